"""`dynaloop job run` (what a worker runs for each job) and `dynaloop worker` (rounds.models.worker)."""

from __future__ import annotations

import os
import signal
from enum import Enum
from typing import Annotated

import typer

from dynaloop.commands.common import (
    DatabaseOpt,
    console,
    ensure_schema,
    fail,
    require_extras,
    session_factory,
    settings_for,
)

app = typer.Typer(
    help="Jobs (train, evaluate, promote) that workers run, each in its own process.", no_args_is_help=True
)


def _die_with_worker() -> None:
    """Started by a worker (rounds.models.worker): get SIGHUP when the worker dies, and stop (the
    job records that its worker is gone), so a job never runs on unwatched. Linux's
    PR_SET_PDEATHSIG; elsewhere the worker's heartbeat still tells the researcher."""
    from rounds.models.worker import WORKER_PID_ENV

    worker_pid = os.environ.get(WORKER_PID_ENV, "")
    if not worker_pid.isdigit():
        return
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGHUP)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(worker_pid):  # the worker died before the call above
        os.kill(os.getpid(), signal.SIGHUP)


@app.command("run")
def job_run(
    job_id: Annotated[int, typer.Argument(help="The job's id (POST /api/v1/tasks/{task}/jobs)")],
    database_url: DatabaseOpt = None,
) -> None:
    """Run a queued job in this process, writing its progress to the database (a `dynaloop
    worker` starts this command for every job it takes; a promote job reads its model server's
    URL and admin token from the registry of model servers)."""
    from rounds.models.job_runner import STOP, run_job
    from services.db.models import JobStatus
    from services.errors import DomainError

    settings = settings_for(database_url)
    url = settings.resolved_database_url
    ensure_schema(url)

    signal.signal(signal.SIGTERM, STOP.handle)  # recorded on the job as interrupted, or cancelled
    signal.signal(signal.SIGHUP, STOP.handle)  # its worker died
    _die_with_worker()
    try:
        job = run_job(session_factory(url), job_id, data_dir=settings.data_dir, data_root=settings.data_root)
    except DomainError as exc:
        raise fail(exc.message) from exc
    console.print(
        f"job {job.id} ({job.kind.value}) {job.status.value}: {job.message}",
        soft_wrap=True,
        highlight=False,
        markup=False,
    )
    if job.status is not JobStatus.succeeded:
        raise typer.Exit(1)


class QueueChoice(str, Enum):
    cpu = "cpu"
    gpu = "gpu"


def worker(
    queue: Annotated[
        QueueChoice, typer.Option("--queue", help="cpu: any job that needs no GPU; gpu: jobs that asked for one.")
    ] = QueueChoice.cpu,
    name: Annotated[
        str | None, typer.Option("--name", help="How jobs and GET /jobs name this worker; default HOST-QUEUE-PID.")
    ] = None,
    skip_gpu_check: Annotated[
        bool,
        typer.Option(
            "--skip-gpu-check",
            help="Take gpu jobs on a machine without a CUDA GPU (to rehearse the wiring; training then runs on CPU).",
        ),
    ] = False,
    database_url: DatabaseOpt = None,
) -> None:
    """Take jobs from one queue (in the application's database) and run each in a process of its
    own, writing a heartbeat; SIGINT waits for the running job, SIGTERM stops it (docs/deploy.md)."""
    from rounds.models.worker import Worker, WorkerSettings
    from services.db.models import JobQueue
    from services.errors import DomainError
    from services.observability import configure_logging

    chosen = JobQueue(queue.value)
    if chosen is JobQueue.gpu and not skip_gpu_check:
        require_extras("training")  # the GPU check asks torch, and every gpu job trains or evaluates
        import torch

        if not torch.cuda.is_available():
            raise fail(
                "no CUDA GPU is visible on this machine, so it cannot take gpu jobs; run `dynaloop worker --queue cpu` "
                "here, or a gpu worker where a GPU is"
            )
    settings = settings_for(database_url)
    # A worker runs as a service (docs/deploy.md): its own lines (jobs taken, started, stopped)
    # are JSON objects with DYNALOOP_LOG_FORMAT=json, as the API's and the model servers' are.
    # Not its jobs' processes: their output is the job's log, which a researcher reads.
    configure_logging(settings.log_format)
    url = settings.resolved_database_url
    ensure_schema(url)
    try:
        runner = Worker(
            WorkerSettings(
                queue=chosen,
                database_url=url,
                data_dir=settings.data_dir,
                data_root=settings.data_root,
                name=name or "",
            ),
            session_factory(url),
        )
        runner.run()
    except DomainError as exc:
        raise fail(exc.message) from exc


@app.command("workers")
def job_workers(
    check: Annotated[
        str | None,
        typer.Option("--check", help="Exit 0 only if the worker of this name reports (a container's health check)."),
    ] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """The job workers: queue, where they run, their current job and when they last reported."""
    from rich.table import Table
    from sqlalchemy import select

    from rounds.models.jobs import HEARTBEAT_STALE
    from services.db.models import JobWorker, utcnow

    settings = settings_for(database_url)
    url = settings.resolved_database_url
    ensure_schema(url)
    with session_factory(url)() as session:
        workers = list(session.scalars(select(JobWorker).order_by(JobWorker.queue, JobWorker.name)))
    now = utcnow()

    def state(worker: JobWorker) -> str:
        if worker.stopped_at is not None:
            return "stopped"
        return "running" if now - worker.heartbeat_at < HEARTBEAT_STALE else "gone (no heartbeat)"

    if check is not None:
        found = next((worker for worker in workers if worker.name == check), None)
        if found is None or state(found) != "running":
            raise fail(f"worker {check!r} is {'not registered' if found is None else state(found)}")
        console.print(f"worker {check} is running (job {found.job_id or 'none'})", highlight=False, markup=False)
        return
    table = Table("name", "queue", "host", "pid", "job", "state", "last report (UTC)")
    for worker in workers:
        table.add_row(
            worker.name,
            worker.queue.value,
            worker.host,
            str(worker.pid),
            str(worker.job_id or ""),
            state(worker),
            f"{worker.heartbeat_at:%Y-%m-%d %H:%M:%S}",
        )
    console.print(table if workers else "no worker has registered yet; start one with `dynaloop worker`")
