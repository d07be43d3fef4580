"""The backend's one door to a model server.

Contract (implemented by ``model_server``, and by the test stub in ``tests/``):

``POST {endpoint}/predict`` with ``{"texts": [...], "targets": [...] | null}`` answers
``{"model": {"id": str, "version": str}, "predictions": [{"label": str | null,
"labels": [str], "probabilities": {label: float}, "truncated": bool}]}`` -- one prediction
per text, in order. ``label`` is the argmax for single-label models; ``labels`` is the
predicted set (one element for single-label models, any subset for multi-label ones).
``targets`` carries the target span text for target-dependent tasks (sentence-pair input).

``GET {endpoint}/info`` answers ``{"model_id": str, "version": str, "labels": [str], ...}``.

``POST {endpoint}/inspect`` (optional) with ``{"text", "label", "target"}`` answers
``{"tokens": [{"token": str, "score": float}]}``: per-token attributions for the label.
"""

from __future__ import annotations

import functools
import json
import logging
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import urllib3
from prometheus_client import Histogram
from pydantic import BaseModel, Field, ValidationError
from urllib3.exceptions import HTTPError as TransportError
from urllib3.exceptions import NewConnectionError
from urllib3.exceptions import TimeoutError as TransportTimeout

from services.observability import REQUEST_ID_HEADER, request_id

logger = logging.getLogger(__name__)


class ModelServerError(Exception):
    """The model server could not be reached, timed out, or answered with an error or bad body.

    The message is a short reason meant for researchers' records (``Attempt.model_error``):
    it never quotes what the server sent (that goes to the log only) and never names the
    server's URL."""


class ModelSlotsBusy(ModelServerError):
    """Every model-call slot of this process stayed taken for the whole queue wait."""


# What a model server may say a forward pass ran at (fp32, bf16, int8, a vLLM dtype such as bfloat16).
_PRECISION = Field(None, max_length=40, pattern=r"^[A-Za-z0-9_.-]+$")


class _ModelInfo(BaseModel):
    id: str
    version: str = ""
    precision: str | None = _PRECISION


class _Prediction(BaseModel):
    label: str | None = None
    labels: list[str]
    probabilities: dict[str, float] = Field(default_factory=dict)
    truncated: bool = False
    precision: str | None = _PRECISION


class _PredictResponse(BaseModel):
    model: _ModelInfo
    predictions: list[_Prediction]


@dataclass(frozen=True)
class ModelPrediction:
    """What the model said about one text."""

    labels: list[str]  # the predicted label (single-label models) or label set (multi-label)
    probabilities: dict[str, float]  # label -> probability
    model_id: str
    model_version: str
    endpoint: str  # the model server that answered
    latency_ms: float
    truncated: bool  # the text was longer than the model reads
    precision: str | None = None  # what the forward pass ran at (fp32, bf16, int8), where the server says


@dataclass(frozen=True)
class NoPrediction:
    """Why the model gave no prediction: none is in the loop, or its server is unreachable,
    timed out, or answered with an error or a body that breaks the contract (``error``, a
    short reason for researchers' records); ``busy``: it was not asked, every model-call slot
    was taken; ``for_writer``: ``error`` is the backend's own advice (no model is in the loop),
    fit to show the writer as it is."""

    error: str
    busy: bool = False
    for_writer: bool = False


# The model's answer to one attempt.
ModelAnswer = ModelPrediction | NoPrediction


# The most of a model server's answer that is read; a larger body breaks the contract.
MAX_ANSWER_BYTES = 1024 * 1024
# What of an error body goes to the log (never to a writer).
LOGGED_BODY_CHARS = 300


