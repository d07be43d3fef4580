"""One crowdworker cannot stall the service (issue 12, point 7; docs/reliability.md "Model calls").

A model server that hangs answers the writer 503 ``model_unavailable`` within the deadline
(``DYNALOOP_MODEL_DEADLINE_S``), retries included; model calls share a bounded pool of slots
(503 ``model_busy`` when it stays full) and a bounded share of the requests in flight, so
that ``/me`` and validation batches keep answering while attempts hang; one attempt per
assignment is with the model at a time (429 ``too_many_in_flight``, nothing saved); the
server's own overload answers are JSON; and what a model server says in an error body is
logged, never shown to the writer.

Real HTTP throughout: the API under uvicorn (in a thread, or the real ``dynaloop api``
process), the tests' stub model server, and a "black hole" model server: a listening socket
that never accepts, like a model server stopped with SIGSTOP.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from sqlalchemy import event

from dynaloop.api.app import create_app
from dynaloop.api.overload import OverloadGuard
from services.db.models import Attempt
from services.settings import Settings
from tests.conftest import (
    Actor,
    MakeUser,
    dynaloop_process,
    example_yaml,
    free_port,
    open_round,
    register_model_server,
    table_counts,
    table_snapshot,
)
from tests.stub_model_server import ThreadedServer, create_stub_app
from tests.test_concurrency import fire

API = "/api/v1"
PROMPTS = [f"Prompt {i}: the soup was fine and the bread was fresh." for i in range(20)]
NEUTRAL_TEXT = "We went there on a Sunday afternoon with friends."  # the stub says neutral
SECRET = "SECRET-7f3a-internal-token-do-not-leak"
TABLES = ["attempts", "assignments", "examples", "validations", "prompts"]
# Slack on top of the deadline for the database work around the model call, on a busy CI machine.
SLACK_S = 3.0


@pytest.fixture(scope="module")
def black_hole() -> Iterator[str]:
    """A model server that never answers: connections are queued by the kernel, never accepted."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def leaky_model() -> Iterator[ThreadedServer]:
    """The stub model whose /inspect answers an error page quoting a secret (its /predict does
    the same in the stub's `error` mode)."""
    stub = create_stub_app(["positive", "negative", "neutral"])

    @stub.post("/inspect")
    def inspect() -> PlainTextResponse:
        return PlainTextResponse(f"Traceback ... api_key={SECRET}", status_code=500)

    server = ThreadedServer(stub, free_port()).start()
    yield server
    server.stop()


def bulkhead_settings(settings: Settings, **changes: Any) -> Settings:
    """The test settings with a short deadline and small pools (tight enough to fill in a test)."""
    values = {
        "model_timeout_s": 10.0,  # per try: the deadline, not this, must bound the wait
        "model_retries": 2,
        "model_deadline_s": 1.5,
        **changes,
    }
    return settings.model_copy(update=values)


def serve(app: FastAPI) -> ThreadedServer:
    return ThreadedServer(app, free_port()).start()


def stop(server: ThreadedServer, app: FastAPI) -> None:
    server.stop()
    app.state.model_client.close()
    app.state.engine.dispose()


def writer_with_assignment(http: httpx.Client, make_user: MakeUser, name: str, round_id: int) -> tuple[Actor, int]:
    writer = make_user(name, "writer")
    response = http.post(f"{API}/rounds/{round_id}/assignments", json={}, headers=writer.headers)
    assert response.status_code == 201, response.text
    return writer, response.json()["id"]


def post_attempt(http: httpx.Client, writer: Actor, assignment_id: int, key: str | None = None) -> httpx.Response:
    headers = {**writer.headers, **({"Idempotency-Key": key} if key else {})}
    return http.post(f"{API}/assignments/{assignment_id}/attempts", json={"text": NEUTRAL_TEXT}, headers=headers)


def assert_json_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert error["code"] == code and len(error["message"]) >= 10, error
    return dict(error)


World = dict[str, Any]


