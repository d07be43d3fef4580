"""Jobs: retraining, evaluation and promotion started through the API, run by workers.

Training a model takes minutes to hours and must never run inside an API process (it would
hold a worker, a restart would lose it, and it would compete with crowdworkers for the API's
CPU). The API therefore records a :class:`Job` row (:func:`create_job`, which validates the
parameters) together with a message on the job's queue (:mod:`modelling.queue`: ``cpu`` or
``gpu``). A `dynaloop worker` of that queue (:mod:`modelling.worker`), on this machine or
another one, takes the message, runs ``python -m dynaloop.cli job run ID`` as a process of its
own and watches it; that process calls :func:`run_job`, which does the work and writes its
progress, message and the tail of its log to the row in short transactions, so a researcher's
page can poll ``GET /api/v1/jobs/{id}``.

Each kind runs the use case that `dynaloop` runs for the same step (:mod:`modelling.usecases`),
and its parameters are that use case's options (docs/api.md, "Jobs"):

* ``train``: :func:`~modelling.usecases.train_and_register` from the base checkpoint on a data
  mix (default: every built round's train split, with the newest built round's dev split for
  early stopping), into ``DATA_DIR/models/TASK-job-ID``;
  its files are the task's uploaded datasets and files under ``DYNALOOP_DATA_ROOT`` only
  (:class:`~modelling.datasets.DataFiles`), checked when the job is created and again in its
  process before anything is read; the params keep the names the researcher gave;
* ``evaluate``: :func:`~modelling.usecases.evaluate_and_record` on every built round's dev and
  test split (and a mix's sets), into ``DATA_DIR/evaluations/TASK-job-ID``;
* ``promote``: :func:`~modelling.usecases.promote_model` (hot swap on a registered model server,
  then the registry). A model below the promoted one on a round's dev split, or near chance, is
  refused without ``confirm_worse`` (:func:`~modelling.registry.check_not_worse`), when the job
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
import signal
import socket
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from modelling.datasets import DataError, DataFiles, DataMix, under_root
from modelling.evaluation_sets import built_round_numbers
from modelling.queue import enqueue
from modelling.registry import check_not_worse
from modelling.usecases import (
    EvaluateOptions,
    EvaluationListener,
    PromoteOptions,
    RegisteredModel,
    TrainingListener,
    TrainOptions,
    default_mix,
    evaluate_and_record,
    promote_model,
    train_and_register,
)
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
from services.domain.tasks import definition_of, get_task
from services.errors import Conflict, DomainError, Invalid, missing_job, validation_problems
from services.extras import MissingExtra

if TYPE_CHECKING:
    from modelling.datasets import LabelledSet
    from modelling.train import EpochRecord, TrainResult

logger = logging.getLogger(__name__)

__all__ = [
    "ACTIVE",
    "EvaluateParams",
    "JobRunner",
    "PromoteParams",
    "TrainParams",
    "cancel_job",
    "check_liveness",
    "create_job",
    "default_mix",
    "get_job",
    "list_jobs",
    "live_workers",
    "parse_params",
    "run_job",
]

ACTIVE = (JobStatus.queued, JobStatus.running)
#: Characters of log kept in the row: the newest lines (the full log is in the job's log file).
LOG_LIMIT = 20_000
#: Progress is written at most this often (plus at every milestone).
PROGRESS_INTERVAL_S = 1.0
#: A worker writes its heartbeat (and its job's) this often (modelling.worker) ...
HEARTBEAT_INTERVAL = dt.timedelta(seconds=5)
#: ... and a job or worker whose heartbeat is older than this is gone: a worker blocked this long
#: in one database write would be one too.
HEARTBEAT_STALE = dt.timedelta(seconds=60)
# Never passed on to a job's process: a promote job takes its server's token from the registry.
ADMIN_TOKEN_ENV = "DYNALOOP_MODEL_SERVER_ADMIN_TOKEN"
DATA_ROOT_ENV = "DYNALOOP_DATA_ROOT"
#: The worker that started a job's process names itself here (modelling.worker).
WORKER_NAME_ENV = "DYNALOOP_JOB_WORKER_NAME"
MAX_ID = 2**31 - 1  # ids are INTEGER columns (api.deps.MAX_ID)
OWN_LOGGERS = ("round_builder", "modelling", "model_server", "model_directory", "services", "api", "dynaloop")


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


def _model_of(session: Session, task: Task, model_id: int) -> ModelVersion:
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
    elif isinstance(parsed, EvaluateParams):
        _model_of(session, task, parsed.model_id)
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
    elif isinstance(parsed, PromoteParams):
        model = _model_of(session, task, parsed.model_id)
        # Without a server the promotion reaches the replicas that follow the task (modelling.replicas).
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
        # Checked again when the job runs (modelling.registry.promote): the promoted model may change.
        check_not_worse(session, task, model, parsed.confirm_worse)
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


# --- running ----------------------------------------------------------------------------


class StopRequest:
    """SIGTERM in a job process: stop the job, but never in the middle of a database call.

    A signal handler that raises runs between two bytecodes of whatever the process is doing; if
    that is a write to the job's row, the connection is left mid-statement and the cleanup then
    fails with a driver error ("connection in transaction status ACTIVE" on PostgreSQL), which
    would hide the interruption. So the job's own writes run inside :meth:`deferred`: a signal
    that arrives there is remembered and raised as :class:`SystemExit` when the write is done.
    Anywhere else (training, evaluating) it is raised at once. Once a stop was asked for, the
    job's failure message says so whatever exception the stop turned into."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._depth = 0
        self._raised = False

    def handle(self, signum: int, frame: object) -> None:
        self.signum = signum
        if self._depth == 0:
            self._raise()

    def _raise(self) -> None:
        if not self._raised:
            self._raised = True
            raise SystemExit(f"stopped by signal {self.signum}")

    @contextmanager
    def deferred(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self.signum is not None:
            self._raise()


STOP = StopRequest()
"""The job process's stop request (`dynaloop job run` routes SIGTERM to :meth:`StopRequest.handle`)."""


class JobRunner:
    """Writes a running job's progress, message and log tail, each in a short transaction
    (throttled to one write per :data:`PROGRESS_INTERVAL_S` unless forced)."""

    def __init__(self, factory: sessionmaker[Session], job_id: int, secrets: Sequence[str] = ()) -> None:
        self.factory = factory
        self.job_id = job_id
        self.secrets = [s for s in secrets if s]
        self._lines: list[str] = []
        self._size = 0
        self._last_write = 0.0
        self._progress = 0.0
        self._message = ""
        self._lock = threading.Lock()

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def log(self, line: str) -> None:
        """Add a line (with the time) to the log tail; it is written with the next progress."""
        line = f"{time.strftime('%H:%M:%S')} {self.redact(line.rstrip())}"
        with self._lock:
            self._lines.append(line)
            self._size += len(line) + 1
            while self._size > LOG_LIMIT and len(self._lines) > 1:
                self._size -= len(self._lines.pop(0)) + 1

    def tail(self) -> str:
        with self._lock:
            text = "\n".join(self._lines)
        return text[-LOG_LIMIT:]

    def progress(
        self, fraction: float | None, message: str | None = None, *, force: bool = False, log: bool = True
    ) -> None:
        """Set the progress (0-1; it never goes backwards; None keeps it) and the message, which
        also goes to the log unless ``log`` is false (per-step messages would flood it)."""
        if fraction is not None:
            self._progress = min(max(float(fraction), self._progress), 1.0)
        if message is not None and message != self._message:
            self._message = self.redact(message)
            if log:
                self.log(self._message)
        now = time.monotonic()
        if not force and now - self._last_write < PROGRESS_INTERVAL_S:
            return
        self._last_write = now
        with STOP.deferred(), self.factory.begin() as session:
            session.execute(
                update(Job)
                .where(Job.id == self.job_id, Job.status == JobStatus.running)
                .values(progress=round(self._progress, 4), message=self._message[:2000], log=self.tail())
            )

    def finish(self, status: JobStatus, message: str, result: dict[str, Any] | None = None) -> None:
        message = self.redact(message)
        self.log(message)
        values: dict[str, Any] = {
            "status": status,
            "message": message[:2000],
            "log": self.tail(),
            "finished_at": utcnow(),
            "result": result,
        }
        if status is JobStatus.succeeded:
            values["progress"] = 1.0
        else:
            values["progress"] = round(self._progress, 4)
        with STOP.deferred(), self.factory.begin() as session:
            session.execute(update(Job).where(Job.id == self.job_id).values(**values))


class _LogToJob(logging.Handler):
    def __init__(self, runner: JobRunner) -> None:
        super().__init__(level=logging.INFO)
        self.runner = runner
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        # Our own INFO lines (per-epoch figures); only warnings and errors of the libraries
        # (Accelerate's "saved checkpoint" lines, our own SQL and HTTP calls are noise).
        if record.levelno < logging.WARNING and not record.name.startswith(OWN_LOGGERS):
            return
        try:
            self.runner.log(self.format(record))
        except Exception:  # a log line must never break the job
            self.handleError(record)


@dataclass
class _Context:
    factory: sessionmaker[Session]
    job_id: int
    kind: JobKind
    task_id: int
    task_name: str
    actor_id: int | None
    params: dict[str, Any]
    data_dir: Path
    data_root: Path | None
    runner: JobRunner

    @property
    def data_files(self) -> DataFiles:
        """What the job may read: the params came through the API, so its rule, checked again here."""
        return DataFiles.of(self.data_dir, self.data_root)


def _claim(factory: sessionmaker[Session], job_id: int) -> tuple[JobKind, int, str, int | None, dict[str, Any]]:
    with factory.begin() as session:
        job = session.scalar(select(Job).where(Job.id == job_id).with_for_update())
        if job is None:
            raise missing_job(job_id)
        if job.status is not JobStatus.queued:
            raise Conflict(f"job {job_id} is {job.status.value}; a job runs once (start a new one)")
        cancelled = job.cancel_requested_at is not None
        if cancelled:
            job.status, job.finished_at = JobStatus.cancelled, utcnow()
            job.message = "cancelled before its process started"
        else:
            job.status = JobStatus.running
            job.started_at = utcnow()
            job.pid = os.getpid()
            job.host = socket.gethostname()
            job.message = "starting"
            claimed = job.kind, job.task_id, job.task.name, job.created_by_id, dict(job.params or {})
    if cancelled:
        raise Conflict(f"job {job_id} was cancelled before it started")
    return claimed


def _cancel_request(factory: sessionmaker[Session], job_id: int) -> str | None:
    """The message of a job whose stop was a cancel request; None when nobody asked to cancel it."""
    with STOP.deferred(), factory() as session:
        job = session.get(Job, job_id)
        if job is None or job.cancel_requested_at is None:
            return None
        by = session.get(User, job.cancel_requested_by_id) if job.cancel_requested_by_id else None
        return f"cancelled by {by.username if by else 'an operator'} while it ran"


def _failure_message(exc: BaseException) -> str:
    from model_directory import ModelMetadataError
    from modelling.errors import EvaluationError, TrainingError

    if STOP.signum == signal.SIGHUP:  # `dynaloop job run` gets it when its worker dies
        worker = os.environ.get(WORKER_NAME_ENV) or "its worker"
        return f"the job was interrupted: {worker}, the worker that ran it, stopped or died; start it again"
    if isinstance(exc, KeyboardInterrupt | SystemExit) or STOP.signum is not None:
        # after a stop, whatever the stop turned into (a driver error mid-statement) is the stop
        return "the job was interrupted (its process was stopped); start it again"
    if isinstance(exc, DomainError):
        return exc.message
    if isinstance(exc, DataError | TrainingError | EvaluationError | ModelMetadataError):
        return str(exc)
    if isinstance(exc, ValidationError):
        return "; ".join(validation_problems(exc.errors(), "params"))
    if isinstance(exc, MissingExtra):  # the worker's install lacks the extra the job needs: it names it
        return f"this worker cannot run the job: {exc}"
    return f"unexpected {type(exc).__name__}: {exc}"


def run_job(factory: sessionmaker[Session], job_id: int, *, data_dir: Path, data_root: Path | None = None) -> Job:
    """Run queued job ``job_id`` in this process and return the finished row.

    The job's params came through the API, so they are held to its rule again before any file is
    read (defence in depth: a row written by other means, a data root changed since): the mix
    reads the task's uploads and files under ``data_root`` only, ``base`` is a folder under it.

    Failures are recorded on the job (status *failed*, a message that says what happened, the
    traceback in the log for unexpected errors), not raised; only a job that does not exist or
    is not queued raises (:class:`NotFound`, :class:`Conflict`)."""
    kind, task_id, task_name, actor_id, params = _claim(factory, job_id)
    runner = JobRunner(factory, job_id)
    context = _Context(factory, job_id, kind, task_id, task_name, actor_id, params, Path(data_dir), data_root, runner)
    handler = _LogToJob(runner)
    root, ours = logging.getLogger(), logging.getLogger("modelling")
    saved_level = ours.level
    root.addHandler(handler)
    if ours.getEffectiveLevel() > logging.INFO:
        ours.setLevel(logging.INFO)  # the trainer's per-epoch lines belong in the job's log
    try:
        runner.progress(0.0, f"{kind.value} job for task {task_name} started (pid {os.getpid()})", force=True)
        if kind is JobKind.train:
            result = _train(context)
        elif kind is JobKind.evaluate:
            result = _evaluate(context)
        else:
            result = _promote(context)
        runner.finish(JobStatus.succeeded, result.pop("message"), result)
    except BaseException as exc:
        message = _failure_message(exc)
        status = JobStatus.failed
        if not isinstance(exc, DomainError | DataError | ValidationError | KeyboardInterrupt | SystemExit):
            runner.log(traceback.format_exc())
        try:
            if STOP.signum is not None:
                cancelled = _cancel_request(factory, job_id)
                if cancelled is not None:
                    status, message = JobStatus.cancelled, cancelled
            runner.finish(status, message)
        except Exception:  # the database is gone too: the next read sees the dead process
            logger.exception("could not record the failure of job %s", job_id)
        logger.error("job %s failed: %s", job_id, runner.redact(message))
        if isinstance(exc, KeyboardInterrupt | SystemExit) or STOP.signum is not None:
            raise
    finally:
        root.removeHandler(handler)
        ours.setLevel(saved_level)
    with factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        session.expunge(job)
        return job


class _TrainingProgress(TrainingListener):
    """A training run's milestones on the job's progress bar: loading 0-0.03, the optimizer steps
    0.03-0.95, registering the rest."""

    SHARE = (0.03, 0.95)

    def __init__(self, runner: JobRunner, epochs: int) -> None:
        self.runner = runner
        self.epochs = epochs

    def data_loaded(self, train_sets: Sequence[LabelledSet], dev: LabelledSet | None) -> None:
        rows = sum(len(s) for s in train_sets)
        self.runner.progress(
            0.02,
            f"loaded {rows:,} training rows from {len(train_sets)} source(s)"
            + (f"; dev {dev.name} has {len(dev):,} rows" if dev is not None else "; no dev set"),
            force=True,
        )

    def step(self, step: int, total: int) -> None:
        start, end = self.SHARE
        self.runner.progress(
            start + (end - start) * step / max(total, 1), f"training: step {step:,} of {total:,}", log=False
        )

    def epoch_ended(self, record: EpochRecord) -> None:
        dev_text = "" if record.dev_macro_f1 is None else f", dev macro-F1 {record.dev_macro_f1:.4f}"
        # The trainer logs the same line with its throughput.
        self.runner.progress(
            None,
            f"epoch {record.epoch}/{self.epochs}: train loss {record.train_loss:.4f}{dev_text}",
            force=True,
            log=False,
        )

    def trained(self, result: TrainResult) -> None:
        self.runner.progress(
            0.97, f"trained {result.metadata.model_id} version {result.metadata.version}; registering it", force=True
        )


def _train(context: _Context) -> dict[str, Any]:
    params = TrainParams.model_validate(context.params)
    with context.factory() as session:  # the task's training defaults, so the progress counts its epochs
        params = params.with_task_defaults(definition_of(get_task(session, context.task_name)).training)
    if params.base is not None:
        params.base = str(base_folder(params.base, context.data_root))
    out_dir = context.data_dir / "models" / f"{context.task_name}-job-{context.job_id}"
    trained = train_and_register(
        context.factory,
        context.task_name,
        params,
        out_dir,
        data_files=context.data_files,
        actor_id=context.actor_id,
        unnamed_model_id=f"{context.task_name}-job-{context.job_id}",
        listener=_TrainingProgress(context.runner, params.epochs or 0),
    )
    assert trained.model is not None  # a job trains in one process, which registers the model
    result, summary = trained.training, trained.model
    best = result.best_dev_macro_f1
    same = "" if trained.same_weights_as is None else f"; the same weights as {trained.same_weights_as}"
    return {
        "message": f"trained and registered {summary.name} (registry id {summary.id}): "
        f"{result.epochs_run} epoch(s), best epoch {result.best_epoch}"
        + ("" if best is None else f", dev macro-F1 {best:.4f}")
        + same,
        "model": summary.to_dict(),
        "same_weights_as": trained.same_weights_as,
        "out_dir": str(out_dir),
        "epochs_run": result.epochs_run,
        "best_epoch": result.best_epoch,
        "best_dev_macro_f1": best,
        "best_dev_f1_per_class": result.best_dev_f1_per_class,
        "stopped_early": result.stopped_early,
        "examples_per_second": round(result.examples_per_second, 2),
        "tokenizer_coverage": None if result.tokenizer_coverage is None else result.tokenizer_coverage.to_dict(),
        "unknown_token_warning": result.unknown_token_warning,
        "low_f1_warning": result.low_f1_warning,
    }


class _EvaluationProgress(EvaluationListener):
    def __init__(self, runner: JobRunner, model_name: str) -> None:
        self.runner = runner
        self.model_name = model_name

    def skipped(self, name: str) -> None:
        self.runner.log(f"skipped {name}: it has no labelled examples")

    def evaluating(self, sets: Sequence[LabelledSet]) -> None:
        self.runner.progress(
            0.1, f"evaluating {self.model_name} on {len(sets)} set(s): " + ", ".join(s.name for s in sets), force=True
        )

    def recording(self) -> None:
        self.runner.progress(0.9, "recording the evaluation in the registry", force=True)


def _evaluate(context: _Context) -> dict[str, Any]:
    from modelling.registry import jsonable

    params = EvaluateParams.model_validate(context.params)
    with context.factory() as session:
        task = session.get(Task, context.task_id)
        assert task is not None
        model = _model_of(session, task, params.model_id)
        directory, unrecorded = Path(model.directory), RegisteredModel.of(model)
    out_dir = context.data_dir / "evaluations" / f"{context.task_name}-job-{context.job_id}"
    evaluated = evaluate_and_record(
        context.factory,
        context.task_name,
        directory,
        params,
        out_dir,
        data_files=context.data_files,
        actor_id=context.actor_id,
        listener=_EvaluationProgress(context.runner, unrecorded.name),
    )
    summary = evaluated.model or unrecorded
    evaluation = evaluated.evaluation
    sets = [
        {
            "name": m.name,
            "rows": m.rows,
            "macro_f1": m.macro_f1,
            "accuracy": m.accuracy,
            "human_f1": m.human_f1,
            "solved": m.solved,
        }
        for m in evaluation.sets
    ]
    headline = ", ".join(f"{m.name} {100 * m.macro_f1:.1f}" for m in evaluation.sets)
    return {
        "message": f"evaluated {summary.name}: macro-F1 (%) {headline}",
        "model": summary.to_dict(),
        "sets": jsonable(sets),
        "out_dir": str(out_dir),
    }


def _promote(context: _Context) -> dict[str, Any]:
    """Hot-swap the named server; or, without one, record the promotion and wait for the replicas
    that follow the task. A replica that failed to load the model, or did not within timeout_s,
    fails the job (PromotionIncomplete's message names each replica; the registry keeps the
    promotion)."""
    params = PromoteParams.model_validate(context.params)
    if params.server is not None:
        with context.factory() as session:
            server = find_server(session, params.server)
            if server is not None and server.admin_token:
                context.runner.secrets.append(server.admin_token)  # never in the log, whatever happens
        context.runner.progress(0.1, f"asking model server {params.server} to load model {params.model_id}", force=True)
    else:
        context.runner.progress(
            0.1,
            f"promoting model {params.model_id}; waiting up to {params.timeout_s:g} s for the replicas that "
            "follow the task to load it",
            force=True,
        )
    promotion = promote_model(context.factory, context.task_name, params.model_id, params, actor_id=context.actor_id)
    summary = RegisteredModel.of(promotion.model)
    retired = [m.name for m in promotion.retired]
    if promotion.rollout is not None:
        message = f"promoted {summary.name}: {promotion.rollout.describe()}"
    else:
        message = f"promoted {summary.name}: model server {promotion.server} ({promotion.endpoint}) now serves it"
    if retired:
        message += f"; retired {', '.join(retired)}"
    if promotion.rounds_updated:
        message += f"; round(s) {', '.join(map(str, promotion.rounds_updated))} now use it"
    return {
        "message": message,
        "model": summary.to_dict(),
        "server": promotion.server,
        "endpoint": promotion.endpoint,
        "retired": retired,
        "rounds_updated": promotion.rounds_updated,
        "replicas": [view.to_dict() for view in promotion.replicas],
    }
