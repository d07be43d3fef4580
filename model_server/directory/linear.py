"""The linear model kind: a class-balanced character and word n-gram TF-IDF + logistic regression.

A model directory whose ``dynaloop_model.json`` says ``"kind": "linear"`` holds, instead of a
Hugging Face checkpoint, one scikit-learn pipeline in :data:`LINEAR_FILE`: a
:class:`~sklearn.pipeline.FeatureUnion` of character n-grams (``char_wb``, 2-5) and word
n-grams (1-2), TF-IDF weighted, under a :class:`~sklearn.linear_model.LogisticRegression`
(single-label) or one binary logistic regression per label
(:class:`~sklearn.multioutput.MultiOutputClassifier`, multi-label). Character n-grams read any
script, so the model learns text the encoder's tokenizer turns into ``[UNK]`` (Ge'ez script
under MiniLM), and it trains in seconds on a CPU (docs/training.md, "The linear kind").

The trainer (rounds.models.linear) writes such a directory; the model server
(model_server.backends.linear_backend), offline prediction and evaluation (rounds.models.inference)
load it through :meth:`LinearModel.load`. It lives here, in ``model_server.directory``, because the
model server may import nothing else of the project.

Persistence: a model directory may come from an upload, so the pipeline is never unpickled. It
is stored with ``skops.io``, which rebuilds objects from a description and loads only the types
it is told to trust: :data:`TRUSTED_TYPES`, the types the trainer's pipeline consists of. A file
naming any other type is refused before anything in it is built, and what is built must be the
trainer's pipeline shape with one output per label.

Target-dependent tasks (MAD-TSC): the encoder reads (sentence, target) pairs; the linear model
reads the sentence with the target marked where it first occurs (:func:`mark_target`), so the
words beside the target become features of their own ("xxtgt" / "xxendtgt" bigrams).

>>> mark_target("The soup was cold but the staff were kind", "staff")
'The soup was cold but the xxtgt staff xxendtgt were kind'
>>> mark_target("Great place", "parking")
'Great place xxtgt parking xxendtgt'
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_server.directory import ModelMetadata, ModelMetadataError

LINEAR_FILE = "linear_model.skops"
#: The words that mark a target in its sentence (word tokens of their own, unlikely in any text).
TARGET_OPEN, TARGET_CLOSE = "xxtgt", "xxendtgt"

#: The only types :meth:`LinearModel.load` lets skops build: the trainer's pipeline and what its
#: fitted attributes hold. Anything else in a file refuses the whole file.
TRUSTED_TYPES: tuple[str, ...] = (
    "sklearn.pipeline.Pipeline",
    "sklearn.pipeline.FeatureUnion",
    "sklearn.feature_extraction.text.TfidfVectorizer",
    "sklearn.feature_extraction.text.TfidfTransformer",
    "sklearn.linear_model._logistic.LogisticRegression",
    "sklearn.multioutput.MultiOutputClassifier",
    "numpy.float64",
    "numpy.int64",
    "numpy.dtype",
    "numpy.ndarray",
    "builtins.dict",
    "builtins.list",
    "builtins.tuple",
    "builtins.set",
    "builtins.str",
    "builtins.int",
    "builtins.float",
    "builtins.bool",
)


def mark_target(text: str, target: str | None) -> str:
    """``text`` with ``target`` wrapped in :data:`TARGET_OPEN` / :data:`TARGET_CLOSE` at its
    first occurrence (case-insensitive), or appended marked when the text does not contain it."""
    if not target:
        return text
    found = re.search(re.escape(target), text, flags=re.IGNORECASE)
    if found is None:
        return f"{text} {TARGET_OPEN} {target} {TARGET_CLOSE}"
    start, end = found.span()
    return f"{text[:start]}{TARGET_OPEN} {text[start:end]} {TARGET_CLOSE}{text[end:]}"


def model_inputs(metadata: ModelMetadata, texts: Sequence[str], targets: Sequence[str | None] | None) -> list[str]:
    """What the pipeline reads: the texts, with their targets marked for ``text_pair`` models."""
    if targets is not None and len(targets) != len(texts):
        raise ValueError(f"{len(targets)} targets for {len(texts)} texts; give one target per text")
    if metadata.input_format == "text_pair":
        if targets is None or any(not target for target in targets):
            raise ValueError("this model takes (text, target) pairs; give a non-empty target for every text")
        return [mark_target(text, target) for text, target in zip(texts, targets, strict=True)]
    if targets is not None and any(targets):
        raise ValueError("this model takes single texts (input_format text); do not give targets")
    return list(texts)


def pipeline_version(pipeline: Any) -> str:
    """A short hash of the fitted pipeline's vocabularies, IDF weights and coefficients: the
    model's ``version`` changes exactly when they do (as rounds.models.train.weights_version does
    for an encoder's weights)."""
    digest = hashlib.sha256()
    for name, vectorizer in pipeline.named_steps["features"].transformer_list:
        digest.update(name.encode())
        for term, column in sorted(vectorizer.vocabulary_.items()):
            digest.update(f"{term}\x1f{column}\x1e".encode())
        digest.update(np.ascontiguousarray(vectorizer.idf_, dtype=np.float64).tobytes())
    for estimator in _estimators(pipeline.named_steps["classifier"]):
        digest.update(np.ascontiguousarray(estimator.coef_, dtype=np.float64).tobytes())
        digest.update(np.ascontiguousarray(estimator.intercept_, dtype=np.float64).tobytes())
    return digest.hexdigest()[:12]


