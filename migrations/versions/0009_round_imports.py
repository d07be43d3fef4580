"""round imports: examples imported from a labelled dataset or from earlier crowd responses

Examples gain a third ``origin``, ``imported`` (docs/round_builder.md "Imports"): like a
harvested example it has no writer, assignment or attempt; its import (file, row, imported
gold) is recorded in ``source_metadata``.

Downgrade deletes imported examples (and their labels and build rows): the old schema has no
origin for them.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 12:00:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ORIGINS_BEFORE = ("written", "harvested")
_ORIGINS_AFTER = ("written", "harvested", "imported")


def _origin_constraints(batch_op: object, origins: tuple[str, ...]) -> None:
    quoted = ", ".join(f"'{origin}'" for origin in origins)
    batch_op.create_check_constraint(op.f("ck_examples_origin_values"), f"origin IN ({quoted})")  # type: ignore[attr-defined]
    batch_op.create_check_constraint(  # type: ignore[attr-defined]
        op.f("ck_examples_written_has_writer"),
        "origin <> 'written' OR (writer_id IS NOT NULL AND assignment_id IS NOT NULL AND attempt_id IS NOT NULL)",
    )


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("examples", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_examples_written_has_writer"), type_="check")
        batch_op.drop_constraint(op.f("ck_examples_origin_values"), type_="check")
        batch_op.alter_column(
            "origin",
            existing_type=sa.Enum(*_ORIGINS_BEFORE, name="exampleorigin", native_enum=False, length=20),
            type_=sa.Enum(*_ORIGINS_AFTER, name="exampleorigin", native_enum=False, length=20),
            existing_nullable=False,
            existing_server_default="written",
        )
        _origin_constraints(batch_op, _ORIGINS_AFTER)


def downgrade() -> None:
    """Downgrade schema."""
    imported = "SELECT id FROM examples WHERE origin = 'imported'"
    for table in ("built_examples", "validation_claims", "validations"):
        op.execute(f"DELETE FROM {table} WHERE example_id IN ({imported})")
    op.execute("DELETE FROM examples WHERE origin = 'imported'")
    with op.batch_alter_table("examples", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_examples_written_has_writer"), type_="check")
        batch_op.drop_constraint(op.f("ck_examples_origin_values"), type_="check")
        batch_op.alter_column(
            "origin",
            existing_type=sa.Enum(*_ORIGINS_AFTER, name="exampleorigin", native_enum=False, length=20),
            type_=sa.Enum(*_ORIGINS_BEFORE, name="exampleorigin", native_enum=False, length=20),
            existing_nullable=False,
            existing_server_default="written",
        )
        batch_op.create_check_constraint(op.f("ck_examples_origin_values"), "origin IN ('written', 'harvested')")
        batch_op.create_check_constraint(
            op.f("ck_examples_written_has_writer"),
            "origin = 'harvested' OR (writer_id IS NOT NULL AND assignment_id IS NOT NULL AND attempt_id IS NOT NULL)",
        )
