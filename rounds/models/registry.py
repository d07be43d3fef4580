"""The model registry: which classifier directories a task has, and which one is in the loop.

A :class:`~services.db.models.ModelVersion` moves ``trained -> evaluated -> promoted ->
retired`` (docs/design.md, "Round builder" step 6; DynaSent §5: Model 1 replaces Model 0 for
Round 2):

* :func:`register_model` reads a directory's ``dynaloop_model.json`` and records it as
  *trained* (idempotent for the same ``model_id`` and ``version``); :func:`register_retrained`
  does so for a model a training run wrote, and registers a run that reproduced registered
  weights as ``VERSION.2`` (``same_weights_as`` in its file);
* :func:`record_evaluation` stores the evaluation (``rounds.models.evaluate``) and makes it
  *evaluated*;
* :func:`rounds.models.promotion.promote` puts a version in the loop (its own module: the
  promotion rules and the model server's hot-swap protocol);
* :func:`retire` takes a model out of use in the registry.

Attempts record the ``model_id`` and ``model_version`` the model server answered with; they
are the registry's ``model_id`` and ``version``, so every attempt joins to the version it met
(:func:`attempt_counts`).

Example::

    >>> from services.db.engine import session_scope  # doctest: +SKIP
    >>> with session_scope(factory) as session:  # doctest: +SKIP
    ...     model = register_model(session, task, Path("models/r1"))
    ...     record_evaluation(session, task, Path("models/r1"), {"round-1 test": {"macro_f1": 0.81}})
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from model_server.directory import ModelMetadata, ModelMetadataError
from services.db.models import Assignment, Attempt, ModelVersion, ModelVersionStatus, Round, Task, User, utcnow
from services.domain import audit
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid, NotFound
from services.taskdef import TaskDefinition, TaskFamily

logger = logging.getLogger(__name__)

__all__ = [
    "attempt_counts",
    "check_compatible",
    "find_model",
    "jsonable",
    "list_models",
    "record_evaluation",
    "register_model",
    "register_retrained",
    "retire",
]


# --- registering -----------------------------------------------------------------------


def _load_metadata(directory: Path) -> ModelMetadata:
    if not directory.is_dir():
        raise Invalid(f"model directory {directory} does not exist; give the folder that holds dynaloop_model.json")
    try:
        return ModelMetadata.load(directory)
    except ModelMetadataError as exc:
        raise Invalid(str(exc)) from exc


def check_compatible(definition: TaskDefinition, metadata: ModelMetadata, where: str) -> None:
    """Refuse a model whose labels, family or input format do not fit the task."""
    if set(metadata.labels) != set(definition.labels):
        missing = [label for label in definition.labels if label not in metadata.labels]
        extra = [label for label in metadata.labels if label not in definition.labels]
        detail = "; ".join(
            part
            for part in (f"missing {missing}" if missing else "", f"not in the task {extra}" if extra else "")
            if part
        )
        raise Invalid(
            f"{where} predicts labels {metadata.labels} but task {definition.name!r} has labels "
            f"{list(definition.labels)} ({detail}); train the model for this task's labels"
        )
    wanted_family = "multi_label" if definition.is_multi_label else "single_label"
    if metadata.family != wanted_family:
        raise Invalid(f"{where} is a {metadata.family} model but task {definition.name!r} needs a {wanted_family} one")
    wanted_input = "text_pair" if definition.family is TaskFamily.target_dependent else "text"
    if metadata.input_format != wanted_input:
        raise Invalid(
            f"{where} takes {metadata.input_format} input but task {definition.name!r} needs {wanted_input} input"
        )
    if metadata.task is not None and metadata.task != definition.name:
        raise Invalid(f"{where} was made for task {metadata.task!r}, not {definition.name!r}")


def _extra(metadata: ModelMetadata, *keys: str) -> dict[str, Any]:
    """A dict field the trainer may add to dynaloop_model.json (under one of ``keys``)."""
    extras = metadata.model_extra or {}
    for key in keys:
        value = extras.get(key)
        if isinstance(value, dict):
            return jsonable(value)
    return {}


def jsonable(value: Any) -> Any:
    """``value`` with NumPy scalars turned into Python ones and NaN/inf into None (PostgreSQL's
    JSON type refuses NaN)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, str | bytes):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def register_model(session: Session, task: Task, directory: Path | str, *, actor: User | None = None) -> ModelVersion:
    """Record the model directory ``directory`` for ``task`` as *trained*.

    Registering the same ``model_id`` and ``version`` again returns the existing row; the same
    id and version from a *different* directory is refused (the version must change whenever
    the weights change)."""
    directory = Path(directory).expanduser().resolve()
    metadata = _load_metadata(directory)
    definition = definition_of(task)
    check_compatible(definition, metadata, f"model {metadata.model_id} (version {metadata.version}) in {directory}")
    existing = _registered_version(session, task, metadata.model_id, metadata.version)
    if existing is not None:
        if Path(existing.directory) != directory:
            raise Conflict(
                f"model {metadata.model_id} version {metadata.version} is already registered for task "
                f"{task.name!r} from {existing.directory}; if {directory} holds other weights, give it a new "
                "`version` in its dynaloop_model.json (a model `dynaloop round train` or a train job wrote "
                "is registered as a new version by itself)"
            )
        return existing
    model = ModelVersion(
        task_id=task.id,
        name=f"{metadata.model_id}@{metadata.version}",
        model_id=metadata.model_id,
        version=metadata.version,
        directory=str(directory),
        base_model=metadata.base_model or "",
        trained_for_round=metadata.trained_for_round,
        labels=list(metadata.labels),
        metrics=_extra(metadata, "metrics", "training_metrics", "training"),
        data=_extra(metadata, "data"),
        hyperparameters=_extra(metadata, "hyperparameters"),
        status=ModelVersionStatus.trained,
    )
    try:
        with session.begin_nested():  # a failed insert rolls back (and expunges) only this row
            session.add(model)
    except IntegrityError as exc:
        raise Conflict(
            f"model {model.name} is being registered by another request, or its name is taken; "
            "retry, or change model_id"
        ) from exc
    audit.record(
        session,
        actor,
        "model.register",
        "model_version",
        model.id,
        task=task.name,
        name=model.name,
        directory=model.directory,
    )
    return model


