"""example source ids: the id an imported example has in the file it came from (issue 29)

``examples.source_id`` keeps the id of an imported row (the import's id column, `id` by
default) as text, so an export joins back to its source (docs/round_builder.md "Imports",
"Export"). Imports before this revision kept it in ``source_metadata.id`` (cut at 200
characters); the upgrade copies it over, the downgrade drops the column and leaves
``source_metadata`` as it was.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-26 10:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 1000


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("examples") as batch_op:
        batch_op.add_column(sa.Column("source_id", sa.String(length=500), nullable=True))
    _backfill()


def _backfill() -> None:
    """``source_metadata.id`` of each imported example into ``source_id``."""
    bind = op.get_bind()
    examples = sa.table(
        "examples",
        sa.column("id", sa.Integer),
        sa.column("origin", sa.String),
        sa.column("source_metadata", sa.JSON),
        sa.column("source_id", sa.String),
    )
    last = 0
    while True:
        rows = bind.execute(
            sa.select(examples.c.id, examples.c.source_metadata)
            .where(examples.c.id > last, examples.c.origin == "imported")
            .order_by(examples.c.id)
            .limit(BATCH)
        ).all()
        if not rows:
            return
        ids = [
            {"example_id": example_id, "source": str(metadata["id"])}
            for example_id, metadata in rows
            if isinstance(metadata, dict) and metadata.get("id") is not None
        ]
        if ids:
            bind.execute(
                examples.update()
                .where(examples.c.id == sa.bindparam("example_id"))
                .values(source_id=sa.bindparam("source")),
                ids,
            )
        last = rows[-1][0]


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("examples") as batch_op:
        batch_op.drop_column("source_id")
