"""The task queue that carries a job to a worker: huey, with its SQL storage in our own database.

Why huey (docs/deploy.md, "Jobs and workers", compares it with procrastinate and rq): its SQL
storage (through peewee) runs on SQLite and on PostgreSQL alike, so the embedded default
(`dynaloop demo`, one SQLite file) needs no extra server and the scaled deployment's workers on
other machines take jobs from the PostgreSQL the stack already has (``FOR UPDATE SKIP LOCKED``:
two workers never take the same message).

What goes through the queue is only a job's id, on the queue of the machines that may run it
(:class:`~services.db.models.JobQueue`: ``cpu`` or ``gpu``). Everything a researcher sees
(status, progress, log tail, result, cancel requests, heartbeats) stays on the ``jobs`` row
(rounds.models.jobs). Two choices of ours on top of huey:

* The message is written by :func:`enqueue` through the API's own SQLAlchemy session, in the
  same transaction as the job's row, so a job is never recorded without its message or the
  reverse (huey's own ``enqueue`` would write through a connection of its own).
* Messages are JSON (:class:`JsonSerializer`), not huey's default pickle: a worker never
  unpickles what it reads from a database.

The queue's tables are created by Alembic (migration 0013, ``queue_messages``,
``queue_schedule``, ``queue_results``), not by huey.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from huey import Huey
from huey.contrib.sql_huey import SqlStorage
from huey.registry import Message
from huey.serializer import Serializer
from peewee import (
    AutoField,
    BigIntegerField,
    BlobField,
    CharField,
    CompositeKey,
    Database,
    FloatField,
    Model,
    PostgresqlDatabase,
    SqliteDatabase,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from services.db.models import JobQueue, QueueMessage

__all__ = ["RUN_JOB", "JobQueueStorage", "JsonSerializer", "enqueue", "job_queue", "peewee_database", "queue_name"]

#: The one kind of message: "run job ID".
RUN_JOB = "dynaloop.run_job"
#: How long a worker's connection waits for SQLite's write lock (the API writes to the same file).
SQLITE_BUSY_TIMEOUT_S = 30


def queue_name(queue: JobQueue | str) -> str:
    return f"dynaloop-{JobQueue(queue).value}"


class _Bytes(BlobField):
    def python_value(self, value: Any) -> bytes:
        return value if isinstance(value, bytes) else bytes(value)


class JobQueueStorage(SqlStorage):
    """huey's SQL storage on our tables (created by Alembic, so never by huey)."""

    def create_models(self) -> tuple[type[Model], type[Model], type[Model]]:
        class Base(Model):
            class Meta:
                database = self.database

        class KV(Base):
            queue = CharField()
            key = CharField()
            value = _Bytes()

            class Meta:
                table_name = "queue_results"
                primary_key = CompositeKey("queue", "key")

        class Schedule(Base):
            id = AutoField()
            queue = CharField()
            data = _Bytes()
            timestamp = BigIntegerField()

            class Meta:
                table_name = "queue_schedule"

        class Task(Base):
            id = AutoField()
            queue = CharField()
            data = _Bytes()
            priority = FloatField(default=0.0)

            class Meta:
                table_name = "queue_messages"

        return KV, Schedule, Task

    def create_tables(self) -> None:
        """Alembic's job (migration 0013)."""

    def drop_tables(self) -> None:
        raise NotImplementedError("the queue's tables belong to Alembic's migrations")


class JsonSerializer(Serializer):
    """huey messages as JSON: the job's id and nothing a worker would have to unpickle."""

    def _serialize(self, data: Any) -> bytes:
        if isinstance(data, Message):
            return json.dumps({"message": list(data)}, separators=(",", ":")).encode()
        return json.dumps({"value": data}, separators=(",", ":")).encode()

    def _deserialize(self, data: bytes) -> Any:
        decoded = json.loads(bytes(data).decode())
        if "message" in decoded:
            fields = decoded["message"]
            if not isinstance(fields, list) or len(fields) != len(Message._fields):
                raise ValueError("not a queue message")
            return Message(*fields)
        return decoded["value"]


def peewee_database(database_url: str) -> Database:
    """The application's database (an SQLAlchemy URL) as peewee, which huey's SQL storage uses."""
    url = make_url(database_url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise ValueError("the job queue needs a database file or server, not an in-memory SQLite database")
        return SqliteDatabase(
            url.database,
            timeout=SQLITE_BUSY_TIMEOUT_S,
            pragmas={"journal_mode": "wal", "busy_timeout": SQLITE_BUSY_TIMEOUT_S * 1000},
        )
    if backend == "postgresql":
        options: dict[str, Any] = {key: value for key, value in url.query.items() if isinstance(value, str)}
        return PostgresqlDatabase(
            url.database,
            user=url.username,
            password=url.password,
            host=url.host,
            port=url.port,
            **options,
        )
    raise ValueError(f"the job queue runs on SQLite or PostgreSQL, not {backend}")


def _not_here(job_id: int) -> None:
    raise RuntimeError(f"job {job_id} reached a process that only queues jobs; run `dynaloop worker`")


def job_queue(database_url: str, queue: JobQueue | str, run_job: Callable[[int], None] | None = None) -> Huey:
    """The huey instance of ``queue`` on the application's database; ``run_job`` (a worker's)
    is what a message does. Creating it opens no connection."""
    huey = Huey(
        name=queue_name(queue),
        results=False,  # the job's row holds its result
        utc=True,
        serializer=JsonSerializer(),
        storage_class=JobQueueStorage,
        database=peewee_database(database_url),
    )
    handler = run_job or _not_here

    def run_job_message(job_id: int) -> None:  # defined here: huey names a task after its function's module
        handler(job_id)

    # One attempt: a job that failed says why on its row, and the researcher starts it again.
    huey.task(name=RUN_JOB, retries=0)(run_job_message)
    return huey


def enqueue(session: Session, queue: JobQueue, job_id: int) -> None:
    """Queue "run job ``job_id``" on ``queue`` in ``session``'s transaction (committed with the
    job's row). The message is built by huey itself, so a worker reads it like any other."""
    builder = _MESSAGE_BUILDERS.get(queue)
    if builder is None:
        # immediate: an in-memory huey that only builds messages (it never stores or runs one)
        huey = Huey(name=queue_name(queue), results=False, utc=True, serializer=JsonSerializer(), immediate=True)
        builder = _MESSAGE_BUILDERS[queue] = (huey, huey.task(name=RUN_JOB, retries=0)(_not_here))
    huey, run_job = builder
    message = huey.serialize_task(run_job.s(job_id))
    session.add(QueueMessage(queue=queue_name(queue), data=message, priority=0.0))


_MESSAGE_BUILDERS: dict[JobQueue, tuple[Huey, Any]] = {}
