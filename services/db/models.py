"""SQLAlchemy 2 models of the domain (docs/design.md "Domain model").

The schema itself is created and changed only by the Alembic migrations in ``migrations/``;
these classes describe it for the ORM and for ``alembic revision --autogenerate``.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dt.datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON}


class Role(str, enum.Enum):
    writer = "writer"
    validator = "validator"
    researcher = "researcher"
    admin = "admin"
    client = "client"  # a program that pulls built datasets (REST client)


class TaskRole(str, enum.Enum):
    """A researcher's place on one task (``task_members``): owners also decide who else is
    on it; members do everything else a researcher does with the task."""

    owner = "owner"
    member = "member"


class RoundStatus(str, enum.Enum):
    collecting = "collecting"
    validating = "validating"
    closed = "closed"
    built = "built"


class Condition(str, enum.Enum):
    prompt = "prompt"
    no_prompt = "no_prompt"


class PromptStrategy(str, enum.Enum):
    unused_first = "unused_first"
    least_used = "least_used"
    least_fooled = "least_fooled"


class TargetLabelMode(str, enum.Enum):
    writer_choice = "writer_choice"
    balanced = "balanced"


class AssignmentStatus(str, enum.Enum):
    active = "active"
    submitted = "submitted"
    skipped = "skipped"
    expired = "expired"


class AttemptStatus(str, enum.Enum):
    pending = "pending"
    scored = "scored"
    model_unavailable = "model_unavailable"


class ExampleStatus(str, enum.Enum):
    validating = "validating"
    validated = "validated"
    dropped = "dropped"


class ModelVersionStatus(str, enum.Enum):
    trained = "trained"
    evaluated = "evaluated"
    promoted = "promoted"
    retired = "retired"


class ExampleOrigin(str, enum.Enum):
    written = "written"  # submitted by a writer through an assignment
    harvested = "harvested"  # sampled from a natural corpus (DynaSent §3.2); no writer
    # brought in from a labelled dataset or earlier crowd responses (docs/round_builder.md "Imports"); no writer
    imported = "imported"


def _enum(enum_cls: type[enum.Enum], length: int = 20) -> Any:
    # Stored as plain strings with a CHECK constraint: portable and easy to read in SQL.
    from sqlalchemy import Enum

    return Enum(enum_cls, native_enum=False, length=length, validate_strings=True)


class User(Base):
    """A person or program with an account: writers, validators, researchers, admins."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    display_name: Mapped[str | None] = mapped_column(String(200))
    roles: Mapped[list[Any]] = mapped_column(JSON, default=list)
    password_hash: Mapped[str | None] = mapped_column(String(200))
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # Created by a study link (services/domain/study.py), not by an admin: such a worker reaches
    # only the tasks and roles of their study sessions (services/authorization.py).
    made_by_link: Mapped[bool] = mapped_column(Boolean, default=False)
    # Created by an import of crowd responses (rounds/models/round_imports.py): a pseudonymous
    # worker of another collection who cannot log in and is never paid here (services/domain/ledger.py).
    made_by_import: Mapped[bool] = mapped_column(Boolean, default=False)
    study_sessions: Mapped[list[StudySession]] = relationship(viewonly=True, order_by="StudySession.id")

    def has_role(self, role: Role) -> bool:
        return role.value in (self.roles or []) or Role.admin.value in (self.roles or [])


class ApiToken(Base):
    """A bearer token. Only its SHA-256 is stored; the plain token is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime | None]
    revoked_at: Mapped[dt.datetime | None]
    last_used_at: Mapped[dt.datetime | None]

    user: Mapped[User] = relationship()


class AuditEntry(Base):
    """What researchers and admins did, and to what."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(primary_key=True)
    actor_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True)
    action: Mapped[str] = mapped_column(String(64))
    target_type: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str] = mapped_column(String(64))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)


class Task(Base):
    """A collection task, defined by a validated YAML file (services.taskdef)."""

    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    title: Mapped[str] = mapped_column(String(200))
    family: Mapped[str] = mapped_column(String(32))
    definition: Mapped[dict[str, Any]] = mapped_column(JSON)
    definition_yaml: Mapped[str] = mapped_column(Text)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    rounds: Mapped[list[Round]] = relationship(back_populates="task", order_by="Round.number")
    # Researchers' authorization decisions about the task read its members
    # (services/authorization.py); a crowdworker's are decided by role and never read them. So
    # they are loaded when first read (one query), not with every task: a writer's check
    # loads its task three times and paid a members query each time (docs/benchmarks.md,
    # "API CPU"). Lists of tasks load them for the whole list in one query
    # (services.domain.tasks.list_tasks: no query per task).
    members: Mapped[list[TaskMember]] = relationship(
        back_populates="task",
        lazy="select",
        order_by="TaskMember.id",
        foreign_keys="TaskMember.task_id",
        cascade="all, delete-orphan",
    )

    def member_role(self, user: User) -> TaskRole | None:
        """``user``'s place on this task (owner or member), or None."""
        return next((member.role for member in self.members if member.user_id == user.id), None)


