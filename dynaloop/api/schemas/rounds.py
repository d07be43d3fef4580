"""Rounds: their settings, prompt imports, live statistics and the dashboard's plot data."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field

from dynaloop.api.schemas.common import ANSWER_CONFIG
from dynaloop.api.schemas.worker_quality import WorkerAgreementPublic
from services.db.models import PromptStrategy, Round, RoundStatus, TargetLabelMode
from services.domain.model_servers import MAX_PER_ROUND


class RoundCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_servers: list[str] = Field(
        default_factory=list,
        max_length=MAX_PER_ROUND,
        examples=[["model-0"]],
        description="Names of registered model servers (GET /model-servers); one is picked per attempt.",
    )
    prompt_strategy: PromptStrategy = PromptStrategy.unused_first
    no_prompt_fraction: float = Field(0.0, ge=0.0, le=1.0)
    target_label_mode: TargetLabelMode = TargetLabelMode.balanced
    notes: str | None = Field(None, max_length=5000)


class RoundStatusUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: RoundStatus


class RoundModelUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_servers: list[str] = Field(
        max_length=MAX_PER_ROUND, description="Names of registered model servers (GET /model-servers)."
    )


class RoundPublic(BaseModel):
    model_config = ANSWER_CONFIG

    id: int
    task: str
    number: int
    status: RoundStatus
    model_servers: list[str] | None = Field(
        description="The registered model servers in the loop; null for those who do not manage the task "
        "(writers and validators never see which servers, or where)."
    )
    prompt_strategy: PromptStrategy
    no_prompt_fraction: float
    target_label_mode: TargetLabelMode
    opened_at: dt.datetime | None
    validating_at: dt.datetime | None
    closed_at: dt.datetime | None
    open_study_links: int | None = Field(
        None,
        description="How many of the round's study links may still take workers (not closed, not past their "
        "closing time); closing the round closes them. Null for those who do not manage the task.",
    )
    study_links_closed: int | None = Field(
        None,
        description="Only in the answer to closing the round: how many open study links the closing closed "
        "(each audited with the reason 'round closed'). Null otherwise.",
    )

    @classmethod
    def of(
        cls,
        round_: Round,
        *,
        show_model: bool,
        open_study_links: int | None = None,
        study_links_closed: int | None = None,
    ) -> RoundPublic:
        """``show_model``: the caller manages the round's task (``RoundPolicy.manage``); only then
        are the study-link counts given."""
        return cls(
            id=round_.id,
            task=round_.task.name,
            number=round_.number,
            status=round_.status,
            model_servers=list(round_.model_servers) if show_model else None,
            prompt_strategy=round_.prompt_strategy,
            no_prompt_fraction=round_.no_prompt_fraction,
            target_label_mode=round_.target_label_mode,
            opened_at=round_.opened_at,
            validating_at=round_.validating_at,
            closed_at=round_.closed_at,
            open_study_links=open_study_links if show_model else None,
            study_links_closed=study_links_closed if show_model else None,
        )


class RoundsPublic(BaseModel):
    data: list[RoundPublic]
    count: int


class PromptImportPublic(BaseModel):
    rows: int
    imported: int
    duplicates_in_file: int
    already_present: int


# --- live statistics (services.domain.round_lifecycle.round_stats) ------------------------------------


class AssignmentCounts(BaseModel):
    """Assignments by status; overdue ones count as expired before their writer is back."""

    active: int
    submitted: int
    skipped: int
    expired: int


class AttemptCounts(BaseModel):
    scored: int
    fooled: int
    model_unavailable: int
    fooling_rate: float | None = Field(description="Fooled / scored attempts; null before the first.")


class ConfirmationCounts(BaseModel):
    """Writers' answers to "would a person say this has the target label?" on fooling attempts."""

    yes: int
    no: int
    rate: float | None = Field(description="Share of yes; null before the first answer.")


class ExampleCounts(BaseModel):
    model_config = ANSWER_CONFIG

    submitted: int
    fooled: int
    prompt: int = Field(description="Written from a prompt.")
    no_prompt: int = Field(description="Written without a prompt.")
    validating: int
    validated: int
    dropped: int
    by_target_label: dict[str, int] = Field(description="Target label ('+'-joined sets) -> examples.")
    awaiting_reannotation: int = Field(
        0, description="Re-queued for new validators after no gold (counted in validating too)."
    )
    awaiting_reannotation_no_new_validator: int = Field(
        0,
        description="Of those, examples every validator of the round has labelled already: they wait for new "
        "validators; a build excludes them as awaiting_reannotation.",
    )


class ValidationCounts(BaseModel):
    given: int = Field(description="Labels given, counted or not.")
    counted: int
    needed: int
    coverage: float | None = Field(description="Counted / needed; null before the first example.")


class PromptCounts(BaseModel):
    total: int
    used: int


class OriginCounts(BaseModel):
    written: int
    harvested: int
    imported: int = Field(description="Imported from a labelled dataset or crowd responses (docs/round_builder.md).")


class RoundStats(BaseModel):
    """What a researcher watches while a round runs."""

    round: int = Field(description="The round's number in its task.")
    status: RoundStatus
    assignments: AssignmentCounts
    attempts: AttemptCounts
    confirmations: ConfirmationCounts
    examples: ExampleCounts
    validations: ValidationCounts
    prompts: PromptCounts
    examples_by_origin: OriginCounts


# --- the dashboard's plot data (rounds.build.dashboard.round_plot_data) ---------------------


class PlotExample(BaseModel):
    """One example as the plots need it (DynaSent Fig. 2); never its text."""

    example_id: int
    condition: str
    origin: str
    edit_distance: float | None = Field(description="Normalised edit distance to the prompt; null without one.")
    chars: int
    words: int
    target: str | None = Field(description="The writer's target label ('+'-joined sets); null if harvested.")
    prediction: str | None
    majority: str | None = Field(description="The gold label once validated; null before, or without a majority.")
    validated: bool
    fooled: bool
    validations: int


class PlotDataPublic(BaseModel):
    round_id: int
    round: int
    task: str
    labels: list[str]
    validation_labels: list[str]
    multi_label: bool
    total_examples: int
    truncated: bool = Field(description="True when the round has more examples than `limit` (thinned evenly).")
    examples: list[PlotExample]
    worker_agreement: list[WorkerAgreementPublic]
