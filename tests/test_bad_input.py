"""Bad input and faults (docs/design.md "Bad input and faults", "Validation protocol",
"One attempt, end to end"), endpoint family by endpoint family.

Every rejected request is checked twice: the error body (status, ``error.code`` and a
message that says what to fix) and the database (every table's row count and full contents
are the same before and after: nothing half-written). The refusals that reach the database's
own behaviour (its constraints, a transaction rolled back, text stored byte for byte) run on
PostgreSQL too (``both_databases``, tests/conftest.py); the rest run on SQLite.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import httpx2  # starlette's TestClient is an httpx2 client: its answers are httpx2 responses
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from services.db.models import ApiToken, Assignment, Attempt, Base, Example, Round, Task
from tests.conftest import (
    Actor,
    MakeUser,
    example_yaml,
    free_port,
    open_round,
    served_examples,
    table_counts,
    table_snapshot,
)
from tests.stub_model_server import ThreadedServer, create_stub_app

API = "/api/v1"
ALL_TABLES = [table.name for table in Base.metadata.sorted_tables]
PROMPTS = [
    "The soup was fine and the bread was fresh.",
    "We went there on a Sunday afternoon.",
    "The staff were friendly and quick.",
]
NEUTRAL_TEXT = "We went there on a Sunday afternoon with friends."  # the stub says neutral
GEEZ = "ሰላም ለዓለም ይህ ጥሩ ነው"


# --- helpers ---------------------------------------------------------------------------


def db_state(app: Any) -> tuple[dict[str, int], dict[str, list[tuple[Any, ...]]]]:
    return table_counts(app), table_snapshot(app, *ALL_TABLES)


@contextmanager
def unchanged(app: Any) -> Iterator[None]:
    """Assert that no table gained, lost or changed a row inside the block."""
    counts, rows = db_state(app)
    yield
    counts_after, rows_after = db_state(app)
    assert counts_after == counts, "row counts changed on a rejected request"
    for name in ALL_TABLES:
        assert rows_after[name] == rows[name], f"table {name} changed on a rejected request"


def assert_error(response: httpx2.Response, status: int, code: str, *fragments: str) -> dict[str, Any]:
    """The response is an error with this status and code, and its message names each fragment."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert error["code"] == code, error
    message = error["message"]
    assert isinstance(message, str) and len(message) >= 10, error
    for fragment in fragments:
        assert fragment.lower() in message.lower(), f"{fragment!r} not in {message!r}"
    return error


def post_attempt(
    client: Any, actor: Actor, assignment_id: int, text: str, key: str | None = None, **fields: Any
) -> httpx2.Response:
    headers = dict(actor.headers)
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post(f"{API}/assignments/{assignment_id}/attempts", json={"text": text, **fields}, headers=headers)


def start(client: Any, actor: Actor, round_id: int, **body: Any) -> dict[str, Any]:
    response = client.post(f"{API}/rounds/{round_id}/assignments", json=body, headers=actor.headers)
    assert response.status_code in (200, 201), response.text
    return response.json()


