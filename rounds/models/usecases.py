"""The model lifecycle's long operations, one function each, called alike by the `dynaloop`
command (``dynaloop/commands/``), the jobs runner (:mod:`rounds.models.job_runner`) and the API:

* :func:`train_and_register`: retrain from the base checkpoint on a data mix, then register the
  model as *trained* (docs/training.md);
* :func:`evaluate_and_record`: score a model on the built rounds' dev and test splits and the
  mix's sets, write the report, then record it so the model is *evaluated* (docs/evaluation.md);
* :func:`promote_model`: hot-swap a model server to a registered model, then mark it *promoted*;
  or, without a server, mark it *promoted* and wait for the replicas that follow the task to
  load it (docs/models.md).

Each takes one options schema (:class:`TrainOptions`, :class:`EvaluateOptions`,
:class:`PromoteOptions`; a job's ``params`` are validated with the same schema), returns a
typed result, and tells a listener what it is doing; the listeners' methods do nothing, and a
front end overrides the ones it shows (the command prints, a job writes its progress). Errors
are raised, never printed: :class:`~services.errors.DomainError`,
:class:`~rounds.models.datasets.DataError`, :class:`~rounds.models.train.TrainingError`,
:class:`~rounds.models.errors.EvaluationError`, :class:`~model_server.directory.ModelMetadataError`,
pydantic's ``ValidationError`` and ``OSError``; each front end says them its own way.

The heavy libraries (PyTorch, transformers) are imported inside the operations, so the API,
which validates a job's options here, never loads them.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.orm import Session, sessionmaker

from rounds.models.datasets import DataFiles, DataMix, SourceSpec
from rounds.models.evaluation_sets import built_round_numbers
from rounds.models.promotion import RELOAD_TIMEOUT_S, Promotion, promote
from rounds.models.registry import record_evaluation, register_retrained
from services.db.engine import session_scope
from services.db.models import ModelVersion, Task, User
from services.domain.tasks import definition_of, get_task
from services.errors import DomainError, Invalid
from services.extras import needs_extra
from services.settings import get_settings
from services.taskdef import TaskDefinition, TrainingDefaults

if TYPE_CHECKING:
    from model_server.directory.runtime import PrecisionCheck
    from rounds.models.datasets import LabelledSet
    from rounds.models.evaluate import Baseline, Evaluation
    from rounds.models.train import EpochRecord, TrainConfig, TrainResult

logger = logging.getLogger(__name__)

__all__ = [
    "EvaluateOptions",
    "EvaluatedModel",
    "EvaluationListener",
    "PromoteOptions",
    "RegisteredModel",
    "TrainOptions",
    "TrainedModel",
    "TrainingListener",
    "default_mix",
    "evaluate_and_record",
    "promote_model",
    "train_and_register",
]

MODEL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


@dataclass(frozen=True)
class RegisteredModel:
    """A registry row as the operations report it (detached from any session)."""

    id: int
    name: str
    model_id: str
    version: str
    status: str
    directory: str

    @classmethod
    def of(cls, model: ModelVersion) -> RegisteredModel:
        return cls(
            id=model.id,
            name=model.name,
            model_id=model.model_id,
            version=model.version,
            status=model.status.value,
            directory=model.directory,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _actor(session: Session, actor_id: int | None) -> User | None:
    return session.get(User, actor_id) if actor_id is not None else None


def default_mix(session: Session, task: Task) -> DataMix:
    """Every built round's train split, and the newest built round's dev split (DynaSent §5.3:
    the next model trains on all rounds at once)."""
    numbers = built_round_numbers(session, task)
    if not numbers:
        raise Invalid(
            f"task {task.name!r} has no built round to train on; close a round and build it first "
            "(POST /rounds/{id}/build), or give a `mix`"
        )
    return DataMix(
        train=[SourceSpec(round=n, split="train") for n in numbers], dev=SourceSpec(round=numbers[-1], split="dev")
    )


# --- train and register --------------------------------------------------------------------


class TrainOptions(BaseModel):
    """What `dynaloop round train` and a ``train`` job take (docs/training.md)."""

    model_config = ConfigDict(extra="forbid")

    mix: DataMix | None = Field(
        None,
        description="A data mix (the YAML of `dynaloop round train --mix`, as JSON). Default: every "
        "built round's train split, and the newest built round's dev split for early stopping.",
    )
    epochs: int | None = Field(
        None, ge=1, le=1000, description="Default: the task YAML's `training.epochs` (3 when it has none)."
    )
    batch_size: int = Field(32, ge=1, le=4096)
    learning_rate: float | None = Field(
        None, gt=0, le=1, description="Default: the task YAML's `training.learning_rate` (2e-5 when it has none)."
    )
    max_length: int = Field(128, ge=8, le=8192)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    class_weights: Literal["none", "balanced"] | dict[str, float] | None = Field(
        None,
        description="none, balanced (from the mix's label mass) or {label: weight}; default: the task "
        "YAML's `training.class_weights` (none when it has none).",
    )
    allow_unknown_tokens: bool = Field(
        False,
        description="Train even when more than DYNALOOP_MAX_UNKNOWN_TOKEN_SHARE of the mix's tokens are the "
        'backbone tokenizer\'s unknown token (docs/training.md, "Tokenizer coverage").',
    )
    patience: int = Field(2, ge=0, le=1000, description="Epochs without a better dev macro-F1; 0: never stop early.")
    gradient_accumulation_steps: int = Field(1, ge=1, le=4096, description="Batches per optimizer step.")
    checkpoint_every: int | Literal["epoch"] = Field(
        "epoch", description="A resumable checkpoint every N optimizer steps, or at each epoch's end."
    )
    resume: bool = Field(False, description="Continue the run in the output folder from its newest checkpoint.")
    round: int | None = Field(None, ge=1, description="The round this model will serve (the next one to collect).")
    base: str | None = Field(
        None,
        max_length=1000,
        description="Backbone checkpoint folder; default: the "
        "packaged MiniLM. Never a model dynaloop trained (DynaSent §5.3).",
    )
    model_id: str | None = Field(
        None,
        min_length=1,
        max_length=150,
        pattern=MODEL_ID_PATTERN,
        description="Default: TASK-for-round-N, or a name from the output folder.",
    )
    cpu: bool = Field(False, description="Train on the CPU even when a GPU is present.")
    check_precision: bool = Field(
        True,
        description="After training, score the dev set at bf16 and int8 against fp32 and record it in the model "
        "directory (dynaloop_precision.json): the model server's --precision auto uses only what it admits.",
    )
    tiny: bool = Field(False, description="Tests only: a tiny random BERT replaces the base.")
    kind: Literal["encoder", "linear"] = Field(
        "encoder",
        description="encoder: fine-tune the backbone (base); linear: a class-balanced character and word n-gram "
        "TF-IDF + logistic regression (scikit-learn) that reads any script and trains in seconds on a CPU, "
        "for scripts the backbone's tokenizer cannot read and as Model 0 without a GPU (docs/training.md, "
        '"The linear kind"). The encoder\'s epochs, batch size, learning rate, base and precision check do not '
        "apply to it.",
    )

    @field_validator("class_weights")
    @classmethod
    def _positive_weights(cls, value: Any) -> Any:
        if isinstance(value, dict) and any(w <= 0 for w in value.values()):
            raise ValueError("class weights must be positive")
        return value

    @field_validator("checkpoint_every")
    @classmethod
    def _positive_steps(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("checkpoint_every must be a positive number of steps or 'epoch'")
        return value

    def with_task_defaults(self, defaults: TrainingDefaults) -> TrainOptions:
        """These options with the task YAML's ``training`` defaults where they name no epochs,
        learning rate or class weights (docs/training.md, "The task's defaults")."""
        return self.model_copy(
            update={
                "epochs": self.epochs if self.epochs is not None else defaults.epochs,
                "learning_rate": self.learning_rate if self.learning_rate is not None else defaults.learning_rate,
                "class_weights": self.class_weights if self.class_weights is not None else defaults.class_weights,
            }
        )

    def train_config(
        self,
        base: Path | None,
        *,
        task_defaults: TrainingDefaults | None = None,
        max_unknown_token_share: float | None = None,
    ) -> TrainConfig:
        """The trainer's hyperparameters, with ``base`` (the tiny base of ``tiny`` runs) as the backbone,
        the task's training defaults (``TrainingDefaults()`` when none are given) where the options name
        none, and the settings' unknown-token limit."""
        from model_server.directory.tokenizer_coverage import DEFAULT_MAX_UNKNOWN_TOKEN_SHARE
        from rounds.models.train import TrainConfig

        resolved = self.with_task_defaults(task_defaults if task_defaults is not None else TrainingDefaults())
        assert resolved.epochs is not None and resolved.learning_rate is not None
        return TrainConfig(
            base=base,
            epochs=resolved.epochs,
            batch_size=self.batch_size,
            learning_rate=resolved.learning_rate,
            max_length=self.max_length,
            seed=self.seed,
            class_weights=resolved.class_weights if resolved.class_weights is not None else "none",
            early_stopping_patience=self.patience or None,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            cpu=self.cpu,
            checkpoint_every=self.checkpoint_every,
            resume=self.resume,
            allow_unknown_tokens=self.allow_unknown_tokens,
            max_unknown_token_share=(
                DEFAULT_MAX_UNKNOWN_TOKEN_SHARE if max_unknown_token_share is None else max_unknown_token_share
            ),
        )


