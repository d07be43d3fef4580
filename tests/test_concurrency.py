"""Real concurrency over real HTTP: the API runs under uvicorn in a background thread on a
free port, and requests are fired at the same moment from a thread pool with httpx.

What must hold under races (docs/design.md "Bad input and faults", "Validation protocol"):
never more counted labels than an example needs, never a second row for a retried request,
never more tries than allowed, never two writers handed the same unused prompt, never two
examples for one assignment -- and never a 500: a request that loses a race gets a 409 that
says what happened and to retry.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import delete, func, select

from services.db.models import Assignment, Attempt, Example, Prompt, Round, Task, Validation, ValidationClaim
from tests.conftest import (
    Actor,
    MakeUser,
    example_yaml,
    grant_model_server,
    open_round,
    register_model_server,
    table_counts,
    table_snapshot,
)
from tests.stub_model_server import ThreadedServer

pytestmark = pytest.mark.both_databases  # concurrency and locking


API = "/api/v1"
NEUTRAL_TEXT = "We went there on a Sunday afternoon with friends."  # the stub says neutral
PROMPTS = [
    "The soup was fine and the bread was fresh.",
    "We went there on a Sunday afternoon.",
    "The staff were friendly and quick.",
]


@pytest.fixture
def http(app_server: ThreadedServer) -> Iterator[httpx.Client]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    with httpx.Client(base_url=app_server.url, timeout=60.0, limits=limits) as client:
        yield client


def fire(n: int, request: Callable[[int], httpx.Response]) -> list[httpx.Response]:
    """Run request(0..n-1) in n threads that start together (a barrier), and return the answers."""
    barrier = threading.Barrier(n)

    def run(i: int) -> httpx.Response:
        barrier.wait(timeout=30)
        return request(i)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(run, range(n)))


def statuses(responses: list[httpx.Response]) -> Counter[int]:
    return Counter(r.status_code for r in responses)


def assert_no_server_errors(responses: list[httpx.Response]) -> None:
    for response in responses:
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["code"] and len(error["message"]) >= 10, error


def assert_created_once(responses: list[httpx.Response]) -> int:
    """Identical concurrent requests: one 201, the rest replays (200) or 409s, all of one row.
    Returns that row's id."""
    assert_no_server_errors(responses)
    counts = statuses(responses)
    assert counts[201] == 1 and set(counts) <= {200, 201, 409}, [r.text for r in responses]
    ids = {r.json()["id"] for r in responses if r.status_code in (200, 201)}
    assert len(ids) == 1
    return ids.pop()


def start(http: httpx.Client, actor: Actor, round_id: int, **body: Any) -> dict[str, Any]:
    response = http.post(f"{API}/rounds/{round_id}/assignments", json=body, headers=actor.headers)
    assert response.status_code in (200, 201), response.text
    return response.json()


def attempt(http: httpx.Client, actor: Actor, assignment_id: int, text: str, key: str | None = None) -> httpx.Response:
    headers = dict(actor.headers)
    if key is not None:
        headers["Idempotency-Key"] = key
    return http.post(f"{API}/assignments/{assignment_id}/attempts", json={"text": text}, headers=headers)


def write_example(http: httpx.Client, actor: Actor, round_id: int, text: str = NEUTRAL_TEXT) -> dict[str, Any]:
    assignment = start(http, actor, round_id)
    response = attempt(http, actor, assignment["id"], text)
    assert response.status_code == 201, response.text
    scored = response.json()
    if scored["fooled"]:
        response = http.post(
            f"{API}/attempts/{scored['id']}/confirmation", json={"agrees": True}, headers=actor.headers
        )
        assert response.status_code == 200, response.text
    response = http.post(
        f"{API}/assignments/{assignment['id']}/example", json={"attempt_id": scored["id"]}, headers=actor.headers
    )
    assert response.status_code == 201, response.text
    return response.json()


