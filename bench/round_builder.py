"""Round-builder benchmark (docs/design.md "Performance targets"), on ONE core:

1. 1,000,000 synthetic validation labels (200,000 examples x 5) aggregated (majority,
   distributional, Dawid-Skene), agreement computed (Fleiss, Krippendorff, Randolph, pairwise
   Cohen, per-worker) and chance-level splits built -- target < 30 s;
2. normalised edit distances for 100,000 prompt/example pairs -- target < 2 s.

Usage: python bench/round_builder.py [--examples 200000] [--json bench/results/round_builder.json]

The synthetic round looks like DynaSent Round 2: 150,000 distinct prompts, 5 labels per
example from 1,000 validators of varying reliability, a model in the loop that is right about
half the time, 10% no-prompt examples.
"""

from __future__ import annotations

import os

# One core: pin the process and every BLAS/OpenMP pool before numpy is imported.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[variable] = "1"
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import ParamSpec, TypeVar  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

# Run as `python bench/round_builder.py`, this folder comes first on sys.path and this file's name would hide
# the rounds.build package: the repository root goes before it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rounds.build import aggregation, agreement, splits  # noqa: E402
from rounds.build.pipeline import DAWID_SKENE_ITERATIONS  # noqa: E402

P = ParamSpec("P")
R = TypeVar("R")

LABELS = ["positive", "negative", "neutral"]
VALIDATION_LABELS = [*LABELS, "mixed"]


def synthetic_round(n_examples: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 3, n_examples)
    n_workers = 1000
    reliability = rng.uniform(0.55, 0.95, n_workers)
    workers = np.stack([rng.choice(n_workers, 5, replace=False) for _ in range(n_examples)])
    correct = rng.random((n_examples, 5)) < reliability[workers]
    noise = rng.integers(0, 4, (n_examples, 5))
    labels = np.where(correct, truth[:, None], noise)
    responses = pd.DataFrame(
        {
            "example_id": np.repeat(np.arange(n_examples), 5),
            "worker_id": workers.ravel(),
            "label": pd.Series(np.asarray(VALIDATION_LABELS, dtype=object)[labels.ravel()], dtype="string"),
        }
    )
    prediction = np.where(rng.random(n_examples) < 0.5, truth, rng.integers(0, 3, n_examples))
    examples = pd.DataFrame(
        {
            "example_id": np.arange(n_examples),
            "prompt_id": rng.integers(0, int(n_examples * 0.75), n_examples),
            "condition": np.where(rng.random(n_examples) < 0.1, "no_prompt", "prompt"),
            "model_prediction": np.asarray(LABELS, dtype=object)[prediction],
        }
    )
    return responses, examples


def timed(results: dict[str, float], name: str, func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    started = time.perf_counter()
    value = func(*args, **kwargs)
    results[name] = round(time.perf_counter() - started, 3)
    print(f"  {name:<28} {results[name]:7.3f} s", flush=True)
    return value


def bench_round(n_examples: int) -> dict[str, float]:
    responses, examples = synthetic_round(n_examples)
    print(f"{len(responses):,} labels, {n_examples:,} examples, {examples['prompt_id'].nunique():,} prompts")
    t: dict[str, float] = {}
    majority = timed(t, "majority", aggregation.majority_labels, responses, labels=VALIDATION_LABELS, min_votes=3)
    timed(
        t,
        "distributional",
        aggregation.distributional_labels,
        responses,
        labels=LABELS,
        split={"mixed": ("positive", "negative")},
    )
    ds = timed(
        t,
        "dawid_skene_30_iterations",
        aggregation.dawid_skene_labels,
        responses,
        labels=VALIDATION_LABELS,
        n_iter=DAWID_SKENE_ITERATIONS,
    )
    timed(t, "fleiss_kappa", agreement.fleiss_kappa, responses, labels=VALIDATION_LABELS, n_raters=5)
    timed(t, "krippendorff_alpha", agreement.krippendorff_alpha, responses, labels=VALIDATION_LABELS)
    timed(t, "randolph_kappa", agreement.randolph_kappa, responses, labels=VALIDATION_LABELS, n_raters=5)
    timed(t, "pairwise_cohen_kappa", agreement.slot_cohen_kappas, responses, labels=VALIDATION_LABELS)
    timed(
        t,
        "per_worker_agreement",
        agreement.worker_agreement,
        responses,
        labels=VALIDATION_LABELS,
        gold=majority["label"],
    )
    split_input = examples.assign(
        gold=majority["label"].reindex(examples["example_id"]).to_numpy(),
        gold_votes=majority["votes"].reindex(examples["example_id"]).to_numpy(),
    )
    result = timed(t, "splits", splits.build_splits, split_input, LABELS, min_votes=4, seed=0)
    report = result.report
    print(
        f"  dev/test per cell: {report.dev_per_cell} (bound {report.upper_bound_c}); "
        f"model macro-F1 dev {report.model_metrics['dev']['macro_f1']:.3f}"
    )
    t["total"] = round(sum(v for k, v in t.items()), 3)
    # How much do 30 EM iterations change the labels against crowd-kit's default 100?
    full = timed(
        t,
        "dawid_skene_100_iterations_(not_in_total)",
        aggregation.dawid_skene_labels,
        responses,
        labels=VALIDATION_LABELS,
        n_iter=100,
    )
    same = (ds["label"].astype(object).fillna("-") == full["label"].astype(object).fillna("-")).mean()
    t["dawid_skene_30_vs_100_label_agreement"] = round(float(same), 5)
    print(f"  Dawid-Skene labels after 30 vs 100 iterations agree on {same:.4%} of examples")
    return t


def bench_edit_distance(n_pairs: int) -> float:
    from services.text import normalized_edit_distance

    rng = np.random.default_rng(1)
    words = np.array(
        ["the", "food", "was", "great", "but", "service", "slow", "and", "cold", "staff", "friendly", "price"]
    )
    prompts = [" ".join(rng.choice(words, rng.integers(8, 25))) for _ in range(n_pairs)]
    edited = [p[: len(p) // 2] + " really " + p[len(p) // 2 :] for p in prompts]
    started = time.perf_counter()
    distances = [normalized_edit_distance(p, e) for p, e in zip(prompts, edited, strict=True)]
    elapsed = time.perf_counter() - started
    assert all(0 < d < 1 for d in distances)
    return round(elapsed, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=200_000)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--json", type=Path, default=Path("bench/results/round_builder.json"))
    args = parser.parse_args()
    print(f"one core ({platform.processor() or platform.machine()}), pandas {pd.__version__}, numpy {np.__version__}")
    round_times = bench_round(args.examples)
    edit_seconds = bench_edit_distance(args.pairs)
    print(f"  edit distances ({args.pairs:,} pairs) {edit_seconds:7.3f} s")
    results = {
        "labels": args.examples * 5,
        "examples": args.examples,
        "seconds": round_times,
        "round_target_s": 30,
        "round_ratio_to_target": round(round_times["total"] / 30, 3),
        "edit_distance_pairs": args.pairs,
        "edit_distance_s": edit_seconds,
        "edit_distance_target_s": 2,
        "edit_distance_ratio_to_target": round(edit_seconds / 2, 3),
    }
    print(
        f"round: {round_times['total']:.2f} s = {results['round_ratio_to_target']:.2f} x the 30 s limit; "
        f"edit distances: {edit_seconds:.2f} s = {results['edit_distance_ratio_to_target']:.2f} x the 2 s limit"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
