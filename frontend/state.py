"""Session state shared by every page: the API client, the signed-in user and role checks.

Keys in ``st.session_state`` that more than one page relies on:

``client``
    An API client (an :class:`~frontend.client.Api`) to use instead of building one: the
    tests put one there that records its requests and can fail on demand
    (``tests/frontend_live.py``). Never cleared by :func:`logout`.
``token``, ``user``, ``roles``
    The signed-in user's API token, their ``/me`` record and its roles; set by
    :func:`login`, removed by :func:`logout`.
``session_problem``
    Why the browser's session cookie (``frontend/sessions.py``) did not sign the user in: the
    API's message for an expired or revoked token, or for an API that did not answer.
``flash``
    A ``(kind, markdown)`` pair a page shows once at its top after a rerun (see :func:`flash`).
``_session_cache``
    Answers of the API kept for a while by :func:`session_cached`.

Each page keeps its own keys under a prefix (``writer_``, ``validator_``, ``researcher_``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Literal, TypeVar

import streamlit as st

from frontend import forwarded, render, sessions
from frontend.client import WEB_APP_KEY_ENV, Api, ApiClient, ApiError, SharedTransport, Task, User, api_root

API_URL_ENV = "DYNALOOP_API_URL"
DEFAULT_API_URL = "http://127.0.0.1:8000"

CLIENT_KEY = "client"
TOKEN_KEY = "token"
USER_KEY = "user"
ROLES_KEY = "roles"
FLASH_KEY = "flash"
SESSION_PROBLEM_KEY = "session_problem"
_COOKIE_TRIED_KEY = "_session_cookie_tried"
_BUILT_CLIENT_KEY = "_api_client"
_TASK_CACHE_KEY = "_task_definitions"
_SESSION_CACHE_KEY = "_session_cache"
#: How long :func:`session_cached` keeps an answer.
SESSION_CACHE_TTL_S = 30.0

T = TypeVar("T")

FlashKind = Literal["success", "info", "warning", "error"]


def api_url() -> str:
    """Where the API is: ``$DYNALOOP_API_URL`` (``http://host:port``, with or without ``/api/v1``)."""
    return os.environ.get(API_URL_ENV) or DEFAULT_API_URL


_LOOPBACK = ("127.0.0.1", "::1")


def browser_address() -> str | None:
    """The browser's address on a page (its WebSocket): the peer, or, when the peer is one of
    ``$DYNALOOP_TRUSTED_PROXIES``, the address the proxy forwarded (frontend/forwarded.py);
    None on this machine's own loopback (Streamlit gives no peer address there)."""
    trusted = forwarded.trusted_from_env()
    peer = st.context.ip_address
    if peer is None:  # a loopback peer: a proxy on this machine, if it is trusted
        peer = next((candidate for candidate in _LOOPBACK if forwarded.is_trusted(candidate, trusted)), None)
        if peer is None:
            return None
    address = forwarded.client_address(peer, dict(st.context.headers), trusted)
    return None if address in _LOOPBACK else address


def get_client() -> Api:
    """The session's API client: the injected ``st.session_state["client"]`` if there is one
    (in tests), else an :class:`ApiClient` for :func:`api_url` with the signed-in user's token."""
    token = st.session_state.get(TOKEN_KEY)
    injected: Api | None = st.session_state.get(CLIENT_KEY)
    if injected is not None:
        if token and injected.token != token:
            injected.token = token
        return injected
    built: ApiClient | None = st.session_state.get(_BUILT_CLIENT_KEY)
    if built is None or built.base_url != api_root(api_url()) or (token and built.token != token):
        if built is not None:
            built.close()
        # The browser's address (None on this machine's own loopback) with the key the API
        # shares: each browser has its own rate limit there (dynaloop/api/ratelimit.py).
        built = ApiClient(
            api_url(),
            token,
            # One connection pool for every session of this process (frontend/client.py).
            transport=SharedTransport(),
            on_behalf_of=browser_address(),
            web_app_key=os.environ.get(WEB_APP_KEY_ENV) or None,
        )
        st.session_state[_BUILT_CLIENT_KEY] = built
    return built


def login(token: str, user: User) -> None:
    """Remember who signed in; the next :func:`get_client` sends their token."""
    st.session_state[TOKEN_KEY] = token
    st.session_state[USER_KEY] = dict(user)
    st.session_state[ROLES_KEY] = list(user.get("roles") or [])
    get_client().token = token


def session_cookie() -> sessions.Session | None:
    """The session the browser's cookie holds (set by ``/login``), if any. The cookie proves
    nothing by itself: :func:`restore_session` asks the API who the token belongs to."""
    try:
        cookies = st.context.cookies
    except Exception:  # no browser behind this run (a bare script run)
        return None
    return sessions.parse_session(cookies.get(sessions.COOKIE_NAME))


def restore_session() -> None:
    """Sign in with the browser's session cookie: once per Streamlit session (and after a
    :func:`logout`), ``GET /me`` with its token. A refused token (expired, revoked) or an API
    that does not answer leaves the user signed out, with the reason in ``session_problem``."""
    if is_logged_in():
        return
    session = session_cookie()
    if session is None or st.session_state.get(_COOKIE_TRIED_KEY) == session.token:
        return
    st.session_state[_COOKIE_TRIED_KEY] = session.token
    client = get_client()
    client.token = session.token
    try:
        user = client.me()
    except ApiError as error:
        client.token = None
        st.session_state[SESSION_PROBLEM_KEY] = error.message
        return
    st.session_state.pop(SESSION_PROBLEM_KEY, None)
    login(session.token, user)


def base_path() -> str:
    """The app's base path (``server.baseUrlPath``): ``""`` or ``"/dl"``."""
    return sessions.base_path(st.get_option("server.baseUrlPath"))


def login_link(page: str = "") -> str:
    """``/login?next=/<page>``: where a signed-out user logs in to come back to ``page``."""
    base = base_path()
    return sessions.login_url(base, sessions.safe_next(f"{base}/{page}", base))


def logout() -> None:
    """Forget the user and everything the pages kept for them (the injected client stays).
    The browser's cookie is ``POST /logout``'s to clear (frontend/web.py); a later run tries it
    again once (:func:`restore_session`)."""
    built = st.session_state.get(_BUILT_CLIENT_KEY)
    if built is not None:
        built.close()
    injected = st.session_state.get(CLIENT_KEY)
    if injected is not None:
        injected.token = None
    for key in list(st.session_state.keys()):
        if key != CLIENT_KEY:
            del st.session_state[key]


def is_logged_in() -> bool:
    return bool(st.session_state.get(TOKEN_KEY))


def current_user() -> User | None:
    return st.session_state.get(USER_KEY)


def roles() -> list[str]:
    return list(st.session_state.get(ROLES_KEY) or [])


def has_role(*wanted: str) -> bool:
    """An admin passes every role check, as in the API."""
    mine = roles()
    return "admin" in mine or any(role in mine for role in wanted)


def require_role(*wanted: str) -> Api:
    """The guard at the top of each page: stop unless the user is signed in with one of
    ``wanted``; returns the API client."""
    if not is_logged_in():
        st.warning("Log in first.")
        st.stop()
    if not has_role(*wanted):
        st.error(f"This page needs the {' or '.join(wanted)} role; your roles: {', '.join(roles()) or 'none'}.")
        st.stop()
    return get_client()


def flash(kind: FlashKind, message: str) -> None:
    """Show ``message`` (Markdown: escape user text in it) once, at the top of the page,
    after the next rerun."""
    st.session_state[FLASH_KEY] = (kind, message)


def show_flash() -> None:
    pending = st.session_state.pop(FLASH_KEY, None)
    if pending:
        kind, message = pending
        getattr(st, kind)(message)


def show_api_error(error: ApiError) -> None:
    """Show the API's message as it is; a 401 (an expired or revoked token) offers to log in again.
    An error on the service's side (no answer, a 5xx) ends with its reference, the request id the
    API and the web app logged it under, for the worker to quote to the researchers."""
    if error.status == 401:
        render.alert("error", error.message)
        if st.button("Log in again", key="state_relogin"):
            logout()
            st.session_state[_COOKIE_TRIED_KEY] = (session_cookie() or sessions.Session("token", "")).token
            st.session_state[SESSION_PROBLEM_KEY] = error.message
            st.rerun()
    else:
        render.alert("warning" if error.status in (0, 503) else "error", error.shown)


def task_definition(client: Api, name: str) -> Task:
    """``GET /tasks/{name}``, once per session (a task's definition never changes)."""
    cache: dict[str, Task] = st.session_state.setdefault(_TASK_CACHE_KEY, {})
    if name not in cache:
        cache[name] = client.task(name)
    return cache[name]


def session_cached(
    client: Api, key: str, fetch: Callable[[], T], *, after_writes: bool = True, ttl_s: float = SESSION_CACHE_TTL_S
) -> T:
    """``fetch()``'s answer, kept in this browser session for ``ttl_s`` seconds, so a page does not
    ask the API again on every rerun (each click reruns the page) for what others change
    rarely: the open rounds, the user's study sessions.

    The answer is fetched again for another token, once the client has met an API error since
    (an error may come from an answer that is out of date: a round closed meanwhile), and, with
    ``after_writes``, once it has sent a write since (the user's own writes change what it
    holds: a submission counts towards their study's quota). An :class:`ApiError` of ``fetch``
    is raised, and nothing is kept."""
    cache: dict[str, tuple[float, tuple[int, int], str | None, object]] = st.session_state.setdefault(
        _SESSION_CACHE_KEY, {}
    )

    def marks() -> tuple[int, int]:
        return (client.writes if after_writes else 0, client.errors)

    held = cache.get(key)
    now = time.monotonic()
    if held is not None:
        fetched_at, seen, token, value = held
        if now - fetched_at < ttl_s and seen == marks() and token == client.token:
            return value  # type: ignore[return-value]
    value = fetch()
    cache[key] = (now, marks(), client.token, value)
    return value
