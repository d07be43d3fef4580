"""model server grants: which tasks may use each registered model server (issue 26, item 7)

An admin grants a registered model server to tasks; a task's researchers may put only servers
granted to their task in its rounds' loop, or promote their models to them, and a server granted
to more than one task is swapped by admins only (services/domain/model_servers.py).

So that existing deployments keep working, each registered server is granted to every task
whose rounds (open or not) already name it in their loop (``rounds.model_servers``, a JSON list
of server names): the demo's ``model-0`` is granted to the demo's task.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-25 19:00:00.000000

"""

import datetime as dt
import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "model_server_grants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("server_id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("granted_by_id", sa.Integer(), nullable=True),
        sa.Column("granted_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["server_id"],
            ["model_servers.id"],
            name=op.f("fk_model_server_grants_server_id_model_servers"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name=op.f("fk_model_server_grants_task_id_tasks"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["granted_by_id"], ["users.id"], name=op.f("fk_model_server_grants_granted_by_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_server_grants")),
        sa.UniqueConstraint("server_id", "task_id", name="uq_model_server_grants_server_task"),
    )
    with op.batch_alter_table("model_server_grants") as batch_op:
        batch_op.create_index(batch_op.f("ix_model_server_grants_server_id"), ["server_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_model_server_grants_task_id"), ["task_id"], unique=False)

    # Grant each registered server to the tasks whose rounds already have it in their loop.
    connection = op.get_bind()
    servers: dict[str, int] = {
        str(name): int(server_id)
        for name, server_id in connection.execute(sa.text("SELECT name, id FROM model_servers")).all()
    }
    pairs: set[tuple[int, int]] = set()
    for task_id, names in connection.execute(sa.text("SELECT task_id, model_servers FROM rounds")).all():
        if isinstance(names, str):  # SQLite returns the JSON column's text
            names = json.loads(names)
        for name in names or []:
            if name in servers:
                pairs.add((servers[name], task_id))
    if pairs:
        grants = sa.table(
            "model_server_grants",
            sa.column("server_id", sa.Integer()),
            sa.column("task_id", sa.Integer()),
            sa.column("granted_at", sa.DateTime(timezone=True)),
        )
        now = dt.datetime.now(dt.UTC)
        op.bulk_insert(grants, [{"server_id": s, "task_id": t, "granted_at": now} for s, t in sorted(pairs)])


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("model_server_grants") as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_server_grants_task_id"))
        batch_op.drop_index(batch_op.f("ix_model_server_grants_server_id"))
    op.drop_table("model_server_grants")
