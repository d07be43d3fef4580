"""Crowd platforms in the Streamlit app (AppTest, tests/frontend_live.py): the study progress and
the way to the completion on the Write and Validate pages, and the researcher's Crowd page
(frontend/app_pages/researcher_crowd.py). Tasks, rounds and users are the real API's; the study link
and ledger endpoints are answered by :class:`CrowdClient` as the shared contract of issue #13
describes them (tests/test_web_study.py does the same for the server-rendered routes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from frontend.client import ApiError
from frontend.researcher import money
from tests.frontend_live import HOSTILE, LiveApi, PageClient, html_of, signed_in_app, texts

PAGES = Path(__file__).resolve().parents[1] / "frontend" / "app_pages"
TASK = "dynasent-r2"
SOUP = "The soup was fine and the bread was fresh."


class CrowdClient(PageClient):
    """The real client for everything but the study and ledger endpoints, which it answers in
    memory (and records, in ``crowd_calls``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.study_sessions: list[dict[str, Any]] = []
        self.links: list[dict[str, Any]] = []
        self.report: dict[str, Any] = {"task": TASK, "currency": "GBP", "data": [], "count": 0}
        self.link_sessions: dict[int, list[dict[str, Any]]] = {}
        self.crowd_calls: list[tuple[str, Any]] = []
        self.payouts_made: list[dict[str, Any]] = []

    def my_study_sessions(self) -> list[Any]:
        self.crowd_calls.append(("my_study_sessions", None))
        return list(self.study_sessions)

    def study_links(self, task: str) -> list[Any]:
        return [link for link in self.links if link["task"] == task]

    def create_study_link(self, task: str, **fields: Any) -> Any:
        self.crowd_calls.append(("create_study_link", {"task": task, **fields}))
        link = _link(len(self.links) + 1, task=task, **fields)
        self.links.append(link)
        return link

    def close_study_link(self, link_id: int) -> Any:
        self.crowd_calls.append(("close_study_link", link_id))
        link = next(link for link in self.links if link["id"] == link_id)
        link.update(closed_at="2026-11-24T12:00:00", is_open=False)
        return link

    def study_link_sessions(self, link_id: int) -> list[Any]:
        return self.link_sessions.get(link_id, [])

    def crowd_report(self, task: str) -> Any:
        return self.report

    def compute_ledger(self, task: str, round_id: int | None = None) -> Any:
        self.crowd_calls.append(("compute_ledger", task))
        return {
            "task": task,
            "currency": "GBP",
            "rounds": [1],
            "entries_added": 3,
            "amount_added_minor": 450,
            "already_paid": 2,
            "added": [],
        }

    def create_payout_batch(self, task: str, link_id: int, note: str | None = None) -> Any:
        self.crowd_calls.append(("create_payout_batch", link_id))
        batch = {
            "id": len(self.payouts_made) + 1,
            "task": task,
            "link_id": link_id,
            "platform": "prolific",
            "currency": "GBP",
            "status": "created",
            "line_count": 1,
            "total_minor": 120,
            "filename": f"{task}-link{link_id}-batch{len(self.payouts_made) + 1}-prolific.csv",
            "created_at": "2026-11-25T10:00:00",
        }
        self.payouts_made.append(batch)
        elsewhere = [{"usernames": ["v*4"], "advice": "earned without a study session", "link_id": None}]
        return {"batch": batch, "held_back": [], "elsewhere": elsewhere}

    def payout_batches(self, task: str, link_id: int | None = None) -> list[Any]:
        return [b for b in self.payouts_made if b["task"] == task]

    def payout_batch_file(self, batch_id: int) -> bytes:
        self.crowd_calls.append(("payout_batch_file", batch_id))
        return b"5f1a2b3c4d5e6f7a8b9c0d1e,1.20\n"

    def mark_payout_batch_paid(self, batch_id: int) -> Any:
        self.crowd_calls.append(("mark_payout_batch_paid", batch_id))
        self.payouts_made[batch_id - 1]["status"] = "paid"
        return self.payouts_made[batch_id - 1]

    def cancel_payout_batch(self, batch_id: int) -> Any:
        self.crowd_calls.append(("cancel_payout_batch", batch_id))
        self.payouts_made[batch_id - 1]["status"] = "cancelled"
        return self.payouts_made[batch_id - 1]


def _link(link_id: int, **fields: Any) -> dict[str, Any]:
    link: dict[str, Any] = {
        "id": link_id,
        "slug": f"slug{link_id}Ab_-",
        "name": "Pilot",
        "task": TASK,
        "round_id": 1,
        "role": "writer",
        "platform": "prolific",
        "quota": 3,
        "max_workers": None,
        "id_parameter": None,
        "completion_code": "C0DE",
        "screened_out_code": None,
        "opens_at": None,
        "closes_at": None,
        "closed_at": None,
        "created_at": "2026-11-24T10:00:00",
        "is_open": True,
    }
    link.update(fields)
    link["path"] = f"/study/{link['slug']}"
    link["query_template"] = (
        "?PROLIFIC_PID={{%PROLIFIC_PID%}}&STUDY_ID={{%STUDY_ID%}}&SESSION_ID={{%SESSION_ID%}}"
        if link["platform"] == "prolific"
        else ""
    )
    return link


def _session(role: str, units_done: int, status: str = "active", quota: int = 3) -> dict[str, Any]:
    return {
        "id": 11,
        "link_id": 1,
        "task": TASK,
        "round_id": 1,
        "role": role,
        "platform": "prolific",
        "quota": quota,
        "units_done": units_done,
        "status": status,
        "started_at": "2026-11-24T10:00:00",
        "ended_at": None,
        "completion": None,
    }


def _crowd_client(live: LiveApi, username: str) -> CrowdClient:
    client = CrowdClient(live.url, live.tokens[username][1], timeout=30)
    live._page_clients.append(client)
    return client


@pytest.fixture
def dynasent(live: LiveApi) -> LiveApi:
    live.task(TASK, onboarding_quiz=None)
    live.round(TASK, [SOUP])
    return live


# --- the worker's pages ---------------------------------------------------------------------


def test_a_study_writer_sees_progress_and_the_way_to_finish(dynasent: LiveApi) -> None:
    dynasent.user("walt", "writer")
    client = _crowd_client(dynasent, "walt")
    client.study_sessions = [_session("writer", 2)]
    at = signed_in_app(dynasent, "walt", client=client)
    assert not at.exception, at.exception
    assert at.progress[0].text == "2 of 3 examples for this study"
    assert 'href="/study/finish"' in html_of(at) and "Finish and get your completion code" in html_of(at)
    assert not texts(at.success)
    assert at.session_state["writer_assignment"]["round_id"] == 1  # writing goes on below

    client.study_sessions = [_session("writer", 3, "completed")]
    at.run()
    assert at.progress[0].text == "3 of 3 examples for this study"
    assert any("reached this study's quota" in t for t in texts(at.success))


def test_a_screened_out_worker_is_shown_the_way_back_to_the_platform(dynasent: LiveApi) -> None:
    """A worker whose quiz failed for good is screened out: no progress, but the link to the
    study's (screened-out) completion, or they would be stranded on the page."""
    dynasent.user("walt", "writer")
    client = _crowd_client(dynasent, "walt")
    client.study_sessions = [_session("writer", 0, "screened_out")]
    at = signed_in_app(dynasent, "walt", client=client)
    assert not at.exception, at.exception
    assert not at.progress and any("This study has ended for you" in t for t in texts(at.warning))
    assert 'href="/study/finish"' in html_of(at)


def test_without_a_study_session_the_page_is_as_before(dynasent: LiveApi) -> None:
    dynasent.user("walt", "writer")
    client = _crowd_client(dynasent, "walt")
    client.study_sessions = [_session("validator", 1)]  # another role's session is not this page's
    at = signed_in_app(dynasent, "walt", client=client)
    assert not at.exception and not at.progress and "/study/finish" not in html_of(at)
    # An API that does not know study sessions (404) shows nothing either; another error says so.
    client.fail_next("my_study_sessions", ApiError(404, "not_found", "no route"))
    at.run()
    assert not at.exception and not at.warning
    client.fail_next("my_study_sessions", ApiError(503, "unavailable", "the database is busy"))
    at.run()
    assert any("the database is busy" in t for t in texts(at.warning))


def test_a_study_validator_sees_labels_towards_the_quota(dynasent: LiveApi) -> None:
    dynasent.user("vera", "validator")
    client = _crowd_client(dynasent, "vera")
    client.study_sessions = [_session("validator", 1, quota=2)]
    at = signed_in_app(dynasent, "vera", page="app_pages/validator.py", client=client)
    assert not at.exception, at.exception
    assert at.progress[0].text == "1 of 2 labels for this study"
    assert 'href="/study/finish"' in html_of(at)


# --- the researcher's Crowd page --------------------------------------------------------------


def crowd_page(client: PageClient, roles: tuple[str, ...] = ("researcher",)) -> AppTest:
    at = AppTest.from_file(str(PAGES / "researcher_crowd.py"), default_timeout=60)
    at.session_state["client"] = client
    at.session_state["token"] = client.token
    at.session_state["user"] = {"username": "rita", "roles": list(roles)}
    at.session_state["roles"] = list(roles)
    return at.run()


@pytest.fixture
def rita(live: LiveApi) -> CrowdClient:
    """A researcher who owns DynaSent's task (made before the task: task ownership)."""
    live.user("rita", "researcher")
    live.task(TASK, onboarding_quiz=None)
    live.round(TASK, [SOUP])
    return _crowd_client(live, "rita")


def test_money_is_formatted_from_minor_units() -> None:
    assert money(150, "GBP") == "GBP 1.50"
    assert money(-5, "USD") == "USD -0.05"
    assert money(123456789, "GBP") == "GBP 1,234,567.89"
    assert money(None, "GBP") == "–"


def test_the_crowd_page_needs_the_researcher_role(rita: CrowdClient) -> None:
    at = crowd_page(rita, roles=("writer",))
    assert not at.exception
    assert texts(at.error) == ["This page needs the researcher role; your roles: writer."]
    assert not at.code and not rita.crowd_calls


def test_links_their_addresses_report_and_close(rita: CrowdClient) -> None:
    rita.links = [_link(1, name=HOSTILE), _link(2, name="Validators", role="validator", platform="generic")]
    rita.report = {  # GET /tasks/{task}/crowd-report
        "task": TASK,
        "currency": "GBP",
        "data": [
            {
                "link_id": 1,
                "name": HOSTILE,
                "round_id": 1,
                "role": "writer",
                "platform": "prolific",
                "sessions": {
                    "started": 10,
                    "active": 0,
                    "completed": 6,
                    "screened_out": 1,
                    "stopped": 1,
                    "abandoned": 2,
                },
                "median_minutes": 12.5,
                "base_pay": 900,
                "bonuses": 130,
                "corrections": -20,
                "effective_hourly_minor": 1090,
            }
        ],
        "count": 1,
    }
    rita.link_sessions = {1: [{"id": 5, "username": "prolific-0a1b2c3d4e5f", "status": "completed", "units_done": 3}]}
    at = crowd_page(rita)
    assert not at.exception, at.exception
    codes = [c.value for c in at.code]
    # AppTest has no browser address (st.context.url): the links start with the path until it is given.
    assert codes == [
        "/study/slug1Ab_-?PROLIFIC_PID={{%PROLIFIC_PID%}}&STUDY_ID={{%STUDY_ID%}}&SESSION_ID={{%SESSION_ID%}}",
        "/study/slug2Ab_-",
    ]
    assert any("public address" in t for t in texts(at.warning))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Started"] == "10" and metrics["Abandoned"] == "2" and metrics["Screened out"] == "1"
    assert metrics["Median minutes"] == "12.5" and metrics["Base pay"] == "GBP 9.00"
    assert metrics["Bonuses"] == "GBP 1.30" and metrics["Effective hourly pay"] == "GBP 10.90/h"
    assert any("Corrections in the ledger: GBP -0.20" in c.value for c in at.caption)
    # The hostile name is shown literally (escaped Markdown), never as markup.
    assert all("<script>" not in m.value for m in at.markdown)
    assert at.dataframe[0].value["username"].tolist() == ["prolific-0a1b2c3d4e5f"]

    at.text_input(key="researcher_crowd_base_url").set_value("https://dl.example.org").run()
    assert "https://dl.example.org/study/slug2Ab_-" in [c.value for c in at.code]
    assert not any("public address" in t for t in texts(at.warning))

    at.button(key="researcher_crowd_close_2").click().run()
    assert ("close_study_link", 2) in rita.crowd_calls
    assert "researcher_crowd_close_2" not in [b.key for b in at.button]


def test_creating_a_link_sends_the_form_and_a_generic_link_needs_its_id_parameter(rita: CrowdClient) -> None:
    at = crowd_page(rita)
    at.text_input(key="researcher_crowd_name").set_value("Generic pilot")
    at.selectbox(key="researcher_crowd_platform").set_value("generic")
    at.number_input(key="researcher_crowd_quota").set_value(4)
    at.button(key="researcher_crowd_create").click().run()
    assert any("id" in t and "parameter" in t for t in texts(at.warning))
    assert not [c for c in rita.crowd_calls if c[0] == "create_study_link"]

    at.text_input(key="researcher_crowd_id_param").set_value("worker_id")
    at.number_input(key="researcher_crowd_max").set_value(20)
    at.button(key="researcher_crowd_create").click().run()
    assert not at.exception, at.exception
    created = [c[1] for c in rita.crowd_calls if c[0] == "create_study_link"]
    round_id = rita.rounds(TASK)[0]["id"]
    assert created == [
        {
            "task": TASK,
            "name": "Generic pilot",
            "round_id": round_id,
            "role": "writer",
            "platform": "generic",
            "quota": 4,
            "max_workers": 20,
            "id_parameter": "worker_id",
            "opens_at": None,
            "closes_at": None,
            "completion_code": None,
            "screened_out_code": None,
            "partial_code": None,
            "partial_pay_minor": None,
            "other_role_allowed": False,
            "when_out_of_work": "complete",
        }
    ]
    assert any("Generic pilot" in t for t in texts(at.success))


def test_a_paid_link_needs_its_most_workers_and_sends_its_partial_code(rita: CrowdClient) -> None:
    at = crowd_page(rita)
    at.text_input(key="researcher_crowd_name").set_value("Prolific pilot")
    at.button(key="researcher_crowd_create").click().run()
    assert any("set the most workers" in t for t in texts(at.warning))
    assert not [c for c in rita.crowd_calls if c[0] == "create_study_link"]
    at.number_input(key="researcher_crowd_max").set_value(30)
    at.text_input(key="researcher_crowd_partial_code").set_value("PART1")
    at.number_input(key="researcher_crowd_partial_pay").set_value(50)
    at.selectbox(key="researcher_crowd_role").set_value("validator")
    at.selectbox(key="researcher_crowd_out_of_work").set_value("partial")
    at.checkbox(key="researcher_crowd_other_role").check()
    at.button(key="researcher_crowd_create").click().run()
    assert not at.exception, at.exception
    (created,) = [c[1] for c in rita.crowd_calls if c[0] == "create_study_link"]
    assert {k: created[k] for k in ("platform", "role", "max_workers", "partial_code", "partial_pay_minor")} == {
        "platform": "prolific",
        "role": "validator",
        "max_workers": 30,
        "partial_code": "PART1",
        "partial_pay_minor": 50,
    }
    assert created["other_role_allowed"] is True and created["when_out_of_work"] == "partial"


def test_an_api_refusal_of_a_link_is_shown(rita: CrowdClient) -> None:
    at = crowd_page(rita)
    rita.fail_next("create_study_link", ApiError(422, "invalid", "quota must be at most 100"))
    at.text_input(key="researcher_crowd_name").set_value("Too big")
    at.number_input(key="researcher_crowd_max").set_value(10)
    at.button(key="researcher_crowd_create").click().run()
    assert any("quota must be at most 100" in t for t in texts(at.error))


def test_compute_the_ledger_and_pay_a_link_with_a_payout_batch(rita: CrowdClient) -> None:
    rita.links.append(_link(1, name="R1 writers"))
    rita.links.append(_link(2, name="Local", platform="generic"))
    at = crowd_page(rita)
    at.button(key="researcher_crowd_compute").click().run()
    assert ("compute_ledger", TASK) in rita.crowd_calls
    assert "Ledger computed: 3 new row(s), GBP 4.50; 2 event(s) paid already." in texts(at.success)
    # A batch button for the Prolific link only: a generic link has no bonus file.
    assert [b.key for b in at.button if (b.key or "").startswith("researcher_crowd_batch_create_")] == [
        "researcher_crowd_batch_create_1"
    ]
    at.button(key="researcher_crowd_batch_create_1").click().run()
    assert not at.exception, at.exception
    assert ("create_payout_batch", 1) in rita.crowd_calls
    (message,) = [t for t in texts(at.success) if t.startswith("Payout batch 1")]
    assert "1 line(s)" in message and "earned without a study session" in message
    at.button(key="researcher_crowd_batch_file_1").click().run()
    assert ("payout_batch_file", 1) in rita.crowd_calls
    labels = [getattr(b, "label", "") for b in at.get("download_button")]
    assert any(label.startswith("Download (") for label in labels), labels
    at.button(key="researcher_crowd_batch_paid_1").click().run()
    assert ("mark_payout_batch_paid", 1) in rita.crowd_calls
    assert not [b for b in at.button if b.key == "researcher_crowd_batch_cancel_1"]


def test_the_crowd_page_against_the_real_study_and_ledger_api(live: LiveApi) -> None:
    """The page with the real client end to end: a link made through the page's API, a worker who
    opened it, the report, the ledger computed and the bonus files fetched, no error anywhere."""
    live.user("rita", "researcher")
    live.task(TASK, onboarding_quiz=None, pay={"currency": "GBP", "base_pay": {"writer": 150, "validator": 100}})
    round_ = live.round(TASK, [SOUP])
    rita = PageClient(live.url, live.tokens["rita"][1], timeout=30)
    live._page_clients.append(rita)
    link = rita.create_study_link(
        TASK, name="R1 writers", round_id=round_["id"], role="writer", platform="prolific", quota=2, max_workers=20
    )
    opened = rita.start_study_session(
        link["slug"],
        {
            "PROLIFIC_PID": "5f1a2b3c4d5e6f7a8b9c0d1e",
            "STUDY_ID": "60aa11bb22cc33dd44ee55ff",
            "SESSION_ID": "6123456789abcdef01234567",
        },
    )
    assert opened["preview"] is False
    at = crowd_page(rita)
    assert not at.exception and not at.error, texts(at.error)
    assert any(code.value.startswith(f"/study/{link['slug']}?PROLIFIC_PID=") for code in at.code)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Started"] == "1" and metrics["Base pay"] == "GBP 0.00", metrics
    at.button(key="researcher_crowd_compute").click().run()
    assert not at.exception and not at.error, texts(at.error)
    assert any(text.startswith("Ledger computed: 0 new row(s)") for text in texts(at.success)), texts(at.success)
    # Nothing to pay yet (no bonus rows): the API's 409 is shown, and no batch is listed.
    at.button(key=f"researcher_crowd_batch_create_{link['id']}").click().run()
    assert not at.exception, at.exception
    assert any("nothing to pay" in t for t in texts(at.error)), texts(at.error)
    assert "No payout batch yet." in [c.value for c in at.caption]


def test_the_crowd_page_shows_gold_accuracy_beside_agreement(live: LiveApi) -> None:
    """A round whose batches hold control items: each validator's gold accuracy is on the Crowd
    page beside their agreement with the majority, as the API computed it."""
    controls = [
        {"text": "The food was absolutely delicious and the staff were wonderful.", "labels": ["positive"]},
        {"text": "The waiter was rude to us and my soup arrived cold.", "labels": ["negative"]},
    ]
    live.user("rita", "researcher")
    quality = {"control_rate": 0.5, "min_control_answers": 50, "control_items": controls}
    live.task(TASK, onboarding_quiz=None, quality=quality)
    round_ = live.round(TASK, [SOUP, "The bread was fresh and the tea was hot."])
    for text in ("The soup was cold and the bread was stale.", "A plain remark about the lunch menu today."):
        live.example(round_, text)
    live.user("vic", "validator")
    batch = live.api("vic").validation_batch(round_["id"])
    assert batch["count"] == 4  # two examples, two control items, alike
    for item in batch["data"]:
        live.api("vic").validate(item["item_id"], "positive")
    expected = live.admin.worker_agreement(round_["id"])
    vic = next(row for row in expected if row["username"] == "vic")
    assert vic["control_answers"] == 2 and vic["gold_accuracy"] == 0.5
    rita = PageClient(live.url, live.tokens["rita"][1], timeout=30)
    live._page_clients.append(rita)
    at = crowd_page(rita)
    assert not at.exception and not at.error, texts(at.error)
    assert "Validators: gold accuracy and agreement" in [s.value for s in at.subheader]
    table = at.dataframe[0].value
    row = table[table["validator"] == "vic"].iloc[0].to_dict()
    assert row == {
        "validator": "vic",
        "labels": 2,
        "agreement with the majority": "–",  # no example has a majority yet
        "control answers": 2,
        "gold accuracy": "50%",
        "qualified": "yes",
    }


def test_the_crowd_page_shows_each_writers_attention_checks(live: LiveApi) -> None:
    """A task with attention checks: each writer's checks served, passed and failed are on the
    Crowd page, as the API counted them."""
    checks = {
        "every_n_assignments": 1,
        "fails_to_screen_out": 2,
        "items": [
            {"question": "For this question, choose 'Orange'.", "options": ["Red", "Orange"], "answer": "Orange"}
        ],
    }
    live.user("rita", "researcher")
    live.task(TASK, onboarding_quiz=None, attention_checks=checks)
    round_ = live.round(TASK, [SOUP, "The bread was fresh and the tea was hot."])
    live.user("walt", "writer")
    walt = live.api("walt")
    walt.skip(walt.start_assignment(round_["id"])["id"])
    with pytest.raises(ApiError) as refused:
        walt.start_assignment(round_["id"])
    assert refused.value.code == "attention_check_pending"
    (check,) = walt.pending_attention_checks()
    assert walt.answer_attention_check(check["id"], "Red")["qualified"] is True
    rita = PageClient(live.url, live.tokens["rita"][1], timeout=30)
    live._page_clients.append(rita)
    at = crowd_page(rita)
    assert not at.exception and not at.error, texts(at.error)
    assert "Writers: attention checks" in [s.value for s in at.subheader]
    table = at.dataframe[-1].value
    row = table[table["writer"] == "walt"].iloc[0].to_dict()
    assert row == {"writer": "walt", "served": 1, "answered": 1, "passed": 0, "failed": 1, "qualified": "yes"}


def test_the_crowd_page_warns_without_a_pay_policy_and_sets_one(rita: CrowdClient, live: LiveApi) -> None:
    """A task without a pay policy: the page says so plainly (not 0.00 without a word); the form
    sets version 1 through the real API, and the page then shows it in force."""
    at = crowd_page(rita)
    assert not at.exception, at.exception
    assert any("no pay policy" in text for text in texts(at.warning))
    at.text_input(key="researcher_crowd_pay_currency").set_value("GBP")
    at.number_input(key="researcher_crowd_pay_writer").set_value(180)
    at.number_input(key="researcher_crowd_pay_validator").set_value(110)
    at.number_input(key="researcher_crowd_pay_bonus").set_value(10)
    at.number_input(key="researcher_crowd_pay_floor").set_value(900)
    at.text_input(key="researcher_crowd_pay_note").set_value("pilot: 12 minutes a session")
    at.button(key="researcher_crowd_pay_save").click().run()
    assert not at.exception and not at.error, texts(at.error)
    answer = live.admin.pay_policy(TASK)
    assert answer["current"]["version"] == 1
    assert answer["current"]["policy"] == {
        "currency": "GBP",
        "base_pay": {"writer": 180, "validator": 110},
        "writer_bonus_per_example": 10,
        "validator_bonus": None,
        "min_hourly_minor": 900,
    }
    assert answer["current"]["note"] == "pilot: 12 minutes a session"
    assert not any("no pay policy" in text for text in texts(at.warning))
    shown = [m.value.replace("\\", "") for m in at.markdown]  # escape_markdown's backslashes
    assert any("Version 1" in m and "writers GBP 1.80" in m and "hourly floor GBP 9.00/h" in m for m in shown), shown


def test_the_crowd_page_shows_each_workers_hourly_pay_and_warns_below_the_minimum(rita: CrowdClient) -> None:
    """The crowd report's `workers` (tests/test_pay_policies.py checks how the API computes them)
    as a table, with a warning naming how many are below the minimum."""
    rita.links = [_link(1)]

    def worker(name: str, hourly: int, below: bool) -> dict[str, Any]:
        return {
            "user_id": len(name),
            "username": name,
            "platforms": ["prolific"],
            "sessions": 1,
            "active_seconds": 1200,
            "earned_minor": hourly // 3,
            "effective_hourly_minor": hourly,
            "platform_minimum_minor": 600,
            "policy_floor_minor": None,
            "below_minimum": below,
            "warning": "GBP 4.50/h is below the platform's published minimum of 6.00/h" if below else None,
        }

    rita.report = {
        "task": TASK,
        "currency": "GBP",
        "data": [],
        "count": 0,
        "workers": [worker("wanda", 450, True), worker("wes", 900, False)],
    }
    at = crowd_page(rita)
    assert not at.exception and not at.error, texts(at.error)
    assert any("1 worker(s) earn less per hour" in text for text in texts(at.warning))
    table = at.table[-1].value
    rows = {row["worker"]: row for row in table.to_dict("records")}
    assert rows["wanda"]["per hour"] == "GBP 4.50" and rows["wanda"]["minimum"] == "GBP 6.00"
    assert "below the platform's published minimum" in rows["wanda"]["warning"]
    assert rows["wes"]["per hour"] == "GBP 9.00" and rows["wes"]["warning"] == ""
