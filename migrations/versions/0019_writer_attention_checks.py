"""writer attention checks: each check served to a writer and their answer (issue 26)

``attention_check_answers`` holds one row per attention check served to a writer on a task
(services/domain/attention.py): the question, options and expected answer as served, and the
writer's one answer and whether it passed. ``(task_id, writer_id, slot)`` is unique: one check
per place in the writer's work, so two concurrent requests serve one check.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-25 20:15:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "attention_check_answers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("writer_id", sa.Integer(), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("item_index", sa.Integer(), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("expected", sa.Text(), nullable=False),
        sa.Column("served_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("passed", sa.Boolean(), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_attention_check_answers_task_id_tasks")),
        sa.ForeignKeyConstraint(["writer_id"], ["users.id"], name=op.f("fk_attention_check_answers_writer_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attention_check_answers")),
        sa.UniqueConstraint("task_id", "writer_id", "slot", name="uq_attention_check_answers_task_writer_slot"),
    )
    op.create_index(op.f("ix_attention_check_answers_task_id"), "attention_check_answers", ["task_id"], unique=False)
    op.create_index("ix_attention_check_answers_writer", "attention_check_answers", ["writer_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_attention_check_answers_writer", table_name="attention_check_answers")
    op.drop_index(op.f("ix_attention_check_answers_task_id"), table_name="attention_check_answers")
    op.drop_table("attention_check_answers")