class TaskMember(Base):
    """A researcher on a task: its owners (the creator, and whoever an owner adds as one) and
    members. Who may manage the task is decided from these rows (services/authorization.py)."""

    __tablename__ = "task_members"
    __table_args__ = (UniqueConstraint("task_id", "user_id", name="uq_task_members_task_user"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    role: Mapped[TaskRole] = mapped_column(_enum(TaskRole))
    added_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    task: Mapped[Task] = relationship(back_populates="members", foreign_keys=[task_id])
    user: Mapped[User] = relationship(foreign_keys=[user_id])


class ModelServer(Base):
    """A model server an admin registered: the only URLs the API and its jobs call. Rounds and
    promotions name it; its admin token (``POST /admin/reload``) is sent only to its ``url`` and
    is never returned by the API."""

    __tablename__ = "model_servers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    url: Mapped[str] = mapped_column(String(500))
    admin_token: Mapped[str | None] = mapped_column(String(500))
    description: Mapped[str | None] = mapped_column(Text)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    created_by: Mapped[User | None] = relationship()


class Round(Base):
    """One round of collection: collecting -> validating -> closed -> built."""

    __tablename__ = "rounds"
    __table_args__ = (
        UniqueConstraint("task_id", "number", name="uq_rounds_task_number"),
        CheckConstraint("no_prompt_fraction >= 0 AND no_prompt_fraction <= 1", name="no_prompt_fraction_range"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[RoundStatus] = mapped_column(_enum(RoundStatus), default=RoundStatus.collecting)
    # Names of registered model servers (ModelServer.name), resolved to URLs at call time.
    model_servers: Mapped[list[Any]] = mapped_column(JSON, default=list)
    prompt_strategy: Mapped[PromptStrategy] = mapped_column(_enum(PromptStrategy), default=PromptStrategy.unused_first)
    no_prompt_fraction: Mapped[float] = mapped_column(Float, default=0.0)
    target_label_mode: Mapped[TargetLabelMode] = mapped_column(_enum(TargetLabelMode), default=TargetLabelMode.balanced)
    notes: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    opened_at: Mapped[dt.datetime | None]
    validating_at: Mapped[dt.datetime | None]
    closed_at: Mapped[dt.datetime | None]
    built_at: Mapped[dt.datetime | None]

    task: Mapped[Task] = relationship(back_populates="rounds")


class Prompt(Base):
    """An inspirational sentence shown to writers (DynaSent §4.2)."""

    __tablename__ = "prompts"
    __table_args__ = (
        UniqueConstraint("round_id", "text_hash", name="uq_prompts_round_text_hash"),
        Index("ix_prompts_round_usage", "round_id", "times_used"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    text: Mapped[str] = mapped_column(Text)
    text_hash: Mapped[str] = mapped_column(String(64))
    source: Mapped[str | None] = mapped_column(String(200))
    external_id: Mapped[str | None] = mapped_column(String(200))
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    times_used: Mapped[int] = mapped_column(Integer, default=0)
    times_fooled: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class TaskWorker(Base):
    """A worker's standing on one task: onboarding quiz, qualification, agreement."""

    __tablename__ = "task_workers"
    __table_args__ = (UniqueConstraint("task_id", "user_id", name="uq_task_workers_task_user"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    quiz_attempts: Mapped[int] = mapped_column(Integer, default=0)
    onboarding_passed: Mapped[bool] = mapped_column(Boolean, default=False)
    qualified: Mapped[bool] = mapped_column(Boolean, default=True)
    unqualified_reason: Mapped[str | None] = mapped_column(Text)
    agreement_rate: Mapped[float | None] = mapped_column(Float)
    agreement_labels: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class QuizAttempt(Base):
    __tablename__ = "quiz_attempts"

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    answers: Mapped[list[Any]] = mapped_column(JSON)
    correct: Mapped[int] = mapped_column(Integer)
    passed: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Assignment(Base):
    """A writer's turn at one prompt with one target label."""

    __tablename__ = "assignments"
    __table_args__ = (Index("ix_assignments_round_writer_status", "round_id", "writer_id", "status"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    writer_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    prompt_id: Mapped[int | None] = mapped_column(ForeignKey("prompts.id"), index=True)
    condition: Mapped[Condition] = mapped_column(_enum(Condition))
    target_label: Mapped[list[Any]] = mapped_column(JSON)
    tries_used: Mapped[int] = mapped_column(Integer, default=0)
    tries_allowed: Mapped[int] = mapped_column(Integer)
    status: Mapped[AssignmentStatus] = mapped_column(_enum(AssignmentStatus), default=AssignmentStatus.active)
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime]
    finished_at: Mapped[dt.datetime | None]

    prompt: Mapped[Prompt | None] = relationship()
    round: Mapped[Round] = relationship()
    attempts: Mapped[list[Attempt]] = relationship(back_populates="assignment", order_by="Attempt.id")


class Attempt(Base):
    """One "check with the model": the text, what the model said, and the writer's confirmation."""

    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("assignment_id", "idempotency_key", name="uq_attempts_assignment_idempotency_key"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    assignment_id: Mapped[int] = mapped_column(ForeignKey("assignments.id"), index=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    text: Mapped[str] = mapped_column(Text)
    target_span: Mapped[list[Any] | None] = mapped_column(JSON)
    status: Mapped[AttemptStatus] = mapped_column(_enum(AttemptStatus), default=AttemptStatus.pending)
    counts_as_try: Mapped[bool] = mapped_column(Boolean, default=False)
    prediction: Mapped[list[Any] | None] = mapped_column(JSON)
    probabilities: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    model_id: Mapped[str | None] = mapped_column(String(200))
    model_version: Mapped[str | None] = mapped_column(String(200))
    # What the forward pass ran at (fp32, bf16, int8), as the model server said; None: it did not say.
    model_precision: Mapped[str | None] = mapped_column(String(40))
    model_endpoint: Mapped[str | None] = mapped_column(String(500))  # URL that answered; never shown to writers
    model_error: Mapped[str | None] = mapped_column(Text)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    input_truncated: Mapped[bool | None] = mapped_column(Boolean)
    edit_distance: Mapped[float | None] = mapped_column(Float)
    seconds_since_start: Mapped[float] = mapped_column(Float)
    fooled: Mapped[bool | None] = mapped_column(Boolean)
    confirmed: Mapped[bool | None] = mapped_column(Boolean)
    judged_label: Mapped[list[Any] | None] = mapped_column(JSON)
    confirmed_at: Mapped[dt.datetime | None]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    scored_at: Mapped[dt.datetime | None]

    assignment: Mapped[Assignment] = relationship(back_populates="attempts")


class Example(Base):
    """What validators label: a writer's submitted attempt with their confirmation and extra
    fields, or a sentence harvested from a natural corpus (no writer, assignment or attempt)."""

    __tablename__ = "examples"
    __table_args__ = (
        Index("ix_examples_round_queue", "round_id", "status", "validation_count"),
        CheckConstraint("validation_count >= 0", name="validation_count_nonnegative"),
        CheckConstraint("origin IN ('written', 'harvested', 'imported')", name="origin_values"),
        # A written example always has its writer, assignment and attempt; harvested and
        # imported ones lack them.
        CheckConstraint(
            "origin <> 'written' OR (writer_id IS NOT NULL AND assignment_id IS NOT NULL AND attempt_id IS NOT NULL)",
            name="written_has_writer",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    assignment_id: Mapped[int | None] = mapped_column(ForeignKey("assignments.id"), unique=True)
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id"), unique=True)
    writer_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True)
    prompt_id: Mapped[int | None] = mapped_column(ForeignKey("prompts.id"), index=True)
    origin: Mapped[ExampleOrigin] = mapped_column(
        _enum(ExampleOrigin), default=ExampleOrigin.written, server_default=ExampleOrigin.written.value
    )
    # Harvested examples: corpus, document id, rating, sentence index, sampling pool, model version.
    # Imported examples: the import (file, sha256, row) and, from a labelled dataset, the imported
    # gold ("gold", "gold_votes", "responses", "split"; docs/round_builder.md "Imports").
    source_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Imported examples: the row's id in the file (the import's id column), as text, so that an
    # export joins back to its source (migration 0023); null for other origins and id-less rows.
    source_id: Mapped[str | None] = mapped_column(String(500))
    condition: Mapped[Condition] = mapped_column(_enum(Condition))
    text: Mapped[str] = mapped_column(Text)
    target_label: Mapped[list[Any]] = mapped_column(JSON)
    model_prediction: Mapped[list[Any] | None] = mapped_column(JSON)
    model_id: Mapped[str | None] = mapped_column(String(200))
    fooled: Mapped[bool] = mapped_column(Boolean)
    extras: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[ExampleStatus] = mapped_column(_enum(ExampleStatus), default=ExampleStatus.validating)
    validation_count: Mapped[int] = mapped_column(Integer, default=0)
    validations_needed: Mapped[int] = mapped_column(Integer)
    requeue_count: Mapped[int] = mapped_column(Integer, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # services.text.duplicate_hash of the text (and target): what makes two examples the same
    # text for the duplicate rules (docs/design.md "Duplicates"; migration 0017).
    normalized_hash: Mapped[str | None] = mapped_column(String(64), index=True)
    # services.text.duplicate_key itself, for the task's optional near-duplicate check (rapidfuzz
    # over the keys of examples of a similar length, without normalizing each one again).
    normalized_text: Mapped[str | None] = mapped_column(Text)

    round: Mapped[Round] = relationship()
    attempt: Mapped[Attempt | None] = relationship()
    assignment: Mapped[Assignment | None] = relationship()
    validations: Mapped[list[Validation]] = relationship(back_populates="example", order_by="Validation.id")


class Validation(Base):
    """One validator's label(s) for one example. ``counted`` is false for unqualified validators."""

    __tablename__ = "validations"
    __table_args__ = (
        UniqueConstraint("example_id", "validator_id", name="uq_validations_example_validator"),
        # A validator's labels with their examples, from the index alone: the label path's
        # per-round count and batch-window judging (migration 0010).
        Index("ix_validations_validator_example", "validator_id", "example_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    example_id: Mapped[int] = mapped_column(ForeignKey("examples.id"), index=True)
    validator_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    label: Mapped[list[Any]] = mapped_column(JSON)
    flagged: Mapped[bool] = mapped_column(Boolean, default=False)
    flag_reason: Mapped[str | None] = mapped_column(Text)
    seconds_taken: Mapped[float | None] = mapped_column(Float)
    counted: Mapped[bool] = mapped_column(Boolean, default=True)
    # 0: the example's first set of labels; 1: its re-annotation by new validators after the
    # first set gave no gold (EthioEmo's re-queue, agreement.requeue_disagreements). Gold is
    # decided on the labels of the example's last pass only (services.domain.labels.gold_of_passes).
    annotation_pass: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    example: Mapped[Example] = relationship(back_populates="validations")


class ModelVersion(Base):
    """A trained classifier directory and where it stands: trained -> evaluated -> promoted
    -> retired (rounds.models.registry, rounds.models.promotion). ``model_id`` and ``version`` are the strings of its
    ``dynaloop_model.json``, the same ones every attempt records from the model server, so
    attempts join to the registry on (model_id, model_version)."""

    __tablename__ = "model_versions"
    __table_args__ = (
        UniqueConstraint("task_id", "name", name="uq_model_versions_task_name"),
        UniqueConstraint("task_id", "model_id", "version", name="uq_model_versions_task_model_version"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    model_id: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(200))
    directory: Mapped[str] = mapped_column(Text)
    base_model: Mapped[str] = mapped_column(String(500))
    trained_for_round: Mapped[int | None] = mapped_column(Integer)
    labels: Mapped[list[Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # training metrics
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # training sources and their hashes
    hyperparameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    evaluation: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # rounds.models.evaluate's results
    status: Mapped[ModelVersionStatus] = mapped_column(_enum(ModelVersionStatus), default=ModelVersionStatus.trained)
    endpoint: Mapped[str | None] = mapped_column(String(500))  # model server it was promoted to
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    evaluated_at: Mapped[dt.datetime | None]
    promoted_at: Mapped[dt.datetime | None]
    retired_at: Mapped[dt.datetime | None]


class ValidationClaim(Base):
    """An example held for a validator's current batch, so concurrent validators get
    different examples. Claims expire; the hard limit is still the conditional count."""

    __tablename__ = "validation_claims"
    __table_args__ = (
        UniqueConstraint("example_id", "validator_id", name="uq_validation_claims_example_validator"),
        Index("ix_validation_claims_example_expires", "example_id", "expires_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    example_id: Mapped[int] = mapped_column(ForeignKey("examples.id"))
    validator_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    expires_at: Mapped[dt.datetime]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class RoundBuild(Base):
    """One run of the round builder over a round: its settings, seed and report. The newest
    build of a round is the one exported; older builds stay for reproducibility."""

    __tablename__ = "round_builds"

    id: Mapped[int] = mapped_column(primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    seed: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    report: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class BuiltExample(Base):
    """An example's place in a build: split, gold and distributional labels, flags."""

    __tablename__ = "built_examples"
    __table_args__ = (
        UniqueConstraint("build_id", "example_id", name="uq_built_examples_build_example"),
        Index("ix_built_examples_build_split", "build_id", "split", "example_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("round_builds.id", ondelete="CASCADE"))
    example_id: Mapped[int] = mapped_column(ForeignKey("examples.id"), index=True)
    split: Mapped[str] = mapped_column(String(16))  # train | dev | test | excluded
    gold_label: Mapped[list[Any] | None] = mapped_column(JSON)
    gold_votes: Mapped[int | None] = mapped_column(Integer)
    responses: Mapped[int] = mapped_column(Integer)
    # The counted responses the build used, as [worker_id, label] pairs: the export shows
    # exactly what the gold label was computed from, even if labels change later.
    response_labels: Mapped[list[Any]] = mapped_column(JSON, default=list)
    distributional_label: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    model_based_label: Mapped[list[Any] | None] = mapped_column(JSON)
    flags: Mapped[list[Any]] = mapped_column(JSON, default=list)


class JobKind(str, enum.Enum):
    train = "train"
    evaluate = "evaluate"
    promote = "promote"


class JobStatus(str, enum.Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class JobQueue(str, enum.Enum):
    """Which workers may take a job (`dynaloop worker --queue`): any machine, or one with a GPU."""

    cpu = "cpu"
    gpu = "gpu"


class Job(Base):
    """Long researcher work (train, evaluate, promote), queued for a worker of its ``queue``
    (`dynaloop worker`, rounds.models.worker), which runs it in a process of its own (`dynaloop job
    run`), never inside the API (rounds.models.jobs). The worker writes ``heartbeat_at`` while the job
    is its; a job whose worker stopped reporting is reported failed instead of hanging as
    *running*. ``cancel_requested_at`` asks the worker to stop it."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint("progress >= 0 AND progress <= 1", name="progress_range"),
        Index("ix_jobs_task_kind_status", "task_id", "kind", "status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[JobKind] = mapped_column(_enum(JobKind))
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus), default=JobStatus.queued)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str] = mapped_column(Text, default="")
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # never holds a secret
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    log: Mapped[str] = mapped_column(Text, default="")  # the newest lines only (bounded)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    pid: Mapped[int | None] = mapped_column(Integer)
    host: Mapped[str | None] = mapped_column(String(255))
    queue: Mapped[JobQueue] = mapped_column(_enum(JobQueue), default=JobQueue.cpu)
    worker: Mapped[str | None] = mapped_column(String(255))  # JobWorker.name of the worker that took it
    heartbeat_at: Mapped[dt.datetime | None]
    cancel_requested_at: Mapped[dt.datetime | None]
    cancel_requested_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))

    task: Mapped[Task] = relationship()
    created_by: Mapped[User | None] = relationship(foreign_keys=[created_by_id])


class JobWorker(Base):
    """A `dynaloop worker` process: which queue it takes, where it runs, when it last reported
    (so a job can say that no worker of its queue is running)."""

    __tablename__ = "job_workers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    queue: Mapped[JobQueue] = mapped_column(_enum(JobQueue))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[int | None] = mapped_column(Integer)  # the job it runs now
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    stopped_at: Mapped[dt.datetime | None]


# The task queue's own tables (huey's SQL storage, rounds.models.queue): the messages that carry a
# job's id to a worker. Declared here so that Alembic creates them, on SQLite and PostgreSQL.


class QueueMessage(Base):
    __tablename__ = "queue_messages"
    __table_args__ = (Index("ix_queue_messages_queue_priority_id", "queue", "priority", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    queue: Mapped[str] = mapped_column(String(255))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    priority: Mapped[float] = mapped_column(Float, default=0.0)


class QueueSchedule(Base):
    __tablename__ = "queue_schedule"
    __table_args__ = (Index("ix_queue_schedule_queue_timestamp", "queue", "timestamp"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    queue: Mapped[str] = mapped_column(String(255))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    timestamp: Mapped[int] = mapped_column(BigInteger)


class QueueResult(Base):
    __tablename__ = "queue_results"

    queue: Mapped[str] = mapped_column(String(255), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[bytes] = mapped_column(LargeBinary)


class ModelReplica(Base):
    """A model-server replica that follows its task's promoted model (`dynaloop model-server
    --follow-task`): what it serves now, the promoted version it works towards (loading, serving
    or failed to load it) and when it last reported (rounds.models.replicas)."""

    __tablename__ = "model_replicas"
    __table_args__ = (UniqueConstraint("task_id", "name", name="uq_model_replicas_task_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    url: Mapped[str | None] = mapped_column(String(500))
    model_version_id: Mapped[int | None] = mapped_column(ForeignKey("model_versions.id"))
    model_id: Mapped[str | None] = mapped_column(String(200))
    version: Mapped[str | None] = mapped_column(String(200))
    precision: Mapped[str | None] = mapped_column(String(40))
    # The task's promoted version as the replica last read it, and when it was promoted (migration
    # 0014): the promotion it loads, serves or failed to load. Null: none was read.
    target_model_version_id: Mapped[int | None] = mapped_column(ForeignKey("model_versions.id"))
    target_promoted_at: Mapped[dt.datetime | None]
    state: Mapped[str] = mapped_column(String(20), default="starting")  # starting, loading, serving, failed, stopped
    message: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class DatasetUpload(Base):
    """A labelled file a task's researcher uploaded (``POST /tasks/{task}/datasets/uploads``),
    validated on arrival and stored as ``DATA_DIR/uploads/TASK/SHA256.FORMAT``; a job's data mix
    names it by ``name`` (rounds.models.uploads)."""

    __tablename__ = "dataset_uploads"
    __table_args__ = (UniqueConstraint("task_id", "name", name="uq_dataset_uploads_task_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    format: Mapped[str] = mapped_column(String(10))  # csv, tsv, jsonl or parquet
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int] = mapped_column(Integer)
    uploaded_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    task: Mapped[Task] = relationship()
    uploaded_by: Mapped[User | None] = relationship()


# --- crowd platforms: study links, study sessions, the pay ledger (docs/crowdsourcing.md) -------


class Platform(str, enum.Enum):
    prolific = "prolific"
    mturk = "mturk"
    generic = "generic"


class StudyRole(str, enum.Enum):
    writer = "writer"
    validator = "validator"


class StudySessionStatus(str, enum.Enum):
    active = "active"  # working (or not yet through onboarding)
    completed = "completed"  # met the link's quota: the platform's completion
    screened_out = "screened_out"  # failed onboarding or unqualified: the screened-out completion
    stopped = "stopped"  # the worker stopped before the quota (a partial completion)


class StudyLink(Base):
    """A link a researcher posts on a crowd platform for one round and one role. Workers open
    ``/study/{slug}`` with the platform's parameters; ``slug`` is random and unguessable."""

    __tablename__ = "study_links"
    __table_args__ = (
        CheckConstraint("quota >= 1", name="quota_positive"),
        CheckConstraint("max_workers IS NULL OR max_workers >= 1", name="max_workers_positive"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    slug: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    role: Mapped[StudyRole] = mapped_column(_enum(StudyRole))
    platform: Mapped[Platform] = mapped_column(_enum(Platform))
    # Examples per writer, or validation batches per validator, in one session.
    quota: Mapped[int] = mapped_column(Integer)
    max_workers: Mapped[int | None] = mapped_column(Integer)
    # generic platform: the query parameter that carries the worker's id.
    id_parameter: Mapped[str | None] = mapped_column(String(64))
    completion_code: Mapped[str] = mapped_column(String(64))
    screened_out_code: Mapped[str | None] = mapped_column(String(64))
    opens_at: Mapped[dt.datetime | None]
    closes_at: Mapped[dt.datetime | None]
    closed_at: Mapped[dt.datetime | None]  # closed by hand before closes_at
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # What a stopped session gets (docs/crowdsourcing.md, "Completion"): the platform's code for
    # a partial submission and the pay (minor units of the task's currency) that goes with it;
    # none: a stopped worker is told to return the submission and is not paid.
    partial_code: Mapped[str | None] = mapped_column(String(64))
    partial_pay_minor: Mapped[int | None] = mapped_column(Integer)
    # Whether a worker who came through a link of the other role may open this one too.
    other_role_allowed: Mapped[bool] = mapped_column(Boolean, default=False)
    # Validator links: what a validator whose round has no more work to serve gets
    # ("complete", "partial" or "return"; services/domain/study.py OUT_OF_WORK).
    when_out_of_work: Mapped[str] = mapped_column(String(16), default="complete")
    # The currency the platform's study pays in (ISO 4217; Prolific: GBP or USD, MTurk: USD);
    # None: the task's pay policy's currency. A payout batch in another currency is refused.
    currency: Mapped[str | None] = mapped_column(String(3))

    task: Mapped[Task] = relationship()
    round: Mapped[Round] = relationship()


class PlatformAccount(Base):
    """The one dynaloop user behind a crowd platform's worker id. The id itself is stored only as
    a keyed hash (HMAC with DYNALOOP_SECRET_KEY): one platform id never gets two users."""

    __tablename__ = "platform_accounts"
    __table_args__ = (UniqueConstraint("platform", "id_hash", name="uq_platform_accounts_platform_id_hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    platform: Mapped[Platform] = mapped_column(_enum(Platform))
    id_hash: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # The link that created the account and a keyed hash (HMAC with DYNALOOP_SECRET_KEY) of the
    # client address it came from, never the address: the hourly caps on new workers count these.
    link_id: Mapped[int | None] = mapped_column(ForeignKey("study_links.id"), index=True)
    address_hash: Mapped[str | None] = mapped_column(String(64), index=True)

    user: Mapped[User] = relationship()


class StudySession(Base):
    """One worker's visit through one study link: at most one per link and platform id,
    resumed when the link is opened again."""

    __tablename__ = "study_sessions"
    __table_args__ = (
        UniqueConstraint("link_id", "user_id", name="uq_study_sessions_link_user"),
        Index("ix_study_sessions_link_status", "link_id", "status"),
        # One session per worker per round and role, whatever the link (NULLs: sessions started
        # before the columns existed, never in conflict).
        Index("uq_study_sessions_user_round_role", "user_id", "round_id", "role", unique=True),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    link_id: Mapped[int] = mapped_column(ForeignKey("study_links.id"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    status: Mapped[StudySessionStatus] = mapped_column(_enum(StudySessionStatus), default=StudySessionStatus.active)
    # Kept in the clear only where paying needs them: the platform's worker id (Prolific's
    # participant id, MTurk's worker id), its study or HIT id, and its session or assignment id.
    platform_worker_id: Mapped[str | None] = mapped_column(String(128))
    platform_study_id: Mapped[str | None] = mapped_column(String(128))
    platform_session_id: Mapped[str | None] = mapped_column(String(128))
    submit_to: Mapped[str | None] = mapped_column(String(200))  # MTurk's turkSubmitTo (an allowed host)
    units_done: Mapped[int] = mapped_column(Integer, default=0)  # examples or batches toward the quota
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[dt.datetime | None]
    # The link's round and role, copied so that the unique index above holds across links.
    round_id: Mapped[int | None] = mapped_column(ForeignKey("rounds.id"))
    role: Mapped[StudyRole | None] = mapped_column(_enum(StudyRole))
    # The session's one API token: re-opening the link replaces it (same expiry), never adds one.
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"))
    # How an ended session ended: "quota", "stop" or "out_of_work" (the validator's round had no
    # more work); the completion a stopped session gets depends on it.
    end_reason: Mapped[str | None] = mapped_column(String(16))

    link: Mapped[StudyLink] = relationship()
    user: Mapped[User] = relationship()


class LedgerKind(str, enum.Enum):
    base_pay = "base_pay"  # a completed session
    writer_bonus = "writer_bonus"  # an example that fooled the model and was validated as intended
    validator_bonus = "validator_bonus"  # a validation batch that agreed with the majority
    correction = "correction"  # a later row that changes an earlier one (never edited in place)


class LedgerEntry(Base):
    """What a worker earned, in minor units of the task's currency. Append-only: a correction
    is a new row pointing at the one it corrects. ``event_key`` names the rewarded event
    (``session:12``, ``example:345``, ``batch:7:3``), unique per task and kind, so computing the
    ledger again never pays an event twice."""

    __tablename__ = "ledger_entries"
    __table_args__ = (
        UniqueConstraint("task_id", "kind", "event_key", name="uq_ledger_entries_task_kind_event"),
        Index("ix_ledger_entries_task_user", "task_id", "user_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"))
    round_id: Mapped[int | None] = mapped_column(ForeignKey("rounds.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    session_id: Mapped[int | None] = mapped_column(ForeignKey("study_sessions.id"), index=True)
    kind: Mapped[LedgerKind] = mapped_column(_enum(LedgerKind))
    event_key: Mapped[str] = mapped_column(String(128))
    amount_minor: Mapped[int] = mapped_column(Integer)  # negative only in a correction
    currency: Mapped[str] = mapped_column(String(3))
    reason: Mapped[str] = mapped_column(Text)
    corrects_id: Mapped[int | None] = mapped_column(ForeignKey("ledger_entries.id"))
    # The version of the task's pay policy (pay_policies.version) the row was computed under;
    # None for a correction (a researcher's amount, no policy's) and for rows written before
    # policies were versioned on a task that had no pay block (migration 0021).
    pay_policy_version: Mapped[int | None] = mapped_column(Integer)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    task: Mapped[Task] = relationship()


class PayoutStatus(str, enum.Enum):
    created = "created"  # exported; not yet known to be paid
    paid = "paid"  # the researcher says the platform paid it
    cancelled = "cancelled"  # never paid: its ledger entries are payable again


class PayoutBatch(Base):
    """One recorded export of bonuses for one study link (a Prolific study, an MTurk HIT group):
    its lines, totals and the exact file (services/domain/payouts.py). A batch is never edited
    but for its status; corrections are new ledger entries that a later batch pays."""

    __tablename__ = "payout_batches"
    __table_args__ = (
        CheckConstraint("line_count >= 1", name="line_count_positive"),
        CheckConstraint("total_minor >= 1", name="total_positive"),
        Index("ix_payout_batches_task_link", "task_id", "link_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"))
    link_id: Mapped[int] = mapped_column(ForeignKey("study_links.id"))
    platform: Mapped[Platform] = mapped_column(_enum(Platform))
    currency: Mapped[str] = mapped_column(String(3))
    status: Mapped[PayoutStatus] = mapped_column(_enum(PayoutStatus), default=PayoutStatus.created)
    line_count: Mapped[int] = mapped_column(Integer)
    total_minor: Mapped[int] = mapped_column(BigInteger)
    filename: Mapped[str] = mapped_column(String(200))
    file_text: Mapped[str] = mapped_column(Text)  # the exact bytes (UTF-8) every download answers
    note: Mapped[str | None] = mapped_column(Text)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    paid_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    paid_at: Mapped[dt.datetime | None]
    cancelled_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    cancelled_at: Mapped[dt.datetime | None]
    # Paying through the platform's API (`dynaloop ledger pay`, migration 0022): where it stands
    # between runs (Prolific's bulk bonus), and the running command's claim on the batch.
    platform_state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    pay_run_id: Mapped[str | None] = mapped_column(String(32))
    pay_run_at: Mapped[dt.datetime | None]

    task: Mapped[Task] = relationship()
    link: Mapped[StudyLink] = relationship()


class PayoutLine(Base):
    """One line of a payout batch: one worker (MTurk: one assignment) and the positive amount the
    ledger entries it pays sum to. The ``platform_*`` columns and ``paid_at`` record what the
    platform answered when the line is paid through its API."""

    __tablename__ = "payout_lines"
    __table_args__ = (
        UniqueConstraint("batch_id", "line_number", name="uq_payout_lines_batch_line"),
        UniqueConstraint("batch_id", "unique_request_token", name="uq_payout_lines_batch_token"),
        CheckConstraint("amount_minor >= 1", name="amount_positive"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("payout_batches.id"), index=True)
    line_number: Mapped[int] = mapped_column(Integer)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    session_id: Mapped[int | None] = mapped_column(ForeignKey("study_sessions.id"))
    platform_worker_id: Mapped[str] = mapped_column(String(128))
    assignment_id: Mapped[str | None] = mapped_column(String(128))  # MTurk's AssignmentId
    amount_minor: Mapped[int] = mapped_column(BigInteger)
    unique_request_token: Mapped[str] = mapped_column(String(64))  # MTurk SendBonus's UniqueRequestToken
    platform_status: Mapped[str | None] = mapped_column(String(64))
    platform_reference: Mapped[str | None] = mapped_column(String(200))
    platform_answer: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    paid_at: Mapped[dt.datetime | None]


class PayoutEvent(Base):
    """A ledger entry paid by a payout line. ``claimed_entry_id`` is the entry's id while the
    batch is not cancelled and NULL once it is: its unique constraint lets the database, not a
    check in Python, refuse a second live batch for one entry (two concurrent exports included)."""

    __tablename__ = "payout_events"
    __table_args__ = (
        UniqueConstraint("claimed_entry_id", name="uq_payout_events_claimed_entry_id"),
        CheckConstraint("claimed_entry_id IS NULL OR claimed_entry_id = ledger_entry_id", name="claim_is_the_entry"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("payout_batches.id"), index=True)
    line_id: Mapped[int] = mapped_column(ForeignKey("payout_lines.id"), index=True)
    ledger_entry_id: Mapped[int] = mapped_column(ForeignKey("ledger_entries.id"), index=True)
    claimed_entry_id: Mapped[int | None] = mapped_column(ForeignKey("ledger_entries.id"))


class PayoutReconciliation(Base):
    """A platform's record of what it paid, compared with a batch: the counts and the report
    (matched, missing and unexpected lines), bounded by the upload's bounds."""

    __tablename__ = "payout_reconciliations"

    id: Mapped[int] = mapped_column(primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("payout_batches.id"), index=True)
    matched: Mapped[int] = mapped_column(Integer)
    missing: Mapped[int] = mapped_column(Integer)
    unexpected: Mapped[int] = mapped_column(Integer)
    report: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class PayPolicyVersion(Base):
    """One version of a task's pay policy (services/domain/pay_policies.py). Versions are never
    edited: a change is a new row with the next number. ``policy`` is the policy as JSON,
    validated by services.taskdef.PayPolicy; it pays work done from ``effective_from`` on, until
    the next version's ``effective_from``."""

    __tablename__ = "pay_policies"
    __table_args__ = (UniqueConstraint("task_id", "version", name="uq_pay_policies_task_version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    policy: Mapped[dict[str, Any]] = mapped_column(JSON)
    effective_from: Mapped[dt.datetime] = mapped_column()
    note: Mapped[str] = mapped_column(Text, default="")
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ModelServerGrant(Base):
    """A registered model server granted to a task by an admin: the task's researchers may put
    it in their rounds' loop and promote their models to it (services/domain/model_servers.py).
    A server granted to more than one task is shared, and only an admin may swap its model."""

    __tablename__ = "model_server_grants"
    __table_args__ = (UniqueConstraint("server_id", "task_id", name="uq_model_server_grants_server_task"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    server_id: Mapped[int] = mapped_column(ForeignKey("model_servers.id", ondelete="CASCADE"), index=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    granted_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    granted_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    server: Mapped[ModelServer] = relationship()
    task: Mapped[Task] = relationship()
    granted_by: Mapped[User | None] = relationship()


class ExampleText(Base):
    """A normalized text (``services.text.duplicate_hash``) that an example of the task holds:
    one row per (task, text), so a second submission of the same text, however the requests
    interleave, fails on the primary key (docs/design.md "Duplicates"). The example is the first
    one with the text; repeats written before migration 0017 have no row of their own."""

    __tablename__ = "example_texts"

    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), primary_key=True)
    normalized_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    example_id: Mapped[int] = mapped_column(ForeignKey("examples.id"), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


# --- issue 26, validation integrity: control items and served validation batches ------------------


class ControlItem(Base):
    """A control (gold) item of a task: a text with its known label(s), mixed into validation
    batches to measure each validator's gold accuracy (services.domain.controls). It is never an
    example: it never enters a round's examples, statistics, ledger or builds. ``text_sha256``
    keeps one row per text and task (the task YAML's items are added once)."""

    __tablename__ = "control_items"
    __table_args__ = (UniqueConstraint("task_id", "text_sha256", name="uq_control_items_task_text"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    text: Mapped[str] = mapped_column(Text)
    text_sha256: Mapped[str] = mapped_column(String(64))
    labels: Mapped[list[Any]] = mapped_column(JSON)
    target_span: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    source: Mapped[str] = mapped_column(String(16))  # "task_yaml" or "api"
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ValidationBatch(Base):
    """One batch served to a validator in a round. A label is accepted only for an item of the
    validator's live batch: not expired and not closed (closed once every item is answered or
    can no longer be labelled, when the next batch is served). ``seed`` shuffles the items."""

    __tablename__ = "validation_batches"
    __table_args__ = (Index("ix_validation_batches_validator_round", "validator_id", "round_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    validator_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    seed: Mapped[int] = mapped_column(BigInteger)
    served_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime]
    closed_at: Mapped[dt.datetime | None]

    round: Mapped[Round] = relationship()
    items: Mapped[list[ValidationBatchItem]] = relationship(
        back_populates="batch", order_by="ValidationBatchItem.position"
    )


class ValidationBatchItem(Base):
    """One item of a served batch: an example or a control item, shown under ``item_key``, an
    opaque random id of this serving only, so that nothing the validator sees tells the two apart.
    A control answer is kept here (``label``, ``correct``); an example's label is a Validation."""

    __tablename__ = "validation_batch_items"
    __table_args__ = (
        UniqueConstraint("item_key", name="uq_validation_batch_items_item_key"),
        UniqueConstraint("batch_id", "position", name="uq_validation_batch_items_batch_position"),
        CheckConstraint("(example_id IS NULL) <> (control_item_id IS NULL)", name="one_kind"),
        Index("ix_validation_batch_items_example", "example_id"),
        Index("ix_validation_batch_items_control_item", "control_item_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("validation_batches.id"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    item_key: Mapped[str] = mapped_column(String(32))
    example_id: Mapped[int | None] = mapped_column(ForeignKey("examples.id"))
    control_item_id: Mapped[int | None] = mapped_column(ForeignKey("control_items.id"))
    answered_at: Mapped[dt.datetime | None]
    validation_id: Mapped[int | None] = mapped_column(ForeignKey("validations.id"))
    label: Mapped[list[Any] | None] = mapped_column(JSON)
    correct: Mapped[bool | None] = mapped_column(Boolean)
    flagged: Mapped[bool] = mapped_column(Boolean, default=False)
    flag_reason: Mapped[str | None] = mapped_column(Text)
    seconds_taken: Mapped[float | None] = mapped_column(Float)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))

    batch: Mapped[ValidationBatch] = relationship(back_populates="items")
    control_item: Mapped[ControlItem | None] = relationship()
    example: Mapped[Example | None] = relationship()


class AttentionCheckAnswer(Base):
    """One attention check served to a writer on a task (services.domain.attention): the
    question, options and expected answer as served (a later change to the task's YAML does not
    re-score it), and the writer's one answer. ``slot`` is the check's place in the writer's
    work (after ``slot`` times N finished assignments): one check per slot, so two concurrent
    requests serve one check. Never an example, never paid."""

    __tablename__ = "attention_check_answers"
    __table_args__ = (
        UniqueConstraint("task_id", "writer_id", "slot", name="uq_attention_check_answers_task_writer_slot"),
        Index("ix_attention_check_answers_writer", "writer_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    writer_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    slot: Mapped[int] = mapped_column(Integer)
    item_index: Mapped[int] = mapped_column(Integer)
    question: Mapped[str] = mapped_column(Text)
    options: Mapped[list[Any]] = mapped_column(JSON)
    expected: Mapped[str] = mapped_column(Text)
    served_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    answered_at: Mapped[dt.datetime | None]
    answer: Mapped[str | None] = mapped_column(Text)
    passed: Mapped[bool | None] = mapped_column(Boolean)

    task: Mapped[Task] = relationship()
