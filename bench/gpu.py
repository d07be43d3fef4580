"""The GPU path, measured: the transformers backend on CUDA checked against the CPU, the raw
batched forward pass as the limit, and the model server over HTTP against that limit.

Run on a machine with a CUDA GPU (docs/benchmarks.md, "GPU"), on a trained model directory
(``bench/train_tweeteval.py --device gpu --mixed-precision bf16 --out DIR`` makes one):

    python bench/gpu.py --model DIR --json bench/results/gpu.json

1. **correctness** -- the first ``--correctness-n`` (2,000) tweets of TweetEval sentiment's test
   split through ``TransformersBackend`` on the CPU at fp32 (the reference) and on CUDA at fp32 and
   bf16: the share of equal predicted labels, the largest probability difference and the share of
   tweets whose probabilities all lie within 0.01 of the reference.
2. **fixed cost of one pass** -- CUDA forward passes of 1 to 256 sentences of 8 to 64 tokens; a
   least-squares fit ``time = fixed + per_token * padded tokens`` gives the fixed cost of a pass
   in padded tokens (what the backend's length-bucketing trades padding against).
3. **limit** -- every test tweet tokenised beforehand, sorted by length, cut into batches of 256,
   each padded to its own longest, already on the GPU: the forward pass alone at bf16 (and fp32),
   in sentences per second. Also ``TransformersBackend.predict`` on batches of 256 tweets
   (tokenising, bucketing, forward, probabilities; what one server batch costs), with the GPU
   split cost and with the CPU's.
4. **server** -- ``dynaloop model-server --device cuda`` (``--precision bf16``, ``--max-batch-size
   256``) over real HTTP on loopback, closed-loop clients sending one tweet per ``POST /predict``
   from several client processes (one process cannot drive 1,024 connections without becoming
   the bottleneck): 1, 32, 256 and 1,024 clients, sentences/s, p50/p99, and the ratio to the
   limit; plus 64 clients sending 16 tweets a request, which shows what the model path holds
   when HTTP is not paid per tweet. The server's own CPU use (cores) is reported beside each row:
   a server main thread near 1.0 core means its event loop (HTTP parsing, JSON) is the
   bottleneck, not the GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.machine import model_server_bench

REPO: Path = model_server_bench().REPO


def load_tweets(explicit: Path | None) -> tuple[list[str], str]:
    bench = model_server_bench()
    candidates = [explicit] if explicit else [root / bench.DATA_FILE for root in bench.DATA_CANDIDATES]
    for path in candidates:
        if path is not None and path.is_file():
            lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            return lines, str(path)
    raise SystemExit(f"no tweets: give --data (TweetEval sentiment's test_text.txt); looked at {candidates}")


def environment() -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cuda_available": torch.cuda.is_available(),
    }
    try:
        import accelerate

        info["accelerate"] = accelerate.__version__
    except ImportError:
        info["accelerate"] = None
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except ImportError:
        info["vllm"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            info["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            info["nvidia_smi"] = f"not run: {exc}"
    return info


# --- 1. correctness --------------------------------------------------------------------------


def _predict_all(backend: Any, texts: Sequence[str], batch: int = 64) -> list[Any]:
    from model_server.backends import ClassifyInput

    outputs: list[Any] = []
    for start in range(0, len(texts), batch):
        outputs.extend(backend.predict([ClassifyInput(t) for t in texts[start : start + batch]]))
    return outputs


def correctness(model_dir: Path, texts: Sequence[str], device: str) -> dict[str, Any]:
    from model_server.backends import load_backend

    reference_backend = load_backend(model_dir, "transformers", "cpu", "fp32")
    reference = _predict_all(reference_backend, texts)
    reference_backend.close()
    results: dict[str, Any] = {"n": len(texts), "reference": "transformers, cpu, fp32"}
    for precision in ("fp32", "bf16"):
        backend = load_backend(model_dir, "transformers", device, precision)
        served = _predict_all(backend, texts)
        backend.close()
        diffs = [
            max(abs(a.probabilities[label] - b.probabilities[label]) for label in a.probabilities)
            for a, b in zip(reference, served, strict=True)
        ]
        agree = sum(a.labels == b.labels for a, b in zip(reference, served, strict=True)) / len(texts)
        results[f"{device}_{precision}"] = {
            "label_agreement": round(agree, 5),
            "max_probability_difference": round(max(diffs), 5),
            "mean_probability_difference": round(statistics.fmean(diffs), 6),
            "share_within_0_01": round(sum(d <= 0.01 for d in diffs) / len(diffs), 5),
            "meets_target": agree >= 0.995 and max(diffs) <= 0.01,
        }
        print(f"correctness {device} {precision}: {results[f'{device}_{precision}']}", flush=True)
    return results


# --- 2. and 3. fixed cost and the limit --------------------------------------------------------


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time_passes(forward: Any, batches: Sequence[dict[str, Any]], device: str, repeats: int) -> float:
    forward(batches[0])  # warm-up (kernel selection)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for tensors in batches:
            forward(tensors)
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return best


def _forward(backend: Any, batch_size: int) -> Any:
    """The backend's forward pass for a batch of ``batch_size`` (its precision plan's choice)."""
    return backend.precision.forwards[backend.precision.precision_for(batch_size)]


def fixed_cost(backend: Any, device: str) -> dict[str, Any]:
    """Least-squares ``seconds = fixed + per_token * padded_tokens`` over passes of 1-256
    sentences of 8-64 tokens; the fixed cost expressed in padded tokens."""
    import numpy as np
    import torch

    points = []
    on_gpu = device.startswith("cuda")
    # On a CPU (a smoke test of this script) a small grid: big passes take seconds there.
    sizes, lengths = ((1, 8, 32, 64, 128, 256, 512), (8, 16, 32, 64, 128)) if on_gpu else ((1, 4, 16), (8, 16))
    with torch.inference_mode():
        for size in sizes:
            for length in lengths:
                tensors = {
                    "input_ids": torch.full((size, length), 1000, dtype=torch.long, device=device),
                    "attention_mask": torch.ones((size, length), dtype=torch.long, device=device),
                }
                if "token_type_ids" in backend.tokenizer.model_input_names:
                    tensors["token_type_ids"] = torch.zeros((size, length), dtype=torch.long, device=device)
                passes = 20 if on_gpu else 2
                pass_seconds = _time_passes(_forward(backend, size), [tensors] * passes, device, 3) / passes
                points.append((size * length, pass_seconds))
    tokens = np.array([p[0] for p in points], dtype=float)
    seconds = np.array([p[1] for p in points], dtype=float)
    per_token, fixed = (float(x) for x in np.polyfit(tokens, seconds, 1))
    smallest = float(seconds[tokens.argmin()])
    # The largest pass that took at most 25% longer than the smallest one: up to there a pass
    # costs its fixed price whatever its size.
    flat = int(max(t for t, s in points if s <= 1.25 * smallest))
    return {
        "fixed_ms": round(1000 * fixed, 4),
        "per_token_us": round(1e6 * per_token, 5),
        "fixed_in_padded_tokens": round(fixed / per_token) if per_token > 0 else None,
        "smallest_pass_ms": round(1000 * smallest, 4),
        "flat_up_to_padded_tokens": flat,
        "points": [(int(t), round(1000 * s, 4)) for t, s in points],
    }


def limit(model_dir: Path, texts: Sequence[str], device: str, batch_size: int, repeats: int) -> dict[str, Any]:
    import torch

    from model_server.backends import ClassifyInput
    from model_server.backends.transformers_backend import (
        CPU_MICRO_BATCH_SIZE,
        SPLIT_COST_TOKENS,
        TransformersBackend,
    )
    from model_server.directory import ModelMetadata
    from model_server.directory.runtime import pad_rows

    metadata = ModelMetadata.load(model_dir)
    result: dict[str, Any] = {"batch_size": batch_size, "texts": len(texts)}
    for precision in ("bf16", "fp32"):
        backend = TransformersBackend(model_dir, metadata, device=device, precision=precision)
        features, _ = backend._tokenize([ClassifyInput(t) for t in texts])
        lengths = [len(ids) for ids in features["input_ids"]]
        order = sorted(range(len(texts)), key=lengths.__getitem__)
        batches = [
            pad_rows(backend.tokenizer, features, order[start : start + batch_size], device)
            for start in range(0, len(order), batch_size)
        ]
        forward = _forward(backend, batch_size)
        with torch.inference_mode():
            seconds = _time_passes(forward, batches, device, repeats)
        result[f"forward_{precision}_seq_per_s"] = round(len(texts) / seconds, 1)
        result[f"mean_tokens_{precision}"] = round(statistics.fmean(lengths), 1)
        print(f"limit {precision}: {result[f'forward_{precision}_seq_per_s']} seq/s (forward only)", flush=True)
        if precision == "bf16":
            result["fixed_cost"] = fixed_cost(backend, device)
            print(f"fixed cost of one pass: {result['fixed_cost']}", flush=True)
            inputs = [ClassifyInput(t) for t in texts]
            for name, cost, micro in (
                ("gpu_split", backend.split_cost_tokens, backend.micro_batch_size),
                ("cpu_split", SPLIT_COST_TOKENS, CPU_MICRO_BATCH_SIZE),
            ):
                backend.split_cost_tokens, backend.micro_batch_size = cost, micro
                backend.predict(inputs[:batch_size])
                _sync(device)
                started = time.perf_counter()
                for start in range(0, len(inputs), batch_size):
                    backend.predict(inputs[start : start + batch_size])
                _sync(device)
                rate = len(inputs) / (time.perf_counter() - started)
                result[f"predict_{name}_seq_per_s"] = round(rate, 1)
                result[f"predict_{name}_settings"] = {"split_cost_tokens": cost, "micro_batch_size": micro}
                print(
                    f"backend.predict, batches of {batch_size}, {name} ({cost}, {micro}): {rate:.0f} seq/s", flush=True
                )
        backend.close()
        del backend
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return result


# --- 4. the server over HTTP ------------------------------------------------------------------


def _client_process(
    url: str, bodies: list[bytes], clients: int, offset: int, start_at: float, window: tuple[float, float]
) -> tuple[list[float], int, int]:
    """One load-generator process: ``clients`` keep-alive connections, closed loop; latencies (s)
    of the requests that started inside the window, requests answered in the window, errors."""
    bench = model_server_bench()

    async def run() -> tuple[list[float], int, int]:
        sessions = [bench.SocketClient(url) for _ in range(clients)]
        await asyncio.gather(*(s.open() for s in sessions))
        await asyncio.sleep(max(0.0, start_at - time.time()))
        latencies: list[float] = []
        done = 0
        errors = 0

        async def worker(k: int, session: Any) -> None:
            nonlocal done, errors
            index = (offset + k) * 997
            while time.time() < window[1]:
                body = bodies[index % len(bodies)]
                index += 1
                t0 = time.time()
                status = await session.predict(body)
                t1 = time.time()
                if status != 200:
                    errors += 1
                elif window[0] <= t0 and t1 <= window[1]:
                    latencies.append(t1 - t0)
                    done += 1

        try:
            await asyncio.gather(*(worker(k, s) for k, s in enumerate(sessions)))
        finally:
            await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        return latencies, done, errors

    return asyncio.run(run())


def _proc_cpu(pid: int) -> tuple[float, float]:
    bench = model_server_bench()
    return bench._cpu_s(f"/proc/{pid}/stat"), bench._cpu_s(f"/proc/{pid}/task/{pid}/stat")


def load_phase(
    url: str,
    server_pid: int,
    bodies: list[bytes],
    texts_per_request: int,
    clients: int,
    processes: int,
    warmup_s: float,
    window_s: float,
) -> dict[str, Any]:
    processes = max(1, min(processes, clients))
    share = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    start_at = time.time() + 2.0 + clients / 500  # time to connect every client first
    window = (start_at + warmup_s, start_at + warmup_s + window_s)
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes) as pool:
        pending = [
            pool.apply_async(_client_process, (url, bodies, n, sum(share[:i]), start_at, window))
            for i, n in enumerate(share)
        ]
        time.sleep(max(0.0, window[0] - time.time()))
        cpu_before = _proc_cpu(server_pid)
        time.sleep(max(0.0, window[1] - time.time()))
        cpu_after = _proc_cpu(server_pid)
        parts = [p.get(timeout=window_s + 120) for p in pending]
    latencies = sorted(x for part in parts for x in part[0])
    answered = sum(part[1] for part in parts)
    errors = sum(part[2] for part in parts)

    def quantile(q: float) -> float:
        return (
            round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2) if latencies else float("nan")
        )

    return {
        "clients": clients,
        "client_processes": processes,
        "texts_per_request": texts_per_request,
        "seq_per_s": round(answered * texts_per_request / window_s, 1),
        "requests_per_s": round(answered / window_s, 1),
        "p50_ms": quantile(0.50),
        "p99_ms": quantile(0.99),
        "errors": errors,
        "server_cores": round((cpu_after[0] - cpu_before[0]) / window_s, 2),
        "server_main_thread_cores": round((cpu_after[1] - cpu_before[1]) / window_s, 2),
    }


def server_phases(
    model_dir: Path, tweets: Sequence[str], device: str, precision: str, warmup_s: float, window_s: float
) -> list[dict[str, Any]]:
    bench = model_server_bench()
    server = bench.Server(
        f"gpu-{precision}", ["--precision", precision, "--max-batch-size", "256", "--request-timeout-s", "30"]
    )
    single = [json.dumps({"texts": [t]}).encode() for t in tweets]
    grouped = [json.dumps({"texts": list(tweets[i : i + 16])}).encode() for i in range(0, len(tweets) - 16, 16)]
    rows = []
    with tempfile.TemporaryDirectory() as logs, bench.running_servers([server], model_dir, Path(logs), device):
        assert server.pid is not None
        for clients, processes, bodies, per_request in (
            (1, 1, single, 1),
            (32, 4, single, 1),
            (256, 8, single, 1),
            (1024, 8, single, 1),
            (64, 8, grouped, 16),
        ):
            row = load_phase(server.url, server.pid, bodies, per_request, clients, processes, warmup_s, window_s)
            row["server"] = f"dynaloop model-server --device {device} --precision {precision} --max-batch-size 256"
            rows.append(row)
            print(f"server {precision}: {row}", flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a trained model directory (dynaloop_model.json)")
    parser.add_argument("--data", type=Path, help="TweetEval sentiment's test_text.txt (default: ../shared/data)")
    parser.add_argument("--device", default="cuda", help="cuda (the point of this script) or cpu for a smoke test")
    parser.add_argument("--correctness-n", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--limit-n", type=int, default=None, help="tweets for the limit (default: all)")
    parser.add_argument("--repeats", type=int, default=5, help="passes over the test set for the limit (best kept)")
    parser.add_argument("--window-s", type=float, default=8.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--skip", nargs="*", default=[], choices=["correctness", "limit", "server"])
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "gpu.json")
    args = parser.parse_args(argv)

    tweets, source = load_tweets(args.data)
    report: dict[str, Any] = {
        "benchmark": "the GPU path: correctness against the CPU, the forward limit, the model server",
        "command": "python bench/gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "data": source,
        "environment": environment(),
    }
    print(json.dumps(report["environment"], indent=1), flush=True)

    def save() -> None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")

    if "correctness" not in args.skip:
        report["correctness"] = correctness(args.model, tweets[: args.correctness_n], args.device)
        save()
    if "limit" not in args.skip:
        report["limit"] = limit(args.model, tweets[: args.limit_n], args.device, args.batch_size, args.repeats)
        save()
    if "server" not in args.skip:
        rows = server_phases(args.model, tweets, args.device, "bf16", args.warmup_s, args.window_s)
        reference = report.get("limit", {}).get("forward_bf16_seq_per_s")
        for row in rows:
            row["ratio_to_limit"] = round(row["seq_per_s"] / reference, 3) if reference else None
        report["server"] = rows
        save()
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