@functools.cache
def _default_ssl_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's CA bundle, ``SSL_CERT_FILE``/``SSL_CERT_DIR``) for the
    client's connection pools, built once per process: loading the CA bundle costs about 60 ms,
    and every app (and every test's app) builds a model client. One context may wrap many
    connections, across threads."""
    return httpx.create_ssl_context()


class _DeadlinePassed(TransportTimeout):
    """The deadline passed while the answer arrived: a timeout like any other."""


def _timed_out(exc: BaseException) -> bool:
    """Whether a transport error is a timeout. urllib3 counts a refused or unresolvable
    connection (``NewConnectionError``) as a connect timeout; here it is an unreachable server."""
    return isinstance(exc, TransportTimeout) and not isinstance(exc, NewConnectionError)


class ModelClient:
    """Calls model servers over HTTP, as a bulkhead: at most ``max_concurrency`` calls at once
    (a call waits at most ``queue_wait_s`` for a free slot, else :class:`ModelSlotsBusy`), and each
    call, retries and the wait included, ends within ``deadline_s``.

    Each try waits at most the smaller of ``timeout_s`` and what is left of the deadline; a
    retry (connection error, timeout, 5xx, 429) starts only while time is left.

    The calls go through urllib3's connection pools: a model call is on the path of every
    writer's check, and through httpx it cost the API about twice the CPU (467 against 236 µs
    a call to a local stub, docs/benchmarks.md, "API CPU per request"). urllib3 retries and
    follows redirects by default; here it does neither (the client's own retries above, and a
    model server's address is the one an admin registered, never one it redirects to). Unlike
    httpx, it reads no ``HTTP_PROXY`` from the environment: a model server is called directly."""

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.05,
        deadline_s: float = 5.0,
        max_concurrency: int = 16,
        queue_wait_s: float = 0.5,
    ) -> None:
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.deadline_s = deadline_s
        self.max_concurrency = max_concurrency
        self.queue_wait_s = min(queue_wait_s, deadline_s)
        self._slots = threading.BoundedSemaphore(max_concurrency)
        # At most max_concurrency calls run at once (the slots), so as many kept-alive
        # connections per model server suffice; a pool per server, for up to 64 servers.
        self._pools = urllib3.PoolManager(
            num_pools=64,
            maxsize=max_concurrency,
            retries=False,
            timeout=urllib3.Timeout(connect=min(timeout_s, 2.0), read=timeout_s),
            ssl_context=_default_ssl_context(),
        )
        # The API's model-call histogram (dynaloop/api/metrics.py), labelled by call and outcome.
        self.call_seconds: Histogram | None = None

    def close(self) -> None:
        self._pools.clear()

    @contextmanager
    def _timed(self, call: str) -> Iterator[None]:
        """Time one whole call (the wait for a slot and the retries included: what the writer
        waits for) into ``call_seconds``: outcome ``ok``, ``busy`` (no slot) or ``error``."""
        if self.call_seconds is None:
            yield
            return
        started = time.perf_counter()
        outcome = "error"
        try:
            yield
            outcome = "ok"
        except ModelSlotsBusy:
            outcome = "busy"
            raise
        finally:
            self.call_seconds.labels(call, outcome).observe(time.perf_counter() - started)

    @contextmanager
    def _slot(self, deadline: float) -> Iterator[None]:
        """One of the ``max_concurrency`` model-call slots, for the duration of one call."""
        if not self._slots.acquire(timeout=max(0.0, min(self.queue_wait_s, deadline - time.monotonic()))):
            raise ModelSlotsBusy(f"all {self.max_concurrency} model-call slots stayed busy for {self.queue_wait_s:g} s")
        try:
            yield
        finally:
            self._slots.release()

    def _timeout(self, deadline: float) -> urllib3.Timeout | None:
        """The timeout of one try: what is left of the deadline, at most ``timeout_s``; None
        when too little is left to start one."""
        left = min(self.timeout_s, deadline - time.monotonic())
        if left < 0.01:
            return None
        return urllib3.Timeout(connect=min(left, 2.0), read=left)

    def _post(self, url: str, payload: Mapping[str, object], deadline: float) -> tuple[int, bytes] | None:
        """One POST of ``payload`` as JSON: see :meth:`_send`."""
        return self._send("POST", url, json.dumps(payload).encode(), deadline)

    def _send(self, method: str, url: str, body: bytes | None, deadline: float) -> tuple[int, bytes] | None:
        """One request: (status, body read up to MAX_ANSWER_BYTES), or None when no time is left.
        The body is read in chunks and dropped as soon as the deadline passes. Raises urllib3's
        errors (``TransportError``; ``_timed_out`` tells a timeout)."""
        timeout = self._timeout(deadline)
        if timeout is None:
            return None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        # The request's id (services/observability.py): the model server logs it too.
        current = request_id.get()
        if current is not None:
            headers[REQUEST_ID_HEADER] = current
        response = self._pools.request(
            method, url, body=body, headers=headers, timeout=timeout, preload_content=False, redirect=False
        )
        complete = False
        try:
            answer = bytearray()
            for chunk in response.stream(64 * 1024):
                answer += chunk
                if len(answer) > MAX_ANSWER_BYTES:
                    raise ModelServerError(f"the model server's answer is larger than {MAX_ANSWER_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise _DeadlinePassed("the deadline passed while the answer arrived")
            complete = True
            return response.status, bytes(answer)
        finally:
            if not complete:
                # What is left unread must not reach the next request on this connection.
                response.close()
            response.release_conn()

    @staticmethod
    def _log_refusal(endpoint: str, path: str, status: int, body: bytes) -> None:
        excerpt = body[: LOGGED_BODY_CHARS * 4].decode("utf-8", "replace")[:LOGGED_BODY_CHARS]
        logger.warning("model server %s%s answered HTTP %d: %r", endpoint, path, status, excerpt)

    def predict(self, endpoint: str, text: str, target: str | None = None) -> ModelPrediction:
        with self._timed("predict"):
            deadline = time.monotonic() + self.deadline_s
            with self._slot(deadline):
                return self._predict(endpoint, text, target, deadline)

    def _predict(self, endpoint: str, text: str, target: str | None, deadline: float) -> ModelPrediction:
        payload = {"texts": [text], "targets": [target] if target is not None else None}
        url = endpoint.rstrip("/") + "/predict"
        last_error = f"no time was left of the {self.deadline_s:g} s deadline"
        for attempt in range(self.retries + 1):
            started = time.perf_counter()
            try:
                answer = self._post(url, payload, deadline)
            except TransportError as exc:
                last_error = (
                    "the model server timed out"
                    if _timed_out(exc)
                    else f"the model server is unreachable ({type(exc).__name__})"
                )
            else:
                if answer is None:
                    break
                status, body = answer
                latency_ms = (time.perf_counter() - started) * 1000
                if status == 200:
                    return self._parse(endpoint, body, latency_ms)
                self._log_refusal(endpoint, "/predict", status, body)
                if status < 500 and status != 429:
                    # A 4xx will not get better by retrying.
                    raise ModelServerError(f"the model server refused the request (HTTP {status})")
                last_error = f"the model server answered HTTP {status}"
            logger.warning("predict try %d/%d at %s failed: %s", attempt + 1, self.retries + 1, endpoint, last_error)
            if attempt < self.retries:
                pause = self.backoff_s * (2**attempt)
                if time.monotonic() + pause >= deadline:
                    break
                time.sleep(pause)
        raise ModelServerError(last_error)

    def inspect(self, endpoint: str, text: str, label: str, target: str | None = None) -> list[dict[str, object]]:
        """Token attributions for ``label`` from ``POST {endpoint}/inspect`` (one try: it is
        an optional aid for writers, not part of the attempt), in a model-call slot and
        within the deadline like :meth:`predict`."""
        with self._timed("inspect"):
            return self._inspect(endpoint, text, label, target)

    def _inspect(self, endpoint: str, text: str, label: str, target: str | None) -> list[dict[str, object]]:
        deadline = time.monotonic() + self.deadline_s
        with self._slot(deadline):
            try:
                answer = self._post(
                    endpoint.rstrip("/") + "/inspect", {"text": text, "label": label, "target": target}, deadline
                )
            except TransportError as exc:
                if _timed_out(exc):
                    raise ModelServerError("the model server timed out") from exc
                raise ModelServerError(f"the model server is unreachable ({type(exc).__name__})") from exc
        if answer is None:
            raise ModelServerError(f"no time was left of the {self.deadline_s:g} s deadline")
        status, body = answer
        if status in (404, 501):
            raise ModelServerError("the model server does not offer token attributions")
        if status != 200:
            self._log_refusal(endpoint, "/inspect", status, body)
            raise ModelServerError(f"the model server answered HTTP {status}")
        try:
            tokens = json.loads(body).get("tokens")
        except (ValueError, AttributeError):
            tokens = None
        if not isinstance(tokens, list):
            raise ModelServerError("the model server answered /inspect without a list of `tokens`")
        return tokens

    def info(self, endpoint: str) -> dict[str, object]:
        try:
            answer = self._send("GET", endpoint.rstrip("/") + "/info", None, time.monotonic() + self.timeout_s)
            if answer is None or answer[0] >= 400:
                raise ValueError(f"HTTP {answer[0] if answer else 'none'}")
            body = json.loads(answer[1])
        except (TransportError, ValueError) as exc:
            logger.warning("model server %s/info: %s", endpoint, exc)
            raise ModelServerError(f"the model server gave no info ({type(exc).__name__})") from exc
        if not isinstance(body, dict):
            raise ModelServerError("the model server answered /info with a non-object")
        return body

    @staticmethod
    def _parse(endpoint: str, content: bytes, latency_ms: float) -> ModelPrediction:
        try:
            body = _PredictResponse.model_validate_json(content)
        except ValidationError as exc:
            # Where and what kind, never the offending value: it came from the server.
            first = exc.errors(include_input=False, include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"]) or "the body"
            logger.warning(
                "model server %s/predict broke the contract: %s", endpoint, exc.errors(include_url=False)[:3]
            )
            raise ModelServerError(f"the model server's answer breaks the contract ({where}: {first['type']})") from exc
        if len(body.predictions) != 1:
            raise ModelServerError(f"the model server returned {len(body.predictions)} predictions for 1 text")
        prediction = body.predictions[0]
        return ModelPrediction(
            labels=prediction.labels,
            probabilities=prediction.probabilities,
            model_id=body.model.id,
            model_version=body.model.version,
            endpoint=endpoint,
            latency_ms=latency_ms,
            truncated=prediction.truncated,
            precision=prediction.precision or body.model.precision,
        )
