"""Login and the signed-in user."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dynaloop.api.schemas.users import UserPublic


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=200)


class LoginResponse(BaseModel):
    token: str
    user: UserPublic
