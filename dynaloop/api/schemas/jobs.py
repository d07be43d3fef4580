"""Jobs: train, evaluate and promote, run by workers of a queue (rounds.models.jobs, rounds.models.worker)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dynaloop.api.schemas.common import ANSWER_CONFIG
from services.db.models import Job, JobKind, JobQueue, JobStatus


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: JobKind = Field(description="train, evaluate or promote.")
    params: dict[str, Any] = Field(default_factory=dict, description="The kind's parameters (docs/api.md, Jobs).")
    queue: Literal["cpu", "gpu"] | None = Field(
        None,
        description="The workers that may run it: cpu or gpu. Default: a train job the task's training.accelerator, "
        "others cpu. A promote job always runs on cpu.",
    )
    cpu_fallback: bool = Field(
        False, description="With queue gpu: queue it for the cpu workers instead when no gpu worker is running."
    )


class JobPublic(BaseModel):
    model_config = ANSWER_CONFIG

    id: int
    kind: JobKind
    task: str
    status: JobStatus
    queue: JobQueue = Field(description="The workers that may run it: cpu or gpu.")
    worker: str | None = Field(None, description="The worker that took it (dynaloop worker --name).")
    heartbeat_at: dt.datetime | None = Field(None, description="When its worker last reported.")
    cancel_requested_at: dt.datetime | None = None
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
    def of(cls, job: Job, *, with_log: bool = False, waiting: str | None = None) -> JobPublic:
        """``waiting``: what a queued job waits for (rounds.models.jobs.waiting_message), shown as its message."""
        return cls(
            id=job.id,
            kind=job.kind,
            task=job.task.name,
            status=job.status,
            queue=job.queue,
            worker=job.worker,
            heartbeat_at=job.heartbeat_at,
            cancel_requested_at=job.cancel_requested_at,
            progress=job.progress,
            message=waiting or job.message,
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
