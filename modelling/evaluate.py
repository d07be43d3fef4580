"""Evaluate a classifier on every round's dev/test and external sets (DynaSent Table 5b).

Prediction
    :func:`predict_probabilities` loads a model directory and returns one row of probabilities
    per input, in the order of the labels in its ``dynaloop_model.json``; :func:`predict_loaded`
    does the same with a model already in memory (the training loop's dev evaluation).
Metrics
    :func:`compute_metrics` scores one :class:`~modelling.datasets.LabelledSet` with scikit-learn:
    per-class F1, macro-F1, accuracy and the confusion matrix for single-label tasks (plus the
    positive class's F1 for binary ones: iSarcasm's headline metric); micro-, macro- and
    per-label F1 at the model's threshold for multi-label ones (EthioEmo).
Evaluation
    :func:`evaluate_model` scores a model on many sets: one row per set as in DynaSent Table 5b,
    a breakdown per variety where the set records varieties (BESSTIE), and a ``solved`` flag
    where the set is a round's dev/test split with a human F1 estimate (DynaSent §3.5, Table 6:
    the round is solved once the model's macro-F1 reaches the humans').
    :func:`cross_variety_matrix` is BESSTIE Fig. 5: macro-F1 of models trained on one variety,
    tested on each. :func:`write_evaluation` writes evaluation.md, evaluation.json and the plots.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure
from sklearn.metrics import (
    ConfusionMatrixDisplay,
    accuracy_score,
    classification_report,
    confusion_matrix,
    f1_score,
    jaccard_score,
    multilabel_confusion_matrix,
)
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from model_directory import ModelMetadata, ModelMetadataError
from modelling.datasets import DataError, LabelledSet, SourceSpec, load_source, model_labels
from services.db.models import BuiltExample, Round, RoundBuild, Task
from services.domain.tasks import definition_of

logger = logging.getLogger(__name__)


class EvaluationError(ValueError):
    """Something that stops an evaluation; the message says what to fix."""


# ---------------------------------------------------------------------------- prediction


@dataclass
class LoadedClassifier:
    """A model directory in memory: the network, its tokenizer and its ``dynaloop_model.json``."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    metadata: ModelMetadata

    @classmethod
    def load(cls, model_dir: Path | str, *, device: str | None = None) -> LoadedClassifier:
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise EvaluationError(f"model directory {model_dir} does not exist")
        metadata = ModelMetadata.load(model_dir)
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ModelMetadataError(f"cannot load a sequence classifier from {model_dir}: {exc}") from exc
        if model.config.num_labels != len(metadata.labels):
            raise ModelMetadataError(
                f"{model_dir}: the classifier head has {model.config.num_labels} outputs but "
                f"dynaloop_model.json lists {len(metadata.labels)} labels; they must match")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model.to(device).eval()
        return cls(model=model, tokenizer=tokenizer, metadata=metadata)