class TrainingListener:
    """What :func:`train_and_register` reports while it runs; every method does nothing here."""

    def data_loaded(self, train_sets: Sequence[LabelledSet], dev: LabelledSet | None) -> None:
        """The mix is read: its training sources and the dev set (None: the last epoch is kept)."""

    def step(self, step: int, total: int) -> None:
        """After every optimizer step (main process); ``total`` spans all planned epochs."""

    def epoch_ended(self, record: EpochRecord) -> None:
        """After each epoch's checkpoint (every process)."""

    def trained(self, result: TrainResult) -> None:
        """The model directory is written; registering it comes next (main process only)."""


@dataclass(frozen=True)
class TrainedModel:
    out_dir: Path
    training: TrainResult
    #: The registry row; None on the other processes of a distributed run (`accelerate launch`),
    #: where only the main process registers.
    model: RegisteredModel | None
    #: What bf16 and int8 did on the dev set (rounds.models.precision_check); None: not checked.
    precision_check: PrecisionCheck | None = None
    #: The registered model (``model_id@version``) whose weights this run reproduced: the model is
    #: registered as ``VERSION.2`` (rounds.models.registry.register_retrained); None: new weights.
    same_weights_as: str | None = None


def _register(
    factory: sessionmaker[Session], task_name: str, out_dir: Path, actor_id: int | None
) -> tuple[RegisteredModel, str | None]:
    """Register the model just trained into ``out_dir`` (:func:`register_retrained`), and the name
    of the registered model whose weights it reproduces, or None."""
    with session_scope(factory) as session:
        model, same_weights_as = register_retrained(
            session, get_task(session, task_name), out_dir, actor=_actor(session, actor_id)
        )
        registered = RegisteredModel.of(model)
    return registered, same_weights_as


