"""Multi-label rounds that follow EthioEmo's protocol (§3.3), through the real API and database:
per-label gold from 2 of 3, re-annotation of disagreements by *new* validators once (gold from
the new labels only, then dropped), rare label sets, neutral kept exclusive, agreement on the
first pass, and a report whose multi-label section says only what the build's numbers show."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import krippendorff
import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from model_server.backends.base import decide
from model_server.directory import ModelMetadata, multi_label_choice
from rounds.build import agreement
from rounds.build.multilabel_report import last_pass_responses, multilabel_agreement_summary
from rounds.build.multilabel_splits import build_multilabel_splits
from rounds.build.response_sets import select_responses
from rounds.models.datasets import LabelledSet
from rounds.models.metrics import compute_metrics
from services.db.models import Example, ExampleStatus, Round, RoundBuild, RoundStatus, Validation
from services.domain.labels import check_validation_label, exclusive_gold, gold_label, last_pass
from services.errors import Invalid
from services.settings import Settings
from services.taskdef import parse_task_definition
from tests.built_round import write_and_label
from tests.conftest import Actor, MakeUser, example_yaml, label_example, open_round
from tests.stub_model_server import ThreadedServer

EMOTIONS = ["anger", "disgust", "fear", "joy", "sadness", "surprise", "neutral"]
TASK = "ethioemo-amharic"


def _definition() -> Any:
    return parse_task_definition(example_yaml(TASK, onboarding_quiz=None), source=TASK)


def _texts(i: int, word: str) -> str:
    return f"text number {i} about {word} ጽሑፍ"


def _label(client: TestClient, validator: Actor, example_id: int, label: Any) -> None:
    response = label_example(client, validator, example_id, label)
    assert response.status_code == 201, response.text


def _examples(settings: Settings) -> dict[str, Example]:
    engine = create_engine(settings.database_url)
    try:
        with Session(engine) as session:
            rows = session.scalars(select(Example)).all()
            for row in rows:
                session.expunge(row)
            return {row.text: row for row in rows}
    finally:
        engine.dispose()


def _dataset(client: TestClient, researcher: Actor) -> dict[str, dict[str, Any]]:
    response = client.get(f"/api/v1/tasks/{TASK}/rounds/1/dataset", params={"split": "all"}, headers=researcher.headers)
    assert response.status_code == 200, response.text
    return {row["text"]: row for row in (json.loads(line) for line in response.text.splitlines())}


# The first pass of every example: three validators (v0, v1, v2).
PLAN: list[tuple[list[str], str, list[Any]]] = [
    *[(["joy"], _texts(i, "joy"), [["joy"], ["joy"], ["joy", "surprise"]]) for i in range(6)],
    *[(["anger"], _texts(10 + i, "anger"), [["anger", "disgust"], ["anger", "disgust"], ["anger"]]) for i in range(6)],
    *[(["sadness"], _texts(20 + i, "sadness"), [["sadness"], ["sadness"], ["sadness", "fear"]]) for i in range(4)],
    # A label *set* that occurs once: the old builder refused the whole round for it.
    (["fear", "surprise"], _texts(30, "fear surprise"), [["fear", "surprise"], ["fear", "surprise"], ["fear"]]),
    # "No emotion" sent as an empty set: stored as the exclusive neutral.
    *[(["neutral"], _texts(40 + i, "neutral"), [[], ["neutral"], []]) for i in range(4)],
    # Disagreements: re-queued for new validators.
    (["fear"], _texts(50, "resolved"), [["fear", "joy"], ["sadness"], ["surprise"]]),
    (["anger"], _texts(51, "unresolved"), [["anger"], ["joy"], ["fear"]]),
]
RESOLVED, UNRESOLVED = _texts(50, "resolved"), _texts(51, "unresolved")


def _open(client: TestClient, researcher: Actor, model: ThreadedServer) -> dict[str, Any]:
    prompts = [f"Prompt {i}: ስለ ምግቡ አስተያየት" for i in range(40)]
    return open_round(
        client,
        researcher,
        example_yaml(TASK, onboarding_quiz=None),
        model.url,
        prompts,
        target_label_mode="writer_choice",
    )


@pytest.mark.both_databases
def test_reannotated_multilabel_round_builds_with_rare_sets_and_an_honest_report(
    client: TestClient,
    researcher: Actor,
    make_user: MakeUser,
    stub_multi_label_model: ThreadedServer,
    settings: Settings,
) -> None:
    round_ = _open(client, researcher, stub_multi_label_model)
    writer = make_user("amara", "writer")
    first = [make_user(f"ev{i}", "validator") for i in range(3)]
    new = [make_user(f"nv{i}", "validator") for i in range(3)]
    write_and_label(client, writer, first, round_["id"], [(t, x, None, labels) for t, x, labels in PLAN])
    examples = _examples(settings)
    assert examples[_texts(40, "neutral")].status is ExampleStatus.validated
    for text in (RESOLVED, UNRESOLVED):
        assert examples[text].status is ExampleStatus.validating and examples[text].requeue_count == 1
        assert examples[text].validations_needed == 6
    stats = client.get(f"/api/v1/rounds/{round_['id']}/stats", headers=researcher.headers).json()["examples"]
    assert stats["awaiting_reannotation"] == 2
    assert stats["awaiting_reannotation_no_new_validator"] == 2  # only ev0-ev2 have labelled so far

    # A first-pass validator cannot label twice; new validators re-annotate.
    again = client.post(
        f"/api/v1/examples/{examples[RESOLVED].id}/validations", json={"label": ["fear"]}, headers=first[0].headers
    )
    assert again.status_code == 409
    # Gold from the new labels only: joy (2 of 3). On all six labels >= 2 would give fear+joy.
    for validator, label in zip(new, [["joy"], ["fear"], ["joy"]], strict=True):
        _label(client, validator, examples[RESOLVED].id, label)
    for validator, label in zip(new, [["sadness"], ["surprise"], ["disgust"]], strict=True):
        _label(client, validator, examples[UNRESOLVED].id, label)
    examples = _examples(settings)
    assert examples[RESOLVED].status is ExampleStatus.validated
    assert examples[UNRESOLVED].status is ExampleStatus.dropped

    assert client.post(f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    response = client.post(f"/api/v1/rounds/{round_['id']}/build", json={"seed": 3}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    report = response.json()["report"]
    rows = _dataset(client, researcher)

    # Gold: per label, neutral alone, the re-annotated example from its new labels only.
    assert rows[_texts(0, "joy")]["gold_label"] == ["joy"]
    assert rows[_texts(10, "anger")]["gold_label"] == ["anger", "disgust"]
    assert rows[_texts(30, "fear surprise")]["gold_label"] == ["fear", "surprise"]
    assert rows[_texts(40, "neutral")]["gold_label"] == ["neutral"]
    assert rows[RESOLVED]["gold_label"] == ["joy"]
    assert len(rows[RESOLVED]["responses"]) == 6, "both passes are exported"
    assert rows[UNRESOLVED]["split"] == "excluded" and rows[UNRESOLVED]["gold_label"] is None
    assert report["counts"]["excluded"] == {"no_gold_after_reannotation": 1}
    assert all(r["gold_label"] for r in rows.values() if r["split"] in ("train", "dev", "test"))
    # The live estimate (re-queueing) and the builder agree on every example's gold.
    definition = _definition()
    engine = create_engine(settings.database_url)
    try:
        with Session(engine) as session:
            for example in session.scalars(select(Example)):
                counted = session.execute(
                    select(Validation.annotation_pass, Validation.label)
                    .where(Validation.example_id == example.id, Validation.counted.is_(True))
                    .order_by(Validation.id)
                ).all()
                live = gold_label(definition, last_pass([p for p, _ in counted], [lab for _, lab in counted]))
                assert live == rows[example.text]["gold_label"], example.text
    finally:
        engine.dispose()

    # Splits: every label with examples is in train; dev/test gold is strong enough; per-label
    # counts in the report are the dataset's.
    section = report["multi_label"]
    assert set(report["counts"]["rows"]) == set(EMOTIONS), report["counts"]
    for label in EMOTIONS:
        per_split = Counter(r["split"] for r in rows.values() if r["gold_label"] and label in r["gold_label"])
        assert section["label_counts"][label] == {s: per_split.get(s, 0) for s in ("train", "dev", "test")}
        assert report["counts"]["rows"][label]["train"] == per_split.get("train", 0), report["counts"]
        if sum(per_split.values()):
            assert per_split["train"] >= 1, label
    assessed = [r for r in rows.values() if r["split"] in ("dev", "test")]
    assert assessed and all(r["gold_votes"] >= 2 for r in assessed)
    assert report["counts"]["total"]["dev"] == sum(r["split"] == "dev" for r in rows.values())
    assert section["reannotation"] == {
        "requeued": 2,
        "resolved_by_new_validators": 1,
        "dropped_after_reannotation": 1,
        "awaiting_reannotation": 0,
    }

    # Agreement: the three labels per example gold was decided on (a re-annotated example's new
    # labels), per label, checked independently.
    gold_pass = {text: labels for _, text, labels in PLAN}
    gold_pass[RESOLVED] = [["joy"], ["fear"], ["joy"]]
    gold_pass[UNRESOLVED] = [["sadness"], ["surprise"], ["disgust"]]
    assert section["agreement"]["n_raters"] == 3 and section["agreement"]["n_examples"] == len(PLAN)
    assert section["agreement"]["examples_left_out"] == 0
    for label in ("joy", "anger", "neutral", "fear"):
        value_counts = []
        for labels in gold_pass.values():
            stored = [lab or ["neutral"] for lab in labels]
            chosen = sum(label in lab for lab in stored)
            value_counts.append([chosen, 3 - chosen])
        expected = krippendorff.alpha(value_counts=np.array(value_counts), level_of_measurement="nominal")
        assert section["agreement"]["per_label"][label]["alpha"] == pytest.approx(expected, abs=1e-4)
    assert report["agreement"]["mean_krippendorff_alpha"] is not None
    assert report["agreement"]["n_examples"] == len(PLAN)
    # The first passes of the two re-annotated examples are exported, read by no statistic.
    selection = report["responses"]
    assert selection["earlier_passes"] == 6 and selection["examples_reannotated"] == 2
    assert selection["set_aside"] == 0 and selection["used"] == 3 * len(PLAN)
    assert "their earlier passes' 6 response(s) are exported and read by no statistic" in selection["statement"]
    assert report["datasheet"]["responses_used"] == selection["statement"]
    # Model-based labels (Dawid-Skene per label) for every example with gold, neutral alone.
    for text in (_texts(0, "joy"), _texts(10, "anger"), _texts(40, "neutral"), RESOLVED):
        assert rows[text]["model_based_label"] == rows[text]["gold_label"], text
    assert report["model_based"]["method"] == "dawid_skene" and report["model_based"]["with_gold"] >= 20

    # Human F1 per split: synthetic annotators from the gold-deciding responses.
    for split in ("dev", "test"):
        if any(r["split"] == split for r in rows.values()):
            human = section["human_f1"][split]
            assert 0 < human["micro_f1"] <= 1 and 0 < human["macro_f1"] <= 1
            assert human["n_annotators"] == 3
            assert section["model"][split]["n"] == sum(r["split"] == split for r in rows.values())

    markdown = client.get(
        f"/api/v1/tasks/{TASK}/rounds/1/report", params={"format": "markdown"}, headers=researcher.headers
    ).text
    assert "Model at chance" not in markdown
    assert "Multi-label round" in markdown and "Human estimate and model on dev and test" in markdown
    assert "dropped after reannotation 1" in markdown


def test_three_validators_cannot_reannotate_and_the_build_says_so(
    client: TestClient,
    researcher: Actor,
    make_user: MakeUser,
    stub_multi_label_model: ThreadedServer,
    settings: Settings,
) -> None:
    round_ = _open(client, researcher, stub_multi_label_model)
    writer = make_user("amara", "writer")
    validators = [make_user(f"ev{i}", "validator") for i in range(3)]
    write_and_label(client, writer, validators, round_["id"], [(t, x, None, labels) for t, x, labels in PLAN])
    # Every validator of the round labelled the re-queued examples already: none is offered them.
    for validator in validators:
        batch = client.get(f"/api/v1/rounds/{round_['id']}/validation-batch", headers=validator.headers)
        assert batch.status_code == 200, batch.text
        assert batch.json()["count"] == 0, "nothing left that this validator has not labelled"
    stats = client.get(f"/api/v1/rounds/{round_['id']}/stats", headers=researcher.headers).json()["examples"]
    assert stats["awaiting_reannotation"] == 2 and stats["awaiting_reannotation_no_new_validator"] == 2

    client.post(f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    response = client.post(f"/api/v1/rounds/{round_['id']}/build", json={}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    report = response.json()["report"]
    rows = _dataset(client, researcher)
    for text in (RESOLVED, UNRESOLVED):
        assert rows[text]["split"] == "excluded" and rows[text]["gold_label"] is None
        assert rows[text]["flags"] == ["awaiting_reannotation"]
    assert report["counts"]["excluded"] == {"awaiting_reannotation": 2}
    assert report["multi_label"]["reannotation"]["awaiting_reannotation"] == 2
    assert any("re-queued for new validators who never labelled" in n for n in report["multi_label"]["notes"])
    # Nothing without gold in any split ("no majority" in train was the old behaviour).
    assert "no majority" not in report["counts"]["rows"]


def test_neutral_is_exclusive_in_validation(
    client: TestClient,
    researcher: Actor,
    make_user: MakeUser,
    stub_multi_label_model: ThreadedServer,
    settings: Settings,
) -> None:
    round_ = _open(client, researcher, stub_multi_label_model)
    writer = make_user("amara", "writer")
    validator = make_user("ev0", "validator")
    write_and_label(client, writer, [], round_["id"], [(["joy"], _texts(0, "joy"), None, [])])
    example = _examples(settings)[_texts(0, "joy")]

    def count() -> int:
        engine = create_engine(settings.database_url)
        try:
            with Session(engine) as session:
                return int(session.scalar(select(func.count()).select_from(Validation)) or 0)
        finally:
            engine.dispose()

    refused = client.post(
        f"/api/v1/examples/{example.id}/validations", json={"label": ["neutral", "joy"]}, headers=validator.headers
    )
    assert refused.status_code == 422 and "cannot be combined" in refused.json()["error"]["message"]
    assert count() == 0
    _label(client, validator, example.id, [])
    engine = create_engine(settings.database_url)
    try:
        with Session(engine) as session:
            stored = session.scalars(select(Validation)).one()
            assert stored.label == ["neutral"] and stored.annotation_pass == 0
    finally:
        engine.dispose()


def test_empty_label_set_without_an_exclusive_label_is_refused() -> None:
    definition = _definition()
    assert check_validation_label(definition, []) == ["neutral"]
    plain = definition.model_copy(update={"exclusive_labels": []})
    with pytest.raises(Invalid, match="no exclusive no-emotion label"):
        check_validation_label(plain, [])


def test_gold_keeps_neutral_exclusive_and_uses_the_last_pass() -> None:
    definition = _definition()
    assert exclusive_gold(definition, ["joy", "neutral"]) == ["joy"], "emotions win over neutral"
    assert exclusive_gold(definition, ["neutral"]) == ["neutral"]
    assert exclusive_gold(definition, []) is None
    # Six votes where neutral and joy both reach 2: joy alone.
    assert gold_label(definition, [["neutral"], ["neutral"], ["joy"], ["joy"]]) == ["joy"]
    passes = [0, 0, 0, 1, 1, 1]
    responses = [["fear", "joy"], ["sadness"], ["surprise"], ["joy"], ["fear"], ["joy"]]
    assert gold_label(definition, last_pass(passes, responses)) == ["joy"]
    assert gold_label(definition, responses) == ["fear", "joy"]


def test_prediction_keeps_neutral_exclusive() -> None:
    neutral = EMOTIONS.index("neutral")
    # neutral wins: only neutral
    assert multi_label_choice([0.1, 0, 0, 0.7, 0, 0, 0.9], threshold=0.5, exclusive=[neutral]) == [neutral]
    # emotions pass, neutral too but not the best: neutral dropped
    assert multi_label_choice([0.8, 0.6, 0, 0, 0, 0, 0.7], threshold=0.5, exclusive=[neutral]) == [0, 1]
    # nothing passes: neutral
    assert multi_label_choice([0.2, 0.1, 0, 0.3, 0, 0, 0.1], threshold=0.5, exclusive=[neutral]) == [neutral]
    # no exclusive label: the server falls back to the best label, evaluation to none
    assert multi_label_choice([0.2, 0.4], threshold=0.5) == [1]
    assert multi_label_choice([0.2, 0.4], threshold=0.5, at_least_one=False) == []

    metadata = ModelMetadata(model_id="m", labels=EMOTIONS, family="multi_label", exclusive_labels=["neutral"])
    assert decide(metadata, [0.8, 0.6, 0, 0, 0, 0, 0.7], False).labels == ["anger", "disgust"]
    assert decide(metadata, [0.1, 0, 0, 0.7, 0, 0, 0.9], False).labels == ["neutral"]
    assert decide(metadata, [0.1] * 7, False).labels == ["neutral"]

    gold = np.zeros((3, 7))
    gold[0, [0, 1]] = 1
    gold[1, neutral] = 1
    gold[2, neutral] = 1
    labelled = LabelledSet("toy", EMOTIONS, True, ["a", "b", "c"], gold)
    probabilities = np.array(
        [[0.8, 0.6, 0, 0, 0, 0, 0.7], [0.1, 0, 0, 0.7, 0, 0, 0.9], [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]]
    )
    exclusive = compute_metrics(labelled, probabilities, exclusive_labels=["neutral"])
    assert exclusive.accuracy == 1.0, "every row predicted exactly its gold set"
    plain = compute_metrics(labelled, probabilities)
    assert plain.accuracy == 0.0, "without the rule neutral is predicted together with emotions"


def test_agreement_reads_one_response_set_per_example_and_says_which_examples_it_leaves_out() -> None:
    # Example 1: a first pass of 3 then a re-annotation of 3; example 2: 3; example 3: 2.
    responses = pd.DataFrame(
        {
            "example_id": [1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3],
            "worker_id": ["a", "b", "c", "d", "e", "f", "a", "b", "c", "a", "b"],
            "label": [
                ("fear", "joy"),
                ("sadness",),
                ("surprise",),
                ("joy",),
                ("fear",),
                ("joy",),
                ("joy",),
                ("joy",),
                ("anger",),
                ("anger",),
                ("anger",),
            ],
        }
    )
    passes = np.array([0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="same number"):
        agreement.multilabel_agreement(responses, labels=EMOTIONS)
    sets = select_responses(_definition(), responses, passes)
    # Gold and every statistic read example 1's re-annotation; its first pass is kept for the export.
    assert list(sets.used.loc[sets.used["example_id"] == 1, "worker_id"]) == ["d", "e", "f"]
    assert len(sets.kept) == 11 and sets.selection.earlier_passes == 3 and sets.selection.set_aside == 0
    assert sets.selection.examples_with_fewer == 1
    ml, summary = multilabel_agreement_summary(sets.used, labels=EMOTIONS, k=3)
    assert ml is not None and summary["n_examples"] == 2 and summary["examples_left_out"] == 1
    # Every per-label figure reads examples 1 (last pass) and 2 alone: prevalence and alpha too.
    joy = [[2, 1], [2, 1]]  # (chosen, not chosen) of joy on examples 1 and 2
    expected = krippendorff.alpha(value_counts=np.array(joy), level_of_measurement="nominal")
    assert summary["per_label"]["joy"]["alpha"] == pytest.approx(expected, abs=1e-4)
    assert summary["per_label"]["joy"]["prevalence"] == pytest.approx(4 / 6, abs=1e-4)
    assert summary["per_label"]["anger"]["prevalence"] == pytest.approx(1 / 6, abs=1e-4)
    last = last_pass_responses(responses, passes)
    assert list(last.loc[last["example_id"] == 1, "worker_id"]) == ["d", "e", "f"]


def test_multilabel_splits_are_deterministic_and_keep_every_label_in_train() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(200):
        k = rng.choice([1, 1, 2])
        gold = tuple(sorted(rng.choice(EMOTIONS[:6], size=k, replace=False).tolist()))
        rows.append(
            {
                "example_id": i,
                "gold": gold,
                "gold_votes": int(rng.choice([2, 3])),
                "prompt_id": i // 2,
                "condition": "prompt",
                "model_prediction": ("joy",),
            }
        )
    rows.append(
        {
            "example_id": 999,
            "gold": ("neutral",),
            "gold_votes": 3,
            "prompt_id": None,
            "condition": "no_prompt",
            "model_prediction": None,
        }
    )
    frame = pd.DataFrame(rows)
    one = build_multilabel_splits(frame, EMOTIONS, min_votes=3, seed=5)
    two = build_multilabel_splits(frame.sample(frac=1, random_state=1), EMOTIONS, min_votes=3, seed=5)
    assert one.assignment.equals(two.assignment)
    split = one.assignment
    assert split.loc[999] == "train", "the only neutral example stays in train"
    for label in EMOTIONS:
        has = [e for e, g in zip(frame["example_id"], frame["gold"], strict=True) if label in g]
        assert (split.loc[has] == "train").any()
    assessed = split[split.isin(["dev", "test"])].index
    votes = frame.set_index("example_id")["gold_votes"]
    assert (votes.loc[assessed] >= 3).all()
    prompts = frame.set_index("example_id")["prompt_id"].loc[assessed]
    assert prompts.is_unique, "no two dev/test examples share a prompt"
    # No example that shares a prompt with dev/test is in train.
    by_prompt = frame.set_index("example_id")["prompt_id"]
    train_prompts = set(by_prompt.loc[split[split == "train"].index].dropna())
    assert not train_prompts & set(prompts)
    # Per-label counts in the report are the assignment's.
    counts = one.report.counts_by_gold
    for label in EMOTIONS:
        for name in ("train", "dev", "test"):
            ids = split[split == name].index
            expected = sum(label in g for g in frame.set_index("example_id").loc[ids, "gold"])
            assert counts.loc[label, name] == expected
    assert one.report.model_metrics["dev"]["n"] == (split == "dev").sum()


@pytest.mark.both_databases
def test_a_failing_statistic_is_a_one_line_4xx_and_changes_nothing(
    client: TestClient,
    researcher: Actor,
    make_user: MakeUser,
    stub_multi_label_model: ThreadedServer,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    round_ = _open(client, researcher, stub_multi_label_model)
    writer = make_user("amara", "writer")
    validators = [make_user(f"ev{i}", "validator") for i in range(3)]
    write_and_label(client, writer, validators, round_["id"], [(t, x, None, labels) for t, x, labels in PLAN[:8]])
    client.post(f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)

    def broken(outcome: Any) -> Any:
        raise ValueError("examples have between 3 and 6 responses;\n Fleiss-type kappas need the same number")

    monkeypatch.setattr("rounds.build.report_assembly.multilabel_report.multilabel_section", broken)
    response = client.post(f"/api/v1/rounds/{round_['id']}/build", json={}, headers=researcher.headers)
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert "\n" not in message and message.startswith("round 1 cannot be built: examples have between 3 and 6")
    engine = create_engine(settings.database_url)
    try:
        with Session(engine) as session:
            assert session.scalar(select(func.count()).select_from(RoundBuild)) == 0
            assert session.scalar(select(Round.status)) is RoundStatus.closed
    finally:
        engine.dispose()
    monkeypatch.undo()
    assert client.post(f"/api/v1/rounds/{round_['id']}/build", json={}, headers=researcher.headers).status_code == 201


def test_a_trained_multi_label_model_keeps_neutral_exclusive(tmp_path: Path) -> None:
    from model_server.backends import ClassifyInput, load_backend
    from rounds.models.init_model import init_model_dir
    from rounds.models.train import TrainConfig, TrainingError, train_model

    labels = ["anger", "joy", "neutral"]
    base = tmp_path / "base"
    init_model_dir(base, labels=labels, family="multi_label", tiny=True, exclusive_labels=["neutral"])
    assert ModelMetadata.load(base).exclusive_labels == ["neutral"]
    texts = [f"I am {word} today {i}" for i in range(8) for word in ("furious", "happy", "here")]
    y = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1]] * 8, dtype=np.float32)
    emotions = LabelledSet("emotions", labels, True, texts, y)
    cfg = TrainConfig(base=base, epochs=1, batch_size=8, learning_rate=5e-3, max_length=32, cpu=True)

    def run(out: str, exclusive: list[str]) -> Any:
        return train_model(
            [emotions],
            emotions,
            labels=labels,
            family="multi_label",
            input_format="text",
            config=cfg,
            out_dir=tmp_path / out,
            model_id="toy",
            exclusive_labels=exclusive,
            progress=False,
        )

    with pytest.raises(TrainingError, match="not among the labels"):
        run("bad", ["none"])
    result = run("out", ["neutral"])
    assert ModelMetadata.load(result.out_dir).exclusive_labels == ["neutral"]
    backend = load_backend(result.out_dir, device="cpu")
    for output in backend.predict([ClassifyInput(text) for text in texts[:6]]):
        assert output.labels and ("neutral" not in output.labels or output.labels == ["neutral"])


def test_a_multi_label_round_without_labels_builds_with_everything_excluded(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_multi_label_model: ThreadedServer
) -> None:
    round_ = _open(client, researcher, stub_multi_label_model)
    writer = make_user("amara", "writer")
    write_and_label(client, writer, [], round_["id"], [(t, x, None, []) for t, x, _ in PLAN[:3]])
    client.post(f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    response = client.post(f"/api/v1/rounds/{round_['id']}/build", json={}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    report = response.json()["report"]
    assert report["counts"]["total"] == {"dist_train": 0, "train": 0, "dev": 0, "test": 0}
    assert report["counts"]["excluded"] == {"no_counted_labels": 3}
    assert report["multi_label"]["human_f1"] == {} and report["multi_label"]["agreement"]["n_examples"] == 0