def _pad(tokenizer: PreTrainedTokenizerBase, features: dict[str, list[list[int]]], rows: Sequence[int],
         device: torch.device) -> dict[str, torch.Tensor]:
    """The ``rows`` of unpadded token features as tensors padded to their own longest row."""
    length = max(len(features["input_ids"][i]) for i in rows)
    pad_values = {"input_ids": tokenizer.pad_token_id or 0,
                  "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0)}
    left = getattr(tokenizer, "padding_side", "right") == "left"
    tensors = {}
    for key, values in features.items():
        pad = pad_values.get(key, 0)  # attention_mask (and anything else): 0
        padded = [[pad] * (length - len(values[i])) + values[i] if left
                  else values[i] + [pad] * (length - len(values[i])) for i in rows]
        tensors[key] = torch.tensor(padded, dtype=torch.long, device=device)
    return tensors


def predict_loaded(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, metadata: ModelMetadata,
                   texts: Sequence[str], targets: Sequence[str] | None = None, *, batch_size: int = 64,
                   progress: bool = False) -> np.ndarray:
    """Probabilities ``(len(texts), len(metadata.labels))`` from a model already in memory.

    Softmax for ``single_label`` models, sigmoid for ``multi_label`` ones. ``targets`` are the
    second segments of sentence-pair (``text_pair``) models; they are never truncated, only the
    sentence is cut to ``metadata.max_length``. Inputs are tokenized once, sorted by token count and run
    in batches of similar length (little padding); rows come back in the input order. The model
    runs on its own device and is left in the train/eval mode it was in.
    """
    if targets is not None and len(targets) != len(texts):
        raise EvaluationError(f"{len(targets)} targets for {len(texts)} texts; give one target per text")
    if metadata.input_format == "text_pair" and targets is None:
        raise EvaluationError("this model takes (text, target) pairs (input_format text_pair); give the targets")
    if metadata.input_format == "text" and targets is not None:
        raise EvaluationError("this model takes single texts (input_format text); do not give targets")
    if batch_size < 1:
        raise EvaluationError(f"batch_size must be at least 1, not {batch_size}")
    n_labels = len(metadata.labels)
    if len(texts) == 0:
        return np.zeros((0, n_labels), dtype=np.float32)

    max_length = min(metadata.max_length, getattr(tokenizer, "model_max_length", None) or metadata.max_length)
    features = dict(tokenizer(list(texts), None if targets is None else list(targets),
                              truncation="only_first" if targets is not None else True, max_length=max_length))
    lengths = [len(ids) for ids in features["input_ids"]]
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    if progress:
        from rich.progress import track

        batches = track(batches, description="predicting", total=len(batches))

    device = next(model.parameters()).device
    probabilities = np.zeros((len(texts), n_labels), dtype=np.float32)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for rows in batches:
                logits = model(**_pad(tokenizer, features, rows, device)).logits.float()
                if metadata.family == "multi_label":
                    batch = torch.sigmoid(logits)
                else:
                    batch = torch.softmax(logits, dim=-1)
                probabilities[rows] = batch.cpu().numpy()
    finally:
        model.train(was_training)
    return probabilities


def predict_probabilities(model_dir: Path | str, texts: Sequence[str], targets: Sequence[str] | None = None, *,
                          batch_size: int = 64, device: str | None = None, progress: bool = False) -> np.ndarray:
    """Load ``model_dir`` and predict: probabilities ``(len(texts), n_labels)`` in the order of
    the labels in its ``dynaloop_model.json`` (see :func:`predict_loaded`).

    >>> predict_probabilities("models/r1", ["I loved it", "meh"]).shape  # doctest: +SKIP
    (2, 3)
    """
    classifier = LoadedClassifier.load(model_dir, device=device)
    return predict_loaded(classifier.model, classifier.tokenizer, classifier.metadata, texts, targets,
                          batch_size=batch_size, progress=progress)


# ---------------------------------------------------------------------------- metrics

# Label names taken as the positive class of a binary task when none is given (case ignored).
POSITIVE_CLASS_NAMES = ("positive", "sarcastic", "sarcasm", "yes", "true", "1")


def default_positive_label(labels: Sequence[str]) -> str:
    """The positive class of a binary task: the label named like one (``positive``,
    ``sarcastic``, ...; see :data:`POSITIVE_CLASS_NAMES`), else ``labels[1]`` (scikit-learn's
    ``pos_label=1`` for labels ordered [negative, positive]).

    >>> default_positive_label(["sarcastic", "not_sarcastic"])
    'sarcastic'
    >>> default_positive_label(["ham", "spam"])
    'spam'
    """
    for name in POSITIVE_CLASS_NAMES:
        for label in labels:
            if label.lower() == name:
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
    confusion: list[list[int]]  # single-label: gold rows x predicted columns; multi-label: per label [[tn, fp], [fn, tp]]
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
        return _json_safe(data)


def _json_safe(value: Any) -> Any:
    """NaN and infinities become None; numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def predicted_labels(probabilities: np.ndarray, *, multi_label: bool, threshold: float = 0.5) -> np.ndarray:
    """Argmax indices (single-label) or a 0/1 matrix of probabilities ``>= threshold`` (multi-label)."""
    if multi_label:
        return (probabilities >= threshold).astype(int)
    return probabilities.argmax(axis=1)


def compute_metrics(labelled: LabelledSet, probabilities: np.ndarray, *, threshold: float = 0.5,
                    positive_label: str | None = None) -> SetMetrics:
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
        raise EvaluationError(f"{labelled.name}: probabilities have shape {probabilities.shape}, "
                              f"expected {(len(labelled), len(labels))}")
    if len(labelled) == 0:
        raise EvaluationError(f"{labelled.name} has no rows to evaluate")
    gold = labelled.hard()
    predicted = predicted_labels(probabilities, multi_label=labelled.multi_label, threshold=threshold)
    indices = list(range(len(labels)))
    report = classification_report(gold, predicted, labels=None if labelled.multi_label else indices,
                                   target_names=labels, output_dict=True, zero_division=0)
    per_class = {label: report[label] for label in labels}
    metrics = SetMetrics(
        name=labelled.name, rows=len(labelled), labels=labels, multi_label=labelled.multi_label,
        f1={label: float(row["f1-score"]) for label, row in per_class.items()},
        precision={label: float(row["precision"]) for label, row in per_class.items()},
        recall={label: float(row["recall"]) for label, row in per_class.items()},
        support={label: int(row["support"]) for label, row in per_class.items()},
        macro_f1=float(report["macro avg"]["f1-score"]),
        accuracy=float(accuracy_score(gold, predicted)),
        confusion=(multilabel_confusion_matrix(gold, predicted).tolist() if labelled.multi_label
                   else confusion_matrix(gold, predicted, labels=indices).tolist()),
        round=labelled.origin.get("round"), split=labelled.origin.get("split"))
    if labelled.multi_label:
        metrics.micro_f1 = float(f1_score(gold, predicted, average="micro", zero_division=0))
        metrics.jaccard = float(jaccard_score(gold, predicted, average="samples", zero_division=1.0))
    elif len(labels) == 2 or positive_label is not None:
        positive = positive_label or default_positive_label(labels)
        if positive not in labels:
            raise EvaluationError(f"positive label {positive!r} is not one of the labels {labels}")
        metrics.positive_label = positive
        metrics.positive_f1 = float(f1_score(gold, predicted, labels=[labels.index(positive)], average="macro",
                                             zero_division=0))
    return metrics


UNSPECIFIED_VARIETY = "unspecified"


def metrics_by_variety(labelled: LabelledSet, probabilities: np.ndarray, *, threshold: float = 0.5,
                       positive_label: str | None = None) -> dict[str, SetMetrics]:
    """:func:`compute_metrics` on each variety's rows (BESSTIE reports macro-F1 per variety);
    rows without a variety form ``unspecified``. Empty when the set records no varieties."""
    if labelled.varieties is None:
        return {}
    groups: dict[str, list[int]] = {}
    for row, variety in enumerate(labelled.varieties):
        groups.setdefault(variety or UNSPECIFIED_VARIETY, []).append(row)
    return {variety: compute_metrics(labelled.subset(rows, name=f"{labelled.name} [{variety}]"),
                                     probabilities[rows], threshold=threshold, positive_label=positive_label)
            for variety, rows in sorted(groups.items())}


# ---------------------------------------------------------------------------- evaluation


@dataclass
class Evaluation:
    """A model scored on several sets: one :class:`SetMetrics` per set, in the order given."""

    model_id: str
    model_version: str
    model_dir: str
    labels: list[str]
    multi_label: bool
    threshold: float
    sets: list[SetMetrics]
    positive_label: str | None = None
    evaluated_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())

    def __getitem__(self, name: str) -> SetMetrics:
        for metrics in self.sets:
            if metrics.name == name:
                return metrics
        raise KeyError(f"no evaluation set named {name!r}; the sets are {[m.name for m in self.sets]}")

    @property
    def solved(self) -> dict[str, bool]:
        """Set name -> solved, for the sets that have a human F1 estimate."""
        return {m.name: m.solved for m in self.sets if m.solved is not None}

    def table(self) -> pd.DataFrame:
        """DynaSent Table 5b with sets as rows: F1 per class, then macro-F1 (fractions), with
        micro-F1 (multi-label), the human estimate and the solved flag where they apply.
        ``table().T`` is the paper's orientation (classes as rows, sets as columns)."""
        rows = []
        for metrics in self.sets:
            row: dict[str, Any] = {"set": metrics.name, "rows": metrics.rows, **metrics.f1, "macro_f1": metrics.macro_f1}
            if self.multi_label:
                row["micro_f1"] = metrics.micro_f1
            row["human_f1"] = metrics.human_f1
            row["solved"] = metrics.solved
            rows.append(row)
        return pd.DataFrame(rows).set_index("set")

    def variety_table(self) -> pd.DataFrame:
        """One row per (set, variety): rows, F1 per class, macro-F1. Empty without varieties."""
        rows = [{"set": metrics.name, "variety": variety, "rows": part.rows, **part.f1, "macro_f1": part.macro_f1}
                for metrics in self.sets for variety, part in metrics.by_variety.items()]
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe({
            "model_id": self.model_id, "model_version": self.model_version, "model_dir": self.model_dir,
            "labels": self.labels, "multi_label": self.multi_label, "threshold": self.threshold,
            "positive_label": self.positive_label, "evaluated_at": self.evaluated_at,
            "macro_f1": {m.name: m.macro_f1 for m in self.sets}, "solved": self.solved,
            "sets": [m.to_dict() for m in self.sets],
        })


def align_columns(probabilities: np.ndarray, model_labels: Sequence[str], set_labels: Sequence[str]) -> np.ndarray:
    """Reorder a model's probability columns to a set's label order (same labels required)."""
    if sorted(model_labels) != sorted(set_labels):
        raise EvaluationError(f"the model's labels {list(model_labels)} are not the set's labels {list(set_labels)}; "
                              "evaluate a model trained for this task")
    return probabilities[:, [list(model_labels).index(label) for label in set_labels]]


def evaluate_probabilities(sets: Sequence[LabelledSet], probabilities: Sequence[np.ndarray], *,
                           human_f1: Mapping[str, float] | None = None, threshold: float = 0.5,
                           positive_label: str | None = None, model_id: str = "", model_version: str = "",
                           model_dir: str = "") -> Evaluation:
    """:func:`evaluate_model` for predictions already made (one array per set, columns in the
    set's label order)."""
    if not sets:
        raise EvaluationError("no evaluation sets: give a round's dev/test split or an external file")
    if len(sets) != len(probabilities):
        raise EvaluationError(f"{len(probabilities)} probability arrays for {len(sets)} sets")
    names = [labelled.name for labelled in sets]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise EvaluationError(f"evaluation sets need distinct names; {repeated} appear more than once")
    human_f1 = dict(human_f1 or {})
    results = []
    for labelled, probs in zip(sets, probabilities, strict=True):
        metrics = compute_metrics(labelled, probs, threshold=threshold, positive_label=positive_label)
        metrics.by_variety = metrics_by_variety(labelled, probs, threshold=threshold, positive_label=positive_label)
        estimate = human_f1.get(labelled.name)
        if estimate is not None and math.isfinite(estimate):
            metrics.human_f1 = float(estimate)
            metrics.solved = metrics.macro_f1 >= estimate
        results.append(metrics)
    first = sets[0]
    return Evaluation(model_id=model_id, model_version=model_version, model_dir=model_dir, labels=list(first.labels),
                      multi_label=first.multi_label, threshold=threshold, sets=results,
                      positive_label=next((m.positive_label for m in results if m.positive_label), None))


def _predict_set(classifier: LoadedClassifier, labelled: LabelledSet, *, batch_size: int, progress: bool) -> np.ndarray:
    metadata = classifier.metadata
    if (metadata.family == "multi_label") != labelled.multi_label:
        kind = "multi-label" if labelled.multi_label else "single-label"
        raise EvaluationError(f"{labelled.name} is {kind} but the model is {metadata.family.replace('_', '-')}")
    targets = None
    if metadata.input_format == "text_pair":
        if labelled.targets is None:
            raise EvaluationError(f"the model takes (sentence, target) pairs but {labelled.name} has no targets; "
                                  "give the file source a target_column")
        targets = labelled.targets
    probabilities = predict_loaded(classifier.model, classifier.tokenizer, metadata, labelled.texts, targets,
                                   batch_size=batch_size, progress=progress)
    return align_columns(probabilities, metadata.labels, labelled.labels)


def evaluate_model(model_dir: Path | str, sets: Sequence[LabelledSet], *, human_f1: Mapping[str, float] | None = None,
                   positive_label: str | None = None, batch_size: int = 64, device: str | None = None,
                   progress: bool = False) -> Evaluation:
    """Predict every set with the model in ``model_dir`` and score it (:func:`compute_metrics`,
    per variety too). ``human_f1`` maps set names (``round 1 dev``) to the round's human
    macro-F1 estimate; those sets get ``solved = macro_f1 >= human_f1``. Multi-label sets are
    thresholded at the model's ``threshold``."""
    classifier = LoadedClassifier.load(model_dir, device=device)
    probabilities = [_predict_set(classifier, labelled, batch_size=batch_size, progress=progress) for labelled in sets]
    metadata = classifier.metadata
    return evaluate_probabilities(sets, probabilities, human_f1=human_f1, threshold=metadata.threshold,
                                  positive_label=positive_label, model_id=metadata.model_id,
                                  model_version=metadata.version, model_dir=str(model_dir))


# ---------------------------------------------------------------------------- cross-variety (BESSTIE Fig. 5)


@dataclass
class CrossVarietyMatrix:
    """Macro-F1 of models trained on one variety (rows) tested on each variety (columns)."""

    train_varieties: list[str]
    test_varieties: list[str]
    macro_f1: np.ndarray  # (len(train_varieties), len(test_varieties))
    test_rows: dict[str, int]  # examples per test variety

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.macro_f1, index=pd.Index(self.train_varieties, name="trained on"),
                            columns=pd.Index(self.test_varieties, name="tested on"))

    def to_dict(self) -> dict[str, Any]:
        return _json_safe({"train_varieties": self.train_varieties, "test_varieties": self.test_varieties,
                           "macro_f1": self.macro_f1.tolist(), "test_rows": self.test_rows})


