"""Evaluate a classifier on every round's dev/test and external sets (DynaSent Table 5b).

:func:`evaluate_model` predicts many sets with one model (rounds.models.inference) and scores each
(rounds.models.metrics): one row per set as in DynaSent Table 5b, a breakdown per variety where the
set records varieties (BESSTIE), and a ``solved`` flag where the set is a round's dev/test split
with a human F1 estimate (DynaSent §3.5, Table 6: the round is solved once the model's
macro-F1 reaches the humans'). :func:`cross_variety_matrix` is BESSTIE Fig. 5: macro-F1 of
models trained on one variety, tested on each.

The sets of a task's built rounds come from rounds.models.evaluation_sets; evaluation.md,
evaluation.json and the plots are written by rounds.models.evaluation_report.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from model_server.directory.tokenizer_coverage import DEFAULT_MAX_UNKNOWN_TOKEN_SHARE, token_coverage
from rounds.models.datasets import LabelledSet
from rounds.models.errors import EvaluationError
from rounds.models.inference import LinearClassifier, LoadedClassifier, load_classifier
from rounds.models.metrics import SetMetrics, compute_metrics, json_safe, metrics_by_variety, predicted_labels


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
    #: Labels never predicted with others (EthioEmo's neutral; model_server.directory.multi_label_choice).
    exclusive_labels: list[str] = field(default_factory=list)
    # The backbone tokenizer's unknown-token share on the sets' texts; a warning above the limit.
    tokenizer_coverage: dict[str, Any] | None = None
    #: What the forward passes ran at (model_server.directory.runtime.PrecisionPlan.describe); None: not recorded.
    precision: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    evaluated_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())
    #: Each set's probabilities (rows of the set, columns in its label order), in the order of
    #: ``sets``: what :meth:`predictions` reads.
    probabilities: list[np.ndarray] = field(default_factory=list, repr=False)
    evaluated_sets: list[LabelledSet] = field(default_factory=list, repr=False)
    #: encoder or linear (model_server.directory.ModelMetadata.kind).
    model_kind: str = "encoder"
    #: The linear baseline trained on the model's training mix and scored on the same sets; None
    #: with ``baseline_note`` saying why there is none.
    baseline: Baseline | None = None
    baseline_note: str | None = None

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
            row: dict[str, Any] = {
                "set": metrics.name,
                "rows": metrics.rows,
                **metrics.f1,
                "macro_f1": metrics.macro_f1,
            }
            if self.multi_label:
                row["micro_f1"] = metrics.micro_f1
            if self.baseline is not None:
                row["baseline_macro_f1"] = self.baseline.evaluation[metrics.name].macro_f1
            row["human_f1"] = metrics.human_f1
            row["solved"] = metrics.solved
            rows.append(row)
        return pd.DataFrame(rows).set_index("set")

    def behind_baseline(self) -> list[tuple[str, float, float]]:
        """``(set, model macro-F1, baseline macro-F1)`` for each set where the model does not beat
        the baseline (its macro-F1 is not above the baseline's)."""
        if self.baseline is None:
            return []
        return [
            (m.name, m.macro_f1, b.macro_f1)
            for m, b in zip(self.sets, self.baseline.evaluation.sets, strict=True)
            if not m.macro_f1 > b.macro_f1
        ]

    def variety_table(self) -> pd.DataFrame:
        """One row per (set, variety): rows, F1 per class, macro-F1. Empty without varieties."""
        rows = [
            {"set": metrics.name, "variety": variety, "rows": part.rows, **part.f1, "macro_f1": part.macro_f1}
            for metrics in self.sets
            for variety, part in metrics.by_variety.items()
        ]
        return pd.DataFrame(rows)

    def predictions(self) -> pa.Table:
        """One row per example of every set: the set, the example's id, text (and target), its
        gold labels, the labels predicted (argmax, or ``>= threshold`` for multi-label, as the
        metrics count them), whether they match, and the probability of each label."""
        if len(self.evaluated_sets) != len(self.sets):
            raise EvaluationError("this evaluation holds no per-example predictions")
        integer_ids = all(
            isinstance(example_id, int) for labelled in self.evaluated_sets for example_id in labelled.ids
        )
        schema = prediction_schema(self.labels, integer_ids=integer_ids)
        columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        for labelled, probabilities in zip(self.evaluated_sets, self.probabilities, strict=True):
            gold = labelled.hard()
            exclusive = [labelled.labels.index(label) for label in self.exclusive_labels if label in labelled.labels]
            predicted = predicted_labels(
                probabilities, multi_label=self.multi_label, threshold=self.threshold, exclusive=exclusive
            )
            for row in range(len(labelled)):
                if self.multi_label:
                    gold_labels = [label for label, on in zip(labelled.labels, gold[row], strict=True) if on]
                    predicted_set = [label for label, on in zip(labelled.labels, predicted[row], strict=True) if on]
                else:
                    gold_labels = [labelled.labels[int(gold[row])]]
                    predicted_set = [labelled.labels[int(predicted[row])]]
                columns["set"].append(labelled.name)
                example_id = labelled.ids[row]
                columns["example_id"].append(example_id if integer_ids else str(example_id))
                columns["text"].append(labelled.texts[row])
                columns["target"].append(labelled.targets[row] if labelled.targets is not None else None)
                columns["gold"].append(gold_labels)
                columns["predicted"].append(predicted_set)
                columns["correct"].append(sorted(gold_labels) == sorted(predicted_set))
                columns["scores"].append(
                    {label: float(probabilities[row, labelled.labels.index(label)]) for label in self.labels}
                )
        return pa.Table.from_pydict(columns, schema=schema)

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "model_id": self.model_id,
                "model_version": self.model_version,
                "model_dir": self.model_dir,
                "model_kind": self.model_kind,
                "labels": self.labels,
                "multi_label": self.multi_label,
                "threshold": self.threshold,
                "positive_label": self.positive_label,
                "tokenizer_coverage": self.tokenizer_coverage,
                "precision": self.precision,
                "warnings": self.warnings,
                "evaluated_at": self.evaluated_at,
                "macro_f1": {m.name: m.macro_f1 for m in self.sets},
                "solved": self.solved,
                "sets": [m.to_dict() for m in self.sets],
                "baseline": None if self.baseline is None else self.baseline.to_dict(),
                "baseline_note": self.baseline_note,
                "behind_baseline": [
                    {"set": name, "model_macro_f1": model, "baseline_macro_f1": baseline}
                    for name, model, baseline in self.behind_baseline()
                ],
            }
        )


