"""Shared fixtures: a real database (SQLite always, PostgreSQL when
DYNALOOP_TEST_POSTGRES_URL is set), the API app, and a real HTTP stub model server."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# pytest-xdist's workers start with COLUMNS=80, and a rich Console made while COLUMNS is set keeps
# that width for good: the CLI's module-level consoles would then ignore the COLUMNS a test gives
# CliRunner, and wrap its tables and messages at 80 columns in a worker but not in a plain run.
os.environ.pop("COLUMNS", None)

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from dynaloop.api.app import create_app
from services.db.engine import session_scope
from services.db.migrate import upgrade
from services.db.models import Base
from services.domain import users
from services.settings import Settings
from services.taskdef import example_path
from tests.stub_model_server import ThreadedServer, create_stub_app

# Fixtures that live in their own modules.
pytest_plugins = ["tests.built_round", "tests.frontend_live"]

POSTGRES_URL = os.environ.get("DYNALOOP_TEST_POSTGRES_URL")
POSTGRESQL = pytest.param(
    "postgresql",
    marks=pytest.mark.skipif(not POSTGRES_URL, reason="DYNALOOP_TEST_POSTGRES_URL is not set (.ci/run sets it)"),
)
BACKENDS = ["sqlite", POSTGRESQL]

# Which tests run on both databases. A test that uses the database (the ``database_url``,
# ``settings``, ``app`` or ``client`` fixtures) runs on SQLite alone, unless it is marked
# ``both_databases`` (a test, a class, or a module through ``pytestmark``): then it runs once per
# backend of BACKENDS. The second run is worth its time where the database's own behaviour is what
# is tested: constraints, concurrency and locking, JSON columns, types, migrations, transactions
# (a refused request that wrote nothing: "database unchanged" checks), ordering, upserts,
# sequences, the idempotency of money (payments, bonuses, completion codes, ledgers, payouts)
# and the job queue on the application database. A test of parsing, validation, authorization,
# a file format or a page, where the database only stores rows and hands them back, stays on
# SQLite. Each feature keeps at least one end-to-end case on both databases. A test marked
# ``postgres`` runs on PostgreSQL alone (it tests what only PostgreSQL does); both markers skip
# the PostgreSQL case when DYNALOOP_TEST_POSTGRES_URL is not set. docs/testing.md says the same
# for contributors; the markers are declared in pyproject.toml (``--strict-markers``).


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Give every test that uses ``database_url`` its backends (the rule above)."""
    if "database_url" not in metafunc.fixturenames:
        return
    if any("database_url" in mark.args[0] for mark in metafunc.definition.iter_markers("parametrize")):
        return  # the test chose its databases itself
    if metafunc.definition.get_closest_marker("postgres") is not None:
        backends: list[Any] = [POSTGRESQL]
    elif metafunc.definition.get_closest_marker("both_databases") is not None:
        backends = BACKENDS
    else:
        backends = ["sqlite"]
    metafunc.parametrize("database_url", backends, indirect=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: The most one readiness poll waits for its answer. A server that is loading a model answers
#: /health from the same process that loads it, and on a loaded CI machine one answer took longer
#: than httpx's default of 5 s (an ``httpx.ReadTimeout`` that failed a passing test); the poll's
#: deadline, not this, bounds the wait.
HEALTH_POLL_TIMEOUT_S = 30.0


def wait_until_healthy(url: str, timeout_s: float, *, running: Callable[[], bool] = lambda: True) -> str | None:
    """Poll ``GET url`` until it answers 200 or ``timeout_s`` passes (or ``running()`` turns
    false, for a server in a process that may exit). A refused connection or a slow answer is
    retried until the deadline. Returns None once it answered 200, else the last thing it said
    (``HTTP 503: ...`` or the transport error), for the caller's failure message."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while running() and (left := deadline - time.monotonic()) > 0:
        try:
            response = httpx.get(url, timeout=min(HEALTH_POLL_TIMEOUT_S, max(left, 1.0)))
        except httpx.TransportError as exc:  # not listening yet, or too busy to answer in time
            last = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code == 200:
                return None
            last = f"HTTP {response.status_code}: {response.text[:300]}"
        time.sleep(0.05)
    return last


def serve_model(config: Any) -> ThreadedServer:
    """A real model server (``model_server.app``, a ``ServerConfig``) on a free port in a thread,
    returned once its /health answers 200 (its model is loaded)."""
    from model_server.app import create_model_app

    server = ThreadedServer(create_model_app(config), free_port())
    server.config.lifespan = "on"
    server.start()
    not_ready = wait_until_healthy(f"{server.url}/health", 60)
    assert not_ready is None, f"the model never became ready: {not_ready}"
    return server


def dynaloop_command() -> list[str]:
    """How to run the `dynaloop` console command of this environment as a subprocess."""
    script = Path(sys.executable).with_name("dynaloop")
    if script.exists():
        return [str(script)]
    found = shutil.which("dynaloop")
    return [found] if found else [sys.executable, "-c", "from dynaloop.cli import app; app()"]


@dataclass
class ModelServerProcess:
    url: str
    popen: subprocess.Popen[bytes]
    log: Path

    def info(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/info", timeout=5).json()


@pytest.fixture
def app_server(app: FastAPI) -> Iterator[ThreadedServer]:
    """The app of the `app` fixture served by uvicorn on a real port (real HTTP, real sockets)."""
    running = ThreadedServer(app, free_port()).start()
    yield running
    running.stop()
    app.state.model_client.close()
    app.state.engine.dispose()


@contextmanager
def dynaloop_process(
    args: list[str], env: dict[str, str], log: Path, url: str, *, start_timeout_s: float = 90
) -> Iterator[subprocess.Popen[bytes]]:
    """``dynaloop ARGS`` as a real process in a session of its own, its output in ``log``; yields
    the process once ``{url}/health`` answers 200, and stops its whole process group on exit.
    Fails the test with the log's tail if it exits or does not answer in ``start_timeout_s``."""
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [*dynaloop_command(), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        not_ready = wait_until_healthy(f"{url}/health", start_timeout_s, running=lambda: popen.poll() is None)
        if not_ready is not None:
            if popen.poll() is not None:
                pytest.fail(f"`dynaloop {args[0]}` exited with {popen.returncode}:\n{log.read_text()[-3000:]}")
            pytest.fail(f"`dynaloop {args[0]}` did not start ({not_ready}):\n{log.read_text()[-3000:]}")
        yield popen
    finally:
        stop_process_group(popen, 10)


def stop_process_group(popen: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the process's group, SIGKILL it after ``timeout_s``; nothing if it already ended."""
    if popen.poll() is None:
        os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=5)


@contextmanager
def model_server_process(model_dir: Path, log: Path, admin_token: str) -> Iterator[ModelServerProcess]:
    """A real `dynaloop model-server` process for ``model_dir`` with reloads enabled; stopped
    (its whole process group) on exit. Fails the test with the server's log if it cannot start."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNALOOP_")}
    env.update(DYNALOOP_MODEL_SERVER_ADMIN_TOKEN=admin_token, PYTHONUNBUFFERED="1")
    url = f"http://127.0.0.1:{port}"
    args = ["model-server", "--model", str(model_dir), "--port", str(port), "--device", "cpu", "--log-level", "warning"]
    with dynaloop_process(args, env, log, url) as popen:
        yield ModelServerProcess(url, popen, log)


@contextmanager
def worker_process(
    app: FastAPI, queue: str, name: str, log: Path, *extra: str, environment: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A real `dynaloop worker` on the app's database (with ``environment`` added to its
    environment); yields once it has registered; its process group is stopped on exit (a test
    that killed it already is fine)."""
    settings = app.state.settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNALOOP_")}
    env.update(DYNALOOP_DATA_DIR=str(settings.data_dir), PYTHONUNBUFFERED="1", **(environment or {}))
    if settings.data_root is not None:  # the worker reads what the API allowed, from the same root
        env["DYNALOOP_DATA_ROOT"] = str(settings.data_root)
    args = ["worker", "--queue", queue, "--name", name, "--database-url", settings.resolved_database_url, *extra]
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [*dynaloop_command(), *args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while not _registered(app, name, popen.pid):
            if popen.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"worker {name} did not register:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield popen
    finally:
        stop_process_group(popen, 20)


def _registered(app: FastAPI, name: str, pid: int) -> bool:
    from services.db.models import JobWorker

    with app.state.sessionmaker() as session:
        row = session.scalar(select(JobWorker).where(JobWorker.name == name))
        return row is not None and row.pid == pid and row.stopped_at is None


@contextmanager
def fresh_postgres_database(server_url: str | None = None) -> Iterator[str]:
    """A new, empty database on the PostgreSQL server of ``server_url`` (default:
    DYNALOOP_TEST_POSTGRES_URL); yields its URL and drops it afterwards, even on failure."""
    server_url = server_url or POSTGRES_URL
    assert server_url is not None, "DYNALOOP_TEST_POSTGRES_URL is not set"
    server = make_url(server_url)
    name = f"dynaloop_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield server.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as connection:
                connection.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": name},
                )
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One migrated database per backend for the whole session; tables are emptied per test."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("db") / "dynaloop.db"
        url = f"sqlite:///{path}"
        upgrade(url)
        yield url
        return
    with fresh_postgres_database() as url:
        upgrade(url)
        yield url


def empty_tables(url: str) -> None:
    """Every table emptied, children first, and (PostgreSQL) every id sequence back at its start,
    as a fresh database has them. DELETE, not TRUNCATE: a TRUNCATE of every table cost PostgreSQL
    about half a second per test (it gives each table new files), a DELETE of the few rows one
    test wrote a few hundredths. SQLite numbers ids from the largest one left, so from 1 again."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            for table in reversed(Base.metadata.sorted_tables):
                connection.execute(table.delete())
            if engine.dialect.name == "postgresql":
                connection.execute(
                    text(
                        "SELECT setval(format('%I.%I', schemaname, sequencename)::regclass, start_value, false) "
                        "FROM pg_sequences WHERE schemaname = current_schema()"
                    )
                )
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def stub_model() -> Iterator[ThreadedServer]:
    server = ThreadedServer(create_stub_app(["positive", "negative", "neutral"]), free_port()).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def stub_multi_label_model() -> Iterator[ThreadedServer]:
    labels = ["anger", "disgust", "fear", "joy", "sadness", "surprise", "neutral"]
    server = ThreadedServer(create_stub_app(labels, multi_label=True), free_port()).start()
    yield server
    server.stop()


@pytest.fixture(autouse=False)
def reset_stubs(stub_model: ThreadedServer) -> Iterator[None]:
    # A generous timeout: on a loaded machine httpx's default of 5 s timed out here (an error at
    # a passing test's teardown), though the stub answers.
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "normal"}, timeout=60)
    yield
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "normal"}, timeout=60)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    empty_tables(database_url)
    return Settings(
        database_url=database_url,
        environment="test",
        secret_key="test-suite-secret-key-0123456789",
        data_dir=tmp_path,
        model_retries=1,
        model_timeout_s=2.0,
        retry_after_s=3,
        max_request_bytes=256 * 1024,
    )


@pytest.fixture
def app(settings: Settings, reset_stubs: None) -> Iterator[FastAPI]:
    app = create_app(settings)
    yield app
    # Close the app's pooled connections now, not whenever its engine is collected: the test
    # workers run side by side, and PostgreSQL takes 100 connections in all.
    app.state.engine.dispose()


@pytest.fixture
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


@dataclass
class Actor:
    """A user and the headers that authenticate them."""

    username: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


class MakeUser(Protocol):
    """The ``make_user`` fixture: creates a user with the roles and a token for them."""

    def __call__(self, username: str, *roles: str) -> Actor: ...


@pytest.fixture
def make_user(app: Any) -> MakeUser:
    def _make(username: str, *roles: str) -> Actor:
        with session_scope(app.state.sessionmaker) as session:
            user = users.create_user(session, None, username, list(roles))
            _, token = users.issue_token(session, None, user)
        return Actor(username, token)

    return _make


@pytest.fixture
def researcher(make_user: MakeUser) -> Actor:
    return make_user("rita", "researcher")


@pytest.fixture
def writer(make_user: MakeUser) -> Actor:
    return make_user("walt", "writer")


@pytest.fixture
def validators(make_user: MakeUser) -> list[Actor]:
    return [make_user(f"val{i}", "validator") for i in range(1, 7)]


def example_yaml(name: str, **overrides: Any) -> str:
    """A shipped example task's YAML, with top-level keys replaced (e.g. no quiz).

    The shipped task's ``quality`` section (control items, issue 26) is left out unless the test
    passes ``quality``: a task with control items refuses labels by example id (the tests label
    through the example's id) and puts control items in every batch a test reads. Its ``pay``
    block is left out too unless the test passes ``pay``, so that a test computes a ledger only
    where it says what the pay policy is; and its ``attention_checks`` section (writers'
    attention checks) unless the test passes ``attention_checks``: it would stop a writer's
    every fifth new assignment."""
    import yaml

    data = yaml.safe_load(example_path(name).read_text(encoding="utf-8"))
    data.pop("quality", None)
    data.pop("pay", None)
    data.pop("attention_checks", None)
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


def register_model_server(app: Any, url: str, *, admin_token: str | None = None, tasks: Sequence[str] = ()) -> str:
    """Register ``url`` as a model server, as an admin would (``POST /model-servers``), grant it
    to ``tasks`` (``PUT /model-servers/{name}/tasks/{task}``), and return its name; a URL
    registered already keeps its name."""
    from services.domain import model_servers

    with session_scope(app.state.sessionmaker) as session:
        found = model_servers.find_by_url(session, url)
        if found is None:
            taken = [server.name for server in model_servers.list_servers(session)]
            name = model_servers.name_for_url(model_servers.check_url(url), taken)
            found = model_servers.register(session, None, name, url, admin_token=admin_token)
        elif admin_token is not None:
            model_servers.update(session, None, found, admin_token=admin_token)
        _REGISTERED_IN[found.name] = app
        name = found.name
    for task in tasks:
        grant_model_server(app, name, task)
    return name


#: The app each server name was last registered in, so that :func:`open_round` can grant it to
#: the new task also when it talks to the API over real HTTP.
_REGISTERED_IN: dict[str, Any] = {}


def grant_model_server(app: Any, name: str, task: str) -> None:
    """Grant the registered server ``name`` to ``task``, as an admin would (``PUT
    /model-servers/{name}/tasks/{task}``)."""
    from services.domain import model_servers, tasks

    with session_scope(app.state.sessionmaker) as session:
        model_servers.grant(session, None, model_servers.get_server(session, name), tasks.get_task(session, task))


def open_round(
    client: TestClient | httpx.Client,
    researcher: Actor,
    yaml_text: str,
    endpoint: str | None,
    prompts: list[str] | None = None,
    **round_options: Any,
) -> dict[str, Any]:
    """Create a task from YAML, open round 1 with the model server ``endpoint`` (a URL, which is
    registered first, as an admin would; or the name of a registered server), granted to the new
    task as an admin would, and import prompts."""
    if endpoint is not None and "://" in endpoint:
        assert isinstance(client, TestClient), "register the server first (register_model_server) and pass its name"
        endpoint = register_model_server(client.app, endpoint)
    response = client.post(
        "/api/v1/tasks",
        content=yaml_text.encode("utf-8"),
        headers={**researcher.headers, "Content-Type": "application/yaml"},
    )
    assert response.status_code == 201, response.text
    task = response.json()["name"]
    if endpoint is not None:  # an admin grants the server to the new task
        app = client.app if isinstance(client, TestClient) else _REGISTERED_IN.get(endpoint)
        if app is not None:
            grant_model_server(app, endpoint, task)
    body = {"model_servers": [endpoint] if endpoint else [], **round_options}
    response = client.post(f"/api/v1/tasks/{task}/rounds", json=body, headers=researcher.headers)
    assert response.status_code == 201, response.text
    round_ = response.json()
    if prompts:
        import json

        lines = "\n".join(json.dumps({"text": p, "id": f"p{i}"}) for i, p in enumerate(prompts))
        response = client.post(
            f"/api/v1/rounds/{round_['id']}/prompts",
            content=lines.encode("utf-8"),
            headers={**researcher.headers, "Content-Type": "application/x-ndjson"},
        )
        assert response.status_code == 200, response.text
    return round_


def label_example(
    client: TestClient | httpx.Client,
    validator: Actor,
    example_id: int,
    value: Any,
    *,
    round_id: int | None = None,
    **body: Any,
) -> Any:
    """Label an example as a validator's client does: fetch the validator's batch first (a label
    is accepted only for an example served in the validator's live batch, issue 26), then post
    the label by the example's id. Without ``round_id`` the example's round is read from the
    test client's database."""
    if round_id is None:
        assert isinstance(client, TestClient), "give round_id when the client is not the in-process one"
        from services.db.models import Example

        with client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
            round_id = session.get(Example, example_id).round_id
    client.get(f"/api/v1/rounds/{round_id}/validation-batch", headers=validator.headers)
    return client.post(
        f"/api/v1/examples/{example_id}/validations", json={"label": value, **body}, headers=validator.headers
    )


def served_examples(client: TestClient, batch: dict[str, Any]) -> list[int | None]:
    """The example behind each item of a served batch, in the order shown (None for a control
    item). The validator sees only opaque item ids; a test reads what each one is from the
    database."""
    return served_examples_of(client.app, batch)  # type: ignore[arg-type]


def served_examples_of(app: FastAPI, batch: dict[str, Any]) -> list[int | None]:
    """:func:`served_examples`, given the app rather than its test client."""
    from services.db.models import ValidationBatchItem

    keys = [item["item_id"] for item in batch["data"]]
    with app.state.sessionmaker() as session:
        found = dict(
            session.execute(
                select(ValidationBatchItem.item_key, ValidationBatchItem.example_id).where(
                    ValidationBatchItem.item_key.in_(keys)
                )
            ).all()
        )
    return [found[key] for key in keys]


def label_served(
    client: TestClient, validator: Actor, round_id: int, label_for: Callable[[int | None], Any]
) -> list[int]:
    """Label every batch the validator is served in the round, as a validator does, until none
    is left: ``label_for(example_id)`` gives each item's label (``example_id`` None for a control
    item); a None label stops (the batch stays the validator's). Returns the examples labelled."""
    labelled: list[int] = []
    while True:
        response = client.get(f"/api/v1/rounds/{round_id}/validation-batch", headers=validator.headers)
        assert response.status_code == 200, response.text
        batch = response.json()
        if not batch["data"]:
            return labelled
        # Examples by id, then control items: a validator may label a batch's items in any order,
        # and a fixed order keeps the labels' order (and what a build computes from it) the same
        # from run to run, whatever order the batch was shuffled into.
        items = sorted(
            zip(batch["data"], served_examples(client, batch), strict=True),
            key=lambda pair: (pair[1] is None, pair[1] or 0, pair[0]["text"]),
        )
        for item, example_id in items:
            value = label_for(example_id)
            if value is None:
                return labelled
            answer = client.post(
                f"/api/v1/validation-items/{item['item_id']}/validations",
                json={"label": value},
                headers=validator.headers,
            )
            assert answer.status_code == 201, answer.text
            if example_id is not None:
                labelled.append(example_id)


def table_counts(app: Any) -> dict[str, int]:
    """Row counts of every table: compared before and after a rejected request."""
    with app.state.engine.connect() as connection:
        return {
            table.name: connection.execute(text(f'SELECT COUNT(*) FROM "{table.name}"')).scalar_one()
            for table in Base.metadata.sorted_tables
        }


def table_snapshot(app: Any, *tables: str) -> dict[str, list[tuple[Any, ...]]]:
    """Full contents of the named tables (every column), for 'nothing changed' assertions."""
    with app.state.engine.connect() as connection:
        snapshot = {}
        for name in tables:
            keys = ", ".join(f'"{column.name}"' for column in Base.metadata.tables[name].primary_key.columns)
            snapshot[name] = [tuple(row) for row in connection.execute(text(f'SELECT * FROM "{name}" ORDER BY {keys}'))]
        return snapshot


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first: the browser's golden path, then the tests that start processes
    (``integration``) and those marked ``slow`` (ten seconds or more), then the rest in the order
    collected. The parallel run (pytest-xdist's ``worksteal``: each worker takes a share of the list
    in order and, when done, takes from the end of another's) then ends on short tests, rather
    than on a four-minute test that one worker started last while the other sat idle."""

    def first_when_long(item: pytest.Item) -> int:
        for rank, marker in enumerate(("browser", "integration", "slow")):
            if item.get_closest_marker(marker) is not None:
                return rank
        return 3

    items.sort(key=first_when_long)  # a stable sort: the collected order within each rank


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``--numprocesses=auto`` (pyproject.toml): one worker more than the cores, at most four. Each
    worker is its own pytest session with its own SQLite file and its own PostgreSQL database (the
    ``database_url`` fixture), stub model servers and free ports, so workers share nothing but the
    machine. Many tests spend part of their time waiting on a process they started (a server
    loading its model, a job's process importing torch, the browser): on 2 cores, three workers
    had the suite 0.15 further along after 12 minutes than two (docs/testing.md). More than four
    would only compete for the cores that training tests need."""
    return max(1, min((os.cpu_count() or 1) + 1, 4))