def submittable(
    client: Any, actor: Actor, round_id: int, text: str, target_label: str | None = None, **fields: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """An assignment and a scored attempt that may be submitted (confirmed when it fooled)."""
    assignment = start(client, actor, round_id, **({"target_label": target_label} if target_label else {}))
    response = post_attempt(client, actor, assignment["id"], text, **fields)
    assert response.status_code == 201, response.text
    attempt = response.json()
    if attempt["fooled"]:
        response = client.post(
            f"{API}/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=actor.headers
        )
        assert response.status_code == 200, response.text
    return assignment, attempt


def write_example(
    client: Any,
    actor: Actor,
    round_id: int,
    text: str = NEUTRAL_TEXT,
    extras: dict[str, Any] | None = None,
    target_label: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    assignment, attempt = submittable(client, actor, round_id, text, target_label, **fields)
    response = client.post(
        f"{API}/assignments/{assignment['id']}/example",
        json={"attempt_id": attempt["id"], "extras": extras or {}},
        headers=actor.headers,
    )
    assert response.status_code == 201, response.text
    return response.json()


def task_yaml(example: str, **overrides: Any) -> str:
    """example_yaml, also able to replace `name` (example_yaml's own first argument)."""
    import yaml

    data = yaml.safe_load(example_yaml(example, onboarding_quiz=None))
    data.update(overrides)
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


def set_mode(stub: ThreadedServer, mode: str, delay_s: float = 0.0) -> None:
    httpx.post(f"{stub.url}/admin/mode", json={"mode": mode, "delay_s": delay_s}).raise_for_status()


def assignment_row(app: Any, assignment_id: int) -> Assignment:
    with app.state.sessionmaker() as session:
        row = session.get(Assignment, assignment_id)
        assert row is not None
        session.expunge(row)
        return row


# --- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sarcasm_model() -> Iterator[ThreadedServer]:
    server = ThreadedServer(create_stub_app(["sarcastic", "not_sarcastic"]), free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def dynasent(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)


@pytest.fixture
def assignment(client: TestClient, writer: Actor, dynasent: dict[str, Any]) -> dict[str, Any]:
    return start(client, writer, dynasent["id"])


@pytest.fixture
def example(client: TestClient, make_user: MakeUser, dynasent: dict[str, Any]) -> dict[str, Any]:
    """A submitted example by another writer, waiting for validations."""
    return write_example(client, make_user("wendy", "writer"), dynasent["id"])


# --- text ------------------------------------------------------------------------------

TEXT_CASES = [
    pytest.param("", ["empty", "write some text"], id="empty"),
    pytest.param("   \n\t  \r\n ", ["empty", "write some text"], id="whitespace-only"),
    pytest.param("word " * 100 + "x" * 10, ["510 characters", "limit is 500", "shorten"], id="over-max-chars"),
    pytest.param("a b c", ["5 characters", "at least 10"], id="under-min-chars"),
    pytest.param("Lovely weather", ["2 word", "at least 3"], id="under-min-words"),
    pytest.param("The soup\x00 was fine", ["control character", "U+0000", "remove it"], id="nul"),
    pytest.param("The soup \x1b[31mwas fine", ["control character", "U+001B", "remove it"], id="escape"),
    pytest.param("The soup was\u2028fine today", ["U+2028", "remove it"], id="line-separator"),
    pytest.param("The soup was\x7f fine today", ["U+007F", "remove it"], id="delete"),
]


@pytest.mark.parametrize(("text", "fragments"), TEXT_CASES)
def test_attempt_text_is_checked(
    client: TestClient, app: FastAPI, writer: Actor, assignment: dict[str, Any], text, fragments
) -> None:
    with unchanged(app):
        response = post_attempt(client, writer, assignment["id"], text, key="k-bad")
        error = assert_error(response, 422, "invalid", "text", *fragments)
    assert error["details"].get("field") == "text"


RAW_BODY_CASES = [
    pytest.param(b'{"text": "\\ud800 abc def"}', ["text", "lone surrogate", "utf-8"], id="lone-surrogate"),
    pytest.param(b'{"text": "\xff\xfe abc def"}', ["not valid utf-8", "offset"], id="not-utf8"),
    pytest.param(b"text=hello world again", ["not valid json", "json object"], id="not-json"),
    pytest.param(b'{"text": "hello world again"', ["not valid json"], id="truncated-json"),
    pytest.param(b"{}", ["text", "required"], id="missing-field"),
    pytest.param(
        b'{"txt": "hello world again"}', ["text: is required", "txt: is not a known field"], id="misspelled-field"
    ),
    pytest.param(
        b'{"text": "hello world again", "label": "positive"}',
        ["label", "not a known field", "remove"],
        id="extra-field",
    ),
    pytest.param(b'["hello world again"]', ["valid dictionary"], id="array"),
    pytest.param(b'{"text": 42}', ["text", "valid string"], id="number"),
    pytest.param(b'{"text": null}', ["text", "valid string"], id="null"),
]


@pytest.mark.parametrize(("body", "fragments"), RAW_BODY_CASES)
def test_attempt_body_is_checked(
    client: TestClient, app: FastAPI, writer: Actor, assignment: dict[str, Any], body, fragments
) -> None:
    with unchanged(app):
        response = client.post(
            f"{API}/assignments/{assignment['id']}/attempts",
            content=body,
            headers={**writer.headers, "Content-Type": "application/json"},
        )
        error = assert_error(response, 422, "invalid", *fragments)
    assert error["details"]["problems"], error


def _chunks(total: int, size: int = 16 * 1024) -> Iterator[bytes]:
    yield b'{"text": "'
    sent = 0
    while sent < total:
        yield b"a" * size
        sent += size
    yield b'"}'


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_body_over_the_size_limit_is_refused(
    client: TestClient,
    app: FastAPI,
    writer: Actor,
    assignment: dict[str, Any],
    researcher: Actor,
    dynasent: dict[str, Any],
    chunked,
) -> None:
    limit = app.state.settings.max_request_bytes
    assert limit == 256 * 1024
    requests = [
        (f"{API}/assignments/{assignment['id']}/attempts", writer, "application/json"),
        (f"{API}/rounds/{dynasent['id']}/prompts", researcher, "application/x-ndjson"),
        (f"{API}/tasks", researcher, "application/yaml"),
    ]
    for url, actor, content_type in requests:
        with unchanged(app):
            body: Any = _chunks(limit + 64 * 1024) if chunked else b"a" * (limit + 1)
            response = client.post(url, content=body, headers={**actor.headers, "Content-Type": content_type})
            assert_error(response, 413, "too_large", f"larger than {limit} bytes", "send less")
        sent_length = response.request.headers.get("content-length")
        assert (sent_length is None) if chunked else (sent_length == str(limit + 1))
    # A body just under the limit is parsed as usual (here: refused for its text length, 422).
    with unchanged(app):
        response = post_attempt(client, writer, assignment["id"], "a" * (limit - 100))
        assert_error(response, 422, "invalid", "text", "at most 100000 characters")


def test_body_limit_uses_bytes_not_characters(
    client: TestClient, app: FastAPI, writer: Actor, assignment: dict[str, Any]
) -> None:
    """Ge'ez characters are 3 bytes in UTF-8: 100k of them is over 256 KiB."""
    with unchanged(app):
        response = post_attempt(client, writer, assignment["id"], "ሰ" * 100_000)
        assert_error(response, 413, "too_large")


def test_other_text_fields_are_checked(
    client: TestClient,
    app: FastAPI,
    writer: Actor,
    validators: list[Actor],
    dynasent: dict[str, Any],
    example: dict[str, Any],
    sarcasm_model: ThreadedServer,
    researcher: Actor,
) -> None:
    # A validator's flag reason.
    with unchanged(app):
        response = client.post(
            f"{API}/examples/{example['id']}/validations",
            json={"label": "neutral", "flagged": True, "flag_reason": "spam\x00"},
            headers=validators[0].headers,
        )
        assert_error(response, 422, "invalid", "flag_reason", "control character", "remove it")
    with unchanged(app):
        response = client.post(
            f"{API}/examples/{example['id']}/validations",
            json={"label": "neutral", "flag_reason": "looks like spam"},
            headers=validators[0].headers,
        )
        assert_error(response, 422, "invalid", "flagged is false", "set flagged to true")
    with unchanged(app):
        response = client.post(
            f"{API}/examples/{example['id']}/validations",
            json={"label": "neutral", "seconds_taken": -3},
            headers=validators[0].headers,
        )
        assert_error(response, 422, "invalid", "seconds_taken", "between 0 and 86400")


# --- Unicode that must be accepted -----------------------------------------------------

UNICODE_TEXTS = [
    pytest.param("هذا المطعم رائع جدا والخدمة ممتازة", id="arabic"),
    pytest.param("\u200fقال لي: the food was fine, honestly!\u200f", id="arabic-rtl-marks-mixed"),
    pytest.param("The cake 🎂 was fine 👩‍👩‍👧 family 👍🏽 🇪🇹 day", id="emoji-zwj-skin-flag"),
    pytest.param("Line one of the review\nline two\tindented", id="newline-tab"),
]


@pytest.mark.both_databases
@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_non_latin_text_is_stored_byte_identically(
    client: TestClient, app: FastAPI, writer: Actor, validators: list[Actor], dynasent: dict[str, Any], text
) -> None:
    example = write_example(client, writer, dynasent["id"], text=text)
    assert example["text"].encode("utf-8") == text.encode("utf-8")
    state = client.get(f"{API}/assignments/{example['assignment_id']}", headers=writer.headers).json()
    assert state["attempts"][0]["text"].encode("utf-8") == text.encode("utf-8")
    batch = client.get(f"{API}/rounds/{dynasent['id']}/validation-batch", headers=validators[0].headers).json()
    assert [item["text"].encode("utf-8") for item in batch["data"]] == [text.encode("utf-8")]
    # The raw JSON bytes round-trip too (no escaping differences in what a client decodes).
    response = client.get(f"{API}/assignments/{example['assignment_id']}", headers=writer.headers)
    assert json.loads(response.content)["attempts"][0]["text"] == text


@pytest.mark.both_databases
def test_geez_text_is_accepted_and_stored_byte_identically(
    client: TestClient,
    app: FastAPI,
    researcher: Actor,
    make_user: MakeUser,
    stub_multi_label_model: ThreadedServer,
) -> None:
    round_ = open_round(
        client,
        researcher,
        example_yaml("ethioemo-amharic", onboarding_quiz=None),
        stub_multi_label_model.url,
        ["ዛሬ በጣም ደስ ብሎኛል።", "ጠቅላይ ሚኒስትሩ ዛሬ ወደ ናይሮቢ ተጓዙ።"],
    )
    writer = make_user("abebe", "writer")
    assignment = start(client, writer, round_["id"])
    assert assignment["prompt"]["text"] in ("ዛሬ በጣም ደስ ብሎኛል።", "ጠቅላይ ሚኒስትሩ ዛሬ ወደ ናይሮቢ ተጓዙ።")
    response = post_attempt(client, writer, assignment["id"], GEEZ, key="geez")
    assert response.status_code == 201, response.text
    attempt = response.json()
    assert attempt["text"].encode("utf-8") == GEEZ.encode("utf-8")
    assert 0 < attempt["edit_distance"] <= 1
    with app.state.sessionmaker() as session:
        stored = session.scalar(select(Attempt.text).where(Attempt.id == attempt["id"]))
    assert stored is not None and stored.encode("utf-8") == GEEZ.encode("utf-8")
    state = client.get(f"{API}/assignments/{assignment['id']}", headers=writer.headers).json()
    assert state["attempts"][0]["text"] == GEEZ
    # The task's Ge'ez title survives the round trip too.
    task = client.get(f"{API}/tasks/ethioemo-amharic", headers=writer.headers).json()
    assert "የስሜት መለያ (አማርኛ)" in task["title"]


# --- labels and family fields -----------------------------------------------------------


@pytest.fixture
def choice_round(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    return open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        stub_model.url,
        PROMPTS,
        target_label_mode="writer_choice",
    )


@pytest.mark.parametrize(
    ("label", "fragments"),
    [
        ("happy", ["'happy'", "not a label of task dynasent-r2", "use one of"]),
        ("mixed", ["'mixed'", "not a label"]),  # a validation label, not a writer target
        (["positive", "negative"], ["exactly one label"]),
        ([], ["exactly one label"]),
        (None, ["choose the target label", "send target_label"]),
    ],
)
def test_unknown_target_label(
    client: TestClient, app: FastAPI, writer: Actor, choice_round: dict[str, Any], label, fragments
) -> None:
    with unchanged(app):
        response = client.post(
            f"{API}/rounds/{choice_round['id']}/assignments", json={"target_label": label}, headers=writer.headers
        )
        assert_error(response, 422, "invalid", *fragments)


def test_target_label_in_a_balanced_round_is_refused(
    client: TestClient, app: FastAPI, writer: Actor, dynasent: dict[str, Any]
) -> None:
    with unchanged(app):
        response = client.post(
            f"{API}/rounds/{dynasent['id']}/assignments", json={"target_label": "positive"}, headers=writer.headers
        )
        assert_error(response, 422, "invalid", "do not send target_label")


@pytest.mark.parametrize(
    ("label", "status", "fragments"),
    [
        ("happy", 422, ["'happy'", "not a label", "use one of", "mixed"]),
        (["positive", "negative"], 422, ["exactly one label"]),
        ("Positive", 422, ["'Positive'", "not a label"]),
        ("", 422, ["not a label"]),
    ],
)
def test_unknown_validation_label(
    client: TestClient, app: FastAPI, validators: list[Actor], example: dict[str, Any], label, status, fragments
) -> None:
    with unchanged(app):
        response = client.post(
            f"{API}/examples/{example['id']}/validations", json={"label": label}, headers=validators[0].headers
        )
        assert_error(response, status, "invalid", *fragments)


def test_multi_label_exclusive_label_cannot_be_combined(
    client: TestClient,
    app: FastAPI,
    researcher: Actor,
    make_user: MakeUser,
    stub_multi_label_model: ThreadedServer,
) -> None:
    round_ = open_round(
        client,
        researcher,
        example_yaml("ethioemo-amharic", onboarding_quiz=None),
        stub_multi_label_model.url,
        ["ዛሬ በጣም ደስ ብሎኛል።"],
        target_label_mode="writer_choice",
    )
    writer, validator = make_user("abebe", "writer"), make_user("almaz", "validator")
    for label, fragments in [
        (["neutral", "joy"], ["'neutral' cannot be combined", "choose it alone"]),
        (["joy", "joy"], ["lists a label twice"]),
        ([], ["is empty", "at least one"]),
        (["joy", "happiness"], ["'happiness'", "not a label"]),
    ]:
        with unchanged(app):
            response = client.post(
                f"{API}/rounds/{round_['id']}/assignments", json={"target_label": label}, headers=writer.headers
            )
            assert_error(response, 422, "invalid", *fragments)
    # A combination without the exclusive label is fine, and so is neutral alone.
    assignment = start(client, writer, round_["id"], target_label=["joy", "surprise"])
    assert assignment["target_label"] == ["joy", "surprise"]
    response = post_attempt(client, writer, assignment["id"], GEEZ)
    assert response.status_code == 201, response.text
    attempt = response.json()
    if attempt["fooled"]:
        with unchanged(app):
            response = client.post(
                f"{API}/attempts/{attempt['id']}/confirmation",
                json={"agrees": False, "judged_label": ["neutral", "joy"]},
                headers=writer.headers,
            )
            assert_error(response, 422, "invalid", "'neutral' cannot be combined")
        client.post(f"{API}/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers)
    response = client.post(
        f"{API}/assignments/{assignment['id']}/example", json={"attempt_id": attempt["id"]}, headers=writer.headers
    )
    assert response.status_code == 201, response.text
    example_id = response.json()["id"]
    serve(client, validator, example_id)
    with unchanged(app):
        response = client.post(
            f"{API}/examples/{example_id}/validations", json={"label": ["neutral", "joy"]}, headers=validator.headers
        )
        assert_error(response, 422, "invalid", "label", "'neutral' cannot be combined", "choose it alone")
    response = client.post(
        f"{API}/examples/{example_id}/validations", json={"label": ["joy", "anger"]}, headers=validator.headers
    )
    assert response.status_code == 201, response.text
    assert response.json()["label"] == ["anger", "joy"]  # stored in the task's label order


def test_target_span_on_a_single_label_task(
    client: TestClient, app: FastAPI, writer: Actor, assignment: dict[str, Any]
) -> None:
    with unchanged(app):
        response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT, target_span=[0, 2])
        assert_error(
            response, 422, "invalid", "target_span only applies to target-dependent tasks", "single_label", "remove it"
        )


MAD_TEXT = "The minister Anna Berg opened the new railway line on Monday."
MAD_SPAN = [MAD_TEXT.index("Anna Berg"), MAD_TEXT.index("Anna Berg") + len("Anna Berg")]


@pytest.fixture
def mad_round(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    return open_round(
        client,
        researcher,
        example_yaml("mad-tsc", onboarding_quiz=None),
        stub_model.url,
        ["The mayor Jan Novak spoke to reporters after the council meeting."],
    )


@pytest.mark.parametrize(
    ("span", "fragments"),
    [
        (None, ["target_span is required", "character offsets"]),
        ([0, 200], ["outside the text", "mark the target inside the text"]),
        ([10, 5], ["outside the text"]),
        ([-1, 5], ["outside the text"]),
        ([3, 4], ["covers only white space"]),
        ([1, 2, 3], ["two integers"]),
    ],
)
def test_target_span_on_a_target_dependent_task(
    client: TestClient, app: FastAPI, writer: Actor, mad_round: dict[str, Any], span, fragments
) -> None:
    assignment = start(client, writer, mad_round["id"])
    with unchanged(app):
        response = post_attempt(client, writer, assignment["id"], MAD_TEXT, target_span=span)
        assert_error(response, 422, "invalid", "target_span", *fragments)


def test_target_span_mismatch_on_submit(
    client: TestClient, app: FastAPI, writer: Actor, mad_round: dict[str, Any], stub_model: ThreadedServer
) -> None:
    assignment, attempt = submittable(client, writer, mad_round["id"], MAD_TEXT, target_span=MAD_SPAN)
    # The model got the target span text as the sentence pair's second part.
    targets = httpx.get(f"{stub_model.url}/admin/calls").json()["targets"]
    assert targets[-1] == ["Anna Berg"]
    with unchanged(app):
        response = client.post(
            f"{API}/assignments/{assignment['id']}/example",
            json={"attempt_id": attempt["id"], "extras": {"target_span": [0, 3]}},
            headers=writer.headers,
        )
        assert_error(response, 422, "invalid", "target_span differs", "same span")
    response = client.post(
        f"{API}/assignments/{assignment['id']}/example",
        json={"attempt_id": attempt["id"], "extras": {"target_span": MAD_SPAN}},
        headers=writer.headers,
    )
    assert response.status_code == 201, response.text
    assert response.json()["extras"]["target_span"] == {"start": MAD_SPAN[0], "end": MAD_SPAN[1], "text": "Anna Berg"}


def test_extras_not_in_the_task(client: TestClient, app: FastAPI, writer: Actor, dynasent: dict[str, Any]) -> None:
    assignment, attempt = submittable(client, writer, dynasent["id"], NEUTRAL_TEXT)
    with unchanged(app):
        response = client.post(
            f"{API}/assignments/{assignment['id']}/example",
            json={"attempt_id": attempt["id"], "extras": {"explanation": "because"}},
            headers=writer.headers,
        )
        assert_error(response, 422, "invalid", "['explanation']", "not part of task 'dynasent-r2'", "allowed")
    with unchanged(app):
        response = client.post(
            f"{API}/assignments/{assignment['id']}/example",
            json={"attempt_id": attempt["id"], "comment": "hi"},
            headers=writer.headers,
        )
        assert_error(response, 422, "invalid", "comment", "not a known field")


SARCASTIC_TEXT = "Oh sure, another Monday meeting at seven, exactly what everyone needed"


@pytest.fixture
def sarcasm_round(client: TestClient, researcher: Actor, sarcasm_model: ThreadedServer) -> dict[str, Any]:
    # Writers choose the target, so each case can write for the label its extras intend.
    return open_round(
        client,
        researcher,
        example_yaml("isarcasm", onboarding_quiz=None),
        sarcasm_model.url,
        ["Mondays are the best day of the week for meetings."],
        target_label_mode="writer_choice",
    )


@pytest.mark.parametrize(
    ("extras", "fragments"),
    [
        ({"intended_label": "sarcastic"}, ["explanation is required when the intended label is 'sarcastic'"]),
        ({"intended_label": "sarcastic", "explanation": "   "}, ["explanation is required"]),
        (
            {"intended_label": "sarcastic", "explanation": "Nobody wants a 7 am meeting."},
            ["rephrase is required when the intended label is 'sarcastic'"],
        ),
        ({}, ["intended_label is required", "fill it in"]),
        ({"intended_label": "ironic"}, ["intended_label 'ironic' is not allowed", "sarcastic", "not_sarcastic"]),
        ({"intended_label": "not_sarcastic", "category": "pun"}, ["category 'pun' is not allowed", "overstatement"]),
        ({"intended_label": ["sarcastic"]}, ["intended_label must be text"]),
        (
            {"intended_label": "sarcastic", "explanation": "bad\x1bbyte", "rephrase": "Mondays are hard."},
            ["explanation contains a control character"],
        ),
        (
            {"intended_label": "sarcastic", "explanation": "x" * 601, "rephrase": "Mondays are hard."},
            ["explanation has 601 characters", "limit is 600"],
        ),
        ({"intended_label": "not_sarcastic", "target_span": [0, 3]}, ["['target_span']", "not part of task"]),
    ],
)
def test_isarcasm_writer_fields(
    client: TestClient, app: FastAPI, writer: Actor, sarcasm_round: dict[str, Any], extras, fragments
) -> None:
    assignment, attempt = submittable(client, writer, sarcasm_round["id"], SARCASTIC_TEXT, target_label="sarcastic")
    with unchanged(app):
        response = client.post(
            f"{API}/assignments/{assignment['id']}/example",
            json={"attempt_id": attempt["id"], "extras": extras},
            headers=writer.headers,
        )
        assert_error(response, 422, "invalid", *fragments)


def test_isarcasm_complete_extras_are_accepted(
    client: TestClient, writer: Actor, sarcasm_round: dict[str, Any]
) -> None:
    extras = {
        "intended_label": "sarcastic",
        "explanation": "Nobody wants a meeting at seven.",
        "rephrase": "I do not want a meeting at seven on Monday.",
        "category": "sarcasm",
    }
    example = write_example(
        client, writer, sarcasm_round["id"], text=SARCASTIC_TEXT, extras=extras, target_label="sarcastic"
    )
    assert example["extras"] == extras


# --- validators -------------------------------------------------------------------------


def test_validator_cannot_label_their_own_example(
    client: TestClient, app: FastAPI, make_user: MakeUser, dynasent: dict[str, Any]
) -> None:
    both = make_user("bo", "writer", "validator")
    example = write_example(client, both, dynasent["id"])
    with unchanged(app):
        response = client.post(
            f"{API}/examples/{example['id']}/validations", json={"label": "neutral"}, headers=both.headers
        )
        assert_error(response, 403, "forbidden", "you wrote this example")
    # Their batch never offers it either.
    batch = client.get(f"{API}/rounds/{dynasent['id']}/validation-batch", headers=both.headers).json()
    assert batch["count"] == 0


@pytest.mark.both_databases
def test_second_label_conflicts_and_identical_retry_replays(
    client: TestClient, app: FastAPI, validators: list[Actor], example: dict[str, Any]
) -> None:
    url = f"{API}/examples/{example['id']}/validations"
    serve(client, validators[0], example["id"])
    first = client.post(url, json={"label": "neutral"}, headers={**validators[0].headers, "Idempotency-Key": "v1"})
    assert first.status_code == 201, first.text
    with unchanged(app):
        response = client.post(url, json={"label": "positive"}, headers=validators[0].headers)
        assert_error(response, 409, "conflict", "already labelled", "as ['neutral']", "cannot be changed")
    with unchanged(app):
        response = client.post(
            url, json={"label": "neutral", "flagged": True, "flag_reason": "odd"}, headers=validators[0].headers
        )
        assert_error(response, 409, "conflict", "already labelled")
    with unchanged(app):
        replay = client.post(url, json={"label": "neutral"}, headers={**validators[0].headers, "Idempotency-Key": "v1"})
        assert replay.status_code == 200, replay.text
        assert replay.json()["id"] == first.json()["id"]
        assert replay.headers["Idempotent-Replayed"] == "true"
    with unchanged(app):  # a retry without the key is still recognised (same validator, same label)
        replay = client.post(url, json={"label": "neutral"}, headers=validators[0].headers)
        assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    record = client.get(f"{API}/examples/{example['id']}", headers=_researcher_headers(client, app)).json()
    assert record["validation_count"] == 1 and len(record["validations"]) == 1


@pytest.mark.both_databases
def test_label_resent_after_its_round_closed_is_answered_as_saved(
    client: TestClient, app: FastAPI, validators: list[Actor], example: dict[str, Any], dynasent: dict[str, Any]
) -> None:
    """The answer to a label was lost and the round closed before the validator resent it: the
    resend says 200 (saved), as a resent submission does, not 409 (which reads as lost)."""
    url = f"{API}/examples/{example['id']}/validations"
    serve(client, validators[0], example["id"])
    first = client.post(url, json={"label": "neutral"}, headers=validators[0].headers)
    assert first.status_code == 201, first.text
    researcher = _researcher_headers(client, app)
    for status in ("validating", "closed"):
        moved = client.post(f"{API}/rounds/{dynasent['id']}/status", json={"status": status}, headers=researcher)
        assert moved.status_code == 200, moved.text
    with unchanged(app):
        replay = client.post(url, json={"label": "neutral"}, headers=validators[0].headers)
        assert replay.status_code == 200, replay.text
        assert replay.json()["id"] == first.json()["id"]
    with unchanged(app):  # a different label is still refused: labels cannot be changed
        assert_error(client.post(url, json={"label": "positive"}, headers=validators[0].headers), 409, "conflict")
    with unchanged(app):  # and a first label after the close is refused as before
        response = client.post(url, json={"label": "neutral"}, headers=validators[1].headers)
        assert_error(response, 409, "conflict", "validation is over")


def serve(client: TestClient, validator: Actor, example_id: int) -> None:
    """Fetch the validator's batch in the example's round: a label is accepted only for an
    example served to the validator in a batch that is still theirs."""
    batch = client.get(f"{API}/rounds/{example_round(client, example_id)}/validation-batch", headers=validator.headers)
    assert batch.status_code == 200, batch.text
    assert example_id in served_examples(client, batch.json())


def example_round(client: TestClient, example_id: int) -> int:
    with client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
        return int(session.get(Example, example_id).round_id)


def _researcher_headers(client: Any, app: Any) -> dict[str, str]:
    from services.db.engine import session_scope
    from services.domain import users

    with session_scope(app.state.sessionmaker) as session:
        user = users.get_user(session, "rita")
        _, token = users.issue_token(session, None, user)
    return {"Authorization": f"Bearer {token}"}


def test_validation_of_a_missing_example(client: TestClient, app: FastAPI, validators: list[Actor]) -> None:
    with unchanged(app):
        response = client.post(
            f"{API}/examples/999/validations", json={"label": "neutral"}, headers=validators[0].headers
        )
        assert_error(response, 404, "not_found", "no example 999")


# --- assignments: expiry and tries --------------------------------------------------------


@pytest.mark.both_databases
def test_expired_assignment_is_gone(
    client: TestClient, app: FastAPI, writer: Actor, assignment: dict[str, Any]
) -> None:
    response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT)
    assert response.status_code == 201, response.text
    attempt = response.json()
    past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    with app.state.sessionmaker.begin() as session:
        session.execute(update(Assignment).where(Assignment.id == assignment["id"]).values(expires_at=past))
    # The first request after the deadline records the expiry (a fact of the clock, kept even
    # though the request fails) and nothing else: no attempt, no try.
    counts, rows = db_state(app)
    response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT + " Again.")
    assert_error(response, 410, "gone", f"assignment {assignment['id']} expired", "request a new assignment")
    counts_after, rows_after = db_state(app)
    assert counts_after == counts
    assert all(rows_after[name] == rows[name] for name in ALL_TABLES if name != "assignments")
    row = assignment_row(app, assignment["id"])
    assert row.status.value == "expired" and row.tries_used == 1 and row.finished_at is not None
    with unchanged(app):  # asked again: still 410, and nothing changes
        response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT + " Again.", key="again")
        assert_error(response, 410, "gone", f"assignment {assignment['id']} expired", "request a new assignment")
    with unchanged(app):
        response = client.post(
            f"{API}/assignments/{assignment['id']}/example", json={"attempt_id": attempt["id"]}, headers=writer.headers
        )
        assert_error(response, 410, "gone", "expired", "request a new assignment")
    with unchanged(app):
        response = client.post(f"{API}/assignments/{assignment['id']}/skip", headers=writer.headers)
        assert_error(response, 410, "gone", "expired")
    # Asking for work expires it for good and hands out a new assignment.
    fresh = start(client, writer, assignment["round_id"])
    assert fresh["id"] != assignment["id"]
    assert assignment_row(app, assignment["id"]).status.value == "expired"


@pytest.mark.both_databases
def test_tries_beyond_the_limit_conflict(
    client: TestClient, app: FastAPI, researcher: Actor, writer: Actor, stub_model: ThreadedServer
) -> None:
    round_ = open_round(
        client,
        researcher,
        task_yaml("dynasent-r2", tries_per_assignment=2, name="dynasent-two-tries"),
        stub_model.url,
        PROMPTS,
    )
    assignment = start(client, writer, round_["id"])
    assert assignment["tries_allowed"] == 2
    for i in range(2):
        response = post_attempt(client, writer, assignment["id"], f"{NEUTRAL_TEXT} Try {i}.")
        assert response.status_code == 201, response.text
    with unchanged(app):
        response = post_attempt(client, writer, assignment["id"], f"{NEUTRAL_TEXT} Try 3.")
        assert_error(response, 409, "conflict", "all 2 tries", "submit one of your attempts", "next prompt")
    with unchanged(app):  # a new Idempotency-Key does not help
        response = post_attempt(client, writer, assignment["id"], f"{NEUTRAL_TEXT} Try 3.", key="fresh")
        assert_error(response, 409, "conflict", "all 2 tries")
    assert assignment_row(app, assignment["id"]).tries_used == 2


# --- authentication and authorisation ---------------------------------------------------


def _auth_cases(writer: Actor) -> list[tuple[str, dict[str, str], list[str]]]:
    return [
        ("no token", {}, ["send an API token", "Authorization: Bearer"]),
        ("malformed: no scheme", {"Authorization": writer.token}, ["send an API token"]),
        ("malformed: basic", {"Authorization": "Basic d2FsdDpwdw=="}, ["send an API token"]),
        ("malformed: empty bearer", {"Authorization": "Bearer "}, ["send an API token"]),
        ("malformed: token scheme", {"Authorization": f"Token {writer.token}"}, ["send an API token"]),
        ("wrong token", {"Authorization": "Bearer dl_not-a-real-token"}, ["unknown or revoked", "log in again"]),
        ("truncated token", {"Authorization": f"Bearer {writer.token[:-1]}"}, ["unknown or revoked"]),
    ]


def test_unauthenticated_requests_are_refused(
    client: TestClient, app: FastAPI, writer: Actor, assignment: dict[str, Any], dynasent: dict[str, Any]
) -> None:
    targets = [
        ("POST", f"{API}/assignments/{assignment['id']}/attempts", {"text": NEUTRAL_TEXT}),
        ("POST", f"{API}/rounds/{dynasent['id']}/assignments", {}),
        ("GET", f"{API}/assignments/{assignment['id']}", None),
        ("POST", f"{API}/tasks/dynasent-r2/rounds", {}),
        ("GET", f"{API}/me", None),
    ]
    for what, headers, fragments in _auth_cases(writer):
        for method, url, body in targets:
            with unchanged(app):
                response = client.request(method, url, json=body, headers=headers)
                assert_error(response, 401, "unauthorized", *fragments)
            assert what  # for the failure message


def test_revoked_and_expired_tokens_are_refused(
    client: TestClient, app: FastAPI, writer: Actor, assignment: dict[str, Any]
) -> None:
    created = client.post(f"{API}/users/{writer.username}/tokens", json={"name": "laptop"}, headers=writer.headers)
    assert created.status_code == 201, created.text
    spare = created.json()
    spare_headers = {"Authorization": f"Bearer {spare['token']}"}
    assert client.get(f"{API}/me", headers=spare_headers).status_code == 200
    response = client.delete(f"{API}/tokens/{spare['id']}", headers=writer.headers)
    assert response.status_code == 200, response.text
    with unchanged(app):
        response = post_attempt(client, Actor(writer.username, spare["token"]), assignment["id"], NEUTRAL_TEXT)
        assert_error(response, 401, "unauthorized", "unknown or revoked")
    # The writer's other token still works.
    assert client.get(f"{API}/me", headers=writer.headers).status_code == 200

    expiring = client.post(
        f"{API}/users/{writer.username}/tokens", json={"expires_in_days": 1}, headers=writer.headers
    ).json()
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    with app.state.sessionmaker.begin() as session:
        session.execute(update(ApiToken).where(ApiToken.id == expiring["id"]).values(expires_at=past))
    with unchanged(app):
        response = post_attempt(client, Actor(writer.username, expiring["token"]), assignment["id"], NEUTRAL_TEXT)
        assert_error(response, 401, "unauthorized", "expired", "create a new one")
    # Token management mistakes.
    with unchanged(app):
        response = client.post(
            f"{API}/users/{writer.username}/tokens", json={"expires_in_days": 0}, headers=writer.headers
        )
        assert_error(response, 422, "invalid", "expires_in_days")
    with unchanged(app):
        response = client.delete(f"{API}/tokens/999", headers=writer.headers)
        assert_error(response, 404, "not_found", "no token 999")


def test_a_deactivated_user_is_refused(client: TestClient, app: FastAPI, writer: Actor) -> None:
    from services.db.models import User

    with app.state.sessionmaker.begin() as session:
        session.execute(update(User).where(User.username == writer.username).values(is_active=False))
    with unchanged(app):
        response = client.get(f"{API}/me", headers=writer.headers)
        assert_error(response, 401, "unauthorized", "deactivated")


@pytest.fixture
def everyone(make_user: MakeUser, researcher: Actor, writer: Actor) -> dict[str, Actor]:
    return {"writer": writer, "validator": make_user("vic", "validator"), "researcher": researcher}


def _role_guarded(
    round_id: int, assignment_id: int, attempt_id: int, example_id: int
) -> list[tuple[str, str, Any, str, list[str]]]:
    """(method, url, body, needed role, callers that lack it)."""
    yaml_text = task_yaml("dynasent-r2", name="another-task")
    return [
        ("POST", f"{API}/tasks", {"definition_yaml": yaml_text}, "researcher", ["writer", "validator"]),
        ("POST", f"{API}/tasks/dynasent-r2/rounds", {}, "researcher", ["writer", "validator"]),
        ("POST", f"{API}/rounds/{round_id}/status", {"status": "closed"}, "researcher", ["writer", "validator"]),
        (
            "PUT",
            f"{API}/rounds/{round_id}/model",
            {"model_servers": ["model-0"]},
            "researcher",
            ["writer", "validator"],
        ),
        ("POST", f"{API}/rounds/{round_id}/prompts?format=jsonl", None, "researcher", ["writer", "validator"]),
        ("GET", f"{API}/rounds/{round_id}/stats", None, "researcher", ["writer", "validator"]),
        ("GET", f"{API}/rounds/{round_id}/worker-agreement", None, "researcher", ["writer", "validator"]),
        ("POST", f"{API}/tasks/dynasent-r2/worker-quality/apply", None, "researcher", ["writer", "validator"]),
        (
            "POST",
            f"{API}/tasks/dynasent-r2/workers/wendy/unqualify",
            {"reason": "spam"},
            "researcher",
            ["writer", "validator"],
        ),
        ("GET", f"{API}/examples/{example_id}", None, "researcher", ["writer", "validator"]),
        ("POST", f"{API}/rounds/{round_id}/assignments", {}, "writer", ["validator", "researcher"]),
        ("GET", f"{API}/assignments/{assignment_id}", None, "writer", ["validator", "researcher"]),
        (
            "POST",
            f"{API}/assignments/{assignment_id}/attempts",
            {"text": NEUTRAL_TEXT},
            "writer",
            ["validator", "researcher"],
        ),
        ("POST", f"{API}/attempts/{attempt_id}/confirmation", {"agrees": True}, "writer", ["validator", "researcher"]),
        (
            "POST",
            f"{API}/assignments/{assignment_id}/example",
            {"attempt_id": attempt_id},
            "writer",
            ["validator", "researcher"],
        ),
        ("POST", f"{API}/assignments/{assignment_id}/skip", None, "writer", ["validator", "researcher"]),
        ("GET", f"{API}/tasks/dynasent-r2/quiz", None, "writer", ["validator", "researcher"]),
        ("POST", f"{API}/tasks/dynasent-r2/quiz/attempts", {"answers": []}, "writer", ["validator", "researcher"]),
        ("GET", f"{API}/rounds/{round_id}/validation-batch", None, "validator", ["writer", "researcher"]),
        (
            "POST",
            f"{API}/examples/{example_id}/validations",
            {"label": "neutral"},
            "validator",
            ["writer", "researcher"],
        ),
        (
            "POST",
            f"{API}/users",
            {"username": "eve", "roles": ["admin"]},
            "admin",
            ["writer", "validator", "researcher"],
        ),
        ("GET", f"{API}/users", None, "admin", ["writer", "validator", "researcher"]),
    ]


def test_wrong_role_is_forbidden(
    client: TestClient,
    app: FastAPI,
    everyone: dict[str, Actor],
    writer: Actor,
    dynasent: dict[str, Any],
    example: dict[str, Any],
    assignment: dict[str, Any],
) -> None:
    # Not NEUTRAL_TEXT: the `example` fixture's writer submitted it, so it would be a duplicate.
    attempt = post_attempt(client, writer, assignment["id"], "We went there on a Monday evening with friends.").json()
    for method, url, body, role, callers in _role_guarded(
        dynasent["id"], assignment["id"], attempt["id"], example["id"]
    ):
        for caller in callers:
            with unchanged(app):
                response = client.request(method, url, json=body, headers=everyone[caller].headers)
                error = assert_error(response, 403, "forbidden", f"needs the {role} role", f"your roles: {caller}")
                assert error, (method, url, caller)


def test_writers_never_see_each_others_work(
    client: TestClient,
    app: FastAPI,
    make_user: MakeUser,
    writer: Actor,
    dynasent: dict[str, Any],
    assignment: dict[str, Any],
) -> None:
    other = make_user("olga", "writer")
    attempt = post_attempt(client, writer, assignment["id"], "The staff were terrible and the soup was cold.").json()
    for method, url, body, fragment in [
        ("GET", f"{API}/assignments/{assignment['id']}", None, f"no assignment {assignment['id']} of yours"),
        (
            "POST",
            f"{API}/assignments/{assignment['id']}/attempts",
            {"text": NEUTRAL_TEXT},
            f"no assignment {assignment['id']} of yours",
        ),
        ("POST", f"{API}/assignments/{assignment['id']}/skip", None, "of yours"),
        ("POST", f"{API}/assignments/{assignment['id']}/example", {"attempt_id": attempt["id"]}, "of yours"),
        (
            "POST",
            f"{API}/attempts/{attempt['id']}/confirmation",
            {"agrees": True},
            f"no attempt {attempt['id']} of yours",
        ),
        ("GET", f"{API}/assignments/99999", None, "no assignment 99999 of yours"),
    ]:
        with unchanged(app):
            response = client.request(method, url, json=body, headers=other.headers)
            assert_error(response, 404, "not_found", fragment)
    # A writer creating a token for someone else is refused.
    with unchanged(app):
        response = client.post(f"{API}/users/{writer.username}/tokens", json={}, headers=other.headers)
        assert_error(response, 403, "forbidden", "only an admin")


# --- task YAML ---------------------------------------------------------------------------


def _post_yaml(
    client: Any, researcher: Actor, content: bytes, content_type: str = "application/yaml"
) -> httpx2.Response:
    return client.post(f"{API}/tasks", content=content, headers={**researcher.headers, "Content-Type": content_type})


def test_invalid_task_yaml_lists_the_problems(client: TestClient, app: FastAPI, researcher: Actor) -> None:
    with unchanged(app):
        response = _post_yaml(client, researcher, b"name: broken\nlabels: [a, b\ntitle: x\n")
        error = assert_error(response, 422, "invalid", "YAML syntax error", "line")
        assert any("YAML syntax error at line" in p for p in error["details"]["problems"])
    bad = task_yaml("dynasent-r2", name="Bad Name!", family="triple_label", colour="blue", tries_per_assignment=0)
    bad = "\n".join(line for line in bad.splitlines() if not line.startswith("title:"))
    with unchanged(app):
        response = _post_yaml(client, researcher, bad.encode("utf-8"))
        error = assert_error(response, 422, "invalid", "not valid")
        problems = error["details"]["problems"]
        joined = "\n".join(problems)
        for fragment in [
            "name:",
            "not a valid task name",
            "family:",
            "title: is required",
            "colour:",
            "not a known field",
            "tries_per_assignment:",
        ]:
            assert fragment in joined, (fragment, problems)
        assert len(problems) >= 5
    with unchanged(app):
        response = _post_yaml(client, researcher, b"- just\n- a list\n")
        assert_error(response, 422, "invalid", "YAML mapping")
    with unchanged(app):
        response = _post_yaml(client, researcher, example_yaml("dynasent-r2").encode("utf-16"))
        assert_error(response, 422, "invalid", "not UTF-8", "save it as UTF-8")
    with unchanged(app):
        response = _post_yaml(client, researcher, json.dumps({"yaml": "x"}).encode(), "application/json")
        assert_error(response, 422, "invalid", "definition_yaml")
    with unchanged(app):
        response = _post_yaml(client, researcher, b"", "application/yaml")
        assert_error(response, 422, "invalid")


@pytest.mark.both_databases
def test_duplicate_task_name_conflicts(client: TestClient, app: FastAPI, researcher: Actor) -> None:
    yaml_text = example_yaml("dynasent-r2")
    assert _post_yaml(client, researcher, yaml_text.encode("utf-8")).status_code == 201
    with unchanged(app):
        response = _post_yaml(client, researcher, yaml_text.encode("utf-8"))
        assert_error(response, 409, "conflict", "'dynasent-r2' already exists", "change `name`")
    with unchanged(app):  # the JSON form too
        response = client.post(f"{API}/tasks", json={"definition_yaml": yaml_text}, headers=researcher.headers)
        assert_error(response, 409, "conflict", "already exists")


# --- prompt import -----------------------------------------------------------------------


@pytest.fixture
def empty_round(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url)


def _import(client: Any, researcher: Actor, round_id: int, content: bytes, content_type: str) -> httpx2.Response:
    return client.post(
        f"{API}/rounds/{round_id}/prompts",
        content=content,
        headers={**researcher.headers, "Content-Type": content_type},
    )


@pytest.mark.both_databases
def test_prompt_file_with_one_bad_row_imports_nothing(
    client: TestClient, app: FastAPI, researcher: Actor, empty_round: dict[str, Any]
) -> None:
    good = [json.dumps({"text": f"Good prompt number {i}.", "stars": 3}) for i in range(5)]
    for bad_line, fragments in [
        ('{"text": "broken', ["line 4", "not valid JSON", "one JSON object per line"]),
        ('{"text": ""}', ["line 4", "empty"]),
        ('{"text": "nul\\u0000inside"}', ["line 4", "control character"]),
        ('{"txt": "no text"}', ["line 4", "`text` is missing"]),
        ('"just a string"', ["line 4", "expected a JSON object"]),
        (json.dumps({"text": "x" * 5001}), ["line 4", "limit is 5000"]),
    ]:
        content = "\n".join([*good[:3], bad_line, *good[3:]]).encode("utf-8")
        with unchanged(app):
            response = _import(client, researcher, empty_round["id"], content, "application/x-ndjson")
            error = assert_error(response, 422, "invalid", "1 row(s)", "nothing was imported", *fragments)
            assert len(error["details"]["errors"]) == 1
    for csv_content in [
        b'text,stars\nA fine prompt here.,4\n"unterminated,5\nAnother prompt.,1\n',
        b'text,stars\nA fine prompt here.,4\n"quoted" then more,5\n',
    ]:
        with unchanged(app):
            response = _import(client, researcher, empty_round["id"], csv_content, "text/csv")
            assert_error(response, 422, "invalid", "the CSV is malformed near line")
    csv_content = b"text,stars\nA fine prompt here.,4\nToo many,5,extra\nAnother prompt.,1\n"
    with unchanged(app):
        response = _import(client, researcher, empty_round["id"], csv_content, "text/csv")
        assert_error(response, 422, "invalid", "line 3", "more fields than header columns", "nothing was imported")


def test_prompt_file_format_problems(
    client: TestClient, app: FastAPI, researcher: Actor, empty_round: dict[str, Any]
) -> None:
    rid = empty_round["id"]
    cases = [
        ("text,stars\nCafé très bon,5\n".encode("latin-1"), "text/csv", ["not UTF-8", "offset", "save it as UTF-8"]),
        (b"sentence,stars\nA fine prompt.,4\n", "text/csv", ["no `text` column", "sentence", "add a header row"]),
        (b"", "text/csv", ["no `text` column"]),
        (b"\n\n", "application/x-ndjson", ["no rows"]),
        (b'{"text": "A fine prompt."}', "text/plain", ["say what the file is", "text/csv"]),
    ]
    for content, content_type, fragments in cases:
        with unchanged(app):
            response = _import(client, researcher, rid, content, content_type)
            assert_error(response, 422, "invalid", *fragments)
    with unchanged(app):
        response = client.post(f"{API}/rounds/{rid}/prompts?format=xml", content=b"<a/>", headers=researcher.headers)
        assert_error(response, 422, "invalid", "unknown prompt file format 'xml'")
    with unchanged(app):
        response = _import(client, researcher, 999, b'{"text": "A fine prompt."}', "application/x-ndjson")
        assert_error(response, 404, "not_found", "no round with id 999")


@pytest.mark.both_databases
def test_prompt_duplicates_are_counted_and_skipped(
    client: TestClient, app: FastAPI, researcher: Actor, empty_round: dict[str, Any]
) -> None:
    rid = empty_round["id"]
    # Duplicates after normalisation: surrounding space, CRLF vs LF, NFC vs NFD.
    content = "\n".join(
        json.dumps({"text": t})
        for t in [
            "The pasta was fine.",
            "  The pasta was fine.  ",
            "Café by the river.",
            "Cafe\u0301 by the river.",
            "A new one.",
        ]
    ).encode("utf-8")
    response = _import(client, researcher, rid, content, "application/x-ndjson")
    assert response.status_code == 200, response.text
    assert response.json() == {"rows": 5, "imported": 3, "duplicates_in_file": 2, "already_present": 0}
    before = table_counts(app)
    response = _import(client, researcher, rid, content, "application/x-ndjson")
    assert response.status_code == 200, response.text
    assert response.json() == {"rows": 5, "imported": 0, "duplicates_in_file": 2, "already_present": 3}
    after = table_counts(app)
    assert after["prompts"] == before["prompts"] == 3
    csv_content = b"text,stars\nThe pasta was fine.,2\nA brand new prompt.,5\nA brand new prompt.,5\n"
    response = _import(client, researcher, rid, csv_content, "text/csv")
    assert response.json() == {"rows": 3, "imported": 1, "duplicates_in_file": 1, "already_present": 1}
    assert table_counts(app)["prompts"] == 4


def test_prompts_cannot_be_added_to_a_closed_round(
    client: TestClient, app: FastAPI, researcher: Actor, empty_round: dict[str, Any]
) -> None:
    response = client.post(
        f"{API}/rounds/{empty_round['id']}/status", json={"status": "closed"}, headers=researcher.headers
    )
    assert response.status_code == 200, response.text
    with unchanged(app):
        response = _import(client, researcher, empty_round["id"], b'{"text": "A fine prompt."}', "application/x-ndjson")
        assert_error(response, 409, "conflict", "closed", "can no longer be added")


# --- model server faults -------------------------------------------------------------------

# The fragment is in the attempt's stored reason (researchers' records), never in the writer's
# message, which is the same whatever the model server said (tests/test_bulkheads.py).
FAULTS = [
    pytest.param("fail", 0.0, "answered HTTP 500", id="down"),
    pytest.param("slow", 3.0, "timed out", id="slow"),
    pytest.param("garbage", 0.0, "breaks the contract", id="garbage"),
    pytest.param("alien", 0.0, "alien_label", id="alien-labels"),
    pytest.param("precision", 0.0, "breaks the contract (model.precision", id="hostile-precision"),
]


@pytest.mark.both_databases
@pytest.mark.parametrize(("mode", "delay", "fragment"), FAULTS)
def test_model_fault_keeps_the_attempt_and_no_try(
    client: TestClient,
    app: FastAPI,
    writer: Actor,
    assignment: dict[str, Any],
    stub_model: ThreadedServer,
    mode,
    delay,
    fragment,
) -> None:
    counts, rows = db_state(app)
    set_mode(stub_model, mode, delay)
    response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT, key="fault-1")
    error = assert_error(response, 503, "model_unavailable", "no try was used", "saved")
    assert fragment not in response.text and stub_model.url not in response.text
    assert response.headers["Retry-After"] == "3"
    attempt_id = error["details"]["attempt_id"]
    # Exactly one new row (the attempt); the assignment did not change (no try consumed).
    counts_after, rows_after = db_state(app)
    assert counts_after == {**counts, "attempts": counts["attempts"] + 1}
    for name in ALL_TABLES:
        if name != "attempts":
            assert rows_after[name] == rows[name], name
    state = client.get(f"{API}/assignments/{assignment['id']}", headers=writer.headers).json()
    assert state["tries_used"] == 0
    assert [(a["id"], a["status"], a["counts_as_try"]) for a in state["attempts"]] == [
        (attempt_id, "model_unavailable", False)
    ]
    with app.state.sessionmaker() as session:
        assert fragment in (session.get(Attempt, attempt_id).model_error or "")

    if mode != "slow":  # (4 s more for the slow mode would prove nothing new)
        # Still down: the same key with the same text keeps the same row.
        response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT, key="fault-1")
        assert response.status_code == 503 and response.json()["error"]["details"]["attempt_id"] == attempt_id
        assert table_counts(app)["attempts"] == counts["attempts"] + 1
    # The same key with another text is a client mistake, whatever the model does.
    with unchanged(app):
        response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT + " Changed.", key="fault-1")
        assert_error(response, 409, "conflict", "Idempotency-Key was already used for a different text", "new key")

    set_mode(stub_model, "normal")
    response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT, key="fault-1")
    assert response.status_code == 201, response.text
    assert response.json()["id"] == attempt_id and response.json()["status"] == "scored"
    assert table_counts(app)["attempts"] == counts["attempts"] + 1
    assert assignment_row(app, assignment["id"]).tries_used == 1
    # Replayed once more: answered from the stored attempt, nothing changes.
    with unchanged(app):
        replay = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT, key="fault-1")
        assert replay.status_code == 200 and replay.json()["id"] == attempt_id
    with unchanged(app):
        response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT + " Changed.", key="fault-1")
        assert_error(response, 409, "conflict", "different text")


