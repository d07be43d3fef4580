"""Retraining on real data: MiniLM fine-tuned on TweetEval sentiment on this CPU, against a
majority-class baseline and a TF-IDF + logistic-regression baseline trained and tested on the
same rows in the same run (issue #5, docs/benchmarks.md "Retraining").

Data: ``../shared/data/tweeteval-sentiment`` (SemEval-2017 Task 4A tweets via TweetEval; the
train split is not shipped there). Train = all of ``val`` (2,000) + the first ``--train-from-test``
tweets of a seeded shuffle of ``test``; the next ``--dev`` tweets are the dev set that early
stopping watches; the rest of ``test`` is the test set every system is scored on.

Usage: python bench/train_tweeteval.py [--epochs 3] [--train-from-test 4000] [--dev 500]
                                       [--json bench/results/train_tweeteval.json]

Reports macro-F1 and per-class F1 for each system, the ratio of the model's macro-F1 to each
baseline's, training throughput (examples/s, upsampling and epochs included) and wall time.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from sklearn.dummy import DummyClassifier
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rounds.models.datasets import LabelledSet  # noqa: E402
from rounds.models.inference import predict_probabilities  # noqa: E402
from rounds.models.metrics import SetMetrics, compute_metrics  # noqa: E402
from rounds.models.train import TrainConfig, train_model  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tweeteval-sentiment"


@dataclass
class SystemResult:
    """One system's test-set scores, training time and anything else the report records about it."""

    metrics: SetMetrics
    train_seconds: float
    details: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"train_seconds": self.train_seconds, **self.details, "metrics": self.metrics.to_dict()}


def read_split(data: Path, split: str, labels: list[str]) -> tuple[list[str], np.ndarray]:
    texts = (data / f"{split}_text.txt").read_text(encoding="utf-8").splitlines()
    ids = [int(line) for line in (data / f"{split}_labels.txt").read_text(encoding="utf-8").split()]
    if len(texts) != len(ids):
        raise SystemExit(f"{data}/{split}: {len(texts)} texts but {len(ids)} labels")
    return texts, np.asarray(ids)


def labelled(name: str, texts: list[str], label_ids: np.ndarray, labels: list[str]) -> LabelledSet:
    y = np.eye(len(labels), dtype=np.float32)[label_ids]
    return LabelledSet(name=name, labels=labels, multi_label=False, texts=list(texts), y=y)


