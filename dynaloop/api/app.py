"""The FastAPI application: routers under /api/v1, error mapping, body-size limit, health."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy import text
from sqlalchemy.exc import DataError, IntegrityError, OperationalError, SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dynaloop.api.input_limits import JsonDepthLimit
from dynaloop.api.metrics import ApiMetrics, RequestMetrics, add_metrics_route
from dynaloop.api.overload import OverloadGuard
from dynaloop.api.ratelimit import RateLimiter
from dynaloop.api.routes import assignments, include_routers
from dynaloop.api.routing import original_endpoint
from dynaloop.api.schemas.errors import ErrorResponse
from dynaloop.api.schemas.health import HealthPublic
from dynaloop.api.state import AppState
from services.db.engine import make_engine, make_sessionmaker
from services.domain.in_flight import AttemptsInFlight
from services.errors import (
    REQUEST_PROBLEM_WORDING,
    DomainError,
    ModelBusy,
    ModelUnavailable,
    RateLimited,
    TooManyInFlight,
    Unauthorized,
    validation_problems,
)
from services.model_client import ModelClient
from services.observability import configure_logging
from services.settings import Settings, get_settings

logger = logging.getLogger(__name__)
API_PREFIX = "/api/v1"

DESCRIPTION = """
Adversarial human-and-model-in-the-loop dataset creation (Dynabench / DynaSent style).

