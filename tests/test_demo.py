"""`dynaloop demo`: the seed corpus, Model 0 and its cache, and the demo as a real process
(model server, API, clean stop on Ctrl-C / SIGTERM)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest

from dynaloop.demo import _STOP_SIGNALS, DEMO_PROMPTS, DEMO_TASK, SECRET_KEY_FILE, _stop_on_signals, _StopRequested
from dynaloop.model_zero import ModelZeroSpec, cache_key, ensure_model_zero, model_zero_dir
from dynaloop.processes import RUNNING_FILE, ServiceError, Supervisor, still_running
from dynaloop.seed_corpus import DEFAULT_PER_LABEL, SEED_LABELS, seed_corpus
from model_server.directory import ModelMetadata
from rounds.models.init_model import minilm_dir
from rounds.models.registry import register_model
from services.db.engine import make_engine, make_sessionmaker, session_scope
from services.domain.tasks import get_task
from services.taskdef import example_path, load_task_definition
from tests.demo_process import TINY_SPEC, alive, group_members, running_demo, tiny_model_cache
from tests.stub_model_server import ThreadedServer


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_cache(tmp_path_factory.getbasetemp() / "demo-model-cache")


# --- the seed corpus -------------------------------------------------------------------------


def test_seed_corpus_is_balanced_distinct_and_stable() -> None:
    corpus = seed_corpus()
    counts = {label: sum(1 for _, row_label in corpus if row_label == label) for label in SEED_LABELS}
    assert counts == dict.fromkeys(SEED_LABELS, DEFAULT_PER_LABEL)
    texts = [text.lower() for text, _ in corpus]
    assert len(set(texts)) == len(texts), "a sentence appears twice (or under two labels)"
    assert all(3 <= len(text.split()) <= 40 and text[0].isupper() for text, _ in corpus)
    prompts = {json.loads(line)["text"].lower() for line in DEMO_PROMPTS.read_text(encoding="utf-8").splitlines()}
    assert not prompts & set(texts), "the demo's prompts must not be in Model 0's training data"
    assert seed_corpus() == corpus  # deterministic: its hash keys the cache
    # Any prefix is balanced too (labels are interleaved), so a smaller corpus stays balanced.
    small = seed_corpus(per_label=20)
    assert [label for _, label in small[:6]] == list(SEED_LABELS) * 2
    assert {label: sum(1 for _, row_label in small if row_label == label) for label in SEED_LABELS} == dict.fromkeys(
        SEED_LABELS, 20
    )


def test_cache_key_changes_with_what_decides_the_weights() -> None:
    keys = {
        cache_key(spec)
        for spec in (
            ModelZeroSpec(),
            ModelZeroSpec(epochs=3),
            ModelZeroSpec(max_length=32),
            ModelZeroSpec(per_label=100),
            ModelZeroSpec(seed=1),
        )
    }
    assert len(keys) == 5
    assert cache_key(ModelZeroSpec()) == cache_key(ModelZeroSpec())
    with pytest.raises(ValueError, match="at least one epoch"):
        ModelZeroSpec(epochs=0)


# --- Model 0 ----------------------------------------------------------------------------------


def test_model_zero_is_trained_once_then_cached(model_cache: Path) -> None:
    directory = model_zero_dir(model_cache, TINY_SPEC)
    metadata_file = directory / "dynaloop_model.json"
    assert metadata_file.is_file()
    before = metadata_file.stat().st_mtime_ns

    again = ensure_model_zero(model_cache, TINY_SPEC, task_name=DEMO_TASK, progress=False)

    assert again.directory == directory and not again.trained
    assert metadata_file.stat().st_mtime_ns == before, "the cached Model 0 was trained again"
    metadata = ModelMetadata.load(directory)
    assert metadata.labels == list(SEED_LABELS) and metadata.task == DEMO_TASK
    assert Path(metadata.base_model) == minilm_dir(), "Model 0 starts from the packaged MiniLM"
    assert (metadata.model_extra or {})["training"]["epochs_run"] == 1
    assert not (directory / "checkpoints").exists(), "optimizer checkpoints are removed after training"
    assert not [p for p in directory.parent.iterdir() if p.name.startswith(".training-")]


# --- child processes ----------------------------------------------------------------------------

# A service that starts a grandchild which ignores SIGTERM, then waits.
_PARENT = """
import subprocess, sys, time
child = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
)
subprocess.Popen([sys.executable, '-c', child])
time.sleep(600)
"""


def test_supervisor_stops_a_service_with_everything_it_started(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    supervisor = Supervisor(logs)
    service = supervisor.start("sleeper", [sys.executable, "-c", _PARENT], url="-", health_url="http://127.0.0.1:9")
    deadline = time.monotonic() + 30
    while "ready" not in service.log_path.read_text(encoding="utf-8"):
        assert time.monotonic() < deadline and service.running()
        time.sleep(0.1)
    grandchildren = [child.pid for child in psutil.Process(service.pid).children()]
    assert len(grandchildren) == 1
    assert still_running(logs) == [f"sleeper (pid {service.pid})"]

    supervisor.stop_all(timeout_s=5)

    assert not alive(service.pid) and not alive(grandchildren[0]), "the SIGTERM-proof grandchild survived"
    assert still_running(logs) == [] and not (logs / RUNNING_FILE).exists()


def test_a_service_that_dies_while_starting_shows_its_log(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path / "logs")
    service = supervisor.start(
        "model server",
        [sys.executable, "-c", "print('cannot load the model'); exit(3)"],
        url="-",
        health_url="http://127.0.0.1:9/health",
    )
    try:
        with pytest.raises(ServiceError, match=r"(?s)exited with status 3.*cannot load the model"):
            supervisor.wait_healthy(service, timeout_s=30)
    finally:
        supervisor.stop_all()


# --- the demo as a process --------------------------------------------------------------------


def _writer_attempt(api: str) -> dict[str, object]:
    """Log in as the demo writer, pass the quiz, take an assignment and make one attempt."""
    with httpx.Client(base_url=f"{api}/api/v1", timeout=30) as http:
        login = http.post("/auth/login", json={"username": "writer", "password": "writer-demo-only"})
        assert login.status_code == 200, login.text
        headers = {"Authorization": f"Bearer {login.json()['token']}"}
        quiz = load_task_definition(example_path(DEMO_TASK)).onboarding_quiz
        assert quiz is not None
        answered = http.post(
            f"/tasks/{DEMO_TASK}/quiz/attempts",
            headers=headers,
            json={"answers": [question.answer for question in quiz.questions]},
        )
        assert answered.status_code == 200 and answered.json()["passed"], answered.text
        rounds = http.get("/rounds/open", headers=headers).json()
        round_id = next(r["id"] for r in rounds["data"] if r["task"] == DEMO_TASK)
        assignment = http.post(f"/rounds/{round_id}/assignments", headers=headers, json={})
        assert assignment.status_code in (200, 201), assignment.text
        attempt = http.post(
            f"/assignments/{assignment.json()['id']}/attempts",
            headers=headers,
            json={"text": "The waiter forgot our drinks, but the pasta was wonderful."},
        )
        assert attempt.status_code in (200, 201), attempt.text
        return attempt.json()


def demo_token(output: str, username: str) -> str:
    """The API token the demo printed for ``username`` (its `  USERNAME  TOKEN` line)."""
    found = re.search(rf"^  {re.escape(username)}\s+(\S+)$", output, re.MULTILINE)
    assert found, output
    return found.group(1)


def _check_study_links(output: str, api: str) -> None:
    """The demo's writer and validator study links open as new crowdworkers through the API."""
    links = dict(re.findall(r"^  (writer|validator) +http://\S+/study/([A-Za-z0-9_-]+)\?worker=demo-1$", output, re.M))
    assert set(links) == {"writer", "validator"}, output
    for role, slug in links.items():
        response = httpx.post(f"{api}/api/v1/study/{slug}/sessions", json={"params": {"worker": "demo-1"}}, timeout=30)
        assert response.status_code == 201, response.text
        started = response.json()
        assert started["session"]["role"] == role and started["session"]["status"] == "active"
        me = httpx.get(f"{api}/api/v1/me", headers={"Authorization": f"Bearer {started['token']}"}, timeout=30)
        assert role in me.json()["roles"]


