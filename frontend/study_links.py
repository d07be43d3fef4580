"""Study links: a crowdworker's arrival (``/study/{slug}`` with their platform's parameters) and
departure (``/study/finish``).

The API starts or resumes their study session and gives a token, which goes into the session
cookie (frontend/sessions.py); ``/study/finish`` ends the session and hands them back to the
platform, to Prolific's or MTurk's own addresses only (docs/frontend.md, "Study links"). MTurk's
worker hosts may frame these pages for an MTurk link (frontend/framing.py).
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from frontend.client import ApiError
from frontend.forms import FormError, browser_address, read_form, same_origin
from frontend.framing import Framing
from frontend.html_pages import completion_page, finish_page, message_page, study_preview_page
from frontend.sessions import (
    COOKIE_NAME,
    TOKEN_RE,
    Session,
    SessionKind,
    SignedIn,
    clear_session_cookie,
    cookie_max_age,
    login_url,
    parse_session,
    set_session_cookie,
)
from frontend.web_backend import Backend, api_down_status

__all__ = ["StudyLinks"]

# Study links (docs/frontend.md, "Study links"): the slug as the API makes it (StudyLink.slug,
# at most 64 characters) and the platform's query parameters as the API takes them.
_SLUG_RE = re.compile(r"[A-Za-z0-9_\-]{1,64}")
MAX_STUDY_PARAMS = 20
MAX_STUDY_PARAM_NAME = 64
MAX_STUDY_PARAM_VALUE = 200
MAX_STUDY_QUERY = 8 * 1024
# The parameters MTurk appends to an ExternalQuestion's address (services/domain/study.py).
MTURK_LINK_PARAMS = ("assignmentId", "hitId")


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


class StudyLinks:
    """The study link routes of one app at ``base``."""

    def __init__(self, backend: Backend, base: str, framing: Framing) -> None:
        self.backend = backend
        self.base = base
        self.framing = framing

    def routes(self) -> list[Route]:
        return [
            Route(f"{self.base}/study/finish", self.study_finish, methods=["GET", "POST"]),
            Route(f"{self.base}/study/{{slug}}", self.study_start, methods=["GET"]),
            Route(f"{self.base}/study/{{rest:path}}", self.study_unknown, methods=["GET", "POST"]),
        ]

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
        return message_page("The API is not answering", error.message, retry_link, "Try again", api_down_status(error))

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
        return self.framing.frame(response, mturk)

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
        if not isinstance(token, str) or not TOKEN_RE.fullmatch(token):
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
        return self.framing.frame(response, session is not None and session.kind == "mturk")

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
            return message_page("The API is not answering", error.message, here, "Try again", api_down_status(error))
        return completion_page(completion, base, self.framing.mturk_submit_origins)
