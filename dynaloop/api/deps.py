"""FastAPI dependencies: the request's unit of work, the settings, the model client, the
authenticated user, and the role half of each route's policy (services/authorization.py)."""

# No `from __future__ import annotations` here: FastAPI reads the annotations of the
# dependencies that `allowed` and `allowed_writer` build, and those name their local `action`.
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from anyio import CapacityLimiter, to_thread
from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from dynaloop.api.ratelimit import RateLimiter
from dynaloop.api.state import app_state
from services.authorization import Policy, authorize
from services.db.models import ApiToken, Role, User, utcnow
from services.db.transactions import begin_read_only, commit_now
from services.domain.in_flight import AttemptsInFlight
from services.domain.users import TOKEN_BY_HASH, valid_token
from services.domain.writing import OVERDUE_ASSIGNMENT_OF_USER, expire_due_assignments
from services.errors import Unauthorized
from services.model_client import ModelClient
from services.security import hash_token
from services.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="An API token: `Authorization: Bearer dl_...`")


# Dependencies that only read the app's state, or objects already loaded, are `async def`:
# FastAPI runs every plain `def` dependency in its worker-thread pool, a round trip between the
# event loop and a thread (each waiting for the GIL) per dependency. POST /attempts made eleven
# of them per request, and under 50 writers and 20 validators those round trips were most of the
# requests' time (docs/benchmarks.md, "Load and faults").


async def get_settings(request: Request) -> Settings:
    return app_state(request).settings


async def get_sessionmaker(request: Request) -> sessionmaker[Session]:
    return app_state(request).sessionmaker


async def get_model_client(request: Request) -> ModelClient:
    return app_state(request).model_client


async def get_attempts_in_flight(request: Request) -> AttemptsInFlight:
    return app_state(request).attempts_in_flight


async def get_session(request: Request) -> AsyncIterator[Session]:
    """The request's unit of work: one session whose transaction is committed when the route
    has built its answer, before the answer is sent (``scope="function"`` below), and rolled
    back on any error. Routes and domain functions do not commit; the few steps that must
    commit sooner call ``services.db.transactions.commit_now`` and say why."""
    # Async on purpose: FastAPI runs a sync dependency's teardown in its worker-thread pool.
    # When every worker thread is waiting for the database write lock, the commit that would
    # release it could not get a thread, and 50 concurrent writers stalled for the whole busy
    # timeout (bench/load.py). Creating the session, commit and rollback are short and never
    # wait for the lock (only a transaction's BEGIN does), so they may run on the event loop.
    session = app_state(request).sessionmaker()
    try:
        yield session
        if session.new or session.dirty or session.deleted:
            # Writing what is still pending may wait: for the write lock if no statement has
            # begun the transaction yet (SQLite), for another transaction's row lock
            # (PostgreSQL). Never on the event loop, where the commit that would end that wait
            # runs; in a thread of its own, outside the (possibly exhausted) handler pool.
            await to_thread.run_sync(session.flush, limiter=CapacityLimiter(1))
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


async def _body_bytes(request: Request) -> bytes:
    return await request.body()


