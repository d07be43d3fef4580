"""The web app's HTTP side: the login and logout pages, the session cookie, and the gate in
front of every page (``frontend/server.py`` mounts them on Streamlit's own server).

A browser signs in at ``/login`` (a password, or an API token pasted instead). The API's
token is kept in one cookie, ``dynaloop_session``: httpOnly (page scripts cannot read it),
``SameSite=Lax``, ``Secure`` over HTTPS, on the app's base path, and it lives exactly as long
as the API token (``GET /me/token`` tells its expiry). The Streamlit script reads the cookie
(``st.context.cookies``) and asks the API who it belongs to (``frontend/state.py``); the
cookie is never trusted beyond what the API says. ``POST /logout`` revokes a login's token in
the API and clears the cookie.

Every page load (a GET of an app page such as ``/dashboard``) passes the gate
(:class:`SessionGate`): without a cookie, or with one the API no longer accepts, the browser is
sent to ``/login?next=/dashboard`` and lands on ``/dashboard`` after logging in; a page of a
role the user lacks gets a page saying so. Streamlit's own routes (``/_stcore/``, ``/static/``,
``/media/``, ``/component/``) and files (a last path segment with a dot) pass untouched.

Crowdworkers arrive through a study link instead (``/study/{slug}`` with their platform's
parameters): the API starts or resumes their study session and gives a token, which goes into
the same cookie; ``/study/finish`` ends the session and hands them back to the platform, to
Prolific's or MTurk's own addresses only (docs/frontend.md, "Study links").

Requests are bounded (a form body of at most :data:`MAX_FORM_BYTES`, fields no longer than
the API accepts), a POST must come from the app's own origin (``Origin`` or ``Referer``), the
``next`` address must be a path of this app, and every piece of user text on a page is escaped.

MTurk shows a study link in a frame on its worker site (an ExternalQuestion). Pages are
unframeable (``X-Frame-Options: DENY`` and ``frame-ancestors 'none'``) except those of an MTurk
study session, which MTurk's worker hosts only may frame (:class:`Framing`,
``$DYNALOOP_MTURK_FRAME_ANCESTORS``); that session's cookie is partitioned and
``SameSite=None`` so that the browser sends it inside the cross-site frame
(:func:`set_session_cookie`; docs/crowdsourcing.md, "Inside MTurk's frame").
"""

from __future__ import annotations

import datetime as dt
import html
import ipaddress
import os
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple
from urllib.parse import parse_qs, quote, urlsplit

from anyio import to_thread
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from frontend import forwarded
from frontend.client import ApiClient, ApiError, Completion, SharedTransport, StudySession, StudyStart

COOKIE_NAME = "dynaloop_session"
MAX_FORM_BYTES = 8 * 1024
MAX_USERNAME = 64  # api/schemas/auth.py LoginRequest
MAX_PASSWORD = 200
MAX_TOKEN = 256
MAX_NEXT = 2000
# A cookie for a token without an expiry lives this long; a login's token has one (7 days).
NO_EXPIRY_MAX_AGE_S = 30 * 24 * 3600
API_TIMEOUT_S = 15.0
# The routes Streamlit serves itself (streamlit/web/server/starlette/starlette_app.py
# _RESERVED_ROUTE_PREFIXES, plus static file serving); a page load never starts with them.
STREAMLIT_PREFIXES = ("/_stcore/", "/static/", "/media/", "/component/", "/app/static/")
_TOKEN_RE = re.compile(rf"[A-Za-z0-9_\-]{{1,{MAX_TOKEN}}}")
# Study links (docs/frontend.md, "Study links"): the slug as the API makes it (StudyLink.slug,
# at most 64 characters) and the platform's query parameters as the API takes them.
_SLUG_RE = re.compile(r"[A-Za-z0-9_\-]{1,64}")
MAX_STUDY_PARAMS = 20
MAX_STUDY_PARAM_NAME = 64
MAX_STUDY_PARAM_VALUE = 200
MAX_STUDY_QUERY = 8 * 1024
MAX_COMPLETION_FIELDS = 20
# Where a completion may send the worker: Prolific's completion page, and MTurk's external
# submit on its two hosts (or the admin's $DYNALOOP_MTURK_SUBMIT_ORIGINS, the API's setting of
# the same name). Anything else the API says is refused, not followed.
PROLIFIC_COMPLETION_PREFIX = "https://app.prolific.com/"
MTURK_SUBMIT_ORIGINS_ENV = "DYNALOOP_MTURK_SUBMIT_ORIGINS"
DEFAULT_MTURK_SUBMIT_ORIGINS = ("https://www.mturk.com", "https://workersandbox.mturk.com")
# The hosts of MTurk's worker site that show an ExternalQuestion in their frame: the worker site
# and its sandbox (the addresses MTurk's requester docs give for previewing HITs), and
# www.mturk.com, the older worker site that MTurk's docs still name as turkSubmitTo.
MTURK_FRAME_ANCESTORS_ENV = "DYNALOOP_MTURK_FRAME_ANCESTORS"
DEFAULT_MTURK_FRAME_ANCESTORS = ("https://worker.mturk.com", "https://workersandbox.mturk.com", "https://www.mturk.com")
# The parameters MTurk appends to an ExternalQuestion's address (services/domain/study.py).
MTURK_LINK_PARAMS = ("assignmentId", "hitId")

