"""The model server's HTTP layer: /predict, /info, /health, /metrics, /inspect, /admin/reload.

The HTTP handlers only validate and enqueue; the :class:`~model_server.batching.Batcher`
thread runs the forward passes. A reload builds the new backend in a thread while the old
one keeps serving, then swaps one reference: a batch already running finishes on the model
it started with. With ``ServerConfig.follow`` the server follows its task's promoted model
(:mod:`model_server.follow`) and reloads itself.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from model_server.backends import Backend, ClassifyInput, ClassifyOutput, load_backend
from model_server.batching import Batcher, BatchStats, DeadlineExceeded, ServerStopping
from model_server.follow import Follower, Registry

logger = logging.getLogger(__name__)

MAX_TEXT_CHARS = 20_000


@dataclass
class FollowSettings:
    """Follow a task's promoted model (`dynaloop model-server --follow-task`)."""

    registry: Registry
    interval_s: float = 2.0


@dataclass
class ServerConfig:
    model_dir: Path | None  # None only when following: the promoted model is loaded
    backend: str = "transformers"
    device: str | None = None
    precision: str = "auto"  # fp32, bf16, int8 or auto (model_directory.runtime)
    max_batch_size: int = 32
    max_wait_ms: float = 0.0
    # Under load, keep collecting returning callers (see model_server.batching.linger); 0 turns it off.
    linger_gap_ms: float = 20.0
    linger_max_ms: float = 150.0
    request_timeout_s: float = 10.0
    max_texts_per_request: int = 64
    admin_token: str | None = None
    load_in_background: bool = True
    follow: FollowSettings | None = None


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


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"code": code, "message": message}}, headers=headers)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "dynaloop_model_requests", "Requests by endpoint and outcome", ["endpoint", "outcome"], registry=r
        )
        self.texts = Counter("dynaloop_model_texts", "Texts classified", registry=r)
        self.batch_size = Histogram(
            "dynaloop_model_batch_size", "Texts per forward pass", buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r
        )
        self.queue_wait = Histogram(
            "dynaloop_model_queue_wait_seconds",
            "Time a text waited for its batch",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.latency = Histogram(
            "dynaloop_model_request_latency_seconds",
            "Latency of /predict",
            buckets=(0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.queue_depth = Gauge("dynaloop_model_queue_depth", "Texts waiting", registry=r)
        self.reloads = Counter("dynaloop_model_reloads", "Model reloads by outcome", ["outcome"], registry=r)


class ModelHost:
    """Holds the serving backend and swaps it atomically."""

    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.backend: Backend | None = None
        self.backend_kind = config.backend
        self.precision = config.precision
        self.load_error: str | None = None
        self._reload_lock = threading.Lock()
        self.batcher: Batcher[ClassifyInput, tuple[ClassifyOutput, Backend]] = Batcher(
            self._forward,
            max_batch_size=config.max_batch_size,
            max_wait_s=config.max_wait_ms / 1000,
            request_timeout_s=config.request_timeout_s,
            linger_gap_s=config.linger_gap_ms / 1000,
            linger_max_s=config.linger_max_ms / 1000,
            stats=BatchStats(on_batch=metrics.batch_size.observe, on_queue_wait=metrics.queue_wait.observe),
            name="model-batcher",
        )

    def _forward(self, inputs: Sequence[ClassifyInput]) -> list[tuple[ClassifyOutput, Backend]]:
        backend = self.backend  # one reference for the whole batch: a reload cannot split it
        if backend is None:
            raise RuntimeError("no model is loaded")
        return [(output, backend) for output in backend.predict(inputs)]

    def load_initial(self) -> None:
        if self.config.model_dir is None:
            raise ValueError("no model directory to load (only a following server starts without one)")
        # Holding the reload lock: a reload asked for during start-up waits its turn (409).
        with self._reload_lock:
            try:
                self.backend = load_backend(
                    self.config.model_dir, self.config.backend, self.config.device, self.config.precision
                )
                logger.info("model %s loaded from %s", self.backend.metadata.model_id, self.config.model_dir)
            except Exception as exc:
                self.load_error = f"{type(exc).__name__}: {exc}"
                logger.exception("could not load %s", self.config.model_dir)

    def reload(self, model_dir: str, backend_kind: str | None, precision: str | None = None) -> Backend:
        if not self._reload_lock.acquire(blocking=False):
            raise RuntimeError("busy")
        try:
            kind = backend_kind or self.backend_kind
            precision = precision or self.precision
            new = load_backend(model_dir, kind, self.config.device, precision)
            old, self.backend, self.backend_kind, self.precision = self.backend, new, kind, precision
            self.config.model_dir = Path(model_dir)
            self.load_error = None
            if old is not None:
                # Let batches that hold the old model finish before freeing it.
                threading.Timer(30.0, old.close).start()
            return new
        finally:
            self._reload_lock.release()


def describe(backend: Backend, kind: str) -> dict[str, Any]:
    return {
        **backend.metadata.public(),
        # A linear model directory is served by the linear backend whatever the server's default.
        "backend": "linear" if backend.metadata.kind == "linear" else kind,
        "device": backend.device,
        "precision": backend.precision_info(),
    }


def create_model_app(config: ServerConfig) -> FastAPI:
    metrics = Metrics()
    host = ModelHost(config, metrics)
    follower = (
        Follower(host, config.follow.registry, interval_s=config.follow.interval_s, fallback_dir=config.model_dir)
        if config.follow is not None
        else None
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        host.batcher.start()
        if follower is not None:
            follower.start()  # it loads the promoted model (or --model) in its own threads
        elif config.load_in_background:
            threading.Thread(target=host.load_initial, name="model-loader", daemon=True).start()
        else:
            host.load_initial()
        yield
        if follower is not None:
            await asyncio.to_thread(follower.stop)
        host.batcher.stop()

    app = FastAPI(
        title="dynaloop model server",
        version="1",
        lifespan=lifespan,
        description="Serves the round's classifier. Contract: see services/model_client.py.",
    )
    app.state.host = host
    app.state.follower = follower

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return _error(422, "invalid", problems)

    def _not_ready() -> JSONResponse:
        if host.load_error:
            return _error(503, "model_failed", f"the model failed to load: {host.load_error}")
        if follower is not None:
            return _error(503, "loading", f"no model serves yet ({follower.message})", {"Retry-After": "2"})
        return _error(503, "loading", "the model is still loading; retry shortly", {"Retry-After": "2"})

    @app.get("/health")
    def health() -> JSONResponse:
        """200 only once the model is loaded."""
        if host.backend is None:
            return _not_ready()
        return JSONResponse({"status": "ready", "model_id": host.backend.metadata.model_id})

    @app.get("/info")
    def info() -> JSONResponse:
        if host.backend is None:
            return _not_ready()
        answer = describe(host.backend, host.backend_kind)
        if follower is not None:
            answer["replica"] = {"state": follower.state.value, "message": follower.message}
        return JSONResponse(answer)

    @app.post("/predict")
    async def predict(body: PredictRequest) -> JSONResponse:
        started = time.perf_counter()
        backend = host.backend
        if backend is None:
            metrics.requests.labels("predict", "not_ready").inc()
            return _not_ready()
        problem = _check_texts(body, backend, config.max_texts_per_request)
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

    @app.post("/inspect")
    async def inspect(body: InspectRequest) -> JSONResponse:
        """Per-token attributions for ``label`` (integrated gradients over the embeddings)."""
        backend = host.backend
        if backend is None:
            return _not_ready()
        if backend.metadata.input_format == "text_pair" and not body.target:
            return _error(422, "invalid", "this model takes (text, target) pairs; send target")
        if body.label not in backend.metadata.labels:
            return _error(422, "invalid", f"unknown label {body.label!r}; use one of {backend.metadata.labels}")
        try:
            tokens = await asyncio.to_thread(backend.inspect, ClassifyInput(body.text, body.target), body.label)
        except NotImplementedError as exc:
            return _error(501, "not_supported", str(exc))
        metrics.requests.labels("inspect", "ok").inc()
        return JSONResponse(
            {
                "model": {"id": backend.metadata.model_id, "version": backend.metadata.version},
                "label": body.label,
                "tokens": [{"token": t.token, "score": t.score} for t in tokens],
            }
        )

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        metrics.queue_depth.set(host.batcher.queue_depth)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def _still() -> str:
        current = host.backend
        return f"{current.metadata.model_id} is still serving" if current else "no model is loaded"

    @app.post("/admin/reload")
    async def reload(body: ReloadRequest, authorization: str | None = Header(None)) -> JSONResponse:
        """Load another model directory in the background and switch to it atomically."""
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
        try:
            new = await asyncio.to_thread(host.reload, body.model_dir, body.backend, body.precision)
        except RuntimeError as exc:
            if str(exc) == "busy":
                return _error(409, "busy", "another reload is in progress; wait for it to finish")
            metrics.reloads.labels("failed").inc()
            return _error(422, "load_failed", f"{body.model_dir} could not be loaded ({exc}); {_still()}")
        except Exception as exc:
            metrics.reloads.labels("failed").inc()
            logger.warning("reload of %s failed: %s", body.model_dir, exc)
            return _error(
                422, "load_failed", f"{body.model_dir} could not be loaded ({type(exc).__name__}: {exc}); {_still()}"
            )
        metrics.reloads.labels("ok").inc()
        return JSONResponse({"status": "reloaded", **describe(new, host.backend_kind)})

    return app


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