@pytest.fixture
def dynasent(http: httpx.Client, app: FastAPI, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    yaml_text = example_yaml("dynasent-r2", onboarding_quiz=None)
    return open_round(http, researcher, yaml_text, register_model_server(app, stub_model.url), PROMPTS)


# --- (a) validators racing for the last labels ---------------------------------------------


def test_ten_validators_race_for_five_labels(
    http: httpx.Client, app: FastAPI, make_user: MakeUser, writer: Actor, dynasent: dict[str, Any]
) -> None:
    example = write_example(http, writer, dynasent["id"])
    racers = [make_user(f"racer{i}", "validator") for i in range(10)]
    # Each racer holds the example in a live batch: a batch claims at most the five slots, so
    # the claims are let go after each serving (as when claims lapse) to put all ten in the race.
    for racer in racers:
        batch = http.get(f"{API}/rounds/{dynasent['id']}/validation-batch", headers=racer.headers).json()
        assert batch["count"] == 1, batch
        with app.state.sessionmaker() as session:
            session.execute(delete(ValidationClaim))
            session.commit()

    responses = fire(
        10,
        lambda i: http.post(
            f"{API}/examples/{example['id']}/validations", json={"label": "neutral"}, headers=racers[i].headers
        ),
    )

    assert_no_server_errors(responses)
    assert statuses(responses) == {201: 5, 409: 5}, [r.text for r in responses]
    for response in responses:
        if response.status_code == 409:
            error = response.json()["error"]
            assert error["code"] == "conflict"
            assert "already has all its labels" in error["message"] and "fetch your batch again" in error["message"]
    with app.state.sessionmaker() as session:
        row = session.get(Example, example["id"])
        counted = session.scalar(
            select(func.count())
            .select_from(Validation)
            .where(Validation.example_id == example["id"], Validation.counted.is_(True))
        )
        total = session.scalar(
            select(func.count()).select_from(Validation).where(Validation.example_id == example["id"])
        )
        assert row is not None
        assert row.validation_count == 5 == counted == total
        assert row.status.value == "validated"
    winners = {r.json()["id"] for r in responses if r.status_code == 201}
    assert len(winners) == 5


# --- (b) one validator, the same label eight times at once -----------------------------------


def test_same_validation_sent_eight_times(
    http: httpx.Client, app: FastAPI, validators: list[Actor], writer: Actor, dynasent: dict[str, Any]
) -> None:
    example = write_example(http, writer, dynasent["id"])
    validator = validators[0]
    # As in the real flow, the batch comes first (it also creates the validator's standing on
    # the task, which would otherwise serialise the racing requests).
    batch = http.get(f"{API}/rounds/{dynasent['id']}/validation-batch", headers=validator.headers).json()
    assert [item["text"] for item in batch["data"]] == [example["text"]]

    responses = fire(
        8,
        lambda i: http.post(
            f"{API}/examples/{example['id']}/validations",
            json={"label": "negative"},
            headers={**validator.headers, "Idempotency-Key": "same-label"},
        ),
    )

    created_id = assert_created_once(responses)
    for response in responses:
        if response.status_code == 409:
            error = response.json()["error"]
            assert error["code"] == "conflict" and "retry" in error["message"], error
        if response.status_code == 200:
            assert response.headers["Idempotent-Replayed"] == "true"
    with app.state.sessionmaker() as session:
        rows = list(session.scalars(select(Validation).where(Validation.example_id == example["id"])))
        assert [(r.id, r.label) for r in rows] == [(created_id, ["negative"])]
        assert session.get(Example, example["id"]).validation_count == 1
    # A retry after the race is answered from the stored row.
    again = http.post(
        f"{API}/examples/{example['id']}/validations",
        json={"label": "negative"},
        headers={**validator.headers, "Idempotency-Key": "same-label"},
    )
    assert again.status_code == 200 and again.json()["id"] == rows[0].id


# --- (c) one attempt, the same Idempotency-Key eight times at once ----------------------------


def test_same_attempt_key_sent_eight_times(
    http: httpx.Client, app: FastAPI, writer: Actor, dynasent: dict[str, Any]
) -> None:
    assignment = start(http, writer, dynasent["id"])

    responses = fire(8, lambda i: attempt(http, writer, assignment["id"], NEUTRAL_TEXT, key="same-attempt"))

    assert_no_server_errors(responses)
    # 429: the duplicate came while the first was with the model (one attempt per assignment
    # in flight, services/domain/in_flight.py).
    assert set(statuses(responses)) <= {200, 201, 409, 429}, [r.text for r in responses]
    ids = {r.json()["id"] for r in responses if r.status_code in (200, 201)}
    assert len(ids) == 1, [r.text for r in responses]
    for response in responses:
        if response.status_code in (409, 429):
            assert "retry" in response.json()["error"]["message"], response.text
    with app.state.sessionmaker() as session:
        rows = list(session.scalars(select(Attempt).where(Attempt.assignment_id == assignment["id"])))
        assert len(rows) == 1 and rows[0].id in ids
        assert rows[0].status.value == "scored" and rows[0].counts_as_try
        assert session.get(Assignment, assignment["id"]).tries_used == 1


# --- (d) eight attempts at once on an assignment with two tries left --------------------------


def test_tries_never_exceed_the_limit(
    http: httpx.Client, app: FastAPI, writer: Actor, dynasent: dict[str, Any]
) -> None:
    assignment = start(http, writer, dynasent["id"])
    allowed = assignment["tries_allowed"]
    for i in range(allowed - 2):
        assert attempt(http, writer, assignment["id"], f"{NEUTRAL_TEXT} Warm-up {i}.").status_code == 201

    def race(i: int) -> httpx.Response:
        return attempt(http, writer, assignment["id"], f"{NEUTRAL_TEXT} Race {i}.", key=f"race-{i}")

    # One attempt per assignment is with the model at a time: the others are refused (429,
    # nothing saved) or, once the tries are used, 409. Refused ones are sent again until
    # every one has its final answer; never more than the two tries left are used.
    pending = list(range(8))
    responses = fire(8, race)
    final: dict[int, httpx.Response] = {}
    for _ in range(20):
        assert_no_server_errors(responses)
        refused = []
        for i, response in zip(pending, responses, strict=True):
            if response.status_code == 429:
                assert response.json()["error"]["code"] == "too_many_in_flight", response.text
                refused.append(i)
            else:
                final[i] = response
        pending = refused
        if not pending:
            break
        responses = fire(len(pending), lambda j, again=pending: race(again[j]))
    assert statuses(list(final.values())) == {201: 2, 409: 6}, [r.text for r in final.values()]
    for response in final.values():
        if response.status_code == 409:
            error = response.json()["error"]
            assert error["code"] == "conflict" and f"all {allowed} tries" in error["message"], error
    with app.state.sessionmaker() as session:
        row = session.get(Assignment, assignment["id"])
        assert row.tries_used == row.tries_allowed == allowed
        counted = session.scalar(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.assignment_id == assignment["id"], Attempt.counts_as_try.is_(True))
        )
        assert counted == allowed
    state = http.get(f"{API}/assignments/{assignment['id']}", headers=writer.headers).json()
    assert state["tries_used"] == allowed


