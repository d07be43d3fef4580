"""The PostgreSQL engine's pool pings a connection only when it has been idle (services/db/engine.py,
``ping_when_idle``): a connection that died while idle is replaced without an error, one used a
moment ago is handed out unpinged, and if it died the request that finds it fails once and the
pool is renewed. The server side of each connection is ended with ``pg_terminate_backend``, as a
server restart or a dropped connection would end it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import OperationalError

from services.db import engine as engine_module
from services.db.engine import make_engine
from tests.conftest import POSTGRES_URL, fresh_postgres_database

pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="DYNALOOP_TEST_POSTGRES_URL is not set (.ci/run sets it)")


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_postgres_database() as url:
        yield url


def _end_every_connection(url: str) -> int:
    """End every server connection to ``url``'s database but the caller's; how many were ended."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            return len(
                connection.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).all()
            )
    finally:
        admin.dispose()


def _pings(engine: Engine) -> list[str]:
    statements: list[str] = []
    # The ping runs on the driver's connection, not through SQLAlchemy: count it at the driver.
    real = engine.dialect.do_ping

    def counted(dbapi_connection: object) -> bool:
        statements.append("ping")
        return real(dbapi_connection)

    engine.dialect.do_ping = counted  # type: ignore[method-assign]
    return statements


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_busy_connection_is_not_pinged_and_an_idle_one_is(database: str) -> None:
    engine = make_engine(database, pool_size=1, max_overflow=0)
    try:
        assert not engine.pool._pre_ping  # type: ignore[attr-defined]
        pings = _pings(engine)
        first = _backend_pid(engine)
        for _ in range(5):  # checked out again at once: no ping, the same connection
            assert _backend_pid(engine) == first
        assert pings == []
        time.sleep(engine_module.PING_AFTER_IDLE_S + 0.1)
        assert _backend_pid(engine) == first
        assert pings == ["ping"]
    finally:
        engine.dispose()


def test_a_connection_that_died_while_idle_is_replaced_without_an_error(database: str) -> None:
    engine = make_engine(database, pool_size=2, max_overflow=0)
    try:
        before = _backend_pid(engine)
        assert _end_every_connection(database) >= 1
        time.sleep(engine_module.PING_AFTER_IDLE_S + 0.1)
        assert _backend_pid(engine) != before  # pinged, found gone, reconnected: no error
    finally:
        engine.dispose()


def test_a_connection_that_died_a_moment_after_use_fails_once_then_the_pool_is_renewed(database: str) -> None:
    engine = make_engine(database, pool_size=2, max_overflow=0)
    reconnects: list[object] = []
    event.listen(engine, "connect", lambda *_: reconnects.append(1))
    try:
        before = _backend_pid(engine)
        reconnects.clear()
        _end_every_connection(database)
        with pytest.raises(OperationalError) as failed:
            _backend_pid(engine)  # used a moment ago: not pinged, and its first statement fails
        assert failed.value.connection_invalidated
        after = _backend_pid(engine)
        assert after != before
        assert reconnects == [1]
    finally:
        engine.dispose()
