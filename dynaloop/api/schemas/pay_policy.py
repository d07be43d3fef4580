"""A task's pay policy and its versions (docs/round_builder.md, "Pay and the ledger")."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.db.models import PayPolicyVersion
from services.domain.pay_policies import MAX_NOTE_CHARS
from services.taskdef import PayPolicy


class PayPolicyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: PayPolicy = Field(
        description="The new policy: currency, base_pay, writer_bonus_per_example, validator_bonus, "
        "min_hourly_minor; integers in minor units, 0 to 1,000,000."
    )
    note: str = Field("", max_length=MAX_NOTE_CHARS, description="Why it changed (shown in the history).")


class PayPolicyVersionPublic(BaseModel):
    version: int
    policy: dict[str, Any]
    effective_from: dt.datetime = Field(description="Work done from this moment on is paid under this version.")
    note: str
    created_by_id: int | None
    created_at: dt.datetime

    @classmethod
    def of(cls, row: PayPolicyVersion) -> PayPolicyVersionPublic:
        return cls(
            version=row.version,
            policy=row.policy,
            effective_from=row.effective_from,
            note=row.note,
            created_by_id=row.created_by_id,
            created_at=row.created_at,
        )


class PayPolicyPublic(BaseModel):
    task: str
    current: PayPolicyVersionPublic | None = Field(description="The version in force now; null: no pay policy.")
    versions: list[PayPolicyVersionPublic] = Field(description="Every version, oldest first.")
    ledger_currency: str | None = Field(description="The ledger's currency once it has rows; the policy keeps it.")
