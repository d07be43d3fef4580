"""task members

Task owners and members: the researchers who may manage a task (services/authorization.py).
Each existing task's creator (``tasks.created_by_id``) becomes its owner; a task created with
no creator (the CLI or the demo before this revision) gets no owner, so only admins manage it
until one adds an owner (``PUT /tasks/{task}/members/{username}`` or
``dynaloop task add-member``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 08:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "task_members",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.Enum("owner", "member", name="taskrole", native_enum=False, length=20), nullable=False),
        sa.Column("added_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["added_by_id"], ["users.id"], name=op.f("fk_task_members_added_by_id_users")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_task_members_task_id_tasks")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_task_members_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_members")),
        sa.UniqueConstraint("task_id", "user_id", name="uq_task_members_task_user"),
    )
    with op.batch_alter_table("task_members", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_members_task_id"), ["task_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_task_members_user_id"), ["user_id"], unique=False)

    # Each task's creator owns it, from the moment the task was created. Plain SQL that both
    # SQLite and PostgreSQL run: INSERT ... SELECT over the existing tasks.
    tasks = sa.table(
        "tasks", sa.column("id", sa.Integer()), sa.column("created_by_id", sa.Integer()), sa.column("created_at")
    )
    members = sa.table(
        "task_members",
        sa.column("task_id", sa.Integer()),
        sa.column("user_id", sa.Integer()),
        sa.column("role", sa.String()),
        sa.column("added_by_id", sa.Integer()),
        sa.column("created_at"),
    )
    op.execute(
        members.insert().from_select(
            ["task_id", "user_id", "role", "added_by_id", "created_at"],
            sa.select(
                tasks.c.id,
                tasks.c.created_by_id,
                sa.literal("owner", sa.String()),
                tasks.c.created_by_id,
                tasks.c.created_at,
            ).where(tasks.c.created_by_id.is_not(None)),
        )
    )


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("task_members", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_members_user_id"))
        batch_op.drop_index(batch_op.f("ix_task_members_task_id"))

    op.drop_table("task_members")
