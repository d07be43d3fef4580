"""The front end's API client against the real API over HTTP, its error mapping, and the
Streamlit app's login and role-based navigation (against the real API, tests/frontend_live.py)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from streamlit.testing.v1 import AppTest

from frontend import sessions, state
from frontend.client import ApiClient, ApiError, api_root, idempotency_key
from services.db.engine import session_scope
from services.domain import users
from tests.conftest import Actor, MakeUser, example_yaml, free_port, register_model_server
from tests.frontend_live import (
    APP_FILE,
    LiveApi,
    html_of,
    signed_in_app,
    texts,
)
from tests.stub_model_server import ThreadedServer

PROMPTS = ["The soup was fine and the bread was fresh.", "We went there on a Sunday afternoon."]


@pytest.fixture
def api_url(app: Any) -> Iterator[str]:
    """The real API app served over HTTP on a free port, as `dynaloop ui` talks to it."""
    server = ThreadedServer(app, free_port()).start()
    yield server.url
    server.stop()


def _user_with_password(app: Any, username: str, password: str, *roles: str) -> None:
    with session_scope(app.state.sessionmaker) as session:
        users.create_user(session, None, username, list(roles), password=password)


def test_api_root_accepts_both_forms() -> None:
    assert api_root("http://h:8000") == "http://h:8000/api/v1"
    assert api_root("http://h:8000/api/v1/") == "http://h:8000/api/v1"


def test_writer_and_validator_flow_through_the_real_api(
    app: FastAPI, api_url: str, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    research = ApiClient(api_url, researcher.token)
    task = research.create_task(example_yaml("dynasent-r2", onboarding_quiz=None))
    assert task["name"] == "dynasent-r2" and task["family"] == "single_label"
    round_ = research.open_round(
        "dynasent-r2", model_servers=[register_model_server(app, stub_model.url, tasks=["dynasent-r2"])]
    )
    lines = "\n".join(json.dumps({"id": f"p{i}", "text": p, "stars": 3}) for i, p in enumerate(PROMPTS))
    report = research.import_prompts(round_["id"], lines.encode("utf-8"), "prompts.jsonl")
    assert report["imported"] == 2
    csv_report = research.import_prompts(round_["id"], b"id,text\nc1,A third prompt about the cold soup.\n", "more.csv")
    assert csv_report["imported"] == 1

    _user_with_password(app, "wanda", "wanda-secret-1", "writer")
    writer = ApiClient(api_url)
    login = writer.login("wanda", "wanda-secret-1")
    assert writer.token == login["token"] and login["user"]["roles"] == ["writer"]
    assert writer.me()["username"] == "wanda"
    assert [r["id"] for r in writer.open_rounds()] == [round_["id"]]
    assert writer.rounds("dynasent-r2")[0]["status"] == "collecting"
    assert writer.quiz("dynasent-r2")["required"] is False

    assignment = writer.start_assignment(round_["id"])
    assert writer.start_assignment(round_["id"])["id"] == assignment["id"]  # resumed, not a new one
    target = assignment["target_label"][0]
    word = {"positive": "terrible", "negative": "great", "neutral": "great"}[target]
    text = f"Honestly a {word} place to spend a Sunday afternoon."
    attempt = writer.attempt(assignment["id"], text)
    assert attempt["fooled"] is True
    # The same click again (a retry): the derived Idempotency-Key returns the same attempt, no new try.
    assert writer.attempt(assignment["id"], text)["id"] == attempt["id"]
    assert writer.assignment(assignment["id"])["tries_used"] == 1
    assert writer.confirm(attempt["id"], True)["confirmed"] is True
    assert writer.confirm(attempt["id"], True)["confirmed"] is True  # idempotent by nature
    example = writer.submit_example(assignment["id"], attempt["id"])
    assert example["text"] == text and example["fooled"]
    assert writer.submit_example(assignment["id"], attempt["id"])["id"] == example["id"]

    second = writer.start_assignment(round_["id"])
    assert second["id"] != assignment["id"]
    assert writer.skip(second["id"])["status"] == "skipped"

    validator = ApiClient(api_url, make_user("vera", "validator").token)
    batch = validator.validation_batch(round_["id"])
    assert batch["validation_labels"] == ["positive", "negative", "neutral", "mixed"]
    assert [item["text"] for item in batch["data"]] == [example["text"]]
    item_id = batch["data"][0]["item_id"]
    # Asked again while it is live, the batch is the same one; size shows its first items.
    assert validator.validation_batch(round_["id"], size=1)["data"][0]["item_id"] == item_id
    label = validator.validate(item_id, target, flagged=True, flag_reason="reads like an advert", seconds_taken=4.2)
    assert label["label"] == [target] and label["flagged"] is True and label["item_id"] == item_id
    again = validator.validate(item_id, target, flagged=True, flag_reason="reads like an advert")
    assert again == label
    other = "mixed"
    with pytest.raises(ApiError) as conflict:
        validator.validate(item_id, other)
    assert conflict.value.status == 409 and "cannot be changed" in conflict.value.message

    stats = research.round_stats(round_["id"])
    assert stats["examples"]["submitted"] == 1 and stats["validations"]["given"] == 1
    assert research.worker_agreement(round_["id"])[0]["username"] == "vera"
    record = research.example(example["id"])
    assert record["validations"][0]["flag_reason"] == "reads like an advert"
    assert research.set_round_status(round_["id"], "validating")["status"] == "validating"


def test_error_mapping_401_404_409_and_503_with_retry_after(
    app: FastAPI, api_url: str, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    with pytest.raises(ApiError) as unknown:
        ApiClient(api_url, "dl_not-a-token").me()
    assert (unknown.value.status, unknown.value.code) == (401, "unauthorized")
    assert "unknown or revoked" in unknown.value.message
    with pytest.raises(ApiError) as wrong_password:
        ApiClient(api_url).login("nobody", "whatever-1")
    assert wrong_password.value.status == 401 and wrong_password.value.message == "wrong username or password"

    research = ApiClient(api_url, researcher.token)
    with pytest.raises(ApiError) as missing:
        research.task("no-such-task")
    assert (missing.value.status, missing.value.code) == (404, "not_found")

    research.create_task(example_yaml("dynasent-r2", onboarding_quiz=None))
    round_ = research.open_round(
        "dynasent-r2", model_servers=[register_model_server(app, stub_model.url, tasks=["dynasent-r2"])]
    )
    research.import_prompts(round_["id"], "\n".join(json.dumps({"text": p}) for p in PROMPTS).encode(), "p.jsonl")
    with pytest.raises(ApiError) as conflict:
        research.open_round("dynasent-r2")
    assert (conflict.value.status, conflict.value.code) == (409, "conflict")
    assert "still collecting" in conflict.value.message

    writer = ApiClient(api_url, make_user("walt", "writer").token)
    assignment = writer.start_assignment(round_["id"])
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "fail"})
    with pytest.raises(ApiError) as unavailable:
        writer.attempt(assignment["id"], "A perfectly ordinary sentence about lunch.")
    error = unavailable.value
    assert (error.status, error.code, error.retry_after) == (503, "model_unavailable", 3.0)
    assert "no try was used" in error.message and error.details["attempt_id"]
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "normal"})
    # Retrying the same text sends the same key: the saved attempt is scored, not a new one.
    attempt = writer.attempt(assignment["id"], "A perfectly ordinary sentence about lunch.")
    assert attempt["id"] == error.details["attempt_id"] and attempt["status"] == "scored"
    assert writer.assignment(assignment["id"])["tries_used"] == 1

    with pytest.raises(ApiError) as invalid:
        writer.attempt(assignment["id"], "x")
    assert invalid.value.status == 422 and "at least" in invalid.value.message


def test_unreachable_api_and_non_json_errors() -> None:
    with pytest.raises(ApiError) as unreachable:
        ApiClient(f"http://127.0.0.1:{free_port()}", timeout=2).me()
    assert unreachable.value.status == 0 and unreachable.value.code == "unreachable"

    def proxy_error(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": "7"}, text="<html>Service Unavailable</html>")

    with pytest.raises(ApiError) as busy:
        ApiClient("http://api", transport=httpx.MockTransport(proxy_error)).tasks()
    assert (busy.value.status, busy.value.retry_after) == (503, 7.0)
    assert "HTTP 503" in busy.value.message


class Recording(httpx.HTTPTransport):
    """Real HTTP, keeping each request the client sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return super().handle_request(request)


