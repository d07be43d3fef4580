"""Login and tokens as an attacker probes them (issue #12, points 5 and 6): password guessing is
throttled per username and per address with a growing lock-out, unknown usernames cost the same
hashing work as real ones, weak passwords are refused, a token cannot mint a longer-lived one,
and the per-token rate limit cannot be dodged by spelling the `Bearer` scheme differently."""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from typer.testing import CliRunner

from dynaloop.api.app import create_app
from dynaloop.cli import app as cli
from dynaloop.demo import DEMO_USERS
from services import security
from services.db.engine import session_scope
from services.db.models import User
from services.domain import users
from services.errors import RateLimited
from services.settings import Settings
from tests.conftest import MakeUser, example_yaml, open_round, table_counts, table_snapshot

API = "/api/v1"
PASSWORD = "plum-orchard-window"


def _client(settings: Settings, **options: Any) -> TestClient:
    return TestClient(create_app(settings.model_copy(update=options)))


def _add_user(client: TestClient, username: str, password: str | None = PASSWORD, *, active: bool = True) -> None:
    with session_scope(client.app.state.sessionmaker) as session:  # type: ignore[attr-defined]
        user = users.create_user(session, None, username, ["writer"], password=password)
        user.is_active = active


def _login(client: TestClient, username: str, password: str) -> Any:
    return client.post(f"{API}/auth/login", json={"username": username, "password": password})


