"""Round-1 harvesting (rounds.models.harvest, DynaSent §3.2): sentence splitting, the sampling
proportions, harvested examples validated through the API and built into chance-level splits,
prompt sets, and clear errors for bad corpora.

Runs on SQLite always and on PostgreSQL when DYNALOOP_TEST_POSTGRES_URL is set.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select
from typer.testing import CliRunner

from dynaloop.cli import app as cli
from rounds.build import export
from rounds.build.build_settings import BuildSettings
from rounds.build.pipeline import build_round
from rounds.models.harvest import (
    POOL_HIGH,
    POOL_LOW,
    POOL_RANDOM,
    HarvestError,
    harvest,
    read_corpus,
    sample_sentences,
    split_sentences,
)
from rounds.models.init_model import init_model_dir
from services.db.engine import session_scope
from services.db.models import Example, ExampleOrigin, ExampleStatus, Prompt
from services.domain.round_lifecycle import get_round
from services.errors import Conflict
from tests.conftest import Actor, example_yaml, open_round, served_examples, table_counts

pytestmark = pytest.mark.timeout(300)

LABELS = ["positive", "negative", "neutral"]
KEYWORDS = {"great": "positive", "awful": "negative"}


def fake_predictor(texts: Sequence[str]) -> np.ndarray:
    """Positive for "great", negative for "awful", else neutral (the model's label order)."""
    rows = []
    for text in texts:
        label = next((label for word, label in KEYWORDS.items() if word in text), "neutral")
        rows.append([0.8 if label == name else 0.1 for name in LABELS])
    return np.array(rows)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("harvest-model") / "model-0"
    init_model_dir(directory, labels=LABELS, tiny=True, model_id="model-0")
    return directory


def write_corpus(path: Path) -> Path:
    """18 reviews of three sentences (one per predicted label) at 1, 3 and 5 stars, plus a
    repeated sentence and one too short to keep."""
    rows = []
    for stars in (1, 3, 5):
        for i in range(6):
            rows.append(
                {
                    "review_id": f"r{stars}-{i}",
                    "stars": stars,
                    "body": f"The great soup {stars}{i} was served.\nThe awful bread {stars}{i} came late. "
                    f"The plain table {stars}{i} stood there.",
                }
            )
    rows.append({"review_id": "dup", "stars": 2, "body": "The plain table 10 stood there. Ok."})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


# --- splitting and sampling -------------------------------------------------------------


def test_sentences_are_split_with_pysbd_and_line_breaks() -> None:
    assert split_sentences("Dr. Smith was late. The U.S. office paid $5.50 for it!\nNever again") == [
        "Dr. Smith was late.",
        "The U.S. office paid $5.50 for it!",
        "Never again",
    ]
    assert split_sentences("The food was cold!!! The staff   did not care...  ") == [
        "The food was cold!!!",
        "The staff did not care...",
    ]
    assert split_sentences("ቡናው ጥሩ ነበር። አገልግሎቱ ግን መጥፎ ነበር።", "am") == ["ቡናው ጥሩ ነበር።", "አገልግሎቱ ግን መጥፎ ነበር።"]
    assert split_sentences("Hello there. Fine.", "xx-Latn") == ["Hello there.", "Fine."]  # no rules: English
    assert split_sentences("  \n ") == []


def _pools(n_low: int, n_high: int, n_other: int) -> tuple[np.ndarray, np.ndarray]:
    ratings = [1] * n_low + [5] * n_high + [3] * (n_other // 2) + [1] * (n_other - n_other // 2)
    predicted: list[str | None] = (
        ["positive"] * n_low + ["negative"] * n_high + [None] * (n_other // 2) + ["negative"] * (n_other - n_other // 2)
    )
    return np.array(ratings, dtype=float), np.array(predicted, dtype=object)


def test_half_the_sample_comes_from_the_two_disagreement_pools_evenly() -> None:
    ratings, predicted = _pools(300, 300, 600)
    draw = sample_sentences(ratings, predicted, 101, seed=3)
    assert draw.selected == {POOL_LOW: 25, POOL_HIGH: 25, POOL_RANDOM: 51}
    assert draw.available == {POOL_LOW: 300, POOL_HIGH: 300, POOL_RANDOM: 600}
    assert draw.notes == []
    assert all(ratings[i] == 1 and predicted[i] == "positive" for i in draw.indices[POOL_LOW])
    assert all(ratings[i] == 5 and predicted[i] == "negative" for i in draw.indices[POOL_HIGH])
    assert all(i >= 600 for i in draw.indices[POOL_RANDOM])
    chosen = np.concatenate(list(draw.indices.values()))
    assert len(set(chosen.tolist())) == 101, "no sentence twice"
    again = sample_sentences(ratings, predicted, 101, seed=3)
    assert all((again.indices[p] == draw.indices[p]).all() for p in draw.indices), "deterministic for a seed"
    other = sample_sentences(ratings, predicted, 101, seed=4)
    assert any((other.indices[p] != draw.indices[p]).any() for p in draw.indices)


def test_a_short_pool_is_made_up_and_reported() -> None:
    ratings, predicted = _pools(5, 300, 600)
    draw = sample_sentences(ratings, predicted, 100, seed=0)
    assert draw.selected == {POOL_LOW: 5, POOL_HIGH: 45, POOL_RANDOM: 50}
    assert any("pool low_rating_predicted_positive is short: 5 sentences" in note for note in draw.notes)
    assert any("20 sentence(s) from pool high_rating_predicted_negative stand in" in note for note in draw.notes)

    ratings, predicted = _pools(3, 4, 600)
    draw = sample_sentences(ratings, predicted, 100, seed=0)
    assert draw.selected == {POOL_LOW: 3, POOL_HIGH: 4, POOL_RANDOM: 93}

    ratings, predicted = _pools(10, 10, 10)
    draw = sample_sentences(ratings, predicted, 100, seed=0)
    assert draw.selected == {POOL_LOW: 10, POOL_HIGH: 10, POOL_RANDOM: 10}
    assert "only 30 sentences are available" in draw.notes[0]
    with pytest.raises(HarvestError, match="at least 1"):
        sample_sentences(ratings, predicted, 0)
    with pytest.raises(HarvestError, match="must be above"):
        sample_sentences(ratings, predicted, 5, low_rating=5, high_rating=1)


def test_thresholds_and_labels_are_settings() -> None:
    ratings = np.array([2, 2, 4, 4, 3, 3], dtype=float)
    predicted = np.array(["pos", "neg", "neg", "pos", "pos", "neg"], dtype=object)
    draw = sample_sentences(
        ratings, predicted, 4, low_rating=2, high_rating=4, positive_label="pos", negative_label="neg", seed=0
    )
    assert draw.indices[POOL_LOW].tolist() == [0] and draw.indices[POOL_HIGH].tolist() == [2]


# --- corpora ------------------------------------------------------------------------------


def test_corpus_formats_and_clear_errors(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {"text": ["Good food. Bad staff.", None, "Fine."], "rating": [5.0, 1.0, 3.0], "id": ["a", "b", "c"]}
    )
    frame.to_parquet(tmp_path / "c.parquet")
    frame.to_json(tmp_path / "c.jsonl", orient="records", lines=True)
    for name in ("c.parquet", "c.jsonl"):
        corpus = read_corpus(tmp_path / name, id_column="id")
        assert corpus["document_id"].tolist() == ["a", "c"] and corpus["rating"].tolist() == [5.0, 3.0]
    (tmp_path / "empty.csv").write_text("", encoding="utf-8")
    (tmp_path / "header.csv").write_text("text,rating\n", encoding="utf-8")
    (tmp_path / "no-rating.csv").write_text("text,score\nGood food.,5\n", encoding="utf-8")
    (tmp_path / "bad-rating.csv").write_text("text,rating\nGood food.,5\nBad food.,one star\n", encoding="utf-8")
    (tmp_path / "no-text.csv").write_text("text,rating\n,5\n", encoding="utf-8")
    cases = {
        "empty.csv": "empty.csv is empty",
        "header.csv": "has no rows",
        "no-rating.csv": r"has no column 'rating' \(columns: \['text', 'score'\]\); name the right one with "
        "--rating-column",
        "bad-rating.csv": r"1 row\(s\) of bad-rating.csv have no numeric 'rating': row 2 \('one star'\)",
        "no-text.csv": "none with text",
        "corpus.xlsx": "cannot tell the format",
        "missing.csv": "no corpus file",
    }
    for name, message in cases.items():
        with pytest.raises(HarvestError, match=message):
            read_corpus(tmp_path / name)
    with pytest.raises(HarvestError, match=r"no column 'doc'.*--id-column"):
        read_corpus(tmp_path / "c.jsonl", id_column="doc")


# --- into a round -------------------------------------------------------------------------


def _open(client: Any, researcher: Any) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), None)


@pytest.mark.both_databases
def test_harvested_examples_are_validated_and_built_into_chance_level_splits(
    app: FastAPI, client: TestClient, researcher: Actor, validators: list[Actor], model_dir: Path, tmp_path: Path
) -> None:
    round_ = _open(client, researcher)
    corpus = write_corpus(tmp_path / "reviews.csv")
    report = harvest(
        app.state.sessionmaker,
        "dynasent-r2",
        1,
        corpus,
        model_dir,
        48,
        text_column="body",
        rating_column="stars",
        id_column="review_id",
        seed=1,
        predictor=fake_predictor,
    )
    assert (report.documents, report.sentences) == (19, 56)
    assert report.skipped["duplicates"] == 1 and report.skipped["too_short"] == 1  # "Ok." is under 10 characters
    assert report.pools == {
        POOL_LOW: {"available": 6, "wanted": 12, "selected": 6},
        POOL_HIGH: {"available": 6, "wanted": 12, "selected": 6},
        POOL_RANDOM: {"available": 42, "wanted": 24, "selected": 36},
    }
    assert report.written == 48 and any("is short" in note for note in report.notes)

    with session_scope(app.state.sessionmaker) as session:
        examples = list(session.scalars(select(Example).order_by(Example.id)))
        assert len(examples) == 48
        for example in examples:
            source = example.source_metadata
            assert example.origin is ExampleOrigin.harvested and example.writer_id is None
            assert example.assignment_id is None and example.attempt_id is None and example.target_label == []
            assert example.model_id == "model-0" and example.validations_needed == 5
            assert example.model_prediction == [LABELS[int(fake_predictor([example.text])[0].argmax())]]
            assert source["corpus"] == "reviews.csv" and source["model_version"] == "0"
            assert source["document_id"].startswith("r") and source["sentence_index"] in (0, 1, 2)
            if source["pool"] == POOL_LOW:
                assert source["rating"] == 1 and example.model_prediction == ["positive"]
            if source["pool"] == POOL_HIGH:
                assert source["rating"] == 5 and example.model_prediction == ["negative"]
        predicted = {e.id: e.model_prediction[0] for e in examples}
    assert min(Counter(predicted.values()).values()) >= 6
    # Gold cycles through the labels within each predicted label, so every (gold, predicted)
    # cell has examples and the model can be held at chance.
    seen: Counter[str] = Counter()
    gold = {}
    for example_id, label in sorted(predicted.items()):
        gold[example_id] = LABELS[seen[label] % 3]
        seen[label] += 1

    stats = client.get(f"/api/v1/rounds/{round_['id']}/stats", headers=researcher.headers).json()
    assert (
        stats["examples_by_origin"] == {"written": 0, "harvested": 48, "imported": 0}
        and stats["examples"]["validating"] == 48
    )
    for validator in validators[:5]:
        while True:
            batch = client.get(f"/api/v1/rounds/{round_['id']}/validation-batch", headers=validator.headers).json()
            if not batch["data"]:
                break
            for item, example_id in zip(batch["data"], served_examples(client, batch), strict=True):
                response = client.post(
                    f"/api/v1/validation-items/{item['item_id']}/validations",
                    json={"label": gold[example_id]},
                    headers=validator.headers,
                )
                assert response.status_code == 201, response.text
    record = client.get(f"/api/v1/examples/{examples[0].id}", headers=researcher.headers).json()
    assert record["origin"] == "harvested" and record["writer"] is None and record["attempts"] == []
    assert record["source"]["corpus"] == "reviews.csv" and len(record["validations"]) == 5
    assert (
        client.post(
            f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers
        ).status_code
        == 200
    )

    with session_scope(app.state.sessionmaker) as session:
        assert all(e.status is ExampleStatus.validated for e in session.scalars(select(Example)))
        build = build_round(session, None, get_round(session, round_["id"]), BuildSettings(seed=0))
        report_ = build.report
        build_id = build.id
    assert report_["counts"]["total"] == {"train": 12, "dev": 18, "test": 18, "dist_train": 12}
    assert report_["splits"]["assessment"]["dev"]["model_macro_f1"] == pytest.approx(1 / 3, abs=1e-3)
    assert report_["fooling"]["harvested_examples"] == 48
    rows = [row for chunk in export.iter_rows(app.state.sessionmaker, build_id, "all", "secret") for row in chunk]
    assert len(rows) == 48 and all(row["writer"] is None for row in rows)


def test_harvest_as_prompts_for_writers(
    app: FastAPI, client: TestClient, researcher: Actor, writer: Actor, model_dir: Path, tmp_path: Path
) -> None:
    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), None)
    corpus = write_corpus(tmp_path / "reviews.csv")
    options = dict(text_column="body", rating_column="stars", mode="prompts", predictor=fake_predictor)
    report = harvest(app.state.sessionmaker, "dynasent-r2", 1, corpus, model_dir, 10, **options)  # type: ignore[arg-type]
    assert report.written == 10 and report.mode == "prompts"
    with session_scope(app.state.sessionmaker) as session:
        prompts = list(session.scalars(select(Prompt).where(Prompt.round_id == round_["id"])))
        assert len(prompts) == 10 and session.scalar(select(Example.id)) is None
        assert all(
            p.source == "reviews.csv"
            and p.meta["pool"] in (POOL_LOW, POOL_HIGH, POOL_RANDOM)
            and p.meta["model_id"] == "model-0"
            and p.external_id.count(":") == 1
            for p in prompts
        )
        low = [p for p in prompts if p.meta["pool"] == POOL_LOW]
        assert len(low) == 3 and all(p.meta["rating"] == 1 and p.meta["model_prediction"] == "positive" for p in low)
    # Harvesting again never repeats a sentence already in the round.
    again = harvest(app.state.sessionmaker, "dynasent-r2", 1, corpus, model_dir, 100, **options)  # type: ignore[arg-type]
    assert again.skipped["already_in_round"] == 10 and again.written == 44
    assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers)
    assert assignment.status_code == 201 and assignment.json()["prompt"]["text"]


