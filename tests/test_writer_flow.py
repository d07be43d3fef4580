"""The writer's flow through the API, against a real HTTP stub model server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.conftest import Actor, example_yaml, free_port, open_round, table_counts
from tests.stub_model_server import ThreadedServer, create_stub_app

PROMPTS = [
    "The soup was fine and the bread was fresh.",
    "We went there on a Sunday afternoon.",
    "The staff were friendly and quick.",
]


@pytest.fixture
def dynasent_round(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)


@pytest.mark.both_databases
def test_writer_fools_model_confirms_and_submits(
    client: TestClient, writer: Actor, dynasent_round: dict[str, Any]
) -> None:
    response = client.post(f"/api/v1/rounds/{dynasent_round['id']}/assignments", json={}, headers=writer.headers)
    assert response.status_code == 201, response.text
    assignment = response.json()
    assert assignment["prompt"]["text"] in PROMPTS
    assert assignment["tries_allowed"] == 10
    target = assignment["target_label"][0]
    # Resuming returns the same assignment.
    again = client.post(f"/api/v1/rounds/{dynasent_round['id']}/assignments", json={}, headers=writer.headers)
    assert again.status_code == 200 and again.json()["id"] == assignment["id"]

    fooling_word = {"positive": "terrible", "negative": "great", "neutral": "great"}[target]
    text = f"{assignment['prompt']['text']} Honestly {fooling_word} stuff"
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts",
        json={"text": text},
        headers={**writer.headers, "Idempotency-Key": "k1"},
    )
    assert response.status_code == 201, response.text
    attempt = response.json()
    assert attempt["status"] == "scored" and attempt["fooled"] is True and attempt["counts_as_try"]
    assert attempt["prediction"] != [target]
    assert 0 < attempt["edit_distance"] < 1
    assert set(attempt["probabilities"]) == {"positive", "negative", "neutral"}

    # Retried request with the same key: same attempt, no new try.
    replay = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts",
        json={"text": text},
        headers={**writer.headers, "Idempotency-Key": "k1"},
    )
    assert replay.status_code == 200 and replay.json()["id"] == attempt["id"]
    state = client.get(f"/api/v1/assignments/{assignment['id']}", headers=writer.headers).json()
    assert state["tries_used"] == 1 and len(state["attempts"]) == 1

    # Submitting an unconfirmed fooling attempt is refused.
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/example", json={"attempt_id": attempt["id"]}, headers=writer.headers
    )
    assert response.status_code == 409 and "confirm" in response.json()["error"]["message"]

    response = client.post(
        f"/api/v1/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers
    )
    assert response.status_code == 200 and response.json()["confirmed"] is True
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/example", json={"attempt_id": attempt["id"]}, headers=writer.headers
    )
    assert response.status_code == 201, response.text
    example = response.json()
    assert example["fooled"] and example["text"] == text and example["status"] == "validating"
    again = client.post(
        f"/api/v1/assignments/{assignment['id']}/example", json={"attempt_id": attempt["id"]}, headers=writer.headers
    )
    assert again.status_code == 200 and again.json()["id"] == example["id"]


@pytest.mark.both_databases
def test_model_down_keeps_attempt_and_consumes_no_try(
    client: TestClient, writer: Actor, dynasent_round: dict[str, Any], stub_model: ThreadedServer, app: FastAPI
) -> None:
    assignment = client.post(
        f"/api/v1/rounds/{dynasent_round['id']}/assignments", json={}, headers=writer.headers
    ).json()
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "fail"})
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts",
        json={"text": "A fine test sentence."},
        headers={**writer.headers, "Idempotency-Key": "down-1"},
    )
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "3"
    body = response.json()["error"]
    assert body["code"] == "model_unavailable" and "no try was used" in body["message"]
    state = client.get(f"/api/v1/assignments/{assignment['id']}", headers=writer.headers).json()
    assert state["tries_used"] == 0
    assert [a["status"] for a in state["attempts"]] == ["model_unavailable"]
    # The model comes back; the retry with the same key scores the same attempt.
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "normal"})
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts",
        json={"text": "A fine test sentence."},
        headers={**writer.headers, "Idempotency-Key": "down-1"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["id"] == body["details"]["attempt_id"]
    assert table_counts(app)["attempts"] == 1


@pytest.mark.both_databases
def test_an_attempts_rows_hold_what_the_api_answered(
    client: TestClient, writer: Actor, dynasent_round: dict[str, Any], stub_model: ThreadedServer, app: FastAPI
) -> None:
    """The attempt is written by id, outside the unit of work (services/db/statements.py,
    insert_persistent, and record_prediction's UPDATEs): what is stored is what the API answered,
    and a JSON column the attempt has no value for is SQL NULL, not the JSON text null."""
    from sqlalchemy import select

    from services.db.models import Assignment, Attempt

    assignment = _assignment(client, writer, dynasent_round["id"])
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "fail"})
    down = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts",
        json={"text": "A fine test sentence."},
        headers=writer.headers,
    )
    assert down.status_code == 503
    httpx.post(f"{stub_model.url}/admin/mode", json={"mode": "normal"})
    scored = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts",
        json={"text": "A good test sentence."},
        headers=writer.headers,
    )
    assert scored.status_code == 201, scored.text
    answer = scored.json()
    with app.state.sessionmaker() as session:
        unset = session.scalars(select(Attempt.id).where(Attempt.target_span.is_(None), Attempt.judged_label.is_(None)))
        assert sorted(unset) == sorted([down.json()["error"]["details"]["attempt_id"], answer["id"]])
        no_prediction = session.scalars(select(Attempt.id).where(Attempt.prediction.is_(None)))
        assert list(no_prediction) == [down.json()["error"]["details"]["attempt_id"]]
        stored = session.get(Attempt, answer["id"])
        assert stored is not None
        assert stored.status.value == answer["status"] == "scored" and stored.counts_as_try is True
        assert stored.prediction == answer["prediction"] and stored.probabilities == answer["probabilities"]
        assert (stored.model_id, stored.model_version, stored.fooled) == (
            answer["model_id"],
            answer["model_version"],
            answer["fooled"],
        )
        assert stored.model_error is None and stored.scored_at is not None
        unavailable = session.get(Attempt, down.json()["error"]["details"]["attempt_id"])
        assert unavailable is not None and unavailable.status.value == "model_unavailable"
        assert unavailable.model_error and unavailable.counts_as_try is False
        assert session.get(Assignment, assignment["id"]).tries_used == 1


@pytest.mark.both_databases
def test_a_confirmation_is_stored_as_answered(
    client: TestClient, writer: Actor, dynasent_round: dict[str, Any], app: FastAPI
) -> None:
    """A confirmation is written by the attempt's id (services.domain.writing.confirm_attempt): a
    yes keeps the judged label SQL NULL, a no stores the label the writer judged."""
    from sqlalchemy import select

    from services.db.models import Attempt

    answers = {}
    for agrees in (True, False):
        assignment = _assignment(client, writer, dynasent_round["id"])
        target = assignment["target_label"][0]
        fooling = {"positive": "terrible", "negative": "great", "neutral": "great"}[target]
        attempt = client.post(
            f"/api/v1/assignments/{assignment['id']}/attempts",
            json={"text": f"Honestly {fooling} stuff, {agrees}."},
            headers=writer.headers,
        ).json()
        assert attempt["fooled"], attempt
        body: dict[str, Any] = {"agrees": agrees}
        if not agrees:
            body["judged_label"] = "neutral" if target != "neutral" else "positive"
        confirmed = client.post(f"/api/v1/attempts/{attempt['id']}/confirmation", json=body, headers=writer.headers)
        assert confirmed.status_code == 200, confirmed.text
        answers[agrees] = (attempt["id"], body.get("judged_label"), confirmed.json())
        client.post(f"/api/v1/assignments/{assignment['id']}/skip", headers=writer.headers)
    with app.state.sessionmaker() as session:
        yes_id, _, yes = answers[True]
        no_id, judged, no = answers[False]
        assert list(
            session.scalars(select(Attempt.id).where(Attempt.judged_label.is_(None), Attempt.id.in_([yes_id, no_id])))
        ) == [yes_id]
        stored_yes, stored_no = session.get(Attempt, yes_id), session.get(Attempt, no_id)
        assert stored_yes.confirmed is True and stored_yes.confirmed_at is not None and yes["confirmed"] is True
        assert stored_no.confirmed is False and stored_no.judged_label == [judged] == no["judged_label"]


def test_insert_persistent_asks_for_every_column_and_writes_nothing_without_them(app: FastAPI) -> None:
    from sqlalchemy import func, select

    from services.db.models import Validation
    from services.db.statements import insert_persistent

    with app.state.sessionmaker() as session:
        with pytest.raises(ValueError, match="no value for"):
            insert_persistent(session, Validation, {"example_id": 1, "validator_id": 1, "label": ["positive"]})
        assert session.scalar(select(func.count()).select_from(Validation)) == 0


def _assignment(client: TestClient, writer: Actor, round_id, **body):
    response = client.post(f"/api/v1/rounds/{round_id}/assignments", json=body, headers=writer.headers)
    assert response.status_code in (200, 201), response.text
    return response.json()


@pytest.fixture(scope="module")
def stub_sarcasm_model() -> Iterator[ThreadedServer]:
    server = ThreadedServer(create_stub_app(["sarcastic", "not_sarcastic"]), free_port()).start()
    yield server
    server.stop()


def test_isarcasm_intended_label_must_match_the_target(
    client: TestClient, researcher: Actor, writer: Actor, stub_sarcasm_model: ThreadedServer, app: FastAPI
) -> None:
    from tests.conftest import table_counts

    round_ = open_round(
        client,
        researcher,
        example_yaml("isarcasm", onboarding_quiz=None),
        stub_sarcasm_model.url,
        PROMPTS,
        target_label_mode="writer_choice",
    )
    assignment = _assignment(client, writer, round_["id"], target_label="not_sarcastic")
    attempt = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts",
        json={"text": "The train was on time and the seats were clean."},
        headers=writer.headers,
    ).json()
    if attempt["fooled"]:
        client.post(f"/api/v1/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers)
    before = table_counts(app)
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/example",
        json={
            "attempt_id": attempt["id"],
            "extras": {
                "intended_label": "sarcastic",
                "explanation": "I mean the opposite.",
                "rephrase": "The train was late.",
            },
        },
        headers=writer.headers,
    )
    assert response.status_code == 422
    assert "contradicts this assignment's target label ('not_sarcastic')" in response.json()["error"]["message"]
    assert table_counts(app) == before
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/example",
        json={"attempt_id": attempt["id"], "extras": {"intended_label": "not_sarcastic"}},
        headers=writer.headers,
    )
    assert response.status_code == 201 and response.json()["extras"] == {"intended_label": "not_sarcastic"}


def test_target_span_extra_of_the_wrong_type_is_a_clear_422(
    client: TestClient, researcher: Actor, writer: Actor, stub_model: ThreadedServer, app: FastAPI
) -> None:
    from tests.conftest import table_counts

    round_ = open_round(client, researcher, example_yaml("mad-tsc", onboarding_quiz=None), stub_model.url, PROMPTS)
    assignment = _assignment(client, writer, round_["id"])
    text = "Officials said the mayor handled the flood response well."
    attempt = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts",
        json={"text": text, "target_span": [18, 23]},
        headers=writer.headers,
    ).json()
    assert attempt["status"] == "scored", attempt
    if attempt["fooled"]:
        client.post(f"/api/v1/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers)
    before = table_counts(app)
    for bad in [5, "18-23", [0, 5]]:
        response = client.post(
            f"/api/v1/assignments/{assignment['id']}/example",
            json={"attempt_id": attempt["id"], "extras": {"target_span": bad}},
            headers=writer.headers,
        )
        assert response.status_code == 422, response.text
        assert "target_span differs from the span of the submitted attempt" in response.json()["error"]["message"]
    assert table_counts(app) == before
    assert "towards a target you mark" in assignment["goal"]


def test_balanced_round_refuses_a_target_even_when_resuming(
    client: TestClient, writer: Actor, dynasent_round: dict[str, Any]
) -> None:
    _assignment(client, writer, dynasent_round["id"])
    response = client.post(
        f"/api/v1/rounds/{dynasent_round['id']}/assignments", json={"target_label": "positive"}, headers=writer.headers
    )
    assert response.status_code == 422 and "assigns target labels" in response.json()["error"]["message"]


def test_overdue_assignments_count_as_expired_in_stats(
    client: TestClient, app: FastAPI, researcher: Actor, writer: Actor, dynasent_round: dict[str, Any]
) -> None:
    import datetime as dt

    from services.db.models import Assignment

    assignment = _assignment(client, writer, dynasent_round["id"])
    with app.state.sessionmaker.begin() as session:
        row = session.get(Assignment, assignment["id"])
        row.expires_at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    stats = client.get(f"/api/v1/rounds/{dynasent_round['id']}/stats", headers=researcher.headers).json()
    assert stats["assignments"]["active"] == 0 and stats["assignments"]["expired"] == 1
    # The writer's next request records the expiry for good and gets a fresh assignment.
    fresh = _assignment(client, writer, dynasent_round["id"])
    assert fresh["id"] != assignment["id"]
    with app.state.sessionmaker() as session:
        assert session.get(Assignment, assignment["id"]).status.value == "expired"


def test_a_task_shows_its_writer_fields_with_the_choices_the_api_checks(client, researcher, writer) -> None:  # type: ignore[no-untyped-def]
    """The web app offers exactly these: iSarcasm's categories come from the family's default,
    the intended label from the task's labels; a field without choices stays without."""
    from services.taskdef import ISARCASM_CATEGORIES

    created = client.post(
        "/api/v1/tasks",
        content=example_yaml("isarcasm", onboarding_quiz=None),
        headers={**researcher.headers, "Content-Type": "application/yaml"},
    )
    assert created.status_code == 201, created.text
    task = client.get(f"/api/v1/tasks/{created.json()['name']}", headers=writer.headers).json()
    fields = {field["name"]: field for field in task["definition"]["writer_fields"]}
    assert fields["category"]["choices"] == list(ISARCASM_CATEGORIES)
    assert fields["intended_label"]["choices"] == task["definition"]["labels"]
    assert fields["explanation"]["choices"] is None
