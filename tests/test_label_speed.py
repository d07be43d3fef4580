"""The label path's work does not grow with earlier rounds (issue 17, point 8; docs/benchmarks.md,
"Labelling"). No timings: the SQL statements each label runs, the rows the batch-window check
judges, and the query plan of the per-round count are checked instead.

Runs on SQLite always and on PostgreSQL when DYNALOOP_TEST_POSTGRES_URL is set.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select, text

from services.db.engine import session_scope
from services.db.models import Condition, Example, ExampleOrigin, ExampleStatus, Task, Validation
from services.domain import quality, validating
from services.domain.tasks import definition_of
from services.domain.validating import labels_in_round
from tests.conftest import Actor, MakeUser, example_yaml, open_round

# On both databases: the queries and indexes each label reads.
pytestmark = [pytest.mark.both_databases, pytest.mark.timeout(300)]

LABELS = ["positive", "negative", "neutral"]
EXAMPLES_PER_ROUND = 12  # 60 labels from 6 validators: every validator completes a batch of 10


def add_examples(app: FastAPI, round_id: int, offset: int) -> None:
    """Examples as ``round harvest --as examples`` writes them: no writer, validating."""
    with session_scope(app.state.sessionmaker) as session:
        for i in range(offset, offset + EXAMPLES_PER_ROUND):
            session.add(
                Example(
                    round_id=round_id,
                    origin=ExampleOrigin.harvested,
                    source_metadata={"corpus": "test", "document_id": str(i), "sentence_index": 0},
                    condition=Condition.prompt,
                    text=f"Sentence {i}: the soup was {LABELS[i % 3]}.",
                    target_label=[],
                    model_prediction=[LABELS[(i + 1) % 3]],
                    model_id="model-0",
                    fooled=False,
                    extras={},
                    status=ExampleStatus.validating,
                    validation_count=0,
                    validations_needed=5,
                    requeue_count=0,
                )
            )


def label_round(client: TestClient, app: FastAPI, round_id: int, validators: list[Actor]) -> list[int]:
    """Every open example labelled through the API; returns the SQL statements of each label."""
    statements: list[int] = []
    seen = [0]

    def count(*_: Any) -> None:
        seen[0] += 1

    busy = True
    while busy:
        busy = False
        for validator in validators:
            batch = client.get(f"/api/v1/rounds/{round_id}/validation-batch", headers=validator.headers).json()
            for item in batch["data"]:
                busy = True
                label = next(label for label in LABELS if f"was {label}." in item["text"])
                event.listen(app.state.engine, "before_cursor_execute", count)
                seen[0] = 0
                try:
                    response = client.post(
                        f"/api/v1/validation-items/{item['item_id']}/validations",
                        json={"label": label},
                        headers=validator.headers,
                    )
                finally:
                    event.remove(app.state.engine, "before_cursor_execute", count)
                assert response.status_code == 201, response.text
                statements.append(seen[0])
    return statements


def test_a_label_in_round_2_does_the_work_of_a_label_in_round_1(
    app: FastAPI, client: TestClient, researcher: Actor, make_user: MakeUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    validators = [make_user(f"v{i}", "validator") for i in range(6)]
    judged: list[tuple[int | None, int]] = []  # (round id, labels of the validator read) per batch-window check
    original = quality.validator_agreement

    def spy(session: Any, task: Any, round_: Any = None, only_user_id: int | None = None) -> Any:
        rows = original(session, task, round_=round_, only_user_id=only_user_id)
        judged.append((round_.id if round_ else None, sum(r.labels for r in rows if r.user_id == only_user_id)))
        return rows

    monkeypatch.setattr(quality, "validator_agreement", spy)
    # Every batch shuffled with one seed: a batch's order decides which label also finalises an
    # example or ends the batch, and so its statements; with one seed both rounds line up.
    monkeypatch.setattr(validating.secrets, "randbits", lambda bits: 20261125)
    first = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), None)
    add_examples(app, first["id"], 0)
    round_1 = label_round(client, app, first["id"], validators)
    round_1_checks = list(judged)
    for status in ("validating", "closed"):
        response = client.post(
            f"/api/v1/rounds/{first['id']}/status", json={"status": status}, headers=researcher.headers
        )
        assert response.status_code == 200, response.text
    response = client.post(f"/api/v1/rounds/{first['id']}/build", json={"chance": False}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    response = client.post("/api/v1/tasks/dynasent-r2/rounds", json={"model_servers": []}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    second = response.json()
    add_examples(app, second["id"], EXAMPLES_PER_ROUND)
    judged.clear()
    round_2 = label_round(client, app, second["id"], validators)
    assert len(round_1) == len(round_2) == 5 * EXAMPLES_PER_ROUND
    # The same statements per label (the same mix of plain labels, finalising labels and
    # batch-window checks), not more because round 1 is there.
    assert Counter(round_2) == Counter(round_1)
    # Each batch-window check judged this round's labels only: 10 labels (one batch) per
    # validator, never the round-1 labels the same validator gave.
    assert round_1_checks and judged
    assert all(round_id == first["id"] for round_id, _ in round_1_checks)
    assert all(round_id == second["id"] and labels == 10 for round_id, labels in judged), judged
    with session_scope(app.state.sessionmaker) as session:
        assert session.scalar(select(func.count()).select_from(Validation)) == 10 * EXAMPLES_PER_ROUND


def test_the_per_round_label_count_reads_the_validator_index(app: FastAPI) -> None:
    """The count behind "every full batch" starts from the validator's labels (migration 0010's
    index), not from a scan of every validation."""
    count = labels_in_round(1, 2)
    engine = app.state.engine
    sql = str(count.compile(engine, compile_kwargs={"literal_binds": True}))
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            plan = " ".join(str(row[-1]) for row in connection.execute(text(f"EXPLAIN QUERY PLAN {sql}")))
        else:
            connection.execute(text("SET enable_seqscan = off"))  # an empty table would be scanned anyway
            plan = " ".join(row[0] for row in connection.execute(text(f"EXPLAIN {sql}")))
    assert "ix_validations_validator_example" in plan, plan


def test_a_task_definition_is_parsed_once_per_stored_definition(
    app: FastAPI, client: TestClient, researcher: Actor
) -> None:
    open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), None)
    with session_scope(app.state.sessionmaker) as session:
        task = session.scalars(select(Task)).one()
        first = definition_of(task)
        assert definition_of(task) is first
        changed = {**task.definition, "validation_batch_size": 7}
        task.definition = changed
        assert definition_of(task) is not first and definition_of(task).validation_batch_size == 7
