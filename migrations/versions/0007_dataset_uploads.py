"""dataset uploads

Labelled files a task's researchers upload for its jobs' data mixes, validated on arrival and
stored under the data directory (``DATA_DIR/uploads/TASK/SHA256.FORMAT``); one row each.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 08:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "dataset_uploads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("format", sa.String(length=10), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("uploaded_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_dataset_uploads_task_id_tasks")),
        sa.ForeignKeyConstraint(["uploaded_by_id"], ["users.id"], name=op.f("fk_dataset_uploads_uploaded_by_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_uploads")),
        sa.UniqueConstraint("task_id", "name", name="uq_dataset_uploads_task_name"),
    )
    with op.batch_alter_table("dataset_uploads", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_dataset_uploads_task_id"), ["task_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_dataset_uploads_uploaded_by_id"), ["uploaded_by_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("dataset_uploads", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dataset_uploads_uploaded_by_id"))
        batch_op.drop_index(batch_op.f("ix_dataset_uploads_task_id"))

    op.drop_table("dataset_uploads")