def one_hot(predicted: np.ndarray, n: int) -> np.ndarray:
    return np.eye(n, dtype=np.float32)[predicted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--train-from-test", type=int, default=4000)
    parser.add_argument("--dev", type=int, default=500)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="model folder (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "train_tweeteval.json")
    parser.add_argument(
        "--device",
        choices=["cpu", "gpu"],
        default="cpu",
        help="cpu (the default, as recorded in docs/benchmarks.md) or gpu: Accelerate's device, CUDA when present",
    )
    parser.add_argument(
        "--mixed-precision",
        choices=["no", "fp16", "bf16"],
        default="no",
        help="Accelerate's mixed precision for the training steps (bf16 on a GPU that has it)",
    )
    args = parser.parse_args()
    if args.device == "gpu" and not torch.cuda.is_available():
        raise SystemExit("--device gpu: torch sees no CUDA GPU on this machine")

    if not (args.data / "val_text.txt").is_file():
        raise SystemExit(
            f"{args.data} is missing: this benchmark reads TweetEval sentiment from ../shared/data "
            "(see ../shared/data/README.md); it is not part of the repository"
        )
    labels = [line.split("\t")[1] for line in (args.data / "mapping.txt").read_text().splitlines() if line.strip()]
    val_texts, val_ids = read_split(args.data, "val", labels)
    test_texts, test_ids = read_split(args.data, "test", labels)
    order = np.random.default_rng(args.seed).permutation(len(test_texts))
    cut_train, cut_dev = args.train_from_test, args.train_from_test + args.dev
    take = lambda rows: ([test_texts[i] for i in rows], test_ids[rows])  # noqa: E731
    train_texts = val_texts + take(order[:cut_train])[0]
    train_ids = np.concatenate([val_ids, take(order[:cut_train])[1]])
    dev_texts, dev_ids = take(order[cut_train:cut_dev])
    eval_texts, eval_ids = take(order[cut_dev:])
    train = labelled("tweeteval val + test part", train_texts, train_ids, labels)
    dev = labelled("tweeteval dev (from test)", dev_texts, dev_ids, labels)
    test = labelled("tweeteval test (rest)", eval_texts, eval_ids, labels)
    print(f"train {len(train)}, dev {len(dev)}, test {len(test)}; labels {labels}")

    systems: dict[str, SystemResult] = {}

    # Baselines, on exactly the same rows.
    majority = DummyClassifier(strategy="most_frequent").fit(train_texts, train_ids)
    systems["majority class"] = SystemResult(
        metrics=compute_metrics(test, one_hot(majority.predict(eval_texts), len(labels))), train_seconds=0.0
    )
    started = time.perf_counter()
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    features = vectorizer.fit_transform(train_texts)
    logistic = LogisticRegression(max_iter=2000, C=2.0, class_weight="balanced").fit(features, train_ids)
    tfidf_seconds = time.perf_counter() - started
    predicted = logistic.predict(vectorizer.transform(eval_texts))
    systems["TF-IDF (1-2 grams) + logistic regression"] = SystemResult(
        metrics=compute_metrics(test, one_hot(predicted, len(labels))), train_seconds=round(tfidf_seconds, 2)
    )

    # MiniLM, from the packaged base checkpoint, on this CPU (or, with --device gpu, the GPU).
    config = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        max_length=args.max_length,
        seed=args.seed,
        cpu=args.device == "cpu",
        mixed_precision=args.mixed_precision,
        early_stopping_patience=1,
    )
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch) / "model"
        result = train_model(
            [train],
            dev,
            labels=labels,
            family="single_label",
            input_format="text",
            config=config,
            out_dir=out,
            model_id="tweeteval-minilm",
            task_name="tweeteval-sentiment",
        )
        started = time.perf_counter()
        probabilities = predict_probabilities(out, eval_texts, batch_size=64)
        predict_seconds = time.perf_counter() - started
    systems["MiniLM-L6 fine-tuned (dynaloop round train)"] = SystemResult(
        metrics=compute_metrics(test, probabilities),
        train_seconds=round(result.wall_seconds, 2),
        details={
            "training": result.metrics(),
            "predict_seq_per_s": round(len(eval_texts) / predict_seconds, 1),
        },
    )

    model = systems["MiniLM-L6 fine-tuned (dynaloop round train)"].metrics.macro_f1
    ratios = {
        f"model_macro_f1_over_{key}": round(model / value.metrics.macro_f1, 3)
        for key, value in (
            ("majority", systems["majority class"]),
            ("tfidf_logreg", systems["TF-IDF (1-2 grams) + logistic regression"]),
        )
    }
    print()
    print("| system | " + " | ".join(f"F1 {label}" for label in labels) + " | macro-F1 | train s |")
    print("| --- |" + " ---: |" * (len(labels) + 2))
    for name, system in systems.items():
        metrics = system.metrics
        cells = " | ".join(f"{100 * metrics.f1[label]:.1f}" for label in labels)
        print(f"| {name} | {cells} | {100 * metrics.macro_f1:.1f} | {system.train_seconds} |")
    print(
        f"\ntraining: {result.examples_per_second:.1f} examples/s, {result.wall_seconds:.0f} s wall, "
        f"{result.epochs_run} epochs (best {result.best_epoch}); ratios {ratios}"
    )

    report = {
        "benchmark": "retraining on tweeteval-sentiment",
        "command": "python bench/train_tweeteval.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpu_cores": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "processor": platform.processor() or platform.machine(),
            "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if args.device == "gpu" else None,
            "mixed_precision": args.mixed_precision,
        },
        "data": {
            "train": len(train),
            "dev": len(dev),
            "test": len(test),
            "labels": labels,
            "train_sha256": train.sha256(),
            "test_sha256": test.sha256(),
        },
        "config": config.recorded(),
        "systems": {name: system.to_dict() for name, system in systems.items()},
        "ratios": ratios,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
