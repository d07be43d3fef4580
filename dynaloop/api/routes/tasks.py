"""Tasks, created from their YAML definition."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request, status
from pydantic import ValidationError

from dynaloop.api.deps import RawBody, SessionDep, SettingsDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.tasks import TaskCreate, TaskPublic, TasksPublic
from services.authorization import TaskPolicy, allows, authorize
from services.db.models import User
from services.domain import tasks
from services.errors import Invalid

router = APIRouter(tags=["tasks"], route_class=OneHopRoute)

_YAML_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/yaml": {"schema": {"type": "string"}, "example": "name: my-task\n..."},
            "application/json": {"schema": TaskCreate.model_json_schema()},
        },
    }
}


@router.post("/tasks", response_model=TaskPublic, status_code=status.HTTP_201_CREATED, openapi_extra=_YAML_BODY)
def create_task(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    researcher: Annotated[User, allowed(TaskPolicy.create)],
    raw: RawBody,
) -> TaskPublic:
    """Create a task from its YAML file (raw `application/yaml`, or JSON `{"definition_yaml": ...}`)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type == "application/json":
        try:
            yaml_text = TaskCreate.model_validate_json(raw).definition_yaml
        except ValidationError as exc:
            raise Invalid(f'body must be {{"definition_yaml": "..."}}: {exc.errors()[0]["msg"]}') from exc
    else:
        try:
            yaml_text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Invalid("the task YAML is not UTF-8; save it as UTF-8") from exc
    task = tasks.create_task(
        session, researcher, yaml_text, max_depth=settings.max_input_depth, max_nodes=settings.max_yaml_nodes
    )
    warnings = tasks.tokenizer_coverage_warnings(
        tasks.definition_of(task), max_unknown_token_share=settings.max_unknown_token_share
    )
    return TaskPublic.of(task, with_answers=True).model_copy(update={"warnings": warnings})


@router.get("/tasks", response_model=TasksPublic)
def list_tasks(session: SessionDep, user: Annotated[User, allowed(TaskPolicy.read)]) -> TasksPublic:
    """Every task; the onboarding quiz's answers only for those who manage the task."""
    rows = [
        TaskPublic.of(t, with_answers=allows(user, TaskPolicy.manage(t)))
        for t in tasks.list_tasks(session)
        if allows(user, TaskPolicy.read(t))
    ]
    return TasksPublic(data=rows, count=len(rows))


@router.get("/tasks/{task_name}", response_model=TaskPublic)
def get_task(task_name: str, session: SessionDep, user: Annotated[User, allowed(TaskPolicy.read)]) -> TaskPublic:
    task = tasks.get_task(session, task_name)
    authorize(user, TaskPolicy.read(task))
    return TaskPublic.of(task, with_answers=allows(user, TaskPolicy.manage(task)))
