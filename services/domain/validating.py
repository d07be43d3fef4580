"""The validator's flow (docs/design.md "Validation protocol"; DynaSent §3.3, App. B).

Validators get batches of up to ``validation_batch_size`` examples written by others, fooling
examples first, then the least-validated; never their own, never one they labelled, never one
that already has its labels. A batch is *selected* fooling-first but *shown* in an order that
says nothing about the model (shuffled with the batch's own seed): were fooling examples shown
first, an example's position would tell the validator that the model got it wrong. Each served
batch is recorded (``ValidationBatch``, issue 26) with its items, examples and the task's
control items (services.domain.controls) mixed in, each under an opaque key of that serving;
a label is accepted only for an item of the validator's live batch, and asking again while the
batch is live returns the same batch, so refreshing never brings other examples. Each label is
counted against ``validations_needed`` with a conditional UPDATE, so two validators racing for
the last slot can never exceed it. A batch *claims* its examples for a while so concurrent
validators are handed different ones.
"""

from __future__ import annotations

import datetime as dt
import random
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, bindparam, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload
from sqlalchemy.orm.attributes import set_committed_value

from services.db.models import (
    ControlItem,
    Example,
    ExampleStatus,
    Round,
    RoundStatus,
    User,
    Validation,
    ValidationBatch,
    ValidationBatchItem,
    ValidationClaim,
    utcnow,
)
from services.db.statements import (
    insert_persistent,
    object_by_id,
    rows_matched,
    table_of,
    update_by_id,
    update_loaded,
)
from services.domain.controls import answer_is_right, apply_gold_threshold, sync_task_controls
from services.domain.example_status import finalize_example
from services.domain.labels import check_validation_label
from services.domain.quality import apply_agreement_threshold, require_qualified, task_worker
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid, NotFound, missing_example
from services.taskdef import TaskDefinition
from services.text import clean_text

CLAIM_MINUTES = 30
# The tables of a label's writes and counts, for Core statements (services/db/statements.py).
_examples = table_of(Example).c
_validations = table_of(Validation).c
_claims = table_of(ValidationClaim).c
_VALIDATING_ROUNDS = (RoundStatus.collecting, RoundStatus.validating)


def _require_validator(session: Session, validator: User, round_: Round) -> TaskDefinition:
    task = round_.task
    if round_.status not in _VALIDATING_ROUNDS:
        raise Conflict(f"round {round_.number} of task {task.name!r} is {round_.status.value}; validation is over")
    require_qualified(task_worker(session, task, validator), task)
    return definition_of(task)


@dataclass
class ServedItem:
    """One item of a served batch as the validator sees it: an opaque key, the text and the
    target, the same for an example and a control item."""

    item_key: str
    text: str
    target_span: dict[str, Any] | None


def _live_batch(session: Session, validator: User, round_: Round, now: dt.datetime) -> ValidationBatch | None:
    return session.scalar(
        select(ValidationBatch)
        .where(
            ValidationBatch.validator_id == validator.id,
            ValidationBatch.round_id == round_.id,
            ValidationBatch.closed_at.is_(None),
            ValidationBatch.expires_at > now,
        )
        .order_by(ValidationBatch.id.desc())
        .limit(1)
    )


def _open_items(session: Session, validator: User, batch: ValidationBatch) -> list[ValidationBatchItem]:
    """The batch's items the validator can still label, in the batch's shuffled order: not
    answered, and (examples) still in need of labels."""
    items = [item for item in batch.items if item.answered_at is None]
    example_ids = [item.example_id for item in items if item.example_id is not None]
    still_open = set(
        session.scalars(
            select(Example.id).where(
                Example.id.in_(example_ids),
                Example.status == ExampleStatus.validating,
                Example.validation_count < Example.validations_needed,
                Example.id.not_in(select(Validation.example_id).where(Validation.validator_id == validator.id)),
            )
        )
    )
    return [item for item in items if item.example_id is None or item.example_id in still_open]


def _control_count(examples: int, rate: float, rng: random.Random) -> int:
    """Control items to add to ``examples`` examples so that on average a share ``rate`` of the
    batch's items are controls (rounded at random, so small batches get their share too)."""
    if examples == 0 or rate <= 0:
        return 0
    expected = examples * rate / (1 - rate)
    whole = int(expected)
    return whole + (1 if rng.random() < expected - whole else 0)