# --- (e) writers racing for unused prompts -----------------------------------------------------


def _prompt_usage_is_exact(app: Any, round_id: int) -> dict[int, int]:
    """Every prompt's times_used equals the assignments that got it (no lost update)."""
    with app.state.sessionmaker() as session:
        used = dict(session.execute(select(Prompt.id, Prompt.times_used).where(Prompt.round_id == round_id)).all())
        handed = Counter(
            session.scalars(
                select(Assignment.prompt_id).where(Assignment.round_id == round_id, Assignment.prompt_id.is_not(None))
            )
        )
    assert used == {pid: handed.get(pid, 0) for pid in used}
    return used


def test_two_writers_race_for_the_last_unused_prompt(
    http: httpx.Client, app: FastAPI, make_user: MakeUser, researcher: Actor, stub_model: ThreadedServer
) -> None:
    round_ = open_round(
        http,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        register_model_server(app, stub_model.url),
        PROMPTS[:2],
        prompt_strategy="unused_first",
    )
    first = start(http, make_user("early", "writer"), round_["id"])
    last_unused = (set(PROMPTS[:2]) - {first["prompt"]["text"]}).pop()
    racers = [make_user("anna", "writer"), make_user("bert", "writer")]

    responses = fire(
        2, lambda i: http.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=racers[i].headers)
    )

    assert_no_server_errors(responses)
    got = [r.json()["prompt"]["text"] for r in responses if r.status_code == 201]
    for response in responses:
        if response.status_code == 409:
            assert "retry" in response.json()["error"]["message"], response.text
    assert last_unused in got  # one of them got it ...
    usage = _prompt_usage_is_exact(app, round_["id"])  # ... and it was not handed out twice as unused
    assert sum(usage.values()) == 1 + len(got)
    if got.count(last_unused) == 2:
        # Only possible as a least-used fallback once it was used: then it counts two uses.
        assert max(usage.values()) == 2


