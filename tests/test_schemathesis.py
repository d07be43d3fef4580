"""Property-based API tests generated from the app's own OpenAPI schema (schemathesis 4).

Every operation of ``/api/v1/openapi.json`` gets generated requests, valid and invalid, and
each request is sent three times: without a token, with a writer's token and with a
researcher+admin token. Every response must be a non-5xx answer whose status code is
documented for the operation and whose body matches the documented schema.

Each operation runs against its own freshly seeded database (a task with its quiz, an open
round with prompts, two writers' examples, an open assignment with an attempt, a label), so one
operation's writes (closing the round, revoking a token) cannot hide another's bugs. Mostly,
the path parameters are the ids of those real rows and the bodies carry a plausible sentence or
label, so the requests get past the 404s and 422s into the code behind them.

No operation is excluded. The prompt upload (JSONL or CSV text) is sent as generated text; the
dataset download streams in-process, and ``test_round_builder_reads_on_a_built_round``
exercises it (and the report) on a really built round.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from dynaloop.api.app import create_app
from services.db.engine import session_scope
from services.db.models import ApiToken
from services.domain import users
from services.settings import Settings
from services.taskdef import example_path
from tests.conftest import example_yaml, free_port, open_round, register_model_server
from tests.stub_model_server import ThreadedServer, create_stub_app

TASK = "dynasent-r2"
OPENAPI = "/api/v1/openapi.json"
MAX_EXAMPLES = 20  # per operation in the fuzzing phase; the examples and coverage phases add their own
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
SETTINGS = hypothesis.settings(
    max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def _schema_only_app() -> Any:
    """An app only to read the OpenAPI document at collection time (nothing touches its
    database). The app under test is built per test from conftest's ``settings``;
    ``test_the_served_schema_is_the_tested_one`` checks that both serve the same document."""
    return create_app(
        Settings(
            database_url="sqlite://",
            environment="test",
            secret_key="schema-only-secret-key-0123456789",
            data_dir=Path("/nonexistent"),
        )
    )


CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 20260407,
        "generation": {
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "mode": "all",
            "with-security-parameters": False,
            "database": "none",
        },
        # The stateful phase chains operations into scenarios; each test here is about one operation.
        "phases": {"stateful": {"enabled": False}},
    }
)
schema = schemathesis.openapi.from_asgi(OPENAPI, _schema_only_app(), config=CONFIG)
# Prompt files are JSONL or CSV text: send the generated string as it is.
schemathesis.serializer.alias("application/x-ndjson", "text/plain")

# Ids of the seeded rows per path parameter name, set by the test's fixture before its
# examples are generated.
REAL: dict[str, list[Any]] = {}


@schema.hook("flatmap_path_parameters")
def _real_ids_mostly(context: Any, path_parameters: dict[str, Any] | None) -> Any:
    names = [name for name in path_parameters or {} if REAL.get(name)]
    if not names:
        return st.just(path_parameters)
    assert path_parameters is not None
    real = st.fixed_dictionaries(
        {
            name: st.sampled_from(REAL[name]) if name in names else st.just(value)
            for name, value in path_parameters.items()
        }
    )
    # Hypothesis prefers (and shrinks towards) the first branch: the real ids.
    return st.one_of(real, st.just(path_parameters))


# Words for sentences that pass the task's constraints (>= 10 characters, >= 3 words); some
# of them make the stub model say positive or negative, so attempts are scored and can fool it.
WORDS = [
    "the",
    "soup",
    "was",
    "great",
    "rude",
    "waiter",
    "lunch",
    "menu",
    "cold",
    "not",
    "at",
    "all",
    "ሰላም",
    "مرحبا",
    "😀",
    "e\u0301",
    "plain",
    "love",
    "worst",
]
SENTENCE = st.lists(st.sampled_from(WORDS), min_size=3, max_size=14).map(" ".join)
HOSTILE_SENTENCE = st.tuples(SENTENCE, st.text(max_size=40), SENTENCE).map(" ".join)
VALIDATION_LABELS = ["positive", "negative", "neutral", "mixed"]
STUDY_PARAMS = {
    "PROLIFIC_PID": "5f1a2b3c4d5e6f7a8b9c0d1e",
    "STUDY_ID": "60aa11bb22cc33dd44ee55ff",
    "SESSION_ID": "6123456789abcdef01234567",
}


@schema.hook("flatmap_body")
def _plausible_bodies_mostly(context: Any, body: Any) -> Any:
    """Random strings almost never pass the task's checks; mostly, put a plausible sentence,
    label or quiz answer where the domain expects one."""
    if not isinstance(body, dict):
        return st.just(body)
    replacements: dict[str, Any] = {}
    if isinstance(body.get("text"), str):
        replacements["text"] = st.one_of(SENTENCE, HOSTILE_SENTENCE)
        if "target_span" in body:  # the seeded task is not target-dependent
            replacements["target_span"] = st.none()
    if "label" in body:
        replacements["label"] = st.one_of(
            st.sampled_from(VALIDATION_LABELS), st.lists(st.sampled_from(VALIDATION_LABELS), max_size=3)
        )
    if "params" in body:
        replacements["params"] = st.one_of(
            st.just(STUDY_PARAMS), st.dictionaries(st.sampled_from([*STUDY_PARAMS, "x"]), st.text(max_size=20))
        )
    if "answers" in body:
        replacements["answers"] = st.lists(st.sampled_from(["True", "False"]), min_size=8, max_size=8)
    if not replacements:
        return st.just(body)
    plausible = st.fixed_dictionaries({key: replacements.get(key, st.just(value)) for key, value in body.items()})
    return st.one_of(plausible, st.just(body))


@pytest.fixture(scope="module")
def model_with_inspect() -> Iterator[ThreadedServer]:
    """The keyword stub model plus the optional ``POST /inspect`` (the conftest stub has none,
    and a model server without attributions is answered with a documented 503)."""
    app = create_stub_app(["positive", "negative", "neutral"])

    @app.post("/inspect")
    def inspect(body: dict[str, Any]) -> dict[str, Any]:
        words = str(body.get("text", "")).split()
        return {"label": body.get("label"), "tokens": [{"token": w, "score": 0.1} for w in words]}

    server = ThreadedServer(app, free_port()).start()
    yield server
    server.stop()


class Seeded:
    """The app under test and tokens of its users (which every example can use)."""

    def __init__(self, app: Any, tokens: dict[str, str], token_ids: dict[str, int]) -> None:
        self.app = app
        self.tokens = tokens
        self.token_ids = token_ids

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def reissue_revoked_tokens(self) -> None:
        """`DELETE /tokens/{id}` may revoke a token this test authenticates with; give its user a
        new one, so that the following examples still run with that user's roles."""
        with session_scope(self.app.state.sessionmaker) as session:
            for who, token_id in list(self.token_ids.items()):
                token = session.get(ApiToken, token_id)
                if token is not None and token.revoked_at is None:
                    continue
                row, self.tokens[who] = users.issue_token(session, None, users.get_user(session, who))
                self.token_ids[who] = row.id


