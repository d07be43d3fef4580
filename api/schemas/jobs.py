"""Jobs: train, evaluate and promote in their own process (modelling.jobs)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.db.models import Job, JobKind, JobStatus


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: JobKind = Field(description="train, evaluate or promote.")
    params: dict[str, Any] = Field(default_factory=dict, description="The kind's parameters (docs/api.md, Jobs).")


class JobPublic(BaseModel):
    id: int
    kind: JobKind
    task: str
    status: JobStatus
    progress: float = Field(description="0 to 1.")
    message: str
    params: dict[str, Any]
    result: dict[str, Any] | None
    log: str | None = Field(None, description="The newest lines of the job's log (only on GET /jobs/{id}).")
    created_by: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None

    @classmethod
    def of(cls, job: Job, *, with_log: bool = False) -> JobPublic:
        return cls(
            id=job.id,
            kind=job.kind,
            task=job.task.name,
            status=job.status,
            progress=job.progress,
            message=job.message,
            params=job.params or {},
            result=job.result,
            log=job.log if with_log else None,
            created_by=job.created_by.username if job.created_by else None,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
        )


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int
