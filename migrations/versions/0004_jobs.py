"""jobs

Long researcher work (train, evaluate, promote) started through the API runs in its own
process (`dynaloop job run`); a ``jobs`` row holds its kind, parameters, status, progress,
message, result, the tail of its log and the process that runs it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 10:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "kind",
            sa.Enum("train", "evaluate", "promote", name="jobkind", native_enum=False, length=20),
            nullable=False,
        ),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum("queued", "running", "succeeded", "failed", name="jobstatus", native_enum=False, length=20),
            nullable=False,
        ),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("log", sa.Text(), nullable=False),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.CheckConstraint("progress >= 0 AND progress <= 1", name=op.f("ck_jobs_progress_range")),
        sa.ForeignKeyConstraint(["created_by_id"], ["users.id"], name=op.f("fk_jobs_created_by_id_users")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_jobs_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_created_by_id"), ["created_by_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_task_id"), ["task_id"], unique=False)
        batch_op.create_index("ix_jobs_task_kind_status", ["task_id", "kind", "status"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_task_kind_status")
        batch_op.drop_index(batch_op.f("ix_jobs_task_id"))
        batch_op.drop_index(batch_op.f("ix_jobs_created_by_id"))

    op.drop_table("jobs")