Every endpoint but `/health` and `/api/v1/auth/login` needs `Authorization: Bearer <token>`.
Errors always have the shape `{"error": {"code", "message", "details"}}`; the message says
what to fix. See `docs/api.md` for the flows with example requests.
"""


def _error(
    status_code: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        status_code=status_code,
        content={"error": {"code": code, "message": message, "details": details or {}}},
        headers=headers,
    )


class _TooLarge(Exception):
    """A body cut off by :class:`BodySizeLimit` (a class per request cost 16 µs of each request)."""


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413, whether or not Content-Length is sent."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    if int(value) > self.max_bytes:
                        await self._too_large()(scope, receive, send)
                        return
                except ValueError:
                    pass
        received = 0
        exceeded = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    exceeded = True
                    raise _TooLarge
            return message

        response_started = False

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            if exceeded and not response_started:
                # FastAPI turns an exception raised while it reads the body into its own 400
                # ("error parsing the body"); the answer to a cut-off body is the 413 below.
                return
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        with suppress(_TooLarge):
            await self.app(scope, limited_receive, tracking_send)
        if exceeded and not response_started:
            await self._too_large()(scope, receive, send)

    def _too_large(self) -> JSONResponse:
        # Built when needed: a response rendered for every request costs every request.
        return _error(413, "too_large", f"the request body is larger than {self.max_bytes} bytes; send less")


# The shed reasons of the domain's refusals (the overload guard's own: dynaloop/api/overload.py).
SHED_REASONS: dict[type[DomainError], str] = {
    ModelBusy: "model_slots",
    TooManyInFlight: "assignment_in_flight",
    RateLimited: "rate_limited",
}


def add_exception_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain(request: Request, exc: DomainError) -> JSONResponse:
        headers = None
        if isinstance(exc, (ModelBusy, TooManyInFlight, RateLimited)):
            # Refused without the work done (dynaloop/api/metrics.py, shed by reason).
            request.app.state.metrics.shed_counter(SHED_REASONS.get(type(exc), "rate_limited"))()
        if isinstance(exc, (ModelUnavailable, RateLimited)):  # ModelBusy, TooManyInFlight too
            headers = {"Retry-After": str(exc.details.get("retry_after_s", 5))}
        elif isinstance(exc, Unauthorized):
            headers = {"WWW-Authenticate": "Bearer"}
        return _error(exc.status_code, exc.code, exc.message, exc.details, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = validation_problems(exc.errors(), wording=REQUEST_PROBLEM_WORDING)
        return _error(422, "invalid", "; ".join(problems), {"problems": problems})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
            # FastAPI answers a JSON body that is not UTF-8 with a bare 400; say what to fix.
            problem = (
                f"the body is not valid UTF-8 (bad byte at offset {exc.__cause__.start}); send a UTF-8 JSON object"
            )
            return _error(422, "invalid", problem, {"problems": [problem]})
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}.get(exc.status_code, "http_error")
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"there is no endpoint {request.method} {request.url.path}; see /docs for the API"
        elif exc.status_code == 405 and message == "Method Not Allowed":
            allowed = (getattr(exc, "headers", None) or {}).get("Allow", "")
            message = f"{request.method} is not allowed on {request.url.path}; use {allowed or 'another method'}"
        return _error(exc.status_code, code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(OperationalError)
    async def _database_down(request: Request, exc: OperationalError) -> JSONResponse:
        logger.error("database error: %s", exc)
        reason = str(exc.orig) if exc.orig is not None else str(exc)
        return _error(
            503,
            "database_unavailable",
            f"the database cannot be used right now ({reason[:200]}); nothing was saved, retry later",
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(IntegrityError)
    async def _integrity(request: Request, exc: IntegrityError) -> JSONResponse:
        # A unique constraint that a concurrent request satisfied first is a race, not a bug:
        # the client should retry (and will then get the usual answer, e.g. "already exists").
        orig = exc.orig
        unique = getattr(orig, "sqlstate", None) == "23505" or "UNIQUE constraint failed" in str(orig)
        if unique:
            logger.info("unique constraint race: %s", orig)
            return _error(
                409, "conflict", "another request changed the same data at the same moment; nothing was saved, retry"
            )
        logger.exception("database integrity error")
        return _error(500, "database_error", "the database refused the change; nothing was saved")

    @app.exception_handler(DataError)
    async def _unstorable(request: Request, exc: DataError) -> JSONResponse:
        # PostgreSQL refuses a NUL character (U+0000) in text (a name, a path segment, a header)
        # and an id beyond its INTEGER range, which SQLite would take: bad input, not a bug.
        # The transaction was rolled back.
        message = None
        if "NUL" in str(exc.orig):
            message = "a text value contains a NUL character (U+0000), which cannot be stored; remove it"
        elif getattr(exc.orig, "sqlstate", None) == "22003":
            message = (
                "a number is out of the range the database can store (ids go up to 2147483647); send a smaller one"
            )
        if message:
            return _error(422, "invalid", message, {"problems": [message]})
        logger.exception("database error")
        return _error(500, "database_error", "the database refused the change; nothing was saved")

    @app.exception_handler(SQLAlchemyError)
    async def _database(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        logger.exception("database error")
        return _error(500, "database_error", "the database refused the change; nothing was saved")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: keep the documented error shape and log the traceback.
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(
            500,
            "internal_error",
            "an unexpected error occurred; nothing was saved. Please report it with the time of the request",
        )


def model_client_for(settings: Settings) -> ModelClient:
    """The model-call bulkhead of one API process (docs/reliability.md "Model calls")."""
    return ModelClient(
        timeout_s=settings.model_timeout_s,
        retries=settings.model_retries,
        deadline_s=settings.model_deadline_s,
        max_concurrency=settings.model_max_concurrency,
        queue_wait_s=settings.model_queue_wait_s,
    )


def create_app(settings: Settings | None = None, model_client: ModelClient | None = None) -> FastAPI:
    settings = settings or get_settings()
    configure_logging(settings.log_format)
    # httpx logs every request it sends at INFO: a line per model call, beside the API's own
    # access line for the attempt that made it, and about a quarter of the call's CPU in the
    # API (docs/benchmarks.md, "API CPU per request"). Its warnings and errors still show.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if warning := settings.placeholder_secret_warning:
        # Production and test settings with a placeholder never get here (Settings refuses them).
        logger.warning("!!! %s !!!", warning)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # More handler threads than concurrent requests (settings.worker_threads >
        # max_concurrent_requests, which `dynaloop api` enforces): a request holding SQLite's
        # write lock always finds a thread to finish on while others wait for the lock.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        if settings.freeze_gc_at_startup:
            # What exists now lives as long as the process: collect once, then keep the cyclic
            # collector's full passes off it (they paused every request for up to 0.2 s under
            # bench/load.py's crowd; docs/benchmarks.md, "Load and faults").
            gc.collect()
            gc.freeze()
        yield
        metrics.process_exit()
        state.model_client.close()
        state.engine.dispose()

    app = FastAPI(
        title="dynaloop API",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url="/docs",
    )
    engine = make_engine(settings.resolved_database_url, busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    state = AppState(
        settings=settings,
        engine=engine,
        sessionmaker=make_sessionmaker(engine),
        model_client=model_client or model_client_for(settings),
        rate_limiter=RateLimiter(settings),
        attempts_in_flight=AttemptsInFlight(per_writer=settings.model_requests_per_writer),
    )
    app.state = state
    metrics = state.metrics = ApiMetrics(state.sessionmaker)
    state.model_client.call_seconds = metrics.model_call
    add_exception_handlers(app)
    include_routers(app, prefix=API_PREFIX)

    @app.get("/health", tags=["health"], response_model=HealthPublic, responses={503: {"model": ErrorResponse}})
    def health() -> HealthPublic | JSONResponse:
        """200 when the database answers and its schema is at the newest migration."""
        from services.db.migrate import head_revision

        try:
            with engine.connect() as connection:
                revision = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
        except SQLAlchemyError as exc:
            return _error(503, "database_unavailable", f"database unreachable or not migrated: {str(exc)[:200]}")
        head = head_revision()
        if revision != head:
            return _error(
                503, "schema_outdated", f"schema is at {revision}, code expects {head}; run `dynaloop db upgrade`"
            )
        return HealthPublic(status="ok", schema=str(revision))

    add_metrics_route(app, metrics, settings.metrics_token)

    # Added first, so it runs inside BodySizeLimit: the body it reads is already bounded.
    app.add_middleware(JsonDepthLimit, max_depth=settings.max_input_depth)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    # Outermost: requests beyond the limits are answered before anything else runs.
    app.add_middleware(
        OverloadGuard,
        max_requests=settings.max_concurrent_requests,
        max_model_requests=settings.max_concurrent_model_requests,
        model_requests_per_token=settings.model_requests_per_writer,
        requests_per_token=settings.requests_per_token,
        burst_penalty_s=settings.burst_penalty_s,
        model_routes=[
            (API_PREFIX + route.path, route.methods or set())
            for route in assignments.router.routes
            if isinstance(route, APIRoute) and original_endpoint(route.endpoint) in assignments.MODEL_BOUND_ENDPOINTS
        ],
        shed_counter=metrics.shed_counter,
    )
    # Outside even the guard: its refusals get a request id and are timed and counted too.
    app.add_middleware(
        RequestMetrics, metrics=metrics, routes=app.router.routes, access_log=settings.log_format == "json"
    )
    return app
