"""The researcher pages (Streamlit AppTest with the in-memory API of tests/frontend_fakes.py)
and the dashboard's plot functions (frontend/plots.py) on fixtures."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from streamlit.testing.v1 import AppTest

from frontend import plots
from frontend.client import ApiError
from services.taskdef import example_path
from tests.frontend_fakes import FakeApiClient
from tests.test_round_build import built  # noqa: F401 - the built-round fixture

PAGES = Path(__file__).resolve().parents[1] / "frontend" / "pages"
HOSTILE = "<script>alert('x')</script> **bold** [link](http://evil.example) $x$"
TASK = "dynasent-r2"


@pytest.fixture
def fake() -> FakeApiClient:
    client = FakeApiClient()
    client.token = client.add_user("rita", "researcher")
    client.add_task(TASK, onboarding_quiz=None)
    return client


def page(fake: FakeApiClient, name: str, *, roles: tuple[str, ...] = ("researcher",)) -> AppTest:
    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=60)
    at.session_state["client"] = fake
    at.session_state["token"] = fake.token
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
            assert "<script>" not in element.value and "**bold**" not in element.value, (kind, element.value)


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


# --- guard ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["researcher_rounds", "researcher_dashboard", "researcher_models"])
def test_pages_need_the_researcher_role(fake, name) -> None:  # type: ignore[no-untyped-def]
    at = ok(page(fake, name, roles=("writer",)))
    assert said(at, "error", "needs the researcher role")
    assert not fake.calls_of("tasks")


# --- tasks and rounds ------------------------------------------------------------------------


def test_rounds_page_creates_a_task_and_escapes_its_title(fake) -> None:  # type: ignore[no-untyped-def]
    at = ok(page(fake, "researcher_rounds"))
    assert at.title[0].value == "Tasks and rounds"
    at.text_area(key="researcher_task_yaml").input(hostile_task_yaml())
    at = ok(at.button(key="researcher_create_task").click().run())
    assert "hostile-task" in fake.task_records
    assert said(at, "success", "Created task hostile-task")
    assert at.selectbox(key="researcher_rounds_task").value == "hostile-task"
    assert HOSTILE in [t.value for t in at.text], texts(at)  # the title, literally, as plain text
    assert_no_raw_markup(at)
    # The same YAML again: the API's 409, shown as it is.
    at.text_area(key="researcher_task_yaml").input(hostile_task_yaml())
    at = ok(at.button(key="researcher_create_task").click().run())
    assert said(at, "error", "already exists")


def test_rounds_page_shows_invalid_yaml_errors(fake) -> None:  # type: ignore[no-untyped-def]
    at = page(fake, "researcher_rounds")
    at.text_area(key="researcher_task_yaml").input("name: Not Valid\nfamily: nope\n")
    at = ok(at.button(key="researcher_create_task").click().run())
    assert at.error and "family" in at.error[0].value
    at = ok(at.button(key="researcher_create_task").click().run())  # nothing pasted now? still the same text
    at.text_area(key="researcher_task_yaml").input("")
    at = ok(at.button(key="researcher_create_task").click().run())
    assert said(at, "warning", "paste the task's YAML")


def test_rounds_page_opens_moves_and_sets_the_model(fake) -> None:  # type: ignore[no-untyped-def]
    at = ok(page(fake, "researcher_rounds"))
    assert said(at, "info", "no round yet")
    at.text_area(key="researcher_open_endpoints").input("http://127.0.0.1:8001\n\nhttp://127.0.0.1:8002")
    at.selectbox(key="researcher_open_mode").set_value("writer_choice")
    at = ok(at.button(key="researcher_open_submit").click().run())
    call = fake.calls_of("open_round")[-1]
    assert call["model_endpoints"] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert call["target_label_mode"] == "writer_choice"
    assert said(at, "success", "Opened round 1")
    assert at.dataframe[0].value["status"].tolist() == ["collecting"]
    # collecting -> validating -> closed
    at = ok(at.button(key="researcher_status_1_validating").click().run())
    assert fake.round_records[1]["status"] == "validating"
    at = ok(at.button(key="researcher_status_1_closed").click().run())
    assert fake.round_records[1]["status"] == "closed"
    assert not [b for b in at.button if b.key and b.key.startswith("researcher_status_")]
    # A closed round: the next one can be opened; a refused transition shows the API's message.
    fake.round_records[1]["status"] = "collecting"
    fake.fail_next("set_round_status", ApiError(409, "conflict", "round 1 is **busy** <b>now</b>"))
    at = ok(page(fake, "researcher_rounds").button(key="researcher_status_1_validating").click().run())
    assert any(r"round 1 is \*\*busy\*\* \<b\>now\<\/b\>" in e.value for e in at.error)


def test_rounds_page_sets_the_model_in_the_loop_and_shows_the_registry(fake) -> None:  # type: ignore[no-untyped-def]
    fake.add_round(TASK, ["a prompt"])  # model endpoints: http://model
    fake.add_model(TASK, "dynasent-r2-for-round-2", "3f9a", status="promoted", endpoint="http://model",
                   macro_f1={"round 1 test": 0.71})
    at = ok(page(fake, "researcher_rounds"))
    assert "http://model" in [c.value for c in at.code]
    values = dataframe_values(at)
    assert "dynasent-r2-for-round-2@3f9a" in values and "round 1 test 71.0" in values
    at.text_area(key="researcher_model_endpoints_1").input("ftp://nowhere")
    at = ok(at.button(key="researcher_model_save_1").click().run())
    assert said(at, "error", "is not an http(s) URL")
    at.text_area(key="researcher_model_endpoints_1").input("http://127.0.0.1:9001\nhttp://127.0.0.1:9002")
    at = ok(at.button(key="researcher_model_save_1").click().run())
    assert fake.round_records[1]["model_endpoints"] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert said(at, "success", "now uses 2 model endpoint(s)")


def test_rounds_page_imports_prompts_and_escapes_them(fake) -> None:  # type: ignore[no-untyped-def]
    fake.add_round(TASK, ["already there"])
    at = ok(page(fake, "researcher_rounds"))
    lines = [{"text": HOSTILE, "id": "p1"}, {"text": "already there"}, {"text": HOSTILE}, {"text": "A new prompt."}]
    at.text_area(key="researcher_prompts_text_1").input("\n".join(json.dumps(line) for line in lines))
    at = ok(at.run())
    assert HOSTILE in dataframe_values(at)  # the preview, as data
    at = ok(at.button(key="researcher_prompts_import_1").click().run())
    assert said(at, "success", "Imported 2 of 4 rows")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {"Rows in the file": "4", "Imported": "2", "Repeated in the file": "1",
                       "Already in the round": "1"}
    assert [p["text"] for p in fake.prompts[1]] == ["already there", HOSTILE, "A new prompt."]
    assert_no_raw_markup(at)
    # CSV, and a file the API refuses.
    at.radio(key="researcher_prompts_format_1").set_value("csv")
    at.text_area(key="researcher_prompts_text_1").input("text,source\nCSV prompt,yelp\n")
    at = ok(at.button(key="researcher_prompts_import_1").click().run())
    assert fake.calls_of("import_prompts")[-1]["format"] == "csv"
    at.radio(key="researcher_prompts_format_1").set_value("jsonl")
    at.text_area(key="researcher_prompts_text_1").input('{"text": "fine"}\n{not json')
    at = ok(at.button(key="researcher_prompts_import_1").click().run())
    assert said(at, "error", "line 2: not valid JSON")


def test_rounds_page_shows_api_errors(fake) -> None:  # type: ignore[no-untyped-def]
    fake.fail_next("tasks", ApiError(0, "unreachable", "cannot reach the API at http://api (refused)"))
    at = ok(page(fake, "researcher_rounds"))
    assert said(at, "warning", "cannot reach the API")
    fake.fail_next("rounds", ApiError(500, "internal_error", "an unexpected error occurred"))
    at = ok(at.run())
    assert said(at, "error", "an unexpected error occurred")


# --- dashboard ---------------------------------------------------------------------------------


def plot_fixture(round_id: int = 1) -> dict[str, Any]:
    examples = []
    cells = [("positive", "negative", "positive"), ("negative", "neutral", "negative"),
             ("neutral", "neutral", "neutral"), ("positive", "positive", "mixed"), ("negative", "positive", None)]
    for i, (target, prediction, majority) in enumerate(cells * 4):
        examples.append({"example_id": i + 1, "condition": "no_prompt" if i % 5 == 4 else "prompt",
                         "origin": "written", "edit_distance": None if i % 5 == 4 else round(0.05 * (i % 19), 2),
                         "chars": 30 + i, "words": 5 + i % 7, "target": target, "prediction": prediction,
                         "majority": majority, "validated": majority is not None, "fooled": target != prediction,
                         "validations": 5})
    return {"round_id": round_id, "round": 1, "task": TASK, "labels": ["positive", "negative", "neutral"],
            "validation_labels": ["positive", "negative", "neutral", "mixed"], "multi_label": False,
            "total_examples": 20, "truncated": False, "examples": examples,
            "worker_agreement": [
                {"username": "val1", "labels": 20, "judged": 20, "agreement_rate": 0.9, "qualified": True},
                {"username": "val2", "labels": 20, "judged": 20, "agreement_rate": 0.85, "qualified": True},
                {"username": HOSTILE, "labels": 20, "judged": 20, "agreement_rate": 0.1, "qualified": False},
                {"username": "new", "labels": 2, "judged": 0, "agreement_rate": None, "qualified": True}]}


STATS = {"round": 1, "status": "collecting",
         "attempts": {"scored": 120, "fooled": 30, "model_unavailable": 2, "fooling_rate": 0.25},
         "confirmations": {"yes": 24, "no": 6, "rate": 0.8},
         "examples": {"submitted": 40, "fooled": 20, "prompt": 36, "no_prompt": 4, "validating": 10,
                      "validated": 30, "dropped": 0, "by_target_label": {}},
         "validations": {"given": 160, "counted": 150, "needed": 200, "coverage": 0.75},
         "prompts": {"total": 100, "used": 40}}


def test_dashboard_shows_metrics_and_plots(fake) -> None:  # type: ignore[no-untyped-def]
    fake.add_round(TASK, ["p"])
    fake.research["stats"][1] = STATS
    fake.research["plot_data"][1] = plot_fixture()
    at = ok(page(fake, "researcher_dashboard"))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {"Attempts": "120", "Fooling rate": "25.0%", "Confirmation rate": "80.0%", "Examples": "40",
                       "Validated": "30", "Validation coverage": "75.0%"}
    assert said(at, "warning", "2 attempt(s) found the model unavailable")
    charts = at.get("vega_lite_chart")
    assert len(charts) == 4, [type(e).__name__ for e in at.main]
    assert at.toggle(key="researcher_dash_auto").value is True  # a collecting round refreshes by default
    assert said(at, "caption", "agrees with the validated majority on 25.0% of the 16 examples")
    assert HOSTILE in dataframe_values(at)  # a validator's name, as data
    assert_no_raw_markup(at)
    # The other length unit and the confusion against the writers' targets still draw.
    at.radio(key="researcher_dash_unit_1").set_value("chars")
    at.radio(key="researcher_dash_gold_1").set_value("target")
    at = ok(at.run())
    assert len(at.get("vega_lite_chart")) == 4
    at.toggle(key="researcher_dash_auto").set_value(False)
    at = ok(at.run())
    assert at.selectbox(key="researcher_dash_every").disabled


def test_dashboard_with_an_empty_round_and_api_errors(fake) -> None:  # type: ignore[no-untyped-def]
    at = ok(page(fake, "researcher_dashboard"))
    assert said(at, "info", "no round yet")
    fake.add_round(TASK, ["p"], status="validating")
    at = ok(at.run())
    assert said(at, "info", "No example has been submitted")
    assert {m.label: m.value for m in at.metric}["Fooling rate"] == "–"
    assert not at.get("vega_lite_chart")
    fake.fail_next("round_stats", ApiError(503, "database_unavailable", "the database cannot be used right now"))
    at = ok(at.run())
    assert said(at, "warning", "the database cannot be used right now")
    assert not at.metric


# --- models and datasets ------------------------------------------------------------------------


def run_until_idle(at: AppTest, fake: FakeApiClient, runs: int = 6) -> AppTest:
    """Rerun the page (as the polling fragment would) until no job is followed any more."""
    for _ in range(runs):
        if not at.session_state["researcher_models_job"].get(TASK):
            return at
        at = ok(at.run())
    raise AssertionError("the job never finished")


def test_models_page_builds_trains_evaluates_and_promotes(fake) -> None:  # type: ignore[no-untyped-def]
    fake.add_round(TASK, ["p"], status="closed")
    at = ok(page(fake, "researcher_models"))
    assert said(at, "caption", "Build a round first")
    at = ok(at.button(key="researcher_models_build").click().run())
    assert fake.round_records[1]["status"] == "built"
    assert said(at, "success", "Built round 1 (build 1): train 12, dev 9, test 9")

    at.number_input(key="researcher_train_epochs").set_value(2)
    at = ok(at.button(key="researcher_train_submit").click().run())
    started = fake.calls_of("start_job")[-1]
    assert started["kind"] == "train" and started["params"]["epochs"] == 2 and started["params"]["round"] == 2
    # Polling: the progress bar follows the job, the buttons wait, then the result is shown.
    seen = []
    for _ in range(2):
        bars = at.get("progress")
        assert bars, texts(at)
        seen.append(bars[0].proto.value)
        assert at.button(key="researcher_train_submit").disabled
        at = ok(at.run())
    assert seen == [25, 75]
    at = run_until_idle(at, fake)
    assert said(at, "success", "trained and registered dynasent-r2-for-round-2@v1"), texts(at)
    assert not at.get("progress")
    assert "dynasent-r2-for-round-2@v1" in dataframe_values(at)

    at = ok(at.button(key="researcher_models_evaluate").click().run())
    assert fake.calls_of("start_job")[-1] == {"task": TASK, "kind": "evaluate", "params": {"model_id": 1}}
    at = run_until_idle(at, fake)
    assert said(at, "success", "evaluated dynasent-r2-for-round-2@v1")
    assert fake.research["models"][1]["status"] == "evaluated"

    at.text_input(key="researcher_promote_endpoint").input("http://127.0.0.1:8001")
    at.text_input(key="researcher_promote_token").input("s3cret-token")
    at = ok(at.button(key="researcher_promote_submit").click().run())
    params = fake.calls_of("start_job")[-1]["params"]
    assert params == {"model_id": 1, "endpoint": "http://127.0.0.1:8001", "force": False,
                      "admin_token": "s3cret-token"}
    at = run_until_idle(at, fake)
    assert said(at, "success", "promoted dynasent-r2-for-round-2@v1")
    assert "s3cret-token" not in json.dumps(fake.research["jobs"][3]["params"])
    jobs = next(frame.value for frame in at.dataframe if "kind" in frame.value.columns)
    assert jobs["kind"].tolist() == ["promote", "evaluate", "train"] and set(jobs["status"]) == {"succeeded"}


def test_models_page_shows_failed_jobs_and_refusals_escaped(fake) -> None:  # type: ignore[no-untyped-def]
    fake.add_round(TASK, ["p"], status="built")
    fake.research["next_job_failure"] = f"unexpected RuntimeError: {HOSTILE}"
    at = ok(page(fake, "researcher_models"))
    at = ok(at.button(key="researcher_train_submit").click().run())
    at = run_until_idle(at, fake)
    assert said(at, "error", f"train job 1: unexpected RuntimeError: {HOSTILE}"), texts(at)
    assert_no_raw_markup(at)
    assert any(HOSTILE in c.value for c in at.code)  # the failed job's log, as code
    # A train job still running elsewhere: the API's 409 is shown.
    fake.fail_next("start_job", ApiError(409, "conflict", "train job 7 of task 'dynasent-r2' is still running"))
    at = ok(at.button(key="researcher_train_submit").click().run())
    assert said(at, "error", "train job 7")
    assert not at.session_state["researcher_models_job"].get(TASK)
    # Promoting a model that was never evaluated: refused by the API, with its reason.
    fake.add_model(TASK, "m", "1", status="trained")
    at = ok(at.run())
    at.text_input(key="researcher_promote_endpoint").input("http://127.0.0.1:8001")
    at = ok(at.button(key="researcher_promote_submit").click().run())
    assert said(at, "error", "was never evaluated")
    fake.fail_next("models", ApiError(403, "forbidden", "this needs the researcher role; your roles: writer"))
    at = ok(at.run())
    assert said(at, "error", "needs the researcher role")


def test_models_page_downloads_the_dataset_and_the_report(fake) -> None:  # type: ignore[no-untyped-def]
    fake.add_round(TASK, ["p"], status="built")
    at = ok(page(fake, "researcher_models"))
    assert not at.get("download_button")
    at.selectbox(key="researcher_download_split").set_value("dev")
    at.selectbox(key="researcher_download_format").set_value("csv")
    at = ok(at.button(key="researcher_download_fetch").click().run())
    assert fake.calls_of("download_dataset")[-1] == {"task": TASK, "number": 1, "split": "dev", "format": "csv"}
    ready = at.session_state["researcher_models_download"]
    assert ready["name"] == f"{TASK}-r1-dev.csv" and ready["data"].startswith(b"id,text,split")
    assert len(at.get("download_button")) == 1
    at.radio(key="researcher_download_what").set_value("report")
    at = ok(at.button(key="researcher_download_fetch").click().run())
    assert fake.calls_of("report")[-1]["format"] == "markdown"
    assert at.session_state["researcher_models_download"]["name"] == f"{TASK}-r1-report.md"
    fake.fail_next("report", ApiError(409, "conflict", "round 1 has not been built"))
    at = ok(at.button(key="researcher_download_fetch").click().run())
    assert said(at, "error", "has not been built")
    assert not at.get("download_button")


# --- plots ---------------------------------------------------------------------------------------


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

    spec = plots.edit_distance_chart(data).to_dict()
    assert spec["encoding"]["x"]["bin"] == {"extent": [0, 1], "step": 0.05}
    assert len(spec["datasets"][spec["data"]["name"]]) == 16  # no-prompt examples have no distance
    spec = plots.worker_agreement_chart(data).to_dict()
    rows = spec["datasets"][spec["data"]["name"]]
    assert sorted(r["agreement_rate"] for r in rows) == [0.1, 0.85, 0.9]  # the unjudged one is left out
    assert {r["status"] for r in rows} == {"qualified", "unqualified"}
    assert plots.length_chart(data, "chars").to_dict()["encoding"]["x"]["field"] == "chars"
    layered = plots.confusion_chart(data).to_dict()
    assert [layer["mark"]["type"] for layer in layered["layer"]] == ["rect", "text"]
    assert plots.summary(data) == {"examples": 20, "validated": 16, "with_majority": 16, "model_accuracy": 0.25,
                                   "mean_edit_distance": pytest.approx(sum(0.05 * (i % 19) for i in range(20)
                                                                           if i % 5 != 4) / 16, abs=1e-3)}


def test_plots_without_data() -> None:
    empty = {"examples": [], "worker_agreement": []}
    for chart in (plots.edit_distance_chart(empty), plots.length_chart(empty), plots.worker_agreement_chart(empty),
                  plots.confusion_chart(empty)):
        assert chart is None
    assert plots.confusion_counts({}).empty
    assert plots.summary({})["model_accuracy"] is None


# --- the real client against the real API ------------------------------------------------------


def test_researcher_pages_against_the_real_api(app, built) -> None:  # type: ignore[no-untyped-def]
    """The pages with the real ApiClient, the API served over HTTP, a built round and a real
    `dynaloop job run` process: plot data, downloads, a train job followed to the end."""
    import time

    from frontend.client import ApiClient
    from tests.conftest import free_port
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


def test_rounds_page_selects_the_round_just_opened(fake) -> None:  # type: ignore[no-untyped-def]
    fake.add_round(TASK, ["p"], status="closed")
    at = ok(page(fake, "researcher_rounds"))
    assert at.selectbox(key="researcher_rounds_round").value == 1
    at = ok(at.button(key="researcher_open_submit").click().run())
    assert at.selectbox(key="researcher_rounds_round").value == 2
    assert at.text_area(key="researcher_prompts_text_2")  # the new round takes prompts
