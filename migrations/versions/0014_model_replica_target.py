"""model replicas: the promotion each replica works towards (issue 15)

A replica that follows its task's promoted model (`dynaloop model-server --follow-task`) records
the registry id and ``promoted_at`` of the promoted version it last read, beside the one it
serves: while it loads that version, and after it failed to load it, the two differ. A promotion
waits on these columns to tell "this replica failed to load the version of *this* promotion"
from an older failure (of another version, or of the same version promoted before).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24 21:40:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("model_replicas") as batch_op:
        batch_op.add_column(sa.Column("target_model_version_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("target_promoted_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_foreign_key(
            op.f("fk_model_replicas_target_model_version_id_model_versions"),
            "model_versions",
            ["target_model_version_id"],
            ["id"],
        )


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("model_replicas") as batch_op:
        batch_op.drop_constraint(op.f("fk_model_replicas_target_model_version_id_model_versions"), type_="foreignkey")
        batch_op.drop_column("target_promoted_at")
        batch_op.drop_column("target_model_version_id")
