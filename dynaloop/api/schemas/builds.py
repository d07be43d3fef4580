"""Builds of a closed round and their report (rounds.build.pipeline; DynaSent Tables 4/6/7,
Fig. 2 and 6). The report is the round builder's own model, :class:`rounds.build.report_schema.RoundReport`
(the one schema of the report: what a build stores, report.json says and these answers hold); this
module adds only what the API wraps around it: the build's id and its pay ledger, and the previews."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rounds.build.build_settings import EffectivePolicy
from rounds.build.report_schema import RoundReport


class PolicyPreview(BaseModel):
    """What one policy would give the round (rounds.build.preview)."""

    name: str
    settings: dict[str, Any] = Field(description="The build options to send for this policy.")
    policy: EffectivePolicy | None
    feasible: bool
    message: str | None = Field(description="Why it cannot build, when it cannot.")
    constraint: str | None = Field(
        description="What refused it: dev_test_size (too few eligible examples per cell or class), "
        "balance_guard (the class-balance guard, max_dev_test_share) or settings (the settings are invalid); "
        "null when it builds.",
    )
    short: list[dict[str, Any]] = Field(description="Cells or classes short of examples: available, needed, short_by.")
    unit: str | None = Field(description="cell or class.")
    dev_per_cell: int | None
    test_per_cell: int | None
    counts: dict[str, int] = Field(description="train, dev, test, excluded.")
    classes: dict[str, dict[str, int]] = Field(description="Class -> train, dev, test.")


class BuildPreviewPublic(BaseModel):
    task: str
    round: int
    requested: PolicyPreview
    relaxations: list[PolicyPreview]


class BuildLedger(BaseModel):
    """The pay ledger computed after the build (docs/round_builder.md, "Pay and the ledger")."""

    currency: str | None = None
    entries_added: int | None = None
    amount_added_minor: int | None = None
    already_paid: int | None = None
    error: str | None = Field(None, description="Why the ledger was not computed; the build stands.")


class BuildPublic(BaseModel):
    build_id: int
    round: int = Field(description="The round's number in its task.")
    task: str
    report: RoundReport
    ledger: BuildLedger | None = Field(
        None, description="Present when the task has a pay policy: what computing its ledger added."
    )


class _BuildId(BaseModel):
    build_id: int


class RoundReportPublic(RoundReport, _BuildId):
    """The newest build's report with its build's id (first, as it always was)."""