def _pick_controls(
    session: Session, validator: User, round_: Round, count: int, rng: random.Random
) -> list[ControlItem]:
    """``count`` of the task's active control items, those this validator was shown least first."""
    if count == 0:
        return []
    sync_task_controls(session, round_.task)
    pool = list(
        session.scalars(
            select(ControlItem)
            .where(ControlItem.task_id == round_.task_id, ControlItem.active.is_(True))
            .order_by(ControlItem.id)
        )
    )
    if not pool:
        return []
    shown: dict[int | None, int] = dict(
        session.execute(
            select(ValidationBatchItem.control_item_id, func.count())
            .join(ValidationBatch, ValidationBatchItem.batch_id == ValidationBatch.id)
            .where(ValidationBatch.validator_id == validator.id, ValidationBatchItem.control_item_id.is_not(None))
            .group_by(ValidationBatchItem.control_item_id)
        ).all()
    )
    rng.shuffle(pool)
    pool.sort(key=lambda control: shown.get(control.id, 0))
    return pool[:count]


# Core, built once (services/db/statements.py): the claims whose time ran out, and a validator's
# claims in a round, let go.
_RELEASE_EXPIRED_CLAIMS = delete(table_of(ValidationClaim)).where(_claims.expires_at <= bindparam("now"))
_RELEASE_MY_CLAIMS = delete(table_of(ValidationClaim)).where(
    _claims.validator_id == bindparam("validator_id"),
    _claims.example_id.in_(select(_examples.id).where(_examples.round_id == bindparam("round_id"))),
)


def get_batch(session: Session, validator: User, round_: Round, size: int | None = None) -> list[ServedItem]:
    """The validator's live batch in the round, or a new one.

    A live batch (not expired, not every item done) is returned again as it was served, in the
    same order: reloading the page, or asking again, never brings other examples. Once it is
    done (or expired) a new batch is served: up to ``validation_batch_size`` examples written by
    others, fooling examples first, then the least-validated (the selection), with the task's
    share of control items mixed in, all in an order shuffled with the batch's own seed, each
    under a new opaque key. ``size`` shows only the first items of the batch."""
    definition = _require_validator(session, validator, round_)
    size = min(size or definition.validation_batch_size, definition.validation_batch_size)
    now = utcnow()
    session.execute(_RELEASE_EXPIRED_CLAIMS, {"now": now})
    live = _live_batch(session, validator, round_, now)
    if live is not None:
        items = _open_items(session, validator, live)
        if items:
            return [_served(item) for item in items[:size]]
        live.closed_at = now
    batch = _new_batch(session, validator, round_, definition, now)
    return [] if batch is None else [_served(item) for item in batch.items[:size]]


def _new_batch(
    session: Session, validator: User, round_: Round, definition: TaskDefinition, now: dt.datetime
) -> ValidationBatch | None:
    # Claims of this validator left by an earlier batch (its items done or expired) are let go.
    session.execute(_RELEASE_MY_CLAIMS, {"validator_id": validator.id, "round_id": round_.id})
    labelled_by_me = select(Validation.example_id).where(Validation.validator_id == validator.id)
    others_claims = (
        select(func.count())
        .where(ValidationClaim.example_id == Example.id, ValidationClaim.validator_id != validator.id)
        .correlate(Example)
        .scalar_subquery()
    )
    examples = list(
        session.scalars(
            select(Example)
            .where(
                Example.round_id == round_.id,
                Example.status == ExampleStatus.validating,
                # Harvested examples have no writer: any validator may label them.
                or_(Example.writer_id.is_(None), Example.writer_id != validator.id),
                Example.id.not_in(labelled_by_me),
                Example.validation_count + others_claims < Example.validations_needed,
            )
            .order_by(Example.fooled.desc(), Example.validation_count, Example.id)
            .limit(definition.validation_batch_size)
        )
    )
    if not examples:
        return None
    seed = secrets.randbits(62)
    rng = random.Random(seed)
    controls = _pick_controls(
        session, validator, round_, _control_count(len(examples), definition.quality.control_rate, rng), rng
    )
    expires = now + dt.timedelta(minutes=CLAIM_MINUTES)
    # The items are built on the batch in position order, with their examples and control items
    # as objects: the caller serves them from memory, not from a second read of each.
    batch = ValidationBatch(
        round_id=round_.id, validator_id=validator.id, seed=seed, served_at=now, expires_at=expires, items=[]
    )
    session.add(batch)
    entries: list[Example | ControlItem] = [*examples, *controls]
    # Shown in an order that says nothing about the model: were fooling examples shown first, an
    # example's position would tell the validator that the model got it wrong.
    rng.shuffle(entries)
    for position, entry in enumerate(entries):
        is_example = isinstance(entry, Example)
        batch.items.append(
            ValidationBatchItem(
                position=position,
                item_key=secrets.token_urlsafe(16),
                example=entry if is_example else None,
                control_item=None if is_example else entry,
                flagged=False,
            )
        )
    for example in examples:
        session.add(ValidationClaim(example_id=example.id, validator_id=validator.id, expires_at=expires))
    session.flush()
    return batch


