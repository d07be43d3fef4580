"""Train the linear model kind (model_server.directory.linear) on a data mix: `round train --kind linear`.

The same data mix as the encoder (rounds.models.datasets: every source's rows, loss ``weight`` and
``upsample``), the same dev set and the same model directory format, so registry, promotion and
the model server treat both kinds alike (docs/training.md, "The linear kind").

Model
    TF-IDF over character n-grams (``char_wb``, 2-5: any script, spelling variants) and word
    n-grams (1-2), sublinear term frequencies, under scikit-learn's logistic regression with
    ``class_weight="balanced"``; multi-label: one balanced binary logistic regression per label
    (:class:`~sklearn.multioutput.MultiOutputClassifier`), read at the model's ``threshold`` with
    the task's exclusive labels, as the encoder's outputs are.
Data
    A row's loss weight is its source's ``weight * upsample``. A distributional (soft) label
    becomes one weighted row per label it gives mass to, so the logistic loss is the expected
    cross-entropy over the distribution, the encoder's soft-target loss. Balanced class weights
    are computed by scikit-learn from these weights (the mix's label mass, as the encoder's
    ``class_weights: balanced``).

It trains in seconds to minutes on a CPU, needs no GPU and no checkpoint, and is also the
baseline every ``round evaluate`` reports beside the model (rounds.models.usecases).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import numpy as np

from model_server.directory import ModelMetadata
from model_server.directory.linear import LINEAR_FILE, LinearModel, model_inputs, pipeline_version, save_pipeline
from rounds.models.datasets import LabelledSet
from rounds.models.metrics import macro_f1, per_class_f1
from rounds.models.train import EpochRecord, TrainingError, TrainResult, _check_sets

logger = logging.getLogger(__name__)

Family = Literal["single_label", "multi_label"]
InputFormat = Literal["text", "text_pair"]

#: The recipe, recorded as the model's hyperparameters. The feature caps bound memory and the
#: model file on large mixes (a few hundred thousand n-grams keep nearly all the signal).
HYPERPARAMETERS: dict[str, Any] = {
    "kind": "linear",
    "char_ngrams": [2, 5],
    "word_ngrams": [1, 2],
    "max_char_features": 300_000,
    "max_word_features": 200_000,
    "sublinear_tf": True,
    "C": 4.0,
    "class_weight": "balanced",
    "max_iter": 2000,
}


def build_pipeline(family: Family, seed: int = 0) -> Any:
    """The unfitted pipeline of :data:`HYPERPARAMETERS`."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.multioutput import MultiOutputClassifier
    from sklearn.pipeline import FeatureUnion, Pipeline

    h = HYPERPARAMETERS
    features = FeatureUnion(
        [
            (
                "char",
                TfidfVectorizer(
                    analyzer="char_wb",
                    ngram_range=tuple(h["char_ngrams"]),
                    sublinear_tf=h["sublinear_tf"],
                    max_features=h["max_char_features"],
                    dtype=np.float64,
                ),
            ),
            (
                "word",
                TfidfVectorizer(
                    analyzer="word",
                    ngram_range=tuple(h["word_ngrams"]),
                    sublinear_tf=h["sublinear_tf"],
                    max_features=h["max_word_features"],
                    dtype=np.float64,
                ),
            ),
        ]
    )
    regression = LogisticRegression(C=h["C"], class_weight=h["class_weight"], max_iter=h["max_iter"], random_state=seed)
    classifier = MultiOutputClassifier(regression) if family == "multi_label" else regression
    return Pipeline([("features", features), ("classifier", classifier)])


