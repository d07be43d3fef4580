"""Who may call what: every API route against every role, and the specific secrets each role
must never see (another writer's texts, the labels behind a validator's batch, plain tokens).

The matrix is built from the app itself (its OpenAPI paths and its top-level routes), so a new
endpoint without an entry in ``ALLOWED`` makes ``test_every_route_has_an_authorization_entry``
fail until someone decides who may call it. Task ownership has a matrix of its own: every
route that names a task or one of its things, as the task's owner, a member, another group's
researcher, a writer, a validator, a REST client and an admin (``OWNERSHIP``, checked the same way).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import String, Text, text

from services.db.engine import session_scope
from services.db.models import Base
from services.domain import users
from tests.conftest import (
    Actor,
    example_yaml,
    free_port,
    open_round,
    register_model_server,
    served_examples,
    table_snapshot,
)
from tests.stub_model_server import ThreadedServer, create_stub_app

API = "/api/v1"
ROLES = ["anonymous", "writer", "validator", "researcher", "client", "admin"]
PUBLIC = "public"  # no token needed
ANY = "any"  # any valid token
W, V, R, C = "writer", "validator", "researcher", "client"

# (method, path) -> who may call it: PUBLIC, ANY, or a set of roles. An admin passes every role
# check (docs/api.md), so "admin" is implied everywhere. Ownership ("your own assignment",
# "your own token") is checked separately below: here each role acts on its own things.
ALLOWED: dict[tuple[str, str], str | set[str]] = {
    ("GET", "/health"): PUBLIC,
    # No user's token opens it: only the metrics token (unset here: 404 for everyone; tests/test_metrics.py).
    ("GET", "/metrics"): PUBLIC,
    ("GET", f"{API}/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/redoc"): PUBLIC,
    ("POST", f"{API}/auth/login"): PUBLIC,
    ("GET", f"{API}/me"): ANY,
    ("GET", f"{API}/me/token"): ANY,
    ("GET", f"{API}/users"): set(),
    ("POST", f"{API}/users"): set(),
    ("POST", f"{API}/users/{{username}}/tokens"): ANY,  # for yourself; for others admins only
    ("DELETE", f"{API}/tokens/{{token_id}}"): ANY,  # your own; anyone's for admins
    ("GET", f"{API}/tasks"): ANY,
    ("POST", f"{API}/tasks"): {R},
    ("GET", f"{API}/tasks/{{task_name}}"): ANY,
    ("GET", f"{API}/tasks/{{task_name}}/rounds"): ANY,
    ("POST", f"{API}/tasks/{{task_name}}/rounds"): {R},
    ("GET", f"{API}/rounds/open"): ANY,
    ("GET", f"{API}/rounds/{{round_id}}"): ANY,
    ("POST", f"{API}/rounds/{{round_id}}/status"): {R},
    ("PUT", f"{API}/rounds/{{round_id}}/model"): {R},
    ("POST", f"{API}/rounds/{{round_id}}/prompts"): {R},
    ("GET", f"{API}/rounds/{{round_id}}/stats"): {R},
    ("GET", f"{API}/rounds/{{round_id}}/worker-agreement"): {R},
    ("POST", f"{API}/tasks/{{task_name}}/worker-quality/apply"): {R},
    ("POST", f"{API}/tasks/{{task_name}}/workers/{{username}}/unqualify"): {R},
    ("POST", f"{API}/tasks/{{task_name}}/workers/{{username}}/requalify"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/quiz"): {W},
    ("POST", f"{API}/tasks/{{task_name}}/quiz/attempts"): {W},
    ("POST", f"{API}/rounds/{{round_id}}/assignments"): {W},
    ("GET", f"{API}/assignments/{{assignment_id}}"): {W},
    ("POST", f"{API}/assignments/{{assignment_id}}/attempts"): {W},
    ("POST", f"{API}/attempts/{{attempt_id}}/confirmation"): {W},
    ("POST", f"{API}/assignments/{{assignment_id}}/example"): {W},
    ("POST", f"{API}/assignments/{{assignment_id}}/skip"): {W},
    ("POST", f"{API}/assignments/{{assignment_id}}/inspect"): {W},
    ("GET", f"{API}/rounds/{{round_id}}/validation-batch"): {V},
    ("POST", f"{API}/examples/{{example_id}}/validations"): {V},
    ("POST", f"{API}/validation-items/{{item_id}}/validations"): {V},
    ("GET", f"{API}/tasks/{{task_name}}/control-items"): {R},
    ("POST", f"{API}/tasks/{{task_name}}/control-items"): {R},
    ("DELETE", f"{API}/tasks/{{task_name}}/control-items/{{control_id}}"): {R},
    ("GET", f"{API}/examples/{{example_id}}"): {R},
    ("POST", f"{API}/rounds/{{round_id}}/build"): {R},
    ("POST", f"{API}/rounds/{{round_id}}/build/preview"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/rounds/{{number}}/report"): {R, C},
    ("GET", f"{API}/tasks/{{task_name}}/rounds/{{number}}/dataset"): {R, C},
    ("GET", f"{API}/tasks/{{task_name}}/rounds/{{number}}/dataset/card"): {R, C},
    ("POST", f"{API}/tasks/{{task_name}}/jobs"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/jobs"): {R},
    ("GET", f"{API}/jobs/{{job_id}}"): {R},
    ("POST", f"{API}/jobs/{{job_id}}/cancel"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/models"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/model-replicas"): {R},
    ("POST", f"{API}/tasks/{{task_name}}/datasets/uploads"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/datasets/uploads"): {R},
    ("DELETE", f"{API}/tasks/{{task_name}}/datasets/uploads/{{dataset_name}}"): {R},
    ("POST", f"{API}/tasks/{{task_name}}/rounds/{{number}}/imports"): {R},
    ("GET", f"{API}/rounds/{{round_id}}/plot-data"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/members"): {R},
    ("PUT", f"{API}/tasks/{{task_name}}/members/{{username}}"): {R},
    ("DELETE", f"{API}/tasks/{{task_name}}/members/{{username}}"): {R},
    ("POST", f"{API}/tasks/{{task_name}}/ledger/compute"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/ledger"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/ledger/workers/{{user_id}}"): {R},
    ("POST", f"{API}/ledger/{{entry_id}}/corrections"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/ledger/bonuses.csv"): {R},  # retired: 410 for researchers
    ("POST", f"{API}/tasks/{{task_name}}/payout-batches"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/payout-batches"): {R},
    ("GET", f"{API}/payout-batches/{{batch_id}}"): {R},
    ("GET", f"{API}/payout-batches/{{batch_id}}/file"): {R},
    ("POST", f"{API}/payout-batches/{{batch_id}}/paid"): {R},
    ("POST", f"{API}/payout-batches/{{batch_id}}/cancel"): {R},
    ("POST", f"{API}/payout-batches/{{batch_id}}/reconciliation"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/crowd-report"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/pay-policy"): {R},
    ("PUT", f"{API}/tasks/{{task_name}}/pay-policy"): {R},
    ("POST", f"{API}/model-servers"): set(),
    ("GET", f"{API}/model-servers"): {R},
    ("GET", f"{API}/model-servers/{{name}}"): {R},
    ("PATCH", f"{API}/model-servers/{{name}}"): set(),
    ("DELETE", f"{API}/model-servers/{{name}}"): set(),
    ("PUT", f"{API}/model-servers/{{name}}/tasks/{{task_name}}"): set(),
    ("DELETE", f"{API}/model-servers/{{name}}/tasks/{{task_name}}"): set(),
    ("GET", f"{API}/model-servers/{{name}}/tasks"): set(),
    ("GET", f"{API}/tasks/{{task_name}}/model-servers"): {R},
    ("POST", f"{API}/tasks/{{task_name}}/study-links"): {R},
    ("GET", f"{API}/tasks/{{task_name}}/study-links"): {R},
    ("GET", f"{API}/study-links/{{link_id}}"): {R},
    ("POST", f"{API}/study-links/{{link_id}}/close"): {R},
    ("GET", f"{API}/study-links/{{link_id}}/sessions"): {R},
    ("POST", f"{API}/study/{{slug}}/sessions"): PUBLIC,
    ("GET", f"{API}/me/study-sessions"): ANY,
    ("POST", f"{API}/study-sessions/{{session_id}}/finish"): ANY,  # your own session (others': 404)
    ("GET", f"{API}/attention-checks/pending"): {W},
    ("POST", f"{API}/attention-checks/{{check_id}}/answer"): {W},  # your own check (others': 404)
    ("GET", f"{API}/tasks/{{task_name}}/attention-checks"): {R},
}

TASK = "dynasent-r2"
WRITER_TEXT = "The soup was great but the waiter was rude."
SECRET_TEXT = "Wendy's secret draft about the cold soup, never to be shown."


def app_routes(app: Any) -> set[tuple[str, str]]:
    """Every (method, path) the app serves: its OpenAPI operations, plus the top-level routes
    that are not in the schema (the docs pages and the schema itself)."""
    from fastapi.testclient import TestClient

    routes = set()
    schema = TestClient(app).get(f"{API}/openapi.json").json()
    for path, operations in schema["paths"].items():
        routes.update((method.upper(), path) for method in operations)
    for route in app.routes:
        path, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if path and methods:
            routes.update((method, path) for method in methods if method != "HEAD")
    return routes


def test_every_route_has_an_authorization_entry(app: Any) -> None:
    routes = app_routes(app)
    missing = sorted(routes - set(ALLOWED))
    assert not missing, f"routes with no entry in ALLOWED (decide who may call them): {missing}"
    stale = sorted(set(ALLOWED) - routes)
    assert not stale, f"entries in ALLOWED for routes the app does not serve: {stale}"


def _dependency_calls(dependant: Any) -> Iterator[Any]:
    for dependency in dependant.dependencies:
        yield dependency.call
        yield from _dependency_calls(dependency)


# The /api/v1 operations that take no token: login, and a worker arriving from a crowd platform
# with the platform's parameters (services/domain/study.py checks them).
PUBLIC_OPERATIONS = (f"{API}/auth/login", f"{API}/study/{{slug}}/sessions")


def test_every_route_asks_the_authorization_module(app: Any) -> None:
    """Every /api/v1 operation but login gets its caller from ``dynaloop.api.deps.allowed`` (or
    ``allowed_writer``), which asks services/authorization.py; no route decides by itself."""
    from fastapi.routing import APIRoute

    asking = {"allowed.<locals>.check", "allowed_writer.<locals>.writer"}
    unasked = sorted(
        f"{sorted(route.methods or ())} {route.path}"
        for route in app.routes
        if isinstance(route, APIRoute)
        and route.path.startswith(API)
        and route.path not in PUBLIC_OPERATIONS
        and not asking & {getattr(call, "__qualname__", "") for call in _dependency_calls(route.dependant)}
    )
    assert not unasked, f"routes that do not ask services/authorization.py: {unasked}"


@dataclass
class World:
    """One actor per role (each acting on its own things), and the ids they need."""

    actors: dict[str, Actor | None]
    round_id: int
    assignment_id: int  # the writer's open assignment
    attempt_id: int  # its scored attempt
    example_id: int  # an example by another writer, for validators to label
    spare_tokens: dict[str, int] = field(default_factory=dict)  # per role, a token it may revoke
    server: str = ""  # the registered model server of the round


@pytest.fixture(scope="module")
def model_with_inspect() -> Iterator[ThreadedServer]:
    """The keyword stub model plus the optional ``POST /inspect`` (token attributions)."""
    stub = create_stub_app(["positive", "negative", "neutral"])

    @stub.post("/inspect")
    def inspect(body: dict[str, Any]) -> dict[str, Any]:
        return {"label": body.get("label"), "tokens": [{"token": w, "score": 0.1} for w in str(body["text"]).split()]}

    server = ThreadedServer(stub, free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def world(client: Any, make_user: Any, model_with_inspect: ThreadedServer, monkeypatch: pytest.MonkeyPatch) -> World:
    actors: dict[str, Actor | None] = {"anonymous": None}
    for role in ROLES[1:]:
        actors[role] = make_user(f"the-{role}", role)
    root = make_user("root", "researcher")
    round_ = open_round(
        client,
        root,
        example_yaml(TASK, onboarding_quiz=None),
        model_with_inspect.url,
        [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(10)],
    )
    # The role matrix's researcher owns the task with root (the ownership matrix below is about
    # the researchers who do not).
    response = client.put(f"{API}/tasks/{TASK}/members/the-researcher", json={"role": "owner"}, headers=root.headers)
    assert response.status_code == 201, response.text
    other = make_user("wendy", "writer")
    example = _write_example(client, other, round_["id"], "A plain remark about the lunch menu today.")
    writer = actors["writer"]
    assert writer is not None
    assignment = client.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()
    attempt = client.post(
        f"{API}/assignments/{assignment['id']}/attempts", json={"text": WRITER_TEXT}, headers=writer.headers
    )
    assert attempt.status_code == 201, attempt.text
    make_user("victim", "validator")  # the one researchers unqualify and requalify
    with session_scope(client.app.state.sessionmaker) as session:  # the one who logs in
        users.create_user(session, None, "lou", ["validator"], password="correct-horse")
    spare = {}
    for role, actor in actors.items():
        if actor is not None:
            response = client.post(
                f"{API}/users/{actor.username}/tokens", json={"name": "spare"}, headers=actor.headers
            )
            assert response.status_code == 201, response.text
            spare[role] = response.json()["id"]
    server = register_model_server(client.app, model_with_inspect.url)
    return World(actors, round_["id"], assignment["id"], attempt.json()["id"], example["id"], spare, server)


def _write_example(client: Any, writer: Actor, round_id: int, text_: str) -> dict[str, Any]:
    assignment = client.post(f"{API}/rounds/{round_id}/assignments", json={}, headers=writer.headers).json()
    attempt = client.post(
        f"{API}/assignments/{assignment['id']}/attempts", json={"text": text_}, headers=writer.headers
    ).json()
    assert attempt["status"] == "scored", attempt
    if attempt["fooled"]:
        client.post(f"{API}/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers)
    response = client.post(
        f"{API}/assignments/{assignment['id']}/example", json={"attempt_id": attempt["id"]}, headers=writer.headers
    )
    assert response.status_code == 201, response.text
    return response.json()


def request_bodies(who: str, server: str, attempt_id: int, round_id: int = 1) -> dict[tuple[str, str], dict[str, Any]]:
    """A valid body for each route that takes one (the one place to change when a body changes;
    both matrices use it): ``who`` makes names and texts unique, ``server`` is the registered
    model server in the loop, ``attempt_id`` the attempt a writer submits, ``round_id`` the round of a study link."""
    return {
        ("POST", f"{API}/auth/login"): {"json": {"username": "lou", "password": "correct-horse"}},
        ("POST", f"{API}/users"): {"json": {"username": f"new-{who}", "roles": ["writer"]}},
        ("POST", f"{API}/users/{{username}}/tokens"): {"json": {"name": "matrix"}},
        ("POST", f"{API}/tasks"): {
            "content": example_yaml("isarcasm", onboarding_quiz=None).encode(),
            "headers": {"Content-Type": "application/yaml"},
        },
        ("POST", f"{API}/tasks/{{task_name}}/rounds"): {"json": {"model_servers": [server]}},
        ("POST", f"{API}/rounds/{{round_id}}/status"): {"json": {"status": "collecting"}},
        ("PUT", f"{API}/rounds/{{round_id}}/model"): {"json": {"model_servers": [server]}},
        ("POST", f"{API}/model-servers"): {"json": {"name": f"m-{who}", "url": "http://127.0.0.1:9"}},
        ("PATCH", f"{API}/model-servers/{{name}}"): {"json": {"description": f"seen by {who}"}},
        ("POST", f"{API}/rounds/{{round_id}}/prompts"): {
            "content": json.dumps({"text": f"A new prompt from the {who} about lunch."}).encode(),
            "headers": {"Content-Type": "application/x-ndjson"},
        },
        ("POST", f"{API}/tasks/{{task_name}}/workers/{{username}}/unqualify"): {"json": {"reason": "matrix"}},
        ("PUT", f"{API}/tasks/{{task_name}}/members/{{username}}"): {"json": {"role": "member"}},
        ("POST", f"{API}/tasks/{{task_name}}/quiz/attempts"): {"json": {"answers": []}},
        ("POST", f"{API}/rounds/{{round_id}}/assignments"): {"json": {}},
        ("POST", f"{API}/assignments/{{assignment_id}}/attempts"): {"json": {"text": "The lunch was great, really."}},
        ("POST", f"{API}/attempts/{{attempt_id}}/confirmation"): {"json": {"agrees": True}},
        ("POST", f"{API}/assignments/{{assignment_id}}/example"): {"json": {"attempt_id": attempt_id}},
        ("POST", f"{API}/assignments/{{assignment_id}}/inspect"): {"json": {"text": "The lunch was great, really."}},
        ("POST", f"{API}/examples/{{example_id}}/validations"): {"json": {"label": "neutral"}},
        ("POST", f"{API}/validation-items/{{item_id}}/validations"): {"json": {"label": "neutral"}},
        ("POST", f"{API}/tasks/{{task_name}}/control-items"): {
            "json": {"text": f"A control sentence from the {who} about a lovely lunch.", "labels": ["positive"]}
        },
        ("POST", f"{API}/rounds/{{round_id}}/build"): {"json": {}},
        ("POST", f"{API}/tasks/{{task_name}}/ledger/compute"): {"json": {}},
        ("PUT", f"{API}/tasks/{{task_name}}/pay-policy"): {
            "json": {"policy": {"currency": "GBP", "base_pay": {"writer": 150}}, "note": f"matrix {who}"}
        },
        ("POST", f"{API}/ledger/{{entry_id}}/corrections"): {"json": {"amount_minor": 5, "reason": "matrix"}},
        ("GET", f"{API}/tasks/{{task_name}}/ledger/bonuses.csv"): {"params": {"platform": "prolific"}},
        ("POST", f"{API}/tasks/{{task_name}}/payout-batches"): {"json": {"link_id": 1}},
        ("POST", f"{API}/payout-batches/{{batch_id}}/reconciliation"): {"content": b"participant_id,amount\n"},
        ("POST", f"{API}/rounds/{{round_id}}/build/preview"): {"json": {}},
        ("POST", f"{API}/tasks/{{task_name}}/jobs"): {"json": {"kind": "train"}},
        ("POST", f"{API}/tasks/{{task_name}}/datasets/uploads"): {
            "content": b"text,label\nThe lunch was fine.,neutral\n",
            "params": {"name": f"matrix-{who}", "format": "csv"},
        },
        ("POST", f"{API}/tasks/{{task_name}}/rounds/{{number}}/imports"): {
            "json": {"kind": "labelled", "dataset": "matrix"}
        },
        ("POST", f"{API}/tasks/{{task_name}}/study-links"): {
            "json": {
                "name": f"link of {who}",
                "round_id": round_id,
                "role": "writer",
                "platform": "prolific",
                "quota": 2,
            }
        },
        ("POST", f"{API}/study/{{slug}}/sessions"): {"json": {"params": {}}},
        ("POST", f"{API}/study-sessions/{{session_id}}/finish"): {"json": {"reason": "stop"}},
        ("POST", f"{API}/attention-checks/{{check_id}}/answer"): {"json": {"answer": "Orange"}},
    }


def _request(world: World, role: str, method: str, path: str) -> dict[str, Any]:
    """The URL and a valid body for ``role`` calling ``method path`` on its own things."""
    actor = world.actors[role]
    values = {
        "task_name": TASK,
        "round_id": world.round_id,
        "number": 1,
        "assignment_id": world.assignment_id,
        "attempt_id": world.attempt_id,
        "example_id": world.example_id,
        "job_id": 1,
        "dataset_name": "matrix",
        "user_id": 1,
        "entry_id": 1,
        "username": actor.username if actor and path.endswith("/tokens") else "victim",
        "token_id": world.spare_tokens.get(role, 1),
        "name": world.server,
        "link_id": 1,
        "slug": "no-such-link",
        "session_id": 1,
        "item_id": "no-such-item",
        "control_id": 1,
        "check_id": 1,
        "batch_id": 1,
    }
    url = path.format(**values)
    bodies = request_bodies(role, world.server, world.attempt_id, world.round_id)
    kwargs: dict[str, Any] = dict(bodies.get((method, path), {}))
    headers = dict(kwargs.pop("headers", {}))
    if actor is not None:
        headers.update(actor.headers)
    return {"method": method, "url": url, "headers": headers, **kwargs}


def _expected(entry: str | set[str], role: str) -> str:
    if entry == PUBLIC:
        return "allowed"
    if role == "anonymous":
        return "401"
    if entry == ANY or role == "admin" or role in entry:
        return "allowed"
    return "403"


# The writer flow changes state (skip ends the assignment); run it after the reads.
_ORDER = {"skip": 2, "example": 1, "confirmation": 1}


def test_route_role_matrix(client: Any, app: Any, world: World, model_with_inspect: ThreadedServer) -> None:
    """401 without a token (except the public routes), 403 for a role that is not allowed,
    and neither for one that is (it may still get 404, 409 or 422 for the data it sent)."""
    mismatches = []
    routes = sorted(app_routes(app), key=lambda r: (_ORDER.get(r[1].rsplit("/", 1)[-1], 0), r))
    for method, path in routes:
        for role in ROLES:
            expected = _expected(ALLOWED[(method, path)], role)
            response = client.request(**_request(world, role, method, path))
            status = response.status_code
            ok = (status not in (401, 403)) if expected == "allowed" else (status == int(expected))
            if status >= 500 or not ok:
                mismatches.append(f"{method} {path} as {role}: expected {expected}, got {status} {response.text[:200]}")
            if expected in ("401", "403"):
                body = response.json()
                assert set(body) == {"error"} and body["error"]["code"] in ("unauthorized", "forbidden"), body
    assert not mismatches, "\n".join(mismatches)


# --- task ownership: every task-scoped route x who is (not) on the task --------------------------

OWNER, MEMBER, OTHER = "owner", "member", "other researcher"
# Workers a study link of another group's task made (services/authorization.py, link-made
# workers): they reach that task only; Rita's is missing to them.
LINK_WRITER, LINK_VALIDATOR = "other task's link writer", "other task's link validator"
WHO = [OWNER, MEMBER, OTHER, "writer", "validator", "client", "admin", LINK_WRITER, LINK_VALIDATOR]
OK, NO, HIDDEN = "ok", "403", "hidden"  # hidden: 404 in the very words of a missing object


def _expect(*cells: str) -> dict[str, str]:
    assert len(cells) == len(WHO)
    return dict(zip(WHO, cells, strict=True))


#                    owner   member  other   writer  valid.  client  admin  link-w  link-v
MANAGE = _expect(OK, OK, HIDDEN, NO, NO, NO, OK, NO, NO)
OWNERS = _expect(OK, NO, HIDDEN, NO, NO, NO, OK, NO, NO)
READ = _expect(OK, OK, HIDDEN, OK, OK, OK, OK, HIDDEN, HIDDEN)
DATASET = _expect(OK, OK, HIDDEN, NO, NO, OK, OK, NO, NO)
WRITE = _expect(NO, NO, NO, OK, NO, NO, OK, HIDDEN, NO)
# A writer's own assignment: even admins are refused.
OWN_WORK = _expect(NO, NO, NO, OK, NO, NO, HIDDEN, HIDDEN, NO)
VALIDATE = _expect(NO, NO, NO, NO, OK, NO, OK, NO, HIDDEN)
ADMINS = _expect(NO, NO, NO, NO, NO, NO, OK, NO, NO)  # the registry of model servers and its grants

# Every route that names a task or one of its things in its path. A new one fails
# test_every_task_scoped_route_is_in_the_ownership_matrix until it is given a row here (and, if
# it takes a body, an entry in request_bodies).
TASK_PARAMS = ("task_name", "round_id", "example_id", "job_id", "assignment_id", "attempt_id")
OWNERSHIP: dict[tuple[str, str], dict[str, str]] = {
    ("GET", f"{API}/tasks/{{task_name}}"): READ,
    ("GET", f"{API}/tasks/{{task_name}}/rounds"): READ,
    ("POST", f"{API}/tasks/{{task_name}}/rounds"): MANAGE,
    ("GET", f"{API}/rounds/{{round_id}}"): READ,
    ("POST", f"{API}/rounds/{{round_id}}/status"): MANAGE,
    ("PUT", f"{API}/rounds/{{round_id}}/model"): MANAGE,
    ("POST", f"{API}/rounds/{{round_id}}/prompts"): MANAGE,
    ("GET", f"{API}/rounds/{{round_id}}/stats"): MANAGE,
    ("GET", f"{API}/rounds/{{round_id}}/plot-data"): MANAGE,
    ("GET", f"{API}/rounds/{{round_id}}/worker-agreement"): MANAGE,
    ("POST", f"{API}/tasks/{{task_name}}/worker-quality/apply"): MANAGE,
    ("POST", f"{API}/tasks/{{task_name}}/workers/{{username}}/unqualify"): MANAGE,
    ("POST", f"{API}/tasks/{{task_name}}/workers/{{username}}/requalify"): MANAGE,
    ("GET", f"{API}/examples/{{example_id}}"): MANAGE,
    ("POST", f"{API}/rounds/{{round_id}}/build"): MANAGE,
    ("POST", f"{API}/rounds/{{round_id}}/build/preview"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/rounds/{{number}}/report"): DATASET,
    ("GET", f"{API}/tasks/{{task_name}}/rounds/{{number}}/dataset"): DATASET,
    ("GET", f"{API}/tasks/{{task_name}}/rounds/{{number}}/dataset/card"): DATASET,
    ("POST", f"{API}/tasks/{{task_name}}/jobs"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/jobs"): MANAGE,
    ("GET", f"{API}/jobs/{{job_id}}"): MANAGE,
    ("POST", f"{API}/jobs/{{job_id}}/cancel"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/models"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/model-replicas"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/members"): MANAGE,
    ("POST", f"{API}/tasks/{{task_name}}/datasets/uploads"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/datasets/uploads"): MANAGE,
    ("DELETE", f"{API}/tasks/{{task_name}}/datasets/uploads/{{dataset_name}}"): MANAGE,
    ("POST", f"{API}/tasks/{{task_name}}/rounds/{{number}}/imports"): MANAGE,
    ("PUT", f"{API}/tasks/{{task_name}}/members/{{username}}"): OWNERS,
    ("DELETE", f"{API}/tasks/{{task_name}}/members/{{username}}"): OWNERS,
    ("GET", f"{API}/tasks/{{task_name}}/quiz"): WRITE,
    ("POST", f"{API}/tasks/{{task_name}}/quiz/attempts"): WRITE,
    ("POST", f"{API}/rounds/{{round_id}}/assignments"): WRITE,
    ("GET", f"{API}/assignments/{{assignment_id}}"): OWN_WORK,
    ("POST", f"{API}/assignments/{{assignment_id}}/attempts"): OWN_WORK,
    ("POST", f"{API}/attempts/{{attempt_id}}/confirmation"): OWN_WORK,
    ("POST", f"{API}/assignments/{{assignment_id}}/example"): OWN_WORK,
    ("POST", f"{API}/assignments/{{assignment_id}}/skip"): OWN_WORK,
    ("POST", f"{API}/assignments/{{assignment_id}}/inspect"): OWN_WORK,
    ("GET", f"{API}/rounds/{{round_id}}/validation-batch"): VALIDATE,
    ("POST", f"{API}/examples/{{example_id}}/validations"): VALIDATE,
    ("POST", f"{API}/tasks/{{task_name}}/ledger/compute"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/ledger"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/ledger/workers/{{user_id}}"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/ledger/bonuses.csv"): MANAGE,
    ("POST", f"{API}/tasks/{{task_name}}/payout-batches"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/payout-batches"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/crowd-report"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/pay-policy"): MANAGE,
    ("PUT", f"{API}/tasks/{{task_name}}/pay-policy"): MANAGE,
    ("POST", f"{API}/tasks/{{task_name}}/study-links"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/study-links"): MANAGE,
    ("PUT", f"{API}/model-servers/{{name}}/tasks/{{task_name}}"): ADMINS,
    ("DELETE", f"{API}/model-servers/{{name}}/tasks/{{task_name}}"): ADMINS,
    ("GET", f"{API}/tasks/{{task_name}}/model-servers"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/control-items"): MANAGE,
    ("POST", f"{API}/tasks/{{task_name}}/control-items"): MANAGE,
    ("DELETE", f"{API}/tasks/{{task_name}}/control-items/{{control_id}}"): MANAGE,
    ("GET", f"{API}/tasks/{{task_name}}/attention-checks"): MANAGE,
}
# What a missing one is called, per path parameter: the "hidden" answers must be exactly these.
MISSING = {"task_name": "no-such-task", "round_id": 987654, "example_id": 987653, "job_id": 987652}
MISSING.update(assignment_id=987651, attempt_id=987650)
# Tables a refused request may touch: the caller's token records when it was last used.
BOOKKEEPING = {"api_tokens"}


def task_scoped_routes(app: Any) -> set[tuple[str, str]]:
    return {(method, path) for method, path in app_routes(app) if any(f"{{{p}}}" in path for p in TASK_PARAMS)}


def test_every_task_scoped_route_is_in_the_ownership_matrix(app: Any) -> None:
    routes = task_scoped_routes(app)
    missing = sorted(routes - set(OWNERSHIP))
    assert not missing, f"task-scoped routes with no row in OWNERSHIP (decide who may call them): {missing}"
    assert not sorted(set(OWNERSHIP) - routes), "rows in OWNERSHIP for routes the app does not serve"


@dataclass
class Owned:
    """Rita's task, built round 1 and collecting round 2; Mia on it as a member; Oscar a
    researcher of another group (with a task of his own); one actor per other role."""

    actors: dict[str, Actor]
    values: dict[str, Any]  # path parameters of Rita's things
    server: str  # the registered model server of Rita's round 2


@pytest.fixture
def owned(
    client: Any, app: Any, built: Any, make_user: Any, model_with_inspect: ThreadedServer, monkeypatch: Any
) -> Owned:
    rita = built["researcher"]
    actors = {OWNER: rita, MEMBER: make_user("mia", "researcher"), OTHER: make_user("oscar", "researcher")}
    for role in ("writer", "validator", "client", "admin"):
        actors[role] = make_user(f"the-{role}", role)
    response = client.put(f"{API}/tasks/{TASK}/members/mia", json={"role": "member"}, headers=rita.headers)
    assert response.status_code == 201, response.text
    other_round = open_round(client, actors[OTHER], example_yaml("isarcasm", onboarding_quiz=None), None)
    for who, role in ((LINK_WRITER, "writer"), (LINK_VALIDATOR, "validator")):
        link = client.post(
            f"{API}/tasks/{other_round['task']}/study-links",
            json={
                "name": role,
                "round_id": other_round["id"],
                "role": role,
                "platform": "generic",
                "id_parameter": "worker",
                "quota": 1,
            },
            headers=actors[OTHER].headers,
        )
        assert link.status_code == 201, link.text
        started = client.post(f"{API}/study/{link.json()['slug']}/sessions", json={"params": {"worker": f"w-{role}"}})
        assert started.status_code == 201, started.text
        token = started.json()["token"]
        me = client.get(f"{API}/me", headers={"Authorization": f"Bearer {token}"}).json()
        actors[who] = Actor(me["username"], token)
    server = register_model_server(app, model_with_inspect.url, tasks=[TASK])
    response = client.post(f"{API}/tasks/{TASK}/rounds", json={"model_servers": [server]}, headers=rita.headers)
    assert response.status_code == 201, response.text
    round_id = response.json()["id"]
    prompts = "\n".join(json.dumps({"text": f"Round 2 prompt {i} about the lunch menu."}) for i in range(5))
    response = client.post(
        f"{API}/rounds/{round_id}/prompts",
        content=prompts.encode(),
        headers={**rita.headers, "Content-Type": "application/x-ndjson"},
    )
    assert response.status_code == 200, response.text
    example = _write_example(client, make_user("wendy", "writer"), round_id, "A plain remark on the lunch menu.")
    writer = actors["writer"]
    assignment = client.post(f"{API}/rounds/{round_id}/assignments", json={}, headers=writer.headers).json()
    attempt = client.post(
        f"{API}/assignments/{assignment['id']}/attempts", json={"text": WRITER_TEXT}, headers=writer.headers
    )
    assert attempt.status_code == 201, attempt.text
    job = client.post(f"{API}/tasks/{TASK}/jobs", json={"kind": "train"}, headers=rita.headers)
    assert job.status_code == 202, job.text
    make_user("victim", "validator")  # the worker researchers unqualify and requalify
    make_user("pat", "researcher")  # the researcher owners add and remove
    upload = client.post(
        f"{API}/tasks/{TASK}/datasets/uploads",
        content=b"text,label\nThe soup was cold.,negative\n",
        params={"name": "matrix", "format": "csv"},
        headers=rita.headers,
    )
    assert upload.status_code == 201, upload.text
    control = client.post(
        f"{API}/tasks/{TASK}/control-items",
        json={"text": "The staff were lovely and the cake was wonderful.", "labels": ["positive"]},
        headers=rita.headers,
    )
    assert control.status_code == 201, control.text
    values = {
        "task_name": TASK,
        "round_id": round_id,
        "number": 1,
        "control_id": control.json()["id"],
        "example_id": example["id"],
        "job_id": job.json()["id"],
        "assignment_id": assignment["id"],
        "attempt_id": attempt.json()["id"],
        "dataset_name": "matrix",
        "user_id": 1,  # a ledger statement: the task has no pay policy, so nobody has one
        "name": server,  # the model server in the round's loop, granted to the task
    }
    return Owned(actors, values, server)


def _call(client: Any, owned: Owned, who: str, method: str, path: str, *, missing: bool = False) -> Any:
    """``who`` calls ``method path`` on Rita's things (or, with ``missing``, on a missing one)."""
    values = dict(owned.values)
    values["username"] = "pat" if "/members/" in path else "victim"
    if missing:
        values.update(MISSING)
    actor = owned.actors[who]
    attempt_id = MISSING["attempt_id"] if missing else values["attempt_id"]
    bodies = request_bodies(who.replace(" ", "-"), owned.server, attempt_id, values["round_id"])
    kwargs = dict(bodies.get((method, path), {}))
    headers = {**kwargs.pop("headers", {}), **actor.headers}
    return client.request(method, path.format(**values), headers=headers, **kwargs)