def _served(item: ValidationBatchItem) -> ServedItem:
    if item.example is not None:
        return ServedItem(item.item_key, item.example.text, item.example.extras.get("target_span"))
    control = item.control_item
    if control is None:  # the check constraint: an item is an example or a control item
        raise RuntimeError(f"validation batch item {item.id} has neither an example nor a control item")
    return ServedItem(item.item_key, control.text, control.target_span)


# A validator's every label reads its item, with what labelling reads next (the batch's owner,
# round and task; the example) in the same statement; built once (services/db/statements.py).
_BATCH_ITEM = (
    select(ValidationBatchItem)
    .options(
        joinedload(ValidationBatchItem.batch).joinedload(ValidationBatch.round).joinedload(Round.task),
        joinedload(ValidationBatchItem.example),
    )
    .where(ValidationBatchItem.item_key == bindparam("item_key"))
)


def get_batch_item(session: Session, validator: User, item_key: str) -> ValidationBatchItem:
    """An item of a batch served to ``validator``; another validator's item is as a missing one."""
    item = session.scalar(_BATCH_ITEM, {"item_key": item_key})
    if item is None or item.batch.validator_id != validator.id:
        raise NotFound(
            "no such item in your validation batches; label the items of the batch that "
            "GET /rounds/{round_id}/validation-batch gives you"
        )
    return item


def _live_item_of_example(
    session: Session, validator: User, example_id: int, now: dt.datetime
) -> ValidationBatchItem | None:
    """The example's unanswered item in a live batch of the validator, if any."""
    return session.scalar(
        select(ValidationBatchItem)
        .join(ValidationBatch, ValidationBatchItem.batch_id == ValidationBatch.id)
        .where(
            ValidationBatchItem.example_id == example_id,
            ValidationBatchItem.answered_at.is_(None),
            ValidationBatch.validator_id == validator.id,
            ValidationBatch.closed_at.is_(None),
            ValidationBatch.expires_at > now,
        )
        .order_by(ValidationBatchItem.id.desc())
        .limit(1)
    )


def _batch_is_live(batch: ValidationBatch, now: dt.datetime) -> bool:
    return batch.closed_at is None and batch.expires_at > now


NOT_LIVE = (
    "is not in a validation batch that is yours now (never served to you, or its batch expired or was "
    "replaced); fetch your batch with GET /rounds/{round_id}/validation-batch and label its items"
)


def get_example(session: Session, example_id: int) -> Example:
    example = session.get(Example, example_id)
    if example is None:
        raise missing_example(example_id)
    return example


@dataclass
class ItemAnswer:
    """A label given to a batch item, as the validator is told of it: the same for an example
    and a control item."""

    item_key: str
    label: list[str]
    flagged: bool
    created_at: dt.datetime
    created: bool


def _checked_extras(flagged: bool, flag_reason: str | None, seconds_taken: float | None) -> str | None:
    if seconds_taken is not None and not 0 <= seconds_taken <= 86_400:
        raise Invalid("seconds_taken must be between 0 and 86400")
    reason = clean_text(flag_reason, field="flag_reason", max_chars=1000) if flag_reason else None
    if reason and not flagged:
        raise Invalid("flag_reason is given but flagged is false; set flagged to true or drop the reason")
    return reason


def has_control_items(session: Session, round_: Round) -> bool:
    """True when the round's batches may hold control items (the task's rate and its items)."""
    if definition_of(round_.task).quality.control_rate <= 0:
        return False
    sync_task_controls(session, round_.task)
    return (
        session.scalar(
            select(ControlItem.id).where(ControlItem.task_id == round_.task_id, ControlItem.active.is_(True)).limit(1)
        )
        is not None
    )


# Core, built once (services/db/statements.py): a control item's answer, if it has none yet.
_items = table_of(ValidationBatchItem).c
_ANSWER_CONTROL = update_by_id(
    ValidationBatchItem,
    "answered_item_id",
    *("answered_at", "label", "correct", "flagged", "flag_reason", "seconds_taken", "idempotency_key"),
).where(_items.answered_at.is_(None))