@pytest.fixture
def pbkdf2_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The iteration counts of every PBKDF2 computation from now on (a password check each)."""
    calls: list[int] = []
    real = hashlib.pbkdf2_hmac

    def counting(name: str, password: bytes, salt: bytes, iterations: int, *args: Any) -> bytes:
        calls.append(iterations)
        return real(name, password, salt, iterations, *args)

    monkeypatch.setattr(security.hashlib, "pbkdf2_hmac", counting)
    return calls


# --- throttle ----------------------------------------------------------------------------------


def test_forty_wrong_passwords_then_the_right_one_is_throttled_without_checking_it(
    settings: Settings, pbkdf2_calls: list[int]
) -> None:
    with _client(settings) as client:
        _add_user(client, "wendy")
        pbkdf2_calls.clear()
        statuses = [_login(client, "wendy", f"guess-number-{i:02d}").status_code for i in range(40)]
        assert statuses == [401] * 5 + [429] * 35
        # Only the first five guesses were checked; locked ones never reach the hash.
        assert len(pbkdf2_calls) == 5
        before = table_counts(client.app)
        right = _login(client, "wendy", PASSWORD)
        assert right.status_code == 429, right.text
        assert set(right.json()) == {"error"}
        error = right.json()["error"]
        assert error["code"] == "rate_limited" and "failed logins for this username" in error["message"]
        assert error["details"]["retry_after_s"] == int(right.headers["Retry-After"])
        assert 1 <= int(right.headers["Retry-After"]) <= 30
        assert len(pbkdf2_calls) == 5 and table_counts(client.app) == before


@pytest.mark.both_databases
def test_the_lock_out_doubles_and_a_success_clears_it(settings: Settings) -> None:
    with _client(
        settings, login_max_failures_per_user=2, login_lockout_s=1, login_lockout_max_s=2, login_failure_window_s=60
    ) as client:
        _add_user(client, "wendy")
        assert [_login(client, "wendy", "not-the-password").status_code for _ in range(3)] == [401, 401, 429]
        time.sleep(1.1)
        assert _login(client, "wendy", "not-the-password").status_code == 401  # the third failure: 2 s
        locked = _login(client, "wendy", PASSWORD)
        assert locked.status_code == 429 and locked.headers["Retry-After"] == "2"
        time.sleep(2.1)
        assert _login(client, "wendy", "not-the-password").status_code == 401  # capped at 2 s
        assert _login(client, "wendy", PASSWORD).headers["Retry-After"] == "2"
        time.sleep(2.1)
        assert _login(client, "wendy", PASSWORD).status_code == 200
        # The success cleared the username's failures: the next mistake is the first again.
        assert [_login(client, "wendy", "not-the-password").status_code for _ in range(2)] == [401, 401]


def test_one_address_guessing_many_usernames_is_locked(settings: Settings) -> None:
    with _client(settings, login_max_failures_per_address=3) as client:
        _add_user(client, "wendy")
        statuses = [_login(client, f"user{i}", "some-password-1").status_code for i in range(3)]
        assert statuses == [401, 401, 401]
        refused = _login(client, "wendy", PASSWORD)
        assert refused.status_code == 429 and "failed logins for this address" in refused.json()["error"]["message"]


WEB_APP_KEY = "web-app-key-for-the-tests-0123456789"


def _login_from(client: TestClient, username: str, address: str, key: str | None = WEB_APP_KEY) -> Any:
    """A login the web app relays for a browser at ``address`` (``key``: the key it sends)."""
    headers = {"X-Dynaloop-Client-Address": address}
    if key is not None:
        headers["X-Dynaloop-Web-App-Key"] = key
    return client.post(f"{API}/auth/login", json={"username": username, "password": "some-password-1"}, headers=headers)


def test_the_web_app_names_each_browsers_address_and_one_browser_cannot_lock_the_others(settings: Settings) -> None:
    """Every web-app login reaches the API from the web app's own address; with the shared key the
    web app names the browser's, so one browser's wrong passwords lock that browser only."""
    with _client(settings, login_max_failures_per_address=3, web_app_key=WEB_APP_KEY) as client:
        _add_user(client, "wendy")
        assert [_login_from(client, f"user{i}", "203.0.113.7").status_code for i in range(3)] == [401] * 3
        assert _login_from(client, "user9", "203.0.113.7").status_code == 429
        assert _login_from(client, "user9", "2001:db8::7").status_code == 401  # another browser: not locked
        other = client.post(
            f"{API}/auth/login",
            json={"username": "wendy", "password": PASSWORD},
            headers={"X-Dynaloop-Client-Address": "198.51.100.2", "X-Dynaloop-Web-App-Key": WEB_APP_KEY},
        )
        assert other.status_code == 200, other.text
        assert _login(client, "wendy", PASSWORD).status_code == 200  # the web app's own address: not locked


@pytest.mark.parametrize(
    ("api_key", "sent_key", "address"),
    [
        (WEB_APP_KEY, None, "203.0.113.{i}"),  # no key: the header is the client's own claim
        (WEB_APP_KEY, "a-guess-at-the-web-app-key-0000", "203.0.113.{i}"),  # a wrong key
        (WEB_APP_KEY, WEB_APP_KEY[:-1], "203.0.113.{i}"),  # a prefix of the key
        (None, WEB_APP_KEY, "203.0.113.{i}"),  # the API has no key: nobody may name an address
        (WEB_APP_KEY, WEB_APP_KEY, "not-an-address-{i}"),  # the right key, but no address
    ],
)
def test_a_forged_client_address_gets_no_fresh_login_budget(
    settings: Settings, api_key: str | None, sent_key: str | None, address: str
) -> None:
    """An attacker who names a new address on every guess still counts against their own."""
    with _client(settings, login_max_failures_per_address=3, web_app_key=api_key) as client:
        _add_user(client, "wendy")
        statuses = [_login_from(client, f"user{i}", address.format(i=i), sent_key).status_code for i in range(4)]
        assert statuses == [401, 401, 401, 429]
        assert _login(client, "wendy", PASSWORD).status_code == 429  # their own address is the one locked


def test_a_short_web_app_key_is_refused() -> None:
    with pytest.raises(ValueError, match="DYNALOOP_WEB_APP_KEY is shorter than 16"):
        Settings(web_app_key="short")


def test_a_login_flood_beyond_the_queue_is_refused_at_once(settings: Settings) -> None:
    """Logins are checked by ``login_password_workers`` threads; beyond ``login_max_waiting``
    logins waiting for one, a login is refused at once (429 in the JSON shape)."""
    with _client(settings, login_password_workers=1, login_max_waiting=2) as client:
        _add_user(client, "wendy")
        throttle = client.app.state.rate_limiter.login  # type: ignore[attr-defined]

        async def flood() -> list[str]:
            results: list[str] = []

            async def one() -> None:
                try:
                    await throttle.check_password("x", "192.0.2.1", lambda: time.sleep(0.2) or True)
                    results.append("checked")
                except RateLimited:
                    results.append("refused")

            async with anyio.create_task_group() as group:
                for _ in range(5):
                    group.start_soon(one)
            return results

        started = time.monotonic()
        results = anyio.run(flood)
        # One checked at a time, two may wait: three checked, two refused without waiting.
        assert sorted(results) == ["checked"] * 3 + ["refused"] * 2
        assert results[:2] == ["refused", "refused"] and time.monotonic() - started >= 0.6

        throttle.pending = 3  # as if one login were being checked and two waiting: the next is refused
        refused = _login(client, "wendy", PASSWORD)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
        assert (
            "logins are being checked or waiting" in refused.json()["error"]["message"]
            and refused.headers["Retry-After"] == "1"
        )
        throttle.pending = 0
        assert _login(client, "wendy", PASSWORD).status_code == 200


# --- the same work for every refusal -------------------------------------------------------------


def test_unknown_usernames_get_the_same_hashing_work_and_answer(
    settings: Settings, make_user: MakeUser, pbkdf2_calls: list[int]
) -> None:
    with _client(settings) as client:
        _add_user(client, "wendy")
        _add_user(client, "ivy", active=False)
        make_user("tok", "writer")  # a user without a password
        pbkdf2_calls.clear()
        for username, password in [
            ("wendy", "wrong-password-1"),
            ("nobody", "wrong-password-1"),
            ("ivy", PASSWORD),  # deactivated, right password
            ("tok", "wrong-password-1"),
        ]:
            before = len(pbkdf2_calls)
            response = _login(client, username, password)
            assert response.status_code == 401, (username, response.text)
            assert response.json()["error"]["message"] == "wrong username or password"
            assert pbkdf2_calls[before:] == [200_000], username  # one full PBKDF2 check each


# --- password policy -----------------------------------------------------------------------------

WEAK = [
    ("password", "at least 12"),
    ("12345678", "at least 12"),
    ("        ", "only whitespace"),
    (" " * 14, "only whitespace"),
    ("eleven-char", "11 characters long"),
    ("qwerty123456", "common passwords"),
    ("Q1W2E3R4T5Y6", "common passwords"),
    ("mallory-the-admin", "is the username"),
    # Long enough and not on the list, but what a guesser tries next (issue 26, point 11).
    ("aaaaaaaaaaaa", "is one character repeated"),
    ("AAAAAAAAAAAAAAAAAAAA", "is one character repeated"),
    ("123456789012", "a run along the alphabet, the digits or a keyboard row"),
    ("987654321098", "a run along the alphabet, the digits or a keyboard row"),
    ("abcdefghijklmn", "a run along the alphabet, the digits or a keyboard row"),
    ("zxcvbnmasdfghjkl", "a run along the alphabet, the digits or a keyboard row"),
    ("abcabcabcabc", "is a piece of 3 characters repeated"),
    ("passwordpassword", "is a piece of 8 characters repeated"),
    ("mallorymallory", "is a piece of 7 characters repeated"),
    ("aabbaabbccdd", "only 4 different characters"),
    ("sunshine2024!", "a common password with digits or symbols added"),
]


@pytest.mark.parametrize(("password", "reason"), WEAK)
def test_weak_passwords_are_refused_and_no_user_is_created(
    client: TestClient, make_user: MakeUser, password: str, reason: str
) -> None:
    admin = make_user("ada", "admin")
    before = table_counts(client.app)
    username = "mallory-the-admin"
    response = client.post(
        f"{API}/users", json={"username": username, "roles": ["writer"], "password": password}, headers=admin.headers
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid" and reason in error["message"] and "password" in error["message"]
    assert table_counts(client.app) == before


@pytest.mark.parametrize(
    "password",
    [
        *[f"{username}-demo-only" for _, username, _ in DEMO_USERS],  # README's demo logins
        PASSWORD,
        "correct horse battery staple",
        "Tr0ub4dor&3-xyz",
        "کتاب\u200cخانه\u200cی بزرگ شهر",  # Persian, with zero width non-joiners
        "ሰላም፡ዓለም፡እንዴት፡ነህ",  # Ge'ez
    ],
)
def test_strong_passwords_and_the_demos_pass_the_policy(client: TestClient, make_user: MakeUser, password: str) -> None:
    admin = make_user("ada", "admin")
    response = client.post(
        f"{API}/users", json={"username": "newcomer", "roles": ["writer"], "password": password}, headers=admin.headers
    )
    assert response.status_code == 201, response.text
    assert _login(client, "newcomer", password).status_code == 200


def test_the_cli_refuses_a_weak_password(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", url]).exit_code == 0
    weak = runner.invoke(
        cli, ["user", "create", "bob", "--role", "writer", "--password", "12345678", "--database-url", url]
    )
    assert weak.exit_code == 1 and "at least 12" in weak.output
    good = runner.invoke(
        cli, ["user", "create", "bob", "--role", "writer", "--password", PASSWORD, "--database-url", url]
    )
    assert good.exit_code == 0, good.output
    common = runner.invoke(cli, ["user", "password", "bob", "--password", "qwertyuiop123", "--database-url", url])
    assert common.exit_code == 1 and "common passwords" in common.output
    repeated = runner.invoke(cli, ["user", "password", "bob", "--password", "aaaaaaaaaaaa", "--database-url", url])
    assert repeated.exit_code == 1 and "one character repeated" in repeated.output
    run = runner.invoke(
        cli, ["user", "create", "eve", "--role", "writer", "--password", "123456789012", "--database-url", url]
    )
    assert run.exit_code == 1 and "a run along" in run.output
    changed = runner.invoke(
        cli, ["user", "password", "bob", "--password", "a-new-long-password", "--database-url", url]
    )
    assert changed.exit_code == 0 and "password of 'bob' set" in changed.output


def test_the_common_password_list_ships_with_its_license() -> None:
    header = security.COMMON_PASSWORDS_FILE.read_text(encoding="utf-8").splitlines()[:12]
    assert any("BSD-3-Clause" in line for line in header)
    assert len(security.common_passwords()) > 19_000 and "password" in security.common_passwords()


# --- tokens minted by tokens ---------------------------------------------------------------------


def test_a_token_from_a_seven_day_login_cannot_mint_a_longer_one(client: TestClient, make_user: MakeUser) -> None:
    _add_user(client, "wendy")
    login = _login(client, "wendy", PASSWORD).json()["token"]
    headers = {"Authorization": f"Bearer {login}"}
    tables = ("api_tokens", "audit_log")
    for body in ({}, {"expires_in_days": 30}, {"expires_in_days": 7}, {"expires_in_days": 3650}):
        before = table_snapshot(client.app, *tables)
        response = client.post(f"{API}/users/wendy/tokens", json=body, headers=headers)
        assert response.status_code == 422, (body, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid" and "cannot outlive it" in error["message"]
        assert "at most 6" in error["message"]
        assert table_snapshot(client.app, *tables) == before
    shorter = client.post(f"{API}/users/wendy/tokens", json={"expires_in_days": 6}, headers=headers)
    assert shorter.status_code == 201, shorter.text
    expires = dt.datetime.fromisoformat(shorter.json()["expires_at"].replace("Z", "+00:00"))
    assert expires <= dt.datetime.now(dt.UTC) + dt.timedelta(days=6, seconds=5)
    # An admin's login token cannot mint an unlimited token for someone else either.
    admin = make_user("ada", "admin")
    with session_scope(client.app.state.sessionmaker) as session:  # type: ignore[attr-defined]
        session.execute(
            update(User).where(User.username == "ada").values(password_hash=security.hash_password(PASSWORD))
        )
    admin_login = _login(client, "ada", PASSWORD).json()["token"]
    response = client.post(f"{API}/users/wendy/tokens", json={}, headers={"Authorization": f"Bearer {admin_login}"})
    assert response.status_code == 422 and "never expires" in response.json()["error"]["message"]
    # A token without expiry (from the CLI) may mint one without expiry.
    assert client.post(f"{API}/users/wendy/tokens", json={}, headers=admin.headers).status_code == 201


# --- the per-token rate limit ----------------------------------------------------------------------


def test_spellings_of_the_bearer_scheme_share_one_budget(
    settings: Settings, make_user: MakeUser, researcher: Any, stub_model: Any, reset_stubs: None
) -> None:
    with _client(settings, rate_limit_per_token="3/minute", rate_limit_per_ip="none") as client:
        round_ = open_round(
            client,
            researcher,
            example_yaml("dynasent-r2", onboarding_quiz=None),
            stub_model.url,
            [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(3)],
        )
        validator = make_user("vera", "validator")
        url = f"{API}/rounds/{round_['id']}/validation-batch"
        spellings = ["Bearer {}", "bearer {}", "BEARER {}", "Bearer    {}  ", "bEaReR {}"]
        statuses = [
            client.get(url, headers={"Authorization": spelling.format(validator.token)}).status_code
            for spelling in spellings
        ]
        assert statuses == [200, 200, 200, 429, 429]


@pytest.mark.both_databases
def test_me_token_tells_the_token_of_the_request_and_a_revoked_one_is_refused(settings: Settings) -> None:
    """``GET /me/token``: the id and expiry of the login's own token (never the plain token), so
    the web app can keep its cookie no longer than the token and revoke it on logout."""
    with _client(settings) as client:
        _add_user(client, "wendy")
        _add_user(client, "walt")
        before = dt.datetime.now(dt.UTC)
        token = _login(client, "wendy", PASSWORD).json()["token"]
        other = _login(client, "walt", PASSWORD).json()["token"]
        headers = {"Authorization": f"Bearer {token}"}
        mine = client.get(f"{API}/me/token", headers=headers)
        assert mine.status_code == 200, mine.text
        body = mine.json()
        assert body["token"] is None and body["name"] == "login" and token.startswith(body["prefix"])
        expires = dt.datetime.fromisoformat(body["expires_at"])
        expires = expires if expires.tzinfo else expires.replace(tzinfo=dt.UTC)
        assert dt.timedelta(days=6, hours=23) < expires - before <= dt.timedelta(days=7, minutes=1)
        # Another user's token id cannot be revoked with this token; the own one can.
        theirs = client.get(f"{API}/me/token", headers={"Authorization": f"Bearer {other}"}).json()["id"]
        assert client.delete(f"{API}/tokens/{theirs}", headers=headers).status_code in (403, 404)
        assert client.delete(f"{API}/tokens/{body['id']}", headers=headers).status_code == 200
        assert client.get(f"{API}/me/token", headers=headers).status_code == 401
        assert client.get(f"{API}/me/token").status_code == 401


# --- issue 26, item 9: the real client address behind a proxy --------------------------------

BROWSER_A, BROWSER_B = "203.0.113.7", "198.51.100.2"


@contextmanager
def _live_api(settings: Settings, **options: Any) -> Iterator[tuple[Any, httpx.Client]]:
    """The API over real HTTP on 127.0.0.1 (as `dynaloop api` runs it: uvicorn leaves forwarded
    headers to the app), and a client that connects from 127.0.0.1."""
    from tests.conftest import free_port
    from tests.stub_model_server import ThreadedServer

    app = create_app(settings.model_copy(update=options))
    server = ThreadedServer(app, free_port()).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            yield app, http
    finally:
        server.stop()
        app.state.engine.dispose()


def _login_over(http: httpx.Client, username: str, password: str, **headers: str) -> httpx.Response:
    return http.post(f"{API}/auth/login", json={"username": username, "password": password}, headers=headers)


def _add(app: Any, username: str) -> None:
    with session_scope(app.state.sessionmaker) as session:
        users.create_user(session, None, username, ["writer"], password=PASSWORD)


def test_a_forwarded_header_from_a_client_that_is_no_trusted_proxy_is_ignored(settings: Settings) -> None:
    """The attacker connects directly (127.0.0.1, not a trusted proxy: none is configured) and
    names a new address in X-Forwarded-For or Forwarded on every guess, hoping for a fresh
    failure budget each time. Their own address is counted: the fourth guess is refused (429)
    before any password is checked, whatever address the next request names."""
    with _live_api(settings, login_max_failures_per_address=3) as (app, http):
        _add(app, "wendy")
        statuses = [
            _login_over(http, f"user{i}", "wrong-password-1", **{"X-Forwarded-For": f"1.2.3.{i}"}).status_code
            for i in range(3)
        ]
        assert statuses == [401, 401, 401]
        for headers in (
            {"X-Forwarded-For": "1.2.3.4"},
            {"Forwarded": "for=198.51.100.77"},
            {"X-Forwarded-For": "9.9.9.9, 8.8.8.8"},
            {},
        ):
            refused = _login_over(http, "wendy", PASSWORD, **headers)
            assert refused.status_code == 429, (headers, refused.text)
            assert "too many failed logins for this address" in refused.json()["error"]["message"]


@pytest.mark.parametrize(
    "forward",
    [
        lambda address: {"X-Forwarded-For": address},
        # A client that forged the header itself, behind a proxy that appends (``$proxy_add_x_forwarded_for``):
        lambda address: {"X-Forwarded-For": f"10.66.66.66, {address}"},
        lambda address: {"Forwarded": f'for="{address}";proto=https'},
    ],
    ids=["x-forwarded-for", "appended-to-a-forged-one", "forwarded"],
)
def test_behind_a_trusted_proxy_one_browsers_guesses_lock_that_browser_only(settings: Settings, forward: Any) -> None:
    """Every browser reaches the API through the same proxy (here 127.0.0.1, configured as
    trusted). 110 failed logins from browser A (any usernames) lock browser A's address; browser
    B, through the same proxy, still logs in. Before, both had the proxy's address and one
    guesser locked every login."""
    with _live_api(settings, trusted_proxies="127.0.0.1, 10.0.0.0/8") as (app, http):
        _add(app, "wendy")
        assert settings.model_copy().login_max_failures_per_address == 100  # the default the issue hit
        statuses = [
            _login_over(http, f"guess{i}", "wrong-password-1", **forward(BROWSER_A)).status_code for i in range(110)
        ]
        assert statuses[:100] == [401] * 100 and set(statuses[100:]) == {429}, statuses
        locked = _login_over(http, "wendy", PASSWORD, **forward(BROWSER_A))
        assert locked.status_code == 429 and "failed logins for this address" in locked.json()["error"]["message"]
        other = _login_over(http, "wendy", PASSWORD, **forward(BROWSER_B))
        assert other.status_code == 200, other.text
        # The proxy's own requests (no forwarded header) are not locked either.
        assert _login_over(http, "wendy", PASSWORD).status_code == 200


@pytest.mark.parametrize(
    ("peer", "headers", "trusted", "expected"),
    [
        ("203.0.113.9", {"X-Forwarded-For": "1.2.3.4"}, "", "203.0.113.9"),  # no proxy is trusted
        ("203.0.113.9", {"X-Forwarded-For": "1.2.3.4"}, "10.0.0.0/8", "203.0.113.9"),  # the peer is no proxy
        ("10.0.0.5", {"X-Forwarded-For": "1.2.3.4"}, "10.0.0.0/8", "1.2.3.4"),
        ("10.0.0.5", {"X-Forwarded-For": "6.6.6.6, 1.2.3.4, 10.0.0.9"}, "10.0.0.0/8", "1.2.3.4"),  # rightmost untrusted
        ("10.0.0.5", {"X-Forwarded-For": "10.0.0.7, 10.0.0.9"}, "10.0.0.0/8", "10.0.0.7"),  # all trusted: leftmost
        ("10.0.0.5", {"X-Forwarded-For": "garbage, 10.0.0.9"}, "10.0.0.0/8", "10.0.0.9"),  # not an address
        ("10.0.0.5", {"X-Forwarded-For": "1.2.3.4:5678"}, "10.0.0.5", "1.2.3.4"),
        ("10.0.0.5", {"X-Forwarded-For": "[2001:db8::1]:443"}, "10.0.0.5", "2001:db8::1"),
        ("10.0.0.5", {}, "10.0.0.5", "10.0.0.5"),
        (
            "10.0.0.5",
            {"Forwarded": 'for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711"'},
            "10.0.0.5",
            "2001:db8:cafe::17",
        ),
        ("10.0.0.5", {"Forwarded": "for=unknown"}, "10.0.0.5", "10.0.0.5"),
        ("10.0.0.5", {"Forwarded": "for=1.1.1.1", "X-Forwarded-For": "2.2.2.2"}, "10.0.0.5", "2.2.2.2"),
        ("::ffff:10.0.0.5", {"X-Forwarded-For": "1.2.3.4"}, "10.0.0.0/8", "1.2.3.4"),  # IPv4-mapped peer
        ("testclient", {"X-Forwarded-For": "1.2.3.4"}, "10.0.0.0/8", "testclient"),  # no address at all
    ],
)
def test_the_api_and_the_web_app_read_forwarded_headers_alike(
    peer: str, headers: dict[str, str], trusted: str, expected: str
) -> None:
    """services/forwarded.py (the API) and frontend/forwarded.py (the web app's copy) agree."""
    from frontend import forwarded as web_side
    from services import forwarded as api_side

    assert api_side.client_address(peer, headers, api_side.parse_trusted_proxies(trusted)) == expected
    assert web_side.client_address(peer, headers, web_side.parse_trusted_proxies(trusted)) == expected


def test_a_trusted_proxy_that_is_no_address_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="DYNALOOP_TRUSTED_PROXIES: 'nginx' is not an IP address or network"):
        Settings(trusted_proxies="10.0.0.5, nginx")
    assert [str(n) for n in Settings(trusted_proxies=" 10.0.0.5 ,172.16.0.0/12,::1 ").trusted_proxy_networks] == [
        "10.0.0.5/32",
        "172.16.0.0/12",
        "::1/128",
    ]