def _train_encoder(
    train_sets: list[LabelledSet],
    dev: LabelledSet | None,
    *,
    labels: list[str],
    family: Literal["single_label", "multi_label"],
    input_format: Literal["text", "text_pair"],
    options: TrainOptions,
    definition: TaskDefinition,
    out_dir: Path,
    model_id: str,
    task_name: str,
    listener: TrainingListener,
    progress_bar: bool,
) -> TrainResult:
    """Fine-tune the encoder (from ``options.base``, or a tiny random base made for the run) on
    ``train_sets`` into ``out_dir``."""
    from rounds.models import train
    from rounds.models.init_model import init_model_dir

    with tempfile.TemporaryDirectory(prefix="dynaloop-tiny-base-") as scratch:
        base = Path(options.base) if options.base else None
        if options.tiny:
            base = Path(scratch) / "base"
            init_model_dir(base, labels=labels, family=family, tiny=True, seed=options.seed)
        result = train.train_model(
            train_sets,
            dev,
            labels=labels,
            family=family,
            input_format=input_format,
            config=options.train_config(
                base,
                task_defaults=definition.training,
                max_unknown_token_share=get_settings().max_unknown_token_share,
            ),
            out_dir=out_dir,
            model_id=model_id,
            trained_for_round=options.round,
            task_name=task_name,
            exclusive_labels=definition.exclusive_labels if definition.is_multi_label else (),
            progress=progress_bar,
            on_epoch_end=listener.epoch_ended,
            on_progress=listener.step,
        )
    return result


