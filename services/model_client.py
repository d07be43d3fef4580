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

import logging
import time
from dataclasses import dataclass

import httpx
from pydantic import BaseModel, Field, ValidationError

logger = logging.getLogger(__name__)


class ModelServerError(Exception):
    """The model server could not be reached, timed out, or answered with an error or bad body."""


class _ModelInfo(BaseModel):
    id: str
    version: str = ""


class _Prediction(BaseModel):
    label: str | None = None
    labels: list[str]
    probabilities: dict[str, float] = Field(default_factory=dict)
    truncated: bool = False


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


@dataclass(frozen=True)
class NoPrediction:
    """Why the model gave no prediction: none is in the loop, or its server is unreachable,
    timed out, or answered with an error or a body that breaks the contract."""

    error: str


# The model's answer to one attempt.
ModelAnswer = ModelPrediction | NoPrediction


class ModelClient:
    """Calls model servers over HTTP with a timeout and a bounded number of retries."""

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.05,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 2.0)),
            transport=transport,
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        )

    def close(self) -> None:
        self._http.close()

    def predict(self, endpoint: str, text: str, target: str | None = None) -> ModelPrediction:
        payload = {"texts": [text], "targets": [target] if target is not None else None}
        url = endpoint.rstrip("/") + "/predict"
        last_error = "no attempt made"
        for attempt in range(self.retries + 1):
            started = time.perf_counter()
            try:
                response = self._http.post(url, json=payload)
            except httpx.TimeoutException:
                last_error = f"model server at {endpoint} timed out"
            except httpx.TransportError as exc:
                last_error = f"model server at {endpoint} is unreachable ({type(exc).__name__})"
            else:
                latency_ms = (time.perf_counter() - started) * 1000
                if response.status_code >= 500 or response.status_code == 429:
                    last_error = f"model server at {endpoint} answered HTTP {response.status_code}"
                elif response.status_code != 200:
                    # A 4xx will not get better by retrying.
                    raise ModelServerError(
                        f"model server at {endpoint} refused the request "
                        f"(HTTP {response.status_code}): {response.text[:300]}"
                    )
                else:
                    return self._parse(endpoint, response, latency_ms)
            logger.warning("predict try %d/%d failed: %s", attempt + 1, self.retries + 1, last_error)
            if attempt < self.retries:
                time.sleep(self.backoff_s * (2**attempt))
        raise ModelServerError(last_error)

    def inspect(self, endpoint: str, text: str, label: str, target: str | None = None) -> list[dict[str, object]]:
        """Token attributions for ``label`` from ``POST {endpoint}/inspect`` (one try: it is
        an optional aid for writers, not part of the attempt)."""
        try:
            response = self._http.post(
                endpoint.rstrip("/") + "/inspect", json={"text": text, "label": label, "target": target}
            )
        except httpx.HTTPError as exc:
            raise ModelServerError(f"model server at {endpoint} is unreachable ({type(exc).__name__})") from exc
        if response.status_code in (404, 501):
            raise ModelServerError(f"the model server at {endpoint} does not offer token attributions")
        if response.status_code != 200:
            raise ModelServerError(
                f"model server at {endpoint} answered HTTP {response.status_code}: {response.text[:300]}"
            )
        tokens = response.json().get("tokens")
        if not isinstance(tokens, list):
            raise ModelServerError(f"model server at {endpoint} answered /inspect without `tokens`")
        return tokens

    def info(self, endpoint: str) -> dict[str, object]:
        try:
            response = self._http.get(endpoint.rstrip("/") + "/info")
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ModelServerError(f"model server at {endpoint} gave no info: {exc}") from exc
        if not isinstance(body, dict):
            raise ModelServerError(f"model server at {endpoint} answered /info with a non-object")
        return body

    @staticmethod
    def _parse(endpoint: str, response: httpx.Response, latency_ms: float) -> ModelPrediction:
        try:
            body = _PredictResponse.model_validate_json(response.content)
        except ValidationError as exc:
            raise ModelServerError(
                f"model server at {endpoint} answered with a body that breaks the contract: {exc.errors()[0]['msg']}"
            ) from exc
        if len(body.predictions) != 1:
            raise ModelServerError(
                f"model server at {endpoint} returned {len(body.predictions)} predictions for 1 text"
            )
        prediction = body.predictions[0]
        return ModelPrediction(
            labels=prediction.labels,
            probabilities=prediction.probabilities,
            model_id=body.model.id,
            model_version=body.model.version,
            endpoint=endpoint,
            latency_ms=latency_ms,
            truncated=prediction.truncated,
        )