@pytest.mark.both_databases
def test_bad_harvests_fail_clearly_and_write_nothing(
    app: FastAPI, client: TestClient, researcher: Actor, model_dir: Path, tmp_path: Path
) -> None:
    round_ = _open(client, researcher)
    corpus = write_corpus(tmp_path / "reviews.csv")
    factory = app.state.sessionmaker
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "dynaloop_model.json").write_text((model_dir / "dynaloop_model.json").read_text())
    before = table_counts(app)
    cases = [
        (dict(corpus_path=corpus), HarvestError, "no column 'text'.*--text-column"),
        (
            dict(corpus_path=tmp_path / "none.csv", text_column="body", rating_column="stars"),
            HarvestError,
            "no corpus file",
        ),
        (
            dict(corpus_path=corpus, text_column="body", rating_column="stars", negative_label="bad"),
            HarvestError,
            "label 'bad' is not a label.*--negative-label",
        ),
        (
            dict(corpus_path=corpus, text_column="body", rating_column="stars", min_chars=400),
            HarvestError,
            "none of the 56 sentences",
        ),
        (
            dict(corpus_path=corpus, text_column="body", rating_column="stars", model_dir=tmp_path),
            HarvestError,
            "no dynaloop_model.json",
        ),
        (
            dict(corpus_path=corpus, text_column="body", rating_column="stars", model_dir=weightless, predictor=None),
            HarvestError,
            "cannot load the harvesting model",
        ),
    ]
    for kwargs, error, message in cases:
        arguments: dict[str, Any] = {"model_dir": model_dir, "n": 10, "predictor": fake_predictor, **kwargs}
        with pytest.raises(error, match=message):
            harvest(factory, "dynasent-r2", 1, **arguments)
        assert table_counts(app) == before
    client.post(f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    with pytest.raises(Conflict, match="round 1 is closed"):
        harvest(
            factory,
            "dynasent-r2",
            1,
            corpus,
            model_dir,
            10,
            text_column="body",
            rating_column="stars",
            predictor=fake_predictor,
        )
    response = client.post(
        "/api/v1/tasks",
        content=example_yaml("ethioemo-amharic", onboarding_quiz=None).encode(),
        headers={**researcher.headers, "Content-Type": "application/yaml"},
    )
    client.post(f"/api/v1/tasks/{response.json()['name']}/rounds", json={}, headers=researcher.headers)
    with pytest.raises(HarvestError, match=r"is multi_label: harvesting.*predicts a set.*dynaloop round import"):
        harvest(factory, response.json()["name"], 1, corpus, model_dir, 10, predictor=fake_predictor)
    response = client.post(
        "/api/v1/tasks",
        content=example_yaml("mad-tsc", onboarding_quiz=None).encode(),
        headers={**researcher.headers, "Content-Type": "application/yaml"},
    )
    assert response.status_code == 201, response.text
    client.post(f"/api/v1/tasks/{response.json()['name']}/rounds", json={}, headers=researcher.headers)
    before = table_counts(app)
    with pytest.raises(HarvestError, match="is target_dependent: its examples need a target span"):
        harvest(factory, response.json()["name"], 1, corpus, model_dir, 10, predictor=fake_predictor)
    assert table_counts(app) == before


def test_a_sentence_level_file_is_not_split_again(
    app: FastAPI, client: TestClient, researcher: Actor, model_dir: Path, tmp_path: Path
) -> None:
    """Issue 17: rows that are already one example each (DynaSent's own rows, some of them two
    sentences long) stay one example each with --no-split-sentences; the default (documents)
    cuts them and the report says how many rows were cut."""
    _open(client, researcher)
    rows = [
        {"id": "a", "rating": 1, "text": "The great soup was fine. But the awful wait ruined it."},
        {"id": "b", "rating": 5, "text": "Dr. Lee's awful-looking cake tasted great!"},
        {"id": "c", "rating": 3, "text": "Plain lunch.\nNothing to add, really."},
        {"id": "d", "rating": 1, "text": "The plain room was quiet and clean."},
    ]
    corpus = tmp_path / "sentences.jsonl"
    corpus.write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8")
    factory = app.state.sessionmaker
    options: dict[str, Any] = {"id_column": "id", "predictor": fake_predictor, "min_chars": 5}
    whole = harvest(factory, "dynasent-r2", 1, corpus, model_dir, 10, split_sentences=False, **options)
    assert (whole.documents, whole.sentences, whole.written) == (4, 4, 4)
    assert whole.split_sentences is False and whole.split_rows == 0
    assert not any("--no-split-sentences" in note for note in whole.notes)
    with session_scope(factory) as session:
        examples = session.scalars(select(Example).order_by(Example.id)).all()
        by_document = {e.source_metadata["document_id"]: e for e in examples}
        assert sorted(by_document) == ["a", "b", "c", "d"] and len(examples) == 4
        assert by_document["a"].text == rows[0]["text"]
        assert by_document["c"].text == "Plain lunch. Nothing to add, really."  # the line break is a space
        assert {e.source_metadata["sentence_index"] for e in examples} == {0}
    # The same file as documents: rows a and c become two sentences each (b stays whole: pysbd
    # knows "Dr."), and the report says so.
    cut = harvest(factory, "dynasent-r2", 1, corpus, model_dir, 10, **options)
    assert cut.split_sentences is True and cut.split_rows == 2
    assert cut.sentences == 6 and cut.skipped["already_in_round"] == 2  # b and d were harvested whole already
    assert any("2 of 4 rows were cut" in note and "--no-split-sentences" in note for note in cut.notes)


def test_cli_harvest_with_the_real_model(
    app: FastAPI, client: TestClient, researcher: Actor, database_url: str, model_dir: Path, tmp_path: Path
) -> None:
    _open(client, researcher)
    corpus = write_corpus(tmp_path / "reviews.csv")
    runner = CliRunner()
    base = [
        "round",
        "harvest",
        "--task",
        "dynasent-r2",
        "--round",
        "1",
        "--model",
        str(model_dir),
        "--database-url",
        database_url,
    ]
    result = runner.invoke(
        cli,
        [
            *base,
            "--corpus",
            str(corpus),
            "--n",
            "12",
            "--text-column",
            "body",
            "--rating-column",
            "stars",
            "--seed",
            "5",
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "19 texts, 56 sentences; model model-0 version 0" in result.output
    assert "wrote 12 examples to dynasent-r2 round 1" in result.output and POOL_RANDOM in result.output
    with session_scope(app.state.sessionmaker) as session:
        predictions = [e.model_prediction for e in session.scalars(select(Example))]
    assert len(predictions) == 12 and all(p is not None and p[0] in LABELS for p in predictions)
    assert "19 of 19 rows were cut into more than one sentence" in result.output  # the note names the option
    assert "--no-split-sentences" in result.output
    # --no-split-sentences: each review is one example, kept whole.
    columns = ["--text-column", "body", "--rating-column", "stars", "--id-column", "review_id"]
    result = runner.invoke(
        cli,
        [*base, "--corpus", str(corpus), "--n", "3", *columns, "--no-split-sentences"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "19 texts, 19 sentences" in result.output and "wrote 3 examples" in result.output
    assert "rows were cut" not in result.output
    with session_scope(app.state.sessionmaker) as session:
        whole = [e.text for e in session.scalars(select(Example)) if e.text.count(".") == 3]
    # three whole reviews (three sentences each, the line break made a space); the 12 before are single sentences
    assert len(whole) == 3 and all("\n" not in text and ". The " in text for text in whole), whole
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"body": "Nice place here.", "stars": "five"}) + "\n", encoding="utf-8")
    result = runner.invoke(
        cli,
        [*base, "--corpus", str(bad), "--n", "3", "--text-column", "body", "--rating-column", "stars"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 1 and "no numeric 'stars'" in result.output and "Traceback" not in result.output
    result = runner.invoke(cli, [*base, "--corpus", str(corpus), "--n", "3", "--as", "both"])
    assert result.exit_code == 1 and "--as takes examples or prompts" in result.output
