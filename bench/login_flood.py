"""Login flood: do other users' requests keep their speed while one client floods the login?

A real ``dynaloop api`` process on a fresh SQLite database. ``--observers`` users with API
tokens each ask ``GET /api/v1/me`` in a loop (one request at a time, ``--pause-ms`` between);
their latencies are measured first alone (baseline), then while ``--flood`` connections post
``POST /api/v1/auth/login`` as fast as the server answers (each login costs one PBKDF2 check,
200,000 iterations, ~50 ms of CPU). The throttle's limits are raised for the run so that every
flooding login is checked (the worst case: an attacker with many addresses and usernames);
what is measured is the password pool (``DYNALOOP_LOGIN_PASSWORD_WORKERS``).

The run is repeated for each pool size of ``--workers`` (default: 1, the default 2, and 64,
as large as the flood: what the API did before the pool, when every handler thread could
hash), and the report gives each one's /me p50/p99 with and without the flood and their ratio.

Usage:
    python bench/login_flood.py [--flood 16] [--observers 4] [--seconds 15] [--workers 1,2,64]
                                [--json bench/results/login_flood.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PASSWORD = "flood-bench-password-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def seed(url: str, observers: int) -> list[str]:
    from services.db.engine import make_engine, make_sessionmaker, session_scope
    from services.db.migrate import upgrade
    from services.domain import users

    upgrade(url)
    engine = make_engine(url)
    tokens = []
    with session_scope(make_sessionmaker(engine)) as session:
        users.create_user(session, None, "flooded", ["writer"], password=PASSWORD)
        for i in range(observers):
            user = users.create_user(session, None, f"observer{i}", ["writer"])
            tokens.append(users.issue_token(session, None, user, name="bench")[1])
    engine.dispose()
    return tokens


def start_api(url: str, port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    popen = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynaloop.cli",
            "api",
            "--port",
            str(port),
            "--database-url",
            url,
            "--log-level",
            "warning",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"the API exited with {popen.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return popen
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the API did not answer /health within 60 s; see {log}")


async def observe(
    base: str, token: str, until: float, pause_s: float, latencies: list[float], errors: list[int]
) -> None:
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        while time.monotonic() < until:
            started = time.perf_counter()
            response = await client.get("/api/v1/me")
            latencies.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                errors.append(response.status_code)
            await asyncio.sleep(pause_s)


async def flood(base: str, until: float, statuses: dict[int, int]) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        i = 0
        while time.monotonic() < until:
            i += 1
            # Alternate right and wrong passwords: both are checked (the throttle is raised).
            password = PASSWORD if i % 2 else f"wrong-guess-{i}"
            response = await client.post("/api/v1/auth/login", json={"username": "flooded", "password": password})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1


def percentiles(values: list[float]) -> dict[str, float]:
    array = np.array(values)
    return {
        "n": len(values),
        "p50_ms": round(float(np.percentile(array, 50)), 1),
        "p99_ms": round(float(np.percentile(array, 99)), 1),
    }


async def phase(base: str, tokens: list[str], seconds: float, pause_s: float, flooders: int) -> dict[str, Any]:
    until = time.monotonic() + seconds
    latencies: list[float] = []
    errors: list[int] = []
    statuses: dict[int, int] = {}
    tasks = [observe(base, token, until, pause_s, latencies, errors) for token in tokens]
    tasks += [flood(base, until, statuses) for _ in range(flooders)]
    await asyncio.gather(*tasks)
    return {
        "me": percentiles(latencies),
        "me_errors": len(errors),
        "logins": sum(statuses.values()),
        "logins_per_s": round(sum(statuses.values()) / seconds, 1),
        "login_statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


def run_config(workdir: Path, name: str, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    url = f"sqlite:///{workdir / f'{name}.db'}"
    tokens = seed(url, args.observers)
    port = free_port()
    env = {
        "DYNALOOP_DATA_DIR": str(workdir),
        "DYNALOOP_LOGIN_PASSWORD_WORKERS": str(workers),
        "DYNALOOP_LOGIN_MAX_WAITING": str(max(32, args.flood * 2)),
        "DYNALOOP_LOGIN_MAX_FAILURES_PER_USER": "100000000",
        "DYNALOOP_LOGIN_MAX_FAILURES_PER_ADDRESS": "100000000",
    }
    api = start_api(url, port, env, workdir / f"{name}.log")
    base = f"http://127.0.0.1:{port}"
    try:
        pause_s = args.pause_ms / 1000
        asyncio.run(phase(base, tokens, 2, pause_s, 0))  # warm-up
        alone = asyncio.run(phase(base, tokens, args.seconds, pause_s, 0))
        flooded = asyncio.run(phase(base, tokens, args.seconds, pause_s, args.flood))
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(timeout=30)
    return {
        "password_workers": workers,
        "alone": alone,
        "flooded": flooded,
        "p50_ratio": round(flooded["me"]["p50_ms"] / alone["me"]["p50_ms"], 2),
        "p99_ratio": round(flooded["me"]["p99_ms"] / alone["me"]["p99_ms"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood", type=int, default=16, help="connections flooding the login")
    parser.add_argument("--observers", type=int, default=4, help="users asking /me meanwhile")
    parser.add_argument("--pause-ms", type=float, default=20, help="each observer's pause between requests")
    parser.add_argument("--seconds", type=float, default=15, help="length of each phase")
    parser.add_argument("--workers", default="1,2,64", help="password pool sizes to compare, comma-separated")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="dynaloop-login-flood-"))
    try:
        results = {
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()},
            "flood_connections": args.flood,
            "observers": args.observers,
            "seconds_per_phase": args.seconds,
            "runs": [run_config(workdir, f"pool{n}", int(n), args) for n in args.workers.split(",")],
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"CPU: {results['machine']['cpu']} x {results['machine']['cores']}")
    print("password workers | /me alone p50/p99 ms | /me under flood p50/p99 ms | ratio p50/p99 | logins/s | errors")
    for run in results["runs"]:
        alone, flooded = run["alone"], run["flooded"]
        print(
            f"{run['password_workers']:>16} | {alone['me']['p50_ms']:>7} / {alone['me']['p99_ms']:<7} | "
            f"{flooded['me']['p50_ms']:>9} / {flooded['me']['p99_ms']:<9} | "
            f"{run['p50_ratio']} / {run['p99_ratio']} | {flooded['logins_per_s']} | "
            f"/me {alone['me_errors'] + flooded['me_errors']}, logins {flooded['login_statuses']}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
