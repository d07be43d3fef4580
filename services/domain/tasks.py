"""Tasks: created from validated YAML, read back as TaskDefinition."""

from __future__ import annotations

import functools
import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.db.models import Task, User
from services.domain import audit, members
from services.errors import Conflict, Invalid, missing_task
from services.structured_input import DEFAULT_MAX_INPUT_DEPTH, DEFAULT_MAX_YAML_NODES
from services.taskdef import TaskDefinition, TaskDefinitionError, parse_task_definition


def create_task(
    session: Session,
    actor: User | None,
    yaml_text: str,
    *,
    owner: User | None = None,
    max_depth: int = DEFAULT_MAX_INPUT_DEPTH,
    max_nodes: int = DEFAULT_MAX_YAML_NODES,
) -> Task:
    """Create a task from its YAML; ``owner`` (default: ``actor``, the researcher who creates
    it) becomes its first owner. With neither (the CLI without ``--owner``), only admins
    manage the task until someone is added (``members.set_member``)."""
    try:
        definition = parse_task_definition(yaml_text, max_depth=max_depth, max_nodes=max_nodes)
    except TaskDefinitionError as exc:
        raise Invalid(str(exc), problems=exc.problems) from exc
    if session.scalar(select(Task.id).where(Task.name == definition.name)) is not None:
        raise Conflict(f"task {definition.name!r} already exists; change `name` in the YAML to create another")
    task = Task(
        name=definition.name,
        title=definition.title,
        family=definition.family.value,
        definition=definition.model_dump(mode="json"),
        definition_yaml=yaml_text,
        created_by_id=actor.id if actor else None,
    )
    session.add(task)
    session.flush()
    audit.record(session, actor, "task.create", "task", task.id, name=task.name)
    owner = owner or actor
    if owner is not None:
        members.add_creator(session, actor, task, owner)
    return task


def get_task(session: Session, name: str) -> Task:
    task = session.scalar(select(Task).where(Task.name == name))
    if task is None:
        raise missing_task(name)
    return task


def list_tasks(session: Session) -> list[Task]:
    return list(session.scalars(select(Task).order_by(Task.id)))


def definition_of(task: Task) -> TaskDefinition:
    """The task's definition, validated. Parsed once per distinct stored definition: validating
    it checks every free-text field and cost ~5 ms, twice per label (docs/benchmarks.md,
    "Labelling"). TaskDefinition is frozen, so one instance can be shared."""
    return _parsed_definition(json.dumps(task.definition, sort_keys=True, ensure_ascii=False))


@functools.lru_cache(maxsize=256)
def _parsed_definition(definition_json: str) -> TaskDefinition:
    return TaskDefinition.model_validate(json.loads(definition_json))
