"""The tokenizer coverage check (model_server/directory/tokenizer_coverage.py) with the real packaged
MiniLM tokenizer on Ge'ez text (Tigrinya and Amharic): task creation, `round train` (refuses
without --allow-unknown-tokens), evaluation and the model server all warn, naming the share."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from model_server.directory import ModelMetadata
from model_server.directory.tokenizer_coverage import (
    MAX_UNKNOWN_TOKEN_SHARE_ENV,
    default_backbone,
    load_tokenizer,
    max_unknown_token_share_from_env,
    token_coverage,
)
from rounds.models.datasets import LabelledSet
from rounds.models.evaluate import evaluate_model
from rounds.models.init_model import init_model_dir
from rounds.models.train import TrainConfig, TrainingError, low_f1_classes, train_model

# Our own sentences (not from a data set): Tigrinya and Amharic in Ge'ez script.
GEEZ = [
    "ሎሚ ጽቡቕ መዓልቲ እዩ፣ ኩሉ ሰብ ሕጉስ እዩ።",  # ti: today is a good day, everyone is happy.
    "እዚ ምግቢ ኣዝዩ ጥዑም እዩ።",  # ti: this food is very tasty.
    "ብዙሕ ሓዚነ ኣለኹ፣ ዓርከይ ከይዱ።",  # ti: I am very sad, my friend has left.
    "ኣብ ከተማና ዝናብ ይዘንብ ኣሎ።",  # ti: it is raining in our town.
    "ዛሬ በጣም ደስ ብሎኛል።",  # am: I am very happy today.
    "ደመወዛችንን እስካሁን አልከፈሉንም፤ በጣም ተናድጃለሁ!",  # am: they still have not paid our wages; I am furious!
    "በወንድሜ ሞት በጣም አዝኛለሁ።",  # am: I am deeply saddened by my brother's death.
    "ጠቅላይ ሚኒስትሩ ዛሬ ወደ ናይሮቢ ተጓዙ።",  # am: the Prime Minister travelled to Nairobi today.
]
ENGLISH = ["what a lovely morning", "the service was awful", "the table is by the window", "great food"]
LABELS = ["negative", "positive"]


@pytest.fixture(scope="module")
def minilm_tokenizer():  # type: ignore[no-untyped-def]
    return load_tokenizer(default_backbone())


def labelled(texts: list[str], name: str = "geez") -> LabelledSet:
    gold = [i % 2 for i in range(len(texts))]
    return LabelledSet(name, LABELS, False, list(texts), np.eye(2, dtype=np.float32)[gold])


def test_minilm_reads_almost_none_of_geez_script_and_all_of_english(minilm_tokenizer) -> None:  # type: ignore[no-untyped-def]
    geez = token_coverage(minilm_tokenizer, GEEZ)
    # Computed independently: every token id the tokenizer gives, compared with its [UNK] id.
    ids = minilm_tokenizer(GEEZ, add_special_tokens=False)["input_ids"]
    tokens = sum(len(row) for row in ids)
    unknown = sum(token == minilm_tokenizer.unk_token_id for row in ids for token in row)
    assert (geez.tokens, geez.unknown_tokens, geez.texts) == (tokens, unknown, len(GEEZ))
    assert geez.unknown_token == "[UNK]"
    assert geez.share > 0.8 and geez.exceeds(0.2)
    assert geez.texts_all_unknown == sum(all(t == minilm_tokenizer.unk_token_id for t in row) for row in ids) > 0
    message = geez.message()
    assert f"{geez.share:.0%} of tokens" in message and "[UNK]" in message
    assert "xlm-roberta-base" in message and "--base" in message

    english = token_coverage(minilm_tokenizer, ENGLISH)
    assert english.unknown_tokens == 0 and english.share == 0.0 and not english.exceeds(0.2)
    # Mixed text: the share is of all tokens, not of texts.
    mixed = token_coverage(minilm_tokenizer, [*ENGLISH, GEEZ[0]])
    assert 0 < mixed.share < geez.share
    empty = token_coverage(minilm_tokenizer, ["", "   "])
    assert empty.tokens == 0 and not empty.exceeds(0.0)


def test_a_byte_level_bpe_tokenizer_without_an_unknown_token_covers_everything(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # GPT-2-style byte-level BPE (trained here on a few lines: no hub access).
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(ENGLISH * 5, trainers.BpeTrainer(initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe)
    assert tokenizer.unk_token is None
    coverage = token_coverage(tokenizer, GEEZ)
    assert coverage.tokens > 0 and coverage.unknown_tokens == 0 and coverage.unknown_token is None
    assert coverage.share == 0.0 and not coverage.exceeds(0.0)


def test_the_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_UNKNOWN_TOKEN_SHARE_ENV, raising=False)
    assert max_unknown_token_share_from_env() == 0.2
    monkeypatch.setenv(MAX_UNKNOWN_TOKEN_SHARE_ENV, "0.5")
    assert max_unknown_token_share_from_env() == 0.5
    from services.settings import Settings

    assert Settings().max_unknown_token_share == 0.5
    monkeypatch.setenv(MAX_UNKNOWN_TOKEN_SHARE_ENV, "2")
    with pytest.raises(ValueError, match="from 0 to 1"):
        max_unknown_token_share_from_env()


# ---------------------------------------------------------------------------- training


def config(**overrides: object) -> TrainConfig:
    """The real MiniLM backbone (the default base), one short epoch on the CPU."""
    values: dict[str, object] = {"epochs": 1, "batch_size": 8, "max_length": 32, "cpu": True}
    return TrainConfig(**(values | overrides))  # type: ignore[arg-type]


def train(out: Path, cfg: TrainConfig, texts: list[str], dev_texts: list[str] | None = None):  # type: ignore[no-untyped-def]
    return train_model(
        [labelled(texts)],
        None if dev_texts is None else labelled(dev_texts, "dev"),
        labels=LABELS,
        family="single_label",
        input_format="text",
        config=cfg,
        out_dir=out,
        model_id="geez-model",
        progress=False,
    )


def test_training_on_geez_with_minilm_is_refused_unless_allowed(tmp_path: Path) -> None:
    with pytest.raises(TrainingError) as refused:
        train(tmp_path / "refused", config(), GEEZ)
    message = str(refused.value)
    assert "of tokens of the training mix are [UNK]" in message
    assert "--allow-unknown-tokens" in message and "xlm-roberta-base" in message
    assert not (tmp_path / "refused").exists(), "refused before anything is written"
    # A higher limit lets it through.
    train(tmp_path / "lenient", config(max_unknown_token_share=1.0), GEEZ)

    result = train(tmp_path / "allowed", config(allow_unknown_tokens=True), GEEZ, dev_texts=GEEZ[:4])
    assert result.tokenizer_coverage is not None and result.tokenizer_coverage.share > 0.8
    assert result.unknown_token_warning is not None and "[UNK]" in result.unknown_token_warning
    recorded = (ModelMetadata.load(tmp_path / "allowed").model_extra or {})["training"]["tokenizer_coverage"]
    assert recorded["unknown_tokens"] == result.tokenizer_coverage.unknown_tokens
    assert recorded["share"] == round(result.tokenizer_coverage.share, 4)


def test_english_training_records_full_coverage_and_per_class_dev_f1(tmp_path: Path) -> None:
    from sklearn.metrics import f1_score

    texts = ENGLISH * 3
    result = train(tmp_path / "out", config(learning_rate=0.0), texts, dev_texts=texts)
    assert result.unknown_token_warning is None and result.tokenizer_coverage.unknown_tokens == 0  # type: ignore[union-attr]
    per_class = result.best_dev_f1_per_class
    assert per_class is not None and list(per_class) == LABELS
    # The same figures from the saved model's own dev predictions, with scikit-learn.
    from rounds.models.inference import LoadedClassifier, predict_loaded

    model = LoadedClassifier.load(tmp_path / "out", device="cpu")
    probabilities = predict_loaded(model.model, model.tokenizer, model.metadata, texts, None, batch_size=8)
    expected = f1_score([i % 2 for i in range(len(texts))], probabilities.argmax(1), average=None, labels=[0, 1])
    assert [per_class[label] for label in LABELS] == pytest.approx(expected.tolist(), abs=1e-4)
    metadata = ModelMetadata.load(tmp_path / "out").model_extra or {}
    assert metadata["training"]["best_dev_f1_per_class"] == per_class
    assert metadata["training"]["history"][0]["dev_f1_per_class"] == per_class
    assert result.metrics()["best_dev_f1_per_class"] == per_class


# ---------------------------------------------------------------------------- evaluation, model server


@pytest.fixture(scope="module")
def minilm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("minilm") / "model"
    init_model_dir(folder, labels=LABELS, max_length=32)
    return folder


def test_evaluation_warns_in_json_and_markdown(minilm_model: Path, tmp_path: Path) -> None:
    from rounds.models.evaluation_report import write_evaluation

    evaluation = evaluate_model(minilm_model, [labelled(GEEZ)], device="cpu")
    assert len(evaluation.warnings) == 1 and "of tokens of the evaluated sets are [UNK]" in evaluation.warnings[0]
    assert evaluation.tokenizer_coverage is not None and evaluation.tokenizer_coverage["share"] > 0.8
    write_evaluation(evaluation, tmp_path)
    written = json.loads((tmp_path / "evaluation.json").read_text(encoding="utf-8"))
    assert written["warnings"] == evaluation.warnings and written["tokenizer_coverage"]["share"] > 0.8
    assert f"**Warning:** {evaluation.warnings[0]}" in (tmp_path / "evaluation.md").read_text(encoding="utf-8")

    english = evaluate_model(minilm_model, [labelled(ENGLISH, "english")], device="cpu")
    assert english.warnings == [] and english.tokenizer_coverage["share"] == 0.0  # type: ignore[index]


def test_the_model_server_backend_logs_unreadable_requests(
    minilm_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from model_server.backends import ClassifyInput, load_backend

    backend = load_backend(minilm_model, "transformers", device="cpu")
    caplog.set_level(logging.WARNING, logger="model_server.backends.transformers_backend")
    backend.predict([ClassifyInput(text) for text in ENGLISH])
    assert not caplog.records and backend.requests_over_unknown_limit == 0  # type: ignore[attr-defined]
    outputs = backend.predict([ClassifyInput(text) for text in GEEZ])
    assert len(outputs) == len(GEEZ)
    assert backend.requests_over_unknown_limit == 1  # type: ignore[attr-defined]
    (record,) = caplog.records
    assert "of tokens of a request's texts are [UNK]" in record.getMessage()
    assert "xlm-roberta-base" in record.getMessage()
    backend.predict([ClassifyInput(GEEZ[0])])  # counted, not logged again within the interval
    assert backend.requests_over_unknown_limit == 2 and len(caplog.records) == 1  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- task creation, CLI

GEEZ_TASK = """
name: geez-sentiment
title: Tigrinya sentiment
family: single_label
language: ti
labels: [negative, positive]
instructions: |
  Write a Tigrinya post in Ge'ez script, e.g. ሎሚ ጽቡቕ መዓልቲ እዩ፣ ኩሉ ሰብ ሕጉስ እዩ። (Today is a good day.)
  or እዚ ምግቢ ኣዝዩ ጥዑም እዩ። (This food is very tasty.)
