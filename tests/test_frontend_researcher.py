"""The researcher pages (Streamlit AppTest against the real API, tests/frontend_live.py) and the
dashboard's plot functions (frontend/plots.py) on fixtures.

Jobs: the API records them but, as in tests/test_authorization.py, starts no `dynaloop job run`
process; the test writes what that process would write to the job's row (:class:`JobProcess`).
``test_researcher_pages_against_the_real_api`` follows a real job process to its end."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any

import altair as alt
import pyarrow.ipc
import pytest
import yaml
from fastapi import FastAPI
from sqlalchemy import select
from streamlit.testing.v1 import AppTest

from frontend import plots
from frontend.client import ApiError, Round
from model_server.directory import ModelMetadata
from rounds.models.registry import record_evaluation, register_model
from services.db.engine import session_scope
from services.db.models import Job, JobStatus, ModelVersion, ModelVersionStatus, Prompt, Task, utcnow
from services.taskdef import example_path
from tests.built_round import KEYWORD, LABELS, BuiltRound
from tests.conftest import register_model_server
from tests.frontend_live import (
    LiveApi,
    PageClient,
)

PAGES = Path(__file__).resolve().parents[1] / "frontend" / "app_pages"
HOSTILE = "<script>alert('x')</script> **bold** [link](http://evil.example) $x$"
TASK = "dynasent-r2"
JOBS = f"/tasks/{TASK}/jobs"


@pytest.fixture
def rita(live: LiveApi) -> PageClient:
    """A researcher's client (for the pages), with DynaSent's task (no quiz) created."""
    client = live.client(live.user("rita", "researcher"))
    live.task(TASK, onboarding_quiz=None)
    return client


def page(client: PageClient, name: str, *, roles: tuple[str, ...] = ("researcher",)) -> AppTest:
    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=60)
    at.session_state["client"] = client
    at.session_state["token"] = client.token
    at.session_state["user"] = {"username": "rita", "roles": list(roles)}
    at.session_state["roles"] = list(roles)
    return at.run()


def texts(at: AppTest) -> list[str]:
    """Every piece of text the page rendered, by kind of element."""
    found = []
    for kind in ("markdown", "text", "caption", "success", "info", "warning", "error", "title", "subheader", "code"):
        found += [f"{kind}: {element.value}" for element in getattr(at, kind)]
    return found


def assert_no_raw_markup(at: AppTest) -> None:
    """Nothing that Streamlit parses as Markdown carries user text unescaped."""
    for kind in ("markdown", "caption", "success", "info", "warning", "error"):
        for element in getattr(at, kind):
            for raw in ("<script>", "**bold**", "__bold__"):
                assert raw not in element.value, (kind, element.value)


def said(at: AppTest, kind: str, fragment: str) -> bool:
    """Whether an element of ``kind`` (error, success, ...) shows ``fragment``, once the
    Markdown escaping of user text (``\\*``) is undone."""
    return any(fragment in re.sub(r"\\(.)", r"\1", element.value) for element in getattr(at, kind))


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    return at


def dataframe_values(at: AppTest) -> list[str]:
    return [str(v) for frame in at.dataframe for v in frame.value.to_numpy().ravel()]


def hostile_task_yaml() -> str:
    data = yaml.safe_load(example_path(TASK).read_text(encoding="utf-8"))
    data.pop("onboarding_quiz", None)
    data.update(name="hostile-task", title=HOSTILE)
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


def labelled_round(
    live: LiveApi,
    *,
    status: str = "collecting",
    validators: tuple[str, ...] = ("val1", "val2", "val3", "val4", "x__bold__"),
) -> Round:
    """Round 1 of the task as tests/built_round.py's ``built`` writes it, through the API:
    two examples per (target, prediction) cell with 4 of 5 validators agreeing, and three with a
    mixed, no or a 3-of-5 majority (21 examples, 12 of them fooled the model); then ``status``."""
    round_ = live.round(
        TASK,
        [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(30)],
        target_label_mode="writer_choice",
    )
    for name in validators:
        live.user(name, "validator")
    plan: list[tuple[int, list[str]]] = []
    for gold in LABELS:
        for predicted in LABELS:
            for copy in range(2):
                text = f"Copy {copy}: a {KEYWORD[predicted]} {gold} sentence about lunch."
                other = next(label for label in LABELS if label != gold)
                plan.append((live.example(round_, text, target=gold), [gold, gold, gold, gold, other]))
    extra = [
        ["mixed", "mixed", "mixed", "positive", "negative"],
        ["positive", "negative", "neutral", "mixed", "positive"],
        ["negative", "negative", "negative", "positive", "neutral"],
    ]
    for i, labels in enumerate(extra):
        plan.append((live.example(round_, f"Extra {i}: a plain remark on the menu.", target="neutral"), labels))
    given: dict[str, dict[int, str | list[str]]] = {name: {} for name in validators}
    for position, (example_id, labels) in enumerate(plan):
        shift = position % 5  # who disagrees rotates, so nobody is unqualified
        for name, label in zip(validators, labels[shift:] + labels[:shift], strict=True):
            given[name][example_id] = label
    for name in validators:  # each labels what it is served
        live.label_all(name, round_["id"], given[name])
    if status == "built":
        live.admin.set_round_status(round_["id"], "closed")
        live.admin.build_round(round_["id"], seed=7)
    elif status != "collecting":
        live.admin.set_round_status(round_["id"], status)
    return live.admin.rounds(TASK)[0]


def registered_model(
    live: LiveApi,
    model_id: str,
    version: str,
    *,
    round_: int | None = 2,
    macro_f1: dict[str, float] | None = None,
    promoted_to: str | None = None,
) -> ModelVersion:
    """A model directory's metadata, registered for the task (evaluated with ``macro_f1``, and
    promoted to ``promoted_to``, when given) with the registry's own functions."""
    models = live.app.state.settings.data_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=f"{model_id}-{version}-", dir=models))
    ModelMetadata(
        model_id=model_id,
        version=version,
        labels=LABELS,
        base_model="/models/minilm",
        trained_for_round=round_,
        task=TASK,
    ).save(directory)
    with session_scope(live.app.state.sessionmaker) as session:
        task = session.scalars(select(Task).where(Task.name == TASK)).one()
        model = register_model(session, task, directory)
        if macro_f1:
            model = record_evaluation(session, task, directory, {"macro_f1": macro_f1})
        if promoted_to:  # what rounds.models.promotion.promote records once the model server has switched
            model.status, model.endpoint = ModelVersionStatus.promoted, promoted_to
            model.promoted_at = utcnow()
        session.flush()
        session.expunge(model)
        return model


class JobProcess:
    """Writes to a job's row what its worker and its `dynaloop job run` process would
    (rounds.models.worker, rounds.models.job_runner.run_job): running with progress and a message, then
    succeeded with a result, or failed."""

    def __init__(self, live: LiveApi) -> None:
        self.live = live

    def _update(self, job_id: int, **values: Any) -> None:
        with session_scope(self.live.app.state.sessionmaker) as session:
            job = session.get(Job, job_id)
            assert job is not None and job.status in (JobStatus.queued, JobStatus.running), job
            if job.status is JobStatus.queued:
                job.status, job.started_at, job.pid, job.host = (
                    JobStatus.running,
                    utcnow(),
                    os.getpid(),
                    socket.gethostname(),
                )
                job.worker = "page-test-worker"
            job.heartbeat_at = utcnow()
            message = values.get("message")
            if message:
                job.log = f"{job.log or ''}\n{message}".strip()
            for name, value in values.items():
                setattr(job, name, value)

    def progress(self, job_id: int, fraction: float, message: str) -> None:
        self._update(job_id, progress=fraction, message=message)

    def succeed(self, job_id: int, message: str, result: dict[str, Any] | None = None) -> None:
        self._update(
            job_id, status=JobStatus.succeeded, progress=1.0, message=message, result=result, finished_at=utcnow()
        )

    def fail(self, job_id: int, message: str) -> None:
        self._update(job_id, status=JobStatus.failed, message=message, finished_at=utcnow())


