"""Control (gold) items: texts with known labels mixed into validation batches (issue 26).

A task's control items come from its YAML (``quality.control_items``, added to the database the
first time the task's controls are read) and from its researchers (``POST
/tasks/{task}/control-items``). ``services.domain.validating`` mixes them into batches at the
task's ``quality.control_rate``, shown exactly like examples. Each answer is kept on its batch
item and scored against the known label(s); a validator whose gold accuracy on the task falls
below ``quality.gold_accuracy_threshold`` after ``quality.min_control_answers`` answers is
unqualified (:func:`services.domain.quality.unqualify`: their labels stop counting, their
examples get their slots back). Control items are never examples: they never reach a round's
examples, statistics, ledger or builds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import (
    ControlItem,
    Round,
    Task,
    User,
    ValidationBatch,
    ValidationBatchItem,
)
from services.domain import audit
from services.domain.labels import check_validation_label
from services.domain.quality import task_worker, unqualify
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid, NotFound
from services.taskdef import TaskDefinition, TaskFamily
from services.text import clean_text

MAX_CONTROL_CHARS = 5000


def _text_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _span(text: str, span: list[int] | None, definition: TaskDefinition) -> dict[str, Any] | None:
    """A control item's target, stored as an example's is (``{"start", "end", "text"}``), so a
    target-dependent task's control items look like its examples."""
    if definition.family is not TaskFamily.target_dependent:
        if span is not None:
            raise Invalid(f"target_span only applies to target-dependent tasks; task {definition.name!r} has none")
        return None
    if span is None:
        raise Invalid("target_span is required in a target-dependent task: give [start, end] offsets of the target")
    if len(span) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in span):
        raise Invalid("target_span must be two integers [start, end]")
    start, end = span
    if not 0 <= start < end <= len(text) or not text[start:end].strip():
        raise Invalid(f"target_span [{start}, {end}] does not mark words inside the text (0..{len(text)})")
    return {"start": start, "end": end, "text": text[start:end]}


def _labels(definition: TaskDefinition, labels: list[str]) -> list[str]:
    if not labels:
        raise Invalid("give the control item's known label(s) in labels")
    if definition.is_multi_label:
        return check_validation_label(definition, labels)
    allowed = definition.effective_validation_labels
    unknown = [label for label in labels if label not in allowed]
    if unknown:
        raise Invalid(f"labels {unknown} are not validation labels of task {definition.name!r}; use {allowed}")
    return sorted(set(labels), key=allowed.index)


def _insert(session: Session, item: ControlItem) -> bool:
    """Insert ``item`` unless the task has its text already; False when it had."""
    try:
        with session.begin_nested():
            session.add(item)
    except IntegrityError:
        return False
    return True


def sync_task_controls(session: Session, task: Task) -> None:
    """Add the task YAML's control items that the database does not hold yet."""
    definition = definition_of(task)
    specs = definition.quality.control_items
    if not specs:
        return
    held = set(session.scalars(select(ControlItem.text_sha256).where(ControlItem.task_id == task.id)))
    for spec in specs:
        if _text_key(spec.text) in held:
            continue
        _insert(
            session,
            ControlItem(
                task_id=task.id,
                text=spec.text,
                text_sha256=_text_key(spec.text),
                labels=_labels(definition, spec.labels),
                target_span=_span(spec.text, spec.target_span, definition),
                source="task_yaml",
                active=True,
            ),
        )


def add_control_item(
    session: Session, actor: User, task: Task, text: str, labels: list[str], target_span: list[int] | None
) -> ControlItem:
    """A researcher's new control item for ``task``."""
    definition = definition_of(task)
    cleaned = clean_text(
        text,
        field="text",
        min_chars=definition.constraints.min_chars,
        max_chars=min(MAX_CONTROL_CHARS, max(definition.constraints.max_chars, definition.constraints.min_chars)),
        min_words=1,
    )
    item = ControlItem(
        task_id=task.id,
        text=cleaned,
        text_sha256=_text_key(cleaned),
        labels=_labels(definition, labels),
        target_span=_span(cleaned, target_span, definition),
        source="api",
        active=True,
        created_by_id=actor.id,
    )
    sync_task_controls(session, task)
    if not _insert(session, item):
        raise Conflict(f"task {task.name!r} already has a control item with this text; change the text")
    audit.record(session, actor, "control_item.create", "control_item", item.id, task=task.name)
    return item


def list_control_items(session: Session, task: Task) -> list[ControlItem]:
    sync_task_controls(session, task)
    return list(session.scalars(select(ControlItem).where(ControlItem.task_id == task.id).order_by(ControlItem.id)))