def register_retrained(
    session: Session, task: Task, directory: Path | str, *, actor: User | None = None
) -> tuple[ModelVersion, str | None]:
    """Register the model a training run just wrote to ``directory`` (:func:`register_model`),
    and the name of the registered model whose weights it reproduces, or None.

    The trainer's ``version`` is a hash of the weights (rounds.models.train.weights_version), so a
    retrain from the same base on the same data with the same seed lands on a version the task
    has registered from another directory. Such a model is registered as ``VERSION.2`` (the next
    free ``VERSION.N``) instead, with ``same_weights_as`` (the registered ``model_id@version``) in
    its dynaloop_model.json, so the model server reports the version the registry holds."""
    directory = Path(directory).expanduser().resolve()
    metadata = _load_metadata(directory)
    taken = _registered_version(session, task, metadata.model_id, metadata.version)
    if taken is None or Path(taken.directory) == directory:  # new weights, or this directory again
        same = (metadata.model_extra or {}).get("same_weights_as")
        return register_model(session, task, directory, actor=actor), same if isinstance(same, str) else None
    number = 2
    while True:
        version = f"{metadata.version}.{number}"
        other = _registered_version(session, task, metadata.model_id, version)
        if other is None or Path(other.directory) == directory:
            break
        number += 1
    renamed = ModelMetadata.model_validate(
        {**metadata.model_dump(mode="json"), "version": version, "same_weights_as": taken.name}
    )
    renamed.save(directory)
    logger.info(
        "%s holds the same weights as %s (registered from %s); registering it as version %s",
        directory,
        taken.name,
        taken.directory,
        version,
    )
    return register_model(session, task, directory, actor=actor), taken.name


def _registered_version(session: Session, task: Task, model_id: str, version: str) -> ModelVersion | None:
    return session.scalar(
        select(ModelVersion).where(
            ModelVersion.task_id == task.id, ModelVersion.model_id == model_id, ModelVersion.version == version
        )
    )