def _rows_by_variety(test_sets: Sequence[LabelledSet]) -> dict[str, list[tuple[int, int]]]:
    groups: dict[str, list[tuple[int, int]]] = {}
    for s, labelled in enumerate(test_sets):
        if labelled.varieties is None:
            raise EvaluationError(f"{labelled.name} records no varieties; a cross-variety matrix needs them "
                                  "(give the file source a variety_column)")
        for row, variety in enumerate(labelled.varieties):
            if variety is not None:
                groups.setdefault(variety, []).append((s, row))
    if not groups:
        raise EvaluationError("no test row has a variety")
    return groups


def cross_variety_from_predictions(predictions: Mapping[str, Sequence[np.ndarray]], test_sets: Sequence[LabelledSet],
                                   *, test_varieties: Sequence[str] | None = None,
                                   threshold: float = 0.5) -> CrossVarietyMatrix:
    """The matrix from predictions already made: ``predictions[train_variety][i]`` are one
    model's probabilities on ``test_sets[i]`` (columns in the set's label order). Test rows are
    pooled over the sets and grouped by variety; columns follow ``test_varieties`` (default:
    sorted)."""
    groups = _rows_by_variety(test_sets)
    columns = list(test_varieties) if test_varieties is not None else sorted(groups)
    missing = [v for v in columns if v not in groups]
    if missing:
        raise EvaluationError(f"no test rows for varieties {missing}; the test sets have {sorted(groups)}")
    first = test_sets[0]
    matrix = np.full((len(predictions), len(columns)), np.nan)
    for r, (train_variety, per_set) in enumerate(predictions.items()):
        if len(per_set) != len(test_sets):
            raise EvaluationError(f"{train_variety}: {len(per_set)} prediction arrays for {len(test_sets)} test sets")
        for c, variety in enumerate(columns):
            rows = groups[variety]
            pooled = LabelledSet(name=variety, labels=list(first.labels), multi_label=first.multi_label,
                                 texts=[test_sets[s].texts[i] for s, i in rows],
                                 y=np.stack([test_sets[s].y[i] for s, i in rows]))
            probabilities = np.stack([per_set[s][i] for s, i in rows])
            matrix[r, c] = compute_metrics(pooled, probabilities, threshold=threshold).macro_f1
    return CrossVarietyMatrix(train_varieties=list(predictions), test_varieties=columns, macro_f1=matrix,
                              test_rows={v: len(groups[v]) for v in columns})


