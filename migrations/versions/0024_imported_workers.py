"""imported workers: the accounts an import of crowd responses creates are marked, and never paid

``users.made_by_import``: the account is the pseudonym of a worker whose responses were imported
(rounds/models/round_imports.py). The ledger pays no validator bonus for such an account's labels
(services/domain/ledger.py); before this revision it did, when the task had a pay policy. The
upgrade marks the accounts earlier imports made: inactive, without a password, named
``imported-`` and an HMAC, with the display name the import gives them. Ledger rows that were
already computed for them are left as they are (the ledger is append-only): a researcher corrects
them with a correction row (docs/round_builder.md "Pay and the ledger").

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 15:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0024"
down_revision: str | Sequence[str] | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("users") as batch_op:
        batch_op.add_column(sa.Column("made_by_import", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute(
        "UPDATE users SET made_by_import = true WHERE username LIKE 'imported-%' AND password_hash IS NULL"
        " AND is_active = false AND made_by_link = false AND display_name = 'imported worker'"
    )


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("users") as batch_op:
        batch_op.drop_column("made_by_import")
