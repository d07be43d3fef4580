"""The API's OpenAPI document describes what it answers: every JSON success response is a named
model, each route module has one tag, and the typed answers are, byte for byte as JSON, what
the domain functions behind them build (number types included: 1 is not 1.0)."""

from __future__ import annotations

import importlib
import json
import pkgutil
from typing import Any

import pytest
import yaml
from fastapi.routing import APIRoute
from sqlalchemy import select

import dynaloop.api.routes
from rounds.build.dashboard import round_plot_data
from services.db.models import Example, RoundBuild
from services.domain import round_lifecycle, validating
from services.taskdef import example_path
from tests.built_round import write_and_label
from tests.conftest import example_yaml, free_port, label_example, open_round
from tests.stub_model_server import ThreadedServer, create_stub_app

API = "/api/v1"


def same_json(actual: Any, expected: Any) -> bool:
    """Equal as JSON documents: keys, values and number types (1 and 1.0 differ)."""
    return json.dumps(actual, sort_keys=True) == json.dumps(json.loads(json.dumps(expected)), sort_keys=True)


# --- the document --------------------------------------------------------------------------


def _success_schemas(schema: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    found = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith("2"):
                    content = response.get("content", {})
                    if "application/json" in content:
                        found.append((method.upper(), path, status, content["application/json"].get("schema", {})))
    return found


def test_every_json_success_response_is_a_named_model(app: Any) -> None:
    """No untyped object responses: a `$ref` to a model, or a list of them."""
    untyped = [
        f"{method} {path} {status}: {json.dumps(schema)[:80]}"
        for method, path, status, schema in _success_schemas(app.openapi())
        if "$ref" not in schema and not (schema.get("type") == "array" and "$ref" in schema.get("items", {}))
    ]
    assert not untyped, "\n".join(untyped)


def _schemas_under(schema: Any, components: dict[str, Any], seen: set[str]) -> None:
    """The names of the component schemas ``schema`` refers to, directly or through others."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if name not in seen:
                seen.add(name)
                _schemas_under(components[name], components, seen)
        for value in schema.values():
            _schemas_under(value, components, seen)
    elif isinstance(schema, list):
        for value in schema:
            _schemas_under(value, components, seen)


def test_every_field_an_answer_always_has_is_required_in_its_schema(app: Any) -> None:
    """A client generated from the document types a field that is not ``required`` as one that
    may be missing. Every answer's field is sent, null or not (the models are serialised whole),
    so each is required, nullable where it may be null; only the build's and the report's
    answers leave out what a task's family has no figure for (``response_model_exclude_unset``),
    and their schemas say so. Error answers included."""
    document = app.openapi()
    components = document["components"]["schemas"]
    from dynaloop.api.routes import ROUTERS

    partial_routes = {
        (method, API + route.path_format)
        for entry in ROUTERS
        for route in entry.router.routes
        if isinstance(route, APIRoute) and route.response_model_exclude_unset
        for method in route.methods or ()
    }
    assert ("POST", f"{API}/rounds/{{round_id}}/build") in partial_routes
    whole: set[str] = set()
    partial: set[str] = set()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                content = response.get("content", {}).get("application/json")
                if content is not None:
                    # Only a route's own answer leaves fields out; its errors are whole.
                    answer = status.startswith("2") and (method.upper(), path) in partial_routes
                    target = partial if answer else whole
                    _schemas_under(content.get("schema", {}), components, target)
    assert {"AttemptPublic", "ErrorBody", "JobPublic", "RoundPublic"} <= whole  # the walk finds them
    optional = {
        name: sorted(set(components[name].get("properties", {})) - set(components[name].get("required", [])))
        for name in sorted(whole - partial)
    }
    assert not {name: fields for name, fields in optional.items() if fields}


def test_files_and_markdown_document_their_media_types(app: Any) -> None:
    paths = app.openapi()["paths"]
    dataset = paths[f"{API}/tasks/{{task_name}}/rounds/{{number}}/dataset"]["get"]["responses"]["200"]["content"]
    assert set(dataset) == {"application/x-ndjson", "text/csv", "application/vnd.apache.parquet"}
    report = paths[f"{API}/tasks/{{task_name}}/rounds/{{number}}/report"]["get"]["responses"]["200"]["content"]
    assert set(report) == {"application/json", "text/markdown"}


def test_one_tag_per_route_module() -> None:
    tags: dict[str, str] = {}
    for module_info in pkgutil.iter_modules(dynaloop.api.routes.__path__):
        module = importlib.import_module(f"dynaloop.api.routes.{module_info.name}")
        module_tags = {tag for route in module.router.routes if isinstance(route, APIRoute) for tag in route.tags}
        assert len(module_tags) == 1, (module_info.name, module_tags)
        for route in module.router.routes:
            assert isinstance(route, APIRoute) and len(route.tags) == 1, (module_info.name, route.path)
        tags[module_info.name] = str(module_tags.pop())
    assert len(set(tags.values())) == len(tags), tags
    assert tags["models"] == "models" and tags["jobs"] == "jobs"


def test_models_and_plot_data_are_not_jobs(app: Any) -> None:
    paths = app.openapi()["paths"]
    assert paths[f"{API}/tasks/{{task_name}}/models"]["get"]["tags"] == ["models"]
    assert paths[f"{API}/rounds/{{round_id}}/plot-data"]["get"]["tags"] == ["rounds"]


# --- the typed answers are what the domain builds ----------------------------------------------


def _stored_report(app: Any, round_id: int) -> tuple[int, dict[str, Any]]:
    with app.state.sessionmaker() as session:
        build = session.scalars(
            select(RoundBuild).where(RoundBuild.round_id == round_id).order_by(RoundBuild.id.desc())
        ).first()
        assert build is not None
        return build.id, build.report


def assert_report_is_the_stored_one(client: Any, headers: dict[str, str], task: str, round_: dict[str, Any]) -> None:
    build_id, report = _stored_report(client.app, round_["id"])
    response = client.get(f"{API}/tasks/{task}/rounds/{round_['number']}/report", headers=headers)
    assert response.status_code == 200, response.text
    assert same_json(response.json(), {"build_id": build_id, **report})
    assert list(response.json()) == ["build_id", *report]


def test_a_built_rounds_answers_are_the_domains(built, client, app) -> None:
    researcher, round_ = built["researcher"], built["round"]
    build_id, report = _stored_report(app, round_["id"])
    assert same_json(
        built["build"], {"build_id": build_id, "round": round_["number"], "task": "dynasent-r2", "report": report}
    )
    assert_report_is_the_stored_one(client, researcher.headers, "dynasent-r2", round_)
    stats = client.get(f"{API}/rounds/{round_['id']}/stats", headers=researcher.headers)
    plot = client.get(f"{API}/rounds/{round_['id']}/plot-data", headers=researcher.headers)
    example_id = built["plan"][0][0]["id"]
    record = client.get(f"{API}/examples/{example_id}", headers=researcher.headers)
    with app.state.sessionmaker() as session:
        round_row = round_lifecycle.get_round(session, round_["id"])
        assert same_json(stats.json(), round_lifecycle.round_stats(session, round_row))
        assert same_json(plot.json(), round_plot_data(session, round_row))
        example = session.get(Example, example_id)
        assert example is not None
        assert same_json(record.json(), validating.example_record(session, example))
    assert list(stats.json()["examples"]) == [
        "submitted",
        "fooled",
        "prompt",
        "no_prompt",
        "validating",
        "validated",
        "dropped",
        "by_target_label",
        "awaiting_reannotation",
        "awaiting_reannotation_no_new_validator",
    ]


def test_multi_label_report_is_the_stored_one(client, researcher, make_user, stub_multi_label_model) -> None:
    round_ = open_round(
        client,
        researcher,
        example_yaml("ethioemo-amharic", onboarding_quiz=None),
        stub_multi_label_model.url,
        [f"Prompt {i}: ስለ ምግቡ አስተያየት" for i in range(6)],
        target_label_mode="writer_choice",
    )
    validators = [make_user(f"ev{i}", "validator") for i in range(3)]
    plan: list[tuple[Any, str, list[int] | None, list[Any]]] = [
        (["joy"], f"a joy filled day {i} ደስታ", None, [["joy"], ["joy"], ["joy", "surprise"]]) for i in range(2)
    ]
    plan += [
        (["anger"], f"an anger filled day {i} ቁጣ", None, [["anger"], ["anger", "disgust"], ["anger"]]) for i in range(2)
    ]
    write_and_label(client, make_user("amara", "writer"), validators, round_["id"], plan)
    client.post(f"{API}/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    built_now = client.post(f"{API}/rounds/{round_['id']}/build", json={"seed": 1}, headers=researcher.headers)
    assert built_now.status_code == 201, built_now.text
    assert "mean_jaccard" in built_now.json()["report"]["agreement"]
    assert "fleiss_kappa" not in built_now.json()["report"]["agreement"]  # absent, not null
    assert_report_is_the_stored_one(client, researcher.headers, "ethioemo-amharic", round_)


def test_intended_sarcasm_report_is_the_stored_one(client, researcher, make_user, stub_model) -> None:
    """iSarcasm's report carries the intended-vs-perceived comparison (iSarcasm §5.2)."""
    server = ThreadedServer(create_stub_app(["sarcastic", "not_sarcastic"]), free_port()).start()
    try:
        round_ = open_round(
            client,
            researcher,
            example_yaml("isarcasm", onboarding_quiz=None),
            server.url,
            [f"Prompt {i}: Mondays are the best day for meetings." for i in range(6)],
            target_label_mode="writer_choice",
        )
        writer = make_user("wes", "writer")
        validators = [make_user(f"sv{i}", "validator") for i in range(3)]
        plan = [
            ("sarcastic", "sarcastic"),
            ("sarcastic", "sarcastic"),
            ("sarcastic", "not_sarcastic"),
            ("not_sarcastic", "not_sarcastic"),
            ("not_sarcastic", "not_sarcastic"),
        ]
        for i, (target, perceived) in enumerate(plan):
            assignment = client.post(
                f"{API}/rounds/{round_['id']}/assignments", json={"target_label": target}, headers=writer.headers
            ).json()
            attempt = client.post(
                f"{API}/assignments/{assignment['id']}/attempts",
                json={"text": f"Oh wonderful, meeting number {i} at seven on a Monday."},
                headers=writer.headers,
            ).json()
            if attempt["fooled"]:
                client.post(
                    f"{API}/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers
                )
            extras = (
                {
                    "intended_label": target,
                    "explanation": "Nobody likes early meetings.",
                    "rephrase": "I do not like early meetings.",
                    "category": "sarcasm",
                }
                if target == "sarcastic"
                else {"intended_label": target}
            )
            example = client.post(
                f"{API}/assignments/{assignment['id']}/example",
                json={"attempt_id": attempt["id"], "extras": extras},
                headers=writer.headers,
            )
            assert example.status_code == 201, example.text
            for validator in validators:
                assert label_example(client, validator, example.json()["id"], perceived).status_code == 201
        client.post(f"{API}/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
        built_now = client.post(
            f"{API}/rounds/{round_['id']}/build",
            json={"chance": False, "max_dev_test_share": 1.0},
            headers=researcher.headers,
        )
        assert built_now.status_code == 201, built_now.text
        assert built_now.json()["report"]["intended_vs_perceived"]["n_examples"] == len(plan)
        assert_report_is_the_stored_one(client, researcher.headers, "isarcasm", round_)
    finally:
        server.stop()


def test_quiz_worker_quality_and_inspect_answers(client, app, researcher, make_user, stub_model) -> None:
    round_ = open_round(client, researcher, example_yaml("dynasent-r2"), stub_model.url, ["The soup was fine."])
    writer = make_user("wes", "writer")
    quiz = client.get(f"{API}/tasks/dynasent-r2/quiz", headers=writer.headers)
    definition = yaml.safe_load(example_path("dynasent-r2").read_text(encoding="utf-8"))["onboarding_quiz"]
    questions, allowed = definition["questions"], definition.get("max_attempts", 5)
    assert same_json(
        quiz.json(),
        {
            "required": True,
            "passed": False,
            "attempts_used": 0,
            "attempts_left": allowed,
            "questions": [{"text": q["text"], "options": q["options"]} for q in questions],
        },
    )
    answers = [str(q["answer"]) for q in questions]
    wrong = [*answers[:1], next(o for o in questions[1]["options"] if o != answers[1]), *answers[2:]]
    failed = client.post(f"{API}/tasks/dynasent-r2/quiz/attempts", json={"answers": wrong}, headers=writer.headers)
    assert same_json(
        failed.json(),
        {
            "passed": False,
            "attempts_used": 1,
            "attempts_left": allowed - 1,
        },
    )
    unqualified = client.post(
        f"{API}/tasks/dynasent-r2/workers/wes/unqualify", json={"reason": "test"}, headers=researcher.headers
    )
    assert same_json(unqualified.json(), {"username": "wes", "qualified": False, "labels_excluded": 0})
    requalified = client.post(f"{API}/tasks/dynasent-r2/workers/wes/requalify", headers=researcher.headers)
    assert same_json(requalified.json(), {"username": "wes", "qualified": True, "labels_restored": 0})
    assert client.post(
        f"{API}/tasks/dynasent-r2/quiz/attempts", json={"answers": answers}, headers=writer.headers
    ).json()["passed"]
    assignment = client.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()
    inspected = client.post(
        f"{API}/assignments/{assignment['id']}/inspect", json={"text": "The soup was great."}, headers=writer.headers
    )
    # The conftest stub offers no attributions: a documented 503, nothing stored.
    assert inspected.status_code == 503, inspected.text
    assert inspected.json()["error"]["code"] == "model_unavailable"


@pytest.fixture
def model_with_inspect() -> Any:
    stub = create_stub_app(["positive", "negative", "neutral"])

    @stub.post("/inspect")
    def inspect(body: dict[str, Any]) -> dict[str, Any]:
        if body["text"].startswith("Broken"):
            return {"tokens": ["not", "pairs"]}
        return {"label": body.get("label"), "tokens": [{"token": w, "score": 0.25} for w in body["text"].split()]}

    server = ThreadedServer(stub, free_port()).start()
    yield server
    server.stop()


def test_inspect_answers_label_and_token_scores(client, researcher, make_user, model_with_inspect) -> None:
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        model_with_inspect.url,
        ["The soup was fine."],
    )
    writer = make_user("wes", "writer")
    assignment = client.post(f"{API}/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()
    url = f"{API}/assignments/{assignment['id']}/inspect"
    inspected = client.post(url, json={"text": "The soup was great."}, headers=writer.headers)
    assert inspected.status_code == 200, inspected.text
    assert same_json(
        inspected.json(),
        {
            "label": assignment["target_label"][0],
            "tokens": [{"token": w, "score": 0.25} for w in ["The", "soup", "was", "great."]],
        },
    )
    broken = client.post(url, json={"text": "Broken attributions here."}, headers=writer.headers)
    assert broken.status_code == 503 and "not token-score pairs" in broken.json()["error"]["message"], broken.text


def test_the_routers_order_decides_no_requests_route() -> None:
    """The crowd's routers come first in ``ROUTERS`` (matching is in that order, and theirs are
    most requests): no route's path, with any values in it, is matched first by another route
    in one order of the routers and not in the reverse order."""
    import re

    from starlette.routing import Match

    from dynaloop.api.routes import ROUTERS

    def first(included: list[Any], path: str, method: str) -> APIRoute | None:
        for entry in included:
            for route in entry.router.routes:
                scope = {"type": "http", "path": path, "method": method, "root_path": ""}
                if isinstance(route, APIRoute) and route.matches(scope)[0] == Match.FULL:
                    return route
        return None

    routes = [route for entry in ROUTERS for route in entry.router.routes if isinstance(route, APIRoute)]
    assert len(routes) > 50
    for route in routes:
        for method in route.methods:
            for value in ("1", "export", "abc_DEF-9"):
                path = re.sub(r"\{[^}]+\}", value, route.path)
                assert first(list(ROUTERS), path, method) is first(list(reversed(ROUTERS)), path, method), (
                    method,
                    path,
                )


def test_apps_share_the_api_routes_and_each_answers_from_its_own_state(settings: Any, tmp_path: Any) -> None:
    """Every app takes the same route objects (dynaloop/api/routes/__init__.py, ``api_routes``:
    an inclusion resolved once per process, not per app), yet each app answers from its own
    database and its own rate limits: a route reads the app's state at request time."""
    from fastapi.testclient import TestClient

    from dynaloop.api.app import API_PREFIX, create_app
    from dynaloop.api.routes import ROUTERS, api_routes
    from services.db.engine import session_scope
    from services.db.migrate import upgrade
    from services.domain import users

    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    upgrade(other_url)
    first = create_app(settings)
    second = create_app(
        settings.model_copy(
            update={"database_url": other_url, "data_dir": tmp_path / "other", "rate_limit_per_token": "2/minute"}
        )
    )
    try:
        shared = api_routes(API_PREFIX)
        assert len(shared) == len(ROUTERS)
        for app in (first, second):
            assert [route for route in app.routes if any(route is one for one in shared)] == list(shared)

        tokens = []
        for app in (first, second):
            with session_scope(app.state.sessionmaker) as session:
                user = users.create_user(session, None, "walt", ["writer"])
                tokens.append(users.issue_token(session, None, user)[1])
        with TestClient(first) as one, TestClient(second) as two:
            mine = {"Authorization": f"Bearer {tokens[0]}"}
            # The first app's token is unknown to the second app's database.
            assert one.get("/api/v1/me", headers=mine).status_code == 200
            assert two.get("/api/v1/me", headers=mine).status_code == 401
            # The second app's per-token limit (2 a minute) is its own: the first app keeps answering.
            theirs = {"Authorization": f"Bearer {tokens[1]}"}
            assert [two.get("/api/v1/assignments/1", headers=theirs).status_code for _ in range(3)] == [404, 404, 429]
            assert [one.get("/api/v1/assignments/1", headers=mine).status_code for _ in range(3)] == [404, 404, 404]
    finally:
        first.state.engine.dispose()
        second.state.engine.dispose()