@pytest.fixture
def jobs(live: LiveApi) -> JobProcess:
    """No worker runs in these tests: JobProcess plays its part."""
    return JobProcess(live)


def followed_job(at: AppTest) -> int | None:
    """The job the models page follows (None: none, or the page never started one)."""
    if "researcher_models_job" not in at.session_state:
        return None
    job_id: int | None = at.session_state["researcher_models_job"].get(TASK)
    return job_id


# --- guard ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["researcher_rounds", "researcher_dashboard", "researcher_models"])
def test_pages_need_the_researcher_role(rita: PageClient, name: str) -> None:
    at = ok(page(rita, name, roles=("writer",)))
    assert said(at, "error", "needs the researcher role")
    assert not rita.sent  # the page asked the API nothing


# --- tasks and rounds ------------------------------------------------------------------------


def test_rounds_page_creates_a_task_and_escapes_its_title(live: LiveApi, rita: PageClient) -> None:
    at = ok(page(rita, "researcher_rounds"))
    assert at.title[0].value == "Tasks and rounds"
    at.text_area(key="researcher_task_yaml").input(hostile_task_yaml())
    at = ok(at.button(key="researcher_create_task").click().run())
    assert live.admin.task("hostile-task")["title"] == HOSTILE
    assert said(at, "success", "Created task hostile-task")
    assert at.selectbox(key="researcher_rounds_task").value == "hostile-task"
    assert HOSTILE in [t.value for t in at.text], texts(at)  # the title, literally, as plain text
    assert_no_raw_markup(at)
    # The same YAML again: the API's 409, shown as it is.
    at.text_area(key="researcher_task_yaml").input(hostile_task_yaml())
    at = ok(at.button(key="researcher_create_task").click().run())
    assert said(at, "error", "already exists")


def test_rounds_page_shows_invalid_yaml_errors(rita: PageClient) -> None:
    at = page(rita, "researcher_rounds")
    at.text_area(key="researcher_task_yaml").input("name: Not Valid\nfamily: nope\n")
    at = ok(at.button(key="researcher_create_task").click().run())
    assert at.error and "family" in at.error[0].value
    at = ok(at.button(key="researcher_create_task").click().run())  # nothing pasted now? still the same text
    at.text_area(key="researcher_task_yaml").input("")
    at = ok(at.button(key="researcher_create_task").click().run())
    assert said(at, "warning", "paste the task's YAML")


def test_rounds_page_opens_moves_and_sets_the_model(live: LiveApi, rita: PageClient) -> None:
    servers = [live.model_server(f"http://127.0.0.1:{port}", tasks=[TASK]) for port in (8001, 8002)]
    at = ok(page(rita, "researcher_rounds"))
    assert said(at, "info", "no round yet")
    # The researcher picks among the servers an admin registered; no URL can be typed in.
    assert at.multiselect(key="researcher_open_servers").options == [
        "127-0-0-1-8001 (http://127.0.0.1:8001)",
        "127-0-0-1-8002 (http://127.0.0.1:8002)",
    ]
    at.multiselect(key="researcher_open_servers").set_value(servers)
    at.selectbox(key="researcher_open_mode").set_value("writer_choice")
    at = ok(at.button(key="researcher_open_submit").click().run())
    sent = rita.requests("POST", f"/tasks/{TASK}/rounds")[-1].body
    assert sent["model_servers"] == servers
    assert sent["target_label_mode"] == "writer_choice"
    opened = live.admin.rounds(TASK)[0]
    assert (opened["model_servers"], opened["target_label_mode"]) == (servers, "writer_choice")
    assert said(at, "success", "Opened round 1")
    assert at.dataframe[0].value["status"].tolist() == ["collecting"]
    # collecting -> validating -> closed
    round_id = opened["id"]
    at = ok(at.button(key=f"researcher_status_{round_id}_validating").click().run())
    assert live.admin.rounds(TASK)[0]["status"] == "validating"
    at = ok(at.button(key=f"researcher_status_{round_id}_closed").click().run())
    assert live.admin.rounds(TASK)[0]["status"] == "validating"  # asked first
    at = ok(at.button(key=f"researcher_status_{round_id}_closed_confirm").click().run())
    assert live.admin.rounds(TASK)[0]["status"] == "closed"
    assert not [b for b in at.button if b.key and b.key.startswith("researcher_status_")]
    # A closed round: the next one can be opened; a refused transition shows the API's message.
    second = live.round(TASK)
    rita.fail_next("set_round_status", ApiError(409, "conflict", "round 2 is **busy** <b>now</b>"))
    at = ok(page(rita, "researcher_rounds").button(key=f"researcher_status_{second['id']}_validating").click().run())
    assert any(r"round 2 is \*\*busy\*\* \<b\>now\<\/b\>" in e.value for e in at.error)
    assert live.admin.round(second["id"])["status"] == "collecting"


def test_closing_a_round_asks_first_and_counts_its_open_study_links(live: LiveApi, rita: PageClient) -> None:
    """Issue 28, item 2: *Close the round* closes nothing until confirmed; the question counts
    the round's open study links (a link closed by hand is not counted); Cancel leaves the
    round as it was; the confirmation closes the round and its links and says how many."""
    round_ = live.round(TASK, ["p"], status="validating")
    links = [
        live.admin.create_study_link(
            TASK, name=name, round_id=round_["id"], role="validator", platform="prolific", quota=3, max_workers=9
        )
        for name in ("pilot", "main", "closed by hand")
    ]
    live.admin.close_study_link(links[2]["id"])
    at = ok(page(rita, "researcher_rounds"))
    assert at.dataframe[0].value["open study links"].tolist() == [2]
    close = f"researcher_status_{round_['id']}_closed"
    for leave in ("cancel", "another page"):
        at = ok(at.button(key=close).click().run())
        assert said(at, "warning", "Close round 1? It cannot be reopened")
        assert said(at, "warning", "Its 2 open study links will be closed with it")
        assert said(at, "warning", "get the completion code only if they met the quota")
        assert live.admin.round(round_["id"])["status"] == "validating"
        assert all(link["is_open"] for link in live.admin.study_links(TASK)[:2])
        assert not rita.requests("POST", f"/rounds/{round_['id']}/status")
        if leave == "cancel":
            at = ok(at.button(key=f"{close}_cancel").click().run())
            assert not at.warning and at.button(key=close)
        else:  # the question stays until answered, across reruns
            at = ok(at.run())
            assert said(at, "warning", "Close round 1?")
    at = ok(at.button(key=f"{close}_confirm").click().run())
    assert live.admin.round(round_["id"])["status"] == "closed"
    assert [link["is_open"] for link in live.admin.study_links(TASK)] == [False, False, False]
    assert said(at, "success", "Round 1 is now closed; 2 of its study links were closed with it.")
    assert not [b for b in at.button if b.key and b.key.startswith("researcher_status_")]