def test_every_request_has_an_id_and_a_service_error_shows_it_as_its_reference(
    app: FastAPI,
    api_url: str,
    researcher: Actor,
    make_user: MakeUser,
    stub_model: ThreadedServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The web app sends an id with every request; the API keeps it (and logs its lines and the
    model call under it, tests/test_metrics.py). An error on the service's side (a 5xx, no
    answer) carries it as the reference a worker can quote, and the web app logs it; a user's own
    mistake (4xx) has no reference and no line in the web app's log."""
    caplog.set_level(logging.WARNING, logger="frontend.client")
    research = ApiClient(api_url, researcher.token)
    research.create_task(example_yaml("dynasent-r2", onboarding_quiz=None))
    round_ = research.open_round(
        "dynasent-r2", model_servers=[register_model_server(app, stub_model.url, tasks=["dynasent-r2"])]
    )
    research.import_prompts(round_["id"], "\n".join(json.dumps({"text": p}) for p in PROMPTS).encode(), "p.jsonl")
    recording = Recording()
    writer = ApiClient(api_url, make_user("walt", "writer").token, transport=recording)
    assignment = writer.start_assignment(round_["id"])
    ids = [request.headers["X-Request-ID"] for request in recording.sent]
    assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]{32}", ids[0])

    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "fail"})
    with pytest.raises(ApiError) as unavailable:
        writer.attempt(assignment["id"], "A perfectly ordinary sentence about lunch.")
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "normal"})
    error, sent = unavailable.value, recording.sent[-1].headers["X-Request-ID"]
    assert (error.status, error.code) == (503, "model_unavailable")
    assert error.request_id == sent != ids[0] and error.reference == sent
    assert error.shown == f"{error.message} (reference {sent})"
    logged = [r.getMessage() for r in caplog.records if r.name == "frontend.client"]
    assert len(logged) == 1 and sent in logged[0] and "503 model_unavailable" in logged[0]
    assert "/attempts" in logged[0] and str(writer.token) not in logged[0] and "lunch" not in logged[0]

    with pytest.raises(ApiError) as missing:
        writer.assignment(2**31 - 1)
    assert missing.value.status == 404 and missing.value.request_id == recording.sent[-1].headers["X-Request-ID"]
    assert missing.value.reference is None and missing.value.shown == missing.value.message
    assert len([r for r in caplog.records if r.name == "frontend.client"]) == 1  # nothing for a 404

    with pytest.raises(ApiError) as unreachable:
        ApiClient(f"http://127.0.0.1:{free_port()}", timeout=2).me()
    assert unreachable.value.status == 0 and re.fullmatch(r"[0-9a-f]{32}", unreachable.value.reference or "")
    assert str(unreachable.value.reference) in caplog.records[-1].getMessage()


