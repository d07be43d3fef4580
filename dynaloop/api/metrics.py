"""The API's Prometheus metrics (``GET /metrics``), its request ids and its access log
(docs/deploy.md, "Logs and metrics").

:class:`RequestMetrics`, the outermost middleware, gives each request its id
(services/observability.py), times it into a histogram per route and counts it by status. The
route label is the route's path template (``/api/v1/assignments/{assignment_id}/attempts``),
``unmatched`` for a path no route has, and the method one of the HTTP methods or ``other``: a
client cannot add label values. The overload guard (dynaloop/api/overload.py) and the domain's
refusals count what they shed by reason; the model client (services/model_client.py) times each
model call. Job queue depth and study sessions by state are read from the database when
Prometheus scrapes (:class:`StateCollector`), from one bounded query each.

``/metrics`` answers only the bearer token of ``DYNALOOP_METRICS_TOKEN``; without one set it
answers 404. Under uvicorn with several worker processes, set ``PROMETHEUS_MULTIPROC_DIR`` (an
empty folder, before the process starts; `dynaloop api --workers N` makes one): every worker
writes its figures there, and whichever worker answers the scrape reports them all.
"""

from __future__ import annotations

import datetime as dt
import hmac
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse, Response
from fastapi.routing import iter_route_contexts
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector
from pydantic import SecretStr
from sqlalchemy import case, func, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.db.models import Job, JobQueue, JobStatus, StudySession, StudySessionStatus, utcnow
from services.observability import new_request_id, request_id, safe_request_id

__all__ = ["UNMATCHED", "ApiMetrics", "RequestMetrics", "StateCollector", "add_metrics_route"]

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("dynaloop.access")

