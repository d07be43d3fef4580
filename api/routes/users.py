"""Login, users and API tokens."""

from __future__ import annotations

from fastapi import APIRouter, status
from sqlalchemy import select

from api.deps import CurrentAdmin, CurrentUser, IdPath, SessionDep
from api.schemas import (
    LoginRequest,
    LoginResponse,
    TokenCreate,
    TokenPublic,
    UserCreate,
    UserPublic,
    UsersPublic,
)
from services.db.models import User
from services.domain import users

router = APIRouter(tags=["users"])


@router.post("/auth/login", response_model=LoginResponse)
def login(body: LoginRequest, session: SessionDep) -> LoginResponse:
    """Exchange a username and password for a 7-day API token."""
    user, token = users.login(session, body.username, body.password)
    session.commit()
    return LoginResponse(token=token, user=UserPublic.of(user))


@router.get("/me", response_model=UserPublic)
def me(user: CurrentUser) -> UserPublic:
    return UserPublic.of(user)


@router.post("/users", response_model=UserPublic, status_code=status.HTTP_201_CREATED)
def create_user(body: UserCreate, session: SessionDep, admin: CurrentAdmin) -> UserPublic:
    user = users.create_user(session, admin, body.username, body.roles,
                             display_name=body.display_name, password=body.password)
    session.commit()
    return UserPublic.of(user)


@router.get("/users", response_model=UsersPublic)
def list_users(session: SessionDep, admin: CurrentAdmin) -> UsersPublic:
    rows = [UserPublic.of(u) for u in session.scalars(select(User).order_by(User.id))]
    return UsersPublic(data=rows, count=len(rows))


@router.post("/users/{username}/tokens", response_model=TokenPublic, status_code=status.HTTP_201_CREATED)
def create_token(username: str, body: TokenCreate, session: SessionDep, actor: CurrentUser) -> TokenPublic:
    """Create an API token for yourself, or (admins) for anyone. The token is shown only here."""
    target = users.get_user(session, username)
    token, plain = users.issue_token(session, actor, target, body.name, body.expires_in_days)
    session.commit()
    return TokenPublic(id=token.id, name=token.name, prefix=token.prefix, token=plain, expires_at=token.expires_at)


@router.delete("/tokens/{token_id}", response_model=TokenPublic)
def revoke_token(token_id: IdPath, session: SessionDep, actor: CurrentUser) -> TokenPublic:
    token = users.revoke_token(session, actor, token_id)
    session.commit()
    return TokenPublic(id=token.id, name=token.name, prefix=token.prefix, expires_at=token.expires_at)
