"""Label display names (the task YAML's ``label_names``) through the API: every answer that
carries labels for people also carries their display names, requests take only the labels, and
a display name sent as a label is refused with a 422 that names the labels, changing nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from rounds.build import dataset_card
from rounds.build.report import render_markdown
from services.taskdef import example_path, load_task_definition
from tests.conftest import Actor, example_yaml, label_example, open_round, served_examples, table_counts, table_snapshot
from tests.stub_model_server import ThreadedServer

REPORTS = Path(__file__).parent / "data" / "round_reports"
NAMES = {"positive": "Positive", "negative": "Negative", "neutral": "No sentiment", "mixed": "Mixed sentiment"}
TASK_LABELS = ["positive", "negative", "neutral"]
PROMPTS = ["The soup was fine and the bread was fresh.", "We went there on a Sunday afternoon."]
FOOLING_WORD = {"positive": "terrible", "negative": "great", "neutral": "great"}


@pytest.fixture
def dynasent_round(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)


def _fooling_attempt(client: TestClient, writer: Actor, round_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    assignment = client.post(f"/api/v1/rounds/{round_id}/assignments", json={}, headers=writer.headers).json()
    target = assignment["target_label"][0]
    text = f"{assignment['prompt']['text']} Honestly {FOOLING_WORD[target]} stuff"
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts", json={"text": text}, headers=writer.headers
    )
    assert response.status_code == 201 and response.json()["fooled"] is True, response.text
    return assignment, response.json()


def _submitted_example(client: TestClient, writer: Actor, validator: Actor, round_id: int) -> int:
    """A writer's confirmed fooling example, as it reaches a validator's batch; its id."""
    assignment, attempt = _fooling_attempt(client, writer, round_id)
    client.post(f"/api/v1/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers)
    submitted = client.post(
        f"/api/v1/assignments/{assignment['id']}/example", json={"attempt_id": attempt["id"]}, headers=writer.headers
    )
    assert submitted.status_code == 201, submitted.text
    batch = client.get(f"/api/v1/rounds/{round_id}/validation-batch", headers=validator.headers).json()
    assert batch["validation_labels"] == list(NAMES) and batch["label_names"] == NAMES
    return int(served_examples(client, batch)[0] or 0)


def test_task_answers_carry_every_display_name(
    client: TestClient, dynasent_round: dict[str, Any], writer: Actor
) -> None:
    task = client.get("/api/v1/tasks/dynasent-r2", headers=writer.headers).json()
    assert task["label_names"] == NAMES  # labels and validation labels
    assert task["definition"]["label_names"] == NAMES  # as written in the YAML
    listed = client.get("/api/v1/tasks", headers=writer.headers).json()["data"]
    assert [t["label_names"] for t in listed if t["name"] == "dynasent-r2"] == [NAMES]


def test_a_task_without_display_names_shows_its_labels(client: TestClient, researcher: Actor) -> None:
    created = client.post(
        "/api/v1/tasks",
        json={
            "definition_yaml": example_yaml("dynasent-r2", label_names=None).replace(
                "name: dynasent-r2", "name: plain-sentiment", 1
            )
        },
        headers=researcher.headers,
    )
    assert created.status_code == 201, created.text
    assert created.json()["label_names"] == {label: label for label in NAMES}


@pytest.mark.both_databases
def test_a_bad_display_name_map_is_refused_and_creates_nothing(client: TestClient, researcher: Actor, app: Any) -> None:
    before = table_counts(app)
    response = client.post(
        "/api/v1/tasks",
        json={"definition_yaml": example_yaml("dynasent-r2", label_names={"neutral": "Both", "mixed": "both"})},
        headers=researcher.headers,
    )
    assert response.status_code == 422
    assert "labels 'neutral' and 'mixed' would both be shown as 'both'" in response.text
    assert table_counts(app) == before


def test_assignment_and_batch_carry_display_names_and_labels_stay_the_values(
    client: TestClient, dynasent_round: dict[str, Any], writer: Actor, validators: list[Actor]
) -> None:
    assignment, attempt = _fooling_attempt(client, writer, dynasent_round["id"])
    target = assignment["target_label"][0]
    assert target in TASK_LABELS and assignment["label_names"] == {label: NAMES[label] for label in TASK_LABELS}
    others = " or ".join(NAMES[label] for label in TASK_LABELS if label != target)
    assert assignment["goal"] == (
        f"Write a sentence a person would label {NAMES[target]} that fools the model into predicting {others}. "
        "Edit the prompt to get there."
    )
    # Predictions and probabilities keep the labels; the names are in label_names.
    assert attempt["prediction"][0] in TASK_LABELS and set(attempt["probabilities"]) == set(TASK_LABELS)
    state = client.get(f"/api/v1/assignments/{assignment['id']}", headers=writer.headers).json()
    assert state["label_names"] == assignment["label_names"] and state["attempts"][0]["prediction"][0] in TASK_LABELS

    example_id = _submitted_example(client, writer, validators[0], dynasent_round["id"])
    saved = label_example(client, validators[1], example_id, "neutral")
    assert saved.status_code == 201 and saved.json()["label"] == ["neutral"]


@pytest.mark.parametrize("sent", ["No sentiment", "no sentiment", ["Mixed sentiment"], "Positive"])
def test_a_display_name_is_not_a_validation_label(
    client: TestClient, dynasent_round: dict[str, Any], writer: Actor, validators: list[Actor], app: Any, sent: Any
) -> None:
    example_id = _submitted_example(client, writer, validators[0], dynasent_round["id"])
    before = table_snapshot(app, "validations", "examples")
    response = client.post(
        f"/api/v1/examples/{example_id}/validations", json={"label": sent}, headers=validators[0].headers
    )
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    name = sent[0] if isinstance(sent, list) else sent
    label = next(label for label, shown in NAMES.items() if shown.casefold() == name.casefold())
    assert "use one of ['positive', 'negative', 'neutral', 'mixed']" in message
    assert f"{name!r} is what people see for {label!r}: send the label, not its display name" in message
    assert table_snapshot(app, "validations", "examples") == before


def test_a_display_name_is_not_a_judged_label(
    client: TestClient, dynasent_round: dict[str, Any], writer: Actor, app: Any
) -> None:
    assignment, attempt = _fooling_attempt(client, writer, dynasent_round["id"])
    other = next(label for label in TASK_LABELS if label != assignment["target_label"][0])
    before = table_snapshot(app, "attempts")
    response = client.post(
        f"/api/v1/attempts/{attempt['id']}/confirmation",
        json={"agrees": False, "judged_label": NAMES[other]},
        headers=writer.headers,
    )
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert "use one of ['positive', 'negative', 'neutral']" in message and f"for {other!r}" in message
    assert table_snapshot(app, "attempts") == before
    # The label itself is taken.
    response = client.post(
        f"/api/v1/attempts/{attempt['id']}/confirmation",
        json={"agrees": False, "judged_label": other},
        headers=writer.headers,
    )
    assert response.status_code == 200 and response.json()["judged_label"] == [other]


def test_a_display_name_is_not_a_target_label(
    client: TestClient, researcher: Actor, stub_model: ThreadedServer, writer: Actor, app: Any
) -> None:
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        stub_model.url,
        PROMPTS,
        target_label_mode="writer_choice",
    )
    before = table_counts(app)
    response = client.post(
        f"/api/v1/rounds/{round_['id']}/assignments", json={"target_label": "No sentiment"}, headers=writer.headers
    )
    assert response.status_code == 422 and "'No sentiment' is what people see for 'neutral'" in response.text
    assert table_counts(app) == before


def test_the_report_shows_display_names_next_to_the_labels() -> None:
    report = json.loads((REPORTS / "dynasent-r2.json").read_text(encoding="utf-8"))
    assert report["label_names"] == NAMES and set(report["counts"]["rows"]) >= set(TASK_LABELS)  # data: labels
    markdown = render_markdown(report)
    assert "| No sentiment (`neutral`) |" in markdown and "| Positive (`positive`) |" in markdown
    assert "| no majority |" in markdown  # rows that are no label stay as they are
    # A pipe in a display name stays inside its table cell.
    piped = render_markdown({**report, "label_names": {**NAMES, "neutral": "No | sentiment"}})
    assert "| No \\| sentiment (`neutral`) |" in piped
    # Without display names the tables show the labels alone.
    plain = render_markdown({key: value for key, value in report.items() if key != "label_names"})
    assert "| neutral |" in plain and "No sentiment" not in plain


def test_the_dataset_card_names_what_annotators_saw() -> None:
    definition = load_task_definition(example_path("dynasent-r2"))
    assert dataset_card._labels_for_people(definition) == (
        '`positive` (shown as "Positive"), `negative` (shown as "Negative"), `neutral` (shown as "No sentiment")'
    )
