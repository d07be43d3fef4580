"""Bulkheads benchmark: does one crowdworker stall everyone else? (issue 12, point 7)

A real ``dynaloop api`` (SQLite) and a model server run as processes on loopback
(bench/load.py's stack). Twenty bystanders, 10 writers and 10 validators, make non-model
requests in a loop (``GET /me``, ``GET /assignments/{id}``, ``GET /rounds/{id}/validation-batch``)
and their latencies are measured in four scenarios of ``--seconds`` each:

* ``baseline``: the bystanders alone;
* ``flood-one-writer``: one writer token keeps ``--flood`` attempts in flight at once (300),
  each sent again the moment it is answered, Retry-After ignored;
* ``flood-many-writers``: the same flood spread over 50 writer tokens (a script with many
  accounts: the per-writer limit does not stop it, the model requests' own share does);
* ``model-stopped``: the model server is stopped with SIGSTOP (hung, connections queue in the
  kernel) while the 50 writers keep ``--flood`` attempts in flight.

For each scenario: the bystanders' p50 / p99 / max latency and error counts, how many answers
anywhere were not in the JSON error shape (or not JSON at all), the flood's answers by
status and code, and the slowest attempt answer (bounded by ``DYNALOOP_MODEL_DEADLINE_S``).
The verdict: bystanders' p99 < 200 ms and 0 non-JSON answers in every scenario.

Usage:
    python bench/bulkheads.py [--seconds 15] [--flood 300] [--model stub|tiny] [--json bench/results/bulkheads.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.load import Stack, start_stack  # noqa: E402
from bench.machine import cpu_model  # noqa: E402

API = "/api/v1"
BYSTANDER_WRITERS = 10
BYSTANDER_VALIDATORS = 10
FLOOD_WRITERS = 50
TEXT = "Honestly the cafe on the corner serves a decent lunch."
# Pause of a bystander between two requests: 20 people clicking about 5 times a second.
BYSTANDER_PAUSE_S = 0.2


@dataclass
class Tally:
    latencies_ms: list[float] = field(default_factory=list)
    by_path: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    not_json: int = 0  # answers that are not JSON, or errors not in {"error": {"code", "message", ...}}
    no_answer: int = 0  # connection errors: no HTTP answer at all
    samples: list[str] = field(default_factory=list)

    def record(self, response: httpx.Response | None, elapsed_ms: float, failure: str | None = None) -> None:
        if response is None:
            self.statuses[failure or "no answer"] += 1
            self.no_answer += 1
            return
        self.latencies_ms.append(elapsed_ms)
        path = "/".join("{id}" if part.isdigit() else part for part in response.request.url.path.split("/"))
        self.by_path.setdefault(f"{response.request.method} {path}", []).append(elapsed_ms)
        label = str(response.status_code)
        try:
            body = response.json()
            if response.status_code >= 400:
                error = body["error"]
                assert isinstance(error["code"], str) and isinstance(error["message"], str)
                label += f" {error['code']}"
        except Exception:
            self.not_json += 1
            if len(self.samples) < 5:
                self.samples.append(f"{response.status_code} {response.text[:120]!r}")
        self.statuses[label] += 1

    def summary(self) -> dict[str, Any]:
        array = np.asarray(self.latencies_ms) if self.latencies_ms else np.asarray([0.0])
        return {
            "requests": len(self.latencies_ms),
            "p50_ms": round(float(np.percentile(array, 50)), 1),
            "p99_ms": round(float(np.percentile(array, 99)), 1),
            "max_ms": round(float(array.max()), 1),
            "statuses": dict(self.statuses.most_common()),
            "p99_ms_by_path": {
                path: round(float(np.percentile(np.asarray(values), 99)), 1)
                for path, values in sorted(self.by_path.items())
            },
            "not_json": self.not_json,
            "no_answer": self.no_answer,
            "not_json_samples": self.samples,
        }


async def timed(http: httpx.AsyncClient, tally: Tally, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
    started = time.perf_counter()
    try:
        response = await http.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        tally.record(None, 0.0, type(exc).__name__)
        return None
    tally.record(response, (time.perf_counter() - started) * 1000)
    return response


async def bystander(http: httpx.AsyncClient, token: str, paths: list[str], tally: Tally, stop: float) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    await asyncio.sleep(random.uniform(0, BYSTANDER_PAUSE_S))  # people do not click in step
    i = 0
    while time.monotonic() < stop:
        await timed(http, tally, "GET", paths[i % len(paths)], headers=headers)
        i += 1
        await asyncio.sleep(BYSTANDER_PAUSE_S)


async def flooder(http: httpx.AsyncClient, token: str, assignment_id: int, tally: Tally, stop: float) -> None:
    """Attempts back to back, a new Idempotency-Key each, Retry-After ignored."""
    while time.monotonic() < stop:
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex}
        await timed(
            http, tally, "POST", f"{API}/assignments/{assignment_id}/attempts", json={"text": TEXT}, headers=headers
        )


async def start_assignment(http: httpx.AsyncClient, token: str, round_id: int) -> int:
    response = await http.post(
        f"{API}/rounds/{round_id}/assignments", json={}, headers={"Authorization": f"Bearer {token}"}
    )
    response.raise_for_status()
    return int(response.json()["id"])


async def flood_loop(url: str, flood: int, flood_tokens: list[tuple[str, int]], seconds: float) -> Tally:
    tally = Tally()
    limits = httpx.Limits(max_connections=flood + 8, max_keepalive_connections=flood + 8)
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        await asyncio.gather(
            *(flooder(http, *flood_tokens[i % len(flood_tokens)], tally=tally, stop=stop) for i in range(flood))
        )
    return tally


def flood_process(url: str, flood: int, flood_tokens: list[tuple[str, int]], seconds: float, out: Any) -> None:
    """The flooding client, in a process of its own (its event loop must not delay the
    bystanders' clients); sends its tally back through ``out``."""
    tally = asyncio.run(flood_loop(url, flood, flood_tokens, seconds))
    out.put(tally.summary())


async def fresh_assignment(http: httpx.AsyncClient, token: str, round_id: int) -> int:
    assignment_id = await start_assignment(http, token, round_id)
    skipped = await http.post(f"{API}/assignments/{assignment_id}/skip", headers={"Authorization": f"Bearer {token}"})
    skipped.raise_for_status()
    return await start_assignment(http, token, round_id)


async def scenario(
    stack: Stack,
    name: str,
    seconds: float,
    flood: int,
    flood_tokens: list[tuple[str, int]],
    bystander_paths: list[tuple[str, list[str]]],
) -> dict[str, Any]:
    bystanders = Tally()
    stopped = name == "model-stopped"
    limits = httpx.Limits(max_connections=len(bystander_paths) + 8, max_keepalive_connections=len(bystander_paths) + 8)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    flooding = None
    if stopped:
        assert stack.model.popen is not None
        os.killpg(stack.model.popen.pid, signal.SIGSTOP)
    try:
        if flood_tokens:
            # The flood starts first and ends last: the bystanders are measured inside it.
            flooding = context.Process(
                target=flood_process, args=(stack.api.url, flood, flood_tokens, seconds + 4, results)
            )
            flooding.start()
            await asyncio.sleep(2)
        async with httpx.AsyncClient(base_url=stack.api.url, timeout=60, limits=limits) as http:
            stop = time.monotonic() + seconds
            await asyncio.gather(*(bystander(http, token, paths, bystanders, stop) for token, paths in bystander_paths))
        result: dict[str, Any] = {"scenario": name, "bystanders": bystanders.summary()}
        if flooding is not None:
            result["flood"] = await asyncio.to_thread(results.get, True, seconds + 120)
            flooding.join(timeout=30)
    finally:
        if flooding is not None and flooding.is_alive():
            flooding.kill()
        if stopped:
            os.killpg(stack.model.popen.pid, signal.SIGCONT)  # type: ignore[union-attr]
    return result


async def run(stack: Stack, seconds: float, flood: int) -> list[dict[str, Any]]:
    writers = stack.writer_tokens
    bystander_writers = writers[:BYSTANDER_WRITERS]
    flood_writers = writers[BYSTANDER_WRITERS:]
    async with httpx.AsyncClient(base_url=stack.api.url, timeout=60) as http:
        paths: list[tuple[str, list[str]]] = []
        for token in bystander_writers:
            assignment_id = await start_assignment(http, token, stack.round_id)
            paths.append((token, [f"{API}/me", f"{API}/assignments/{assignment_id}"]))
        for token in stack.validator_tokens:
            paths.append((token, [f"{API}/me", f"{API}/rounds/{stack.round_id}/validation-batch"]))
        warm_up = Tally()
        for token, token_paths in paths:  # not measured: first connections, first queries
            for path in token_paths:
                await timed(http, warm_up, "GET", path, headers={"Authorization": f"Bearer {token}"})
    results = []
    for name, flooders in [
        ("baseline", []),
        ("flood-one-writer", flood_writers[:1]),
        ("flood-many-writers", flood_writers),
        ("model-stopped", flood_writers),
    ]:
        # A fresh assignment for each flooding writer: the tries an earlier scenario used up
        # would end the flood at "all tries used" before it reached the model.
        async with httpx.AsyncClient(base_url=stack.api.url, timeout=60) as http:
            flood_tokens = [(token, await fresh_assignment(http, token, stack.round_id)) for token in flooders]
        result = await scenario(stack, name, seconds, flood, flood_tokens, paths)
        print_result(result)
        results.append(result)
        await asyncio.sleep(6)  # attempts still with a hung model finish (deadline 5 s)
    return results


def print_result(result: dict[str, Any]) -> None:
    b = result["bystanders"]
    line = (
        f"{result['scenario']:>20}: bystanders {b['requests']} requests p50 {b['p50_ms']} ms p99 {b['p99_ms']} ms "
        f"max {b['max_ms']} ms, non-JSON {b['not_json']}, no answer {b['no_answer']}, {b['statuses']}"
        f"\n{'':>22}p99 by path: {b['p99_ms_by_path']}"
    )
    if "flood" in result:
        f = result["flood"]
        line += (
            f"\n{'':>22}flood: {f['requests']} answers, p50 {f['p50_ms']} ms p99 {f['p99_ms']} ms "
            f"max {f['max_ms']} ms, non-JSON {f['not_json']}, no answer {f['no_answer']}, "
        )
        line += f"{f['statuses']}"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--flood", type=int, default=300, help="attempts kept in flight by the flood")
    parser.add_argument("--model", choices=["stub", "tiny"], default="stub")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--api-env", action="append", default=[], metavar="NAME=VALUE", help="a setting of the API (repeatable)"
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="dynaloop-bulkheads-"))
    stack = start_stack(
        workdir,
        writers=BYSTANDER_WRITERS + FLOOD_WRITERS,
        validators=BYSTANDER_VALIDATORS,
        model_kind=args.model,
        # The shipped model-call settings (load.py turns retries off), rate limits off: the
        # bulkheads must hold against a flood the rate limiter does not stop (many tokens,
        # many addresses), and all clients here share one address.
        api_env={
            "DYNALOOP_MODEL_RETRIES": "2",
            "DYNALOOP_RETRY_AFTER_S": "5",
            **dict(item.split("=", 1) for item in args.api_env),
        },
    )
    try:
        print(f"API {stack.api.url}, model server {stack.model.url} ({args.model}), SQLite; CPU {cpu_model()}")
        results = asyncio.run(run(stack, args.seconds, args.flood))
    finally:
        stack.stop()
    held = all(r["bystanders"]["p99_ms"] < 200 for r in results)
    clean = all(r["bystanders"]["not_json"] == 0 and r.get("flood", {}).get("not_json", 0) == 0 for r in results)
    answered = all(r["bystanders"]["no_answer"] == 0 for r in results)
    report = {
        "command": "python bench/bulkheads.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "seconds": args.seconds,
        "flood": args.flood,
        "model": args.model,
        "scenarios": results,
        "p99_under_200ms": held,
        "no_non_json_answers": clean,
        "bystanders_always_answered": answered,
    }
    print(
        f"bystanders' p99 < 200 ms in every scenario: {held}; 0 non-JSON answers: {clean}; "
        f"every bystander request answered: {answered}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    shutil.rmtree(workdir, ignore_errors=True)
    if not (held and clean and answered):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
