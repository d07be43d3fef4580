"""Structured input is bounded (issue 12, point 8): JSON bodies, NDJSON prompt files and task
YAML nested deeper than DYNALOOP_MAX_INPUT_DEPTH, YAML aliases (billion laughs), YAML with a
key given twice and YAML with too many values are refused with a 422 that names the limit,
nothing is written, and the server keeps answering on the same connection.

The attacks run over a real socket (uvicorn in a thread): before these bounds a few thousand
levels of nesting raised RecursionError in the handler (a 500, or a bare 400 from FastAPI's
body parser).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

from services.structured_input import json_depth, load_yaml
from services.taskdef import TaskDefinitionError, example_paths, parse_task_definition
from tests.conftest import Actor, example_yaml, open_round, register_model_server
from tests.stub_model_server import ThreadedServer
from tests.test_bad_input import PROMPTS, assert_error, unchanged

API = "/api/v1"
LIMIT = 32  # the default of DYNALOOP_MAX_INPUT_DEPTH
DEEP = 5000  # far past Python's recursion limit (1000)


def nested_json(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def nested_objects(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.fixture
def http(app_server: ThreadedServer) -> Iterator[httpx.Client]:
    # One connection: a dropped connection would show as an error on the next request.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(base_url=app_server.url, timeout=30.0, limits=limits) as client:
        yield client


@pytest.fixture
def dynasent(http: httpx.Client, app: Any, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    server = register_model_server(app, stub_model.url)  # as an admin would
    return open_round(http, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), server, PROMPTS)


def still_answers(http: httpx.Client, actor: Actor) -> None:
    response = http.get(f"{API}/me", headers=actor.headers)
    assert response.status_code == 200, response.text


def assert_too_deep(response: Any, *fragments: str) -> dict[str, Any]:
    return assert_error(response, 422, "invalid", "nested", f"the limit is {LIMIT}", *fragments)


# --- JSON bodies ---------------------------------------------------------------------------


def json_body_requests(
    writer: Actor, researcher: Actor, admin: Actor, assignment_id: int, task: str
) -> list[tuple[str, Actor, str]]:
    """(url, actor, body template with {deep}) for endpoints whose bodies FastAPI parses as JSON.
    Each template adds at least one level around {deep}."""
    return [
        (f"{API}/assignments/{assignment_id}/attempts", writer, '{"text": "The soup was fine today.", "x": {deep}}'),
        (f"{API}/assignments/{assignment_id}/example", writer, '{"attempt_id": 1, "extras": {"note": {deep}}}'),
        (f"{API}/tasks/{task}/jobs", researcher, '{"kind": "train", "params": {"data": {deep}}}'),
        (f"{API}/users", admin, '{"username": "mallory", "roles": {deep}}'),
        (f"{API}/tasks", researcher, '{"definition_yaml": {deep}}'),
    ]


@pytest.mark.parametrize("depth", [DEEP, LIMIT], ids=["5000-deep", "just-over-the-limit"])
@pytest.mark.parametrize("content_type", ["application/json", "application/merge-patch+json", None])
def test_deep_json_bodies_are_refused_naming_the_limit(
    http: httpx.Client,
    app: FastAPI,
    make_user: Any,
    writer: Actor,
    researcher: Actor,
    dynasent: dict[str, Any],
    depth: int,
    content_type: str | None,
) -> None:
    admin = make_user("root", "admin")
    assignment = http.post(f"{API}/rounds/{dynasent['id']}/assignments", json={}, headers=writer.headers).json()
    for url, actor, template in json_body_requests(writer, researcher, admin, assignment["id"], "dynasent-r2"):
        for deep in (nested_json(depth), nested_objects(depth)):
            headers = dict(actor.headers)
            if content_type:
                headers["Content-Type"] = content_type
            with unchanged(app):
                response = http.post(url, content=template.replace("{deep}", deep).encode(), headers=headers)
                error = assert_too_deep(response, "the JSON body", "levels deep", "DYNALOOP_MAX_INPUT_DEPTH", "flatten")
            assert error["details"]["limit"] == LIMIT
            assert error["details"]["problems"] == [error["message"]]
            still_answers(http, writer)


def test_json_at_the_depth_limit_reaches_the_schema(
    http: httpx.Client, app: FastAPI, writer: Actor, dynasent: dict[str, Any]
) -> None:
    """The limit counts levels exactly: LIMIT levels pass the depth check (the schema then
    refuses the unknown field), and brackets inside strings do not count."""
    assignment = http.post(f"{API}/rounds/{dynasent['id']}/assignments", json={}, headers=writer.headers).json()
    url = f"{API}/assignments/{assignment['id']}/attempts"
    body = '{"text": "The soup was fine today.", "x": ' + nested_json(LIMIT - 1) + "}"
    with unchanged(app):
        response = http.post(url, content=body, headers={**writer.headers, "Content-Type": "application/json"})
        error = assert_error(response, 422, "invalid", "x: is not a known field")
    assert "nested" not in error["message"]
    text = "The soup was fine " + "[" * 200 + ' today "really" \\' + "{" * 200
    response = http.post(url, json={"text": text}, headers=writer.headers)
    assert response.status_code == 201, response.text


# --- NDJSON prompt files ---------------------------------------------------------------------


@pytest.mark.parametrize("depth", [DEEP, LIMIT + 1], ids=["5000-deep", "one-over-the-limit"])
def test_deep_ndjson_prompt_lines_are_refused_naming_line_and_limit(
    http: httpx.Client, app: FastAPI, researcher: Actor, writer: Actor, dynasent: dict[str, Any], depth: int
) -> None:
    lines = [
        json.dumps({"text": "A perfectly fine prompt sentence."}),
        '{"text": "A prompt with deep metadata.", "meta": ' + nested_json(depth) + "}",
        '{"text": "Another fine prompt sentence.", "tags": ' + nested_objects(depth) + "}",
    ]
    with unchanged(app):
        response = http.post(
            f"{API}/rounds/{dynasent['id']}/prompts",
            content="\n".join(lines).encode(),
            headers={**researcher.headers, "Content-Type": "application/x-ndjson"},
        )
        error = assert_too_deep(response, "2 row(s)", f"line 2 is nested {depth + 1} levels deep", "line 3 is nested")
    assert "DYNALOOP_MAX_INPUT_DEPTH" in error["message"]
    assert [line.split(" is ")[0] for line in error["details"]["errors"]] == ["line 2", "line 3"]
    still_answers(http, writer)


# --- task YAML -------------------------------------------------------------------------------

BILLION_LAUGHS = """\
name: laughs
title: Laughs
family: single_label
labels: [positive, negative]
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
description: *h
"""


def yaml_cases() -> list[Any]:
    base = example_yaml("dynasent-r2", onboarding_quiz=None)
    return [
        pytest.param(
            base + "description: " + nested_json(DEEP, "x") + "\n",
            ["nested more than 32 levels", "DYNALOOP_MAX_INPUT_DEPTH", "line"],
            id="flow-5000-deep",
        ),
        pytest.param(
            base + "description:\n" + "- " * DEEP + "x\n",
            ["nested more than 32 levels", "line"],
            id="block-5000-deep",
        ),
        pytest.param(
            base + "description: " + nested_json(LIMIT, "x") + "\n",
            ["nested more than 32 levels"],
            id="one-over-the-limit",
        ),
        pytest.param(BILLION_LAUGHS, ["aliases (*a) are not accepted", "line 6"], id="billion-laughs"),
        pytest.param(
            base + "description: [" + ", ".join(["x"] * 20_000) + "]\n",
            ["more than 10000 values", "DYNALOOP_MAX_YAML_NODES"],
            id="too-many-values",
        ),
        pytest.param(
            base.replace("title:", "labels: [positive, negative]\ntitle:", 1),
            ["the key 'labels' appears twice", "first at line"],
            id="duplicate-top-level-key",
        ),
    ]


@pytest.mark.parametrize(("yaml_text", "fragments"), yaml_cases())
@pytest.mark.parametrize("content_type", ["application/yaml", "application/json"])
def test_hostile_task_yaml_is_refused(
    http: httpx.Client, app: FastAPI, researcher: Actor, yaml_text: str, fragments: list[str], content_type: str
) -> None:
    body = json.dumps({"definition_yaml": yaml_text}) if content_type == "application/json" else yaml_text
    with unchanged(app):
        response = http.post(
            f"{API}/tasks", content=body.encode(), headers={**researcher.headers, "Content-Type": content_type}
        )
        error = assert_error(response, 422, "invalid", *fragments)
    assert any("YAML" in problem for problem in error["details"]["problems"]), error
    still_answers(http, researcher)


def test_duplicate_key_in_a_nested_mapping_names_key_and_lines() -> None:
    text = (
        "name: tiny\ntitle: Tiny\nfamily: single_label\nlabels: [positive, negative]\n"
        "constraints:\n  min_chars: 10\n  max_chars: 90\n  min_chars: 20\n"
    )
    with pytest.raises(TaskDefinitionError) as caught:
        parse_task_definition(text)
    assert caught.value.problems == [
        "YAML at line 8, column 3: the key 'min_chars' appears twice in one mapping (first at line 6); keep one"
    ]


def test_every_shipped_task_example_loads_within_the_bounds() -> None:
    for path in example_paths():
        text = path.read_text(encoding="utf-8")
        assert load_yaml(text) == yaml.safe_load(text)


# --- the scanner itself ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ("[]", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('["[[[[", "\\"[[", {"k]": "}"}]', 2),
        (nested_json(DEEP), DEEP),
        # Not JSON: json.loads stops at the first unmatched "]" and never reaches the "[".
        ("]]][[", 0),
    ],
)
def test_json_depth_counts_brackets_outside_strings(text: str, depth: int) -> None:
    assert json_depth(text) == depth


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.sampled_from('ab[]{}"\\ :,\u00e9\u1230')),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=40,
)


def depth_of(value: Any) -> int:
    """Nesting depth of a decoded JSON value (recursive: only for the small values generated here)."""
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None, derandomize=True)
@given(JSON_VALUES, st.booleans())
def test_json_depth_agrees_with_the_parsed_value(value: Any, ascii_only: bool) -> None:
    """Strings full of brackets, quotes and backslashes, non-ASCII text: the scan of the raw
    text finds the depth of the value json.loads builds."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert json_depth(text) == depth_of(value)
    assert json_depth(text.encode()) == depth_of(value)