def train_and_register(
    factory: sessionmaker[Session],
    task_name: str,
    options: TrainOptions,
    out_dir: Path,
    *,
    data_files: DataFiles,
    actor_id: int | None = None,
    unnamed_model_id: str | None = None,
    listener: TrainingListener | None = None,
    progress_bar: bool = False,
) -> TrainedModel:
    """Train a fresh classifier for task ``task_name`` on ``options.mix`` (default:
    :func:`default_mix`) into ``out_dir``, then register it as *trained*.

    The mix's files are read only where ``data_files`` allows (the API's jobs: uploads and the data
    root; the `dynaloop` command: any path). The model's ``model_id`` is ``options.model_id``,
    else ``TASK-for-round-N`` when the options name the round it will serve, else
    ``unnamed_model_id`` (default ``TASK-OUTDIR``). A run that reproduces the weights of a
    registered model (same base, data and seed) is registered as a new version of it
    (:func:`~rounds.models.registry.register_retrained`), never refused after the training."""
    with needs_extra("training"):
        from accelerate import PartialState

    from rounds.models.datasets import input_format, load_source, model_labels

    listener = listener or TrainingListener()
    with factory() as session:
        task = get_task(session, task_name)
        mix = options.mix or default_mix(session, task)
        data_files.resolve(mix, session=session, task=task)
        definition = definition_of(task)
        labels = model_labels(definition)
        multi = definition.is_multi_label
        train_sets = [
            load_source(spec, labels=labels, multi_label=multi, session=session, task=task) for spec in mix.train
        ]
        dev = (
            None
            if mix.dev is None
            else load_source(mix.dev, labels=labels, multi_label=multi, session=session, task=task)
        )
        pair_input = input_format(definition)
    listener.data_loaded(train_sets, dev)
    family: Literal["single_label", "multi_label"] = "multi_label" if multi else "single_label"
    model_id = options.model_id or (
        f"{task_name}-for-round-{options.round}" if options.round else unnamed_model_id or f"{task_name}-{out_dir.name}"
    )
    if options.kind == "linear":
        from rounds.models.linear import train_linear

        result = train_linear(
            train_sets,
            dev,
            labels=labels,
            family=family,
            input_format=pair_input,
            out_dir=out_dir,
            model_id=model_id,
            trained_for_round=options.round,
            task_name=task_name,
            exclusive_labels=definition.exclusive_labels if multi else (),
            seed=options.seed,
        )
        record_mix(out_dir, mix, train_sets)
        listener.trained(result)
        registered, same_weights_as = _register(factory, task_name, out_dir, actor_id)
        return TrainedModel(out_dir=out_dir, training=result, model=registered, same_weights_as=same_weights_as)
    result = _train_encoder(
        train_sets,
        dev,
        labels=labels,
        family=family,
        input_format=pair_input,
        options=options,
        definition=definition,
        out_dir=out_dir,
        model_id=model_id,
        task_name=task_name,
        listener=listener,
        progress_bar=progress_bar,
    )
    if not PartialState().is_main_process:  # `accelerate launch`: one process registers the model
        return TrainedModel(out_dir=out_dir, training=result, model=None)
    record_mix(out_dir, mix, train_sets)
    listener.trained(result)
    check = _check_precision_on_dev(out_dir, dev) if options.check_precision else None
    registered, same_weights_as = _register(factory, task_name, out_dir, actor_id)
    return TrainedModel(
        out_dir=out_dir, training=result, model=registered, precision_check=check, same_weights_as=same_weights_as
    )


#: The key of dynaloop_model.json that records the data mix a model was trained on (as JSON), so that
#: `round evaluate` can train the linear baseline on the same mix.
MIX_KEY = "mix"


def record_mix(out_dir: Path, mix: DataMix, train_sets: Sequence[LabelledSet]) -> None:
    """Add the mix's train sources to ``out_dir``'s dynaloop_model.json (:data:`MIX_KEY`), each
    round source pinned to the build it was read from (a later build of the round is other data)."""
    from model_server.directory import ModelMetadata

    pinned = [
        spec.model_copy(update={"build_id": labelled.origin.get("build_id")})
        if spec.round is not None and spec.build_id is None
        else spec
        for spec, labelled in zip(mix.train, train_sets, strict=True)
    ]
    recorded = DataMix(train=pinned).model_dump(mode="json", exclude_defaults=True)
    metadata = ModelMetadata.load(out_dir)
    ModelMetadata.model_validate({**metadata.model_dump(mode="json"), MIX_KEY: recorded}).save(out_dir)


