"""Request ids and structured logs (docs/deploy.md, "Logs and metrics").

Each API request has an id: the caller's ``X-Request-ID`` when it is short and safe
(:func:`safe_request_id`), else a new one. The API's request middleware
(dynaloop/api/metrics.py) keeps it in :data:`request_id` for the request's duration, which
the handler threads inherit (they run in a copy of the request's context), so that every log
line written for the request carries it and the model client (services/model_client.py)
sends it on to the model server, whose logs carry it too.

:class:`JsonFormatter` writes one JSON object per line: ``ts``, ``level``, ``logger``,
``message``, ``request_id`` (when there is one), the fields passed in ``extra=`` and ``exc``
(a traceback). A value a client chose (a path, a header) cannot start a line of its own: JSON
escapes every control character.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import secrets
import sys
import time
from contextvars import ContextVar
from typing import Any, Literal

__all__ = [
    "REQUEST_ID_HEADER",
    "JsonFormatter",
    "configure_logging",
    "new_request_id",
    "request_id",
    "safe_request_id",
]

REQUEST_ID_HEADER = "X-Request-ID"
#: The id of the request being answered (None outside a request).
request_id: ContextVar[str | None] = ContextVar("dynaloop_request_id", default=None)

# At most 64 characters of letters, digits, dot, underscore and dash: a UUID, a ULID, nginx's
# $request_id or a load balancer's trace id fit; a newline, a quote or 10 KB never reach a log.
_SAFE_ID = re.compile(rb"[A-Za-z0-9._-]{1,64}")


# A new id: 16 hex digits drawn once per process, then a counter (16 hex digits), 32 in all. Unique
# across processes and replicas as a UUID would be, but without a uuid4's getrandom() system call
# per request (bench/request_metrics.py: that call was most of the middleware's cost). Request ids
# are labels for logs, never secrets.
_PROCESS_PREFIX = secrets.token_hex(8)
_COUNTER = itertools.count(1)


def _new_prefix() -> None:  # a forked child draws its own
    global _PROCESS_PREFIX, _COUNTER
    _PROCESS_PREFIX, _COUNTER = secrets.token_hex(8), itertools.count(1)


os.register_at_fork(after_in_child=_new_prefix)


def new_request_id() -> str:
    return f"{_PROCESS_PREFIX}{next(_COUNTER):016x}"


def safe_request_id(value: bytes | str | None) -> str | None:
    """``value`` when it is a safe request id, else None (the caller makes a new one)."""
    if value is None:
        return None
    raw = value.encode("latin-1", "replace") if isinstance(value, str) else value
    return raw.decode("ascii") if _SAFE_ID.fullmatch(raw) else None


# The attributes every LogRecord has: anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module's docstring)."""

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
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False, default=str)


LogFormat = Literal["text", "json"]
_HANDLER_NAME = "dynaloop"


def configure_logging(log_format: LogFormat, level: int = logging.INFO) -> None:
    """With ``json``: every record of the process, uvicorn's included, goes to stderr as one JSON
    line (one handler on the root logger, replaced on a second call); uvicorn's access log is
    turned off, as the app writes its own (with the route's template, the duration and the
    request id). With ``text``, nothing changes: the logging the process has set up stays."""
    if log_format != "json":
        return
    root = logging.getLogger()
    # Ours from an earlier call, and the plain-text one of logging.basicConfig (the command
    # line's), which would write each record a second time in another format. Other handlers
    # (a file, a test's capture) stay.
    for other in list(root.handlers):
        if other.get_name() == _HANDLER_NAME or type(other) is logging.StreamHandler:
            root.removeHandler(other)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
    access = logging.getLogger("uvicorn.access")
    access.handlers.clear()
    access.propagate = False
    access.disabled = True
