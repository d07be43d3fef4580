"""The web app's login and logout pages, session cookie and page gate (frontend/web.py,
frontend/sessions.py, frontend/page_gate.py), as a browser and an attacker meet them: against
the real API served over HTTP, with a stand-in for the Streamlit pages behind the gate (the
browser test, tests/test_e2e_browser.py, runs the real ``st.App``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from http.cookies import SimpleCookie
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from dynaloop.api.app import create_app
from frontend import forms, forwarded, page_gate, sessions, web, web_backend
from frontend.client import ApiClient, ApiError
from services.db.engine import session_scope
from services.domain import users
from tests.conftest import free_port
from tests.frontend_live import HOSTILE
from tests.stub_model_server import ThreadedServer

ORIGIN = "http://testserver"
SAME = {"Origin": ORIGIN}
PASSWORD = "plum-orchard-window"


@pytest.fixture
def api_url(app: Any) -> Iterator[str]:
    server = ThreadedServer(app, free_port()).start()
    yield server.url
    server.stop()


def _user(app: Any, username: str, *roles: str) -> None:
    with session_scope(app.state.sessionmaker) as session:
        users.create_user(session, None, username, list(roles), password=PASSWORD)


def _web_app(api_url: str, base: str = "", web_app_key: str | None = None, trusted_proxies: str = "") -> Starlette:
    """The routes and gate as ``frontend/server.py`` mounts them; any other path stands for a
    Streamlit page or file."""
    trusted = forwarded.parse_trusted_proxies(trusted_proxies)
    session = web.WebSession(web_backend.Backend(api_url, web_app_key=web_app_key, trusted_proxies=trusted), base)

    async def streamlit(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"streamlit {request.url.path}")

    return Starlette(
        routes=[*session.routes(), Route("/{path:path}", streamlit, methods=["GET", "HEAD", "POST"])],
        middleware=[Middleware(page_gate.SessionGate, web=session)],
    )


@pytest.fixture
def browser(api_url: str) -> Iterator[TestClient]:
    with TestClient(_web_app(api_url), base_url=ORIGIN, follow_redirects=False) as client:
        yield client


def _set_cookie(response: httpx.Response) -> SimpleCookie:
    cookie = SimpleCookie()
    for header in response.headers.get_list("set-cookie"):
        cookie.load(header)
    return cookie


def _log_in(browser: TestClient, username: str, password: str = PASSWORD, next_path: str = "/dashboard") -> Any:
    return browser.post(
        "/login",
        data={"kind": "password", "username": username, "password": password, "next": next_path},
        headers=SAME,
    )


def test_a_page_load_without_a_session_goes_to_login_and_back_to_the_deep_link(
    app: Any, api_url: str, browser: TestClient
) -> None:
    _user(app, "rita", "researcher")
    response = browser.get("/dashboard?round=3")
    assert response.status_code == 303 and response.headers["location"] == "/login?next=/dashboard%3Fround%3D3"
    form = browser.get(response.headers["location"])
    assert form.status_code == 200
    assert 'aria-label="Username"' in form.text and 'aria-label="Password"' in form.text
    assert '<button type="submit">Log in</button>' in form.text
    assert 'name="next" value="/dashboard?round=3"' in form.text and "no-store" in form.headers["cache-control"]

    before = dt.datetime.now(dt.UTC)
    logged_in = _log_in(browser, "rita", next_path="/dashboard?round=3")
    assert logged_in.status_code == 303 and logged_in.headers["location"] == "/dashboard?round=3"
    morsel = _set_cookie(logged_in)[sessions.COOKIE_NAME]
    assert morsel["httponly"] and morsel["samesite"].lower() == "lax" and morsel["path"] == "/"
    assert not morsel["secure"]  # plain HTTP here; see the HTTPS test
    kind, token = morsel.value.split(".", 1)
    assert kind == "login" and token.startswith("dl_")
    # The cookie lives as long as the API token: 7 days for a login.
    expires_at = dt.datetime.fromisoformat(str(ApiClient(api_url, token).my_token()["expires_at"]))
    expires_at = expires_at if expires_at.tzinfo else expires_at.replace(tzinfo=dt.UTC)
    assert abs((before + dt.timedelta(seconds=int(morsel["max-age"]))) - expires_at) < dt.timedelta(minutes=2)
    assert ApiClient(api_url, token).me()["username"] == "rita"

    # With the cookie (the TestClient keeps it), the page and Streamlit's own routes load.
    assert browser.get("/dashboard").text == "streamlit /dashboard"
    assert browser.get("/").text == "streamlit /"
    assert browser.get("/_stcore/health").text == "streamlit /_stcore/health"


def test_a_wrong_password_shows_the_apis_message_and_sets_no_cookie(app: Any, browser: TestClient) -> None:
    _user(app, "rita", "researcher")
    wrong = _log_in(browser, "rita", "not-the-password")
    assert wrong.status_code == 401
    assert "wrong username or password" in wrong.text
    assert sessions.COOKIE_NAME not in wrong.headers.get("set-cookie", "")
    assert 'value="rita"' in wrong.text and "not-the-password" not in wrong.text  # the password is not echoed
    empty = _log_in(browser, "rita", "")
    assert empty.status_code == 400 and "Enter your username and password." in empty.text
    assert browser.get("/dashboard").status_code == 303  # still signed out


def test_user_text_on_the_login_page_is_escaped(app: Any, browser: TestClient) -> None:
    answer = _log_in(browser, HOSTILE[:60], "whatever-1", next_path='/x"><script>alert(1)</script>')
    assert answer.status_code in (401, 422), answer.text
    assert "<script>" not in answer.text and "&lt;script&gt;" in answer.text
    page = browser.get("/login", params={"next": '/"><img src=x onerror=alert(1)>'})
    assert "<img" not in page.text


@pytest.mark.parametrize(
    "next_path",
    [
        "//evil.example/x",
        "https://evil.example/",
        "http:/evil.example",
        "/\\evil.example",
        "\\\\evil.example",
        "/\t/evil.example",
        "/ /evil.example",
        "/dashboard\r\nSet-Cookie: x=1",
        "javascript:alert(1)",
        "evil.example",
        "/login?next=//evil.example",
        "/logout",
        "/" + "a" * 3000,
    ],
)
def test_next_is_a_path_of_this_app_or_the_start_page(app: Any, browser: TestClient, next_path: str) -> None:
    _user(app, "rita", "researcher")
    answer = _log_in(browser, "rita", next_path=next_path)
    assert answer.status_code == 303 and answer.headers["location"] == "/", answer.headers
    assert sessions.safe_next(next_path, "") == "/"


def test_next_keeps_paths_under_the_base_path_only() -> None:
    assert sessions.safe_next("/dl/dashboard?round=2", "/dl") == "/dl/dashboard?round=2"
    assert sessions.safe_next("/dashboard", "/dl") == "/dl/"
    assert sessions.safe_next("/dlx/dashboard", "/dl") == "/dl/"
    assert sessions.safe_next("/dl/login", "/dl") == "/dl/"
    assert sessions.base_path("/dl/") == "/dl" and sessions.base_path("") == "" and sessions.base_path(None) == ""


def test_a_cookie_over_https_is_secure_and_under_a_base_path_is_scoped_to_it(app: Any, api_url: str) -> None:
    _user(app, "rita", "researcher")
    with TestClient(_web_app(api_url, "/dl"), base_url="https://testserver", follow_redirects=False) as client:
        answer = client.post(
            "/dl/login",
            data={"kind": "password", "username": "rita", "password": PASSWORD, "next": "/dl/rounds"},
            headers={"Origin": "https://testserver"},
        )
        assert answer.status_code == 303 and answer.headers["location"] == "/dl/rounds"
        morsel = _set_cookie(answer)[sessions.COOKIE_NAME]
        assert morsel["secure"] and morsel["httponly"] and morsel["path"] == "/dl"
        assert client.get("/dl/rounds").text == "streamlit /dl/rounds"
        assert client.get("/elsewhere").text == "streamlit /elsewhere"  # not the app's: no gate


@pytest.mark.parametrize(
    "cookie",
    [
        "dl_forged-token-that-the-api-never-issued",
        "login.dl_forged-token-that-the-api-never-issued",
        "token.dl_forged",
        "admin.dl_x",
        "login.dl_x;admin=1",
        "login." + "a" * 5000,
        "",
    ],
)
def test_a_forged_or_malformed_cookie_leads_to_the_login_page(browser: TestClient, cookie: str) -> None:
    browser.cookies.set(sessions.COOKIE_NAME, cookie)
    answer = browser.get("/validate")
    assert answer.status_code == 303 and answer.headers["location"].startswith("/login?next=/validate")
    assert "streamlit" not in answer.text


def test_an_expired_or_revoked_token_ends_the_session(app: Any, api_url: str, browser: TestClient) -> None:
    _user(app, "vera", "validator")
    assert _log_in(browser, "vera", next_path="/validate").status_code == 303
    token = sessions.parse_session(browser.cookies.get(sessions.COOKIE_NAME))
    assert token is not None and browser.get("/validate").text == "streamlit /validate"
    with ApiClient(api_url, token.token) as client:
        client.revoke_token(client.my_token()["id"])
    ended = browser.get("/validate")
    assert ended.status_code == 303 and ended.headers["location"] == "/login?next=/validate&ended=1"
    assert f'{sessions.COOKIE_NAME}=""' in ended.headers["set-cookie"] and "Max-Age=0" in ended.headers["set-cookie"]
    assert "Your session has ended" in browser.get(ended.headers["location"]).text


def test_a_page_of_another_role_says_which_role_it_needs(app: Any, browser: TestClient) -> None:
    _user(app, "walt", "writer")
    _user(app, "ada", "admin")
    _log_in(browser, "walt")
    refused = browser.get("/dashboard")
    assert refused.status_code == 403
    assert "The Dashboard page needs the researcher role; your roles: writer." in refused.text
    assert browser.get("/write").text == "streamlit /write"
    assert browser.get("/no-such-page").text == "streamlit /no-such-page"  # Streamlit says so itself
    _log_in(browser, "ada")
    assert browser.get("/dashboard").text == "streamlit /dashboard"  # an admin passes every role check


def test_an_api_token_instead_of_a_password(app: Any, api_url: str, browser: TestClient) -> None:
    _user(app, "vera", "validator")
    with ApiClient(api_url) as client:
        client.login("vera", PASSWORD)
        issued = client._json("POST", "/users/vera/tokens", json_body={"name": "laptop", "expires_in_days": 2})
    bad = browser.post("/login", data={"kind": "token", "token": "dl_bogus", "next": "/validate"}, headers=SAME)
    assert bad.status_code == 401 and "unknown or revoked" in bad.text
    assert "set-cookie" not in bad.headers
    assert (
        browser.post("/login", data={"kind": "token", "token": "no spaces", "next": "/"}, headers=SAME).status_code
        == 400
    )
    good = browser.post("/login", data={"kind": "token", "token": issued["token"], "next": "/validate"}, headers=SAME)
    assert good.status_code == 303 and good.headers["location"] == "/validate"
    morsel = _set_cookie(good)[sessions.COOKIE_NAME]
    assert morsel.value == f"token.{issued['token']}"
    assert 2 * 86400 - 120 < int(morsel["max-age"]) <= 2 * 86400  # the pasted token's own expiry
    # Logging out forgets a pasted token in the browser but leaves it working for its owner.
    out = browser.post("/logout", headers=SAME)
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    assert ApiClient(api_url, issued["token"]).me()["username"] == "vera"


@pytest.mark.both_databases
def test_logout_revokes_the_logins_token_and_clears_the_cookie(app: Any, api_url: str, browser: TestClient) -> None:
    _user(app, "rita", "researcher")
    _log_in(browser, "rita")
    session = sessions.parse_session(browser.cookies.get(sessions.COOKIE_NAME))
    assert session is not None
    out = browser.post("/logout", headers={"Referer": f"{ORIGIN}/dashboard"})
    assert out.status_code == 303 and out.headers["location"] == "/login?logged_out=1"
    assert "Max-Age=0" in out.headers["set-cookie"] and "Path=/" in out.headers["set-cookie"]
    with pytest.raises(ApiError) as refused:
        ApiClient(api_url, session.token).me()
    assert refused.value.status == 401
    assert "You are logged out." in browser.get(out.headers["location"]).text
    assert browser.get("/dashboard").status_code == 303


@pytest.mark.parametrize(
    "headers",
    [{}, {"Origin": "https://evil.example"}, {"Origin": "null"}, {"Referer": "https://evil.example/page"}],
)
def test_a_cross_site_logout_or_login_is_refused(
    app: Any, api_url: str, browser: TestClient, headers: dict[str, str]
) -> None:
    _user(app, "rita", "researcher")
    _log_in(browser, "rita")
    session = sessions.parse_session(browser.cookies.get(sessions.COOKIE_NAME))
    assert session is not None
    refused = browser.post("/logout", headers=headers)
    assert refused.status_code == 403 and "set-cookie" not in refused.headers
    assert ApiClient(api_url, session.token).me()["username"] == "rita"  # not revoked
    # Login CSRF (signing the victim into the attacker's account) is refused the same way.
    forced = browser.post(
        "/login", data={"kind": "password", "username": "rita", "password": PASSWORD, "next": "/"}, headers=headers
    )
    assert forced.status_code == 403 and "set-cookie" not in forced.headers


def test_oversized_or_malformed_forms_are_refused_before_the_api(app: Any, browser: TestClient) -> None:
    _user(app, "rita", "researcher")
    big = browser.post(
        "/login",
        content=b"kind=password&username=rita&password=" + b"x" * (forms.MAX_FORM_BYTES + 1),
        headers={**SAME, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert big.status_code == 413 and "set-cookie" not in big.headers

    def chunks() -> Iterator[bytes]:  # chunked, without a Content-Length
        yield b"kind=password&username=rita&password="
        for _ in range(64):
            yield b"x" * 4096

    streamed = browser.post(
        "/login", content=chunks(), headers={**SAME, "Content-Type": "application/x-www-form-urlencoded"}
    )
    assert streamed.status_code == 413
    as_json = browser.post("/login", json={"kind": "password", "username": "rita", "password": PASSWORD}, headers=SAME)
    assert as_json.status_code == 415
    not_utf8 = browser.post(
        "/login", content=b"username=\xff\xfe", headers={**SAME, "Content-Type": "application/x-www-form-urlencoded"}
    )
    assert not_utf8.status_code == 400
    long_name = _log_in(browser, "r" * (forms.MAX_USERNAME + 1))
    assert long_name.status_code == 400 and "at most 64 characters" in long_name.text
    assert browser.get("/dashboard").status_code == 303


@pytest.mark.parametrize("shared_key", [True, False], ids=["with-the-web-app-key", "without"])
def test_one_browsers_wrong_passwords_lock_that_browser_only(settings: Any, shared_key: bool) -> None:
    """Every login reaches the API from the web app's address; with the key the API shares, the
    web app names the browser's, so a hundred wrong passwords from one browser (here three) do
    not lock every other browser out of the web app. Without it they do, as the API is told."""
    key = "web-app-key-for-the-tests-0123456789"
    api = create_app(settings.model_copy(update={"login_max_failures_per_address": 3, "web_app_key": key}))
    _user(api, "wendy", "researcher")
    server = ThreadedServer(api, free_port()).start()
    try:
        app = _web_app(server.url, web_app_key=key if shared_key else None)
        with (
            TestClient(app, base_url=ORIGIN, follow_redirects=False, client=("203.0.113.7", 50000)) as attacker,
            TestClient(app, base_url=ORIGIN, follow_redirects=False, client=("198.51.100.2", 50000)) as worker,
        ):
            assert [_log_in(attacker, f"user{i}", "wrong-password-1").status_code for i in range(3)] == [401] * 3
            locked = _log_in(attacker, "wendy")
            assert locked.status_code == 429 and "failed logins for this address" in locked.text
            assert "Retry-After" in locked.headers
            answer = _log_in(worker, "wendy")
            if shared_key:
                assert answer.status_code == 303 and answer.headers["location"] == "/dashboard"
                assert sessions.COOKIE_NAME in _set_cookie(answer)
            else:
                assert answer.status_code == 429 and sessions.COOKIE_NAME not in _set_cookie(answer)
    finally:
        server.stop()


def test_behind_the_https_proxy_one_browsers_guesses_lock_that_browser_only(settings: Any) -> None:
    """The issue's deployment: every browser reaches the web app through the HTTPS proxy
    (10.0.0.2, trusted by the web app), which names the browser in X-Forwarded-For; the web app
    names it to the API (real HTTP) with the shared key. Browser A's wrong passwords lock browser
    A only; browser B, through the same proxy, logs in. A browser that connects to the web app
    directly (no trusted proxy) and forges X-Forwarded-For is counted by its own address."""
    key = "web-app-key-for-the-tests-0123456789"
    api = create_app(settings.model_copy(update={"login_max_failures_per_address": 3, "web_app_key": key}))
    _user(api, "wendy", "researcher")
    server = ThreadedServer(api, free_port()).start()
    try:
        app = _web_app(server.url, web_app_key=key, trusted_proxies="10.0.0.2")
        with (
            TestClient(app, base_url=ORIGIN, follow_redirects=False, client=("10.0.0.2", 50000)) as via_proxy,
            TestClient(app, base_url=ORIGIN, follow_redirects=False, client=("192.0.2.50", 50000)) as direct,
        ):
            browser_a, browser_b = {"X-Forwarded-For": "203.0.113.7"}, {"X-Forwarded-For": "198.51.100.2"}
            via_proxy.headers.update(browser_a)
            assert [_log_in(via_proxy, f"user{i}", "wrong-password-1").status_code for i in range(3)] == [401] * 3
            locked = _log_in(via_proxy, "wendy")
            assert locked.status_code == 429 and "failed logins for this address" in locked.text
            via_proxy.headers.update(browser_b)
            answer = _log_in(via_proxy, "wendy")
            assert answer.status_code == 303 and answer.headers["location"] == "/dashboard", answer.text
            assert sessions.COOKIE_NAME in _set_cookie(answer)

            # Not a trusted proxy: X-Forwarded-For is the browser's own claim, a new one each time.
            statuses = [
                _log_in_as(direct, f"user{i}", {"X-Forwarded-For": f"198.51.100.{10 + i}"}).status_code
                for i in range(4)
            ]
            assert statuses == [401, 401, 401, 429], statuses
            assert _log_in_as(direct, "wendy", {"X-Forwarded-For": "198.51.100.2"}).status_code == 429
    finally:
        server.stop()


def _log_in_as(browser: TestClient, username: str, headers: dict[str, str], password: str = "wrong-password-1") -> Any:
    return browser.post(
        "/login",
        data={"kind": "password", "username": username, "password": password, "next": "/dashboard"},
        headers={**SAME, **headers},
    )


def test_the_api_being_down_gets_a_clear_page(app: Any) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    with TestClient(_web_app(down), base_url=ORIGIN, follow_redirects=False) as client:
        answer = _log_in(client, "rita")
        assert answer.status_code == 503 and "cannot reach the API" in answer.text
        assert "set-cookie" not in answer.headers
        client.cookies.set(sessions.COOKIE_NAME, "login.dl_some-token")
        page = client.get("/dashboard")
        assert page.status_code == 503 and "The API is not answering" in page.text
        out = client.post("/logout", headers=SAME)  # the cookie goes; the page says the token could not be revoked
        assert out.status_code == 503 and "could not revoke" in out.text and "Max-Age=0" in out.headers["set-cookie"]


def test_an_endless_form_body_is_read_no_further_than_the_limit() -> None:
    received = 0

    async def endless() -> dict[str, Any]:
        nonlocal received
        received += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/login",
        "headers": [(b"content-type", b"application/x-www-form-urlencoded")],
    }

    async def read() -> None:
        with pytest.raises(forms.FormError) as refused:
            await forms.read_form(Request(scope, endless))
        assert refused.value.status == 413

    anyio.run(read)
    assert received == forms.MAX_FORM_BYTES // 1024 + 1
