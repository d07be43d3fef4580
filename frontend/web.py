"""The web app's HTTP side: the login and logout pages, the study links and the page gate in front
of every page (``frontend/server.py`` mounts them on Streamlit's own server).

A browser signs in at ``/login`` (a password, or an API token pasted instead); the API's token
goes into the session cookie (frontend/sessions.py). ``POST /logout`` revokes a login's token in
the API and clears the cookie. Crowdworkers arrive through a study link instead
(frontend/study_links.py). Every page load passes the gate first (frontend/page_gate.py). The
pages themselves are in frontend/html_pages.py, the frame policy in frontend/framing.py.

A POST must come from the app's own origin and its form is bounded (frontend/forms.py), the
``next`` address must be a path of this app, and every piece of user text on a page is escaped.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from frontend.client import ApiError
from frontend.forms import MAX_PASSWORD, MAX_USERNAME, FormError, browser_address, read_form, same_origin
from frontend.framing import Framing
from frontend.html_pages import login_page, message_page
from frontend.sessions import (
    COOKIE_NAME,
    TOKEN_RE,
    clear_session_cookie,
    parse_session,
    safe_next,
    set_session_cookie,
)
from frontend.study_links import StudyLinks
from frontend.web_backend import Backend, api_down_status

__all__ = ["WebSession"]


class WebSession:
    """The web app's own routes at ``base``: ``/login`` and ``/logout`` here, the study links'
    (:class:`~frontend.study_links.StudyLinks`); :class:`frontend.page_gate.SessionGate` guards
    the pages with the same backend, base and framing."""

    def __init__(self, backend: Backend, base: str = "", framing: Framing | None = None) -> None:
        self.backend = backend
        self.base = base
        self.framing = framing or Framing()
        self.study_links = StudyLinks(backend, base, self.framing)

    def routes(self) -> list[Route]:
        return [
            Route(f"{self.base}/login", self.login, methods=["GET", "POST"]),
            Route(f"{self.base}/logout", self.logout, methods=["POST"]),
            *self.study_links.routes(),
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
            problem = None if TOKEN_RE.fullmatch(secret) else "Paste your API token (it starts with dl_)."
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
            status = error.status if error.status in (401, 403, 422, 429) else api_down_status(error)
            response = login_page(
                base, next_path, self.backend.api_url, error=error.shown, username=username, status=status
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
                    problem = error.shown
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
