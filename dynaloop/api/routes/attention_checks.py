"""Attention checks for writers (services/domain/attention.py): the writer's pending checks and
their one answer to each, and each writer's record on a task for its researchers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response, status

from dynaloop.api.deps import IdPath, SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.attention_checks import (
    AttentionCheckAnswerCreate,
    AttentionCheckPublic,
    AttentionCheckResult,
    AttentionChecksPublic,
    TaskAttentionChecksPublic,
    WriterAttentionChecksPublic,
)
from services.authorization import AttentionCheckPolicy, TaskPolicy, authorize
from services.db.models import User
from services.domain import attention, tasks

router = APIRouter(tags=["attention checks"], route_class=OneHopRoute)
Writer = Annotated[User, allowed(AttentionCheckPolicy.answer)]


@router.get("/attention-checks/pending", response_model=AttentionChecksPublic)
def pending_checks(session: SessionDep, writer: Writer) -> AttentionChecksPublic:
    """Your unanswered attention checks. One is served when you ask for a new assignment after
    every N finished ones (the answer 409 `attention_check_pending` names it)."""
    rows = [AttentionCheckPublic.of(check) for check in attention.pending_checks(session, writer)]
    return AttentionChecksPublic(data=rows, count=len(rows))


@router.post(
    "/attention-checks/{check_id}/answer",
    response_model=AttentionCheckResult,
    responses={200: {"model": AttentionCheckResult, "description": "Your answer (or the same answer again)."}},
)
def answer_check(
    check_id: IdPath, body: AttentionCheckAnswerCreate, response: Response, session: SessionDep, writer: Writer
) -> AttentionCheckResult:
    """Answer one of your attention checks, once: the same answer again is a replay (header
    `Idempotent-Replayed`); another answer is refused (409)."""
    check = attention.get_check(session, check_id)
    authorize(writer, AttentionCheckPolicy.answer(check))
    answered = attention.answer_check(session, check, body.answer)
    if answered.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    response.status_code = status.HTTP_200_OK
    return AttentionCheckResult(
        **AttentionCheckPublic.of(check).model_dump(),
        passed=bool(check.passed),
        qualified=attention.is_qualified(session, check.task, writer),
    )


@router.get("/tasks/{task_name}/attention-checks", response_model=TaskAttentionChecksPublic)
def task_attention_checks(
    task_name: str, session: SessionDep, researcher: Annotated[User, allowed(TaskPolicy.manage)]
) -> TaskAttentionChecksPublic:
    """Each writer's attention checks on the task: served, answered, passed, failed, and whether
    they are still qualified."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    settings = tasks.definition_of(task).attention_checks
    rows = [WriterAttentionChecksPublic.of(row) for row in attention.writer_summaries(session, task)]
    return TaskAttentionChecksPublic(
        data=rows,
        count=len(rows),
        every_n_assignments=settings.every_n_assignments if settings else None,
        fails_to_screen_out=settings.fails_to_screen_out if settings else None,
    )