def _check_precision_on_dev(out_dir: Path, dev: LabelledSet | None) -> PrecisionCheck | None:
    """The precision check on the dev set, recorded in ``out_dir``; None without a dev set. A check
    that fails is logged and leaves the model as trained (auto then serves it at fp32)."""
    from rounds.models.precision_check import CheckTexts, check_precisions

    if dev is None or not len(dev):
        return None
    try:
        check = check_precisions(out_dir, CheckTexts.of_labelled(dev))
    except Exception:  # the check is advice for serving; the trained model stands without it
        logger.exception("the precision check of %s on %s failed; auto will serve it at fp32", out_dir, dev.name)
        return None
    check.save(out_dir)
    return check


# --- evaluate and record -------------------------------------------------------------------


class EvaluateOptions(BaseModel):
    """What `dynaloop round evaluate` and an ``evaluate`` job take (docs/evaluation.md)."""

    model_config = ConfigDict(extra="forbid")

    mix: DataMix | None = Field(None, description="A data mix: its dev and evaluate sources are evaluated too.")
    rounds: list[Annotated[int, Field(ge=1)]] | None = Field(
        None,
        description="Built rounds whose dev and test splits are evaluated; default: every built round; "
        "[]: none (only the mix's sets).",
    )
    positive_label: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Binary tasks: the class whose F1 is reported (default: the task YAML's "
        "`positive_label`, else a label named positive/sarcastic/..., else the one whose not_/non_ form "
        "is the other, else the second label).",
    )
    batch_size: int = Field(64, ge=1, le=4096)
    device: str | None = Field(
        None,
        max_length=20,
        pattern=r"^[a-z]+(:[0-9]+)?$",
        description="cpu, cuda, cuda:1, ...; default: cuda when present.",
    )
    record: bool = Field(True, description="Store the results in the model registry (trained -> evaluated).")
    precision: Literal["fp32", "bf16", "int8", "auto"] = Field(
        "fp32",
        description='What the forward passes run at (docs/models.md, "Precision"); the evaluation records it. '
        "fp32 scores the weights as trained.",
    )
    baseline: bool = Field(
        True,
        description="Also train the linear model kind on the model's own training mix (recorded in its "
        "dynaloop_model.json; else every built round's train split) and report it beside the model on every "
        'set (docs/evaluation.md, "Baseline").',
    )

    def extra_sources(self) -> list[SourceSpec]:
        """The mix's dev and evaluate sources, evaluated after the rounds' splits."""
        if self.mix is None:
            return []
        return [spec for spec in [self.mix.dev, *self.mix.evaluate] if spec is not None]


class EvaluationListener:
    """What :func:`evaluate_and_record` reports while it runs; every method does nothing here."""

    def skipped(self, name: str) -> None:
        """A set with no labelled examples is left out."""

    def evaluating(self, sets: Sequence[LabelledSet]) -> None:
        """The model is about to predict these sets."""

    def training_baseline(self, trained_on: str) -> None:
        """The linear baseline is about to be trained on ``trained_on`` (in words)."""

    def written(self, evaluation: Evaluation, files: Sequence[Path]) -> None:
        """The scores are computed and the report's files written."""

    def recording(self) -> None:
        """The evaluation goes to the registry next (only with ``record``)."""


@dataclass(frozen=True)
class EvaluatedModel:
    evaluation: Evaluation
    out_dir: Path
    files: list[Path]
    #: The registry row after recording; None without ``record``.
    model: RegisteredModel | None