# "mturk": a study session of an MTurk link, whose cookie works inside MTurk's frame.
SessionKind = Literal["login", "token", "mturk"]


class PageRoles(NamedTuple):
    title: str
    roles: tuple[str, ...]


# The app's pages by url path (frontend/app.py ROLE_PAGES builds its navigation from the same
# table), so the gate can say which role a deep link needs.
PAGE_ROLES: dict[str, PageRoles] = {
    "write": PageRoles("Write", ("writer",)),
    "validate": PageRoles("Validate", ("validator",)),
    "rounds": PageRoles("Tasks and rounds", ("researcher",)),
    "dashboard": PageRoles("Dashboard", ("researcher",)),
    "models": PageRoles("Models and datasets", ("researcher",)),
    "crowd": PageRoles("Crowd", ("researcher",)),
}


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
    if kind not in ("login", "token", "mturk") or not _TOKEN_RE.fullmatch(token):
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


# --- framing: who may show a page in a frame ------------------------------------------------

MAX_ORIGINS = 10
MAX_ORIGIN_CHARS = 200
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# A host name (letters, digits, hyphens, dots: no wildcard, no CSP syntax) or an IPv6 address.
_HOST_RE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*|[0-9a-f:.]+")


def _loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_origins(value: str | Iterable[str], setting: str) -> tuple[str, ...]:
    """The web app's copy of services/origins.py ``parse_origins`` (tests/test_web_study.py
    checks that both answer alike): origins written ``scheme://host[:port]``, https only (plain
    http only on a loopback host, which browsers treat as secure), at most :data:`MAX_ORIGINS`;
    a :class:`ValueError` names ``setting`` and the entry that is wrong."""
    items = value.replace(",", " ").split() if isinstance(value, str) else [item.strip() for item in value]
    origins: list[str] = []
    for item in items:
        if not item:
            continue
        problem = None
        try:
            parts = urlsplit(item)
            port = parts.port
        except ValueError:
            parts, port, problem = None, None, "is not an address"
        if parts is not None:
            host = (parts.hostname or "").lower()
            if len(item) > MAX_ORIGIN_CHARS or any(ord(c) < 33 or ord(c) == 127 or c in "\\<>\"'" for c in item):
                problem = "is not an address"
            elif parts.scheme not in ("https", "http") or not _HOST_RE.fullmatch(host):
                problem = "is not an http(s) origin with a host name or address"
            elif parts.scheme == "http" and not _loopback(host):
                problem = "is not https (plain http only on localhost, 127.0.0.1 or ::1)"
            elif parts.username is not None or parts.password is not None:
                problem = "names a user"
            elif parts.path not in ("", "/") or parts.query or parts.fragment or item.endswith(("?", "#")):
                problem = "has a path, query or fragment: give scheme://host[:port] only"
        if problem is not None:
            raise ValueError(
                f"{setting}: {item[:80]!r} {problem}; give origins such as https://worker.mturk.com, "
                "separated by commas or spaces"
            )
        assert parts is not None
        netloc = host if port is None else f"{host}:{port}"
        if ":" in host:  # IPv6
            netloc = f"[{host}]" if port is None else f"[{host}]:{port}"
        origin = f"{parts.scheme}://{netloc}"
        if origin not in origins:
            origins.append(origin)
    if len(origins) > MAX_ORIGINS:
        raise ValueError(f"{setting}: at most {MAX_ORIGINS} origins")
    return tuple(origins)


@dataclass(frozen=True)
class Framing:
    """Who may frame the pages of an MTurk study session, and where its assignment is posted
    back. ``mturk_frame_ancestors``: MTurk's worker hosts (``$DYNALOOP_MTURK_FRAME_ANCESTORS``;
    empty: not even MTurk may frame them, and workers must open the task in its own tab);
    ``mturk_submit_origins``: ``$DYNALOOP_MTURK_SUBMIT_ORIGINS``, the API's setting of the same
    name. A test names its own fake MTurk origin (http on localhost) in both."""

    mturk_frame_ancestors: tuple[str, ...] = DEFAULT_MTURK_FRAME_ANCESTORS
    mturk_submit_origins: tuple[str, ...] = DEFAULT_MTURK_SUBMIT_ORIGINS

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Framing:
        env = os.environ if environ is None else environ
        ancestors = env.get(MTURK_FRAME_ANCESTORS_ENV)
        submit = env.get(MTURK_SUBMIT_ORIGINS_ENV)
        submit_origins = (
            DEFAULT_MTURK_SUBMIT_ORIGINS if submit is None else parse_origins(submit, MTURK_SUBMIT_ORIGINS_ENV)
        )
        if not submit_origins:
            raise ValueError(f"{MTURK_SUBMIT_ORIGINS_ENV} is empty; name MTurk's hosts (the default)")
        return cls(
            DEFAULT_MTURK_FRAME_ANCESTORS if ancestors is None else parse_origins(ancestors, MTURK_FRAME_ANCESTORS_ENV),
            submit_origins,
        )


_FRAME_ANCESTORS_RE = re.compile(r";?\s*frame-ancestors[^;]*")


def _with_frame_ancestors(csp: str, sources: str) -> str:
    return f"{_FRAME_ANCESTORS_RE.sub('', csp).strip().rstrip(';')}; frame-ancestors {sources}".lstrip("; ")