@functools.cache
def _task_yaml() -> str:
    return example_yaml(TASK)


@functools.cache
def _quiz_answers() -> list[str]:
    definition = yaml.safe_load(example_path(TASK).read_text(encoding="utf-8"))
    return [str(question["answer"]) for question in definition["onboarding_quiz"]["questions"]]


class _Actor:
    def __init__(self, token: str) -> None:
        self.headers = {"Authorization": f"Bearer {token}"}


def seed(app: Any, model_url: str) -> tuple[dict[str, str], dict[str, int], dict[str, list[Any]]]:
    """Users of every role, the task with its quiz, round 1 collecting with prompts, two
    submitted examples (one labelled), and an open assignment with a scored attempt."""
    tokens: dict[str, str] = {}
    token_ids: dict[str, int] = {}
    with session_scope(app.state.sessionmaker) as session:
        for name, roles in [
            ("root", ["researcher", "admin"]),
            ("walt", ["writer"]),
            ("wendy", ["writer"]),
            ("val1", ["validator"]),
            ("val2", ["validator"]),
            ("cora", ["client"]),
        ]:
            user = users.create_user(session, None, name, roles)
            row, tokens[name] = users.issue_token(session, None, user)
            token_ids[name] = row.id
        spare, _ = users.issue_token(session, None, users.get_user(session, "wendy"), "spare")
        spare_id = spare.id
    client = TestClient(app)  # no `with`: the lifespan's shutdown would close the app's model client
    h = {name: _Actor(token).headers for name, token in tokens.items()}
    round_ = open_round(
        client,
        _Actor(tokens["root"]),
        _task_yaml(),
        model_url,
        [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(12)],
    )
    ids: dict[str, list[Any]] = {"assignment_id": [], "attempt_id": [], "example_id": []}
    for writer, text in [
        ("walt", "The soup was great but the waiter was rude."),
        ("wendy", "A plain remark about the lunch menu today."),
    ]:
        response = client.post(
            f"/api/v1/tasks/{TASK}/quiz/attempts", json={"answers": _quiz_answers()}, headers=h[writer]
        )
        assert response.status_code == 200 and response.json()["passed"], response.text
        assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=h[writer])
        assert assignment.status_code == 201, assignment.text
        attempt = client.post(
            f"/api/v1/assignments/{assignment.json()['id']}/attempts", json={"text": text}, headers=h[writer]
        )
        assert attempt.status_code == 201, attempt.text
        if attempt.json()["fooled"]:
            client.post(
                f"/api/v1/attempts/{attempt.json()['id']}/confirmation", json={"agrees": True}, headers=h[writer]
            )
        example = client.post(
            f"/api/v1/assignments/{assignment.json()['id']}/example",
            json={"attempt_id": attempt.json()["id"]},
            headers=h[writer],
        )
        assert example.status_code == 201, example.text
        ids["assignment_id"].append(assignment.json()["id"])
        ids["attempt_id"].append(attempt.json()["id"])
        ids["example_id"].append(example.json()["id"])
    open_assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=h["walt"])
    attempt = client.post(
        f"/api/v1/assignments/{open_assignment.json()['id']}/attempts",
        json={"text": "Lunch was served at noon as usual."},
        headers=h["walt"],
    )
    assert attempt.status_code == 201, attempt.text
    # Twice: the open assignment is where attempts, inspect and skip do their real work.
    ids["assignment_id"] += [open_assignment.json()["id"]] * 2
    ids["attempt_id"].append(attempt.json()["id"])
    # val1 is served a batch (a label is accepted only for an item of it), labels one item and
    # keeps the rest: their ids are real ids for the fuzzed label route.
    batch = client.get(f"/api/v1/rounds/{round_['id']}/validation-batch", headers=h["val1"])
    assert batch.status_code == 200 and batch.json()["count"] >= 2, batch.text
    items = [item["item_id"] for item in batch.json()["data"]]
    response = client.post(
        f"/api/v1/validation-items/{items[0]}/validations", json={"label": "mixed"}, headers=h["val1"]
    )
    assert response.status_code == 201, response.text
    control = client.post(
        f"/api/v1/tasks/{TASK}/control-items",
        json={"text": "The staff were lovely and the cake was wonderful.", "labels": ["positive"]},
        headers=h["root"],
    )
    assert control.status_code == 201, control.text
    # A study link and one worker's session on it (the public route opens it again, resumes it).
    link = client.post(
        f"/api/v1/tasks/{TASK}/study-links",
        json={
            "name": "seeded",
            "round_id": round_["id"],
            "role": "writer",
            "platform": "prolific",
            "quota": 2,
            "max_workers": 100,
        },
        headers=h["root"],
    )
    assert link.status_code == 201, link.text
    started = client.post(f"/api/v1/study/{link.json()['slug']}/sessions", json={"params": STUDY_PARAMS})
    assert started.status_code == 201, started.text
    ids.update(
        {
            "link_id": [link.json()["id"]],
            "item_id": items,
            "control_id": [control.json()["id"]],
            "slug": [link.json()["slug"]],
            "session_id": [started.json()["session"]["id"]],
            "round_id": [round_["id"]],
            "task_name": [TASK],
            "number": [round_["number"]],
            "username": ["walt", "val1"],
            "token_id": [spare_id],
            "job_id": [1],
            "name": [register_model_server(app, model_url)],  # the round's registered model server
        }
    )
    return tokens, token_ids, ids


