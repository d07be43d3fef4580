"""Jobs (rounds/models/jobs.py, rounds/models/job_runner.py): train, evaluate and promote run outside the
API with progress, on a real database (SQLite; PostgreSQL too when DYNALOOP_TEST_POSTGRES_URL is
set), a built round, a tiny model, a real `dynaloop model-server` process, a real `dynaloop worker`
and its `dynaloop job run` processes (more of the queue and the workers in tests/test_workers.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from model_server.directory.runtime import PRECISION_CHECK_FILE
from rounds.models import job_runner, jobs
from rounds.models.init_model import init_model_dir
from rounds.models.job_runner import JobRunner, run_job
from rounds.models.jobs import create_job
from services.db.engine import session_scope
from services.db.models import AuditEntry, Job, JobKind, JobStatus, ModelVersion, ModelVersionStatus, utcnow
from services.domain.tasks import create_task, get_task
from services.domain.users import get_user
from services.errors import Conflict, Invalid
from services.settings import Settings
from tests.built_round import LABELS, BuiltRound
from tests.conftest import (
    Actor,
    MakeUser,
    example_yaml,
    free_port,
    model_server_process,
    register_model_server,
    table_counts,
    worker_process,
)

# The tests of the job queue and of a job's record on the application database (a job and its
# message written together, a job whose process is gone, a worker taking a queued job, one train
# job per task) run on both databases (``both_databases`` on each); the rest (what a job does with
# its options, its model and its failures) runs on SQLite, where the database only stores rows.
pytestmark = [pytest.mark.timeout(600)]

TOKEN = "jobs-test-admin-token-123"
# No precision check after training (an ONNX export and three scorings of the dev set: about 12 s
# of CPU per train job on a 2-core machine, in every test that trains); the one test of the
# default, test_train_evaluate_promote_in_process, trains with it (docs/testing.md).
TINY_TRAIN = {
    "check_precision": False,
    "tiny": True,
    "epochs": 2,
    "batch_size": 2,
    "learning_rate": 5e-3,
    "max_length": 32,
    "cpu": True,
    "round": 2,
}


def _create(app: Any, kind: str, params: dict[str, Any], *, task: str = "dynasent-r2") -> int:
    with session_scope(app.state.sessionmaker) as session:
        job = create_job(session, None, get_task(session, task), kind, params, data_dir=app.state.settings.data_dir)
        return job.id


def _run(app: Any, job_id: int) -> Job:
    return run_job(app.state.sessionmaker, job_id, data_dir=app.state.settings.data_dir)


@pytest.fixture
def progress_seen(app: Any, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every progress value the database holds right after each report of a running job."""
    seen: list[float] = []
    original = JobRunner.progress
    monkeypatch.setattr(job_runner, "PROGRESS_INTERVAL_S", 0.0)

    def spy(self: JobRunner, fraction: float | None, message: str | None = None, **options: Any) -> None:
        original(self, fraction, message, **options)
        with app.state.sessionmaker() as session:
            seen.append(session.get(Job, self.job_id).progress)  # type: ignore[union-attr]

    monkeypatch.setattr(JobRunner, "progress", spy)
    return seen


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `dynaloop model-server` process (a tiny Model 0) that allows reloads."""
    root = tmp_path_factory.mktemp("jobs-model-server")
    init_model_dir(root / "model-0", labels=LABELS, tiny=True, model_id="model-0", seed=0)
    with model_server_process(root / "model-0", root / "server.log", TOKEN) as server:
        yield server.url


# --- in process: train -> evaluate -> promote --------------------------------------------------


@pytest.mark.slow
def test_train_evaluate_promote_in_process(
    app: FastAPI, built: BuiltRound, progress_seen: list[float], model_server: str
) -> None:
    # The researcher's default: the precision check runs after training.
    job_id = _create(app, "train", {k: v for k, v in TINY_TRAIN.items() if k != "check_precision"})
    with session_scope(app.state.sessionmaker) as session:
        job = session.get(Job, job_id)
        assert job.status is JobStatus.queued and job.progress == 0.0
        # The default mix, written out: every built round's train split, the newest one's dev.
        assert job.params["mix"]["train"][0]["round"] == 1 and job.params["mix"]["dev"]["split"] == "dev"

    job = _run(app, job_id)
    assert job.status is JobStatus.succeeded, job.message + "\n" + job.log
    assert job.progress == 1.0 and job.started_at is not None and job.finished_at >= job.started_at
    assert job.pid == os.getpid() and job.host == socket.gethostname()
    assert progress_seen == sorted(progress_seen), "progress never goes backwards"
    assert any(0.03 < p < 0.95 for p in progress_seen), f"no progress during training: {progress_seen}"
    assert len({p for p in progress_seen if 0.03 < p < 0.95}) >= 3, progress_seen
    assert "epoch 1/2: train loss" in job.log and "epoch 2/2" in job.log
    model = job.result["model"]
    assert model["status"] == "trained" and model["name"].startswith("dynasent-r2-for-round-2@")
    # Each class's dev F1 (a collapsed class shows as 0) and the mix's tokenizer coverage.
    assert list(job.result["best_dev_f1_per_class"]) == ["positive", "negative", "neutral"]
    assert job.result["tokenizer_coverage"]["unknown_tokens"] == 0 and job.result["unknown_token_warning"] is None
    assert Path(job.result["out_dir"]).joinpath("dynaloop_model.json").is_file()
    assert Path(job.result["out_dir"]).joinpath(PRECISION_CHECK_FILE).is_file(), "the default checks precision"
    with session_scope(app.state.sessionmaker) as session:
        registered = session.get(ModelVersion, model["id"])
        assert registered.trained_for_round == 2 and registered.directory == job.result["out_dir"]
        assert registered.hyperparameters["epochs"] == 2

    progress_seen.clear()
    evaluation = _run(app, _create(app, "evaluate", {"model_id": model["id"]}))
    assert evaluation.status is JobStatus.succeeded, evaluation.message + "\n" + evaluation.log
    assert [s["name"] for s in evaluation.result["sets"]] == ["round 1 dev", "round 1 test"]
    assert all(s["rows"] == 9 and 0 <= s["macro_f1"] <= 1 for s in evaluation.result["sets"])
    assert evaluation.message.startswith(f"evaluated {model['name']}: macro-F1 (%) round 1 dev ")
    assert progress_seen == sorted(progress_seen) and progress_seen[-1] >= 0.9
    assert (Path(evaluation.result["out_dir"]) / "evaluation.md").is_file()
    with session_scope(app.state.sessionmaker) as session:
        registered = session.get(ModelVersion, model["id"])
        assert registered.status is ModelVersionStatus.evaluated
        assert set(registered.evaluation["macro_f1"]) == {"round 1 dev", "round 1 test"}

    server = register_model_server(app, model_server + "/", admin_token=TOKEN)
    # A two-epoch tiny model on 9 dev rows may score near chance: the test means to promote it.
    promote_id = _create(app, "promote", {"model_id": model["id"], "server": server, "confirm_worse": True})
    promotion = _run(app, promote_id)
    assert promotion.status is JobStatus.succeeded, promotion.message + "\n" + promotion.log
    assert (promotion.result["server"], promotion.result["endpoint"]) == (server, model_server)
    info = httpx.get(f"{model_server}/info", timeout=5).json()
    assert (info["model_id"], info["version"]) == (model["model_id"], model["version"])
    with session_scope(app.state.sessionmaker) as session:
        registered = session.get(ModelVersion, model["id"])
        assert registered.status is ModelVersionStatus.promoted and registered.endpoint == model_server
        # The token is used, never stored: not in the params, the log, the message or the audit log.
        stored = json.dumps(
            [
                session.get(Job, promote_id).params,
                session.get(Job, promote_id).log,
                promotion.message,
                [e.details for e in session.scalars(select(AuditEntry))],
            ]
        )
        assert TOKEN not in stored and "admin_token" not in session.get(Job, promote_id).params


def test_a_retrain_that_reproduces_the_weights_registers_a_new_version(app: FastAPI, built: BuiltRound) -> None:
    """The same options, seed and data give the same weights, so the same version (a hash of the
    weights): the second run is registered as VERSION.2, not refused after its training."""
    first = _run(app, _create(app, "train", {**TINY_TRAIN, "epochs": 1}))
    assert first.status is JobStatus.succeeded, first.message + "\n" + first.log
    second = _run(app, _create(app, "train", {**TINY_TRAIN, "epochs": 1}))
    assert second.status is JobStatus.succeeded, second.message + "\n" + second.log
    assert first.result is not None and second.result is not None
    name, version = first.result["model"]["name"], first.result["model"]["version"]
    assert second.result["model"]["version"] == f"{version}.2" and second.result["same_weights_as"] == name
    assert second.message.endswith(f"; the same weights as {name}")
    written = json.loads(Path(second.result["out_dir"], "dynaloop_model.json").read_text(encoding="utf-8"))
    assert (written["version"], written["same_weights_as"]) == (f"{version}.2", name)
    with session_scope(app.state.sessionmaker) as session:
        rows = session.scalars(select(ModelVersion).order_by(ModelVersion.id)).all()
        assert [(m.version, m.directory) for m in rows] == [
            (version, first.result["out_dir"]),
            (f"{version}.2", second.result["out_dir"]),
        ]


def test_a_train_job_takes_the_options_of_round_train(
    app: FastAPI, built: BuiltRound, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gradient_accumulation_steps, checkpoint_every and resume reach the trainer, as they do from
    `dynaloop round train` (both run rounds.models.usecases.train_and_register)."""
    from rounds.models import train

    configs: list[train.TrainConfig] = []
    original = train.train_model

    def spy(*args: Any, **kwargs: Any) -> train.TrainResult:
        configs.append(kwargs["config"])
        return original(*args, **kwargs)

    monkeypatch.setattr(train, "train_model", spy)
    params = {**TINY_TRAIN, "epochs": 1, "gradient_accumulation_steps": 2, "checkpoint_every": 1, "resume": True}
    job_id = _create(app, "train", params)
    with session_scope(app.state.sessionmaker) as session:
        stored = session.get(Job, job_id).params
        assert (stored["gradient_accumulation_steps"], stored["checkpoint_every"], stored["resume"]) == (2, 1, True)
    job = _run(app, job_id)
    assert job.status is JobStatus.succeeded, job.message + "\n" + job.log
    [config] = configs
    assert (config.gradient_accumulation_steps, config.checkpoint_every, config.resume) == (2, 1, True)
    # The job's model folder is new, so resuming finds no checkpoint and starts from the base.
    assert "no checkpoint in" in job.log and "starting from the base checkpoint" in job.log
    assert list((Path(job.result["out_dir"]) / "checkpoints").glob("step-*")), "a checkpoint every optimizer step"
    with session_scope(app.state.sessionmaker) as session:
        registered = session.get(ModelVersion, job.result["model"]["id"])
        assert registered.hyperparameters["gradient_accumulation_steps"] == 2
        assert registered.hyperparameters["checkpoint_every"] == 1

    for bad, message in [
        ({"checkpoint_every": 0}, "params.checkpoint_every"),
        ({"checkpoint_every": "daily"}, "params.checkpoint_every"),
        ({"gradient_accumulation_steps": 0}, "params.gradient_accumulation_steps"),
    ]:
        with pytest.raises(Invalid, match=message):
            _create(app, "train", {**TINY_TRAIN, **bad})


