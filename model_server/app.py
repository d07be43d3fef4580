"""The model server's HTTP layer: /predict, /info, /health, /metrics, /inspect, /admin/reload.

The handlers validate a request and hand it to the :class:`~model_server.host.ModelHost` (the
loaded model, its dynamic batching and hot swap); :func:`create_model_app` assembles the app from
a :class:`~model_server.config.ServerConfig`. With ``ServerConfig.follow`` the server follows its
task's promoted model (:mod:`model_server.follow`) and reloads itself.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from model_server.backends import Backend, ClassifyInput
from model_server.batching import DeadlineExceeded, ServerStopping
from model_server.config import ServerConfig
from model_server.follow import Follower
from model_server.host import ModelHost, describe
from model_server.logs import RequestIds, configure_logging
from model_server.metrics import Metrics

logger = logging.getLogger(__name__)

__all__ = ["create_model_app"]

MAX_TEXT_CHARS = 20_000
MAX_CONCURRENT_INSPECTIONS = 4


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    texts: list[str] = Field(min_length=1)
    targets: list[str | None] | None = None


class InspectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    target: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    label: str


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_dir: str = Field(min_length=1)
    backend: str | None = None
    precision: Literal["fp32", "bf16", "int8", "auto"] | None = None  # default: the server's current one


def create_model_app(config: ServerConfig) -> FastAPI:
    """The model server's app: one :class:`ModelHost` for ``config``, and with ``config.follow``
    the :class:`Follower` that keeps it on the task's promoted model."""
    configure_logging(config.log_format)
    host = ModelHost(config, Metrics())
    follower = (
        Follower(host, config.follow.registry, interval_s=config.follow.interval_s, fallback_dir=config.model_dir)
        if config.follow is not None
        else None
    )
    app = FastAPI(
        title="dynaloop model server",
        version="1",
        lifespan=_lifespan,
        description="Serves the round's classifier. Contract: see services/model_client.py.",
    )
    app.state.host = host
    app.state.follower = follower
    # Attributions computed at once, each in a thread of its own (in_a_thread_that_ends): the
    # executor they ran in before bounded them by its size; the rest wait their turn.
    app.state.inspections = asyncio.Semaphore(MAX_CONCURRENT_INSPECTIONS)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return _error(422, "invalid", problems)

    app.include_router(router)
    # The caller's request id in every log line and in the answer (model_server/logs.py).
    app.add_middleware(RequestIds, access_log=config.log_format == "json")
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    host: ModelHost = app.state.host
    follower: Follower | None = app.state.follower
    host.batcher.start()
    if follower is not None:
        follower.start()  # it loads the promoted model (or --model) in its own threads
    elif host.config.load_in_background:
        threading.Thread(target=host.load_initial, name="model-loader", daemon=True).start()
    else:
        host.load_initial()
    yield
    if follower is not None:
        await asyncio.to_thread(follower.stop)
    host.batcher.stop()


# The dependencies are coroutines so that none of them costs a trip through the thread pool.
async def _host(request: Request) -> ModelHost:
    host: ModelHost = request.app.state.host
    return host


async def _follower(request: Request) -> Follower | None:
    follower: Follower | None = request.app.state.follower
    return follower


T = TypeVar("T")


async def in_a_thread_that_ends(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a thread of its own that ends with the call, not in the event
    loop's executor, whose threads live on.

    torch's OpenMP keeps a team of helper threads for every thread that ran a parallel region,
    for as long as that thread lives; while a second one lives beside the batcher thread, the
    batcher's forward passes ran on 1.52 cores instead of 1.97, about a fifth slower
    (docs/benchmarks.md, "An AMD EPYC with AVX-512 bf16"). A reload (its precision plan runs
    forward passes) and an attribution (``/inspect``) both compute with torch."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()  # the request's id, for the log lines of the call

    def settle(result: T | None, error: BaseException | None) -> None:
        if answer.cancelled():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = context.run(function, *args)
        except BaseException as exc:  # handed to the awaiting request, as asyncio.to_thread does
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name=f"model-{getattr(function, '__name__', 'call')}", daemon=True).start()
    return await answer


