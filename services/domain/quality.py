"""Worker quality: onboarding quiz, agreement with the majority, (un)qualification.

DynaSent §3.3 and App. B: validators whose rate of disagreement with the majority exceeds a
threshold (80%) are unqualified: their future access stops, their labels stop counting and
the examples they labelled are re-queued until they have enough labels from qualified
validators. Unqualified workers are never deleted; their labels stay in the database.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import (
    Example,
    ExampleStatus,
    QuizAttempt,
    Round,
    RoundStatus,
    Task,
    TaskWorker,
    User,
    Validation,
    ValidationBatch,
    ValidationClaim,
    utcnow,
)
from services.db.statements import rows_matched
from services.domain import audit
from services.domain.example_status import finalize_example
from services.domain.labels import agreement_with, gold_label, last_pass
from services.domain.tasks import definition_of
from services.errors import Conflict, Forbidden, Invalid, NotFound
from services.taskdef import TaskDefinition
from services.text import clean_text

# Read by every writer's and validator's step: built once (services/db/statements.py).
_TASK_WORKER = select(TaskWorker).where(
    TaskWorker.task_id == bindparam("task_id"), TaskWorker.user_id == bindparam("user_id")
)


def task_worker(session: Session, task: Task, user: User) -> TaskWorker:
    """The worker's standing on a task, created on first use."""
    worker = session.scalar(_TASK_WORKER, {"task_id": task.id, "user_id": user.id})
    if worker is None:
        worker = TaskWorker(
            task_id=task.id,
            user_id=user.id,
            quiz_attempts=0,
            onboarding_passed=False,
            qualified=True,
            agreement_labels=0,
        )
        try:
            with session.begin_nested():
                session.add(worker)
        except IntegrityError:
            # Another request created it first.
            worker = session.scalars(
                select(TaskWorker).where(TaskWorker.task_id == task.id, TaskWorker.user_id == user.id)
            ).one()
    return worker


def require_qualified(worker: TaskWorker, task: Task) -> None:
    if not worker.qualified:
        raise Forbidden(
            f"you are no longer qualified for task {task.name!r}"
            + (f" ({worker.unqualified_reason})" if worker.unqualified_reason else "")
            + "; contact the researcher if you think this is a mistake"
        )


def require_onboarded(worker: TaskWorker, task: Task, definition: TaskDefinition) -> None:
    quiz = definition.onboarding_quiz
    if quiz is None or worker.onboarding_passed:
        return
    if worker.quiz_attempts >= quiz.max_attempts:
        raise Forbidden(
            f"you used all {quiz.max_attempts} attempts at the onboarding quiz of task "
            f"{task.name!r} without passing; you are held back from writing for this task"
        )
    raise Forbidden(
        f"take the onboarding quiz of task {task.name!r} first "
        f"(GET /api/v1/tasks/{task.name}/quiz); {quiz.max_attempts - worker.quiz_attempts} attempt(s) left",
        quiz_required=True,
    )


def quiz_status(session: Session, task: Task, user: User) -> dict[str, Any]:
    definition = definition_of(task)
    quiz = definition.onboarding_quiz
    worker = task_worker(session, task, user)
    if quiz is None:
        return {"required": False, "passed": True, "attempts_used": 0, "attempts_left": 0, "questions": []}
    return {
        "required": True,
        "passed": worker.onboarding_passed,
        "attempts_used": worker.quiz_attempts,
        "attempts_left": max(0, quiz.max_attempts - worker.quiz_attempts),
        "questions": [{"text": q.text, "options": q.options} for q in quiz.questions],
    }


