"""The validator's flow (docs/design.md "Validation protocol"; DynaSent §3.3, App. B).

Validators get batches of up to ``validation_batch_size`` examples written by others, fooling
examples first, then the least-validated; never their own, never one they labelled, never one
that already has its labels. A batch is *selected* fooling-first but *shown* in an order that
says nothing about the model (:func:`shown_order`): were fooling examples shown first, an
example's position would tell the validator that the model got it wrong. Each label is
counted against ``validations_needed`` with a conditional UPDATE, so two validators racing for
the last slot can never exceed it. A batch *claims* its examples for a while so concurrent
validators are handed different ones.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from sqlalchemy import Select, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import (
    Example,
    ExampleStatus,
    Round,
    RoundStatus,
    User,
    Validation,
    ValidationClaim,
    utcnow,
)
from services.db.statements import rows_matched
from services.domain.example_status import finalize_example
from services.domain.labels import check_validation_label
from services.domain.quality import apply_agreement_threshold, require_qualified, task_worker
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid, missing_example
from services.taskdef import TaskDefinition
from services.text import clean_text

CLAIM_MINUTES = 30
_VALIDATING_ROUNDS = (RoundStatus.collecting, RoundStatus.validating)


def _require_validator(session: Session, validator: User, round_: Round) -> TaskDefinition:
    task = round_.task
    if round_.status not in _VALIDATING_ROUNDS:
        raise Conflict(f"round {round_.number} of task {task.name!r} is {round_.status.value}; validation is over")
    require_qualified(task_worker(session, task, validator), task)
    return definition_of(task)


def get_batch(session: Session, validator: User, round_: Round, size: int | None = None) -> list[Example]:
    """Up to ``size`` examples for this validator; examples they already hold come first, so
    a reloaded page gets the same batch back."""
    definition = _require_validator(session, validator, round_)
    size = min(size or definition.validation_batch_size, definition.validation_batch_size)
    now = utcnow()
    session.execute(delete(ValidationClaim).where(ValidationClaim.expires_at <= now))
    labelled_by_me = select(Validation.example_id).where(Validation.validator_id == validator.id)
    open_examples = (
        Example.round_id == round_.id,
        Example.status == ExampleStatus.validating,
        # Harvested examples have no writer: any validator may label them.
        or_(Example.writer_id.is_(None), Example.writer_id != validator.id),
        Example.validation_count < Example.validations_needed,
        Example.id.not_in(labelled_by_me),
    )
    held = list(
        session.scalars(
            select(Example)
            .join(ValidationClaim, ValidationClaim.example_id == Example.id)
            .where(ValidationClaim.validator_id == validator.id, *open_examples)
            .order_by(Example.fooled.desc(), Example.validation_count, Example.id)
        )
    )
    if len(held) < size:
        others_claims = (
            select(func.count())
            .where(ValidationClaim.example_id == Example.id, ValidationClaim.validator_id != validator.id)
            .correlate(Example)
            .scalar_subquery()
        )
        held_ids = [e.id for e in held]
        fresh = list(
            session.scalars(
                select(Example)
                .where(
                    *open_examples,
                    Example.id.not_in(held_ids),
                    Example.validation_count + others_claims < Example.validations_needed,
                )
                .order_by(Example.fooled.desc(), Example.validation_count, Example.id)
                .limit(size - len(held))
            )
        )
        expires = now + dt.timedelta(minutes=CLAIM_MINUTES)
        for example in fresh:
            session.add(ValidationClaim(example_id=example.id, validator_id=validator.id, expires_at=expires))
        held.extend(fresh)
    batch = held[:size]
    batch.sort(key=lambda example: shown_order(validator.id, example.id))
    return batch


def shown_order(validator_id: int, example_id: int) -> str:
    """Where an example stands in a validator's batch: a hash of the two ids, so the order is
    unrelated to whether the model was fooled, differs between validators, and stays the same
    when the page is reloaded or an example leaves the batch."""
    return hashlib.sha256(f"{validator_id}:{example_id}".encode()).hexdigest()


def get_example(session: Session, example_id: int) -> Example:
    example = session.get(Example, example_id)
    if example is None:
        raise missing_example(example_id)
    return example


def submit_validation(
    session: Session,
    validator: User,
    example: Example,
    raw_label: Any,
    flagged: bool = False,
    flag_reason: str | None = None,
    seconds_taken: float | None = None,
    idempotency_key: str | None = None,
) -> tuple[Validation, bool]:
    """Record one label (``ExamplePolicy.validate`` decides who may: never the example's
    writer). Returns (validation, created); a retried identical request returns the stored
    validation with created=False."""
    example_id = example.id
    round_ = example.round
    label = check_validation_label(definition_of(round_.task), raw_label)
    if seconds_taken is not None and not 0 <= seconds_taken <= 86_400:
        raise Invalid("seconds_taken must be between 0 and 86400")
    reason = clean_text(flag_reason, field="flag_reason", max_chars=1000) if flag_reason else None
    if reason and not flagged:
        raise Invalid("flag_reason is given but flagged is false; set flagged to true or drop the reason")
    existing = session.scalar(
        select(Validation).where(Validation.example_id == example.id, Validation.validator_id == validator.id)
    )
    if existing is not None:
        # A label resent (its answer lost on the way) is answered as saved, whatever happened
        # since: the round may have closed, or the validator been unqualified, after it was
        # recorded. Otherwise the validator could not tell a saved label from a lost one.
        if existing.label == label and existing.flagged == flagged:
            return existing, False
        raise Conflict(f"you already labelled example {example.id} as {existing.label}; labels cannot be changed")
    definition = _require_validator(session, validator, round_)
    counted = rows_matched(
        session,
        update(Example)
        .where(
            Example.id == example.id,
            Example.status == ExampleStatus.validating,
            Example.validation_count < Example.validations_needed,
        )
        .values(validation_count=Example.validation_count + 1)
        .execution_options(synchronize_session=False),
    )
    if not counted:
        raise Conflict(f"example {example.id} already has all its labels; fetch a new batch")
    validation = Validation(
        example_id=example.id,
        validator_id=validator.id,
        label=label,
        flagged=flagged,
        flag_reason=reason,
        seconds_taken=seconds_taken,
        counted=True,
        # The pass it belongs to: 0, or 1 once the example was re-queued for new validators.
        annotation_pass=example.requeue_count,
        idempotency_key=idempotency_key,
    )
    session.add(validation)
    try:
        session.flush()
    except IntegrityError as exc:
        # example_id, not example.id: after the failed flush the session cannot load anything.
        raise Conflict(f"your label for example {example_id} is being recorded by another request; retry") from exc
    session.execute(
        delete(ValidationClaim).where(
            ValidationClaim.example_id == example.id, ValidationClaim.validator_id == validator.id
        )
    )
    session.refresh(example)
    if example.validation_count >= example.validations_needed:
        finalize_example(session, example, definition)
    # "After each batch window" (DynaSent App. B): judge this validator every full batch of
    # labels in this round, on this round's labels. Counting and judging over the whole task
    # read every label of every earlier round again each batch, so labelling slowed as the
    # database grew (docs/benchmarks.md, "Labelling"); the researcher's
    # ``worker-quality/apply`` still judges the whole task.
    given = session.scalar(labels_in_round(validator.id, round_.id)) or 0
    if given % definition.validation_batch_size == 0:
        apply_agreement_threshold(session, None, round_.task, only_user_id=validator.id, round_=round_)
    return validation, True


def labels_in_round(validator_id: int, round_id: int) -> Select[int]:
    """How many labels the validator gave in the round. It starts from the validator's labels
    (index ix_validations_validator_example, migration 0010) and looks up each one's round by
    primary key: written as a join, PostgreSQL planned it from the round's examples instead,
    which cost more the larger the round (docs/benchmarks.md, "Labelling")."""
    example_round = (
        select(Example.round_id).where(Example.id == Validation.example_id).correlate(Validation).scalar_subquery()
    )
    return (
        select(func.count())
        .select_from(Validation)
        .where(Validation.validator_id == validator_id, example_round == round_id)
    )


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
