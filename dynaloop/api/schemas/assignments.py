"""The writer's assignments and what happens in them: attempts, confirmation, inspection."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dynaloop.api.schemas.common import ANSWER_CONFIG, Label
from services.db.models import Assignment, Attempt
from services.domain.tasks import definition_of
from services.domain.writing import Inspection


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


class AttemptFields(BaseModel):
    """What the writer's attempt answers and an example's full record (dynaloop/api/schemas/examples.py)
    both say of an attempt."""

    model_config = ANSWER_CONFIG

    id: int
    text: str
    status: str
    prediction: list[str] | None
    probabilities: dict[str, float] | None
    model_id: str | None
    model_version: str | None
    model_precision: str | None = Field(None, description="What the model's forward pass ran at: fp32, bf16 or int8.")
    latency_ms: float | None
    edit_distance: float | None
    seconds_since_start: float
    fooled: bool | None
    counts_as_try: bool
    confirmed: bool | None
    judged_label: list[str] | None
    target_span: list[int] | None


class AttemptPublic(AttemptFields):
    assignment_id: int
    input_truncated: bool | None
    created_at: dt.datetime

    @classmethod
    def of(cls, attempt: Attempt) -> AttemptPublic:
        return cls(
            id=attempt.id,
            assignment_id=attempt.assignment_id,
            text=attempt.text,
            status=attempt.status.value,
            prediction=attempt.prediction,
            probabilities=attempt.probabilities,
            model_id=attempt.model_id,
            model_version=attempt.model_version,
            model_precision=attempt.model_precision,
            latency_ms=attempt.latency_ms,
            input_truncated=attempt.input_truncated,
            edit_distance=attempt.edit_distance,
            seconds_since_start=attempt.seconds_since_start,
            fooled=attempt.fooled,
            counts_as_try=attempt.counts_as_try,
            confirmed=attempt.confirmed,
            judged_label=attempt.judged_label,
            target_span=attempt.target_span,
            created_at=attempt.created_at,
        )


class AssignmentPublic(BaseModel):
    id: int
    round_id: int
    task: str
    condition: str
    prompt: PromptPublic | None
    target_label: list[str]
    label_names: dict[str, str] = Field(
        description="Each task label (target, predictions, judged labels) with the name writers see; "
        "requests take the label, not the name."
    )
    goal: str = Field(description="The goal in words, with the labels' display names.")
    tries_used: int
    tries_allowed: int
    status: str
    started_at: dt.datetime
    expires_at: dt.datetime
    attempts: list[AttemptPublic]

    @classmethod
    def of(cls, assignment: Assignment, goal: str) -> AssignmentPublic:
        prompt = assignment.prompt
        definition = definition_of(assignment.round.task)
        return cls(
            id=assignment.id,
            round_id=assignment.round_id,
            task=assignment.round.task.name,
            condition=assignment.condition.value,
            prompt=PromptPublic(id=prompt.id, text=prompt.text, metadata=prompt.meta) if prompt else None,
            target_label=assignment.target_label,
            label_names={label: definition.label_name(label) for label in definition.labels},
            goal=goal,
            tries_used=assignment.tries_used,
            tries_allowed=assignment.tries_allowed,
            status=assignment.status.value,
            started_at=assignment.started_at,
            expires_at=assignment.expires_at,
            attempts=[AttemptPublic.of(a) for a in assignment.attempts],
        )


class ConfirmationCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agrees: bool = Field(description="Yes: a person would say the text has the target label.")
    judged_label: Label | None = Field(None, description="With agrees=false: the label you would give.")


class ExampleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempt_id: int = Field(ge=1, le=2**31 - 1)  # an INTEGER id (dynaloop.api.deps.MAX_ID)
    extras: dict[str, Any] = Field(default_factory=dict, description="The task's writer fields.")


class InspectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(max_length=100_000)
    label: str | None = Field(None, description="Default: the assignment's target label.")
    target_span: list[int] | None = None


class TokenAttribution(BaseModel):
    token: str
    score: float = Field(description="Signed attribution towards the label (L2-normalised over the tokens).")


class InspectionPublic(BaseModel):
    """Token attributions for a draft (DynaSent's "Inspect" button); nothing is stored."""

    label: str
    tokens: list[TokenAttribution]

    @classmethod
    def of(cls, inspection: Inspection) -> InspectionPublic:
        return cls(
            label=inspection.label, tokens=[TokenAttribution(token=t.token, score=t.score) for t in inspection.tokens]
        )
