"""Users, roles and API tokens."""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from services.db.models import ApiToken, Role, User, utcnow
from services.domain import audit
from services.errors import Conflict, Invalid, NotFound, Unauthorized
from services.security import hash_password, hash_token, new_token, password_problem, verify_password
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
    if password is not None:
        check_password(username, password)
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


def check_password(username: str, password: str) -> None:
    """The password policy, wherever a password is set (services/security.py
    ``password_problem``: at least 12 characters, not all whitespace, not the username, not a
    common password)."""
    problem = password_problem(password, username)
    if problem:
        raise Invalid(problem, problems=[f"password: {problem}"])


def set_password(session: Session, actor: User | None, user: User, password: str) -> None:
    """Give ``user`` a new password (it must pass the policy); their tokens stay valid."""
    check_password(user.username, password)
    user.password_hash = hash_password(password)
    audit.record(session, actor, "user.password", "user", user.id)


def get_user(session: Session, username: str) -> User:
    user = session.scalar(select(User).where(User.username == username))
    if user is None:
        raise NotFound(f"no user {username!r}")
    return user


def issue_token(
    session: Session,
    actor: User | None,
    user: User,
    name: str = "api",
    expires_in_days: int | None = None,
    *,
    minted_by: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """Create a token for ``user``; returns the row and the plain token (shown only once).
    Who may ask for whose token is ``TokenPolicy.issue``'s to decide. A token created with
    another (``minted_by``, the token of the API request) never outlives it: asking for a later
    expiry, or none, is refused (422), not shortened behind the caller's back."""
    now = utcnow()
    expires_at = now + dt.timedelta(days=expires_in_days) if expires_in_days else None
    limit = minted_by.expires_at if minted_by is not None else None
    if limit is not None and (expires_at is None or expires_at > limit):
        days_left = (limit - now) // dt.timedelta(days=1)
        fix = (
            f"ask for expires_in_days of at most {days_left}"
            if days_left >= 1
            else "log in again for a fresh token first"
        )
        asked = f"expires in {expires_in_days} days" if expires_in_days else "never expires"
        problem = (
            f"the token of this request expires at {limit.isoformat(timespec='seconds')} and a token it creates cannot "
            f"outlive it, but the new one {asked}; {fix}, or create it with a longer-lived token "
            "(`dynaloop user token`)"
        )
        raise Invalid(problem, problems=[f"expires_in_days: {problem}"])
    plain = new_token()
    token = ApiToken(
        user_id=user.id,
        name=clean_name(name, field="name", max_chars=TOKEN_NAME_MAX_CHARS),
        token_hash=hash_token(plain),
        prefix=plain[:10],
        expires_at=expires_at,
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


def tokens_of(session: Session, user: User) -> list[ApiToken]:
    """Every token of ``user``, revoked and expired ones too, oldest first."""
    return list(session.scalars(select(ApiToken).where(ApiToken.user_id == user.id).order_by(ApiToken.id)))


def list_users(session: Session) -> list[User]:
    return list(session.scalars(select(User).order_by(User.id)))


def revoke_token(session: Session, actor: User | None, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        audit.record(session, actor, "token.revoke", "token", token.id)
    return token


# Every request's first query: built once (statements.py). The user in the same statement:
# every authenticated request reads ``is_active`` and the roles, and a lazy load would be a
# second round trip (docs/benchmarks.md, "API CPU"). Both entities as columns, not the user as
# a joined load of the token: ``token.user`` is then found in the session's identity map, and
# the ORM skips its eager-loading machinery. The API adds a column of its own to it
# (dynaloop/api/deps.py: a writer's overdue assignments, in the same round trip).
TOKEN_BY_HASH = (
    select(ApiToken, User)
    .join_from(ApiToken, User, ApiToken.user_id == User.id)
    .where(ApiToken.token_hash == bindparam("token_hash"))
)


def valid_token(token: ApiToken | None) -> ApiToken:
    """``token`` (read by :data:`TOKEN_BY_HASH`), if it is valid and its user active (else
    Unauthorized)."""
    now = utcnow()
    if token is None or token.revoked_at is not None:
        raise Unauthorized("the API token is unknown or revoked; log in again or ask an admin")
    if token.expires_at is not None and token.expires_at <= now:
        raise Unauthorized("the API token has expired; create a new one")
    if not token.user.is_active:
        raise Unauthorized(f"user {token.user.username!r} is deactivated")
    return token


# One answer for an unknown username, a wrong password, a user without a password and a
# deactivated user: the answer must not tell which usernames exist.
WRONG_LOGIN = "wrong username or password"
LOGIN_TOKEN_DAYS = 7


def login_candidate(session: Session, username: str) -> User | None:
    """The user a login names, if any (whether they may log in is :func:`password_matches`'s)."""
    return session.scalar(select(User).where(User.username == username))


def password_matches(user: User | None, password: str) -> bool:
    """Whether ``password`` logs ``user`` in. The same PBKDF2 work whether or not the user
    exists, has a password or is active (``verify_password`` checks a dummy hash when there is
    none), so the time of the answer tells nothing either."""
    matches = verify_password(password, user.password_hash if user is not None else None)
    return matches and user is not None and user.is_active


def open_login_session(session: Session, user: User) -> str:
    """The plain 7-day token of a successful login."""
    _, plain = issue_token(session, user, user, name="login", expires_in_days=LOGIN_TOKEN_DAYS)
    return plain
