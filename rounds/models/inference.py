"""Inference: load a model directory and predict probabilities.

:func:`predict_probabilities` loads a model directory and returns one row of probabilities per
input, in the order of the labels in its ``dynaloop_model.json``; :func:`predict_loaded` does
the same with a model already in memory (:class:`LoadedClassifier`). A directory of the linear
kind (model_server.directory.linear) loads as a :class:`LinearClassifier`; :func:`load_classifier`
picks the one the directory's ``kind`` names. Evaluation (rounds.models.evaluate) and harvesting
(rounds.models.harvest) predict through this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model_server.directory import ModelMetadata, ModelMetadataError
from model_server.directory.linear import LinearModel
from model_server.directory.runtime import PrecisionCheck, PrecisionPlan, PrecisionUnavailable, pad_rows, plan_precision
from rounds.models.errors import EvaluationError
from services.extras import needs_extra

with needs_extra("training"):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class LoadedClassifier:
    """A model directory in memory: the network, its tokenizer, its ``dynaloop_model.json`` and
    the forward pass at the precision it was loaded for (model_server.directory.runtime)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    metadata: ModelMetadata
    precision: PrecisionPlan

    @classmethod
    def load(
        cls, model_dir: Path | str, *, device: str | None = None, precision: str = "fp32", batch_size: int = 64
    ) -> LoadedClassifier:
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
                f"dynaloop_model.json lists {len(metadata.labels)} labels; they must match"
            )
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model.to(device).eval()
        try:
            plan = plan_precision(
                model,
                tokenizer,
                precision,
                directory=model_dir,
                max_batch_size=batch_size,
                check=PrecisionCheck.load(model_dir),
            )
        except PrecisionUnavailable as exc:
            raise EvaluationError(f"cannot predict at {precision}: {exc}") from exc
        return cls(model=model, tokenizer=tokenizer, metadata=metadata, precision=plan)

    def predict(
        self,
        texts: Sequence[str],
        targets: Sequence[str] | None = None,
        *,
        batch_size: int = 64,
        progress: bool = False,
    ) -> np.ndarray:
        """:func:`predict_loaded` with this classifier at its precision."""
        return predict_loaded(
            self.model,
            self.tokenizer,
            self.metadata,
            texts,
            targets,
            batch_size=batch_size,
            progress=progress,
            precision=self.precision,
        )


@dataclass
class LinearClassifier:
    """A linear model directory in memory (model_server.directory.linear): no tokenizer, no precision."""

    model: LinearModel

    @property
    def metadata(self) -> ModelMetadata:
        return self.model.metadata

    def predict(
        self,
        texts: Sequence[str],
        targets: Sequence[str] | None = None,
        *,
        batch_size: int = 64,
        progress: bool = False,
    ) -> np.ndarray:
        """Probabilities ``(len(texts), len(labels))``, as :func:`predict_loaded` gives them for an
        encoder (``batch_size`` and ``progress`` are accepted for the same signature; the whole
        input is one sparse matrix)."""
        if targets is not None and len(targets) != len(texts):
            raise EvaluationError(f"{len(targets)} targets for {len(texts)} texts; give one target per text")
        try:
            return self.model.predict_proba(texts, targets)
        except ValueError as exc:
            raise EvaluationError(str(exc)) from exc


def load_classifier(
    model_dir: Path | str, *, device: str | None = None, precision: str = "fp32", batch_size: int = 64
) -> LoadedClassifier | LinearClassifier:
    """The model directory in memory, as its ``kind`` says: an encoder at ``precision`` on
    ``device``, or a linear model (which has neither)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise EvaluationError(f"model directory {model_dir} does not exist")
    metadata = ModelMetadata.load(model_dir)
    if metadata.kind == "linear":
        return LinearClassifier(LinearModel.load(model_dir, metadata))
    return LoadedClassifier.load(model_dir, device=device, precision=precision, batch_size=batch_size)


def predict_loaded(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    metadata: ModelMetadata,
    texts: Sequence[str],
    targets: Sequence[str] | None = None,
    *,
    batch_size: int = 64,
    progress: bool = False,
    precision: PrecisionPlan | None = None,
) -> np.ndarray:
    """Probabilities ``(len(texts), len(metadata.labels))`` from a model already in memory, at
    ``precision`` (default: fp32).

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
    features = dict(
        tokenizer(
            list(texts),
            None if targets is None else list(targets),
            truncation="only_first" if targets is not None else True,
            max_length=max_length,
        )
    )
    lengths = [len(ids) for ids in features["input_ids"]]
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    to_run: Iterable[list[int]] = batches
    if progress:
        from rich.progress import track

        to_run = track(batches, description="predicting", total=len(batches))

    device = next(model.parameters()).device
    probabilities = np.zeros((len(texts), n_labels), dtype=np.float32)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for rows in to_run:
                tensors = pad_rows(tokenizer, features, rows, device)
                logits = precision.forward(tensors)[0] if precision is not None else model(**tensors).logits.float()
                multi_label = metadata.family == "multi_label"
                batch = torch.sigmoid(logits) if multi_label else torch.softmax(logits, dim=-1)
                probabilities[rows] = batch.cpu().numpy()
    finally:
        model.train(was_training)
    return probabilities


def predict_probabilities(
    model_dir: Path | str,
    texts: Sequence[str],
    targets: Sequence[str] | None = None,
    *,
    batch_size: int = 64,
    device: str | None = None,
    progress: bool = False,
    precision: str = "fp32",
) -> np.ndarray:
    """Load ``model_dir`` and predict (an encoder at ``precision``: fp32, bf16, int8 or auto): probabilities
    ``(len(texts), n_labels)`` in the order of the labels in its ``dynaloop_model.json`` (see
    :func:`predict_loaded`).

    >>> predict_probabilities("models/r1", ["I loved it", "meh"]).shape  # doctest: +SKIP
    (2, 3)
    """
    classifier = load_classifier(model_dir, device=device, precision=precision, batch_size=batch_size)
    return classifier.predict(texts, targets, batch_size=batch_size, progress=progress)