def _as_if_missing(owned: Owned, path: str, response: Any) -> Any:
    """The answer about a missing object, with its name or id replaced by Rita's: what a hidden
    object must answer."""
    param = next(p for p in TASK_PARAMS if f"{{{p}}}" in path)
    return json.loads(response.text.replace(str(MISSING[param]), str(owned.values[param])))


def _check(client: Any, owned: Owned, who: str, method: str, path: str, expected: str) -> str | None:
    response = _call(client, owned, who, method, path)
    status = response.status_code
    where = f"{method} {path} as {who}: expected {expected}, got {status} {response.text[:300]}"
    if status >= 500:
        return where
    hidden = _as_if_missing(owned, path, _call(client, owned, who, method, path, missing=True))
    if expected == NO:
        return None if status == 403 and response.json()["error"]["code"] == "forbidden" else where
    if expected == HIDDEN:
        return None if status == 404 and response.json() == hidden else f"{where}; missing: {hidden}"
    refused = status in (401, 403) or (status == 404 and response.json() == hidden)
    return where if refused else None


@pytest.mark.slow
def test_task_ownership_matrix(client: Any, app: Any, owned: Owned) -> None:
    """Every task-scoped route as the task's owner, a member, another group's researcher, a
    writer, a validator, a REST client and an admin. The refusals come first and change nothing
    in the database; then the calls that are allowed are made and must not be refused."""
    cells = [(method, path, who, OWNERSHIP[(method, path)][who]) for method, path in sorted(OWNERSHIP) for who in WHO]
    tables = [t.name for t in Base.metadata.sorted_tables if t.name not in BOOKKEEPING]
    before = table_snapshot(app, *tables)
    mismatches = [
        problem
        for method, path, who, expected in cells
        if expected != OK and (problem := _check(client, owned, who, method, path, expected))
    ]
    assert table_snapshot(app, *tables) == before, "a refused request changed the database"
    ordered = sorted(
        (cell for cell in cells if cell[3] == OK), key=lambda c: (_ORDER.get(c[1].rsplit("/", 1)[-1], 0), c[1], c[0])
    )
    mismatches += [
        problem
        for method, path, who, expected in ordered
        if (problem := _check(client, owned, who, method, path, expected))
    ]
    assert not mismatches, "\n".join(mismatches)