def label_item(
    session: Session,
    validator: User,
    item_key: str,
    raw_label: Any,
    flagged: bool = False,
    flag_reason: str | None = None,
    seconds_taken: float | None = None,
    idempotency_key: str | None = None,
    item: ValidationBatchItem | None = None,
) -> ItemAnswer:
    """Label one item of the validator's live batch, an example or a control item, with the same
    answers and the same errors for both (nothing in them tells a control item apart). A
    retried identical label is answered with the stored one (``created`` false). ``item``: the
    item ``item_key`` names, if the caller has just read it with :func:`get_batch_item`."""
    if item is None or item.item_key != item_key:
        item = get_batch_item(session, validator, item_key)
    round_ = item.batch.round
    definition = definition_of(round_.task)
    label = check_validation_label(definition, raw_label)
    reason = _checked_extras(flagged, flag_reason, seconds_taken)
    checked = None
    if item.answered_at is None:
        # The round and the validator's standing first (why they cannot label at all), then
        # whether this batch is still theirs: the same order for both kinds of item.
        checked = _require_validator(session, validator, round_)
        if not _batch_is_live(item.batch, utcnow()):
            raise Conflict(NOT_LIVE_ITEM)
    if item.example is not None:
        validation, created = submit_validation(
            session,
            validator,
            item.example,
            label,
            flagged,
            reason,
            seconds_taken,
            idempotency_key,
            item=item,
            checked_definition=checked,
        )
        return ItemAnswer(item.item_key, validation.label, validation.flagged, validation.created_at, created)
    control = item.control_item
    if control is None:
        raise RuntimeError(f"validation batch item {item.id} has neither an example nor a control item")
    if item.answered_at is None:
        now = utcnow()
        answer = {
            "answered_at": now,
            "label": label,
            "correct": answer_is_right(definition, control, label),
            "flagged": flagged,
            "flag_reason": reason,
            "seconds_taken": seconds_taken,
            "idempotency_key": idempotency_key,
        }
        answered = rows_matched(session, _ANSWER_CONTROL, {"answered_item_id": item.id, **answer})
        session.refresh(item)
        if answered:
            apply_gold_threshold(session, None, round_.task, validator)
            return ItemAnswer(item.item_key, label, flagged, now, True)
    # Answered before (a resent label whose answer was lost): the stored answer, or a refusal.
    if item.label == label and item.flagged == flagged and item.answered_at is not None:
        return ItemAnswer(item.item_key, list(item.label), item.flagged, item.answered_at, False)
    raise Conflict(f"you already labelled this item as {item.label}; labels cannot be changed")


NOT_LIVE_ITEM = (
    "this item's validation batch is no longer yours (it expired or was replaced); fetch your batch with "
    "GET /rounds/{round_id}/validation-batch and label its items"
)


# Built once (services/db/statements.py): one more label counted on an example that still needs
# one, and the row as the UPDATE left it.
_COUNT_LABEL = (
    update(table_of(Example))
    .where(
        _examples.id == bindparam("example_id"),
        _examples.status == ExampleStatus.validating,
        _examples.validation_count < _examples.validations_needed,
    )
    .values(validation_count=_examples.validation_count + 1)
    .returning(_examples.validation_count, _examples.validations_needed, _examples.status, _examples.requeue_count)
)


def _record_validation(
    session: Session,
    validator: User,
    example: Example,
    name: str,
    label: list[str],
    flagged: bool,
    reason: str | None,
    seconds_taken: float | None,
    idempotency_key: str | None,
) -> Validation:
    """Count the label on the example (one conditional UPDATE: never past the labels it needs)
    and write the validation; :class:`Conflict` when the example has all its labels or another
    request is recording the same label."""
    # The row as the UPDATE left it comes back with it (RETURNING: SQLite 3.35+, PostgreSQL):
    # the count, and what a concurrent label's finalize_example may have changed, without a
    # second read of the row. No row back means the condition failed.
    counted = session.execute(_COUNT_LABEL, {"example_id": example.id}).one_or_none()
    if counted is None:
        raise Conflict(f"{name} already has all its labels; fetch your batch again")
    for column, value in zip(
        ("validation_count", "validations_needed", "status", "requeue_count"), counted, strict=True
    ):
        set_committed_value(example, column, value)
    values = {
        "example_id": example.id,
        "validator_id": validator.id,
        "label": label,
        "flagged": flagged,
        "flag_reason": reason,
        "seconds_taken": seconds_taken,
        "counted": True,
        # The pass it belongs to: 0, or 1 once the example was re-queued for new validators.
        "annotation_pass": example.requeue_count,
        "idempotency_key": idempotency_key,
        "created_at": utcnow(),
    }
    try:
        return insert_persistent(session, Validation, values)
    except IntegrityError as exc:
        # No object of the session is read here: after the failed INSERT, PostgreSQL's
        # transaction cannot run another statement.
        raise Conflict(f"your label for {name} is being recorded by another request; retry") from exc


