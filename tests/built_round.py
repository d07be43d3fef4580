"""The ``built`` fixture (a pytest plugin listed in tests/conftest.py's ``pytest_plugins``): a
DynaSent-style round simulated through the real database and API (a writer, five validators per
example, an unqualified validator), closed and built; and the helpers that write and label examples
through the API.

The round is simulated through the API once per test process, database and settings (about 210
requests: two to four seconds, and some 90 tests use it); later tests start from a copy of the
rows it left (tests/row_snapshots.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.conftest import Actor, MakeUser, example_yaml, label_example, label_served, open_round
from tests.row_snapshots import reuse_rows
from tests.stub_model_server import ThreadedServer

LABELS = ["positive", "negative", "neutral"]
# The stub model predicts positive for "great", negative for "terrible", else neutral.
KEYWORD = {"positive": "great", "negative": "terrible", "neutral": "plain"}


class BuiltRound(TypedDict):
    round: dict[str, Any]  # the round as the API answered its creation
    plan: list[tuple[dict[str, Any], list[str]]]  # each example written and the five labels it was given
    build: dict[str, Any]  # the build as the API answered it (its report included)
    researcher: Actor
    writer: Actor


def write_example(client: TestClient, writer: Actor, round_id: int, target: str, text: str) -> dict[str, Any]:
    """One example written through the API for ``target`` (confirmed when it fooled the model),
    with the model's prediction for it."""
    assignment = client.post(
        f"/api/v1/rounds/{round_id}/assignments", json={"target_label": target}, headers=writer.headers
    ).json()
    attempt = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts", json={"text": text}, headers=writer.headers
    ).json()
    assert attempt["status"] == "scored", attempt
    if attempt["fooled"]:
        client.post(f"/api/v1/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers)
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/example", json={"attempt_id": attempt["id"]}, headers=writer.headers
    )
    assert response.status_code == 201, response.text
    return {**response.json(), "prediction": attempt["prediction"][0]}


def write_and_label(
    client: TestClient,
    writer: Actor,
    validators: list[Actor],
    round_id: int,
    plan: Sequence[tuple[Any, str, list[int] | None, list[Any]]],
) -> None:
    """Write each (target, text, span) and have the validators give the listed labels."""
    for target, text, span, labels in plan:
        assignment = client.post(
            f"/api/v1/rounds/{round_id}/assignments", json={"target_label": target}, headers=writer.headers
        ).json()
        body: dict[str, Any] = {"text": text, **({"target_span": span} if span else {})}
        attempt = client.post(
            f"/api/v1/assignments/{assignment['id']}/attempts", json=body, headers=writer.headers
        ).json()
        assert attempt["status"] == "scored", attempt
        if attempt["fooled"]:
            client.post(f"/api/v1/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers)
        example = client.post(
            f"/api/v1/assignments/{assignment['id']}/example",
            json={"attempt_id": attempt["id"]},
            headers=writer.headers,
        ).json()
        for validator, label in zip(validators, labels, strict=False):
            # Written and labelled one at a time: each validator's batch holds this example alone.
            response = label_example(client, validator, example["id"], label, round_id=round_id)
            assert response.status_code == 201, response.text


def spam(client: TestClient, spammer: Actor, researcher: Actor, round_id: int) -> None:
    """The spammer labels the first three examples (all it is served) and is then unqualified:
    those labels stop counting."""
    assert len(label_served(client, spammer, round_id, lambda _: "mixed")) == 3
    response = client.post(
        "/api/v1/tasks/dynasent-r2/workers/spam/unqualify", json={"reason": "spam"}, headers=researcher.headers
    )
    assert response.json()["labels_excluded"] == 3


@pytest.fixture
def built(
    app: FastAPI, client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> BuiltRound:
    result = reuse_rows(app, "built", lambda: simulate_built_round(client, researcher, make_user, stub_model))
    result["researcher"] = researcher  # this test's researcher (from a copy: their token was carried over)
    return result


def simulate_built_round(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> BuiltRound:
    """The round of :func:`built`, simulated through the API: written, labelled, closed and built."""
    prompts = [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(30)]
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        stub_model.url,
        prompts,
        target_label_mode="writer_choice",
    )
    writer = make_user("wanda", "writer")
    validators = [make_user(f"val{i}", "validator") for i in range(5)]
    spammer = make_user("spam", "validator")
    plan: list[tuple[dict[str, Any], list[str]]] = []
    # Two examples per (gold, predicted) cell with 4 of 5 agreeing: one for dev, one for test.
    for gold in LABELS:
        for predicted in LABELS:
            for copy in range(2):
                example = write_example(
                    client,
                    writer,
                    round_["id"],
                    gold,
                    f"Copy {copy}: a {KEYWORD[predicted]} {gold} sentence about lunch.",
                )
                assert example["prediction"] == predicted
                other = next(label for label in LABELS if label != gold)
                plan.append((example, [gold, gold, gold, gold, other]))
                if len(plan) == 3:
                    spam(client, spammer, researcher, round_["id"])
    # Train-only material: a mixed majority, no majority, a 3-of-5 gold.
    extra = [
        ["mixed", "mixed", "mixed", "positive", "negative"],
        ["positive", "negative", "neutral", "mixed", "positive"],
        ["negative", "negative", "negative", "positive", "neutral"],
    ]
    for i, labels in enumerate(extra):
        plan.append(
            (write_example(client, writer, round_["id"], "neutral", f"Extra {i}: a plain remark on the menu."), labels)
        )
    # Rotate who disagrees, so nobody crosses the 80% disagreement line and gets unqualified.
    rotated: dict[int, list[str]] = {}
    for position, (example, labels) in enumerate(plan):
        shift = position % 5
        rotated[example["id"]] = labels[shift:] + labels[:shift]
    for index, validator in enumerate(validators):

        def label_for(example_id: int | None, index: int = index) -> str:
            assert example_id is not None  # the task has no control items
            return rotated[example_id][index]

        assert sorted(label_served(client, validator, round_["id"], label_for)) == sorted(rotated)
    assert (
        client.post(
            f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers
        ).status_code
        == 200
    )
    response = client.post(f"/api/v1/rounds/{round_['id']}/build", json={"seed": 7}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    return {"round": round_, "plan": plan, "build": response.json(), "researcher": researcher, "writer": writer}
