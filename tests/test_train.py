"""Retraining from scratch (rounds/models/train.py) with a tiny random BERT and toy labelled sets."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from typer.testing import CliRunner

from model_server.backends import ClassifyInput, load_backend
from model_server.directory import ModelMetadata
from rounds.models.datasets import LabelledSet
from rounds.models.init_model import init_model_dir
from rounds.models.metrics import macro_f1
from rounds.models.train import (
    EpochRecord,
    Family,
    InputFormat,
    TrainConfig,
    TrainingError,
    TrainResult,
    UpsampledEpochs,
    class_weights_for,
    fresh_classifier,
    latest_checkpoint,
    multi_label_bce,
    soft_cross_entropy,
    train_model,
)

SENTIMENT = ["negative", "neutral", "positive"]
EMOTIONS = ["anger", "joy", "sadness"]
CUES = {
    "negative": "awful terrible",
    "neutral": "table chair",
    "positive": "great lovely",
    "anger": "furious",
    "joy": "delighted",
    "sadness": "tearful",
}


def sentiment_set(
    n: int,
    *,
    name: str = "toy",
    seed: int = 0,
    soft: bool = False,
    weight: float = 1.0,
    upsample: int = 1,
    targets: bool = False,
) -> LabelledSet:
    """Sentences whose class shows in a cue word; ``soft`` puts 20% of the mass on a neighbour."""
    rng = np.random.default_rng(seed)
    gold = [i % 3 for i in range(n)]
    texts = [f"the {CUES[SENTIMENT[g]].split()[rng.integers(2)]} place number {rng.integers(1000)}" for g in gold]
    y = np.zeros((n, 3), dtype=np.float32)
    for i, g in enumerate(gold):
        y[i, g] = 1.0
        if soft:
            y[i, g], y[i, (g + 1) % 3] = 0.8, 0.2
    return LabelledSet(
        name=name,
        labels=SENTIMENT,
        multi_label=False,
        texts=texts,
        y=y,
        weight=weight,
        upsample=upsample,
        targets=[["food", "service"][i % 2] for i in range(n)] if targets else None,
    )


def emotion_set(n: int, seed: int = 0) -> LabelledSet:
    rng = np.random.default_rng(seed)
    y = (rng.random((n, 3)) < 0.4).astype(np.float32)
    texts = [
        " ".join(["I am"] + [CUES[label] for label, on in zip(EMOTIONS, row, strict=True) if on] + ["today"])
        for row in y
    ]
    return LabelledSet(name="emotions", labels=EMOTIONS, multi_label=True, texts=texts, y=y)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Model 0 as `dynaloop model init --tiny` makes it: untrained, so a valid base."""
    folder = tmp_path_factory.mktemp("tiny") / "base"
    init_model_dir(folder, labels=SENTIMENT, tiny=True, seed=0)
    return folder


def config(base: Path, **overrides: object) -> TrainConfig:
    values: dict[str, object] = {
        "base": base,
        "epochs": 2,
        "batch_size": 8,
        "learning_rate": 5e-3,
        "warmup_ratio": 0.0,
        "max_length": 32,
        "seed": 0,
        "cpu": True,
    }
    return TrainConfig(**(values | overrides))  # type: ignore[arg-type]


def train(
    train_sets: list[LabelledSet],
    dev: LabelledSet | None,
    out: Path,
    cfg: TrainConfig,
    *,
    family: Family = "single_label",
    input_format: InputFormat = "text",
    **kwargs: Any,
) -> TrainResult:
    return train_model(
        train_sets,
        dev,
        labels=train_sets[0].labels,
        family=family,
        input_format=input_format,
        config=cfg,
        out_dir=out,
        model_id="toy-model",
        trained_for_round=2,
        task_name="toy-task",
        progress=False,
        **kwargs,
    )


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def same_weights(a: Path, b: Path) -> bool:
    first, second = weights(a), weights(b)
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


# ---------------------------------------------------------------------------- losses


def test_soft_cross_entropy_on_one_hot_targets_is_cross_entropy() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 3)
    gold = torch.tensor([0, 1, 2, 2, 1, 0])
    one_hot = F.one_hot(gold, 3).float()
    assert torch.allclose(soft_cross_entropy(logits, one_hot), F.cross_entropy(logits, gold, reduction="none"))
    class_weights = torch.tensor([0.5, 2.0, 1.5])
    assert torch.allclose(
        soft_cross_entropy(logits, one_hot, class_weights),
        F.cross_entropy(logits, gold, weight=class_weights, reduction="none"),
    )


