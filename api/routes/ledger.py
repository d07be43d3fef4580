"""The pay ledger of a task (docs/round_builder.md, "Pay and the ledger"): compute it, read the
totals and a worker's statement, correct a row, export the platforms' bulk-bonus files, and the
researcher's view of the study links (the crowd report). A researcher on the task only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from api.deps import IdPath, SessionDep, allowed
from api.schemas.ledger import (
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
from services.domain import ledger, rounds, tasks
from services.errors import missing_round

router = APIRouter(tags=["ledger"])
Manager = Annotated[User, allowed(TaskPolicy.manage)]

# Header of the bulk-bonus export: workers with bonuses who have no id on that platform (they
# did not come through one of its study links), so they are not in the file. Count and names.
WITHOUT_PLATFORM_ID = "X-Ledger-Without-Platform-Id"
WITHOUT_PLATFORM_ID_NAMES = "X-Ledger-Without-Platform-Id-Users"
# Workers whose platform id is not one the platform issues (left out of the file).
INVALID_PLATFORM_ID = "X-Ledger-Invalid-Platform-Id"
INVALID_PLATFORM_ID_NAMES = "X-Ledger-Invalid-Platform-Id-Users"


@router.post("/tasks/{task_name}/ledger/compute", response_model=ComputedPublic)
def compute(task_name: str, body: ComputeRequest, session: SessionDep, researcher: Manager) -> ComputedPublic:
    """Add the ledger rows the task's pay policy gives (one round, or all) that are not there
    yet; computing again pays nothing twice."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    round_ = None
    if body.round_id is not None:
        round_ = rounds.get_round(session, body.round_id)
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
    responses={
        200: {
            "content": {"text/csv": {}},
            "description": "The bulk-bonus file (`Content-Disposition: attachment`). Prolific: "
            "`participant_id,amount` lines; MTurk: `worker_id,assignment_id,amount,reason` with a header. "
            f"`{WITHOUT_PLATFORM_ID}`: how many workers with bonuses have no id on the platform (not in the file); "
            f"`{WITHOUT_PLATFORM_ID_NAMES}`: their usernames. `{INVALID_PLATFORM_ID}` and "
            f"`{INVALID_PLATFORM_ID_NAMES}`: workers whose id is not of the form the platform issues (Prolific: "
            "24 hexadecimal characters; MTurk: ^A[A-Z0-9]+$ and an assignment id ^[A-Z0-9]+$), left out of the file.",
        }
    },
)
def bonuses_csv(
    task_name: str,
    session: SessionDep,
    researcher: Manager,
    platform: str = Query(max_length=20, description="prolific or mturk"),
) -> Response:
    """The task's bonuses in the platform's bulk-bonus format."""
    checked = ledger.check_platform(platform)
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    export = ledger.bonus_csv(session, task, checked)
    return Response(
        export.text,
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{export.filename}"',
            WITHOUT_PLATFORM_ID: str(len(export.without_platform_id)),
            WITHOUT_PLATFORM_ID_NAMES: ",".join(export.without_platform_id),
            INVALID_PLATFORM_ID: str(len(export.invalid_platform_id)),
            INVALID_PLATFORM_ID_NAMES: ",".join(export.invalid_platform_id),
        },
    )


@router.get("/tasks/{task_name}/crowd-report", response_model=CrowdReportPublic)
def crowd_report(task_name: str, session: SessionDep, researcher: Manager) -> CrowdReportPublic:
    """Per study link: sessions by status, abandoned, median minutes, ledger totals and the
    effective hourly pay (minor units per hour)."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    return CrowdReportPublic.of(ledger.crowd_report(session, task))
