"""label speed: a validator's labels by example, read by the label path (issue 17)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 12:00:00.000000

"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index("ix_validations_validator_example", "validations", ["validator_id", "example_id"])


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_validations_validator_example", table_name="validations")