def test_a_second_researcher_cannot_steer_another_groups_task(
    client: Any, app: Any, researcher: Actor, make_user: Any, stub_model: Any
) -> None:
    """Issue #12, point 4: a second researcher changed the first one's round status and model,
    imported prompts and unqualified workers. Each is now refused as if the task did not exist,
    and the database is unchanged."""
    round_ = open_round(
        client,
        researcher,
        example_yaml(TASK, onboarding_quiz=None),
        stub_model.url,
        [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(5)],
    )
    make_user("victim", "validator")
    oscar = make_user("oscar", "researcher")
    rid = round_["id"]
    elsewhere = register_model_server(app, "http://127.0.0.1:9")  # a registered server Oscar would switch to
    tables = [t.name for t in Base.metadata.sorted_tables if t.name not in BOOKKEEPING]
    before = table_snapshot(app, *tables)
    attacks = [
        ("POST", f"{API}/rounds/{rid}/status", {"json": {"status": "validating"}}),
        (
            "PUT",
            f"{API}/rounds/{rid}/model",
            {"json": {"model_servers": [elsewhere]}},
        ),
        (
            "POST",
            f"{API}/rounds/{rid}/prompts",
            {"content": b'{"text": "Oscar was here."}', "headers": {"Content-Type": "application/x-ndjson"}},
        ),
        ("POST", f"{API}/tasks/{TASK}/workers/victim/unqualify", {"json": {"reason": "mine now"}}),
        ("POST", f"{API}/tasks/{TASK}/worker-quality/apply", {}),
        ("PUT", f"{API}/tasks/{TASK}/members/oscar", {"json": {"role": "owner"}}),
        ("GET", f"{API}/rounds/{rid}/stats", {}),
    ]
    for method, url, kwargs in attacks:
        headers = {**kwargs.get("headers", {}), **oscar.headers}
        response = client.request(method, url, headers=headers, **{k: v for k, v in kwargs.items() if k != "headers"})
        assert response.status_code == 404, (method, url, response.text)
        message = response.json()["error"]["message"]
        if "/rounds/" in url:
            assert message == f"no round with id {rid}", message
        else:
            assert message == f"no task {TASK!r}; list tasks with GET /api/v1/tasks", message
    assert table_snapshot(app, *tables) == before
    # Nor does Oscar see the task or its round in any list; the crowd and Rita still do.
    assert client.get(f"{API}/tasks", headers=oscar.headers).json() == {"data": [], "count": 0}
    assert client.get(f"{API}/rounds/open", headers=oscar.headers).json() == {"data": [], "count": 0}
    for actor in (researcher, make_user("walt", "writer"), make_user("cora", "client")):
        assert [t["name"] for t in client.get(f"{API}/tasks", headers=actor.headers).json()["data"]] == [TASK]
        assert [r["id"] for r in client.get(f"{API}/rounds/open", headers=actor.headers).json()["data"]] == [rid]
    # Once Rita makes him a member, the same request goes through.
    response = client.put(f"{API}/tasks/{TASK}/members/oscar", json={"role": "member"}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    response = client.post(f"{API}/rounds/{rid}/status", json={"status": "validating"}, headers=oscar.headers)
    assert response.status_code == 200 and response.json()["status"] == "validating", response.text


# --- writers: nobody else's drafts ----------------------------------------------------------


def test_a_writer_never_sees_another_writers_assignment_or_attempts(
    client: Any, make_user: Any, stub_model: Any
) -> None:
    root = make_user("root", "researcher")
    round_ = open_round(
        client,
        root,
        example_yaml(TASK, onboarding_quiz=None),
        stub_model.url,
        [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(5)],
    )
    wendy, walt = make_user("wendy", "writer"), make_user("walt", "writer")
    assignment = client.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=wendy.headers).json()
    attempt = client.post(
        f"{API}/assignments/{assignment['id']}/attempts", json={"text": SECRET_TEXT}, headers=wendy.headers
    ).json()
    assert attempt["text"] == SECRET_TEXT
    prompt_text = assignment["prompt"]["text"]
    attempts = [
        ("GET", f"{API}/assignments/{assignment['id']}", None),
        ("POST", f"{API}/assignments/{assignment['id']}/attempts", {"text": "Walt writes into Wendy's task."}),
        ("POST", f"{API}/attempts/{attempt['id']}/confirmation", {"agrees": True}),
        ("POST", f"{API}/assignments/{assignment['id']}/example", {"attempt_id": attempt["id"]}),
        ("POST", f"{API}/assignments/{assignment['id']}/inspect", {"text": "Walt probes Wendy's task here."}),
        ("POST", f"{API}/assignments/{assignment['id']}/skip", None),
    ]
    for method, url, body in attempts:
        response = client.request(method, url, json=body, headers=walt.headers)
        assert response.status_code in (403, 404), (method, url, response.status_code, response.text)
        assert SECRET_TEXT not in response.text and "secret draft" not in response.text
        assert prompt_text not in response.text
    # Wendy's assignment is untouched: still active, one try used, one attempt.
    mine = client.get(f"{API}/assignments/{assignment['id']}", headers=wendy.headers).json()
    assert mine["status"] == "active" and mine["tries_used"] == 1 and len(mine["attempts"]) == 1


