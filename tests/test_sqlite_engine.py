"""The SQLite engine's in-process write queue: every transaction gets the lock in turn, and
it is given back on commit, on rollback, on a failed BEGIN and across threads."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from services.db.engine import make_engine


def _engine(tmp_path: Path, **kwargs):
    engine = make_engine(f"sqlite:///{tmp_path / 'lock.db'}", busy_timeout_ms=2000, **kwargs)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (x INTEGER)"))
    return engine


def test_concurrent_writers_all_commit(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(10):
                with engine.begin() as connection:
                    connection.execute(text("INSERT INTO t VALUES (:x)"), {"x": n * 100 + i})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    with engine.connect() as connection:
        assert connection.execute(text("SELECT COUNT(DISTINCT x) FROM t")).scalar_one() == 300


def test_lock_is_given_back_on_rollback_and_on_error(tmp_path: Path) -> None:
    engine = _engine(tmp_path)

    def insert_then_fail() -> None:
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO t VALUES (1)"))
            raise RuntimeError("an error inside the transaction")

    with pytest.raises(RuntimeError, match="an error inside the transaction"):
        insert_then_fail()
    connection = engine.connect()
    connection.execute(text("INSERT INTO t VALUES (2)"))
    connection.close()  # closed with its transaction open: rolled back, lock released
    with engine.begin() as connection:
        connection.execute(text("INSERT INTO t VALUES (3)"))
    with engine.connect() as connection:
        assert connection.execute(text("SELECT x FROM t")).scalars().all() == [3]


def test_a_transaction_may_end_in_another_thread(tmp_path: Path) -> None:
    # FastAPI runs a sync dependency's setup and teardown in different worker threads.
    engine = _engine(tmp_path)
    connection = engine.connect()
    connection.execute(text("INSERT INTO t VALUES (1)"))
    finisher = threading.Thread(target=lambda: (connection.commit(), connection.close()))
    finisher.start()
    finisher.join()
    with engine.begin() as other:
        other.execute(text("INSERT INTO t VALUES (2)"))
    with engine.connect() as check:
        assert check.execute(text("SELECT COUNT(*) FROM t")).scalar_one() == 2


def test_a_held_lock_times_out_with_a_clear_error(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    holder = engine.connect()
    holder.execute(text("INSERT INTO t VALUES (1)"))
    outcome: list[BaseException] = []

    def second() -> None:
        try:
            with engine.begin() as connection:
                connection.execute(text("INSERT INTO t VALUES (2)"))
        except OperationalError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(timeout=10)
    holder.rollback()
    holder.close()
    assert outcome and "database is locked" in str(outcome[0])
    with engine.begin() as connection:  # and the queue works again afterwards
        connection.execute(text("INSERT INTO t VALUES (3)"))