# Built once (services/db/statements.py).
_RELEASE_CLAIM = delete(table_of(ValidationClaim)).where(
    _claims.example_id == bindparam("example_id"), _claims.validator_id == bindparam("validator_id")
)


_ANSWER_ITEM = update_by_id(ValidationBatchItem, "answered_item_id", "answered_at", "validation_id", "label", "flagged")


def _answer_item(
    session: Session,
    validator: User,
    example: Example,
    item: ValidationBatchItem,
    validation: Validation,
    label: list[str],
    flagged: bool,
) -> None:
    """The validator's claim on the example is done with; its batch item is answered by ``validation``."""
    session.execute(_RELEASE_CLAIM, {"example_id": example.id, "validator_id": validator.id})
    answer = {
        "answered_at": validation.created_at,
        "validation_id": validation.id,
        "label": label,
        "flagged": flagged,
    }
    update_loaded(session, item, _ANSWER_ITEM, {"answered_item_id": item.id}, answer)


def _judge_validator_each_batch(session: Session, validator: User, round_: Round, definition: TaskDefinition) -> None:
    """Judge the validator's agreement once every full batch of their labels in the round."""
    # "After each batch window" (DynaSent App. B): judge this validator every full batch of
    # labels in this round, on this round's labels. Counting and judging over the whole task
    # read every label of every earlier round again each batch, so labelling slowed as the
    # database grew (docs/benchmarks.md, "Labelling"); the researcher's
    # ``worker-quality/apply`` still judges the whole task.
    given = session.scalar(_LABELS_IN_ROUND, {"validator_id": validator.id, "round_id": round_.id}) or 0
    if given % definition.validation_batch_size == 0:
        apply_agreement_threshold(session, None, round_.task, only_user_id=validator.id, round_=round_)


# Built once (services/db/statements.py): the validator's label of an example, if any.
# Core (services/db/statements.py): almost every label finds none, and the object is loaded
# only when there is one.
_VALIDATION_OF = select(_validations.id).where(
    _validations.example_id == bindparam("example_id"), _validations.validator_id == bindparam("validator_id")
)


def submit_validation(
    session: Session,
    validator: User,
    example: Example,
    raw_label: Any,
    flagged: bool = False,
    flag_reason: str | None = None,
    seconds_taken: float | None = None,
    idempotency_key: str | None = None,
    item: ValidationBatchItem | None = None,
    checked_definition: TaskDefinition | None = None,
) -> tuple[Validation, bool]:
    """Record one label (``ExamplePolicy.validate`` decides who may: never the example's
    writer) for an example of the validator's live batch: ``item`` when the label came through
    the batch item (:func:`label_item`), otherwise the example's unanswered item in a live batch
    of the validator, or the label is refused and nothing is written. Returns (validation,
    created); a retried identical request returns the stored validation with created=False.
    ``checked_definition``: the round's definition, when the caller has just checked the
    round and the validator's standing (``_require_validator``) in this transaction."""
    example_id = example.id
    round_ = example.round
    # Reached through its batch item, an example is named "this item" in every answer, as a
    # control item is: an example id in a message would tell the two apart.
    name = "this item" if item is not None else f"example {example_id}"
    label = check_validation_label(definition_of(round_.task), raw_label)
    reason = _checked_extras(flagged, flag_reason, seconds_taken)
    existing = object_by_id(
        session, Validation, _VALIDATION_OF, {"example_id": example.id, "validator_id": validator.id}
    )
    if existing is not None:
        # A label resent (its answer lost on the way) is answered as saved, whatever happened
        # since: the round may have closed, or the validator been unqualified, after it was
        # recorded. Otherwise the validator could not tell a saved label from a lost one.
        if existing.label == label and existing.flagged == flagged:
            return existing, False
        raise Conflict(f"you already labelled {name} as {existing.label}; labels cannot be changed")
    definition = checked_definition or _require_validator(session, validator, round_)
    if item is None:
        if has_control_items(session, round_):
            # Labelling by example id would let a validator find which batch items are examples
            # (they leave the batch) and so which are control items.
            raise Conflict(
                f"task {round_.task.name!r} mixes control items into its validation batches; label "
                "the items of your batch through POST /validation-items/{item_id}/validations"
            )
        item = _live_item_of_example(session, validator, example_id, utcnow())
        if item is None:
            # A concurrent copy of this request may have answered the item since ``existing``
            # was read (PostgreSQL reads each statement afresh): its label is the answer.
            racing = session.scalar(
                select(Validation).where(Validation.example_id == example_id, Validation.validator_id == validator.id)
            )
            if racing is not None and racing.label == label and racing.flagged == flagged:
                return racing, False
            # 409, not 403: the validator may label examples (the policy's answer); this one is
            # not theirs to label now.
            raise Conflict(f"example {example_id} {NOT_LIVE}")
    validation = _record_validation(
        session, validator, example, name, label, flagged, reason, seconds_taken, idempotency_key
    )
    _answer_item(session, validator, example, item, validation, label, flagged)
    if example.validation_count >= example.validations_needed:
        finalize_example(session, example, definition)
    _judge_validator_each_batch(session, validator, round_, definition)
    return validation, True