def test_model_unavailable_attempt_cannot_be_confirmed_or_submitted(
    client: TestClient,
    app: FastAPI,
    writer: Actor,
    assignment: dict[str, Any],
    stub_model: ThreadedServer,
) -> None:
    set_mode(stub_model, "fail")
    response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT, key="down")
    attempt_id = response.json()["error"]["details"]["attempt_id"]
    with unchanged(app):
        response = client.post(
            f"{API}/attempts/{attempt_id}/confirmation", json={"agrees": True}, headers=writer.headers
        )
        assert_error(response, 409, "conflict", "no model prediction", "retry it first")
    with unchanged(app):
        response = client.post(
            f"{API}/assignments/{assignment['id']}/example", json={"attempt_id": attempt_id}, headers=writer.headers
        )
        assert_error(response, 409, "conflict", "no model prediction", "check it with the model")


def test_round_without_a_model_is_a_retryable_503(
    client: TestClient, app: FastAPI, researcher: Actor, writer: Actor
) -> None:
    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), None, PROMPTS)
    assignment = start(client, writer, round_["id"])
    counts, rows = db_state(app)
    response = post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT, key="nomodel")
    assert_error(
        response, 503, "model_unavailable", "no model is in the loop", "a researcher must set one", "no try was used"
    )
    assert response.headers["Retry-After"] == "3"
    counts_after, rows_after = db_state(app)
    assert counts_after == {**counts, "attempts": counts["attempts"] + 1}  # the text is kept
    assert all(rows_after[name] == rows[name] for name in ALL_TABLES if name != "attempts")


