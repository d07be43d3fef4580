"""`dynaloop worker`: takes jobs from one queue and runs each in a process of its own.

A worker serves one queue (:class:`~services.db.models.JobQueue`): ``cpu`` (any machine) or
``gpu`` (a machine with a CUDA GPU; the worker refuses to start without one). It takes one job
at a time from the task queue (:mod:`rounds.models.queue`, huey's consumer polling the
application's database) and, for each:

1. *takes* the job's row: only a job still queued and not cancelled, so a message for a job
   that was cancelled, or a message delivered twice, does nothing;
2. starts ``python -m dynaloop.cli job run ID`` (:func:`rounds.models.job_runner.run_job`) with the
   database URL and data folders in its environment (never on its command line), its output
   in ``DATA_DIR/jobs/job-ID.log``; the process dies with its worker (``PR_SET_PDEATHSIG`` on
   Linux, set by `dynaloop job run` itself), so a worker that is stopped or killed never leaves
   a job running unwatched;
3. watches it: every :data:`~rounds.models.jobs.HEARTBEAT_INTERVAL` it writes its heartbeat on
   its own row and the job's, and every second it reads whether somebody asked to cancel the
   job; a cancel sends the process SIGTERM (recorded as *cancelled* by the process itself),
   then SIGKILL after a grace period;
4. settles it: a process that ended without recording a result (killed, out of memory) leaves
   the job *failed* (or *cancelled*) with its exit status in the message.

A worker that dies with its machine writes nothing more; its jobs' heartbeats age, and
:func:`rounds.models.jobs.check_liveness` reports them failed when next read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from rounds.models.jobs import (
    ACTIVE,
    ADMIN_TOKEN_ENV,
    DATA_ROOT_ENV,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_STALE,
    WORKER_NAME_ENV,
    job_log_path,
    process_alive,
)
from rounds.models.queue import job_queue
from services.db.models import Job, JobQueue, JobStatus, JobWorker, utcnow
from services.db.statements import rows_matched
from services.errors import Conflict, Invalid

logger = logging.getLogger(__name__)

__all__ = ["WORKER_PID_ENV", "Worker", "WorkerSettings", "default_worker_name"]

#: `dynaloop job run` reads its worker's pid here, to die with it (dynaloop.commands.job).
WORKER_PID_ENV = "DYNALOOP_JOB_WORKER_PID"


def default_worker_name(queue: JobQueue) -> str:
    return f"{socket.gethostname()}-{queue.value}-{os.getpid()}"[:255]


@dataclass
class WorkerSettings:
    queue: JobQueue
    database_url: str
    data_dir: Path
    data_root: Path | None = None
    name: str = ""
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL.total_seconds()
    #: How often a running job's cancel request is looked for.
    cancel_poll_s: float = 1.0
    #: Between SIGTERM and SIGKILL when a job is cancelled.
    stop_grace_s: float = 30.0
    #: The longest pause between two looks at an empty queue.
    poll_max_delay_s: float = 1.0
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.queue = JobQueue(self.queue)
        self.name = self.name or default_worker_name(self.queue)
        if not 1 <= len(self.name) <= 255 or any(ord(c) < 0x21 or ord(c) == 0x7F for c in self.name):
            raise Invalid("the worker's name must be 1-255 visible characters without spaces")


class Worker:
    def __init__(self, settings: WorkerSettings, factory: sessionmaker[Session]) -> None:
        self.settings = settings
        self.factory = factory
        self.name = settings.name
        self.current_job: int | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    # --- the worker's own row ----------------------------------------------------------------

    def register(self) -> None:
        """Record this worker (a name in use by a live worker elsewhere is refused)."""
        now = utcnow()
        with self.factory.begin() as session:
            row = session.scalar(select(JobWorker).where(JobWorker.name == self.name).with_for_update())
            if row is None:
                session.add(
                    JobWorker(
                        name=self.name,
                        queue=self.settings.queue,
                        host=socket.gethostname(),
                        pid=os.getpid(),
                        started_at=now,
                        heartbeat_at=now,
                    )
                )
                return
            same_machine = row.host == socket.gethostname()
            # A worker restarted under its name (a container's hostname and pid stay the same) is no rival.
            gone = same_machine and (row.pid == os.getpid() or not process_alive(row.pid))
            if row.stopped_at is None and now - row.heartbeat_at < HEARTBEAT_STALE and not gone:
                raise Conflict(
                    f"a worker named {self.name!r} is running on {row.host} (pid {row.pid}); give this one another "
                    "--name"
                )
            row.queue, row.host, row.pid = self.settings.queue, socket.gethostname(), os.getpid()
            row.started_at = row.heartbeat_at = now
            row.stopped_at, row.job_id = None, None

    def _beat(self) -> None:
        now = utcnow()
        with self.factory.begin() as session:
            session.execute(
                update(JobWorker).where(JobWorker.name == self.name).values(heartbeat_at=now, job_id=self.current_job)
            )
            if self.current_job is not None:
                session.execute(
                    update(Job)
                    .where(Job.id == self.current_job, Job.worker == self.name, Job.status.in_(ACTIVE))
                    .values(heartbeat_at=now)
                )

    def _heartbeats(self) -> None:
        while not self._stopping.wait(self.settings.heartbeat_interval_s):
            try:
                self._beat()
            except Exception:  # the database may be away for a moment: the next beat tries again
                logger.exception("worker %s could not write its heartbeat", self.name)

    def deregister(self) -> None:
        with self.factory.begin() as session:
            session.execute(
                update(JobWorker).where(JobWorker.name == self.name).values(stopped_at=utcnow(), job_id=None)
            )

    # --- taking, running, watching and settling a job ----------------------------------------

    def _take(self, job_id: int) -> bool:
        with self.factory.begin() as session:
            return bool(
                rows_matched(
                    session,
                    update(Job)
                    .where(
                        Job.id == job_id,
                        Job.status == JobStatus.queued,
                        Job.worker.is_(None),
                        Job.cancel_requested_at.is_(None),
                    )
                    .values(worker=self.name, heartbeat_at=utcnow(), message=f"taken by worker {self.name}")
                    .execution_options(synchronize_session=False),
                )
            )

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DYNALOOP_DATABASE_URL=self.settings.database_url,
            DYNALOOP_DATA_DIR=str(Path(self.settings.data_dir).resolve()),
            PYTHONUNBUFFERED="1",
        )
        env[WORKER_PID_ENV] = str(os.getpid())
        env[WORKER_NAME_ENV] = self.name
        env.pop(DATA_ROOT_ENV, None)
        if self.settings.data_root is not None:
            env[DATA_ROOT_ENV] = str(Path(self.settings.data_root).resolve())
        env.pop(ADMIN_TOKEN_ENV, None)  # a promote job reads its server's token from the registry
        env.update(self.settings.extra_env)
        return env

    def _start(self, job_id: int, out: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "dynaloop.cli", "job", "run", str(job_id)],
            env=self._environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for the worker does not reach the job
        )

    def _cancel_requested(self, job_id: int) -> bool:
        with self.factory() as session:
            return session.scalar(select(Job.cancel_requested_at).where(Job.id == job_id)) is not None

    def _watch(self, job_id: int, process: subprocess.Popen[bytes]) -> bool:
        """Wait for the job's process; True when it was stopped for a cancel request."""
        cancelled_at: float | None = None
        while True:
            try:
                process.wait(timeout=self.settings.cancel_poll_s)
                return cancelled_at is not None
            except subprocess.TimeoutExpired:
                pass
            if cancelled_at is None:
                try:
                    if self._cancel_requested(job_id):
                        logger.info("job %s: cancel requested; stopping its process %s", job_id, process.pid)
                        process.send_signal(signal.SIGTERM)
                        cancelled_at = time.monotonic()
                except Exception:
                    logger.exception("job %s: could not read its cancel request", job_id)
            elif time.monotonic() - cancelled_at > self.settings.stop_grace_s:
                grace = self.settings.stop_grace_s
                logger.warning("job %s: its process ignored SIGTERM for %ss; killing it", job_id, grace)
                process.kill()

    def _settle(self, job_id: int, returncode: int, cancelled: bool) -> None:
        """A job whose process ended without recording how: failed, or cancelled."""
        how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with status {returncode}"
        log = job_log_path(self.settings.data_dir, job_id)
        if cancelled:
            status, message = JobStatus.cancelled, f"cancelled: its process {how} before it could record the cancel"
        else:
            status, message = (
                JobStatus.failed,
                f"the job's process {how} without recording a result (out of memory, or killed); its output is in "
                f"{log} on worker {self.name}; start the job again",
            )
        with self.factory.begin() as session:
            changed = rows_matched(
                session,
                update(Job)
                .where(Job.id == job_id, Job.status.in_(ACTIVE))
                .values(status=status, message=message, finished_at=utcnow())
                .execution_options(synchronize_session=False),
            )
        if changed:
            logger.warning("job %s: %s", job_id, message)

    def run_job(self, job_id: int) -> None:
        """What a queue message does: take, run, watch and settle job ``job_id``."""
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            logger.error("ignoring a queue message that does not name a job: %r", job_id)
            return
        if not self._take(job_id):
            logger.info("job %s is no longer waiting for a worker (cancelled, or taken); skipped", job_id)
            return
        with self._lock:
            self.current_job = job_id
        try:
            self._beat()
            log_path = job_log_path(self.settings.data_dir, job_id)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with log_path.open("ab") as out:
                    process = self._start(job_id, out)
            except OSError as exc:
                self._settle_start_failure(job_id, exc)
                return
            logger.info("job %s: running in process %s", job_id, process.pid)
            cancelled = self._watch(job_id, process)
            self._settle(job_id, process.returncode, cancelled)
        finally:
            with self._lock:
                self.current_job = None
            with contextlib.suppress(Exception):
                self._beat()

    def _settle_start_failure(self, job_id: int, exc: OSError) -> None:
        with self.factory.begin() as session:
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status.in_(ACTIVE))
                .values(
                    status=JobStatus.failed,
                    message=f"worker {self.name} could not start the job's process: {exc}",
                    finished_at=utcnow(),
                )
            )

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Register, then take jobs until SIGINT (waits for the running job) or SIGTERM (stops it
        now: its process dies with the worker and records the interruption)."""
        self.register()
        beats = threading.Thread(target=self._heartbeats, name="worker-heartbeat", daemon=True)
        beats.start()
        huey = job_queue(self.settings.database_url, self.settings.queue, self.run_job)
        consumer = huey.create_consumer(
            workers=1,
            worker_type="thread",
            periodic=False,
            initial_delay=0.1,
            backoff=1.15,
            max_delay=self.settings.poll_max_delay_s,
            check_worker_health=True,
        )
        logger.info("worker %s takes jobs from the %s queue", self.name, self.settings.queue.value)
        try:
            consumer.run()
        finally:
            self._stopping.set()
            try:
                self.deregister()
            except Exception:
                logger.exception("worker %s could not record that it stopped", self.name)
            huey.storage.close()