@pytest.mark.parametrize(
    "answered_id",
    [None, "x" * 65, "two\tparts"],
    ids=["no id (a proxy's answer)", "too long", "not printable"],
)
def test_an_answer_without_a_usable_id_keeps_the_id_the_request_was_sent_with(answered_id: str | None) -> None:
    def proxy(request: httpx.Request) -> httpx.Response:
        headers = {} if answered_id is None else {"X-Request-ID": answered_id}
        return httpx.Response(502, headers=headers, text="<html>Bad Gateway</html>")

    with pytest.raises(ApiError) as bad_gateway:
        ApiClient("http://api", transport=httpx.MockTransport(proxy)).tasks()
    sent = bad_gateway.value.request_id
    assert sent is not None and re.fullmatch(r"[0-9a-f]{32}", sent)
    assert bad_gateway.value.reference == sent and bad_gateway.value.shown.endswith(f"(reference {sent})")


def test_every_write_carries_an_idempotency_key_and_researcher_calls_hit_their_paths() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/report") and request.url.params.get("format") == "markdown":
            return httpx.Response(200, text="# Round 1\n")
        if request.url.path.endswith("/dataset"):
            return httpx.Response(200, content=b'{"text": "a"}\n')
        if request.url.path.endswith("/worker-agreement") or request.url.path.endswith("/apply"):
            return httpx.Response(200, json=[])
        if request.url.path.endswith("/model-servers"):
            return httpx.Response(200, json={"data": [], "count": 0})
        return httpx.Response(200, json={"ok": True, "token": "dl_x"})

    client = ApiClient("http://api", "dl_token", transport=httpx.MockTransport(answer))
    client.attempt(1, "Some text here.", target_span=[0, 4])
    client.confirm(2, False, "positive")
    client.submit_example(1, 2, {"intended_label": "sarcastic"})
    client.validate("item3", ["anger", "joy"])
    keyed = {r.url.path: r.headers.get("Idempotency-Key") for r in seen}
    assert keyed["/api/v1/assignments/1/attempts"] == idempotency_key("attempt", 1, "Some text here.", [0, 4])
    assert all(
        keyed[path]
        for path in [
            "/api/v1/attempts/2/confirmation",
            "/api/v1/assignments/1/example",
            "/api/v1/validation-items/item3/validations",
        ]
    )
    assert json.loads(seen[0].content) == {"text": "Some text here.", "target_span": [0, 4]}
    assert seen[0].headers["Authorization"] == "Bearer dl_token"
    # A different text gets a different key; an explicit key wins.
    assert idempotency_key("attempt", 1, "Other text.", None) != keyed["/api/v1/assignments/1/attempts"]
    client.attempt(1, "Some text here.", idempotency_key="mine")
    assert seen[-1].headers["Idempotency-Key"] == "mine"

    seen.clear()
    client.build_round(5, seed=3)
    assert client.report("dynasent-r2", 1, format="markdown") == "# Round 1\n"
    assert client.download_dataset("dynasent-r2", 1, split="dev", format="csv") == b'{"text": "a"}\n'
    client.import_prompts(5, b"id,text\n1,x\n", "p.csv")
    client.set_model(5, ["model-0"])
    client.open_round("dynasent-r2", model_servers=["model-0"])
    client.worker_agreement(5)
    client.model_servers()
    calls = [(r.method, r.url.path, dict(r.url.params)) for r in seen]
    assert calls[0][:2] == ("POST", "/api/v1/rounds/5/build")
    assert calls[1] == ("GET", "/api/v1/tasks/dynasent-r2/rounds/1/report", {"format": "markdown"})
    assert calls[2] == ("GET", "/api/v1/tasks/dynasent-r2/rounds/1/dataset", {"split": "dev", "format": "csv"})
    assert calls[3] == ("POST", "/api/v1/rounds/5/prompts", {"format": "csv"})
    assert seen[3].headers["Content-Type"] == "text/csv"
    assert calls[4][:2] == ("PUT", "/api/v1/rounds/5/model")
    assert json.loads(seen[4].content) == {"model_servers": ["model-0"]}
    assert json.loads(seen[5].content) == {"model_servers": ["model-0"]}
    assert calls[7] == ("GET", "/api/v1/model-servers", {})


