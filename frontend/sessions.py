"""The browser's session: the cookie that holds the API token, and the app's own addresses.

The API's token is kept in one cookie, ``dynaloop_session``: httpOnly (page scripts cannot read
it), ``SameSite=Lax``, ``Secure`` over HTTPS, on the app's base path, and it lives exactly as
long as the API token (``GET /me/token`` tells its expiry). The Streamlit script reads the
cookie (``st.context.cookies``) and asks the API who it belongs to (``frontend/state.py``); the
cookie is never trusted beyond what the API says. An MTurk study session's cookie is partitioned
and ``SameSite=None`` so that the browser sends it inside MTurk's cross-site frame
(:func:`set_session_cookie`; docs/crowdsourcing.md, "Inside MTurk's frame").
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Literal, NamedTuple
from urllib.parse import quote, urlsplit

from starlette.requests import Request
from starlette.responses import Response

__all__ = [
    "COOKIE_NAME",
    "Session",
    "SessionKind",
    "SignedIn",
    "base_path",
    "clear_session_cookie",
    "cookie_max_age",
    "login_url",
    "parse_session",
    "safe_next",
    "set_session_cookie",
]

COOKIE_NAME = "dynaloop_session"
MAX_TOKEN = 256
MAX_NEXT = 2000
# A cookie for a token without an expiry lives this long; a login's token has one (7 days).
NO_EXPIRY_MAX_AGE_S = 30 * 24 * 3600
TOKEN_RE = re.compile(rf"[A-Za-z0-9_\-]{{1,{MAX_TOKEN}}}")

# "mturk": a study session of an MTurk link, whose cookie works inside MTurk's frame.
SessionKind = Literal["login", "token", "mturk"]


class Session(NamedTuple):
    """What the cookie holds: the API token, and whether a password login made it (then logout
    revokes it) or the user pasted it (then it is theirs to keep; logout only forgets it)."""

    kind: SessionKind
    token: str

    def cookie_value(self) -> str:
        return f"{self.kind}.{self.token}"


def parse_session(value: object) -> Session | None:
    """The session in a cookie value, or None for a missing or malformed one."""
    if not isinstance(value, str) or not value or len(value) > MAX_TOKEN + 8:
        return None
    kind, _, token = value.partition(".")
    if kind not in ("login", "token", "mturk") or not TOKEN_RE.fullmatch(token):
        return None
    return Session(kind, token)  # type: ignore[arg-type]


def base_path(configured: str | None) -> str:
    """Streamlit's ``server.baseUrlPath`` as a path prefix: ``""`` or ``"/dl"``."""
    stripped = (configured or "").strip("/")
    return f"/{stripped}" if stripped else ""


def safe_next(value: str | None, base: str) -> str:
    """``value`` if it is a path of this app (``/dashboard?x=1``), else the app's start page.

    Refused: other hosts (``//evil``, ``https://evil``, ``/\\evil``), backslashes, control
    characters and spaces, paths outside the base path, the login and logout pages, and
    anything longer than :data:`MAX_NEXT`."""
    home = f"{base}/"
    if not value or len(value) > MAX_NEXT or not value.startswith("/") or value.startswith("//"):
        return home
    if "\\" in value or any(ord(c) < 33 or ord(c) == 127 for c in value):
        return home
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or not parts.path.startswith("/"):
        return home
    if base and parts.path != base and not parts.path.startswith(f"{base}/"):
        return home
    if parts.path.rstrip("/") in (f"{base}/login", f"{base}/logout"):
        return home
    return value


def login_url(base: str, next_path: str) -> str:
    return f"{base}/login?next={quote(next_path, safe='/')}"


class SignedIn(NamedTuple):
    session: Session
    max_age_s: int


def cookie_max_age(expires_at: str | None) -> int:
    """The session cookie's Max-Age for a token expiring at ``expires_at`` (ISO 8601, the API's),
    at most :data:`NO_EXPIRY_MAX_AGE_S`; 0 or less for a token that has expired."""
    return min(_expiry_seconds(expires_at, dt.datetime.now(dt.UTC)), NO_EXPIRY_MAX_AGE_S)


def _expiry_seconds(expires_at: str | None, now: dt.datetime) -> int:
    if expires_at is None:
        return NO_EXPIRY_MAX_AGE_S
    expires = dt.datetime.fromisoformat(expires_at)
    if expires.tzinfo is None:  # the API writes UTC
        expires = expires.replace(tzinfo=dt.UTC)
    return int((expires - now).total_seconds())


def _secure(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").lower() == "https"


def set_session_cookie(response: Response, request: Request, base: str, signed_in: SignedIn) -> None:
    """The session cookie: httpOnly, on the app's path, ``SameSite=Lax`` (and ``Secure`` over HTTPS).

    An MTurk study session's cookie is ``SameSite=None; Secure; Partitioned`` instead: MTurk
    shows the task in a frame on its own site, and a browser sends no ``Lax`` cookie to a frame
    whose page is another site, so the worker would never be signed in there. ``Partitioned``
    (CHIPS) keeps the cookie to the site at the top of the tab that got it: the browser sends it
    only while MTurk's site is at the top of the tab (or, for a worker who opens the task in a
    tab of its own, this app's), so a page of any other site never gets it sent along. A page
    inside MTurk's own (another requester's HIT) could, which is why the app's own POSTs still
    need its own origin (:func:`same_origin`) and Streamlit refuses a websocket whose origin is
    not its own (``server.enableCORS``, on by default). Chromium keeps a third-party cookie only if it is
    partitioned once third-party cookies are blocked, which is why this is CHIPS and not a
    plain ``SameSite=None`` cookie. Browsers require ``Secure`` with ``SameSite=None`` (and with
    ``Partitioned``); they accept it over plain http only from localhost or 127.0.0.1, so a
    deployment serves study links over HTTPS (MTurk requires it of an ExternalQuestion anyway).
    """
    framed = signed_in.session.kind == "mturk"
    # The other kind of session cookie (partitioned or not) is forgotten first: the browser keeps
    # the two apart, and would send both under one name (a researcher trying their own MTurk link).
    clear_session_cookie(response, request, base, "login" if framed else "mturk")
    response.set_cookie(
        COOKIE_NAME,
        signed_in.session.cookie_value(),
        max_age=signed_in.max_age_s,
        path=base or "/",
        secure=framed or _secure(request),
        httponly=True,
        samesite="none" if framed else "lax",
    )
    if framed:
        _partition_last_cookie(response)


def _partition_last_cookie(response: Response) -> None:
    """Add ``Partitioned`` to the ``Set-Cookie`` header just set. By hand: Starlette's
    ``set_cookie(partitioned=True)`` needs Python 3.14's http.cookies, and this runs on 3.11."""
    for index in range(len(response.raw_headers) - 1, -1, -1):
        name, value = response.raw_headers[index]
        if name == b"set-cookie":
            response.raw_headers[index] = (name, value + b"; Partitioned")
            return
    raise AssertionError("no Set-Cookie header to partition")


def clear_session_cookie(response: Response, request: Request, base: str, kind: SessionKind | None = None) -> None:
    """Forget the session cookie; a partitioned one (``kind`` "mturk") is deleted only by a
    ``Set-Cookie`` that is partitioned too."""
    framed = kind == "mturk"
    response.delete_cookie(
        COOKIE_NAME,
        path=base or "/",
        secure=framed or _secure(request),
        httponly=True,
        samesite="none" if framed else "lax",
    )
    if framed:
        _partition_last_cookie(response)
