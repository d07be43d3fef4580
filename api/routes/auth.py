"""Login, and who the token belongs to."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from api.deps import SessionDep, allowed
from api.schemas.auth import LoginRequest, LoginResponse
from api.schemas.users import UserPublic
from services.authorization import UserPolicy
from services.db.models import User
from services.domain import users

router = APIRouter(tags=["auth"])


@router.post("/auth/login", response_model=LoginResponse)
def login(body: LoginRequest, session: SessionDep) -> LoginResponse:
    """Exchange a username and password for a 7-day API token."""
    user, token = users.login(session, body.username, body.password)
    return LoginResponse(token=token, user=UserPublic.of(user))


@router.get("/me", response_model=UserPublic)
def me(user: Annotated[User, allowed(UserPolicy.me)]) -> UserPublic:
    return UserPublic.of(user)
