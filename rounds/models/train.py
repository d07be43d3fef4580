"""Retrain the next round's model from scratch (docs/design.md, "Round builder" step 6).

Every round's model starts again from the *base* checkpoint (a Hugging Face backbone such as
the packaged all-MiniLM-L6-v2, RoBERTa or XLM-R) with a freshly initialised classification head,
and is trained on the whole data mix: every built round's train split with its distributional
labels plus external labelled files, each with a loss weight and an upsampling factor (DynaSent
Table 5a). It never continues from the previous round's model (DynaSent §5.3), and
:func:`train_model` refuses a base directory that dynaloop itself trained.

Loss
    single-label: soft-target cross-entropy ``-(y * log_softmax(logits)).sum(-1)``, the ordinary
    cross-entropy when ``y`` is one-hot and its expectation over labels when ``y`` is a
    distribution (DynaSent §3.4's distributional labels); optional per-class weights (BESSTIE's
    class-weighted loss); times the source's ``weight``.
    multi-label: binary cross-entropy with logits on ``y`` (EthioEmo), per-label ``pos_weight``
    as class weights, times the source's ``weight``.
Engine
    Hugging Face Accelerate, so one code path runs on a CPU, one GPU or several GPUs
    (``accelerate launch -m dynaloop.cli round train ...``); seeded, and bit-for-bit
    reproducible on a CPU for a given seed. Early stopping on dev macro-F1 keeps the best
    epoch's weights; resumable checkpoints live in ``out_dir/checkpoints``.
Output
    ``out_dir`` is a model directory the model server loads: ``save_pretrained`` weights and
    tokenizer plus ``dynaloop_model.json`` with the data (each source's rows, weight, upsampling,
    SHA-256 and label counts), the hyperparameters and the training record.

>>> soft_cross_entropy(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.5, 0.5]])).item()  # doctest: +ELLIPSIS
0.693...
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, TypedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator
from tqdm.auto import tqdm

from model_server.directory import METADATA_FILE, ModelMetadata
from model_server.directory.tokenizer_coverage import DEFAULT_MAX_UNKNOWN_TOKEN_SHARE, TokenCoverage, token_coverage
from rounds.models.datasets import LabelledSet, expand
from rounds.models.errors import TrainingError
from rounds.models.metrics import macro_f1, per_class_f1
from services.extras import needs_extra

with needs_extra("training"):
    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin, load_checkpoint_in_model, set_seed
    from torch.utils.data import DataLoader, Dataset, Sampler
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        PreTrainedModel,
        PreTrainedTokenizerBase,
        get_linear_schedule_with_warmup,
    )

logger = logging.getLogger(__name__)

Family = Literal["single_label", "multi_label"]
InputFormat = Literal["text", "text_pair"]

CHECKPOINTS_DIR = "checkpoints"
BEST_WEIGHTS_DIR = "best-weights"
PROGRESS_FILE = "training_progress.json"


class TrainConfig(BaseModel):
    """Hyperparameters of one training run (recorded in the model's ``dynaloop_model.json``)."""

    model_config = ConfigDict(extra="forbid")

    base: Path | None = Field(None, description="Hugging Face backbone directory; default: the packaged MiniLM.")
    epochs: int = Field(3, ge=1, le=1000, description="Planned epochs; the learning-rate schedule spans them.")
    batch_size: int = Field(32, ge=1, description="Examples per batch on each process.")
    learning_rate: float = Field(2e-5, ge=0)
    weight_decay: float = Field(0.01, ge=0, description="AdamW decay; biases and norm weights are exempt.")
    warmup_ratio: float = Field(0.1, ge=0, le=1, description="Share of the optimizer steps with linear warm-up.")
    max_grad_norm: float | None = Field(1.0, gt=0, description="Gradient clipping; null: none.")
    max_length: int = Field(128, ge=8, le=8192, description="Longer inputs are truncated (the text, not the target).")
    seed: int = 0
    class_weights: Literal["none", "balanced"] | dict[str, float] = Field(
        "none", description="Per-class loss weights: none, balanced (from the mix's label mass) or {label: weight}."
    )
    early_stopping_patience: int | None = Field(
        2, ge=1, description="Stop after this many epochs without a better dev macro-F1; null: never."
    )
    gradient_accumulation_steps: int = Field(1, ge=1)
    cpu: bool = Field(False, description="Train on the CPU even when a GPU is present.")
    mixed_precision: Literal["no", "fp16", "bf16"] | None = Field(
        None, description="null: what `accelerate launch` / `accelerate config` says (default no)."
    )
    checkpoint_every: int | Literal["epoch"] = Field(
        "epoch", description="Save a resumable checkpoint every N optimizer steps, or at each epoch's end only."
    )
    resume: bool = Field(False, description="Continue from the newest checkpoint in out_dir/checkpoints.")
    max_unknown_token_share: float = Field(
        DEFAULT_MAX_UNKNOWN_TOKEN_SHARE,
        ge=0,
        le=1,
        description="Refuse to train when more than this share of the mix's tokens are the backbone "
        "tokenizer's unknown token (DYNALOOP_MAX_UNKNOWN_TOKEN_SHARE).",
    )
    allow_unknown_tokens: bool = Field(
        False, description="Train even above max_unknown_token_share (the share is still recorded and logged)."
    )

    @field_validator("checkpoint_every")
    @classmethod
    def _positive_steps(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("checkpoint_every must be a positive number of steps or 'epoch'")
        return value

    def resolved_base(self) -> Path:
        if self.base is not None:
            return Path(self.base)
        from rounds.models.init_model import minilm_dir

        return minilm_dir()

    def recorded(self) -> dict[str, object]:
        """The hyperparameters as written to the model's metadata."""
        values = self.model_dump(mode="json", exclude={"resume", "allow_unknown_tokens"})
        values["base"] = str(self.resolved_base())
        return values


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    train_loss: float
    dev_macro_f1: float | None
    examples: int
    seconds: float
    examples_per_second: float
    # F1 of each class (label) on dev: a class the model never predicts shows as 0 at once.
    dev_f1_per_class: dict[str, float] | None = None


@dataclass
class TrainResult:
    out_dir: Path
    metadata: ModelMetadata
    history: list[EpochRecord]
    best_epoch: int  # the epoch whose weights are in out_dir
    best_dev_macro_f1: float | None
    stopped_early: bool
    resumed_from_step: int | None
    examples_per_second: float
    wall_seconds: float
    tokenizer_coverage: TokenCoverage | None = None
    unknown_token_warning: str | None = None  # set when the coverage is above the limit (allowed)
    low_f1_warning: str | None = None  # set when a class's best-epoch dev F1 is low (low_f1_classes)

    @property
    def epochs_run(self) -> int:
        return len(self.history)

    @property
    def best_dev_f1_per_class(self) -> dict[str, float] | None:
        """Per-class dev F1 of the epoch whose weights were kept."""
        for record in self.history:
            if record.epoch == self.best_epoch:
                return record.dev_f1_per_class
        return None

    def metrics(self) -> dict[str, object]:
        return {
            "epochs_run": self.epochs_run,
            "best_epoch": self.best_epoch,
            "best_dev_macro_f1": self.best_dev_macro_f1,
            "best_dev_f1_per_class": self.best_dev_f1_per_class,
            "tokenizer_coverage": None if self.tokenizer_coverage is None else self.tokenizer_coverage.to_dict(),
            "unknown_token_warning": self.unknown_token_warning,
            "low_f1_classes": low_f1_classes(self.best_dev_f1_per_class),
            "low_f1_warning": self.low_f1_warning,
            "stopped_early": self.stopped_early,
            "resumed_from_step": self.resumed_from_step,
            "examples_per_second": round(self.examples_per_second, 2),
            "wall_seconds": round(self.wall_seconds, 2),
            "history": [asdict(record) for record in self.history],
        }


# ---------------------------------------------------------------------------- low per-class F1

# A class's dev F1 is low when it is under LOW_F1_FLOOR, or under LOW_F1_SHARE of the mean of all
# classes' F1 (the dev macro-F1): a class at 0.039 beside others at 0.7 is one the model has all
# but given up on, and a class at 0.15 where the others average 0.2 is not (docs/training.md,
# "Per-class F1 on dev").
LOW_F1_FLOOR = 0.1
LOW_F1_SHARE = 1 / 3


def low_f1_bound(per_class: Mapping[str, float]) -> float:
    """The F1 below which a class is low: ``max(LOW_F1_FLOOR, LOW_F1_SHARE × mean F1)``."""
    mean = sum(per_class.values()) / len(per_class)
    return max(LOW_F1_FLOOR, LOW_F1_SHARE * mean)


def low_f1_classes(per_class: Mapping[str, float] | None) -> list[str]:
    """The classes (labels) whose dev F1 is low, in the labels' order; none without a dev set.

    >>> low_f1_classes({"negative": 0.71, "neutral": 0.039, "positive": 0.74})
    ['neutral']
    >>> low_f1_classes({"negative": 0.2, "neutral": 0.15, "positive": 0.25})
    []
    """
    if not per_class:
        return []
    bound = low_f1_bound(per_class)
    return [label for label, f1 in per_class.items() if f1 < bound]


def low_f1_warning(
    per_class: Mapping[str, float] | None, class_weights: Literal["none", "balanced"] | Mapping[str, float]
) -> str | None:
    """One line naming the low classes with their F1 and what to try, or None when none is low."""
    low = low_f1_classes(per_class)
    if not low or not per_class:
        return None
    mean = sum(per_class.values()) / len(per_class)
    figures = ", ".join(f"{label} {per_class[label]:.3f}" for label in low)
    never = [label for label in low if per_class[label] == 0]
    what = (
        "the model never gets " + ("this class" if len(low) == 1 else "these classes") + " right"
        if len(never) == len(low)
        else "the model has nearly given up on " + ("this class" if len(low) == 1 else "these classes")
    )
    remedy = (
        "try --class-weights balanced, a higher --learning-rate or more --epochs"
        if class_weights == "none"
        else "try a higher --learning-rate, more --epochs or more training examples of "
        + ("it" if len(low) == 1 else "them")
    )
    return (
        f"low dev F1 for {figures} (below {low_f1_bound(per_class):.3f}: the larger of "
        f"{LOW_F1_FLOOR} and a third of the dev macro-F1 {mean:.3f}): {what}; {remedy}"
    )


# ---------------------------------------------------------------------------- losses


def soft_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, class_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-example ``-(w * y * log_softmax(logits)).sum(-1)``.

    On one-hot ``targets`` this is ``F.cross_entropy(logits, gold, weight=w, reduction="none")``;
    on a distribution it is the expected cross-entropy over its labels (DynaSent's
    distributional labels as soft targets).
    """
    log_probabilities = F.log_softmax(logits.float(), dim=-1)
    weighted = targets if class_weights is None else targets * class_weights
    return -(weighted * log_probabilities).sum(dim=-1)


def multi_label_bce(
    logits: torch.Tensor, targets: torch.Tensor, pos_weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-example binary cross-entropy with logits, averaged over labels."""
    losses = F.binary_cross_entropy_with_logits(logits.float(), targets, pos_weight=pos_weight, reduction="none")
    return losses.mean(dim=-1)


def class_weights_for(
    sets: Sequence[LabelledSet],
    labels: Sequence[str],
    spec: Literal["none", "balanced"] | Mapping[str, float],
    *,
    family: Family,
) -> torch.Tensor | None:
    """Per-class loss weights for the mix, or None.

    ``balanced`` follows scikit-learn's formula on the soft label mass, counting each example
    as often as it is seen per epoch (``upsample``) and by its loss ``weight``: single-label
    ``w_c = total / (n_labels * mass_c)``; multi-label a BCE ``pos_weight`` of
    ``negative mass / positive mass`` per label. An explicit ``{label: weight}`` gives the class
    weights (single-label) or ``pos_weight`` (multi-label) directly; unlisted labels get 1.
    """
    if isinstance(spec, str):
        if spec == "none":
            return None
        if spec != "balanced":
            raise TrainingError(f"class_weights {spec!r}: use none, balanced or a {{label: weight}} mapping")
        positive = np.zeros(len(labels), dtype=np.float64)
        examples = 0.0
        for labelled in sets:
            factor = labelled.weight * labelled.upsample
            positive += factor * labelled.y.sum(axis=0)
            examples += factor * len(labelled)
        weights = np.ones(len(labels), dtype=np.float64)
        seen = positive > 0
        if not seen.all():
            logger.warning(
                "no training mass for %s; their class weight stays 1",
                [label for label, s in zip(labels, seen, strict=True) if not s],
            )
        if family == "multi_label":
            weights[seen] = (examples - positive[seen]) / positive[seen]
        else:
            weights[seen] = positive.sum() / (len(labels) * positive[seen])
        return torch.tensor(weights, dtype=torch.float32)
    unknown = sorted(set(spec) - set(labels))
    if unknown:
        raise TrainingError(f"class_weights names {unknown}, which are not among the labels {list(labels)}")
    if any(value <= 0 for value in spec.values()):
        raise TrainingError("class weights must be positive")
    return torch.tensor([float(spec.get(label, 1.0)) for label in labels], dtype=torch.float32)


# ---------------------------------------------------------------------------- data


class TrainingItem(TypedDict):
    """One row of a labelled set, as the data loader hands it to :class:`Collate`."""

    text: str
    target: str | None
    y: np.ndarray  # (len(labels),) float32
    weight: float


class MixDataset(Dataset[TrainingItem]):
    """Rows of several labelled sets, addressed by ``(set index, row)``."""

    def __init__(self, sets: Sequence[LabelledSet]) -> None:
        self.sets = list(sets)

    def __len__(self) -> int:
        return sum(len(labelled) for labelled in self.sets)

    def __getitem__(self, key: tuple[int, int]) -> TrainingItem:
        set_index, row = key
        labelled = self.sets[set_index]
        return {
            "text": labelled.texts[row],
            "target": None if labelled.targets is None else labelled.targets[row],
            "y": labelled.y[row],
            "weight": labelled.weight,
        }


class UpsampledEpochs(Sampler[tuple[int, int]]):
    """One epoch of the mix: each row ``upsample`` times, shuffled with ``seed + epoch``
    (:func:`rounds.models.datasets.expand`). The epoch is chosen explicitly with :meth:`use_epoch`
    (deliberately not ``set_epoch``, which Accelerate would drive from its own counter)."""

    def __init__(self, sets: Sequence[LabelledSet], seed: int) -> None:
        self.sets = list(sets)
        self.seed = seed
        self.epoch = 1
        self._length = sum(len(labelled) * labelled.upsample for labelled in self.sets)

    def use_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[tuple[int, int]]:
        set_indices, rows = expand(self.sets, seed=self.seed + self.epoch)
        return iter(zip(set_indices, rows, strict=True))


class Collate:
    """Tokenise a batch; the second segment (a target) is never truncated, the text is."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int, input_format: InputFormat) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.input_format = input_format

    def __call__(self, items: list[TrainingItem]) -> dict[str, torch.Tensor]:
        texts = [str(item["text"]) for item in items]
        if self.input_format == "text_pair":
            targets = [str(item["target"]) for item in items]
            encoded = self.tokenizer(
                texts, targets, truncation="only_first", max_length=self.max_length, padding=True, return_tensors="pt"
            )
        else:
            encoded = self.tokenizer(
                texts, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt"
            )
        batch = dict(encoded)
        batch["y"] = torch.tensor(np.stack([item["y"] for item in items]), dtype=torch.float32)
        batch["weight"] = torch.tensor([float(item["weight"]) for item in items], dtype=torch.float32)
        return batch


def _check_sets(
    train_sets: Sequence[LabelledSet],
    dev: LabelledSet | None,
    labels: Sequence[str],
    family: Family,
    input_format: InputFormat,
) -> None:
    if len(labels) < 2:
        raise TrainingError(f"a classifier needs at least two labels, got {list(labels)}")
    if not train_sets or not any(len(labelled) for labelled in train_sets):
        raise TrainingError("no training examples: the data mix's train sources are empty")
    for labelled in [*train_sets, *([dev] if dev is not None else [])]:
        if list(labelled.labels) != list(labels):
            raise TrainingError(f"{labelled.name}: labels {labelled.labels} differ from the model's {list(labels)}")
        if labelled.multi_label != (family == "multi_label"):
            raise TrainingError(
                f"{labelled.name}: a {'multi' if labelled.multi_label else 'single'}-label set for a {family} model"
            )
        if input_format == "text_pair" and labelled.targets is None:
            raise TrainingError(
                f"{labelled.name}: the model takes (text, target) pairs but the set has no targets; "
                "set target_column for a file source"
            )
        if input_format == "text" and labelled.targets is not None:
            raise TrainingError(f"{labelled.name}: the set has targets but the model takes single texts")


# ---------------------------------------------------------------------------- model


def refuse_trained_base(base: Path) -> None:
    """Raise when ``base`` is a model dynaloop trained: a new round starts from the backbone."""
    path = base / METADATA_FILE
    if not path.is_file():
        return
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TrainingError(f"{path} cannot be read: {exc}") from exc
    if raw.get("trained_for_round") is not None or raw.get("training"):
        origin = raw.get("base_model") or "the backbone it was trained from"
        served = f" (trained for round {raw['trained_for_round']})" if raw.get("trained_for_round") else ""
        raise TrainingError(
            f"{base} is a model dynaloop already trained{served}. Each round's model is retrained from scratch: "
            f"from the base checkpoint with a fresh classification head, on all rounds' data, never continued "
            f"from the previous round's model (DynaSent §5.3). Pass the backbone instead: --base {origin}"
        )


def fresh_classifier(base: Path, labels: Sequence[str], family: Family) -> PreTrainedModel:
    """The base checkpoint's encoder under a newly initialised classification head.

    A plain backbone (MiniLM, RoBERTa) has no head, so Transformers initialises one; a base
    that carries a head (Model 0 from ``dynaloop model init``, a hub sentiment classifier) has
    its head replaced by freshly initialised weights, so no label knowledge carries over.
    """
    problem_type = "multi_label_classification" if family == "multi_label" else "single_label_classification"
    label_kwargs = {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
        "problem_type": problem_type,
    }
    try:
        model, loading = AutoModelForSequenceClassification.from_pretrained(
            base, local_files_only=True, ignore_mismatched_sizes=True, output_loading_info=True, **label_kwargs
        )
    except (OSError, ValueError) as exc:
        raise TrainingError(f"cannot load a Hugging Face checkpoint from {base}: {exc}") from exc
    prefix = model.base_model_prefix + "."
    head_keys = {key for key in model.state_dict() if not key.startswith(prefix)}
    if head_keys - set(loading["missing_keys"]):
        fresh = AutoModelForSequenceClassification.from_config(model.config)
        model.load_state_dict(
            {key: value for key, value in fresh.state_dict().items() if key in head_keys}, strict=False
        )
    return model


def _parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, object]]:
    # Biases and normalisation weights (the 1-d parameters) are not decayed.
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def weights_version(model: torch.nn.Module) -> str:
    """A short hash of the weights: the model's ``version`` changes exactly when they do."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:12]


# ---------------------------------------------------------------------------- progress


@dataclass
class TrainingProgress:
    """Where a run stands; saved with every checkpoint next to Accelerate's state."""

    fingerprint: str
    epoch: int = 1  # the epoch being run (1-based)
    batches_done: int = 0  # of that epoch, on each process
    global_step: int = 0  # optimizer steps so far
    best_dev_macro_f1: float | None = None
    best_epoch: int = 0
    epochs_without_improvement: int = 0
    stopped_early: bool = False
    history: list[EpochRecord] = field(default_factory=list)
    # The running epoch's sums, so a mid-epoch resume reports the whole epoch.
    loss_sum: float = 0.0
    loss_examples: float = 0.0
    epoch_seconds: float = 0.0

    def save(self, directory: Path) -> None:
        (directory / PROGRESS_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> TrainingProgress:
        saved = json.loads((directory / PROGRESS_FILE).read_text(encoding="utf-8"))
        saved["history"] = [EpochRecord(**record) for record in saved["history"]]
        return cls(**saved)


def _fingerprint(
    train_sets: Sequence[LabelledSet],
    dev: LabelledSet | None,
    labels: Sequence[str],
    family: Family,
    input_format: InputFormat,
    config: TrainConfig,
    num_processes: int,
) -> str:
    """What must not change between a checkpoint and its resumption (epochs and patience may)."""
    identity = {
        "labels": list(labels),
        "family": family,
        "input_format": input_format,
        "processes": num_processes,
        "train": [(s.sha256(), s.weight, s.upsample) for s in train_sets],
        "dev": dev.sha256() if dev is not None else None,
        "config": config.model_dump(
            mode="json",
            exclude={
                "epochs",
                "early_stopping_patience",
                "resume",
                "checkpoint_every",
                "cpu",
                "mixed_precision",
                "allow_unknown_tokens",
                "max_unknown_token_share",
            },
        ),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete checkpoint (its progress file is written last)."""
    folder = out_dir / CHECKPOINTS_DIR
    complete = [path for path in folder.glob("step-*") if (path / PROGRESS_FILE).is_file()]
    return max(complete, key=lambda path: int(path.name.split("-")[1]), default=None)


# ---------------------------------------------------------------------------- training


def train_model(
    train_sets: Sequence[LabelledSet],
    dev: LabelledSet | None,
    *,
    labels: Sequence[str],
    family: Family,
    input_format: InputFormat,
    config: TrainConfig,
    out_dir: Path | str,
    model_id: str,
    trained_for_round: int | None = None,
    task_name: str | None = None,
    exclusive_labels: Sequence[str] = (),
    progress: bool = True,
    on_epoch_end: Callable[[EpochRecord], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> TrainResult:
    """Train a classifier from the base checkpoint on ``train_sets``; write it to ``out_dir``.

    ``dev`` drives early stopping and the choice of the saved epoch (macro-F1); without it the
    last epoch is saved. ``exclusive_labels`` (multi-label: the task's, e.g. neutral) are never
    predicted with others, in the dev macro-F1 and by the saved model. ``on_epoch_end`` is
    called on every process after each epoch's checkpoint (an exception raised there
    interrupts the run, which ``resume`` continues).
    ``on_progress(step, total_steps)`` is called on the main process after every optimizer
    step (a job's progress bar); ``total_steps`` spans all planned epochs.
    """
    started = time.perf_counter()
    out_dir = Path(out_dir)
    labels = list(labels)
    base = config.resolved_base()
    if not base.is_dir():
        raise TrainingError(f"the base checkpoint {base} is not a folder")
    refuse_trained_base(base)
    _check_sets(train_sets, dev, labels, family, input_format)
    if not config.resume and out_dir.exists() and any(out_dir.iterdir()):
        raise TrainingError(f"{out_dir} is not empty; choose a new folder, or resume the run that is in it")
    class_weights = class_weights_for(train_sets, labels, config.class_weights, family=family)
    unknown_exclusive = [label for label in exclusive_labels if label not in labels]
    if unknown_exclusive:
        raise TrainingError(f"exclusive_labels {unknown_exclusive} are not among the labels {labels}")
    exclusive = [labels.index(label) for label in exclusive_labels] if family == "multi_label" else []
    try:
        tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TrainingError(f"cannot load the tokenizer of {base}: {exc}") from exc
    coverage = check_tokenizer_coverage(tokenizer, train_sets, dev, config)

    run = _Run.prepare(
        train_sets,
        dev,
        tokenizer,
        base,
        labels,
        family,
        input_format,
        config,
        out_dir,
        class_weights,
        coverage,
        exclusive,
    )
    resumed_from = run.resume(out_dir)
    state = run.state
    patience = config.early_stopping_patience
    # Derived, not restored: a resumed run may be given more patience.
    state.stopped_early = patience is not None and state.epochs_without_improvement >= patience
    while state.epoch <= config.epochs and not state.stopped_early:
        epoch = state.epoch
        run.train_epoch(epoch, progress=progress, on_progress=on_progress)
        record = run.end_epoch(epoch, dev)
        if on_epoch_end is not None:
            on_epoch_end(record)

    run.accelerator.wait_for_everyone()
    return run.write_model(
        out_dir,
        train_sets,
        dev,
        model_id=model_id,
        trained_for_round=trained_for_round,
        task_name=task_name,
        resumed_from=resumed_from,
        started=started,
    )


@dataclass
class _Run:
    """One training run on its prepared Accelerate objects (:meth:`prepare`): its epochs
    (:meth:`train_epoch`, :meth:`end_epoch`), checkpoints and resumption, and the model
    directory it writes (:meth:`write_model`)."""

    accelerator: Accelerator
    config: TrainConfig
    tokenizer: PreTrainedTokenizerBase
    base: Path
    labels: list[str]
    family: Family
    input_format: InputFormat
    max_length: int
    coverage: TokenCoverage
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_loader: DataLoader[TrainingItem]
    dev_loader: DataLoader[TrainingItem] | None
    sampler: UpsampledEpochs
    class_weights: torch.Tensor | None
    total_steps: int
    checkpoints: Path
    fingerprint: str
    exclusive: list[int]  # multi-label: the indices of the labels never predicted with others
    state: TrainingProgress = field(init=False)

    def __post_init__(self) -> None:
        self.state = TrainingProgress(fingerprint=self.fingerprint)

    @classmethod
    def prepare(
        cls,
        train_sets: Sequence[LabelledSet],
        dev: LabelledSet | None,
        tokenizer: PreTrainedTokenizerBase,
        base: Path,
        labels: list[str],
        family: Family,
        input_format: InputFormat,
        config: TrainConfig,
        out_dir: Path,
        class_weights: torch.Tensor | None,
        coverage: TokenCoverage,
        exclusive: list[int],
    ) -> _Run:
        """The accelerator, the model from the base checkpoint, the loaders, the optimizer and
        its schedule, prepared for this machine's processes."""
        accelerator = Accelerator(
            cpu=config.cpu,
            mixed_precision=config.mixed_precision,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=config.gradient_accumulation_steps),
        )
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > 1 and accelerator.num_processes == 1:
            # Otherwise every process would train alone and write the same folder.
            raise TrainingError(
                f"launched as {launched} processes but Accelerate runs only one: on CPUs pass "
                "--cpu (TrainConfig.cpu) so the processes train together over gloo"
            )
        set_seed(config.seed)
        out_dir.mkdir(parents=True, exist_ok=True)

        if coverage.exceeds(config.max_unknown_token_share):
            _warn(accelerator, "%s (training anyway: allow_unknown_tokens)", coverage.message("the training mix"))
        max_length = min(config.max_length, getattr(tokenizer, "model_max_length", None) or config.max_length)
        model = fresh_classifier(base, labels, family)
        collate = Collate(tokenizer, max_length, input_format)
        sampler = UpsampledEpochs(train_sets, config.seed)
        # Loaders draw a seed when an iterator starts; their own generator keeps that draw out of
        # the global RNG, so a run resumed mid-epoch sees the same dropout masks as one never cut.
        train_loader = DataLoader(
            MixDataset(train_sets),
            batch_size=config.batch_size,
            sampler=sampler,
            collate_fn=collate,
            generator=torch.Generator().manual_seed(config.seed),
        )
        dev_loader = None
        if dev is not None:
            dev_loader = DataLoader(
                MixDataset([dev]),
                batch_size=config.batch_size * 2,
                sampler=[(0, row) for row in range(len(dev))],
                collate_fn=collate,
                generator=torch.Generator().manual_seed(config.seed),
            )
        optimizer = torch.optim.AdamW(_parameter_groups(model, config.weight_decay), lr=config.learning_rate)
        # Built before prepare(): Accelerate steps a prepared scheduler once per process, so the
        # schedule is counted in unsharded batches.
        steps_per_epoch = math.ceil(len(train_loader) / config.gradient_accumulation_steps)
        total_steps = steps_per_epoch * config.epochs
        scheduler = get_linear_schedule_with_warmup(optimizer, round(config.warmup_ratio * total_steps), total_steps)
        model, optimizer, train_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, scheduler)
        if dev_loader is not None:
            dev_loader = accelerator.prepare(dev_loader)
        if class_weights is not None:
            class_weights = class_weights.to(accelerator.device)
        fingerprint = _fingerprint(train_sets, dev, labels, family, input_format, config, accelerator.num_processes)
        return cls(
            accelerator=accelerator,
            config=config,
            tokenizer=tokenizer,
            base=base,
            labels=labels,
            family=family,
            input_format=input_format,
            max_length=max_length,
            coverage=coverage,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            train_loader=train_loader,
            dev_loader=dev_loader,
            sampler=sampler,
            class_weights=class_weights,
            total_steps=total_steps,
            checkpoints=out_dir / CHECKPOINTS_DIR,
            fingerprint=fingerprint,
            exclusive=exclusive,
        )

    def resume(self, out_dir: Path) -> int | None:
        """With ``config.resume``, continue from the newest checkpoint in ``out_dir`` (made with the
        same data and hyperparameters); the optimizer step it resumed from, or None."""
        if not self.config.resume:
            return None
        checkpoint = latest_checkpoint(out_dir)
        if checkpoint is None:
            _info(self.accelerator, "no checkpoint in %s; starting from the base checkpoint", self.checkpoints)
            return None
        saved = TrainingProgress.load(checkpoint)
        if saved.fingerprint != self.fingerprint:
            raise TrainingError(
                f"the checkpoint {checkpoint} was made with other data or hyperparameters (only epochs and "
                f"patience may change on resume); start a new output folder instead"
            )
        self.accelerator.load_state(str(checkpoint))
        self.state = saved
        _info(
            self.accelerator,
            "resuming from %s: epoch %d, %d batches done",
            checkpoint.name,
            saved.epoch,
            saved.batches_done,
        )
        return saved.global_step

    def save_checkpoint(self) -> None:
        folder = self.checkpoints / f"step-{self.state.global_step:08d}"
        self.accelerator.save_state(str(folder))
        if self.accelerator.is_main_process:
            self.state.save(folder)  # last: marks the checkpoint complete
            for old in self.checkpoints.glob("step-*"):
                if old != folder:
                    shutil.rmtree(old, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def compute_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.family == "multi_label":
            return multi_label_bce(logits, y, self.class_weights)
        return soft_cross_entropy(logits, y, self.class_weights)

    def train_epoch(self, epoch: int, *, progress: bool, on_progress: Callable[[int, int], None] | None) -> None:
        """The optimizer steps of ``epoch`` (from where a resumed run stopped), with a checkpoint
        every ``config.checkpoint_every`` steps."""
        accelerator, config, state, model = self.accelerator, self.config, self.state, self.model
        model.train()
        self.sampler.use_epoch(epoch)
        loader = (
            accelerator.skip_first_batches(self.train_loader, state.batches_done)
            if state.batches_done
            else self.train_loader
        )
        bar = tqdm(
            total=len(self.train_loader),
            initial=state.batches_done,
            desc=f"epoch {epoch}/{config.epochs}",
            unit="batch",
            leave=False,
            disable=not (progress and accelerator.is_local_main_process),
        )
        tick = time.perf_counter()
        for batch in loader:
            y, weight = batch.pop("y"), batch.pop("weight")
            with accelerator.accumulate(model):
                logits = model(**batch).logits
                per_example = self.compute_loss(logits, y)
                loss = (per_example * weight).mean()
                accelerator.backward(loss)
                if accelerator.sync_gradients and config.max_grad_norm is not None:
                    accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
            state.batches_done += 1
            state.loss_sum += float(loss.detach()) * len(y)
            state.loss_examples += len(y)
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}")
            if accelerator.sync_gradients:
                state.global_step += 1
                if on_progress is not None and accelerator.is_main_process:
                    on_progress(min(state.global_step, self.total_steps), self.total_steps)
                if (
                    isinstance(config.checkpoint_every, int)
                    and state.global_step % config.checkpoint_every == 0
                    and state.batches_done < len(self.train_loader)
                ):
                    state.epoch_seconds += time.perf_counter() - tick
                    self.save_checkpoint()
                    tick = time.perf_counter()
        bar.close()
        state.epoch_seconds += time.perf_counter() - tick

    def end_epoch(self, epoch: int, dev: LabelledSet | None) -> EpochRecord:
        """Score ``epoch`` on dev, keep its weights when they are the best so far, decide on early
        stopping, and checkpoint the run at the epoch's end."""
        accelerator, config, state = self.accelerator, self.config, self.state
        totals = accelerator.reduce(
            torch.tensor([state.loss_sum, state.loss_examples], device=accelerator.device), "sum"
        )
        loss_sum, examples = totals.tolist()
        dev_f1 = dev_per_class = None
        if dev is not None and self.dev_loader is not None:
            dev_f1, dev_per_class = _dev_scores(
                accelerator, self.model, self.dev_loader, dev, self.family, self.exclusive
            )
        record = EpochRecord(
            epoch=epoch,
            train_loss=loss_sum / max(examples, 1.0),
            dev_macro_f1=dev_f1,
            examples=int(examples),
            seconds=round(state.epoch_seconds, 3),
            examples_per_second=examples / max(state.epoch_seconds, 1e-9),
            dev_f1_per_class=dev_per_class,
        )
        improved = dev_f1 is not None and (state.best_dev_macro_f1 is None or dev_f1 > state.best_dev_macro_f1)
        if improved:
            state.best_dev_macro_f1, state.best_epoch, state.epochs_without_improvement = dev_f1, epoch, 0
            accelerator.save_model(self.model, str(self.checkpoints / BEST_WEIGHTS_DIR))
        elif dev_f1 is not None:
            state.epochs_without_improvement += 1
        else:
            state.best_epoch = epoch
        state.history.append(record)
        patience = config.early_stopping_patience
        state.stopped_early = patience is not None and state.epochs_without_improvement >= patience
        state.epoch, state.batches_done = epoch + 1, 0
        state.loss_sum = state.loss_examples = state.epoch_seconds = 0.0
        self.save_checkpoint()
        dev_text = "" if dev_f1 is None else f", dev macro-F1 {dev_f1:.4f}{' (best)' if improved else ''}"
        _info(
            accelerator,
            "epoch %d/%d: train loss %.4f%s, %.1f examples/s",
            epoch,
            config.epochs,
            record.train_loss,
            dev_text,
            record.examples_per_second,
        )
        if state.stopped_early:
            _info(
                accelerator,
                "early stop: no better dev macro-F1 for %d epochs; keeping epoch %d",
                state.epochs_without_improvement,
                state.best_epoch,
            )
        return record

    def write_model(
        self,
        out_dir: Path,
        train_sets: Sequence[LabelledSet],
        dev: LabelledSet | None,
        *,
        model_id: str,
        trained_for_round: int | None,
        task_name: str | None,
        resumed_from: int | None,
        started: float,
    ) -> TrainResult:
        """Write the best epoch's weights (the last epoch's without dev), the tokenizer and
        ``dynaloop_model.json`` with the run's history to ``out_dir``."""
        accelerator, config, state = self.accelerator, self.config, self.state
        labels, exclusive, coverage = self.labels, self.exclusive, self.coverage
        final = accelerator.unwrap_model(self.model)
        if state.best_dev_macro_f1 is not None:
            load_checkpoint_in_model(final, str(self.checkpoints / BEST_WEIGHTS_DIR))
        history = list(state.history)
        train_seconds = sum(record.seconds for record in history)
        examples_per_second = sum(record.examples for record in history) / max(train_seconds, 1e-9)
        wall_seconds = time.perf_counter() - started
        summary = {
            "epochs_run": len(history),
            "best_epoch": state.best_epoch,
            "best_dev_macro_f1": state.best_dev_macro_f1,
            "stopped_early": state.stopped_early,
            "resumed_from_step": resumed_from,
            "examples_per_second": examples_per_second,
            "wall_seconds": wall_seconds,
            "best_dev_f1_per_class": next(
                (record.dev_f1_per_class for record in history if record.epoch == state.best_epoch), None
            ),
            "tokenizer_coverage": coverage.to_dict(),
        }
        best_per_class = next((record.dev_f1_per_class for record in history if record.epoch == state.best_epoch), None)
        low_f1 = low_f1_warning(best_per_class, config.class_weights)
        if low_f1 is not None:
            _warn(accelerator, "warning: %s", low_f1)
        metadata = ModelMetadata(
            model_id=model_id,
            version=weights_version(final),
            labels=labels,
            family=self.family,
            input_format=self.input_format,
            max_length=self.max_length,
            base_model=str(self.base),
            trained_for_round=trained_for_round,
            task=task_name,
            exclusive_labels=[labels[j] for j in exclusive],
            data={
                "train": [labelled.summary() for labelled in train_sets],
                "dev": dev.summary() if dev is not None else None,
            },
            hyperparameters=config.recorded(),
            training={
                **summary,
                "low_f1_classes": low_f1_classes(best_per_class),
                "low_f1_warning": low_f1,
                "history": [asdict(record) for record in history],
                "from_scratch": True,
                "processes": accelerator.num_processes,
                "device": str(accelerator.device),
                "mixed_precision": accelerator.mixed_precision,
                "versions": _versions(),
            },
        )
        if accelerator.is_main_process:
            final.save_pretrained(out_dir)
            self.tokenizer.save_pretrained(out_dir)
            metadata.save(out_dir)
        accelerator.wait_for_everyone()
        _info(accelerator, "wrote %s (version %s, best epoch %d)", out_dir, metadata.version, state.best_epoch)
        return TrainResult(
            out_dir=out_dir,
            metadata=metadata,
            history=history,
            best_epoch=state.best_epoch,
            best_dev_macro_f1=state.best_dev_macro_f1,
            stopped_early=state.stopped_early,
            resumed_from_step=resumed_from,
            examples_per_second=examples_per_second,
            wall_seconds=wall_seconds,
            tokenizer_coverage=coverage,
            unknown_token_warning=(
                coverage.message("the training mix") if coverage.exceeds(config.max_unknown_token_share) else None
            ),
            low_f1_warning=low_f1,
        )


def check_tokenizer_coverage(
    tokenizer: PreTrainedTokenizerBase,
    train_sets: Sequence[LabelledSet],
    dev: LabelledSet | None,
    config: TrainConfig,
) -> TokenCoverage:
    """The share of the mix's tokens (train and dev texts) that ``tokenizer`` maps to its unknown
    token; a :class:`TrainingError` above ``config.max_unknown_token_share`` unless
    ``config.allow_unknown_tokens`` (docs/training.md, "Tokenizer coverage")."""
    texts = (text for labelled in [*train_sets, *([dev] if dev is not None else [])] for text in labelled.texts)
    coverage = token_coverage(tokenizer, texts)
    if coverage.exceeds(config.max_unknown_token_share) and not config.allow_unknown_tokens:
        raise TrainingError(
            f"{coverage.message('the training mix')} Refusing to train above "
            f"{config.max_unknown_token_share:.0%} (DYNALOOP_MAX_UNKNOWN_TOKEN_SHARE); to train anyway pass "
            "--allow-unknown-tokens (`allow_unknown_tokens: true` in a train job's params)."
        )
    return coverage


@torch.no_grad()
def _dev_scores(
    accelerator: Accelerator,
    model: torch.nn.Module,
    loader: DataLoader,
    dev: LabelledSet,
    family: Family,
    exclusive: Sequence[int] = (),
) -> tuple[float, dict[str, float]]:
    """Dev macro-F1 (early stopping watches it) and each class's F1, the exclusive labels
    (EthioEmo's neutral) never predicted with others."""
    model.eval()
    chunks = []
    for batch in loader:
        del batch["y"], batch["weight"]
        logits = model(**batch).logits.float()
        scores = torch.sigmoid(logits) if family == "multi_label" else logits
        chunks.append(accelerator.gather_for_metrics(scores).cpu())
    model.train()
    scores = torch.cat(chunks).numpy()
    return (
        macro_f1(dev.y, scores, family=family, exclusive=exclusive),
        per_class_f1(dev.y, scores, dev.labels, family=family, exclusive=exclusive),
    )


def _info(accelerator: Accelerator, message: str, *args: object) -> None:
    if accelerator.is_main_process:
        logger.info(message, *args)


def _warn(accelerator: Accelerator, message: str, *args: object) -> None:
    if accelerator.is_main_process:
        logger.warning(message, *args)


def _versions() -> dict[str, str]:
    import accelerate
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "accelerate": accelerate.__version__}