HostDep = Annotated[ModelHost, Depends(_host)]
FollowerDep = Annotated[Follower | None, Depends(_follower)]

router = APIRouter()


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"code": code, "message": message}}, headers=headers)


def _not_ready(host: ModelHost, follower: Follower | None) -> JSONResponse:
    if host.load_error:
        return _error(503, "model_failed", f"the model failed to load: {host.load_error}")
    if follower is not None:
        return _error(503, "loading", f"no model serves yet ({follower.message})", {"Retry-After": "2"})
    return _error(503, "loading", "the model is still loading; retry shortly", {"Retry-After": "2"})


@router.get("/health")
def health(host: HostDep, follower: FollowerDep) -> JSONResponse:
    """200 only once the model is loaded."""
    if host.backend is None:
        return _not_ready(host, follower)
    return JSONResponse({"status": "ready", "model_id": host.backend.metadata.model_id})


@router.get("/info")
def info(host: HostDep, follower: FollowerDep) -> JSONResponse:
    if host.backend is None:
        return _not_ready(host, follower)
    answer = describe(host.backend, host.backend_kind)
    if follower is not None:
        answer["replica"] = {"state": follower.state.value, "message": follower.message}
    return JSONResponse(answer)


@router.post("/predict")
async def predict(body: PredictRequest, host: HostDep, follower: FollowerDep) -> JSONResponse:
    started = time.perf_counter()
    metrics = host.metrics
    backend = host.backend
    if backend is None:
        metrics.requests.labels("predict", "not_ready").inc()
        return _not_ready(host, follower)
    problem = _check_texts(body, backend, host.config.max_texts_per_request)
    if problem:
        metrics.requests.labels("predict", "invalid").inc()
        return _error(422, "invalid", problem)
    targets = body.targets or [None] * len(body.texts)
    inputs = [ClassifyInput(text, target) for text, target in zip(body.texts, targets, strict=True)]
    metrics.queue_depth.set(host.batcher.queue_depth)
    try:
        results = await host.batcher.submit(inputs)
    except DeadlineExceeded as exc:
        metrics.requests.labels("predict", "deadline").inc()
        return _error(503, "overloaded", f"the model server is overloaded ({exc}); retry", {"Retry-After": "1"})
    except ServerStopping as exc:
        metrics.requests.labels("predict", "stopping").inc()
        return _error(503, "stopping", str(exc), {"Retry-After": "2"})
    except ValueError as exc:
        metrics.requests.labels("predict", "invalid").inc()
        return _error(422, "invalid", str(exc))
    except Exception as exc:
        metrics.requests.labels("predict", "error").inc()
        logger.exception("predict failed")
        return _error(500, "model_error", f"the model failed on this batch: {type(exc).__name__}: {exc}")
    served_by = results[0][1].metadata
    metrics.requests.labels("predict", "ok").inc()
    metrics.texts.inc(len(inputs))
    metrics.latency.observe(time.perf_counter() - started)
    return JSONResponse(
        {
            "model": {"id": served_by.model_id, "version": served_by.version, "precision": host.precision},
            "predictions": [
                {
                    "label": output.labels[0],
                    "labels": output.labels,
                    "probabilities": output.probabilities,
                    "truncated": output.truncated,
                    "precision": output.precision,
                }
                for output, _ in results
            ],
        }
    )


async def _inspections(request: Request) -> asyncio.Semaphore:
    inspections: asyncio.Semaphore = request.app.state.inspections
    return inspections