def test_closing_a_round_without_study_links_says_so_and_shows_a_refusal(live: LiveApi, rita: PageClient) -> None:
    round_ = live.round(TASK, ["p"], status="validating")
    close = f"researcher_status_{round_['id']}_closed"
    at = ok(page(rita, "researcher_rounds").button(key=close).click().run())
    assert said(at, "warning", "It has no open study links.")
    rita.fail_next("set_round_status", ApiError(409, "conflict", "round 1 is **busy** <b>now</b>"))
    at = ok(at.button(key=f"{close}_confirm").click().run())
    assert any(r"round 1 is \*\*busy\*\* \<b\>now\<\/b\>" in e.value for e in at.error)
    assert live.admin.round(round_["id"])["status"] == "validating"
    # The refusal ends the question: the page offers the close again.
    at = ok(at.run())
    assert not at.warning and at.button(key=close)


def test_rounds_page_sets_the_model_in_the_loop_and_shows_the_registry(live: LiveApi, rita: PageClient) -> None:
    round_ = live.round(TASK, ["a prompt"])  # model server: the stub model, registered
    [name] = round_["model_servers"]
    endpoint = {s["name"]: s["url"] for s in live.admin.model_servers()}[name]
    others = [live.model_server(f"http://127.0.0.1:{port}", tasks=[TASK]) for port in (9001, 9002)]
    registered_model(live, "dynasent-r2-for-round-2", "3f9a", macro_f1={"round 1 test": 0.71}, promoted_to=endpoint)
    at = ok(page(rita, "researcher_rounds"))
    assert f"{name} ({endpoint})" in [c.value for c in at.code]
    values = dataframe_values(at)
    assert "dynasent-r2-for-round-2@3f9a" in values and "round 1 test 71.0" in values
    chooser = at.multiselect(key=f"researcher_model_servers_{round_['id']}")
    assert chooser.value == [name] and len(chooser.options) == 3
    rita.fail_next("set_model", ApiError(422, "invalid", "model_servers: 'gone' is not a registered model server"))
    at = ok(chooser.set_value(others).run())
    at = ok(at.button(key=f"researcher_model_save_{round_['id']}").click().run())
    assert said(at, "error", "is not a registered model server")
    at.multiselect(key=f"researcher_model_servers_{round_['id']}").set_value(others)
    at = ok(at.button(key=f"researcher_model_save_{round_['id']}").click().run())
    assert live.admin.rounds(TASK)[0]["model_servers"] == others
    assert said(at, "success", "now uses 2 model server(s)")


def test_rounds_page_imports_prompts_and_escapes_them(live: LiveApi, rita: PageClient) -> None:
    round_ = live.round(TASK, ["already there"])
    at = ok(page(rita, "researcher_rounds"))
    lines = [{"text": HOSTILE, "id": "p1"}, {"text": "already there"}, {"text": HOSTILE}, {"text": "A new prompt."}]
    at.text_area(key=f"researcher_prompts_text_{round_['id']}").input("\n".join(json.dumps(line) for line in lines))
    at = ok(at.run())
    assert HOSTILE in dataframe_values(at)  # the preview, as data
    at = ok(at.button(key=f"researcher_prompts_import_{round_['id']}").click().run())
    assert said(at, "success", "Imported 2 of 4 rows")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {
        "Rows in the file": "4",
        "Imported": "2",
        "Repeated in the file": "1",
        "Already in the round": "1",
    }
    with live.app.state.sessionmaker() as session:
        stored = session.scalars(select(Prompt.text).where(Prompt.round_id == round_["id"]).order_by(Prompt.id))
        assert list(stored) == ["already there", HOSTILE, "A new prompt."]
    assert_no_raw_markup(at)
    # CSV, and a file the API refuses.
    at.radio(key=f"researcher_prompts_format_{round_['id']}").set_value("csv")
    at.text_area(key=f"researcher_prompts_text_{round_['id']}").input("text,source\nCSV prompt,yelp\n")
    at = ok(at.button(key=f"researcher_prompts_import_{round_['id']}").click().run())
    assert rita.requests("POST", f"/rounds/{round_['id']}/prompts")[-1].params == {"format": "csv"}
    assert said(at, "success", "Imported 1 of 1 rows")
    at.radio(key=f"researcher_prompts_format_{round_['id']}").set_value("jsonl")
    at.text_area(key=f"researcher_prompts_text_{round_['id']}").input('{"text": "fine"}\n{not json')
    at = ok(at.button(key=f"researcher_prompts_import_{round_['id']}").click().run())
    assert said(at, "error", "line 2: not valid JSON")


def test_rounds_page_shows_api_errors(rita: PageClient) -> None:
    rita.fail_next("tasks", ApiError(0, "unreachable", "cannot reach the API at http://api (refused)"))
    at = ok(page(rita, "researcher_rounds"))
    assert said(at, "warning", "cannot reach the API")
    rita.fail_next("rounds", ApiError(500, "internal_error", "an unexpected error occurred"))
    at = ok(at.run())
    assert said(at, "error", "an unexpected error occurred")


def test_rounds_page_selects_the_round_just_opened(live: LiveApi, rita: PageClient) -> None:
    live.round(TASK, ["p"], status="closed")
    at = ok(page(rita, "researcher_rounds"))
    assert at.selectbox(key="researcher_rounds_round").value == 1
    at = ok(at.button(key="researcher_open_submit").click().run())
    assert at.selectbox(key="researcher_rounds_round").value == 2
    second = next(r for r in live.admin.rounds(TASK) if r["number"] == 2)
    assert at.text_area(key=f"researcher_prompts_text_{second['id']}")  # the new round takes prompts


# --- dashboard ---------------------------------------------------------------------------------


def test_dashboard_shows_metrics_and_plots(live: LiveApi, rita: PageClient) -> None:
    round_ = labelled_round(live)
    # One more writer finds the model down: an attempt kept unscored.
    writer = live.writer("walt", TASK)
    assignment = writer.start_assignment(round_["id"], "negative")
    live.stubs.mode("fail")
    with pytest.raises(ApiError):
        writer.attempt(assignment["id"], "A perfectly ordinary sentence about lunch.")
    live.stubs.mode("normal")
    at = ok(page(rita, "researcher_dashboard"))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {
        "Attempts": "21",
        "Fooling rate": "57.1%",
        "Confirmation rate": "100.0%",
        "Examples": "21",
        "Validated": "21",
        "Validation coverage": "100.0%",
    }
    # Rows of three metrics, each label in full (six in a row cut "Confirmation rate" short at 1280 pixels).
    holding = [column for column in at.columns if column.metric]
    assert [[m.label for m in column.metric] for column in holding] == [[label] for label in metrics]
    assert [round(column.weight, 3) for column in holding] == [0.333] * 6  # each a third of the width
    assert max(len(label) for label in metrics) <= 20
    assert said(at, "warning", "1 attempt(s) found the model unavailable")
    charts = at.get("vega_lite_chart")
    assert len(charts) == 4, [type(e).__name__ for e in at.main]
    # The confusion chart names the labels as every other page does (label_names), never `neutral`.
    (confusion,) = [pyarrow.ipc.open_stream(d.data.data).read_all().to_pandas() for d in charts[3].proto.datasets]
    assert {"No sentiment", "Positive", "Negative"} <= set(confusion["gold"]), confusion
    assert not {"neutral", "positive", "negative"} & set(confusion["predicted"]), confusion
    assert at.toggle(key="researcher_dash_auto").value is True  # a collecting round refreshes by default
    assert said(at, "caption", "agrees with the validated majority on 30.0% of the 20 examples")
    assert {"val1", "x__bold__"} <= set(dataframe_values(at))  # validators' names, as data
    assert_no_raw_markup(at)
    # The other length unit and the confusion against the writers' targets still draw.
    at.radio(key=f"researcher_dash_unit_{round_['id']}").set_value("chars")
    at.radio(key=f"researcher_dash_gold_{round_['id']}").set_value("target")
    at = ok(at.run())
    assert len(at.get("vega_lite_chart")) == 4
    at.toggle(key="researcher_dash_auto").set_value(False)
    at = ok(at.run())
    assert at.selectbox(key="researcher_dash_every").disabled