def test_an_evaluate_job_takes_the_options_of_round_evaluate(app: FastAPI, built: BuiltRound, tmp_path: Path) -> None:
    """rounds, positive_label, device and record, as `dynaloop round evaluate` takes them."""
    from rounds.models.registry import register_model

    init_model_dir(tmp_path / "m", labels=LABELS, tiny=True, model_id="m", seed=0)
    with session_scope(app.state.sessionmaker) as session:
        model_id = register_model(session, get_task(session, "dynasent-r2"), tmp_path / "m").id
    with pytest.raises(Invalid, match=re.escape("params.rounds: task 'dynasent-r2' has no round 7")):
        _create(app, "evaluate", {"model_id": model_id, "rounds": [7]})
    with pytest.raises(Invalid, match=re.escape("params.positive_label: 'joy' is not a label of 'dynasent-r2'")):
        _create(app, "evaluate", {"model_id": model_id, "positive_label": "joy"})
    with pytest.raises(Invalid, match=re.escape("params.device")):
        _create(app, "evaluate", {"model_id": model_id, "device": "cuda; rm -rf /"})
    job = _run(
        app,
        _create(
            app,
            "evaluate",
            {
                "model_id": model_id,
                "rounds": [1],
                "positive_label": "positive",
                "device": "cpu",
                "record": False,
                "batch_size": 4,
            },
        ),
    )
    assert job.status is JobStatus.succeeded, job.message + "\n" + job.log
    assert [s["name"] for s in job.result["sets"]] == ["round 1 dev", "round 1 test"]
    assert (Path(job.result["out_dir"]) / "evaluation.json").is_file()
    assert "recording the evaluation" not in job.log
    with session_scope(app.state.sessionmaker) as session:
        model = session.get(ModelVersion, model_id)
        assert model.status is ModelVersionStatus.trained and model.evaluation in (None, {})
    assert job.result["model"]["status"] == "trained"