MULTIPROCESS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
UNMATCHED = "unmatched"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Requests: a read takes milliseconds, an attempt waits for the model (deadline 5 s), an export streams.
REQUEST_BUCKETS = (0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
MODEL_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# An active study session not seen for this long is counted as idle (stuck, or a closed tab).
IDLE_AFTER = dt.timedelta(minutes=30)
# The most a scrape's database queries may take (PostgreSQL's statement_timeout).
STATE_QUERY_TIMEOUT_MS = 2000


def prepare_multiprocess_folder() -> Path:
    """Before uvicorn starts several worker processes: ``PROMETHEUS_MULTIPROC_DIR`` emptied of an
    earlier run's figures, or a new temporary folder when it is unset (and set for the workers)."""
    given = os.environ.get(MULTIPROCESS_DIR_VARIABLE)
    folder = Path(given) if given else Path(tempfile.mkdtemp(prefix="dynaloop-metrics-"))
    folder.mkdir(parents=True, exist_ok=True)
    # prometheus_client's own files only (counter_<pid>.db, gauge_livesum_<pid>.db, ...): a folder
    # set by mistake to the data folder must not lose the SQLite database (dynaloop.db).
    for kind in ("counter", "gauge", "histogram", "summary"):
        for old in folder.glob(f"{kind}_*.db"):
            old.unlink()
    os.environ[MULTIPROCESS_DIR_VARIABLE] = str(folder)
    return folder


class StateCollector(Collector):
    """Job queue depth and study sessions by state, read from the database at each scrape: one
    grouped count over ``jobs`` (queued and running only) and one over ``study_sessions``. Every
    queue, status and state is reported, 0 when none is; ``dynaloop_state_up`` is 0 when the
    database did not answer (the other figures are then left out)."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory

    def describe(self) -> Iterable[Metric]:
        return []  # nothing is read from the database when the collector is registered

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("dynaloop_state_up", "1 when the scrape's database queries answered")
        try:
            jobs, sessions = self._read()
        except SQLAlchemyError as exc:
            logger.warning("metrics: the database queries failed: %s", str(exc)[:200])
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        return [up, jobs, sessions[0], sessions[1]]

    def _read(self) -> tuple[GaugeMetricFamily, tuple[GaugeMetricFamily, GaugeMetricFamily]]:
        cutoff = utcnow() - IDLE_AFTER
        with self.factory() as session:
            if session.get_bind().dialect.name == "postgresql":
                session.execute(text(f"SET LOCAL statement_timeout = {STATE_QUERY_TIMEOUT_MS}"))
            job_rows = session.execute(
                select(Job.queue, Job.status, func.count())
                .where(Job.status.in_([JobStatus.queued, JobStatus.running]))
                .group_by(Job.queue, Job.status)
            ).all()
            session_rows = session.execute(
                select(
                    StudySession.status,
                    func.count(),
                    func.sum(case((StudySession.last_seen_at < cutoff, 1), else_=0)),
                ).group_by(StudySession.status)
            ).all()
        jobs = GaugeMetricFamily("dynaloop_jobs", "Jobs queued or running, per queue", labels=["queue", "status"])
        counted = {(queue, status): n for queue, status, n in job_rows}
        for queue in JobQueue:
            for status in (JobStatus.queued, JobStatus.running):
                jobs.add_metric([queue.value, status.value], counted.get((queue, status), 0))
        by_state = GaugeMetricFamily("dynaloop_study_sessions", "Study sessions by state", labels=["state"])
        idle = GaugeMetricFamily(
            "dynaloop_study_sessions_idle",
            f"Study sessions in a state and not seen for {int(IDLE_AFTER.total_seconds() // 60)} minutes",
            labels=["state"],
        )
        rows = {status: (n, int(stale or 0)) for status, n, stale in session_rows}
        for state in StudySessionStatus:
            n, stale = rows.get(state, (0, 0))
            by_state.add_metric([state.value], n)
            idle.add_metric([state.value], stale if state is StudySessionStatus.active else 0)
        return jobs, (by_state, idle)


class ApiMetrics:
    """The metrics of one API process, on a registry of its own (every app a test builds has one)."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.multiprocess = bool(os.environ.get(MULTIPROCESS_DIR_VARIABLE))
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "dynaloop_api_requests", "Requests answered, by method, route and status", ["method", "route", "status"],
            registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "dynaloop_api_request_duration_seconds",
            "Time from a request's arrival to the end of its answer, by method and route",
            ["method", "route"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "dynaloop_api_requests_in_flight", "Requests being answered", multiprocess_mode="livesum", registry=r
        )
        self.shed = Counter(
            "dynaloop_api_shed",
            "Requests refused before any work was done on them, by reason (docs/deploy.md)",
            ["reason"],
            registry=r,
        )
        self.model_call = Histogram(
            "dynaloop_api_model_call_duration_seconds",
            "A whole model call (the wait for a slot and the retries included), by call and outcome",
            ["call", "outcome"],
            buckets=MODEL_CALL_BUCKETS,
            registry=r,
        )
        self.state = StateCollector(factory)
        r.register(self.state)

    def shed_counter(self, reason: str) -> Callable[[], None]:
        """The increment of ``dynaloop_api_shed_total{reason=...}``, bound once."""
        return self.shed.labels(reason).inc

    def render(self) -> bytes:
        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            registry.register(self.state)
            return generate_latest(registry)
        return generate_latest(self.registry)

    def process_exit(self) -> None:
        """Drop this process's live gauges from the shared folder (a worker that stops)."""
        if self.multiprocess:
            mark_process_dead(os.getpid())


def route_templates(routes: Sequence[BaseRoute]) -> Iterator[tuple[BaseRoute, re.Pattern[str], str]]:
    """(route as declared, its path's pattern, its whole path template) of every route, those
    of included routers under their prefix."""
    for context in iter_route_contexts(routes):
        path, regex = context.path, getattr(context, "path_regex", None)
        if isinstance(path, str) and regex is not None:
            yield context.original_route, regex, path


class RequestMetrics:
    """Pure ASGI (no BaseHTTPMiddleware): per request, a header scan, a perf_counter pair, the
    in-flight gauge up and down, and one observation into children bound once per
    (method, route, status). With ``access_log``, one line per request on ``dynaloop.access``."""

    def __init__(self, app: ASGIApp, *, metrics: ApiMetrics, routes: Sequence[BaseRoute], access_log: bool) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log
        # The router leaves the route it chose in scope["route"]: the route as declared, whose
        # `path` lacks the prefix of the router that included it (/api/v1). Its whole
        # template, by the route's id:
        self.templates: dict[int, str] = {}
        # Requests answered before routing (the overload guard's refusals, a body too large)
        # carry no route: their template is found by path, from these.
        self.patterns: list[tuple[re.Pattern[str], str]] = []
        for route, regex, template in route_templates(routes):
            self.templates[id(route)] = template
            self.patterns.append((regex, template))
        self.children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def _route(self, scope: Scope, status: int) -> str:
        route = scope.get("route")
        if route is not None:
            template = self.templates.get(id(route))
            if template is not None:
                return template
        if status != 404:
            for regex, template in self.patterns:
                if regex.match(scope["path"]):
                    return template
        return UNMATCHED

    def _observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        children = self.children.get(key)
        if children is None:
            children = (
                self.metrics.duration.labels(method, route),
                self.metrics.requests.labels(method, route, str(status)),
            )
            self.children[key] = children
        children[0].observe(seconds)
        children[1].inc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        given = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                given = safe_request_id(value)
                break
        current = given or new_request_id()
        token = request_id.set(current)
        id_header = (b"x-request-id", current.encode())
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        in_flight = self.metrics.in_flight
        in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            in_flight.dec()
            seconds = time.perf_counter() - started
            method = scope["method"] if scope["method"] in METHODS else "other"
            route = self._route(scope, status)
            self._observe(method, route, status, seconds)
            if self.access_log:
                access_logger.info(
                    "%s %s %d",
                    method,
                    route,
                    status,
                    extra={
                        "request_id": current,
                        "method": method,
                        "route": route,
                        "status": status,
                        "duration_ms": round(seconds * 1e3, 2),
                    },
                )
        # Left set when the app raised: the 500's handler, outside this middleware, logs the
        # traceback with the id (each request runs in a task, and so a context, of its own).
        request_id.reset(token)


def add_metrics_route(app: FastAPI, metrics: ApiMetrics, token: SecretStr | None) -> None:
    """``GET /metrics`` for Prometheus, answered only to ``Authorization: Bearer <token>``
    (404 when no token is set, 401 for any other); left out of the OpenAPI document."""
    expected = token.get_secret_value().encode() if token is not None else None

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics(authorization: str | None = Header(None)) -> Response:
        if expected is None:
            return JSONResponse(
                status_code=404,
                content={"error": {"code": "not_found", "message": "there is no endpoint GET /metrics", "details": {}}},
            )
        scheme, _, given = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            return JSONResponse(
                status_code=401,
                content={
                    "error": {
                        "code": "unauthorized",
                        "message": "send the metrics token: `Authorization: Bearer <token>`",
                        "details": {},
                    }
                },
                headers={"WWW-Authenticate": "Bearer"},
            )
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
