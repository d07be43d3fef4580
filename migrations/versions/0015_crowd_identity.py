"""crowd identity: link-made workers, caps on new workers, one session per round and role, the
session's one token, and the completion of stopped and out-of-work sessions (issue 26)

* ``users.made_by_link``: the account was created by a study link; it reaches only the tasks
  and roles of its study sessions.
* ``platform_accounts.link_id`` and ``address_hash``: the link that created the account and a
  keyed hash of the client address, counted by the hourly caps on new workers.
* ``study_sessions.round_id`` and ``role`` (copied from the link, filled in for existing rows)
  with a unique index on (user, round, role): one session per worker per round and role.
* ``study_sessions.token_id``: the session's one API token; ``end_reason``: quota, stop or
  out of work.
* ``study_links.partial_code``, ``partial_pay_minor``, ``other_role_allowed`` and
  ``when_out_of_work``.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25 18:50:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("users") as batch_op:
        batch_op.add_column(sa.Column("made_by_link", sa.Boolean(), nullable=False, server_default=sa.false()))
    # Every worker a study link created so far is link-made (scoped to their links' tasks).
    op.execute("UPDATE users SET made_by_link = true WHERE id IN (SELECT user_id FROM platform_accounts)")
    with op.batch_alter_table("study_links") as batch_op:
        batch_op.add_column(sa.Column("partial_code", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("partial_pay_minor", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("other_role_allowed", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(
            sa.Column("when_out_of_work", sa.String(length=16), nullable=False, server_default="complete")
        )
    with op.batch_alter_table("platform_accounts") as batch_op:
        batch_op.add_column(sa.Column("link_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("address_hash", sa.String(length=64), nullable=True))
        batch_op.create_foreign_key(
            op.f("fk_platform_accounts_link_id_study_links"), "study_links", ["link_id"], ["id"]
        )
        batch_op.create_index(batch_op.f("ix_platform_accounts_link_id"), ["link_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_platform_accounts_address_hash"), ["address_hash"], unique=False)
    with op.batch_alter_table("study_sessions") as batch_op:
        batch_op.add_column(sa.Column("round_id", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column(
                "role", sa.Enum("writer", "validator", name="studyrole", native_enum=False, length=20), nullable=True
            )
        )
        batch_op.add_column(sa.Column("token_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("end_reason", sa.String(length=16), nullable=True))
        batch_op.create_foreign_key(op.f("fk_study_sessions_round_id_rounds"), "rounds", ["round_id"], ["id"])
        batch_op.create_foreign_key(
            op.f("fk_study_sessions_token_id_api_tokens"), "api_tokens", ["token_id"], ["id"], ondelete="SET NULL"
        )
    # Existing sessions take their link's round and role. Where one worker already holds two
    # sessions of one round and role (through two links), only the oldest is filled in, so the
    # unique index can be built; the others keep NULL and stay as they are.
    op.execute(
        """
        UPDATE study_sessions SET
            round_id = (SELECT l.round_id FROM study_links l WHERE l.id = study_sessions.link_id),
            role = (SELECT l.role FROM study_links l WHERE l.id = study_sessions.link_id)
        WHERE NOT EXISTS (
            SELECT 1 FROM study_sessions older JOIN study_links ol ON ol.id = older.link_id,
                 study_links mine
            WHERE mine.id = study_sessions.link_id AND older.user_id = study_sessions.user_id
              AND ol.round_id = mine.round_id AND ol.role = mine.role AND older.id < study_sessions.id
        )
        """
    )
    with op.batch_alter_table("study_sessions") as batch_op:
        batch_op.create_index("uq_study_sessions_user_round_role", ["user_id", "round_id", "role"], unique=True)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("study_sessions") as batch_op:
        batch_op.drop_index("uq_study_sessions_user_round_role")
        batch_op.drop_constraint(op.f("fk_study_sessions_token_id_api_tokens"), type_="foreignkey")
        batch_op.drop_constraint(op.f("fk_study_sessions_round_id_rounds"), type_="foreignkey")
        batch_op.drop_column("end_reason")
        batch_op.drop_column("token_id")
        batch_op.drop_column("role")
        batch_op.drop_column("round_id")
    with op.batch_alter_table("platform_accounts") as batch_op:
        batch_op.drop_index(batch_op.f("ix_platform_accounts_address_hash"))
        batch_op.drop_index(batch_op.f("ix_platform_accounts_link_id"))
        batch_op.drop_constraint(op.f("fk_platform_accounts_link_id_study_links"), type_="foreignkey")
        batch_op.drop_column("address_hash")
        batch_op.drop_column("link_id")
    with op.batch_alter_table("study_links") as batch_op:
        batch_op.drop_column("when_out_of_work")
        batch_op.drop_column("other_role_allowed")
        batch_op.drop_column("partial_pay_minor")
        batch_op.drop_column("partial_code")
    with op.batch_alter_table("users") as batch_op:
        batch_op.drop_column("made_by_link")