@pytest.fixture
def seeded(settings: Settings, model_with_inspect: ThreadedServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Seeded]:
    app = create_app(settings)
    tokens, token_ids, ids = seed(app, model_with_inspect.url)
    REAL.clear()
    REAL.update(ids)
    yield Seeded(app, tokens, token_ids)
    REAL.clear()
    app.state.model_client.close()
    app.state.engine.dispose()


def _send_as_everyone(case: Any, app: Any, tokens: dict[str | None, dict[str, str] | None]) -> None:
    # The schema declares bearer auth; the case carries no Authorization header of its own.
    case.headers = {key: value for key, value in (case.headers or {}).items() if key.lower() != "authorization"}
    for headers in tokens.values():
        case.call_and_validate(app=app, headers=headers, checks=CHECKS)


@schema.parametrize()
@SETTINGS
def test_every_operation(case: Any, seeded: Seeded) -> None:
    seeded.reissue_revoked_tokens()
    _send_as_everyone(case, seeded.app, {None: None, "walt": seeded.headers("walt"), "root": seeded.headers("root")})


def test_the_served_schema_is_the_tested_one(seeded: Seeded) -> None:
    served = TestClient(seeded.app).get(OPENAPI).json()
    assert served == schema.raw_schema


BUILT_ROUND_READS = [
    (
        "/api/v1/tasks/{task_name}/rounds/{number}/dataset",
        {"split": ["train", "dev", "test", "excluded", "all"], "format": ["jsonl", "csv", "parquet"]},
    ),
    (
        "/api/v1/tasks/{task_name}/rounds/{number}/dataset/card",
        {"format": ["jsonl", "csv", "parquet"], "splits": ["train,dev,test", "all", "excluded,train"]},
    ),
    ("/api/v1/tasks/{task_name}/rounds/{number}/report", {"format": ["json", "markdown"]}),
    ("/api/v1/rounds/{round_id}/plot-data", {"limit": [1, 5, 500_000]}),
    ("/api/v1/tasks/{task_name}/models", {}),
    ("/api/v1/tasks/{task_name}/jobs", {}),
]


