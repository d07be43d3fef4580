"""The linear model kind (model_server/directory/linear.py, rounds/models/linear.py): trained by
`round train --kind linear`, stored with skops (a tampered file is refused), served behind the
same /predict, and the baseline `round evaluate` reports beside every model.

The Ge'ez fixture (tests/data/geez_emotion.jsonl) is our own Amharic sentences in Ethiopic
script, four emotions; the packaged MiniLM's tokenizer turns nearly all of it into [UNK]."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import skops.io
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dynaloop.cli import app as cli
from model_server.backends import ClassifyInput, load_backend
from model_server.backends.linear_backend import LinearBackend
from model_server.config import ServerConfig
from model_server.directory import ModelMetadata, ModelMetadataError
from model_server.directory.linear import LINEAR_FILE, LinearModel, mark_target
from rounds.models.datasets import LabelledSet
from rounds.models.inference import LinearClassifier, load_classifier, predict_probabilities
from rounds.models.linear import train_linear
from rounds.models.train import TrainingError
from tests.conftest import Actor, open_round, serve_model

FIXTURE = Path(__file__).parent / "data" / "geez_emotion.jsonl"
EMOTIONS = ["joy", "sadness", "anger", "fear"]
GEEZ_EMOTION_TASK = """
name: geez-emotion
title: Amharic emotion
family: single_label
language: am
labels: [joy, sadness, anger, fear]
instructions: |
  Write a short Amharic post in Ge'ez script that shows one emotion, e.g. ዛሬ በጣም ደስ ብሎኛል። (I am very happy today.)
