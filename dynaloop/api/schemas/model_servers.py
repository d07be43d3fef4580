"""The registry of model servers (admins register; researchers choose among them).

No response ever carries a server's admin token: ``has_admin_token`` says whether one is set."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field

from services.db.models import ModelServer
from services.domain.model_servers import DESCRIPTION_MAX, NAME_MAX, TOKEN_MAX, URL_MAX


class ModelServerCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=NAME_MAX, examples=["model-0"], description="A slug: a-z, 0-9, -.")
    url: str = Field(min_length=1, max_length=URL_MAX, examples=["http://127.0.0.1:8001"])
    admin_token: str | None = Field(
        None,
        min_length=1,
        max_length=TOKEN_MAX,
        description="The server's admin token (`dynaloop model-server --admin-token`), sent only to this "
        "server's URL when a model is promoted to it. Stored; never returned.",
    )
    description: str | None = Field(None, max_length=DESCRIPTION_MAX)


class ModelServerUpdate(BaseModel):
    """Only the fields sent change; ``admin_token: null`` removes the token."""

    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, min_length=1, max_length=URL_MAX)
    admin_token: str | None = Field(None, min_length=1, max_length=TOKEN_MAX)
    description: str | None = Field(None, max_length=DESCRIPTION_MAX)


class ModelServerPublic(BaseModel):
    name: str
    url: str
    description: str | None
    has_admin_token: bool = Field(description="Whether an admin token is registered (the token is never shown).")
    created_by: str | None
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def of(cls, server: ModelServer) -> ModelServerPublic:
        return cls(
            name=server.name,
            url=server.url,
            description=server.description,
            has_admin_token=bool(server.admin_token),
            created_by=server.created_by.username if server.created_by else None,
            created_at=server.created_at,
            updated_at=server.updated_at,
        )


class ModelServersPublic(BaseModel):
    data: list[ModelServerPublic]
    count: int


class ModelServerGrantPublic(BaseModel):
    """A server granted to a task: the task's researchers may put it in their rounds' loop and,
    while it is granted to no other task (``shared`` false), promote their models to it."""

    server: str
    task: str
    shared: bool = Field(description="Granted to more than one task: only admins may swap its model.")
    granted_by: str | None
    granted_at: dt.datetime


class ModelServerGrantsPublic(BaseModel):
    data: list[ModelServerGrantPublic]
    count: int
