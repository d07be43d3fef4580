"""Do the example tasks' training defaults learn every class? Per task family, MiniLM trained with
that family's example task's `training` defaults (class weights, learning rate, epochs, and the
(sentence, target) pair input of target-dependent tasks) against a class-balanced TF-IDF +
logistic-regression baseline trained and scored on the same rows in the same run
(docs/benchmarks.md, "Training defaults per family").

Families and their rows:

* ``single_label`` (defaults of ``dynasent-r2``): TweetEval sentiment from ``../shared/data``
  (SemEval-2017 Task 4A tweets; the train split is not shipped there). Train = ``--train`` tweets
  of a seeded shuffle of ``val``, dev (early stopping) = the next ``--dev`` of that shuffle, test = ``--test``
  tweets of a seeded shuffle of ``test``.
* ``multi_label`` (defaults of ``ethioemo-amharic``): TweetEval emotion from ``../shared/data``,
  read as multi-label data with one label per tweet (the multi-label loss, ``pos_weight`` and
  0.5 threshold; not the EthioEmo text, which the packaged MiniLM cannot read). Train =
  ``--train`` tweets of a seeded shuffle of ``train``, dev = ``val``, test = ``--test`` of ``test``.
* ``target_dependent`` (defaults of ``mad-tsc``): ``tests/data/target_sentiment_news.csv``, 48
  news sentences with a person target each, written for this project in MAD-TSC's shape (no
  public target-dependent set is in ``../shared/data``), scored by 4-fold cross-validation
  (every row predicted by the fold that did not train on it; no dev set, so the last epoch is
  kept). ``--target-file`` points it at a larger CSV with the same columns instead (``text``,
  ``target``, ``label`` with negative / neutral / positive), such as a SemEval-2014 restaurants
  export.

``--before`` also trains MiniLM with the defaults the examples had before (no class weights,
learning rate 2e-5, 3 epochs) on the same rows.

Usage: python bench/defaults_per_family.py [--families single_label,multi_label,target_dependent]
           [--train 800] [--dev 300] [--test 1000] [--before] [--json bench/results/defaults_per_family.json]

The data in ../shared/data is read where it is; nothing is copied into the repository. A family
whose data is absent is skipped with a line that says so.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.sparse import hstack
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.multiclass import OneVsRestClassifier
from sklearn.pipeline import FeatureUnion

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rounds.models.datasets import LabelledSet  # noqa: E402
from rounds.models.inference import predict_probabilities  # noqa: E402
from rounds.models.metrics import SetMetrics, compute_metrics  # noqa: E402
from rounds.models.train import TrainConfig, train_model  # noqa: E402
from services.taskdef import TrainingDefaults, example_path, load_task_definition  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
FIXTURE = ROOT / "tests" / "data" / "target_sentiment_news.csv"
EXAMPLE_OF = {"single_label": "dynasent-r2", "multi_label": "ethioemo-amharic", "target_dependent": "mad-tsc"}
# What the examples' `training` sections said before they were checked here (and what a task
# YAML without a `training` section still gets): no class weights, 2e-5, 3 epochs.
BEFORE = TrainingDefaults(class_weights="none", learning_rate=2e-5, epochs=3)
TARGET_LABELS = ["negative", "neutral", "positive"]


@dataclass
class Rows:
    """One family's rows: train, dev (or None) and test, or ``folds`` for cross-validation."""

    source: str
    train: LabelledSet
    dev: LabelledSet | None
    test: LabelledSet
    folds: list[tuple[np.ndarray, np.ndarray]] | None = None


def read_tweeteval(folder: Path, split: str) -> tuple[list[str], np.ndarray, list[str]]:
    labels = [line.split("\t")[1] for line in (folder / "mapping.txt").read_text().splitlines() if line.strip()]
    texts = (folder / f"{split}_text.txt").read_text(encoding="utf-8").splitlines()
    ids = np.asarray([int(v) for v in (folder / f"{split}_labels.txt").read_text(encoding="utf-8").split()])
    if len(texts) != len(ids):
        raise SystemExit(f"{folder}/{split}: {len(texts)} texts but {len(ids)} labels")
    return texts, ids, labels