@pytest.fixture
def start_api(settings: Settings, make_user: MakeUser) -> Iterator[Callable[..., World]]:
    """start_api(**settings changes): an API under uvicorn with the bulkhead test settings, a
    researcher and an http client; each test opens its own round (the model differs)."""
    running: list[tuple[ThreadedServer, FastAPI, httpx.Client]] = []

    def start(**changes: Any) -> World:
        app = create_app(bulkhead_settings(settings, **changes))
        server = serve(app)
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        http = httpx.Client(base_url=server.url, timeout=60.0, limits=limits)
        running.append((server, app, http))
        return {"app": app, "http": http, "researcher": make_user("rita", "researcher")}

    yield start
    for server, app, http in running:
        http.close()
        stop(server, app)


def open_dynasent(world: dict[str, Any], endpoint: str) -> int:
    server = register_model_server(world["app"], endpoint)  # as an admin would
    round_ = open_round(
        world["http"], world["researcher"], example_yaml("dynasent-r2", onboarding_quiz=None), server, PROMPTS
    )
    return int(round_["id"])


# --- the deadline ---------------------------------------------------------------------------


def test_hung_model_answers_within_the_deadline(
    start_api: Callable[..., World], make_user: MakeUser, black_hole: str
) -> None:
    """Before: 3 tries x DYNALOOP_MODEL_TIMEOUT_S (10 s here) = 30 s for the 503."""
    world = start_api()
    http, app = world["http"], world["app"]
    writer, assignment_id = writer_with_assignment(http, make_user, "wanda", open_dynasent(world, black_hole))
    started = time.monotonic()
    response = post_attempt(http, writer, assignment_id, key="hung-1")
    elapsed = time.monotonic() - started
    error = assert_json_error(response, 503, "model_unavailable")
    assert elapsed < 1.5 + SLACK_S, elapsed
    assert "not answering" in error["message"] and "no try was used" in error["message"]
    assert response.headers["Retry-After"] == str(app.state.settings.retry_after_s)
    assert black_hole not in response.text  # no endpoint URL either
    with app.state.sessionmaker() as session:
        attempt = session.get(Attempt, error["details"]["attempt_id"])
        assert attempt is not None and attempt.model_error == "the model server timed out"


def test_retries_fit_in_the_deadline() -> None:
    """A refused connection is retried, but never past the deadline (unit level: no API)."""
    from services.model_client import ModelClient, ModelServerError

    closed = f"http://127.0.0.1:{free_port()}"
    client = ModelClient(timeout_s=10, retries=5, backoff_s=0.3, deadline_s=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(ModelServerError, match="unreachable"):
            client.predict(closed, "some text")
        assert time.monotonic() - started < 1.0 + 0.5
    finally:
        client.close()


# --- the model-call slots ---------------------------------------------------------------------


def test_full_model_pool_answers_model_busy(
    start_api: Callable[..., World], make_user: MakeUser, stub_model: ThreadedServer, reset_stubs: None
) -> None:
    world = start_api(model_max_concurrency=1, model_queue_wait_s=0.3, model_deadline_s=4.0)
    http, app = world["http"], world["app"]
    round_id = open_dynasent(world, stub_model.url)
    writers = [writer_with_assignment(http, make_user, f"w{i}", round_id) for i in range(2)]
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "slow", "delay_s": 2.0}).raise_for_status()
    responses = fire(2, lambda i: post_attempt(http, writers[i][0], writers[i][1], key=f"busy-{i}"))
    by_status = sorted(responses, key=lambda r: r.status_code)
    assert [r.status_code for r in by_status] == [201, 503], [r.text for r in responses]
    error = assert_json_error(by_status[1], 503, "model_busy")
    assert by_status[1].headers["Retry-After"] and "no try was used" in error["message"]
    # The refused writer's text is kept, unscored, and a retry with the same key scores it.
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "normal"}).raise_for_status()
    index = next(i for i, r in enumerate(responses) if r.status_code == 503)
    retried = post_attempt(http, writers[index][0], writers[index][1], key=f"busy-{index}")
    assert retried.status_code == 201 and retried.json()["id"] == error["details"]["attempt_id"], retried.text
    assert len(app.state.attempts_in_flight) == 0


