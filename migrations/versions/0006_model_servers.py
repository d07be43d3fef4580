"""model servers

Admin-registered model servers: the only URLs the API and its jobs call. Rounds name the
servers in their loop (``rounds.model_servers``, a list of ``model_servers.name``) instead of
holding URLs (``rounds.model_endpoints``).

Upgrade registers every distinct URL found in the rounds' ``model_endpoints`` as a server
(named after its host and port: ``http://127.0.0.1:8001`` becomes ``127-0-0-1-8001``, with
``-2``, ``-3``... when two URLs give the same name), without an admin token (an admin sets one
with ``PATCH /model-servers/{name}``), and stores the names in each round. Downgrade turns the
names back into URLs and drops the registry (its admin tokens are lost).

The name rule is written out here, not imported, so that this migration keeps doing what it
did when the code changes.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 08:00:00.000000

"""

import datetime as dt
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME_MAX = 63


def _name_for(url: str, taken: set[str]) -> str:
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        host, port = "", None
    base = re.sub(r"[^a-z0-9]+", "-", f"{host}-{port}" if port else host).strip("-")[:50].strip("-") or "server"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def _rounds_table(column: str) -> sa.TableClause:
    return sa.table("rounds", sa.column("id", sa.Integer()), sa.column(column, sa.JSON()))


def upgrade() -> None:
    """Upgrade schema."""
    servers = op.create_table(
        "model_servers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("url", sa.String(length=500), nullable=False),
        sa.Column("admin_token", sa.String(length=500), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["created_by_id"], ["users.id"], name=op.f("fk_model_servers_created_by_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_servers")),
        sa.UniqueConstraint("name", name=op.f("uq_model_servers_name")),
    )
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model_servers", sa.JSON(), nullable=True))

    connection = op.get_bind()
    old, new = _rounds_table("model_endpoints"), _rounds_table("model_servers")
    names: dict[str, str] = {}
    taken: set[str] = set()
    now = dt.datetime.now(dt.UTC)
    for round_id, endpoints in connection.execute(sa.select(old.c.id, old.c.model_endpoints)).all():
        round_servers = []
        for url in endpoints or []:
            url = str(url).strip().rstrip("/")
            if url not in names:
                names[url] = _name_for(url, taken)
                connection.execute(
                    sa.insert(servers).values(
                        name=names[url],
                        url=url[:500],
                        admin_token=None,
                        description=None,
                        created_by_id=None,
                        created_at=now,
                        updated_at=now,
                    )
                )
            if names[url] not in round_servers:
                round_servers.append(names[url])
        connection.execute(sa.update(new).where(new.c.id == round_id).values(model_servers=round_servers))

    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.alter_column("model_servers", existing_type=sa.JSON(), nullable=False)
        batch_op.drop_column("model_endpoints")


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model_endpoints", sa.JSON(), nullable=True))

    connection = op.get_bind()
    servers = sa.table("model_servers", sa.column("name", sa.String()), sa.column("url", sa.String()))
    urls = dict(connection.execute(sa.select(servers.c.name, servers.c.url)).all())
    old, new = _rounds_table("model_endpoints"), _rounds_table("model_servers")
    for round_id, names in connection.execute(sa.select(new.c.id, new.c.model_servers)).all():
        endpoints = [urls[name] for name in names or [] if name in urls]
        connection.execute(sa.update(old).where(old.c.id == round_id).values(model_endpoints=endpoints))

    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.alter_column("model_endpoints", existing_type=sa.JSON(), nullable=False)
        batch_op.drop_column("model_servers")
    op.drop_table("model_servers")
