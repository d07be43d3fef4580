"""API tokens."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field

from dynaloop.api.schemas.common import ANSWER_CONFIG
from services.db.models import ApiToken


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("api", min_length=1, max_length=100)
    expires_in_days: int | None = Field(None, ge=1, le=3650)


class TokenPublic(BaseModel):
    model_config = ANSWER_CONFIG

    id: int
    name: str
    prefix: str
    token: str | None = Field(None, description="The plain token; shown only when it is created.")
    expires_at: dt.datetime | None

    @classmethod
    def of(cls, token: ApiToken, plain: str | None = None) -> TokenPublic:
        return cls(id=token.id, name=token.name, prefix=token.prefix, token=plain, expires_at=token.expires_at)