def test_invalid_model_server_is_refused(
    client: TestClient, app: FastAPI, researcher: Actor, dynasent: dict[str, Any]
) -> None:
    [registered] = dynasent["model_servers"]
    for servers, fragments in [
        (["ftp://model"], ["'ftp://model' is not a registered model server", f"registered: {registered}"]),
        (["no-such-server", registered], ["'no-such-server' is not a registered model server"]),
        ([registered, registered], ["same server twice"]),
        (["x" * 5000], ["is not a registered model server"]),
        ([f"s{i}" for i in range(21)], ["at most 20"]),
    ]:
        with unchanged(app):
            response = client.put(
                f"{API}/rounds/{dynasent['id']}/model", json={"model_servers": servers}, headers=researcher.headers
            )
            assert response.status_code == 422, response.text
            assert all(fragment in response.text for fragment in fragments), response.text
    with unchanged(app):
        response = client.put(
            f"{API}/rounds/{dynasent['id']}/model", json={"model_endpoints": ["http://a:1"]}, headers=researcher.headers
        )
        assert_error(response, 422, "invalid", "model_endpoints: is not a known field; send model_servers")
    # Opening a round with the old field says which field to send (issue 29, item 8).
    with unchanged(app):
        response = client.post(
            f"{API}/tasks/dynasent-r2/rounds", json={"model_endpoints": ["http://a:1"]}, headers=researcher.headers
        )
        assert_error(
            response,
            422,
            "invalid",
            "model_endpoints: is not a known field; send model_servers (the names of registered model servers",
        )