def test_dashboard_with_an_empty_round_and_api_errors(live: LiveApi, rita: PageClient) -> None:
    at = ok(page(rita, "researcher_dashboard"))
    assert said(at, "info", "no round yet")
    live.round(TASK, ["p"], status="validating")
    at = ok(at.run())
    assert said(at, "info", "No example has been submitted")
    assert {m.label: m.value for m in at.metric}["Fooling rate"] == "–"
    assert not at.get("vega_lite_chart")
    rita.fail_next("round_stats", ApiError(503, "database_unavailable", "the database cannot be used right now"))
    at = ok(at.run())
    assert said(at, "warning", "the database cannot be used right now")
    assert not at.metric
    # With the request's id (as frontend/client.py gives every error), a 5xx shows it as its reference.
    failed = ApiError(500, "internal_error", "something went wrong on our side", request_id="0f" * 16)
    rita.fail_next("round_stats", failed)
    at = ok(at.run())
    assert said(at, "error", f"something went wrong on our side (reference {'0f' * 16})")


def test_dashboard_says_when_no_new_validator_can_reannotate(live: LiveApi, rita: PageClient) -> None:
    """Multi-label re-annotation needs validators who have not labelled the example: when the
    round's stats say none is left, the researcher is told what to do before closing it."""
    round_ = labelled_round(live)
    real = rita.round_stats(round_["id"])
    assert real["examples"]["awaiting_reannotation_no_new_validator"] == 0
    at = ok(page(rita, "researcher_dashboard"))
    assert not said(at, "warning", "wait for re-annotation")
    stuck = {
        **real,
        "examples": {**real["examples"], "awaiting_reannotation": 3, "awaiting_reannotation_no_new_validator": 2},
    }
    rita.round_stats = lambda round_id: stuck  # type: ignore[method-assign]
    at = ok(at.run())
    assert said(at, "warning", "2 example(s) wait for re-annotation by new validators")
    assert_no_raw_markup(at)


# --- models and datasets ------------------------------------------------------------------------


def run_until_idle(at: AppTest, runs: int = 6) -> AppTest:
    """Rerun the page (as the polling fragment would) until no job is followed any more."""
    for _ in range(runs):
        if not followed_job(at):
            return at
        at = ok(at.run())
    raise AssertionError("the job never finished")


def test_models_page_builds_trains_evaluates_and_promotes(live: LiveApi, rita: PageClient, jobs: JobProcess) -> None:
    round_ = labelled_round(live, status="closed")
    server = register_model_server(live.app, "http://127.0.0.1:8001", admin_token="s3cret-token", tasks=[TASK])
    at = ok(page(rita, "researcher_models"))
    assert said(at, "caption", "Build a round first")
    at = ok(at.button(key="researcher_models_build").click().run())
    assert live.admin.rounds(TASK)[0]["status"] == "built"
    report = live.admin.report(TASK, 1)
    assert isinstance(report, dict)
    total = report["counts"]["total"]
    assert (report["build_id"], total["dev"], total["test"]) == (1, 9, 9)
    assert said(at, "success", f"Built round 1 (build 1): train {total['train']}, dev 9, test 9")
    assert rita.requests("POST", f"/rounds/{round_['id']}/build")[0].body == {"seed": 0}

    # The task YAML's training defaults are preselected (dynasent-r2: 4 epochs at 5e-5, balanced).
    assert at.number_input(key="researcher_train_epochs").value == 4
    assert at.number_input(key="researcher_train_lr").value == 5e-5
    assert at.selectbox(key="researcher_train_weights").value == "balanced"
    at.number_input(key="researcher_train_epochs").set_value(2)
    at = ok(at.button(key="researcher_train_submit").click().run())
    started = rita.requests("POST", JOBS)[-1].body
    assert started["kind"] == "train" and started["params"]["epochs"] == 2 and started["params"]["round"] == 2
    assert started["params"]["allow_unknown_tokens"] is False  # the tokenizer check stays on unless ticked
    assert started["params"]["kind"] == "encoder"  # the linear kind only when chosen
    train = followed_job(at)
    assert train is not None and live.admin.job(train)["params"]["epochs"] == 2  # as the API stored it
    # Polling: the progress bar follows the job, the buttons wait, then the result is shown.
    seen = []
    for fraction, step in ((0.25, 1), (0.75, 3)):
        jobs.progress(train, fraction, f"training: step {step} of 4")
        at = ok(at.run())
        bars = at.get("progress")
        assert bars, texts(at)
        seen.append(bars[0].proto.value)
        assert at.button(key="researcher_train_submit").disabled
    assert seen == [25, 75]
    model = registered_model(live, "dynasent-r2-for-round-2", "v1")
    jobs.succeed(
        train,
        f"trained and registered {model.name} (registry id {model.id})",
        {"model": {"id": model.id, "name": model.name}},
    )
    at = run_until_idle(at)
    assert said(at, "success", "trained and registered dynasent-r2-for-round-2@v1"), texts(at)
    assert not at.get("progress")
    assert "dynasent-r2-for-round-2@v1" in dataframe_values(at)
    assert at.selectbox(key="researcher_models_model").value == model.id  # the model just trained is chosen

    at = ok(at.button(key="researcher_models_evaluate").click().run())
    assert rita.requests("POST", JOBS)[-1].body == {"kind": "evaluate", "params": {"model_id": model.id}}
    evaluate = followed_job(at)
    assert evaluate is not None
    registered_model_evaluation(live, model, {"round 1 dev": 0.52, "round 1 test": 0.49})
    jobs.succeed(evaluate, f"evaluated {model.name}: macro-F1 (%) round 1 dev 52.0, round 1 test 49.0")
    at = run_until_idle(at)
    assert said(at, "success", "evaluated dynasent-r2-for-round-2@v1")
    assert [m["status"] for m in live.admin.models(TASK)] == ["evaluated"]
    # The picker's labels are the names only: the browser keeps the chosen label as the widget's
    # value, so a status in it would stay "(evaluated)" after the promotion. The status is a line of its own.
    assert at.selectbox(key="researcher_models_model").options == [model.name]
    assert said(at, "markdown", "Status: **evaluated**, not promoted"), texts(at)

    # The replicas that follow the task, or registered servers with an admin token; the page never
    # asks for a token or a URL.
    assert at.selectbox(key="researcher_promote_server").options == [
        f"{server} (http://127.0.0.1:8001)",
        "every model-server replica that follows the task",
    ]
    assert not [t for t in at.text_input if t.key and "promote" in t.key]
    at.selectbox(key="researcher_promote_server").set_value(server)
    at = ok(at.button(key="researcher_promote_submit").click().run())
    params = rita.requests("POST", JOBS)[-1].body["params"]
    assert params == {"model_id": model.id, "server": server, "force": False}
    promote = followed_job(at)
    assert promote is not None
    assert "s3cret-token" not in json.dumps(live.admin.job(promote))  # the token stays in the registry
    recorded_promotion(live, model, "http://127.0.0.1:8001")
    jobs.succeed(promote, f"promoted {model.name}: model server {server} (http://127.0.0.1:8001) now serves it")
    at = run_until_idle(at)
    assert said(at, "success", "promoted dynasent-r2-for-round-2@v1")
    assert [m["status"] for m in live.admin.models(TASK)] == ["promoted"]
    assert at.selectbox(key="researcher_models_model").value == model.id
    assert said(at, "markdown", "Status: **promoted**, served by the model server at http://127.0.0.1:8001")
    assert not said(at, "markdown", "evaluated"), texts(at)
    table = next(frame.value for frame in at.dataframe if "kind" in frame.value.columns)
    assert table["kind"].tolist() == ["promote", "evaluate", "train"] and set(table["status"]) == {"succeeded"}