@router.post("/inspect")
async def inspect(
    body: InspectRequest,
    host: HostDep,
    follower: FollowerDep,
    inspections: Annotated[asyncio.Semaphore, Depends(_inspections)],
) -> JSONResponse:
    """Per-token attributions for ``label`` (integrated gradients over the embeddings)."""
    backend = host.backend
    if backend is None:
        return _not_ready(host, follower)
    if backend.metadata.input_format == "text_pair" and not body.target:
        return _error(422, "invalid", "this model takes (text, target) pairs; send target")
    if body.label not in backend.metadata.labels:
        return _error(422, "invalid", f"unknown label {body.label!r}; use one of {backend.metadata.labels}")
    try:
        async with inspections:
            tokens = await in_a_thread_that_ends(backend.inspect, ClassifyInput(body.text, body.target), body.label)
    except NotImplementedError as exc:
        return _error(501, "not_supported", str(exc))
    host.metrics.requests.labels("inspect", "ok").inc()
    return JSONResponse(
        {
            "model": {"id": backend.metadata.model_id, "version": backend.metadata.version},
            "label": body.label,
            "tokens": [{"token": t.token, "score": t.score} for t in tokens],
        }
    )


@router.get("/metrics")
def prometheus_metrics(host: HostDep) -> Response:
    host.metrics.queue_depth.set(host.batcher.queue_depth)
    return Response(generate_latest(host.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.post("/admin/reload")
async def reload(body: ReloadRequest, host: HostDep, authorization: str | None = Header(None)) -> JSONResponse:
    """Load another model directory in the background and switch to it atomically."""
    refused = _refuse_admin(host.config, authorization)
    if refused is not None:
        return refused
    try:
        new = await in_a_thread_that_ends(host.reload, body.model_dir, body.backend, body.precision)
    except RuntimeError as exc:
        if str(exc) == "busy":
            return _error(409, "busy", "another reload is in progress; wait for it to finish")
        host.metrics.reloads.labels("failed").inc()
        return _error(422, "load_failed", f"{body.model_dir} could not be loaded ({exc}); {_still(host)}")
    except Exception as exc:
        host.metrics.reloads.labels("failed").inc()
        logger.warning("reload of %s failed: %s", body.model_dir, exc)
        return _error(
            422, "load_failed", f"{body.model_dir} could not be loaded ({type(exc).__name__}: {exc}); {_still(host)}"
        )
    host.metrics.reloads.labels("ok").inc()
    return JSONResponse({"status": "reloaded", **describe(new, host.backend_kind)})


def _refuse_admin(config: ServerConfig, authorization: str | None) -> JSONResponse | None:
    """The answer to an admin request without the server's admin token; None when it has it."""
    if not config.admin_token:
        return _error(
            403,
            "disabled",
            "reload is disabled; start the server with --admin-token (or DYNALOOP_MODEL_SERVER_ADMIN_TOKEN)",
        )
    given = (authorization or "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), config.admin_token.encode()):
        return _error(
            401,
            "unauthorized",
            "send the admin token: `Authorization: Bearer <token>`",
            {"WWW-Authenticate": "Bearer"},
        )
    return None


def _still(host: ModelHost) -> str:
    current = host.backend
    return f"{current.metadata.model_id} is still serving" if current else "no model is loaded"


def _check_texts(body: PredictRequest, backend: Backend, max_texts: int) -> str | None:
    if len(body.texts) > max_texts:
        return f"{len(body.texts)} texts in one request; send at most {max_texts}"
    for index, text in enumerate(body.texts):
        if not text.strip():
            return f"texts[{index}] is empty"
        if len(text) > MAX_TEXT_CHARS:
            return f"texts[{index}] has {len(text)} characters; the limit is {MAX_TEXT_CHARS}"
    if body.targets is not None and len(body.targets) != len(body.texts):
        return f"targets has {len(body.targets)} entries for {len(body.texts)} texts; send one per text"
    if backend.metadata.input_format == "text_pair" and (body.targets is None or any(not t for t in body.targets)):
        return "this model takes (text, target) pairs; send a non-empty target for every text"
    return None