def one_hot_set(name: str, texts: list[str], ids: np.ndarray, labels: list[str], *, multi: bool) -> LabelledSet:
    return LabelledSet(name, labels, multi, list(texts), np.eye(len(labels), dtype=np.float32)[ids])


def pick(texts: list[str], ids: np.ndarray, rows: np.ndarray) -> tuple[list[str], np.ndarray]:
    return [texts[i] for i in rows], ids[rows]


def sentiment_rows(args: argparse.Namespace) -> Rows | None:
    folder = args.shared / "tweeteval-sentiment"
    if not (folder / "val_text.txt").is_file():
        return None
    val_texts, val_ids, labels = read_tweeteval(folder, "val")
    test_texts, test_ids, _ = read_tweeteval(folder, "test")
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(val_texts))
    train = one_hot_set(
        "tweeteval-sentiment val (train part)", *pick(val_texts, val_ids, order[: args.train]), labels, multi=False
    )
    dev_rows = order[args.train : args.train + args.dev]
    dev = one_hot_set("tweeteval-sentiment val (dev part)", *pick(val_texts, val_ids, dev_rows), labels, multi=False)
    test_rows = rng.permutation(len(test_texts))[: args.test]
    test = one_hot_set("tweeteval-sentiment test (sample)", *pick(test_texts, test_ids, test_rows), labels, multi=False)
    return Rows("../shared/data/tweeteval-sentiment", train, dev, test)


def emotion_rows(args: argparse.Namespace) -> Rows | None:
    folder = args.shared / "tweeteval-emotion"
    if not (folder / "train_text.txt").is_file():
        return None
    train_texts, train_ids, labels = read_tweeteval(folder, "train")
    val_texts, val_ids, _ = read_tweeteval(folder, "val")
    test_texts, test_ids, _ = read_tweeteval(folder, "test")
    rng = np.random.default_rng(args.seed)
    train_rows = rng.permutation(len(train_texts))[: args.train]
    test_rows = rng.permutation(len(test_texts))[: args.test]
    train = one_hot_set(
        "tweeteval-emotion train (sample)", *pick(train_texts, train_ids, train_rows), labels, multi=True
    )
    dev = one_hot_set("tweeteval-emotion val", val_texts, val_ids, labels, multi=True)
    test = one_hot_set("tweeteval-emotion test (sample)", *pick(test_texts, test_ids, test_rows), labels, multi=True)
    return Rows("../shared/data/tweeteval-emotion (one label per tweet, read as multi-label)", train, dev, test)


def target_rows(args: argparse.Namespace) -> Rows:
    path = args.target_file or FIXTURE
    with path.open(encoding="utf-8", newline="") as handle:
        records = list(csv.DictReader(handle))
    unknown = sorted({r["label"] for r in records} - set(TARGET_LABELS))
    if unknown:
        raise SystemExit(f"{path}: labels {unknown} are not {TARGET_LABELS}")
    ids = np.asarray([TARGET_LABELS.index(r["label"]) for r in records])
    everything = LabelledSet(
        path.name,
        TARGET_LABELS,
        False,
        [r["text"] for r in records],
        np.eye(3, dtype=np.float32)[ids],
        targets=[r["target"] for r in records],
    )
    folds = list(StratifiedKFold(n_splits=4, shuffle=True, random_state=args.seed).split(ids, ids))
    source = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    return Rows(source, everything, None, everything, folds=folds)


def subset(labelled: LabelledSet, rows: np.ndarray, name: str) -> LabelledSet:
    return LabelledSet(
        name,
        labelled.labels,
        labelled.multi_label,
        [labelled.texts[i] for i in rows],
        labelled.y[rows],
        targets=None if labelled.targets is None else [labelled.targets[i] for i in rows],
    )


# ---------------------------------------------------------------------------- the baseline