def _check_client_token(output: str, api: str) -> None:
    """The printed `client` token reads tasks and datasets (round 1 is not built yet: the API
    says so, not that the token is refused) and is refused everything else."""
    token = demo_token(output, "client")
    curl = re.search(r"^export a built round .*: (curl .*)$", output, re.MULTILINE)
    assert curl, output
    dataset = f"{api}/api/v1/tasks/{DEMO_TASK}/rounds/1/dataset?split=train&format=jsonl"
    assert f'-H "Authorization: Bearer {token}" "{dataset}"' in curl.group(1)
    with httpx.Client(base_url=f"{api}/api/v1", timeout=30, headers={"Authorization": f"Bearer {token}"}) as http:
        me = http.get("/me")
        assert me.status_code == 200 and me.json()["roles"] == ["client"], me.text
        assert http.get(f"/tasks/{DEMO_TASK}").status_code == 200
        answer = http.get(dataset)
        assert answer.status_code == 404 and "has not been built yet" in answer.text, answer.text
        round_id = next(r["id"] for r in http.get("/rounds/open").json()["data"] if r["task"] == DEMO_TASK)
        refused = {
            "take an assignment": http.post(f"/rounds/{round_id}/assignments", json={}),
            "build a round": http.post(f"/rounds/{round_id}/build", json={}),
            "start a job": http.post(f"/tasks/{DEMO_TASK}/jobs", json={"kind": "evaluate", "params": {}}),
            "list users": http.get("/users"),
            "list model servers": http.get("/model-servers"),
        }
        assert {what: answer.status_code for what, answer in refused.items()} == dict.fromkeys(refused, 403), {
            what: answer.text for what, answer in refused.items()
        }
    anonymous = httpx.get(dataset, timeout=30)
    assert anonymous.status_code == 401, anonymous.text


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["ctrl-c", "terminal-closed"])
def test_demo_serves_model_zero_and_stops_every_child(tmp_path: Path, model_cache: Path, signum: int) -> None:
    with running_demo(tmp_path / "data", model_cache=model_cache) as demo:
        assert "cached" in demo.output, demo.output  # the session's Model 0: no training here
        pids = demo.service_pids()
        assert set(pids) == {"model server", "API"}, demo.output
        assert "web app not started (--no-ui)" in demo.output
        for url in (f"{demo.api_url}/health", f"{demo.model_url}/health"):
            assert httpx.get(url, timeout=10).status_code == 200, url
        info = httpx.get(f"{demo.model_url}/info", timeout=10).json()
        assert info["model_id"] == f"{DEMO_TASK}-model-0"
        for login in (
            "writer-demo-only",
            "validator1-demo-only",
            "researcher-demo-only",
            "admin-demo-only",
            "client-demo-only",
        ):
            assert login in demo.output
        _check_client_token(demo.output, demo.api_url)

        attempt = _writer_attempt(demo.api_url)

        assert attempt["status"] == "scored", attempt
        assert attempt["model_id"] == info["model_id"] and attempt["model_version"] == info["version"]
        probabilities = attempt["probabilities"]
        assert isinstance(probabilities, dict) and set(probabilities) == set(SEED_LABELS)
        assert abs(sum(probabilities.values()) - 1.0) < 1e-3

        assert demo.stop(signum) == 0, demo.output
        assert "every service it started is down" in demo.output
        assert [name for name, pid in pids.items() if alive(pid)] == []
        assert group_members(set(pids.values())) == [], "a child of a service outlived it"