def evaluate_and_record(
    factory: sessionmaker[Session],
    task_name: str,
    model_dir: Path,
    options: EvaluateOptions,
    out_dir: Path,
    *,
    data_files: DataFiles,
    actor_id: int | None = None,
    listener: EvaluationListener | None = None,
    progress_bar: bool = False,
) -> EvaluatedModel:
    """Evaluate the model in ``model_dir`` on the chosen rounds' dev and test splits and the mix's
    sets (DynaSent Table 5b; the mix's files read only where ``data_files`` allows), write
    ``evaluation.md``, ``evaluation.json`` and the plots to
    ``out_dir``, and with ``options.record`` store the results in the registry.

    Should the registry refuse the evaluation, the error says that the files are written."""
    from model_server.directory import ModelMetadata
    from rounds.models.evaluate import evaluate_model
    from rounds.models.evaluation_report import write_evaluation
    from rounds.models.evaluation_sets import load_evaluation_sets

    listener = listener or EvaluationListener()
    if not model_dir.is_dir():
        raise Invalid(f"model directory {model_dir} does not exist")
    ModelMetadata.load(model_dir)
    with factory() as session:
        task = get_task(session, task_name)
        data_files.resolve(options.mix, session=session, task=task)
        chosen = load_evaluation_sets(session, task, rounds=options.rounds, extra=options.extra_sources())
        definition = definition_of(task)
    for name in chosen.skipped:
        listener.skipped(name)
    if not chosen.sets:
        raise Invalid(
            f"nothing to evaluate: task {task_name!r} has no built round with labelled dev/test examples "
            "and no data mix with evaluate sources"
        )
    listener.evaluating(chosen.sets)
    evaluation = evaluate_model(
        model_dir,
        chosen.sets,
        human_f1=chosen.human_f1,
        positive_label=options.positive_label or definition.positive_label,
        batch_size=options.batch_size,
        device=options.device,
        progress=progress_bar,
        max_unknown_token_share=get_settings().max_unknown_token_share,
        precision=options.precision,
    )
    if not options.baseline:
        evaluation.baseline_note = "not asked for (baseline: false, `--no-baseline`)"
    else:
        evaluation.baseline, evaluation.baseline_note = _baseline(
            factory,
            task_name,
            model_dir,
            chosen.sets,
            evaluation,
            out_dir,
            data_files=data_files,
            human_f1=chosen.human_f1,
            listener=listener,
        )
    files = write_evaluation(evaluation, out_dir)
    listener.written(evaluation, files)
    if not options.record:
        return EvaluatedModel(evaluation=evaluation, out_dir=out_dir, files=files, model=None)
    listener.recording()
    try:
        with session_scope(factory) as session:
            model = record_evaluation(
                session, get_task(session, task_name), model_dir, evaluation.to_dict(), actor=_actor(session, actor_id)
            )
            recorded = RegisteredModel.of(model)
    except DomainError as exc:
        raise type(exc)(
            f"the evaluation files are written, but the model registry refused it: {exc.message}", **exc.details
        ) from exc
    return EvaluatedModel(evaluation=evaluation, out_dir=out_dir, files=files, model=recorded)


#: The folder of the evaluation's output that holds the linear baseline's model directory.
BASELINE_DIR = "baseline-linear"


def _baseline(
    factory: sessionmaker[Session],
    task_name: str,
    model_dir: Path,
    sets: Sequence[LabelledSet],
    evaluation: Evaluation,
    out_dir: Path,
    *,
    data_files: DataFiles,
    human_f1: dict[str, float],
    listener: EvaluationListener,
) -> tuple[Baseline | None, str | None]:
    """The linear model kind trained on the model's training mix (:data:`MIX_KEY` of its
    dynaloop_model.json, read where ``data_files`` allows; else every built round's train split)
    and evaluated on ``sets``; its model directory is kept in ``out_dir``/:data:`BASELINE_DIR`.
    Returns the baseline, or None and why there is none."""
    import shutil

    from pydantic import ValidationError

    from model_server.directory import METADATA_FILE, ModelMetadata
    from rounds.models.datasets import DataError, input_format, load_source, model_labels
    from rounds.models.evaluate import Baseline, evaluate_model
    from rounds.models.linear import train_linear
    from rounds.models.train import TrainingError

    metadata = ModelMetadata.load(model_dir)
    if metadata.kind == "linear":
        return None, "the evaluated model is of the linear kind: it is the baseline itself"
    extras = metadata.model_extra or {}
    recorded = extras.get(MIX_KEY)
    why_not_recorded = "the model's dynaloop_model.json records no training mix"
    with factory() as session:
        task = get_task(session, task_name)
        definition = definition_of(task)
        labels = model_labels(definition)
        multi = definition.is_multi_label
        train_sets: list[LabelledSet] | None = None
        if recorded:
            try:
                mix = DataMix.model_validate(recorded)
                data_files.resolve(mix, session=session, task=task, where="the model's recorded mix")
                train_sets = [
                    load_source(spec, labels=labels, multi_label=multi, session=session, task=task)
                    for spec in mix.train
                ]
                trained_on = "the evaluated model's own training mix (recorded in its dynaloop_model.json)"
            except (ValidationError, DataError, DomainError) as exc:
                why_not_recorded = f"the model's recorded training mix cannot be read again ({exc})"
        if train_sets is None:
            try:
                mix = default_mix(session, task)
                train_sets = [
                    load_source(spec, labels=labels, multi_label=multi, session=session, task=task)
                    for spec in mix.train
                ]
            except (DataError, DomainError) as exc:
                return None, f"no data to train it on: {why_not_recorded}, and {exc}"
            trained_on = f"every built round's train split ({why_not_recorded})"
        pair_input = input_format(definition)
    known = [
        str(entry.get("sha256")) for entry in (extras.get("data") or {}).get("train") or [] if isinstance(entry, dict)
    ]
    if known and sorted(known) != sorted(labelled.sha256() for labelled in train_sets):
        trained_on += "; these rows are not exactly the ones the model was trained on (their SHA-256 differ)"
    listener.training_baseline(trained_on)
    target = out_dir / BASELINE_DIR
    if target.exists() and (target / METADATA_FILE).is_file():
        shutil.rmtree(target)  # the baseline of an earlier evaluation into this folder
    try:
        train_linear(
            train_sets,
            None,
            labels=labels,
            family="multi_label" if multi else "single_label",
            input_format=pair_input,
            out_dir=target,
            model_id=f"{metadata.model_id}-baseline-linear",
            task_name=task_name,
            exclusive_labels=definition.exclusive_labels if multi else (),
        )
    except TrainingError as exc:
        return None, f"the linear model cannot be trained on {trained_on}: {exc}"
    scored = evaluate_model(
        target, sets, human_f1=human_f1, positive_label=evaluation.positive_label or definition.positive_label
    )
    return (
        Baseline(
            evaluation=scored,
            trained_on=trained_on,
            train_sets=[labelled.summary() for labelled in train_sets],
            model_dir=str(target),
        ),
        None,
    )


