"""The health check."""

from __future__ import annotations

from pydantic import BaseModel, Field


class HealthPublic(BaseModel):
    status: str = Field(description="`ok`.")
    schema_revision: str = Field(alias="schema", description="The database's migration, the newest one.")
