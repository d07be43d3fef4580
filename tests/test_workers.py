"""Jobs through the task queue (rounds/models/queue.py) to `dynaloop worker` processes (rounds/models/worker.py):
real worker processes on the real database of each backend (SQLite; PostgreSQL when
DYNALOOP_TEST_POSTGRES_URL is set, as in CI), real `dynaloop job run` processes, a built round
and tiny models. The API runs in the test's process."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from rounds.models import jobs
from services.db.engine import session_scope
from services.db.models import Job, JobKind, JobQueue, JobStatus, JobWorker, QueueMessage, utcnow
from services.domain.tasks import get_task
from tests.built_round import BuiltRound
from tests.conftest import Actor, MakeUser, dynaloop_command, table_counts, worker_process
from tests.test_jobs import TINY_TRAIN

# On both databases (``both_databases`` on each): the job queue and the workers' records on the
# application database. The two-process scenario (a cancel, a worker killed mid-job) runs on
# SQLite: it adds training processes, not database behaviour, to what the others prove on both.
pytestmark = [pytest.mark.timeout(600)]

LONG_TRAIN = {**TINY_TRAIN, "epochs": 1000, "patience": 0}
JOBS = "/api/v1/tasks/dynasent-r2/jobs"


def wait_for(condition: Callable[[], Any], timeout_s: float, why: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(why())
        time.sleep(0.2)


def job_of(client: TestClient, researcher: Actor, job_id: int) -> dict[str, Any]:
    response = client.get(f"/api/v1/jobs/{job_id}", headers=researcher.headers)
    assert response.status_code == 200, response.text
    return response.json()


def running_past_loading(client: TestClient, researcher: Actor, job_id: int) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        body = job_of(client, researcher, job_id)
        assert body["status"] in ("queued", "running"), body
        return body if body["status"] == "running" and body["progress"] > 0.03 else None

    return wait_for(check, 240, lambda: f"job {job_id} never got past loading: {job_of(client, researcher, job_id)}")


def ended(client: TestClient, researcher: Actor, job_id: int, timeout_s: float = 120) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        body = job_of(client, researcher, job_id)
        return body if body["status"] not in ("queued", "running") else None

    return wait_for(check, timeout_s, lambda: f"job {job_id} did not end: {job_of(client, researcher, job_id)}")


def job_pid(app: FastAPI, job_id: int) -> int | None:
    with app.state.sessionmaker() as session:
        return session.get(Job, job_id).pid  # type: ignore[union-attr]


def gone(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --- the queue ---------------------------------------------------------------------------------------


@pytest.mark.both_databases
def test_a_job_and_its_message_are_written_together(app: FastAPI, client: TestClient, built: BuiltRound) -> None:
    """The job's row and its queue message commit in one transaction; a refused request writes neither."""
    researcher = built["researcher"]
    before = table_counts(app)
    refused = client.post(JOBS, json={"kind": "train", "params": {"epochs": 0}}, headers=researcher.headers)
    assert refused.status_code == 422
    refused = client.post(JOBS, json={"kind": "train", "queue": "tpu"}, headers=researcher.headers)
    assert refused.status_code == 422
    refused = client.post(JOBS, json={"kind": "promote", "queue": "gpu", "params": {}}, headers=researcher.headers)
    assert refused.status_code == 422
    assert table_counts(app) == before
    created = client.post(JOBS, json={"kind": "train", "params": TINY_TRAIN}, headers=researcher.headers)
    assert created.status_code == 202, created.text
    body = created.json()
    assert body["status"] == "queued" and body["queue"] == "cpu" and body["worker"] is None
    # No worker runs: the job says so, and what to start.
    assert body["message"] == (
        "queued for a cpu worker; no cpu worker is running (an operator starts one with `dynaloop worker --queue cpu`)"
    )
    with app.state.sessionmaker() as session:
        messages = session.scalars(select(QueueMessage)).all()
        assert [m.queue for m in messages] == ["dynaloop-cpu"]
        assert b"pickle" not in messages[0].data and str(body["id"]).encode() in messages[0].data


@pytest.mark.both_databases
def test_gpu_jobs_wait_for_a_gpu_worker_unless_told_to_fall_back(
    app: FastAPI, client: TestClient, built: BuiltRound
) -> None:
    researcher = built["researcher"]
    waiting = client.post(
        JOBS, json={"kind": "train", "params": TINY_TRAIN, "queue": "gpu"}, headers=researcher.headers
    )
    assert waiting.status_code == 202, waiting.text
    assert waiting.json()["queue"] == "gpu" and waiting.json()["message"].startswith(
        "queued for a gpu worker; no gpu worker is running"
    )
    cancelled = client.post(f"/api/v1/jobs/{waiting.json()['id']}/cancel", headers=researcher.headers)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["message"] == "cancelled by rita before a worker took it"
    again = client.post(f"/api/v1/jobs/{waiting.json()['id']}/cancel", headers=researcher.headers)
    assert again.status_code == 409 and "already cancelled" in again.json()["error"]["message"]
    fallback = client.post(
        JOBS,
        json={"kind": "train", "params": TINY_TRAIN, "queue": "gpu", "cpu_fallback": True},
        headers=researcher.headers,
    ).json()
    assert fallback["queue"] == "cpu" and "cpu_fallback" in fallback["message"]


