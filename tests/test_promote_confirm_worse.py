"""Promoting a worse model asks first (rounds.models.promotion.check_not_worse): a model below the
promoted one on a round's dev split, or within NEAR_CHANCE_MARGIN of chance, is refused with 409
``confirm_worse`` and both scores, through the API (when the job is created and again when it
runs) and the CLI, and goes ahead with ``confirm_worse``. A retrain that reproduces registered
weights is registered as a new version (rounds.models.registry.register_retrained).

Real database (SQLite; PostgreSQL too when DYNALOOP_TEST_POSTGRES_URL is set), real HTTP
through the app, the promote job run in process, no model server: the promotions go to the
replicas that follow the task, and none is live, so a promotion completes once recorded."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select
from typer.testing import CliRunner

from dynaloop.cli import app as cli
from model_server.directory import ModelMetadata
from rounds.models.job_runner import run_job
from rounds.models.promotion import NEAR_CHANCE_MARGIN, chance_macro_f1, promote
from rounds.models.registry import record_evaluation, register_model, register_retrained
from services.db.engine import session_scope
from services.db.models import JobStatus, ModelVersion, ModelVersionStatus
from services.domain.tasks import get_task
from tests.conftest import Actor, example_yaml, open_round, table_counts, table_snapshot

pytestmark = pytest.mark.timeout(300)

TASK = "dynasent-r2"
LABELS = ["positive", "negative", "neutral"]
JOBS = f"/api/v1/tasks/{TASK}/jobs"
# round 1's dev split: 9 rows, 3 of each class, so chance (a uniformly guessed label) is 1/3.
SUPPORT = {"positive": 3, "negative": 3, "neutral": 3}


def _evaluation(dev: float, *, round_: int = 1) -> dict[str, Any]:
    """What rounds.models.evaluate records: macro-F1 per set, and each set with its gold counts."""
    name = f"round {round_} dev"
    return {
        "macro_f1": {name: dev},
        "sets": [{"name": name, "round": round_, "split": "dev", "rows": 9, "support": SUPPORT, "macro_f1": dev}],
    }


def _model(app: Any, model_id: str, dev: float | None) -> int:
    """A model directory's metadata, registered for the task and evaluated with dev macro-F1 ``dev``."""
    models = Path(app.state.settings.data_dir) / "models"
    models.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=f"{model_id}-", dir=models))
    ModelMetadata(model_id=model_id, version="1", labels=LABELS, task=TASK).save(directory)
    with session_scope(app.state.sessionmaker) as session:
        task = get_task(session, TASK)
        model = (
            register_model(session, task, directory)
            if dev is None
            else record_evaluation(session, task, directory, _evaluation(dev))
        )
        return model.id


def _statuses(app: Any) -> dict[str, str]:
    with session_scope(app.state.sessionmaker) as session:
        return {m.model_id: m.status.value for m in session.scalars(select(ModelVersion).order_by(ModelVersion.id))}


def _refused(client: TestClient, researcher: Actor, params: dict[str, Any]) -> dict[str, Any]:
    response = client.post(JOBS, json={"kind": "promote", "params": params}, headers=researcher.headers)
    assert response.status_code == 409, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "confirm_worse", error
    return error


@pytest.fixture
def task(client: TestClient, researcher: Actor) -> str:
    open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None), None)
    return TASK


def test_chance_is_what_a_guess_scores() -> None:
    assert chance_macro_f1(3, multi_label=False, support=SUPPORT, rows=9) == pytest.approx(1 / 3)
    assert chance_macro_f1(3, multi_label=False, support=None, rows=None) == pytest.approx(1 / 3)
    # Lopsided: 2pr/(p+r) per class with r = 1/3; an absent class counts 0, as in macro-F1.
    lopsided = chance_macro_f1(3, multi_label=False, support={"positive": 6, "negative": 3}, rows=9)
    assert lopsided == pytest.approx((2 * (2 / 3) * (1 / 3) / 1 + 1 / 3 + 0) / 3)
    # Multi-label: each label guessed with probability 1/2; without gold counts nothing is claimed.
    assert chance_macro_f1(2, multi_label=True, support={"a": 5, "b": 5}, rows=10) == pytest.approx(0.5)
    assert chance_macro_f1(2, multi_label=True, support=None, rows=None) is None


