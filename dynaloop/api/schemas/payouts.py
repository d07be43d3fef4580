"""Payout batches (services/domain/payouts.py): recorded bonus exports of one study link.
Amounts are integers in minor units of the batch's currency; ``amount`` is the same in major
units as the file writes it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dynaloop.api.schemas.common import ANSWER_CONFIG
from services.db.models import PayoutBatch, PayoutLine
from services.domain import payouts
from services.domain.ledger import format_amount

MAX_ID = 2**31 - 1


class PayoutBatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    link_id: int = Field(ge=1, le=MAX_ID, description="The study link (Prolific study, MTurk HIT group) to pay.")
    note: str | None = Field(None, max_length=payouts.MAX_NOTE_CHARS, description="Kept with the batch.")


class PayoutNote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str | None = Field(None, max_length=payouts.MAX_NOTE_CHARS, description="Replaces the batch's note.")


class PayoutLinePublic(BaseModel):
    line_number: int
    user_id: int
    platform_worker_id: str
    assignment_id: str | None
    amount_minor: int
    amount: str
    unique_request_token: str = Field(description="MTurk SendBonus's UniqueRequestToken for this line.")
    ledger_entry_ids: list[int] = Field(description="The ledger entries this line pays.")
    platform_status: str | None
    platform_reference: str | None
    paid_at: dt.datetime | None

    @classmethod
    def of(cls, line: PayoutLine, currency: str, entry_ids: list[int]) -> PayoutLinePublic:
        return cls(
            line_number=line.line_number,
            user_id=line.user_id,
            platform_worker_id=line.platform_worker_id,
            assignment_id=line.assignment_id,
            amount_minor=line.amount_minor,
            amount=format_amount(line.amount_minor, currency),
            unique_request_token=line.unique_request_token,
            ledger_entry_ids=entry_ids,
            platform_status=line.platform_status,
            platform_reference=line.platform_reference,
            paid_at=line.paid_at,
        )


class PayoutBatchPublic(BaseModel):
    model_config = ANSWER_CONFIG

    id: int
    task: str
    link_id: int
    platform: str
    currency: str
    status: str = Field(description="created, paid or cancelled.")
    line_count: int
    total_minor: int
    total: str
    filename: str
    note: str | None
    created_by_id: int | None
    created_at: dt.datetime
    paid_by_id: int | None
    paid_at: dt.datetime | None
    cancelled_by_id: int | None
    cancelled_at: dt.datetime | None
    lines: list[PayoutLinePublic] | None = Field(None, description="Only where one batch is shown.")

    @classmethod
    def of(
        cls, batch: PayoutBatch, lines: list[PayoutLine] | None = None, entry_ids: dict[int, list[int]] | None = None
    ) -> PayoutBatchPublic:
        return cls(
            id=batch.id,
            task=batch.task.name,
            link_id=batch.link_id,
            platform=batch.platform.value,
            currency=batch.currency,
            status=batch.status.value,
            line_count=batch.line_count,
            total_minor=batch.total_minor,
            total=format_amount(batch.total_minor, batch.currency),
            filename=batch.filename,
            note=batch.note,
            created_by_id=batch.created_by_id,
            created_at=batch.created_at,
            paid_by_id=batch.paid_by_id,
            paid_at=batch.paid_at,
            cancelled_by_id=batch.cancelled_by_id,
            cancelled_at=batch.cancelled_at,
            lines=None
            if lines is None
            else [PayoutLinePublic.of(line, batch.currency, (entry_ids or {}).get(line.id, [])) for line in lines],
        )


class HeldBackPublic(BaseModel):
    username: str
    amount_minor: int
    reason: str


class ElsewherePublic(BaseModel):
    link_id: int | None = Field(description="null: bonuses earned without a study session (no platform id).")
    link_name: str | None
    platform: str | None
    usernames: list[str]
    amount_minor: int
    advice: str


class PayoutBatchCreatedPublic(BaseModel):
    batch: PayoutBatchPublic
    held_back: list[HeldBackPublic] = Field(
        description="Workers of this link with payable bonuses who are not in the batch, and why."
    )
    elsewhere: list[ElsewherePublic] = Field(
        description="Payable bonuses of the task that are not this link's, and where they are paid."
    )


class PayoutBatchesPublic(BaseModel):
    data: list[PayoutBatchPublic]
    count: int


class ReconciliationPublic(BaseModel):
    reconciliation_id: int
    batch_id: int
    matched: list[dict[str, Any]]
    missing: list[dict[str, Any]] = Field(description="Lines of the batch that the platform's record does not hold.")
    unexpected: list[dict[str, Any]] = Field(
        description="Rows of the record that the batch does not hold, or holds with another amount."
    )
    in_other_batches: list[dict[str, Any]] = Field(
        description="Rows that match a line of another batch of the link that is not cancelled."
    )
    counts: dict[str, int] = Field(description="The whole length of each list (each list keeps 10,000 at most).")
    truncated: bool

    @classmethod
    def of(cls, report: payouts.ReconcileReport) -> ReconciliationPublic:
        assert report.reconciliation_id is not None
        return cls(reconciliation_id=report.reconciliation_id, **report.as_dict())