def test_the_task_can_ask_for_a_gpu(app: FastAPI, built: BuiltRound) -> None:
    with session_scope(app.state.sessionmaker) as session:
        task = get_task(session, "dynasent-r2")
        definition = dict(task.definition)
        definition["training"] = {**definition.get("training", {}), "accelerator": "gpu"}
        task.definition = definition
    with session_scope(app.state.sessionmaker) as session:
        task = get_task(session, "dynasent-r2")
        job = jobs.create_job(session, None, task, "train", TINY_TRAIN, data_dir=app.state.settings.data_dir)
        assert job.queue is JobQueue.gpu
        evaluate_queue, _ = jobs.choose_queue(session, task, JobKind.evaluate, None, False)
        assert evaluate_queue is JobQueue.cpu


def test_cancel_is_for_the_tasks_researchers_only(
    app: FastAPI, client: TestClient, built: BuiltRound, make_user: MakeUser
) -> None:
    researcher, writer = built["researcher"], built["writer"]
    job = client.post(JOBS, json={"kind": "train", "params": TINY_TRAIN}, headers=researcher.headers).json()
    stranger = make_user("stranger", "researcher")
    before = table_counts(app)
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=writer.headers).status_code == 403
    hidden = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=stranger.headers)
    assert hidden.status_code == 404  # another group's job looks like no job at all
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 401
    assert client.post("/api/v1/jobs/99999999999/cancel", headers=researcher.headers).status_code == 422
    assert table_counts(app) == before
    assert job_of(client, researcher, job["id"])["status"] == "queued"


@pytest.mark.both_databases
def test_a_job_whose_worker_stopped_reporting_is_failed(app: FastAPI, client: TestClient, built: BuiltRound) -> None:
    researcher = built["researcher"]
    with session_scope(app.state.sessionmaker) as session:
        task = get_task(session, "dynasent-r2")
        common = {"kind": JobKind.train, "task_id": task.id, "message": "", "params": {}, "log": ""}
        lost = Job(
            **common,
            status=JobStatus.running,
            progress=0.4,
            worker="gpu-box-1",
            heartbeat_at=utcnow() - dt.timedelta(minutes=2),
            started_at=utcnow(),
        )
        taken_never_started = Job(
            **common,
            status=JobStatus.queued,
            progress=0.0,
            worker="gpu-box-2",
            heartbeat_at=utcnow() - dt.timedelta(hours=1),
        )
        alive = Job(**common, status=JobStatus.running, progress=0.1, worker="cpu-box-1", heartbeat_at=utcnow())
        waiting = Job(**common, status=JobStatus.queued, progress=0.0)
        session.add_all([lost, taken_never_started, alive, waiting])
        session.flush()
        ids = lost.id, taken_never_started.id, alive.id, waiting.id
    body = job_of(client, researcher, ids[0])
    assert body["status"] == "failed" and body["progress"] == 0.4 and body["finished_at"] is not None
    assert body["message"].startswith("worker gpu-box-1, which was running this job, last reported at ")
    listed = client.get(JOBS, headers=researcher.headers).json()
    statuses = {j["id"]: j["status"] for j in listed["data"]}
    assert [statuses[i] for i in ids] == ["failed", "failed", "running", "queued"]