"""


def test_task_creation_warns_through_the_use_case_cli_and_api(tmp_path: Path) -> None:
    from dynaloop.cli import app as cli
    from services.domain.tasks import tokenizer_coverage_warnings
    from services.taskdef import parse_task_definition

    (warning,) = tokenizer_coverage_warnings(parse_task_definition(GEEZ_TASK), max_unknown_token_share=0.2)
    assert "of tokens of the task YAML's words in the Ethiopic script (the task's language: ti)" in warning
    assert "[UNK]" in warning
    english = (
        "name: en-task\ntitle: English sentiment\nfamily: single_label\nlabels: [negative, positive]\n"
        "instructions: Write a short post about your day, e.g. what a lovely morning.\n"
    )
    assert tokenizer_coverage_warnings(parse_task_definition(english), max_unknown_token_share=0.2) == []
    # A task in another language is judged on its own script: English glosses do not hide it.
    assert "[UNK]" not in " ".join(
        tokenizer_coverage_warnings(parse_task_definition(GEEZ_TASK), max_unknown_token_share=1.0)
    )

    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", url]).exit_code == 0
    (tmp_path / "task.yaml").write_text(GEEZ_TASK, encoding="utf-8")
    created = runner.invoke(cli, ["task", "create", str(tmp_path / "task.yaml"), "--database-url", url])
    assert created.exit_code == 0, created.output
    assert "warning:" in created.output and "[UNK]" in created.output and "xlm-roberta-base" in created.output
    shipped = runner.invoke(cli, ["task", "create", "isarcasm", "--database-url", url])
    assert shipped.exit_code == 0 and "[UNK]" not in shipped.output


def test_the_task_creation_warning_names_the_script_it_measured_not_the_tasks_language() -> None:
    """The check measures a non-English task's words with letters outside the Latin script; the
    warning names that script, not the language tag, and emoji, dashes and curly quotes in a
    Latin-script task's YAML are not taken for its script (issue 29, item 8)."""
    from services.domain.tasks import tokenizer_coverage_warnings
    from services.taskdef import parse_task_definition

    quoting = GEEZ_TASK.replace("language: ti", "language: ha").replace("name: geez-sentiment", "name: ha-task")
    (warning,) = tokenizer_coverage_warnings(parse_task_definition(quoting), max_unknown_token_share=0.2)
    assert "the task YAML's words in the Ethiopic script (the task's language: ha)" in warning
    assert "ha text" not in warning
    german = (
        "name: de-task\ntitle: German sentiment\nfamily: single_label\nlanguage: de\nlabels: [negative, positive]\n"
        "instructions: Schreib einen kurzen Beitrag über deinen Tag 😀 🙂 — „so“ 🎉\n"
    )
    assert tokenizer_coverage_warnings(parse_task_definition(german), max_unknown_token_share=0.2) == []


