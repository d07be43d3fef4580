"""Worker quality: validators' agreement with the majority, (un)qualification."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dynaloop.api.schemas.common import ANSWER_CONFIG
from services.domain.controls import GoldAccuracy
from services.domain.quality import ValidatorAgreement


class UnqualifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=500)


class WorkerAgreementPublic(BaseModel):
    model_config = ANSWER_CONFIG

    username: str
    labels: int
    judged: int
    agreement_rate: float | None
    qualified: bool
    control_answers: int = Field(0, description="Answers to control (gold) items in the same scope.")
    gold_accuracy: float | None = Field(
        None, description="Share of the control answers that were right; null without control answers."
    )

    @classmethod
    def of(cls, row: ValidatorAgreement, gold: GoldAccuracy | None = None) -> WorkerAgreementPublic:
        return cls(
            username=row.username,
            labels=row.labels,
            judged=row.judged,
            agreement_rate=row.agreement_rate,
            qualified=row.qualified,
            control_answers=gold.answers if gold else 0,
            gold_accuracy=gold.rate if gold else None,
        )


class UnqualifiedPublic(BaseModel):
    username: str
    qualified: bool = Field(description="Always false.")
    labels_excluded: int = Field(description="Labels that stopped counting (0 if already unqualified).")


class RequalifiedPublic(BaseModel):
    username: str
    qualified: bool = Field(description="Always true.")
    labels_restored: int = Field(description="Labels that count again where the example still had room.")
