"""The model registry of a task (rounds.models.registry)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from dynaloop.api.deps import SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.models import ModelPublic, ModelReplicaPublic, ModelReplicasPublic, ModelsPublic
from rounds.models.registry import attempt_counts, list_models
from rounds.models.replicas import list_replicas
from services.authorization import ModelPolicy, authorize
from services.db.models import User
from services.domain import tasks

router = APIRouter(tags=["models"], route_class=OneHopRoute)


@router.get("/tasks/{task_name}/models", response_model=ModelsPublic)
def task_models(
    task_name: str, session: SessionDep, researcher: Annotated[User, allowed(ModelPolicy.list)]
) -> ModelsPublic:
    """The task's model registry, oldest first, with the attempts each version scored."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, ModelPolicy.list(task))
    counts = attempt_counts(session, task)
    rows = [ModelPublic.of(model, counts.get(model.id, 0)) for model in list_models(session, task)]
    return ModelsPublic(data=rows, count=len(rows))


@router.get("/tasks/{task_name}/model-replicas", response_model=ModelReplicasPublic)
def task_model_replicas(
    task_name: str, session: SessionDep, researcher: Annotated[User, allowed(ModelPolicy.list)]
) -> ModelReplicasPublic:
    """The model-server replicas that follow the task's promoted model (`dynaloop model-server
    --follow-task`), by name: what each serves, its state, and whether it is live."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, ModelPolicy.list(task))
    rows = [ModelReplicaPublic.of(view) for view in list_replicas(session, task)]
    return ModelReplicasPublic(data=rows, count=len(rows), live=sum(row.live for row in rows))
