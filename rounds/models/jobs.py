"""Jobs: retraining, evaluation and promotion started through the API, run by workers.

Training a model takes minutes to hours and must never run inside an API process (it would
hold a worker, a restart would lose it, and it would compete with crowdworkers for the API's
CPU). The API therefore records a :class:`Job` row (:func:`create_job`, which validates the
parameters) together with a message on the job's queue (:mod:`rounds.models.queue`: ``cpu`` or
``gpu``). A `dynaloop worker` of that queue (:mod:`rounds.models.worker`), on this machine or
another one, takes the message, runs ``python -m dynaloop.cli job run ID`` as a process of its
own and watches it; that process calls :func:`rounds.models.job_runner.run_job`, which does the work
and writes its progress, message and the tail of its log to the row in short transactions, so a
researcher's page can poll ``GET /api/v1/jobs/{id}``. This module keeps the records: creating
and validating a job, its queue, the heartbeats that tell a live job from a lost one, cancelling.

Each kind runs the use case that `dynaloop` runs for the same step (:mod:`rounds.models.usecases`),
and its parameters are that use case's options (docs/api.md, "Jobs"):

* ``train``: :func:`~rounds.models.usecases.train_and_register` from the base checkpoint on a data
  mix (default: every built round's train split, with the newest built round's dev split for
  early stopping), into ``DATA_DIR/models/TASK-job-ID``;
  its files are the task's uploaded datasets and files under ``DYNALOOP_DATA_ROOT`` only
  (:class:`~rounds.models.datasets.DataFiles`), checked when the job is created and again in its
  process before anything is read; the params keep the names the researcher gave;
* ``evaluate``: :func:`~rounds.models.usecases.evaluate_and_record` on every built round's dev and
  test split (and a mix's sets), into ``DATA_DIR/evaluations/TASK-job-ID``;
* ``promote``: :func:`~rounds.models.usecases.promote_model` (hot swap on a registered model server,
  then the registry). A model below the promoted one on a round's dev split, or near chance, is
  refused without ``confirm_worse`` (:func:`~rounds.models.promotion.check_not_worse`), when the job
  is created and again when it runs. The job names the server; its process reads the server's URL and admin
  token from the registry of model servers that admins keep, so a request can neither choose
  where the token goes nor see it, and the token is never in the job's row, log or environment.

A job never hangs as *running*: every failure is recorded with a message that says what
happened; the worker that took a job writes a heartbeat on its row, and a job whose worker
stopped reporting (killed, out of memory, machine lost) is marked failed when it is next read
(:func:`check_liveness`). :func:`cancel_job` cancels a queued job at once and asks the worker
of a running one to stop it.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from rounds.models.datasets import DataError, DataFiles, DataMix, under_root
from rounds.models.evaluation_sets import built_round_numbers
from rounds.models.promotion import check_not_worse
from rounds.models.queue import enqueue
from rounds.models.usecases import EvaluateOptions, PromoteOptions, TrainOptions, default_mix
from services.db.models import (
    Job,
    JobKind,
    JobQueue,
    JobStatus,
    JobWorker,
    ModelVersion,
    ModelVersionStatus,
    Round,
    Task,
    User,
    utcnow,
)
from services.db.statements import rows_matched
from services.domain import audit
from services.domain.model_servers import find_server, require_granted
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid, missing_job, validation_problems
from services.taskdef import TaskDefinition

logger = logging.getLogger(__name__)

__all__ = [
    "ACTIVE",
    "EvaluateParams",
    "PromoteParams",
    "TrainParams",
    "cancel_job",
    "check_liveness",
    "choose_queue",
    "create_job",
    "get_job",
    "list_jobs",
    "live_workers",
    "model_of",
    "parse_params",
]

ACTIVE = (JobStatus.queued, JobStatus.running)
#: A worker writes its heartbeat (and its job's) this often (rounds.models.worker) ...
HEARTBEAT_INTERVAL = dt.timedelta(seconds=5)
#: ... and a job or worker whose heartbeat is older than this is gone: a worker blocked this long
#: in one database write would be one too.
HEARTBEAT_STALE = dt.timedelta(seconds=60)
# Never passed on to a job's process: a promote job takes its server's token from the registry.
ADMIN_TOKEN_ENV = "DYNALOOP_MODEL_SERVER_ADMIN_TOKEN"
DATA_ROOT_ENV = "DYNALOOP_DATA_ROOT"
#: The worker that started a job's process names itself here (rounds.models.worker).
WORKER_NAME_ENV = "DYNALOOP_JOB_WORKER_NAME"
MAX_ID = 2**31 - 1  # ids are INTEGER columns (dynaloop.api.deps.MAX_ID)


# --- parameters --------------------------------------------------------------------------

#: ``POST /tasks/{task}/jobs`` with ``kind: train``: the options of `dynaloop round train`.
TrainParams = TrainOptions


class EvaluateParams(EvaluateOptions):
    """``kind: evaluate``: the options of `dynaloop round evaluate`, for a registered model."""

    model_id: int = Field(ge=1, le=MAX_ID, description="The model's registry id (GET /tasks/{task}/models).")


class PromoteParams(PromoteOptions):
    """``kind: promote``: the options of `dynaloop model promote`, for a registered model."""

    model_id: int = Field(ge=1, le=MAX_ID, description="The model's registry id.")


PARAMS: dict[JobKind, type[BaseModel]] = {
    JobKind.train: TrainParams,
    JobKind.evaluate: EvaluateParams,
    JobKind.promote: PromoteParams,
}


def parse_params(kind: JobKind | str, params: dict[str, Any] | None) -> BaseModel:
    """The parameters of a job of ``kind``, validated; :class:`Invalid` lists every problem."""
    try:
        kind = JobKind(kind)
    except ValueError as exc:
        raise Invalid(f"kind {kind!r} is not a job kind; use one of {[k.value for k in JobKind]}") from exc
    try:
        return PARAMS[kind].model_validate(params or {})
    except ValidationError as exc:
        problems = validation_problems(exc.errors(), "params")
        raise Invalid("; ".join(problems), problems=problems) from exc


# --- creating and reading ------------------------------------------------------------------


def _check_rounds(session: Session, task: Task, numbers: list[int], where: str) -> None:
    built = set(built_round_numbers(session, task))
    existing = set(session.scalars(select(Round.number).where(Round.task_id == task.id)))
    for number in numbers:
        if number not in existing:
            raise Invalid(f"{where}: task {task.name!r} has no round {number}")
        if number not in built:
            raise Invalid(f"{where}: round {number} of {task.name!r} has not been built; build it first")


def _check_mix(session: Session, task: Task, mix: DataMix, files: DataFiles) -> DataMix:
    """The mix's rounds are built and its files are uploads or under the data root. The params
    keep the names the researcher gave; the job's process checks them again before it reads."""
    _check_rounds(
        session, task, [source.round for _, source in mix.sources() if source.round is not None], "params.mix"
    )
    try:
        files.resolve(mix, session=session, task=task, where="params.mix")
    except DataError as exc:
        raise Invalid(str(exc)) from exc
    return mix