def record_evaluation(
    session: Session, task: Task, directory: Path | str, metrics: dict[str, Any], *, actor: User | None = None
) -> ModelVersion:
    """Store ``metrics`` (e.g. ``rounds.models.evaluate``'s results) as the evaluation of the model in
    ``directory`` (registered first if needed); a *trained* model becomes *evaluated*. A
    promoted or retired model keeps its status (re-evaluating it on a newer round is normal)."""
    if not isinstance(metrics, dict) or not metrics:
        raise Invalid("the evaluation is empty; give a dict of metrics (e.g. from rounds.models.evaluate)")
    model = register_model(session, task, directory, actor=actor)
    model.evaluation = jsonable(metrics)
    model.evaluated_at = utcnow()
    if model.status is ModelVersionStatus.trained:
        model.status = ModelVersionStatus.evaluated
    audit.record(session, actor, "model.evaluate", "model_version", model.id, task=task.name, name=model.name)
    session.flush()
    return model


# --- finding ---------------------------------------------------------------------------


def list_models(session: Session, task: Task) -> list[ModelVersion]:
    """The task's model versions, oldest first."""
    return list(session.scalars(select(ModelVersion).where(ModelVersion.task_id == task.id).order_by(ModelVersion.id)))


def find_model(session: Session, task: Task, reference: str | int) -> ModelVersion:
    """A model version by registry id, name (``model_id@version``), or ``model_id`` when the
    task has only one version of it."""
    text = str(reference).strip()
    if text.isdigit():
        model = session.get(ModelVersion, int(text))
        if model is not None and model.task_id == task.id:
            return model
    model = session.scalar(select(ModelVersion).where(ModelVersion.task_id == task.id, ModelVersion.name == text))
    if model is not None:
        return model
    if "@" in text:
        model_id, _, version = text.rpartition("@")
        model = session.scalar(
            select(ModelVersion).where(
                ModelVersion.task_id == task.id, ModelVersion.model_id == model_id, ModelVersion.version == version
            )
        )
        if model is not None:
            return model
    candidates = list(
        session.scalars(
            select(ModelVersion)
            .where(ModelVersion.task_id == task.id, ModelVersion.model_id == text)
            .order_by(ModelVersion.id)
        )
    )
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise Invalid(
            f"task {task.name!r} has {len(candidates)} versions of {text!r} "
            f"({', '.join(c.name for c in candidates)}); name one"
        )
    known = [m.name for m in list_models(session, task)]
    raise NotFound(
        f"task {task.name!r} has no model {text!r}; registered: {', '.join(known) or 'none'} "
        "(register one with `dynaloop model register`)"
    )


def attempt_counts(session: Session, task: Task) -> dict[int, int]:
    """Attempts of the task's rounds scored by each model version: the join of attempts'
    (model_id, model_version) to the registry."""
    rows = session.execute(
        select(ModelVersion.id, func.count(Attempt.id))
        .join(Attempt, (Attempt.model_id == ModelVersion.model_id) & (Attempt.model_version == ModelVersion.version))
        .join(Assignment, Attempt.assignment_id == Assignment.id)
        .join(Round, Assignment.round_id == Round.id)
        .where(ModelVersion.task_id == task.id, Round.task_id == task.id)
        .group_by(ModelVersion.id)
    ).all()
    return {int(model_id): int(count) for model_id, count in rows}


# --- retiring --------------------------------------------------------------------------


def retire(session: Session, task: Task, reference: str | int, *, actor: User | None = None) -> ModelVersion:
    """Mark a model version *retired* (idempotent). Retiring the promoted model leaves the task
    without one in the registry; the model server keeps serving it until another is promoted."""
    model = find_model(session, task, reference)
    if model.status is ModelVersionStatus.retired:
        return model
    was = model.status
    model.status = ModelVersionStatus.retired
    model.retired_at = utcnow()
    audit.record(
        session,
        actor,
        "model.retire",
        "model_version",
        model.id,
        task=task.name,
        name=model.name,
        previous_status=was.value,
    )
    session.flush()
    return model
