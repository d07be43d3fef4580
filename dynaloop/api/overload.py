"""The API's own overload answers: requests in flight are counted here, and those beyond the
limits are answered on the event loop, in the documented JSON error shape (docs/api.md
"Errors"), before the token is looked up and before any handler thread or database work is
spent on them (docs/reliability.md "Model calls" and "One client's burst").

Four limits, per API process (services/settings.py):

* requests per API token, of any kind: ``requests_per_token``; beyond it 429
  ``too_many_in_flight``, so that one client's burst (300 requests sent at once with one
  token) takes a handful of places and costs no authentication, thread or database work for
  the rest: they are answered here, on the event loop;
* every request: ``max_concurrent_requests``; beyond it 503 ``overloaded``;
* requests that call the model (the routes ``model_routes`` names: attempts, inspect):
  ``max_concurrent_model_requests``, below ``max_concurrent_requests``, so that writers waiting for a slow
  model can never take the places of everyone else; beyond it 503 ``model_busy``;
* model requests per API token: ``model_requests_per_writer``; beyond it 429
  ``too_many_in_flight``, so that one writer's flood costs no database work at all.

A token refused by either per-token limit is penalized for ``burst_penalty_s`` (1 s, the
``Retry-After`` it is told): every request it sends in that time is refused too, and each
refusal starts the time again; and each of its refusals is held back that long before it is
sent, taking no place. A client that waits for its answers, or for Retry-After, never meets
the penalty. A flooding script that sends its next request the moment it hears the last
answer would otherwise get thousands of refusals a second over its 300 connections, and
answering them (reading and parsing each request, sending each answer) kept the event loop
from everyone else's requests; and whenever one of its requests finished, the next one was let
in to the token lookup and the database at once (docs/benchmarks.md "One writer's burst"). Penalized
and held back, its connections bring one request each per second and none gets in. The
server-wide refusals (503) are sent at once: whoever gets them did nothing wrong.

This replaces uvicorn's ``limit_concurrency``, which answers a plain-text ``Service
Unavailable`` and counts idle keep-alive connections as well.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence

import anyio
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Seconds a refused client is told to wait: requests here last well under that.
OVERLOAD_RETRY_AFTER_S = 1


class _Refusal:
    """A refusal rendered once, when the guard is built: under a burst it is sent thousands of
    times a second on the event loop, and nothing in it depends on the request. ``delay_s``:
    how long the answer is held back (``burst_penalty_s``)."""

    def __init__(
        self, status_code: int, code: str, message: str, retry_after_s: int = OVERLOAD_RETRY_AFTER_S, delay_s: float = 0
    ) -> None:
        self.status_code = status_code
        self.delay_s = delay_s
        # Counts each time it is sent (dynaloop/api/metrics.py, shed by reason); set by the guard.
        self.count: Callable[[], None] | None = None
        self.body = json.dumps(
            {"error": {"code": code, "message": message, "details": {"retry_after_s": retry_after_s}}}
        ).encode()
        self.headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body)).encode()),
            (b"retry-after", str(retry_after_s).encode()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.count is not None:
            self.count()
        if self.delay_s > 0:
            await anyio.sleep(self.delay_s)
        start: Message = {"type": "http.response.start", "status": self.status_code, "headers": self.headers}
        await send(start)
        await send({"type": "http.response.body", "body": self.body})


def _bearer_token(scope: Scope) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (the scheme in any case), unchecked."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


def token_key(token: str) -> bytes:
    """The key a token's requests are counted under: a digest (the raw token is kept nowhere),
    the same however the ``Authorization`` header spelled its scheme (``_bearer_token`` decoded
    the header as latin-1, so this gives back its bytes). Hashing costs about a
    microsecond, far less than the token lookup it spares."""
    return hashlib.blake2b(token.encode("latin-1"), digest_size=16).digest()


class OverloadGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_requests: int,
        max_model_requests: int,
        model_requests_per_token: int,
        model_routes: Sequence[tuple[str, Collection[str]]],
        requests_per_token: int,
        burst_penalty_s: float,
        shed_counter: Callable[[str], Callable[[], None]] | None = None,
    ) -> None:
        """``shed_counter(reason)``: the counter of the refusals for ``reason`` (a key of
        ``self.refusals``), or None to count nothing."""
        self.app = app
        self.max_requests = max_requests
        self.max_model_requests = max_model_requests
        self.model_requests_per_token = model_requests_per_token
        self.requests_per_token = requests_per_token
        self.burst_penalty_s = burst_penalty_s
        # (path pattern, methods) of each route that calls the model, e.g.
        # ("/api/v1/assignments/{assignment_id}/attempts", {"POST"}).
        self.model_routes: list[tuple[re.Pattern[str], Collection[str]]] = [
            (compile_path(path)[0], methods) for path, methods in model_routes
        ]
        # Touched only on the event loop: no lock needed.
        self.in_flight = 0
        self.model_in_flight = 0
        self.in_flight_per_token: Counter[bytes] = Counter()
        self.model_in_flight_per_token: Counter[bytes] = Counter()
        # Penalized tokens: until when (time.monotonic()) every request of theirs is refused.
        self.penalized: dict[bytes, float] = {}
        penalty_retry_s = max(OVERLOAD_RETRY_AFTER_S, math.ceil(burst_penalty_s))
        self.refusals = {
            "per_token": _Refusal(
                429,
                "too_many_in_flight",
                f"this token sent more than {requests_per_token} requests at once, its most, or sent more "
                f"before the wait it was told; nothing was done with this one: wait for the answers to "
                f"come, then retry in {penalty_retry_s} s",
                penalty_retry_s,
                burst_penalty_s,
            ),
            "overloaded": _Refusal(
                503,
                "overloaded",
                f"the server is answering {max_requests} requests at once, its most; nothing was "
                f"done, retry in {OVERLOAD_RETRY_AFTER_S} s",
            ),
            "model_busy": _Refusal(
                503,
                "model_busy",
                f"the model is busy with {max_model_requests} other checks right now; nothing was "
                f"saved and no try was used, retry in {OVERLOAD_RETRY_AFTER_S} s",
            ),
            "model_per_token": _Refusal(
                429,
                "too_many_in_flight",
                f"you already have {model_requests_per_token} model checks running; wait for their "
                f"answers (nothing was saved), then retry in {penalty_retry_s} s",
                penalty_retry_s,
                burst_penalty_s,
            ),
        }
        if shed_counter is not None:
            for reason, refusal in self.refusals.items():
                refusal.count = shed_counter(reason)

    def _calls_the_model(self, scope: Scope) -> bool:
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        method = scope["method"]
        return any(method in methods and pattern.match(path) for pattern, methods in self.model_routes)

    def _is_penalized(self, key: bytes, now: float) -> bool:
        until = self.penalized.get(key)
        if until is None:
            return False
        if now < until:
            return True
        del self.penalized[key]
        return False

    def _penalize(self, key: bytes, now: float) -> None:
        if self.burst_penalty_s <= 0:
            return
        if len(self.penalized) >= 10_000:  # made-up tokens that never came back: forget the expired
            self.penalized = {k: until for k, until in self.penalized.items() if until > now}
        self.penalized[key] = now + self.burst_penalty_s

    def _refuse(self, model_bound: bool, key: bytes | None) -> _Refusal | None:
        # The token's own limits first: whoever sends too much at once is told so (429),
        # whether or not the server as a whole is full.
        if key is not None:
            now = time.monotonic()
            if self._is_penalized(key, now) or self.in_flight_per_token[key] >= self.requests_per_token:
                self._penalize(key, now)
                return self.refusals["per_token"]
        if self.in_flight >= self.max_requests:
            return self.refusals["overloaded"]
        if not model_bound:
            return None
        if self.model_in_flight >= self.max_model_requests:
            return self.refusals["model_busy"]
        if key is not None and self.model_in_flight_per_token[key] >= self.model_requests_per_token:
            self._penalize(key, time.monotonic())
            return self.refusals["model_per_token"]
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        model_bound = self._calls_the_model(scope)
        token = _bearer_token(scope)
        key = None if token is None else token_key(token)
        refusal = self._refuse(model_bound, key)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        self.in_flight += 1
        if key is not None:
            self.in_flight_per_token[key] += 1
        if model_bound:
            self.model_in_flight += 1
            if key is not None:
                self.model_in_flight_per_token[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if key is not None:
                _release(self.in_flight_per_token, key)
            if model_bound:
                self.model_in_flight -= 1
                if key is not None:
                    _release(self.model_in_flight_per_token, key)


def _release(counter: Counter[bytes], key: bytes) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
