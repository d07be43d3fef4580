"""Attention checks: what a writer is shown and answers, and the researchers' per-writer view."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field

from services.db.models import AttentionCheckAnswer
from services.domain.attention import WriterChecks


class AttentionCheckPublic(BaseModel):
    """A check as its writer sees it (never the expected answer)."""

    id: int
    task: str
    question: str
    options: list[str]
    served_at: dt.datetime
    answered_at: dt.datetime | None
    answer: str | None

    @classmethod
    def of(cls, check: AttentionCheckAnswer) -> AttentionCheckPublic:
        return cls(
            id=check.id,
            task=check.task.name,
            question=check.question,
            options=list(check.options),
            served_at=check.served_at,
            answered_at=check.answered_at,
            answer=check.answer,
        )


class AttentionChecksPublic(BaseModel):
    data: list[AttentionCheckPublic]
    count: int


class AttentionCheckAnswerCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    answer: str = Field(min_length=1, max_length=1000, description="One of the check's options.")


class AttentionCheckResult(AttentionCheckPublic):
    passed: bool
    qualified: bool = Field(
        description="False once you failed the task's allowed number of checks: you can no longer write for it."
    )


class WriterAttentionChecksPublic(BaseModel):
    user_id: int
    username: str
    served: int
    answered: int
    passed: int
    failed: int
    qualified: bool = Field(description="Still qualified on the task (unqualified after too many failed checks).")

    @classmethod
    def of(cls, row: WriterChecks) -> WriterAttentionChecksPublic:
        return cls(**row.__dict__)


class TaskAttentionChecksPublic(BaseModel):
    data: list[WriterAttentionChecksPublic]
    count: int
    every_n_assignments: int | None = Field(description="From the task's YAML; null: the task has no attention checks.")
    fails_to_screen_out: int | None