def labels_in_round(validator_id: int, round_id: int) -> Select[int]:
    """How many labels the validator gave in the round. It starts from the validator's labels
    (index ix_validations_validator_example, migration 0010) and looks up each one's round by
    primary key: written as a join, PostgreSQL planned it from the round's examples instead,
    which cost more the larger the round (docs/benchmarks.md, "Labelling")."""
    validations = table_of(Validation)
    example_round = (
        select(_examples.round_id)
        .where(_examples.id == _validations.example_id)
        .correlate(validations)
        .scalar_subquery()
    )
    return (
        select(func.count())
        .select_from(validations)
        .where(_validations.validator_id == validator_id, example_round == round_id)
    )


# The count above for bound ``validator_id`` and ``round_id``, built once (services/db/statements.py):
# it runs after every label.
_LABELS_IN_ROUND = labels_in_round(bindparam("validator_id"), bindparam("round_id"))  # type: ignore[arg-type]


def example_record(session: Session, example: Example) -> dict[str, Any]:
    """Everything about one example: its attempts, edit distances, confirmation and labels
    (a harvested example has no writer and no attempts, but its corpus source)."""
    assignment = example.assignment
    round_ = example.round
    prompt = assignment.prompt if assignment is not None else None
    people = [v.validator_id for v in example.validations]
    if example.writer_id is not None:
        people.append(example.writer_id)
    users = {u.id: u.username for u in session.scalars(select(User).where(User.id.in_(people)))}
    return {
        "id": example.id,
        "round": round_.number,
        "task": round_.task.name,
        "origin": example.origin.value,
        "source": example.source_metadata,
        "text": example.text,
        "target_label": example.target_label,
        "condition": example.condition.value,
        "prompt": None
        if prompt is None
        else {
            "id": prompt.id,
            "text": prompt.text,
            "source": prompt.source,
            "metadata": prompt.meta,
        },
        "writer": users.get(example.writer_id) if example.writer_id is not None else None,
        "model_prediction": example.model_prediction,
        "model_id": example.model_id,
        "fooled": example.fooled,
        "extras": example.extras,
        "status": example.status.value,
        "validation_count": example.validation_count,
        "validations_needed": example.validations_needed,
        "submitted_attempt_id": example.attempt_id,
        "attempts": [
            {
                "id": a.id,
                "text": a.text,
                "status": a.status.value,
                "prediction": a.prediction,
                "probabilities": a.probabilities,
                "model_id": a.model_id,
                "model_version": a.model_version,
                "model_precision": a.model_precision,
                "latency_ms": a.latency_ms,
                "edit_distance": a.edit_distance,
                "seconds_since_start": a.seconds_since_start,
                "fooled": a.fooled,
                "counts_as_try": a.counts_as_try,
                "confirmed": a.confirmed,
                "judged_label": a.judged_label,
                "target_span": a.target_span,
                "created_at": a.created_at.isoformat(),
            }
            for a in (assignment.attempts if assignment is not None else [])
        ],
        "validations": [
            {
                "validator": users.get(v.validator_id),
                "label": v.label,
                "counted": v.counted,
                "flagged": v.flagged,
                "flag_reason": v.flag_reason,
                "seconds_taken": v.seconds_taken,
                "created_at": v.created_at.isoformat(),
            }
            for v in example.validations
        ],
    }
