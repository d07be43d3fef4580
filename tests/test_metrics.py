"""Metrics and logs (issue 31; docs/deploy.md "Logs and metrics").

``/metrics`` answers only the metrics token, in Prometheus's text format, with a latency
histogram per route template; a shed attempt is counted with its reason; every answer carries
a request id (the caller's when it is safe), which the model server receives and logs; JSON log
lines carry the request id, the route, the status and the duration. Real HTTP where it matters:
the API under uvicorn, the tests' stub and a real model server, and the real `dynaloop api`
with two worker processes.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from dynaloop.api.app import create_app
from dynaloop.api.metrics import UNMATCHED
from model_server.config import ServerConfig
from model_server.logs import JsonFormatter as ModelServerJsonFormatter
from services.observability import JsonFormatter, safe_request_id
from services.settings import Settings
from tests.conftest import (
    MakeUser,
    dynaloop_process,
    example_yaml,
    free_port,
    open_round,
    register_model_server,
    serve_model,
)
from tests.stub_model_server import ThreadedServer
from tests.test_bulkheads import hold_requests, wait_until_in_flight

API = "/api/v1"
TOKEN = "metrics-token-for-the-tests-0123456789"
SCRAPE = {"Authorization": f"Bearer {TOKEN}"}
ATTEMPTS = f"{API}/assignments/{{assignment_id}}/attempts"
PROMPTS = [f"Prompt {i}: the soup was fine and the bread was fresh." for i in range(5)]


def with_token(settings: Settings, **changes: Any) -> Settings:
    return settings.model_copy(update={"metrics_token": SecretStr(TOKEN), **changes})


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics answer, by name and labels (parsed as Prometheus parses it)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def served() -> Iterator[Callable[[FastAPI], ThreadedServer]]:
    running: list[tuple[ThreadedServer, FastAPI]] = []

    def serve(app: FastAPI) -> ThreadedServer:
        server = ThreadedServer(app, free_port()).start()
        running.append((server, app))
        return server

    yield serve
    for server, app in running:
        server.stop()
        app.state.model_client.close()
        app.state.engine.dispose()


# --- the attacker first: /metrics tells nothing without its token --------------------------------


def test_metrics_answer_nothing_without_their_token(settings: Settings) -> None:
    off = create_app(settings)  # no token set: there is no /metrics
    with TestClient(off) as client:
        client.get("/health")
        for headers in ({}, SCRAPE, {"Authorization": "Bearer "}):
            response = client.get("/metrics", headers=headers)
            assert response.status_code == 404, response.text
            assert "dynaloop_" not in response.text and "# HELP" not in response.text
    on = create_app(with_token(settings))
    with TestClient(on) as client:
        client.get("/health")
        for headers in (
            {},
            {"Authorization": f"Bearer {TOKEN[:-1]}"},
            {"Authorization": f"Bearer {TOKEN}x"},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": TOKEN},
            {"X-Metrics-Token": TOKEN},
        ):
            response = client.get("/metrics", headers=headers)
            assert response.status_code == 401, (headers, response.text)
            assert response.json()["error"]["code"] == "unauthorized"
            assert "dynaloop_" not in response.text and "/health" not in response.text
        assert client.get("/metrics", headers=SCRAPE).status_code == 200
    # Not in the API's documented contract either.
    assert "/metrics" not in on.openapi()["paths"]


def test_a_short_metrics_token_is_refused() -> None:
    with pytest.raises(ValueError, match="DYNALOOP_METRICS_TOKEN is shorter than 16"):
        Settings(metrics_token="short")


# --- what /metrics says ---------------------------------------------------------------------------


def test_metrics_count_each_request_under_its_route_template(settings: Settings, make_user: MakeUser) -> None:
    app = create_app(with_token(settings))
    writer = make_user("wanda", "writer")
    with TestClient(app) as client:
        before = samples(client.get("/metrics", headers=SCRAPE).text)
        assert client.get(f"{API}/me", headers=writer.headers).status_code == 200
        assert client.get(f"{API}/assignments/987654", headers=writer.headers).status_code == 404
        assert client.get(f"{API}/assignments/987655", headers=writer.headers).status_code == 404
        assert client.get("/no/such/path/42").status_code == 404
        assert client.request("BREW", f"{API}/me").status_code in (400, 405)
        response = client.get("/metrics", headers=SCRAPE)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")  # the text format
    after = samples(response.text)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    count = "dynaloop_api_request_duration_seconds_count"
    assert delta(count, method="GET", route=f"{API}/me") == 1
    assert delta("dynaloop_api_requests_total", method="GET", route=f"{API}/me", status="200") == 1
    # Two ids, one template: the label never holds a raw path.
    assert delta(count, method="GET", route=f"{API}/assignments/{{assignment_id}}") == 2
    assert delta(count, method="GET", route=UNMATCHED) == 1
    assert delta(count, method="other", route=f"{API}/me") == 1
    assert not any("987654" in str(labels) or "/no/such" in str(labels) for _, labels in after)
    assert value(after, "dynaloop_api_requests_in_flight") == 1  # the scrape itself
    assert value(after, "dynaloop_state_up") == 1
    assert value(after, "dynaloop_jobs", queue="cpu", status="queued") == 0
    assert value(after, "dynaloop_study_sessions", state="active") == 0
    buckets = [labels for name, labels in after if name == "dynaloop_api_request_duration_seconds_bucket"]
    assert (("le", "+Inf"), ("method", "GET"), ("route", f"{API}/me")) in buckets


@pytest.mark.both_databases  # PostgreSQL's statement timeout on the scrape's queries
def test_jobs_and_study_sessions_are_read_from_the_database_at_each_scrape(
    settings: Settings, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    from services.db.engine import session_scope
    from services.db.models import (
        Job,
        JobKind,
        JobQueue,
        JobStatus,
        Platform,
        Round,
        StudyLink,
        StudyRole,
        StudySession,
        StudySessionStatus,
        utcnow,
    )

    app = create_app(with_token(settings))
    researcher = make_user("rita", "researcher")
    workers = [make_user(f"w{i}", "writer") for i in range(4)]
    with TestClient(app) as client:
        endpoint = register_model_server(app, stub_model.url)
        round_id = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), endpoint, PROMPTS)[
            "id"
        ]
        with session_scope(app.state.sessionmaker) as session:
            task_id = session.get(Round, round_id).task_id  # type: ignore[union-attr]
            jobs = [Job(kind=JobKind.train, task_id=task_id, queue=JobQueue.gpu, params={}) for _ in range(3)]
            jobs.append(Job(kind=JobKind.evaluate, task_id=task_id, status=JobStatus.running, params={}))
            jobs.append(Job(kind=JobKind.evaluate, task_id=task_id, status=JobStatus.succeeded, params={}))
            session.add_all(jobs)
            link = StudyLink(
                slug="slug-m", name="m", task_id=task_id, round_id=round_id, role=StudyRole.writer,
                platform=Platform.prolific, quota=5, completion_code="C-m",
            )  # fmt: skip
            session.add(link)
            session.flush()
            user_ids = [session.execute(text_select_user(name)).scalar_one() for name in ("w0", "w1", "w2", "w3")]
            long_ago = utcnow() - dt.timedelta(hours=2)
            for user_id, status, seen in zip(
                user_ids,
                [StudySessionStatus.active, StudySessionStatus.active, StudySessionStatus.completed,
                 StudySessionStatus.stopped],
                [utcnow(), long_ago, long_ago, utcnow()],
                strict=True,
            ):  # fmt: skip
                session.add(StudySession(link_id=link.id, user_id=user_id, status=status, last_seen_at=seen))
        scraped = samples(client.get("/metrics", headers=SCRAPE).text)
    assert len(workers) == 4
    assert value(scraped, "dynaloop_jobs", queue="gpu", status="queued") == 3
    assert value(scraped, "dynaloop_jobs", queue="cpu", status="running") == 1
    assert value(scraped, "dynaloop_jobs", queue="cpu", status="queued") == 0
    assert value(scraped, "dynaloop_study_sessions", state="active") == 2
    assert value(scraped, "dynaloop_study_sessions", state="completed") == 1
    assert value(scraped, "dynaloop_study_sessions", state="stopped") == 1
    assert value(scraped, "dynaloop_study_sessions", state="screened_out") == 0
    assert value(scraped, "dynaloop_study_sessions_idle", state="active") == 1  # not seen for 2 hours


def test_metrics_still_answer_when_the_database_does_not(settings: Settings, tmp_path: Path) -> None:
    """A scrape of an API whose database has no tables: dynaloop_state_up 0, the rest as usual."""
    broken = settings.model_copy(update={"database_url": f"sqlite:///{tmp_path / 'empty.db'}"})
    with TestClient(create_app(with_token(broken))) as client:
        response = client.get("/metrics", headers=SCRAPE)
    assert response.status_code == 200
    scraped = samples(response.text)
    assert value(scraped, "dynaloop_state_up") == 0
    assert not any(name.startswith(("dynaloop_jobs", "dynaloop_study_sessions")) for name, _ in scraped)
    assert value(scraped, "dynaloop_api_requests_in_flight") == 1


def text_select_user(name: str) -> Any:
    from sqlalchemy import select

    from services.db.models import User

    return select(User.id).where(User.username == name)


def test_a_shed_attempt_is_counted_with_its_reason(
    settings: Settings, make_user: MakeUser, served: Callable[[FastAPI], ThreadedServer]
) -> None:
    """One attempt holds the only model place (its body never ends); the next writer's attempt
    is shed by the overload guard with 503 model_busy, and /metrics counts exactly that."""
    app = create_app(with_token(settings, max_concurrent_model_requests=1))
    server = served(app)
    first, second = make_user("wanda", "writer"), make_user("otto", "writer")
    http = httpx.Client(base_url=server.url, timeout=30)
    before = samples(http.get("/metrics", headers=SCRAPE).text)
    held = hold_requests(server.url, first.token, f"{API}/assignments/1/attempts", 1)
    try:
        wait_until_in_flight(app, 1)
        shed = http.post(f"{API}/assignments/2/attempts", json={"text": "a text"}, headers=second.headers)
        assert shed.status_code == 503 and shed.json()["error"]["code"] == "model_busy", shed.text
        assert re.fullmatch(r"[0-9a-f]{32}", shed.headers["X-Request-ID"])
        after = samples(http.get("/metrics", headers=SCRAPE).text)
    finally:
        for sock in held:
            sock.close()
        http.close()
    shed_total = "dynaloop_api_shed_total"
    assert value(after, shed_total, reason="model_busy") - value(before, shed_total, reason="model_busy") == 1
    for reason in ("overloaded", "per_token", "model_per_token"):
        assert value(after, shed_total, reason=reason) == value(before, shed_total, reason=reason) == 0
    status = ("dynaloop_api_requests_total", {"method": "POST", "route": ATTEMPTS, "status": "503"})
    assert value(after, status[0], **status[1]) - value(before, status[0], **status[1]) == 1
    assert value(after, "dynaloop_api_requests_in_flight") == 2  # the held attempt and the scrape


# --- request ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("abc-123", True),
        ("0f8e2c1a-6d0b-4c4e-9b55-3a8e1d2f7c90", True),
        ("trace.v1_ok-" + "x" * 52, True),  # 64 characters
        ("x" * 65, False),
        ("x" * 10_000, False),
        ("evil\nINFO forged line", False),
        ('{"request_id": "forged"}', False),
        ("", False),
        ("ünïcode", False),
    ],
)
def test_only_a_short_safe_request_id_is_kept(client: TestClient, given: str, kept: bool) -> None:
    assert (safe_request_id(given) == given) is kept
    if "\n" in given or not given.isascii():
        return  # no HTTP client sends these as a header; safe_request_id alone is checked
    response = client.get("/health", headers={"X-Request-ID": given})
    answered = response.headers["X-Request-ID"]
    if kept:
        assert answered == given
    else:
        assert answered != given and re.fullmatch(r"[0-9a-f]{32}", answered)


def test_a_request_id_with_a_newline_never_reaches_a_log(settings: Settings) -> None:
    """Raw ASGI, as a hostile client's bytes arrive: the header's newline and 10 KB are replaced."""
    app = create_app(settings)
    with TestClient(app) as client:
        for hostile in (b"evil\r\nINFO forged", b"x" * 10_000, b"\xff\xfe"):
            answered: list[bytes] = []

            async def send(message: dict[str, Any], into: list[bytes] = answered) -> None:
                if message["type"] == "http.response.start":
                    into.extend(value for name, value in message["headers"] if name == b"x-request-id")

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "GET",
                "scheme": "http",
                "path": "/health",
                "raw_path": b"/health",
                "query_string": b"",
                "root_path": "",
                "headers": [(b"x-request-id", hostile)],
                "client": ("127.0.0.1", 1234),
                "server": ("testserver", 80),
                "state": {},
            }
            client.portal.call(app, scope, receive, send)  # type: ignore[union-attr]
            assert len(answered) == 1 and re.fullmatch(rb"[0-9a-f]{32}", answered[0]), answered


def test_the_model_server_receives_and_logs_the_request_id(
    settings: Settings,
    make_user: MakeUser,
    served: Callable[[FastAPI], ThreadedServer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    restore_logging: None,
) -> None:
    """A writer's attempt with X-Request-ID: the API sends the id with its model call, the real
    model server answers it back and writes it on its access line, and the API times the call."""
    from rounds.models.init_model import init_model_dir

    model_dir = tmp_path / "tiny"
    init_model_dir(model_dir, labels=["positive", "negative", "neutral"], tiny=True, model_id="tiny", seed=1)
    model = serve_model(ServerConfig(model_dir=model_dir, log_format="json"))
    try:
        app = create_app(with_token(settings))
        server = served(app)
        http = httpx.Client(base_url=server.url, timeout=60)
        world = {"app": app, "http": http}
        researcher, writer = make_user("rita", "researcher"), make_user("wanda", "writer")
        endpoint = register_model_server(world["app"], model.url)
        round_ = open_round(http, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), endpoint, PROMPTS)
        assignment = http.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()
        before = samples(http.get("/metrics", headers=SCRAPE).text)
        caplog.set_level(logging.INFO, logger="model_server.access")
        attempt = http.post(
            f"{API}/assignments/{assignment['id']}/attempts",
            json={"text": "The service was friendly and quick."},
            headers={**writer.headers, "X-Request-ID": "attempt-42.abc"},
        )
        assert attempt.status_code == 201, attempt.text
        assert attempt.headers["X-Request-ID"] == "attempt-42.abc"
        after = samples(http.get("/metrics", headers=SCRAPE).text)
        http.close()
    finally:
        model.stop()
    predicts = [r for r in caplog.records if r.name == "model_server.access" and getattr(r, "route", "") == "/predict"]
    assert [getattr(r, "request_id", None) for r in predicts] == ["attempt-42.abc"]
    line = json.loads(ModelServerJsonFormatter().format(predicts[0]))
    assert line["request_id"] == "attempt-42.abc" and line["status"] == 200 and line["route"] == "/predict"
    call = "dynaloop_api_model_call_duration_seconds_count"
    assert value(after, call, call="predict", outcome="ok") - value(before, call, call="predict", outcome="ok") == 1


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The process's logging as it was (a JSON model server configures the root logger)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    saved = {name: (list(logging.getLogger(name).handlers), logging.getLogger(name).propagate) for name in names}
    disabled = logging.getLogger("uvicorn.access").disabled
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, (kept, propagate) in saved.items():
        logging.getLogger(name).handlers[:] = kept
        logging.getLogger(name).propagate = propagate
    logging.getLogger("uvicorn.access").disabled = disabled


def test_the_api_sends_its_request_id_to_the_model_server() -> None:
    """Unit level: the model client puts the current request id on its call (a real server,
    over HTTP, records what arrived)."""
    from services.model_client import ModelClient
    from services.observability import request_id

    seen: list[str | None] = []
    recorder = FastAPI()

    @recorder.post("/predict")
    async def predict(request: Request) -> dict[str, Any]:
        seen.append(request.headers.get("X-Request-ID"))
        return {"model": {"id": "m"}, "predictions": [{"label": "a", "labels": ["a"], "probabilities": {"a": 1.0}}]}

    server = ThreadedServer(recorder, free_port()).start()
    client = ModelClient()
    try:
        token = request_id.set("from-the-api-1")
        try:
            assert client.predict(server.url, "a text").labels == ["a"]
        finally:
            request_id.reset(token)
        client.predict(server.url, "outside a request")
    finally:
        client.close()
        server.stop()
    assert seen == ["from-the-api-1", None]


# --- JSON logs ----------------------------------------------------------------------------------------


def test_json_log_lines_carry_the_request_id_and_escape_what_a_client_chose() -> None:
    from services.observability import request_id

    record = logging.LogRecord("dynaloop.x", logging.WARNING, __file__, 1, "text %s", ("a\nforged line",), None)
    token = request_id.set("rid-1")
    try:
        line = JsonFormatter().format(record)
    finally:
        request_id.reset(token)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["request_id"] == "rid-1" and entry["level"] == "warning" and entry["logger"] == "dynaloop.x"
    assert entry["message"] == "text a\nforged line" and entry["ts"].endswith("Z")


@pytest.mark.slow
def test_dynaloop_api_with_two_workers_writes_json_lines_and_one_metrics_for_both(tmp_path: Path) -> None:
    """The real `dynaloop api --workers 2` with DYNALOOP_LOG_FORMAT=json: every line of its log is
    a JSON object, each request has one access line with its id, route, status and duration, and
    /metrics counts the requests of both workers whichever worker answers the scrape."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYNALOOP_", "PROMETHEUS_"))}
    env.update(
        DYNALOOP_DATA_DIR=str(tmp_path),
        DYNALOOP_LOG_FORMAT="json",
        DYNALOOP_METRICS_TOKEN=TOKEN,
        PYTHONUNBUFFERED="1",
    )
    log = tmp_path / "api.log"
    database = f"sqlite:///{tmp_path / 'api.db'}"
    args = ["api", "--port", str(port), "--workers", "2", "--database-url", database]
    with dynaloop_process(args, env, log, url, start_timeout_s=180):
        ids = [f"req-{i}" for i in range(20)]
        with httpx.Client(base_url=url, timeout=30) as http:
            for rid in ids:
                answer = http.get("/health", headers={"X-Request-ID": rid}, timeout=30)
                assert answer.status_code == 200 and answer.headers["X-Request-ID"] == rid
            counts = set()
            for _ in range(6):  # new connections: the kernel spreads them over the workers
                with httpx.Client(base_url=url, timeout=30) as scraper:
                    scraped = samples(scraper.get("/metrics", headers=SCRAPE).text)
                key = {"method": "GET", "route": "/health", "status": "200"}
                counts.add(value(scraped, "dynaloop_api_requests_total", **key))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and log.read_text().count('"req-19"') == 0:
            time.sleep(0.1)
    # The readiness polls of dynaloop_process add a few /health requests; all are counted at once.
    assert len(counts) == 1 and counts.pop() >= len(ids), counts
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is JSON
    access = [e for e in entries if e["logger"] == "dynaloop.access" and e.get("request_id", "").startswith("req-")]
    assert sorted(e["request_id"] for e in access) == sorted(ids)
    for entry in access:
        assert entry["route"] == "/health" and entry["status"] == 200 and entry["method"] == "GET"
        assert isinstance(entry["duration_ms"], float | int) and entry["level"] == "info"
    assert not any(e["logger"] == "uvicorn.access" for e in entries)


def test_the_metrics_folder_is_emptied_of_prometheus_files_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PROMETHEUS_MULTIPROC_DIR set by mistake to the data folder: the SQLite database and other
    files stay; only prometheus_client's own files of an earlier run go."""
    from dynaloop.api.metrics import MULTIPROCESS_DIR_VARIABLE, prepare_multiprocess_folder

    kept = [tmp_path / "dynaloop.db", tmp_path / "backup.db", tmp_path / "notes.txt"]
    gone = [tmp_path / "counter_123.db", tmp_path / "histogram_123.db", tmp_path / "gauge_livesum_9.db"]
    for path in kept + gone:
        path.write_bytes(b"x")
    monkeypatch.setenv(MULTIPROCESS_DIR_VARIABLE, str(tmp_path))
    assert prepare_multiprocess_folder() == tmp_path
    assert all(path.exists() for path in kept) and not any(path.exists() for path in gone)
