"""payout batches paid through a platform's API: where paying stands (issue 27, part E)

``payout_batches.platform_state`` keeps what `dynaloop ledger pay` must remember between runs
(Prolific's bulk bonus: the study, the set-up's id, a set-up without an answer, a pay request
sent), saved before each next request so that a second run never sets up or pays twice.
``pay_run_id`` and ``pay_run_at`` hold the running `pay` command's claim on the batch (taken
and renewed by a conditional UPDATE), so two runs at once never both call the platform.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-25 23:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("payout_batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("platform_state", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("pay_run_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("pay_run_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("payout_batches", schema=None) as batch_op:
        batch_op.drop_column("pay_run_at")
        batch_op.drop_column("pay_run_id")
        batch_op.drop_column("platform_state")
