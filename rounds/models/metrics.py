"""Metrics of a classifier on one labelled set, with scikit-learn.

:func:`compute_metrics` scores one :class:`~rounds.models.datasets.LabelledSet`: per-class F1,
macro-F1, accuracy and the confusion matrix for single-label tasks (plus the positive class's
F1 for binary ones: iSarcasm's headline metric); micro-, macro- and per-label F1 at the model's
threshold for multi-label ones (EthioEmo). :func:`metrics_by_variety` does the same per variety
(BESSTIE); :func:`macro_f1` is the one figure the trainer's early stopping watches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from sklearn.metrics import (
    accuracy_score,
    classification_report,
    confusion_matrix,
    f1_score,
    jaccard_score,
    multilabel_confusion_matrix,
)

from model_server.directory import multi_label_choice
from rounds.models.datasets import LabelledSet
from rounds.models.errors import EvaluationError

# Label names taken as the positive class of a binary task when none is given (case ignored).
POSITIVE_CLASS_NAMES = ("positive", "sarcastic", "sarcasm", "yes", "true", "1")


def default_positive_label(labels: Sequence[str]) -> str:
    """The positive class of a binary task whose YAML names none (``positive_label``): the label
    named like one (``positive``, ``sarcastic``, ...; see :data:`POSITIVE_CLASS_NAMES`), else the
    label whose negation the other is (``irony`` beside ``non_irony`` / ``not_irony``), else
    ``labels[1]`` (scikit-learn's ``pos_label=1`` for labels ordered [negative, positive]).

    >>> default_positive_label(["sarcastic", "not_sarcastic"])
    'sarcastic'
    >>> default_positive_label(["irony", "non_irony"]), default_positive_label(["non_irony", "irony"])
    ('irony', 'irony')
    >>> default_positive_label(["ham", "spam"])
    'spam'
    """
    for name in POSITIVE_CLASS_NAMES:
        for label in labels:
            if label.lower() == name:
                return label
    if len(labels) == 2:
        for label, other in (labels, labels[::-1]):
            lowered = other.lower()
            if any(lowered in (f"{p}{label.lower()}", f"{p}_{label.lower()}") for p in ("non", "not", "no")):
                return label
    return labels[1]


@dataclass
class SetMetrics:
    """How a model does on one labelled set. F1 figures are fractions (0-1)."""

    name: str
    rows: int
    labels: list[str]
    multi_label: bool
    f1: dict[str, float]  # per class (single-label) or per label (multi-label)
    precision: dict[str, float]
    recall: dict[str, float]
    support: dict[str, int]  # gold examples of each class / carrying each label
    macro_f1: float
    accuracy: float  # multi-label: exact-match ratio (every label right)
    confusion: list[
        list[int]
    ]  # single-label: gold rows x predicted columns; multi-label: per label [[tn, fp], [fn, tp]]
    micro_f1: float | None = None  # multi-label only
    jaccard: float | None = None  # multi-label only: mean per-example Jaccard (EthioEmo)
    positive_label: str | None = None  # binary tasks
    positive_f1: float | None = None
    round: int | None = None  # the round a dev/test split belongs to
    split: str | None = None
    human_f1: float | None = None  # the round's human macro-F1 estimate for this split
    solved: bool | None = None  # macro_f1 >= human_f1; None where there is no estimate
    by_variety: dict[str, SetMetrics] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["by_variety"] = {variety: metrics.to_dict() for variety, metrics in self.by_variety.items()}
        return json_safe(data)


def json_safe(value: Any) -> Any:
    """NaN and infinities become None; numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def predicted_labels(
    probabilities: np.ndarray, *, multi_label: bool, threshold: float = 0.5, exclusive: Sequence[int] = ()
) -> np.ndarray:
    """Argmax indices (single-label) or a 0/1 matrix of probabilities ``>= threshold`` (multi-label),
    the columns ``exclusive`` (e.g. neutral) never predicted with others
    (model_server.directory.multi_label_choice, the model server's rule; nothing passing predicts
    the exclusive label, else the empty set)."""
    if multi_label:
        predicted = (probabilities >= threshold).astype(int)
        if exclusive:
            for row, scores in enumerate(probabilities):
                chosen = multi_label_choice(
                    scores.tolist(), threshold=threshold, exclusive=exclusive, at_least_one=False
                )
                predicted[row] = 0
                predicted[row, chosen] = 1
        return predicted
    return probabilities.argmax(axis=1)


def compute_metrics(
    labelled: LabelledSet,
    probabilities: np.ndarray,
    *,
    threshold: float = 0.5,
    positive_label: str | None = None,
    exclusive_labels: Sequence[str] = (),
) -> SetMetrics:
    """Score ``probabilities`` (rows of ``labelled``, columns in ``labelled.labels`` order) against
    the set's gold labels (:meth:`LabelledSet.hard`) with scikit-learn.

    Single-label: per-class precision/recall/F1 (``classification_report`` over every label,
    so a class absent from gold and predictions scores 0 and still counts in the macro
    average), macro-F1, accuracy, confusion matrix. Binary tasks also get ``positive_f1``, the
    F1 of ``positive_label`` (default: :func:`default_positive_label`). Multi-label: a label is
    predicted when its probability is ``>= threshold``; per-label and macro-F1, micro-F1,
    exact-match accuracy, mean Jaccard (an example with no gold and no predicted label scores 1).

    >>> import numpy as np
    >>> gold = LabelledSet("toy", ["neg", "pos"], False, ["a", "b", "c"], np.eye(2)[[0, 1, 1]])
    >>> metrics = compute_metrics(gold, np.array([[.9, .1], [.2, .8], [.6, .4]]))
    >>> round(metrics.macro_f1, 3), metrics.positive_label, round(metrics.positive_f1, 3)
    (0.667, 'pos', 0.667)
    """
    labels = list(labelled.labels)
    if probabilities.shape != (len(labelled), len(labels)):
        raise EvaluationError(
            f"{labelled.name}: probabilities have shape {probabilities.shape}, expected {(len(labelled), len(labels))}"
        )
    if len(labelled) == 0:
        raise EvaluationError(f"{labelled.name} has no rows to evaluate")
    gold = labelled.hard()
    exclusive = [labels.index(label) for label in exclusive_labels if label in labels]
    predicted = predicted_labels(
        probabilities, multi_label=labelled.multi_label, threshold=threshold, exclusive=exclusive
    )
    indices = list(range(len(labels)))
    report = classification_report(
        gold,
        predicted,
        labels=None if labelled.multi_label else indices,
        target_names=labels,
        output_dict=True,
        zero_division=0,
    )
    per_class = {label: report[label] for label in labels}
    metrics = SetMetrics(
        name=labelled.name,
        rows=len(labelled),
        labels=labels,
        multi_label=labelled.multi_label,
        f1={label: float(row["f1-score"]) for label, row in per_class.items()},
        precision={label: float(row["precision"]) for label, row in per_class.items()},
        recall={label: float(row["recall"]) for label, row in per_class.items()},
        support={label: int(row["support"]) for label, row in per_class.items()},
        macro_f1=float(report["macro avg"]["f1-score"]),
        accuracy=float(accuracy_score(gold, predicted)),
        confusion=(
            multilabel_confusion_matrix(gold, predicted).tolist()
            if labelled.multi_label
            else confusion_matrix(gold, predicted, labels=indices).tolist()
        ),
        round=labelled.origin.get("round"),
        split=labelled.origin.get("split"),
    )
    if labelled.multi_label:
        metrics.micro_f1 = float(f1_score(gold, predicted, average="micro", zero_division=0))
        metrics.jaccard = float(jaccard_score(gold, predicted, average="samples", zero_division=1.0))
    elif len(labels) == 2 or positive_label is not None:
        positive = positive_label or default_positive_label(labels)
        if positive not in labels:
            raise EvaluationError(f"positive label {positive!r} is not one of the labels {labels}")
        metrics.positive_label = positive
        metrics.positive_f1 = float(
            f1_score(gold, predicted, labels=[labels.index(positive)], average="macro", zero_division=0)
        )
    return metrics


UNSPECIFIED_VARIETY = "unspecified"


def metrics_by_variety(
    labelled: LabelledSet,
    probabilities: np.ndarray,
    *,
    threshold: float = 0.5,
    positive_label: str | None = None,
    exclusive_labels: Sequence[str] = (),
) -> dict[str, SetMetrics]:
    """:func:`compute_metrics` on each variety's rows (BESSTIE reports macro-F1 per variety);
    rows without a variety form ``unspecified``. Empty when the set records no varieties."""
    if labelled.varieties is None:
        return {}
    groups: dict[str, list[int]] = {}
    for row, variety in enumerate(labelled.varieties):
        groups.setdefault(variety or UNSPECIFIED_VARIETY, []).append(row)
    return {
        variety: compute_metrics(
            labelled.subset(rows, name=f"{labelled.name} [{variety}]"),
            probabilities[rows],
            threshold=threshold,
            positive_label=positive_label,
            exclusive_labels=exclusive_labels,
        )
        for variety, rows in sorted(groups.items())
    }


def macro_f1(
    y: np.ndarray,
    scores: np.ndarray,
    *,
    family: Literal["single_label", "multi_label"],
    threshold: float = 0.5,
    exclusive: Sequence[int] = (),
) -> float:
    """Macro-F1 of ``scores`` (probabilities, or logits for single-label models) against soft or
    hard ``y``: over every class of the argmax (single-label) or over labels at ``threshold``
    (multi-label; gold labels at 0.5). The trainer's early stopping watches it."""
    multi_label = family == "multi_label"
    gold = (y >= 0.5).astype(int) if multi_label else y.argmax(axis=1)
    predicted = predicted_labels(scores, multi_label=multi_label, threshold=threshold, exclusive=exclusive)
    return float(
        f1_score(
            gold, predicted, labels=None if multi_label else list(range(y.shape[1])), average="macro", zero_division=0
        )
    )


def per_class_f1(
    y: np.ndarray,
    scores: np.ndarray,
    labels: Sequence[str],
    *,
    family: Literal["single_label", "multi_label"],
    threshold: float = 0.5,
    exclusive: Sequence[int] = (),
) -> dict[str, float]:
    """Each class's (single-label) or label's (multi-label) F1, as :func:`macro_f1` decides gold
    and predictions: a class the model never predicts shows as 0 (``round train`` prints it).

    >>> per_class_f1(np.eye(2)[[0, 1, 1]], np.array([[.9, .1], [.8, .2], [.3, .7]]), ["neg", "pos"],
    ...              family="single_label")
    {'neg': 0.6667, 'pos': 0.6667}
    """
    multi_label = family == "multi_label"
    gold = (y >= 0.5).astype(int) if multi_label else y.argmax(axis=1)
    predicted = predicted_labels(scores, multi_label=multi_label, threshold=threshold, exclusive=exclusive)
    values = f1_score(
        gold, predicted, labels=None if multi_label else list(range(y.shape[1])), average=None, zero_division=0
    )
    return {label: round(float(value), 4) for label, value in zip(labels, values, strict=True)}