def test_round_builder_reads_on_a_built_round(built, app, make_user) -> None:
    """The reads of a *built* round (the seeded round of ``test_every_operation`` is not built):
    generated requests, valid and invalid, with every valid query combination mixed in, sent
    anonymously and as a client, a researcher and a writer. The dataset streams JSONL, CSV or
    Parquet; the report is JSON or markdown."""
    REAL.clear()
    REAL.update({"task_name": [TASK], "number": [built["round"]["number"]], "round_id": [built["round"]["id"]]})
    headers: dict[str | None, dict[str, str] | None] = {
        None: None,
        "client": make_user("cora", "client").headers,
        "researcher": built["researcher"].headers,
        "writer": built["writer"].headers,
    }
    try:
        for path, valid_query in BUILT_ROUND_READS:
            operation = schema[path]["GET"]
            combinations = [
                dict(zip(valid_query, values, strict=True)) for values in itertools.product(*valid_query.values())
            ]
            strategy = st.one_of(
                operation.as_strategy(GenerationMode.POSITIVE),
                operation.as_strategy(GenerationMode.NEGATIVE),
                st.sampled_from(combinations).flatmap(lambda query, op=operation: op.as_strategy(query=query)),
            )

            @SETTINGS
            @hypothesis.given(case=strategy)
            def run(case: Any) -> None:
                _send_as_everyone(case, app, headers)

            run()
    finally:
        REAL.clear()
