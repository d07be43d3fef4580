"""The sets a task's models are evaluated on: each built round's dev and test split (from its
newest build) with the round's human F1 estimate, and a data mix's extra sources."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rounds.models.datasets import DataError, LabelledSet, SourceSpec, load_source, model_labels
from rounds.models.errors import EvaluationError
from services.db.models import BuiltExample, Round, RoundBuild, Task
from services.domain.round_lifecycle import newest_build
from services.domain.tasks import definition_of

logger = logging.getLogger(__name__)


def human_f1_estimate(report: Mapping[str, Any], split: str) -> float | None:
    """The human macro-F1 of a built round's split, as the round report stores it
    (``report["human_f1"][split]["macro avg"]["f1"]``; absent for multi-label tasks)."""
    value = ((report.get("human_f1") or {}).get(split) or {}).get("macro avg", {}).get("f1")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def built_round_numbers(session: Session, task: Task) -> list[int]:
    """The task's rounds that have at least one build, in order."""
    return list(
        session.scalars(
            select(Round.number)
            .where(Round.task_id == task.id, Round.id.in_(select(RoundBuild.round_id)))
            .order_by(Round.number)
        )
    )


@dataclass
class EvaluationSets:
    """The sets to evaluate on, with the human F1 estimates of the round splits among them."""

    sets: list[LabelledSet]
    human_f1: dict[str, float]
    skipped: list[str]  # round splits with no labelled examples


def _newest_build(session: Session, task: Task, number: int) -> RoundBuild:
    round_ = session.scalar(select(Round).where(Round.task_id == task.id, Round.number == number))
    if round_ is None:
        raise EvaluationError(f"task {task.name!r} has no round {number}")
    build = newest_build(session, round_)
    if build is None:
        raise EvaluationError(
            f"round {number} of {task.name!r} has not been built; run "
            f"`dynaloop round build --task {task.name} --round {number}` first"
        )
    return build


def load_evaluation_sets(
    session: Session, task: Task, *, rounds: Sequence[int] | None = None, extra: Sequence[SourceSpec] = ()
) -> EvaluationSets:
    """Each round's dev and test split from its newest build (``rounds``: default every built
    round; ``[]`` for none), then the ``extra`` sources (a data mix's dev and evaluate
    entries: external files or other round splits), each once. Round splits carry the human
    F1 estimate of their build's report. A round that does not exist or was never built is an
    error; a round split without labelled examples is skipped and named in ``skipped``."""
    definition = definition_of(task)
    labels, multi = model_labels(definition), definition.is_multi_label
    numbers = built_round_numbers(session, task) if rounds is None else list(rounds)
    specs = [
        SourceSpec(round=number, split=split, build_id=_newest_build(session, task, number).id)
        for number in numbers
        for split in ("dev", "test")
    ]
    result = EvaluationSets(sets=[], human_f1={}, skipped=[])
    seen: set[tuple[Any, ...]] = set()
    for spec in [*specs, *extra]:
        if spec.round is not None and spec.build_id is None:
            spec = spec.model_copy(update={"build_id": _newest_build(session, task, spec.round).id})
        key = ("round", spec.build_id, spec.split) if spec.round is not None else ("file", spec.describe())
        if key in seen:
            continue
        seen.add(key)
        if spec.round is not None and not session.scalar(
            select(func.count())
            .select_from(BuiltExample)
            .where(BuiltExample.build_id == spec.build_id, BuiltExample.split == spec.split)
        ):
            logger.info("%s of %s has no examples in build %s; skipped", spec.describe(), task.name, spec.build_id)
            result.skipped.append(spec.describe())
            continue
        try:
            labelled = load_source(spec, labels=labels, multi_label=multi, session=session, task=task)
        except DataError:
            if spec.round is None:
                raise
            result.skipped.append(spec.describe())  # rows, but none with a usable gold label
            continue
        result.sets.append(labelled)
        if spec.round is not None:
            build = session.get(RoundBuild, spec.build_id)
            estimate = human_f1_estimate(build.report or {} if build else {}, spec.split)
            if estimate is not None:
                result.human_f1[labelled.name] = estimate
    return result