def test_after_the_first_stop_signal_the_next_ones_are_ignored_until_the_demo_ends() -> None:
    """In the demo's own process: the first SIGTERM raises the stop, a second one (the clean-up
    is under way) is ignored, and the handlers the process had come back when the demo ends."""
    before = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    with _stop_on_signals():
        with pytest.raises(_StopRequested):
            signal.raise_signal(signal.SIGTERM)  # its handler runs (and raises) in this, the main thread
        assert all(signal.getsignal(signum) == signal.SIG_IGN for signum in _STOP_SIGNALS)
        signal.raise_signal(signal.SIGINT)  # ignored: no KeyboardInterrupt, no second stop
    assert {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS} == before


@pytest.mark.integration
def test_demo_uses_an_external_model_server_when_given_one(tmp_path: Path, stub_model: ThreadedServer) -> None:
    with running_demo(tmp_path / "data", "--model-endpoint", stub_model.url) as demo:
        assert "Model 0" not in demo.output and not (tmp_path / "data" / "models").exists()
        pids = demo.service_pids()
        assert set(pids) == {"API"}
        assert f"({stub_model.url}) (external, registered)" in demo.output
        # The API runs with the demo's own random pseudonym key, not the placeholder.
        secret = (tmp_path / "data" / SECRET_KEY_FILE).read_text().strip()
        environment = Path(f"/proc/{pids['API']}/environ").read_bytes().split(b"\0")
        assert f"DYNALOOP_SECRET_KEY={secret}".encode() in environment
        attempt = _writer_attempt(demo.api_url)
        assert attempt["status"] == "scored" and attempt["model_id"] == "stub-model"
        _check_study_links(demo.output, demo.api_url)
        assert demo.stop(signal.SIGTERM) == 0


