"""Request and response bodies of the REST API, one family per entity."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.db.models import (
    Assignment,
    Attempt,
    Example,
    PromptStrategy,
    Round,
    RoundStatus,
    TargetLabelMode,
    Task,
    User,
)

Label = str | list[str]


class ErrorBody(BaseModel):
    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    error: ErrorBody


_ERROR_DESCRIPTIONS = {
    401: "No token, or an unknown, revoked or expired one (at login: a wrong username or password).",
    403: "Your roles or status do not allow this (wrong role, quiz not passed, unqualified, your own example).",
    404: "No such task, round, example, user, job, or no such assignment or attempt of yours.",
    409: "The current state forbids it (duplicate, round not collecting, tries used up, ...).",
    410: "The assignment expired; request a new one.",
    413: "The request body is over the size limit.",
    422: "Bad input: `details.problems` lists each problem with what to fix.",
    429: "Too many requests from this token or address; see `Retry-After`.",
    503: "The database (or, where the operation uses it, the model server) is unavailable; nothing was "
         "saved, retry after `Retry-After` seconds.",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the error statuses an operation can answer; every error
    has the `{"error": {"code", "message", "details"}}` shape of :class:`ErrorResponse`."""
    return {code: {"model": ErrorResponse, "description": _ERROR_DESCRIPTIONS[code]} for code in codes}


# --- users and tokens -----------------------------------------------------------------


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(min_length=1, max_length=64)
    roles: list[str] = Field(min_length=1, examples=[["writer", "validator"]])
    display_name: str | None = Field(None, max_length=200)
    password: str | None = Field(None, min_length=8, max_length=200)


class UserPublic(BaseModel):
    id: int
    username: str
    display_name: str | None
    roles: list[str]
    is_active: bool

    @classmethod
    def of(cls, user: User) -> UserPublic:
        return cls(id=user.id, username=user.username, display_name=user.display_name,
                   roles=list(user.roles), is_active=user.is_active)


class UsersPublic(BaseModel):
    data: list[UserPublic]
    count: int


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("api", min_length=1, max_length=100)
    expires_in_days: int | None = Field(None, ge=1, le=3650)


class TokenPublic(BaseModel):
    id: int
    name: str
    prefix: str
    token: str | None = Field(None, description="The plain token; shown only when it is created.")
    expires_at: dt.datetime | None


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=200)


class LoginResponse(BaseModel):
    token: str
    user: UserPublic


# --- tasks and rounds -----------------------------------------------------------------


class TaskCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    definition_yaml: str = Field(min_length=1, max_length=200_000, description="The task's YAML file.")


class TaskPublic(BaseModel):
    id: int
    name: str
    title: str
    family: str
    definition: dict[str, Any]
    created_at: dt.datetime

    @classmethod
    def of(cls, task: Task, *, with_answers: bool = False) -> TaskPublic:
        definition = dict(task.definition)
        quiz = definition.get("onboarding_quiz")
        if quiz and not with_answers:
            definition["onboarding_quiz"] = {
                **quiz,
                "questions": [{k: v for k, v in q.items() if k not in ("answer", "explanation")}
                              for q in quiz["questions"]],
            }
        return cls(id=task.id, name=task.name, title=task.title, family=task.family,
                   definition=definition, created_at=task.created_at)


class TasksPublic(BaseModel):
    data: list[TaskPublic]
    count: int


class RoundCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_endpoints: list[str] = Field(default_factory=list, max_length=20,
                                       examples=[["http://127.0.0.1:8001"]])
    prompt_strategy: PromptStrategy = PromptStrategy.unused_first
    no_prompt_fraction: float = Field(0.0, ge=0.0, le=1.0)
    target_label_mode: TargetLabelMode = TargetLabelMode.balanced
    notes: str | None = Field(None, max_length=5000)


class RoundStatusUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: RoundStatus


class RoundModelUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_endpoints: list[str] = Field(max_length=20)


class RoundPublic(BaseModel):
    id: int
    task: str
    number: int
    status: RoundStatus
    model_endpoints: list[str]
    prompt_strategy: PromptStrategy
    no_prompt_fraction: float
    target_label_mode: TargetLabelMode
    opened_at: dt.datetime | None
    validating_at: dt.datetime | None
    closed_at: dt.datetime | None

    @classmethod
    def of(cls, round_: Round) -> RoundPublic:
        return cls(id=round_.id, task=round_.task.name, number=round_.number, status=round_.status,
                   model_endpoints=list(round_.model_endpoints), prompt_strategy=round_.prompt_strategy,
                   no_prompt_fraction=round_.no_prompt_fraction, target_label_mode=round_.target_label_mode,
                   opened_at=round_.opened_at, validating_at=round_.validating_at, closed_at=round_.closed_at)


class RoundsPublic(BaseModel):
    data: list[RoundPublic]
    count: int


class PromptImportPublic(BaseModel):
    rows: int
    imported: int
    duplicates_in_file: int
    already_present: int