def recorded_promotion(live: LiveApi, model: ModelVersion, endpoint: str) -> None:
    """What a promote job records once the model server has switched (rounds.models.promotion.promote)."""
    with session_scope(live.app.state.sessionmaker) as session:
        row = session.get(ModelVersion, model.id)
        assert row is not None
        row.status, row.endpoint, row.promoted_at = ModelVersionStatus.promoted, endpoint, utcnow()


def registered_model_evaluation(live: LiveApi, model: ModelVersion, macro_f1: dict[str, float]) -> None:
    """What an evaluate job records in the registry (rounds.models.registry.record_evaluation)."""
    with session_scope(live.app.state.sessionmaker) as session:
        task = session.scalars(select(Task).where(Task.name == TASK)).one()
        record_evaluation(session, task, model.directory, {"macro_f1": macro_f1})


def test_models_page_cancels_the_job_it_follows(live: LiveApi, rita: PageClient, jobs: JobProcess) -> None:
    labelled_round(live, status="built")
    at = ok(page(rita, "researcher_models"))
    at = ok(at.button(key="researcher_train_submit").click().run())
    job_id = followed_job(at)
    assert job_id is not None
    jobs.progress(job_id, 0.5, "training: step 2 of 4")
    at = ok(at.button(key=f"researcher_cancel_job_{job_id}").click().run())
    assert rita.requests("POST", f"/jobs/{job_id}/cancel")
    assert live.admin.job(job_id)["cancel_requested_at"] is not None  # the worker stops it next
    jobs._update(job_id, status=JobStatus.cancelled, message="cancelled by rita while it ran", finished_at=utcnow())
    at = run_until_idle(at)
    assert said(at, "warning", f"train job {job_id}: cancelled by rita while it ran"), texts(at)
    assert not followed_job(at)


def test_models_page_promotes_to_the_replicas_that_follow_the_task(
    live: LiveApi, rita: PageClient, jobs: JobProcess
) -> None:
    """With no server registered, the form's one choice names none: the promote job reaches every
    following replica."""
    labelled_round(live, status="built")
    model = registered_model(live, "m", "1")
    at = ok(page(rita, "researcher_models"))
    assert at.selectbox(key="researcher_promote_server").value == ""  # no server registered, still offered
    at.checkbox(key="researcher_promote_force").check()
    at = ok(at.button(key="researcher_promote_submit").click().run())
    assert rita.requests("POST", JOBS)[-1].body["params"] == {"model_id": model.id, "force": True}
    assert live.admin.job(followed_job(at))["queue"] == "cpu"  # type: ignore[arg-type]


def test_models_page_shows_failed_jobs_and_refusals_escaped(live: LiveApi, rita: PageClient, jobs: JobProcess) -> None:
    labelled_round(live, status="built")
    server = register_model_server(live.app, "http://127.0.0.1:8001", admin_token="s3cret-token", tasks=[TASK])
    at = ok(page(rita, "researcher_models"))
    at = ok(at.button(key="researcher_train_submit").click().run())
    failed = followed_job(at)
    assert failed is not None
    jobs.fail(failed, f"unexpected RuntimeError: {HOSTILE}")
    at = run_until_idle(at)
    assert said(at, "error", f"train job {failed}: unexpected RuntimeError: {HOSTILE}"), texts(at)
    assert_no_raw_markup(at)
    assert any(HOSTILE in c.value for c in at.code)  # the failed job's log, as code
    # A train job still running (started elsewhere): the API's 409 is shown, nothing is followed.
    other = live.admin.start_job(TASK, "train", {"epochs": 1})
    at = ok(at.button(key="researcher_train_submit").click().run())
    assert said(at, "error", f"train job {other['id']} of task '{TASK}' is still queued")
    assert not followed_job(at)
    # Promoting a model that was never evaluated: refused by the API, with its reason.
    registered_model(live, "m", "1")
    at = ok(at.run())
    at.selectbox(key="researcher_promote_server").set_value(server)
    at = ok(at.button(key="researcher_promote_submit").click().run())
    assert said(at, "error", "was never evaluated")
    rita.fail_next("models", ApiError(403, "forbidden", "this needs the researcher role; your roles: writer"))
    at = ok(at.run())
    assert said(at, "error", "needs the researcher role")


def form_block(at: AppTest, form_id: str) -> Any:
    """The ``st.form`` block with ``form_id`` as the page drew it."""

    def walk(node: Any) -> Any:
        proto: Any = getattr(node, "proto", None)
        is_form = proto is not None and proto.DESCRIPTOR.name == "Block" and proto.WhichOneof("type") == "form"
        if is_form and proto.form.form_id == form_id:
            return proto.form
        children = getattr(node, "children", None)
        for child in (children or {}).values() if isinstance(children, dict) else []:
            found = walk(child)
            if found is not None:
                return found
        return None

    found = walk(at.main)
    assert found is not None, f"no form {form_id}"
    return found


def test_models_page_forms_that_start_jobs_do_not_submit_on_enter(live: LiveApi, rita: PageClient) -> None:
    labelled_round(live, status="built")
    registered_model(live, "m", "1", macro_f1={"round 1 dev": 0.6})
    at = ok(page(rita, "researcher_models"))
    # The browser submits a form on Enter in a field only with enter_to_submit (Streamlit's default).
    for form_id in ("researcher_models_train_form", "researcher_models_promote_form"):
        assert form_block(at, form_id).enter_to_submit is False, form_id
    at.number_input(key="researcher_train_epochs").set_value(5)
    at = ok(at.run())
    assert not rita.requests("POST", JOBS) and not followed_job(at)
    assert live.admin.jobs(TASK) == []