def set_frame_policy(headers: MutableHeaders, ancestors: tuple[str, ...] = ()) -> None:
    """Who may show this answer in a frame.

    No one (``ancestors`` empty): ``X-Frame-Options: DENY`` for old browsers and
    ``frame-ancestors 'none'``, which every browser with CSP level 2 obeys over the other.

    MTurk's worker hosts (``ancestors``) only: ``frame-ancestors`` lists them, and there is no
    ``X-Frame-Options`` (it cannot name a host, and ``DENY`` would block MTurk in the browsers
    that do not know frame-ancestors). A browser too old for CSP's frame-ancestors (Internet
    Explorer) lets any site frame these pages; they are a study session's own, with nothing to
    trick the worker into but their own task."""
    if not ancestors:
        headers["X-Frame-Options"] = "DENY"
        sources = "'none'"
    else:
        if "X-Frame-Options" in headers:
            del headers["X-Frame-Options"]
        sources = " ".join(ancestors)
    headers["Content-Security-Policy"] = _with_frame_ancestors(headers.get("Content-Security-Policy", ""), sources)


def deny_framing(response: Response) -> Response:
    set_frame_policy(response.headers)
    return response


# --- pages --------------------------------------------------------------------------------

_STYLE = """
body { font-family: "Source Sans Pro", system-ui, sans-serif; margin: 0; background: #fff; color: #31333f; }
main { max-width: 26rem; margin: 4rem auto; padding: 0 1rem; }
h1 { font-size: 2.2rem; margin-bottom: .25rem; }
label { display: block; margin: .9rem 0 .3rem; font-size: .9rem; }
input { width: 100%; box-sizing: border-box; padding: .55rem; font-size: 1rem; border: 1px solid #ccc;
        border-radius: .4rem; background: #f0f2f6; }
button { margin-top: 1rem; padding: .5rem 1rem; font-size: 1rem; border-radius: .4rem; border: 1px solid #ff4b4b;
         background: #ff4b4b; color: #fff; cursor: pointer; }
details { margin-top: 2rem; } summary { cursor: pointer; }
details button { background: #fff; color: #31333f; border-color: #ccc; }
.error { background: #ffe5e5; color: #7d1a1a; padding: .7rem; border-radius: .4rem; margin: 1rem 0; }
.notice { background: #e8f4ff; color: #0c4a7a; padding: .7rem; border-radius: .4rem; margin: 1rem 0; }
.muted { font-size: .8rem; color: #666; margin-top: 2rem; }
"""


DEFAULT_CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'"


def _page(title: str, body: str, status: int = 200, csp: str = DEFAULT_CSP) -> HTMLResponse:
    markup = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>"
    )
    response = HTMLResponse(markup, status_code=status)
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = csp
    response.headers["Referrer-Policy"] = "same-origin"
    deny_framing(response)
    return response


def login_page(
    base: str,
    next_path: str,
    api_url: str,
    *,
    error: str | None = None,
    notice: str | None = None,
    username: str = "",
    status: int = 200,
) -> HTMLResponse:
    e = html.escape
    action = e(f"{base}/login")
    hidden_next = f'<input type="hidden" name="next" value="{e(next_path)}">'
    body = (
        "<h1>dynaloop</h1>"
        "<p>Adversarial data collection: write sentences that fool the model, or label what others wrote.</p>"
        + (f'<div class="notice" role="status">{e(notice)}</div>' if notice else "")
        + (f'<div class="error" role="alert">{e(error)}</div>' if error else "")
        + f'<form method="post" action="{action}">{hidden_next}'
        '<input type="hidden" name="kind" value="password">'
        '<label for="username">Username</label>'
        f'<input id="username" name="username" aria-label="Username" autocomplete="username" required '
        f'maxlength="{MAX_USERNAME}" value="{e(username)}" autofocus>'
        '<label for="password">Password</label>'
        f'<input id="password" name="password" type="password" aria-label="Password" '
        f'autocomplete="current-password" required maxlength="{MAX_PASSWORD}">'
        '<button type="submit">Log in</button></form>'
        "<details><summary>Use an API token instead</summary>"
        "<p>Tokens come from <code>dynaloop user token NAME</code> or from an admin; they start with "
        "<code>dl_</code>. Logging out forgets a pasted token in this browser but does not revoke it.</p>"
        f'<form method="post" action="{action}">{hidden_next}'
        '<input type="hidden" name="kind" value="token">'
        '<label for="api_token">API token</label>'
        f'<input id="api_token" name="token" type="password" aria-label="API token" required '
        f'maxlength="{MAX_TOKEN}" autocomplete="off">'
        '<button type="submit">Use this token</button></form></details>'
        f'<p class="muted">API: {e(api_url)}</p>'
    )
    return _page("Log in - dynaloop", body, status)


def message_page(title: str, message: str, link: str, link_text: str, status: int) -> HTMLResponse:
    e = html.escape
    body = (
        f'<h1>{e(title)}</h1><div class="error" role="alert">{e(message)}</div>'
        f'<p><a href="{e(link)}">{e(link_text)}</a></p>'
    )
    return _page(f"{title} - dynaloop", body, status)


# --- study links: what a crowdworker meets --------------------------------------------------


