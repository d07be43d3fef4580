"""pay policy versions: a task's pay policy can change; each ledger row names its version (issue 27)

``pay_policies`` holds every version of a task's pay policy (services/domain/pay_policies.py):
the policy as JSON, the time from which it pays work (``effective_from``), who set it and why.
``(task_id, version)`` is unique, so two concurrent changes never get one number.
``ledger_entries.pay_policy_version`` names the version a row was computed under.

Upgrading makes version 1 from the ``pay:`` block of each existing task's definition (effective
from the task's creation, so it covers all work done so far) and stamps that task's existing
non-correction ledger rows with it. A task without a ``pay:`` block gets no version, and its rows
(there are none: no policy, no ledger) stay NULL.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-25 22:00:00.000000

"""

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _as_utc(value: Any) -> dt.datetime:
    # SQLite hands back naive text or datetimes (the models store UTC); PostgreSQL aware ones.
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def upgrade() -> None:
    """Upgrade schema."""
    pay_policies = op.create_table(
        "pay_policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("policy", sa.JSON(), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_pay_policies_task_id_tasks")),
        sa.ForeignKeyConstraint(["created_by_id"], ["users.id"], name=op.f("fk_pay_policies_created_by_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pay_policies")),
        sa.UniqueConstraint("task_id", "version", name="uq_pay_policies_task_version"),
    )
    op.create_index(op.f("ix_pay_policies_task_id"), "pay_policies", ["task_id"], unique=False)
    with op.batch_alter_table("ledger_entries") as batch:
        batch.add_column(sa.Column("pay_policy_version", sa.Integer(), nullable=True))

    connection = op.get_bind()
    tasks = connection.execute(sa.text("SELECT id, definition, created_by_id, created_at FROM tasks ORDER BY id")).all()
    now = dt.datetime.now(dt.UTC)
    for task_id, definition, created_by_id, created_at in tasks:
        if isinstance(definition, str):
            definition = json.loads(definition)
        pay = (definition or {}).get("pay")
        if not pay:
            continue
        connection.execute(
            pay_policies.insert().values(
                task_id=task_id,
                version=1,
                policy=pay,
                effective_from=_as_utc(created_at),
                note="the task YAML's pay block (migration 0021)",
                created_by_id=created_by_id,
                created_at=now,
            )
        )
        connection.execute(
            sa.text(
                "UPDATE ledger_entries SET pay_policy_version = 1 WHERE task_id = :task_id AND kind != 'correction'"
            ),
            {"task_id": task_id},
        )


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("pay_policy_version")
    op.drop_index(op.f("ix_pay_policies_task_id"), table_name="pay_policies")
    op.drop_table("pay_policies")