# --- round state ---------------------------------------------------------------------------


def _set_status(client: Any, researcher: Actor, round_id: int, status: str) -> httpx2.Response:
    return client.post(f"{API}/rounds/{round_id}/status", json={"status": status}, headers=researcher.headers)


def test_attempts_outside_a_collecting_round_conflict(
    client: TestClient,
    app: FastAPI,
    researcher: Actor,
    writer: Actor,
    validators: list[Actor],
    dynasent: dict[str, Any],
    assignment: dict[str, Any],
    example: dict[str, Any],
) -> None:
    assert _set_status(client, researcher, dynasent["id"], "validating").status_code == 200
    for request in [
        lambda: post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT),
        lambda: client.post(f"{API}/rounds/{dynasent['id']}/assignments", json={}, headers=writer.headers),
    ]:
        with unchanged(app):
            assert_error(request(), 409, "conflict", "validating", "not collecting")
    # Validation goes on while the round is validating.
    serve(client, validators[0], example["id"])
    response = client.post(
        f"{API}/examples/{example['id']}/validations", json={"label": "neutral"}, headers=validators[0].headers
    )
    assert response.status_code == 201, response.text

    assert _set_status(client, researcher, dynasent["id"], "closed").status_code == 200
    assert assignment_row(app, assignment["id"]).status.value == "expired"
    with unchanged(app):
        assert_error(post_attempt(client, writer, assignment["id"], NEUTRAL_TEXT), 409, "conflict", "closed")
    with unchanged(app):
        response = client.post(f"{API}/rounds/{dynasent['id']}/assignments", json={}, headers=writer.headers)
        assert_error(response, 409, "conflict", "closed", "not collecting")
    with unchanged(app):
        response = client.post(
            f"{API}/examples/{example['id']}/validations", json={"label": "neutral"}, headers=validators[1].headers
        )
        assert_error(response, 409, "conflict", "closed", "validation is over")
    with unchanged(app):
        response = client.get(f"{API}/rounds/{dynasent['id']}/validation-batch", headers=validators[1].headers)
        assert_error(response, 409, "conflict", "validation is over")


