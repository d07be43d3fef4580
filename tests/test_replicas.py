"""Promotion that reaches every model-server replica (#15): replicas started with `dynaloop
model-server --follow-task` load their task's promoted model and swap themselves, and the
registry records which replica serves what (rounds.models.replicas, model_server.follow).

Real `dynaloop model-server` processes over real HTTP, on SQLite; the promote jobs, which the job
queue on the application database carries, on PostgreSQL too (``both_databases``,
tests/conftest.py). The rollout test serves the packaged MiniLM's real weights: the replicas must
load a real model while requests are in flight.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dynaloop.cli import app as cli
from model_server.config import ServerConfig
from model_server.follow import Follower, PromotedModel, ReplicaState, ReplicaStatus
from model_server.host import ModelHost
from model_server.metrics import Metrics
from rounds.models.init_model import init_model_dir
from rounds.models.job_runner import run_job
from rounds.models.jobs import create_job
from rounds.models.promotion import PromotionIncomplete, promote
from rounds.models.registry import list_models, register_model
from rounds.models.replicas import LIVE_WITHIN_S, list_replicas
from services.db.engine import session_scope
from services.db.models import Job, JobStatus, ModelReplica, ModelVersionStatus
from services.domain.tasks import create_task, get_task
from services.domain.users import get_user
from services.errors import Invalid
from tests.conftest import (
    MakeUser,
    dynaloop_command,
    dynaloop_process,
    example_yaml,
    free_port,
    model_server_process,
    register_model_server,
)

pytestmark = pytest.mark.timeout(600)

TASK = "dynasent-r2"
LABELS = ["positive", "negative", "neutral"]
TEXTS = ["the staff were lovely", "the soup was cold and the room was loud", "we got there at noon"]


def _set_version(directory: Path, version: str) -> None:
    path = directory / "dynaloop_model.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["version"] = version
    path.write_text(json.dumps(data), encoding="utf-8")


@dataclass
class Versions:
    v0: Path
    v1: Path


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Versions:
    """Two versions of a classifier on the packaged MiniLM's real weights (heads seeded differently)."""
    root = tmp_path_factory.mktemp("replicas-minilm")
    init_model_dir(root / "v0", labels=LABELS, model_id="minilm", seed=0)
    init_model_dir(root / "v1", labels=LABELS, model_id="minilm", seed=1)
    _set_version(root / "v1", "1")
    return Versions(root / "v0", root / "v1")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Versions:
    root = tmp_path_factory.mktemp("replicas-tiny")
    init_model_dir(root / "v0", labels=LABELS, tiny=True, model_id="tiny", seed=0)
    init_model_dir(root / "v1", labels=LABELS, tiny=True, model_id="tiny", seed=1)
    _set_version(root / "v1", "1")
    return Versions(root / "v0", root / "v1")


@pytest.fixture
def task(app: Any) -> str:
    with session_scope(app.state.sessionmaker) as session:
        return create_task(session, None, example_yaml(TASK, onboarding_quiz=None)).name


def _register(app: Any, *directories: Path) -> list[str]:
    with session_scope(app.state.sessionmaker) as session:
        return [register_model(session, get_task(session, TASK), d).name for d in directories]