# --- promote -------------------------------------------------------------------------------


class PromoteOptions(BaseModel):
    """What `dynaloop model promote` and a ``promote`` job take, besides the model (docs/models.md)."""

    model_config = ConfigDict(extra="forbid")

    server: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        description="The registered model server to load the model (GET /api/v1/model-servers), e.g. model-0. "
        "Its URL and admin token come from the registry. Leave it out to promote to the replicas that follow "
        "the task (`dynaloop model-server --follow-task`): the promotion is recorded, then it waits until every "
        "live replica serves the model.",
    )
    force: bool = Field(False, description="Promote a model that was never evaluated.")
    confirm_worse: bool = Field(
        False,
        description="Promote a model that scores below the promoted one on a round's dev split, or within "
        "NEAR_CHANCE_MARGIN (0.05) of chance; without it such a promotion is refused (409 confirm_worse, with "
        "both scores).",
    )
    keep_round_servers: bool = Field(False, description="Do not put the server in the task's open rounds' loop.")
    backend: str | None = Field(
        None, min_length=1, max_length=100, description="Model server backend for the new model; default: the same."
    )
    timeout_s: float = Field(
        RELOAD_TIMEOUT_S,
        gt=0,
        le=86_400,
        description="How long the server (or, without one, the following replicas) may take to load the model.",
    )


def promote_model(
    factory: sessionmaker[Session],
    task_name: str,
    reference: str | int,
    options: PromoteOptions,
    *,
    actor_id: int | None = None,
    operator_admin_token: str | None = None,
) -> Promotion:
    """Put model ``reference`` (registry id, ``model_id@version`` or ``model_id``) of task
    ``task_name`` in the loop on the registered server ``options.server``, or, without one, on
    the replicas that follow the task: :func:`rounds.models.promotion.promote`. The admin token is
    the one registered with the server; ``operator_admin_token`` (`dynaloop model promote
    --admin-token`, an operator at the server's shell) overrides it. No request or job can give
    one. Without a server, :class:`~rounds.models.promotion.PromotionIncomplete` says which
    replicas did not load the model (the promotion stays recorded)."""
    return promote(
        factory,
        task_name,
        reference,
        server=options.server,
        admin_token=operator_admin_token,
        force=options.force,
        confirm_worse=options.confirm_worse,
        actor_id=actor_id,
        backend=options.backend,
        update_open_rounds=not options.keep_round_servers,
        timeout_s=options.timeout_s,
    )
