"""What the API's tail under a crowd was cut with (issue 14, point 3; docs/benchmarks.md, "Load and
faults"): reads that do not queue for SQLite's write lock, the balanced target pick counted in
SQL, and `dynaloop api`'s frozen start-up objects. No timings (those are bench/load.py's).

Runs on SQLite always and on PostgreSQL when DYNALOOP_TEST_POSTGRES_URL is set.
"""

from __future__ import annotations

import gc
import json
import threading
from collections import Counter
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, text

from dynaloop.api.app import create_app
from services.db.engine import session_scope
from services.db.models import ApiToken, Assignment, User
from services.db.transactions import begin_read_only
from services.domain.writing import assignments_per_target
from services.settings import Settings
from tests.conftest import Actor, MakeUser, example_yaml, open_round
from tests.stub_model_server import ThreadedServer

# On both databases: read-only transactions, counts in SQL.
pytestmark = [pytest.mark.both_databases, pytest.mark.timeout(300)]

PROMPTS = [f"Prompt {i}: the cafe on the corner serves a decent lunch." for i in range(20)]


def test_balanced_round_gives_each_label_in_turn_counted_in_sql(
    client: TestClient, app: FastAPI, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    """Nine writers in a balanced three-label round get each label three times; the per-target
    count is SQL's GROUP BY over the stored JSON and agrees with counting the rows one by one."""
    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)
    targets = []
    for i in range(9):
        writer = make_user(f"writer{i}", "writer")
        response = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers)
        assert response.status_code == 201, response.text
        targets.append(tuple(response.json()["target_label"]))
    assert sorted(Counter(targets).values()) == [3, 3, 3], targets
    with session_scope(app.state.sessionmaker) as session:
        counted: dict[str, int] = {row[0]: row[1] for row in session.execute(assignments_per_target(round_["id"]))}
        one_by_one = Counter(
            tuple(target)
            for target in session.scalars(select(Assignment.target_label).where(Assignment.round_id == round_["id"]))
        )
    assert {tuple(json.loads(text_)): n for text_, n in counted.items()} == dict(one_by_one)


def test_a_reader_does_not_wait_for_an_open_write_transaction(app: FastAPI, make_user: MakeUser) -> None:
    """While one transaction holds the write lock (on SQLite: the API's queue and BEGIN
    IMMEDIATE), a read-only one (the token lookup's) reads the last committed state at once."""
    make_user("reader", "writer")
    holding, release = threading.Event(), threading.Event()

    def writer() -> None:
        with session_scope(app.state.sessionmaker) as session:
            user = session.scalars(select(User).where(User.username == "reader")).one()
            user.roles = ["writer", "validator"]
            session.flush()  # the transaction has begun and written: it holds the lock
            holding.set()
            release.wait(timeout=60)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert holding.wait(timeout=60)
        seen: list[Any] = []

        def reader() -> None:
            with session_scope(app.state.sessionmaker) as session:
                begin_read_only(session)
                seen.append(session.scalars(select(User.roles).where(User.username == "reader")).one())

        reading = threading.Thread(target=reader)
        reading.start()
        # Far below the 10 s busy timeout a queued transaction would wait; the writer lets go only after this.
        reading.join(timeout=5)
        assert not reading.is_alive(), "the read waited for the write transaction"
        assert seen == [["writer"]]  # the committed state, not the open transaction's change
    finally:
        release.set()
        thread.join(timeout=60)


def test_a_read_only_transaction_refuses_writes(app: FastAPI, make_user: MakeUser) -> None:
    make_user("quiet", "writer")
    if app.state.engine.dialect.name != "sqlite":
        pytest.skip("read-only transactions are SQLite's (PostgreSQL's are ordinary ones)")
    with app.state.sessionmaker() as session:
        begin_read_only(session)
        with pytest.raises(RuntimeError, match="read-only transaction may only SELECT"):
            session.execute(text("UPDATE users SET roles = '[]' WHERE username = 'quiet'"))
        session.rollback()
    with session_scope(app.state.sessionmaker) as session:
        assert session.scalars(select(User.roles).where(User.username == "quiet")).one() == ["writer"]
        # After the read-only transaction the connection writes again (the mark does not stay with it).
        session.execute(text("UPDATE users SET roles = '[\"writer\", \"validator\"]' WHERE username = 'quiet'"))


def test_read_only_must_begin_a_transaction(app: FastAPI, make_user: MakeUser) -> None:
    make_user("early", "writer")
    with app.state.sessionmaker() as session:
        session.scalar(select(ApiToken.id).limit(1))
        with pytest.raises(RuntimeError, match="already begun"):
            begin_read_only(session)


def test_revoked_token_and_expiry_still_seen_by_the_read_only_lookups(
    client: TestClient, app: FastAPI, researcher: Actor, writer: Actor, stub_model: ThreadedServer
) -> None:
    """The token lookup and the writer's due-assignment check read outside the write lock; an
    overdue assignment is still expired (410) and a revoked token still refused (401)."""
    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)
    assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()
    with session_scope(app.state.sessionmaker) as session:
        row = session.get(Assignment, assignment["id"])
        assert row is not None
        row.expires_at = row.started_at  # overdue
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts", json={"text": "A fine lunch."}, headers=writer.headers
    )
    assert response.status_code == 410, response.text
    with session_scope(app.state.sessionmaker) as session:
        assert session.get(Assignment, assignment["id"]).status.value == "expired"  # type: ignore[union-attr]
        for token in session.scalars(select(ApiToken)):
            token.revoked_at = token.created_at
    response = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers)
    assert response.status_code == 401, response.text


def test_the_api_server_freezes_its_start_up_objects(settings: Settings) -> None:
    """`dynaloop api` sets freeze_gc_at_startup; an app built in-process (the tests') does not."""
    gc.unfreeze()
    try:
        plain = create_app(settings)
        with TestClient(plain):
            assert gc.get_freeze_count() == 0
        plain.state.engine.dispose()
        frozen = settings.model_copy(update={"freeze_gc_at_startup": True})
        app = create_app(frozen)
        with TestClient(app):
            assert gc.get_freeze_count() > 0
        app.state.engine.dispose()
    finally:
        gc.unfreeze()
