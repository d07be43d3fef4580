"""Every exported round holds, whatever writers repeat (issue 26, "Done when" item 3): the
acceptance test of duplicates, validation integrity and anonymity as a researcher receives the
round, through the real API over real HTTP, on SQLite and PostgreSQL.

Three writers (who validate too) try repeats: the same sentence again, another writer's sentence
exactly, in capitals, with other punctuation, spacing and an invisible space. Each repeat is
refused; the round is validated through the batches each validator is served (control items
mixed in), closed, built, and downloaded as JSONL, CSV and Parquet. On every exported file:
no normalized text in two splits, none twice in a split, exactly ``validations_per_example``
distinct validators per example, no validator labelling their own example, no control item, and
worker ids that are pseudonyms (no username, user id or platform id anywhere in the file)."""

from __future__ import annotations

import io
import json
import re
from collections import defaultdict
from typing import Any

import httpx
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from services.db.models import User
from services.text import normalized_for_duplicates
from tests.conftest import Actor, MakeUser, ThreadedServer, example_yaml, open_round, register_model_server

pytestmark = pytest.mark.both_databases  # what the database hands back, exported end to end


API = "/api/v1"
TASK = "dynasent-r2"
VALIDATIONS_PER_EXAMPLE = 3
CONTROLS = {
    "The food was absolutely delicious and the staff were wonderful to us.": "positive",
    "The waiter was rude to us and my soup arrived cold.": "negative",
    "The parking lot is behind the building, next to the bank.": "neutral",
}
QUALITY = {
    "control_rate": 0.25,
    "gold_accuracy_threshold": 0.7,
    "min_control_answers": 2,
    "control_items": [{"text": text, "labels": [label]} for text, label in CONTROLS.items()],
}
AGREEMENT = {
    "gold_min_votes": 2,
    "dev_test_min_votes": 3,
    "unqualify_disagreement_rate": 0.8,
    "min_labels_for_quality": 10,
    "requeue_disagreements": 0,
}
PLACES = ["bakery", "diner", "bistro", "canteen", "pizzeria", "taqueria", "brewery", "tea room"]
# Each writer's own sentences, as (target label, text): "great" makes the stub model say
# positive (so the negative ones fool it), "terrible" negative, anything else neutral.
OWN = {
    writer: [
        ("negative", f"The {place} staff did a great job of ignoring {writer} all evening."),
        ("positive", f"Honestly the {place} on the corner is where {writer} eats every Friday."),
        ("neutral", f"The {place} sells coffee and sandwiches, {writer} says, until five."),
        (extra, f"Last week {writer} took a cousin to the {place} {words}."),
    ]
    for writer, place, extra, words in (
        ("ann", "bakery", "negative", "and the great waiter spilled soup on both of them"),
        ("ben", "diner", "positive", "because the cook there remembers every regular by name"),
        ("cat", "bistro", "neutral", "after a long walk through the old market square"),
    )
}


def repeats_of(text: str) -> list[str]:
    """An attacker's copies of ``text``: exact, in capitals, other punctuation and spacing, an
    invisible space."""
    return [
        text,
        text.upper(),
        "  " + text.replace(",", " ,").rstrip(".") + "!!!",
        text.replace(" ", " \u200b", 1),
    ]


def write(http: httpx.Client, actor: Actor, round_id: int, target: str, text: str) -> httpx.Response:
    """Write ``text`` for ``target``: the attempt's refusal, or the submitted example."""
    assignment = http.post(f"{API}/rounds/{round_id}/assignments", json={"target_label": target}, headers=actor.headers)
    assert assignment.status_code in (200, 201), assignment.text
    assignment_id = assignment.json()["id"]
    attempt = http.post(f"{API}/assignments/{assignment_id}/attempts", json={"text": text}, headers=actor.headers)
    if attempt.status_code != 201:
        return attempt
    scored = attempt.json()
    if scored["fooled"]:
        confirmed = http.post(
            f"{API}/attempts/{scored['id']}/confirmation", json={"agrees": True}, headers=actor.headers
        )
        assert confirmed.status_code == 200, confirmed.text
    return http.post(
        f"{API}/assignments/{assignment_id}/example", json={"attempt_id": scored["id"]}, headers=actor.headers
    )


def label_batches(http: httpx.Client, actor: Actor, round_id: int, intended: dict[str, str]) -> int:
    """Label every item served to ``actor`` until no batch is left; returns the items labelled."""
    labelled = 0
    while True:
        batch = http.get(f"{API}/rounds/{round_id}/validation-batch", headers=actor.headers)
        assert batch.status_code == 200, batch.text
        items = batch.json()["data"]
        if not items:
            return labelled
        for item in items:
            label = CONTROLS.get(item["text"]) or intended[item["text"]]
            answer = http.post(
                f"{API}/validation-items/{item['item_id']}/validations", json={"label": label}, headers=actor.headers
            )
            assert answer.status_code == 201, answer.text
            labelled += 1


def exported_rows(http: httpx.Client, researcher: Actor, file_format: str) -> tuple[list[dict[str, Any]], bytes]:
    """Round 1's whole export (split=all) in ``file_format``, as rows with ``responses`` a list
    of {worker, label}; and the file's bytes."""
    response = http.get(
        f"{API}/tasks/{TASK}/rounds/1/dataset",
        params={"split": "all", "format": file_format},
        headers=researcher.headers,
    )
    assert response.status_code == 200, response.text
    body = response.content
    if file_format == "jsonl":
        rows = [json.loads(line) for line in body.decode("utf-8").splitlines() if line.strip()]
    elif file_format == "parquet":
        rows = pq.read_table(io.BytesIO(body)).to_pylist()
    else:
        table = pa_csv.read_csv(io.BytesIO(body), convert_options=pa_csv.ConvertOptions(strings_can_be_null=False))
        rows = table.to_pylist()
        for row in rows:  # CSV writes nested columns as their JSON text
            row["responses"] = json.loads(row["responses"])
    return rows, body