def _plain_url(value: object, prefixes: tuple[str, ...]) -> str | None:
    """``value`` if it is an address under one of ``prefixes`` with nothing odd in it, else None.
    Only https, except under a plain-http prefix (an admin's loopback origin, for tests)."""
    if not isinstance(value, str) or len(value) > MAX_NEXT or not value.startswith(prefixes):
        return None
    if any(ord(c) < 33 or ord(c) == 127 or c in "\\<>\"'" for c in value):
        return None
    parts = urlsplit(value)
    http_allowed = value.startswith(tuple(prefix for prefix in prefixes if prefix.startswith("http://")))
    if parts.scheme != "https" and not (parts.scheme == "http" and http_allowed):
        return None
    if parts.username is not None or parts.password is not None:
        return None
    return value


def study_preview_page(preview: StudyStart) -> HTMLResponse:
    """MTurk's preview (the worker has not accepted the HIT): the task, read-only."""
    e = html.escape
    task = preview.get("task") or {}
    link = preview.get("link") or {}
    role = str(link.get("role") or "")
    unit = "examples to write" if role == "writer" else "batches of examples to label"
    body = (
        f"<h1>{e(str(task.get('title') or task.get('name') or 'A dynaloop study'))}</h1>"
        f"<p>{e(str(task.get('description') or ''))}</p>"
        f"<p>Your part: <strong>{e(role or 'worker')}</strong>, {e(str(link.get('quota') or '?'))} {unit}.</p>"
        '<div class="notice" role="status">This is a preview. Accept the HIT to start.</div>'
    )
    return _page("Preview - dynaloop", body)


def _code_block(code: str) -> str:
    e = html.escape
    return (
        '<p style="font-size: 2rem; font-family: monospace; letter-spacing: .1rem; user-select: all;" '
        f'aria-label="Completion code">{e(code)}</p>'
        "<p>Copy this code (select it and copy) into the study's page on your platform.</p>"
    )


def completion_page(
    completion: Completion, base: str, mturk_submit_origins: tuple[str, ...] = DEFAULT_MTURK_SUBMIT_ORIGINS
) -> Response:
    """The end of a study session on its platform: a redirect to Prolific, a form that posts back
    to MTurk (on one of ``mturk_submit_origins``), or the code to copy; an address outside the
    platforms' own is refused."""
    e = html.escape
    status = completion.get("status")
    code = completion.get("code")
    screened_out = status == "screened_out"
    # A stopped session is not a completed one: without the link's partial code there is no code
    # at all, and the worker returns the submission on the platform.
    stopped = status == "stopped"
    title = (
        "This study is not for you this time"
        if screened_out
        else "Your session has ended"
        if stopped and not code
        else "Thank you"
    )
    intro = (
        "<p>You did not qualify for this study. Thank you for your time.</p>"
        if screened_out
        else "<p>You stopped before the study's quota: this is not a completed submission. Please return "
        "it on your platform (on Prolific: Return submission); do not submit it as completed.</p>"
        if stopped and not code
        else "<p>Your study session has ended. Thank you!</p>"
    )
    message = completion.get("message")
    if isinstance(message, str) and message:
        intro += f'<div class="notice" role="status">{e(message[:500])}</div>'

    redirect_url = completion.get("redirect_url")
    if redirect_url is not None:
        target = _plain_url(redirect_url, (PROLIFIC_COMPLETION_PREFIX,))
        if target is not None:
            response = RedirectResponse(target, status_code=303)
            response.headers["Cache-Control"] = "no-store"
            response.headers["Referrer-Policy"] = "no-referrer"
            return response
        # Not Prolific's address: the code (if any) is still the worker's, the address is not followed.
    form = completion.get("form")
    if form is not None:
        action = _plain_url(form.get("action"), tuple(f"{origin}/" for origin in mturk_submit_origins))
        fields = form.get("fields")
        if action is None or not isinstance(fields, dict) or len(fields) > MAX_COMPLETION_FIELDS:
            return message_page(
                "Completion refused",
                "The completion form points somewhere other than Mechanical Turk; it was not shown. "
                "Tell the study's researcher.",
                f"{base}/",
                "Go to the app",
                502,
            )
        hidden = "".join(
            f'<input type="hidden" name="{e(str(name))}" value="{e(str(value))}">' for name, value in fields.items()
        )
        body = (
            f"<h1>{e(title)}</h1>{intro}"
            "<p>Submit the HIT to Mechanical Turk to get paid.</p>"
            f'<form method="post" action="{e(action)}">{hidden}<button type="submit">Submit the HIT</button></form>'
            + (_code_block(code) if code else "")
        )
        origin = "{0.scheme}://{0.netloc}".format(urlsplit(action))
        csp = f"default-src 'none'; style-src 'unsafe-inline'; form-action {origin}"
        return _page("Submit the HIT - dynaloop", body, csp=csp)
    if code:
        return _page(f"{title} - dynaloop", f"<h1>{e(title)}</h1>{intro}{_code_block(code)}")
    if screened_out:
        return _page(
            f"{title} - dynaloop", f"<h1>{e(title)}</h1>{intro}<p>You may return the study on your platform.</p>"
        )
    if stopped:
        return _page(f"{title} - dynaloop", f"<h1>{e(title)}</h1>{intro}")
    return _page(
        f"{title} - dynaloop",
        f"<h1>{e(title)}</h1>{intro}<p>This study has no completion code; tell the study's researcher.</p>",
    )


