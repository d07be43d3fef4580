"""model registry and harvested examples

Model versions gain the model_id/version strings of their dynaloop_model.json (unique per
task, so attempts' (model_id, model_version) join to the registry), their training data,
hyper-parameters, evaluation, the endpoint they were promoted to and the dates of each step.

Examples gain ``origin`` (written | harvested) and ``source_metadata``; a harvested example
(DynaSent §3.2: a corpus sentence) has no writer, assignment or attempt, so those columns
become nullable, guarded by a CHECK that written examples still have all three.

Downgrade deletes harvested examples (and their labels and build rows): the old schema
cannot hold an example without a writer.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 03:53:23.687476

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("examples", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "origin",
                sa.Enum("written", "harvested", name="exampleorigin", native_enum=False, length=20),
                server_default="written",
                nullable=False,
            )
        )
        batch_op.add_column(sa.Column("source_metadata", sa.JSON(), nullable=True))
        batch_op.alter_column("assignment_id", existing_type=sa.INTEGER(), nullable=True)
        batch_op.alter_column("attempt_id", existing_type=sa.INTEGER(), nullable=True)
        batch_op.alter_column("writer_id", existing_type=sa.INTEGER(), nullable=True)
        batch_op.create_check_constraint(op.f("ck_examples_origin_values"), "origin IN ('written', 'harvested')")
        batch_op.create_check_constraint(
            op.f("ck_examples_written_has_writer"),
            "origin = 'harvested' OR (writer_id IS NOT NULL AND assignment_id IS NOT NULL AND attempt_id IS NOT NULL)",
        )

    # New NOT NULL columns: added nullable, filled for existing rows, then tightened.
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model_id", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("version", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("data", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("hyperparameters", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("evaluation", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("endpoint", sa.String(length=500), nullable=True))
        batch_op.add_column(sa.Column("evaluated_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))
    # Rows from before the registry have only a name: it stands in for the model id.
    op.execute("UPDATE model_versions SET model_id = name, version = '', data = '{}', hyperparameters = '{}'")
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.alter_column("model_id", existing_type=sa.String(length=200), nullable=False)
        batch_op.alter_column("version", existing_type=sa.String(length=200), nullable=False)
        batch_op.alter_column("data", existing_type=sa.JSON(), nullable=False)
        batch_op.alter_column("hyperparameters", existing_type=sa.JSON(), nullable=False)
        batch_op.create_unique_constraint("uq_model_versions_task_model_version", ["task_id", "model_id", "version"])


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.drop_constraint("uq_model_versions_task_model_version", type_="unique")
        batch_op.drop_column("retired_at")
        batch_op.drop_column("promoted_at")
        batch_op.drop_column("evaluated_at")
        batch_op.drop_column("endpoint")
        batch_op.drop_column("evaluation")
        batch_op.drop_column("hyperparameters")
        batch_op.drop_column("data")
        batch_op.drop_column("version")
        batch_op.drop_column("model_id")

    harvested = "SELECT id FROM examples WHERE origin = 'harvested'"
    for table in ("built_examples", "validation_claims", "validations"):
        op.execute(f"DELETE FROM {table} WHERE example_id IN ({harvested})")
    op.execute("DELETE FROM examples WHERE origin = 'harvested'")
    with op.batch_alter_table("examples", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_examples_written_has_writer"), type_="check")
        batch_op.drop_constraint(op.f("ck_examples_origin_values"), type_="check")
        batch_op.alter_column("writer_id", existing_type=sa.INTEGER(), nullable=False)
        batch_op.alter_column("attempt_id", existing_type=sa.INTEGER(), nullable=False)
        batch_op.alter_column("assignment_id", existing_type=sa.INTEGER(), nullable=False)
        batch_op.drop_column("source_metadata")
        batch_op.drop_column("origin")