def test_a_writer_cannot_read_the_dataset_or_the_report(built, client: Any, make_user: Any) -> None:
    """Even when the round is built and the files exist."""
    reader = make_user("cora", "client")
    writer, validator = built["writer"], make_user("vic", "validator")
    for suffix in ["dataset", "dataset?split=test&format=csv", "report", "report?format=markdown"]:
        url = f"{API}/tasks/{TASK}/rounds/1/{suffix}"
        assert client.get(url, headers=reader.headers).status_code == 200
        for actor in (writer, validator):
            response = client.get(url, headers=actor.headers)
            assert response.status_code == 403, (suffix, response.text)
            assert response.json()["error"]["code"] == "forbidden"
            assert "example_id" not in response.text and "gold" not in response.text
        assert client.get(url).status_code == 401


# --- validators: the text only, never the answers ----------------------------------------------

# label_names: the display names of the task's labels (the same for every validator; no example's answer)
BATCH_KEYS = {"round_id", "task", "validation_labels", "label_names", "multi_label", "data", "count"}
ITEM_KEYS = {"item_id", "text", "target_span"}


@pytest.fixture(scope="module")
def sarcasm_model() -> Any:
    server = ThreadedServer(create_stub_app(["sarcastic", "not_sarcastic"]), free_port()).start()
    yield server
    server.stop()