@pytest.mark.both_databases
def test_second_open_round_conflicts(
    client: TestClient, app: FastAPI, researcher: Actor, dynasent: dict[str, Any]
) -> None:
    for status in ("collecting", "validating"):
        if status == "validating":
            assert _set_status(client, researcher, dynasent["id"], "validating").status_code == 200
        with unchanged(app):
            response = client.post(f"{API}/tasks/dynasent-r2/rounds", json={}, headers=researcher.headers)
            assert_error(
                response,
                409,
                "conflict",
                f"round 1 of task 'dynasent-r2' is still {status}",
                "close it before opening the next",
            )
    assert _set_status(client, researcher, dynasent["id"], "closed").status_code == 200
    response = client.post(f"{API}/tasks/dynasent-r2/rounds", json={}, headers=researcher.headers)
    assert response.status_code == 201 and response.json()["number"] == 2
    with unchanged(app):
        response = client.post(f"{API}/tasks/no-such-task/rounds", json={}, headers=researcher.headers)
        assert_error(response, 404, "not_found", "no task 'no-such-task'")
    with unchanged(app):
        response = client.post(
            f"{API}/tasks/dynasent-r2/rounds", json={"no_prompt_fraction": 1.5}, headers=researcher.headers
        )
        assert_error(response, 422, "invalid", "no_prompt_fraction")
    with unchanged(app):
        response = client.post(
            f"{API}/tasks/dynasent-r2/rounds", json={"prompt_strategy": "random"}, headers=researcher.headers
        )
        assert_error(response, 422, "invalid", "prompt_strategy")


