"""duplicate texts: each example's normalized-text hash and the task's claimed texts (issue 26)

``examples.normalized_hash`` is ``services.text.duplicate_hash`` of the example's text (and, for
a target-dependent example, its target), indexed, so "is this text already an example of the
task?" is one indexed query; ``examples.normalized_text`` keeps the normalized text itself for
the optional near-duplicate check. ``example_texts`` holds one row per (task, normalized hash),
naming the first example with that text: its primary key is what keeps two concurrent
submissions of one text from both being accepted. Existing examples are backfilled; where a
task already holds repeats (written before this revision) the earliest example claims the text
and the round builder drops the rest from the splits (docs/round_builder.md "Duplicates").

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25 19:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from services.text import duplicate_key, key_hash

# revision identifiers, used by Alembic.
revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 1000


def _target(extras: object) -> str | None:
    span = extras.get("target_span") if isinstance(extras, dict) else None
    return span.get("text") if isinstance(span, dict) and isinstance(span.get("text"), str) else None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("examples") as batch_op:
        batch_op.add_column(sa.Column("normalized_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("normalized_text", sa.Text(), nullable=True))
        batch_op.create_index(batch_op.f("ix_examples_normalized_hash"), ["normalized_hash"], unique=False)
    op.create_table(
        "example_texts",
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("normalized_hash", sa.String(length=64), nullable=False),
        sa.Column("example_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["example_id"], ["examples.id"], name=op.f("fk_example_texts_example_id_examples")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_example_texts_task_id_tasks")),
        sa.PrimaryKeyConstraint("task_id", "normalized_hash", name=op.f("pk_example_texts")),
        sa.UniqueConstraint("example_id", name=op.f("uq_example_texts_example_id")),
    )
    _backfill()


def _backfill() -> None:
    """Hash every existing example and let the earliest example of each (task, text) claim it."""
    bind = op.get_bind()
    examples = sa.table(
        "examples",
        sa.column("id", sa.Integer),
        sa.column("round_id", sa.Integer),
        sa.column("text", sa.Text),
        sa.column("extras", sa.JSON),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("normalized_hash", sa.String),
        sa.column("normalized_text", sa.Text),
    )
    rounds = sa.table("rounds", sa.column("id", sa.Integer), sa.column("task_id", sa.Integer))
    texts = sa.table(
        "example_texts",
        sa.column("task_id", sa.Integer),
        sa.column("normalized_hash", sa.String),
        sa.column("example_id", sa.Integer),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    claimed: set[tuple[int, str]] = set()
    last = 0
    while True:
        rows = bind.execute(
            sa.select(examples.c.id, rounds.c.task_id, examples.c.text, examples.c.extras, examples.c.created_at)
            .join(rounds, examples.c.round_id == rounds.c.id)
            .where(examples.c.id > last)
            .order_by(examples.c.id)
            .limit(BATCH)
        ).all()
        if not rows:
            return
        hashes = []
        claims = []
        for example_id, task_id, text, extras, created_at in rows:
            key = duplicate_key(text, _target(extras))
            digest = key_hash(key)
            hashes.append({"example_id": example_id, "digest": digest, "key": key})
            if (task_id, digest) not in claimed:
                claimed.add((task_id, digest))
                claims.append(
                    {"task_id": task_id, "normalized_hash": digest, "example_id": example_id, "created_at": created_at}
                )
        bind.execute(
            examples.update()
            .where(examples.c.id == sa.bindparam("example_id"))
            .values(normalized_hash=sa.bindparam("digest"), normalized_text=sa.bindparam("key")),
            hashes,
        )
        if claims:
            bind.execute(texts.insert(), claims)
        last = rows[-1][0]


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("example_texts")
    with op.batch_alter_table("examples") as batch_op:
        batch_op.drop_index(batch_op.f("ix_examples_normalized_hash"))
        batch_op.drop_column("normalized_text")
        batch_op.drop_column("normalized_hash")