def test_a_validators_batch_carries_no_label_prediction_or_other_labels(
    client: Any, make_user: Any, sarcasm_model: Any
) -> None:
    """iSarcasm: the writer's intended label, explanation and rephrase, the model's prediction,
    and the labels other validators gave are all on the server; the batch shows the text only."""
    root = make_user("root", "researcher")
    round_ = open_round(
        client,
        root,
        example_yaml("isarcasm", onboarding_quiz=None),
        sarcasm_model.url,
        ["Mondays are the best day of the week for meetings."],
        target_label_mode="writer_choice",
    )
    writer = make_user("wes", "writer")
    extras = {
        "intended_label": "sarcastic",
        "explanation": "EXPLANATION-MARKER nobody likes Monday meetings.",
        "rephrase": "REPHRASE-MARKER I do not like meetings on Monday.",
        "category": "sarcasm",
    }
    assignment = client.post(
        f"{API}/rounds/{round_['id']}/assignments", json={"target_label": "sarcastic"}, headers=writer.headers
    ).json()
    attempt = client.post(
        f"{API}/assignments/{assignment['id']}/attempts",
        json={"text": "Oh great, another meeting at seven on a Monday morning."},
        headers=writer.headers,
    ).json()
    assert attempt["status"] == "scored" and attempt["prediction"], attempt
    if attempt["fooled"]:
        client.post(f"{API}/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers)
    example = client.post(
        f"{API}/assignments/{assignment['id']}/example",
        json={"attempt_id": attempt["id"], "extras": extras},
        headers=writer.headers,
    )
    assert example.status_code == 201, example.text
    first, second = make_user("val1", "validator"), make_user("val2", "validator")
    batch = client.get(f"{API}/rounds/{round_['id']}/validation-batch", headers=first.headers).json()
    assert served_examples(client, batch) == [example.json()["id"]]
    response = client.post(
        f"{API}/validation-items/{batch['data'][0]['item_id']}/validations",
        json={"label": "not_sarcastic"},
        headers=first.headers,
    )
    assert response.status_code == 201, response.text
    response = client.get(f"{API}/rounds/{round_['id']}/validation-batch", headers=second.headers)
    assert response.status_code == 200
    batch = response.json()
    assert set(batch) == BATCH_KEYS
    assert len(batch["data"]) == 1
    for item in batch["data"]:
        assert set(item) == ITEM_KEYS, item
        assert item["target_span"] is None
    body = response.text
    for secret in (
        "EXPLANATION-MARKER",
        "REPHRASE-MARKER",
        "intended_label",
        "prediction",
        "probabilities",
        "fooled",
        "gold",
        "target_label",
        "validations",
        "label_counts",
        "wes",
        "val1",
    ):
        assert secret not in body, secret


def test_a_validator_cannot_label_their_own_example(client: Any, app: Any, make_user: Any, stub_model: Any) -> None:
    root = make_user("root", "researcher")
    round_ = open_round(
        client,
        root,
        example_yaml(TASK, onboarding_quiz=None),
        stub_model.url,
        [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(5)],
    )
    both = make_user("bo", "writer", "validator")
    example = _write_example(client, both, round_["id"], WRITER_TEXT)
    batch = client.get(f"{API}/rounds/{round_['id']}/validation-batch", headers=both.headers).json()
    assert example["id"] not in served_examples(client, batch)
    response = client.post(
        f"{API}/examples/{example['id']}/validations", json={"label": "neutral"}, headers=both.headers
    )
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden", response.text
    with app.state.engine.connect() as connection:
        assert connection.execute(text("SELECT COUNT(*) FROM validations")).scalar_one() == 0


# --- tokens ----------------------------------------------------------------------------------


def test_tokens_are_stored_hashed_and_a_revoked_token_is_refused(client: Any, app: Any, make_user: Any) -> None:
    admin = make_user("ada", "admin")
    writer = make_user("wim", "writer")
    issued = [writer.token, admin.token]
    for name in ("laptop", "script"):
        response = client.post(f"{API}/users/wim/tokens", json={"name": name}, headers=writer.headers)
        assert response.status_code == 201
        issued.append(response.json()["token"])
    login_user = client.post(
        f"{API}/users",
        json={"username": "lou", "roles": ["validator"], "password": "correct-horse"},
        headers=admin.headers,
    )
    assert login_user.status_code == 201
    login = client.post(f"{API}/auth/login", json={"username": "lou", "password": "correct-horse"})
    issued.append(login.json()["token"])
    # No table, no text column, holds a plain token (the 10-character display prefix is no token).
    with app.state.engine.connect() as connection:
        for table in Base.metadata.sorted_tables:
            columns = [
                c.name
                for c in table.columns
                if isinstance(c.type, (String, Text))
                or c.name in ("details", "definition", "extras", "params", "result")
            ]
            for row in connection.execute(table.select()):
                values = " ".join(str(row._mapping[c]) for c in columns)
                for token in issued:
                    assert token not in values, (table.name, token[:10])
        ids = dict(connection.execute(text("SELECT token_hash, id FROM api_tokens")).all())
    assert {hashlib.sha256(token.encode()).hexdigest() for token in issued} <= set(ids)
    # Revoke the writer's laptop token: it is refused from then on; the others still work.
    laptop = issued[2]
    token_id = ids[hashlib.sha256(laptop.encode()).hexdigest()]
    assert client.get(f"{API}/me", headers={"Authorization": f"Bearer {laptop}"}).status_code == 200
    # Another non-admin user cannot revoke it (and does not learn it exists).
    response = client.delete(f"{API}/tokens/{token_id}", headers=make_user("val", "validator").headers)
    assert response.status_code == 404
    assert client.get(f"{API}/me", headers={"Authorization": f"Bearer {laptop}"}).status_code == 200
    response = client.delete(f"{API}/tokens/{token_id}", headers=writer.headers)
    assert response.status_code == 200 and response.json()["token"] is None
    for url in (f"{API}/me", f"{API}/tasks", f"{API}/rounds/open"):
        refused = client.get(url, headers={"Authorization": f"Bearer {laptop}"})
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["code"] == "unauthorized"
        assert refused.headers.get("www-authenticate") == "Bearer"
    assert client.get(f"{API}/me", headers=writer.headers).status_code == 200
    for bad in (
        "",
        "Bearer",
        "Bearer ",
        f"Basic {laptop}",
        f"Bearer {laptop}x",
        "Bearer dl_" + "A" * 43,
        f"Bearer {laptop[:-1]}",
    ):
        response = client.get(f"{API}/me", headers={"Authorization": bad})
        assert response.status_code == 401, (bad, response.text)
