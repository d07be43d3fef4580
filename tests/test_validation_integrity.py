"""Validation integrity (issue 26, items 3 and 6): a label only for an item of the validator's live
batch, batches that stay put while live, control (gold) items that a validator cannot tell
from examples, gold accuracy that unqualifies and re-queues, and control items that never
reach the dataset. Each attack is sent as the attacker would, then the answer and the
unchanged database are checked (SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from rounds.build.report import render_markdown
from services.db.models import (
    ControlItem,
    Example,
    TaskWorker,
    Validation,
    ValidationBatch,
    ValidationBatchItem,
)
from tests.built_round import write_example as written
from tests.conftest import (
    Actor,
    MakeUser,
    example_yaml,
    label_served,
    open_round,
    served_examples,
    table_snapshot,
)
from tests.stub_model_server import ThreadedServer
from tests.test_validation_quality import PROMPTS, write_example

pytestmark = pytest.mark.both_databases  # served batches: locking, idempotent re-asks, requeues


API = "/api/v1"
# What a label can change: nothing here may move when a label is refused.
LABEL_TABLES = (
    "validations",
    "examples",
    "validation_batches",
    "validation_batch_items",
    "validation_claims",
    "task_workers",
    "control_items",
    "audit_log",
)
CONTROLS: list[dict[str, Any]] = [
    {"text": "The food was absolutely delicious and the staff were wonderful.", "labels": ["positive"]},
    {"text": "The waiter was rude to us and my soup arrived cold.", "labels": ["negative"]},
    {"text": "The restaurant opens at nine in the morning on weekdays.", "labels": ["neutral"]},
    {"text": "The pasta was excellent, but the service was painfully slow.", "labels": ["mixed"]},
    {"text": "I loved every minute of our stay and will come back.", "labels": ["positive"]},
    {"text": "Worst haircut I have ever had, and they charged me double.", "labels": ["negative"]},
]
RIGHT = {c["text"]: c["labels"][0] for c in CONTROLS}


def controlled_round(
    client: TestClient,
    researcher: Actor,
    stub_model: ThreadedServer,
    *,
    rate: float = 0.5,
    min_answers: int = 3,
    threshold: float = 0.7,
    batch_size: int = 10,
) -> dict[str, Any]:
    quality = {
        "control_rate": rate,
        "gold_accuracy_threshold": threshold,
        "min_control_answers": min_answers,
        "control_items": CONTROLS,
    }
    yaml_text = example_yaml("dynasent-r2", onboarding_quiz=None, validation_batch_size=batch_size, quality=quality)
    return open_round(client, researcher, yaml_text, stub_model.url, PROMPTS)


@pytest.fixture
def dynasent(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)


def batch_of(client: TestClient, validator: Actor, round_id: int, **params: Any) -> dict[str, Any]:
    response = client.get(f"{API}/rounds/{round_id}/validation-batch", params=params, headers=validator.headers)
    assert response.status_code == 200, response.text
    return response.json()


def label_item(client: TestClient, validator: Actor, item_id: str, value: Any) -> Any:
    return client.post(
        f"{API}/validation-items/{item_id}/validations", json={"label": value}, headers=validator.headers
    )


def message(response: Any) -> str:
    return str(response.json()["error"]["message"])


def control_text(app: FastAPI, item_id: str) -> str | None:
    with app.state.sessionmaker() as session:
        item = session.scalars(select(ValidationBatchItem).where(ValidationBatchItem.item_key == item_id)).one()
        return item.control_item.text if item.control_item is not None else None


# --- a label only for an item of one's live batch ---------------------------------------------


def test_the_issues_reproduction_a_label_by_example_id_never_served_is_refused(
    client: TestClient, app: FastAPI, dynasent: dict[str, Any], writer: Actor, validators: list[Actor]
) -> None:
    """Issue 26 item 3: ``POST /examples/1/validations`` answered 201 for anyone with the
    validator role, so five made-up validators decided an example's gold label. Now a label for
    an example that was never served to the caller is refused and nothing is written."""
    example = write_example(client, writer, dynasent["id"], "A plain remark about the weather here.")
    before = table_snapshot(app, *LABEL_TABLES)
    for validator in validators[:5]:
        response = client.post(
            f"{API}/examples/{example['id']}/validations", json={"label": "positive"}, headers=validator.headers
        )
        assert response.status_code == 409, response.text
        assert "not in a validation batch that is yours" in message(response)
        assert "GET /rounds/{round_id}/validation-batch" in message(response)
    assert table_snapshot(app, *LABEL_TABLES) == before


def test_another_validators_item_or_example_is_refused(
    client: TestClient, app: FastAPI, dynasent: dict[str, Any], writer: Actor, validators: list[Actor]
) -> None:
    example = write_example(client, writer, dynasent["id"], "A plain remark about the weather here.")
    owner, thief = validators[0], validators[1]
    item_id = batch_of(client, owner, dynasent["id"])["data"][0]["item_id"]
    before = table_snapshot(app, *LABEL_TABLES)
    stolen = label_item(client, thief, item_id, "positive")
    assert stolen.status_code == 404 and "no such item in your validation batches" in message(stolen)
    by_id = client.post(
        f"{API}/examples/{example['id']}/validations", json={"label": "positive"}, headers=thief.headers
    )
    assert by_id.status_code == 409
    made_up = label_item(client, thief, "A" * 22, "positive")
    assert made_up.status_code == 404
    assert table_snapshot(app, *LABEL_TABLES) == before
    # The owner's label goes through their item.
    assert label_item(client, owner, item_id, "neutral").status_code == 201


def test_an_expired_batch_takes_no_labels_and_the_next_batch_has_new_item_ids(
    client: TestClient, app: FastAPI, dynasent: dict[str, Any], writer: Actor, validators: list[Actor]
) -> None:
    example = write_example(client, writer, dynasent["id"], "A plain remark about the weather here.")
    validator = validators[0]
    old = batch_of(client, validator, dynasent["id"])["data"][0]["item_id"]
    with app.state.sessionmaker() as session:
        session.execute(update(ValidationBatch).values(expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)))
        session.commit()
    before = table_snapshot(app, *LABEL_TABLES)
    late = label_item(client, validator, old, "neutral")
    assert late.status_code == 409 and "no longer yours" in message(late)
    by_id = client.post(
        f"{API}/examples/{example['id']}/validations", json={"label": "neutral"}, headers=validator.headers
    )
    assert by_id.status_code == 409
    assert table_snapshot(app, *LABEL_TABLES) == before
    fresh = batch_of(client, validator, dynasent["id"])
    assert served_examples(client, fresh) == [example["id"]] and fresh["data"][0]["item_id"] != old
    assert label_item(client, validator, fresh["data"][0]["item_id"], "neutral").status_code == 201
    # The old key stays dead, even for the same example.
    assert label_item(client, validator, old, "neutral").status_code == 409


def test_asking_again_returns_the_same_batch_until_it_is_done(
    client: TestClient,
    app: FastAPI,
    researcher: Actor,
    writer: Actor,
    validators: list[Actor],
    stub_model: ThreadedServer,
) -> None:
    """Refreshing never farms new examples: while a batch is live the same items come back in
    the same order, a smaller ``size`` shows its first items, and only a finished batch makes
    room for the next examples."""
    yaml_text = example_yaml("dynasent-r2", onboarding_quiz=None, validation_batch_size=4)
    round_ = open_round(client, researcher, yaml_text, stub_model.url, PROMPTS)
    written = [
        write_example(client, writer, round_["id"], f"A plain remark number {i} on rain.")["id"] for i in range(7)
    ]
    validator = validators[0]
    first = batch_of(client, validator, round_["id"])
    assert first["count"] == 4
    for _ in range(3):
        assert batch_of(client, validator, round_["id"]) == first
    assert batch_of(client, validator, round_["id"], size=2)["data"] == first["data"][:2]
    with app.state.sessionmaker() as session:
        assert session.scalar(select(ValidationBatch.id).where(ValidationBatch.id > 1)) is None  # one batch only
    shown = served_examples(client, first)
    for item in first["data"]:
        assert label_item(client, validator, item["item_id"], "neutral").status_code == 201
    second = batch_of(client, validator, round_["id"])
    rest = served_examples(client, second)
    assert set(rest) == set(written) - set(shown) and len(rest) == 3
    assert not {i["item_id"] for i in second["data"]} & {i["item_id"] for i in first["data"]}


# --- control items ----------------------------------------------------------------------------


def test_control_items_cannot_be_told_from_examples(
    client: TestClient,
    app: FastAPI,
    researcher: Actor,
    writer: Actor,
    validators: list[Actor],
    stub_model: ThreadedServer,
) -> None:
    """Same JSON shape, same kind of id, same answers and the same errors: nothing a validator
    receives tells a control item from an example."""
    round_ = controlled_round(client, researcher, stub_model, rate=0.5)
    written = [
        write_example(client, writer, round_["id"], f"A plain remark number {i} on rain.")["id"] for i in range(3)
    ]
    validator = validators[0]
    batch = batch_of(client, validator, round_["id"])
    behind = served_examples(client, batch)
    # Three examples at a rate of one half: three control items beside them.
    assert sorted(e for e in behind if e is not None) == written and behind.count(None) == 3
    shapes = {tuple(sorted(item)) for item in batch["data"]}
    assert shapes == {("item_id", "target_span", "text")}
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{22}", item["item_id"]) for item in batch["data"])
    assert all(item["target_span"] is None for item in batch["data"])
    example_item = batch["data"][behind.index(written[0])]
    control_item = batch["data"][behind.index(None)]
    answers = [label_item(client, validator, item["item_id"], "neutral") for item in (example_item, control_item)]
    assert [a.status_code for a in answers] == [201, 201]
    assert [sorted(a.json()) for a in answers] == [["created_at", "flagged", "item_id", "label"]] * 2
    assert [a.json()["label"] for a in answers] == [["neutral"], ["neutral"]]
    # A retried label is the first answer again; a changed one is refused alike, naming no id.
    retries = [label_item(client, validator, item["item_id"], "neutral") for item in (example_item, control_item)]
    assert [(r.status_code, r.headers.get("Idempotent-Replayed")) for r in retries] == [(200, "true")] * 2
    changed = [label_item(client, validator, item["item_id"], "mixed") for item in (example_item, control_item)]
    assert [c.status_code for c in changed] == [409, 409]
    assert (
        message(changed[0])
        == message(changed[1])
        == ("you already labelled this item as ['neutral']; labels cannot be changed")
    )
    # Control items are not examples: the round still holds the three written ones.
    with app.state.sessionmaker() as session:
        assert sorted(session.scalars(select(Example.id))) == written


def test_labelling_by_example_id_is_refused_where_batches_hold_control_items(
    client: TestClient,
    app: FastAPI,
    researcher: Actor,
    writer: Actor,
    validators: list[Actor],
    stub_model: ThreadedServer,
) -> None:
    """Blind labels by example id would show which items leave the batch (the examples) and so
    which stay (the control items): a task with control items takes labels by item only."""
    round_ = controlled_round(client, researcher, stub_model)
    example = write_example(client, writer, round_["id"], "A plain remark about the weather here.")
    batch_of(client, validators[0], round_["id"])
    before = table_snapshot(app, *LABEL_TABLES)
    response = client.post(
        f"{API}/examples/{example['id']}/validations", json={"label": "neutral"}, headers=validators[0].headers
    )
    assert response.status_code == 409 and "POST /validation-items/{item_id}/validations" in message(response)
    assert table_snapshot(app, *LABEL_TABLES) == before


def test_low_gold_accuracy_unqualifies_and_requeues_what_the_validator_labelled(
    client: TestClient, app: FastAPI, researcher: Actor, writer: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    round_ = controlled_round(client, researcher, stub_model, rate=0.5, min_answers=3, threshold=0.7)
    written = [
        write_example(client, writer, round_["id"], f"A plain remark number {i} on rain.")["id"] for i in range(3)
    ]
    careless, careful = make_user("careless", "validator"), make_user("careful", "validator")
    wrong = {"positive": "negative", "negative": "positive", "neutral": "mixed", "mixed": "neutral"}
    batch = batch_of(client, careless, round_["id"])
    behind = served_examples(client, batch)
    # The examples first (they count), then the control items, all three wrong.
    order = sorted(range(len(behind)), key=lambda i: behind[i] is None)
    for index in order:
        item = batch["data"][index]
        value = "neutral" if behind[index] is not None else wrong[RIGHT[item["text"]]]
        assert label_item(client, careless, item["item_id"], value).status_code == 201
    with app.state.sessionmaker() as session:
        worker = session.scalars(select(TaskWorker).where(TaskWorker.qualified.is_(False))).one()
        assert "answered 0 of 3 control items right" in (worker.unqualified_reason or "")
        assert [v.counted for v in session.scalars(select(Validation))] == [False] * 3
        examples = session.scalars(select(Example).order_by(Example.id)).all()
        # Re-queued: their slots are back for qualified validators.
        assert [(e.validation_count, e.status.value) for e in examples] == [(0, "validating")] * 3
    stopped = client.get(f"{API}/rounds/{round_['id']}/validation-batch", headers=careless.headers)
    assert stopped.status_code == 403 and "no longer qualified" in message(stopped)
    labelled = label_served(client, careful, round_["id"], lambda example_id: "neutral" if example_id else None)
    # label_served stops at the first control item; answer the rest right.
    rest = batch_of(client, careful, round_["id"])
    for item, example_id in zip(rest["data"], served_examples(client, rest), strict=True):
        value = "neutral" if example_id is not None else RIGHT[item["text"]]
        assert label_item(client, careful, item["item_id"], value).status_code == 201
        if example_id is not None:
            labelled.append(example_id)
    assert sorted(labelled) == written
    rows = client.get(f"{API}/rounds/{round_['id']}/worker-agreement", headers=researcher.headers).json()
    by_name = {row["username"]: row for row in rows}
    assert by_name["careless"]["gold_accuracy"] == 0.0 and by_name["careless"]["control_answers"] == 3
    assert not by_name["careless"]["qualified"]
    assert by_name["careful"]["gold_accuracy"] == 1.0 and by_name["careful"]["control_answers"] == 3
    assert by_name["careful"]["qualified"]


def test_researchers_add_and_list_control_items_others_cannot(
    client: TestClient,
    app: FastAPI,
    researcher: Actor,
    make_user: MakeUser,
    validators: list[Actor],
    stub_model: ThreadedServer,
) -> None:
    controlled_round(client, researcher, stub_model)
    url = f"{API}/tasks/dynasent-r2/control-items"
    listed = client.get(url, headers=researcher.headers).json()
    assert listed["count"] == len(CONTROLS) and {row["source"] for row in listed["data"]} == {"task_yaml"}
    body = {"text": "The hotel room was spotless and the bed was lovely.", "labels": ["positive"]}
    outsider = make_user("otto", "researcher")
    before = table_snapshot(app, *LABEL_TABLES)
    hidden = client.post(url, json=body, headers=outsider.headers)
    assert hidden.status_code == 404 and client.get(url, headers=outsider.headers).status_code == 404
    assert client.post(url, json=body, headers=validators[0].headers).status_code == 403
    assert client.get(url, headers=validators[0].headers).status_code == 403
    bad = client.post(url, json={**body, "labels": ["ecstatic"]}, headers=researcher.headers)
    assert bad.status_code == 422 and "not validation labels" in message(bad)
    assert table_snapshot(app, *LABEL_TABLES) == before
    added = client.post(url, json=body, headers=researcher.headers)
    assert added.status_code == 201 and added.json()["source"] == "api"
    again = client.post(url, json=body, headers=researcher.headers)
    assert again.status_code == 409 and "already has a control item" in message(again)
    retired = client.delete(f"{url}/{added.json()['id']}", headers=researcher.headers)
    assert retired.status_code == 200 and retired.json()["active"] is False
    with app.state.sessionmaker() as session:
        assert session.scalar(select(ControlItem.active).where(ControlItem.id == added.json()["id"])) is False


def test_a_build_and_its_export_hold_no_control_item(
    client: TestClient, app: FastAPI, researcher: Actor, writer: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    """Control answers sit beside the labels in every batch, yet the round's examples, its
    statistics, its build (report included) and its exported dataset hold no control item."""
    quality = {"control_rate": 0.3, "min_control_answers": 50, "control_items": CONTROLS}
    yaml_text = example_yaml("dynasent-r2", onboarding_quiz=None, quality=quality)
    round_ = open_round(client, researcher, yaml_text, stub_model.url, PROMPTS, target_label_mode="writer_choice")
    gold: dict[int, str] = {}
    for target in ("positive", "negative", "neutral"):
        for copy in range(4):  # the relaxed policy's class-balance guard: 4 per class
            text = f"Copy {copy}: a plain {target} sentence about lunch."
            gold[written_for(client, writer, round_["id"], target, text)] = target
    crowd = [make_user(f"crowd{i}", "validator") for i in range(5)]
    for validator in crowd:
        labelled = label_served(
            client, validator, round_["id"], lambda example_id: gold[example_id] if example_id else "positive"
        )
        assert sorted(labelled) == sorted(gold)
    with app.state.sessionmaker() as session:
        control_answers = session.scalars(
            select(ValidationBatchItem).where(ValidationBatchItem.control_item_id.is_not(None))
        ).all()
        assert control_answers and all(item.answered_at is not None for item in control_answers)
    closed = client.post(f"{API}/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    assert closed.status_code == 200, closed.text
    build = client.post(
        f"{API}/rounds/{round_['id']}/build", json={"seed": 7, "policy": "relaxed"}, headers=researcher.headers
    )
    assert build.status_code == 201, build.text
    report = build.json()["report"]
    # The report shows each validator's gold accuracy beside their agreement with the majority,
    # naming nobody; every one of them answered "positive" to every control item.
    with app.state.sessionmaker() as session:
        right: dict[int, list[bool]] = {}
        for validator_id, correct in session.execute(
            select(ValidationBatch.validator_id, ValidationBatchItem.correct)
            .join(ValidationBatch, ValidationBatchItem.batch_id == ValidationBatch.id)
            .where(ValidationBatchItem.control_item_id.is_not(None))
        ):
            right.setdefault(validator_id, []).append(bool(correct))
    rows = report["workers"]["gold_accuracy"]
    assert [row["validator"] for row in rows] == ["v1", "v2", "v3", "v4", "v5"]
    assert [row["control_answers"] for row in rows] == [len(right[v]) for v in sorted(right)]
    assert [row["gold_accuracy"] for row in rows] == [round(sum(right[v]) / len(right[v]), 4) for v in sorted(right)]
    assert all(row["labels"] == len(gold) and row["agreement_rate"] == 1.0 for row in rows)
    markdown = render_markdown(report)
    assert "### Gold accuracy beside agreement with the majority" in markdown
    assert not any(name in json.dumps(report) for name in ("crowd0", "crowd1"))
    dataset = client.get(
        f"{API}/tasks/dynasent-r2/rounds/{round_['number']}/dataset",
        params={"split": "all", "format": "jsonl"},
        headers=researcher.headers,
    )
    assert dataset.status_code == 200, dataset.text
    exported = [json.loads(line) for line in dataset.text.splitlines() if line.strip()]
    assert len(exported) == len(gold)
    stats = client.get(f"{API}/rounds/{round_['id']}/stats", headers=researcher.headers).json()
    for control in CONTROLS:
        text = control["text"]
        assert text not in dataset.text and text not in json.dumps(report) and text not in json.dumps(stats)


def written_for(client: TestClient, writer: Actor, round_id: int, target: str, text: str) -> int:
    example: dict[str, Any] = written(client, writer, round_id, target, text)
    return int(example["id"])


def test_a_study_sessions_progress_counts_a_control_answer_like_a_label(
    client: TestClient,
    app: FastAPI,
    researcher: Actor,
    writer: Actor,
    stub_model: ThreadedServer,
) -> None:
    """The progress a link-made validator sees moves by one for every answer, control item or
    example alike, so it cannot tell them apart afterwards."""
    from tests.test_study_links import PROLIFIC, bearer, make_link, open_link

    round_ = controlled_round(client, researcher, stub_model, rate=0.5)
    written = [
        write_example(client, writer, round_["id"], f"A plain remark number {i} on snow.")["id"] for i in range(3)
    ]
    link = make_link(client, researcher, round_["id"], role="validator", quota=50, max_workers=5)
    started = open_link(client, link, PROLIFIC)
    assert started.status_code == 201, started.text
    headers = bearer(started.json()["token"])
    batch = client.get(f"{API}/rounds/{round_['id']}/validation-batch", headers=headers)
    assert batch.status_code == 200, batch.text
    behind = served_examples(client, batch.json())
    assert sorted(e for e in behind if e is not None) == written and None in behind

    def progress() -> int:
        sessions = client.get(f"{API}/me/study-sessions", headers=headers)
        assert sessions.status_code == 200, sessions.text
        return int(sessions.json()["data"][0]["units_done"])

    assert progress() == 0
    seen = []
    for item, example_id in zip(batch.json()["data"], behind, strict=True):
        control = control_text(app, item["item_id"])
        label = "neutral" if control is None else RIGHT[control]
        response = client.post(
            f"{API}/validation-items/{item['item_id']}/validations", json={"label": label}, headers=headers
        )
        assert response.status_code == 201, response.text
        seen.append((example_id is None, progress()))
    assert [count for _, count in seen] == list(range(1, len(seen) + 1))
    assert {is_control for is_control, _ in seen} == {True, False}