@contextmanager
def _researcher(api: str) -> Iterator[httpx.Client]:
    """The demo researcher's API client, logged in with the printed password."""
    with httpx.Client(base_url=f"{api}/api/v1", timeout=30) as http:
        login = http.post("/auth/login", json={"username": "researcher", "password": "researcher-demo-only"})
        assert login.status_code == 200, login.text
        http.headers["Authorization"] = f"Bearer {login.json()['token']}"
        yield http


def _second_model(data_dir: Path, model_zero: Path) -> Path:
    """Model 0's weights under another model id and version, as a retrain would register them
    (hard links: the weights are not copied; the metadata file is a new one)."""
    directory = data_dir / "promoted" / "dynasent-r2-for-round-2"
    shutil.copytree(model_zero, directory, copy_function=os.link)
    metadata = ModelMetadata.load(directory)
    (directory / "dynaloop_model.json").unlink()
    metadata.model_copy(update={"model_id": f"{DEMO_TASK}-for-round-2", "version": "2"}).save(directory)
    return directory


@pytest.mark.integration
def test_a_restarted_demo_keeps_the_researchers_promotion_and_rounds(tmp_path: Path, model_cache: Path) -> None:
    """Issue 28, item 3: the researcher promotes another model with a promote job; a rerun
    serves that model (Model 0 stays retired), opens no other round and leaves the rounds as
    the researcher left them; a promoted model whose folder is gone stops the start."""
    data = tmp_path / "data"
    second = _second_model(tmp_path, model_zero_dir(model_cache, TINY_SPEC))
    with running_demo(data, model_cache=model_cache) as demo:
        assert "cached" in demo.output, demo.output
        engine = make_engine(f"sqlite:///{(data / 'dynaloop.db').resolve()}")
        try:
            with session_scope(make_sessionmaker(engine)) as session:
                task = get_task(session, DEMO_TASK)
                model_id = register_model(session, task, second).id
        finally:
            engine.dispose()
        with _researcher(demo.api_url) as http:
            job = http.post(
                f"/tasks/{DEMO_TASK}/jobs",
                json={"kind": "promote", "params": {"model_id": model_id, "server": "model-0", "force": True}},
            )
            assert job.status_code == 202, job.text
            deadline = time.monotonic() + 120
            while (state := http.get(f"/jobs/{job.json()['id']}").json())["status"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline, state
                time.sleep(0.5)
            assert state["status"] == "succeeded", state
        assert httpx.get(f"{demo.model_url}/info", timeout=10).json()["model_id"] == f"{DEMO_TASK}-for-round-2"
        assert demo.stop() == 0, demo.output

    def registry(http: httpx.Client) -> dict[str, str]:
        return {m["model_id"]: m["status"] for m in http.get(f"/tasks/{DEMO_TASK}/models").json()["data"]}

    with running_demo(data, model_cache=model_cache) as demo:  # new ports: the model server's address changes
        assert f"model: {DEMO_TASK}-for-round-2@2, the task's promoted model" in demo.output, demo.output
        assert "Model 0:" not in demo.output
        info = httpx.get(f"{demo.model_url}/info", timeout=10).json()
        assert (info["model_id"], info["version"]) == (f"{DEMO_TASK}-for-round-2", "2")
        attempt = _writer_attempt(demo.api_url)
        assert attempt["model_id"] == f"{DEMO_TASK}-for-round-2" and attempt["model_version"] == "2", attempt
        with _researcher(demo.api_url) as http:
            assert registry(http) == {f"{DEMO_TASK}-model-0": "retired", f"{DEMO_TASK}-for-round-2": "promoted"}
            promoted = next(
                m for m in http.get(f"/tasks/{DEMO_TASK}/models").json()["data"] if m["status"] == "promoted"
            )
            assert promoted["endpoint"] == demo.model_url  # recorded at this start's address
            rounds = http.get(f"/tasks/{DEMO_TASK}/rounds").json()["data"]
            assert [(r["number"], r["status"], r["model_servers"]) for r in rounds] == [(1, "collecting", ["model-0"])]
            closed = http.post(f"/rounds/{rounds[0]['id']}/status", json={"status": "closed"})
            assert closed.status_code == 200 and closed.json()["study_links_closed"] == 2, closed.text
            kept = rounds[0]["id"], len(http.get(f"/tasks/{DEMO_TASK}/study-links").json()["data"])
        assert demo.stop() == 0, demo.output

    with running_demo(data, model_cache=model_cache) as demo:  # round 1 closed: no round 2, no new links
        assert "round 1 (id" in demo.output and "round 1 is closed; a rerun opens no other round" in demo.output
        assert not re.search(r"^  (writer|validator) +http://", demo.output, re.M), demo.output
        assert "takes no workers: the round of this study link is closed" in demo.output
        with _researcher(demo.api_url) as http:
            rounds = http.get(f"/tasks/{DEMO_TASK}/rounds").json()["data"]
            assert [(r["number"], r["status"]) for r in rounds] == [(1, "closed")]
            assert (rounds[0]["id"], len(http.get(f"/tasks/{DEMO_TASK}/study-links").json()["data"])) == kept
            assert registry(http) == {f"{DEMO_TASK}-model-0": "retired", f"{DEMO_TASK}-for-round-2": "promoted"}
        assert httpx.get(f"{demo.model_url}/info", timeout=10).json()["model_id"] == f"{DEMO_TASK}-for-round-2"
        assert demo.stop() == 0, demo.output

    shutil.rmtree(second)
    with running_demo(data, model_cache=model_cache, timeout_s=60) as demo:
        assert demo.process.wait(timeout=60) == 1
    assert f"the task's promoted model {DEMO_TASK}-for-round-2@2 is served from {second}" in demo.output
    assert "put the folder back, or retire the model" in demo.output and demo.service_pids() == {}


def test_demo_refuses_a_port_in_use(tmp_path: Path) -> None:
    # As if an earlier demo with this data directory had been killed with SIGKILL, leaving its
    # API (here: this process) running.
    logs = tmp_path / "data" / "logs"
    logs.mkdir(parents=True)
    (logs / RUNNING_FILE).write_text(json.dumps([{"name": "API", "pid": os.getpid(), "url": "-"}]))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with running_demo(tmp_path / "data", "--port", str(port), timeout_s=60) as demo:
            assert demo.process.wait(timeout=30) == 1
    assert f"port {port} on 127.0.0.1 is in use" in demo.output and "--port" in demo.output
    assert f"left API (pid {os.getpid()}) running" in demo.output
    assert not (tmp_path / "data" / "models").exists(), "nothing is trained when the demo cannot start"