@dataclass
class Baseline:
    """The linear model kind (rounds.models.linear) trained on the evaluated model's training mix and
    scored on the same sets: what the model must beat to be worth its cost (docs/evaluation.md,
    "Baseline")."""

    evaluation: Evaluation
    #: Where its training data came from, in words (the model's recorded mix, or the rounds' train splits).
    trained_on: str
    #: Each training source's summary (rows, label counts, SHA-256), as a model's metadata records it.
    train_sets: list[dict[str, Any]]
    model_dir: str

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "kind": "linear",
                "model_dir": self.model_dir,
                "model_version": self.evaluation.model_version,
                "trained_on": self.trained_on,
                "train_sets": self.train_sets,
                "macro_f1": {m.name: m.macro_f1 for m in self.evaluation.sets},
                "sets": [m.to_dict() for m in self.evaluation.sets],
            }
        )


def prediction_schema(labels: Sequence[str], *, integer_ids: bool = False) -> pa.Schema:
    """The columns of predictions.parquet (:meth:`Evaluation.predictions`); ``scores`` has one
    probability per label, in the task's label order (a struct, so Hugging Face ``datasets``
    loads it). ``example_id`` is an integer when every set's ids are (rounds' example ids, a
    file's integer `id` column), so the ids sort numerically; else text."""
    return pa.schema(
        [
            ("set", pa.string()),
            ("example_id", pa.int64() if integer_ids else pa.string()),
            ("text", pa.string()),
            ("target", pa.string()),
            ("gold", pa.list_(pa.string())),
            ("predicted", pa.list_(pa.string())),
            ("correct", pa.bool_()),
            ("scores", pa.struct([(label, pa.float64()) for label in labels])),
        ]
    )


