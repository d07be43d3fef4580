"""The API's own overload answers: requests in flight are counted here, and those beyond the
limits are answered at once, on the event loop, in the documented JSON error shape (docs/api.md
"Errors"), before any handler thread or database work is spent on them.

Three limits, per API process (services/settings.py):

* every request: ``max_concurrent_requests``; beyond it 503 ``overloaded``;
* requests that call the model (the routes ``model_routes`` names: attempts, inspect):
  ``max_concurrent_model_requests``, below the first, so that writers waiting for a slow
  model can never take the places of everyone else; beyond it 503 ``model_busy``;
* model requests per API token: ``model_requests_per_writer``; beyond it 429
  ``too_many_in_flight``, so that one writer's flood costs no database work at all.

This replaces uvicorn's ``limit_concurrency``, which answers a plain-text ``Service
Unavailable`` and counts idle keep-alive connections as well.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Sequence

from fastapi.responses import JSONResponse
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

# Seconds a refused client is told to wait: requests here last well under that.
OVERLOAD_RETRY_AFTER_S = 1


def _refusal(status_code: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(
        status_code=status_code,
        content={"error": {"code": code, "message": message, "details": {"retry_after_s": OVERLOAD_RETRY_AFTER_S}}},
        headers={"Retry-After": str(OVERLOAD_RETRY_AFTER_S)},
    )


def _bearer_token(scope: Scope) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (the scheme in any case), unchecked."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


class OverloadGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_requests: int,
        max_model_requests: int,
        model_requests_per_token: int,
        model_routes: Sequence[tuple[str, Collection[str]]],
    ) -> None:
        self.app = app
        self.max_requests = max_requests
        self.max_model_requests = max_model_requests
        self.model_requests_per_token = model_requests_per_token
        # (path pattern, methods) of each route that calls the model, e.g.
        # ("/api/v1/assignments/{assignment_id}/attempts", {"POST"}).
        self.model_routes: list[tuple[re.Pattern[str], Collection[str]]] = [
            (compile_path(path)[0], methods) for path, methods in model_routes
        ]
        # Touched only on the event loop: no lock needed.
        self.in_flight = 0
        self.model_in_flight = 0
        self.model_in_flight_per_token: Counter[str] = Counter()

    def _calls_the_model(self, scope: Scope) -> bool:
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        method = scope["method"]
        return any(method in methods and pattern.match(path) for pattern, methods in self.model_routes)

    def _refuse(self, scope: Scope, model_bound: bool, token: str | None) -> JSONResponse | None:
        if self.in_flight >= self.max_requests:
            return _refusal(
                503,
                "overloaded",
                f"the server is answering {self.max_requests} requests at once, its most; nothing was "
                f"done, retry in {OVERLOAD_RETRY_AFTER_S} s",
            )
        if not model_bound:
            return None
        if self.model_in_flight >= self.max_model_requests:
            return _refusal(
                503,
                "model_busy",
                f"the model is busy with {self.max_model_requests} other checks right now; nothing was "
                f"saved and no try was used, retry in {OVERLOAD_RETRY_AFTER_S} s",
            )
        if token is not None and self.model_in_flight_per_token[token] >= self.model_requests_per_token:
            return _refusal(
                429,
                "too_many_in_flight",
                f"you already have {self.model_requests_per_token} model checks running; wait for their "
                f"answers (nothing was saved), then retry in {OVERLOAD_RETRY_AFTER_S} s",
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        model_bound = self._calls_the_model(scope)
        token = _bearer_token(scope) if model_bound else None
        refusal = self._refuse(scope, model_bound, token)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        self.in_flight += 1
        if model_bound:
            self.model_in_flight += 1
            if token is not None:
                self.model_in_flight_per_token[token] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if model_bound:
                self.model_in_flight -= 1
                if token is not None:
                    self.model_in_flight_per_token[token] -= 1
                    if self.model_in_flight_per_token[token] <= 0:
                        del self.model_in_flight_per_token[token]
