"""Worker quality: validators' agreement with the majority, and (un)qualifying workers
(DynaSent §3.3, App. B, Fig. 6)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from dynaloop.api.deps import IdPath, SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.worker_quality import (
    RequalifiedPublic,
    UnqualifiedPublic,
    UnqualifyRequest,
    WorkerAgreementPublic,
)
from services.authorization import RoundPolicy, WorkerPolicy, authorize
from services.db.models import User
from services.domain import controls, quality, round_lifecycle, tasks, users

router = APIRouter(tags=["worker quality"], route_class=OneHopRoute)
Judge = Annotated[User, allowed(WorkerPolicy.judge)]


@router.get("/rounds/{round_id}/worker-agreement", response_model=list[WorkerAgreementPublic])
def worker_agreement(round_id: IdPath, session: SessionDep, researcher: Judge) -> list[WorkerAgreementPublic]:
    """Each validator's rate of agreement with the majority in this round (DynaSent Fig. 6), and
    beside it their gold accuracy: the share of this round's control items they answered right."""
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(researcher, RoundPolicy.manage(round_))  # another group's round: as a missing one
    authorize(researcher, WorkerPolicy.judge(round_.task))
    gold = controls.gold_accuracy(session, round_.task, round_)
    return [
        WorkerAgreementPublic.of(row, gold.get(row.user_id))
        for row in quality.validator_agreement(session, round_.task, round_, include_user_ids=list(gold))
    ]


@router.post("/tasks/{task_name}/worker-quality/apply", response_model=list[WorkerAgreementPublic])
def apply_worker_quality(task_name: str, session: SessionDep, researcher: Judge) -> list[WorkerAgreementPublic]:
    """Unqualify every validator above the task's disagreement threshold; returns them."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, WorkerPolicy.judge(task))
    return [WorkerAgreementPublic.of(row) for row in quality.apply_agreement_threshold(session, researcher, task)]


@router.post("/tasks/{task_name}/workers/{username}/unqualify", response_model=UnqualifiedPublic)
def unqualify(
    task_name: str, username: str, body: UnqualifyRequest, session: SessionDep, researcher: Judge
) -> UnqualifiedPublic:
    """Stop a worker: their labels are kept but excluded, their examples re-queued."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, WorkerPolicy.judge(task))
    excluded = quality.unqualify(session, researcher, task, users.get_user(session, username), body.reason)
    return UnqualifiedPublic(username=username, qualified=False, labels_excluded=excluded)


@router.post("/tasks/{task_name}/workers/{username}/requalify", response_model=RequalifiedPublic)
def requalify(task_name: str, username: str, session: SessionDep, researcher: Judge) -> RequalifiedPublic:
    task = tasks.get_task(session, task_name)
    authorize(researcher, WorkerPolicy.judge(task))
    restored = quality.requalify(session, researcher, task, users.get_user(session, username))
    return RequalifiedPublic(username=username, qualified=True, labels_restored=restored)
