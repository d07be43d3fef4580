"""What the API's request middleware (dynaloop/api/metrics.py's RequestMetrics: the request id,
the per-route histogram and status counter, the in-flight gauge, and with JSON logs one access
line) costs per request, in CPU time, on ONE core.

The same app answers the same requests twice: once through its whole middleware stack, once
from the layer just inside RequestMetrics (everything else the same), in alternating blocks;
the difference of the CPU time per request (time.process_time, every thread) is the
middleware's cost. Requests are plain ASGI calls on one event loop (no HTTP, no test client, whose
own cost would hide the figure): GET /health (a database read on SQLite), GET /api/v1/me without
a token (401, the router and the auth dependency) and GET of a path no route has (404).
``--json-logs`` adds the access line, written as JSON to /dev/null. The start-up objects are
frozen out of the garbage collector as `dynaloop api` does (``--no-freeze-gc``: not).

Usage: python bench/request_metrics.py [--requests 20000] [--json-logs]
"""

from __future__ import annotations

import os

if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

import argparse
import asyncio
import gc
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dynaloop.api.app import create_app
from dynaloop.api.metrics import RequestMetrics
from services.db.migrate import upgrade
from services.observability import JsonFormatter
from services.settings import Settings

PATHS = ["/health", "/api/v1/me", "/no/such/path"]


def scope_for(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"bench"), (b"user-agent", b"bench")],
        "client": ("127.0.0.1", 40000),
        "server": ("bench", 80),
        "state": {},
    }


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def send(message: MutableMapping[str, Any]) -> None:
    return None


async def run(app: Any, path: str, n: int) -> float:
    """CPU seconds per request for ``n`` requests of ``path`` through ``app``."""
    started = time.process_time()
    for _ in range(n):
        await app(scope_for(path), receive, send)
    return (time.process_time() - started) / n


async def main(requests: int, blocks: int, json_logs: bool, freeze_gc: bool) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-request-metrics-"))
    url = f"sqlite:///{folder / 'bench.db'}"
    upgrade(url)
    settings = Settings(
        database_url=url,
        data_dir=folder,
        log_format="json" if json_logs else "text",
        secret_key="bench-secret-key-0123456789",
    )
    app = create_app(settings)
    if json_logs:
        root = logging.getLogger()
        root.handlers.clear()
        sink = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the run
        sink.setFormatter(JsonFormatter())
        root.addHandler(sink)
    await app(scope_for("/health"), receive, send)  # builds the middleware stack
    if freeze_gc:  # as `dynaloop api` and the API image do (services/settings.py, freeze_gc_at_startup)
        gc.collect()
        gc.freeze()
    parent: Any = app.middleware_stack
    while not isinstance(parent.app, RequestMetrics):
        parent = parent.app
    middleware = parent.app

    def use(on: bool) -> None:
        """The same app, with the middleware in its place or the layer inside it there instead."""
        parent.app = middleware if on else middleware.app

    for path in PATHS:
        for on in (True, False):  # warm-up: thread pool, caches
            use(on)
            await run(app, path, 200)
        with_it: list[float] = []
        without_it: list[float] = []
        for block in range(blocks):  # alternating, each variant first in half of the pairs
            for on in (True, False) if block % 2 else (False, True):
                use(on)
                (with_it if on else without_it).append(await run(app, path, requests // blocks))
        a, b = statistics.median(with_it), statistics.median(without_it)
        print(
            f"GET {path:<16} with {a * 1e6:7.1f} µs  without {b * 1e6:7.1f} µs  "
            f"middleware {(a - b) * 1e6:6.1f} µs/request (median of {blocks} blocks of {requests // blocks})"
        )
    app.state.engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--json-logs", action="store_true")
    parser.add_argument("--no-freeze-gc", action="store_true", help="leave the start-up objects to the collector")
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.blocks, args.json_logs, not args.no_freeze_gc))
