"""Attention checks for writers (issue 26, services/domain/attention.py).

The attacker's tests come first: another writer answering my check, a second, different answer,
a new assignment asked for while a check is pending, a task whose question does not tell the
writer its answer. After each refusal the database is unchanged. Then the scoring: one failed
check keeps a writer; the task's ``fails_to_screen_out`` (two) screens their study session out
with no completion code, and nothing is ever paid for a check."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import select

from services.db.models import AttentionCheckAnswer, LedgerEntry
from tests.conftest import Actor, MakeUser, example_yaml, open_round, table_counts, table_snapshot
from tests.test_concurrency import assert_no_server_errors, fire

API = "/api/v1"
TASK = "dynasent-r2"
PROMPTS = [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(12)]
PROLIFIC = {
    "PROLIFIC_PID": "5f1a2b3c4d5e6f7a8b9c0d1e",
    "STUDY_ID": "60aa11bb22cc33dd44ee55ff",
    "SESSION_ID": "6123456789abcdef01234567",
}
CHECKS: dict[str, Any] = {
    "every_n_assignments": 1,
    "fails_to_screen_out": 2,
    "items": [
        {
            "question": "For this question, choose 'Strongly disagree'.",
            "options": ["Strongly agree", "Agree", "Disagree", "Strongly disagree"],
            "answer": "Strongly disagree",
        },
        {
            "question": "This is an attention check: select 'Orange' from the colours below.",
            "options": ["Red", "Blue", "Orange"],
            "answer": "Orange",
        },
    ],
}
TABLES = ("attention_check_answers", "task_workers", "assignments", "study_sessions")


@pytest.fixture
def round_(client: Any, researcher: Actor, stub_model: Any) -> dict[str, Any]:
    yaml_text = example_yaml(TASK, onboarding_quiz=None, attention_checks=CHECKS)
    return open_round(client, researcher, yaml_text, stub_model.url, PROMPTS)


def finish_one(client: Any, headers: dict[str, str], round_id: int) -> None:
    """Start an assignment and skip it: a finished assignment, with no model call."""
    response = client.post(f"{API}/rounds/{round_id}/assignments", json={}, headers=headers)
    assert response.status_code == 201, response.text
    skipped = client.post(f"{API}/assignments/{response.json()['id']}/skip", headers=headers)
    assert skipped.status_code == 200, skipped.text


def serve_check(client: Any, headers: dict[str, str], round_id: int) -> dict[str, Any]:
    """Finish an assignment, then ask for the next: the 409 names the check now served."""
    finish_one(client, headers, round_id)
    response = client.post(f"{API}/rounds/{round_id}/assignments", json={}, headers=headers)
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "attention_check_pending"
    pending = client.get(f"{API}/attention-checks/pending", headers=headers).json()["data"]
    assert [check["id"] for check in pending] == [error["details"]["attention_check_id"]]
    return dict(pending[0])


def answer(client: Any, headers: dict[str, str], check_id: int, value: str) -> Any:
    return client.post(f"{API}/attention-checks/{check_id}/answer", json={"answer": value}, headers=headers)


# --- the attacker's tests ----------------------------------------------------------------------


def test_another_writer_cannot_see_or_answer_my_check(
    client: Any, app: Any, round_: dict[str, Any], make_user: MakeUser, researcher: Actor
) -> None:
    alice = make_user("alice", "writer")
    mallory = make_user("mallory", "writer")
    check = serve_check(client, alice.headers, round_["id"])
    # The served check never shows its expected answer.
    assert set(check) == {"id", "task", "question", "options", "served_at", "answered_at", "answer"}
    before = table_snapshot(app, *TABLES)
    theirs = answer(client, mallory.headers, check["id"], "Strongly disagree")
    missing = answer(client, mallory.headers, 987654, "Strongly disagree")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"]["message"] == missing.json()["error"]["message"].replace("987654", str(check["id"]))
    assert client.get(f"{API}/attention-checks/pending", headers=mallory.headers).json()["count"] == 0
    assert table_snapshot(app, *TABLES) == before
    # A researcher (no writer role) cannot answer it either.
    assert answer(client, researcher.headers, check["id"], "Strongly disagree").status_code == 403
    assert table_snapshot(app, *TABLES) == before


@pytest.mark.both_databases
def test_a_second_different_answer_is_refused_and_the_same_one_replayed(
    client: Any, app: Any, round_: dict[str, Any], writer: Actor
) -> None:
    check = serve_check(client, writer.headers, round_["id"])
    first = answer(client, writer.headers, check["id"], "Strongly disagree")
    assert first.status_code == 200, first.text
    assert first.json()["passed"] is True and first.json()["qualified"] is True
    before = table_snapshot(app, *TABLES)
    changed = answer(client, writer.headers, check["id"], "Agree")
    assert changed.status_code == 409 and "cannot be changed" in changed.json()["error"]["message"]
    not_an_option = answer(client, writer.headers, check["id"], "Maybe")
    assert not_an_option.status_code == 422 and "not one of the options" in not_an_option.json()["error"]["message"]
    replay = answer(client, writer.headers, check["id"], "Strongly disagree")
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["answer"] == "Strongly disagree" and replay.json()["passed"] is True
    assert table_snapshot(app, *TABLES) == before


def test_no_new_assignment_while_a_check_is_pending(
    client: Any, app: Any, round_: dict[str, Any], writer: Actor
) -> None:
    check = serve_check(client, writer.headers, round_["id"])
    before = table_snapshot(app, *TABLES)
    for _ in range(2):
        again = client.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=writer.headers)
        assert again.status_code == 409
        assert again.json()["error"]["details"]["attention_check_id"] == check["id"]
        assert f"attention check {check['id']}" in again.json()["error"]["message"]
    assert table_snapshot(app, *TABLES) == before
    assert answer(client, writer.headers, check["id"], "Strongly disagree").status_code == 200
    after = client.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=writer.headers)
    assert after.status_code == 201, after.text


def test_a_question_that_does_not_name_its_answer_is_refused_at_task_creation(
    client: Any, app: Any, researcher: Actor
) -> None:
    hidden = {
        "every_n_assignments": 5,
        "fails_to_screen_out": 2,
        "items": [{"question": "What colour is the sky?", "options": ["Blue", "Green"], "answer": "Blue"}],
    }
    one_fail = {**CHECKS, "fails_to_screen_out": 1}
    not_an_option = {**CHECKS, "items": [{"question": "Choose 'Pink'.", "options": ["Red", "Blue"], "answer": "Pink"}]}
    before = table_counts(app)
    for checks, words in (
        (hidden, "does not name its answer"),
        (one_fail, "fails_to_screen_out"),
        (not_an_option, "not one of the options"),
    ):
        yaml_text = example_yaml(TASK, onboarding_quiz=None, attention_checks=checks)
        response = client.post(f"{API}/tasks", json={"definition_yaml": yaml_text}, headers=researcher.headers)
        assert response.status_code == 422, response.text
        assert words in response.text
    assert table_counts(app) == before


# --- scoring -----------------------------------------------------------------------------------


def test_one_failed_check_keeps_the_writer_and_two_screen_their_session_out(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    response = client.post(
        f"{API}/tasks/{TASK}/study-links",
        json={
            "name": "pilot",
            "round_id": round_["id"],
            "role": "writer",
            "platform": "prolific",
            "quota": 10,
            "max_workers": 5,
            "completion_code": "C0MPLETE",
        },
        headers=researcher.headers,
    )
    assert response.status_code == 201, response.text
    link = response.json()
    started = client.post(f"{API}/study/{link['slug']}/sessions", json={"params": PROLIFIC}).json()
    token = {"Authorization": f"Bearer {started['token']}"}

    first = serve_check(client, token, round_["id"])
    failed = answer(client, token, first["id"], first["options"][0])
    assert failed.status_code == 200 and failed.json()["passed"] is False and failed.json()["qualified"] is True
    row = client.get(f"{API}/me/study-sessions", headers=token).json()["data"][0]
    assert row["status"] == "active" and row["units_done"] == 0  # a check is never a unit of work

    second = serve_check(client, token, round_["id"])
    assert second["id"] != first["id"] and second["question"] != first["question"]  # the items in turn
    failed = answer(client, token, second["id"], "Red")
    assert failed.status_code == 200 and failed.json()["passed"] is False and failed.json()["qualified"] is False
    row = client.get(f"{API}/me/study-sessions", headers=token).json()["data"][0]
    assert row["status"] == "screened_out"
    completion = row["completion"]
    # No screened-out code on the link: no code, no redirect, and a request to return the study.
    assert completion["code"] is None and completion["redirect_url"] is None
    assert "return" in completion["message"] and "Prolific" in completion["message"]
    refused = client.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=token)
    assert refused.status_code == 403 and "failed 2 attention checks" in refused.json()["error"]["message"]

    record = client.get(f"{API}/tasks/{TASK}/attention-checks", headers=researcher.headers).json()
    assert record["every_n_assignments"] == 1 and record["fails_to_screen_out"] == 2
    assert [(r["served"], r["answered"], r["passed"], r["failed"], r["qualified"]) for r in record["data"]] == [
        (2, 2, 0, 2, False)
    ]
    with app.state.sessionmaker() as session:
        assert session.scalars(select(LedgerEntry)).all() == []


def test_checks_come_after_every_n_finished_assignments_and_a_pass_keeps_going(
    client: Any, app: Any, researcher: Actor, stub_model: Any, writer: Actor
) -> None:
    checks = {**CHECKS, "every_n_assignments": 2}
    yaml_text = example_yaml(TASK, onboarding_quiz=None, attention_checks=checks)
    round_ = open_round(client, researcher, yaml_text, stub_model.url, PROMPTS)
    finish_one(client, writer.headers, round_["id"])  # one finished: no check yet
    check = serve_check(client, writer.headers, round_["id"])  # two finished: a check
    assert check["question"] == CHECKS["items"][0]["question"] and check["task"] == TASK
    assert answer(client, writer.headers, check["id"], "Strongly disagree").json()["passed"] is True
    finish_one(client, writer.headers, round_["id"])  # three finished: none due
    second = serve_check(client, writer.headers, round_["id"])  # four: the second item
    assert second["question"] == CHECKS["items"][1]["question"]


def test_a_task_without_checks_serves_none(
    client: Any, app: Any, researcher: Actor, stub_model: Any, writer: Actor
) -> None:
    round_ = open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None), stub_model.url, PROMPTS)
    for _ in range(6):
        finish_one(client, writer.headers, round_["id"])
    assert table_counts(app)["attention_check_answers"] == 0
    record = client.get(f"{API}/tasks/{TASK}/attention-checks", headers=researcher.headers).json()
    assert record == {"data": [], "count": 0, "every_n_assignments": None, "fails_to_screen_out": None}


@pytest.mark.both_databases
def test_requests_at_once_serve_one_check_and_answers_at_once_record_one(
    app: Any, app_server: Any, researcher: Actor, writer: Actor
) -> None:
    """Over real HTTP: eight requests for a new assignment when a check is due store one check
    (all eight name it); eight different answers at once record one answer, the rest 409."""
    with httpx.Client(base_url=app_server.url, timeout=60) as http:
        yaml_text = example_yaml(TASK, onboarding_quiz=None, attention_checks=CHECKS)
        round_ = open_round(http, researcher, yaml_text, None, PROMPTS)
        finish_one(http, writer.headers, round_["id"])
        url = f"{API}/rounds/{round_['id']}/assignments"
        responses = fire(8, lambda i: http.post(url, json={}, headers=writer.headers))
        assert_no_server_errors(responses)
        assert {r.status_code for r in responses} == {409}
        named = {r.json()["error"]["details"]["attention_check_id"] for r in responses}
        assert len(named) == 1
        check_id = named.pop()
        options = CHECKS["items"][0]["options"]
        answers = fire(8, lambda i: answer(http, writer.headers, check_id, options[i % len(options)]))
        assert_no_server_errors(answers)
        accepted = [r for r in answers if r.status_code == 200]
        assert len({r.json()["answer"] for r in accepted}) == 1
        assert all(r.status_code in (200, 409) for r in answers)
    with app.state.sessionmaker() as session:
        rows = session.scalars(select(AttentionCheckAnswer)).all()
        assert [(row.id, row.answer in options) for row in rows] == [(check_id, True)]