def answer_quiz(session: Session, task: Task, user: User, answers: list[str]) -> dict[str, Any]:
    """Grade one quiz attempt. DynaSent Table 11: all answers right, within 5 attempts."""
    definition = definition_of(task)
    quiz = definition.onboarding_quiz
    if quiz is None:
        raise Conflict(f"task {task.name!r} has no onboarding quiz")
    if len(answers) != len(quiz.questions):
        raise Invalid(
            f"the quiz has {len(quiz.questions)} questions; send exactly that many answers (got {len(answers)})"
        )
    for index, (answer, question) in enumerate(zip(answers, quiz.questions, strict=True)):
        if answer not in question.options:
            raise Invalid(f"answer {index + 1} ({answer!r}) is not one of that question's options {question.options}")
    worker = task_worker(session, task, user)
    if worker.onboarding_passed:
        return {
            "passed": True,
            "attempts_used": worker.quiz_attempts,
            "attempts_left": quiz.max_attempts - worker.quiz_attempts,
        }
    # Conditional increment: concurrent submissions cannot exceed the attempt limit.
    attempt_taken = rows_matched(
        session,
        update(TaskWorker)
        .where(
            TaskWorker.id == worker.id,
            TaskWorker.quiz_attempts < quiz.max_attempts,
            TaskWorker.onboarding_passed.is_(False),
        )
        .values(quiz_attempts=TaskWorker.quiz_attempts + 1),
    )
    if not attempt_taken:
        raise Forbidden(
            f"you used all {quiz.max_attempts} attempts at the onboarding quiz of task {task.name!r}; "
            "you are held back from writing for this task"
        )
    session.refresh(worker)
    wrong = [i + 1 for i, (a, q) in enumerate(zip(answers, quiz.questions, strict=True)) if a != q.answer]
    passed = not wrong
    worker.onboarding_passed = passed
    session.add(
        QuizAttempt(task_id=task.id, user_id=user.id, answers=answers, correct=len(answers) - len(wrong), passed=passed)
    )
    return {
        "passed": passed,
        "attempts_used": worker.quiz_attempts,
        "attempts_left": max(0, quiz.max_attempts - worker.quiz_attempts),
    }


@dataclass
class ValidatorAgreement:
    user_id: int
    username: str
    labels: int
    judged: int
    agreement_rate: float | None
    qualified: bool


def validator_agreement(
    session: Session,
    task: Task,
    round_: Round | None = None,
    only_user_id: int | None = None,
    include_user_ids: list[int] | None = None,
) -> list[ValidatorAgreement]:
    """Each validator's rate of agreement with the majority (DynaSent Fig. 6).

    The majority of an example comes from its counted labels of its last annotation pass (a
    re-annotated example's gold is its new validators', as in the builder:
    services.domain.labels.last_pass); every label a validator gave (counted or not) is
    compared with it. Examples without a majority are not judged. With
    ``only_user_id`` only the examples that validator labelled are read. ``include_user_ids``
    are listed even without labels (validators who answered only control items).
    """
    definition = definition_of(task)
    query = (
        select(
            Validation.example_id,
            Validation.validator_id,
            Validation.label,
            Validation.counted,
            Validation.annotation_pass,
        )
        .join(Example, Validation.example_id == Example.id)
        .join(Round, Example.round_id == Round.id)
        .where(Round.task_id == task.id)
    )
    if round_ is not None:
        query = query.where(Example.round_id == round_.id)
    if only_user_id is not None:
        labelled = select(Validation.example_id).where(Validation.validator_id == only_user_id)
        if round_ is not None:
            labelled = labelled.join(Example, Validation.example_id == Example.id).where(Example.round_id == round_.id)
        query = query.where(Validation.example_id.in_(labelled))
    by_example: dict[int, list[tuple[int, list[str], bool, int]]] = defaultdict(list)
    for example_id, validator_id, label, counted, annotation_pass in session.execute(query):
        by_example[example_id].append((validator_id, label, counted, annotation_pass))
    totals: dict[int, list[float]] = defaultdict(list)
    label_counts: dict[int, int] = defaultdict(int)
    for responses in by_example.values():
        counted_responses = [(p, label) for _, label, counted, p in responses if counted]
        gold = gold_label(
            definition, last_pass([p for p, _ in counted_responses], [label for _, label in counted_responses])
        )
        for validator_id, label, _, _ in responses:
            label_counts[validator_id] += 1
            if gold is not None:
                totals[validator_id].append(agreement_with(definition, label, gold))
    for user_id in include_user_ids or ():
        label_counts.setdefault(user_id, 0)
    workers = {
        w.user_id: w
        for w in session.scalars(
            select(TaskWorker).where(TaskWorker.task_id == task.id, TaskWorker.user_id.in_(list(label_counts)))
        )
    }
    users = {u.id: u for u in session.scalars(select(User).where(User.id.in_(list(label_counts))))}
    result = []
    for validator_id, count in sorted(label_counts.items()):
        scores = totals.get(validator_id, [])
        worker = workers.get(validator_id)
        result.append(
            ValidatorAgreement(
                user_id=validator_id,
                username=users[validator_id].username,
                labels=count,
                judged=len(scores),
                agreement_rate=sum(scores) / len(scores) if scores else None,
                qualified=worker.qualified if worker else True,
            )
        )
    return result