def test_every_exported_file_holds_whatever_writers_repeat(
    app: FastAPI, app_server: ThreadedServer, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    server = register_model_server(app, stub_model.url)
    yaml_text = example_yaml(
        TASK,
        onboarding_quiz=None,
        quality=QUALITY,
        agreement=AGREEMENT,
        validations_per_example=VALIDATIONS_PER_EXAMPLE,
        validation_batch_size=4,
    )
    writers = {name: make_user(f"{name}-writer", "writer", "validator") for name in OWN}
    validators = [make_user(f"val-{i}", "validator") for i in range(3)]
    with httpx.Client(base_url=app_server.url, timeout=60) as http:
        round_ = open_round(
            http,
            researcher,
            yaml_text,
            server,
            [f"Prompt {i}: a small cafe." for i in range(10)],
            target_label_mode="writer_choice",
        )
        round_id = round_["id"]
        intended: dict[str, str] = {}
        written: dict[str, str] = {}  # normalized text -> the writer who got it accepted
        for name, actor in writers.items():
            for target, text in OWN[name]:
                response = write(http, actor, round_id, target, text)
                assert response.status_code == 201, response.text
                intended[text] = target
                written[normalized_for_duplicates(text)] = name
        # Every writer tries every accepted sentence again, their own and the others', each in
        # one of its copies (every kind of copy is tried on every writer's sentences).
        for w, actor in enumerate(writers.values()):
            assignment = http.post(
                f"{API}/rounds/{round_id}/assignments", json={"target_label": "neutral"}, headers=actor.headers
            )
            assert assignment.status_code in (200, 201), assignment.text
            for i, text in enumerate(intended):
                copy = repeats_of(text)[(i + w) % 4]
                response = http.post(
                    f"{API}/assignments/{assignment.json()['id']}/attempts", json={"text": copy}, headers=actor.headers
                )
                assert response.status_code == 409, (copy, response.text)
                assert response.json()["error"]["code"] == "duplicate_text"
                assert "no try was used" in response.json()["error"]["message"]

        # Validation: the writers label others' examples as served, then the other validators.
        for actor in [*writers.values(), *validators]:
            label_batches(http, actor, round_id, intended)
        closed = http.post(f"{API}/rounds/{round_id}/status", json={"status": "closed"}, headers=researcher.headers)
        assert closed.status_code == 200, closed.text
        build = http.post(
            f"{API}/rounds/{round_id}/build",
            json={"seed": 7, "policy": "relaxed", "chance": False},
            headers=researcher.headers,
        )
        assert build.status_code == 201, build.text

        exports = {
            file_format: exported_rows(http, researcher, file_format) for file_format in ("jsonl", "csv", "parquet")
        }

    with app.state.sessionmaker() as session:
        accounts = [(user.id, user.username) for user in session.scalars(select(User))]
    pseudonym = re.compile(r"^w[0-9a-f]{12}$")
    writer_pseudonyms: dict[str, str] = {}
    for file_format, (rows, body) in exports.items():
        assert len(rows) == len(intended), (file_format, len(rows))
        by_split: dict[str, list[str]] = defaultdict(list)
        for row in rows:
            by_split[row["split"]].append(normalized_for_duplicates(row["text"]))
            workers = [response["worker"] for response in row["responses"]]
            # Exactly the configured number of labels, each from a different validator.
            assert len(workers) == len(set(workers)) == VALIDATIONS_PER_EXAMPLE, (file_format, row)
            # No validator labelled their own example.
            assert row["writer"] not in workers, (file_format, row)
            # Pseudonyms only, and the same writer keeps one across the file.
            assert all(pseudonym.match(worker) for worker in [*workers, row["writer"]]), row
            owner = written[normalized_for_duplicates(row["text"])]
            assert writer_pseudonyms.setdefault(owner, row["writer"]) == row["writer"]
            assert row["text"] not in CONTROLS  # control items never enter the dataset
        placed = [text for split in ("train", "dev", "test") for text in by_split.get(split, [])]
        assert all(by_split.get(split) for split in ("train", "dev", "test")), (file_format, dict(by_split))
        # The writers validated too (so "not their own example" is a real check).
        responders = {response["worker"] for row in rows for response in row["responses"]}
        assert set(writer_pseudonyms.values()) <= responders, file_format
        # No normalized text in two splits, none twice in one.
        assert len(placed) == len(set(placed)), f"{file_format}: a text is in two splits or twice in one"
        all_texts = [text for texts in by_split.values() for text in texts]
        assert len(all_texts) == len(set(all_texts))
        # Nothing in the file names an account: no username, no user id as a worker.
        text = body.decode("utf-8", errors="replace") if file_format != "parquet" else body.decode("latin-1")
        for user_id, username in accounts:
            assert username not in text, (file_format, username)
            assert f'"worker": "{user_id}"' not in text and f'"worker":"{user_id}"' not in text
    # The three files are one export.
    assert {json.dumps(r, sort_keys=True, default=str) for r in exports["jsonl"][0]} == {
        json.dumps(r, sort_keys=True, default=str) for r in exports["parquet"][0]
    }