# --- one attempt per assignment -----------------------------------------------------------------


def test_second_attempt_on_one_assignment_is_refused_and_saves_nothing(
    start_api: Callable[..., World], make_user: MakeUser, stub_model: ThreadedServer, reset_stubs: None
) -> None:
    world = start_api(model_deadline_s=4.0)
    http, app = world["http"], world["app"]
    writer, assignment_id = writer_with_assignment(http, make_user, "wanda", open_dynasent(world, stub_model.url))
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "slow", "delay_s": 1.5}).raise_for_status()
    before = table_counts(app)
    # Two different attempts (two keys) at once: one is checked, the other refused at once.
    responses = fire(2, lambda i: post_attempt(http, writer, assignment_id, key=f"twin-{i}"))
    by_status = sorted(responses, key=lambda r: r.status_code)
    assert [r.status_code for r in by_status] == [201, 429], [r.text for r in responses]
    error = assert_json_error(by_status[1], 429, "too_many_in_flight")
    assert f"assignment {assignment_id}" in error["message"] and "nothing was saved" in error["message"]
    assert by_status[1].headers["Retry-After"] == "1"
    assert table_counts(app)["attempts"] == before["attempts"] + 1  # the refused one saved nothing
    # The same key sent twice at once: the duplicate is refused too, not scored twice (429 here,
    # or 409 "being processed" where PostgreSQL's unique index makes it wait for the first).
    responses = fire(2, lambda i: post_attempt(http, writer, assignment_id, key="same-key"))
    by_status = sorted(responses, key=lambda r: r.status_code)
    assert by_status[0].status_code == 201, [r.text for r in responses]
    assert by_status[1].json()["error"]["code"] in ("too_many_in_flight", "conflict"), by_status[1].text
    assert table_counts(app)["attempts"] == before["attempts"] + 2
    tries = http.get(f"{API}/assignments/{assignment_id}", headers=writer.headers).json()["tries_used"]
    assert tries == 2


def test_one_writers_flood_is_refused_before_the_database(
    start_api: Callable[..., World], make_user: MakeUser, stub_model: ThreadedServer, reset_stubs: None
) -> None:
    world = start_api(model_requests_per_writer=1, model_deadline_s=4.0)
    http, app = world["http"], world["app"]
    writer, assignment_id = writer_with_assignment(http, make_user, "wanda", open_dynasent(world, stub_model.url))
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "slow", "delay_s": 1.5}).raise_for_status()
    before = table_counts(app)

    def send(i: int) -> httpx.Response:
        # The scheme in any case: the same token, the same limit.
        headers = {"Authorization": f"{'BEARER' if i % 2 else 'bearer'} {writer.token}", "Idempotency-Key": f"f{i}"}
        return http.post(f"{API}/assignments/{assignment_id}/attempts", json={"text": NEUTRAL_TEXT}, headers=headers)

    responses = fire(12, send)
    codes = sorted(r.status_code for r in responses)
    assert codes == [201] + [429] * 11, [r.text for r in responses]
    for response in responses:
        if response.status_code == 429:
            assert_json_error(response, 429, "too_many_in_flight")
    assert table_counts(app) == {**before, "attempts": before["attempts"] + 1}


# --- other requests keep their place -------------------------------------------------------------