def test_models_page_shows_the_newest_failed_job_of_each_kind(
    live: LiveApi, rita: PageClient, jobs: JobProcess
) -> None:
    labelled_round(live, status="built")
    model = registered_model(live, "m", "1", macro_f1={"round 1 dev": 0.6})
    train = live.admin.start_job(TASK, "train", {"epochs": 1})["id"]
    jobs.progress(train, 0.5, "training: step 1 of 2")
    at = ok(page(rita, "researcher_models"))  # started elsewhere: not followed, nothing failed yet
    assert not followed_job(at) and not at.error
    jobs.fail(train, f"unexpected RuntimeError: {HOSTILE}")
    at = ok(at.run())  # the next poll
    assert said(at, "error", f"train job {train}: unexpected RuntimeError: {HOSTILE}"), texts(at)
    assert any(HOSTILE in c.value for c in at.code)  # its log
    assert_no_raw_markup(at)
    # An evaluate job that failed and then one that succeeded: the evaluation is fine now.
    evaluate = live.admin.start_job(TASK, "evaluate", {"model_id": model.id})["id"]
    jobs.fail(evaluate, "the evaluation broke")
    at = ok(at.run())
    assert said(at, "error", f"evaluate job {evaluate}: the evaluation broke")
    again = live.admin.start_job(TASK, "evaluate", {"model_id": model.id})["id"]
    jobs.succeed(again, "evaluated m@1")
    at = ok(at.run())
    assert not said(at, "error", "the evaluation broke"), texts(at)
    assert said(at, "error", f"train job {train}: unexpected RuntimeError")  # still the newest train job
    # A later train job that succeeds clears the train failure too.
    retrain = live.admin.start_job(TASK, "train", {"epochs": 1})["id"]
    jobs.succeed(retrain, "trained and registered m@2")
    at = ok(at.run())
    assert not at.error, texts(at)


def test_models_page_asks_before_promoting_a_worse_model(live: LiveApi, rita: PageClient, jobs: JobProcess) -> None:
    labelled_round(live, status="built")
    registered_model(live, "good", "1", macro_f1={"round 1 dev": 0.7}, promoted_to="http://127.0.0.1:8001")
    worse = registered_model(live, "worse", "1", macro_f1={"round 1 dev": 0.36})
    at = ok(page(rita, "researcher_models"))
    assert at.selectbox(key="researcher_models_model").value == worse.id
    at = ok(at.button(key="researcher_promote_submit").click().run())
    # Refused by the API (409 confirm_worse): the reason, both scores, and a choice; nothing queued.
    assert said(at, "warning", "worse@1 scores macro-F1 0.360 on round 1 dev, below good@1, the promoted model (0.700)")
    assert said(at, "warning", "within 0.05 of chance (0.333")
    scores = next(frame.value for frame in at.dataframe if "chance" in frame.value.columns)
    assert scores[["model", "macro-F1"]].values.tolist() == [["worse@1", 0.36], ["good@1", 0.7]]
    assert live.admin.jobs(TASK) == [] and not followed_job(at)
    at = ok(at.button(key="researcher_promote_not").click().run())
    assert said(at, "info", "worse@1 was not promoted")
    assert not [b for b in at.button if b.key == "researcher_promote_anyway"]
    assert live.admin.jobs(TASK) == [] and len(rita.requests("POST", JOBS)) == 1
    # Asked again, and promoted anyway: the same job with confirm_worse.
    at = ok(at.button(key="researcher_promote_submit").click().run())
    at = ok(at.button(key="researcher_promote_anyway").click().run())
    assert rita.requests("POST", JOBS)[-1].body == {
        "kind": "promote",
        "params": {"model_id": worse.id, "force": False, "confirm_worse": True},
    }
    promote = followed_job(at)
    assert promote is not None and live.admin.job(promote)["params"]["confirm_worse"] is True
    assert not [b for b in at.button if b.key == "researcher_promote_anyway"]


def test_models_page_downloads_the_dataset_and_the_report(live: LiveApi, rita: PageClient) -> None:
    labelled_round(live, status="built")
    at = ok(page(rita, "researcher_models"))
    assert not at.get("download_button")
    at.selectbox(key="researcher_download_split").set_value("dev")
    at.selectbox(key="researcher_download_format").set_value("csv")
    at = ok(at.button(key="researcher_download_fetch").click().run())
    sent = rita.requests("GET", f"/tasks/{TASK}/rounds/1/dataset")[-1]
    assert sent.params == {"split": "dev", "format": "csv"}
    ready = at.session_state["researcher_models_download"]
    rows = list(csv.reader(io.StringIO(ready["data"].decode("utf-8"))))
    assert ready["name"] == f"{TASK}-r1-dev.csv" and "text" in rows[0] and len(rows) == 10
    assert len(at.get("download_button")) == 1
    at.radio(key="researcher_download_what").set_value("report")
    at = ok(at.button(key="researcher_download_fetch").click().run())
    assert rita.requests("GET", f"/tasks/{TASK}/rounds/1/report")[-1].params == {"format": "markdown"}
    ready = at.session_state["researcher_models_download"]
    assert ready["name"] == f"{TASK}-r1-report.md" and b"Datasheet" in ready["data"]
    rita.fail_next("report", ApiError(409, "conflict", "round 1 has not been built"))
    at = ok(at.button(key="researcher_download_fetch").click().run())
    assert said(at, "error", "has not been built")
    assert not at.get("download_button")


# --- plots ---------------------------------------------------------------------------------------


def plot_fixture(round_id: int = 1) -> dict[str, Any]:
    examples = []
    cells = [
        ("positive", "negative", "positive"),
        ("negative", "neutral", "negative"),
        ("neutral", "neutral", "neutral"),
        ("positive", "positive", "mixed"),
        ("negative", "positive", None),
    ]
    for i, (target, prediction, majority) in enumerate(cells * 4):
        examples.append(
            {
                "example_id": i + 1,
                "condition": "no_prompt" if i % 5 == 4 else "prompt",
                "origin": "written",
                "edit_distance": None if i % 5 == 4 else round(0.05 * (i % 19), 2),
                "chars": 30 + i,
                "words": 5 + i % 7,
                "target": target,
                "prediction": prediction,
                "majority": majority,
                "validated": majority is not None,
                "fooled": target != prediction,
                "validations": 5,
            }
        )
    return {
        "round_id": round_id,
        "round": 1,
        "task": TASK,
        "labels": ["positive", "negative", "neutral"],
        "validation_labels": ["positive", "negative", "neutral", "mixed"],
        "multi_label": False,
        "total_examples": 20,
        "truncated": False,
        "examples": examples,
        "worker_agreement": [
            {"username": "val1", "labels": 20, "judged": 20, "agreement_rate": 0.9, "qualified": True},
            {"username": "val2", "labels": 20, "judged": 20, "agreement_rate": 0.85, "qualified": True},
            {"username": HOSTILE, "labels": 20, "judged": 20, "agreement_rate": 0.1, "qualified": False},
            {"username": "new", "labels": 2, "judged": 0, "agreement_rate": None, "qualified": True},
        ],
    }


def drawn(chart: alt.TopLevelMixin | None) -> dict[str, Any]:
    """A chart's Vega-Lite spec (it must have been drawn)."""
    assert chart is not None
    return chart.to_dict()


