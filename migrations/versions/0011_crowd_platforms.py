"""crowd platforms: study links, platform accounts, study sessions and the pay ledger (issue 13)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 15:56:02.999877

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "platform_accounts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "platform",
            sa.Enum("prolific", "mturk", "generic", name="platform", native_enum=False, length=20),
            nullable=False,
        ),
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_platform_accounts_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_platform_accounts")),
        sa.UniqueConstraint("platform", "id_hash", name="uq_platform_accounts_platform_id_hash"),
        sa.UniqueConstraint("user_id", name=op.f("uq_platform_accounts_user_id")),
    )
    op.create_table(
        "study_links",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column(
            "role", sa.Enum("writer", "validator", name="studyrole", native_enum=False, length=20), nullable=False
        ),
        sa.Column(
            "platform",
            sa.Enum("prolific", "mturk", "generic", name="platform", native_enum=False, length=20),
            nullable=False,
        ),
        sa.Column("quota", sa.Integer(), nullable=False),
        sa.Column("max_workers", sa.Integer(), nullable=True),
        sa.Column("id_parameter", sa.String(length=64), nullable=True),
        sa.Column("completion_code", sa.String(length=64), nullable=False),
        sa.Column("screened_out_code", sa.String(length=64), nullable=True),
        sa.Column("opens_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closes_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("max_workers IS NULL OR max_workers >= 1", name=op.f("ck_study_links_max_workers_positive")),
        sa.CheckConstraint("quota >= 1", name=op.f("ck_study_links_quota_positive")),
        sa.ForeignKeyConstraint(["created_by_id"], ["users.id"], name=op.f("fk_study_links_created_by_id_users")),
        sa.ForeignKeyConstraint(["round_id"], ["rounds.id"], name=op.f("fk_study_links_round_id_rounds")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_study_links_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_study_links")),
        sa.UniqueConstraint("slug", name=op.f("uq_study_links_slug")),
    )
    with op.batch_alter_table("study_links", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_study_links_round_id"), ["round_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_study_links_task_id"), ["task_id"], unique=False)

    op.create_table(
        "study_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("link_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "active",
                "completed",
                "screened_out",
                "stopped",
                name="studysessionstatus",
                native_enum=False,
                length=20,
            ),
            nullable=False,
        ),
        sa.Column("platform_worker_id", sa.String(length=128), nullable=True),
        sa.Column("platform_study_id", sa.String(length=128), nullable=True),
        sa.Column("platform_session_id", sa.String(length=128), nullable=True),
        sa.Column("submit_to", sa.String(length=200), nullable=True),
        sa.Column("units_done", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["link_id"], ["study_links.id"], name=op.f("fk_study_sessions_link_id_study_links")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_study_sessions_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_study_sessions")),
        sa.UniqueConstraint("link_id", "user_id", name="uq_study_sessions_link_user"),
    )
    with op.batch_alter_table("study_sessions", schema=None) as batch_op:
        batch_op.create_index("ix_study_sessions_link_status", ["link_id", "status"], unique=False)
        batch_op.create_index(batch_op.f("ix_study_sessions_user_id"), ["user_id"], unique=False)

    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=True),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=True),
        sa.Column(
            "kind",
            sa.Enum(
                "base_pay",
                "writer_bonus",
                "validator_bonus",
                "correction",
                name="ledgerkind",
                native_enum=False,
                length=20,
            ),
            nullable=False,
        ),
        sa.Column("event_key", sa.String(length=128), nullable=False),
        sa.Column("amount_minor", sa.Integer(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("corrects_id", sa.Integer(), nullable=True),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["corrects_id"], ["ledger_entries.id"], name=op.f("fk_ledger_entries_corrects_id_ledger_entries")
        ),
        sa.ForeignKeyConstraint(["created_by_id"], ["users.id"], name=op.f("fk_ledger_entries_created_by_id_users")),
        sa.ForeignKeyConstraint(["round_id"], ["rounds.id"], name=op.f("fk_ledger_entries_round_id_rounds")),
        sa.ForeignKeyConstraint(
            ["session_id"], ["study_sessions.id"], name=op.f("fk_ledger_entries_session_id_study_sessions")
        ),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_ledger_entries_task_id_tasks")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_ledger_entries_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_entries")),
        sa.UniqueConstraint("task_id", "kind", "event_key", name="uq_ledger_entries_task_kind_event"),
    )
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ledger_entries_round_id"), ["round_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_ledger_entries_session_id"), ["session_id"], unique=False)
        batch_op.create_index("ix_ledger_entries_task_user", ["task_id", "user_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_index("ix_ledger_entries_task_user")
        batch_op.drop_index(batch_op.f("ix_ledger_entries_session_id"))
        batch_op.drop_index(batch_op.f("ix_ledger_entries_round_id"))

    op.drop_table("ledger_entries")
    with op.batch_alter_table("study_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_study_sessions_user_id"))
        batch_op.drop_index("ix_study_sessions_link_status")

    op.drop_table("study_sessions")
    with op.batch_alter_table("study_links", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_study_links_task_id"))
        batch_op.drop_index(batch_op.f("ix_study_links_round_id"))

    op.drop_table("study_links")
    op.drop_table("platform_accounts")
