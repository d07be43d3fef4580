"""Where the API's CPU per request goes: the load mix of ``bench/load.py --cpu-per-endpoint``,
sent to the app in this process through ASGI (no HTTP, no uvicorn), endpoint by endpoint, with
an optional cProfile of each endpoint's requests.

``bench/load.py --cpu-per-endpoint`` measures the API as deployed (a ``dynaloop api`` process
over HTTP) and says how much; this says where. The same seeding and the same flow
(``seed_database``, ``mix_flow``): a stub model server in a process of its own (its CPU is not
counted), the app built by ``create_app`` on a fresh SQLite or PostgreSQL database, each request
a hand-made ASGI call, one at a time. The figures are this process's CPU (``time.process_time``,
every thread) per request: the app's, plus a few microseconds of the harness per call.

``--inline-hops`` runs every worker-thread hop (``anyio.to_thread.run_sync``, which FastAPI and
Starlette use for plain ``def`` dependencies and endpoints) on the event loop's thread instead:
cProfile then sees a request end to end in one thread, and the difference from a run without it
is what the hops cost. Inline hops are for measuring only (on SQLite a waiting BEGIN would stall
the loop; here requests go one at a time).

Usage:
    python bench/api_profile.py [--database sqlite|postgresql] [--inline-hops]
                                [--profile-dir DIR] [--top 25] [--show-statements] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import MutableMapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.load import (  # noqa: E402
    DEFAULT_POSTGRES_URL,
    Calls,
    Process,
    cpu_figures,
    free_port,
    fresh_postgres,
    mix_flow,
    print_cpu_per_endpoint,
    seed_database,
)
from bench.machine import cpu_model  # noqa: E402


class Answer:
    """What ``mix_flow`` reads of an answer: its status and its JSON body."""

    def __init__(self, status_code: int, body: bytes) -> None:
        self.status_code = status_code
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


async def call(app: Any, token: str, method: str, path: str, body: Any) -> Answer:
    """One request through the app's ASGI interface, as uvicorn would hand it over."""
    payload = b"" if body is None else json.dumps(body).encode()
    headers = [
        (b"host", b"bench"),
        (b"authorization", f"Bearer {token}".encode()),
        (b"idempotency-key", uuid.uuid4().hex.encode()),
    ]
    if body is not None:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("bench", 80),
        "state": {},
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:  # the body has gone: a client that waits, as uvicorn's receive does
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": payload, "more_body": False}

    status = 0
    chunks: list[bytes] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return Answer(status, b"".join(chunks))


def inline_hops() -> None:
    """Every ``anyio.to_thread.run_sync`` runs its function on the calling thread (see the
    module's docstring)."""
    import anyio.to_thread
    import starlette.concurrency

    async def run_sync(func: Any, *args: Any, **_: Any) -> Any:
        return func(*args)

    # Both names are the one anyio module: FastAPI and Starlette call it through either.
    setattr(anyio.to_thread, "run_sync", run_sync)  # noqa: B010 - a different signature, on purpose
    setattr(starlette.concurrency.anyio.to_thread, "run_sync", run_sync)  # noqa: B010