def _estimators(classifier: Any) -> list[Any]:
    return list(getattr(classifier, "estimators_", [classifier]))


def save_pipeline(pipeline: Any, directory: Path | str) -> Path:
    """Write the fitted pipeline to ``directory``/:data:`LINEAR_FILE` with ``skops.io``."""
    import skops.io

    path = Path(directory) / LINEAR_FILE
    skops.io.dump(pipeline, path)
    return path


@dataclass
class LinearModel:
    """A linear model directory in memory: its pipeline and its ``dynaloop_model.json``."""

    pipeline: Any
    metadata: ModelMetadata

    @classmethod
    def load(cls, directory: Path | str, metadata: ModelMetadata | None = None) -> LinearModel:
        """Load ``directory``'s pipeline, refusing any file that names a type outside
        :data:`TRUSTED_TYPES` or that is not the trainer's pipeline for the metadata's labels."""
        import skops.io
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.multioutput import MultiOutputClassifier
        from sklearn.pipeline import FeatureUnion, Pipeline

        directory = Path(directory)
        metadata = metadata or ModelMetadata.load(directory)
        if metadata.kind != "linear":
            raise ModelMetadataError(f"{directory} is an {metadata.kind} model directory, not a linear one")
        path = directory / LINEAR_FILE
        if not path.is_file():
            raise ModelMetadataError(
                f"{directory} says kind linear but has no {LINEAR_FILE}; "
                "train it with `dynaloop round train --kind linear`"
            )
        try:
            untrusted = skops.io.get_untrusted_types(file=path)
        except Exception as exc:  # skops raises several types for a file that is not its format
            raise ModelMetadataError(f"{path} is not a skops file ({type(exc).__name__}: {exc})") from exc
        refused = sorted(set(untrusted) - set(TRUSTED_TYPES))
        if refused:
            raise ModelMetadataError(
                f"{path} names types dynaloop does not load ({', '.join(refused[:5])}); a linear model directory "
                "holds only the trainer's scikit-learn pipeline. Train it again with "
                "`dynaloop round train --kind linear`"
            )
        try:
            pipeline = skops.io.load(path, trusted=[name for name in untrusted if name in TRUSTED_TYPES])
        except Exception as exc:
            raise ModelMetadataError(f"{path} cannot be loaded ({type(exc).__name__}: {exc})") from exc
        multi = metadata.family == "multi_label"
        wanted = MultiOutputClassifier if multi else LogisticRegression
        steps = getattr(pipeline, "named_steps", {}) if isinstance(pipeline, Pipeline) else {}
        features, classifier = steps.get("features"), steps.get("classifier")
        if (
            not isinstance(features, FeatureUnion)
            or not all(isinstance(part, TfidfVectorizer) for _, part in features.transformer_list)
            or not isinstance(classifier, wanted)
            or (
                multi
                and not all(isinstance(e, LogisticRegression) and len(e.classes_) == 2 for e in _estimators(classifier))
            )
        ):
            raise ModelMetadataError(
                f"{path} is not the linear trainer's pipeline (TF-IDF features under a {wanted.__name__})"
            )
        outputs = len(_estimators(classifier)) if multi else len(getattr(classifier, "classes_", []))
        if (multi and outputs != len(metadata.labels)) or (not multi and not 2 <= outputs <= len(metadata.labels)):
            raise ModelMetadataError(
                f"{path}: the classifier has {outputs} outputs but dynaloop_model.json lists "
                f"{len(metadata.labels)} labels; they must match"
            )
        return cls(pipeline=pipeline, metadata=metadata)

    def predict_proba(self, texts: Sequence[str], targets: Sequence[str | None] | None = None) -> np.ndarray:
        """Probabilities ``(len(texts), len(labels))`` in the metadata's label order: a softmax
        over the labels (single-label; a label the training data never had gets 0) or one
        sigmoid per label (multi-label)."""
        labels = self.metadata.labels
        if not len(texts):
            return np.zeros((0, len(labels)), dtype=np.float32)
        inputs = model_inputs(self.metadata, texts, targets)
        classifier = self.pipeline.named_steps["classifier"]
        if self.metadata.family == "multi_label":
            per_label = self.pipeline.predict_proba(inputs)
            return np.stack([scores[:, 1] for scores in per_label], axis=1).astype(np.float32)
        probabilities = np.zeros((len(inputs), len(labels)), dtype=np.float32)
        probabilities[:, np.asarray(classifier.classes_, dtype=int)] = self.pipeline.predict_proba(inputs)
        return probabilities
