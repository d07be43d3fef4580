"""The SQL statements of the crowd's requests stay few (issue 31; docs/benchmarks.md, "API CPU").

Each statement costs the API process about 0.2 ms of CPU on these machines (the ORM's work, not
the database's), and the crowd's requests are most of the load: a writer's check of a text, a
label, a batch. No timings here: the statements each request runs are counted and held to what
they were when the API's CPU per request was cut (every further statement on these paths is a
cost to every request of the crowd; raise a bound only with a reason in the commit).

Runs on SQLite always and on PostgreSQL when DYNALOOP_TEST_POSTGRES_URL is set (SQLite counts a
``BEGIN`` per transaction, which psycopg sends without a statement of its own).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio.to_thread
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import event

from tests.conftest import Actor, MakeUser, example_yaml, open_round
from tests.stub_model_server import ThreadedServer

pytestmark = [pytest.mark.both_databases, pytest.mark.timeout(300)]

PROMPTS = [f"Prompt {i}: the soup was fine and the bread was fresh." for i in range(12)]

# The most statements each request may run (SQLite's count, which is the larger).
BOUNDS = {
    "GET /me": 2,
    "POST /assignments": 15,
    "POST /attempts": 13,
    "POST /confirmation": 5,
    "POST /example": 13,
    # A new batch: its fixed part (with the control-item pick, which the task's control rate
    # asks for in some batches, at random), then an INSERT of each item and of each example's
    # claim (one statement per row: the ORM needs each new row's id back); checked per item below.
    "GET /validation-batch": 14,
    "POST /validations": 12,
}


@contextmanager
def counted(app: FastAPI) -> Iterator[list[str]]:
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(app.state.engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(app.state.engine, "before_cursor_execute", count)


@contextmanager
def orm_writes(app: FastAPI) -> Iterator[list[str]]:
    """The UPDATE, DELETE and INSERT statements sent through the ORM's bulk machinery
    (``session.execute(update(Entity)...)``) while the block runs; the unit of work's own flush
    is not among them. Written against the entity's table, the same statement costs a third of
    the CPU (services/db/statements.py)."""
    writes: list[str] = []

    def seen(state: Any) -> None:
        if state.is_orm_statement and (state.is_update or state.is_delete or state.is_insert):
            writes.append(" ".join(str(state.statement).split())[:120])

    event.listen(app.state.sessionmaker, "do_orm_execute", seen)
    try:
        yield writes
    finally:
        event.remove(app.state.sessionmaker, "do_orm_execute", seen)


@contextmanager
def hops_counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The worker-thread hops made while the block runs: every ``anyio.to_thread.run_sync``
    (FastAPI's and Starlette's ``run_in_threadpool`` and the API's own), by the function sent."""
    hops: list[str] = []
    run_sync = anyio.to_thread.run_sync

    async def counting(function: Any, *args: Any, **kwargs: Any) -> Any:
        # FastAPI sends functools.partial objects, a sync endpoint as their ``function``.
        called = getattr(function, "keywords", {}).get("function") or getattr(function, "func", function)
        if not getattr(called, "__module__", "").startswith("tests."):  # the stub model server's own
            hops.append(getattr(called, "__qualname__", repr(called)))
        return await run_sync(function, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(anyio.to_thread, "run_sync", counting)
        yield hops


def test_the_crowds_requests_run_few_statements_in_two_worker_thread_hops(
    app: FastAPI,
    client: TestClient,
    researcher: Actor,
    make_user: MakeUser,
    stub_model: ThreadedServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)
    seen: dict[str, list[int]] = {}
    hopped: dict[str, list[list[str]]] = {}

    def call(name: str, actor: Actor, method: str, path: str, body: Any = None, **headers: str) -> Any:
        with counted(app) as statements, hops_counted(monkeypatch) as hops, orm_writes(app) as writes:
            response = client.request(method, f"/api/v1{path}", json=body, headers={**actor.headers, **headers})
        assert response.status_code in (200, 201), (name, response.text)
        assert not writes, f"{name} wrote through the ORM's bulk statements, not Core: {writes}"
        seen.setdefault(name, []).append(len(statements))
        hopped.setdefault(name, []).append(hops)
        return response.json()

    writers = [make_user(f"w{i}", "writer") for i in range(3)]
    for i, writer in enumerate(writers):
        call("GET /me", writer, "GET", "/me")
        assignment = call("POST /assignments", writer, "POST", f"/rounds/{round_['id']}/assignments", {})
        target = assignment["target_label"][0]
        fooling = {"positive": "terrible", "negative": "great", "neutral": "great"}[target]
        path = f"/assignments/{assignment['id']}/attempts"
        call(
            "POST /attempts",
            writer,
            "POST",
            path,
            {"text": f"{assignment['prompt']['text']} Fine."},
            **{"Idempotency-Key": f"a{i}"},
        )
        attempt = call(
            "POST /attempts",
            writer,
            "POST",
            path,
            {"text": f"Honestly {fooling} stuff {i}"},
            **{"Idempotency-Key": f"b{i}"},
        )
        assert attempt["fooled"], attempt
        call("POST /confirmation", writer, "POST", f"/attempts/{attempt['id']}/confirmation", {"agrees": True})
        call("POST /example", writer, "POST", f"/assignments/{assignment['id']}/example", {"attempt_id": attempt["id"]})
    validators = [make_user(f"v{i}", "validator") for i in range(2)]
    for validator in validators:
        call("GET /me", validator, "GET", "/me")
        batch = call("GET /validation-batch", validator, "GET", f"/rounds/{round_['id']}/validation-batch")
        assert batch["data"], batch
        seen["GET /validation-batch"][-1] -= 2 * len(batch["data"])
        for item in batch["data"]:
            label = batch["validation_labels"][0]
            call(
                "POST /validations",
                validator,
                "POST",
                f"/validation-items/{item['item_id']}/validations",
                {"label": label},
            )
    assert set(seen) == set(BOUNDS)
    over = {name: counts for name, counts in seen.items() if max(counts) > BOUNDS[name]}
    assert not over, f"statements per request over their bounds {BOUNDS}: {over}"
    # Two worker-thread hops each: the token lookup, then the endpoint's work (its answer is
    # checked on the event loop, dynaloop/api/routing.py, and its writes are flushed in that
    # work rather than in a hop of the commit's own, dynaloop/api/deps.py get_session).
    extra = {name: hops for name, per_request in hopped.items() for hops in per_request if len(hops) > 2}
    assert not extra, f"requests with more than two worker-thread hops: {extra}"


def test_only_the_writers_own_overdue_assignment_is_expired_on_their_request(
    app: FastAPI, client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    """The token lookup asks, in its one statement, whether the caller has an overdue assignment
    (dynaloop/api/deps.py). Another writer's overdue assignment must not make this writer's
    request run the expiry; the late writer's own next request must."""
    from services.db.engine import session_scope
    from services.db.models import Assignment

    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)
    late, punctual = make_user("late", "writer"), make_user("punctual", "writer")
    assignments = f"/api/v1/rounds/{round_['id']}/assignments"
    overdue = client.post(assignments, json={}, headers=late.headers).json()
    with session_scope(app.state.sessionmaker) as session:
        row = session.get(Assignment, overdue["id"])
        assert row is not None
        row.expires_at = row.started_at

    def expiries(actor: Actor) -> list[str]:
        with counted(app) as statements:
            response = client.post(assignments, json={}, headers=actor.headers)
        assert response.status_code in (200, 201), response.text  # a new assignment, or the open one
        return [s for s in statements if s.lstrip().upper().startswith("UPDATE ASSIGNMENTS") and "expires_at" in s]

    assert expiries(punctual) == []
    assert len(expiries(late)) == 1
    with session_scope(app.state.sessionmaker) as session:
        assert session.get(Assignment, overdue["id"]).status.value == "expired"  # type: ignore[union-attr]
    assert expiries(late) == []  # nothing is overdue any more
