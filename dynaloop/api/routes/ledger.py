"""The pay ledger of a task (docs/round_builder.md, "Pay and the ledger"): compute it, read the
totals and a worker's statement, correct a row, and the researcher's view of the study links (the
crowd report). Bonuses are exported as payout batches (dynaloop/api/routes/payouts.py). A researcher on
the task only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response, status

from dynaloop.api.deps import IdPath, SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.ledger import (
    ComputedPublic,
    ComputeRequest,
    CorrectionRequest,
    CrowdReportPublic,
    LedgerEntryPublic,
    LedgerTotalsPublic,
    WorkerStatementPublic,
)
from services.authorization import LedgerPolicy, TaskPolicy, authorize
from services.db.models import User
from services.domain import ledger, round_lifecycle, tasks
from services.errors import Gone, missing_round

router = APIRouter(tags=["ledger"], route_class=OneHopRoute)
Manager = Annotated[User, allowed(TaskPolicy.manage)]


@router.post("/tasks/{task_name}/ledger/compute", response_model=ComputedPublic)
def compute(task_name: str, body: ComputeRequest, session: SessionDep, researcher: Manager) -> ComputedPublic:
    """Add the ledger rows the task's pay policy gives (one round, or all) that are not there
    yet; computing again pays nothing twice."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    round_ = None
    if body.round_id is not None:
        round_ = round_lifecycle.get_round(session, body.round_id)
        if round_.task_id != task.id:
            raise missing_round(body.round_id)
    return ComputedPublic.of(ledger.compute_ledger(session, researcher, task, round_))


@router.get("/tasks/{task_name}/ledger", response_model=LedgerTotalsPublic)
def totals(task_name: str, session: SessionDep, researcher: Manager) -> LedgerTotalsPublic:
    """Per worker: base pay, writer and validator bonuses (corrections included) and total."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    return LedgerTotalsPublic.of(ledger.ledger_totals(session, task))


@router.get("/tasks/{task_name}/ledger/workers/{user_id}", response_model=WorkerStatementPublic)
def statement(task_name: str, user_id: IdPath, session: SessionDep, researcher: Manager) -> WorkerStatementPublic:
    """One worker's statement: every row of theirs on the task, with totals."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    return WorkerStatementPublic.of(ledger.worker_statement(session, task, user_id))


@router.post("/ledger/{entry_id}/corrections", response_model=LedgerEntryPublic, status_code=status.HTTP_201_CREATED)
def correct(
    entry_id: IdPath,
    body: CorrectionRequest,
    session: SessionDep,
    researcher: Annotated[User, allowed(LedgerPolicy.correct)],
) -> LedgerEntryPublic:
    """Add a correction row to a ledger row (the row itself never changes)."""
    entry = ledger.get_entry(session, entry_id)
    authorize(researcher, LedgerPolicy.correct(entry))
    return LedgerEntryPublic.of(ledger.add_correction(session, researcher, entry, body.amount_minor, body.reason))


@router.get(
    "/tasks/{task_name}/ledger/bonuses.csv",
    response_class=Response,
    deprecated=True,
    responses={410: {"description": "Retired: use the task's payout batches."}},
)
def bonuses_csv(task_name: str, session: SessionDep, researcher: Manager) -> Response:
    """Retired (410): this unrecorded export listed every bonus to date, so a file exported
    after another paid the first one's bonuses again. Bonuses are exported as payout batches:
    ``POST /api/v1/tasks/{task}/payout-batches`` with a study link, then
    ``GET /api/v1/payout-batches/{id}/file``."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    raise Gone(
        "GET /tasks/{task}/ledger/bonuses.csv is retired: it exported every bonus to date, unrecorded, so bonuses "
        f"were paid twice; create a payout batch per study link with POST /api/v1/tasks/{task.name}/payout-batches "
        '{"link_id": ...} and download it with GET /api/v1/payout-batches/{id}/file'
    )


@router.get("/tasks/{task_name}/crowd-report", response_model=CrowdReportPublic)
def crowd_report(task_name: str, session: SessionDep, researcher: Manager) -> CrowdReportPublic:
    """Per study link: sessions by status, abandoned, median minutes, ledger totals and the
    effective hourly pay (minor units per hour)."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    return CrowdReportPublic.of(ledger.crowd_report(session, task))
