"""Duplicate texts (issue 26, item 4; docs/design.md "Duplicates"), the attacker's way first:
the same sentence sent again by one writer, across assignments, by two writers, in a later round,
and by concurrent requests. Each repeat is refused with 409 ``duplicate_text`` that says why,
before the model is called: no try is used and the database is unchanged."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, update
from sqlalchemy.orm import Session

from services.db.migrate import downgrade, upgrade
from services.db.models import BuiltExample, Example, ExampleText
from services.taskdef import TaskDefinitionError, parse_task_definition
from services.text import duplicate_hash, normalized_for_duplicates
from tests.built_round import BuiltRound
from tests.conftest import (
    Actor,
    MakeUser,
    ThreadedServer,
    example_yaml,
    open_round,
    register_model_server,
    table_snapshot,
)
from tests.test_study_links import PROLIFIC, make_link, open_link

pytestmark = pytest.mark.both_databases  # unique constraints and concurrent writers


API = "/api/v1"
PROMPTS = ["The soup was fine and the bread was fresh.", "We went there on a Sunday afternoon."]
SENTENCE = "The soup was fine, the bread was fresh and the staff were quick."
# The same sentence as an attacker would vary it: case, spacing, punctuation, an invisible space.
VARIANTS = [
    SENTENCE,
    "THE SOUP WAS FINE, THE BREAD WAS FRESH AND THE STAFF WERE QUICK!",
    "the soup was fine   the bread was fresh and the staff were quick",
    "The soup was fine, the bread was\u200b fresh and the staff were quick...",
]
TABLES = ("assignments", "attempts", "examples", "example_texts", "prompts")


@pytest.fixture
def round_(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)


def assignment_of(client: Any, actor: Actor, round_id: int) -> dict[str, Any]:
    response = client.post(f"{API}/rounds/{round_id}/assignments", json={}, headers=actor.headers)
    assert response.status_code in (200, 201), response.text
    return response.json()


def attempt(client: Any, actor: Actor, assignment_id: int, text: str) -> httpx.Response:
    return client.post(f"{API}/assignments/{assignment_id}/attempts", json={"text": text}, headers=actor.headers)


def scored_attempt(client: Any, actor: Actor, assignment_id: int, text: str) -> dict[str, Any]:
    response = attempt(client, actor, assignment_id, text)
    assert response.status_code == 201, response.text
    scored = response.json()
    if scored["fooled"]:
        confirmed = client.post(
            f"{API}/attempts/{scored['id']}/confirmation", json={"agrees": True}, headers=actor.headers
        )
        assert confirmed.status_code == 200, confirmed.text
    return scored


def submit(client: Any, actor: Actor, assignment_id: int, attempt_id: int) -> httpx.Response:
    return client.post(
        f"{API}/assignments/{assignment_id}/example", json={"attempt_id": attempt_id}, headers=actor.headers
    )


def write_example(client: Any, actor: Actor, round_id: int, text: str) -> dict[str, Any]:
    assignment = assignment_of(client, actor, round_id)
    scored = scored_attempt(client, actor, assignment["id"], text)
    response = submit(client, actor, assignment["id"], scored["id"])
    assert response.status_code == 201, response.text
    return response.json()


def model_calls(stub_model: ThreadedServer) -> int:
    return int(httpx.get(f"{stub_model.url}/admin/calls").json()["calls"])


def assert_duplicate_refusal(response: httpx.Response, round_number: int) -> None:
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "duplicate_text"
    assert f"already in round {round_number}" in error["message"]
    assert "no try was used" in error["message"] and "write a different sentence" in error["message"]


def test_one_writer_repeating_a_sentence_in_new_assignments_gets_one_example(
    client: TestClient, app: FastAPI, writer: Actor, round_: dict[str, Any], stub_model: ThreadedServer
) -> None:
    """The issue's reproduction: the same sentence accepted 4 times from one writer. Now the
    first counts; the three repeats (varied in case, spacing, punctuation and an invisible
    character) are refused at the attempt, before the model is asked."""
    first = write_example(client, writer, round_["id"], VARIANTS[0])
    for variant in VARIANTS[1:]:
        assignment = assignment_of(client, writer, round_["id"])
        before, calls = table_snapshot(app, *TABLES), model_calls(stub_model)
        response = attempt(client, writer, assignment["id"], variant)
        assert_duplicate_refusal(response, round_["number"])
        assert table_snapshot(app, *TABLES) == before  # no attempt stored, no try used
        assert model_calls(stub_model) == calls  # the model was not asked
        state = client.get(f"{API}/assignments/{assignment['id']}", headers=writer.headers).json()
        assert state["tries_used"] == 0 and state["attempts"] == [] and state["status"] == "active"
    # The assignment is still the writer's: a new sentence goes through.
    write_example(client, writer, round_["id"], "A different sentence about the lunch menu today.")
    mine = client.get(f"{API}/me/examples", headers=writer.headers)
    if mine.status_code == 200:
        texts = [row["text"] for row in mine.json()["data"]]
        assert texts.count(first["text"]) == 1
    with Session(app.state.engine) as session:
        assert session.scalars(select(Example.text).order_by(Example.id)).all() == [
            VARIANTS[0],
            "A different sentence about the lunch menu today.",
        ]
        assert session.scalars(select(ExampleText.normalized_hash)).all().count(duplicate_hash(SENTENCE)) == 1


def test_a_second_writer_and_a_submission_after_the_attempt_are_refused(
    client: TestClient, app: FastAPI, writer: Actor, make_user: MakeUser, round_: dict[str, Any]
) -> None:
    """Across assignments and writers: both writers check the sentence before either submits
    (so both attempts are scored), the first submission counts and the second is refused at
    submission, with the assignment left active and nothing written."""
    other = make_user("wanda", "writer")
    mine = assignment_of(client, writer, round_["id"])
    theirs = assignment_of(client, other, round_["id"])
    my_attempt = scored_attempt(client, writer, mine["id"], VARIANTS[0])
    their_attempt = scored_attempt(client, other, theirs["id"], VARIANTS[1])
    assert submit(client, writer, mine["id"], my_attempt["id"]).status_code == 201
    before = table_snapshot(app, *TABLES)
    response = submit(client, other, theirs["id"], their_attempt["id"])
    assert_duplicate_refusal(response, round_["number"])
    assert table_snapshot(app, *TABLES) == before
    # A third writer is refused at the attempt already.
    third = make_user("wes", "writer")
    third_assignment = assignment_of(client, third, round_["id"])
    before = table_snapshot(app, *TABLES)
    assert_duplicate_refusal(attempt(client, third, third_assignment["id"], VARIANTS[2]), round_["number"])
    assert table_snapshot(app, *TABLES) == before
    # The refused writer writes something else in the same assignment.
    other_attempt = scored_attempt(client, other, theirs["id"], "Our waiter forgot the order twice tonight.")
    assert submit(client, other, theirs["id"], other_attempt["id"]).status_code == 201


def test_a_sentence_of_an_earlier_round_of_the_task_is_refused(
    client: TestClient, app: FastAPI, writer: Actor, researcher: Actor, round_: dict[str, Any], stub_model: Any
) -> None:
    write_example(client, writer, round_["id"], SENTENCE)
    closed = client.post(f"{API}/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    assert closed.status_code == 200, closed.text
    task = round_["task"]
    server = register_model_server(app, stub_model.url)
    second = client.post(f"{API}/tasks/{task}/rounds", json={"model_servers": [server]}, headers=researcher.headers)
    assert second.status_code == 201, second.text
    second_round = second.json()
    prompts = '{"text": "Another prompt about a small cafe.", "id": "q1"}'
    loaded = client.post(
        f"{API}/rounds/{second_round['id']}/prompts",
        content=prompts.encode(),
        headers={**researcher.headers, "Content-Type": "application/x-ndjson"},
    )
    assert loaded.status_code == 200, loaded.text
    assignment = assignment_of(client, writer, second_round["id"])
    before = table_snapshot(app, *TABLES)
    assert_duplicate_refusal(attempt(client, writer, assignment["id"], VARIANTS[3]), round_["number"])
    assert table_snapshot(app, *TABLES) == before


def test_concurrent_submissions_of_one_sentence_accept_exactly_one(
    app: FastAPI, app_server: ThreadedServer, make_user: MakeUser, researcher: Actor, stub_model: ThreadedServer
) -> None:
    """Six writers check the same sentence (each attempt is scored: nothing is submitted yet),
    then all submit at once over real HTTP: one example, five 409s, one claimed text."""
    with httpx.Client(base_url=app_server.url, timeout=30) as http:
        round_ = open_round(
            TestClient(app), researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS
        )
        writers = [make_user(f"racer{i}", "writer") for i in range(6)]
        ready = []
        for i, actor in enumerate(writers):
            assignment = assignment_of(http, actor, round_["id"])
            ready.append(
                (actor, assignment["id"], scored_attempt(http, actor, assignment["id"], VARIANTS[i % 4])["id"])
            )
        barrier = threading.Barrier(len(ready))
        statuses: list[int] = []
        codes: list[str] = []

        def go(actor: Actor, assignment_id: int, attempt_id: int) -> None:
            with httpx.Client(base_url=app_server.url, timeout=30) as own:
                barrier.wait()
                response = submit(own, actor, assignment_id, attempt_id)
                statuses.append(response.status_code)
                if response.status_code != 201:
                    codes.append(response.json()["error"]["code"])

        threads = [threading.Thread(target=go, args=args) for args in ready]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(statuses) == [201, 409, 409, 409, 409, 409], statuses
    assert set(codes) == {"duplicate_text"}
    with Session(app.state.engine) as session:
        assert len(session.scalars(select(Example.id)).all()) == 1
        assert len(session.scalars(select(ExampleText.example_id)).all()) == 1


def test_near_duplicates_are_refused_only_when_the_task_asks(
    client: TestClient, app: FastAPI, writer: Actor, researcher: Actor, stub_model: ThreadedServer
) -> None:
    strict = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None, near_duplicate_similarity=0.9).replace(
            "name: dynasent-r2", "name: near-dups", 1
        ),
        stub_model.url,
        PROMPTS,
    )
    write_example(client, writer, strict["id"], SENTENCE)
    assignment = assignment_of(client, writer, strict["id"])
    before = table_snapshot(app, *TABLES)
    near = "The soup was fine, the bread was fresh and the staff were quite quick."
    response = attempt(client, writer, assignment["id"], near)
    assert response.status_code == 409 and response.json()["error"]["code"] == "duplicate_text"
    assert "almost the same as an example already in round 1" in response.json()["error"]["message"]
    assert table_snapshot(app, *TABLES) == before
    # A sentence below the similarity is accepted.
    write_example(client, writer, strict["id"], "The soup was cold and the waiter never came back.")
    # Without the setting only exact duplicates (after normalization) are refused.
    loose = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)
    write_example(client, writer, loose["id"], SENTENCE)
    write_example(client, writer, loose["id"], near)


def test_migration_0017_hashes_existing_examples_and_the_earliest_copy_claims_the_text(
    app: FastAPI, client: TestClient, writer: Actor, make_user: MakeUser, round_: dict[str, Any], database_url: str
) -> None:
    """Data written before the rule (here: rows put back to the state of revision 0014) keeps
    its repeats; the upgrade hashes every example and lets the earliest copy claim the text."""
    first = write_example(client, writer, round_["id"], SENTENCE)
    other = make_user("wanda", "writer")
    second = write_example(client, other, round_["id"], "Another sentence about the same lunch.")
    engine = create_engine(database_url)
    try:
        # A repeat as one was written before the rule: same text in other words, no claim.
        with engine.begin() as connection:
            connection.execute(update(Example).where(Example.id == second["id"]).values(text=VARIANTS[1]))
        downgrade(database_url, "0014")
        upgrade(database_url)
        with Session(engine) as session:
            rows = session.execute(select(Example.normalized_hash, Example.normalized_text).order_by(Example.id)).all()
            assert rows == [(duplicate_hash(SENTENCE), normalized_for_duplicates(SENTENCE))] * 2
            claims = session.execute(select(ExampleText.example_id, ExampleText.normalized_hash)).all()
            assert claims == [(first["id"], duplicate_hash(SENTENCE))]
    finally:
        engine.dispose()


# --- the round builder ------------------------------------------------------------------


def _split_texts(app: FastAPI, build_id: int) -> dict[str, list[str]]:
    with Session(app.state.engine) as session:
        rows = session.execute(
            select(BuiltExample.split, Example.text)
            .join(Example, Example.id == BuiltExample.example_id)
            .where(BuiltExample.build_id == build_id)
            .order_by(Example.id)
        ).all()
    splits: dict[str, list[str]] = {}
    for split, text in rows:
        splits.setdefault(split, []).append(normalized_for_duplicates(text))
    return splits


def test_the_builder_keeps_one_copy_of_each_text_even_for_rows_written_before_the_rule(
    app: FastAPI, client: TestClient, built: BuiltRound
) -> None:
    """The issue's reproduction: a sentence of two writers in train and in dev, and a repeat
    with the opposite gold. Rows as they were before the rule (texts changed in the database,
    where the API would now refuse them); the next build keeps one copy of the agreeing pair,
    excludes both copies that disagree, and says so in its report."""
    plan = built["plan"]
    by_text = {example["text"]: example for example, _ in plan}
    kept = by_text["Copy 0: a great positive sentence about lunch."]
    repeat = by_text["Copy 1: a great positive sentence about lunch."]  # same gold (positive)
    positive = by_text["Copy 0: a plain positive sentence about lunch."]
    negative = by_text["Extra 2: a plain remark on the menu."]  # gold negative (3 of 5), train
    before = _split_texts(app, built["build"]["build_id"])
    assert sum(len(texts) for split, texts in before.items() if split != "excluded") == len(plan)
    with Session(app.state.engine) as session, session.begin():
        session.execute(
            update(Example)
            .where(Example.id == repeat["id"])
            .values(text="copy 0 - A GREAT positive sentence about lunch")
        )
        session.execute(update(Example).where(Example.id == negative["id"]).values(text=positive["text"].upper()))
    response = client.post(
        f"{API}/rounds/{built['round']['id']}/build",
        json={"seed": 7, "policy": "relaxed", "chance": False},
        headers=built["researcher"].headers,
    )
    assert response.status_code == 201, response.text
    build = response.json()
    splits = _split_texts(app, build["build_id"])
    placed = [text for split in ("train", "dev", "test") for text in splits.get(split, [])]
    assert len(placed) == len(set(placed)), "a text is in two splits or twice in one"
    assert normalized_for_duplicates(kept["text"]) in placed
    assert normalized_for_duplicates(positive["text"]) not in placed  # conflicting gold: both copies out
    report = build["report"]
    assert {k: report["duplicates"][k] for k in report["duplicates"] if k != "rule"} == {
        "merged": 1,
        "conflicting_gold_texts": 1,
        "conflicting_gold_examples": 2,
        "in_an_earlier_round": 0,
    }
    excluded = report["counts"]["excluded"]
    assert excluded["duplicate"] == 1 and excluded["duplicate_conflicting_gold"] == 2
    with Session(app.state.engine) as session:
        flags: dict[int, list[str]] = dict(
            session.execute(
                select(BuiltExample.example_id, BuiltExample.flags).where(BuiltExample.build_id == build["build_id"])
            ).all()
        )
    assert flags[repeat["id"]] == ["duplicate"]
    assert flags[positive["id"]] == flags[negative["id"]] == ["duplicate_conflicting_gold"]
    markdown = client.get(
        f"{API}/tasks/dynasent-r2/rounds/1/report?format=markdown", headers=built["researcher"].headers
    ).text
    assert "Duplicates merged: 1" in markdown


@pytest.mark.parametrize("value", [0.3, 1.5, "high"])
def test_a_near_duplicate_similarity_outside_its_range_is_refused_with_its_field_named(value: Any) -> None:
    yaml_text = example_yaml("dynasent-r2", near_duplicate_similarity=value)
    with pytest.raises(TaskDefinitionError) as refused:
        parse_task_definition(yaml_text)
    assert "near_duplicate_similarity" in str(refused.value)
    assert (
        parse_task_definition(example_yaml("dynasent-r2", near_duplicate_similarity=0.9)).near_duplicate_similarity
        == 0.9
    )
    assert parse_task_definition(example_yaml("dynasent-r2")).near_duplicate_similarity is None


def test_a_study_workers_repeats_count_towards_no_quota(
    client: TestClient, app: FastAPI, researcher: Actor, round_: dict[str, Any]
) -> None:
    """A Prolific writer on a link with a quota of 3 submits one sentence, then sends it three
    more times, varied: every repeat is refused, the session's count stays at 1 and finishing
    "at quota" is refused, so the repeats earn neither the completion code nor a bonus."""
    link = make_link(client, researcher, round_["id"], quota=3, max_workers=5, completion_code="C0MPLETE")
    started = open_link(client, link, PROLIFIC)
    assert started.status_code in (200, 201), started.text
    worker = Actor("prolific-worker", started.json()["token"])
    session_id = started.json()["session"]["id"]
    write_example(client, worker, round_["id"], SENTENCE)
    for variant in VARIANTS[1:]:
        assignment = assignment_of(client, worker, round_["id"])
        before = table_snapshot(app, *TABLES, "study_sessions")
        assert_duplicate_refusal(attempt(client, worker, assignment["id"], variant), round_["number"])
        assert table_snapshot(app, *TABLES, "study_sessions") == before
    row = client.get(f"{API}/me/study-sessions", headers=worker.headers).json()["data"][0]
    assert row["units_done"] == 1 and row["status"] == "active"
    finish = client.post(f"{API}/study-sessions/{session_id}/finish", json={"reason": "quota"}, headers=worker.headers)
    assert finish.status_code == 409 and "1 of 3" in finish.json()["error"]["message"]
