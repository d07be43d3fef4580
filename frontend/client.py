"""The front end's only way to the backend: a small client for the dynaloop REST API.

One method per endpoint the pages use (docs/api.md has the flows). Every method returns the
API's JSON (lists are unwrapped from their ``{"data": [...], "count": n}`` envelope) and
raises :class:`ApiError` with the API's own message on any error, so a page can show
``error.message`` as it is.

Writes that the API can deduplicate always carry an ``Idempotency-Key``. When the caller
gives none, the key is derived from the request's content (for an attempt: the assignment,
the text and the target span), so a click that is retried after a dropped connection, a
double click, or a retry after a 503 never uses a second try or stores a second label.

Example::

    client = ApiClient("http://127.0.0.1:8000")
    client.login("writer", "writer-demo")
    round_ = client.open_rounds()[0]
    assignment = client.start_assignment(round_["id"])
    attempt = client.attempt(assignment["id"], "The host did a great job of making me feel unwanted.")
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx

API_PREFIX = "/api/v1"
# An attempt waits for the model server (10 s timeout, 2 retries with backoff, by default).
DEFAULT_TIMEOUT_S = 60.0

JSON = dict[str, Any]


class ApiError(Exception):
    """An error answer of the API (or no answer at all: ``status`` 0).

    ``code`` and ``message`` come from the API's ``{"error": {"code", "message"}}`` body;
    ``retry_after`` (seconds) from its ``Retry-After`` header on a 503.
    """

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.details = details or {}

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, {self.message!r}, retry_after={self.retry_after})"


def api_root(base_url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/api/v1`` -> ``http://host:8000/api/v1``."""
    root = base_url.strip().rstrip("/")
    return root if root.endswith(API_PREFIX) else root + API_PREFIX


def idempotency_key(kind: str, *parts: Any) -> str:
    """A key that is the same for the same request content (and differs otherwise)."""
    digest = hashlib.sha256(json.dumps(parts, ensure_ascii=False, sort_keys=True, default=str).encode("utf-8"))
    return f"{kind}-{digest.hexdigest()[:32]}"


# The methods' ``idempotency_key`` parameter shadows the function inside them.
_key = idempotency_key


def _retry_after(response: httpx.Response, details: dict[str, Any]) -> float | None:
    header = response.headers.get("Retry-After")
    if header is not None:
        try:
            return float(header)
        except ValueError:
            pass  # an HTTP date: fall back to the body
    value = details.get("retry_after_s")
    return float(value) if isinstance(value, (int, float)) else None


def error_from_response(response: httpx.Response) -> ApiError:
    """The API's error body as an :class:`ApiError`; a sensible message for any other body."""
    code, message, details = "http_error", "", {}
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        code = str(error.get("code") or code)
        message = str(error.get("message") or "")
        details = error.get("details") if isinstance(error.get("details"), dict) else {}
    if not message:
        text = response.text.strip()[:300]
        message = f"the API answered HTTP {response.status_code}" + (f": {text}" if text else "")
    return ApiError(response.status_code, code, message, _retry_after(response, details), details)