def test_a_worse_promotion_is_refused_with_both_scores_and_goes_ahead_when_confirmed(
    app: FastAPI, client: TestClient, researcher: Actor, task: str
) -> None:
    factory, data_dir = app.state.sessionmaker, app.state.settings.data_dir
    good = _model(app, "good", 0.70)
    worse = _model(app, "worse", 0.55)
    near = _model(app, "near", 1 / 3 + NEAR_CHANCE_MARGIN - 0.01)
    unevaluated = _model(app, "unevaluated", None)
    promote(factory, TASK, good, server=None, timeout_s=1)
    assert _statuses(app)["good"] == "promoted"

    before = table_counts(app)
    snapshot = table_snapshot(app, "model_versions", "jobs", "audit_log")
    error = _refused(client, researcher, {"model_id": worse})
    assert error["details"]["reasons"] == ["below_promoted"]
    assert error["details"]["promoted"] == "good@1"
    assert [(s["model"], s["set"], s["macro_f1"]) for s in error["details"]["scores"]] == [
        ("worse@1", "round 1 dev", 0.55),
        ("good@1", "round 1 dev", 0.7),
    ]
    assert "worse@1 scores macro-F1 0.550 on round 1 dev, below good@1, the promoted model (0.700)" in error["message"]
    assert "confirm_worse" in error["message"]

    error = _refused(client, researcher, {"model_id": near})
    assert error["details"]["reasons"] == ["below_promoted", "near_chance"]
    assert error["details"]["scores"][0]["chance_macro_f1"] == pytest.approx(1 / 3, abs=1e-4)
    assert "within 0.05 of chance (0.333, what a uniformly guessed label scores)" in error["message"]
    # force (an unevaluated model) does not lift it; a model with no dev score is not compared.
    _refused(client, researcher, {"model_id": near, "force": True})
    assert table_counts(app) == before and table_snapshot(app, "model_versions", "jobs", "audit_log") == snapshot

    accepted = client.post(
        JOBS,
        json={"kind": "promote", "params": {"model_id": unevaluated, "force": True, "timeout_s": 1}},
        headers=researcher.headers,
    )
    assert accepted.status_code == 202, accepted.text  # queued; not run here

    confirmed = client.post(
        JOBS,
        json={"kind": "promote", "params": {"model_id": worse, "confirm_worse": True, "timeout_s": 1}},
        headers=researcher.headers,
    )
    assert confirmed.status_code == 202, confirmed.text
    assert confirmed.json()["params"]["confirm_worse"] is True
    job = run_job(factory, confirmed.json()["id"], data_dir=data_dir)
    assert job.status is JobStatus.succeeded, job.message + "\n" + job.log
    assert job.message.startswith("promoted worse@1") and "retired good@1" in job.message
    assert _statuses(app)["worse"] == "promoted" and _statuses(app)["good"] == "retired"


def test_the_check_runs_again_when_the_job_runs(app: FastAPI, client: TestClient, researcher: Actor, task: str) -> None:
    """Accepted while the promoted model was worse; by the time it runs a better one is promoted."""
    factory, data_dir = app.state.sessionmaker, app.state.settings.data_dir
    low = _model(app, "low", 0.50)
    middle = _model(app, "middle", 0.60)
    high = _model(app, "high", 0.80)
    promote(factory, TASK, low, server=None, timeout_s=1)
    created = client.post(
        JOBS, json={"kind": "promote", "params": {"model_id": middle, "timeout_s": 1}}, headers=researcher.headers
    )
    assert created.status_code == 202, created.text
    promote(factory, TASK, high, server=None, timeout_s=1)
    snapshot = table_snapshot(app, "model_versions")
    job = run_job(factory, created.json()["id"], data_dir=data_dir)
    assert job.status is JobStatus.failed
    assert job.message.startswith(
        "middle@1 scores macro-F1 0.600 on round 1 dev, below high@1, the promoted model (0.800)"
    ), job.message
    assert table_snapshot(app, "model_versions") == snapshot
    assert _statuses(app) == {"low": "retired", "middle": "evaluated", "high": "promoted"}


def test_cli_promote_asks_for_confirm_worse(app: FastAPI, database_url: str, task: str) -> None:
    factory = app.state.sessionmaker
    promote(factory, TASK, _model(app, "good", 0.70), server=None, timeout_s=1)
    _model(app, "worse", 0.40)
    runner = CliRunner()
    args = ["model", "promote", "--task", TASK, "--version", "worse@1", "--timeout-s", "1", "--database-url"]
    before = table_snapshot(app, "model_versions", "audit_log")
    result = runner.invoke(cli, [*args, database_url], env={"COLUMNS": "250"})
    assert result.exit_code == 1, result.output
    flat = " ".join(result.output.split())
    assert "worse@1 scores macro-F1 0.400 on round 1 dev, below good@1, the promoted model (0.700)" in flat
    assert "--confirm-worse" in flat and "Traceback" not in result.output
    assert table_snapshot(app, "model_versions", "audit_log") == before
    result = runner.invoke(cli, [*args, database_url, "--confirm-worse"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "promoted worse@1" in result.output and "retired good@1" in result.output
    assert _statuses(app) == {"good": "retired", "worse": "promoted"}


def test_a_retrain_on_the_same_weights_registers_a_new_version(app: FastAPI, task: str, tmp_path: Path) -> None:
    first = tmp_path / "job-1"
    first.mkdir()
    ModelMetadata(model_id="m", version="abc123", labels=LABELS, task=TASK).save(first)
    second, third = tmp_path / "job-2", tmp_path / "job-3"
    shutil.copytree(first, second)
    shutil.copytree(first, third)
    with session_scope(app.state.sessionmaker) as session:
        row, same = register_retrained(session, get_task(session, TASK), first)
        assert (row.name, same) == ("m@abc123", None)
        row, same = register_retrained(session, get_task(session, TASK), second)
        assert (row.name, row.version, same) == ("m@abc123.2", "abc123.2", "m@abc123")
        row, same = register_retrained(session, get_task(session, TASK), third)
        assert (row.name, same) == ("m@abc123.3", "m@abc123")
        again, same = register_retrained(session, get_task(session, TASK), second)  # the same directory again
        assert (again.name, same) == ("m@abc123.2", "m@abc123")
        assert [m.status for m in session.scalars(select(ModelVersion))] == [ModelVersionStatus.trained] * 3
    # The model server reads the version from the directory: it says what the registry holds.
    written = json.loads((second / "dynaloop_model.json").read_text(encoding="utf-8"))
    assert (written["version"], written["same_weights_as"]) == ("abc123.2", "m@abc123")