def test_yaml_at_the_limits_loads() -> None:
    assert load_yaml("a: " + nested_json(LIMIT - 1, "x")) == {"a": json.loads(nested_json(LIMIT - 1, '"x"'))}
    assert len(load_yaml("[" + ", ".join(["x"] * 9_999) + "]")) == 9_999
    assert load_yaml("a: &anchor 1\nb: 2\n") == {"a": 1, "b": 2}  # an anchor without an alias is harmless


def test_the_limits_come_from_the_settings(settings: Any, researcher: Actor, stub_model: ThreadedServer) -> None:
    """DYNALOOP_MAX_INPUT_DEPTH and DYNALOOP_MAX_YAML_NODES reach the middleware and both parsers."""
    from fastapi.testclient import TestClient

    from dynaloop.api.app import create_app

    strict = create_app(settings.model_copy(update={"max_input_depth": 4, "max_yaml_nodes": 100}))
    with TestClient(strict) as client:
        response = client.post(
            f"{API}/users", json={"username": "x", "roles": [[[[["writer"]]]]]}, headers=researcher.headers
        )
        assert_error(response, 422, "invalid", "nested 6 levels deep", "the limit is 4")
        response = client.post(
            f"{API}/tasks",
            content=example_yaml("dynasent-r2", onboarding_quiz=None, domain=[[[["x"]]]]).encode(),
            headers={**researcher.headers, "Content-Type": "application/yaml"},
        )
        assert_error(response, 422, "invalid", "nested more than 4 levels", "the limit is 4")
        response = client.post(
            f"{API}/tasks",
            content=example_yaml("dynasent-r2", onboarding_quiz=None, labels=[f"l{i}" for i in range(120)]).encode(),
            headers={**researcher.headers, "Content-Type": "application/yaml"},
        )
        assert_error(response, 422, "invalid", "more than 100 values", "DYNALOOP_MAX_YAML_NODES")
        round_ = open_round(
            client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS
        )
        response = client.post(
            f"{API}/rounds/{round_['id']}/prompts",
            content=b'{"text": "A fine prompt sentence.", "m": [[[[1]]]]}',
            headers={**researcher.headers, "Content-Type": "application/x-ndjson"},
        )
        assert_error(response, 422, "invalid", "line 1 is nested 5 levels deep", "the limit is 4")
