"""The model registry of a task (modelling.registry)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from api.deps import SessionDep, allowed
from api.schemas.models import ModelPublic, ModelsPublic
from modelling.registry import attempt_counts, list_models
from services.authorization import ModelPolicy, authorize
from services.db.models import User
from services.domain import tasks

router = APIRouter(tags=["models"])


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