def base_folder(base: str, data_root: Path | None) -> Path:
    """A train job's ``base`` checkpoint: a folder under the data root, like the mix's files
    (the error never tells whether a path exists)."""
    folder = under_root(data_root, base)
    if folder is None or not folder.is_dir():
        raise Invalid(
            "params.base: not a folder under the data root; give a path relative to the data root "
            "(DYNALOOP_DATA_ROOT), or leave base out for the packaged backbone"
        )
    return folder


def model_of(session: Session, task: Task, model_id: int) -> ModelVersion:
    model = session.get(ModelVersion, model_id)
    if model is None or model.task_id != task.id:
        known = [
            f"{m.id} ({m.name})"
            for m in session.scalars(
                select(ModelVersion).where(ModelVersion.task_id == task.id).order_by(ModelVersion.id)
            )
        ]
        raise Invalid(
            f"params.model_id: task {task.name!r} has no model {model_id}; registered: "
            f"{', '.join(known) or 'none (train one first)'}"
        )
    return model


def create_job(
    session: Session,
    actor: User | None,
    task: Task,
    kind: JobKind | str,
    params: dict[str, Any] | None,
    *,
    data_dir: Path,
    data_root: Path | None = None,
    queue: JobQueue | str | None = None,
    cpu_fallback: bool = False,
) -> Job:
    """Validate ``params`` for ``kind`` and record a queued job with its queue's message (both
    written in ``session``'s transaction): see :func:`choose_queue` for ``queue`` and
    ``cpu_fallback``.

    A data mix may name the task's uploaded datasets and files under ``data_root``
    (``DYNALOOP_DATA_ROOT``; None: uploads only); anything else is refused with one message
    that does not tell whether the file exists. A second train job for a task while one is
    queued or running is a :class:`Conflict`."""
    parsed = parse_params(kind, params)
    kind = JobKind(kind)
    definition = definition_of(task)
    files = DataFiles.of(data_dir, data_root)
    if isinstance(parsed, TrainParams):
        _check_train(session, task, definition, parsed, files, data_root)
    elif isinstance(parsed, EvaluateParams):
        _check_evaluate(session, task, definition, parsed, files)
    elif isinstance(parsed, PromoteParams):
        _check_promote(session, actor, task, parsed)
    chosen, note = choose_queue(session, task, kind, queue, cpu_fallback)
    stored = parsed.model_dump(mode="json", exclude_none=True)
    job = Job(
        kind=kind,
        task_id=task.id,
        status=JobStatus.queued,
        queue=chosen,
        progress=0.0,
        message=f"queued for a {chosen.value} worker" + (f" ({note})" if note else ""),
        params=stored,
        log="",
        created_by_id=actor.id if actor else None,
    )
    session.add(job)
    session.flush()
    enqueue(session, chosen, job.id)
    audit.record(session, actor, f"job.{kind.value}", "job", job.id, task=task.name, params=stored, queue=chosen.value)
    return job