def test_task_creation_over_the_api_returns_the_warning(client, researcher) -> None:  # type: ignore[no-untyped-def]
    response = client.post(
        "/api/v1/tasks",
        content=GEEZ_TASK.encode("utf-8"),
        headers={**researcher.headers, "Content-Type": "application/yaml"},
    )
    assert response.status_code == 201, response.text
    (warning,) = response.json()["warnings"]
    assert "[UNK]" in warning and "xlm-roberta-base" in warning
    # Read back later, a task carries no creation warnings.
    listed = client.get("/api/v1/tasks", headers=researcher.headers).json()["data"]
    assert [task["warnings"] for task in listed] == [[]]


def test_round_train_refuses_geez_without_allow_unknown_tokens(tmp_path: Path) -> None:
    from dynaloop.cli import app as cli

    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'train.db'}"
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", url]).exit_code == 0
    (tmp_path / "task.yaml").write_text(GEEZ_TASK, encoding="utf-8")
    assert runner.invoke(cli, ["task", "create", str(tmp_path / "task.yaml"), "--database-url", url]).exit_code == 0
    rows = [f'"{text}",{LABELS[i % 2]}' for i, text in enumerate(GEEZ * 2)]
    (tmp_path / "geez.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "mix.yaml").write_text(
        "train:\n  - file: geez.csv\n    label_column: label\ndev:\n  file: geez.csv\n  label_column: label\n",
        encoding="utf-8",
    )
    args = ["round", "train", "--task", "geez-sentiment", "--mix", str(tmp_path / "mix.yaml"), "--tiny", "--cpu"]
    # No precision check after training (tests/test_jobs.py::TINY_TRAIN says why).
    args += ["--epochs", "1", "--batch-size", "8", "--no-check-precision", "--database-url", url]
    refused = runner.invoke(cli, [*args, "--out", str(tmp_path / "refused")])
    assert refused.exit_code != 0
    assert "[UNK]" in refused.output and "--allow-unknown-tokens" in refused.output
    assert not (tmp_path / "refused").exists()
    allowed = runner.invoke(cli, [*args, "--out", str(tmp_path / "allowed"), "--allow-unknown-tokens"])
    assert allowed.exit_code == 0, allowed.output
    assert "warning:" in allowed.output and "[UNK]" in allowed.output
    assert "dev F1 per class (best epoch): negative" in allowed.output