def cross_variety_matrix(models: Mapping[str, Path | str], test_sets: Sequence[LabelledSet], *,
                         test_varieties: Sequence[str] | None = None, batch_size: int = 64,
                         device: str | None = None) -> CrossVarietyMatrix:
    """BESSTIE Fig. 5: ``models`` maps a training variety (``en-AU``, or ``PT`` for the model
    before fine-tuning) to a model directory; each model predicts every test set once and is
    scored (macro-F1) on each variety's rows. Rows keep the order of ``models``."""
    if not models:
        raise EvaluationError("give at least one model (training variety -> model directory)")
    _rows_by_variety(test_sets)  # fail before loading any model
    predictions: dict[str, list[np.ndarray]] = {}
    threshold = 0.5
    for train_variety, model_dir in models.items():
        classifier = LoadedClassifier.load(model_dir, device=device)
        threshold = classifier.metadata.threshold
        predictions[train_variety] = [_predict_set(classifier, labelled, batch_size=batch_size, progress=False)
                                      for labelled in test_sets]
        del classifier
    return cross_variety_from_predictions(predictions, test_sets, test_varieties=test_varieties, threshold=threshold)


# ---------------------------------------------------------------------------- plots and files


def plot_confusion(metrics: SetMetrics, path: Path | str) -> Path:
    """A PNG of the set's confusion matrix (gold rows, predicted columns); for multi-label sets
    one 2x2 matrix per label."""
    path = Path(path)
    if metrics.multi_label:
        n = len(metrics.labels)
        figure = Figure(figsize=(2.4 * n, 2.8), layout="constrained")
        axes = figure.subplots(1, n, squeeze=False)[0]
        for ax, label, matrix in zip(axes, metrics.labels, metrics.confusion, strict=True):
            ConfusionMatrixDisplay(np.array(matrix), display_labels=["no", "yes"]).plot(
                ax=ax, colorbar=False, cmap="Blues", values_format="d")
            ax.set_title(label)
    else:
        size = max(4.0, 0.9 * len(metrics.labels) + 2.5)
        figure = Figure(figsize=(size + 1, size), layout="constrained")
        ax = figure.subplots()
        ConfusionMatrixDisplay(np.array(metrics.confusion), display_labels=metrics.labels).plot(
            ax=ax, cmap="Blues", values_format="d", xticks_rotation=30)
        ax.set_xlabel("predicted")
        ax.set_ylabel("gold")
    figure.suptitle(f"{metrics.name}: macro-F1 {metrics.macro_f1:.3f} (n = {metrics.rows})")
    figure.savefig(path, dpi=100)
    return path