def _check_train(
    session: Session,
    task: Task,
    definition: TaskDefinition,
    parsed: TrainParams,
    files: DataFiles,
    data_root: Path | None,
) -> None:
    """One train job per task at a time; the mix (default: :func:`default_mix`), class weights
    and base checkpoint are the task's. Resolves ``parsed.mix`` in place."""
    # Lock the task row (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises) so two
    # concurrent requests cannot both start a training run.
    session.execute(select(Task.id).where(Task.id == task.id).with_for_update())
    for other in session.scalars(
        select(Job).where(Job.task_id == task.id, Job.kind == JobKind.train, Job.status.in_(ACTIVE))
    ):
        check_liveness(session, other)
        if other.status in ACTIVE:
            raise Conflict(
                f"train job {other.id} of task {task.name!r} is still {other.status.value}; wait for "
                f"it to finish (GET /api/v1/jobs/{other.id})",
                job_id=other.id,
            )
    parsed.mix = _check_mix(session, task, parsed.mix or default_mix(session, task), files)
    if isinstance(parsed.class_weights, dict):
        unknown = sorted(set(parsed.class_weights) - set(definition.labels))
        if unknown:
            raise Invalid(
                f"params.class_weights: {unknown} are not labels of {task.name!r}; its labels are "
                f"{list(definition.labels)}"
            )
    if parsed.base is not None and parsed.tiny:
        raise Invalid("params: give base or tiny, not both")
    if parsed.base is not None:
        base_folder(parsed.base, data_root)


def _check_evaluate(
    session: Session, task: Task, definition: TaskDefinition, parsed: EvaluateParams, files: DataFiles
) -> None:
    """The model is the task's, the rounds are built and the positive label is one of the task's."""
    model_of(session, task, parsed.model_id)
    if parsed.mix is not None:
        parsed.mix = _check_mix(session, task, parsed.mix, files)
    if parsed.rounds is not None:
        _check_rounds(session, task, parsed.rounds, "params.rounds")
    elif not built_round_numbers(session, task) and not parsed.extra_sources():
        raise Invalid(f"task {task.name!r} has no built round to evaluate on; build a round first")
    if parsed.positive_label is not None and parsed.positive_label not in definition.labels:
        raise Invalid(
            f"params.positive_label: {parsed.positive_label!r} is not a label of {task.name!r}; its "
            f"labels are {list(definition.labels)}"
        )


