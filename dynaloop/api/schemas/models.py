"""The model registry (rounds.models.registry)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, Field

from rounds.models.replicas import ReplicaView
from services.db.models import ModelVersion


class ModelPublic(BaseModel):
    id: int
    name: str
    model_id: str
    version: str
    status: str
    trained_for_round: int | None
    base_model: str
    directory: str
    endpoint: str | None
    labels: list[Any]
    attempts: int = Field(description="Attempts of the task's rounds this version scored.")
    best_dev_macro_f1: float | None
    macro_f1: dict[str, Any] = Field(description="Evaluation: macro-F1 per set (fractions).")
    solved: dict[str, Any] = Field(description="Evaluation: set -> macro-F1 reached the human estimate.")
    hyperparameters: dict[str, Any]
    created_at: dt.datetime
    evaluated_at: dt.datetime | None
    promoted_at: dt.datetime | None
    retired_at: dt.datetime | None

    @classmethod
    def of(cls, model: ModelVersion, attempts: int) -> ModelPublic:
        evaluation = model.evaluation or {}
        best = (model.metrics or {}).get("best_dev_macro_f1")
        return cls(
            id=model.id,
            name=model.name,
            model_id=model.model_id,
            version=model.version,
            status=model.status.value,
            trained_for_round=model.trained_for_round,
            base_model=model.base_model,
            directory=model.directory,
            endpoint=model.endpoint,
            labels=list(model.labels or []),
            attempts=attempts,
            best_dev_macro_f1=best if isinstance(best, int | float) else None,
            macro_f1=dict(evaluation.get("macro_f1") or {}),
            solved=dict(evaluation.get("solved") or {}),
            hyperparameters=model.hyperparameters or {},
            created_at=model.created_at,
            evaluated_at=model.evaluated_at,
            promoted_at=model.promoted_at,
            retired_at=model.retired_at,
        )


class ModelsPublic(BaseModel):
    data: list[ModelPublic]
    count: int


class ModelReplicaPublic(BaseModel):
    """A model-server replica that follows the task's promoted model (`dynaloop model-server --follow-task`)."""

    name: str
    url: str | None = Field(description="Where others reach it (its --advertise-url), if it said.")
    state: str = Field(
        description="starting (nothing to serve yet), loading, serving, failed (the promoted version could not be "
        "loaded: the model it had still serves), stopped."
    )
    serving: str | None = Field(description="model_id@version of the model it serves, or null.")
    model_id: str | None
    version: str | None
    model_version_id: int | None = Field(description="The registry id of what it serves, when the registry has it.")
    target_model_version_id: int | None = Field(
        description="The task's promoted version as the replica last read it: what it loads, serves or failed to load."
    )
    precision: str | None
    message: str = Field(description="Why it failed, what it loads; empty when it serves the promoted model.")
    live: bool = Field(description="It reported within the last seconds (rounds.models.replicas.LIVE_WITHIN_S).")
    started_at: dt.datetime
    heartbeat_at: dt.datetime

    @classmethod
    def of(cls, view: ReplicaView) -> ModelReplicaPublic:
        return cls(
            name=view.name,
            url=view.url,
            state=view.state,
            serving=view.serving,
            model_id=view.model_id,
            version=view.version,
            model_version_id=view.model_version_id,
            target_model_version_id=view.target_model_version_id,
            precision=view.precision,
            message=view.message,
            live=view.live,
            started_at=view.started_at,
            heartbeat_at=view.heartbeat_at,
        )


class ModelReplicasPublic(BaseModel):
    data: list[ModelReplicaPublic]
    count: int
    live: int = Field(description="How many of them are live.")
