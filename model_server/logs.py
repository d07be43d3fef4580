"""The model server's request ids and JSON logs (docs/model_server.md, "Endpoints").

The API sends each model call with the id of the writer's request (``X-Request-ID``,
services/model_client.py); :class:`RequestIds` keeps it for the request's log lines, answers
it back in the same header, and makes a new one for a caller that sent none (or an unsafe one:
more than 64 characters, or any but letters, digits, dot, underscore and dash). With
``--log-format json`` every line is one JSON object with the id, and each request writes one
access line (method, route, status, duration_ms). The model server imports nothing of the rest
of the project, so these few lines repeat the API's rule (services/observability.py).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import secrets
import sys
import time
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["JsonFormatter", "RequestIds", "configure_logging", "request_id"]

request_id: ContextVar[str | None] = ContextVar("model_server_request_id", default=None)
_SAFE_ID = re.compile(rb"[A-Za-z0-9._-]{1,64}")
# A new id: a prefix drawn once per process and a counter (as services/observability.py makes them).
_PROCESS_PREFIX = secrets.token_hex(8)
_COUNTER = itertools.count(1)
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
access_logger = logging.getLogger("model_server.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, request_id, the ``extra=`` fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        current = request_id.get()
        if current is not None:
            entry["request_id"] = current
        entry.update((k, v) for k, v in record.__dict__.items() if k not in _RECORD_ATTRIBUTES and k[:1] != "_")
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(log_format: str, level: int = logging.INFO) -> None:
    """``json``: one JSON handler on the root logger (uvicorn's lines go through it, its access
    log is off: :class:`RequestIds` writes one); ``text``: the process's logging as it is."""
    if log_format != "json":
        return
    root = logging.getLogger()
    for other in list(root.handlers):
        if other.get_name() == "model_server" or type(other) is logging.StreamHandler:
            root.removeHandler(other)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name("model_server")
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    access = logging.getLogger("uvicorn.access")
    access.handlers.clear()
    access.propagate = False
    access.disabled = True


class RequestIds:
    """Pure ASGI middleware: the request's id in :data:`request_id` and in the answer's
    ``X-Request-ID``; with ``access_log``, one line per request."""

    def __init__(self, app: ASGIApp, *, access_log: bool) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        current = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                current = value.decode("ascii") if _SAFE_ID.fullmatch(value) else None
                break
        if current is None:
            current = f"{_PROCESS_PREFIX}{next(_COUNTER):016x}"
        request_id.set(current)  # this request's own task and context
        id_header = (b"x-request-id", current.encode())
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access_log:
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                access_logger.info(
                    "%s %s %d",
                    scope["method"][:16],
                    route,
                    status,
                    extra={
                        "request_id": current,
                        "method": scope["method"][:16],
                        "route": route,
                        "status": status,
                        "duration_ms": round((time.perf_counter() - started) * 1e3, 2),
                    },
                )