def test_eight_writers_race_for_eight_unused_prompts(
    http: httpx.Client, app: FastAPI, make_user: MakeUser, researcher: Actor, stub_model: ThreadedServer
) -> None:
    prompts = [f"Prompt number {i} about a quiet little cafe." for i in range(8)]
    round_ = open_round(
        http,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        register_model_server(app, stub_model.url),
        prompts,
        prompt_strategy="unused_first",
    )
    racers = [make_user(f"w{i}", "writer") for i in range(8)]

    responses = fire(
        8, lambda i: http.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=racers[i].headers)
    )

    assert_no_server_errors(responses)
    got = [r.json()["prompt"]["id"] for r in responses if r.status_code == 201]
    for response in responses:
        if response.status_code == 409:
            assert "retry" in response.json()["error"]["message"], response.text
    assert len(got) == len(set(got)), "two writers got the same unused prompt"
    assert len(got) >= 6
    usage = _prompt_usage_is_exact(app, round_["id"])
    assert sorted(usage.values()).count(1) == len(got)


# --- (f) the same assignment submitted eight times at once ---------------------------------------


def test_concurrent_submit_makes_one_example(
    http: httpx.Client, app: FastAPI, writer: Actor, dynasent: dict[str, Any]
) -> None:
    assignment = start(http, writer, dynasent["id"])
    target = assignment["target_label"][0]
    fooling = {"positive": "terrible", "negative": "great", "neutral": "great"}[target]
    response = attempt(http, writer, assignment["id"], f"{NEUTRAL_TEXT} Honestly {fooling} stuff.")
    assert response.status_code == 201, response.text
    scored = response.json()
    assert scored["fooled"]
    assert (
        http.post(
            f"{API}/attempts/{scored['id']}/confirmation", json={"agrees": True}, headers=writer.headers
        ).status_code
        == 200
    )

    responses = fire(
        8,
        lambda i: http.post(
            f"{API}/assignments/{assignment['id']}/example",
            json={"attempt_id": scored["id"]},
            headers={**writer.headers, "Idempotency-Key": "submit-1"},
        ),
    )

    created_id = assert_created_once(responses)
    for response in responses:
        if response.status_code == 409:
            assert "retry" in response.json()["error"]["message"], response.text
    with app.state.sessionmaker() as session:
        examples = list(session.scalars(select(Example).where(Example.assignment_id == assignment["id"])))
        assert [e.id for e in examples] == [created_id]
        row = session.get(Assignment, assignment["id"])
        assert row.status.value == "submitted"
        prompt = session.get(Prompt, row.prompt_id)
        assert prompt.times_fooled == 1  # counted once, not once per racing request


