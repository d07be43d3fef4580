"""Running a job: the process that `dynaloop job run ID` starts for a job a worker took.

:func:`run_job` claims the queued row (:mod:`rounds.models.jobs` records and validates it), runs the
use case of its kind (:mod:`rounds.models.usecases`: train and register, evaluate and record,
promote) in this process, and writes its progress, message and the tail of its log to the row in
short transactions (:class:`JobRunner`), so a researcher's page can poll
``GET /api/v1/jobs/{id}``. Every failure is recorded on the row with a message that says what
happened; a stop (SIGTERM from the worker on a cancel, SIGHUP when the worker dies) is taken
between two database writes, never inside one (:class:`StopRequest`).
"""

from __future__ import annotations

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

from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from rounds.models.datasets import DataError, DataFiles
from rounds.models.jobs import WORKER_NAME_ENV, EvaluateParams, PromoteParams, TrainParams, base_folder, model_of
from rounds.models.usecases import (
    EvaluationListener,
    RegisteredModel,
    TrainingListener,
    evaluate_and_record,
    promote_model,
    train_and_register,
)
from services.db.models import Job, JobKind, JobStatus, Task, User, utcnow
from services.domain.model_servers import find_server
from services.domain.tasks import definition_of, get_task
from services.errors import Conflict, DomainError, missing_job, validation_problems
from services.extras import MissingExtra

if TYPE_CHECKING:
    from rounds.models.datasets import LabelledSet
    from rounds.models.train import EpochRecord, TrainResult

logger = logging.getLogger(__name__)

__all__ = ["STOP", "JobRunner", "StopRequest", "run_job"]

#: Characters of log kept in the row: the newest lines (the full log is in the job's log file).
LOG_LIMIT = 20_000
#: Progress is written at most this often (plus at every milestone).
PROGRESS_INTERVAL_S = 1.0
OWN_LOGGERS = ("rounds", "model_server", "services", "dynaloop")


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
    from model_server.directory import ModelMetadataError
    from rounds.models.errors import EvaluationError, TrainingError

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
    root, ours = logging.getLogger(), logging.getLogger("rounds.models")
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
    from rounds.models.registry import jsonable

    params = EvaluateParams.model_validate(context.params)
    with context.factory() as session:
        task = session.get(Task, context.task_id)
        assert task is not None
        model = model_of(session, task, params.model_id)
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
