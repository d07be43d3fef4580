"""The model registry and promotion (rounds.models.registry, rounds.models.promotion): register,
evaluate, promote over real HTTP to a real `dynaloop model-server` process, retire; attempts
record the version they met.

Runs on SQLite always and on PostgreSQL when DYNALOOP_TEST_POSTGRES_URL is set.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from dynaloop.cli import app as cli
from rounds.models import promotion, registry
from rounds.models.init_model import init_model_dir
from rounds.models.promotion import PromotionError, promote
from rounds.models.registry import find_model, list_models, record_evaluation, register_model, retire
from services.db.engine import session_scope
from services.db.models import Assignment, Attempt, AuditEntry, ModelVersion, ModelVersionStatus, Round
from services.domain.tasks import create_task, get_task
from services.errors import Conflict, Invalid, NotFound
from tests.conftest import (
    Actor,
    ModelServerProcess,
    example_yaml,
    free_port,
    model_server_process,
    open_round,
    register_model_server,
    table_snapshot,
)

pytestmark = pytest.mark.timeout(300)

TOKEN = "registry-test-admin-token"
LABELS = ["positive", "negative", "neutral"]
MODEL_ID = "tiny-sentiment"


@dataclass
class Models:
    a: Path  # tiny-sentiment version 0
    b: Path  # tiny-sentiment version 1 (other weights)
    wrong_labels: Path
    unloadable: Path  # valid dynaloop_model.json, no weights


def _set_version(directory: Path, version: str) -> None:
    path = directory / "dynaloop_model.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(
        version=version,
        data={"train": [{"name": "round 1 train", "sha256": "abc"}]},
        hyperparameters={"epochs": 3, "learning_rate": 2e-5},
        training={"best_dev_macro_f1": 0.5},
    )
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("registry-models")
    init_model_dir(root / "a", labels=LABELS, tiny=True, model_id=MODEL_ID, seed=0)
    init_model_dir(root / "b", labels=LABELS, tiny=True, model_id=MODEL_ID, seed=1)
    _set_version(root / "b", "1")
    init_model_dir(root / "binary", labels=["positive", "negative"], tiny=True, model_id="tiny-binary")
    (root / "unloadable").mkdir()
    shutil.copy(root / "a" / "dynaloop_model.json", root / "unloadable" / "dynaloop_model.json")
    _set_version(root / "unloadable", "broken")
    return Models(root / "a", root / "b", root / "binary", root / "unloadable")


@pytest.fixture(scope="module")
def model_server(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServerProcess]:
    """A real `dynaloop model-server` process serving model A, with reloads enabled."""
    log = tmp_path_factory.mktemp("model-server-log") / "model-server.log"
    with model_server_process(models.a, log, TOKEN) as server:
        yield server


@pytest.fixture
def task(app: Any) -> str:
    with session_scope(app.state.sessionmaker) as session:
        return create_task(session, None, example_yaml("dynasent-r2", onboarding_quiz=None)).name


def _session(app: Any):
    return session_scope(app.state.sessionmaker)


# --- registering ------------------------------------------------------------------------


@pytest.mark.both_databases
def test_register_is_idempotent_and_reads_the_metadata(app: FastAPI, task: str, models: Models) -> None:
    with _session(app) as session:
        first = register_model(session, get_task(session, task), models.b)
        again = register_model(session, get_task(session, task), str(models.b) + "/")
        assert first.id == again.id
        assert (first.name, first.model_id, first.version, first.status) == (
            f"{MODEL_ID}@1",
            MODEL_ID,
            "1",
            ModelVersionStatus.trained,
        )
        assert first.labels == LABELS and first.directory == str(models.b.resolve())
        assert first.data == {"train": [{"name": "round 1 train", "sha256": "abc"}]}
        assert first.hyperparameters == {"epochs": 3, "learning_rate": 2e-5}
        assert first.metrics == {"best_dev_macro_f1": 0.5}
        assert len(list_models(session, get_task(session, task))) == 1


@pytest.mark.both_databases
def test_register_refuses_other_labels_and_a_reused_version(
    app: FastAPI, task: str, models: Models, tmp_path: Path
) -> None:
    with _session(app) as session:
        with pytest.raises(Invalid, match=r"labels \['positive', 'negative'\].*missing \['neutral'\]"):
            register_model(session, get_task(session, task), models.wrong_labels)
        with pytest.raises(Invalid, match=re.escape("has no dynaloop_model.json")):
            register_model(session, get_task(session, task), tmp_path)
        with pytest.raises(Invalid, match="does not exist"):
            register_model(session, get_task(session, task), tmp_path / "nowhere")
        register_model(session, get_task(session, task), models.a)
    copy = tmp_path / "copy-of-a"
    shutil.copytree(models.a, copy)
    before = table_snapshot(app, "model_versions")
    with _session(app) as session, pytest.raises(Conflict, match=r"already registered.*give it a new `version`"):
        register_model(session, get_task(session, task), copy)
    assert table_snapshot(app, "model_versions") == before


def test_evaluation_moves_trained_to_evaluated_and_names_resolve(app: FastAPI, task: str, models: Models) -> None:
    with _session(app) as session:
        task_row = get_task(session, task)
        model = record_evaluation(session, task_row, models.a, {"round 1 test": {"macro_f1": float("nan"), "n": 3}})
        assert model.status is ModelVersionStatus.evaluated and model.evaluated_at is not None
        assert model.evaluation == {"round 1 test": {"macro_f1": None, "n": 3}}  # NaN is not JSON
        register_model(session, task_row, models.b)
        assert find_model(session, task_row, f"{MODEL_ID}@0").id == model.id
        assert find_model(session, task_row, str(model.id)).id == model.id
        with pytest.raises(Invalid, match="has 2 versions"):
            find_model(session, task_row, MODEL_ID)
        with pytest.raises(NotFound, match="registered: tiny-sentiment@0, tiny-sentiment@1"):
            find_model(session, task_row, "nope")
        with pytest.raises(Invalid, match="evaluation is empty"):
            record_evaluation(session, task_row, models.a, {})
        assert retire(session, task_row, f"{MODEL_ID}@1").status is ModelVersionStatus.retired
        assert retire(session, task_row, f"{MODEL_ID}@1").retired_at is not None  # idempotent


# --- promoting: failures change nothing -------------------------------------------------


def _registered(app: Any, task: str, *directories: Path, evaluated: bool = True) -> None:
    with _session(app) as session:
        task_row = get_task(session, task)
        for directory in directories:
            if evaluated:
                record_evaluation(session, task_row, directory, {"dev": {"macro_f1": 0.4}})
            else:
                register_model(session, task_row, directory)


def _tables(app: Any) -> dict[str, list[tuple[Any, ...]]]:
    return table_snapshot(app, "model_versions", "rounds", "audit_log")


@pytest.mark.both_databases
def test_promotion_failures_say_why_and_change_nothing(
    app: FastAPI, task: str, models: Models, model_server: ModelServerProcess, tmp_path: Path
) -> None:
    factory = app.state.sessionmaker
    _registered(app, task, models.a, evaluated=False)
    _registered(app, task, models.unloadable)
    server = register_model_server(app, model_server.url, admin_token=TOKEN)
    down = register_model_server(app, f"http://127.0.0.1:{free_port()}", admin_token=TOKEN)
    tokenless = register_model_server(app, f"http://127.0.0.1:{free_port()}")
    before = _tables(app)
    cases = [
        (dict(reference=f"{MODEL_ID}@0", server=server), Conflict, "never evaluated.*--force"),
        (dict(reference=f"{MODEL_ID}@broken", server=down), PromotionError, "is down or unreachable"),
        (
            dict(reference=f"{MODEL_ID}@broken", server=server, admin_token="wrong"),
            PromotionError,
            "refused the admin token \\(HTTP 401\\)",
        ),
        (
            dict(reference=f"{MODEL_ID}@broken", server=server),
            PromotionError,
            "could not load .*unloadable \\(HTTP 422\\)",
        ),
        (dict(reference="nope", server=server), NotFound, "has no model 'nope'"),
        (dict(reference=f"{MODEL_ID}@broken", server="nowhere"), NotFound, "no model server named 'nowhere'"),
        (dict(reference=f"{MODEL_ID}@broken", server=tokenless), Invalid, "registered without an admin token"),
    ]
    for kwargs, error, message in cases:
        reference = kwargs.pop("reference")
        with pytest.raises(error, match=message):
            promote(factory, task, reference, **kwargs)  # type: ignore[arg-type]
        assert _tables(app) == before, f"a failed promotion ({message}) changed the database"
    assert model_server.info()["version"] == "0", "a failed reload leaves the old model serving"


def test_a_registry_failure_after_the_reload_puts_the_previous_model_back(
    app: FastAPI, task: str, models: Models, model_server: ModelServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    factory = app.state.sessionmaker
    _registered(app, task, models.a, models.b)
    server = register_model_server(app, model_server.url, admin_token=TOKEN)
    promote(factory, task, f"{MODEL_ID}@0", server=server)
    before = _tables(app)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("UPDATE model_versions", {}, Exception("disk I/O error"))

    monkeypatch.setattr(promotion, "_record", broken)
    with pytest.raises(PromotionError, match=r"could not record it.*previous model .* was reloaded"):
        promote(factory, task, f"{MODEL_ID}@1", server=server)
    assert _tables(app) == before
    assert model_server.info()["version"] == "0"


# --- promoting over real HTTP: attempts record the version they met ---------------------


def _attempt(client: Any, writer: Any, round_id: int, text: str) -> dict[str, Any]:
    assignment = client.post(f"/api/v1/rounds/{round_id}/assignments", json={}, headers=writer.headers).json()
    attempt = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts", json={"text": text}, headers=writer.headers
    )
    assert attempt.status_code == 201, attempt.text
    client.post(f"/api/v1/assignments/{assignment['id']}/skip", headers=writer.headers)
    return attempt.json()


def test_attempts_record_the_promoted_version(
    app: FastAPI, client: TestClient, researcher: Actor, writer: Actor, models: Models, model_server: ModelServerProcess
) -> None:
    factory = app.state.sessionmaker
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        model_server.url,
        [f"Prompt {i}: the soup was fine." for i in range(4)],
    )
    _registered(app, "dynasent-r2", models.a)
    server = register_model_server(app, model_server.url, admin_token=TOKEN)
    first = promote(factory, "dynasent-r2", f"{MODEL_ID}@0", server=server)
    assert first.retired == [] and first.rounds_updated == []  # the round already uses this server
    before = _attempt(client, writer, round_["id"], "The soup was cold and the bread was stale.")
    assert (before["model_id"], before["model_version"]) == (MODEL_ID, "0")

    with _session(app) as session:  # Model 1 is trained, registered and evaluated
        record_evaluation(session, get_task(session, "dynasent-r2"), models.b, {"round 1 dev": {"macro_f1": 0.7}})
    second = promote(factory, "dynasent-r2", f"{MODEL_ID}@1", server=server)
    assert [m.name for m in second.retired] == [f"{MODEL_ID}@0"]
    assert second.server_info["version"] == "1" and model_server.info()["version"] == "1"
    after = _attempt(client, writer, round_["id"], "The soup was hot and the bread was fresh.")
    assert (after["model_id"], after["model_version"]) == (MODEL_ID, "1")

    with _session(app) as session:
        by_name = {m.name: m for m in session.scalars(select(ModelVersion))}
        a, b = by_name[f"{MODEL_ID}@0"], by_name[f"{MODEL_ID}@1"]
        assert (a.status, b.status) == (ModelVersionStatus.retired, ModelVersionStatus.promoted)
        assert a.retired_at is not None and b.promoted_at is not None and b.endpoint == model_server.url
        # Every attempt joins to the registry entry of the model that scored it.
        joined = session.execute(
            select(Attempt.id, ModelVersion.name)
            .join(
                ModelVersion,
                (ModelVersion.model_id == Attempt.model_id) & (ModelVersion.version == Attempt.model_version),
            )
            .join(Assignment, Attempt.assignment_id == Assignment.id)
            .join(Round, Assignment.round_id == Round.id)
            .where(Round.id == round_["id"], ModelVersion.task_id == Round.task_id)
            .order_by(Attempt.id)
        ).all()
        assert [(row[0], row[1]) for row in joined] == [(before["id"], a.name), (after["id"], b.name)]
        assert registry.attempt_counts(session, get_task(session, "dynasent-r2")) == {a.id: 1, b.id: 1}
        actions = [e.action for e in session.scalars(select(AuditEntry)) if e.action.startswith("model.")]
        assert actions.count("model.promote") == 2


def test_promotion_puts_the_server_in_open_rounds_loop(
    app: FastAPI, client: TestClient, researcher: Actor, models: Models, model_server: ModelServerProcess
) -> None:
    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), None)
    _registered(app, "dynasent-r2", models.a)
    server = register_model_server(app, model_server.url + "/", admin_token=TOKEN)
    result = promote(app.state.sessionmaker, "dynasent-r2", MODEL_ID, server=server)
    assert result.rounds_updated == [1] and (result.server, result.endpoint) == (server, model_server.url)
    shown = client.get(f"/api/v1/rounds/{round_['id']}", headers=researcher.headers).json()
    assert shown["model_servers"] == [server]


# --- CLI ---------------------------------------------------------------------------------


def test_cli_register_list_promote_retire(
    app: FastAPI, database_url: str, task: str, models: Models, model_server: ModelServerProcess, tmp_path: Path
) -> None:
    runner = CliRunner()
    url = ["--database-url", database_url]

    def run(*args: str, env: dict[str, str] | None = None) -> Any:
        return runner.invoke(cli, [*args, *url], env={"COLUMNS": "250", **(env or {})})

    result = run("model", "register", "--task", task, "--dir", str(models.a))
    assert result.exit_code == 0, result.output
    assert f"registered {MODEL_ID}@0" in result.output and "is trained" in result.output
    result = run("model", "register", "--task", task, "--dir", str(models.wrong_labels))
    assert result.exit_code == 1 and "missing ['neutral']" in result.output and "Traceback" not in result.output
    result = run(
        "model",
        "promote",
        "--task",
        task,
        "--version",
        f"{MODEL_ID}@0",
        "--endpoint",
        model_server.url,
        env={"DYNALOOP_MODEL_SERVER_ADMIN_TOKEN": TOKEN},
    )
    assert result.exit_code == 1 and "never evaluated" in result.output
    evaluation = tmp_path / "evaluation.json"
    evaluation.write_text(json.dumps({"round 1 dev": {"macro_f1": 0.5}}), encoding="utf-8")
    result = run("model", "register", "--task", task, "--dir", str(models.b), "--evaluation", str(evaluation))
    assert result.exit_code == 0 and "is evaluated" in result.output, result.output
    result = run(
        "model",
        "promote",
        "--task",
        task,
        "--version",
        f"{MODEL_ID}@1",
        "--endpoint",
        model_server.url,
        "--admin-token",
        "wrong",
    )
    assert result.exit_code == 1 and "HTTP 401" in result.output and "Traceback" not in result.output
    result = run(
        "model",
        "promote",
        "--task",
        task,
        "--version",
        f"{MODEL_ID}@1",
        "--endpoint",
        model_server.url,
        env={"DYNALOOP_MODEL_SERVER_ADMIN_TOKEN": TOKEN},
    )
    assert result.exit_code == 0 and f"promoted {MODEL_ID}@1" in result.output, result.output
    result = run(
        "model",
        "promote",
        "--task",
        task,
        "--version",
        f"{MODEL_ID}@0",
        "--endpoint",
        model_server.url,
        "--force",
        env={"DYNALOOP_MODEL_SERVER_ADMIN_TOKEN": TOKEN},
    )
    assert result.exit_code == 0 and f"retired {MODEL_ID}@1" in result.output, result.output
    result = run("model", "list", "--task", task)
    assert result.exit_code == 0
    lines = {
        name: line
        for line in result.output.splitlines()
        for name in (f"{MODEL_ID}@0", f"{MODEL_ID}@1")
        if f" {name} " in line
    }
    assert "promoted" in lines[f"{MODEL_ID}@0"] and "retired" in lines[f"{MODEL_ID}@1"]
    result = run("model", "retire", "--task", task, "--version", f"{MODEL_ID}@0")
    assert result.exit_code == 0 and "still serves it" in result.output
    result = run("model", "retire", "--task", "no-such-task", "--version", "x")
    assert result.exit_code == 1 and "no task 'no-such-task'" in result.output
    # `--endpoint URL` registered the URL (an operator at the shell is an admin); `--server` names it.
    port = model_server.url.rsplit(":", 1)[1]
    result = run("model", "servers", "list")
    assert result.exit_code == 0 and f"127-0-0-1-{port}" in result.output and TOKEN not in result.output
    result = run("model", "promote", "--task", task, "--version", f"{MODEL_ID}@1", "--server", f"127-0-0-1-{port}")
    assert result.exit_code == 0 and f"model server 127-0-0-1-{port}" in result.output, result.output
    result = run(
        "model", "promote", "--task", task, "--version", f"{MODEL_ID}@1", "--server", "x", "--endpoint", "http://h:1"
    )
    assert result.exit_code == 1 and "not both" in result.output
    # Without a server: promoted in the registry, for the replicas that follow the task (none here).
    result = run("model", "promote", "--task", task, "--version", f"{MODEL_ID}@1")
    assert result.exit_code == 0 and f"promoted {MODEL_ID}@1: no live replica follows the task" in result.output
    result = run(
        "model",
        "servers",
        "register",
        "spare",
        "http://127.0.0.1:9/",
        "--admin-token-env",
        "SPARE_TOKEN",
        env={"SPARE_TOKEN": "spare-secret-token"},
    )
    assert result.exit_code == 0 and "with its admin token" in result.output and "spare-secret" not in result.output
    result = run("model", "servers", "register", "bad", "http://user:pw@127.0.0.1:9")
    assert result.exit_code == 1 and "credentials" in result.output
    result = run("model", "servers", "remove", "spare")
    assert result.exit_code == 0 and "removed model server spare" in result.output