class PromptList(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompts: list[dict[str, Any]] = Field(min_length=1, description="Objects with `text` and metadata.")


# --- writer flow ----------------------------------------------------------------------


class AssignmentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target_label: Label | None = Field(None, description="Only in rounds where writers choose.")


class PromptPublic(BaseModel):
    id: int
    text: str
    metadata: dict[str, Any]


class AttemptCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="The edited sentence.", max_length=100_000)
    target_span: list[int] | None = Field(
        None, description="Target-dependent tasks: [start, end) character offsets of the target."
    )


class AttemptPublic(BaseModel):
    id: int
    assignment_id: int
    text: str
    status: str
    prediction: list[str] | None
    probabilities: dict[str, float] | None
    model_id: str | None
    model_version: str | None
    latency_ms: float | None
    input_truncated: bool | None
    edit_distance: float | None
    seconds_since_start: float
    fooled: bool | None
    counts_as_try: bool
    confirmed: bool | None
    judged_label: list[str] | None
    target_span: list[int] | None
    created_at: dt.datetime

    @classmethod
    def of(cls, attempt: Attempt) -> AttemptPublic:
        return cls(
            id=attempt.id, assignment_id=attempt.assignment_id, text=attempt.text, status=attempt.status.value,
            prediction=attempt.prediction, probabilities=attempt.probabilities, model_id=attempt.model_id,
            model_version=attempt.model_version, latency_ms=attempt.latency_ms,
            input_truncated=attempt.input_truncated, edit_distance=attempt.edit_distance,
            seconds_since_start=attempt.seconds_since_start, fooled=attempt.fooled,
            counts_as_try=attempt.counts_as_try, confirmed=attempt.confirmed, judged_label=attempt.judged_label,
            target_span=attempt.target_span, created_at=attempt.created_at,
        )


class AssignmentPublic(BaseModel):
    id: int
    round_id: int
    task: str
    condition: str
    prompt: PromptPublic | None
    target_label: list[str]
    goal: str
    tries_used: int
    tries_allowed: int
    status: str
    started_at: dt.datetime
    expires_at: dt.datetime
    attempts: list[AttemptPublic]

    @classmethod
    def of(cls, assignment: Assignment, goal: str) -> AssignmentPublic:
        prompt = assignment.prompt
        return cls(
            id=assignment.id, round_id=assignment.round_id, task=assignment.round.task.name,
            condition=assignment.condition.value,
            prompt=PromptPublic(id=prompt.id, text=prompt.text, metadata=prompt.meta) if prompt else None,
            target_label=assignment.target_label, goal=goal, tries_used=assignment.tries_used,
            tries_allowed=assignment.tries_allowed, status=assignment.status.value,
            started_at=assignment.started_at, expires_at=assignment.expires_at,
            attempts=[AttemptPublic.of(a) for a in assignment.attempts],
        )


class InspectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(max_length=100_000)
    label: str | None = Field(None, description="Default: the assignment's target label.")
    target_span: list[int] | None = None


class ConfirmationCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agrees: bool = Field(description="Yes: a person would say the text has the target label.")
    judged_label: Label | None = Field(None, description="With agrees=false: the label you would give.")


class ExampleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempt_id: int = Field(ge=1, le=2**31 - 1)  # an INTEGER id (api.deps.MAX_ID)
    extras: dict[str, Any] = Field(default_factory=dict, description="The task's writer fields.")


class ExamplePublic(BaseModel):
    id: int
    round_id: int
    assignment_id: int | None = Field(description="None for a harvested example (it has no writer).")
    attempt_id: int | None
    text: str
    target_label: list[str]
    condition: str
    fooled: bool
    extras: dict[str, Any]
    status: str
    created_at: dt.datetime

    @classmethod
    def of(cls, example: Example) -> ExamplePublic:
        return cls(id=example.id, round_id=example.round_id, assignment_id=example.assignment_id,
                   attempt_id=example.attempt_id, text=example.text, target_label=example.target_label,
                   condition=example.condition.value, fooled=example.fooled, extras=example.extras,
                   status=example.status.value, created_at=example.created_at)


# --- validator flow -------------------------------------------------------------------


class BatchItem(BaseModel):
    """What a validator sees: the text (and target), never the writer's label or the model's."""

    example_id: int
    text: str
    target_span: dict[str, Any] | None


class BatchPublic(BaseModel):
    round_id: int
    task: str
    validation_labels: list[str]
    multi_label: bool
    data: list[BatchItem]
    count: int


class ValidationCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: Label = Field(description="One validation label, or a list for multi-label tasks.")
    flagged: bool = False
    flag_reason: str | None = Field(None, max_length=5000)
    seconds_taken: float | None = None


class ValidationPublic(BaseModel):
    id: int
    example_id: int
    label: list[str]
    flagged: bool
    counted: bool
    created_at: dt.datetime


# --- worker quality -------------------------------------------------------------------


class QuizAnswers(BaseModel):
    model_config = ConfigDict(extra="forbid")
    answers: list[str] = Field(max_length=200)


class UnqualifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=500)


class WorkerAgreementPublic(BaseModel):
    username: str
    labels: int
    judged: int
    agreement_rate: float | None
    qualified: bool
