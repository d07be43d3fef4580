"""Precision (issue 14): the model server at fp32, bf16, int8 and auto, against the naive fp32
server and the raw in-process batched forward of each precision, and the macro-F1 each
precision gives a trained model on held-out TweetEval tweets.

Usage:
    python bench/precision.py --model DIR [--data ../shared/data/tweeteval-sentiment] [--rounds 2]
                              [--quick] [--json bench/results/precision.json]

``--model`` is a MiniLM trained by ``bench/train_tweeteval.py --out DIR`` (``rounds.models.train``,
the code behind ``dynaloop round train``) on TweetEval's val split plus 4,000 test tweets. This
benchmark rebuilds the same seeded split: the 500 dev tweets are what the precision check reads
(as ``round train`` would; the result is written to DIR/dynaloop_precision.json, which the auto
server then obeys) and the other 7,784 are the held-out test set every precision is scored on,
through each server's ``POST /predict``.

Speed: every server is a separate ``dynaloop model-server`` process; the clients are bench/model_server.py's
closed-loop httpx clients (one sentence per request). In each of ``--rounds`` rounds the raw batched
forward of each precision, each server at 32 clients, the naive server at 32, one fp32 forward in
process and each server with a lone client are measured back to back, so that the ratios compare
phases of the same minutes; medians over rounds are reported. 1, 8 and 64 clients run once.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.machine import model_server_bench  # noqa: E402

ms = model_server_bench()

from sklearn.metrics import f1_score  # noqa: E402

from model_server.directory.runtime import cpu_description, native_bf16, why_unavailable  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "tweeteval-sentiment"
PRECISIONS = ["fp32", "bf16", "int8", "auto"]
NAIVE = "naive fp32 (batch 1)"
TARGETS = {
    "server32_over_naive32": 3.5,  # on a CPU with native bf16; 2.0 without (docs/design.md)
    "server32_over_raw_same_precision": 0.85,
    "lone_p50_over_one_fp32_forward": 1.2,
    "macro_f1_points_from_fp32": 0.3,
}


def tweeteval_split(data: Path, seed: int = 0, train_from_test: int = 4000, dev: int = 500) -> dict[str, Any]:
    """bench/train_tweeteval.py's split of TweetEval's test tweets: dev and the held-out rest."""
    labels = [line.split("\t")[1] for line in (data / "mapping.txt").read_text().splitlines() if line.strip()]
    texts = (data / "test_text.txt").read_text(encoding="utf-8").splitlines()
    ids = np.asarray([int(line) for line in (data / "test_labels.txt").read_text(encoding="utf-8").split()])
    order = np.random.default_rng(seed).permutation(len(texts))
    dev_rows, test_rows = order[train_from_test : train_from_test + dev], order[train_from_test + dev :]
    return {
        "labels": labels,
        "dev_texts": [texts[i] for i in dev_rows],
        "dev_gold": [labels[ids[i]] for i in dev_rows],
        "test_texts": [texts[i] for i in test_rows],
        "test_gold": [labels[ids[i]] for i in test_rows],
    }


def score_through_server(url: str, texts: list[str], batch: int = 32) -> tuple[list[str], dict[str, int], float]:
    """Each text's predicted label from ``POST /predict`` (``batch`` texts a request), which
    precision each was computed at, and the seconds it took."""
    predicted: list[str] = []
    used: dict[str, int] = {}
    started = time.perf_counter()
    with httpx.Client(timeout=120) as client:
        for start in range(0, len(texts), batch):
            response = client.post(f"{url}/predict", json={"texts": texts[start : start + batch]})
            response.raise_for_status()
            for prediction in response.json()["predictions"]:
                predicted.append(prediction["label"])
                used[prediction["precision"]] = used.get(prediction["precision"], 0) + 1
    return predicted, used, time.perf_counter() - started


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a MiniLM trained by bench/train_tweeteval.py --out")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="short windows: a smoke test, not a measurement")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "precision.json")
    args = parser.parse_args(argv)
    if not (args.data / "test_text.txt").is_file():
        raise SystemExit(f"{args.data} is missing: this benchmark reads TweetEval sentiment from ../shared/data")
    started = time.perf_counter()
    scale = 0.25 if args.quick else 1.0
    ms.RETRY_BUDGET_S[0] *= scale
    window = {1: 5.0 * scale, 8: 8.0 * scale, 32: 8.0 * scale, 64: 8.0 * scale}
    warmup = {1: 1.5 * scale, 8: 2.5 * scale, 32: 2.5 * scale, 64: 3.0 * scale}
    max_per_client = {1: 2000, 8: 1000, 32: 500, 64: 300}
    ms._cheap_httpx()

    import torch
    import transformers

    from rounds.models.precision_check import CheckTexts, check_precisions

    machine = {
        "cpu": cpu_description(),
        "native_bf16": native_bf16("cpu"),
        "cpu_cores": len(__import__("os").sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": __import__("onnxruntime").__version__,
        "torch_threads": torch.get_num_threads(),
    }
    print(f"machine: {machine}", flush=True)
    split = tweeteval_split(args.data)
    print(f"dev {len(split['dev_texts'])} tweets (precision check), test {len(split['test_texts'])} (macro-F1)")

    # 1. The precision check on the dev tweets, as `dynaloop round train` runs it; auto reads it.
    check = check_precisions(
        args.model, CheckTexts("tweeteval dev (500)", split["dev_texts"], gold=[[g] for g in split["dev_gold"]])
    )
    check.save(args.model)
    for precision, result in check.results.items():
        print(
            f"check {precision}: agreement {100 * result.agreement:.2f}% ({result.changed} changed), max |dp| "
            f"{result.max_probability_difference:.4f}, dev macro-F1 {100 * (result.macro_f1 or 0):.2f}, "
            f"auto {'may use' if check.admits(precision) is None else 'refuses'}",
            flush=True,
        )
    available = [p for p in PRECISIONS if p == "auto" or why_unavailable(p, "cpu") is None]
    print(f"precisions measured: {available}", flush=True)

    servers = [ms.Server(NAIVE, ["--max-batch-size", "1", "--precision", "fp32"])]
    servers += [ms.Server(p, ["--precision", p]) for p in available]
    by_name = {server.name: server for server in servers}
    sentences = split["test_texts"]
    bodies = [json.dumps({"texts": [s]}).encode() for s in sentences]

    def phase(name: str, clients: int, kind: str = "httpx") -> Any:
        return ms.run_phase(
            by_name[name], bodies, clients, warmup[clients], window[clients], max_per_client[clients], kind
        )

    fidelity: dict[str, Any] = {}
    rounds: list[dict[str, Any]] = []
    once: list[Any] = []
    raw_single_by_precision: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="dynaloop-bench-precision-") as tmp,
        ms.running_servers(servers, args.model, Path(tmp)),
    ):
        info = {p: httpx.get(f"{by_name[p].url}/info").json()["precision"] for p in available}
        print(f"auto chose: {info.get('auto', {}).get('by_batch_size')} notes: {info.get('auto', {}).get('notes')}")
        # 2. Fidelity: the held-out tweets through each server.
        reference: list[str] | None = None
        for p in available:
            predicted, used, seconds = score_through_server(by_name[p].url, sentences)
            reference = predicted if p == "fp32" else reference
            f1 = f1_score(split["test_gold"], predicted, labels=split["labels"], average="macro")
            fidelity[p] = {
                "macro_f1": round(100 * float(f1), 2),
                "agreement_with_fp32": None
                if reference is None
                else round(float(np.mean([a == b for a, b in zip(predicted, reference, strict=True)])), 5),
                "precision_used": used,
                "seconds": round(seconds, 1),
            }
            print(f"test macro-F1 at {p}: {fidelity[p]}", flush=True)
        for p in available:
            fidelity[p]["points_from_fp32"] = round(fidelity[p]["macro_f1"] - fidelity["fp32"]["macro_f1"], 2)
        # 3. Speed, in interleaved rounds.
        print(f"background load before measuring: {ms.wait_for_quiet(30.0 * scale):.2f} cores", flush=True)
        raw = {p: ms.RawBench(args.model, sentences, p) for p in available if p != "auto"}
        raw["auto"] = ms.RawBench(args.model, sentences, "auto")
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}:", flush=True)
            entry: dict[str, Any] = {"raw_batched": {}, "server32": {}, "server1": {}}
            for p in available:
                entry["raw_batched"][p] = raw[p].batched(f"round {r + 1}", 8.0 * scale)
                entry["server32"][p] = phase(p, 32)
            entry["naive32"] = phase(NAIVE, 32)
            entry["raw_single_fp32"] = raw["fp32"].single(f"round {r + 1}", 4.0 * scale)
            for p in available:
                entry["server1"][p] = phase(p, 1)
            rounds.append(entry)
        for p in available:
            raw_single_by_precision[p] = raw[p].single("once", 4.0 * scale)
        for each in raw.values():
            each.close()
        print("once each:", flush=True)
        for clients in (8, 64):
            once.append(phase(NAIVE, clients))
            for p in available:
                once.append(phase(p, clients))
        once.append(phase(NAIVE, 1))
        # bench/model_server.py's minimal asyncio-socket client (~0.02 cores against httpx's ~0.2 at
        # these rates): how much of the gap to the raw forward is the load generator's own CPU.
        for p in available:
            once.append(phase(p, 32, "socket"))

    def ratio(entry: dict[str, Any], p: str) -> dict[str, float]:
        server32 = entry["server32"][p].seq_per_s
        return {
            "server32_over_naive32": round(server32 / entry["naive32"].seq_per_s, 3),
            "server32_over_raw_same_precision": round(server32 / entry["raw_batched"][p]["seq_per_s"], 3),
            "lone_p50_over_one_fp32_forward": round(entry["server1"][p].p50_ms / entry["raw_single_fp32"]["p50_ms"], 3),
        }

    per_round = {p: [ratio(entry, p) for entry in rounds] for p in available}
    summary: dict[str, Any] = {}
    for p in available:
        summary[p] = {key: _median([r[key] for r in per_round[p]]) for key in per_round[p][0]} | {
            "per_round": per_round[p],
            "server32_seq_per_s": _median([e["server32"][p].seq_per_s for e in rounds]),
            "server32_p99_ms": _median([e["server32"][p].p99_ms for e in rounds]),
            "server1_p50_ms": _median([e["server1"][p].p50_ms for e in rounds]),
            "raw_batched_seq_per_s": _median([e["raw_batched"][p]["seq_per_s"] for e in rounds]),
            "raw_single_p50_ms": raw_single_by_precision[p]["p50_ms"],
            "macro_f1": fidelity[p]["macro_f1"],
            "points_from_fp32": fidelity[p]["points_from_fp32"],
        }
    naive32 = _median([e["naive32"].seq_per_s for e in rounds])
    one_forward = _median([e["raw_single_fp32"]["p50_ms"] for e in rounds])

    print()
    print(f"naive fp32 server @32: {naive32:.1f} seq/s; one fp32 forward in process: p50 {one_forward:.2f} ms")
    print(
        "| precision | raw batched seq/s | server@32 seq/s | p99 ms | ×naive@32 | /raw same precision | lone p50 ms "
        "| lone/one fp32 forward | test macro-F1 | Δ points |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for p in available:
        s = summary[p]
        print(
            f"| {p} | {s['raw_batched_seq_per_s']:.1f} | {s['server32_seq_per_s']:.1f} | {s['server32_p99_ms']:.0f} | "
            f"{s['server32_over_naive32']:.2f} | {s['server32_over_raw_same_precision']:.2f} | "
            f"{s['server1_p50_ms']:.1f} | {s['lone_p50_over_one_fp32_forward']:.2f} | {s['macro_f1']:.2f} | "
            f"{s['points_from_fp32']:+.2f} |"
        )
    print(
        "once: "
        + "; ".join(
            f"{p.server}@{p.clients}: {p.seq_per_s:.1f} seq/s p50 {p.p50_ms:.1f} p99 {p.p99_ms:.1f}" for p in once
        )
    )
    report = {
        "benchmark": "precision",
        "command": "python bench/precision.py --model DIR"
        + (" --quick" if args.quick else "")
        + f" --rounds {args.rounds}",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "model": str(args.model),
        "check": check.model_dump(mode="json"),
        "auto_plan": info.get("auto"),
        "fidelity": fidelity,
        "targets": TARGETS,
        "summary": summary,
        "naive32_seq_per_s": naive32,
        "one_fp32_forward_p50_ms": one_forward,
        "raw_single": raw_single_by_precision,
        "rounds": [
            {
                "raw_batched": e["raw_batched"],
                "server32": {p: ms.asdict(v) for p, v in e["server32"].items()},
                "server1": {p: ms.asdict(v) for p, v in e["server1"].items()},
                "naive32": ms.asdict(e["naive32"]),
                "raw_single_fp32": e["raw_single_fp32"],
            }
            for e in rounds
        ],
        "once": [ms.asdict(p) for p in once],
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json} after {report['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
