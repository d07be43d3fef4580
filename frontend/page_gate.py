"""The page gate: every page load of the web app passes it first.

Every page load (a GET of an app page such as ``/dashboard``) passes the gate
(:class:`SessionGate`): without a session cookie, or with one the API no longer accepts, the
browser is sent to ``/login?next=/dashboard`` and lands on ``/dashboard`` after logging in; a
page of a role the user lacks gets a page saying so. Streamlit's own routes (``/_stcore/``,
``/static/``, ``/media/``, ``/component/``) and files (a last path segment with a dot) pass
untouched. The page Streamlit then serves gets the frame policy of frontend/framing.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, NamedTuple

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from frontend.client import ApiError
from frontend.forms import browser_address
from frontend.framing import set_frame_policy
from frontend.html_pages import message_page
from frontend.sessions import COOKIE_NAME, clear_session_cookie, login_url, parse_session, safe_next
from frontend.web import WebSession
from frontend.web_backend import api_down_status

__all__ = ["PAGE_ROLES", "PageRoles", "SessionGate", "gate", "page_name"]

# The routes Streamlit serves itself (streamlit/web/server/starlette/starlette_app.py
# _RESERVED_ROUTE_PREFIXES, plus static file serving); a page load never starts with them.
STREAMLIT_PREFIXES = ("/_stcore/", "/static/", "/media/", "/component/", "/app/static/")


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


def page_name(path: str, base: str) -> str | None:
    """The app page a GET of ``path`` loads (``""`` for the start page), or None for
    Streamlit's own routes, files and the login and logout pages."""
    if base:
        if path == base:
            return ""
        if not path.startswith(f"{base}/"):
            return None
        path = path[len(base) :]
    if path.startswith(STREAMLIT_PREFIXES) or path.rstrip("/") in ("/login", "/logout"):
        return None
    if path.startswith("/study/"):  # the study routes (frontend/study_links.py) check for themselves
        return None
    last = path.rstrip("/").rsplit("/", 1)[-1]
    if "." in last:
        return None
    return path.strip("/")


async def gate(web: WebSession, request: Request) -> Response | None:
    """None to let the page load; otherwise the answer instead of it."""
    base, backend = web.base, web.backend
    page = page_name(request.url.path, base)
    if page is None:
        return None
    wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    session = parse_session(request.cookies.get(COOKIE_NAME))
    if session is None:
        return RedirectResponse(login_url(base, safe_next(wanted, base)), status_code=303)
    try:
        roles = await backend.roles(session.token, browser_address(request, backend.trusted_proxies))
    except ApiError as error:
        if error.status == 401:
            response = RedirectResponse(login_url(base, safe_next(wanted, base)) + "&ended=1", status_code=303)
            clear_session_cookie(response, request, base, session.kind)
            return response
        down = message_page(
            "The API is not answering",
            error.message,
            wanted if safe_next(wanted, base) == wanted else f"{base}/",
            "Try again",
            api_down_status(error),
        )
        return web.framing.frame(down, session.kind == "mturk")
    needed = PAGE_ROLES.get(page)
    if needed is not None and "admin" not in roles and not set(needed.roles) & set(roles):
        refused = message_page(
            f"{needed.title}: not for your roles",
            f"The {needed.title} page needs the {' or '.join(needed.roles)} role; "
            f"your roles: {', '.join(roles) or 'none'}. Ask an admin for the role.",
            f"{base}/",
            "Go to your pages",
            403,
        )
        return web.framing.frame(refused, session.kind == "mturk")
    return None


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class SessionGate:
    """ASGI middleware: every GET or HEAD of an app page passes :func:`gate` first, and the page
    Streamlit then serves gets the frame policy of :meth:`Framing.frame <frontend.framing.Framing.frame>`
    (Streamlit's own answer says nothing about frames): MTurk's worker hosts may frame the
    pages of an MTurk study session, no one may frame anyone else's."""

    def __init__(self, app: ASGIApp, web: WebSession) -> None:
        self.app = app
        self.web = web

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            request = Request(scope, receive)
            answer = await gate(self.web, request)
            if answer is not None:
                await answer(scope, receive, send)
                return
            if page_name(request.url.path, self.web.base) is not None:
                session = parse_session(request.cookies.get(COOKIE_NAME))
                mturk = session is not None and session.kind == "mturk"
                send = _framed_send(send, self.web.framing.ancestors(mturk))
        await self.app(scope, receive, send)


def _framed_send(send: Send, ancestors: tuple[str, ...]) -> Send:
    """``send`` that sets the frame policy (:func:`set_frame_policy`) on the answer's headers."""

    async def framed(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            set_frame_policy(MutableHeaders(scope=message), ancestors)
        await send(message)

    return framed