def test_hung_model_leaves_room_for_everyone_else(
    start_api: Callable[..., World], make_user: MakeUser, validators: list[Actor], black_hole: str
) -> None:
    world = start_api(max_concurrent_requests=12, max_concurrent_model_requests=3, model_deadline_s=3.0)
    http = world["http"]
    round_id = open_dynasent(world, black_hole)
    writers = [writer_with_assignment(http, make_user, f"w{i}", round_id) for i in range(8)]
    validator = validators[0]
    results: dict[str, Any] = {}

    def during(i: int) -> httpx.Response:
        if i < len(writers):
            started = time.monotonic()
            response = post_attempt(http, writers[i][0], writers[i][1], key=f"k{i}")
            results[f"attempt{i}"] = time.monotonic() - started
            return response
        time.sleep(0.5)  # the attempts are in flight (the model hangs for 3 s)
        if i == len(writers):
            return http.get(f"{API}/me", headers=writers[0][0].headers)
        return http.get(f"{API}/rounds/{round_id}/validation-batch", headers=validator.headers)

    responses = fire(len(writers) + 2, during)
    me, batch = responses[-2], responses[-1]
    assert me.status_code == 200 and me.json()["username"] == "w0", me.text
    assert batch.status_code == 200, batch.text
    attempts = responses[: len(writers)]
    codes = sorted(r.json()["error"]["code"] for r in attempts)
    # Three were let through to the (hung) model; the rest were told at once it is busy.
    assert codes == ["model_busy"] * 5 + ["model_unavailable"] * 3, [r.text for r in attempts]
    for response in attempts:
        assert_json_error(response, 503, response.json()["error"]["code"])
    assert max(results.values()) < 3.0 + SLACK_S, results


def test_overload_answers_in_the_json_error_shape(start_api: Callable[..., World], make_user: MakeUser) -> None:
    """Three requests whose bodies are still arriving take every place; the fourth request gets
    the documented JSON error (uvicorn's `limit_concurrency` answered plain text)."""
    world = start_api(max_concurrent_requests=3, max_concurrent_model_requests=1)
    http = world["http"]
    user = make_user("uma", "writer")
    host, port = http.base_url.host, http.base_url.port
    assert port is not None
    slow = []
    try:
        for _ in range(3):
            sock = socket.create_connection((host, port))
            sock.sendall(
                b"POST /api/v1/auth/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
            slow.append(sock)
        deadline = time.monotonic() + 10
        while True:
            response = http.get(f"{API}/me", headers=user.headers)
            if response.status_code == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        error = assert_json_error(response, 503, "overloaded")
        assert response.headers["Retry-After"] == "1" and "retry in 1 s" in error["message"]
    finally:
        for sock in slow:
            sock.close()
    deadline = time.monotonic() + 10
    while http.get(f"{API}/me", headers=user.headers).status_code != 200:
        assert time.monotonic() < deadline, "the places were never given back"
        time.sleep(0.05)


def test_model_requests_must_leave_room() -> None:
    with pytest.raises(ValueError, match="MAX_CONCURRENT_MODEL_REQUESTS must be below"):
        Settings(max_concurrent_requests=10, max_concurrent_model_requests=10)


# --- model-server error bodies stay in the log ------------------------------------------------


@pytest.mark.parametrize("status", [400, 500])
def test_model_server_error_body_never_reaches_the_writer(
    start_api: Callable[..., World],
    make_user: MakeUser,
    stub_model: ThreadedServer,
    reset_stubs: None,
    caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:
    """Before: a 4xx body was quoted in the 503 (`response.text[:300]`), and the URL always."""
    world = start_api()
    http, app = world["http"], world["app"]
    writer, assignment_id = writer_with_assignment(http, make_user, "wanda", open_dynasent(world, stub_model.url))
    body = f"<html>upstream failed; api_key={SECRET}</html>"
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "error", "status": status, "body": body})
    with caplog.at_level(logging.WARNING, logger="services.model_client"):
        response = post_attempt(http, writer, assignment_id, key="leak")
    error = assert_json_error(response, 503, "model_unavailable")
    assert SECRET not in response.text and stub_model.url not in response.text
    assert "not answering" in error["message"]
    with app.state.sessionmaker() as session:
        stored = session.get(Attempt, error["details"]["attempt_id"])
        assert stored is not None and stored.model_error is not None
        assert SECRET not in stored.model_error and f"HTTP {status}" in stored.model_error
    assert SECRET in caplog.text  # the operator can still see what the server said