# A raw body (a task's YAML, a prompt file) is read by an async dependency so that the endpoints
# themselves are plain `def`: FastAPI runs those in its thread pool. An `async def` endpoint
# would run its (blocking) database work on the event loop and, on SQLite, stall every other
# request, even deadlock with one whose rollback waits for the loop.
RawBody = Annotated[bytes, Depends(_body_bytes)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
# The largest id an INTEGER primary key holds on PostgreSQL (SQLite's go to 2**63 - 1): a larger
# id in a path is bad input (422), not a database overflow (500).
MAX_ID = 2**31 - 1
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SessionmakerDep = Annotated[sessionmaker[Session], Depends(get_sessionmaker)]
ModelClientDep = Annotated[ModelClient, Depends(get_model_client)]
AttemptsInFlightDep = Annotated[AttemptsInFlight, Depends(get_attempts_in_flight)]


# Where current_token leaves, for a writer, whether an assignment of theirs is overdue.
_DUE_ASSIGNMENTS = "dynaloop_due_assignments"


def current_token(
    request: Request,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiToken:
    """Authentication: which valid token is this, of an active user? (401 without one.) Its id
    keys the per-token rate limit (dynaloop/api/ratelimit.py), however the header was spelled.

    For a writer, the same read also asks whether an assignment of theirs is overdue, for
    :func:`allowed_writer`: one transaction and one worker-thread round trip fewer on every
    writer's request than a read of its own (docs/benchmarks.md, "API CPU")."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise Unauthorized("send an API token: `Authorization: Bearer <token>`")
    # A reader: on SQLite the lookup does not queue for the write lock behind other requests'
    # transactions (docs/benchmarks.md, "Load and faults").
    begin_read_only(session)
    row = session.execute(
        _TOKEN_FOR_REQUEST, {"token_hash": hash_token(credentials.credentials), "due_now": utcnow()}
    ).first()
    token = valid_token(row[0] if row is not None else None)
    if row is not None and Role.writer.value in (token.user.roles or []):
        request.scope.setdefault("state", {})[_DUE_ASSIGNMENTS] = bool(row._mapping["has_overdue_assignment"])
    commit_now(session, "end the token lookup's read before the rest of the request")
    return token


# The token, its user and whether the user has an overdue assignment, in one statement: the
# last is asked of every user (a writer's is read; for anyone else it is an indexed lookup that
# finds nothing), so that a writer's request reads it without a round trip of its own.
_TOKEN_FOR_REQUEST = TOKEN_BY_HASH.add_columns(OVERDUE_ASSIGNMENT_OF_USER)


CurrentToken = Annotated[ApiToken, Depends(current_token)]


async def current_user(token: CurrentToken) -> User:
    """The user whose token authenticated the request (loaded by the token lookup, which read
    ``is_active``: nothing is read from the database here, on the event loop)."""
    return token.user


CurrentUser = Annotated[User, Depends(current_user)]


def allowed(action: Callable[[], Policy]) -> Any:
    """The signed-in user, if the role half of ``action``'s policy allows them (else 403).

    ``action`` is a policy method such as ``RoundPolicy.manage``, called here without its
    object. As a dependency the check runs before the route reads its path, query and body,
    so a caller without the role gets 403 whatever they sent; the route then authorizes the
    loaded object with the same method (``authorize(user, RoundPolicy.manage(round_))``)."""

    async def check(user: CurrentUser) -> User:
        policy = action()
        if policy.rule is None:
            # Roles only: the user's roles column, loaded with the user; no database work.
            authorize(user, policy)
        else:
            await run_in_threadpool(authorize, user, policy)
        return user

    return Depends(check)


def allowed_writer(action: Callable[[], Policy]) -> Any:
    """Like :func:`allowed`, for the writer's routes: the writer's overdue assignments are
    expired first, in a transaction of their own."""

    async def writer(request: Request, session: SessionDep, user: Annotated[User, allowed(action)]) -> User:
        # Most requests find nothing due: the token lookup asked, as a reader, so that on
        # SQLite they do not queue for the write lock for nothing (docs/benchmarks.md, "Load
        # and faults"), and nothing here needs a worker thread.
        if request.scope.get("state", {}).get(_DUE_ASSIGNMENTS, True):
            await run_in_threadpool(_expire_due_assignments, session, user)
        return user

    return Depends(writer)


def _expire_due_assignments(session: Session, user: User) -> None:
    """The expiry is a write transaction of its own."""
    expire_due_assignments(session, user.id)
    # Never a rollback here: it would expire `user`, and reloading it would open a new
    # transaction that (on SQLite) holds the write lock for the rest of the request.
    commit_now(session, "the expiry must survive a 410 (or any error) later in the request")


# --- rate limits (dynaloop/api/ratelimit.py) ------------------------------------------------------


async def address_rate_limited(request: Request) -> None:
    """FastAPI dependency for the writer and validator routers: the client address's budget,
    counted before authentication (requests without a valid token count too), by :func:`_count`;
    with no limit set, nothing is counted and no thread is asked (the cost of a round trip to
    the thread pool: see above)."""
    limiter = app_state(request).rate_limiter
    if limiter.per_ip:
        await _count(limiter, limiter.check_address, request)


async def token_rate_limited(request: Request, token: CurrentToken) -> None:
    """FastAPI dependency for the writer and validator routers, after ``address_rate_limited``:
    the budget of the token that authenticated the request (401 without one)."""
    limiter = app_state(request).rate_limiter
    if limiter.per_token:
        await _count(limiter, limiter.check_token, token.id)


async def _count(limiter: RateLimiter, check: Callable[[Any], None], subject: Any) -> None:
    """Count a request against a budget: on the event loop when the counters are the process's
    own (``memory://``, a few microseconds under a lock), in a worker thread when they are shared
    (Redis: a network round trip)."""
    if limiter.in_process:
        check(subject)
    else:
        await run_in_threadpool(check, subject)