def test_illegal_round_transitions_conflict(
    client: TestClient, app: FastAPI, researcher: Actor, dynasent: dict[str, Any]
) -> None:
    rid = dynasent["id"]
    with unchanged(app):
        assert_error(
            _set_status(client, researcher, rid, "built"),
            409,
            "conflict",
            "collecting and cannot become built",
            "allowed next: closed, validating",
        )
    with unchanged(app):
        assert_error(_set_status(client, researcher, rid, "open"), 422, "invalid", "status")
    assert _set_status(client, researcher, rid, "validating").status_code == 200
    with unchanged(app):
        assert_error(
            _set_status(client, researcher, rid, "collecting"),
            409,
            "conflict",
            "validating and cannot become collecting",
            "allowed next: closed",
        )
    assert _set_status(client, researcher, rid, "closed").status_code == 200
    for target in ("collecting", "validating", "built"):
        with unchanged(app):
            assert_error(
                _set_status(client, researcher, rid, target),
                409,
                "conflict",
                f"closed and cannot become {target}",
                "allowed next: none",
            )
    with unchanged(app):  # the same status again changes nothing
        response = _set_status(client, researcher, rid, "closed")
        assert response.status_code == 200
    with unchanged(app):
        response = client.put(
            f"{API}/rounds/{rid}/model", json={"model_servers": ["model-0"]}, headers=researcher.headers
        )
        assert_error(response, 409, "conflict", "closed", "can no longer change")
    with unchanged(app):
        assert_error(_set_status(client, researcher, 999, "closed"), 404, "not_found", "no round with id 999")