def training_rows(
    train_sets: Sequence[LabelledSet], family: Family, input_format: InputFormat, metadata: ModelMetadata
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The pipeline's inputs, targets (a label index per row, or a 0/1 matrix) and row weights."""
    texts: list[str] = []
    targets: list[Any] = []
    weights: list[float] = []
    for labelled in train_sets:
        inputs = model_inputs(metadata, labelled.texts, labelled.targets if input_format == "text_pair" else None)
        factor = float(labelled.weight * labelled.upsample)
        for row, text in enumerate(inputs):
            if family == "multi_label":
                texts.append(text)
                targets.append((labelled.y[row] >= 0.5).astype(int))
                weights.append(factor)
                continue
            for label in np.flatnonzero(labelled.y[row] > 0):
                texts.append(text)
                targets.append(int(label))
                weights.append(factor * float(labelled.y[row, label]))
    y = np.stack(targets) if family == "multi_label" else np.asarray(targets, dtype=int)
    return texts, y, np.asarray(weights, dtype=np.float64)


def _log_loss(pipeline: Any, texts: Sequence[str], y: np.ndarray, weights: np.ndarray, family: Family) -> float:
    """The fitted model's weighted log loss on its training rows (multi-label: the mean over labels)."""
    from sklearn.metrics import log_loss

    probabilities = pipeline.predict_proba(texts)
    if family == "multi_label":
        return float(
            np.mean([log_loss(y[:, j], p, sample_weight=weights, labels=[0, 1]) for j, p in enumerate(probabilities)])
        )
    classes = pipeline.named_steps["classifier"].classes_
    return float(log_loss(y, probabilities, sample_weight=weights, labels=classes))


def _library_versions() -> dict[str, str]:
    """The versions of the libraries that fit and store the model (importing them: the linear
    recipe needs both)."""
    import sklearn
    import skops

    return {"scikit-learn": sklearn.__version__, "skops": skops.__version__}


def _check_fittable(y: np.ndarray, labels: list[str], family: Family) -> None:
    """:class:`TrainingError` for targets the model cannot be fitted on: one class only;
    multi-label, a label that is never, or always, on."""
    if family == "multi_label":
        on = y.sum(axis=0)
        constant = [label for label, count in zip(labels, on, strict=True) if count in (0, len(y))]
        if constant:
            raise TrainingError(
                f"the linear model needs every label both on and off in the training mix; {constant} "
                "never change: add examples of them, or train the encoder"
            )
    elif len(set(y.tolist())) < 2:
        raise TrainingError(f"the training mix has examples of one label only ({labels[int(y[0])]}); add others")


def _score_dev(
    model: LinearModel, dev: LabelledSet | None, input_format: InputFormat, family: Family, exclusive: list[int]
) -> tuple[float | None, dict[str, float] | None]:
    """The fitted model's macro-F1 and each class's F1 on ``dev``; None without a dev set."""
    metadata = model.metadata
    dev_f1 = dev_per_class = None
    if dev is not None and len(dev):
        scores = model.predict_proba(dev.texts, dev.targets if input_format == "text_pair" else None)
        dev_f1 = macro_f1(dev.y, scores, family=family, threshold=metadata.threshold, exclusive=exclusive)
        dev_per_class = per_class_f1(
            dev.y, scores, dev.labels, family=family, threshold=metadata.threshold, exclusive=exclusive
        )
    return dev_f1, dev_per_class


def _full_metadata(
    metadata: ModelMetadata,
    pipeline: Any,
    train_sets: Sequence[LabelledSet],
    dev: LabelledSet | None,
    seed: int,
    record: EpochRecord,
    wall_seconds: float,
    versions: dict[str, str],
) -> ModelMetadata:
    """The model directory's metadata: the model's, with the data it was fitted on, the
    hyperparameters and its one epoch of training."""
    return ModelMetadata.model_validate(
        {
            **metadata.model_dump(mode="json"),
            "data": {
                "train": [labelled.summary() for labelled in train_sets],
                "dev": dev.summary() if dev is not None else None,
            },
            "hyperparameters": {**HYPERPARAMETERS, "seed": seed},
            "training": {
                "epochs_run": 1,
                "best_epoch": 1,
                "best_dev_macro_f1": record.dev_macro_f1,
                "best_dev_f1_per_class": record.dev_f1_per_class,
                "stopped_early": False,
                "examples_per_second": record.examples_per_second,
                "wall_seconds": wall_seconds,
                "history": [asdict(record)],
                "from_scratch": True,
                "features": {
                    name: len(vectorizer.vocabulary_)
                    for name, vectorizer in pipeline.named_steps["features"].transformer_list
                },
                "device": "cpu",
                "versions": versions,
            },
        }
    )


def _write_model_dir(
    pipeline: Any, full: ModelMetadata, out_dir: Path, rows: int, seconds: float, dev_f1: float | None
) -> None:
    """Save the fitted pipeline and its metadata to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_pipeline(pipeline, out_dir)
    full.save(out_dir)
    logger.info(
        "linear model: %d rows, %s n-grams, fitted in %.1f s%s; wrote %s (version %s, %s)",
        rows,
        full.model_extra["training"]["features"] if full.model_extra else {},
        seconds,
        "" if dev_f1 is None else f", dev macro-F1 {dev_f1:.4f}",
        out_dir,
        full.version,
        LINEAR_FILE,
    )


def train_linear(
    train_sets: Sequence[LabelledSet],
    dev: LabelledSet | None,
    *,
    labels: Sequence[str],
    family: Family,
    input_format: InputFormat,
    out_dir: Path | str,
    model_id: str,
    trained_for_round: int | None = None,
    task_name: str | None = None,
    exclusive_labels: Sequence[str] = (),
    seed: int = 0,
) -> TrainResult:
    """Fit the linear model on ``train_sets`` and write its model directory to ``out_dir``.

    ``dev`` is scored (macro-F1 and each class's F1, as the encoder's epochs are) but chooses
    nothing: the recipe has no epochs to stop early. Raises :class:`TrainingError` for data the
    model cannot be fitted on (one class only; multi-label: a label that is never, or always, on).
    """
    versions = _library_versions()
    started = time.perf_counter()
    out_dir = Path(out_dir)
    labels = list(labels)
    _check_sets(train_sets, dev, labels, family, input_format)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise TrainingError(f"{out_dir} is not empty; choose a new folder")
    unknown_exclusive = [label for label in exclusive_labels if label not in labels]
    if unknown_exclusive:
        raise TrainingError(f"exclusive_labels {unknown_exclusive} are not among the labels {labels}")
    exclusive = [labels.index(label) for label in exclusive_labels] if family == "multi_label" else []
    draft = ModelMetadata(
        model_id=model_id,
        labels=labels,
        family=family,
        kind="linear",
        input_format=input_format,
        exclusive_labels=[labels[j] for j in exclusive],
    )
    texts, y, weights = training_rows(train_sets, family, input_format, draft)
    _check_fittable(y, labels, family)
    pipeline = build_pipeline(family, seed)
    tick = time.perf_counter()
    with warnings.catch_warnings():
        # lbfgs stopping at max_iter on separable text is expected; its warning is not the user's business.
        warnings.filterwarnings("ignore", message=".*failed to converge.*")
        pipeline.fit(texts, y, classifier__sample_weight=weights)
    seconds = time.perf_counter() - tick
    train_loss = _log_loss(pipeline, texts, y, weights, family)
    examples = sum(len(labelled) * labelled.upsample for labelled in train_sets)
    metadata = ModelMetadata.model_validate(
        {
            **draft.model_dump(mode="json"),
            "version": pipeline_version(pipeline),
            "base_model": "tf-idf char 2-5 + word 1-2 n-grams, logistic regression (scikit-learn)",
            "trained_for_round": trained_for_round,
            "task": task_name,
        }
    )
    model = LinearModel(pipeline=pipeline, metadata=metadata)
    dev_f1, dev_per_class = _score_dev(model, dev, input_format, family, exclusive)
    record = EpochRecord(
        epoch=1,
        train_loss=train_loss,
        dev_macro_f1=dev_f1,
        examples=examples,
        seconds=round(seconds, 3),
        examples_per_second=examples / max(seconds, 1e-9),
        dev_f1_per_class=dev_per_class,
    )
    wall_seconds = time.perf_counter() - started
    full = _full_metadata(metadata, pipeline, train_sets, dev, seed, record, wall_seconds, versions)
    _write_model_dir(pipeline, full, out_dir, len(texts), seconds, dev_f1)
    return TrainResult(
        out_dir=out_dir,
        metadata=full,
        history=[record],
        best_epoch=1,
        best_dev_macro_f1=dev_f1,
        stopped_early=False,
        resumed_from_step=None,
        examples_per_second=record.examples_per_second,
        wall_seconds=wall_seconds,
    )
