"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 00:12:47.374472

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""

    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=True),
        sa.Column("roles", sa.JSON(), nullable=False),
        sa.Column("password_hash", sa.String(length=200), nullable=True),
        sa.Column("is_active", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("username", name=op.f("uq_users_username")),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_api_tokens_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_tokens_user_id"), ["user_id"], unique=False)

    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("actor_id", sa.Integer(), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target_type", sa.String(length=32), nullable=False),
        sa.Column("target_id", sa.String(length=64), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["actor_id"], ["users.id"], name=op.f("fk_audit_log_actor_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_log_actor_id"), ["actor_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_log_created_at"), ["created_at"], unique=False)

    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("family", sa.String(length=32), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("definition_yaml", sa.Text(), nullable=False),
        sa.Column("created_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["created_by_id"], ["users.id"], name=op.f("fk_tasks_created_by_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
        sa.UniqueConstraint("name", name=op.f("uq_tasks_name")),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tasks_created_by_id"), ["created_by_id"], unique=False)

    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("directory", sa.Text(), nullable=False),
        sa.Column("base_model", sa.String(length=500), nullable=False),
        sa.Column("trained_for_round", sa.Integer(), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "trained", "evaluated", "promoted", "retired", name="modelversionstatus", native_enum=False, length=20
            ),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_model_versions_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("task_id", "name", name="uq_model_versions_task_name"),
    )
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_model_versions_task_id"), ["task_id"], unique=False)

    op.create_table(
        "quiz_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("answers", sa.JSON(), nullable=False),
        sa.Column("correct", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_quiz_attempts_task_id_tasks")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_quiz_attempts_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quiz_attempts")),
    )
    with op.batch_alter_table("quiz_attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_quiz_attempts_task_id"), ["task_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_quiz_attempts_user_id"), ["user_id"], unique=False)

    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum("collecting", "validating", "closed", "built", name="roundstatus", native_enum=False, length=20),
            nullable=False,
        ),
        sa.Column("model_endpoints", sa.JSON(), nullable=False),
        sa.Column(
            "prompt_strategy",
            sa.Enum("unused_first", "least_used", "least_fooled", name="promptstrategy", native_enum=False, length=20),
            nullable=False,
        ),
        sa.Column("no_prompt_fraction", sa.Float(), nullable=False),
        sa.Column(
            "target_label_mode",
            sa.Enum("writer_choice", "balanced", name="targetlabelmode", native_enum=False, length=20),
            nullable=False,
        ),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("validating_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("built_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "no_prompt_fraction >= 0 AND no_prompt_fraction <= 1", name=op.f("ck_rounds_no_prompt_fraction_range")
        ),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_rounds_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rounds")),
        sa.UniqueConstraint("task_id", "number", name="uq_rounds_task_number"),
    )
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rounds_task_id"), ["task_id"], unique=False)

    op.create_table(
        "task_workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("quiz_attempts", sa.Integer(), nullable=False),
        sa.Column("onboarding_passed", sa.Boolean(), nullable=False),
        sa.Column("qualified", sa.Boolean(), nullable=False),
        sa.Column("unqualified_reason", sa.Text(), nullable=True),
        sa.Column("agreement_rate", sa.Float(), nullable=True),
        sa.Column("agreement_labels", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_task_workers_task_id_tasks")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_task_workers_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_workers")),
        sa.UniqueConstraint("task_id", "user_id", name="uq_task_workers_task_user"),
    )
    with op.batch_alter_table("task_workers", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_workers_task_id"), ["task_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_task_workers_user_id"), ["user_id"], unique=False)

    op.create_table(
        "prompts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("text_hash", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=200), nullable=True),
        sa.Column("external_id", sa.String(length=200), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("times_used", sa.Integer(), nullable=False),
        sa.Column("times_fooled", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["round_id"], ["rounds.id"], name=op.f("fk_prompts_round_id_rounds")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prompts")),
        sa.UniqueConstraint("round_id", "text_hash", name="uq_prompts_round_text_hash"),
    )
    with op.batch_alter_table("prompts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_prompts_round_id"), ["round_id"], unique=False)
        batch_op.create_index("ix_prompts_round_usage", ["round_id", "times_used"], unique=False)

    op.create_table(
        "assignments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("writer_id", sa.Integer(), nullable=False),
        sa.Column("prompt_id", sa.Integer(), nullable=True),
        sa.Column(
            "condition", sa.Enum("prompt", "no_prompt", name="condition", native_enum=False, length=20), nullable=False
        ),
        sa.Column("target_label", sa.JSON(), nullable=False),
        sa.Column("tries_used", sa.Integer(), nullable=False),
        sa.Column("tries_allowed", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum("active", "submitted", "skipped", "expired", name="assignmentstatus", native_enum=False, length=20),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["prompt_id"], ["prompts.id"], name=op.f("fk_assignments_prompt_id_prompts")),
        sa.ForeignKeyConstraint(["round_id"], ["rounds.id"], name=op.f("fk_assignments_round_id_rounds")),
        sa.ForeignKeyConstraint(["writer_id"], ["users.id"], name=op.f("fk_assignments_writer_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_assignments")),
    )
    with op.batch_alter_table("assignments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_assignments_prompt_id"), ["prompt_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_assignments_round_id"), ["round_id"], unique=False)
        batch_op.create_index("ix_assignments_round_writer_status", ["round_id", "writer_id", "status"], unique=False)
        batch_op.create_index(batch_op.f("ix_assignments_writer_id"), ["writer_id"], unique=False)

    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("assignment_id", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("target_span", sa.JSON(), nullable=True),
        sa.Column(
            "status",
            sa.Enum("pending", "scored", "model_unavailable", name="attemptstatus", native_enum=False, length=20),
            nullable=False,
        ),
        sa.Column("counts_as_try", sa.Boolean(), nullable=False),
        sa.Column("prediction", sa.JSON(), nullable=True),
        sa.Column("probabilities", sa.JSON(), nullable=True),
        sa.Column("model_id", sa.String(length=200), nullable=True),
        sa.Column("model_version", sa.String(length=200), nullable=True),
        sa.Column("model_endpoint", sa.String(length=500), nullable=True),
        sa.Column("model_error", sa.Text(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("input_truncated", sa.Boolean(), nullable=True),
        sa.Column("edit_distance", sa.Float(), nullable=True),
        sa.Column("seconds_since_start", sa.Float(), nullable=False),
        sa.Column("fooled", sa.Boolean(), nullable=True),
        sa.Column("confirmed", sa.Boolean(), nullable=True),
        sa.Column("judged_label", sa.JSON(), nullable=True),
        sa.Column("confirmed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("scored_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["assignment_id"], ["assignments.id"], name=op.f("fk_attempts_assignment_id_assignments")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("assignment_id", "idempotency_key", name="uq_attempts_assignment_idempotency_key"),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_attempts_assignment_id"), ["assignment_id"], unique=False)

    op.create_table(
        "examples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("assignment_id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("writer_id", sa.Integer(), nullable=False),
        sa.Column("prompt_id", sa.Integer(), nullable=True),
        sa.Column(
            "condition", sa.Enum("prompt", "no_prompt", name="condition", native_enum=False, length=20), nullable=False
        ),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("target_label", sa.JSON(), nullable=False),
        sa.Column("model_prediction", sa.JSON(), nullable=True),
        sa.Column("model_id", sa.String(length=200), nullable=True),
        sa.Column("fooled", sa.Boolean(), nullable=False),
        sa.Column("extras", sa.JSON(), nullable=False),
        sa.Column(
            "status",
            sa.Enum("validating", "validated", "dropped", name="examplestatus", native_enum=False, length=20),
            nullable=False,
        ),
        sa.Column("validation_count", sa.Integer(), nullable=False),
        sa.Column("validations_needed", sa.Integer(), nullable=False),
        sa.Column("requeue_count", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("validation_count >= 0", name=op.f("ck_examples_validation_count_nonnegative")),
        sa.ForeignKeyConstraint(
            ["assignment_id"], ["assignments.id"], name=op.f("fk_examples_assignment_id_assignments")
        ),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], name=op.f("fk_examples_attempt_id_attempts")),
        sa.ForeignKeyConstraint(["prompt_id"], ["prompts.id"], name=op.f("fk_examples_prompt_id_prompts")),
        sa.ForeignKeyConstraint(["round_id"], ["rounds.id"], name=op.f("fk_examples_round_id_rounds")),
        sa.ForeignKeyConstraint(["writer_id"], ["users.id"], name=op.f("fk_examples_writer_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_examples")),
        sa.UniqueConstraint("assignment_id", name=op.f("uq_examples_assignment_id")),
        sa.UniqueConstraint("attempt_id", name=op.f("uq_examples_attempt_id")),
    )
    with op.batch_alter_table("examples", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_examples_prompt_id"), ["prompt_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_examples_round_id"), ["round_id"], unique=False)
        batch_op.create_index("ix_examples_round_queue", ["round_id", "status", "validation_count"], unique=False)
        batch_op.create_index(batch_op.f("ix_examples_writer_id"), ["writer_id"], unique=False)

    op.create_table(
        "validation_claims",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("example_id", sa.Integer(), nullable=False),
        sa.Column("validator_id", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["example_id"], ["examples.id"], name=op.f("fk_validation_claims_example_id_examples")),
        sa.ForeignKeyConstraint(["validator_id"], ["users.id"], name=op.f("fk_validation_claims_validator_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_validation_claims")),
        sa.UniqueConstraint("example_id", "validator_id", name="uq_validation_claims_example_validator"),
    )
    with op.batch_alter_table("validation_claims", schema=None) as batch_op:
        batch_op.create_index("ix_validation_claims_example_expires", ["example_id", "expires_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_validation_claims_validator_id"), ["validator_id"], unique=False)

    op.create_table(
        "validations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("example_id", sa.Integer(), nullable=False),
        sa.Column("validator_id", sa.Integer(), nullable=False),
        sa.Column("label", sa.JSON(), nullable=False),
        sa.Column("flagged", sa.Boolean(), nullable=False),
        sa.Column("flag_reason", sa.Text(), nullable=True),
        sa.Column("seconds_taken", sa.Float(), nullable=True),
        sa.Column("counted", sa.Boolean(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["example_id"], ["examples.id"], name=op.f("fk_validations_example_id_examples")),
        sa.ForeignKeyConstraint(["validator_id"], ["users.id"], name=op.f("fk_validations_validator_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_validations")),
        sa.UniqueConstraint("example_id", "validator_id", name="uq_validations_example_validator"),
    )
    with op.batch_alter_table("validations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_validations_example_id"), ["example_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_validations_validator_id"), ["validator_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""

    with op.batch_alter_table("validations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_validations_validator_id"))
        batch_op.drop_index(batch_op.f("ix_validations_example_id"))

    op.drop_table("validations")
    with op.batch_alter_table("validation_claims", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_validation_claims_validator_id"))
        batch_op.drop_index("ix_validation_claims_example_expires")

    op.drop_table("validation_claims")
    with op.batch_alter_table("examples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_examples_writer_id"))
        batch_op.drop_index("ix_examples_round_queue")
        batch_op.drop_index(batch_op.f("ix_examples_round_id"))
        batch_op.drop_index(batch_op.f("ix_examples_prompt_id"))

    op.drop_table("examples")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attempts_assignment_id"))

    op.drop_table("attempts")
    with op.batch_alter_table("assignments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_assignments_writer_id"))
        batch_op.drop_index("ix_assignments_round_writer_status")
        batch_op.drop_index(batch_op.f("ix_assignments_round_id"))
        batch_op.drop_index(batch_op.f("ix_assignments_prompt_id"))

    op.drop_table("assignments")
    with op.batch_alter_table("prompts", schema=None) as batch_op:
        batch_op.drop_index("ix_prompts_round_usage")
        batch_op.drop_index(batch_op.f("ix_prompts_round_id"))

    op.drop_table("prompts")
    with op.batch_alter_table("task_workers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_workers_user_id"))
        batch_op.drop_index(batch_op.f("ix_task_workers_task_id"))

    op.drop_table("task_workers")
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_rounds_task_id"))

    op.drop_table("rounds")
    with op.batch_alter_table("quiz_attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_quiz_attempts_user_id"))
        batch_op.drop_index(batch_op.f("ix_quiz_attempts_task_id"))

    op.drop_table("quiz_attempts")
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_versions_task_id"))

    op.drop_table("model_versions")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_created_by_id"))

    op.drop_table("tasks")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_created_at"))
        batch_op.drop_index(batch_op.f("ix_audit_log_actor_id"))

    op.drop_table("audit_log")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_tokens_user_id"))

    op.drop_table("api_tokens")
    op.drop_table("users")
