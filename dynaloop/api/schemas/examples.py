"""Examples: a submitted one, and the researcher's full record of one."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, Field

from dynaloop.api.schemas.assignments import AttemptFields
from services.db.models import Example


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
        return cls(
            id=example.id,
            round_id=example.round_id,
            assignment_id=example.assignment_id,
            attempt_id=example.attempt_id,
            text=example.text,
            target_label=example.target_label,
            condition=example.condition.value,
            fooled=example.fooled,
            extras=example.extras,
            status=example.status.value,
            created_at=example.created_at,
        )


# --- the full record (services.domain.validating.example_record) -----------------------------


class RecordPrompt(BaseModel):
    id: int
    text: str
    source: str | None
    metadata: dict[str, Any]


class RecordAttempt(AttemptFields):
    """Every attempt of the example's assignment, scored or not."""

    created_at: str = Field(description="ISO 8601 time.")


class RecordValidation(BaseModel):
    validator: str | None
    label: list[str]
    counted: bool
    flagged: bool
    flag_reason: str | None
    seconds_taken: float | None
    created_at: str = Field(description="ISO 8601 time.")


class ExampleRecord(BaseModel):
    """Everything about one example: its attempts, edit distances, confirmation and labels. A
    harvested example has no writer, assignment or attempts, but its corpus source."""

    id: int
    round: int = Field(description="The round's number in its task.")
    task: str
    origin: str
    source: dict[str, Any] | None = Field(description="Where a harvested example came from.")
    text: str
    target_label: list[str] = Field(description="Empty for a harvested example.")
    condition: str
    prompt: RecordPrompt | None
    writer: str | None
    model_prediction: list[str] | None
    model_id: str | None
    fooled: bool
    extras: dict[str, Any]
    status: str
    validation_count: int
    validations_needed: int
    submitted_attempt_id: int | None
    attempts: list[RecordAttempt]
    validations: list[RecordValidation]
