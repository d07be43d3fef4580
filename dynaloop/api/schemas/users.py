"""Users and their roles."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from services.db.models import User


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(min_length=1, max_length=64)
    roles: list[str] = Field(min_length=1, examples=[["writer", "validator"]])
    display_name: str | None = Field(None, max_length=200)
    password: str | None = Field(None, max_length=200, description="At least 12 characters, not a common password")


class UserPublic(BaseModel):
    id: int
    username: str
    display_name: str | None
    roles: list[str]
    is_active: bool

    @classmethod
    def of(cls, user: User) -> UserPublic:
        return cls(
            id=user.id,
            username=user.username,
            display_name=user.display_name,
            roles=list(user.roles),
            is_active=user.is_active,
        )


class UsersPublic(BaseModel):
    data: list[UserPublic]
    count: int