def finish_page(base: str, session: StudySession) -> HTMLResponse:
    """Confirm before ending a study session: the quota met, or stopping early (which is not a
    completion: no completion code), or, for a validator, the round out of work for them."""
    e = html.escape
    done, quota = int(session.get("units_done") or 0), int(session.get("quota") or 0)
    validator = session.get("role") == "validator"
    unit = "labels" if validator else "examples"
    met = session.get("status") != "active" or done >= quota
    reason = "quota" if met else "stop"
    progress = f"{done} of {quota} {unit} for this study"
    warning = (
        ""
        if met
        else '<div class="error" role="alert">You have not reached the quota yet. Stopping now ends your study '
        "session without the completion code (you cannot go on with it afterwards): you will be asked to "
        "return the submission, unless the study pays for partial work.</div>"
    )
    session_field = f'<input type="hidden" name="session_id" value="{int(session["id"])}">'
    action = e(f"{base}/study/finish")
    out_of_work = (
        f'<form method="post" action="{action}">{session_field}'
        '<input type="hidden" name="reason" value="out_of_work">'
        "<p>The Validate page has no more examples for you? The study ends with what you labelled.</p>"
        '<button type="submit">No more examples to label: finish</button></form>'
        if validator and not met
        else ""
    )
    body = (
        "<h1>Finish the study</h1>"
        f'<p role="status">{e(progress)}.</p>{warning}'
        f'<form method="post" action="{action}">{session_field}'
        f'<input type="hidden" name="reason" value="{reason}">'
        f'<button type="submit">{"Finish and get your completion code" if met else "Stop now"}</button></form>'
        f"{out_of_work}"
        f'<p><a href="{e(f"{base}/" if session.get("role") == "writer" else f"{base}/validate")}">'
        "Back to the task</a></p>"
    )
    # The answer to the form may redirect to Prolific's completion page (form-action covers it).
    csp = f"default-src 'none'; style-src 'unsafe-inline'; form-action 'self' {PROLIFIC_COMPLETION_PREFIX.rstrip('/')}"
    return _page("Finish the study - dynaloop", body, csp=csp)


def _study_params(request: Request) -> dict[str, str] | str:
    """The platform's query parameters, or what is wrong with them."""
    if len(request.url.query) > MAX_STUDY_QUERY:
        return f"The link's address is longer than {MAX_STUDY_QUERY} characters."
    items = request.query_params.multi_items()
    if len(items) > MAX_STUDY_PARAMS:
        return f"The link has more than {MAX_STUDY_PARAMS} parameters."
    params: dict[str, str] = {}
    for name, value in items:
        if not name or len(name) > MAX_STUDY_PARAM_NAME or len(value) > MAX_STUDY_PARAM_VALUE:
            return (
                f"A parameter's name has at most {MAX_STUDY_PARAM_NAME} characters and its value at most "
                f"{MAX_STUDY_PARAM_VALUE}."
            )
        if name in params:
            return f"The parameter {name} appears twice."
        params[name] = value
    return params


# --- the API, from a worker thread (frontend/client.py is synchronous) ---------------------


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


@dataclass(frozen=True)
class Backend:
    """The API as the HTTP routes use it; ``transport`` lets tests route it in process.

    ``web_app_key`` (``$DYNALOOP_WEB_APP_KEY``, the same as the API's) goes with the browser's
    address on every call, so the API counts failed logins and rate limits per browser, not
    for the web app as a whole (api/ratelimit.py); ``api_url`` is the admin's, never a user's."""

    api_url: str
    transport: Any = None
    web_app_key: str | None = None
    #: The proxies in front of the web app whose forwarded headers name the browser.
    trusted_proxies: tuple[forwarded.IPNetwork, ...] = ()

    def _client(self, token: str | None, browser: str | None) -> ApiClient:
        return ApiClient(
            self.api_url,
            token,
            timeout=API_TIMEOUT_S,
            # The process's one connection pool (frontend/client.py), unless a test routes it.
            transport=self.transport or SharedTransport(),
            on_behalf_of=browser,
            web_app_key=self.web_app_key,
        )

    def _sign_in(self, kind: SessionKind, username: str, secret: str, browser: str | None) -> SignedIn:
        with self._client(None, browser) as client:
            if kind == "login":
                client.login(username, secret)
            else:
                client.token = secret
            assert client.token is not None
            info = client.my_token()
            max_age = cookie_max_age(info["expires_at"])
            if max_age <= 0:
                raise ApiError(401, "unauthorized", "this token has expired")
            return SignedIn(Session(kind, client.token), max_age)

    async def sign_in(self, kind: SessionKind, username: str, secret: str, browser: str | None) -> SignedIn:
        return await to_thread.run_sync(self._sign_in, kind, username, secret, browser)

    def _roles(self, token: str, browser: str | None) -> list[str]:
        with self._client(token, browser) as client:
            return list(client.me().get("roles") or [])

    async def roles(self, token: str, browser: str | None) -> list[str]:
        return await to_thread.run_sync(self._roles, token, browser)

    def _revoke(self, token: str, browser: str | None) -> None:
        with self._client(token, browser) as client:
            client.revoke_token(client.my_token()["id"])

    async def revoke(self, token: str, browser: str | None) -> None:
        return await to_thread.run_sync(self._revoke, token, browser)

    def _start_study(self, slug: str, params: dict[str, str], browser: str | None) -> StudyStart:
        with self._client(None, browser) as client:
            return client.start_study_session(slug, params)

    async def start_study(self, slug: str, params: dict[str, str], browser: str | None) -> StudyStart:
        """``POST /study/{slug}/sessions`` without a token (the link is public)."""
        return await to_thread.run_sync(self._start_study, slug, params, browser)

    def _study_sessions(self, token: str, browser: str | None) -> list[StudySession]:
        with self._client(token, browser) as client:
            return client.my_study_sessions()

    async def study_sessions(self, token: str, browser: str | None) -> list[StudySession]:
        return await to_thread.run_sync(self._study_sessions, token, browser)

    def _finish_study(self, token: str, session_id: int, reason: str, browser: str | None) -> Completion:
        with self._client(token, browser) as client:
            return client.finish_study_session(session_id, reason)

    async def finish_study(self, token: str, session_id: int, reason: str, browser: str | None) -> Completion:
        return await to_thread.run_sync(self._finish_study, token, session_id, reason, browser)


