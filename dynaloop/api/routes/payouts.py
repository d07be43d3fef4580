"""Payout batches (docs/crowdsourcing.md, "Paying a round with payout batches"): each bonus
export is recorded for one study link, and an event is paid by at most one batch that is not
cancelled. A researcher on the task only; another group's batch reads as missing."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from dynaloop.api.deps import IdPath, RawBody, SessionDep, SettingsDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.payouts import (
    ElsewherePublic,
    HeldBackPublic,
    PayoutBatchCreate,
    PayoutBatchCreatedPublic,
    PayoutBatchesPublic,
    PayoutBatchPublic,
    PayoutNote,
    ReconciliationPublic,
)
from rounds.models import payout_records
from services.authorization import PayoutBatchPolicy, TaskPolicy, authorize
from services.db.models import PayoutBatch, StudyLink, User
from services.domain import payouts, tasks

router = APIRouter(tags=["payouts"], route_class=OneHopRoute)
Manager = Annotated[User, allowed(TaskPolicy.manage)]
BatchManager = Annotated[User, allowed(PayoutBatchPolicy.manage)]
MAX_ID = 2**31 - 1

_RECORD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The platform's record of the bonuses it paid: a CSV with a header naming a worker id "
        "(participant_id / WorkerId), an amount (amount / BonusAmount) and, for MTurk, an assignment id "
        "(AssignmentId) column; Prolific's `participant_id,amount` lines without a header; or, for MTurk, the "
        'JSON ListBonusPayments answers (`{"BonusPayments": [...]}`).',
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def _shown(session: SessionDep, batch: PayoutBatch) -> PayoutBatchPublic:
    return PayoutBatchPublic.of(batch, payouts.lines_of(session, batch), payouts.entry_ids_of(session, batch))


def _batch(session: SessionDep, researcher: User, batch_id: int) -> PayoutBatch:
    batch = payouts.get_batch(session, batch_id)
    authorize(researcher, PayoutBatchPolicy.manage(batch))
    return batch


@router.post(
    "/tasks/{task_name}/payout-batches", response_model=PayoutBatchCreatedPublic, status_code=status.HTTP_201_CREATED
)
def create_batch(
    task_name: str, body: PayoutBatchCreate, session: SessionDep, researcher: Manager
) -> PayoutBatchCreatedPublic:
    """Record a payout batch for one study link of the task: its workers' bonuses (and their
    corrections) that no batch that is not cancelled holds, one positive line per worker (MTurk:
    per assignment). 409 when there is nothing to pay, 422 for a link whose currency is not the
    ledger's or not one its platform pays in; nothing is written then."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    link = session.get(StudyLink, body.link_id)
    if link is None or link.task_id != task.id:
        raise payouts.missing_study_link(body.link_id)
    created = payouts.create_batch(session, researcher, task, link, note=body.note)
    return PayoutBatchCreatedPublic(
        batch=_shown(session, created.batch),
        held_back=[HeldBackPublic(**h.__dict__) for h in created.held_back],
        elsewhere=[ElsewherePublic(**e.__dict__) for e in created.elsewhere],
    )


@router.get("/tasks/{task_name}/payout-batches", response_model=PayoutBatchesPublic)
def list_batches(
    task_name: str,
    session: SessionDep,
    researcher: Manager,
    link_id: Annotated[int | None, Query(ge=1, le=MAX_ID, description="One study link's batches.")] = None,
) -> PayoutBatchesPublic:
    """The task's payout batches, oldest first (without their lines)."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    rows = [PayoutBatchPublic.of(batch) for batch in payouts.list_batches(session, task, link_id)]
    return PayoutBatchesPublic(data=rows, count=len(rows))


@router.get("/payout-batches/{batch_id}", response_model=PayoutBatchPublic)
def show_batch(batch_id: IdPath, session: SessionDep, researcher: BatchManager) -> PayoutBatchPublic:
    """One batch with its lines and the ledger entries each line pays."""
    return _shown(session, _batch(session, researcher, batch_id))


@router.get(
    "/payout-batches/{batch_id}/file",
    response_class=Response,
    responses={
        200: {
            "content": {"text/csv": {}},
            "description": "The batch's bulk-bonus file, the same bytes every time (`Content-Disposition: "
            "attachment`). Prolific: `participant_id,amount` lines; MTurk: a header, then "
            "`worker_id,assignment_id,amount,reason,unique_request_token`.",
        }
    },
)
def batch_file(batch_id: IdPath, session: SessionDep, researcher: BatchManager) -> Response:
    """The batch's file, exactly as it was exported."""
    batch = _batch(session, researcher, batch_id)
    return Response(
        batch.file_text.encode("utf-8"),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{batch.filename}"'},
    )


@router.post("/payout-batches/{batch_id}/paid", response_model=PayoutBatchPublic)
def mark_paid(
    batch_id: IdPath, session: SessionDep, researcher: BatchManager, body: PayoutNote | None = None
) -> PayoutBatchPublic:
    """The platform paid the batch. Only a created batch (409 otherwise)."""
    batch = _batch(session, researcher, batch_id)
    payouts.mark_paid(session, researcher, batch, note=body.note if body else None)
    return _shown(session, batch)


@router.post("/payout-batches/{batch_id}/cancel", response_model=PayoutBatchPublic)
def cancel_batch(
    batch_id: IdPath, session: SessionDep, researcher: BatchManager, body: PayoutNote | None = None
) -> PayoutBatchPublic:
    """The batch was not paid and never will be: its ledger entries become payable again. Only a
    created batch (409 otherwise: a paid batch is put right with ledger corrections)."""
    batch = _batch(session, researcher, batch_id)
    payouts.cancel(session, researcher, batch, note=body.note if body else None)
    return _shown(session, batch)


@router.post(
    "/payout-batches/{batch_id}/reconciliation",
    response_model=ReconciliationPublic,
    status_code=status.HTTP_201_CREATED,
    openapi_extra=_RECORD_BODY,
)
def reconcile_batch(
    batch_id: IdPath, session: SessionDep, settings: SettingsDep, researcher: BatchManager, raw: RawBody
) -> ReconciliationPublic:
    """Compare the batch with the platform's own record of what it paid (the request body) and
    record the report: matched, missing and unexpected lines. Read within the upload bounds
    (rows, decoded bytes, characters per cell): 413 or 422 otherwise, and nothing is recorded."""
    batch = _batch(session, researcher, batch_id)
    bounds = payout_records.record_bounds(settings)
    record = payout_records.parse_record(raw, batch.platform, batch.currency, bounds)
    return ReconciliationPublic.of(payouts.reconcile(session, researcher, batch, record))