def test_plots_on_a_fixture() -> None:
    data = plot_fixture()
    counts = plots.confusion_counts(data)
    assert list(counts.columns) == ["gold", "predicted", "count"]
    order = ["positive", "negative", "neutral", "mixed"]
    table = counts.pivot(index="gold", columns="predicted", values="count").reindex(index=order, columns=order)
    # The same labels on both axes, in the task's order, with zeros where nothing fell.
    assert list(dict.fromkeys(counts["gold"])) == list(dict.fromkeys(counts["predicted"])) == order
    assert table.loc["positive", "negative"] == 4 and table.loc["negative", "neutral"] == 4
    assert table.loc["mixed", "positive"] == 4 and table.loc["positive", "positive"] == 0
    assert counts["count"].sum() == 16  # the four examples without a majority are left out
    by_target = plots.confusion_counts(data, "target")
    assert by_target["count"].sum() == 20 and "mixed" not in set(by_target["gold"])

    spec = drawn(plots.edit_distance_chart(data))
    assert spec["encoding"]["x"]["bin"] == {"extent": [0, 1], "step": 0.05}
    assert len(spec["datasets"][spec["data"]["name"]]) == 16  # no-prompt examples have no distance
    spec = drawn(plots.worker_agreement_chart(data))
    rows = spec["datasets"][spec["data"]["name"]]
    assert sorted(r["agreement_rate"] for r in rows) == [0.1, 0.85, 0.9]  # the unjudged one is left out
    assert {r["status"] for r in rows} == {"qualified", "unqualified"}
    assert drawn(plots.length_chart(data, "chars"))["encoding"]["x"]["field"] == "chars"
    layered = drawn(plots.confusion_chart(data))
    assert [layer["mark"]["type"] for layer in layered["layer"]] == ["rect", "text"]
    named = drawn(plots.confusion_chart(data, label_names={"neutral": "No sentiment", "mixed": "Mixed sentiment"}))
    cells = named["datasets"][named["data"]["name"]]
    # Each label by its display name; one without a name as written; the counts unchanged.
    assert list(dict.fromkeys(r["gold"] for r in cells)) == ["positive", "negative", "No sentiment", "Mixed sentiment"]
    assert sum(r["count"] for r in cells) == 16
    assert plots.summary(data) == {
        "examples": 20,
        "validated": 16,
        "with_majority": 16,
        "model_accuracy": 0.25,
        "mean_edit_distance": pytest.approx(sum(0.05 * (i % 19) for i in range(20) if i % 5 != 4) / 16, abs=1e-3),
    }


COUNTED_FIELDS = {"count", "words", "chars"}  # a count of examples or validators, a length


