"""Faults under load: writers and validators keep working through the real API while the model
server is killed, the API is killed, or PostgreSQL drops its connections; afterwards nothing
the clients saw accepted is missing and the invariant checker finds nothing. A read-only or
full SQLite database gives a clear, retryable error and changes nothing.

The load driver is bench/load.py (real processes on loopback, a tiny random model)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

from bench.load import Stack, Tally, drive, fresh_postgres, start_stack, verdict
from services.db.engine import session_scope
from services.domain.invariants import check_database
from services.settings import Settings
from tests.conftest import POSTGRES_URL, Actor, MakeUser, example_yaml, open_round
from tests.stub_model_server import ThreadedServer

pytestmark = pytest.mark.integration


def _assert_nothing_lost(result: dict[str, Any]) -> None:
    assert result["nothing_lost"], result["lost"]
    assert result["invariants"]["ok"], result["invariants"]["violations"]
    assert result["server_errors_500"] == 0, result["endpoints"]
    assert result["gave_up"] == 0


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    running = start_stack(tmp_path / "load", writers=4, validators=3)
    yield running
    running.stop()


def _run(stack: Stack, seconds: float, during: Any) -> dict[str, Any]:
    started = time.monotonic()
    tally = asyncio.run(drive(stack, seconds, max_examples=10_000, during=during))
    return verdict(stack, tally, time.monotonic() - started)


async def _until(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


def test_model_server_killed_during_load(stack: Stack) -> None:
    restarted_at: list[float] = []

    async def kill_and_restart(stack: Stack, tally: Tally) -> None:
        # Timed by what the writers did, not by the clock: on a busy machine the writers may
        # not have reached the model within a fixed few seconds.
        await _until(lambda: tally.statuses["POST /attempts"].get("201", 0) > 0, 20)
        stack.model.kill()
        # Writers meet a dead model server (503 + Retry-After, text kept) for at least 2 s.
        await asyncio.sleep(2)
        await _until(lambda: tally.statuses["POST /attempts"].get("503", 0) > 0, 10)
        await asyncio.to_thread(stack.model.start)
        restarted_at.append(time.monotonic())

    result = _run(stack, 20, kill_and_restart)
    _assert_nothing_lost(result)
    attempts = result["endpoints"]["POST /attempts"]["statuses"]
    assert attempts.get("503", 0) > 0, attempts  # the outage was seen ...
    assert attempts.get("201", 0) > 0 and result["accepted"]["examples"] > 0  # ... and writers recovered
    assert restarted_at


def test_api_killed_and_restarted_during_load(stack: Stack) -> None:
    async def kill_and_restart(stack: Stack, tally: Tally) -> None:
        await _until(lambda: bool(tally.examples_accepted) or bool(tally.validations_accepted), 20)
        await asyncio.sleep(1)
        stack.api.kill()  # SIGKILL: requests in flight are cut off, some after their commit
        await asyncio.sleep(1)
        await asyncio.to_thread(stack.api.start)

    result = _run(stack, 12, kill_and_restart)
    _assert_nothing_lost(result)
    errors = sum(
        n for statuses in result["endpoints"].values() for code, n in statuses["statuses"].items() if not code.isdigit()
    )
    assert errors > 0, result["endpoints"]  # clients did see the API go away, and retried
    assert result["retries"] > 0
    assert result["accepted"]["validations"] > 0 and result["accepted"]["examples"] > 0


@pytest.mark.postgres
@pytest.mark.skipif(not POSTGRES_URL, reason="DYNALOOP_TEST_POSTGRES_URL is not set (.ci/run sets it)")
def test_postgres_connections_dropped_during_load(tmp_path: Path) -> None:
    assert POSTGRES_URL is not None
    url = fresh_postgres(POSTGRES_URL)
    name = make_url(url).database
    running = start_stack(tmp_path / "load", writers=4, validators=3, database_url=url)
    dropped: list[int] = []

    async def drop_connections(stack: Stack, tally: Tally) -> None:
        admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
        try:
            for _ in range(3):
                await asyncio.sleep(2.5)
                with admin.connect() as connection:
                    dropped.append(
                        len(
                            connection.execute(
                                text(
                                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                                ),
                                {"name": name},
                            ).all()
                        )
                    )
        finally:
            admin.dispose()

    try:
        result = _run(running, 10, drop_connections)
    finally:
        running.stop()
        admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"), {"n": name}
            )
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
    assert sum(dropped) > 0  # connections really were cut
    _assert_nothing_lost(result)
    assert result["accepted"]["examples"] > 0 and result["accepted"]["validations"] > 0


# --- a database that cannot be written ---------------------------------------------------------


def _writer_setup(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> tuple[Any, int]:
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        stub_model.url,
        ["The cafe on the corner serves lunch."],
    )
    writer = make_user("wanda", "writer")
    assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()
    return writer, assignment["id"]


def _attempts(app: Any) -> int:
    with app.state.engine.connect() as connection:
        # Scored attempts that used a try; an attempt whose scoring could not be saved stays
        # pending (no try used) and is resumed by a retry with the same Idempotency-Key.
        return int(
            connection.execute(
                text("SELECT COUNT(*) FROM attempts WHERE status = 'scored' AND counts_as_try")
            ).scalar_one()
        )


def test_full_sqlite_database_gives_a_clear_retryable_error(
    client, app, researcher, make_user, stub_model, database_url
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite only: PostgreSQL reports a full disk the same way (OperationalError -> 503)")
    writer, assignment_id = _writer_setup(client, researcher, make_user, stub_model)
    before = _attempts(app)
    app.state.engine.dispose()
    raw = app.state.engine.raw_connection()
    try:  # earlier tests left free pages that inserts would reuse: drop them
        raw.cursor().execute("VACUUM")
    finally:
        raw.close()
    app.state.engine.dispose()

    @event.listens_for(app.state.engine, "connect")
    def _full(dbapi_connection, _record) -> None:
        # No page may be added: SQLite answers SQLITE_FULL, "database or disk is full".
        cursor = dbapi_connection.cursor()
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")
        cursor.close()

    try:
        texts = [f"The cafe on the corner serves lunch {'and dinner ' * 25}{i}." for i in range(10)]
        responses = [
            client.post(f"/api/v1/assignments/{assignment_id}/attempts", json={"text": t}, headers=writer.headers)
            for t in texts
        ]
    finally:
        event.remove(app.state.engine, "connect", _full)
        app.state.engine.dispose()
    full = [r for r in responses if r.status_code == 503]
    assert full, [r.status_code for r in responses]
    body = full[0].json()["error"]
    assert body["code"] == "database_unavailable" and "full" in body["message"], body
    assert full[0].headers["Retry-After"]
    after = _attempts(app)
    assert after == before + (len(responses) - len(full))
    with session_scope(app.state.sessionmaker) as session:
        report = check_database(session)
    assert report.ok, report.to_dict()


def test_read_only_sqlite_database_gives_a_clear_error(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from dynaloop.api.app import create_app
    from services.db.migrate import upgrade

    path = tmp_path / "ro.db"
    upgrade(f"sqlite:///{path}")
    read_only = f"sqlite:///file:{path}?mode=ro&uri=true"
    app = create_app(Settings(database_url=read_only, data_dir=tmp_path))
    with TestClient(app) as client:
        response = client.post("/api/v1/auth/login", json={"username": "nobody", "password": "wrong-password"})
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "database_unavailable" and "readonly" in error["message"].replace("-", ""), error
    assert "nothing was saved" in error["message"]
    assert os.path.getsize(path) > 0


def test_fifty_writers_at_once_on_sqlite_are_all_served(tmp_path: Path) -> None:
    """50 writers asking for an assignment in the same instant. Before the in-process write
    queue and the spare handler threads, 13 of them stalled for the whole busy timeout and got
    503 (every handler thread waited for SQLite's lock; its holder needed a thread to finish)."""
    import httpx

    running = start_stack(tmp_path / "load", writers=50, validators=0, model_kind="stub")

    async def everyone_at_once() -> list[int]:
        async with httpx.AsyncClient(base_url=running.api.url, timeout=60) as http:

            async def one(token: str) -> int:
                response = await http.post(
                    f"/api/v1/rounds/{running.round_id}/assignments",
                    json={},
                    headers={"Authorization": f"Bearer {token}"},
                )
                return response.status_code

            return await asyncio.gather(*[one(token) for token in running.writer_tokens])

    try:
        statuses = asyncio.run(everyone_at_once())
    finally:
        running.stop()
    assert statuses == [201] * 50
