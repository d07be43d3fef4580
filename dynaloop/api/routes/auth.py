"""Login, and who the token belongs to."""

from __future__ import annotations

from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Request

from dynaloop.api.deps import CurrentToken, SessionDep, allowed
from dynaloop.api.ratelimit import client_address
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.auth import LoginRequest, LoginResponse
from dynaloop.api.schemas.errors import error_responses
from dynaloop.api.schemas.tokens import TokenPublic
from dynaloop.api.schemas.users import UserPublic
from dynaloop.api.state import app_state
from services.authorization import UserPolicy
from services.db.models import User
from services.db.transactions import commit_now
from services.domain import users
from services.errors import Unauthorized

router = APIRouter(tags=["auth"], route_class=OneHopRoute)


@router.post("/auth/login", response_model=LoginResponse, responses=error_responses(429))
async def login(body: LoginRequest, request: Request, session: SessionDep) -> LoginResponse:
    """Exchange a username and password for a 7-day API token.

    Failed logins are throttled per username and per client address with a growing lock-out
    (429 with Retry-After; the password is not checked while locked); unknown usernames,
    wrong passwords and deactivated users get the same answer after the same work."""
    # Async so that a login waiting for the password pool (dynaloop/api/ratelimit.py) holds no handler
    # thread; its database work and the password check run in threads.
    throttle = app_state(request).rate_limiter.login
    address = client_address(request, app_state(request).settings)

    def look_up() -> User | None:
        throttle.check(body.username, address)
        user = users.login_candidate(session, body.username)
        commit_now(session, "end the lookup's read (on SQLite, the write lock) before the slow password check")
        return user

    user = await to_thread.run_sync(look_up)
    # Checked even when there is no such user: the same work, the same answer.
    matched = await throttle.check_password(body.username, address, lambda: users.password_matches(user, body.password))
    if not matched or user is None:
        raise Unauthorized(users.WRONG_LOGIN)
    token = await to_thread.run_sync(users.open_login_session, session, user)
    return LoginResponse(token=token, user=UserPublic.of(user))


@router.get("/me", response_model=UserPublic)
def me(user: Annotated[User, allowed(UserPolicy.me)]) -> UserPublic:
    return UserPublic.of(user)


@router.get("/me/token", response_model=TokenPublic)
def my_token(user: Annotated[User, allowed(UserPolicy.me)], token: CurrentToken) -> TokenPublic:
    """The token of this request: its id (to revoke it with ``DELETE /tokens/{id}``, as the web
    app's logout does), name, prefix and expiry. The plain token is never shown again."""
    return TokenPublic.of(token)
