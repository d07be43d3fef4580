"""The pay ledger (docs/round_builder.md, "Pay and the ledger"): amounts are integers in minor
units of the task's currency."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from services.db.models import LedgerEntry
from services.domain import ledger
from services.domain.ledger import MAX_CORRECTION_MINOR, MAX_REASON_CHARS

MAX_ID = 2**31 - 1


class ComputeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    round_id: int | None = Field(None, ge=1, le=MAX_ID, description="One round of the task; default: every round.")


class LedgerEntryPublic(BaseModel):
    id: int
    user_id: int
    round_id: int | None
    session_id: int | None
    kind: str = Field(description="base_pay, writer_bonus, validator_bonus or correction.")
    event_key: str
    amount_minor: int
    currency: str
    reason: str
    corrects_id: int | None
    created_at: dt.datetime

    @classmethod
    def of(cls, entry: LedgerEntry) -> LedgerEntryPublic:
        return cls(
            id=entry.id,
            user_id=entry.user_id,
            round_id=entry.round_id,
            session_id=entry.session_id,
            kind=entry.kind.value,
            event_key=entry.event_key,
            amount_minor=entry.amount_minor,
            currency=entry.currency,
            reason=entry.reason,
            corrects_id=entry.corrects_id,
            created_at=entry.created_at,
        )


class ComputedPublic(BaseModel):
    task: str
    currency: str
    rounds: list[int] = Field(description="The ids of the rounds looked at.")
    entries_added: int
    amount_added_minor: int
    already_paid: int = Field(description="Events found in the ledger already (not paid again).")
    added: list[LedgerEntryPublic]

    @classmethod
    def of(cls, computed: ledger.LedgerComputed) -> ComputedPublic:
        return cls(
            task=computed.task,
            currency=computed.currency,
            rounds=computed.rounds,
            entries_added=len(computed.added),
            amount_added_minor=sum(e.amount_minor for e in computed.added),
            already_paid=computed.already,
            added=[LedgerEntryPublic.of(e) for e in computed.added],
        )


class WorkerTotalsPublic(BaseModel):
    user_id: int
    username: str
    base_pay: int
    writer_bonus: int
    validator_bonus: int
    corrections: int = Field(description="The correction rows' sum; already counted in the kinds they correct.")
    total: int

    @classmethod
    def of(cls, row: ledger.WorkerTotals) -> WorkerTotalsPublic:
        return cls(**row.__dict__)


class LedgerTotalsPublic(BaseModel):
    task: str
    currency: str | None
    total: int
    data: list[WorkerTotalsPublic]
    count: int

    @classmethod
    def of(cls, totals: ledger.LedgerTotals) -> LedgerTotalsPublic:
        return cls(
            task=totals.task,
            currency=totals.currency,
            total=totals.total,
            data=[WorkerTotalsPublic.of(w) for w in totals.workers],
            count=len(totals.workers),
        )


class WorkerStatementPublic(BaseModel):
    task: str
    user_id: int
    username: str
    currency: str | None
    totals: WorkerTotalsPublic
    entries: list[LedgerEntryPublic]

    @classmethod
    def of(cls, statement: ledger.WorkerStatement) -> WorkerStatementPublic:
        return cls(
            task=statement.task,
            user_id=statement.user_id,
            username=statement.username,
            currency=statement.currency,
            totals=WorkerTotalsPublic.of(statement.totals),
            entries=[LedgerEntryPublic.of(e) for e in statement.entries],
        )


class CorrectionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount_minor: StrictInt = Field(
        ge=-MAX_CORRECTION_MINOR,
        le=MAX_CORRECTION_MINOR,
        description="Minor units added to the corrected row (negative takes pay back); not zero.",
    )
    reason: str = Field(min_length=1, max_length=MAX_REASON_CHARS)


class LinkReportPublic(BaseModel):
    link_id: int
    name: str
    round_id: int
    role: str
    platform: str
    sessions: dict[str, int] = Field(
        description="started, active, completed, screened_out, stopped, and abandoned (active, not seen for 2 hours)."
    )
    median_minutes: float | None
    base_pay: int
    bonuses: int
    corrections: int
    effective_hourly_minor: int | None = Field(
        description="Median over completed sessions of (base + bonuses of the worker in the round) per hour, "
        "minor units, rounded half-up; null when no completed session has a length."
    )

    @classmethod
    def of(cls, row: ledger.LinkReport) -> LinkReportPublic:
        return cls(**row.__dict__)


class WorkerHourlyPublic(BaseModel):
    user_id: int
    username: str
    platforms: list[str] = Field(description="The platforms of the links the worker came through.")
    sessions: int
    active_seconds: int = Field(description="Sum over their study sessions of started_at to ended_at (else last seen).")
    earned_minor: int = Field(description="Their ledger total on the task, corrections included.")
    effective_hourly_minor: int | None = Field(
        description="earned_minor per hour of active time, minor units, rounded half-up; null without active time."
    )
    platform_minimum_minor: int | None = Field(
        description="The highest published minimum hourly pay of their platforms in the task's currency "
        "(Prolific: GBP 600, USD 800); null where none is published (MTurk, generic links)."
    )
    policy_floor_minor: int | None = Field(description="The pay policy's min_hourly_minor, if set.")
    below_minimum: bool
    warning: str | None

    @classmethod
    def of(cls, row: ledger.WorkerHourly) -> WorkerHourlyPublic:
        return cls(**row.__dict__)


class CrowdReportPublic(BaseModel):
    task: str
    currency: str | None
    data: list[LinkReportPublic]
    count: int
    workers: list[WorkerHourlyPublic] = Field(
        description="Each worker who came through a study link: effective hourly pay and the minimum it is held to."
    )

    @classmethod
    def of(cls, report: ledger.CrowdReport) -> CrowdReportPublic:
        return cls(
            task=report.task,
            currency=report.currency,
            data=[LinkReportPublic.of(link) for link in report.links],
            count=len(report.links),
            workers=[WorkerHourlyPublic.of(row) for row in report.workers],
        )
