"""validation integrity: control items and served validation batches (issue 26)

``control_items`` holds a task's control (gold) items: a text with its known label(s), never an
example. ``validation_batches`` records each batch served to a validator (served, expires,
closed, the seed of its shuffled order) and ``validation_batch_items`` its items, each shown
under an opaque per-serving key, an example or a control item; a control answer is kept on its
item. A label is accepted only for an item of the validator's live batch.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25 19:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "control_items",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("text_sha256", sa.String(length=64), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("target_span", sa.JSON(), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_control_items_task_id_tasks")),
        sa.ForeignKeyConstraint(["created_by_id"], ["users.id"], name=op.f("fk_control_items_created_by_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_control_items")),
        sa.UniqueConstraint("task_id", "text_sha256", name="uq_control_items_task_text"),
    )
    with op.batch_alter_table("control_items") as batch_op:
        batch_op.create_index(batch_op.f("ix_control_items_task_id"), ["task_id"], unique=False)

    op.create_table(
        "validation_batches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("validator_id", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("served_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["round_id"], ["rounds.id"], name=op.f("fk_validation_batches_round_id_rounds")),
        sa.ForeignKeyConstraint(["validator_id"], ["users.id"], name=op.f("fk_validation_batches_validator_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_validation_batches")),
    )
    with op.batch_alter_table("validation_batches") as batch_op:
        batch_op.create_index(batch_op.f("ix_validation_batches_round_id"), ["round_id"], unique=False)
        batch_op.create_index("ix_validation_batches_validator_round", ["validator_id", "round_id"], unique=False)

    op.create_table(
        "validation_batch_items",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("batch_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("item_key", sa.String(length=32), nullable=False),
        sa.Column("example_id", sa.Integer(), nullable=True),
        sa.Column("control_item_id", sa.Integer(), nullable=True),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("validation_id", sa.Integer(), nullable=True),
        sa.Column("label", sa.JSON(), nullable=True),
        sa.Column("correct", sa.Boolean(), nullable=True),
        sa.Column("flagged", sa.Boolean(), nullable=False),
        sa.Column("flag_reason", sa.Text(), nullable=True),
        sa.Column("seconds_taken", sa.Float(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.CheckConstraint(
            "(example_id IS NULL) <> (control_item_id IS NULL)", name=op.f("ck_validation_batch_items_one_kind")
        ),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["validation_batches.id"], name=op.f("fk_validation_batch_items_batch_id_validation_batches")
        ),
        sa.ForeignKeyConstraint(
            ["example_id"], ["examples.id"], name=op.f("fk_validation_batch_items_example_id_examples")
        ),
        sa.ForeignKeyConstraint(
            ["control_item_id"],
            ["control_items.id"],
            name=op.f("fk_validation_batch_items_control_item_id_control_items"),
        ),
        sa.ForeignKeyConstraint(
            ["validation_id"], ["validations.id"], name=op.f("fk_validation_batch_items_validation_id_validations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_validation_batch_items")),
        sa.UniqueConstraint("item_key", name="uq_validation_batch_items_item_key"),
        sa.UniqueConstraint("batch_id", "position", name="uq_validation_batch_items_batch_position"),
    )
    with op.batch_alter_table("validation_batch_items") as batch_op:
        batch_op.create_index(batch_op.f("ix_validation_batch_items_batch_id"), ["batch_id"], unique=False)
        batch_op.create_index("ix_validation_batch_items_example", ["example_id"], unique=False)
        batch_op.create_index("ix_validation_batch_items_control_item", ["control_item_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("validation_batch_items")
    op.drop_table("validation_batches")
    op.drop_table("control_items")
