"""Attention checks for writers (issue 26): instructional manipulation checks between assignments.

A task whose YAML has an ``attention_checks`` section serves its writers one check after every
``every_n_assignments`` finished assignments (submitted, skipped or expired, so skipping does
not dodge them). The check is served when the writer asks for their next assignment
(:func:`services.domain.writing.start_assignment` calls :func:`require_no_check_due`): it is
stored and the request is refused with 409 ``attention_check_pending`` naming it; until it is
answered (``POST /attention-checks/{id}/answer``) every request for a new assignment gets the
same 409.

Each check is Prolific's fair kind: the question itself tells the writer which option to choose
(``services.taskdef.AttentionCheckItem`` refuses a question that does not name its answer). A
writer who failed ``fails_to_screen_out`` checks (at least 2: Prolific's rule for studies of 5
minutes or longer) is unqualified on the task (:func:`services.domain.quality.unqualify`), so
their study session on the task ends screened out (:func:`services.domain.study.refresh`) with
the link's screened-out code, or, without one, a request to return the submission.

Answers are kept in ``attention_check_answers`` only: they are never examples, never paid, never
counted as a study session's units.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import (
    Assignment,
    AssignmentStatus,
    AttentionCheckAnswer,
    Round,
    StudyLink,
    StudySession,
    StudySessionStatus,
    Task,
    TaskWorker,
    User,
    utcnow,
)
from services.db.statements import rows_matched
from services.db.transactions import commit_now
from services.domain import study
from services.domain.quality import task_worker, unqualify
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid, missing_attention_check
from services.taskdef import AttentionChecks


class AttentionCheckPending(Conflict):
    """The writer must answer an attention check before their next assignment."""

    code = "attention_check_pending"


def _pending_error(check: AttentionCheckAnswer) -> AttentionCheckPending:
    return AttentionCheckPending(
        f"answer attention check {check.id} first (GET /api/v1/attention-checks/pending, then "
        f"POST /api/v1/attention-checks/{check.id}/answer); then ask for your next assignment again",
        attention_check_id=check.id,
    )


def pending_check(session: Session, task: Task, writer: User) -> AttentionCheckAnswer | None:
    """The writer's unanswered check on ``task``, if any."""
    return session.scalar(
        select(AttentionCheckAnswer)
        .where(
            AttentionCheckAnswer.task_id == task.id,
            AttentionCheckAnswer.writer_id == writer.id,
            AttentionCheckAnswer.answered_at.is_(None),
        )
        .order_by(AttentionCheckAnswer.id)
        .limit(1)
    )


def pending_checks(session: Session, writer: User) -> list[AttentionCheckAnswer]:
    """The writer's unanswered checks, on every task."""
    return list(
        session.scalars(
            select(AttentionCheckAnswer)
            .where(AttentionCheckAnswer.writer_id == writer.id, AttentionCheckAnswer.answered_at.is_(None))
            .order_by(AttentionCheckAnswer.id)
        )
    )


def _finished_assignments(session: Session, task: Task, writer: User) -> int:
    return (
        session.scalar(
            select(func.count(Assignment.id))
            .join(Round, Assignment.round_id == Round.id)
            .where(
                Round.task_id == task.id,
                Assignment.writer_id == writer.id,
                Assignment.status != AssignmentStatus.active,
            )
        )
        or 0
    )


def _serve(session: Session, task: Task, writer: User, settings: AttentionChecks, slot: int) -> AttentionCheckAnswer:
    """Store the check of ``slot`` (the task's items in turn), or the one a concurrent request stored."""
    index = (slot - 1) % len(settings.items)
    item = settings.items[index]
    check = AttentionCheckAnswer(
        task_id=task.id,
        writer_id=writer.id,
        slot=slot,
        item_index=index,
        question=item.question,
        options=list(item.options),
        expected=item.answer,
        served_at=utcnow(),
    )
    try:
        with session.begin_nested():
            session.add(check)
    except IntegrityError:
        return session.scalars(
            select(AttentionCheckAnswer).where(
                AttentionCheckAnswer.task_id == task.id,
                AttentionCheckAnswer.writer_id == writer.id,
                AttentionCheckAnswer.slot == slot,
            )
        ).one()
    return check


def require_no_check_due(session: Session, task: Task, writer: User) -> None:
    """Refuse a new assignment (409 ``attention_check_pending``) while the writer has an
    unanswered check on ``task``, or when one is due now: then it is served (stored and
    committed, so that it survives the 409 that names it)."""
    settings = definition_of(task).attention_checks
    if settings is None:
        return
    pending = pending_check(session, task, writer)
    if pending is not None:
        raise _pending_error(pending)
    slot = _finished_assignments(session, task, writer) // settings.every_n_assignments
    if slot < 1:
        return
    served = session.scalar(
        select(AttentionCheckAnswer).where(
            AttentionCheckAnswer.task_id == task.id,
            AttentionCheckAnswer.writer_id == writer.id,
            AttentionCheckAnswer.slot == slot,
        )
    )
    if served is not None:
        if served.answered_at is None:  # served by a request running beside this one
            raise _pending_error(served)
        return
    check = _serve(session, task, writer, settings, slot)
    commit_now(session, "the attention check just served must survive the 409 that names it")
    raise _pending_error(check)