def test_study_link_and_ledger_calls_hit_the_contracts_paths() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if path.endswith("/file"):
            return httpx.Response(200, content=b"5a0c0ffee0000000000000a1,1.20\n")
        if request.method == "GET" and path.endswith("/payout-batches"):
            return httpx.Response(200, json={"data": [{"id": 7}], "count": 1})
        if request.method == "GET" and path.endswith(("/study-links", "/sessions")):
            return httpx.Response(200, json={"data": [{"id": 1}], "count": 1})
        if path.endswith("/me/study-sessions"):
            return httpx.Response(200, json={"data": [{"id": 11, "units_done": 2}], "count": 1})
        if path.endswith("/finish"):
            return httpx.Response(200, json={"status": "completed", "code": "C", "redirect_url": None, "form": None})
        if path == "/api/v1/study/bad/sessions":
            return httpx.Response(409, json={"error": {"code": "study_link_full", "message": "full", "details": {}}})
        return httpx.Response(200, json={"ok": True})

    public = ApiClient("http://api", transport=httpx.MockTransport(answer))
    assert public.start_study_session("Ab_9-x", {"PROLIFIC_PID": "p1", "STUDY_ID": "s"}) == {"ok": True}
    assert "Authorization" not in seen[-1].headers  # the link is public: no token
    assert json.loads(seen[-1].content) == {"params": {"PROLIFIC_PID": "p1", "STUDY_ID": "s"}}
    with pytest.raises(ApiError) as full:
        public.start_study_session("bad", {})
    assert (full.value.status, full.value.code, full.value.message) == (409, "study_link_full", "full")
    # A slug with a slash or a dot cannot reach another path.
    public.start_study_session("../../tasks", {})
    assert seen[-1].url.raw_path == b"/api/v1/study/..%2F..%2Ftasks/sessions"

    seen.clear()
    client = ApiClient("http://api", "dl_token", transport=httpx.MockTransport(answer))
    assert client.my_study_sessions() == [{"id": 11, "units_done": 2}]
    assert client.finish_study_session(11, "quota")["code"] == "C"
    assert client.study_links("dynasent-r2") == [{"id": 1}]
    client.create_study_link(
        "dynasent-r2", name="Pilot", round_id=3, role="writer", platform="generic", quota=5, id_parameter="worker"
    )
    client.close_study_link(4)
    assert client.study_link_sessions(4) == [{"id": 1}]
    client.crowd_report("dynasent-r2")
    client.ledger("dynasent-r2")
    client.compute_ledger("dynasent-r2")
    client.compute_ledger("dynasent-r2", round_id=3)
    client.create_payout_batch("dynasent-r2", 4)
    assert client.payout_batches("dynasent-r2", link_id=4) == [{"id": 7}]
    assert client.payout_batch_file(7) == b"5a0c0ffee0000000000000a1,1.20\n"
    client.mark_payout_batch_paid(7)
    client.cancel_payout_batch(7)
    client.reconcile_payout_batch(7, b"participant_id,amount\n")
    calls = [(r.method, r.url.path, dict(r.url.params)) for r in seen]
    assert calls == [
        ("GET", "/api/v1/me/study-sessions", {}),
        ("POST", "/api/v1/study-sessions/11/finish", {}),
        ("GET", "/api/v1/tasks/dynasent-r2/study-links", {}),
        ("POST", "/api/v1/tasks/dynasent-r2/study-links", {}),
        ("POST", "/api/v1/study-links/4/close", {}),
        ("GET", "/api/v1/study-links/4/sessions", {}),
        ("GET", "/api/v1/tasks/dynasent-r2/crowd-report", {}),
        ("GET", "/api/v1/tasks/dynasent-r2/ledger", {}),
        ("POST", "/api/v1/tasks/dynasent-r2/ledger/compute", {}),
        ("POST", "/api/v1/tasks/dynasent-r2/ledger/compute", {}),
        ("POST", "/api/v1/tasks/dynasent-r2/payout-batches", {}),
        ("GET", "/api/v1/tasks/dynasent-r2/payout-batches", {"link_id": "4"}),
        ("GET", "/api/v1/payout-batches/7/file", {}),
        ("POST", "/api/v1/payout-batches/7/paid", {}),
        ("POST", "/api/v1/payout-batches/7/cancel", {}),
        ("POST", "/api/v1/payout-batches/7/reconciliation", {}),
    ]
    assert json.loads(seen[10].content) == {"link_id": 4}
    assert seen[-1].content == b"participant_id,amount\n"
    assert all(r.headers["Authorization"] == "Bearer dl_token" for r in seen)
    assert json.loads(seen[1].content) == {"reason": "quota"}
    assert json.loads(seen[3].content) == {
        "name": "Pilot",
        "round_id": 3,
        "role": "writer",
        "platform": "generic",
        "quota": 5,
        "max_workers": None,
        "id_parameter": "worker",
        "opens_at": None,
        "closes_at": None,
        "completion_code": None,
        "screened_out_code": None,
        "partial_code": None,
        "partial_pay_minor": None,
        "other_role_allowed": False,
        "when_out_of_work": "complete",
    }
    assert json.loads(seen[8].content) == {} and json.loads(seen[9].content) == {"round_id": 3}