def target_window(text: str, target: str, words: int = 4) -> str:
    """The target and the words around its first occurrence, each marked as near the target."""
    start = text.find(target)
    if start < 0:
        return "T_" + target
    left = text[:start].split()[-words:]
    right = text[start + len(target) :].split()[:words]
    return " ".join(["L_" + w for w in left] + ["T_" + w for w in target.split()] + ["R_" + w for w in right])


def baseline_probabilities(train: LabelledSet, test: LabelledSet) -> np.ndarray:
    """A class-balanced TF-IDF (character 2-5-grams within words + word 1-2-grams) + logistic
    regression, one-vs-rest per label for multi-label data; target-aware for pairs (the words
    around the target get features of their own). It mirrors the project's linear model kind
    (`round train --kind linear`), which is written beside this benchmark; the benchmark keeps
    its own copy so that it measures the same thing before and after that kind exists."""

    def union() -> FeatureUnion:
        return FeatureUnion(
            [
                ("chars", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), min_df=2, sublinear_tf=True)),
                ("words", TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)),
            ]
        )

    text_features = union()
    x_train = text_features.fit_transform(train.texts)
    x_test = text_features.transform(test.texts)
    if train.targets is not None and test.targets is not None:
        near = TfidfVectorizer(token_pattern=r"\S+", lowercase=True, sublinear_tf=True)
        x_train = hstack([x_train, near.fit_transform(map(target_window, train.texts, train.targets))]).tocsr()
        x_test = hstack([x_test, near.transform(map(target_window, test.texts, test.targets))]).tocsr()
    logistic = LogisticRegression(max_iter=2000, C=2.0, class_weight="balanced")
    if train.multi_label:
        model = OneVsRestClassifier(logistic).fit(x_train, train.y.astype(int))
        return np.asarray(model.predict_proba(x_test))
    gold = train.hard()
    fitted = logistic.fit(x_train, gold)
    probabilities = np.zeros((len(test), len(train.labels)))
    probabilities[:, fitted.classes_] = fitted.predict_proba(x_test)
    return probabilities


# ---------------------------------------------------------------------------- MiniLM


def minilm_probabilities(
    train: LabelledSet, dev: LabelledSet | None, test: LabelledSet, defaults: TrainingDefaults, family: str, seed: int
) -> tuple[np.ndarray, dict[str, object]]:
    config = TrainConfig(
        epochs=defaults.epochs,
        learning_rate=defaults.learning_rate,
        class_weights=defaults.class_weights,
        seed=seed,
        cpu=True,
    )
    pairs = train.targets is not None
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "model"
        result = train_model(
            [train],
            dev,
            labels=train.labels,
            family="multi_label" if train.multi_label else "single_label",
            input_format="text_pair" if pairs else "text",
            config=config,
            out_dir=out,
            model_id=f"bench-{family}",
            task_name=EXAMPLE_OF[family],
        )
        probabilities = predict_probabilities(out, test.texts, test.targets if pairs else None, batch_size=64)
    return probabilities, {
        "epochs_run": result.epochs_run,
        "best_epoch": result.best_epoch,
        "best_dev_macro_f1": result.best_dev_macro_f1,
        "examples_per_second": round(result.examples_per_second, 1),
        "train_seconds": round(result.wall_seconds, 1),
    }


def scores(test: LabelledSet, probabilities: np.ndarray) -> SetMetrics:
    return compute_metrics(test, probabilities)


def summary(metrics: SetMetrics) -> dict[str, object]:
    return {
        "macro_f1": round(metrics.macro_f1, 4),
        "f1": {label: round(value, 4) for label, value in metrics.f1.items()},
    }


