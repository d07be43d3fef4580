"""Users, roles and API tokens."""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.db.models import ApiToken, Role, User, utcnow
from services.domain import audit
from services.errors import Conflict, Invalid, NotFound, Unauthorized
from services.security import hash_password, hash_token, new_token, verify_password
from services.text import clean_name

DISPLAY_NAME_MAX_CHARS = 200
TOKEN_NAME_MAX_CHARS = 100
_USERNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


def _check_roles(roles: list[str]) -> list[str]:
    known = [r.value for r in Role]
    if not roles:
        raise Invalid(f"roles is empty; give at least one of {known}")
    unknown = [r for r in roles if r not in known]
    if unknown:
        raise Invalid(f"unknown role(s) {unknown}; use {known}")
    return sorted(set(roles), key=known.index)


def create_user(
    session: Session,
    actor: User | None,
    username: str,
    roles: list[str],
    *,
    display_name: str | None = None,
    password: str | None = None,
) -> User:
    if not _USERNAME_RE.match(username):
        raise Invalid(f"username {username!r} is not valid; use 1-64 letters, digits, '_', '.', '@' or '-'")
    if password is not None and len(password) < 8:
        raise Invalid("password is shorter than 8 characters; choose a longer one")
    if session.scalar(select(User.id).where(User.username == username)) is not None:
        raise Conflict(f"user {username!r} already exists; pick another username")
    user = User(
        username=username,
        roles=_check_roles(roles),
        display_name=clean_name(display_name, field="display_name", max_chars=DISPLAY_NAME_MAX_CHARS)
        if display_name is not None
        else None,
        password_hash=hash_password(password) if password else None,
    )
    session.add(user)
    session.flush()
    audit.record(session, actor, "user.create", "user", user.id, username=username, roles=user.roles)
    return user


def get_user(session: Session, username: str) -> User:
    user = session.scalar(select(User).where(User.username == username))
    if user is None:
        raise NotFound(f"no user {username!r}")
    return user


def issue_token(
    session: Session, actor: User | None, user: User, name: str = "api", expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """Create a token for ``user``; returns the row and the plain token (shown only once).
    Who may ask for whose token is ``TokenPolicy.issue``'s to decide."""
    plain = new_token()
    token = ApiToken(
        user_id=user.id,
        name=clean_name(name, field="name", max_chars=TOKEN_NAME_MAX_CHARS),
        token_hash=hash_token(plain),
        prefix=plain[:10],
        expires_at=utcnow() + dt.timedelta(days=expires_in_days) if expires_in_days else None,
    )
    session.add(token)
    session.flush()
    audit.record(session, actor, "token.create", "user", user.id, token_id=token.id, name=token.name)
    return token, plain


def get_token(session: Session, token_id: int) -> ApiToken:
    """The token row; whose it is, is for ``TokenPolicy.revoke`` (another user's token is
    reported as missing, in the same words)."""
    token = session.get(ApiToken, token_id)
    if token is None:
        raise NotFound(f"no token {token_id}")
    return token


def list_users(session: Session) -> list[User]:
    return list(session.scalars(select(User).order_by(User.id)))


def revoke_token(session: Session, actor: User, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        audit.record(session, actor, "token.revoke", "token", token.id)
    return token


def authenticate_token(session: Session, plain: str) -> User:
    token = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(plain)))
    now = utcnow()
    if token is None or token.revoked_at is not None:
        raise Unauthorized("the API token is unknown or revoked; log in again or ask an admin")
    if token.expires_at is not None and token.expires_at <= now:
        raise Unauthorized("the API token has expired; create a new one")
    user = token.user
    if not user.is_active:
        raise Unauthorized(f"user {user.username!r} is deactivated")
    return user


def login(session: Session, username: str, password: str) -> tuple[User, str]:
    user = session.scalar(select(User).where(User.username == username))
    if user is None or not user.is_active or not verify_password(password, user.password_hash):
        raise Unauthorized("wrong username or password")
    _, plain = issue_token(session, user, user, name="login", expires_in_days=7)
    return user, plain