# --- failures are recorded ---------------------------------------------------------------------


def test_failures_are_recorded_with_a_clear_message(
    app: FastAPI, built: BuiltRound, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rounds.models import train

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the GPU caught fire")

    monkeypatch.setattr(train, "train_model", broken)
    job = _run(app, _create(app, "train", TINY_TRAIN))
    assert job.status is JobStatus.failed and job.finished_at is not None
    assert job.message == "unexpected RuntimeError: the GPU caught fire"
    assert "Traceback" in job.log and "the GPU caught fire" in job.log

    # A domain failure: the model server is down. The registry is unchanged.
    root = tmp_path / "models"
    init_model_dir(root / "m", labels=LABELS, tiny=True, model_id="m", seed=0)
    from rounds.models.registry import record_evaluation

    with session_scope(app.state.sessionmaker) as session:
        model = record_evaluation(session, get_task(session, "dynasent-r2"), root / "m", {"dev": {"macro_f1": 0.5}})
        model_id = model.id
    down = f"http://127.0.0.1:{free_port()}"
    job = _run(
        app,
        _create(app, "promote", {"model_id": model_id, "server": register_model_server(app, down, admin_token=TOKEN)}),
    )
    assert job.status is JobStatus.failed
    assert job.message.startswith(f"the model server at {down} is down or unreachable")
    with session_scope(app.state.sessionmaker) as session:
        assert session.get(ModelVersion, model_id).status is ModelVersionStatus.evaluated

    with pytest.raises(Conflict, match="is failed; a job runs once"):
        _run(app, job.id)


@pytest.mark.both_databases
def test_a_job_whose_process_is_gone_is_reported_failed(app: FastAPI, client: TestClient, researcher: Actor) -> None:
    with session_scope(app.state.sessionmaker) as session:
        owner = get_user(session, researcher.username)  # the researcher who watches the jobs owns the task
        create_task(session, owner, example_yaml("dynasent-r2", onboarding_quiz=None))
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    gone_pid = int(done.stdout)
    with session_scope(app.state.sessionmaker) as session:
        task = get_task(session, "dynasent-r2")
        dead = Job(
            kind=JobKind.train,
            task_id=task.id,
            status=JobStatus.running,
            progress=0.4,
            message="step 4",
            params={},
            log="",
            pid=gone_pid,
            host=socket.gethostname(),
            started_at=utcnow(),
        )
        elsewhere = Job(
            kind=JobKind.evaluate,
            task_id=task.id,
            status=JobStatus.running,
            progress=0.4,
            message="",
            params={},
            log="",
            pid=gone_pid,
            host="another-machine",
        )
        alive = Job(
            kind=JobKind.evaluate,
            task_id=task.id,
            status=JobStatus.running,
            progress=0.1,
            message="",
            params={},
            log="",
            pid=os.getpid(),
            host=socket.gethostname(),
        )
        session.add_all([dead, elsewhere, alive])
        session.flush()
        ids = dead.id, elsewhere.id, alive.id
    body = client.get(f"/api/v1/jobs/{ids[0]}", headers=researcher.headers).json()
    assert body["status"] == "failed" and body["finished_at"] is not None and body["progress"] == 0.4
    assert body["message"].startswith(f"the job's process (pid {gone_pid}) ended without reporting a result")
    listed = client.get("/api/v1/tasks/dynasent-r2/jobs", headers=researcher.headers).json()
    assert {j["id"]: j["status"] for j in listed["data"]} == {ids[0]: "failed", ids[1]: "running", ids[2]: "running"}


# --- the API: a real worker and its `dynaloop job run` process ----------------------------------


@pytest.mark.slow
@pytest.mark.both_databases
def test_post_queues_a_job_that_a_worker_runs_to_the_end(
    app: FastAPI, client: TestClient, built: BuiltRound, tmp_path: Path
) -> None:
    researcher = built["researcher"]
    response = client.post(
        "/api/v1/tasks/dynasent-r2/jobs", json={"kind": "train", "params": TINY_TRAIN}, headers=researcher.headers
    )
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["status"] == "queued" and job["kind"] == "train" and job["created_by"] == "rita"
    # A second train job for the task while this one waits: 409, and nothing is recorded.
    before = table_counts(app)
    again = client.post(
        "/api/v1/tasks/dynasent-r2/jobs", json={"kind": "train", "params": TINY_TRAIN}, headers=researcher.headers
    )
    assert again.status_code == 409 and f"train job {job['id']}" in again.json()["error"]["message"]
    assert table_counts(app) == before
    seen: list[float] = []
    with worker_process(app, "cpu", "jobs-worker", tmp_path / "worker.log"):
        deadline = time.monotonic() + 300
        while True:
            body = client.get(f"/api/v1/jobs/{job['id']}", headers=researcher.headers).json()
            seen.append(body["progress"])
            if body["status"] in ("succeeded", "failed") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    log_file = jobs.job_log_path(app.state.settings.data_dir, job["id"])
    assert body["status"] == "succeeded", body["message"] + "\n" + body["log"] + "\n" + log_file.read_text()
    assert body["progress"] == 1.0 and seen == sorted(seen) and body["worker"] == "jobs-worker"
    assert body["message"].startswith("trained and registered dynasent-r2-for-round-2@")
    assert "epoch 2/2" in body["log"] and f"job {job['id']} (train) succeeded" in log_file.read_text()
    # The finished job stays succeeded when read again, its worker gone.
    assert client.get(f"/api/v1/jobs/{job['id']}", headers=researcher.headers).json()["status"] == "succeeded"

    listed = client.get("/api/v1/tasks/dynasent-r2/jobs?kind=train", headers=researcher.headers).json()
    assert listed["count"] == 1 and listed["data"][0]["log"] is None
    models = client.get("/api/v1/tasks/dynasent-r2/models", headers=researcher.headers).json()
    assert models["count"] == 1
    model = models["data"][0]
    assert model["id"] == body["result"]["model"]["id"] and model["status"] == "trained"
    assert model["attempts"] == 0 and model["trained_for_round"] == 2
    assert model["best_dev_macro_f1"] == body["result"]["best_dev_macro_f1"]


# --- authorization and bad input -----------------------------------------------------------------


def test_roles_unknown_task_and_bad_input(
    app: FastAPI, client: TestClient, built: BuiltRound, make_user: MakeUser
) -> None:
    researcher, writer = built["researcher"], built["writer"]
    round_id = built["round"]["id"]
    url = "/api/v1/tasks/dynasent-r2/jobs"
    before = table_counts(app)
    for method, path in [
        ("post", url),
        ("get", url),
        ("get", "/api/v1/jobs/1"),
        ("get", "/api/v1/tasks/dynasent-r2/models"),
        ("get", f"/api/v1/rounds/{round_id}/plot-data"),
    ]:
        response = client.request(
            method.upper(), path, json={"kind": "train"} if method == "post" else None, headers=writer.headers
        )
        assert response.status_code == 403, (path, response.text)
        assert "needs the researcher role" in response.json()["error"]["message"]
    assert client.post(url, json={"kind": "train"}).status_code == 401

    def refused(body: Any, status: int, message: str, path: str = url) -> None:
        response = client.post(path, json=body, headers=researcher.headers)
        assert response.status_code == status, response.text
        assert message in response.json()["error"]["message"], response.json()

    refused({"kind": "train"}, 404, "no task", "/api/v1/tasks/nope/jobs")
    refused({"kind": "dance"}, 422, "body.kind")
    refused({"kind": "train", "colour": 1}, 422, "body.colour: is not a known field")
    refused({"kind": "train", "params": {"colour": "red"}}, 422, "params.colour: is not a known field; remove it")
    refused({"kind": "train", "params": {"epochs": 0}}, 422, "params.epochs: Input should be greater than or equal")
    refused(
        {"kind": "train", "params": {"class_weights": {"joy": 2}}},
        422,
        "params.class_weights: ['joy'] are not labels of 'dynasent-r2'",
    )
    refused({"kind": "train", "params": {"mix": {"train": [{"round": 7}]}}}, 422, "has no round 7")
    refused(
        {"kind": "train", "params": {"mix": {"train": [{"file": "missing.csv"}]}}},
        422,
        "params.mix.train.0.file: not an uploaded dataset or a file under the data root",
    )
    refused(
        {"kind": "train", "params": {"base": "/no/such/folder"}}, 422, "params.base: not a folder under the data root"
    )
    refused({"kind": "evaluate", "params": {}}, 422, "params.model_id: is required")
    refused({"kind": "evaluate", "params": {"model_id": 99}}, 422, "task 'dynasent-r2' has no model 99")
    refused({"kind": "promote", "params": {"model_id": 1, "server": "x"}}, 422, "has no model 1")
    assert table_counts(app) == before, "a refused request records nothing"
    assert client.get("/api/v1/jobs/12345", headers=researcher.headers).status_code == 404
    assert client.get("/api/v1/tasks/nope/models", headers=researcher.headers).status_code == 404
    assert client.get("/api/v1/rounds/9999/plot-data", headers=researcher.headers).status_code == 404


@pytest.mark.both_databases
def test_a_second_train_job_is_refused_while_one_is_queued_or_running(
    app: FastAPI, client: TestClient, built: BuiltRound
) -> None:
    """docs/researcher_ui.md and docs/api.md: one train job per task at a time."""
    researcher, url = built["researcher"], "/api/v1/tasks/dynasent-r2/jobs"
    first = client.post(url, json={"kind": "train", "params": {"epochs": 1}}, headers=researcher.headers)
    assert first.status_code == 202, first.text
    first_id = first.json()["id"]
    for status in ("queued", "running"):
        if status == "running":  # a worker took it and reports (rounds.models.worker)
            with session_scope(app.state.sessionmaker) as session:
                job = session.get(Job, first_id)
                assert job is not None
                job.status, job.worker, job.heartbeat_at, job.started_at = (
                    JobStatus.running,
                    "worker-cpu",
                    utcnow(),
                    utcnow(),
                )
        before = table_counts(app)
        second = client.post(url, json={"kind": "train", "params": {"epochs": 2}}, headers=researcher.headers)
        assert second.status_code == 409, second.text
        error = second.json()["error"]
        assert error["message"].startswith(f"train job {first_id} of task 'dynasent-r2' is still {status}")
        assert error["details"] == {"job_id": first_id}
        assert table_counts(app) == before, "a refused request records nothing"
    # Once it finished (here: failed), the next train job is accepted.
    with session_scope(app.state.sessionmaker) as session:
        job = session.get(Job, first_id)
        assert job is not None
        job.status, job.finished_at, job.message = JobStatus.failed, utcnow(), "the GPU caught fire"
    again = client.post(url, json={"kind": "train", "params": {"epochs": 2}}, headers=researcher.headers)
    assert again.status_code == 202, again.text


def test_promote_needs_an_evaluated_model_and_a_token(app: FastAPI, built: BuiltRound, tmp_path: Path) -> None:
    from rounds.models.registry import register_model

    init_model_dir(tmp_path / "m", labels=LABELS, tiny=True, model_id="m", seed=0)
    with session_scope(app.state.sessionmaker) as session:
        model_id = register_model(session, get_task(session, "dynasent-r2"), tmp_path / "m").id
    tokenless = register_model_server(app, "http://127.0.0.1:9")
    params = {"model_id": model_id, "server": register_model_server(app, "http://127.0.0.1:10", admin_token=TOKEN)}
    with pytest.raises(Conflict, match=r"was never evaluated.*set force"):
        _create(app, "promote", params)
    with pytest.raises(Invalid, match="registered without an admin token"):
        _create(app, "promote", {**params, "server": tokenless, "force": True})
    with pytest.raises(Invalid, match="'nowhere' is not a registered model server"):
        _create(app, "promote", {**params, "server": "nowhere", "force": True})
    for smuggled in ({"endpoint": "http://evil.example"}, {"admin_token": "mine"}):
        with pytest.raises(Invalid, match="is not a known field"):
            _create(app, "promote", {**params, **smuggled, "force": True})
    job_id = _create(app, "promote", {**params, "force": True})
    with session_scope(app.state.sessionmaker) as session:
        # No token and no URL: the server's name and the options of `dynaloop model promote`, with their defaults.
        assert session.get(Job, job_id).params == {
            **params,
            "force": True,
            "confirm_worse": False,
            "keep_round_servers": False,
            "timeout_s": 300.0,
        }
        assert session.scalar(select(func.count()).select_from(Job)) == 1


def test_train_needs_a_built_round(app: FastAPI) -> None:
    with session_scope(app.state.sessionmaker) as session:
        create_task(session, None, example_yaml("dynasent-r2", onboarding_quiz=None))
    with pytest.raises(Invalid, match="has no built round to train on"):
        _create(app, "train", {})
    with pytest.raises(Invalid, match="kind 'dance' is not a job kind"):
        _create(app, "dance", {})


# --- plot data ----------------------------------------------------------------------------------


def test_plot_data_for_the_dashboard(client: TestClient, built: BuiltRound) -> None:
    researcher = built["researcher"]
    response = client.get(f"/api/v1/rounds/{built['round']['id']}/plot-data", headers=researcher.headers)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["task"] == "dynasent-r2" and data["round"] == 1 and data["total_examples"] == 21
    assert data["labels"] == ["positive", "negative", "neutral"] and "mixed" in data["validation_labels"]
    assert not data["truncated"] and len(data["examples"]) == 21
    by_id = {row["example_id"]: row for row in data["examples"]}
    for example, labels in built["plan"]:
        row = by_id[example["id"]]
        assert row["validated"] and row["target"] == example["target_label"][0]
        assert row["prediction"] == example["prediction"]
        top = max(set(labels), key=labels.count)
        assert row["majority"] == (top if labels.count(top) >= 3 else None)
        assert 0 < row["edit_distance"] <= 1 and row["chars"] == len(example["text"])
        assert row["words"] == len(example["text"].split()) and "text" not in row
    agreement = {row["username"]: row for row in data["worker_agreement"]}
    assert {f"val{i}" for i in range(5)} <= set(agreement) and all(agreement[f"val{i}"]["qualified"] for i in range(5))
    thinned = client.get(f"/api/v1/rounds/{built['round']['id']}/plot-data?limit=5", headers=researcher.headers).json()
    assert thinned["truncated"] and len(thinned["examples"]) == 5 and thinned["total_examples"] == 21


@pytest.mark.slow
def test_a_stopped_job_process_records_the_interruption(
    app: FastAPI, client: TestClient, built: BuiltRound, tmp_path: Path
) -> None:
    researcher = built["researcher"]
    params = {**TINY_TRAIN, "epochs": 1000, "patience": 0}
    job = client.post(
        "/api/v1/tasks/dynasent-r2/jobs", json={"kind": "train", "params": params}, headers=researcher.headers
    ).json()
    pid: int | None = None
    with worker_process(app, "cpu", "stop-worker", tmp_path / "worker.log"):
        try:
            deadline = time.monotonic() + 240
            while True:
                body = client.get(f"/api/v1/jobs/{job['id']}", headers=researcher.headers).json()
                if (body["status"] == "running" and body["progress"] > 0.03) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert body["status"] == "running", body
            with session_scope(app.state.sessionmaker) as session:
                pid = session.get(Job, job["id"]).pid  # type: ignore[union-attr]
            assert pid is not None
            os.kill(pid, signal.SIGTERM)  # the job's own process, not its worker
            while body["status"] == "running" and time.monotonic() < deadline:
                time.sleep(0.2)
                body = client.get(f"/api/v1/jobs/{job['id']}", headers=researcher.headers).json()
        finally:
            if pid is not None and jobs.process_alive(pid):  # never leave a 1000-epoch run behind
                os.kill(pid, signal.SIGKILL)
    assert body["status"] == "failed" and body["finished_at"] is not None
    assert body["message"] == "the job was interrupted (its process was stopped); start it again"
    assert 0.03 < body["progress"] < 1


def test_cli_job_run_runs_a_job_once(app: FastAPI, settings: Settings) -> None:
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    with session_scope(app.state.sessionmaker) as session:
        task = create_task(session, None, example_yaml("dynasent-r2", onboarding_quiz=None))
        done = Job(
            kind=JobKind.evaluate,
            task_id=task.id,
            status=JobStatus.succeeded,
            progress=1.0,
            message="ok",
            params={"model_id": 1},
            log="",
        )
        session.add(done)
        session.flush()
        done_id = done.id
    url = settings.resolved_database_url
    result = CliRunner().invoke(cli, ["job", "run", str(done_id), "--database-url", url])
    assert result.exit_code == 1 and "is succeeded; a job runs once" in result.output
    result = CliRunner().invoke(cli, ["job", "run", "999", "--database-url", url])
    assert result.exit_code == 1 and "there is no job 999" in result.output


def _a_write_with_a_stop_signal_inside(stop: job_runner.StopRequest, steps: list[str]) -> None:
    with stop.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        steps.append("the write went on after the signal")
        with stop.deferred():  # nested writes: raised when the outermost ends
            steps.append("nested write")
        steps.append("outer write finished")


def _a_stop_signal_outside_a_write() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)  # the handler runs at the next bytecode, outside any write


