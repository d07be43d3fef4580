"""The validator's batches and labels."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dynaloop.api.schemas.common import Label
from services.db.models import Validation
from services.domain.validating import ItemAnswer


class BatchItem(BaseModel):
    """What a validator sees: the text (and target), never the writer's label or the model's.
    ``item_id`` is an opaque key of this serving; label the item with POST
    /validation-items/{item_id}/validations."""

    item_id: str = Field(description="Opaque id of this item in your batch; label it through it.")
    text: str
    target_span: dict[str, Any] | None


class BatchPublic(BaseModel):
    round_id: int
    task: str
    validation_labels: list[str]
    label_names: dict[str, str] = Field(
        description="Each validation label with the name validators see; send the label, not the name."
    )
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

    @classmethod
    def of(cls, validation: Validation) -> ValidationPublic:
        return cls(
            id=validation.id,
            example_id=validation.example_id,
            label=validation.label,
            flagged=validation.flagged,
            counted=validation.counted,
            created_at=validation.created_at,
        )


class ItemLabelPublic(BaseModel):
    """A label given to a batch item, as stored."""

    item_id: str
    label: list[str]
    flagged: bool
    created_at: dt.datetime

    @classmethod
    def of(cls, answer: ItemAnswer) -> ItemLabelPublic:
        return cls(item_id=answer.item_key, label=answer.label, flagged=answer.flagged, created_at=answer.created_at)