def test_round_evaluate_reports_the_yamls_positive_class_and_the_warning(tmp_path: Path) -> None:
    """`positive_label` in the task YAML decides the positive class's F1 (here the first label,
    which the naming rule would not pick); the CLI prints the unknown-token warning."""
    from dynaloop.cli import app as cli

    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'evaluate.db'}"
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", url]).exit_code == 0
    task = GEEZ_TASK.replace("labels: [negative, positive]", "labels: [ham, spam]\npositive_label: ham")
    (tmp_path / "task.yaml").write_text(task, encoding="utf-8")
    assert runner.invoke(cli, ["task", "create", str(tmp_path / "task.yaml"), "--database-url", url]).exit_code == 0
    init_model_dir(tmp_path / "model", labels=["ham", "spam"], tiny=True, max_length=32)
    rows = [f'"{text}",{["ham", "spam"][i % 2]}' for i, text in enumerate(GEEZ)]
    (tmp_path / "geez.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "mix.yaml").write_text(
        "train:\n  - file: geez.csv\n    label_column: label\n"
        "evaluate:\n  - file: geez.csv\n    label_column: label\n    name: geez test\n",
        encoding="utf-8",
    )
    args = ["round", "evaluate", "--task", "geez-sentiment", "--model", str(tmp_path / "model")]
    args += ["--out", str(tmp_path / "out"), "--mix", str(tmp_path / "mix.yaml"), "--rounds", "none"]
    result = runner.invoke(cli, [*args, "--no-record", "--device", "cpu", "--database-url", url])
    assert result.exit_code == 0, result.output
    assert "warning:" in result.output and "[UNK]" in result.output
    data = json.loads((tmp_path / "out" / "evaluation.json").read_text(encoding="utf-8"))
    assert data["positive_label"] == "ham" and data["sets"][0]["positive_label"] == "ham"
    assert data["sets"][0]["positive_f1"] == data["sets"][0]["f1"]["ham"]
    assert data["warnings"] and "[UNK]" in data["warnings"][0]