def _check_promote(session: Session, actor: User | None, task: Task, parsed: PromoteParams) -> None:
    """The server, when named, is registered, granted to the task and has an admin token; the
    model was evaluated (or ``force``) and is not worse than the promoted one (or ``confirm_worse``)."""
    model = model_of(session, task, parsed.model_id)
    # Without a server the promotion reaches the replicas that follow the task (rounds.models.replicas).
    server = find_server(session, parsed.server) if parsed.server is not None else None
    if parsed.server is not None and server is None:
        raise Invalid(
            f"params.server: {parsed.server[:80]!r} is not a registered model server; GET "
            "/api/v1/model-servers lists them (an admin registers new ones), or leave server out to "
            "promote to the replicas that follow the task"
        )
    if server is not None:
        # Only a server granted to this task, and to no other, unless an admin asks; force
        # (an unevaluated model) does not lift it.
        require_granted(session, actor, task, [server.name], field="params.server", swap=True)
    if server is not None and not server.admin_token:
        raise Invalid(
            f"params.server: model server {server.name!r} is registered without an admin token, so no "
            "model can be promoted to it; ask an admin to set one, or leave server out to promote to the "
            "replicas that follow the task"
        )
    if model.status is ModelVersionStatus.trained and not parsed.force:
        raise Conflict(
            f"model {model.name} was never evaluated, so nobody knows whether it beats the one in the "
            "loop; run an evaluate job first, or set force to promote it anyway"
        )
    # Checked again when the job runs (rounds.models.promotion.promote): the promoted model may change.
    check_not_worse(session, task, model, parsed.confirm_worse)


def choose_queue(
    session: Session, task: Task, kind: JobKind, requested: JobQueue | str | None, cpu_fallback: bool
) -> tuple[JobQueue, str | None]:
    """The queue a new job waits in, and a note on why when it is not the one asked for.

    A train job goes where the request says, else where the task's definition says
    (``training.accelerator``); an evaluate job where the request says, else to the CPU workers;
    a promote job always to the CPU workers (it loads no model). A job for the GPU workers waits
    for one, however long; only with ``cpu_fallback`` does it go to the CPU workers instead,
    when no GPU worker is running at the time it is created."""
    if requested is not None:
        try:
            requested = JobQueue(requested)
        except ValueError as exc:
            raise Invalid(f"queue {str(requested)[:20]!r} is not a queue; use cpu or gpu") from exc
    if kind is JobKind.promote:
        if requested is JobQueue.gpu:
            raise Invalid("queue: a promote job loads no model here, so it runs on a cpu worker; leave queue out")
        return JobQueue.cpu, None
    if requested is None:
        accelerator = definition_of(task).training.accelerator if kind is JobKind.train else "cpu"
        requested = JobQueue(accelerator)
    if requested is JobQueue.gpu and cpu_fallback and not live_workers(session, JobQueue.gpu):
        return JobQueue.cpu, "no gpu worker is running, and cpu_fallback was asked for"
    return requested, None


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise missing_job(job_id)
    check_liveness(session, job)
    return job


