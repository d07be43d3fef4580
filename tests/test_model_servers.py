"""Outbound calls go only where an admin said (issue #12, points 1 and 3).

Model servers are registered by admins (a name, a URL, an admin token kept server-side); rounds
and promote jobs name them. These tests play the attacker: a researcher who points a promote
job or a round at a server of their choosing (a real HTTP server here that records every request
it gets), a writer or validator reading rounds for URLs, non-admins registering servers, and
anyone hunting for the admin token in the API's answers.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import create_engine, inspect, select, text

from dynaloop.api.app import create_app
from services.db.engine import session_scope
from services.db.migrate import downgrade, upgrade
from services.db.models import AuditEntry, Base, ModelVersion, ModelVersionStatus
from services.domain.tasks import get_task
from services.settings import Settings
from tests.conftest import (
    BACKENDS,
    Actor,
    MakeUser,
    example_yaml,
    fresh_postgres_database,
    open_round,
    table_counts,
    table_snapshot,
    worker_process,
)
from tests.stub_model_server import ThreadedServer

API = "/api/v1"
ADMIN_TOKEN = "the-model-servers-admin-token-0123456789"
ALL_TABLES = [table.name for table in Base.metadata.sorted_tables]
METADATA_URL = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"


# --- a real HTTP server that records what it is sent ---------------------------------------------


class Recorder:
    """Every request it got: (method, path, headers)."""

    def __init__(self, url: str, requests: list[tuple[str, str, dict[str, str]]]) -> None:
        self.url = url
        self.requests = requests


@contextmanager
def recording_server() -> Iterator[Recorder]:
    requests: list[tuple[str, str, dict[str, str]]] = []

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            requests.append((self.command, self.path, dict(self.headers.items())))
            body = b'{"error": {"code": "not_found", "message": "nothing here"}}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _record

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Recorder(f"http://127.0.0.1:{server.server_address[1]}", requests)
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def unchanged(app: Any) -> Iterator[None]:
    counts, rows = table_counts(app), table_snapshot(app, *ALL_TABLES)
    yield
    assert table_counts(app) == counts, "row counts changed on a rejected request"
    after = table_snapshot(app, *ALL_TABLES)
    for name in ALL_TABLES:
        assert after[name] == rows[name], f"table {name} changed on a rejected request"


def _error(response: Any, status: int, *fragments: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    for fragment in fragments:
        assert fragment in body["error"]["message"], body


@pytest.fixture
def admin(make_user: MakeUser) -> Actor:
    return make_user("ada", "admin")


def _register(client: TestClient, admin: Actor, name: str, url: str, token: str | None = ADMIN_TOKEN) -> Any:
    body: dict[str, Any] = {"name": name, "url": url}
    if token is not None:
        body["admin_token"] = token
    response = client.post(f"{API}/model-servers", json=body, headers=admin.headers)
    assert response.status_code == 201, response.text
    return response.json()


# --- point 1: a researcher's promote job never gets the admin token out --------------------------


def _wait_for(client: TestClient, researcher: Actor, job_id: int, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"{API}/jobs/{job_id}", headers=researcher.headers).json()
        if job["status"] not in ("queued", "running") or time.monotonic() > deadline:
            return job
        time.sleep(0.3)


def test_a_researchers_promote_job_never_sends_the_admin_token_to_a_server_of_their_choosing(
    settings: Settings, make_user: MakeUser, stub_model: ThreadedServer, tmp_path: Path
) -> None:
    """The issue's attack: ``kind: promote`` with ``endpoint`` set to the researcher's server made
    the API's job send ``POST /admin/reload`` there with the deployment's admin token. Here the
    deployment has that token (in the settings the API had, and registered with its model
    server); the researcher's server must get no request at all, whatever the job's params say.
    The registered server, and only it, gets the token."""
    # The token as the API's setting (DYNALOOP_MODEL_SERVER_ADMIN_TOKEN) used to hold it; the
    # registry replaced that setting, so this only keeps a deployment's old configuration.
    deployment = settings.model_copy(update={"model_server_admin_token": SecretStr(ADMIN_TOKEN)})
    app = create_app(deployment)
    with TestClient(app) as client, recording_server() as attacker, recording_server() as registered:
        researcher = make_user("mallory", "researcher")
        admin = make_user("ada", "admin")
        open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url)
        with session_scope(app.state.sessionmaker) as session:
            model = ModelVersion(
                task_id=get_task(session, "dynasent-r2").id,
                name="m@1",
                model_id="m",
                version="1",
                directory="/models/m-1",
                base_model="tiny",
                labels=["positive", "negative", "neutral"],
                status=ModelVersionStatus.evaluated,
            )
            session.add(model)
            session.flush()
            model_id = model.id

        jobs = []
        for params in (
            {"model_id": model_id, "endpoint": attacker.url},
            {"model_id": model_id, "endpoint": attacker.url, "admin_token": "guess"},
            {"model_id": model_id, "server": attacker.url},
            {"model_id": model_id, "server": "model-0", "endpoint": attacker.url},
        ):
            response = client.post(
                f"{API}/tasks/dynasent-r2/jobs", json={"kind": "promote", "params": params}, headers=researcher.headers
            )
            if response.status_code == 202:  # the job runs in its own process: let it finish
                jobs.append(_wait_for(client, researcher, response.json()["id"]))
            else:
                assert response.status_code == 422, response.text
        assert attacker.requests == [], f"the researcher's server was called: {attacker.requests}"
        assert jobs == [], "no promote job may start with a URL of the caller's choosing"

        # The registered server is the one place the token goes (it answers 404: not a model server).
        _register(client, admin, "model-0", registered.url)
        granted = client.put(f"{API}/model-servers/model-0/tasks/dynasent-r2", headers=admin.headers)
        assert granted.status_code == 200, granted.text
        response = client.post(
            f"{API}/tasks/dynasent-r2/jobs",
            json={"kind": "promote", "params": {"model_id": model_id, "server": "model-0"}},
            headers=researcher.headers,
        )
        assert response.status_code == 202, response.text
        with worker_process(app, "cpu", "promote-worker", tmp_path / "worker.log"):  # the job runs there
            job = _wait_for(client, researcher, response.json()["id"])
        assert job["status"] == "failed" and "has no /admin/reload" in job["message"], job
        assert [(method, path) for method, path, _ in registered.requests] == [("POST", "/admin/reload")]
        assert registered.requests[0][2]["Authorization"] == f"Bearer {ADMIN_TOKEN}"
        assert attacker.requests == []
        assert ADMIN_TOKEN not in json.dumps(job)


# --- point 3: rounds name registered servers; a URL is refused ---------------------------------


@pytest.fixture
def dynasent(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    prompts = [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(5)]
    return open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, prompts)


def test_a_round_cannot_be_pointed_at_a_url(
    client: TestClient, app: FastAPI, researcher: Actor, writer: Actor, dynasent: dict[str, Any]
) -> None:
    """``PUT /rounds/{id}/model`` took any URL (metadata addresses, credentials, queries); the
    writers' attempts then went there. Only registered names are taken now: 422, nothing saved,
    and the attempts keep going to the registered server."""
    with recording_server() as attacker:
        attempts = [
            {"model_servers": [attacker.url]},
            {"model_servers": [METADATA_URL]},
            {"model_servers": ["http://user:secret@10.0.0.1:8001/?q=1#x"]},
            {"model_endpoints": [METADATA_URL]},
            {"model_servers": [*(dynasent.get("model_servers") or []), METADATA_URL]},
        ]
        for body in attempts:
            with unchanged(app):
                response = client.put(f"{API}/rounds/{dynasent['id']}/model", json=body, headers=researcher.headers)
                assert response.status_code == 422, response.text
                assert set(response.json()) == {"error"}
        with unchanged(app):
            _error(
                client.post(
                    f"{API}/tasks/dynasent-r2/rounds",
                    json={"model_servers": [METADATA_URL]},
                    headers=researcher.headers,
                ),
                422,
                "is not a registered model server",
            )
        assignment = client.post(f"{API}/rounds/{dynasent['id']}/assignments", json={}, headers=writer.headers).json()
        attempt = client.post(
            f"{API}/assignments/{assignment['id']}/attempts",
            json={"text": "The soup was lovely."},
            headers=writer.headers,
        )
        assert attempt.status_code == 201 and attempt.json()["status"] == "scored", attempt.text
        assert attacker.requests == []


def test_writers_and_validators_never_see_model_servers(
    client: TestClient,
    researcher: Actor,
    writer: Actor,
    validators: list[Actor],
    admin: Actor,
    stub_model: ThreadedServer,
    dynasent: dict[str, Any],
) -> None:
    rid = dynasent["id"]
    name = (dynasent.get("model_servers") or ["127-0-0-1"])[0]
    host_port = stub_model.url.removeprefix("http://")
    paths = [f"{API}/rounds/{rid}", f"{API}/rounds/open", f"{API}/tasks/dynasent-r2/rounds"]
    for crowdworker in (writer, validators[0]):
        for path in paths:
            response = client.get(path, headers=crowdworker.headers)
            assert response.status_code == 200, response.text
            assert host_port not in response.text and name not in response.text
            for round_ in response.json().get("data", [response.json()]):
                assert round_["model_servers"] is None
        _error(client.get(f"{API}/model-servers", headers=crowdworker.headers), 403, "needs the researcher role")
        _error(client.get(f"{API}/model-servers/{name}", headers=crowdworker.headers), 403)
    # The attempt a writer gets back names no server either.
    assignment = client.post(f"{API}/rounds/{rid}/assignments", json={}, headers=writer.headers)
    attempt = client.post(
        f"{API}/assignments/{assignment.json()['id']}/attempts",
        json={"text": "The soup was lovely but the waiter was rude to us."},
        headers=writer.headers,
    )
    assert attempt.status_code == 201, attempt.text
    for response in (assignment, attempt):
        assert host_port not in response.text and name not in response.text
    # Those who manage the task see the names, and may look their URLs up.
    for manager in (researcher, admin):
        for path in paths:
            response = client.get(path, headers=manager.headers).json()
            assert all(r["model_servers"] == [name] for r in response.get("data", [response]))
        listed = client.get(f"{API}/model-servers", headers=manager.headers).json()
        assert [(s["name"], s["url"]) for s in listed["data"]] == [(name, stub_model.url)]


# --- the registry: admins only; the token is never shown ---------------------------------------


@pytest.mark.both_databases
def test_only_admins_register_change_and_remove_servers(
    client: TestClient, app: FastAPI, make_user: MakeUser, researcher: Actor, admin: Actor
) -> None:
    _register(client, admin, "model-0", "http://127.0.0.1:8001")
    others = [researcher, make_user("wes", "writer"), make_user("val", "validator"), make_user("cli", "client")]
    for user in others:
        with unchanged(app):
            for method, path, body in (
                ("POST", f"{API}/model-servers", {"name": "mine", "url": "http://10.0.0.9:8001"}),
                ("PATCH", f"{API}/model-servers/model-0", {"url": "http://10.0.0.9:8001"}),
                ("PATCH", f"{API}/model-servers/model-0", {"admin_token": "mine"}),
                ("DELETE", f"{API}/model-servers/model-0", None),
            ):
                _error(client.request(method, path, json=body, headers=user.headers), 403, "needs the admin role")
    assert client.post(f"{API}/model-servers", json={"name": "x", "url": "http://a:1"}).status_code == 401
    listed = client.get(f"{API}/model-servers", headers=researcher.headers)
    assert listed.status_code == 200 and [s["name"] for s in listed.json()["data"]] == ["model-0"]


def test_the_admin_token_never_leaves_the_server(client: TestClient, app: FastAPI, admin: Actor) -> None:
    second = "a-second-admin-token-9876543210"
    answers = [
        client.post(
            f"{API}/model-servers",
            json={"name": "model-0", "url": "http://127.0.0.1:8001/", "admin_token": ADMIN_TOKEN},
            headers=admin.headers,
        ),
        client.get(f"{API}/model-servers", headers=admin.headers),
        client.get(f"{API}/model-servers/model-0", headers=admin.headers),
        client.patch(f"{API}/model-servers/model-0", json={"url": "http://127.0.0.1:8002"}, headers=admin.headers),
        client.patch(f"{API}/model-servers/model-0", json={"admin_token": second}, headers=admin.headers),
        client.post(
            f"{API}/model-servers",
            json={"name": "model-0", "url": "http://a:1", "admin_token": second},
            headers=admin.headers,
        ),  # 409: the name is taken
        client.delete(f"{API}/model-servers/model-0", headers=admin.headers),
        client.get(f"{API}/model-servers/model-0", headers=admin.headers),  # 404 once removed
    ]
    assert [a.status_code for a in answers] == [201, 200, 200, 200, 200, 409, 200, 404]
    for answer in answers:
        assert ADMIN_TOKEN not in answer.text and second not in answer.text, answer.text
        assert '"admin_token"' not in answer.text
    assert answers[0].json()["has_admin_token"] is True and answers[0].json()["url"] == "http://127.0.0.1:8001"
    assert answers[3].json()["url"] == "http://127.0.0.1:8002"
    with session_scope(app.state.sessionmaker) as session:
        audit = json.dumps([e.details for e in session.scalars(select(AuditEntry))])
    assert ADMIN_TOKEN not in audit and second not in audit
    # Removing the token: has_admin_token goes false.
    _register(client, admin, "model-1", "http://127.0.0.1:8003")
    cleared = client.patch(f"{API}/model-servers/model-1", json={"admin_token": None}, headers=admin.headers)
    assert cleared.status_code == 200 and cleared.json()["has_admin_token"] is False


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"name": "m", "url": "ftp://127.0.0.1/model"}, "is not http(s)"),
        ({"name": "m", "url": "file:///etc/passwd"}, "is not http(s)"),
        ({"name": "m", "url": "http://user:pass@127.0.0.1:8001"}, "holds credentials"),
        ({"name": "m", "url": "http://127.0.0.1:8001/?next=/admin"}, "has a query or fragment"),
        ({"name": "m", "url": "http://127.0.0.1:8001/#frag"}, "has a query or fragment"),
        ({"name": "m", "url": "http:///no-host"}, "has no host"),
        ({"name": "m", "url": "http://127.0.0.1:99999"}, "is malformed"),
        ({"name": "m", "url": "http://127.0.0.1:8001/a b"}, "spaces or control characters"),
        ({"name": "m", "url": "http://a/" + "x" * 600}, "at most 500"),
        ({"name": "Model_0", "url": "http://127.0.0.1:8001"}, "is not a slug"),
        ({"name": "-m", "url": "http://127.0.0.1:8001"}, "is not a slug"),
        ({"name": "m", "url": "http://127.0.0.1:8001", "admin_token": "has space"}, "printable characters"),
        ({"name": "m", "url": "http://127.0.0.1:8001", "password": "x"}, "is not a known field"),
    ],
)
def test_registration_refuses_what_no_model_server_url_needs(
    client: TestClient, app: FastAPI, admin: Actor, body: dict[str, Any], fragment: str
) -> None:
    with unchanged(app):
        _error(client.post(f"{API}/model-servers", json=body, headers=admin.headers), 422, fragment)


@pytest.mark.both_databases
def test_an_admin_may_register_any_host_and_a_server_in_use_stays(
    client: TestClient, app: FastAPI, admin: Actor, researcher: Actor, stub_model: ThreadedServer
) -> None:
    """Local and link-local hosts are the admin's call (the demo's Model 0 is on 127.0.0.1)."""
    assert _register(client, admin, "local", "http://127.0.0.1:8001")["url"] == "http://127.0.0.1:8001"
    assert _register(client, admin, "meta", "http://169.254.169.254", token=None)["has_admin_token"] is False
    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), "local")
    assert round_["model_servers"] == ["local"]
    with unchanged(app):
        _error(client.delete(f"{API}/model-servers/local", headers=admin.headers), 409, "dynasent-r2 round 1")
    assert client.delete(f"{API}/model-servers/meta", headers=admin.headers).status_code == 200
    # A round closed later keeps the name of a server removed since.
    client.post(f"{API}/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    assert client.delete(f"{API}/model-servers/local", headers=admin.headers).status_code == 200
    shown = client.get(f"{API}/rounds/{round_['id']}", headers=researcher.headers).json()
    assert shown["model_servers"] == ["local"]


# --- migration 0006: rounds' URLs become registered servers -------------------------------------


@pytest.fixture(params=BACKENDS)
def fresh_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    with fresh_postgres_database() as url:
        yield url


def test_migration_registers_the_urls_rounds_used(fresh_database: str) -> None:
    url = fresh_database
    upgrade(url, "0005")
    engine = create_engine(url)
    urls = [
        ["http://127.0.0.1:8001", "http://model.internal:8001/"],
        ["http://127.0.0.1:8001"],
        [],
        ["https://127.0.0.1:8001/v1"],  # the same host and port: a name of its own
    ]
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO tasks (id, name, title, family, definition, definition_yaml, created_at) "
                    "VALUES (1, 't', 'T', 'single_label', '{}', '', CURRENT_TIMESTAMP)"
                )
            )
            for number, endpoints in enumerate(urls, start=1):
                connection.execute(
                    text(
                        "INSERT INTO rounds (id, task_id, number, status, model_endpoints, prompt_strategy, "
                        "no_prompt_fraction, target_label_mode, created_at) VALUES (:n, 1, :n, 'closed', :e, "
                        "'unused_first', 0, 'balanced', CURRENT_TIMESTAMP)"
                    ),
                    {"n": number, "e": json.dumps(endpoints)},
                )
        upgrade(url, "0006")
        with engine.connect() as connection:
            servers = dict(connection.execute(text("SELECT name, url FROM model_servers ORDER BY id")).all())
            tokens = connection.execute(text("SELECT admin_token FROM model_servers")).scalars().all()
            in_loop = [
                json.loads(value) if isinstance(value, str) else value
                for value in connection.execute(text("SELECT model_servers FROM rounds ORDER BY id")).scalars()
            ]
        assert servers == {
            "127-0-0-1-8001": "http://127.0.0.1:8001",
            "model-internal-8001": "http://model.internal:8001",
            "127-0-0-1-8001-2": "https://127.0.0.1:8001/v1",
        }
        assert tokens == [None, None, None]
        assert in_loop == [["127-0-0-1-8001", "model-internal-8001"], ["127-0-0-1-8001"], [], ["127-0-0-1-8001-2"]]
        downgrade(url, "0005")
        with engine.connect() as connection:
            back = [
                json.loads(value) if isinstance(value, str) else value
                for value in connection.execute(text("SELECT model_endpoints FROM rounds ORDER BY id")).scalars()
            ]
            assert "model_servers" not in inspect(connection).get_table_names()
        assert back == [[u.rstrip("/") for u in endpoints] for endpoints in urls]
    finally:
        engine.dispose()


def test_names_and_descriptions_no_database_can_hold_are_refused_not_crashed(
    client: TestClient, app: FastAPI, admin: Actor, researcher: Actor, dynasent: dict[str, Any]
) -> None:
    """NUL and other control characters (PostgreSQL refuses NUL in text) give 4xx, never 500."""
    with unchanged(app):
        for method, path, body, status in (
            ("GET", f"{API}/model-servers/a%00b", None, 404),
            ("PATCH", f"{API}/model-servers/a%00b", {"description": "x"}, 404),
            ("POST", f"{API}/model-servers", {"name": "m", "url": "http://a:1", "description": "a\x00b"}, 422),
            ("PUT", f"{API}/rounds/{dynasent['id']}/model", {"model_servers": ["a\x00b"]}, 422),
            (
                "POST",
                f"{API}/tasks/dynasent-r2/jobs",
                {"kind": "promote", "params": {"model_id": 1, "server": "\x00"}},
                422,
            ),
        ):
            response = client.request(method, path, json=body, headers=admin.headers)
            assert response.status_code == status, response.text


# --- issue 26, item 7: model servers belong to tasks ----------------------------------------------

GROUP_B_TASK = "group-b-sentiment"


def _model(app: FastAPI, task: str, name: str, status: ModelVersionStatus) -> int:
    """A model of ``task`` in the registry (never evaluated: only ``force`` could promote it)."""
    with session_scope(app.state.sessionmaker) as session:
        model = ModelVersion(
            task_id=get_task(session, task).id,
            name=f"{name}@1",
            model_id=name,
            version="1",
            directory=f"/models/{name}-1",
            base_model="tiny",
            labels=["positive", "negative", "neutral"],
            status=status,
        )
        session.add(model)
        session.flush()
        return model.id


@pytest.fixture
def two_groups(
    client: TestClient, app: FastAPI, make_user: MakeUser, admin: Actor, stub_model: ThreadedServer
) -> dict[str, Any]:
    """Group A (alice) runs dynasent-r2 with ``model-0`` in its loop, granted by the admin; group
    B (bob) runs a task of its own with a server of its own (``model-b``), and a model that was
    never evaluated."""
    alice = make_user("alice", "researcher")
    bob = make_user("bob", "researcher")
    _register(client, admin, "model-0", stub_model.url)
    round_a = open_round(client, alice, example_yaml("dynasent-r2", onboarding_quiz=None), "model-0")
    _register(client, admin, "model-b", "http://127.0.0.1:9")
    round_b = open_round(
        client,
        bob,
        example_yaml("dynasent-r2", onboarding_quiz=None).replace("name: dynasent-r2", f"name: {GROUP_B_TASK}", 1),
        "model-b",
    )
    return {
        "alice": alice,
        "bob": bob,
        "round_a": round_a,
        "round_b": round_b,
        "model_a": _model(app, "dynasent-r2", "alices-model", ModelVersionStatus.evaluated),
        "model_b": _model(app, GROUP_B_TASK, "bobs-model", ModelVersionStatus.trained),
    }


def test_another_groups_server_cannot_be_named_in_a_promote_job_even_with_force(
    client: TestClient, app: FastAPI, two_groups: dict[str, Any]
) -> None:
    """The issue's attack: group B's researcher promotes their own, never evaluated model to
    group A's server (``"server": "model-0", "force": true``), which would then score group A's
    attempts. Refused when the job is submitted (403, naming the servers granted to B's task):
    no job row, no queue message, no audit entry, nothing else."""
    bob = two_groups["bob"]
    for params in (
        {"model_id": two_groups["model_b"], "server": "model-0", "force": True},
        {"model_id": two_groups["model_b"], "server": "model-0", "force": True, "keep_round_servers": True},
        {"model_id": two_groups["model_b"], "server": " model-0", "force": True},
    ):
        with unchanged(app):
            response = client.post(
                f"{API}/tasks/{GROUP_B_TASK}/jobs", json={"kind": "promote", "params": params}, headers=bob.headers
            )
            assert response.status_code in (403, 422), response.text
            assert set(response.json()) == {"error"}
        if response.status_code == 403:
            message = response.json()["error"]["message"]
            assert f"'model-0' is not granted to task '{GROUP_B_TASK}'" in message, message
            assert "granted to it: model-b" in message, message
    # Nor may bob put group A's server in his round's loop, or open a round with it.
    with unchanged(app):
        _error(
            client.put(
                f"{API}/rounds/{two_groups['round_b']['id']}/model",
                json={"model_servers": ["model-0"]},
                headers=bob.headers,
            ),
            403,
            "'model-0' is not granted to task",
            "granted to it: model-b",
        )
        _error(
            client.put(
                f"{API}/rounds/{two_groups['round_b']['id']}/model",
                json={"model_servers": ["model-b", "model-0"]},
                headers=bob.headers,
            ),
            403,
            "'model-0' is not granted",
        )


def test_a_shared_server_is_swapped_by_admins_only(
    client: TestClient, app: FastAPI, admin: Actor, two_groups: dict[str, Any]
) -> None:
    """Once ``model-0`` is granted to both groups' tasks, either group may keep it in its loop,
    but a promotion (a hot swap that changes what scores the other group's attempts) is refused
    to both researchers, force or not; the admin's own promote job is accepted."""
    alice, bob = two_groups["alice"], two_groups["bob"]
    response = client.put(f"{API}/model-servers/model-0/tasks/{GROUP_B_TASK}", headers=admin.headers)
    assert response.status_code == 200, response.text
    assert response.json()["shared"] is True and response.json()["granted_by"] == "ada"
    # Putting it in B's loop is now allowed: scoring with it changes nobody's model.
    response = client.put(
        f"{API}/rounds/{two_groups['round_b']['id']}/model", json={"model_servers": ["model-0"]}, headers=bob.headers
    )
    assert response.status_code == 200, response.text
    for who, task, model in (
        (bob, GROUP_B_TASK, two_groups["model_b"]),
        (alice, "dynasent-r2", two_groups["model_a"]),
    ):
        with unchanged(app):
            _error(
                client.post(
                    f"{API}/tasks/{task}/jobs",
                    json={"kind": "promote", "params": {"model_id": model, "server": "model-0", "force": True}},
                    headers=who.headers,
                ),
                403,
                "'model-0' (granted to 2 tasks) is shared with other tasks",
                "only an admin may swap its model",
            )
    # Alice's own server (granted to her task alone) she may swap, after registering it.
    _register(client, admin, "model-a", "http://127.0.0.1:9")
    assert client.put(f"{API}/model-servers/model-a/tasks/dynasent-r2", headers=admin.headers).status_code == 200
    response = client.post(
        f"{API}/tasks/dynasent-r2/jobs",
        json={"kind": "promote", "params": {"model_id": two_groups["model_a"], "server": "model-a"}},
        headers=alice.headers,
    )
    assert response.status_code == 202, response.text
    response = client.post(
        f"{API}/tasks/dynasent-r2/jobs",
        json={"kind": "promote", "params": {"model_id": two_groups["model_a"], "server": "model-0"}},
        headers=admin.headers,
    )
    assert response.status_code == 202, response.text


@pytest.mark.both_databases
def test_only_admins_grant_and_revoke_and_a_server_in_an_open_loop_stays(
    client: TestClient, app: FastAPI, admin: Actor, writer: Actor, two_groups: dict[str, Any]
) -> None:
    """A researcher cannot grant themselves another group's server, nor take one away; the
    admin's grants and revocations are audited; a server in a task's open round is not revoked
    from it (409); each group lists only its own task's servers."""
    bob = two_groups["bob"]
    for who in (bob, writer, two_groups["alice"]):
        with unchanged(app):
            for method in ("PUT", "DELETE"):
                response = client.request(
                    method, f"{API}/model-servers/model-0/tasks/{GROUP_B_TASK}", headers=who.headers
                )
                assert response.status_code == 403, response.text
            assert client.get(f"{API}/model-servers/model-0/tasks", headers=who.headers).status_code == 403
    with unchanged(app):
        _error(
            client.delete(f"{API}/model-servers/model-0/tasks/dynasent-r2", headers=admin.headers),
            409,
            "in the loop of task 'dynasent-r2'",
        )
        _error(client.delete(f"{API}/model-servers/model-0/tasks/{GROUP_B_TASK}", headers=admin.headers), 404)
        _error(client.put(f"{API}/model-servers/model-0/tasks/no-such-task", headers=admin.headers), 404)
        _error(client.put(f"{API}/model-servers/nope/tasks/{GROUP_B_TASK}", headers=admin.headers), 404)
    listed = client.get(f"{API}/tasks/{GROUP_B_TASK}/model-servers", headers=bob.headers).json()
    assert [(g["server"], g["task"], g["shared"]) for g in listed["data"]] == [("model-b", GROUP_B_TASK, False)]
    with unchanged(app):  # another group's task: as if it did not exist
        assert client.get(f"{API}/tasks/dynasent-r2/model-servers", headers=bob.headers).status_code in (403, 404)

    assert client.put(f"{API}/model-servers/model-0/tasks/{GROUP_B_TASK}", headers=admin.headers).status_code == 200
    with unchanged(app):  # granting again changes nothing
        assert client.put(f"{API}/model-servers/model-0/tasks/{GROUP_B_TASK}", headers=admin.headers).status_code == 200
    grants = client.get(f"{API}/model-servers/model-0/tasks", headers=admin.headers).json()
    assert [g["task"] for g in grants["data"]] == ["dynasent-r2", GROUP_B_TASK]
    removed = client.delete(f"{API}/model-servers/model-0/tasks/{GROUP_B_TASK}", headers=admin.headers)
    assert removed.status_code == 200 and removed.json()["task"] == GROUP_B_TASK, removed.text
    with session_scope(app.state.sessionmaker) as session:
        actions = [
            (entry.action, (entry.details or {}).get("task"))
            for entry in session.scalars(
                select(AuditEntry).where(AuditEntry.action.like("model_server.%")).order_by(AuditEntry.id)
            )
            if entry.target_id == "model-0"
        ]
    assert actions[-2:] == [("model_server.grant", GROUP_B_TASK), ("model_server.revoke", GROUP_B_TASK)], actions


def test_a_promotion_checks_the_grant_again_when_it_runs(
    app: FastAPI, client: TestClient, admin: Actor, two_groups: dict[str, Any]
) -> None:
    """A job checked at submission may run later: the promotion itself asks again, with the
    job's author, before it calls the server (here the grant is gone): no request reaches it."""
    from rounds.models.promotion import promote
    from services.db.models import User
    from services.errors import Forbidden

    with recording_server() as registered:
        _register(client, admin, "model-c", registered.url)
        with session_scope(app.state.sessionmaker) as session:
            bob_id = session.scalar(select(User.id).where(User.username == "bob"))
        with unchanged(app), pytest.raises(Forbidden, match="'model-c' is not granted to task"):
            promote(
                app.state.sessionmaker,
                GROUP_B_TASK,
                two_groups["model_b"],
                server="model-c",
                force=True,
                actor_id=bob_id,
            )
        assert registered.requests == []


@pytest.mark.both_databases
def test_migration_0018_grants_each_server_to_the_tasks_that_use_it(fresh_database: str) -> None:
    """Existing deployments keep working: a server named in a task's rounds (open or closed) is
    granted to that task; one no round names is granted to none."""
    url = fresh_database
    upgrade(url, "0014")
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            for task_id, name in ((1, "a"), (2, "b"), (3, "c")):
                connection.execute(
                    text(
                        "INSERT INTO tasks (id, name, title, family, definition, definition_yaml, created_at) "
                        "VALUES (:i, :n, 'T', 'single_label', '{}', '', CURRENT_TIMESTAMP)"
                    ),
                    {"i": task_id, "n": name},
                )
            for server_id, name in ((1, "model-0"), (2, "shared"), (3, "idle")):
                connection.execute(
                    text(
                        "INSERT INTO model_servers (id, name, url, created_at, updated_at) "
                        "VALUES (:i, :n, 'http://127.0.0.1:8001', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    ),
                    {"i": server_id, "n": name},
                )
            for round_id, task_id, status, servers in (
                (1, 1, "closed", ["model-0"]),
                (2, 1, "collecting", ["model-0", "shared"]),
                (3, 2, "validating", ["shared", "removed-since"]),
                (4, 3, "collecting", []),
            ):
                connection.execute(
                    text(
                        "INSERT INTO rounds (id, task_id, number, status, model_servers, prompt_strategy, "
                        "no_prompt_fraction, target_label_mode, created_at) VALUES (:i, :t, :i, :s, :m, "
                        "'unused_first', 0, 'balanced', CURRENT_TIMESTAMP)"
                    ),
                    {"i": round_id, "t": task_id, "s": status, "m": json.dumps(servers)},
                )
        upgrade(url, "0018")
        with engine.connect() as connection:
            grants = connection.execute(
                text(
                    "SELECT s.name, t.name FROM model_server_grants g JOIN model_servers s ON s.id = g.server_id "
                    "JOIN tasks t ON t.id = g.task_id ORDER BY s.name, t.name"
                )
            ).all()
        assert [tuple(row) for row in grants] == [("model-0", "a"), ("shared", "a"), ("shared", "b")]
        downgrade(url, "0014")
        with engine.connect() as connection:
            assert "model_server_grants" not in inspect(connection).get_table_names()
    finally:
        engine.dispose()


def test_the_grant_and_revoke_commands(tmp_path: Path) -> None:
    """`dynaloop model servers grant/revoke` (the admin at the server's shell), and `list` shows
    the grants."""
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(cli, [*args, "--database-url", url], catch_exceptions=False)

    assert run("db", "upgrade").exit_code == 0
    assert run("task", "create", "dynasent-r2").exit_code == 0
    assert run("model", "servers", "register", "model-0", "http://127.0.0.1:8001").exit_code == 0
    result = run("model", "servers", "grant", "model-0", "dynasent-r2")
    assert result.exit_code == 0 and "model server model-0 granted to task dynasent-r2" in result.output, result.output
    assert "already granted" in run("model", "servers", "grant", "model-0", "dynasent-r2").output
    listed = run("model", "servers", "list")
    assert "dynasent-r2" in listed.output, listed.output
    missing = run("model", "servers", "grant", "model-0", "no-such-task")
    assert missing.exit_code == 1 and "no task 'no-such-task'" in missing.output, missing.output
    result = run("model", "servers", "revoke", "model-0", "dynasent-r2")
    assert result.exit_code == 0 and "revoked" in result.output, result.output
    again = run("model", "servers", "revoke", "model-0", "dynasent-r2")
    assert again.exit_code == 1 and "is not granted to task 'dynasent-r2'" in again.output, again.output


def test_an_admin_who_puts_a_server_in_a_tasks_loop_grants_it(
    client: TestClient, app: FastAPI, admin: Actor, two_groups: dict[str, Any]
) -> None:
    """A server in a task's loop scores that task's attempts, so it belongs to the task: when an
    admin puts group A's server in group B's round, the server is granted to B (audited) and is
    from then on shared, so group A's researcher may no longer swap it."""
    response = client.put(
        f"{API}/rounds/{two_groups['round_b']['id']}/model", json={"model_servers": ["model-0"]}, headers=admin.headers
    )
    assert response.status_code == 200, response.text
    grants = client.get(f"{API}/model-servers/model-0/tasks", headers=admin.headers).json()
    assert [(g["task"], g["shared"]) for g in grants["data"]] == [("dynasent-r2", True), (GROUP_B_TASK, True)]
    with unchanged(app):
        _error(
            client.post(
                f"{API}/tasks/dynasent-r2/jobs",
                json={"kind": "promote", "params": {"model_id": two_groups["model_a"], "server": "model-0"}},
                headers=two_groups["alice"].headers,
            ),
            403,
            "is shared with other tasks",
        )