def test_inspect_error_body_never_reaches_the_writer(
    start_api: Callable[..., World], make_user: MakeUser, leaky_model: ThreadedServer, caplog: pytest.LogCaptureFixture
) -> None:
    world = start_api()
    http = world["http"]
    writer, assignment_id = writer_with_assignment(http, make_user, "wanda", open_dynasent(world, leaky_model.url))
    with caplog.at_level(logging.WARNING, logger="services.model_client"):
        response = http.post(
            f"{API}/assignments/{assignment_id}/inspect", json={"text": NEUTRAL_TEXT}, headers=writer.headers
        )
    assert_json_error(response, 503, "model_unavailable")
    assert SECRET not in response.text and leaky_model.url not in response.text
    assert SECRET in caplog.text


# --- the real `dynaloop api` process ----------------------------------------------------------------


@pytest.fixture
def api_process(settings: Settings, tmp_path: Path) -> Iterator[str]:
    """`dynaloop api` on the test database with small limits: 8 requests in flight, 3 of them
    model requests, a 2 s model deadline (before the fix: uvicorn's limit_concurrency of 8)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNALOOP_")}
    env.update(
        DYNALOOP_DATABASE_URL=settings.resolved_database_url,
        DYNALOOP_DATA_DIR=str(tmp_path),
        DYNALOOP_MAX_CONCURRENT_REQUESTS="8",
        DYNALOOP_MAX_CONCURRENT_MODEL_REQUESTS="3",
        DYNALOOP_MODEL_DEADLINE_S="2",
        DYNALOOP_RATE_LIMIT_PER_TOKEN="none",
        DYNALOOP_RATE_LIMIT_PER_IP="none",
        PYTHONUNBUFFERED="1",
    )
    url = f"http://127.0.0.1:{port}"
    args = ["api", "--port", str(port), "--log-level", "warning"]
    with dynaloop_process(args, env, tmp_path / "api.log", url, start_timeout_s=60):
        yield url


def test_dynaloop_api_keeps_answering_while_attempts_hang(
    client: Any, make_user: MakeUser, researcher: Actor, validators: list[Actor], black_hole: str, api_process: str
) -> None:
    """Twelve writers check texts against a hung model through the real `dynaloop api`; the
    others' `/me` and validation batch answer 200, and every attempt gets a JSON answer
    within the deadline (before: plain-text `Service Unavailable` for everyone)."""
    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), black_hole, PROMPTS)
    writers = []
    for i in range(12):
        writer = make_user(f"flood{i}", "writer")
        response = client.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=writer.headers)
        assert response.status_code == 201, response.text
        writers.append((writer, response.json()["id"]))
    bystander = make_user("bea", "writer")
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    with httpx.Client(base_url=api_process, timeout=60.0, limits=limits) as http:
        timings: dict[int, float] = {}

        def during(i: int) -> httpx.Response:
            if i < len(writers):
                started = time.monotonic()
                response = post_attempt(http, writers[i][0], writers[i][1], key=f"k{i}")
                timings[i] = time.monotonic() - started
                return response
            time.sleep(0.7)
            if i % 2:
                return http.get(f"{API}/me", headers=bystander.headers)
            return http.get(f"{API}/rounds/{round_['id']}/validation-batch", headers=validators[0].headers)

        responses = fire(len(writers) + 4, during)
    for response in responses[len(writers) :]:
        assert response.status_code == 200, response.text
    codes = sorted(r.json()["error"]["code"] for r in responses[: len(writers)])
    assert set(codes) <= {"model_busy", "model_unavailable"} and codes.count("model_unavailable") <= 3, codes
    for response in responses[: len(writers)]:
        assert response.status_code == 503 and response.headers["content-type"].startswith("application/json")
    assert max(timings.values()) < 2.0 + SLACK_S, timings


# --- one token's burst (issue 26, item 10) --------------------------------------------------------


def hold_requests(url: str, token: str, path: str, n: int) -> list[socket.socket]:
    """``n`` requests of ``token`` in flight that never end: their bodies stop after one byte.
    The guard has let them in; the route still waits for the body (so they do no database
    work either)."""
    host, port = url.removeprefix("http://").split(":")
    held = []
    for _ in range(n):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
        )
        held.append(sock)
    return held


def wait_until_in_flight(app: FastAPI, n: int, at_most: bool = False) -> None:
    """Wait until the API's overload guard counts ``n`` requests in flight (at least ``n``, or
    with ``at_most`` at most ``n``)."""
    deadline = time.monotonic() + 10
    while True:
        guard = app.middleware_stack  # built by the first request
        while guard is not None and not isinstance(guard, OverloadGuard):
            guard = getattr(guard, "app", None)
        if isinstance(guard, OverloadGuard) and ((guard.in_flight <= n) if at_most else (guard.in_flight >= n)):
            return
        assert time.monotonic() < deadline, f"not {n} requests in flight: {guard and guard.in_flight}"
        time.sleep(0.02)


class StatementCounter:
    """Every SQL statement the API's engine sends to the database, while installed."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.statements = engine, 0

    def _count(self, *args: Any) -> None:
        self.statements += 1

    def __enter__(self) -> StatementCounter:
        event.listen(self.engine, "before_cursor_execute", self._count)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._count)


