"""Bulkheads benchmark: does one crowdworker's burst stall everyone else? (issue 12, point 7;
issue 26, item 10)

A real ``dynaloop api`` (SQLite) and the tests' stub model server run as processes on loopback
(bench/load.py's stack). Twenty other users, 10 writers and 10 validators, work in a loop, one
request every 0.2 s each: a writer reads ``/me`` and their assignment and checks a new text of
their own with the model (``POST /assignments/{id}/attempts``; when the assignment's tries are
used up, skips it and starts the next one), a validator reads ``/me`` and a validation batch.
Every one of their requests is timed, in these scenarios of ``--seconds`` each (``--scenarios``):

* ``quiet``: the other users alone (the baseline);
* ``one-writer-burst``: one writer token keeps ``--flood`` (300) attempts in flight at once, each
  sent again the moment it is answered, Retry-After ignored, over 300 keep-alive connections;
* ``one-writer-burst-new-connections``: the same, each attempt on a new connection;
* ``one-writer-burst-reads``: the same token keeps 300 reads of its assignment in flight (no
  model, no per-writer model limit: only the per-token limit stands in the way);
* ``many-writers`` (not by default): 300 attempts in flight spread over 50 writer tokens;
* ``model-stopped`` (not by default): the model server stopped with SIGSTOP while 50 writers
  flood.

The flood runs in a process of its own on bare sockets, as an attacker's load tool does: an
HTTP client library in Python spends more CPU per request than the server's refusal costs, and
would have measured its own speed, not the server's.

For each scenario: the other users' p50 / p99 / max latency (and p99 per request kind), their
ratio to the quiet p99, pass or fail against the limit (p99 < 200 ms), the API process's CPU,
how many answers anywhere were not in the JSON error shape, and the flood's answers by status
and code. The machine (CPU model, cores, avx512_bf16 / AMX flags) and the load average are
printed and written with the results. Exit status 1 if any scenario fails.

Usage:
    python bench/bulkheads.py [--seconds 15] [--flood 300] [--scenarios quiet,one-writer-burst,...]
        [--api-env DYNALOOP_REQUESTS_PER_TOKEN=1000 ...] [--json bench/results/bulkheads.json]
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

from bench.load import EDITS, Stack, start_stack  # noqa: E402
from bench.machine import cpu_model  # noqa: E402

API = "/api/v1"
BYSTANDER_WRITERS = 10
BYSTANDER_VALIDATORS = 10
FLOOD_WRITERS = 50
TEXT = "Honestly the cafe on the corner serves a decent lunch."
# Pause of a bystander between two requests: 20 people clicking about 5 times a second.
BYSTANDER_PAUSE_S = 0.2
# The target: other users' p99 while one writer bursts (issue 26, item 10).
P99_LIMIT_MS = 200


@dataclass
class Tally:
    latencies_ms: list[float] = field(default_factory=list)
    by_path: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    not_json: int = 0  # answers that are not JSON, or errors not in {"error": {"code", "message", ...}}
    no_answer: int = 0  # connection errors: no HTTP answer at all
    samples: list[str] = field(default_factory=list)
    client_cpu_s: float | None = None  # the flooding client's own CPU time

    def record_raw(self, status: int, body: bytes, elapsed_ms: float) -> None:
        """An answer read off a bare socket (the flood's client)."""
        self.latencies_ms.append(elapsed_ms)
        label = str(status)
        try:
            payload = json.loads(body)
            if status >= 400:
                error = payload["error"]
                assert isinstance(error["code"], str) and isinstance(error["message"], str)
                label += f" {error['code']}"
        except Exception:
            self.not_json += 1
            if len(self.samples) < 5:
                self.samples.append(f"{status} {body[:120]!r}")
        self.statuses[label] += 1

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
            "client_cpu_s": None if self.client_cpu_s is None else round(self.client_cpu_s, 1),
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


async def bystander(
    http: httpx.AsyncClient, token: str, paths: list[str], tally: Tally, stop: float, round_id: int | None = None
) -> None:
    """One person clicking: ``paths`` in turn, one every ``BYSTANDER_PAUSE_S``. A writer
    (``round_id`` given) also checks a text of their own with the model once per turn, and
    when their assignment is spent (409 or 410: tries used up, fooled, expired) skips it and
    starts the next one: every one of those requests is measured too."""
    headers = {"Authorization": f"Bearer {token}"}
    await asyncio.sleep(random.uniform(0, BYSTANDER_PAUSE_S))  # people do not click in step
    i = 0
    while time.monotonic() < stop:
        path = paths[i % len(paths)]
        if path.endswith("/attempts"):
            text = f"{TEXT} ({random.choice(EDITS)} {uuid.uuid4().hex[:8]})"  # a new text each time
            response = await timed(
                http, tally, "POST", path, json={"text": text}, headers={**headers, "Idempotency-Key": uuid.uuid4().hex}
            )
            if response is not None and response.status_code in (409, 410) and round_id is not None:
                assignment_id = int(path.split("/")[-2])
                await timed(http, tally, "POST", f"{API}/assignments/{assignment_id}/skip", headers=headers)
                started = await timed(
                    http, tally, "POST", f"{API}/rounds/{round_id}/assignments", json={}, headers=headers
                )
                if started is not None and started.status_code in (200, 201):
                    new = f"{API}/assignments/{started.json()['id']}"
                    paths[:] = [p.replace(f"{API}/assignments/{assignment_id}", new) for p in paths]
        else:
            await timed(http, tally, "GET", path, headers=headers)
        i += 1
        await asyncio.sleep(BYSTANDER_PAUSE_S)


def flood_request(host: str, token: str, assignment_id: int, reads: bool) -> bytes:
    """One request of the flood as bytes: an attempt (or, with ``reads``, a read of the
    assignment), a new Idempotency-Key each."""
    key = uuid.uuid4().hex
    if reads:
        return (
            f"GET {API}/assignments/{assignment_id} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\nIdempotency-Key: {key}\r\n\r\n"
        ).encode()
    body = json.dumps({"text": TEXT}).encode()
    return (
        f"POST {API}/assignments/{assignment_id}/attempts HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token}\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, whether the server closes the connection) of one HTTP/1.1 answer."""
    status_line = await reader.readuntil(b"\r\n")
    status = int(status_line.split()[1])
    length, closes = 0, False
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
        elif name.strip().lower() == "connection" and value.strip().lower() == "close":
            closes = True
    return status, await reader.readexactly(length), closes


async def flooder(
    url: str, token: str, assignment_id: int, tally: Tally, stop: float, new_connections: bool, reads: bool
) -> None:
    """Requests back to back on one connection (or, with ``new_connections``, each on a new
    one), Retry-After ignored. Written on bare sockets, as an attacker's load tool (wrk, hey)
    is: an HTTP client library in Python would spend more CPU per request than the server's
    refusal costs, and the flood would be slowed by its own client, not by the server."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while time.monotonic() < stop:
        started = time.perf_counter()
        try:
            if connection is None:
                connection = await asyncio.open_connection(host, int(port))
            reader, writer = connection
            writer.write(flood_request(host, token, assignment_id, reads))
            status, body, closes = await read_response(reader)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            tally.statuses[type(exc).__name__] += 1
            tally.no_answer += 1
            connection = None
            continue
        tally.record_raw(status, body, (time.perf_counter() - started) * 1000)
        if closes or new_connections:
            connection[1].close()
            connection = None


async def start_assignment(http: httpx.AsyncClient, token: str, round_id: int) -> int:
    response = await http.post(
        f"{API}/rounds/{round_id}/assignments", json={}, headers={"Authorization": f"Bearer {token}"}
    )
    response.raise_for_status()
    return int(response.json()["id"])


async def flood_loop(
    url: str, flood: int, flood_tokens: list[tuple[str, int]], seconds: float, new_connections: bool, reads: bool
) -> Tally:
    tally = Tally()
    stop = time.monotonic() + seconds
    cpu_before = time.process_time()
    await asyncio.gather(
        *(flooder(url, *flood_tokens[i % len(flood_tokens)], tally, stop, new_connections, reads) for i in range(flood))
    )
    tally.client_cpu_s = time.process_time() - cpu_before
    return tally


def flood_process(
    url: str,
    flood: int,
    flood_tokens: list[tuple[str, int]],
    seconds: float,
    new_connections: bool,
    reads: bool,
    out: Any,
) -> None:
    """The flooding client, in a process of its own (its event loop must not delay the
    bystanders' clients); sends its tally back through ``out``."""
    tally = asyncio.run(flood_loop(url, flood, flood_tokens, seconds, new_connections, reads))
    out.put(tally.summary())


async def fresh_assignment(http: httpx.AsyncClient, token: str, round_id: int) -> int:
    assignment_id = await start_assignment(http, token, round_id)
    skipped = await http.post(f"{API}/assignments/{assignment_id}/skip", headers={"Authorization": f"Bearer {token}"})
    skipped.raise_for_status()
    return await start_assignment(http, token, round_id)


@dataclass
class Scenario:
    name: str
    description: str
    flooders: int = 0  # writer tokens sharing the flood (0: no flood)
    new_connections: bool = False  # each flood request on a new connection
    model_stopped: bool = False  # the model server is stopped with SIGSTOP during the scenario
    reads: bool = False  # the flood reads its assignment instead of sending attempts


SCENARIOS = {
    scenario.name: scenario
    for scenario in [
        Scenario("quiet", "the bystanders alone (the baseline)"),
        Scenario("one-writer-burst", "one writer token keeps --flood attempts in flight", flooders=1),
        Scenario(
            "one-writer-burst-new-connections",
            "the same, each attempt on a new connection",
            flooders=1,
            new_connections=True,
        ),
        Scenario(
            "one-writer-burst-reads",
            "one writer token keeps --flood reads of its assignment in flight (no model involved)",
            flooders=1,
            reads=True,
        ),
        Scenario(
            "many-writers", f"--flood attempts in flight spread over {FLOOD_WRITERS} writer tokens", FLOOD_WRITERS
        ),
        Scenario(
            "model-stopped",
            f"the model server stopped, {FLOOD_WRITERS} writers flood",
            FLOOD_WRITERS,
            model_stopped=True,
        ),
    ]
}
DEFAULT_SCENARIOS = ["quiet", "one-writer-burst", "one-writer-burst-new-connections", "one-writer-burst-reads"]


async def scenario_run(
    stack: Stack,
    scenario: Scenario,
    seconds: float,
    flood: int,
    flood_tokens: list[tuple[str, int]],
    bystander_paths: list[tuple[str, list[str]]],
) -> dict[str, Any]:
    bystanders = Tally()
    limits = httpx.Limits(max_connections=len(bystander_paths) + 8, max_keepalive_connections=len(bystander_paths) + 8)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    flooding = None
    if scenario.model_stopped:
        assert stack.model.popen is not None
        os.killpg(stack.model.popen.pid, signal.SIGSTOP)
    try:
        if flood_tokens:
            # The flood starts first and ends last: the bystanders are measured inside it.
            flooding = context.Process(
                target=flood_process,
                args=(
                    stack.api.url,
                    flood,
                    flood_tokens,
                    seconds + 4,
                    scenario.new_connections,
                    scenario.reads,
                    results,
                ),
            )
            flooding.start()
            await asyncio.sleep(2)
        api_cpu_before, measured_from = stack.api.cpu_seconds(), time.monotonic()
        async with httpx.AsyncClient(base_url=stack.api.url, timeout=60, limits=limits) as http:
            stop = time.monotonic() + seconds
            await asyncio.gather(
                *(
                    bystander(http, token, list(paths), bystanders, stop, stack.round_id)
                    for token, paths in bystander_paths
                )
            )
        api_cpu_after, measured_s = stack.api.cpu_seconds(), time.monotonic() - measured_from
        result: dict[str, Any] = {
            "scenario": scenario.name,
            "description": scenario.description,
            "bystanders": bystanders.summary(),
            # Where the time goes: the API process's CPU (1.0 = one core busy the whole time).
            "api_cpu_share": None
            if api_cpu_before is None or api_cpu_after is None
            else round((api_cpu_after - api_cpu_before) / measured_s, 2),
        }
        if flooding is not None:
            result["flood"] = await asyncio.to_thread(results.get, True, seconds + 120)
            flooding.join(timeout=30)
    finally:
        if flooding is not None and flooding.is_alive():
            flooding.kill()
        if scenario.model_stopped:
            os.killpg(stack.model.popen.pid, signal.SIGCONT)  # type: ignore[union-attr]
    return result


async def run(stack: Stack, seconds: float, flood: int, names: list[str]) -> list[dict[str, Any]]:
    writers = stack.writer_tokens
    bystander_writers = writers[:BYSTANDER_WRITERS]
    flood_writers = writers[BYSTANDER_WRITERS:]
    async with httpx.AsyncClient(base_url=stack.api.url, timeout=60) as http:
        paths: list[tuple[str, list[str]]] = []
        for token in bystander_writers:
            assignment = f"{API}/assignments/{await start_assignment(http, token, stack.round_id)}"
            paths.append((token, [f"{API}/me", assignment, f"{assignment}/attempts"]))
        for token in stack.validator_tokens:
            paths.append((token, [f"{API}/me", f"{API}/rounds/{stack.round_id}/validation-batch"]))
        warm_up = Tally()
        for token, token_paths in paths:  # not measured: first connections, first queries
            for path in token_paths:
                if not path.endswith("/attempts"):
                    await timed(http, warm_up, "GET", path, headers={"Authorization": f"Bearer {token}"})
    results = []
    for name in names:
        scenario = SCENARIOS[name]
        # A fresh assignment for each flooding writer: the tries an earlier scenario used up
        # would end the flood at "all tries used" before it reached the model.
        async with httpx.AsyncClient(base_url=stack.api.url, timeout=60) as http:
            flood_tokens = [
                (token, await fresh_assignment(http, token, stack.round_id))
                for token in flood_writers[: scenario.flooders]
            ]
        result = await scenario_run(stack, scenario, seconds, flood, flood_tokens, paths)
        results.append(result)
        print_result(result, results[0] if results[0]["scenario"] == "quiet" else None)
        await asyncio.sleep(6)  # attempts still with a hung model finish (deadline 5 s)
    return results


def print_result(result: dict[str, Any], quiet: dict[str, Any] | None) -> None:
    b = result["bystanders"]
    ratio = ""
    if quiet is not None and quiet is not result and quiet["bystanders"]["p99_ms"]:
        result["p99_ratio_to_quiet"] = round(b["p99_ms"] / quiet["bystanders"]["p99_ms"], 2)
        ratio = f" ({result['p99_ratio_to_quiet']} x quiet)"
    result["p99_under_limit"] = b["p99_ms"] < P99_LIMIT_MS
    # A 503 `overloaded` is fast but it is no answer: the other users must be served, too.
    result["bystander_server_errors"] = sum(n for status, n in b["statuses"].items() if status.startswith("5"))
    result["passed"] = result["p99_under_limit"] and result["bystander_server_errors"] == 0
    line = (
        f"{result['scenario']:>32}: bystanders {b['requests']} requests p50 {b['p50_ms']} ms p99 {b['p99_ms']} ms"
        f"{ratio} [{'pass' if result['passed'] else 'FAIL'}: limit {P99_LIMIT_MS} ms and no 5xx, "
        f"{result['bystander_server_errors']} 5xx] "
        f"max {b['max_ms']} ms, non-JSON {b['not_json']}, no answer {b['no_answer']}, {b['statuses']}"
        f"\n{'':>34}API process CPU: {result['api_cpu_share']} cores"
        f"\n{'':>34}p99 by request: {b['p99_ms_by_path']}"
    )
    if "flood" in result:
        f = result["flood"]
        line += (
            f"\n{'':>34}flood: {f['requests']} answers, p50 {f['p50_ms']} ms p99 {f['p99_ms']} ms "
            f"max {f['max_ms']} ms, non-JSON {f['not_json']}, no answer {f['no_answer']}, "
            f"client CPU {f['client_cpu_s']} s, "
        )
        line += f"{f['statuses']}"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--flood", type=int, default=300, help="attempts kept in flight by the flood")
    parser.add_argument("--model", choices=["stub", "tiny"], default="stub")
    parser.add_argument(
        "--scenarios",
        default=",".join(DEFAULT_SCENARIOS),
        help=f"comma-separated, from: {', '.join(SCENARIOS)} (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--api-env", action="append", default=[], metavar="NAME=VALUE", help="a setting of the API (repeatable)"
    )
    args = parser.parse_args()
    names = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    if unknown := [name for name in names if name not in SCENARIOS]:
        parser.error(f"unknown scenarios {unknown}; choose from {list(SCENARIOS)}")

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
    cpu = cpu_model()
    try:
        print(f"API {stack.api.url}, model server {stack.model.url} ({args.model}), SQLite; CPU {cpu}")
        print(f"load average before: {os.getloadavg()}")
        results = asyncio.run(run(stack, args.seconds, args.flood, names))
    finally:
        stack.stop()
    held = all(r["passed"] for r in results)
    clean = all(r["bystanders"]["not_json"] == 0 and r.get("flood", {}).get("not_json", 0) == 0 for r in results)
    answered = all(r["bystanders"]["no_answer"] == 0 for r in results)
    report = {
        "command": "python bench/bulkheads.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu": cpu,
        "loadavg_at_end": os.getloadavg(),
        "python": platform.python_version(),
        "seconds": args.seconds,
        "flood": args.flood,
        "model": args.model,
        "p99_limit_ms": P99_LIMIT_MS,
        "scenarios": results,
        "p99_under_limit": held,
        "no_non_json_answers": clean,
        "bystanders_always_answered": answered,
    }
    print(
        f"other users' p99 < {P99_LIMIT_MS} ms and no 5xx in every scenario: {'pass' if held else 'FAIL'}; "
        f"0 non-JSON answers: {clean}; every bystander request answered: {answered}"
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