def align_columns(probabilities: np.ndarray, model_labels: Sequence[str], set_labels: Sequence[str]) -> np.ndarray:
    """Reorder a model's probability columns to a set's label order (same labels required)."""
    if sorted(model_labels) != sorted(set_labels):
        raise EvaluationError(
            f"the model's labels {list(model_labels)} are not the set's labels {list(set_labels)}; "
            "evaluate a model trained for this task"
        )
    return probabilities[:, [list(model_labels).index(label) for label in set_labels]]


def evaluate_probabilities(
    sets: Sequence[LabelledSet],
    probabilities: Sequence[np.ndarray],
    *,
    human_f1: Mapping[str, float] | None = None,
    threshold: float = 0.5,
    positive_label: str | None = None,
    exclusive_labels: Sequence[str] = (),
    model_id: str = "",
    model_version: str = "",
    model_dir: str = "",
) -> Evaluation:
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
        metrics = compute_metrics(
            labelled, probs, threshold=threshold, positive_label=positive_label, exclusive_labels=exclusive_labels
        )
        metrics.by_variety = metrics_by_variety(
            labelled, probs, threshold=threshold, positive_label=positive_label, exclusive_labels=exclusive_labels
        )
        estimate = human_f1.get(labelled.name)
        if estimate is not None and math.isfinite(estimate):
            metrics.human_f1 = float(estimate)
            metrics.solved = metrics.macro_f1 >= estimate
        results.append(metrics)
    first = sets[0]
    return Evaluation(
        model_id=model_id,
        model_version=model_version,
        model_dir=model_dir,
        labels=list(first.labels),
        multi_label=first.multi_label,
        threshold=threshold,
        sets=results,
        positive_label=next((m.positive_label for m in results if m.positive_label), None),
        exclusive_labels=list(exclusive_labels),
        probabilities=[np.asarray(probs) for probs in probabilities],
        evaluated_sets=list(sets),
    )


def _predict_set(
    classifier: LoadedClassifier | LinearClassifier, labelled: LabelledSet, *, batch_size: int, progress: bool
) -> np.ndarray:
    metadata = classifier.metadata
    if (metadata.family == "multi_label") != labelled.multi_label:
        kind = "multi-label" if labelled.multi_label else "single-label"
        raise EvaluationError(f"{labelled.name} is {kind} but the model is {metadata.family.replace('_', '-')}")
    targets = None
    if metadata.input_format == "text_pair":
        if labelled.targets is None:
            raise EvaluationError(
                f"the model takes (sentence, target) pairs but {labelled.name} has no targets; "
                "give the file source a target_column"
            )
        targets = labelled.targets
    probabilities = classifier.predict(labelled.texts, targets, batch_size=batch_size, progress=progress)
    return align_columns(probabilities, metadata.labels, labelled.labels)


def evaluate_model(
    model_dir: Path | str,
    sets: Sequence[LabelledSet],
    *,
    human_f1: Mapping[str, float] | None = None,
    positive_label: str | None = None,
    batch_size: int = 64,
    device: str | None = None,
    progress: bool = False,
    max_unknown_token_share: float = DEFAULT_MAX_UNKNOWN_TOKEN_SHARE,
    precision: str = "fp32",
) -> Evaluation:
    """Predict every set with the model in ``model_dir`` and score it (:func:`compute_metrics`,
    per variety too). ``human_f1`` maps set names (``round 1 dev``) to the round's human
    macro-F1 estimate; those sets get ``solved = macro_f1 >= human_f1``. Multi-label sets are
    thresholded at the model's ``threshold``. ``precision``: fp32, bf16, int8 or auto
    (model_server.directory.runtime); the evaluation records what it ran at."""
    classifier = load_classifier(model_dir, device=device, precision=precision, batch_size=batch_size)
    probabilities = [_predict_set(classifier, labelled, batch_size=batch_size, progress=progress) for labelled in sets]
    metadata = classifier.metadata
    evaluation = evaluate_probabilities(
        sets,
        probabilities,
        human_f1=human_f1,
        threshold=metadata.threshold,
        positive_label=positive_label,
        exclusive_labels=metadata.exclusive_labels,
        model_id=metadata.model_id,
        model_version=metadata.version,
        model_dir=str(model_dir),
    )
    evaluation.model_kind = metadata.kind
    if isinstance(classifier, LinearClassifier):  # characters of any script: no tokenizer to cover them
        return evaluation
    evaluation.precision = classifier.precision.describe()
    coverage = token_coverage(classifier.tokenizer, (text for labelled in sets for text in labelled.texts))
    evaluation.tokenizer_coverage = coverage.to_dict()
    if coverage.exceeds(max_unknown_token_share):
        evaluation.warnings.append(coverage.message("the evaluated sets"))
    return evaluation