class ApiClient:
    """A synchronous client of the dynaloop REST API for one user (one token)."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = api_root(base_url)
        self.token = token
        self.timeout = timeout
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- plumbing ---------------------------------------------------------------------

    def _request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None,
                 content: bytes | None = None, content_type: str | None = None,
                 key: str | None = None) -> httpx.Response:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if key is not None:
            headers["Idempotency-Key"] = key
        if content_type is not None:
            headers["Content-Type"] = content_type
        params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(method, path, json=json_body, params=params or None, content=content,
                                          headers=headers)
        except httpx.TimeoutException as exc:
            raise ApiError(0, "timeout", f"the API at {self.base_url} did not answer within {self.timeout:g} s; "
                           "try again") from exc
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"cannot reach the API at {self.base_url} ({exc}); is the API "
                           "running (`dynaloop api`)?") from exc
        if response.is_error:
            raise error_from_response(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    def _data(self, path: str, **kwargs: Any) -> list[JSON]:
        return list(self._json("GET", path, **kwargs)["data"])

    # --- sign-in ----------------------------------------------------------------------

    def login(self, username: str, password: str) -> JSON:
        """Trade a username and password for a 7-day token; the client uses it from now on."""
        result = self._json("POST", "/auth/login", json_body={"username": username, "password": password})
        self.token = result["token"]
        return result

    def me(self) -> JSON:
        return self._json("GET", "/me")

    # --- tasks and rounds -------------------------------------------------------------

    def tasks(self) -> list[JSON]:
        return self._data("/tasks")

    def task(self, name: str) -> JSON:
        return self._json("GET", f"/tasks/{name}")

    def rounds(self, task: str) -> list[JSON]:
        """The rounds of a task."""
        return self._data(f"/tasks/{task}/rounds")

    def open_rounds(self) -> list[JSON]:
        """Rounds that are collecting or validating, of every task."""
        return self._data("/rounds/open")

    def round(self, round_id: int) -> JSON:
        return self._json("GET", f"/rounds/{round_id}")

    # --- writer: onboarding quiz ------------------------------------------------------

    def quiz(self, task: str) -> JSON:
        """``{"required", "passed", "attempts_used", "attempts_left", "questions"}``."""
        return self._json("GET", f"/tasks/{task}/quiz")

    def answer_quiz(self, task: str, answers: list[str]) -> JSON:
        """``{"passed", "correct", "wrong_questions", "attempts_used", "attempts_left"}``."""
        return self._json("POST", f"/tasks/{task}/quiz/attempts", json_body={"answers": answers})

    # --- writer: assignments, attempts, examples ---------------------------------------

    def start_assignment(self, round_id: int, target_label: str | list[str] | None = None) -> JSON:
        """The writer's open assignment in the round, or a new one (a prompt and a target)."""
        body = {} if target_label is None else {"target_label": target_label}
        return self._json("POST", f"/rounds/{round_id}/assignments", json_body=body)

    def assignment(self, assignment_id: int) -> JSON:
        """An assignment with every attempt so far."""
        return self._json("GET", f"/assignments/{assignment_id}")

    def attempt(self, assignment_id: int, text: str, *, target_span: list[int] | None = None,
                idempotency_key: str | None = None) -> JSON:
        """Check a text against the model in the loop (one try, unless the model is unavailable:
        then :class:`ApiError` 503 with ``retry_after``; resend the same text to retry)."""
        key = idempotency_key or _key("attempt", assignment_id, text, target_span)
        body: JSON = {"text": text}
        if target_span is not None:
            body["target_span"] = list(target_span)
        return self._json("POST", f"/assignments/{assignment_id}/attempts", json_body=body, key=key)

    def confirm(self, attempt_id: int, agrees: bool, judged_label: str | list[str] | None = None, *,
                idempotency_key: str | None = None) -> JSON:
        """"Would a person say this has the target label?" (yes, or no with the label they would give)."""
        key = idempotency_key or _key("confirmation", attempt_id, agrees, judged_label)
        body: JSON = {"agrees": agrees}
        if judged_label is not None:
            body["judged_label"] = judged_label
        return self._json("POST", f"/attempts/{attempt_id}/confirmation", json_body=body, key=key)

    def submit_example(self, assignment_id: int, attempt_id: int, extras: dict[str, Any] | None = None, *,
                       idempotency_key: str | None = None) -> JSON:
        """Submit one attempt of the assignment as the example, with the task's writer fields."""
        key = idempotency_key or _key("example", assignment_id, attempt_id)
        return self._json("POST", f"/assignments/{assignment_id}/example",
                          json_body={"attempt_id": attempt_id, "extras": extras or {}}, key=key)

    def skip(self, assignment_id: int) -> JSON:
        """Switch to the next prompt: the assignment ends without an example."""
        return self._json("POST", f"/assignments/{assignment_id}/skip")

    def inspect(self, assignment_id: int, text: str, *, label: str | None = None,
                target_span: list[int] | None = None) -> JSON:
        """Token attributions of a draft (``{"label", "tokens": [{"token", "score"}]}``); no try used."""
        body: JSON = {"text": text}
        if label is not None:
            body["label"] = label
        if target_span is not None:
            body["target_span"] = list(target_span)
        return self._json("POST", f"/assignments/{assignment_id}/inspect", json_body=body)

    # --- validator --------------------------------------------------------------------

    def validation_batch(self, round_id: int, size: int | None = None) -> JSON:
        """Up to 10 examples by others; asking again returns the examples still held."""
        return self._json("GET", f"/rounds/{round_id}/validation-batch", params={"size": size})

    def validate(self, example_id: int, label: str | list[str], *, flagged: bool = False,
                 flag_reason: str | None = None, seconds_taken: float | None = None,
                 idempotency_key: str | None = None) -> JSON:
        """Label one example (a list for multi-label tasks), optionally flagging it."""
        key = idempotency_key or _key("validation", example_id, label, flagged, flag_reason)
        body: JSON = {"label": label, "flagged": flagged}
        if flag_reason:
            body["flag_reason"] = flag_reason
        if seconds_taken is not None:
            body["seconds_taken"] = round(min(max(seconds_taken, 0.0), 86_400.0), 3)
        return self._json("POST", f"/examples/{example_id}/validations", json_body=body, key=key)

    # --- researcher -------------------------------------------------------------------

    def create_task(self, definition_yaml: str) -> JSON:
        return self._json("POST", "/tasks", json_body={"definition_yaml": definition_yaml})

    def open_round(self, task: str, *, model_endpoints: list[str] | None = None, prompt_strategy: str | None = None,
                   no_prompt_fraction: float | None = None, target_label_mode: str | None = None,
                   notes: str | None = None) -> JSON:
        """Open the task's next round (fields left out take the API's defaults)."""
        body = {"model_endpoints": model_endpoints, "prompt_strategy": prompt_strategy,
                "no_prompt_fraction": no_prompt_fraction, "target_label_mode": target_label_mode, "notes": notes}
        return self._json("POST", f"/tasks/{task}/rounds",
                          json_body={k: v for k, v in body.items() if v is not None})

    def set_model(self, round_id: int, model_endpoints: list[str]) -> JSON:
        return self._json("PUT", f"/rounds/{round_id}/model", json_body={"model_endpoints": model_endpoints})

    def import_prompts(self, round_id: int, content: bytes, filename: str = "prompts.jsonl", *,
                       format: str | None = None) -> JSON:
        """Upload a JSONL or CSV prompt file (the format from ``format`` or the file name)."""
        fmt = format or ("csv" if filename.lower().endswith(".csv") else "jsonl")
        content_type = "text/csv" if fmt == "csv" else "application/x-ndjson"
        return self._json("POST", f"/rounds/{round_id}/prompts", content=content, content_type=content_type,
                          params={"format": fmt})

    def set_round_status(self, round_id: int, status: str) -> JSON:
        """collecting -> validating -> closed."""
        return self._json("POST", f"/rounds/{round_id}/status", json_body={"status": status})

    def round_stats(self, round_id: int) -> JSON:
        return self._json("GET", f"/rounds/{round_id}/stats")

    def worker_agreement(self, round_id: int) -> list[JSON]:
        return list(self._json("GET", f"/rounds/{round_id}/worker-agreement"))

    def example(self, example_id: int) -> JSON:
        """The full record of one example: every attempt, the confirmation, every label."""
        return self._json("GET", f"/examples/{example_id}")

    def apply_worker_quality(self, task: str) -> list[JSON]:
        """Unqualify validators above the task's disagreement threshold; returns them."""
        return list(self._json("POST", f"/tasks/{task}/worker-quality/apply"))

    def unqualify(self, task: str, username: str, reason: str) -> JSON:
        return self._json("POST", f"/tasks/{task}/workers/{username}/unqualify", json_body={"reason": reason})

    def requalify(self, task: str, username: str) -> JSON:
        return self._json("POST", f"/tasks/{task}/workers/{username}/requalify")

    def build_round(self, round_id: int, **options: Any) -> JSON:
        """Aggregate, compute agreement and build the splits of a closed round (options as
        ``BuildOptions``: seed, dev_test_min_votes, chance, max_per_cell, model_based)."""
        return self._json("POST", f"/rounds/{round_id}/build", json_body=options)

    def report(self, task: str, number: int, format: str = "json") -> JSON | str:
        """The newest build's report: a dict, or the Markdown text with ``format="markdown"``."""
        response = self._request("GET", f"/tasks/{task}/rounds/{number}/report", params={"format": format})
        return response.text if format == "markdown" else response.json()

    def download_dataset(self, task: str, number: int, split: str = "train", format: str = "jsonl") -> bytes:
        """One split of the newest build as JSONL, CSV or Parquet bytes."""
        return self._request("GET", f"/tasks/{task}/rounds/{number}/dataset",
                             params={"split": split, "format": format}).content

    # --- jobs and models (researcher pages; added by their helper below this line) -----

    def start_job(self, task: str, kind: str, params: dict[str, Any] | None = None) -> JSON:
        """Start a train, evaluate or promote job (202); poll :meth:`job` for its progress."""
        return self._json("POST", f"/tasks/{task}/jobs", json_body={"kind": kind, "params": params or {}})

    def job(self, job_id: int) -> JSON:
        """A job's status, progress (0-1), message, result and the newest lines of its log."""
        return self._json("GET", f"/jobs/{job_id}")

    def jobs(self, task: str, *, kind: str | None = None, status: str | None = None,
             limit: int | None = None) -> list[JSON]:
        """The task's jobs, newest first (without logs)."""
        return self._data(f"/tasks/{task}/jobs", params={"kind": kind, "status": status, "limit": limit})

    def models(self, task: str) -> list[JSON]:
        """The task's model registry with the attempts each version scored."""
        return self._data(f"/tasks/{task}/models")

    def plot_data(self, round_id: int, limit: int | None = None) -> JSON:
        """Per example edit distance, lengths, target / prediction / majority; worker agreement."""
        return self._json("GET", f"/rounds/{round_id}/plot-data", params={"limit": limit})