def plot_cross_variety(matrix: CrossVarietyMatrix, path: Path | str, *, title: str = "Cross-variety macro-F1") -> Path:
    """A heatmap PNG of the matrix, each cell annotated with its macro-F1 (BESSTIE Fig. 5)."""
    path = Path(path)
    rows, columns = matrix.macro_f1.shape
    figure = Figure(figsize=(1.3 * columns + 2.5, 1.0 * rows + 1.8), layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(matrix.macro_f1, cmap="Blues", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(columns), labels=matrix.test_varieties)
    ax.set_yticks(range(rows), labels=matrix.train_varieties)
    ax.set_xlabel("tested on")
    ax.set_ylabel("trained on")
    for r in range(rows):
        for c in range(columns):
            value = matrix.macro_f1[r, c]
            ax.text(c, r, "–" if math.isnan(value) else f"{value:.2f}", ha="center", va="center",
                    color="white" if value > 0.6 else "black")
    figure.colorbar(image, ax=ax, label="macro-F1")
    ax.set_title(title)
    figure.savefig(path, dpi=100)
    return path


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "set"


def _percent(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|",
            *["| " + " | ".join(row) + " |" for row in rows]]


def evaluation_markdown(evaluation: Evaluation, cross_variety: CrossVarietyMatrix | None = None) -> str:
    """evaluation.md: the Table 5b-style table (F1 in percent, one decimal, as in the paper),
    the per-variety breakdown and, when given, the cross-variety matrix."""
    labels = evaluation.labels
    origin = [f"model directory `{evaluation.model_dir}`"] if evaluation.model_dir else []
    origin += [f"version {evaluation.model_version}"] if evaluation.model_version else []
    about = ", ".join([*origin, f"evaluated {evaluation.evaluated_at}"])
    lines = [f"# Evaluation of {evaluation.model_id or evaluation.model_dir or 'a model'}", "",
             f"{about[0].upper()}{about[1:]}. F1 scores in percent.", ""]
    if evaluation.multi_label:
        lines += [f"Multi-label: a label is predicted when its probability is at least {evaluation.threshold}.", ""]
    if evaluation.positive_label:
        lines += [f"Positive class: `{evaluation.positive_label}`.", ""]
    header = ["Set", "n", *labels, "Macro-F1"]
    if evaluation.multi_label:
        header.append("Micro-F1")
    if evaluation.positive_label:
        header.append(f"F1 {evaluation.positive_label}")
    header += ["Human F1", "Solved"]
    rows = []
    for m in evaluation.sets:
        row = [m.name, str(m.rows), *[_percent(m.f1[label]) for label in labels], _percent(m.macro_f1)]
        if evaluation.multi_label:
            row.append(_percent(m.micro_f1))
        if evaluation.positive_label:
            row.append(_percent(m.positive_f1))
        row += [_percent(m.human_f1), "–" if m.solved is None else ("yes" if m.solved else "no")]
        rows.append(row)
    lines += ["## F1 per set (DynaSent Table 5b)", "", *_markdown_table(header, rows), ""]
    lines += ["Solved: the model's macro-F1 reaches the round's human F1 estimate (DynaSent §3.5).", ""]

    # The paper's own orientation: classes as rows, sets as columns.
    paper_rows = [[label, *[_percent(m.f1[label]) for m in evaluation.sets]] for label in labels]
    paper_rows.append(["Macro avg", *[_percent(m.macro_f1) for m in evaluation.sets]])
    lines += ["### As laid out in the paper", "",
              *_markdown_table(["", *[m.name for m in evaluation.sets]], paper_rows), ""]

    variety_rows = [[m.name, variety, str(part.rows), *[_percent(part.f1[label]) for label in labels],
                     _percent(part.macro_f1)]
                    for m in evaluation.sets for variety, part in m.by_variety.items()]
    if variety_rows:
        lines += ["## Per variety", "",
                  *_markdown_table(["Set", "Variety", "n", *labels, "Macro-F1"], variety_rows), ""]
    if cross_variety is not None:
        matrix_rows = [[train, *[_percent(v) for v in cross_variety.macro_f1[r]]]
                       for r, train in enumerate(cross_variety.train_varieties)]
        lines += ["## Cross-variety macro-F1 (BESSTIE Fig. 5)", "",
                  "Rows: the variety a model was trained on; columns: the variety it is tested on.", "",
                  *_markdown_table(["trained on \\ tested on", *cross_variety.test_varieties], matrix_rows),
                  "", "![cross-variety](cross-variety.png)", ""]
    return "\n".join(lines)


def write_evaluation(evaluation: Evaluation, out_dir: Path | str, *,
                     cross_variety: CrossVarietyMatrix | None = None) -> list[Path]:
    """Write evaluation.md, evaluation.json, one confusion-matrix PNG per set and, when given,
    cross-variety.png into ``out_dir``; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    images: dict[str, str] = {}
    for metrics in evaluation.sets:
        stem = f"confusion-{_slug(metrics.name)}"
        name, copy = f"{stem}.png", 2
        while name in images.values():
            name, copy = f"{stem}-{copy}.png", copy + 1
        images[metrics.name] = name
        written.append(plot_confusion(metrics, out_dir / name))
    if cross_variety is not None:
        written.append(plot_cross_variety(cross_variety, out_dir / "cross-variety.png"))
    markdown = evaluation_markdown(evaluation, cross_variety)
    markdown += "\n## Confusion matrices\n\n" + "\n".join(f"![{name}]({image})" for name, image in images.items()) + "\n"
    (out_dir / "evaluation.md").write_text(markdown, encoding="utf-8")
    data = {**evaluation.to_dict(), "confusion_images": images}
    if cross_variety is not None:
        data["cross_variety"] = cross_variety.to_dict()
    (out_dir / "evaluation.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return [out_dir / "evaluation.md", out_dir / "evaluation.json", *written]


# ---------------------------------------------------------------------------- round sets


def human_f1_estimate(report: Mapping[str, Any], split: str) -> float | None:
    """The human macro-F1 of a built round's split, as the round report stores it
    (``report["human_f1"][split]["macro avg"]["f1"]``; absent for multi-label tasks)."""
    value = ((report.get("human_f1") or {}).get(split) or {}).get("macro avg", {}).get("f1")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def built_round_numbers(session: Session, task: Task) -> list[int]:
    """The task's rounds that have at least one build, in order."""
    return list(session.scalars(
        select(Round.number).where(Round.task_id == task.id, Round.id.in_(select(RoundBuild.round_id)))
        .order_by(Round.number)))


@dataclass
class EvaluationSets:
    """The sets to evaluate on, with the human F1 estimates of the round splits among them."""

    sets: list[LabelledSet]
    human_f1: dict[str, float]
    skipped: list[str]  # round splits with no labelled examples


def _newest_build(session: Session, task: Task, number: int) -> RoundBuild:
    round_ = session.scalar(select(Round).where(Round.task_id == task.id, Round.number == number))
    if round_ is None:
        raise EvaluationError(f"task {task.name!r} has no round {number}")
    build = session.scalar(select(RoundBuild).where(RoundBuild.round_id == round_.id)
                           .order_by(RoundBuild.id.desc()).limit(1))
    if build is None:
        raise EvaluationError(f"round {number} of {task.name!r} has not been built; run "
                              f"`dynaloop round build --task {task.name} --round {number}` first")
    return build


def load_evaluation_sets(session: Session, task: Task, *, rounds: Sequence[int] | None = None,
                         extra: Sequence[SourceSpec] = ()) -> EvaluationSets:
    """Each round's dev and test split from its newest build (``rounds``: default every built
    round; ``[]`` for none), then the ``extra`` sources (a data mix's dev and evaluate
    entries: external files or other round splits), each once. Round splits carry the human
    F1 estimate of their build's report. A round that does not exist or was never built is an
    error; a round split without labelled examples is skipped and named in ``skipped``."""
    definition = definition_of(task)
    labels, multi = model_labels(definition), definition.is_multi_label
    numbers = built_round_numbers(session, task) if rounds is None else list(rounds)
    specs = [SourceSpec(round=number, split=split, build_id=_newest_build(session, task, number).id)
             for number in numbers for split in ("dev", "test")]
    result = EvaluationSets(sets=[], human_f1={}, skipped=[])
    seen: set[tuple[Any, ...]] = set()
    for spec in [*specs, *extra]:
        if spec.round is not None and spec.build_id is None:
            spec = spec.model_copy(update={"build_id": _newest_build(session, task, spec.round).id})
        key = ("round", spec.build_id, spec.split) if spec.round is not None else ("file", spec.describe())
        if key in seen:
            continue
        seen.add(key)
        if spec.round is not None and not session.scalar(select(func.count()).select_from(BuiltExample).where(
                BuiltExample.build_id == spec.build_id, BuiltExample.split == spec.split)):
            logger.info("%s of %s has no examples in build %s; skipped", spec.describe(), task.name, spec.build_id)
            result.skipped.append(spec.describe())
            continue
        try:
            labelled = load_source(spec, labels=labels, multi_label=multi, session=session, task=task)
        except DataError:
            if spec.round is None:
                raise
            result.skipped.append(spec.describe())  # rows, but none with a usable gold label
            continue
        result.sets.append(labelled)
        if spec.round is not None:
            build = session.get(RoundBuild, spec.build_id)
            estimate = human_f1_estimate(build.report or {} if build else {}, spec.split)
            if estimate is not None:
                result.human_f1[labelled.name] = estimate
    return result
