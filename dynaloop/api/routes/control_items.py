"""A task's control (gold) items: texts with known labels mixed into validation batches
(services/domain/controls.py). Its researchers add, list and retire them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status

from dynaloop.api.deps import IdPath, SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.control_items import ControlItemCreate, ControlItemPublic, ControlItemsPublic
from services.authorization import TaskPolicy, authorize
from services.db.models import User
from services.domain import controls, tasks

router = APIRouter(tags=["control items"], route_class=OneHopRoute)
Manager = Annotated[User, allowed(TaskPolicy.manage)]


@router.get("/tasks/{task_name}/control-items", response_model=ControlItemsPublic)
def list_control_items(task_name: str, session: SessionDep, researcher: Manager) -> ControlItemsPublic:
    """The task's control items (those of its YAML too), with how often each was served and
    answered right."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    usage = controls.control_usage(session, task)
    rows = [
        ControlItemPublic.of(item, task.name, *usage.get(item.id, (0, 0, 0)))
        for item in controls.list_control_items(session, task)
    ]
    return ControlItemsPublic(data=rows, count=len(rows))


@router.post("/tasks/{task_name}/control-items", response_model=ControlItemPublic, status_code=status.HTTP_201_CREATED)
def add_control_item(
    task_name: str, body: ControlItemCreate, session: SessionDep, researcher: Manager
) -> ControlItemPublic:
    """Add a control item: a text and its known label(s). It is mixed into the task's validation
    batches from the next batch served, at the task's ``quality.control_rate``."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    item = controls.add_control_item(session, researcher, task, body.text, body.labels, body.target_span)
    return ControlItemPublic.of(item, task.name)


@router.delete("/tasks/{task_name}/control-items/{control_id}", response_model=ControlItemPublic)
def retire_control_item(
    task_name: str, control_id: IdPath, session: SessionDep, researcher: Manager
) -> ControlItemPublic:
    """Stop serving a control item (kept, with its answers; it still counts in gold accuracy)."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    item = controls.retire_control_item(session, researcher, task, control_id)
    usage = controls.control_usage(session, task)
    return ControlItemPublic.of(item, task.name, *usage.get(item.id, (0, 0, 0)))