# ---------------------------------------------------------------------------- training defaults


@pytest.mark.slow
def test_round_train_uses_the_tasks_class_weights_and_prints_per_class_dev_f1(tmp_path: Path) -> None:
    """BESSTIE's YAML asks for its paper's class-weighted loss: `round train` uses it unless told
    otherwise, records it, and prints each class's dev F1 (a class with a low F1 is called out)."""
    from dynaloop.cli import app as cli

    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'train.db'}"
    assert runner.invoke(cli, ["db", "upgrade", "--database-url", url]).exit_code == 0
    assert runner.invoke(cli, ["task", "create", "besstie-en-in-sarcasm", "--database-url", url]).exit_code == 0
    posts = ["yeah right great plan", "the metro is late again", "oh wonderful more rain", "lunch was fine"]
    rows = [f"{post} {i},{['sarcastic', 'not_sarcastic', 'not_sarcastic'][i % 3]}" for i, post in enumerate(posts * 3)]
    (tmp_path / "posts.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "mix.yaml").write_text(
        "train:\n  - file: posts.csv\n    label_column: label\ndev:\n  file: posts.csv\n  label_column: label\n",
        encoding="utf-8",
    )
    args = ["round", "train", "--task", "besstie-en-in-sarcasm", "--mix", str(tmp_path / "mix.yaml"), "--tiny"]
    args += ["--cpu", "--epochs", "1", "--batch-size", "8", "--learning-rate", "1e-9", "--no-check-precision"]
    args += ["--database-url", url]
    default = runner.invoke(cli, [*args, "--out", str(tmp_path / "default")])
    assert default.exit_code == 0, default.output
    metadata = ModelMetadata.load(tmp_path / "default").model_extra or {}
    assert metadata["hyperparameters"]["class_weights"] == "balanced"
    per_class = metadata["training"]["best_dev_f1_per_class"]
    assert set(per_class) == {"sarcastic", "not_sarcastic"}
    printed = " ".join(default.output.split())
    assert "dev F1 per class (best epoch): " + ", ".join(f"{k} {v:.4f}" for k, v in per_class.items()) in printed
    low = low_f1_classes(per_class)  # under 0.1 or a third of the macro-F1 (docs/training.md)
    assert metadata["training"]["low_f1_classes"] == low
    assert ("warning: low dev F1 for" in printed) is bool(low)

    plain = runner.invoke(cli, [*args, "--out", str(tmp_path / "plain"), "--class-weights", "none"])
    assert plain.exit_code == 0, plain.output
    assert (ModelMetadata.load(tmp_path / "plain").model_extra or {})["hyperparameters"]["class_weights"] == "none"