def _env(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNALOOP_")}
    env.update(DYNALOOP_DATABASE_URL=database_url, PYTHONUNBUFFERED="1")
    return env


@dataclass
class Replica:
    name: str
    url: str
    log: Path

    def info(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/info", timeout=10).json()

    def serves(self) -> str:
        info = self.info()
        return f"{info['model_id']}@{info['version']}"


@contextmanager
def replica(database_url: str, name: str, log_dir: Path, *extra: str) -> Iterator[Replica]:
    """A real `dynaloop model-server --follow-task` process, yielded once its /health is 200."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        "model-server",
        "--follow-task",
        TASK,
        "--replica-name",
        name,
        "--advertise-url",
        url,
        "--follow-interval",
        "0.5",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--log-level",
        "warning",
        *extra,
    ]
    log = log_dir / f"{name}.log"
    with dynaloop_process(args, _env(database_url), log, url, start_timeout_s=120):
        yield Replica(name, url, log)


def _wait_for(what: str, check: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# --- the attacker's and the edge cases first ------------------------------------------------------


def test_replicas_route_refuses_other_groups_researchers_and_writers(
    app: FastAPI, client: TestClient, make_user: MakeUser
) -> None:
    owner, outsider, writer = (
        make_user("rita", "researcher"),
        make_user("omar", "researcher"),
        make_user("walt", "writer"),
    )
    with session_scope(app.state.sessionmaker) as session:
        task = create_task(
            session, None, example_yaml(TASK, onboarding_quiz=None), owner=get_user(session, "rita")
        ).name
        session.add(
            ModelReplica(
                task_id=get_task(session, task).id, name="model-1", url="http://10.0.0.7:8001", state="serving"
            )
        )
    url = f"/api/v1/tasks/{task}/model-replicas"

    refused = client.get(url, headers=outsider.headers)
    assert refused.status_code == 404, "another group's task reads as missing"
    assert refused.json()["error"]["message"] == f"no task {task!r}; list tasks with GET /api/v1/tasks"
    assert "10.0.0.7" not in refused.text
    assert client.get(url, headers=writer.headers).status_code == 403
    assert client.get(url).status_code == 401

    answer = client.get(url, headers=owner.headers)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (
        body["count"] == 1 and body["data"][0]["name"] == "model-1" and body["data"][0]["url"] == "http://10.0.0.7:8001"
    )
    assert body["data"][0]["live"] is True and body["live"] == 1


def test_a_replica_for_an_unknown_task_exits_with_a_clear_error(app: FastAPI, database_url: str) -> None:
    result = subprocess.run(
        [*dynaloop_command(), "model-server", "--follow-task", "no-such-task", "--port", str(free_port())],
        env=_env(database_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--follow-task: no task 'no-such-task'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_model_server_needs_a_model_or_a_task(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["model-server"], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "give --model DIR" in result.output and "--follow-task TASK" in result.output
    result = CliRunner().invoke(
        cli, ["model-server", "--follow-task", TASK, "--follow-interval", "60"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 1 and "--follow-interval must be between 0.1 and 5" in result.output


@pytest.mark.slow
def test_a_missing_promoted_directory_leaves_the_replica_failed_and_serving(
    app: FastAPI, database_url: str, task: str, tiny: Versions, tmp_path: Path
) -> None:
    v1 = tmp_path / "v1"
    shutil.copytree(tiny.v1, v1)
    v0_name, v1_name = _register(app, tiny.v0, v1)
    factory = app.state.sessionmaker
    promote(factory, TASK, v0_name, server=None, force=True, timeout_s=5)
    with replica(database_url, "r-1", tmp_path) as r1:
        assert r1.serves() == v0_name and r1.info()["replica"]["state"] == "serving"
        shutil.rmtree(v1)  # the promoted directory is gone (e.g. not on this host's volume)

        with pytest.raises(PromotionIncomplete) as raised:
            promote(factory, TASK, v1_name, server=None, force=True, timeout_s=60)

        message = raised.value.message
        assert f"{v1_name} is promoted in the registry, but not every replica serves it" in message, message
        assert f"r-1 failed to load it and still serves {v0_name}" in message and "no dynaloop_model.json" in message
        assert "The registry keeps" in message
        [view] = raised.value.promotion.replicas
        assert (view.name, view.state, view.serving, view.live) == ("r-1", "failed", v0_name, True)
        with session_scope(factory) as session:
            registry = {m.name: m.status for m in list_models(session, get_task(session, TASK))}
        assert registry == {v0_name: ModelVersionStatus.retired, v1_name: ModelVersionStatus.promoted}
        # It keeps serving the old model, and does not try the broken version at every poll.
        answer = httpx.post(f"{r1.url}/predict", json={"texts": TEXTS}, timeout=30)
        assert answer.status_code == 200 and answer.json()["model"]["version"] == "0"
        time.sleep(6 * 0.5)
        assert r1.log.read_text().count(f"could not load {v1_name}") == 1, r1.log.read_text()[-3000:]
        assert r1.info()["replica"]["state"] == "failed"

        # Fixed and promoted again: it loads it.
        shutil.copytree(tiny.v1, v1)
        result = CliRunner().invoke(
            cli,
            ["model", "promote", "--task", TASK, "--version", v1_name, "--force", "--database-url", database_url],
            env={"COLUMNS": "300"},
        )
        assert result.exit_code == 0, result.output
        assert f"promoted {v1_name}: of the 1 live replica(s), 1 serve it (r-1)" in result.output
        assert r1.serves() == v1_name

        listed = CliRunner().invoke(
            cli, ["model", "replicas", "--task", TASK, "--database-url", database_url], env={"COLUMNS": "300"}
        )
        assert listed.exit_code == 0 and "r-1" in listed.output and v1_name in listed.output, listed.output
        assert "1 of 1 live" in listed.output


# --- the follower in this process: a registry that cannot be reached -------------------------------


@dataclass
class FlakyRegistry:
    """A registry (model_server.follow.Registry) that can be made unreachable."""

    promoted: PromotedModel | None = None
    down: bool = False
    reports: list[ReplicaStatus] = field(default_factory=list)

    def promoted_model(self) -> PromotedModel | None:
        if self.down:
            raise ConnectionRefusedError("connection to the database refused")
        return self.promoted

    def report(self, status: ReplicaStatus) -> None:
        if self.down:
            raise ConnectionRefusedError("connection to the database refused")
        self.reports.append(status)


def _settle(follower: Follower) -> None:
    """One poll, then until the load it started (if any) is done, then one poll to report it."""
    follower.poll()
    loader = follower._loader
    if loader is not None:
        loader.join(60)
    follower.poll()


def test_a_follower_keeps_serving_while_the_registry_is_down(tiny: Versions) -> None:
    registry = FlakyRegistry(down=True)
    host = ModelHost(ServerConfig(model_dir=None, device="cpu", precision="fp32"), Metrics())
    follower = Follower(host, registry, interval_s=0.5, fallback_dir=tiny.v0)

    _settle(follower)  # the database is down at start: --model serves
    assert host.backend is not None and host.backend.metadata.version == "0"
    assert registry.reports == []

    registry.down = False
    registry.promoted = PromotedModel(7, "tiny", "1", str(tiny.v1), None)
    _settle(follower)
    assert host.backend.metadata.version == "1"
    assert registry.reports[-1].state is ReplicaState.serving and registry.reports[-1].target_model_version_id == 7

    registry.down = True  # down again: no exception, the model keeps serving
    for _ in range(3):
        follower.poll()
    assert host.backend.metadata.version == "1" and follower.state is ReplicaState.serving


# --- the rollout: two replicas, a promotion under load, a third replica ----------------------------


@dataclass
class Traffic:
    """Threads that send /predict to every replica in turn, counting answers by replica and model,
    with when each request was sent and answered."""

    urls: list[str]
    ok: Counter[tuple[str, str]] = field(default_factory=Counter)  # (url, version) -> answers
    spans: list[tuple[float, float]] = field(default_factory=list)  # (sent, answered), monotonic
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, offset: int) -> None:
        with httpx.Client(timeout=60) as http:
            turn = offset
            while not self.stop.is_set():
                url = self.urls[turn % len(self.urls)]
                turn += 1
                sent = time.monotonic()
                try:
                    answer = http.post(f"{url}/predict", json={"texts": TEXTS[: 1 + turn % 3]})
                except httpx.HTTPError as exc:
                    self.failures.append(f"{url}: {type(exc).__name__}: {exc}")
                    continue
                if answer.status_code != 200:
                    self.failures.append(f"{url}: HTTP {answer.status_code}: {answer.text[:300]}")
                    continue
                self.ok[(url, answer.json()["model"]["version"])] += 1
                self.spans.append((sent, time.monotonic()))

    def during(self, start: float, end: float) -> int:
        """Answered requests that were in flight at some moment between ``start`` and ``end``."""
        return sum(1 for sent, answered in self.spans if sent < end and answered > start)

    def total(self) -> int:
        return sum(self.ok.values())


@pytest.mark.slow
def test_promotion_reaches_every_replica_without_a_failed_request(
    app: FastAPI, database_url: str, task: str, minilm: Versions, tmp_path: Path
) -> None:
    v0_name, v1_name = _register(app, minilm.v0, minilm.v1)
    factory = app.state.sessionmaker
    first = promote(factory, TASK, v0_name, server=None, force=True, timeout_s=5)
    assert first.rollout is not None and first.rollout.complete and first.replicas == []

    with ExitStack() as stack:
        r1 = stack.enter_context(replica(database_url, "replica-1", tmp_path))
        r2 = stack.enter_context(replica(database_url, "replica-2", tmp_path))
        assert r1.serves() == r2.serves() == v0_name
        traffic = Traffic([r1.url, r2.url])
        senders = [threading.Thread(target=traffic.run, args=(i,), name=f"traffic-{i}") for i in range(4)]
        for sender in senders:
            sender.start()
        try:
            _wait_for("answers from both replicas", lambda: all(traffic.ok[(r.url, "0")] >= 20 for r in (r1, r2)), 120)

            promoting = time.monotonic()
            promotion = promote(factory, TASK, v1_name, server=None, force=True, timeout_s=120)
            promoted = time.monotonic()

            assert promotion.rollout is not None and promotion.rollout.complete
            assert [v.name for v in promotion.rollout.serving] == ["replica-1", "replica-2"]
            assert [m.name for m in promotion.retired] == [v0_name] and promotion.server is None
            assert r1.serves() == r2.serves() == v1_name
            r3 = stack.enter_context(replica(database_url, "replica-3", tmp_path))
            assert r3.serves() == v1_name  # a replica started after the promotion loads it at start
            traffic.urls.append(r3.url)
            _wait_for(
                "answers from the new model on every replica",
                lambda: all(traffic.ok[(r.url, "1")] >= 20 for r in (r1, r2, r3)),
                120,
            )
            # Enough answers to mean anything, however fast this machine sent them: the waits
            # above ask for 100 at least, and a busy 2-core machine once stopped at 147.
            _wait_for("150 answers in all", lambda: traffic.total() >= 150, 120)
        finally:
            traffic.stop.set()
            for sender in senders:
                sender.join(120)

        assert traffic.failures == [], traffic.failures[:5]
        assert traffic.total() >= 150, f"only {traffic.total()} requests: too few to mean anything"
        # The four senders each had requests in flight while the replicas loaded the new model and swapped.
        in_flight = traffic.during(promoting, promoted)
        assert in_flight >= 4, (promoted - promoting, in_flight)
        for r in (r1, r2):  # each swapped under traffic: it answered with the old and the new model
            assert traffic.ok[(r.url, "0")] > 0 and traffic.ok[(r.url, "1")] > 0, traffic.ok
        assert traffic.ok[(r3.url, "0")] == 0

        with session_scope(factory) as session:
            views = list_replicas(session, get_task(session, TASK))
        assert [(v.name, v.url, v.serving, v.state, v.live) for v in views] == [
            (r.name, r.url, v1_name, "serving", True) for r in (r1, r2, r3)
        ]
        assert all(v.precision == "fp32" and v.model_version_id == promotion.model.id for v in views)

    # Stopped replicas say so, and are no longer live.
    with session_scope(factory) as session:
        views = list_replicas(session, get_task(session, TASK))
    assert {(v.state, v.live) for v in views} == {("stopped", False)}
    assert LIVE_WITHIN_S <= 20


# --- promote jobs ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.both_databases
def test_promote_jobs_reach_the_following_replicas_with_or_without_a_server(
    app: FastAPI, database_url: str, task: str, tiny: Versions, tmp_path: Path
) -> None:
    v0_name, v1_name = _register(app, tiny.v0, tiny.v1)
    factory = app.state.sessionmaker
    with session_scope(factory) as session:
        ids = {m.name: m.id for m in list_models(session, get_task(session, TASK))}

    def job(params: dict[str, Any]) -> Job:
        with session_scope(factory) as session:
            created = create_job(session, None, get_task(session, TASK), "promote", params, data_dir=tmp_path)
        return run_job(factory, created.id, data_dir=tmp_path)

    unknown = {"model_id": ids[v1_name], "server": "nope"}
    with session_scope(factory) as session, pytest.raises(Invalid, match="leave server out to promote to the replicas"):
        create_job(session, None, get_task(session, TASK), "promote", unknown, data_dir=tmp_path)

    promote(factory, TASK, v0_name, server=None, force=True, timeout_s=5)
    with (
        replica(database_url, "r-1", tmp_path) as r1,
        model_server_process(tiny.v0, tmp_path / "pushed.log", "replicas-test-admin-token") as pushed,
    ):
        # Without a server: the job records the promotion and waits for the replica.
        done = job({"model_id": ids[v1_name], "force": True})
        assert done.status is JobStatus.succeeded, done.message + "\n" + done.log
        assert done.message == f"promoted {v1_name}: of the 1 live replica(s), 1 serve it (r-1); retired {v0_name}"
        assert done.result is not None
        [listed] = done.result["replicas"]
        assert (listed["name"], listed["url"], listed["serving"], listed["state"], listed["live"]) == (
            "r-1",
            r1.url,
            v1_name,
            "serving",
            True,
        )
        assert done.result["server"] is None and r1.serves() == v1_name

        # With a server: the hot swap of that server, as before; the following replica loads it too.
        server = register_model_server(app, pushed.url, admin_token="replicas-test-admin-token")
        done = job({"model_id": ids[v0_name], "server": server, "force": True})
        assert done.status is JobStatus.succeeded, done.message + "\n" + done.log
        assert done.message.startswith(f"promoted {v0_name}: model server {server} ({pushed.url}) now serves it")
        assert done.result is not None and done.result["replicas"] == []
        assert "replicas-test-admin-token" not in done.log
        _wait_for("the following replica to load the pushed promotion", lambda: r1.serves() == v0_name, 30)