def unqualify(session: Session, actor: User | None, task: Task, user: User, reason: str) -> int:
    """Unqualify ``user`` on ``task``: their labels stop counting and their examples are
    re-queued. Returns how many labels were excluded."""
    reason = clean_text(reason, field="reason", max_chars=500)
    worker = task_worker(session, task, user)
    if not worker.qualified:
        return 0
    worker.qualified = False
    worker.unqualified_reason = reason
    _release_batches(session, task, user)
    excluded = 0
    validations = session.scalars(
        select(Validation)
        .join(Example, Validation.example_id == Example.id)
        .join(Round, Example.round_id == Round.id)
        .where(Round.task_id == task.id, Validation.validator_id == user.id, Validation.counted.is_(True))
    ).all()
    for validation in validations:
        validation.counted = False
        example = validation.example
        example.validation_count -= 1
        round_open = example.round.status in (RoundStatus.collecting, RoundStatus.validating)
        if (
            round_open
            and example.status is not ExampleStatus.dropped
            and example.validation_count < example.validations_needed
        ):
            # Re-queued: it needs labels from qualified validators again. In a closed round
            # nobody can label it any more, so it keeps its status with fewer counted labels.
            example.status = ExampleStatus.validating
        excluded += 1
    audit.record(
        session, actor, "worker.unqualify", "user", user.id, task=task.name, reason=reason, labels_excluded=excluded
    )
    return excluded


def _release_batches(session: Session, task: Task, user: User) -> None:
    """Close the unqualified worker's live validation batches in the task's rounds and let go of
    the examples they held, so that qualified validators are served them at once."""
    now = utcnow()
    task_rounds = select(Round.id).where(Round.task_id == task.id)
    session.execute(
        update(ValidationBatch)
        .where(
            ValidationBatch.validator_id == user.id,
            ValidationBatch.round_id.in_(task_rounds),
            ValidationBatch.closed_at.is_(None),
        )
        .values(closed_at=now)
        .execution_options(synchronize_session=False)
    )
    session.execute(
        delete(ValidationClaim).where(
            ValidationClaim.validator_id == user.id,
            ValidationClaim.example_id.in_(select(Example.id).where(Example.round_id.in_(task_rounds))),
        )
    )


def requalify(session: Session, actor: User | None, task: Task, user: User) -> int:
    """Qualify ``user`` again. Their labels count again where the example still has room
    (never more counted labels than asked). Returns how many labels count again."""
    worker = task_worker(session, task, user)
    if worker.qualified:
        return 0
    worker.qualified = True
    worker.unqualified_reason = None
    restored = 0
    validations = session.scalars(
        select(Validation)
        .join(Example, Validation.example_id == Example.id)
        .join(Round, Example.round_id == Round.id)
        .where(Round.task_id == task.id, Validation.validator_id == user.id, Validation.counted.is_(False))
        .order_by(Validation.id)
    ).all()
    for validation in validations:
        example = validation.example
        if example.status is ExampleStatus.validating and example.validation_count < example.validations_needed:
            validation.counted = True
            example.validation_count += 1
            restored += 1
            if example.validation_count >= example.validations_needed:
                finalize_example(session, example, definition_of(task))
    audit.record(session, actor, "worker.requalify", "user", user.id, task=task.name, labels_restored=restored)
    return restored


def apply_agreement_threshold(
    session: Session,
    actor: User | None,
    task: Task,
    only_user_id: int | None = None,
    round_: Round | None = None,
) -> list[ValidatorAgreement]:
    """Unqualify validators who disagree with the majority more often than the task allows
    (and have enough judged labels). Returns the validators unqualified now.

    With ``round_`` (the check after each batch window) only that round's labels are judged and
    the validator's stored task-wide agreement rate is left as it is; without it the whole task
    is judged and every judged validator's stored rate is updated."""
    definition = definition_of(task)
    settings = definition.agreement
    unqualified = []
    for row in validator_agreement(session, task, round_=round_, only_user_id=only_user_id):
        if only_user_id is not None and row.user_id != only_user_id:
            continue
        user = session.get(User, row.user_id)
        if user is None:
            raise NotFound(f"no user {row.user_id}")
        worker = task_worker(session, task, user)
        if round_ is None:
            worker.agreement_rate = row.agreement_rate
            worker.agreement_labels = row.judged
        if (
            row.qualified
            and row.agreement_rate is not None
            and row.judged >= settings.min_labels_for_quality
            and 1.0 - row.agreement_rate > settings.unqualify_disagreement_rate
        ):
            unqualify(
                session,
                actor,
                task,
                user,
                reason=f"disagreed with the majority on {1 - row.agreement_rate:.0%} of "
                f"{row.judged} labels (limit {settings.unqualify_disagreement_rate:.0%})",
            )
            row.qualified = False
            unqualified.append(row)
    return unqualified
