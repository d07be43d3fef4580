"""Jobs: train, evaluate and promote, queued for workers that run each in a process of its own (rounds.models.jobs)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from dynaloop.api.deps import IdPath, SessionDep, SettingsDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.jobs import JobCreate, JobPublic, JobsPublic
from rounds.models import jobs as job_runs
from services.authorization import JobPolicy, authorize
from services.db.models import JobKind, JobStatus, User
from services.domain import tasks

router = APIRouter(tags=["jobs"], route_class=OneHopRoute)


@router.post("/tasks/{task_name}/jobs", status_code=status.HTTP_202_ACCEPTED, response_model=JobPublic)
def create_job(
    task_name: str,
    body: JobCreate,
    session: SessionDep,
    settings: SettingsDep,
    researcher: Annotated[User, allowed(JobPolicy.start)],
) -> JobPublic:
    """Queue a train, evaluate or promote job for a worker of its queue (cpu or gpu); poll
    GET /jobs/{id} for progress."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, JobPolicy.start(task))
    job = job_runs.create_job(
        session,
        researcher,
        task,
        body.kind,
        body.params,
        data_dir=settings.data_dir,
        data_root=settings.data_root,
        queue=body.queue,
        cpu_fallback=body.cpu_fallback,
    )
    return JobPublic.of(job, with_log=True, waiting=job_runs.waiting_message(session, job))


@router.post("/jobs/{job_id}/cancel", response_model=JobPublic)
def cancel_job(
    job_id: IdPath, session: SessionDep, researcher: Annotated[User, allowed(JobPolicy.cancel)]
) -> JobPublic:
    """Cancel a job: a queued one at once, a running one within seconds (its worker stops its
    process); 409 when it already ended."""
    job = job_runs.get_job(session, job_id)
    authorize(researcher, JobPolicy.cancel(job))
    job = job_runs.cancel_job(session, researcher, job)
    return JobPublic.of(job, with_log=True)


@router.get("/jobs/{job_id}", response_model=JobPublic)
def get_job(job_id: IdPath, session: SessionDep, researcher: Annotated[User, allowed(JobPolicy.view)]) -> JobPublic:
    """A job's status, progress (0-1), message, result and the newest lines of its log."""
    job = job_runs.get_job(session, job_id)
    authorize(researcher, JobPolicy.view(job))
    return JobPublic.of(job, with_log=True, waiting=job_runs.waiting_message(session, job))


@router.get("/tasks/{task_name}/jobs", response_model=JobsPublic)
def list_jobs(
    task_name: str,
    session: SessionDep,
    researcher: Annotated[User, allowed(JobPolicy.list)],
    kind: JobKind | None = None,
    job_status: JobStatus | None = Query(None, alias="status"),
    limit: int = Query(50, ge=1, le=500),
) -> JobsPublic:
    """The task's jobs, newest first (without their logs)."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, JobPolicy.list(task))
    found = job_runs.list_jobs(session, task, kind=kind, status=job_status, limit=limit)
    return JobsPublic(
        data=[JobPublic.of(job, waiting=job_runs.waiting_message(session, job)) for job in found], count=len(found)
    )