# ---------------------------------------------------------------------------- cross-variety (BESSTIE Fig. 5)


@dataclass
class CrossVarietyMatrix:
    """Macro-F1 of models trained on one variety (rows) tested on each variety (columns)."""

    train_varieties: list[str]
    test_varieties: list[str]
    macro_f1: np.ndarray  # (len(train_varieties), len(test_varieties))
    test_rows: dict[str, int]  # examples per test variety

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            self.macro_f1,
            index=pd.Index(self.train_varieties, name="trained on"),
            columns=pd.Index(self.test_varieties, name="tested on"),
        )

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "train_varieties": self.train_varieties,
                "test_varieties": self.test_varieties,
                "macro_f1": self.macro_f1.tolist(),
                "test_rows": self.test_rows,
            }
        )


def _rows_by_variety(test_sets: Sequence[LabelledSet]) -> dict[str, list[tuple[int, int]]]:
    groups: dict[str, list[tuple[int, int]]] = {}
    for s, labelled in enumerate(test_sets):
        if labelled.varieties is None:
            raise EvaluationError(
                f"{labelled.name} records no varieties; a cross-variety matrix needs them "
                "(give the file source a variety_column)"
            )
        for row, variety in enumerate(labelled.varieties):
            if variety is not None:
                groups.setdefault(variety, []).append((s, row))
    if not groups:
        raise EvaluationError("no test row has a variety")
    return groups


def cross_variety_from_predictions(
    predictions: Mapping[str, Sequence[np.ndarray]],
    test_sets: Sequence[LabelledSet],
    *,
    test_varieties: Sequence[str] | None = None,
    threshold: float = 0.5,
) -> CrossVarietyMatrix:
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
            pooled = LabelledSet(
                name=variety,
                labels=list(first.labels),
                multi_label=first.multi_label,
                texts=[test_sets[s].texts[i] for s, i in rows],
                y=np.stack([test_sets[s].y[i] for s, i in rows]),
            )
            probabilities = np.stack([per_set[s][i] for s, i in rows])
            matrix[r, c] = compute_metrics(pooled, probabilities, threshold=threshold).macro_f1
    return CrossVarietyMatrix(
        train_varieties=list(predictions),
        test_varieties=columns,
        macro_f1=matrix,
        test_rows={v: len(groups[v]) for v in columns},
    )


def cross_variety_matrix(
    models: Mapping[str, Path | str],
    test_sets: Sequence[LabelledSet],
    *,
    test_varieties: Sequence[str] | None = None,
    batch_size: int = 64,
    device: str | None = None,
) -> CrossVarietyMatrix:
    """BESSTIE Fig. 5: ``models`` maps a training variety (``en-AU``, or ``PT`` for the model
    before fine-tuning) to a model directory; each model predicts every test set once and is
    scored (macro-F1) on each variety's rows. Rows keep the order of ``models``."""
    if not models:
        raise EvaluationError("give at least one model (training variety -> model directory)")
    _rows_by_variety(test_sets)  # fail before loading any model
    predictions: dict[str, list[np.ndarray]] = {}
    threshold = 0.5
    for train_variety, model_dir in models.items():
        classifier = load_classifier(model_dir, device=device)
        threshold = classifier.metadata.threshold
        predictions[train_variety] = [
            _predict_set(classifier, labelled, batch_size=batch_size, progress=False) for labelled in test_sets
        ]
        del classifier
    return cross_variety_from_predictions(predictions, test_sets, test_varieties=test_varieties, threshold=threshold)
