"""multilabel reannotation: validations.annotation_pass

Which set of labels a validation belongs to: 0 for an example's first set, 1 for its
re-annotation by new validators after the first set gave no gold (EthioEmo's re-queue of
disagreements). Gold is decided on the last pass's labels only. Existing validations are
first-pass labels (0); an example re-queued before this column existed keeps its old mixed
labels as pass 0.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 12:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("validations") as batch:
        batch.add_column(sa.Column("annotation_pass", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("validations") as batch:
        batch.drop_column("annotation_pass")
