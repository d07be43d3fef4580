"""The precision check: does bf16 or int8 change what the model predicts, on real text?

``dynaloop model check-precision --model DIR --data FILE`` and ``dynaloop round train`` (on its
dev set) run :func:`check_precisions`: the texts are scored at fp32 (the reference) and at each
other precision the machine can run, with the same tokenization and batching as the model
server (model_server.directory.runtime); each precision gets its agreement with fp32's predictions,
the largest probability difference and, where the texts have gold labels, its macro-F1 next to
fp32's. The result is written to the model directory (``dynaloop_precision.json``), where the
model server's ``--precision auto`` reads it: a precision that changed more than 1% of the
predictions is never chosen (docs/models.md, "Precision").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.metrics import f1_score

from model_server.directory import ModelMetadata, multi_label_choice
from model_server.directory.runtime import (
    MAX_CHANGED_SHARE,
    PRECISIONS,
    PrecisionCheck,
    PrecisionResult,
    PrecisionUnavailable,
    plan_precision,
)
from rounds.models.datasets import DataError, LabelledSet, read_table
from rounds.models.errors import EvaluationError
from rounds.models.inference import LoadedClassifier, predict_loaded

# A check reads at most this many texts of a file (a seeded sample of larger files): enough to
# see a 1% change (20 texts of 2,000), and minutes, not hours, on a CPU.
DEFAULT_MAX_TEXTS = 2000
MAX_TEXT_CHARS = 20_000


@dataclass(frozen=True)
class CheckTexts:
    """The texts a check scores, with their targets (sentence-pair models) and gold labels (or None)."""

    name: str
    texts: list[str]
    targets: list[str] | None = None
    gold: list[list[str]] | None = None  # each text's gold label set (one label for single-label tasks)

    def __post_init__(self) -> None:
        if not self.texts:
            raise EvaluationError(f"{self.name} has no texts to check")
        for what, values in (("targets", self.targets), ("gold labels", self.gold)):
            if values is not None and len(values) != len(self.texts):
                raise EvaluationError(f"{self.name}: {len(values)} {what} for {len(self.texts)} texts")

    @classmethod
    def of_labelled(cls, labelled: LabelledSet, *, max_texts: int = DEFAULT_MAX_TEXTS, seed: int = 0) -> CheckTexts:
        """A labelled set (the training dev set) as check texts, gold labels included; sets larger
        than ``max_texts`` are sampled (seeded)."""
        rows: Sequence[int] = range(len(labelled))
        if len(labelled) > max_texts:
            rows = sorted(int(i) for i in np.random.default_rng(seed).choice(len(labelled), max_texts, replace=False))
        hard = labelled.hard()
        if labelled.multi_label:
            gold = [[label for label, on in zip(labelled.labels, hard[i], strict=True) if on] for i in rows]
        else:
            gold = [[labelled.labels[int(hard[i])]] for i in rows]
        return cls(
            name=labelled.name,
            texts=[labelled.texts[i] for i in rows],
            targets=None if labelled.targets is None else [labelled.targets[i] for i in rows],
            gold=gold,
        )


def read_check_texts(
    path: Path,
    *,
    text_column: str = "text",
    label_column: str | None = "label",
    target_column: str | None = None,
    max_texts: int = DEFAULT_MAX_TEXTS,
    seed: int = 0,
) -> CheckTexts:
    """A data file as :class:`CheckTexts`: a ``.txt`` file has one text per line; a CSV, TSV,
    JSONL or Parquet file has ``text_column`` and, optionally, ``label_column`` (gold; a
    multi-label row separates labels with ``|``) and ``target_column``. Files with more than
    ``max_texts`` texts are sampled (seeded)."""
    if max_texts < 1:
        raise EvaluationError(f"--max-texts must be at least 1, not {max_texts}")
    if path.suffix.lower() == ".txt":
        if not path.is_file():
            raise DataError(f"{path.name} does not exist")
        texts = [line.strip() for line in path.read_text(encoding="utf-8", errors="strict").splitlines()]
        rows = {"text": [text for text in texts if text]}
        text_column, label_column, target_column = "text", None, None
    else:
        frame = read_table(path)
        missing = [c for c in (text_column, target_column) if c is not None and c not in frame.columns]
        if missing:
            raise DataError(f"{path.name} has no column {missing[0]!r}; its columns are {list(frame.columns)[:20]}")
        if label_column is not None and label_column not in frame.columns:
            label_column = None  # no gold: agreement only
        frame = frame[frame[text_column].astype(str).str.strip() != ""]
        rows = {
            column: frame[column].astype(str).tolist()
            for column in (text_column, label_column, target_column)
            if column
        }
    texts = rows[text_column]
    too_long = [i for i, text in enumerate(texts) if len(text) > MAX_TEXT_CHARS]
    if too_long:
        raise DataError(f"{path.name}: text {too_long[0] + 1} is longer than {MAX_TEXT_CHARS} characters")
    chosen = np.arange(len(texts))
    if len(texts) > max_texts:
        chosen = np.sort(np.random.default_rng(seed).choice(len(texts), size=max_texts, replace=False))
    pick = [int(i) for i in chosen]
    return CheckTexts(
        name=path.name + (f" ({len(pick)} of {len(texts)} texts, seed {seed})" if len(pick) < len(texts) else ""),
        texts=[texts[i] for i in pick],
        targets=[rows[target_column][i] for i in pick] if target_column else None,
        gold=[rows[label_column][i].split("|") for i in pick] if label_column else None,
    )


def predicted_sets(metadata: ModelMetadata, probabilities: np.ndarray) -> list[tuple[int, ...]]:
    """Each row's predicted label positions, as the model server decides them."""
    if metadata.family == "multi_label":
        exclusive = [metadata.labels.index(label) for label in metadata.exclusive_labels]
        return [
            tuple(multi_label_choice(list(row), threshold=metadata.threshold, exclusive=exclusive))
            for row in probabilities
        ]
    return [(int(np.argmax(row)),) for row in probabilities]


