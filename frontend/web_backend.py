"""The API as the web app's own routes use it (sign in, roles, revoke, study sessions), from a
worker thread: frontend/client.py is synchronous."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anyio import to_thread

from frontend import forwarded
from frontend.client import ApiClient, ApiError, Completion, SharedTransport, StudySession, StudyStart
from frontend.sessions import Session, SessionKind, SignedIn, cookie_max_age

__all__ = ["Backend", "api_down_status"]

API_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Backend:
    """The API as the HTTP routes use it; ``transport`` lets tests route it in process.

    ``web_app_key`` (``$DYNALOOP_WEB_APP_KEY``, the same as the API's) goes with the browser's
    address on every call, so the API counts failed logins and rate limits per browser, not
    for the web app as a whole (dynaloop/api/ratelimit.py); ``api_url`` is the admin's, never a user's."""

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


def api_down_status(error: ApiError) -> int:
    """The status of a page that reports the API's error: 503 when the API is down, else 502."""
    return 503 if error.status in (0, 502, 503, 504) else 502