def test_one_tokens_burst_is_refused_before_the_database(
    start_api: Callable[..., World], make_user: MakeUser, validators: list[Actor], stub_model: ThreadedServer
) -> None:
    """The attack: one writer's token sends a burst of requests at once (attempts, reads of its
    assignment, /me, a new assignment). Before, every one of them past the model requests' own
    cap went through the token lookup, a handler thread and the database: 300 of them took the
    API's places and the others' p99 rose to 1.5 s. Now the token holds ``requests_per_token``
    places; the rest get 429 ``too_many_in_flight`` on the event loop without one SQL
    statement, and other tokens' requests are let in as usual."""
    world = start_api(requests_per_token=4, model_deadline_s=4.0)
    http, app = world["http"], world["app"]
    round_id = open_dynasent(world, stub_model.url)
    writer, assignment_id = writer_with_assignment(http, make_user, "wanda", round_id)
    other, other_assignment = writer_with_assignment(http, make_user, "otto", round_id)
    url = str(http.base_url).rstrip("/")
    tables = ["attempts", "assignments", "examples", "validations", "api_tokens", "users"]
    before = table_snapshot(app, *tables)

    held = hold_requests(url, writer.token, f"{API}/rounds/{round_id}/assignments", 4)
    try:
        burst = [
            ("POST", f"{API}/assignments/{assignment_id}/attempts", {"text": NEUTRAL_TEXT}),
            ("GET", f"{API}/assignments/{assignment_id}", None),
            ("GET", f"{API}/me", None),
            ("POST", f"{API}/rounds/{round_id}/assignments", {}),
        ]

        def attack(i: int) -> httpx.Response:
            method, path, body = burst[i % len(burst)]
            # The scheme spelled any way, a new Idempotency-Key each: still the same token.
            scheme = ["Bearer", "bearer", "BEARER"][i % 3]
            headers = {"Authorization": f"{scheme} {writer.token}", "Idempotency-Key": f"burst-{i}"}
            return http.request(method, path, json=body, headers=headers)

        wait_until_in_flight(app, 4)
        with StatementCounter(app.state.engine) as counter:
            responses = fire(40, attack)
            assert counter.statements == 0, f"the burst reached the database: {counter.statements} statements"
        for response in responses:
            error = assert_json_error(response, 429, "too_many_in_flight")
            assert response.headers["Retry-After"] == "1"
            assert "more than 4 requests at once" in error["message"], error
            assert "nothing was done" in error["message"] and "retry in 1 s" in error["message"], error
        # Everyone else is let in while the burst's places are held.
        me = http.get(f"{API}/me", headers=other.headers)
        assert me.status_code == 200 and me.json()["username"] == "otto", me.text
        batch = http.get(f"{API}/rounds/{round_id}/validation-batch", headers=validators[0].headers)
        assert batch.status_code == 200, batch.text
        mine = http.get(f"{API}/assignments/{other_assignment}", headers=other.headers)
        assert mine.status_code == 200, mine.text
        assert table_snapshot(app, *tables) == before  # the burst changed nothing
    finally:
        for sock in held:
            sock.close()
    # The places are given back when the held requests end: the writer is served again.
    deadline = time.monotonic() + 10
    while (again := http.get(f"{API}/assignments/{assignment_id}", headers=writer.headers)).status_code == 429:
        assert time.monotonic() < deadline, "the token's places were never given back"
        time.sleep(0.05)
    assert again.status_code == 200, again.text