def test_a_stop_signal_during_a_job_write_waits_for_the_write_to_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM that lands inside the job's own database write is raised after it, not in the
    middle (where it left a PostgreSQL connection mid-statement and hid the stop behind a driver
    error); outside a write it is raised at once, and only once."""
    stop = job_runner.StopRequest()
    monkeypatch.setattr(job_runner, "STOP", stop)
    previous = signal.signal(signal.SIGTERM, stop.handle)
    steps: list[str] = []
    try:
        with pytest.raises(SystemExit, match="stopped by signal"):
            _a_write_with_a_stop_signal_inside(stop, steps)
        assert steps == ["the write went on after the signal", "nested write", "outer write finished"]
        with stop.deferred():  # the failure is then recorded: the stop is not raised a second time
            steps.append("failure recorded")
        assert steps[-1] == "failure recorded"
        assert job_runner._failure_message(RuntimeError("driver error")).startswith("the job was interrupted")

        fresh = job_runner.StopRequest()
        monkeypatch.setattr(job_runner, "STOP", fresh)
        assert job_runner._failure_message(RuntimeError("x")) == "unexpected RuntimeError: x"  # no stop asked for
        signal.signal(signal.SIGTERM, fresh.handle)
        with pytest.raises(SystemExit):
            _a_stop_signal_outside_a_write()
    finally:
        signal.signal(signal.SIGTERM, previous)
