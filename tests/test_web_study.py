"""The web app's study link routes (frontend/study_links.py ``/study/{slug}`` and ``/study/finish``) as a
crowdworker and an attacker meet them, against a fake of the API's study endpoints (the shared
contract of issue #13) reached through ``Backend(transport=...)``; a compromised API's off-site
completion addresses are refused, not followed."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from frontend import framing as web_framing
from frontend import page_gate, web, web_backend
from frontend.framing import Framing
from frontend.sessions import COOKIE_NAME
from tests.conftest import Actor, example_yaml, free_port, open_round, table_counts
from tests.stub_model_server import ThreadedServer
from tests.test_study_links import MTURK, PROMPTS, _write_example, make_link
from tests.test_study_links import PROLIFIC as PROLIFIC_IDS

ORIGIN = "http://testserver"
# An MTurk worker's browser: MTurk requires an ExternalQuestion's address to be HTTPS, and the
# MTurk study session's cookie is Secure, which a cookie jar sends over https only.
HTTPS_ORIGIN = "https://testserver"
SAME = {"Origin": ORIGIN}
SLUG = "Yq3x_k9-Lm2pQ7"
STUDY_TASK = "dynasent-r2"
PROLIFIC = {"PROLIFIC_PID": "5f1a2b3c4d5e6f7a8b9c0d1e", "STUDY_ID": "s1", "SESSION_ID": "x1"}


def _error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message, "details": {}}})


@dataclass
class FakeApi:
    """The study endpoints of the contract, in memory: one link per slug, sessions by token."""

    platform: str = "prolific"
    role: str = "writer"
    quota: int = 3
    units_done: int = 0
    status: str = "active"
    completion: dict[str, Any] | None = None  # what finishing answers (None: the platform's own)
    link_error: tuple[int, str, str] | None = None
    other_roles: list[str] = field(default_factory=list)  # the worker's roles besides the link's
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)  # token -> session id

    def session(self, session_id: int) -> dict[str, Any]:
        return {
            "id": session_id,
            "link_id": 7,
            "task": "dynasent-r2",
            "round_id": 1,
            "role": self.role,
            "platform": self.platform,
            "quota": self.quota,
            "units_done": self.units_done,
            "status": self.status,
            "started_at": "2026-11-24T10:00:00",
            "ended_at": None,
            "completion": None,
        }

    def finished(self, reason: str = "quota") -> dict[str, Any]:
        if self.completion is not None:
            return self.completion
        if reason != "quota":  # a stop is not a completion (the contract since issue 26)
            form = None
            if self.platform == "mturk":
                form = {
                    "action": "https://workersandbox.mturk.com/mturk/externalSubmit",
                    "fields": {"assignmentId": "A1B2", "completion_code": "stopped"},
                }
            return {"status": "stopped", "code": None, "redirect_url": None, "form": form, "message": "return it"}
        if self.platform == "prolific":
            return {
                "status": "completed",
                "code": "C0DE42",
                "redirect_url": "https://app.prolific.com/submissions/complete?cc=C0DE42",
                "form": None,
            }
        if self.platform == "mturk":
            return {
                "status": "completed",
                "code": "C0DE42",
                "redirect_url": None,
                "form": {
                    "action": "https://workersandbox.mturk.com/mturk/externalSubmit",
                    "fields": {"assignmentId": "A1B2", "completion_code": "C0DE42"},
                },
            }
        return {"status": "completed", "code": "C0DE42", "redirect_url": None, "form": None}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/v1")
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, path, body))
        auth = request.headers.get("authorization", "").removeprefix("Bearer ")
        if request.method == "POST" and path.startswith("/study/") and path.endswith("/sessions"):
            if path != f"/study/{SLUG}/sessions":
                return _error(404, "not_found", "no such study link")
            if self.link_error is not None:
                return _error(*self.link_error)
            params = body["params"]
            if params.get("assignmentId") == "ASSIGNMENT_ID_NOT_AVAILABLE":
                return httpx.Response(
                    200,
                    json={
                        "preview": True,
                        "link": {"name": "Pilot", "role": self.role, "platform": "mturk", "quota": self.quota},
                        "task": {"name": "dynasent-r2", "description": "Write <b>reviews</b> that fool the model."},
                    },
                )
            token = f"dl_worker{len(self.tokens) + 1}"
            self.tokens[token] = 11
            expires = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(hours=24)
            return httpx.Response(
                201,
                json={
                    "preview": False,
                    "token": token,
                    "expires_at": expires.isoformat(),
                    "session": self.session(11),
                    "task": {"name": "dynasent-r2", "description": "d"},
                    "link": {"name": "Pilot", "role": self.role, "platform": self.platform, "quota": self.quota},
                },
            )
        if auth not in self.tokens:
            return _error(401, "unauthorized", "log in first")
        if request.method == "GET" and path == "/me":
            return httpx.Response(
                200, json={"id": 5, "username": "prolific-0a1b2c3d4e5f", "roles": [self.role, *self.other_roles]}
            )
        if request.method == "GET" and path == "/me/study-sessions":
            return httpx.Response(200, json={"data": [self.session(self.tokens[auth])], "count": 1})
        if request.method == "POST" and path.startswith("/study-sessions/") and path.endswith("/finish"):
            if path != f"/study-sessions/{self.tokens[auth]}/finish":
                return _error(404, "not_found", "no such study session")
            return httpx.Response(200, json=self.finished(body["reason"]))
        return _error(404, "not_found", f"no route {path}")


def _web_app(api: FakeApi, base: str = "", framing: Framing | None = None) -> Starlette:
    session = web.WebSession(web_backend.Backend("http://api", transport=httpx.MockTransport(api)), base, framing)

    async def streamlit(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"streamlit {request.url.path}")

    return Starlette(
        routes=[*session.routes(), Route("/{path:path}", streamlit, methods=["GET", "HEAD", "POST"])],
        middleware=[Middleware(page_gate.SessionGate, web=session)],
    )


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def browser(api: FakeApi) -> Iterator[TestClient]:
    with TestClient(_web_app(api), base_url=ORIGIN, follow_redirects=False) as client:
        yield client


@pytest.fixture
def mturk_browser(api: FakeApi) -> Iterator[TestClient]:
    with TestClient(_web_app(api), base_url=HTTPS_ORIGIN, follow_redirects=False) as client:
        yield client


def _cookie(response: httpx.Response) -> SimpleCookie:
    cookie = SimpleCookie()
    for header in response.headers.get_list("set-cookie"):
        cookie.load(header)
    return cookie


def _api_calls(api: FakeApi, method: str, prefix: str) -> list[Any]:
    return [c for c in api.calls if c[0] == method and c[1].startswith(prefix)]


# --- the attacker first -------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/study/" + "a" * 65,  # longer than a slug
        "/study/a%20b",  # a space
        "/study/..%2F..%2Fme",  # a path in disguise
        "/study/%3Cscript%3E",
        "/study/a.b",
    ],
)
def test_a_forged_slug_is_refused_before_the_api(api: FakeApi, browser: TestClient, path: str) -> None:
    response = browser.get(path, params=PROLIFIC)
    assert response.status_code == 404
    assert COOKIE_NAME not in response.headers.get("set-cookie", "")
    assert "<script>" not in response.text
    assert api.calls == []


def test_an_unknown_slug_gets_the_apis_404_and_no_cookie(api: FakeApi, browser: TestClient) -> None:
    response = browser.get("/study/unknownSlug1", params=PROLIFIC)
    assert response.status_code == 404 and "no such study link" in response.text
    assert COOKIE_NAME not in response.headers.get("set-cookie", "")


@pytest.mark.parametrize(
    "params",
    [
        {f"p{i}": "x" for i in range(21)},  # too many parameters
        {"PROLIFIC_PID": "a" * 201},  # a value too long
        {"P" * 65: "x"},  # a name too long
    ],
)
def test_oversized_parameters_are_refused_before_the_api(
    api: FakeApi, browser: TestClient, params: dict[str, str]
) -> None:
    response = browser.get(f"/study/{SLUG}", params=params)
    assert response.status_code == 422
    assert COOKIE_NAME not in response.headers.get("set-cookie", "")
    assert api.calls == []


def test_a_repeated_parameter_or_an_endless_address_is_refused(api: FakeApi, browser: TestClient) -> None:
    twice = browser.get(f"/study/{SLUG}?PROLIFIC_PID=a&PROLIFIC_PID=b&STUDY_ID=s")
    assert twice.status_code == 422 and "twice" in twice.text
    huge = browser.get(f"/study/{SLUG}?" + "&".join(f"k{i}={'v' * 190}" for i in range(50)))
    assert huge.status_code == 422
    assert api.calls == []


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ((409, "study_link_closed", "This study link is closed."), 409),
        ((409, "study_link_full", "This study has all the workers it needs."), 409),
        ((422, "bad_params", "PROLIFIC_PID is missing: open the study from Prolific."), 422),
    ],
)
def test_the_apis_refusal_is_shown_with_its_status_and_no_cookie(
    api: FakeApi, browser: TestClient, error: tuple[int, str, str], status: int
) -> None:
    api.link_error = error
    response = browser.get(f"/study/{SLUG}", params=PROLIFIC)
    assert response.status_code == status and error[2] in response.text
    assert COOKIE_NAME not in response.headers.get("set-cookie", "")


@pytest.mark.parametrize(
    "redirect_url",
    [
        "https://evil.example/submissions/complete?cc=C0DE42",
        "https://app.prolific.com.evil.example/x",
        "http://app.prolific.com/submissions/complete?cc=C0DE42",  # not HTTPS
        "https://app.prolific.com/x\r\nSet-Cookie: a=b",
        "javascript:alert(1)//https://app.prolific.com/",
    ],
)
def test_an_off_site_redirect_from_a_compromised_api_is_not_followed(
    api: FakeApi, browser: TestClient, redirect_url: str
) -> None:
    api.completion = {"status": "completed", "code": "C0DE42", "redirect_url": redirect_url, "form": None}
    browser.get(f"/study/{SLUG}", params=PROLIFIC)
    response = browser.post("/study/finish", data={"session_id": "11", "reason": "quota"}, headers=SAME)
    assert response.status_code == 200 and "location" not in response.headers
    assert "C0DE42" in response.text  # the worker still gets the code
    assert "evil" not in response.text and "javascript:" not in response.text


@pytest.mark.parametrize(
    "action",
    [
        "https://evil.example/mturk/externalSubmit",
        "https://www.mturk.com.evil.example/mturk/externalSubmit",
        "http://www.mturk.com/mturk/externalSubmit",
        'https://www.mturk.com/"><script>alert(1)</script>',
    ],
)
def test_an_off_site_form_action_from_a_compromised_api_is_refused(
    api: FakeApi, mturk_browser: TestClient, action: str
) -> None:
    browser = mturk_browser
    api.platform = "mturk"
    api.completion = {
        "status": "completed",
        "code": "C0DE42",
        "redirect_url": None,
        "form": {"action": action, "fields": {"assignmentId": "A1"}},
    }
    browser.get(f"/study/{SLUG}", params={"workerId": "W1", "assignmentId": "A1", "hitId": "H1"})
    response = browser.post("/study/finish", data={"session_id": "11", "reason": "quota"}, headers=SAME)
    assert response.status_code == 502
    assert "<form" not in response.text and "evil" not in response.text and "<script>" not in response.text


@pytest.mark.parametrize("headers", [{}, {"Origin": "https://evil.example"}, {"Origin": "null"}])
def test_a_cross_site_finish_is_refused(api: FakeApi, browser: TestClient, headers: dict[str, str]) -> None:
    browser.get(f"/study/{SLUG}", params=PROLIFIC)
    response = browser.post("/study/finish", data={"session_id": "11", "reason": "stop"}, headers=headers)
    assert response.status_code == 403
    assert _api_calls(api, "POST", "/study-sessions/") == []


@pytest.mark.parametrize(
    "form",
    [
        {"session_id": "11", "reason": "paid"},
        {"session_id": "eleven", "reason": "quota"},
        {"session_id": "9" * 30, "reason": "quota"},
        {"reason": "quota"},
    ],
)
def test_a_malformed_finish_form_is_refused_before_the_api(
    api: FakeApi, browser: TestClient, form: dict[str, str]
) -> None:
    browser.get(f"/study/{SLUG}", params=PROLIFIC)
    response = browser.post("/study/finish", data=form, headers=SAME)
    assert response.status_code == 400
    assert _api_calls(api, "POST", "/study-sessions/") == []


def test_another_workers_session_gets_the_apis_404(api: FakeApi, browser: TestClient) -> None:
    browser.get(f"/study/{SLUG}", params=PROLIFIC)
    response = browser.post("/study/finish", data={"session_id": "12", "reason": "quota"}, headers=SAME)
    assert response.status_code == 404 and "no such study session" in response.text


def test_finish_without_a_cookie_goes_to_login(api: FakeApi, browser: TestClient) -> None:
    response = browser.get("/study/finish")
    assert response.status_code == 303 and response.headers["location"] == "/login?next=/study/finish"
    posted = browser.post("/study/finish", data={"session_id": "11", "reason": "quota"}, headers=SAME)
    assert posted.status_code == 303 and posted.headers["location"].startswith("/login?next=")
    # Only the study routes pass the gate: /study itself is a page load like any other.
    assert browser.get("/study").headers["location"] == "/login?next=/study"
    assert browser.get(f"/study/{SLUG}/more").status_code == 404
    assert api.calls == []


def test_a_revoked_token_ends_the_session_at_finish(api: FakeApi, browser: TestClient) -> None:
    browser.get(f"/study/{SLUG}", params=PROLIFIC)
    api.tokens.clear()
    response = browser.get("/study/finish")
    assert response.status_code == 303 and response.headers["location"] == "/login?next=/study/finish&ended=1"


# --- as a worker meets it -------------------------------------------------------------------


def test_a_prolific_link_signs_the_worker_in_and_finishing_redirects_to_prolific(
    api: FakeApi, browser: TestClient
) -> None:
    response = browser.get(f"/study/{SLUG}", params=PROLIFIC)
    # Straight to the Write page's own address (frontend/app.py: no page is served at "/" alone).
    assert response.status_code == 303 and response.headers["location"] == "/write"
    # The platform's parameters went to the API as they came.
    assert api.calls[0] == ("POST", f"/study/{SLUG}/sessions", {"params": PROLIFIC})
    morsel = _cookie(response)[COOKIE_NAME]
    assert morsel.value == "login.dl_worker1" and morsel["httponly"] and morsel["samesite"].lower() == "lax"
    assert abs(int(morsel["max-age"]) - 24 * 3600) < 120  # as long as the token: 24 hours

    # The study routes pass the gate; the Streamlit page itself is behind it (the cookie lets it load).
    assert browser.get("/write").text == "streamlit /write"

    confirm = browser.get("/study/finish")
    assert confirm.status_code == 200 and "0 of 3 examples for this study" in confirm.text
    assert 'name="reason" value="stop"' in confirm.text and "not reached the quota" in confirm.text
    assert "Stop now" in confirm.text and "without the completion code" in confirm.text
    assert "Finish and get your completion code" not in confirm.text
    assert 'value="out_of_work"' not in confirm.text  # writers do not run out of work
    assert "https://app.prolific.com" in confirm.headers["content-security-policy"]

    api.units_done = 3
    confirm = browser.get("/study/finish")
    assert 'name="reason" value="quota"' in confirm.text and "not reached" not in confirm.text

    done = browser.post("/study/finish", data={"session_id": "11", "reason": "quota"}, headers=SAME)
    assert done.status_code == 303
    assert done.headers["location"] == "https://app.prolific.com/submissions/complete?cc=C0DE42"
    assert _api_calls(api, "POST", "/study-sessions/") == [("POST", "/study-sessions/11/finish", {"reason": "quota"})]


def test_a_validator_link_goes_to_the_validate_page(api: FakeApi, browser: TestClient) -> None:
    api.role = "validator"
    response = browser.get(f"/study/{SLUG}", params=PROLIFIC)
    assert response.status_code == 303 and response.headers["location"] == "/validate"
    confirm = browser.get("/study/finish").text
    assert "0 of 3 labels" in confirm and 'name="reason" value="out_of_work"' in confirm
    done = browser.post("/study/finish", data={"session_id": "11", "reason": "out_of_work"}, headers=SAME)
    assert done.status_code == 200
    assert _api_calls(api, "POST", "/study-sessions/") == [
        ("POST", "/study-sessions/11/finish", {"reason": "out_of_work"})
    ]
    api.other_roles = ["writer"]  # a validator link leads to Validate whatever other roles the worker has
    response = browser.get(f"/study/{SLUG}", params=PROLIFIC)
    assert response.status_code == 303 and response.headers["location"] == "/validate"


def test_an_mturk_preview_is_read_only(api: FakeApi, browser: TestClient) -> None:
    response = browser.get(
        f"/study/{SLUG}", params={"assignmentId": "ASSIGNMENT_ID_NOT_AVAILABLE", "hitId": "H1", "workerId": ""}
    )
    assert response.status_code == 200
    assert "Accept the HIT to start" in response.text and "dynasent-r2" in response.text
    assert "&lt;b&gt;reviews&lt;/b&gt;" in response.text  # the description is escaped
    assert "<form" not in response.text
    assert COOKIE_NAME not in response.headers.get("set-cookie", "")


def test_an_mturk_worker_gets_a_form_that_posts_back_to_mturk(api: FakeApi, mturk_browser: TestClient) -> None:
    browser = mturk_browser
    api.platform = "mturk"
    params = {
        "workerId": "W1",
        "assignmentId": "A1B2",
        "hitId": "H1",
        "turkSubmitTo": "https://workersandbox.mturk.com",
    }
    assert browser.get(f"/study/{SLUG}", params=params).headers["location"] == "/write"
    done = browser.post("/study/finish", data={"session_id": "11", "reason": "quota"}, headers=SAME)
    assert done.status_code == 200
    assert '<form method="post" action="https://workersandbox.mturk.com/mturk/externalSubmit">' in done.text
    assert '<input type="hidden" name="assignmentId" value="A1B2">' in done.text
    assert '<input type="hidden" name="completion_code" value="C0DE42">' in done.text
    assert "Submit the HIT" in done.text
    csp = done.headers["content-security-policy"]
    assert "form-action https://workersandbox.mturk.com" in csp and "script-src" not in csp


def test_a_generic_worker_gets_the_code_to_copy(api: FakeApi, browser: TestClient) -> None:
    api.platform = "generic"
    browser.get(f"/study/{SLUG}", params={"worker": "w-123"})
    done = browser.post("/study/finish", data={"session_id": "11", "reason": "quota"}, headers=SAME)
    assert done.status_code == 200 and "C0DE42" in done.text and "Copy this code" in done.text


def test_a_worker_who_stopped_is_told_to_return_the_submission(api: FakeApi, browser: TestClient) -> None:
    browser.get(f"/study/{SLUG}", params=PROLIFIC)
    done = browser.post("/study/finish", data={"session_id": "11", "reason": "stop"}, headers=SAME)
    assert done.status_code == 200 and "location" not in done.headers
    assert "not a completed submission" in done.text and "Return submission" in done.text
    assert "C0DE42" not in done.text and "Copy this code" not in done.text
    # A link with a partial code: the worker gets that code.
    api.completion = {"status": "stopped", "code": "PART1", "redirect_url": None, "form": None}
    done = browser.post("/study/finish", data={"session_id": "11", "reason": "stop"}, headers=SAME)
    assert "PART1" in done.text and "not a completed submission" not in done.text


def test_a_screened_out_worker_sees_the_message_and_the_code(api: FakeApi, browser: TestClient) -> None:
    api.platform = "generic"
    api.status = "screened_out"
    api.completion = {"status": "screened_out", "code": "SCR33N", "redirect_url": None, "form": None}
    started = browser.get(f"/study/{SLUG}", params={"worker": "w-123"})
    assert started.status_code == 303 and started.headers["location"] == "/study/finish"
    done = browser.post("/study/finish", data={"session_id": "11", "reason": "stop"}, headers=SAME)
    assert "did not qualify" in done.text and "SCR33N" in done.text
    api.completion = {"status": "screened_out", "code": None, "redirect_url": None, "form": None}
    done = browser.post("/study/finish", data={"session_id": "11", "reason": "stop"}, headers=SAME)
    assert "did not qualify" in done.text and "Completion code" not in done.text


def test_under_a_base_path_the_study_routes_and_cookie_follow_it(api: FakeApi) -> None:
    with TestClient(_web_app(api, "/dl"), base_url=ORIGIN, follow_redirects=False) as browser:
        response = browser.get(f"/dl/study/{SLUG}", params=PROLIFIC)
        assert response.status_code == 303 and response.headers["location"] == "/dl/write"
        assert _cookie(response)[COOKIE_NAME]["path"] == "/dl"
        assert 'action="/dl/study/finish"' in browser.get("/dl/study/finish").text


# --- against the real API (issue #13's study endpoints, served over HTTP) ----------------------


@pytest.fixture
def api_url(app: Any) -> Iterator[str]:
    server = ThreadedServer(app, free_port()).start()
    yield server.url
    server.stop()


@pytest.fixture
def real_round(client: Any, researcher: Actor, stub_model: Any) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml(STUDY_TASK, onboarding_quiz=None), stub_model.url, PROMPTS)


def _real_web_app(api_url: str) -> Starlette:
    session = web.WebSession(web_backend.Backend(api_url), "")

    async def streamlit(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"streamlit {request.url.path}")

    return Starlette(
        routes=[*session.routes(), Route("/{path:path}", streamlit, methods=["GET", "HEAD", "POST"])],
        middleware=[Middleware(page_gate.SessionGate, web=session)],
    )


@pytest.fixture
def real_browser(api_url: str) -> Iterator[TestClient]:
    with TestClient(_real_web_app(api_url), base_url=ORIGIN, follow_redirects=False) as browser:
        yield browser


@pytest.fixture
def real_mturk_browser(api_url: str) -> Iterator[TestClient]:
    with TestClient(_real_web_app(api_url), base_url=HTTPS_ORIGIN, follow_redirects=False) as browser:
        yield browser


@pytest.mark.both_databases
def test_a_prolific_worker_writes_to_the_quota_and_lands_on_the_completion_redirect(
    app: Any, client: Any, researcher: Actor, real_round: dict[str, Any], real_browser: TestClient
) -> None:
    link = make_link(client, researcher, real_round["id"], completion_code="C0MPLETE")
    params = PROLIFIC_IDS
    started = real_browser.get(link["path"], params=params)
    assert started.status_code == 303 and started.headers["location"] == "/write"
    kind, token = _cookie(started)[COOKIE_NAME].value.split(".", 1)
    assert kind == "login" and abs(int(_cookie(started)[COOKIE_NAME]["max-age"]) - 24 * 3600) < 120
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).json()["roles"] == ["writer"]
    assert real_browser.get("/write").text == "streamlit /write"  # the gate lets the worker's page load

    confirm = real_browser.get("/study/finish")
    assert confirm.status_code == 200 and "0 of 2 examples for this study" in confirm.text
    for text in ("A plain remark about the lunch menu today.", "We went there on a Sunday afternoon with friends."):
        _write_example(client, {"Authorization": f"Bearer {token}"}, real_round["id"], text)
    # The quota met: the Finish page hands the worker straight to Prolific, and so does the form.
    expected = "https://app.prolific.com/submissions/complete?cc=C0MPLETE"
    assert real_browser.get("/study/finish").headers["location"] == expected
    session_id = client.get("/api/v1/me/study-sessions", headers={"Authorization": f"Bearer {token}"}).json()["data"]
    done = real_browser.post(
        "/study/finish", data={"session_id": str(session_id[0]["id"]), "reason": "quota"}, headers=SAME
    )
    assert done.status_code == 303 and done.headers["location"] == expected
    # Re-opening the link resumes the same, completed session (no second worker or session).
    again = real_browser.get(link["path"], params=params)
    assert again.status_code == 303 and again.headers["location"] == "/study/finish"
    sessions = client.get(f"/api/v1/study-links/{link['id']}/sessions", headers=researcher.headers).json()
    assert sessions["count"] == 1 and sessions["data"][0]["status"] == "completed"


def test_an_mturk_preview_then_accept_then_stop_posts_back_to_mturk(
    app: Any, client: Any, researcher: Actor, real_round: dict[str, Any], real_mturk_browser: TestClient
) -> None:
    real_browser = real_mturk_browser
    link = make_link(client, researcher, real_round["id"], platform="mturk", completion_code="TURKDONE")
    before = table_counts(app)
    preview = real_browser.get(
        link["path"], params={"assignmentId": "ASSIGNMENT_ID_NOT_AVAILABLE", "hitId": MTURK["hitId"]}
    )
    assert preview.status_code == 200 and "Accept the HIT to start" in preview.text
    assert COOKIE_NAME not in preview.headers.get("set-cookie", "") and table_counts(app) == before

    accepted = real_browser.get(
        link["path"],
        params=MTURK,
    )
    assert accepted.status_code == 303 and accepted.headers["location"] == "/write"
    confirm = real_browser.get("/study/finish")
    assert 'name="reason" value="stop"' in confirm.text
    session_id = confirm.text.split('name="session_id" value="', 1)[1].split('"', 1)[0]
    done = real_browser.post("/study/finish", data={"session_id": session_id, "reason": "stop"}, headers=SAME)
    assert done.status_code == 200
    assert '<form method="post" action="https://workersandbox.mturk.com/mturk/externalSubmit">' in done.text
    # The form stays (MTurk's only way back), but a stop carries its status, never the code.
    assert f'<input type="hidden" name="assignmentId" value="{MTURK["assignmentId"]}">' in done.text
    assert '<input type="hidden" name="completion_code" value="stopped">' in done.text
    assert "TURKDONE" not in done.text and "not a completed submission" in done.text


def test_the_real_apis_refusals_reach_the_worker(
    app: Any, client: Any, researcher: Actor, real_round: dict[str, Any], real_browser: TestClient
) -> None:
    link = make_link(client, researcher, real_round["id"])
    before = table_counts(app)
    unknown = real_browser.get("/study/" + "x" * 32, params={"PROLIFIC_PID": "abc", "STUDY_ID": "s", "SESSION_ID": "t"})
    assert unknown.status_code == 404
    missing = real_browser.get(link["path"], params={"STUDY_ID": "s"})
    assert missing.status_code == 422 and COOKIE_NAME not in missing.headers.get("set-cookie", "")
    assert table_counts(app) == before
    assert client.post(f"/api/v1/study-links/{link['id']}/close", headers=researcher.headers).status_code == 200
    before = table_counts(app)
    closed = real_browser.get(link["path"], params=PROLIFIC_IDS)
    assert closed.status_code == 409 and COOKIE_NAME not in closed.headers.get("set-cookie", "")
    assert table_counts(app) == before


def test_a_prolific_worker_who_stops_at_zero_gets_no_completion_redirect(
    app: Any, client: Any, researcher: Actor, real_round: dict[str, Any], real_browser: TestClient
) -> None:
    """Issue 26, item 5, as a worker meets it: Finish at 0 of N no longer redirects to Prolific
    with the completion code; the worker is told to return the submission."""
    link = make_link(client, researcher, real_round["id"], completion_code="C0MPLETE")
    real_browser.get(link["path"], params=PROLIFIC_IDS)
    confirm = real_browser.get("/study/finish")
    session_id = confirm.text.split('name="session_id" value="', 1)[1].split('"', 1)[0]
    for _ in range(2):  # finishing again answers the same
        done = real_browser.post("/study/finish", data={"session_id": session_id, "reason": "stop"}, headers=SAME)
        assert done.status_code == 200 and "location" not in done.headers
        assert "C0MPLETE" not in done.text and "Return submission" in done.text
    # The Finish page of the ended session shows the same, not a redirect.
    again = real_browser.get("/study/finish")
    assert again.status_code == 200 and "C0MPLETE" not in again.text


def test_a_closed_rounds_link_gets_a_409_page_and_a_worker_in_a_session_only_a_stop(
    app: Any,
    client: Any,
    researcher: Actor,
    real_round: dict[str, Any],
    real_browser: TestClient,
    api_url: str,
) -> None:
    """Issue 28, item 2, as a worker meets it: once the researcher closes the round, its link
    answers a 409 page that says the round is closed, with no cookie and nothing written; a
    worker who was already in a session keeps their cookie, can no longer resume through the
    link, and their Finish page ends the session as a stop, without the completion code."""
    link = make_link(client, researcher, real_round["id"], completion_code="C0MPLETE")
    started = real_browser.get(link["path"], params=PROLIFIC_IDS)
    assert started.status_code == 303 and COOKIE_NAME in _cookie(started)
    closed = client.post(
        f"/api/v1/rounds/{real_round['id']}/status", json={"status": "closed"}, headers=researcher.headers
    )
    assert closed.status_code == 200 and closed.json()["study_links_closed"] == 1

    before = table_counts(app)
    newcomer = {**PROLIFIC_IDS, "PROLIFIC_PID": "5f" + "0" * 21 + "9", "SESSION_ID": "61" + "0" * 21 + "9"}
    with TestClient(_real_web_app(api_url), base_url=ORIGIN, follow_redirects=False) as stranger:
        for browser, params in ((stranger, newcomer), (real_browser, PROLIFIC_IDS)):
            page = browser.get(link["path"], params=params)
            assert page.status_code == 409, page.text
            assert "This study is not taking workers" in page.text and "round of this study link is closed" in page.text
            assert COOKIE_NAME not in page.headers.get("set-cookie", "") and "C0MPLETE" not in page.text
    assert table_counts(app) == before

    confirm = real_browser.get("/study/finish")
    assert confirm.status_code == 200 and "0 of 2 examples for this study" in confirm.text
    session_id = confirm.text.split('name="session_id" value="', 1)[1].split('"', 1)[0]
    quota = real_browser.post("/study/finish", data={"session_id": session_id, "reason": "quota"}, headers=SAME)
    assert "location" not in quota.headers and "C0MPLETE" not in quota.text
    done = real_browser.post("/study/finish", data={"session_id": session_id, "reason": "stop"}, headers=SAME)
    assert done.status_code == 200 and "location" not in done.headers
    assert "C0MPLETE" not in done.text and "Return submission" in done.text


# --- MTurk inside its frame: frame policy and cookie per page kind (issue 27, item 4) ---------

MTURK_ACCEPTED = {
    "workerId": "W1",
    "assignmentId": "A1B2",
    "hitId": "H1",
    "turkSubmitTo": "https://workersandbox.mturk.com",
}
MTURK_HOSTS = "https://worker.mturk.com https://workersandbox.mturk.com https://www.mturk.com"


def _frame_ancestors(response: httpx.Response) -> str:
    csp = response.headers.get("content-security-policy", "")
    found = [part.strip() for part in csp.split(";") if part.strip().startswith("frame-ancestors")]
    assert len(found) == 1, csp
    return found[0].removeprefix("frame-ancestors").strip()


def _unframeable(response: httpx.Response) -> None:
    assert response.headers.get("x-frame-options") == "DENY", dict(response.headers)
    assert _frame_ancestors(response) == "'none'"


def _framed_by(response: httpx.Response, ancestors: str = MTURK_HOSTS) -> None:
    assert "x-frame-options" not in response.headers, dict(response.headers)
    assert _frame_ancestors(response) == ancestors


def _set_cookie(response: httpx.Response) -> str:
    """The session cookie the answer sets (or clears, when it clears it alone)."""
    headers = [h for h in response.headers.get_list("set-cookie") if h.startswith(f"{COOKIE_NAME}=")]
    setting = [h for h in headers if "max-age=0" not in h.lower()]
    assert len(setting) == 1 or (not setting and len(headers) == 1), headers
    return (setting or headers)[0]


def _cleared(response: httpx.Response) -> list[str]:
    headers = response.headers.get_list("set-cookie")
    return [h for h in headers if h.startswith(f"{COOKIE_NAME}=") and "max-age=0" in h.lower()]


def _attributes(header: str) -> set[str]:
    return {part.strip().lower() for part in header.split(";")[1:]}


def test_an_mturk_session_may_be_framed_by_mturk_only_on_every_page_it_meets(
    api: FakeApi, mturk_browser: TestClient
) -> None:
    api.platform = "mturk"
    preview = mturk_browser.get(f"/study/{SLUG}", params={"assignmentId": "ASSIGNMENT_ID_NOT_AVAILABLE", "hitId": "H1"})
    assert preview.status_code == 200 and "Accept the HIT to start" in preview.text
    _framed_by(preview)
    accepted = mturk_browser.get(f"/study/{SLUG}", params=MTURK_ACCEPTED)
    assert accepted.status_code == 303 and accepted.headers["location"] == "/write"
    cookie = _set_cookie(accepted)
    assert cookie.startswith(f"{COOKIE_NAME}=mturk.dl_worker1;")
    attributes = _attributes(cookie)
    assert {"httponly", "secure", "samesite=none", "partitioned", "path=/"} <= attributes, cookie
    # A Lax session cookie of the same browser (a researcher trying their link) is cleared first.
    (cleared,) = _cleared(accepted)
    assert "samesite=lax" in _attributes(cleared) and "partitioned" not in _attributes(cleared)
    headers = accepted.headers.get_list("set-cookie")
    assert headers.index(cleared) < headers.index(cookie)
    # The work pages Streamlit serves, the Finish page and the "Submit the HIT" form.
    work = mturk_browser.get("/write")
    assert work.text == "streamlit /write"
    _framed_by(work)
    finish = mturk_browser.get("/study/finish")
    assert finish.status_code == 200 and "Finish the study" in finish.text
    _framed_by(finish)
    submit = mturk_browser.post("/study/finish", data={"session_id": "11", "reason": "quota"}, headers=SAME)
    assert submit.status_code == 200 and "Submit the HIT" in submit.text
    _framed_by(submit)
    assert "form-action https://workersandbox.mturk.com" in submit.headers["content-security-policy"]
    # A page of a role the worker lacks: a message MTurk may show in its frame.
    refused = mturk_browser.get("/dashboard")
    assert refused.status_code == 403
    _framed_by(refused)
    # The login page never: not even for a worker with an MTurk session.
    _unframeable(mturk_browser.get("/login"))


def test_pages_that_are_not_an_mturk_sessions_refuse_every_frame(api: FakeApi, browser: TestClient) -> None:
    _unframeable(browser.get("/login"))
    assert browser.get("/dashboard").headers["location"] == "/login?next=/dashboard"  # no session
    started = browser.get(f"/study/{SLUG}", params=PROLIFIC)
    assert started.status_code == 303
    _unframeable(started)
    cookie = _set_cookie(started)
    attributes = _attributes(cookie)
    assert "samesite=lax" in attributes and "httponly" in attributes, cookie
    assert "partitioned" not in attributes and "samesite=none" not in attributes, cookie
    (cleared,) = _cleared(started)  # and a partitioned MTurk session cookie, if the browser has one
    assert {"partitioned", "samesite=none", "secure"} <= _attributes(cleared)
    page = browser.get("/write")
    assert page.text == "streamlit /write"
    _unframeable(page)
    _unframeable(browser.get("/study/finish"))
    # Streamlit's own routes and files are no page loads: the gate leaves them alone.
    assert "x-frame-options" not in browser.get("/static/app.js").headers
    _unframeable(browser.get("/study/no/such/thing"))


def test_a_refused_mturk_link_is_readable_in_mturks_frame_and_a_forged_one_is_not(
    api: FakeApi, mturk_browser: TestClient
) -> None:
    api.link_error = (409, "study_link_full", "This study has all the workers it needs.")
    full = mturk_browser.get(f"/study/{SLUG}", params=MTURK_ACCEPTED)
    assert full.status_code == 409 and "all the workers" in full.text
    _framed_by(full)
    assert COOKIE_NAME not in full.headers.get("set-cookie", "")
    # Without MTurk's parameters it is no MTurk answer: unframeable.
    _unframeable(mturk_browser.get(f"/study/{SLUG}", params=PROLIFIC))
    _unframeable(mturk_browser.get("/study/" + "a" * 65, params={"hitId": "H1"}))


def test_an_admins_frame_ancestors_and_submit_origins_are_used(api: FakeApi) -> None:
    framing = Framing.from_env(
        {
            "DYNALOOP_MTURK_FRAME_ANCESTORS": "http://localhost:8123, https://worker.mturk.com/",
            "DYNALOOP_MTURK_SUBMIT_ORIGINS": "http://localhost:8123",
        }
    )
    assert framing == Framing(("http://localhost:8123", "https://worker.mturk.com"), ("http://localhost:8123",))
    api.platform = "mturk"
    api.completion = {
        "status": "completed",
        "code": "C0DE42",
        "redirect_url": None,
        "form": {"action": "http://localhost:8123/mturk/externalSubmit", "fields": {"assignmentId": "A1B2"}},
    }
    with TestClient(_web_app(api, framing=framing), base_url=HTTPS_ORIGIN, follow_redirects=False) as client:
        client.get(f"/study/{SLUG}", params={**MTURK_ACCEPTED, "turkSubmitTo": "http://localhost:8123"})
        _framed_by(client.get("/write"), "http://localhost:8123 https://worker.mturk.com")
        done = client.post("/study/finish", data={"session_id": "11", "reason": "quota"}, headers=SAME)
        assert '<form method="post" action="http://localhost:8123/mturk/externalSubmit">' in done.text
    # MTurk's own hosts are no longer where this web app posts the assignment.
    api.completion["form"]["action"] = "https://www.mturk.com/mturk/externalSubmit"
    with TestClient(_web_app(api, framing=framing), base_url=HTTPS_ORIGIN, follow_redirects=False) as client:
        client.get(f"/study/{SLUG}", params=MTURK_ACCEPTED)
        refused = client.post("/study/finish", data={"session_id": "11", "reason": "quota"}, headers=SAME)
        assert refused.status_code == 502 and "<form" not in refused.text
    # None may frame: an empty list.
    closed = Framing.from_env({"DYNALOOP_MTURK_FRAME_ANCESTORS": ""})
    with TestClient(_web_app(api, framing=closed), base_url=HTTPS_ORIGIN, follow_redirects=False) as client:
        _unframeable(client.get(f"/study/{SLUG}", params={"assignmentId": "ASSIGNMENT_ID_NOT_AVAILABLE", "hitId": "H"}))


@pytest.mark.parametrize(
    "value",
    [
        "http://worker.mturk.com",  # plain http off the loopback
        "https://worker.mturk.com/mturk",  # a path
        "https://worker.mturk.com?x=1",
        "https://user@worker.mturk.com",
        "javascript:alert(1)",
        "*",
        "https://*.mturk.com",
        "'self'",
        "https://worker.mturk.com;script-src",  # a CSP directive smuggled in
        "https://worker.mturk.com:99999",
        "https://" + "a" * 200 + ".example",
        " ".join(f"https://h{i}.example" for i in range(11)),  # too many
    ],
)
def test_a_wrong_frame_ancestor_or_submit_origin_stops_the_start(value: str) -> None:
    from services.origins import parse_origins
    from services.settings import Settings

    with pytest.raises(ValueError, match="DYNALOOP_MTURK_FRAME_ANCESTORS"):
        Framing.from_env({"DYNALOOP_MTURK_FRAME_ANCESTORS": value})
    with pytest.raises(ValueError, match="DYNALOOP_MTURK_SUBMIT_ORIGINS"):
        Framing.from_env({"DYNALOOP_MTURK_SUBMIT_ORIGINS": value})
    with pytest.raises(ValueError, match="DYNALOOP_MTURK_SUBMIT_ORIGINS"):
        Settings(mturk_submit_origins=value)
    with pytest.raises(ValueError, match=r"^X: "):
        parse_origins(value, "X")


@pytest.mark.parametrize(
    "value",
    [
        "https://worker.mturk.com, https://workersandbox.mturk.com",
        "http://localhost:8123 http://127.0.0.1:9 http://[::1]:80",
        "https://Worker.MTurk.com/ https://worker.mturk.com:443",
        "",
    ],
)
def test_the_web_apps_copy_of_the_origin_parser_answers_like_the_apis(value: str) -> None:
    from services.origins import parse_origins

    assert web_framing.parse_origins(value, "X") == parse_origins(value, "X")


def test_a_cross_site_post_with_the_framed_cookie_ends_nothing(api: FakeApi, mturk_browser: TestClient) -> None:
    """The framed cookie is SameSite=None: a browser sends it with a form another site posts.
    The Finish route still needs this app's own origin, so nothing is finished."""
    api.platform = "mturk"
    mturk_browser.get(f"/study/{SLUG}", params=MTURK_ACCEPTED)
    for headers in ({"Origin": "https://evil.example"}, {"Referer": "https://evil.example/x"}, {}):
        response = mturk_browser.post("/study/finish", data={"session_id": "11", "reason": "stop"}, headers=headers)
        assert response.status_code == 403 and "Submit the HIT" not in response.text
        _framed_by(response)
    assert _api_calls(api, "POST", "/study-sessions/") == []


def test_logout_and_an_expired_mturk_session_clear_the_partitioned_cookie(
    api: FakeApi, mturk_browser: TestClient
) -> None:
    api.platform = "mturk"
    mturk_browser.get(f"/study/{SLUG}", params=MTURK_ACCEPTED)
    api.tokens.clear()  # the API no longer knows the token
    ended = mturk_browser.get("/write")
    assert ended.status_code == 303 and "ended=1" in ended.headers["location"]
    cleared = _set_cookie(ended)
    assert {"partitioned", "samesite=none", "secure"} <= _attributes(cleared) and "max-age=0" in cleared.lower()