def test_the_per_token_cap_leaves_other_tokens_and_tokenless_requests_alone(
    start_api: Callable[..., World], make_user: MakeUser
) -> None:
    """The cap counts per token: a made-up token's burst does not take a real token's places,
    and a request without a token (login) is counted only by the server-wide limit."""
    world = start_api(requests_per_token=2)
    http = world["http"]
    writer = make_user("wanda", "writer")
    url = str(http.base_url).rstrip("/")
    held = hold_requests(url, "dl_made-up-token", f"{API}/rounds/1/assignments", 2)
    try:
        wait_until_in_flight(world["app"], 2)
        refused = http.get(f"{API}/me", headers={"Authorization": "Bearer dl_made-up-token"})
        assert_json_error(refused, 429, "too_many_in_flight")
        me = http.get(f"{API}/me", headers=writer.headers)
        assert me.status_code == 200, me.text
        login = http.post(f"{API}/auth/login", json={"username": "nobody", "password": "wrong-password-1"})
        assert login.status_code == 401, login.text
    finally:
        for sock in held:
            sock.close()


def test_requests_per_token_is_a_setting() -> None:
    assert Settings().requests_per_token == 8
    assert Settings(requests_per_token=20).requests_per_token == 20
    with pytest.raises(ValueError, match="requests_per_token"):
        Settings(requests_per_token=0)


def test_a_token_that_keeps_sending_is_kept_out_for_the_penalty(
    start_api: Callable[..., World], make_user: MakeUser
) -> None:
    """A flooding script resends the moment it hears an answer. Each refusal is held back
    ``burst_penalty_s`` (no place taken), and for that long after a refusal every request of
    the token is refused, even with nothing of it in flight: none of the flood slips in the
    moment one of its requests ends. A client that waits Retry-After is served."""
    world = start_api(requests_per_token=1, burst_penalty_s=1.0)
    http, app = world["http"], world["app"]
    writer = make_user("wanda", "writer")
    url = str(http.base_url).rstrip("/")
    before = table_snapshot(app, "api_tokens", "users")
    held = hold_requests(url, writer.token, f"{API}/rounds/1/assignments", 1)
    with ThreadPoolExecutor(max_workers=3) as pool:
        try:
            wait_until_in_flight(app, 1)
            started = time.monotonic()
            burst = [pool.submit(http.get, f"{API}/me", headers=writer.headers) for _ in range(3)]
            time.sleep(0.3)
        finally:
            for sock in held:
                sock.close()
        wait_until_in_flight(app, 0, at_most=True)
        # Nothing of the token is in flight now, but it was refused 0.3 s ago: still refused.
        with StatementCounter(app.state.engine) as counter:
            again = http.get(f"{API}/me", headers=writer.headers)
            assert counter.statements == 0
        assert_json_error(again, 429, "too_many_in_flight")
        responses = [future.result() for future in burst]
        # Each refusal was held back the penalty before it was sent.
        assert time.monotonic() - started >= 0.9
        for response in responses:
            error = assert_json_error(response, 429, "too_many_in_flight")
            assert response.headers["Retry-After"] == "1" and error["details"]["retry_after_s"] == 1
    assert table_snapshot(app, "api_tokens", "users") == before
    time.sleep(1.1)  # as Retry-After says
    served = http.get(f"{API}/me", headers=writer.headers)
    assert served.status_code == 200 and served.json()["username"] == "wanda", served.text