def run_family(family: str, rows: Rows, args: argparse.Namespace) -> dict[str, object]:
    defaults = load_task_definition(example_path(EXAMPLE_OF[family])).training
    systems: dict[str, tuple[TrainingDefaults | None, str]] = {
        "baseline": (None, "TF-IDF char+word n-grams + logistic regression (balanced)"),
        "minilm": (defaults, f"MiniLM-L6, {EXAMPLE_OF[family]} defaults"),
    }
    if args.before:
        systems["minilm_before"] = (BEFORE, "MiniLM-L6, the defaults before (none, 2e-5, 3 epochs)")
    report: dict[str, object] = {
        "example_task": EXAMPLE_OF[family],
        "data": rows.source,
        "train": len(rows.train) if rows.folds is None else f"{len(rows.train)} rows, 4-fold cross-validation",
        "dev": None if rows.dev is None else len(rows.dev),
        "test": len(rows.test),
        "labels": rows.train.labels,
        "defaults": defaults.model_dump(mode="json", exclude={"accelerator"}),
        "systems": {},
    }
    for key, (train_defaults, title) in systems.items():
        started = time.perf_counter()
        details: dict[str, object] = {}
        if rows.folds is None:
            if train_defaults is None:
                probabilities = baseline_probabilities(rows.train, rows.test)
            else:
                probabilities, details = minilm_probabilities(
                    rows.train, rows.dev, rows.test, train_defaults, family, args.seed
                )
        else:
            probabilities = np.zeros(rows.test.y.shape)
            for number, (train_rows, test_rows) in enumerate(rows.folds):
                train = subset(rows.train, train_rows, f"fold {number} train")
                held_out = subset(rows.train, test_rows, f"fold {number} test")
                if train_defaults is None:
                    probabilities[test_rows] = baseline_probabilities(train, held_out)
                else:
                    probabilities[test_rows], fold = minilm_probabilities(
                        train, None, held_out, train_defaults, family, args.seed
                    )
                    details.setdefault("folds", []).append(fold)  # type: ignore[attr-defined]
        metrics = scores(rows.test, probabilities)
        report["systems"][key] = {  # type: ignore[index]
            "system": title,
            **summary(metrics),
            "predicted_classes": sorted({label for label, f1 in metrics.f1.items() if f1 > 0}),
            "wall_seconds": round(time.perf_counter() - started, 1),
            **({"training": details} if details else {}),
        }
        print(
            f"{family}: {title}: macro-F1 {100 * metrics.macro_f1:.1f}; "
            + ", ".join(f"{label} {100 * f1:.1f}" for label, f1 in metrics.f1.items()),
            flush=True,
        )
    found: dict[str, dict[str, float]] = report["systems"]  # type: ignore[assignment]
    report["model_over_baseline"] = round(found["minilm"]["macro_f1"] / max(found["baseline"]["macro_f1"], 1e-9), 3)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="single_label,multi_label,target_dependent")
    parser.add_argument("--shared", type=Path, default=SHARED, help="the shared data folder (default ../shared/data)")
    parser.add_argument("--train", type=int, default=800, help="training rows per public-data family")
    parser.add_argument("--dev", type=int, default=300, help="dev rows of TweetEval sentiment (from val)")
    parser.add_argument("--test", type=int, default=1000, help="test rows per public-data family (at most)")
    parser.add_argument("--target-file", type=Path, default=None, help="a CSV with text, target, label")
    parser.add_argument("--before", action="store_true", help="also train with the defaults before (none, 2e-5, 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "defaults_per_family.json")
    args = parser.parse_args()

    loaders = {"single_label": sentiment_rows, "multi_label": emotion_rows, "target_dependent": target_rows}
    families = [name.strip() for name in args.families.split(",") if name.strip()]
    unknown = sorted(set(families) - set(loaders))
    if unknown:
        raise SystemExit(f"--families: {unknown} are not among {sorted(loaders)}")
    started = time.perf_counter()
    results: dict[str, object] = {}
    for family in families:
        rows = loaders[family](args)
        if rows is None:
            print(f"{family}: skipped: its public data is not in {args.shared} (see ../shared/data/README.md)")
            results[family] = {"skipped": f"no data in {args.shared}"}
            continue
        results[family] = run_family(family, rows, args)

    cpu_model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or platform.machine(),
        )
        if Path("/proc/cpuinfo").is_file()
        else platform.processor()
    )
    report = {
        "benchmark": "training defaults per family",
        "command": "python bench/defaults_per_family.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpu": cpu_model,
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_average_at_end": os.getloadavg(),
        },
        "wall_seconds": round(time.perf_counter() - started, 1),
        "families": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
