"""round builds

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 01:26:36.274858

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "round_builds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["created_by_id"], ["users.id"], name=op.f("fk_round_builds_created_by_id_users")),
        sa.ForeignKeyConstraint(["round_id"], ["rounds.id"], name=op.f("fk_round_builds_round_id_rounds")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_round_builds")),
    )
    with op.batch_alter_table("round_builds", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_round_builds_round_id"), ["round_id"], unique=False)

    op.create_table(
        "built_examples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("example_id", sa.Integer(), nullable=False),
        sa.Column("split", sa.String(length=16), nullable=False),
        sa.Column("gold_label", sa.JSON(), nullable=True),
        sa.Column("gold_votes", sa.Integer(), nullable=True),
        sa.Column("responses", sa.Integer(), nullable=False),
        sa.Column("response_labels", sa.JSON(), nullable=False),
        sa.Column("distributional_label", sa.JSON(), nullable=True),
        sa.Column("model_based_label", sa.JSON(), nullable=True),
        sa.Column("flags", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["build_id"], ["round_builds.id"], name=op.f("fk_built_examples_build_id_round_builds"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["example_id"], ["examples.id"], name=op.f("fk_built_examples_example_id_examples")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_built_examples")),
        sa.UniqueConstraint("build_id", "example_id", name="uq_built_examples_build_example"),
    )
    with op.batch_alter_table("built_examples", schema=None) as batch_op:
        batch_op.create_index("ix_built_examples_build_split", ["build_id", "split", "example_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_built_examples_example_id"), ["example_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("built_examples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_built_examples_example_id"))
        batch_op.drop_index("ix_built_examples_build_split")

    op.drop_table("built_examples")
    with op.batch_alter_table("round_builds", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_round_builds_round_id"))

    op.drop_table("round_builds")