# --- real workers ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_workers_queues_a_dead_worker_and_a_cancel(
    app: FastAPI, client: TestClient, built: BuiltRound, tmp_path: Path
) -> None:
    """The issue's test: a cpu and a gpu worker as separate processes; a train job goes to the
    worker of its queue and succeeds; a running job is cancelled; a worker killed mid-job leaves
    its job failed with a message that says so, and a worker restarted under its name takes jobs again."""
    researcher = built["researcher"]
    with (
        worker_process(app, "cpu", "cpu-worker", tmp_path / "cpu.log") as cpu,
        worker_process(app, "gpu", "gpu-worker", tmp_path / "gpu.log", "--skip-gpu-check"),
    ):
        # A gpu job goes to the gpu worker, a cpu job to the cpu worker; both run to the end.
        on_gpu = client.post(
            JOBS, json={"kind": "train", "params": TINY_TRAIN, "queue": "gpu"}, headers=researcher.headers
        )
        assert on_gpu.status_code == 202, on_gpu.text
        done = ended(client, researcher, on_gpu.json()["id"], 300)
        assert done["status"] == "succeeded", done["message"] + "\n" + done["log"]
        assert done["worker"] == "gpu-worker" and done["queue"] == "gpu" and done["progress"] == 1.0
        model_id = done["result"]["model"]["id"]
        evaluate = client.post(
            JOBS, json={"kind": "evaluate", "params": {"model_id": model_id}}, headers=researcher.headers
        ).json()
        evaluated = ended(client, researcher, evaluate["id"], 300)
        assert evaluated["status"] == "succeeded" and evaluated["worker"] == "cpu-worker", evaluated

        # Cancel a running job: its worker stops the process, the job ends cancelled.
        long_job = client.post(JOBS, json={"kind": "train", "params": LONG_TRAIN}, headers=researcher.headers).json()
        running = running_past_loading(client, researcher, long_job["id"])
        assert running["worker"] == "cpu-worker"
        pid = job_pid(app, long_job["id"])
        asked = client.post(f"/api/v1/jobs/{long_job['id']}/cancel", headers=researcher.headers)
        assert asked.status_code == 200 and asked.json()["cancel_requested_at"] is not None
        cancelled = ended(client, researcher, long_job["id"], 60)
        assert cancelled["status"] == "cancelled" and cancelled["message"] == "cancelled by rita while it ran"
        assert 0.03 < cancelled["progress"] < 1
        wait_for(lambda: gone(pid), 30, lambda: f"the cancelled job's process {pid} still runs")

        # Kill the cpu worker (SIGKILL: no clean-up of its own) in the middle of a job.
        doomed = client.post(JOBS, json={"kind": "train", "params": LONG_TRAIN}, headers=researcher.headers).json()
        running_past_loading(client, researcher, doomed["id"])
        pid = job_pid(app, doomed["id"])
        os.kill(cpu.pid, signal.SIGKILL)
        failed = ended(client, researcher, doomed["id"], 60)
        assert failed["status"] == "failed" and failed["finished_at"] is not None
        assert failed["message"] == (
            "the job was interrupted: cpu-worker, the worker that ran it, stopped or died; start it again"
        )
        wait_for(lambda: gone(pid), 30, lambda: f"the job's process {pid} outlived its worker")

        # The same worker, restarted under its name, takes the next cpu job.
        with worker_process(app, "cpu", "cpu-worker", tmp_path / "cpu-again.log"):
            # (one epoch: other weights than the first job's, so a new version rather than VERSION.2)
            after = client.post(
                JOBS, json={"kind": "train", "params": {**TINY_TRAIN, "epochs": 1}}, headers=researcher.headers
            ).json()
            finished = ended(client, researcher, after["id"], 300)
            assert finished["status"] == "succeeded" and finished["worker"] == "cpu-worker", (
                finished["message"],
                finished["log"][-2000:],
            )
    with app.state.sessionmaker() as session:
        assert session.scalar(select(func.count()).select_from(QueueMessage)) == 0  # every message was taken
        stopped = session.scalars(select(JobWorker).order_by(JobWorker.name)).all()
        assert [(w.name, w.stopped_at is not None) for w in stopped] == [("cpu-worker", True), ("gpu-worker", True)]


@pytest.mark.slow
@pytest.mark.both_databases
def test_a_worker_name_in_use_elsewhere_is_refused(app: FastAPI, built: BuiltRound, tmp_path: Path) -> None:
    with session_scope(app.state.sessionmaker) as session:
        session.add(JobWorker(name="taken", queue=JobQueue.cpu, host="another-machine", pid=1, heartbeat_at=utcnow()))
    settings = app.state.settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNALOOP_")}
    env.update(DYNALOOP_DATA_DIR=str(settings.data_dir))
    args = ["worker", "--name", "taken", "--database-url", settings.resolved_database_url]
    done = subprocess.run([*dynaloop_command(), *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "a worker named 'taken' is running on another-machine (pid 1)" in done.stderr
    gpu = subprocess.run(
        [*dynaloop_command(), "worker", "--queue", "gpu", "--database-url", settings.resolved_database_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert gpu.returncode == 1 and "no CUDA GPU is visible" in gpu.stderr


def test_a_worker_writes_json_lines_with_dynaloop_log_format_json(app: FastAPI, tmp_path: Path) -> None:
    """DYNALOOP_LOG_FORMAT=json (the compose stack's setting, shared with the API) makes the
    worker's own log JSON lines, as the API's and the model servers' are (docs/deploy.md)."""
    log = tmp_path / "worker.log"
    with worker_process(app, "cpu", "json-worker", log, environment={"DYNALOOP_LOG_FORMAT": "json"}) as worker:
        os.kill(worker.pid, signal.SIGINT)  # waits for the running job (none) and records that it stopped
        worker.wait(30)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert any(
        entry["logger"] == "rounds.models.worker"
        and entry["message"] == "worker json-worker takes jobs from the cpu queue"
        and entry["level"] == "info"
        for entry in entries
    ), lines
