"""FastAPI dependencies: the database session, the settings and the authenticated user."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from services.db.models import Role, User
from services.domain.users import authenticate_token
from services.domain.writing import expire_due_assignments
from services.errors import Forbidden, Unauthorized
from services.model_client import ModelClient
from services.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="An API token: `Authorization: Bearer dl_...`")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def get_sessionmaker(request: Request) -> sessionmaker[Session]:
    return request.app.state.sessionmaker  # type: ignore[no-any-return]


def get_model_client(request: Request) -> ModelClient:
    return request.app.state.model_client  # type: ignore[no-any-return]


async def get_session(request: Request) -> AsyncIterator[Session]:
    # Async on purpose: FastAPI runs a sync dependency's teardown in its worker-thread pool.
    # When every worker thread is waiting for the database write lock, the commit that would
    # release it could not get a thread, and 50 concurrent writers stalled for the whole busy
    # timeout (bench/load.py). Creating the session, commit and rollback are short and never
    # wait for the lock (only a transaction's BEGIN does), so they may run on the event loop.
    session: Session = request.app.state.sessionmaker()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


SettingsDep = Annotated[Settings, Depends(get_settings)]
# The largest id an INTEGER primary key holds on PostgreSQL (SQLite's go to 2**63 - 1): a larger
# id in a path is bad input (422), not a database overflow (500).
MAX_ID = 2**31 - 1
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
SessionDep = Annotated[Session, Depends(get_session)]
SessionmakerDep = Annotated[sessionmaker[Session], Depends(get_sessionmaker)]
ModelClientDep = Annotated[ModelClient, Depends(get_model_client)]


def current_user(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> User:
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise Unauthorized("send an API token: `Authorization: Bearer <token>`")
    user = authenticate_token(session, credentials.credentials)
    # End the read transaction now: on SQLite it would otherwise hold the write lock for the
    # whole request (the attempt handler calls the model outside any transaction).
    session.commit()
    return user


CurrentUser = Annotated[User, Depends(current_user)]


def _requires(role: Role):  # type: ignore[no-untyped-def]
    def check(user: CurrentUser) -> User:
        if not user.has_role(role):
            raise Forbidden(f"this needs the {role.value} role; your roles: {', '.join(user.roles) or 'none'}")
        return user

    return check


def current_writer(session: SessionDep, user: Annotated[User, Depends(_requires(Role.writer))]) -> User:
    # Expire the writer's overdue assignments first and commit: a 410 later in the request
    # rolls its own transaction back, and the expiry must not go with it.
    expire_due_assignments(session, user.id)
    # Commit, never roll back: a rollback would expire `user`, and reloading it would open a
    # new transaction that (on SQLite) holds the write lock for the rest of the request.
    session.commit()
    return user


CurrentWriter = Annotated[User, Depends(current_writer)]
CurrentValidator = Annotated[User, Depends(_requires(Role.validator))]
CurrentResearcher = Annotated[User, Depends(_requires(Role.researcher))]
CurrentAdmin = Annotated[User, Depends(_requires(Role.admin))]
