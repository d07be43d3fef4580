"""`dynaloop job`: run a job that the API queued (modelling.jobs)."""

from __future__ import annotations

from typing import Annotated

import typer

from dynaloop.commands.common import DatabaseOpt, console, ensure_schema, fail, session_factory, settings_for

app = typer.Typer(
    help="Jobs (train, evaluate, promote) that the API starts in their own process.", no_args_is_help=True
)


@app.command("run")
def job_run(
    job_id: Annotated[int, typer.Argument(help="The job's id (POST /api/v1/tasks/{task}/jobs)")],
    database_url: DatabaseOpt = None,
) -> None:
    """Run a queued job in this process, writing its progress to the database (the API starts
    this command for every job; a promote job reads its model server's URL and admin token from
    the registry of model servers)."""
    import signal

    from modelling.jobs import STOP, run_job
    from services.db.models import JobStatus
    from services.errors import DomainError

    settings = settings_for(database_url)
    url = settings.resolved_database_url
    ensure_schema(url)

    signal.signal(signal.SIGTERM, STOP.handle)  # recorded on the job as interrupted
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
