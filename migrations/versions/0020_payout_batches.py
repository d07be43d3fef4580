"""payout batches: recorded bonus exports per study link, their lines, the ledger entries each
line pays, and reconciliations with the platforms' records (issue 27, part A)

``payout_events.claimed_entry_id`` holds the ledger entry's id while its batch is not cancelled
(NULL once it is) and is unique: a ledger entry is in at most one live batch, enforced by the
database, so two concurrent exports cannot both claim it. ``study_links.currency`` is the
currency the platform's study pays in (NULL: the task's pay policy's).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-25 22:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PLATFORM = sa.Enum("prolific", "mturk", "generic", name="platform", native_enum=False, length=20)
STATUS = sa.Enum("created", "paid", "cancelled", name="payoutstatus", native_enum=False, length=20)


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("study_links", schema=None) as batch_op:
        batch_op.add_column(sa.Column("currency", sa.String(length=3), nullable=True))
    op.create_table(
        "payout_batches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("link_id", sa.Integer(), nullable=False),
        sa.Column("platform", PLATFORM, nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("status", STATUS, nullable=False),
        sa.Column("line_count", sa.Integer(), nullable=False),
        sa.Column("total_minor", sa.BigInteger(), nullable=False),
        sa.Column("filename", sa.String(length=200), nullable=False),
        sa.Column("file_text", sa.Text(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("paid_by_id", sa.Integer(), nullable=True),
        sa.Column("paid_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancelled_by_id", sa.Integer(), nullable=True),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("line_count >= 1", name=op.f("ck_payout_batches_line_count_positive")),
        sa.CheckConstraint("total_minor >= 1", name=op.f("ck_payout_batches_total_positive")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_payout_batches_task_id_tasks")),
        sa.ForeignKeyConstraint(["link_id"], ["study_links.id"], name=op.f("fk_payout_batches_link_id_study_links")),
        sa.ForeignKeyConstraint(["created_by_id"], ["users.id"], name=op.f("fk_payout_batches_created_by_id_users")),
        sa.ForeignKeyConstraint(["paid_by_id"], ["users.id"], name=op.f("fk_payout_batches_paid_by_id_users")),
        sa.ForeignKeyConstraint(
            ["cancelled_by_id"], ["users.id"], name=op.f("fk_payout_batches_cancelled_by_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_payout_batches")),
    )
    op.create_index("ix_payout_batches_task_link", "payout_batches", ["task_id", "link_id"], unique=False)
    op.create_table(
        "payout_lines",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("batch_id", sa.Integer(), nullable=False),
        sa.Column("line_number", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=True),
        sa.Column("platform_worker_id", sa.String(length=128), nullable=False),
        sa.Column("assignment_id", sa.String(length=128), nullable=True),
        sa.Column("amount_minor", sa.BigInteger(), nullable=False),
        sa.Column("unique_request_token", sa.String(length=64), nullable=False),
        sa.Column("platform_status", sa.String(length=64), nullable=True),
        sa.Column("platform_reference", sa.String(length=200), nullable=True),
        sa.Column("platform_answer", sa.JSON(), nullable=True),
        sa.Column("paid_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("amount_minor >= 1", name=op.f("ck_payout_lines_amount_positive")),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["payout_batches.id"], name=op.f("fk_payout_lines_batch_id_payout_batches")
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_payout_lines_user_id_users")),
        sa.ForeignKeyConstraint(
            ["session_id"], ["study_sessions.id"], name=op.f("fk_payout_lines_session_id_study_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_payout_lines")),
        sa.UniqueConstraint("batch_id", "line_number", name="uq_payout_lines_batch_line"),
        sa.UniqueConstraint("batch_id", "unique_request_token", name="uq_payout_lines_batch_token"),
    )
    op.create_index(op.f("ix_payout_lines_batch_id"), "payout_lines", ["batch_id"], unique=False)
    op.create_table(
        "payout_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("batch_id", sa.Integer(), nullable=False),
        sa.Column("line_id", sa.Integer(), nullable=False),
        sa.Column("ledger_entry_id", sa.Integer(), nullable=False),
        sa.Column("claimed_entry_id", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "claimed_entry_id IS NULL OR claimed_entry_id = ledger_entry_id",
            name=op.f("ck_payout_events_claim_is_the_entry"),
        ),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["payout_batches.id"], name=op.f("fk_payout_events_batch_id_payout_batches")
        ),
        sa.ForeignKeyConstraint(["line_id"], ["payout_lines.id"], name=op.f("fk_payout_events_line_id_payout_lines")),
        sa.ForeignKeyConstraint(
            ["ledger_entry_id"], ["ledger_entries.id"], name=op.f("fk_payout_events_ledger_entry_id_ledger_entries")
        ),
        sa.ForeignKeyConstraint(
            ["claimed_entry_id"],
            ["ledger_entries.id"],
            name=op.f("fk_payout_events_claimed_entry_id_ledger_entries"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_payout_events")),
        sa.UniqueConstraint("claimed_entry_id", name="uq_payout_events_claimed_entry_id"),
    )
    op.create_index(op.f("ix_payout_events_batch_id"), "payout_events", ["batch_id"], unique=False)
    op.create_index(op.f("ix_payout_events_line_id"), "payout_events", ["line_id"], unique=False)
    op.create_index(op.f("ix_payout_events_ledger_entry_id"), "payout_events", ["ledger_entry_id"], unique=False)
    op.create_table(
        "payout_reconciliations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("batch_id", sa.Integer(), nullable=False),
        sa.Column("matched", sa.Integer(), nullable=False),
        sa.Column("missing", sa.Integer(), nullable=False),
        sa.Column("unexpected", sa.Integer(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["payout_batches.id"], name=op.f("fk_payout_reconciliations_batch_id_payout_batches")
        ),
        sa.ForeignKeyConstraint(
            ["created_by_id"], ["users.id"], name=op.f("fk_payout_reconciliations_created_by_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_payout_reconciliations")),
    )
    op.create_index(op.f("ix_payout_reconciliations_batch_id"), "payout_reconciliations", ["batch_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f("ix_payout_reconciliations_batch_id"), table_name="payout_reconciliations")
    op.drop_table("payout_reconciliations")
    op.drop_index(op.f("ix_payout_events_ledger_entry_id"), table_name="payout_events")
    op.drop_index(op.f("ix_payout_events_line_id"), table_name="payout_events")
    op.drop_index(op.f("ix_payout_events_batch_id"), table_name="payout_events")
    op.drop_table("payout_events")
    op.drop_index(op.f("ix_payout_lines_batch_id"), table_name="payout_lines")
    op.drop_table("payout_lines")
    op.drop_index("ix_payout_batches_task_link", table_name="payout_batches")
    op.drop_table("payout_batches")
    with op.batch_alter_table("study_links", schema=None) as batch_op:
        batch_op.drop_column("currency")