def get_check(session: Session, check_id: int) -> AttentionCheckAnswer:
    """The check; whose it is, is for ``AttentionCheckPolicy.answer`` (another writer's check
    is reported as missing, in the same words)."""
    check = session.get(AttentionCheckAnswer, check_id)
    if check is None:
        raise missing_attention_check(check_id)
    return check


@dataclass
class Answered:
    check: AttentionCheckAnswer
    replayed: bool
    screened_out: bool


def answer_check(session: Session, check: AttentionCheckAnswer, answer: str) -> Answered:
    """Record the writer's one answer to ``check``. The same answer again is a replay; another
    answer is refused (409). At the task's ``fails_to_screen_out`` failed checks the writer is
    unqualified on the task and their active study sessions on it end screened out."""
    if answer not in check.options:
        raise Invalid(f"answer {answer!r} is not one of the options {check.options}; choose one of them")
    if check.answered_at is None:
        # Conditional: of two answers sent at once, only the first is recorded (the other is
        # then a replay or a 409, below).
        recorded = rows_matched(
            session,
            update(AttentionCheckAnswer)
            .where(AttentionCheckAnswer.id == check.id, AttentionCheckAnswer.answered_at.is_(None))
            .values(answer=answer, answered_at=utcnow(), passed=answer == check.expected),
        )
        session.refresh(check)
        if not recorded:
            return _answered_already(check, answer)
    else:
        return _answered_already(check, answer)
    screened_out = False
    if not check.passed:
        screened_out = _apply_fail_limit(session, check)
    return Answered(check, replayed=False, screened_out=screened_out)


def _answered_already(check: AttentionCheckAnswer, answer: str) -> Answered:
    if check.answer == answer:
        return Answered(check, replayed=True, screened_out=False)
    raise Conflict(f"attention check {check.id} was answered already ({check.answer!r}); an answer cannot be changed")


def _apply_fail_limit(session: Session, check: AttentionCheckAnswer) -> bool:
    task = check.task
    settings = definition_of(task).attention_checks
    writer = session.get(User, check.writer_id)
    if settings is None or writer is None:
        return False
    failed = (
        session.scalar(
            select(func.count(AttentionCheckAnswer.id)).where(
                AttentionCheckAnswer.task_id == task.id,
                AttentionCheckAnswer.writer_id == writer.id,
                AttentionCheckAnswer.passed.is_(False),
            )
        )
        or 0
    )
    if failed < settings.fails_to_screen_out or not task_worker(session, task, writer).qualified:
        return False
    unqualify(session, None, task, writer, reason=f"failed {failed} attention checks")
    session.flush()  # the session does not autoflush: the study sessions' recount reads the standing
    for active in session.scalars(
        select(StudySession)
        .join(StudyLink, StudySession.link_id == StudyLink.id)
        .where(
            StudySession.user_id == writer.id,
            StudyLink.task_id == task.id,
            StudySession.status == StudySessionStatus.active,
        )
    ):
        study.refresh(session, active)
    return True


def is_qualified(session: Session, task: Task, user: User) -> bool:
    """Whether ``user`` is still qualified on ``task`` (a worker without a standing yet is)."""
    qualified = session.scalar(
        select(TaskWorker.qualified).where(TaskWorker.task_id == task.id, TaskWorker.user_id == user.id)
    )
    return qualified is not False


@dataclass
class WriterChecks:
    user_id: int
    username: str
    served: int
    answered: int
    passed: int
    failed: int
    qualified: bool


def writer_summaries(session: Session, task: Task) -> list[WriterChecks]:
    """Each writer's attention checks on ``task``: served, answered, passed, failed, and whether
    they are still qualified on the task."""
    rows = session.execute(
        select(
            AttentionCheckAnswer.writer_id,
            func.count(AttentionCheckAnswer.id),
            func.count(AttentionCheckAnswer.answered_at),
            func.count(AttentionCheckAnswer.id).filter(AttentionCheckAnswer.passed.is_(True)),
            func.count(AttentionCheckAnswer.id).filter(AttentionCheckAnswer.passed.is_(False)),
        )
        .where(AttentionCheckAnswer.task_id == task.id)
        .group_by(AttentionCheckAnswer.writer_id)
        .order_by(AttentionCheckAnswer.writer_id)
    ).all()
    summaries = []
    for user_id, served, answered, passed, failed in rows:
        user = session.get(User, user_id)
        if user is None:
            continue
        summaries.append(
            WriterChecks(
                user_id=user_id,
                username=user.username,
                served=served,
                answered=answered,
                passed=passed,
                failed=failed,
                qualified=is_qualified(session, task, user),
            )
        )
    return summaries