def list_jobs(
    session: Session, task: Task, *, kind: JobKind | None = None, status: JobStatus | None = None, limit: int = 50
) -> list[Job]:
    """The task's jobs, newest first."""
    query = select(Job).where(Job.task_id == task.id)
    if kind is not None:
        query = query.where(Job.kind == kind)
    if status is not None:
        query = query.where(Job.status == status)
    found = list(session.scalars(query.order_by(Job.id.desc()).limit(limit)))
    for job in found:
        check_liveness(session, job)
    if status is not None:
        found = [job for job in found if job.status is status]
    return found


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine runs (a zombie does not)."""
    if pid == os.getpid():
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # someone else's process: it exists
        return True


def check_liveness(session: Session, job: Job) -> bool:
    """Mark a job failed when the worker that took it stopped reporting; True when it did so.

    A queued job that no worker took yet stays queued however long it waits (a GPU worker may
    be started tomorrow; :func:`waiting_message` says what it waits for). A job that a worker
    took carries that worker's heartbeat; older than :data:`HEARTBEAT_STALE`, the worker and
    the job's process are gone (killed, out of memory, machine lost). The update is conditional
    on the heartbeat read, so a job that finished or reported at the same moment keeps its state.
    Rows from before the queue (no worker, a pid) are judged by their process, on its machine."""
    if job.status not in ACTIVE:
        return False
    if job.worker is not None:
        if job.heartbeat_at is not None and utcnow() - job.heartbeat_at < HEARTBEAT_STALE:
            return False
        seen = (
            "never reported"
            if job.heartbeat_at is None
            else f"last reported at {job.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC"
        )
        message = (
            f"worker {job.worker}, which was running this job, {seen} and is gone (stopped, killed, out of memory, "
            "or its machine was lost); see the job's log and start it again"
        )
        unchanged = Job.heartbeat_at.is_(None) if job.heartbeat_at is None else Job.heartbeat_at == job.heartbeat_at
    elif job.pid is not None and job.host == socket.gethostname() and not process_alive(job.pid):
        message = (
            f"the job's process (pid {job.pid}) ended without reporting a result: it was killed, ran out of "
            "memory, or the machine restarted; see the job's log and start it again"
        )
        unchanged = Job.pid == job.pid
    else:
        return False
    changed = rows_matched(
        session,
        update(Job)
        .where(Job.id == job.id, Job.status.in_(ACTIVE), unchanged)
        .values(status=JobStatus.failed, message=message, finished_at=utcnow())
        .execution_options(synchronize_session=False),
    )
    session.refresh(job)
    if changed:
        logger.warning("job %s: %s", job.id, message)
    return bool(changed)


def live_workers(session: Session, queue: JobQueue) -> list[JobWorker]:
    """The workers of ``queue`` that reported within :data:`HEARTBEAT_STALE`."""
    return list(
        session.scalars(
            select(JobWorker)
            .where(
                JobWorker.queue == queue,
                JobWorker.stopped_at.is_(None),
                JobWorker.heartbeat_at > utcnow() - HEARTBEAT_STALE,
            )
            .order_by(JobWorker.name)
        )
    )


def waiting_message(session: Session, job: Job) -> str | None:
    """What a queued job that no worker took yet waits for; None for any other job."""
    if job.status is not JobStatus.queued or job.worker is not None:
        return None
    workers = live_workers(session, job.queue)
    if not workers:
        return (
            f"{job.message}; no {job.queue.value} worker is running (an operator starts one with "
            f"`dynaloop worker --queue {job.queue.value}`)"
        )
    busy = sum(1 for worker in workers if worker.job_id is not None)
    return f"{job.message}; {len(workers)} {job.queue.value} worker(s) running, {busy} busy with other jobs"


def job_log_path(data_dir: Path, job_id: int) -> Path:
    """Where the worker writes the output of job ``job_id``'s process (on the worker's machine)."""
    return Path(data_dir) / "jobs" / f"job-{job_id}.log"


# --- cancelling ----------------------------------------------------------------------------


def cancel_job(session: Session, actor: User | None, job: Job) -> Job:
    """Cancel ``job``: a queued job that no worker took is cancelled at once; otherwise the
    request is recorded and the job's worker stops its process (SIGTERM, then SIGKILL) within a
    few seconds, and the job ends *cancelled*. Asking twice is harmless; a finished job is a
    :class:`Conflict`."""
    check_liveness(session, job)
    if job.status not in ACTIVE:
        raise Conflict(f"job {job.id} is already {job.status.value}; only a queued or running job can be cancelled")
    who = actor.username if actor is not None else "an operator"
    now = utcnow()
    taken = rows_matched(
        session,
        update(Job)
        .where(Job.id == job.id, Job.status == JobStatus.queued, Job.worker.is_(None))
        .values(
            status=JobStatus.cancelled,
            message=f"cancelled by {who} before a worker took it",
            finished_at=now,
            cancel_requested_at=now,
            cancel_requested_by_id=actor.id if actor else None,
        )
        .execution_options(synchronize_session=False),
    )
    if not taken:
        rows_matched(
            session,
            update(Job)
            .where(Job.id == job.id, Job.status.in_(ACTIVE), Job.cancel_requested_at.is_(None))
            .values(
                cancel_requested_at=now,
                cancel_requested_by_id=actor.id if actor else None,
                message=f"cancelling: {who} asked {job.worker or 'its worker'} to stop it",
            )
            .execution_options(synchronize_session=False),
        )
    session.refresh(job)
    audit.record(session, actor, "job.cancel", "job", job.id, task=job.task.name, status=job.status.value)
    return job
