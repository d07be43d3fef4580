"""Engines and sessions. SQLite gets WAL, foreign keys, a busy timeout and BEGIN IMMEDIATE."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InvalidatePoolError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

# A connection execution option: this transaction only reads. On SQLite it begins deferred (a
# WAL reader, beside the one writer) instead of queueing for the write lock; a statement other
# than a SELECT in it is refused. See services.db.transactions.begin_read_only.
READ_ONLY = "dynaloop_read_only"


def ensure_sqlite_folder(url: str) -> None:
    """Make the folder of a SQLite file URL, so a fresh machine needs no manual step."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)


def make_engine(url: str, *, busy_timeout_ms: int = 10_000, **kwargs: Any) -> Engine:
    """Create an engine for ``url``; for SQLite, make the file's folder and set pragmas."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        ensure_sqlite_folder(url)
        # Connections to a SQLite file are cheap. With fewer than the API's handler threads,
        # threads queued for the write lock each hold one and the lock's holder can starve
        # waiting for another (a lazy load after a commit): seen with 50 writers in bench/load.py.
        if parsed.database not in (None, "", ":memory:"):
            kwargs.setdefault("pool_size", 256)
            kwargs.setdefault("max_overflow", 0)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
            **kwargs,
        )
        _configure_sqlite(engine, busy_timeout_ms)
        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    engine = create_engine(url, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        ping_when_idle(engine, PING_AFTER_IDLE_S)
    return engine


# A pooled server connection unused for longer than this is pinged before it is handed out.
PING_AFTER_IDLE_S = 1.0
_LAST_USED = "dynaloop_last_used"


def ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Before a pooled connection is handed out, ping it if it has been idle in the pool for
    more than ``idle_s`` seconds; if the ping finds it gone (the server restarted or dropped it),
    every connection made before now is replaced and the checkout reconnects.

    SQLAlchemy's ``pool_pre_ping`` pings on every checkout: a round trip to the server and about
    90 µs of the API's CPU each time, two or three times a request: about 4% of the API's CPU
    per request on PostgreSQL over the crowd's load mix (docs/benchmarks.md, "API CPU per
    request"). A connection used within the last second is not pinged: if the server went away
    in that second, the request that finds it so fails with 503 (``database_unavailable``,
    Retry-After: dynaloop/api/app.py), nothing half-written, and SQLAlchemy replaces the pool's
    connections as it does on any disconnect. A server that is down for longer than a second
    finds a busy pool's connections failing requests that would fail anyway while it is down,
    and an idle pool's connections pinged (docs/reliability.md)."""
    dialect = engine.dialect

    @event.listens_for(engine, "connect")
    def _connected(_dbapi_connection: Any, record: Any) -> None:
        record.info[_LAST_USED] = time.monotonic()

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info[_LAST_USED] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get(_LAST_USED, 0.0) <= idle_s:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as error:
            if dialect.is_disconnect(error, dbapi_connection, None):
                # What pool_pre_ping does with a failed ping: the pool drops every connection
                # made before now and this checkout reconnects.
                raise InvalidatePoolError(f"a connection idle for over {idle_s:g} s is gone: {error}") from error
            raise


def _configure_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    # One writer at a time, queued here rather than in SQLite. SQLite's busy handler makes a
    # waiting transaction sleep and poll (1, 2, 5, ... 100 ms), so under 40 concurrent request
    # threads the unlucky ones sleep for seconds while others keep winning the lock (measured:
    # p99 3.1 s against 0.16 s with this lock, bench/load.py and docs/benchmarks.md). A plain
    # Lock, not an RLock: a request's transaction may begin in one worker thread and commit in
    # another. Not a first-come-first-served queue either: handing the lock to the oldest waiter
    # made each hand-over wait for that thread to get the GIL, and POST /attempts' median under
    # bench/load.py went from 46 to 84 ms (docs/benchmarks.md, "Load and faults"). Other
    # processes on the same file still meet SQLite's own lock.
    write_lock = threading.Lock()
    timeout_s = busy_timeout_ms / 1000

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        if connection.get_execution_options().get(READ_ONLY):
            # A reader: WAL lets it run beside the writer, on the last committed state.
            connection.exec_driver_sql("BEGIN")
            connection.info[READ_ONLY] = True
            return
        # BEGIN IMMEDIATE takes the write lock up front, so two transactions that read and
        # then write (e.g. two validators racing for an example's last slot) queue on the
        # lock instead of failing with "database is locked" on lock upgrade.
        if not write_lock.acquire(timeout=timeout_s):
            # The same error SQLite gives after its busy timeout (the API answers 503 + Retry-After).
            raise OperationalError(
                "BEGIN IMMEDIATE",
                None,
                sqlite3.OperationalError("database is locked (no transaction slot within the busy timeout)"),
            )
        connection.info["dynaloop_write_lock"] = True
        try:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            _release(connection)
            raise

    @event.listens_for(engine, "before_cursor_execute")
    def _only_reads(connection: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        # A write in a deferred transaction would take SQLite's write lock without queueing on
        # write_lock (and fail if another writer committed since the read began): refuse it.
        if connection.info.get(READ_ONLY) and statement.lstrip()[:6].upper() != "SELECT":
            raise RuntimeError(f"a read-only transaction may only SELECT, not {statement[:40]!r}")

    def _release(connection: Any) -> None:
        connection.info.pop(READ_ONLY, None)
        if connection.info.pop("dynaloop_write_lock", False):
            write_lock.release()

    # SQLAlchemy calls these just before the driver's COMMIT / ROLLBACK (also when a
    # connection with an open transaction is closed or returned to the pool).
    event.listen(engine, "commit", _release)
    event.listen(engine, "rollback", _release)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: handlers read the committed objects after commit without a
    # new transaction (important on SQLite, where a transaction holds the write lock).
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
