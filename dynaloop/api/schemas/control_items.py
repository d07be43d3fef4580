"""A task's control (gold) items, as its researchers add and list them."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field

from services.db.models import ControlItem


class ControlItemCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=5000, description="The sentence validators label.")
    labels: list[str] = Field(
        min_length=1,
        max_length=50,
        description="The validation label(s) accepted as right: any one of them in a single-label task, "
        "exactly this set in a multi-label task.",
    )
    target_span: list[int] | None = Field(
        None, min_length=2, max_length=2, description="Target-dependent tasks: [start, end] of the target."
    )


class ControlItemPublic(BaseModel):
    id: int
    task: str
    text: str
    labels: list[str]
    target_span: dict[str, int | str] | None
    source: str = Field(description="task_yaml (from the task's YAML) or api.")
    active: bool
    served: int = Field(description="Times the item was put in a validator's batch.")
    answers: int
    correct: int
    created_at: dt.datetime

    @classmethod
    def of(cls, item: ControlItem, task: str, served: int = 0, answers: int = 0, correct: int = 0) -> ControlItemPublic:
        return cls(
            id=item.id,
            task=task,
            text=item.text,
            labels=list(item.labels),
            target_span=item.target_span,
            source=item.source,
            active=item.active,
            served=served,
            answers=answers,
            correct=correct,
            created_at=item.created_at,
        )


class ControlItemsPublic(BaseModel):
    data: list[ControlItemPublic]
    count: int