def count_channels(spec: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every position or colour channel of a Vega-Lite spec (layers included) whose values count things."""
    found = []
    for layer in [spec, *spec.get("layer", [])]:
        for channel, encoding in (layer.get("encoding") or {}).items():
            counts = isinstance(encoding, dict) and (
                encoding.get("aggregate") == "count" or encoding.get("field") in COUNTED_FIELDS
            )
            if channel in ("x", "y", "color") and counts:
                found.append((channel, encoding))
    return found


def test_count_axes_show_whole_numbers() -> None:
    data = plot_fixture()
    charts = {
        "edit distance": plots.edit_distance_chart(data),
        "length in words": plots.length_chart(data, "words"),
        "length in characters": plots.length_chart(data, "chars"),
        "validators' agreement": plots.worker_agreement_chart(data),
        "confusion (majority)": plots.confusion_chart(data),
        "confusion (target)": plots.confusion_chart(data, "target"),
    }
    for name, chart in charts.items():
        channels = count_channels(drawn(chart))
        assert channels, f"{name}: no count axis found"
        for channel, encoding in channels:
            guide = encoding.get("legend" if channel == "color" else "axis") or {}
            # Ticks (and legend labels) one apart at least, printed as integers: never "0.5 examples".
            assert guide.get("tickMinStep") == 1 and guide.get("format") == "d", (name, channel, encoding)
            if "bin" in encoding and encoding.get("field") in ("words", "chars"):
                assert encoding["bin"].get("minstep") == 1, (name, encoding)  # no half-word bins


def test_plots_without_data() -> None:
    empty: dict[str, Any] = {"examples": [], "worker_agreement": []}
    for chart in (
        plots.edit_distance_chart(empty),
        plots.length_chart(empty),
        plots.worker_agreement_chart(empty),
        plots.confusion_chart(empty),
    ):
        assert chart is None
    assert plots.confusion_counts({}).empty
    assert plots.summary({})["model_accuracy"] is None


# --- the real client against the real API ------------------------------------------------------


@pytest.mark.slow
def test_researcher_pages_against_the_real_api(app: FastAPI, built: BuiltRound, tmp_path: Path) -> None:
    """The pages with the real ApiClient, the API served over HTTP, a built round, a real
    `dynaloop worker` and its `dynaloop job run` process: plot data, downloads, a train job
    followed to the end."""
    import time

    from frontend.client import ApiClient
    from tests.conftest import free_port, worker_process
    from tests.stub_model_server import ThreadedServer
    from tests.test_jobs import TINY_TRAIN

    server = ThreadedServer(app, free_port()).start()
    try:
        client = ApiClient(server.url, built["researcher"].token)
        data = client.plot_data(built["round"]["id"])
        assert data["total_examples"] == 21 and len(data["worker_agreement"]) >= 5
        assert client.models(TASK) == [] and client.jobs(TASK) == []

        def real_page(name: str) -> AppTest:
            at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=60)
            at.session_state["client"] = client
            at.session_state["token"] = client.token
            at.session_state["user"] = {"username": "rita", "roles": ["researcher"]}
            at.session_state["roles"] = ["researcher"]
            return ok(at.run())

        at = real_page("researcher_dashboard")
        assert {m.label: m.value for m in at.metric}["Validated"] == "21"
        assert len(at.get("vega_lite_chart")) == 4 and not at.error

        at = real_page("researcher_models")
        at.selectbox(key="researcher_download_split").set_value("dev")
        at = ok(at.button(key="researcher_download_fetch").click().run())
        assert len(at.session_state["researcher_models_download"]["data"].splitlines()) == 9

        with worker_process(app, "cpu", "page-worker", tmp_path / "worker.log"):
            job = client.start_job(TASK, "train", TINY_TRAIN)
            at.session_state["researcher_models_job"] = {TASK: job["id"]}
            deadline = time.monotonic() + 300
            while at.session_state["researcher_models_job"].get(TASK) and time.monotonic() < deadline:
                time.sleep(0.5)
                at = ok(at.run())
        assert said(at, "success", "trained and registered dynasent-r2-for-round-2@"), texts(at)
        assert [m["status"] for m in client.models(TASK)] == ["trained"]
        assert client.job(job["id"])["status"] == "succeeded"
    finally:
        server.stop()


def test_models_page_offers_the_relaxations_of_a_refused_build(live: LiveApi, rita: PageClient) -> None:
    """A small round strict cannot build: the page shows what is short and each relaxation's
    counts, and builds the one the researcher picks."""
    round_ = live.round(TASK, [f"Prompt {i}: lunch." for i in range(20)], target_label_mode="writer_choice")
    validators = [f"pv{i}" for i in range(5)]
    for name in validators:
        live.user(name, "validator")
    small = {
        "positive": ["positive", "positive", "positive", "neutral"],
        "negative": ["negative", "negative", "neutral", "negative"],
        "neutral": ["neutral", "neutral", "neutral", "positive"],
    }
    for gold, predictions in small.items():
        for i, predicted in enumerate(predictions):
            example_id = live.example(round_, f"Note {gold} {i}: a {KEYWORD[predicted]} lunch.", target=gold)
            for name in validators:
                live.label_as(name, example_id, gold)
    live.admin.set_round_status(round_["id"], "closed")
    at = ok(page(rita, "researcher_models"))
    at = ok(at.button(key="researcher_models_build").click().run())
    assert said(at, "error", "the strict policy cannot be met: cell gold=positive/predicted=negative")
    assert "gold=positive/predicted=negative" in dataframe_values(at)
    assert live.admin.rounds(TASK)[0]["status"] == "closed"
    at.radio(key="researcher_models_build_relaxation").set_value("relaxed")
    at = ok(at.button(key="researcher_models_build_relaxed").click().run())
    assert rita.requests("POST", f"/rounds/{round_['id']}/build")[-1].body == {
        "seed": 0,
        "policy": "relaxed",
        "chance": False,
    }
    assert said(at, "success", "Built round 1 (build 1): train 6, dev 3, test 3; relaxed policy.")
    assert live.admin.rounds(TASK)[0]["status"] == "built"


def _lopsided_closed_round(live: LiveApi) -> Round:
    """tests/test_build_policies.py's LOPSIDED round through the live API: 12 examples, 5
    positive, 4 negative, 3 neutral, each gold with at least 4 of 5 votes; closed."""
    round_ = live.round(TASK, [f"Prompt {i}: lunch." for i in range(20)], target_label_mode="writer_choice")
    validators = [f"lv{i}" for i in range(5)]
    for name in validators:
        live.user(name, "validator")
    lopsided = {
        "positive": ["positive", "positive", "neutral", "negative", "positive"],
        "negative": ["negative", "neutral", "negative", "positive"],
        "neutral": ["neutral", "positive", "neutral"],
    }
    for gold, predictions in lopsided.items():
        for i, predicted in enumerate(predictions):
            example_id = live.example(round_, f"Note {gold} {i}: a {KEYWORD[predicted]} lunch.", target=gold)
            for position, name in enumerate(validators):
                live.label_as(name, example_id, "mixed" if i % 2 == 0 and position == 4 else gold)
    live.admin.set_round_status(round_["id"], "closed")
    return round_


WIDENED = "relaxed, dev+test up to 0.7 of each class"


def frames_with(at: AppTest, column: str) -> list[Any]:
    """The data frames shown whose columns include ``column``."""
    return [frame.value for frame in at.dataframe if column in frame.value.columns]


def test_models_page_relaxed_policy_refused_offers_the_wider_guard_and_builds_with_it(
    live: LiveApi, rita: PageClient
) -> None:
    """The page's policy controls send what is set; plain relaxed is refused by the class-balance
    guard; the refusal's table has the option that builds with every count; building with it
    sends exactly its settings and builds."""
    round_ = _lopsided_closed_round(live)
    at = ok(page(rita, "researcher_models"))
    at.selectbox(key="researcher_models_build_policy").set_value("relaxed")
    at = ok(at.button(key="researcher_models_build").click().run())
    assert rita.requests("POST", f"/rounds/{round_['id']}/build")[-1].body == {"seed": 0, "policy": "relaxed"}
    assert said(at, "error", "the relaxed policy cannot be met: the class-balance guard lets dev+test take at most 0.5")
    assert live.admin.rounds(TASK)[0]["status"] == "closed"
    frame = frames_with(at, "settings")[0]
    row = frame.set_index("option").loc[WIDENED].to_dict()
    assert row == {
        "settings": "policy=relaxed, chance=false, max_dev_test_share=0.7",
        "dev": 3,
        "test": 3,
        "train": 6,
        "per": "1 per class",
        "positive train/dev/test": "3/1/1",
        "negative train/dev/test": "2/1/1",
        "neutral train/dev/test": "1/1/1",
    }
    refused = frames_with(at, "refused by")[0].set_index("option")
    assert refused.loc["strict", "refused by"] == "dev_test_size"
    assert refused.loc["relaxed, 3 of 5 votes", "refused by"] == "balance_guard"
    assert NOTHING not in " ".join(texts(at))
    at.radio(key="researcher_models_build_relaxation").set_value(WIDENED)
    at = ok(at.button(key="researcher_models_build_relaxed").click().run())
    assert rita.requests("POST", f"/rounds/{round_['id']}/build")[-1].body == {
        "seed": 0,
        "policy": "relaxed",
        "chance": False,
        "max_dev_test_share": 0.7,
    }
    assert said(at, "success", "Built round 1 (build 1): train 6, dev 3, test 3; relaxed policy."), texts(at)
    assert live.admin.rounds(TASK)[0]["status"] == "built"


NOTHING = "No option builds this round, and a closed round takes no more examples or labels"


def test_models_page_previews_every_policy_without_building(live: LiveApi, rita: PageClient) -> None:
    """ "Preview every policy" shows the options that build and those that do not, records
    nothing; changing a setting drops the table computed for the old one; a build from the
    table sends the seed it was previewed with."""
    round_ = _lopsided_closed_round(live)
    at = ok(page(rita, "researcher_models"))
    at.number_input(key="researcher_models_build_seed").set_value(3)
    at.selectbox(key="researcher_models_build_policy").set_value("relaxed")
    at.selectbox(key="researcher_models_build_share").set_value(0.6)
    at = ok(at.button(key="researcher_models_build_preview").click().run())
    assert rita.requests("POST", f"/rounds/{round_['id']}/build/preview")[-1].body == {
        "seed": 3,
        "policy": "relaxed",
        "max_dev_test_share": 0.6,
    }
    assert not rita.requests("POST", f"/rounds/{round_['id']}/build")
    assert live.admin.rounds(TASK)[0]["status"] == "closed"
    assert not at.error
    options = frames_with(at, "settings")[0]
    assert list(options["option"]) == [WIDENED, "relaxed, 3 of 5 votes, dev+test up to 0.7 of each class"]
    refused = frames_with(at, "refused by")[0]
    assert list(refused["option"]) == [
        "as set above",
        "strict",
        "relaxed",
        "relaxed, 3 of 5 votes",
        "model at chance, 3 of 5 votes",
    ]
    assert "class-balance guard" in refused.set_index("option").loc["as set above", "why"]

    at.selectbox(key="researcher_models_build_policy").set_value("strict")
    at = ok(at.run())
    assert not frames_with(at, "settings") and not frames_with(at, "refused by")
    at.selectbox(key="researcher_models_build_policy").set_value("relaxed")
    at = ok(at.button(key="researcher_models_build_preview").click().run())
    at = ok(at.button(key="researcher_models_build_relaxed").click().run())
    assert rita.requests("POST", f"/rounds/{round_['id']}/build")[-1].body == {
        "seed": 3,
        "policy": "relaxed",
        "chance": False,
        "max_dev_test_share": 0.7,
    }
    assert live.admin.rounds(TASK)[0]["status"] == "built"


def test_models_page_says_the_way_on_when_nothing_builds(live: LiveApi, rita: PageClient) -> None:
    """A closed round no option builds (one class): the page says so and how to go on, never
    "collect more", and offers no build."""
    round_ = live.round(TASK, [f"Prompt {i}: lunch." for i in range(20)], target_label_mode="writer_choice")
    for name in (f"ov{i}" for i in range(5)):
        live.user(name, "validator")
    for i in range(6):
        example_id = live.example(round_, f"Note {i}: a great lunch.", target="positive")
        for name in (f"ov{i}" for i in range(5)):
            live.label_as(name, example_id, "positive")
    live.admin.set_round_status(round_["id"], "closed")
    at = ok(page(rita, "researcher_models"))
    at = ok(at.button(key="researcher_models_build").click().run())
    assert said(at, "error", "No relaxation builds round 1, and a closed round takes no more examples or labels")
    assert said(at, "caption", NOTHING)
    assert not [b for b in at.button if b.key == "researcher_models_build_relaxed"]
    assert "collect more" not in " ".join(texts(at))
    assert live.admin.rounds(TASK)[0]["status"] == "closed"
