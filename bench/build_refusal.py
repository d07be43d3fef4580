"""What naming every option that builds costs a refused build (docs/round_builder.md, "Build
policies"), on ONE core: bench/round_builder.py's synthetic 200,000-example round with all but 3
of the neutral examples left without gold, so strict is refused (too few neutral examples per
cell), the relaxed policy's class-balance guard refuses it too, and only a wider share builds.
Times the refused strict split alone, then ``rounds.build.preview.relaxations_for`` (every
option, each guard-refused one retried with the larger shares) on the same prepared round. The
aggregation before the splits (majority here; a build adds Dawid-Skene, see bench/round_builder.py)
is the same with or without the options and is not timed.

Usage: python bench/build_refusal.py [--examples 200000] [--json bench/results/build_refusal.json]
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
import sys  # noqa: E402
import time  # noqa: E402
from importlib import util  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

# The repository root first, so that the rounds.build package is not hidden by bench/round_builder.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rounds.build import aggregation, splits  # noqa: E402
from rounds.build.build_settings import BuildSettings, resolve_policy  # noqa: E402
from rounds.build.prepare import make_splits  # noqa: E402
from rounds.build.preview import relaxations_for  # noqa: E402
from rounds.build.round_data import Prepared, RoundData  # noqa: E402
from services.taskdef import example_path, load_task_definition  # noqa: E402

# bench/round_builder.py's synthetic round, loaded from its file (its name is the package's).
_spec = util.spec_from_file_location("bench_round_builder", Path(__file__).resolve().parent / "round_builder.py")
assert _spec is not None and _spec.loader is not None
_bench = util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)


def lopsided_prepared(n_examples: int) -> Prepared:
    responses, examples = _bench.synthetic_round(n_examples)
    majority = aggregation.majority_labels(responses, labels=_bench.VALIDATION_LABELS, min_votes=3)
    split_input = examples.assign(
        gold=majority["label"].reindex(examples["example_id"]).astype(object).to_numpy(),
        gold_votes=majority["votes"].reindex(examples["example_id"]).fillna(0).to_numpy(),
    )[splits.COLUMNS]
    neutral = np.flatnonzero(
        (split_input["gold"] == "neutral").to_numpy() & (split_input["gold_votes"] >= 4).to_numpy()
    )
    gold = split_input["gold"].to_numpy(copy=True)
    gold[np.flatnonzero((split_input["gold"] == "neutral").to_numpy())] = None
    gold[neutral[:3]] = "neutral"
    split_input["gold"] = gold
    definition = load_task_definition(example_path("dynasent-r2"))
    data = RoundData(definition, examples, responses, pd.DataFrame(), {}, [])
    dropped = np.zeros(len(split_input), dtype=bool)
    return Prepared(data, pd.DataFrame(), dropped, split_input, split_input)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=200_000)
    parser.add_argument("--json", type=Path, default=Path("bench/results/build_refusal.json"))
    args = parser.parse_args()
    prepared = lopsided_prepared(args.examples)
    config = BuildSettings()
    policy = resolve_policy(config, prepared.data.definition, prepared.data.examples)
    started = time.perf_counter()
    try:
        make_splits(prepared, policy, config.seed)
    except splits.SplitError as exc:
        refused_by = exc.details.get("constraint")
    else:
        raise SystemExit("strict built the round; the benchmark needs a refused build")
    strict_s = time.perf_counter() - started
    # The first call pays for imports done on first use (scikit-learn's metrics in the report);
    # a running API has done them already, so the figure is the median of three calls after it.
    started = time.perf_counter()
    options = relaxations_for(prepared, config, policy, refused_by=refused_by)
    first_s = time.perf_counter() - started
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        relaxations_for(prepared, config, policy, refused_by=refused_by)
        runs.append(time.perf_counter() - started)
    options_s = float(np.median(runs))
    for option in options:
        print(f"  {option.summary()[:160]}")
    results = {
        "examples": args.examples,
        "refused_strict_split_s": round(strict_s, 3),
        "options_first_call_s": round(first_s, 3),
        "options_median_of_3_s": round(options_s, 3),
        "options": len(options),
        "options_that_build": sum(o.feasible for o in options),
    }
    print(
        f"{args.examples:,} examples: the refused strict split {strict_s:.2f} s; naming the options "
        f"({len(options)}, {results['options_that_build']} build) {options_s:.2f} s (median of 3; "
        f"first call {first_s:.2f} s)"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