def test_soft_cross_entropy_on_a_distribution_is_the_expectation_over_labels() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 3)
    distribution = torch.tensor([[0.6, 0.2, 0.2], [0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3], [0.0, 0.0, 1.0]])
    per_label = torch.stack([F.cross_entropy(logits, torch.full((4,), c), reduction="none") for c in range(3)], dim=1)
    assert torch.allclose(soft_cross_entropy(logits, distribution), (distribution * per_label).sum(dim=1))


def test_multi_label_loss_is_bce_with_logits_per_label() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.0]])
    targets = torch.tensor([[1.0, 0.0, 0.5]])
    expected = F.binary_cross_entropy_with_logits(logits, targets)
    assert torch.allclose(multi_label_bce(logits, targets), expected.unsqueeze(0))


def test_balanced_class_weights_come_from_the_soft_label_mass() -> None:
    y = np.array([[1, 0, 0], [1, 0, 0], [0.5, 0.5, 0], [0, 0, 1]], dtype=np.float32)  # mass 2.5, 0.5, 1
    mix = [LabelledSet(name="a", labels=SENTIMENT, multi_label=False, texts=list("abcd"), y=y)]
    weights_ = class_weights_for(mix, SENTIMENT, "balanced", family="single_label")
    assert weights_ is not None
    assert torch.allclose(weights_, torch.tensor([4 / (3 * 2.5), 4 / (3 * 0.5), 4 / (3 * 1.0)]))
    # Upsampling and loss weights count as label mass: a 2x-upsampled copy of the same set
    # doubles every class's mass and leaves the balanced weights unchanged.
    doubled = [LabelledSet(name="a", labels=SENTIMENT, multi_label=False, texts=list("abcd"), y=y, upsample=2)]
    assert torch.allclose(class_weights_for(doubled, SENTIMENT, "balanced", family="single_label"), weights_)
    assert class_weights_for(mix, SENTIMENT, "none", family="single_label") is None
    explicit = class_weights_for(mix, SENTIMENT, {"neutral": 3.0}, family="single_label")
    assert explicit is not None and explicit.tolist() == [1.0, 3.0, 1.0]
    with pytest.raises(TrainingError, match="not among the labels"):
        class_weights_for(mix, SENTIMENT, {"mixed": 2.0}, family="single_label")
    multi = [
        LabelledSet(
            name="m",
            labels=EMOTIONS,
            multi_label=True,
            texts=list("abcd"),
            y=np.array([[1, 0, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=np.float32),
        )
    ]
    pos_weight = class_weights_for(multi, EMOTIONS, "balanced", family="multi_label")
    assert pos_weight is not None and torch.allclose(pos_weight, torch.tensor([1 / 3, 3.0, 3.0]))


def test_macro_f1_single_and_multi_label() -> None:
    y = np.eye(3)[[0, 1, 2, 2]]
    assert macro_f1(y, np.eye(3)[[0, 1, 2, 2]], family="single_label") == 1.0
    assert macro_f1(y, np.eye(3)[[0, 0, 0, 0]], family="single_label") == pytest.approx(
        0.4 / 3
    )  # F1 of class 0: 2 * 0.25 / 1.25
    multi = np.array([[1, 0], [1, 1]])
    assert macro_f1(multi, np.array([[0.9, 0.1], [0.8, 0.7]]), family="multi_label") == 1.0


# ---------------------------------------------------------------------------- data


def test_an_epoch_repeats_each_source_by_its_upsampling_factor() -> None:
    once, thrice = sentiment_set(10, name="once"), sentiment_set(4, name="thrice", upsample=3)
    sampler = UpsampledEpochs([once, thrice], seed=7)
    sampler.use_epoch(1)
    first = list(sampler)
    assert len(first) == len(sampler) == 10 + 3 * 4
    counts = Counter(first)
    assert all(counts[(0, row)] == 1 for row in range(10))
    assert all(counts[(1, row)] == 3 for row in range(4))
    per_set = Counter(set_index for set_index, _ in first)
    assert per_set == {0: 10, 1: 12}
    sampler.use_epoch(2)
    second = list(sampler)
    assert Counter(second) == counts and second != first  # same mix, new order each epoch
    sampler.use_epoch(1)
    assert list(sampler) == first  # and the same order for the same seed and epoch


# ---------------------------------------------------------------------------- model


def test_a_base_with_a_head_gets_a_fresh_head(tiny_base: Path) -> None:
    base = weights(tiny_base)
    model = fresh_classifier(tiny_base, SENTIMENT, "single_label")
    state = model.state_dict()
    assert torch.equal(
        state["bert.encoder.layer.0.attention.self.query.weight"],
        base["bert.encoder.layer.0.attention.self.query.weight"],
    )
    assert not torch.equal(state["classifier.weight"], base["classifier.weight"])
    assert model.config.id2label == dict(enumerate(SENTIMENT))


def test_a_trained_model_is_refused_as_base(tiny_base: Path, tmp_path: Path) -> None:
    result = train([sentiment_set(12)], None, tmp_path / "round2", config(tiny_base, epochs=1))
    with pytest.raises(TrainingError, match="retrained from scratch") as refused:
        train([sentiment_set(12)], None, tmp_path / "round3", config(result.out_dir))
    assert "DynaSent §5.3" in str(refused.value) and f"--base {tiny_base}" in str(refused.value)
    assert not (tmp_path / "round3").exists()
    # A hand-made directory that only says which round it served is refused too.
    marked = tmp_path / "marked"
    init_model_dir(marked, labels=SENTIMENT, tiny=True)
    metadata = json.loads((marked / "dynaloop_model.json").read_text())
    (marked / "dynaloop_model.json").write_text(json.dumps(metadata | {"trained_for_round": 1}))
    with pytest.raises(TrainingError, match="trained for round 1"):
        train([sentiment_set(12)], None, tmp_path / "round4", config(marked))


def test_bad_inputs_are_refused_before_training(tiny_base: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="no targets"):
        train([sentiment_set(12)], None, tmp_path / "a", config(tiny_base), input_format="text_pair")
    with pytest.raises(TrainingError, match="not a folder"):
        train([sentiment_set(12)], None, tmp_path / "b", config(tmp_path / "missing"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.txt").write_text("x")
    with pytest.raises(TrainingError, match="not empty"):
        train([sentiment_set(12)], None, tmp_path / "full", config(tiny_base))


# ---------------------------------------------------------------------------- a full run


@pytest.fixture(scope="module")
def single_label_run(
    tiny_base: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[TrainResult, list[LabelledSet], LabelledSet]:
    """Soft labels, a 3x-upsampled second source with half the loss weight, class weights, dev set."""
    out = tmp_path_factory.mktemp("run") / "model"
    mix = [
        sentiment_set(36, name="round 1 train", soft=True),
        sentiment_set(12, name="sst", seed=1, weight=0.5, upsample=3),
    ]
    dev = sentiment_set(15, name="round 1 dev", seed=2)
    result = train(mix, dev, out, config(tiny_base, epochs=3, class_weights="balanced"))
    return result, mix, dev


def test_a_run_trains_on_the_upsampled_mix_and_keeps_the_best_epoch(
    single_label_run: tuple[TrainResult, list[LabelledSet], LabelledSet],
) -> None:
    result, _, dev = single_label_run
    assert [record.epoch for record in result.history] == [1, 2, 3]
    assert all(record.examples == 36 + 3 * 12 for record in result.history)
    assert result.history[-1].train_loss < result.history[0].train_loss
    best = max(result.history, key=lambda record: record.dev_macro_f1)
    assert result.best_epoch == best.epoch and result.best_dev_macro_f1 == best.dev_macro_f1
    # The saved weights are the best epoch's: scoring them again gives its dev macro-F1.
    backend = load_backend(result.out_dir, device="cpu")
    outputs = backend.predict([ClassifyInput(text) for text in dev.texts])
    scores = np.array([[output.probabilities[label] for label in SENTIMENT] for output in outputs])
    assert macro_f1(dev.y, scores, family="single_label") == pytest.approx(result.best_dev_macro_f1)
    assert latest_checkpoint(result.out_dir) is not None


def test_the_model_directory_records_data_hyperparameters_and_training(
    single_label_run: tuple[TrainResult, list[LabelledSet], LabelledSet],
) -> None:
    result, mix, dev = single_label_run
    metadata = ModelMetadata.load(result.out_dir)
    assert metadata == result.metadata
    assert (metadata.model_id, metadata.labels, metadata.family, metadata.input_format) == (
        "toy-model",
        SENTIMENT,
        "single_label",
        "text",
    )
    assert metadata.trained_for_round == 2 and metadata.task == "toy-task" and metadata.max_length == 32
    assert len(metadata.version) == 12 and metadata.version != "0"
    extra = metadata.model_extra or {}
    train_sources = extra["data"]["train"]
    assert [(s["name"], s["rows"], s["weight"], s["upsample"]) for s in train_sources] == [
        ("round 1 train", 36, 1.0, 1),
        ("sst", 12, 0.5, 3),
    ]
    assert train_sources[0]["sha256"] == mix[0].sha256()
    assert train_sources[1]["label_counts"] == {"negative": 4, "neutral": 4, "positive": 4}
    assert extra["data"]["dev"]["sha256"] == dev.sha256()
    assert extra["hyperparameters"]["class_weights"] == "balanced"
    assert extra["hyperparameters"]["epochs"] == 3 and extra["hyperparameters"]["seed"] == 0
    training = extra["training"]
    assert training["from_scratch"] is True and training["epochs_run"] == 3
    assert training["best_dev_macro_f1"] == result.best_dev_macro_f1 and training["examples_per_second"] > 0
    assert training["wall_seconds"] > 0 and len(training["history"]) == 3


def test_the_model_server_loads_the_output(
    single_label_run: tuple[TrainResult, list[LabelledSet], LabelledSet],
) -> None:
    result, _, _ = single_label_run
    backend = load_backend(result.out_dir, device="cpu")
    [output] = backend.predict([ClassifyInput("the great lovely place")])
    assert output.labels[0] in SENTIMENT and sum(output.probabilities.values()) == pytest.approx(1.0)
    assert backend.metadata.version == result.metadata.version


# ---------------------------------------------------------------------------- families


def test_a_multi_label_model_trains_and_its_loss_decreases(tmp_path: Path) -> None:
    base = tmp_path / "base"
    init_model_dir(base, labels=EMOTIONS, family="multi_label", tiny=True)
    emotions = emotion_set(48)
    result = train(
        [emotions],
        emotion_set(12, seed=1),
        tmp_path / "out",
        config(base, epochs=3, learning_rate=1e-2),
        family="multi_label",
    )
    losses = [record.train_loss for record in result.history]
    assert losses[-1] < losses[0]
    assert result.metadata.family == "multi_label"
    backend = load_backend(result.out_dir, device="cpu")
    [output] = backend.predict([ClassifyInput("I am furious today")])
    assert set(output.labels) <= set(EMOTIONS) and len(output.probabilities) == 3


def test_a_sentence_pair_model_trains(tiny_base: Path, tmp_path: Path) -> None:
    pairs = sentiment_set(24, targets=True)
    result = train(
        [pairs], sentiment_set(9, seed=3, targets=True), tmp_path / "out", config(tiny_base), input_format="text_pair"
    )
    assert result.metadata.input_format == "text_pair" and len(result.history) == 2
    backend = load_backend(result.out_dir, device="cpu")
    [output] = backend.predict([ClassifyInput("the food was great, the service awful", target="service")])
    assert output.labels[0] in SENTIMENT


# ---------------------------------------------------------------------------- runs


def test_early_stopping_stops_when_dev_macro_f1_stops_improving(tiny_base: Path, tmp_path: Path) -> None:
    # With a learning rate of 0 the dev macro-F1 never changes: epoch 1 is best, and with a
    # patience of 2 the run stops after epoch 3 of 10.
    seen: list[EpochRecord] = []
    result = train(
        [sentiment_set(16)],
        sentiment_set(6, seed=1),
        tmp_path / "out",
        config(tiny_base, epochs=10, learning_rate=0.0, early_stopping_patience=2),
        on_epoch_end=seen.append,
    )
    assert [record.epoch for record in seen] == [1, 2, 3]
    assert result.stopped_early and result.best_epoch == 1 and result.epochs_run == 3


def test_training_is_reproducible_for_a_seed(tiny_base: Path, tmp_path: Path) -> None:
    mix, dev = [sentiment_set(24)], sentiment_set(6, seed=1)
    first = train(mix, dev, tmp_path / "first", config(tiny_base))
    again = train(mix, dev, tmp_path / "again", config(tiny_base))
    other = train(mix, dev, tmp_path / "other", config(tiny_base, seed=1))
    assert same_weights(first.out_dir, again.out_dir) and first.metadata.version == again.metadata.version
    assert [r.train_loss for r in first.history] == [r.train_loss for r in again.history]
    assert not same_weights(first.out_dir, other.out_dir) and first.metadata.version != other.metadata.version


class Interrupted(RuntimeError):
    pass


def test_an_interrupted_run_resumes_to_the_same_model(tiny_base: Path, tmp_path: Path) -> None:
    """A run killed after epoch 1 of 2 and resumed equals the uninterrupted run exactly:
    weights, optimizer, scheduler and RNG states come back from the checkpoint."""
    mix, dev = [sentiment_set(24)], sentiment_set(6, seed=1)
    whole = train(mix, dev, tmp_path / "whole", config(tiny_base, early_stopping_patience=None))

    def crash(record: EpochRecord) -> None:
        if record.epoch == 1:
            raise Interrupted

    with pytest.raises(Interrupted):
        train(mix, dev, tmp_path / "cut", config(tiny_base, early_stopping_patience=None), on_epoch_end=crash)
    seen: list[EpochRecord] = []
    resumed = train(
        mix,
        dev,
        tmp_path / "cut",
        config(tiny_base, early_stopping_patience=None, resume=True),
        on_epoch_end=seen.append,
    )
    assert [record.epoch for record in seen] == [2]  # only the missing epoch ran
    assert resumed.resumed_from_step == 3 and resumed.epochs_run == 2
    assert same_weights(whole.out_dir, resumed.out_dir)
    assert [r.train_loss for r in whole.history] == [r.train_loss for r in resumed.history]


class FlakyTexts(list):
    """Texts that fail on the n-th read: a crash in the middle of an epoch."""

    def __init__(self, texts: list[str], fail_after: int) -> None:
        super().__init__(texts)
        self.reads, self.fail_after = 0, fail_after

    def __getitem__(self, index):
        self.reads += 1
        if self.reads > self.fail_after:
            raise Interrupted
        return super().__getitem__(index)


def test_a_run_cut_mid_epoch_resumes_from_its_step_checkpoint(tiny_base: Path, tmp_path: Path) -> None:
    mix = sentiment_set(48)  # 6 batches of 8 per epoch; checkpoints after steps 2 and 4
    cfg = config(tiny_base, epochs=1, checkpoint_every=2)
    whole = train([mix], None, tmp_path / "whole", cfg)
    flaky = sentiment_set(48)
    # Dies while reading batch 6, which Accelerate's loader fetches before handing out batch 5.
    flaky.texts = FlakyTexts(flaky.texts, fail_after=5 * 8 + 3)
    with pytest.raises(Interrupted):
        train([flaky], None, tmp_path / "cut", cfg)
    assert latest_checkpoint(tmp_path / "cut").name == "step-00000004"  # type: ignore[union-attr]
    resumed = train([mix], None, tmp_path / "cut", config(tiny_base, epochs=1, checkpoint_every=2, resume=True))
    assert resumed.resumed_from_step == 4
    assert same_weights(whole.out_dir, resumed.out_dir)
    assert resumed.history[0].train_loss == pytest.approx(whole.history[0].train_loss)


def test_resuming_with_more_epochs_continues_from_the_checkpoint(tiny_base: Path, tmp_path: Path) -> None:
    """Extending a finished 1-epoch run to 2 epochs runs only epoch 2 from the saved state. It is
    not the same model as a 2-epoch run from the start: the first epoch's learning-rate schedule
    was planned for one epoch."""
    mix = [sentiment_set(24)]
    one = train(mix, None, tmp_path / "out", config(tiny_base, epochs=1, learning_rate=1e-2))
    first_epoch = weights(one.out_dir)
    seen: list[EpochRecord] = []
    two = train(
        mix,
        None,
        tmp_path / "out",
        config(tiny_base, epochs=2, learning_rate=1e-2, resume=True),
        on_epoch_end=seen.append,
    )
    assert [record.epoch for record in seen] == [2] and two.resumed_from_step == 3
    assert two.history[0] == one.history[0] and two.epochs_run == 2
    assert not torch.equal(weights(two.out_dir)["classifier.weight"], first_epoch["classifier.weight"])
    with pytest.raises(TrainingError, match="other data or hyperparameters"):
        train(mix, None, tmp_path / "out", config(tiny_base, epochs=3, learning_rate=1e-3, resume=True))


# ---------------------------------------------------------------------------- command line


def test_round_train_command_trains_on_a_star_rated_file_and_registers_the_model(tmp_path: Path) -> None:
    from dynaloop.cli import app as cli

    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'train.db'}"
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", url]).exit_code == 0
    assert runner.invoke(cli, ["task", "create", "dynasent-r2", "--database-url", url]).exit_code == 0
    words = {1: "awful", 2: "bad", 3: "okay", 4: "good", 5: "wonderful"}
    rows = [f"The {words[stars]} dinner number {i}.,{stars}" for i, stars in enumerate([1, 2, 3, 4, 5] * 6)]
    (tmp_path / "reviews.csv").write_text("text,stars\n" + "\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "mix.yaml").write_text(
        "train:\n"
        "  - file: reviews.csv\n    label_column: stars\n    upsample: 2\n"
        "    label_map: {'1': negative, '2': negative, '3': neutral, '4': positive, '5': positive}\n"
        "dev:\n"
        "  file: reviews.csv\n  label_column: stars\n  limit: 10\n"
        "  label_map: {'1': negative, '2': negative, '3': neutral, '4': positive, '5': positive}\n",
        encoding="utf-8",
    )
    out = tmp_path / "model"
    args = [
        "round",
        "train",
        "--task",
        "dynasent-r2",
        "--mix",
        str(tmp_path / "mix.yaml"),
        "--out",
        str(out),
        "--round",
        "2",
        "--tiny",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--learning-rate",
        "0.005",
        "--class-weights",
        "balanced",
        "--cpu",
        "--no-check-precision",  # tests/test_jobs.py::TINY_TRAIN says why
        "--database-url",
        url,
    ]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "reviews.csv — 30 rows, weight 1.0, ×2" in result.output
    assert "registered model version" in result.output
    metadata = ModelMetadata.load(out)
    assert metadata.model_id == "dynasent-r2-for-round-2" and metadata.trained_for_round == 2
    assert metadata.labels == ["positive", "negative", "neutral"]  # the task's order
    assert (metadata.model_extra or {})["data"]["train"][0]["label_counts"] == {
        "positive": 12,
        "negative": 12,
        "neutral": 6,
    }
    from sqlalchemy import select

    from services.db.engine import make_engine, make_sessionmaker
    from services.db.models import ModelVersion

    with make_sessionmaker(make_engine(url))() as session:
        [version] = session.scalars(select(ModelVersion)).all()
        assert (version.model_id, version.version, version.trained_for_round) == (
            metadata.model_id,
            metadata.version,
            2,
        )

    # Errors: a clear message and exit code 1, no traceback.
    refused = runner.invoke(
        cli, [*args[:6], "--out", str(tmp_path / "again"), "--base", str(out), "--database-url", url]
    )
    assert refused.exit_code == 1 and "retrained from scratch" in refused.output
    assert "Traceback" not in refused.output
    missing = runner.invoke(
        cli,
        [
            "round",
            "train",
            "--task",
            "dynasent-r2",
            "--mix",
            str(tmp_path / "none.yaml"),
            "--out",
            str(tmp_path / "x"),
            "--tiny",
            "--database-url",
            url,
        ],
    )
    assert missing.exit_code == 1 and "cannot read the data mix" in missing.output
    (tmp_path / "bad.yaml").write_text("train:\n  - file: reviews.csv\n    label_column: stars\n", encoding="utf-8")
    unmapped = runner.invoke(
        cli,
        [
            "round",
            "train",
            "--task",
            "dynasent-r2",
            "--mix",
            str(tmp_path / "bad.yaml"),
            "--out",
            str(tmp_path / "y"),
            "--tiny",
            "--database-url",
            url,
        ],
    )
    assert unmapped.exit_code == 1 and "label_map" in unmapped.output
    no_task = runner.invoke(
        cli,
        [
            "round",
            "train",
            "--task",
            "nope",
            "--mix",
            str(tmp_path / "mix.yaml"),
            "--out",
            str(tmp_path / "z"),
            "--tiny",
            "--database-url",
            url,
        ],
    )
    assert no_task.exit_code == 1 and "no task 'nope'" in no_task.output
    # The options share the limits of a train job's params (rounds.models.usecases.TrainOptions).
    for bad, field in [
        (["--epochs", "0"], "epochs"),
        (["--model-id", "no spaces"], "model_id"),
        (["--checkpoint-every", "0"], "checkpoint_every"),
    ]:
        invalid = runner.invoke(cli, [*args[:6], "--out", str(tmp_path / "w"), "--tiny", *bad, "--database-url", url])
        assert invalid.exit_code == 1 and f"invalid training settings: {field}" in invalid.output, invalid.output
    assert not (tmp_path / "w").exists()
