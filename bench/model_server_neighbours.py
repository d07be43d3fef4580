"""The model server beside a busy neighbour: a fixed thread team against ``--threads auto``.

A deployment rarely gives the model server a machine of its own: the API, PostgreSQL, a training
job or the web app run beside it, and at a launch they are busy exactly when the model is asked
most. Torch's CPU forward pass runs on one OpenMP thread per core and waits at every operator for
the slowest one, so a core taken by a neighbour stalls the whole team (model_server/threads.py).

This runs two servers of the same model directory (a fresh MiniLM with an untrained 3-way head,
as ``bench/model_server.py`` builds it, and its precision check), one at a time:

* **fixed**: ``--threads N`` with N the cores this process may use (torch's default team, what
  the server ran before ``--threads auto``);
* **auto**: ``--threads auto``, the default.

beside each of three neighbours, a process of its own that burns CPU: **none**, **half** (busy
5 ms, asleep 5 ms: half a core) and **one core** (a busy loop). ``--in-process`` measures instead
the forward passes themselves in this process (no HTTP) on a team of every core and on one
thread, beside those neighbours and a **quarter** one (busy 2.5 ms, asleep 7.5 ms): where one
thread starts to win is what ``--threads auto`` is set by. Each server gets 1 and 32
closed-loop clients of the light socket client (``bench/model_server.py``'s ``SocketClient``, one
sentence a request). Phases are interleaved in ``--rounds`` rounds (fixed then auto for each
neighbour and concurrency) and the ratio auto / fixed of requests per second is taken per round;
the report gives the medians. The server's ``dynaloop_model_forward_threads`` gauge after each
phase says which team size ``auto`` chose.

    .venv/bin/python bench/model_server_neighbours.py --out bench/results/model_server_neighbours.json
    .venv/bin/python bench/model_server_neighbours.py --quick      # short windows, a smoke test
    .venv/bin/python bench/model_server_neighbours.py --in-process --out bench/results/threads_in_process.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

_HERE = Path(__file__).resolve().parent
REPO = _HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.machine import cpu_model, load_average, model_server_bench  # noqa: E402

bench_server = model_server_bench()


def _duty(busy_ms: float, idle_ms: float) -> str:
    """A neighbour busy ``busy_ms`` then asleep ``idle_ms``, over and over."""
    return (
        "import time\n"
        "while True:\n"
        "    t = time.perf_counter()\n"
        f"    while time.perf_counter() - t < {busy_ms / 1000}:\n"
        "        pass\n"
        f"    time.sleep({idle_ms / 1000})\n"
    )


NEIGHBOURS = {
    "none": None,
    "quarter": _duty(2.5, 7.5),
    "half": _duty(5, 5),
    "one core": "while True:\n    pass\n",
}
SERVER_NEIGHBOURS = ["none", "half", "one core"]
CLIENTS = (1, 32)
CHANGES = "dynaloop_model_forward_thread_changes_total"


@contextmanager
def neighbour(name: str) -> Iterator[subprocess.Popen[bytes] | None]:
    """The neighbour process for the block (none for ``none``), always killed at the end."""
    code = NEIGHBOURS[name]
    if code is None:
        yield None
        return
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def server_metric(server: Any, name: str) -> float | None:
    """One of the server's unlabelled metrics: ``dynaloop_model_forward_threads`` (threads of its
    last forward pass), ``dynaloop_model_forward_thread_changes_total``."""
    for line in httpx.get(f"{server.url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="a text file with one sentence per line (default: tweeteval)")
    parser.add_argument("--out", type=Path, default=_HERE / "results" / "model_server_neighbours.json")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--neighbours",
        nargs="+",
        choices=list(NEIGHBOURS),
        help=f"which neighbours to run (default: {', '.join(SERVER_NEIGHBOURS)}; with --in-process, all four)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="instead of the servers: forward passes in this process on a team of every core and on one thread, "
        "beside each neighbour, at fp32 and bf16 (where the CPU has it), batches of 1 and 32",
    )
    parser.add_argument("--quick", action="store_true", help="short windows: a smoke test, not a measurement")
    args = parser.parse_args(argv)

    if args.neighbours is None:
        args.neighbours = list(NEIGHBOURS) if args.in_process else SERVER_NEIGHBOURS
    if args.in_process:
        return in_process(args)
    scale = 0.3 if args.quick else 1.0
    window = {1: 5.0 * scale, 32: 6.0 * scale}
    warmup = {1: 1.5 * scale, 32: 2.0 * scale}
    max_per_client = {1: 5000, 32: 1000}
    cores = len(os.sched_getaffinity(0))
    started = time.perf_counter()
    sentences, source = bench_server.load_sentences(args.data)
    bodies = [json.dumps({"texts": [s]}).encode() for s in sentences]

    servers = [
        bench_server.Server("fixed", ["--threads", str(cores)]),
        bench_server.Server("auto", ["--threads", "auto"]),
    ]
    phases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dynaloop-bench-") as tmp:
        tmp_path = Path(tmp)
        from rounds.models.init_model import init_model_dir

        model_dir = tmp_path / "model"
        print("building an untrained MiniLM classifier directory ...", flush=True)
        init_model_dir(model_dir, labels=bench_server.LABELS)
        check_note = bench_server.ensure_precision_check(model_dir, sentences, own=True)
        with bench_server.running_servers(servers, model_dir, tmp_path):
            precision, plan = bench_server.served_precision(servers[0])
            print(f"precision plan: {plan['by_batch_size']}", flush=True)
            for r in range(args.rounds):
                for name in args.neighbours:
                    with neighbour(name):
                        for clients in CLIENTS:
                            # Each server first in every other round: the machine's speed drifts.
                            for server in servers if r % 2 == 0 else servers[::-1]:
                                changes = server_metric(server, CHANGES)
                                phase = bench_server.run_phase(
                                    server,
                                    bodies,
                                    clients,
                                    warmup[clients],
                                    window[clients],
                                    max_per_client[clients],
                                    "socket",
                                    max_disturbance=float("inf"),  # the neighbour is the point
                                    attempts=1,
                                )
                                phases.append(
                                    {
                                        "round": r + 1,
                                        "neighbour": name,
                                        "forward_threads": server_metric(server, "dynaloop_model_forward_threads"),
                                        "team_changes": (server_metric(server, CHANGES) or 0) - (changes or 0),
                                        **asdict(phase),
                                    }
                                )
    result = report(phases, args.rounds, args.neighbours)
    result.update(
        {
            "machine": {**cpu_model(), "load_average_at_end": load_average()},
            "cores_usable": cores,
            "precision_plan": plan,
            "precision_of_a_batch_of_32": precision,
            "precision_check": check_note,
            "data": {"source": source, "sentences": len(sentences)},
            "quick": args.quick,
            "seconds": round(time.perf_counter() - started, 1),
            "phases": phases,
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def in_process(args: argparse.Namespace) -> int:
    """Forward passes through ``TransformersBackend.predict`` in this process (no HTTP), on a team
    of every usable core and on one thread, beside each neighbour: the measurement behind
    ``IDLE_SHARE_FOR_A_THREAD`` in model_server/threads.py."""
    import torch

    from model_server.backends import ClassifyInput, load_backend
    from model_server.directory.runtime import native_bf16
    from rounds.models.init_model import init_model_dir

    seconds = 1.0 if args.quick else 3.0
    cores = len(os.sched_getaffinity(0))
    sentences, source = bench_server.load_sentences(args.data)
    inputs = [ClassifyInput(s) for s in sentences]
    precisions = ["fp32", "bf16"] if native_bf16("cpu") else ["fp32"]
    rows: list[dict[str, Any]] = []
    print("\n| neighbour | precision | batch | every core: seq/s | one thread: seq/s | one ÷ every |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(prefix="dynaloop-bench-") as tmp:
        model_dir = Path(tmp) / "model"
        init_model_dir(model_dir, labels=bench_server.LABELS)
        backends = {p: load_backend(model_dir, "transformers", "cpu", p) for p in precisions}
        for name in args.neighbours:
            with neighbour(name):
                for precision, backend in backends.items():
                    for batch in (1, 32):
                        rates = {}
                        for team in (cores, 1):
                            torch.set_num_threads(team)
                            rates[team] = _forward_rate(backend, inputs, batch, 0.5)  # warm-up
                            rates[team] = _forward_rate(backend, inputs, batch, seconds)
                        row = {
                            "neighbour": name,
                            "precision": precision,
                            "batch": batch,
                            "every_core_seq_per_s": round(rates[cores], 1),
                            "one_thread_seq_per_s": round(rates[1], 1),
                            "one_over_every": round(rates[1] / rates[cores], 3),
                        }
                        rows.append(row)
                        print(
                            f"| {name} | {precision} | {batch} | {row['every_core_seq_per_s']} | "
                            f"{row['one_thread_seq_per_s']} | {row['one_over_every']} |",
                            flush=True,
                        )
        torch.set_num_threads(cores)
    result = {
        "in_process": rows,
        "cores_usable": cores,
        "machine": {**cpu_model(), "load_average_at_end": load_average()},
        "data": {"source": source, "sentences": len(sentences)},
        "seconds_per_cell": seconds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def _forward_rate(backend: Any, inputs: Sequence[Any], batch: int, seconds: float) -> float:
    """Sentences a second through ``backend.predict`` in batches of ``batch``, for ``seconds``."""
    done, index, started = 0, 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        backend.predict([inputs[(index + j) % len(inputs)] for j in range(batch)])
        index += batch
        done += batch
    return done / (time.perf_counter() - started)


def report(phases: Sequence[dict[str, Any]], rounds: int, neighbours: Sequence[str]) -> dict[str, Any]:
    """Per neighbour and concurrency: each server's median requests/s and p99, the threads auto
    chose, and the median over rounds of auto / fixed."""
    table: list[dict[str, Any]] = []
    print(
        "\n| neighbour | clients | fixed req/s (p99 ms) | auto req/s (p99 ms) | auto's team (changes) | auto ÷ fixed |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in neighbours:
        for clients in CLIENTS:
            cell = [p for p in phases if p["neighbour"] == name and p["clients"] == clients]
            rows = {server: [p for p in cell if p["server"] == server] for server in ("fixed", "auto")}
            ratios = [
                a["seq_per_s"] / f["seq_per_s"]
                for f, a in zip(rows["fixed"], rows["auto"], strict=True)
                if f["seq_per_s"] > 0
            ]
            entry = {
                "neighbour": name,
                "clients": clients,
                "fixed_seq_per_s": statistics.median(p["seq_per_s"] for p in rows["fixed"]),
                "fixed_p99_ms": statistics.median(p["p99_ms"] for p in rows["fixed"]),
                "auto_seq_per_s": statistics.median(p["seq_per_s"] for p in rows["auto"]),
                "auto_p99_ms": statistics.median(p["p99_ms"] for p in rows["auto"]),
                "auto_forward_threads": [p["forward_threads"] for p in rows["auto"]],
                "auto_team_changes": [p["team_changes"] for p in rows["auto"]],
                "neighbour_cores": [p["cpu"]["other_cores"] for p in rows["auto"]],
                "auto_over_fixed": round(statistics.median(ratios), 3) if ratios else None,
                "auto_over_fixed_per_round": [round(x, 3) for x in ratios],
            }
            table.append(entry)
            print(
                f"| {name} | {clients} | {entry['fixed_seq_per_s']:.1f} ({entry['fixed_p99_ms']:.1f}) | "
                f"{entry['auto_seq_per_s']:.1f} ({entry['auto_p99_ms']:.1f}) | "
                f"{', '.join(f'{t:g}' for t in entry['auto_forward_threads'] if t is not None)} "
                f"({', '.join(f'{c:g}' for c in entry['auto_team_changes'])}) | "
                f"{entry['auto_over_fixed']} |"
            )
    return {"rounds": rounds, "table": table}


if __name__ == "__main__":
    raise SystemExit(main())