# --- (g) a researcher's double click: the same task, round and prompt file at once -------------


def test_concurrent_setup_requests_create_each_thing_once(
    http: httpx.Client, app: FastAPI, researcher: Actor, stub_model: ThreadedServer
) -> None:
    yaml_text = example_yaml("dynasent-r2", onboarding_quiz=None).encode("utf-8")
    server_name = register_model_server(app, stub_model.url)
    responses = fire(
        6,
        lambda i: http.post(
            f"{API}/tasks", content=yaml_text, headers={**researcher.headers, "Content-Type": "application/yaml"}
        ),
    )
    assert_no_server_errors(responses)
    assert statuses(responses) == {201: 1, 409: 5}, [r.text for r in responses]
    grant_model_server(app, server_name, "dynasent-r2")  # as an admin would

    responses = fire(
        6,
        lambda i: http.post(
            f"{API}/tasks/dynasent-r2/rounds", json={"model_servers": [server_name]}, headers=researcher.headers
        ),
    )
    assert_no_server_errors(responses)
    assert statuses(responses) == {201: 1, 409: 5}, [r.text for r in responses]
    round_id = next(r.json()["id"] for r in responses if r.status_code == 201)

    lines = "\n".join(json.dumps({"text": f"Prompt {i} about the cafe."}) for i in range(40)).encode("utf-8")
    responses = fire(
        6,
        lambda i: http.post(
            f"{API}/rounds/{round_id}/prompts",
            content=lines,
            headers={**researcher.headers, "Content-Type": "application/x-ndjson"},
        ),
    )
    assert_no_server_errors(responses)
    assert set(statuses(responses)) <= {200, 409}
    imported = [r.json() for r in responses if r.status_code == 200]
    assert sum(r["imported"] for r in imported) == 40
    assert all(r["imported"] + r["already_present"] == 40 for r in imported)
    for response in responses:
        if response.status_code == 409:
            assert "retry" in response.json()["error"]["message"], response.text

    with app.state.sessionmaker() as session:
        assert session.scalar(select(func.count()).select_from(Task)) == 1
        assert [r.number for r in session.scalars(select(Round))] == [1]
        assert session.scalar(select(func.count()).select_from(Prompt)) == 40


# --- (h) oversized bodies over a real socket, with and without Content-Length ------------------


def test_oversized_bodies_over_real_http(
    http: httpx.Client, app: FastAPI, writer: Actor, dynasent: dict[str, Any]
) -> None:
    """uvicorn, not the test transport: a 413 comes back whether or not Content-Length is sent,
    before the whole body is read, and the connection pool stays usable."""
    assignment = start(http, writer, dynasent["id"])
    limit = app.state.settings.max_request_bytes

    def chunked() -> Iterator[bytes]:
        yield b'{"text": "'
        for _ in range(limit // 16384 + 4):
            yield b"a" * 16384
        yield b'"}'

    tables = ["attempts", "assignments", "prompts", "examples", "validations"]
    before = table_counts(app), table_snapshot(app, *tables)
    # Two at once: a writer may have two attempt requests in flight (model_requests_per_writer);
    # a third would get 429 `too_many_in_flight` before its body is read.
    responses = fire(
        2,
        lambda i: http.post(
            f"{API}/assignments/{assignment['id']}/attempts",
            content=chunked() if i % 2 else b"a" * (limit + 1),
            headers={**writer.headers, "Content-Type": "application/json"},
        ),
    )
    for i, response in enumerate(responses):
        assert response.status_code == 413, response.text
        error = response.json()["error"]
        assert error["code"] == "too_large" and f"larger than {limit} bytes" in error["message"]
        assert (response.request.headers.get("content-length") is None) == bool(i % 2)
    assert (table_counts(app), table_snapshot(app, *tables)) == before
    assert http.get(f"{API}/me", headers=writer.headers).status_code == 200