def retire_control_item(session: Session, actor: User, task: Task, control_id: int) -> ControlItem:
    """Stop serving a control item. Its past answers still count towards gold accuracy."""
    item = session.get(ControlItem, control_id)
    if item is None or item.task_id != task.id:
        raise NotFound(f"task {task.name!r} has no control item {control_id}; list them with GET .../control-items")
    if item.active:
        item.active = False
        audit.record(session, actor, "control_item.retire", "control_item", item.id, task=task.name)
    return item


def answer_is_right(definition: TaskDefinition, control: ControlItem, label: list[str]) -> bool:
    """Single-label tasks: the answer is one of the known labels. Multi-label: exactly their set."""
    known = list(control.labels)
    if definition.is_multi_label:
        return set(label) == set(known)
    return len(label) == 1 and label[0] in known


@dataclass
class GoldAccuracy:
    user_id: int
    answers: int
    correct: int

    @property
    def rate(self) -> float | None:
        return self.correct / self.answers if self.answers else None


def gold_accuracy(
    session: Session, task: Task, round_: Round | None = None, user_ids: list[int] | None = None
) -> dict[int, GoldAccuracy]:
    """Each validator's answers to control items and how many were right: on the whole task, or
    on one round's batches."""
    query = (
        select(
            ValidationBatch.validator_id,
            func.count(ValidationBatchItem.id),
            func.count(ValidationBatchItem.id).filter(ValidationBatchItem.correct.is_(True)),
        )
        .join(ValidationBatch, ValidationBatchItem.batch_id == ValidationBatch.id)
        .join(Round, ValidationBatch.round_id == Round.id)
        .where(
            Round.task_id == task.id,
            ValidationBatchItem.control_item_id.is_not(None),
            ValidationBatchItem.answered_at.is_not(None),
        )
        .group_by(ValidationBatch.validator_id)
    )
    if round_ is not None:
        query = query.where(ValidationBatch.round_id == round_.id)
    if user_ids is not None:
        query = query.where(ValidationBatch.validator_id.in_(user_ids))
    return {
        user_id: GoldAccuracy(user_id=user_id, answers=answers, correct=correct)
        for user_id, answers, correct in session.execute(query)
    }


def failed_gold(session: Session, task: Task, user_ids: list[int]) -> set[int]:
    """Those of ``user_ids`` whose gold accuracy on ``task`` is judged (at least
    ``min_control_answers`` control answers) and below ``gold_accuracy_threshold``: they failed
    the task's attention checks, whenever their session met its quota (the ledger pays them no
    base pay, services/domain/ledger.py)."""
    settings = definition_of(task).quality
    return {
        user_id
        for user_id, accuracy in gold_accuracy(session, task, user_ids=user_ids).items()
        if accuracy.answers >= settings.min_control_answers
        and accuracy.rate is not None
        and accuracy.rate < settings.gold_accuracy_threshold
    }


def apply_gold_threshold(session: Session, actor: User | None, task: Task, user: User) -> bool:
    """Unqualify ``user`` on ``task`` when their gold accuracy fell below the task's threshold
    after enough control answers (their labels stop counting; their examples are re-queued).
    True when they were unqualified now."""
    settings = definition_of(task).quality
    accuracy = gold_accuracy(session, task, user_ids=[user.id]).get(user.id)
    if accuracy is None or accuracy.answers < settings.min_control_answers:
        return False
    rate = accuracy.rate
    if rate is None or rate >= settings.gold_accuracy_threshold:
        return False
    if not task_worker(session, task, user).qualified:
        return False
    unqualify(
        session,
        actor,
        task,
        user,
        reason=f"answered {accuracy.correct} of {accuracy.answers} control items right ({rate:.0%}; "
        f"the task asks for at least {settings.gold_accuracy_threshold:.0%})",
    )
    return True


def control_usage(session: Session, task: Task) -> dict[int, tuple[int, int, int]]:
    """Each control item of ``task``: (times served, answers, right answers)."""
    rows = session.execute(
        select(
            ValidationBatchItem.control_item_id,
            func.count(ValidationBatchItem.id),
            func.count(ValidationBatchItem.answered_at),
            func.count(ValidationBatchItem.id).filter(ValidationBatchItem.correct.is_(True)),
        )
        .join(ControlItem, ValidationBatchItem.control_item_id == ControlItem.id)
        .where(ControlItem.task_id == task.id)
        .group_by(ValidationBatchItem.control_item_id)
    ).all()
    return {control_id: (served, answers, correct) for control_id, served, answers, correct in rows if control_id}
