"""Tasks, created from their YAML definition."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dynaloop.api.schemas.common import ANSWER_CONFIG
from services.db.models import Task
from services.domain.tasks import definition_of


class TaskCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    definition_yaml: str = Field(min_length=1, max_length=200_000, description="The task's YAML file.")


class TaskPublic(BaseModel):
    model_config = ANSWER_CONFIG

    id: int
    name: str
    title: str
    family: str
    definition: dict[str, Any]
    label_names: dict[str, str] = Field(
        description="Every label of the task (validation labels included) with the name people see for it "
        "(the definition's `label_names`, else the label itself). Requests take the labels, never these names."
    )
    created_at: dt.datetime
    warnings: list[str] = Field(
        default_factory=list,
        description="On creation only: what the task should know before collecting, e.g. that the default "
        "backbone's tokenizer maps most of its text to [UNK].",
    )

    @classmethod
    def of(cls, task: Task, *, with_answers: bool = False) -> TaskPublic:
        definition = dict(task.definition)
        # A writer field's choices as the API checks them, the family's defaults included (the
        # web app shows exactly these; it keeps no list of its own).
        parsed = definition_of(task)
        if "writer_fields" in definition:
            definition["writer_fields"] = [
                {**written, "choices": parsed.field_choices(field)}
                for written, field in zip(definition["writer_fields"], parsed.writer_fields, strict=True)
            ]
        quiz = definition.get("onboarding_quiz")
        if quiz and not with_answers:
            definition["onboarding_quiz"] = {
                **quiz,
                "questions": [
                    {k: v for k, v in q.items() if k not in ("answer", "explanation")} for q in quiz["questions"]
                ],
            }
        return cls(
            id=task.id,
            name=task.name,
            title=task.title,
            family=task.family,
            definition=definition,
            label_names=parsed.display_names,
            created_at=task.created_at,
        )


class TasksPublic(BaseModel):
    data: list[TaskPublic]
    count: int
