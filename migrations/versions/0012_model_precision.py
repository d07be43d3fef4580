"""model precision: what each attempt's forward pass ran at (fp32, bf16, int8; issue 14)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24 19:40:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.add_column(sa.Column("model_precision", sa.String(length=40), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.drop_column("model_precision")
