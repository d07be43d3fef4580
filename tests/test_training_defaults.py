"""The example tasks' training defaults (docs/training.md, "The task's defaults"), the target of a
target-dependent task in the encoder's input, and the warning for a class with a low dev F1
(docs/training.md, "Per-class F1 on dev")."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from model_server.backends import ClassifyInput, load_backend
from model_server.directory import ModelMetadata
from rounds.models.datasets import DataError, DataMix, SourceSpec, labelled_from_frame, read_table
from rounds.models.inference import predict_probabilities
from rounds.models.init_model import init_model_dir, minilm_dir
from rounds.models.train import Collate, TrainingItem, low_f1_classes, low_f1_warning
from rounds.models.usecases import TrainOptions
from services.taskdef import TrainingDefaults, example_path, load_task_definition, parse_task_definition

FIXTURE = Path(__file__).parent / "data" / "target_sentiment_news.csv"


def fixture_rows() -> list[dict[str, str]]:
    with FIXTURE.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


# ---------------------------------------------------------------------------- the task's defaults


def test_options_that_name_no_epochs_learning_rate_or_weights_take_the_tasks() -> None:
    mad = load_task_definition(example_path("mad-tsc")).training
    config = TrainOptions().train_config(None, task_defaults=mad)
    assert (config.epochs, config.learning_rate, config.class_weights) == (
        mad.epochs,
        mad.learning_rate,
        mad.class_weights,
    )
    named = TrainOptions(epochs=2, learning_rate=1e-4, class_weights="none").train_config(None, task_defaults=mad)
    assert (named.epochs, named.learning_rate, named.class_weights) == (2, 1e-4, "none")
    # A task YAML without a `training` section: 3 epochs, 2e-5, no class weights, as before.
    plain = TrainOptions().train_config(None, task_defaults=TrainingDefaults())
    assert (plain.epochs, plain.learning_rate, plain.class_weights) == (3, 2e-5, "none")


def test_a_task_yaml_sets_epochs_and_learning_rate_within_limits() -> None:
    text = example_path("mad-tsc").read_text(encoding="utf-8")
    changed = text.replace("  learning_rate: 5.0e-5\n  epochs: 4\n", "  learning_rate: 1.0e-4\n  epochs: 6\n")
    assert changed != text
    training = parse_task_definition(changed).training
    assert (training.learning_rate, training.epochs) == (1e-4, 6)
    with pytest.raises(Exception, match="epochs"):
        parse_task_definition(text.replace("  epochs: 4\n", "  epochs: 0\n"))


# ---------------------------------------------------------------------------- target marking


def test_a_csv_files_target_offsets_are_read_though_csv_cells_are_text(tmp_path: Path) -> None:
    """CSV and TSV cells are read as text; offset columns there ("12", "12.0") are whole numbers."""
    spec = SourceSpec(file=FIXTURE, target_column="target", target_start_column="from", target_end_column="to")
    labels = ["negative", "neutral", "positive"]
    loaded = labelled_from_frame(read_table(FIXTURE), labels=labels, multi_label=False, spec=spec)
    rows = fixture_rows()
    assert loaded.targets == [row["target"] for row in rows]
    assert loaded.target_spans == [(int(row["from"]), int(row["to"])) for row in rows]
    bad = FIXTURE.read_text(encoding="utf-8").replace(f",{rows[0]['from']},", ",one,", 1)
    (tmp_path / "bad.csv").write_text(bad, encoding="utf-8")
    with pytest.raises(DataError, match="row 1, columns `from`/`to`: the target's offsets must be whole numbers"):
        labelled_from_frame(read_table(tmp_path / "bad.csv"), labels=labels, multi_label=False, spec=spec)


def test_the_target_is_the_encoders_second_segment_in_training_and_in_the_model_server(tmp_path: Path) -> None:
    """MAD-TSC's sentence-pair input (§4.1): the target's tokens, and only they, are segment 1
    after the sentence, in the trainer's batches and in the model server's, token for token."""
    rows = fixture_rows()[:4]
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True)
    items: list[TrainingItem] = [
        {"text": row["text"], "target": row["target"], "y": np.zeros(3, dtype=np.float32), "weight": 1.0}
        for row in rows
    ]
    batch = Collate(tokenizer, 128, "text_pair")(items)
    for i, row in enumerate(rows):
        ids = batch["input_ids"][i][batch["attention_mask"][i] == 1]
        segments = batch["token_type_ids"][i][batch["attention_mask"][i] == 1]
        second = ids[segments == 1].tolist()
        assert second == [*tokenizer(row["target"], add_special_tokens=False)["input_ids"], tokenizer.sep_token_id]
        first = ids[segments == 0].tolist()
        sentence = tokenizer(row["text"], add_special_tokens=False)["input_ids"]
        assert first == [tokenizer.cls_token_id, *sentence, tokenizer.sep_token_id]

    init_model_dir(tmp_path / "m", labels=["negative", "neutral", "positive"], input_format="text_pair")
    backend = load_backend(tmp_path / "m", device="cpu")
    served, _ = backend.encode([ClassifyInput(row["text"], row["target"]) for row in rows])  # type: ignore[attr-defined]
    assert served["input_ids"].tolist() == batch["input_ids"].tolist()
    assert served["token_type_ids"].tolist() == batch["token_type_ids"].tolist()


# ---------------------------------------------------------------------------- low dev F1


def test_a_class_far_below_the_others_is_low_and_so_is_one_near_zero() -> None:
    # The case: a neutral dev F1 of 0.039 beside two classes around 0.7.
    per_class = {"negative": 0.71, "neutral": 0.039, "positive": 0.74}
    assert low_f1_classes(per_class) == ["neutral"]
    warning = low_f1_warning(per_class, "none")
    assert warning is not None
    assert "neutral 0.039" in warning and "nearly given up" in warning and "--class-weights balanced" in warning
    # Already balanced: the hint does not suggest what was done.
    balanced = low_f1_warning(per_class, "balanced")
    assert balanced is not None and "--class-weights" not in balanced and "--learning-rate" in balanced
    # Exactly 0: "never".
    never = low_f1_warning({"sarcastic": 0.0, "not_sarcastic": 0.8}, "none")
    assert never is not None and "never gets this class right" in never
    # Below a third of the macro-F1 though above 0.1 (0.15 < (0.15 + 0.9 + 0.9) / 3 / 3 = 0.217).
    assert low_f1_classes({"a": 0.15, "b": 0.9, "c": 0.9}) == ["a"]
    # Weak everywhere, none far below the others and none under 0.1: no warning.
    assert low_f1_classes({"a": 0.2, "b": 0.15, "c": 0.25}) == []
    assert low_f1_warning({"a": 0.2, "b": 0.15, "c": 0.25}, "none") is None
    # Two classes near zero are both named.
    assert low_f1_classes({"a": 0.05, "b": 0.02, "c": 0.9, "d": 0.8}) == ["a", "b"]
    assert low_f1_classes(None) == [] and low_f1_classes({}) == []


# ---------------------------------------------------------------------------- MAD-TSC, end to end


@pytest.mark.slow
def test_mad_tsc_defaults_train_on_pairs_and_predict_more_than_one_class(tmp_path: Path) -> None:
    """`round train --task mad-tsc` with nothing but the task's defaults, on news sentences shaped
    like MAD-TSC's (the packaged MiniLM, a few steps): the recorded hyperparameters are the YAML's,
    the input is (sentence, target), and the model predicts more than one class on the rows."""
    from dynaloop.cli import app as cli

    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'train.db'}"
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", url]).exit_code == 0
    assert runner.invoke(cli, ["task", "create", "mad-tsc", "--database-url", url]).exit_code == 0
    (tmp_path / "mix.yaml").write_text(
        f"train:\n  - file: {FIXTURE}\n    target_column: target\n    target_start_column: from\n"
        f"    target_end_column: to\ndev:\n  file: {FIXTURE}\n  target_column: target\n",
        encoding="utf-8",
    )
    assert DataMix.load(tmp_path / "mix.yaml").dev is not None
    out = tmp_path / "model"
    args = ["round", "train", "--task", "mad-tsc", "--mix", str(tmp_path / "mix.yaml"), "--out", str(out)]
    result = runner.invoke(cli, [*args, "--cpu", "--no-check-precision", "--database-url", url])
    assert result.exit_code == 0, result.output

    metadata = ModelMetadata.load(out)
    extra = metadata.model_extra or {}
    defaults = load_task_definition(example_path("mad-tsc")).training
    hyper = extra["hyperparameters"]
    assert (hyper["class_weights"], hyper["learning_rate"], hyper["epochs"]) == (
        defaults.class_weights,
        defaults.learning_rate,
        defaults.epochs,
    )
    assert metadata.input_format == "text_pair"
    rows = fixture_rows()
    probabilities = predict_probabilities(out, [r["text"] for r in rows], [r["target"] for r in rows])
    predicted = Counter(metadata.labels[i] for i in probabilities.argmax(axis=1))
    assert len(predicted) > 1, predicted
    # The warning is in the metadata and the output exactly when the rule finds a low class.
    training = extra["training"]
    low = low_f1_classes(training["best_dev_f1_per_class"])
    assert training["low_f1_classes"] == low
    assert (training["low_f1_warning"] is not None) is bool(low)
    assert ("warning: low dev F1 for" in " ".join(result.output.split())) is bool(low)