# --- the app: login and role-based navigation -----------------------------------------


@pytest.fixture
def with_round(live: LiveApi) -> LiveApi:
    live.task("dynasent-r2", onboarding_quiz=None)
    live.round("dynasent-r2", PROMPTS)
    return live


def _with_cookie(monkeypatch: pytest.MonkeyPatch, session: sessions.Session | None) -> None:
    """What ``st.context.cookies`` would hold in a browser (AppTest cannot seed cookies)."""
    monkeypatch.setattr(state, "session_cookie", lambda: session)


def test_the_session_cookie_signs_in_with_the_pages_of_the_roles(
    with_round: LiveApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_round.user("wanda", "writer", "validator", password="wanda-secret-1")
    token = ApiClient(with_round.url).login("wanda", "wanda-secret-1")["token"]
    _with_cookie(monkeypatch, sessions.Session("login", token))
    client = with_round.client()
    at = AppTest.from_file(str(APP_FILE), default_timeout=30)
    at.session_state["client"] = client
    at.run()
    assert not at.exception
    assert at.session_state["roles"] == ["writer", "validator"]
    assert [t.value for t in at.title] == ["Write"]  # the first page of the roles
    assert "Signed in as wanda" in [t.value for t in at.sidebar.text]
    assert '<form method="post" action="/logout"' in html_of(at)  # Log out: the server's POST /logout
    assert at.session_state["token"] == token and client.token == token
    at.switch_page("app_pages/validator.py").run()
    assert [t.value for t in at.title] == ["Validate"]
    assert len(client.requests("GET", "/me")) == 1  # asked once per session, not on every rerun


def test_signed_out_every_page_links_to_the_login_page_with_its_address(
    with_round: LiveApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_cookie(monkeypatch, None)
    at = AppTest.from_file(str(APP_FILE), default_timeout=30)
    at.session_state["client"] = with_round.client()
    at.run()
    assert [t.value for t in at.title] == ["dynaloop"] and "You are signed out." in texts(at.info)
    assert 'href="/login?next=/"' in html_of(at)
    assert "token" not in at.session_state


def test_a_forged_or_revoked_cookie_leaves_the_user_signed_out(
    with_round: LiveApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_cookie(monkeypatch, sessions.Session("login", "dl_forged-token-never-issued"))
    client = with_round.client()
    at = AppTest.from_file(str(APP_FILE), default_timeout=30)
    at.session_state["client"] = client
    at.run()
    assert [t.value for t in at.title] == ["dynaloop"]
    assert any("You are signed out" in w and "unknown or revoked" in w for w in texts(at.warning))
    assert "token" not in at.session_state and client.token is None
    at.run()
    assert len(client.requests("GET", "/me")) == 1  # the refused cookie is not retried on every rerun


def test_a_pasted_api_token_in_the_cookie_signs_in(with_round: LiveApi, monkeypatch: pytest.MonkeyPatch) -> None:
    token = with_round.user("vera", "validator")
    _with_cookie(monkeypatch, sessions.Session("token", token))
    at = AppTest.from_file(str(APP_FILE), default_timeout=30)
    at.session_state["client"] = with_round.client()
    at.run()
    assert [t.value for t in at.title] == ["Validate"]
    with pytest.raises(ValueError, match=r"Could not find a navigation page for '.*/app_pages/writer\.py'"):
        at.switch_page("app_pages/writer.py")  # not a page of a validator


def test_writer_cannot_reach_validator_page_and_admin_reaches_all(with_round: LiveApi) -> None:
    with_round.user("walt", "writer")
    with_round.user("ada", "admin")
    at = signed_in_app(with_round, "walt")
    with pytest.raises(ValueError, match=r"Could not find a navigation page for '.*/app_pages/validator\.py'"):
        at.switch_page("app_pages/validator.py")
    admin = signed_in_app(with_round, "ada", page="app_pages/writer.py")
    assert [t.value for t in admin.title] == ["Write"]
    admin.switch_page("app_pages/validator.py").run()
    assert [t.value for t in admin.title] == ["Validate"]


def test_researcher_navigation_lists_the_researcher_pages_that_exist(with_round: LiveApi) -> None:
    with_round.user("rita", "researcher")
    at = signed_in_app(with_round, "rita")
    pages = sorted(Path(APP_FILE).parent.joinpath("app_pages").glob("researcher_*.py"))
    for page in pages:
        at.switch_page(f"app_pages/{page.name}")  # registered (not run: those pages have their own tests)
    if not pages:
        assert "have no pages here" in at.info[0].value
    with pytest.raises(ValueError, match=r"Could not find a navigation page for '.*/app_pages/writer\.py'"):
        at.switch_page("app_pages/writer.py")


def test_expired_token_offers_to_log_in_again(with_round: LiveApi) -> None:
    with_round.user("walt", "writer")
    at = signed_in_app(with_round, "walt")
    with_round.revoke("walt")  # the token was revoked
    at.run()
    assert "unknown or revoked" in at.error[0].value
    at.button(key="state_relogin").click().run()
    assert [t.value for t in at.title] == ["dynaloop"]
    assert any("unknown or revoked" in w for w in texts(at.warning))
    assert "token" not in at.session_state


def test_dynaloop_ui_runs_streamlit_with_the_api_url(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    started: dict[str, Any] = {}

    def fake_call(command: list[str], env: dict[str, str]) -> int:
        started.update(command=command, env=env)
        return 0

    monkeypatch.setattr(subprocess, "call", fake_call)
    result = CliRunner().invoke(cli, ["ui", "--port", "8600", "--host", "0.0.0.0", "--api-url", "http://api:9000"])
    assert result.exit_code == 0, result.output
    command = started["command"]
    assert command[1:4] == ["-m", "streamlit", "run"] and command[4] == str(APP_FILE.parent / "server.py")
    assert command[5:] == [
        "--server.port",
        "8600",
        "--server.address",
        "0.0.0.0",
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
    ]
    assert started["env"]["DYNALOOP_API_URL"] == "http://api:9000"