"""


def fixture_rows(split: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    return [row for row in rows if row["split"] == split]


def geez_set(split: str) -> LabelledSet:
    rows = fixture_rows(split)
    gold = [EMOTIONS.index(row["label"]) for row in rows]
    return LabelledSet(
        f"geez {split}",
        EMOTIONS,
        False,
        [row["text"] for row in rows],
        np.eye(len(EMOTIONS), dtype=np.float32)[gold],
        ids=[row["id"] for row in rows],
    )


@pytest.fixture(scope="module")
def geez_linear(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("linear") / "geez"
    train_linear(
        [geez_set("train")],
        geez_set("test"),
        labels=EMOTIONS,
        family="single_label",
        input_format="text",
        out_dir=out,
        model_id="geez-linear",
    )
    return out


def test_the_directory_loads_everywhere_and_predicts_fast(geez_linear: Path) -> None:
    metadata = ModelMetadata.load(geez_linear)
    assert metadata.kind == "linear" and metadata.labels == EMOTIONS and (geez_linear / LINEAR_FILE).is_file()
    recorded = metadata.model_extra or {}
    assert recorded["hyperparameters"]["class_weight"] == "balanced"
    assert recorded["training"]["best_dev_macro_f1"] > 0.8, "char n-grams learn the Ge'ez fixture"
    texts = [row["text"] for row in fixture_rows("test")]
    offline = predict_probabilities(geez_linear, texts)
    assert offline.shape == (len(texts), 4) and np.allclose(offline.sum(axis=1), 1, atol=1e-5)
    classifier = load_classifier(geez_linear)
    assert isinstance(classifier, LinearClassifier)
    backend = load_backend(geez_linear)  # the server's default backend name: the directory decides
    assert isinstance(backend, LinearBackend)
    served = backend.predict([ClassifyInput(text) for text in texts])
    for output, row in zip(served, offline, strict=True):
        assert output.labels == [EMOTIONS[int(row.argmax())]] and not output.truncated
        assert [output.probabilities[label] for label in EMOTIONS] == pytest.approx(row.tolist(), abs=1e-6)
    started = time.perf_counter()
    for text in texts[:20]:
        backend.predict([ClassifyInput(text)])
    assert (time.perf_counter() - started) / 20 < 0.05, "a linear prediction takes milliseconds"
    with pytest.raises(ValueError, match="vllm-classify backend serves encoder models only"):
        load_backend(geez_linear, "vllm-classify")


class Intruder:
    """A type no linear model directory holds."""

    def __init__(self) -> None:
        self.command = "echo owned"


def test_a_tampered_model_file_is_refused(geez_linear: Path, tmp_path: Path) -> None:
    import pickle
    import shutil

    foreign = tmp_path / "foreign"
    shutil.copytree(geez_linear, foreign)
    skops.io.dump({"pipeline": Intruder()}, foreign / LINEAR_FILE)
    with pytest.raises(ModelMetadataError, match=r"names types dynaloop does not load.*Intruder"):
        LinearModel.load(foreign)
    with pytest.raises(ModelMetadataError, match="names types"):
        load_backend(foreign)

    pickled = tmp_path / "pickled"
    shutil.copytree(geez_linear, pickled)
    (pickled / LINEAR_FILE).write_bytes(pickle.dumps(Intruder()))
    with pytest.raises(ModelMetadataError, match="is not a skops file"):
        LinearModel.load(pickled)

    other_shape = tmp_path / "other-shape"
    shutil.copytree(geez_linear, other_shape)
    skops.io.dump({"not": "a pipeline"}, other_shape / LINEAR_FILE)
    with pytest.raises(ModelMetadataError, match="is not the linear trainer's pipeline"):
        LinearModel.load(other_shape)


def test_multi_label_with_an_exclusive_label_and_target_marking(tmp_path: Path) -> None:
    labels = ["joy", "anger", "neutral"]
    texts = ["ደስ ብሎኛል", "ተናድጃለሁ", "ደስ ብሎኛል ግን ተናድጃለሁ", "ዜና ነው", "ሰላም ነው", "ተናድጃለሁ ደስ ብሎኛል"] * 4
    y = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 1], [0, 0, 1], [1, 1, 0]] * 4, dtype=np.float32)
    out = tmp_path / "multi"
    train_linear(
        [LabelledSet("train", labels, True, texts, y)],
        None,
        labels=labels,
        family="multi_label",
        input_format="text",
        out_dir=out,
        model_id="multi",
        exclusive_labels=["neutral"],
    )
    backend = load_backend(out)
    both, news = backend.predict([ClassifyInput("ደስ ብሎኛል ግን ተናድጃለሁ"), ClassifyInput("ዜና ነው")])
    assert sorted(both.labels) == ["anger", "joy"] and news.labels == ["neutral"]
    with pytest.raises(TrainingError, match="never change"):
        train_linear(
            [LabelledSet("train", labels, True, texts, np.c_[y[:, :2], np.zeros(len(y))].astype(np.float32))],
            None,
            labels=labels,
            family="multi_label",
            input_format="text",
            out_dir=tmp_path / "constant",
            model_id="constant",
        )

    assert mark_target("The FOOD was cold", "food") == "The xxtgt FOOD xxendtgt was cold"
    # The word after the marked target carries its sentiment: the same sentence, two targets, two labels.
    sentences = ["food great and staff rude"] * 6 + ["staff kind and food cold"] * 6
    targets = ["food", "staff"] * 3 + ["staff", "food"] * 3
    gold = [0, 1] * 3 + [0, 1] * 3
    pair = tmp_path / "pair"
    train_linear(
        [
            LabelledSet(
                "train", ["positive", "negative"], False, sentences, np.eye(2, dtype=np.float32)[gold], targets=targets
            )
        ],
        None,
        labels=["positive", "negative"],
        family="single_label",
        input_format="text_pair",
        out_dir=pair,
        model_id="pair",
    )
    served = load_backend(pair)
    same_sentence = served.predict(
        [ClassifyInput(sentences[0], "food"), ClassifyInput(sentences[0], "staff")]
    )  # one sentence, two targets: the marked target decides
    assert [output.labels for output in same_sentence] == [["positive"], ["negative"]]
    with pytest.raises(ValueError, match="pairs"):
        served.predict([ClassifyInput(sentences[0])])


@pytest.mark.slow
def test_geez_linear_model_trains_serves_the_loop_and_beats_the_encoder(
    client: TestClient, researcher: Actor, writer: Actor, settings: Any, tmp_path: Path
) -> None:
    """Issue 29's done-when: on Ge'ez text MiniLM cannot read, `round train --kind linear` trains,
    a writer's attempt is scored by it over real HTTP, it beats the encoder, and the evaluation
    report shows the encoder beside the linear baseline."""
    runner = CliRunner()
    url = settings.database_url
    for split in ("train", "test"):
        lines = [
            json.dumps({k: row[k] for k in ("id", "text", "label")}, ensure_ascii=False) for row in fixture_rows(split)
        ]
        (tmp_path / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "mix.yaml").write_text(
        "train:\n  - file: train.jsonl\n    name: geez train\ndev:\n  file: test.jsonl\n  name: geez test\n",
        encoding="utf-8",
    )
    (tmp_path / "evaluate.yaml").write_text(
        "train:\n  - file: train.jsonl\nevaluate:\n  - file: test.jsonl\n    name: geez test\n", encoding="utf-8"
    )
    created = client.post(
        "/api/v1/tasks",
        content=GEEZ_EMOTION_TASK.encode("utf-8"),
        headers={**researcher.headers, "Content-Type": "application/yaml"},
    )
    assert created.status_code == 201, created.text
    train = ["round", "train", "--task", "geez-emotion", "--mix", str(tmp_path / "mix.yaml"), "--database-url", url]

    # The encoder is refused on this script, and its message names the linear kind.
    refused = runner.invoke(cli, [*train, "--out", str(tmp_path / "refused"), "--cpu"])
    assert refused.exit_code != 0 and "[UNK]" in refused.output and "--kind linear" in " ".join(refused.output.split())

    linear = runner.invoke(
        cli, [*train, "--out", str(tmp_path / "linear"), "--kind", "linear", "--model-id", "geez-lin"]
    )
    assert linear.exit_code == 0, linear.output
    assert "registered model version" in linear.output and "dev F1 per class (best epoch): joy" in linear.output
    encoder_args = ["--out", str(tmp_path / "encoder"), "--cpu", "--allow-unknown-tokens", "--epochs", "1"]
    encoder_args += ["--batch-size", "16", "--max-length", "32", "--no-check-precision", "--model-id", "geez-enc"]
    encoder = runner.invoke(cli, [*train, *encoder_args])
    assert encoder.exit_code == 0, encoder.output

    # In the loop: the linear model behind the model server's /predict, over real HTTP.
    server = serve_model(ServerConfig(model_dir=tmp_path / "linear"))
    try:
        info = httpx.get(f"{server.url}/info").json()
        assert info["kind"] == "linear" and info["backend"] == "linear" and info["model_id"] == "geez-lin"
        task_yaml = GEEZ_EMOTION_TASK.replace("name: geez-emotion", "name: geez-emotion-loop")
        round_ = open_round(client, researcher, task_yaml, server.url, ["ዛሬ ጠዋት በገበያ በጣም ፈራሁ።"])
        assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers)
        assert assignment.status_code in (200, 201), assignment.text
        text = "ትናንት ማታ በመንደራችን ጅብ ሲጮህ ሰምቼ ፍርሃት ያዘኝ።"
        attempt = client.post(
            f"/api/v1/assignments/{assignment.json()['id']}/attempts", json={"text": text}, headers=writer.headers
        ).json()
        direct = httpx.post(f"{server.url}/predict", json={"texts": [text]}).json()["predictions"][0]
    finally:
        server.stop()
    assert attempt["status"] == "scored" and attempt["model_id"] == "geez-lin"
    assert attempt["prediction"] == direct["labels"] == ["fear"]

    # The encoder's evaluation shows the linear baseline beside it, trained on the encoder's own mix.
    evaluate = ["round", "evaluate", "--task", "geez-emotion", "--rounds", "none", "--database-url", url]
    evaluate += ["--mix", str(tmp_path / "evaluate.yaml"), "--no-record"]
    result = runner.invoke(cli, [*evaluate, "--model", str(tmp_path / "encoder"), "--out", str(tmp_path / "eval-enc")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval-enc" / "evaluation.json").read_text(encoding="utf-8"))
    encoder_f1 = report["macro_f1"]["geez test"]
    baseline = report["baseline"]
    assert baseline["trained_on"].startswith("the evaluated model's own training mix")
    assert baseline["train_sets"][0]["rows"] == len(fixture_rows("train"))
    assert baseline["macro_f1"]["geez test"] > encoder_f1 + 0.3, (baseline["macro_f1"], encoder_f1)
    assert report["behind_baseline"] == [
        {"set": "geez test", "model_macro_f1": encoder_f1, "baseline_macro_f1": baseline["macro_f1"]["geez test"]}
    ]
    markdown = (tmp_path / "eval-enc" / "evaluation.md").read_text(encoding="utf-8")
    assert "Baseline macro-F1" in markdown and "**no**" in markdown
    assert "The model does not beat the linear baseline on every set" in markdown
    assert "does not beat the linear baseline" in " ".join(result.output.split())
    assert ModelMetadata.load(tmp_path / "eval-enc" / "baseline-linear").kind == "linear"

    # The linear model's own evaluation: above the encoder, ids sorted as numbers.
    result = runner.invoke(cli, [*evaluate, "--model", str(tmp_path / "linear"), "--out", str(tmp_path / "eval-lin")])
    assert result.exit_code == 0, result.output
    own = json.loads((tmp_path / "eval-lin" / "evaluation.json").read_text(encoding="utf-8"))
    assert own["model_kind"] == "linear" and own["baseline"] is None and "baseline itself" in own["baseline_note"]
    assert own["macro_f1"]["geez test"] > encoder_f1 + 0.3
    import pyarrow.parquet as pq

    ids = pq.read_table(tmp_path / "eval-lin" / "predictions.parquet").column("example_id")
    assert str(ids.type) == "int64"