def browser_address(request: Request, trusted: tuple[forwarded.IPNetwork, ...] = ()) -> str | None:
    """The browser's address: the socket peer, or, when the peer is one of the ``trusted``
    proxies (``$DYNALOOP_TRUSTED_PROXIES``), the address the proxy forwarded
    (frontend/forwarded.py)."""
    peer = request.client.host if request.client else None
    return forwarded.client_address(peer, request.headers.items(), trusted)


# --- requests -----------------------------------------------------------------------------


class FormError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form of at most :data:`MAX_FORM_BYTES` (read no further), one value a field."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise FormError(415, "send the form as application/x-www-form-urlencoded")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
        raise FormError(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_FORM_BYTES:
            raise FormError(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=10)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormError(400, "the form could not be read") from exc
    return {name: values[0] for name, values in fields.items() if values}


def same_origin(request: Request) -> bool:
    """Did the browser send this POST from a page of this app? ``Origin`` (or, without it,
    ``Referer``) must name this host; neither header, or ``Origin: null``, is refused."""
    source = request.headers.get("origin") or request.headers.get("referer")
    host = request.headers.get("host")
    if not source or not host or source == "null":
        return False
    return urlsplit(source).netloc.lower() == host.lower()


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


def _api_down_status(error: ApiError) -> int:
    return 503 if error.status in (0, 502, 503, 504) else 502


class WebSession:
    """The ``/login`` and ``/logout`` routes and the page gate of one app at ``base``."""

    def __init__(self, backend: Backend, base: str = "", framing: Framing | None = None) -> None:
        self.backend = backend
        self.base = base
        self.framing = framing or Framing()

    def frame_ancestors(self, mturk: bool) -> tuple[str, ...]:
        """Who may frame a page: MTurk's worker hosts for an MTurk study session's, no one else."""
        return self.framing.mturk_frame_ancestors if mturk else ()

    def frame_for(self, response: Response, mturk: bool) -> Response:
        """``response`` framed by MTurk's worker hosts only when it belongs to an MTurk study
        session (``mturk``), unframeable otherwise (:func:`set_frame_policy`)."""
        set_frame_policy(response.headers, self.frame_ancestors(mturk))
        return response

    def routes(self) -> list[Route]:
        return [
            Route(f"{self.base}/login", self.login, methods=["GET", "POST"]),
            Route(f"{self.base}/logout", self.logout, methods=["POST"]),
            Route(f"{self.base}/study/finish", self.study_finish, methods=["GET", "POST"]),
            Route(f"{self.base}/study/{{slug}}", self.study_start, methods=["GET"]),
            Route(f"{self.base}/study/{{rest:path}}", self.study_unknown, methods=["GET", "POST"]),
        ]

    async def login(self, request: Request) -> Response:
        base = self.base
        if request.method == "GET":
            notice = "You are logged out." if request.query_params.get("logged_out") == "1" else None
            if request.query_params.get("ended") == "1":
                notice = "Your session has ended; log in again."
            return login_page(
                base, safe_next(request.query_params.get("next"), base), self.backend.api_url, notice=notice
            )
        try:
            if not same_origin(request):
                raise FormError(403, "log in from this app's own login page")
            form = await read_form(request)
        except FormError as error:
            return login_page(base, f"{base}/", self.backend.api_url, error=error.message, status=error.status)
        next_path = safe_next(form.get("next"), base)
        kind = form.get("kind")
        username = form.get("username", "").strip()
        if kind == "password":
            secret = form.get("password", "")
            if not username or not secret:
                problem = "Enter your username and password."
            elif len(username) > MAX_USERNAME or len(secret) > MAX_PASSWORD:
                problem = f"A username has at most {MAX_USERNAME} characters and a password at most {MAX_PASSWORD}."
            else:
                problem = None
        elif kind == "token":
            username = ""
            secret = form.get("token", "").strip()
            problem = None if _TOKEN_RE.fullmatch(secret) else "Paste your API token (it starts with dl_)."
        else:
            secret, problem = "", "Choose how to log in."
        if problem:
            return login_page(base, next_path, self.backend.api_url, error=problem, username=username, status=400)
        try:
            signed_in = await self.backend.sign_in(
                "login" if kind == "password" else "token",
                username,
                secret,
                browser_address(request, self.backend.trusted_proxies),
            )
        except ApiError as error:
            status = error.status if error.status in (401, 403, 422, 429) else _api_down_status(error)
            response = login_page(
                base, next_path, self.backend.api_url, error=error.message, username=username, status=status
            )
            if error.status == 429 and error.retry_after is not None:
                response.headers["Retry-After"] = str(int(error.retry_after))
            return response
        redirect = RedirectResponse(next_path, status_code=303)
        set_session_cookie(redirect, request, base, signed_in)
        return redirect

    async def logout(self, request: Request) -> Response:
        base = self.base
        if not same_origin(request):
            return message_page(
                "Not logged out", "Log out from the app's own Log out button.", f"{base}/", "Back to the app", 403
            )
        session = parse_session(request.cookies.get(COOKIE_NAME))
        problem = None
        if session is not None and session.kind in ("login", "mturk"):
            try:
                await self.backend.revoke(session.token, browser_address(request, self.backend.trusted_proxies))
            except ApiError as error:
                if error.status != 401:  # 401: already expired or revoked
                    problem = error.message
        if problem is not None:
            response: Response = message_page(
                "Logged out of this browser",
                f"The API could not revoke the login's token ({problem}); it stops working when it expires.",
                f"{base}/login",
                "Log in",
                503,
            )
        else:
            response = RedirectResponse(f"{base}/login?logged_out=1", status_code=303)
        clear_session_cookie(response, request, base, session.kind if session else None)
        return response

    # --- study links ----------------------------------------------------------------------

    def _study_api_error(self, error: ApiError, retry_link: str) -> Response:
        if error.status in (404, 409, 410, 422, 429):
            titles = {404: "No such study", 409: "This study is not taking workers", 429: "Too many requests"}
            response = message_page(
                titles.get(error.status, "This study link does not work"),
                error.message,
                retry_link,
                "Try again",
                error.status,
            )
            if error.status == 429 and error.retry_after is not None:
                response.headers["Retry-After"] = str(int(error.retry_after))
            return response
        return message_page("The API is not answering", error.message, retry_link, "Try again", _api_down_status(error))

    async def study_unknown(self, request: Request) -> Response:
        """Any other address under ``/study/``: no study has it."""
        return message_page(
            "No such study", "This study link is not one of this app's.", f"{self.base}/", "Go to the app", 404
        )

    async def study_start(self, request: Request) -> Response:
        """``GET /study/{slug}?<the platform's parameters>``: a preview, or the worker signed in
        and sent to the task (the page takes them through the quiz first).

        The answer may be framed by MTurk's worker hosts when it is an MTurk link's (the API says
        the link's platform) or, where the API gave no link (a refusal), when the address carries
        MTurk's parameters: those answers are a message or a preview with nothing to click but a
        link, and the worker reads them inside MTurk's frame instead of an empty one."""
        response, platform = await self._study_start(request)
        if platform is None:
            mturk = all(request.query_params.get(name) for name in MTURK_LINK_PARAMS)
        else:
            mturk = platform == "mturk"
        return self.frame_for(response, mturk)

    async def _study_start(self, request: Request) -> tuple[Response, str | None]:
        """The answer to a study link and the link's platform, if the API named it."""
        base = self.base
        slug = request.path_params["slug"]
        if not _SLUG_RE.fullmatch(slug):
            return message_page(
                "No such study", "This study link is not one of this app's.", f"{base}/", "Go to the app", 404
            ), None
        params = _study_params(request)
        if isinstance(params, str):
            return message_page("This study link does not work", params, f"{base}/", "Go to the app", 422), None
        retry = f"{base}/study/{slug}" + (f"?{request.url.query}" if request.url.query else "")
        try:
            started = await self.backend.start_study(
                slug, params, browser_address(request, self.backend.trusted_proxies)
            )
        except ApiError as error:
            return self._study_api_error(error, retry), None
        link = started.get("link") or {}
        platform = str(link.get("platform") or "")
        if started.get("preview"):
            return study_preview_page(started), platform
        token = started.get("token")
        if not isinstance(token, str) or not _TOKEN_RE.fullmatch(token):
            return message_page("The API is not answering", "The API gave no token.", retry, "Try again", 502), platform
        max_age = cookie_max_age(started.get("expires_at"))
        session: dict[str, Any] = dict(started.get("session") or {})
        if session.get("status", "active") != "active":
            target = f"{base}/study/finish"
        else:
            # Straight to the worker's page: every page has an address of its own (frontend/app.py).
            role = session.get("role", link.get("role"))
            target = f"{base}/write" if role == "writer" else f"{base}/validate"
        response = RedirectResponse(target, status_code=303)
        response.headers["Cache-Control"] = "no-store"
        response.headers["Referrer-Policy"] = "no-referrer"
        if max_age > 0:
            kind: SessionKind = "mturk" if platform == "mturk" else "login"
            set_session_cookie(response, request, base, SignedIn(Session(kind, token), max_age))
        return response, platform

    async def study_finish(self, request: Request) -> Response:
        """``GET /study/finish``: confirm; ``POST /study/finish`` (from this app's own page): end
        the study session and hand the worker to the platform's completion. MTurk's worker hosts
        may frame it for an MTurk study session's cookie."""
        session = parse_session(request.cookies.get(COOKIE_NAME))
        response = await self._study_finish(request, session)
        return self.frame_for(response, session is not None and session.kind == "mturk")

    async def _study_finish(self, request: Request, session: Session | None) -> Response:
        base = self.base
        here = f"{base}/study/finish"
        if request.method == "POST":
            if not same_origin(request):
                return message_page(
                    "Not finished", "Finish from the app's own Finish page.", here, "Go to the Finish page", 403
                )
            try:
                form = await read_form(request)
            except FormError as error:
                return message_page("Not finished", error.message, here, "Go to the Finish page", error.status)
        if session is None:
            return RedirectResponse(login_url(base, here), status_code=303)
        browser = browser_address(request, self.backend.trusted_proxies)
        try:
            if request.method == "GET":
                sessions = await self.backend.study_sessions(session.token, browser)
                wanted = request.query_params.get("session")
                choices = [s for s in sessions if wanted is None or str(s.get("id")) == wanted]
                newest = sorted(choices, key=lambda s: str(s.get("started_at") or ""), reverse=True)
                current = next((s for s in newest if s.get("status") == "active"), None) or (
                    newest[0] if newest else None
                )
                if current is None:
                    return message_page(
                        "No study session", "You have no study session to finish.", f"{base}/", "Go to the app", 404
                    )
                if current.get("status") != "active" and current.get("completion"):
                    return completion_page(current["completion"], base, self.framing.mturk_submit_origins)  # type: ignore[arg-type]
                return finish_page(base, current)
            session_id, reason = form.get("session_id", ""), form.get("reason", "")
            if not session_id.isdigit() or len(session_id) > 18 or reason not in ("quota", "stop", "out_of_work"):
                return message_page(
                    "Not finished", "Finish from the Finish page's button.", here, "Go to the Finish page", 400
                )
            completion = await self.backend.finish_study(session.token, int(session_id), reason, browser)
        except ApiError as error:
            if error.status == 401:
                response = RedirectResponse(login_url(base, here) + "&ended=1", status_code=303)
                clear_session_cookie(response, request, base, session.kind)
                return response
            if error.status in (403, 404, 409, 422):
                return message_page("Not finished", error.message, here, "Go to the Finish page", error.status)
            return message_page("The API is not answering", error.message, here, "Try again", _api_down_status(error))
        return completion_page(completion, base, self.framing.mturk_submit_origins)

    # --- the gate -------------------------------------------------------------------------

    def page_name(self, path: str) -> str | None:
        """The app page a GET of ``path`` loads (``""`` for the start page), or None for
        Streamlit's own routes, files and the login and logout pages."""
        if self.base:
            if path == self.base:
                return ""
            if not path.startswith(f"{self.base}/"):
                return None
            path = path[len(self.base) :]
        if path.startswith(STREAMLIT_PREFIXES) or path.rstrip("/") in ("/login", "/logout"):
            return None
        if path.startswith("/study/"):  # the study routes (WebSession.routes) check for themselves
            return None
        last = path.rstrip("/").rsplit("/", 1)[-1]
        if "." in last:
            return None
        return path.strip("/")

    async def gate(self, request: Request) -> Response | None:
        """None to let the page load; otherwise the answer instead of it."""
        page = self.page_name(request.url.path)
        if page is None:
            return None
        wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        session = parse_session(request.cookies.get(COOKIE_NAME))
        if session is None:
            return RedirectResponse(login_url(self.base, safe_next(wanted, self.base)), status_code=303)
        try:
            roles = await self.backend.roles(session.token, browser_address(request, self.backend.trusted_proxies))
        except ApiError as error:
            if error.status == 401:
                response = RedirectResponse(
                    login_url(self.base, safe_next(wanted, self.base)) + "&ended=1", status_code=303
                )
                clear_session_cookie(response, request, self.base, session.kind)
                return response
            down = message_page(
                "The API is not answering",
                error.message,
                wanted if safe_next(wanted, self.base) == wanted else f"{self.base}/",
                "Try again",
                _api_down_status(error),
            )
            return self.frame_for(down, session.kind == "mturk")
        needed = PAGE_ROLES.get(page)
        if needed is not None and "admin" not in roles and not set(needed.roles) & set(roles):
            refused = message_page(
                f"{needed.title}: not for your roles",
                f"The {needed.title} page needs the {' or '.join(needed.roles)} role; "
                f"your roles: {', '.join(roles) or 'none'}. Ask an admin for the role.",
                f"{self.base}/",
                "Go to your pages",
                403,
            )
            return self.frame_for(refused, session.kind == "mturk")
        return None


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class SessionGate:
    """ASGI middleware: every GET or HEAD of an app page passes :meth:`WebSession.gate` first,
    and the page Streamlit then serves gets the frame policy of :meth:`WebSession.frame_for`
    (Streamlit's own answer says nothing about frames): MTurk's worker hosts may frame the
    pages of an MTurk study session, no one may frame anyone else's."""

    def __init__(self, app: ASGIApp, web: WebSession) -> None:
        self.app = app
        self.web = web

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            request = Request(scope, receive)
            answer = await self.web.gate(request)
            if answer is not None:
                await answer(scope, receive, send)
                return
            if self.web.page_name(request.url.path) is not None:
                session = parse_session(request.cookies.get(COOKIE_NAME))
                send = _framed_send(send, self.web.frame_ancestors(session is not None and session.kind == "mturk"))
        await self.app(scope, receive, send)


def _framed_send(send: Send, ancestors: tuple[str, ...]) -> Send:
    """``send`` that sets the frame policy (:func:`set_frame_policy`) on the answer's headers."""

    async def framed(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            set_frame_policy(MutableHeaders(scope=message), ancestors)
        await send(message)

    return framed
