"""API tokens: issued to yourself (admins: to anyone), shown once, revoked by their owner."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status

from dynaloop.api.deps import CurrentToken, IdPath, SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.tokens import TokenCreate, TokenPublic
from services.authorization import TokenPolicy, authorize
from services.db.models import User
from services.domain import users

router = APIRouter(tags=["tokens"], route_class=OneHopRoute)


@router.post("/users/{username}/tokens", response_model=TokenPublic, status_code=status.HTTP_201_CREATED)
def create_token(
    username: str,
    body: TokenCreate,
    session: SessionDep,
    actor: Annotated[User, allowed(TokenPolicy.issue)],
    current: CurrentToken,
) -> TokenPublic:
    """Create an API token for yourself, or (admins) for anyone. The token is shown only here.
    It cannot outlive the token of this request: with a 7-day login token, ask for at most the
    days that token has left (422 otherwise)."""
    owner = users.get_user(session, username)
    authorize(actor, TokenPolicy.issue(owner))
    token, plain = users.issue_token(session, actor, owner, body.name, body.expires_in_days, minted_by=current)
    return TokenPublic.of(token, plain)


@router.delete("/tokens/{token_id}", response_model=TokenPublic)
def revoke_token(
    token_id: IdPath, session: SessionDep, actor: Annotated[User, allowed(TokenPolicy.revoke)]
) -> TokenPublic:
    token = users.get_token(session, token_id)
    authorize(actor, TokenPolicy.revoke(token))
    return TokenPublic.of(users.revoke_token(session, actor, token))