def macro_f1(metadata: ModelMetadata, predicted: Sequence[tuple[int, ...]], gold: Sequence[Sequence[str]]) -> float:
    """Macro-F1 (0-1) over the model's labels: of the label (single-label) or per label of the set."""
    unknown = sorted({label for labels in gold for label in labels} - set(metadata.labels))
    if unknown:
        raise EvaluationError(f"gold labels {unknown[:5]} are not among the model's labels {metadata.labels}")
    if metadata.family == "multi_label":
        truth = np.zeros((len(gold), len(metadata.labels)), dtype=int)
        guess = np.zeros_like(truth)
        for row, (labels, chosen) in enumerate(zip(gold, predicted, strict=True)):
            truth[row, [metadata.labels.index(label) for label in labels]] = 1
            guess[row, list(chosen)] = 1
        return float(f1_score(truth, guess, average="macro", zero_division=0))
    return float(
        f1_score(
            [metadata.labels.index(labels[0]) for labels in gold],
            [chosen[0] for chosen in predicted],
            labels=list(range(len(metadata.labels))),
            average="macro",
            zero_division=0,
        )
    )


def check_precisions(
    model_dir: Path | str,
    data: CheckTexts,
    *,
    batch_size: int = 64,
    device: str | None = None,
    classifier: LoadedClassifier | None = None,
) -> PrecisionCheck:
    """Score ``data`` at fp32 and at every other precision this machine can run (see the module
    docstring). ``classifier``: the model already loaded at fp32 (saves a load)."""
    classifier = classifier or LoadedClassifier.load(model_dir, device=device, batch_size=batch_size)
    metadata = classifier.metadata

    def run(precision: str) -> tuple[np.ndarray, float]:
        plan = plan_precision(classifier.model, classifier.tokenizer, precision, directory=Path(model_dir))
        started = time.perf_counter()
        probabilities = predict_loaded(
            classifier.model,
            classifier.tokenizer,
            metadata,
            data.texts,
            data.targets,
            batch_size=batch_size,
            precision=plan,
        )
        return probabilities, len(data.texts) / (time.perf_counter() - started)

    reference, reference_rate = run("fp32")
    reference_sets = predicted_sets(metadata, reference)
    reference_f1 = macro_f1(metadata, reference_sets, data.gold) if data.gold is not None else None
    results = {
        "fp32": PrecisionResult(
            agreement=1.0,
            changed=0,
            max_probability_difference=0.0,
            macro_f1=reference_f1,
            macro_f1_vs_fp32_points=0.0 if reference_f1 is not None else None,
            sentences_per_second=reference_rate,
            accepted=True,
        )
    }
    unavailable: dict[str, str] = {}
    for precision in PRECISIONS:
        if precision == "fp32":
            continue
        try:
            probabilities, rate = run(precision)
        except PrecisionUnavailable as exc:
            unavailable[precision] = str(exc)
            continue
        predicted = predicted_sets(metadata, probabilities)
        changed = sum(a != b for a, b in zip(predicted, reference_sets, strict=True))
        f1 = macro_f1(metadata, predicted, data.gold) if data.gold is not None else None
        results[precision] = PrecisionResult(
            agreement=1 - changed / len(data.texts),
            changed=changed,
            max_probability_difference=float(np.max(np.abs(probabilities - reference))),
            macro_f1=f1,
            macro_f1_vs_fp32_points=None if f1 is None or reference_f1 is None else 100 * (f1 - reference_f1),
            sentences_per_second=rate,
            accepted=changed <= MAX_CHANGED_SHARE * len(data.texts),
        )
    return PrecisionCheck(data=data.name, texts=len(data.texts), results=results, unavailable=unavailable)
