"""job queue and model replicas (issue 15)

Jobs go through a task queue to `dynaloop worker` processes instead of being child processes
of the API replica that accepted them: ``jobs`` gains the queue a job waits in (cpu or gpu),
the worker that took it, the worker's heartbeat and a cancel request; ``job_workers`` lists the
workers; ``queue_messages``, ``queue_schedule`` and ``queue_results`` are the task queue's own
tables (huey's SQL storage, in the application's database). ``model_replicas`` records which
model-server replica serves which model of its task.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24 22:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(
            sa.Column(
                "queue",
                sa.Enum("cpu", "gpu", name="jobqueue", native_enum=False, length=20),
                nullable=False,
                server_default="cpu",
            )
        )
        batch_op.add_column(sa.Column("worker", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("cancel_requested_by_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            op.f("fk_jobs_cancel_requested_by_id_users"), "users", ["cancel_requested_by_id"], ["id"]
        )
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.alter_column("queue", server_default=None)

    op.create_table(
        "job_workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("queue", sa.Enum("cpu", "gpu", name="jobqueue", native_enum=False, length=20), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_workers")),
        sa.UniqueConstraint("name", name=op.f("uq_job_workers_name")),
    )
    op.create_table(
        "queue_messages",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("priority", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_queue_messages")),
    )
    op.create_index("ix_queue_messages_queue_priority_id", "queue_messages", ["queue", "priority", "id"])
    op.create_table(
        "queue_schedule",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("timestamp", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_queue_schedule")),
    )
    op.create_index("ix_queue_schedule_queue_timestamp", "queue_schedule", ["queue", "timestamp"])
    op.create_table(
        "queue_results",
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "key", name=op.f("pk_queue_results")),
    )
    op.create_table(
        "model_replicas",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("url", sa.String(length=500), nullable=True),
        sa.Column("model_version_id", sa.Integer(), nullable=True),
        sa.Column("model_id", sa.String(length=200), nullable=True),
        sa.Column("version", sa.String(length=200), nullable=True),
        sa.Column("precision", sa.String(length=40), nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_version_id"], ["model_versions.id"], name=op.f("fk_model_replicas_model_version_id_model_versions")
        ),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_model_replicas_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_replicas")),
        sa.UniqueConstraint("task_id", "name", name="uq_model_replicas_task_name"),
    )
    op.create_index(op.f("ix_model_replicas_task_id"), "model_replicas", ["task_id"])


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f("ix_model_replicas_task_id"), table_name="model_replicas")
    op.drop_table("model_replicas")
    op.drop_table("queue_results")
    op.drop_index("ix_queue_schedule_queue_timestamp", table_name="queue_schedule")
    op.drop_table("queue_schedule")
    op.drop_index("ix_queue_messages_queue_priority_id", table_name="queue_messages")
    op.drop_table("queue_messages")
    op.drop_table("job_workers")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_constraint(op.f("fk_jobs_cancel_requested_by_id_users"), type_="foreignkey")
        batch_op.drop_column("cancel_requested_by_id")
        batch_op.drop_column("cancel_requested_at")
        batch_op.drop_column("heartbeat_at")
        batch_op.drop_column("worker")
        batch_op.drop_column("queue")