async def run_mix(
    app: Any, stack: Any, seed: int, profile_dir: Path | None, top: int, show_statements: bool
) -> dict[str, Any]:
    flow = mix_flow(stack, random.Random(seed))
    step: tuple[str, Calls] | None = next(flow)
    statements: list[str] = []
    shown: set[str] = set()
    if show_statements:
        from sqlalchemy import event

        @event.listens_for(app.state.engine, "before_cursor_execute")
        def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            statements.append(" ".join(statement.split()))

    rows: dict[str, dict[str, Any]] = {}
    while step is not None:
        endpoint, calls = step
        profiler = cProfile.Profile() if profile_dir is not None else None
        answers: list[Any] = []  # Answer, read as mix_flow reads an httpx.Response
        started_cpu, started_wall = time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        first: list[str] = []
        for token, method, path, body in calls:
            statements.clear()
            answers.append(await call(app, token, method, path, body))
            if len(answers) == 1:
                first = list(statements)
        if profiler is not None:
            profiler.disable()
        cpu, wall = time.process_time() - started_cpu, time.perf_counter() - started_wall
        # Printed outside the timed block: only the listener's own cost is in the figures.
        if show_statements and calls and endpoint not in shown:
            shown.add(endpoint)
            print(f"\n=== {endpoint}: the statements of its first request ({len(first)})")
            for number, statement in enumerate(first, 1):
                print(f"{number:3}. {statement[:300]}")
        if calls:
            row = rows.setdefault(endpoint, {"requests": 0, "cpu_s": 0.0, "wall_s": 0.0, "statuses": Counter()})
            row["requests"] += len(calls)
            row["cpu_s"] += cpu
            row["wall_s"] += wall
            row["statuses"].update(str(a.status_code) for a in answers)
            if profiler is not None and profile_dir is not None:
                name = endpoint.replace(" ", "_").replace("/", "")
                dump = profile_dir / f"{name}-{row['requests']}.pstats"
                profiler.dump_stats(dump)
                print(f"\n=== {endpoint}: {len(calls)} requests, profile {dump}")
                pstats.Stats(str(dump)).sort_stats("tottime").print_stats(top)
        try:
            step = flow.send(answers)
        except StopIteration:
            step = None
    return cpu_figures(rows)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from dynaloop.api.app import create_app
    from services.settings import Settings

    folder = Path(tempfile.mkdtemp(prefix="bench-api-profile-"))
    port = free_port()
    stub = Process(
        "stub model server",
        [sys.executable, "-m", "tests.stub_model_server", "--port", str(port)],
        f"http://127.0.0.1:{port}",
        {**os.environ, "PYTHONUNBUFFERED": "1"},
        folder / "model-server.log",
        health_path="/info",
    )
    stub.start()
    try:
        url = fresh_postgres(args.postgres_url) if args.database == "postgresql" else f"sqlite:///{folder / 'load.db'}"
        round_id, writers, validators = seed_database(
            url, args.writers, args.validators, max(200, args.writers * 40), stub.url
        )
        settings = Settings(
            database_url=url,
            data_dir=folder,
            secret_key="bench-secret-key-0123456789",
            model_retries=0,
            rate_limit_per_token="none",
            rate_limit_per_ip="none",
        )
        app = create_app(settings)
        if args.inline_hops:
            inline_hops()
        stack = SimpleNamespace(round_id=round_id, writer_tokens=writers, validator_tokens=validators)
        async with app.router.lifespan_context(app):
            gc.collect()
            gc.freeze()  # as `dynaloop api` does (services/settings.py, freeze_gc_at_startup)
            await call(app, writers[0], "GET", "/api/v1/me", None)  # builds the middleware stack
            if args.profile_dir is not None:
                args.profile_dir.mkdir(parents=True, exist_ok=True)
            figures = await run_mix(app, stack, args.seed, args.profile_dir, args.top, args.show_statements)
    finally:
        stub.kill(signal.SIGTERM)
        shutil.rmtree(folder, ignore_errors=True)
    print_cpu_per_endpoint(figures, "\nCPU per request in process (ASGI, no HTTP):")
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=50)
    parser.add_argument("--validators", type=int, default=20)
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument(
        "--postgres-url",
        default=DEFAULT_POSTGRES_URL,
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--inline-hops", action="store_true", help="run worker-thread hops on the loop's thread")
    parser.add_argument("--profile-dir", type=Path, default=None, help="cProfile each endpoint's requests here")
    parser.add_argument("--top", type=int, default=25, help="functions printed per endpoint's profile")
    parser.add_argument("--show-statements", action="store_true", help="print the SQL of each endpoint's first request")
    parser.add_argument("--json", type=Path, default=None)
    arguments = parser.parse_args()
    result = asyncio.run(main(arguments))
    if arguments.json is not None:
        arguments.json.parent.mkdir(parents=True, exist_ok=True)
        arguments.json.write_text(
            json.dumps(
                {
                    "command": "python bench/api_profile.py " + " ".join(sys.argv[1:]),
                    "database": arguments.database,
                    "inline_hops": arguments.inline_hops,
                    "cpu_per_endpoint": result,
                    "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "machine": cpu_model(),
                },
                indent=1,
            )
            + "\n",
            encoding="utf-8",
        )