# --- users and quiz --------------------------------------------------------------------------


def test_user_and_login_mistakes(client: TestClient, app: FastAPI, make_user: MakeUser) -> None:
    admin = make_user("ada", "admin")
    for body, status, code, fragments in [
        ({"username": "bad name!", "roles": ["writer"]}, 422, "invalid", ["not valid", "letters, digits"]),
        ({"username": "ok", "roles": ["overlord"]}, 422, "invalid", ["unknown role", "overlord"]),
        ({"username": "ok", "roles": []}, 422, "invalid", ["roles"]),
        ({"username": "ada", "roles": ["writer"]}, 409, "conflict", ["'ada' already exists"]),
        ({"username": "ok", "roles": ["writer"], "password": "short"}, 422, "invalid", ["password"]),
    ]:
        with unchanged(app):
            response = client.post(f"{API}/users", json=body, headers=admin.headers)
            assert_error(response, status, code, *fragments)
    with unchanged(app):
        response = client.post(f"{API}/auth/login", json={"username": "ada", "password": "wrong-password"})
        assert_error(response, 401, "unauthorized", "wrong username or password")


def test_quiz_mistakes(
    client: TestClient, app: FastAPI, researcher: Actor, writer: Actor, stub_model: ThreadedServer
) -> None:
    round_ = open_round(client, researcher, example_yaml("dynasent-r2"), stub_model.url, PROMPTS)
    # The quiz comes first; nothing is written for the refused assignment request.
    with unchanged(app):
        response = client.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=writer.headers)
        assert_error(response, 403, "forbidden", "take the onboarding quiz")
    quiz = client.get(f"{API}/tasks/dynasent-r2/quiz", headers=writer.headers).json()
    n = len(quiz["questions"])
    with unchanged(app):
        response = client.post(
            f"{API}/tasks/dynasent-r2/quiz/attempts", json={"answers": ["x"] * (n + 1)}, headers=writer.headers
        )
        assert_error(response, 422, "invalid", f"has {n} questions", "send exactly that many")
    with unchanged(app):
        response = client.post(
            f"{API}/tasks/dynasent-r2/quiz/attempts", json={"answers": ["nonsense"] * n}, headers=writer.headers
        )
        assert_error(response, 422, "invalid", "answer 1", "not one of that question's options")


def test_unknown_routes_and_methods(client: TestClient, app: FastAPI, writer: Actor) -> None:
    with unchanged(app):
        assert_error(
            client.get(f"{API}/nothing-here", headers=writer.headers),
            404,
            "not_found",
            "no endpoint GET /api/v1/nothing-here",
            "/docs",
        )
    with unchanged(app):
        assert_error(
            client.put(f"{API}/me", headers=writer.headers),
            405,
            "method_not_allowed",
            "PUT is not allowed on /api/v1/me",
            "use GET",
        )
    with unchanged(app):
        response = client.get(f"{API}/tasks/nope", headers=writer.headers)
        assert_error(response, 404, "not_found", "no task 'nope'", "GET /api/v1/tasks")
    with unchanged(app):
        response = client.get(f"{API}/rounds/not-a-number", headers=writer.headers)
        assert_error(response, 422, "invalid", "round_id")


@pytest.mark.both_databases
def test_no_task_or_round_rows_leak_from_a_rejected_task(client: TestClient, app: FastAPI, researcher: Actor) -> None:
    """A task refused for a family rule leaves no task, round or audit row behind."""
    yaml_text = task_yaml("mad-tsc", writer_fields=[], name="mad-no-span")
    with unchanged(app):
        response = _post_yaml(client, researcher, yaml_text.encode("utf-8"))
        assert_error(response, 422, "invalid", "target_span")
    with app.state.sessionmaker() as session:
        assert session.scalar(select(Task).where(Task.name == "mad-no-span")) is None
        assert session.scalar(select(Round)) is None
