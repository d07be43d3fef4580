"""The web app's types (the ``TypedDict`` classes of ``frontend/client.py``) checked against the
API's OpenAPI document, so that a field renamed, retyped or made optional in ``dynaloop/api/schemas/``
fails here rather than on a page.

**How each type finds its schema.** Nothing is listed by hand: every ``ApiClient`` method whose
return annotation names a ``TypedDict`` is called once against a recording transport, which
gives the HTTP method and path the client really sends; the OpenAPI operation behind that path
names the success response's schema. A method that returns ``list[X]`` is compared with the
items of the answer's array, or of its ``{"data": [...], "count": n}`` envelope (the client
unwraps it). Nested ``TypedDict`` fields are compared with the schema of the field they type,
``$ref`` components followed. Every ``TypedDict`` of the module must be reached this way
(:func:`test_every_type_of_the_client_is_checked`), so a new one cannot be left out.

**What must agree.** A ``TypedDict`` may describe a subset of the schema's properties: a page
reads only some fields, and a field the API adds must not break the web app. Every key it
declares must match exactly:

- the key is a property of the schema;
- the key is required (not ``NotRequired``) exactly when the schema lists it in ``required``:
  a key the API may leave out must be ``NotRequired``, and one it always sends must not be;
- the value types agree: ``str``/``int``/``float``/``bool`` with ``string``/``integer``/
  ``number``/``boolean``; ``X | None`` with a schema that allows ``null`` (and only then);
  ``list[X]`` with ``array`` items; a nested ``TypedDict`` with an object schema; ``Literal``
  with ``enum`` (the same values); ``dict[str, X]`` with ``additionalProperties``. ``str`` may
  type an ``enum`` (the page does not branch on the values), and ``Any``, or ``dict[str, Any]``
  for an object, may type anything the page reads without looking inside.

**Requests.** The client's JSON bodies have no ``TypedDict``; every key a method sends (each
optional argument given) must be a field of the operation's request schema.

**Adding a type.** Write the ``TypedDict`` in ``frontend/client.py`` and make an ``ApiClient``
method return it (or a field of a checked type use it); run this module. A type no method
returns is reported by :func:`test_every_type_of_the_client_is_checked`; a mismatch names the
type, the key and the schema.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, Required, TypedDict

import httpx
import pytest

from dynaloop.api.app import API_PREFIX, create_app
from frontend import client as client_module
from frontend.client import ApiClient
from services.settings import Settings
from services.taskdef import TaskDefinition as TaskDefinitionModel

Schema = dict[str, Any]
COMPONENTS = "#/components/schemas/"
JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


# --- the checker ---------------------------------------------------------------------------


@dataclass
class Checker:
    """Compares Python type hints with the schemas of one OpenAPI document; collects the
    problems and the ``TypedDict`` classes it compared."""

    components: dict[str, Schema]
    #: Stand-ins for an object the document leaves untyped (``additionalProperties: true``): the
    #: TypedDict that describes it, and a :class:`Checker` whose components hold the schema its
    #: content follows under the TypedDict's name, or None where no schema in the repository
    #: describes it (:func:`untyped_in_the_document`).
    stand_ins: dict[Any, Checker | None] = field(default_factory=dict)
    #: Whether a key the schema requires may be ``NotRequired``: a record stored by an older
    #: version lacks the fields added since.
    stored_records: bool = False
    problems: list[str] = field(default_factory=list)
    checked: set[type] = field(default_factory=set)
    _compared: set[tuple[type, str]] = field(default_factory=set)

    def resolve(self, schema: Schema) -> tuple[Schema, str | None]:
        """The schema behind a ``$ref`` (and the component's name), or the schema itself."""
        ref = schema.get("$ref")
        if ref is None:
            return schema, None
        assert ref.startswith(COMPONENTS), ref
        name = ref.removeprefix(COMPONENTS)
        return self.components[name], name

    def problem(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    def variants(self, schema: Schema) -> list[Schema]:
        """The alternatives a schema allows: its ``anyOf``/``oneOf`` members (nested unions
        flattened), the types of an OpenAPI 3.1 ``type`` list, or the schema itself."""
        resolved, _ = self.resolve(schema)
        for keyword in ("anyOf", "oneOf"):
            if keyword in resolved:
                return [variant for member in resolved[keyword] for variant in self.variants(member)]
        if isinstance(resolved.get("type"), list):
            return [{**resolved, "type": one} for one in resolved["type"]]
        return [schema]

    def compare(self, hint: Any, schema: Schema, where: str) -> None:
        """``hint`` (a type hint of ``frontend/client.py``) against ``schema``."""
        if hint is Any:
            return
        hint_members = _union_members(hint)
        schema_variants = self.variants(schema)
        hint_nullable = type(None) in hint_members
        schema_nullable = any(_is_null(variant) for variant in schema_variants)
        if hint_nullable != schema_nullable:
            self.problem(
                where,
                "the API may answer null: type it `... | None`"
                if schema_nullable
                else "the API never answers null: drop `| None`",
            )
        hints = [member for member in hint_members if member is not type(None)]
        variants = [variant for variant in schema_variants if not _is_null(variant)]
        if len(hints) == 1 and len(variants) == 1:
            self.compare_one(hints[0], variants[0], where)
            return
        # A union (e.g. one label or a list of labels): each side's members matched by the other's.
        for member in hints:
            if not any(self.matches(member, variant, where) for variant in variants):
                self.problem(where, f"{_name(member)} matches none of the schema's {_describe_all(variants)}")
        for variant in variants:
            if not any(self.matches(member, variant, where) for member in hints):
                self.problem(where, f"the schema's {_describe(variant)} matches none of {_name(hint)}")

    def matches(self, hint: Any, schema: Schema, where: str) -> bool:
        """Whether ``hint`` agrees with ``schema``, without recording problems."""
        trial = Checker(self.components, self.stand_ins, self.stored_records)
        trial.compare_one(hint, schema, where)
        return not trial.problems

    def compare_one(self, hint: Any, schema: Schema, where: str) -> None:
        """One type (not a union) against one schema (not a union with null)."""
        schema, name = self.resolve(schema)
        origin = typing.get_origin(hint)
        if hint is Any:
            return
        if typing.is_typeddict(hint):
            self.compare_typed_dict(hint, schema, name or where)
        elif origin is Literal:
            allowed = schema.get("enum", [schema["const"]] if "const" in schema else None)
            if allowed is None or set(typing.get_args(hint)) != set(allowed):
                self.problem(where, f"{_name(hint)} differs from the schema's values {allowed}")
        elif origin is list:
            if schema.get("type") != "array":
                self.problem(where, f"list, but the schema is {_describe(schema)}")
            else:
                (item,) = typing.get_args(hint)
                self.compare(item, schema.get("items", {}), f"{where}[]")
        elif origin is dict or hint is dict:
            self.compare_mapping(hint, schema, where)
        elif hint in JSON_TYPES:
            if schema.get("type") != JSON_TYPES[hint]:
                self.problem(where, f"{hint.__name__}, but the schema is {_describe(schema)}")
        else:
            self.problem(where, f"the checker does not know the type {_name(hint)}")

    def compare_mapping(self, hint: Any, schema: Schema, where: str) -> None:
        """``dict[str, X]`` against an object schema: its ``additionalProperties`` and each of its
        named properties (a page that reads counts by name as a mapping) must be ``X``."""
        key_type, value_type = typing.get_args(hint) or (str, Any)
        if schema.get("type") != "object":
            self.problem(where, f"dict, but the schema is {_describe(schema)}")
            return
        if key_type is not str:
            self.problem(where, "JSON object keys are strings: type it dict[str, ...]")
        if value_type is Any:
            return
        values = schema.get("additionalProperties", False)
        properties = schema.get("properties", {})
        if values is True or (values is False and not properties):
            self.problem(where, f"dict[str, {_name(value_type)}], but the schema does not type its values")
            return
        if isinstance(values, dict):
            self.compare(value_type, values, f"{where}{{}}")
        for key, value_schema in properties.items():
            self.compare(value_type, value_schema, f"{where}.{key}")

    def compare_typed_dict(self, typed_dict: Any, schema: Schema, schema_name: str) -> None:
        """Every key of ``typed_dict``: present in ``schema``, required alike, typed alike."""
        self.checked.add(typed_dict)
        if (typed_dict, schema_name) in self._compared:
            return
        self._compared.add((typed_dict, schema_name))
        where = f"{typed_dict.__name__} (schema {schema_name})"
        properties = schema.get("properties")
        if schema.get("type") == "object" and properties is None and typed_dict in self.stand_ins:
            stand_in = self.stand_ins[typed_dict]
            if stand_in is not None:
                stand_in.compare_typed_dict(typed_dict, stand_in.components[typed_dict.__name__], typed_dict.__name__)
                self.problems += stand_in.problems
                self.checked |= stand_in.checked
            return
        if schema.get("type") != "object" or not isinstance(properties, dict):
            self.problem(where, f"a TypedDict, but the schema is {_describe(schema)}")
            return
        required = set(schema.get("required", []))
        declared_required = required_keys(typed_dict)
        for key, hint in typing.get_type_hints(typed_dict).items():
            at = f"{where}.{key}"
            if key not in properties:
                self.problem(at, f"not a field of the API's answer (its fields: {', '.join(sorted(properties))})")
                continue
            if key in declared_required and key not in required:
                self.problem(at, "the API may leave it out: make it NotRequired")
            elif key not in declared_required and key in required and not self.stored_records:
                self.problem(at, "the API always sends it: it must not be NotRequired")
            self.compare(hint, properties[key], at)


def _union_members(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def required_keys(typed_dict: Any) -> set[str]:
    """The keys a ``TypedDict`` requires. Read from the evaluated hints, not only from
    ``__required_keys__``: under ``from __future__ import annotations`` (frontend/client.py) a
    class's ``NotRequired[...]`` is still a string when Python 3.11 builds the class, so
    ``__required_keys__`` counts the key as required."""
    required = set()
    for key, hint in typing.get_type_hints(typed_dict, include_extras=True).items():
        marker = typing.get_origin(hint)
        if marker is Required or (marker is not NotRequired and key in typed_dict.__required_keys__):
            required.add(key)
    return required


def _is_null(schema: Schema) -> bool:
    return schema.get("type") == "null"


def _name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _describe(schema: Schema) -> str:
    if "enum" in schema:
        return f"enum {schema['enum']}"
    return str(schema.get("type") or schema.get("title") or "untyped")


def _describe_all(schemas: list[Schema]) -> str:
    return ", ".join(_describe(schema) for schema in schemas) or "nothing"


# --- the checker, attacked -------------------------------------------------------------------


ITEM_SCHEMAS: dict[str, Schema] = {
    "Colour": {"type": "string", "enum": ["red", "green"]},
    "Item": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "score": {"type": "number"},
            "colour": {"$ref": f"{COMPONENTS}Colour"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "part": {"$ref": f"{COMPONENTS}Part"},
            "origins": {"$ref": f"{COMPONENTS}Origins"},
            "span": {"anyOf": [{"type": "object", "additionalProperties": True}, {"type": "null"}]},
        },
        "required": ["id", "name", "note", "score", "colour", "tags", "counts", "part", "origins", "span"],
    },
    "Origins": {
        "type": "object",
        "properties": {"written": {"type": "integer"}, "imported": {"type": "integer"}},
        "required": ["written", "imported"],
    },
    "Part": {
        "type": "object",
        "properties": {"size": {"type": "integer"}, "label": {"type": "string"}},
        "required": ["size"],
    },
}


class Part(TypedDict):
    size: int
    label: NotRequired[str]


class Item(TypedDict):
    id: int
    name: str
    note: str | None
    score: float
    colour: Literal["red", "green"]
    tags: list[str]
    counts: dict[str, int]
    part: Part
    origins: dict[str, int]
    span: Span | None


class Span(TypedDict):
    start: int
    end: int


class ItemSubset(TypedDict):
    id: int
    colour: str


class WrongType(TypedDict):
    id: str


class MissingField(TypedDict):
    id: int
    title: str


class MustBeNotRequired(TypedDict):
    size: int
    label: str


class WronglyNotRequired(TypedDict):
    id: NotRequired[int]


class NotNullable(TypedDict):
    name: str | None


class Nullable(TypedDict):
    note: str


class WrongEnum(TypedDict):
    colour: Literal["red", "blue"]


class WrongItems(TypedDict):
    tags: list[int]


class WrongValues(TypedDict):
    counts: dict[str, str]


class WrongPart(TypedDict):
    part: WrongType


class WrongOrigins(TypedDict):
    origins: dict[str, str]


class UncheckedSpan(TypedDict):
    span: WrongType | None


def fake_problems(typed_dict: Any, schema_name: str = "Item", **options: Any) -> list[str]:
    checker = Checker(ITEM_SCHEMAS, stand_ins={Span: None}, **options)
    checker.compare(typed_dict, {"$ref": f"{COMPONENTS}{schema_name}"}, "fake")
    return checker.problems


def test_the_checker_passes_a_type_that_matches() -> None:
    assert fake_problems(Item) == []
    assert fake_problems(ItemSubset) == [], "a subset of the fields, an enum typed str"


def test_a_stored_record_may_lack_keys_added_since() -> None:
    assert fake_problems(WronglyNotRequired, stored_records=True) == []


def test_a_stand_in_checks_an_object_the_document_leaves_untyped() -> None:
    span = {"type": "object", "properties": {"start": {"type": "string"}}, "required": ["start"]}
    checker = Checker(ITEM_SCHEMAS, stand_ins={Span: Checker({"Span": span})})
    checker.compare(Item, {"$ref": f"{COMPONENTS}Item"}, "fake")
    assert checker.problems == [
        "Span (schema Span).start: int, but the schema is string",
        "Span (schema Span).end: not a field of the API's answer (its fields: start)",
    ]
    assert Span in checker.checked


def test_a_mapping_is_checked_against_each_named_property() -> None:
    assert fake_problems(WrongOrigins) == [
        "WrongOrigins (schema Item).origins.written: str, but the schema is integer",
        "WrongOrigins (schema Item).origins.imported: str, but the schema is integer",
    ]


@pytest.mark.parametrize(
    ("typed_dict", "schema_name", "expected"),
    [
        (WrongType, "Item", "WrongType (schema Item).id: str, but the schema is integer"),
        (MissingField, "Item", "MissingField (schema Item).title: not a field of the API's answer"),
        (MustBeNotRequired, "Part", "MustBeNotRequired (schema Part).label: the API may leave it out"),
        (WronglyNotRequired, "Item", "WronglyNotRequired (schema Item).id: the API always sends it"),
        (NotNullable, "Item", "NotNullable (schema Item).name: the API never answers null"),
        (Nullable, "Item", "Nullable (schema Item).note: the API may answer null"),
        (WrongEnum, "Item", "WrongEnum (schema Item).colour: Literal['red', 'blue'] differs"),
        (WrongItems, "Item", "WrongItems (schema Item).tags[]: int, but the schema is string"),
        (WrongValues, "Item", "WrongValues (schema Item).counts{}: str, but the schema is integer"),
        (WrongPart, "Item", "WrongType (schema Part).id: not a field of the API's answer"),
        (UncheckedSpan, "Item", "WrongType (schema UncheckedSpan (schema Item).span): a TypedDict, but the schema"),
    ],
)
def test_the_checker_catches_a_mismatch(typed_dict: Any, schema_name: str, expected: str) -> None:
    problems = fake_problems(typed_dict, schema_name)
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_the_checker_compares_unions_member_by_member() -> None:
    label = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
    checker = Checker({})
    checker.compare(str | list[str], label, "label")
    assert checker.problems == []
    checker.compare(str, label, "label")
    checker.compare(str | list[int], label, "label")
    assert [problem.split(":")[0] for problem in checker.problems] == ["label"] * 3, checker.problems


# --- the web app's types -------------------------------------------------------------------


@dataclass(frozen=True)
class SentRequest:
    """What an ``ApiClient`` method sent: the HTTP method, the path after the API's prefix and
    the keys of its JSON body (None without one)."""

    method: str
    path: str
    body_keys: frozenset[str] | None


SAMPLE_ARGUMENTS: dict[Any, Any] = {str: "sample", int: 1, float: 1.0, bool: True, bytes: b"{}"}


def sample_argument(hint: Any) -> Any:
    """A value of the parameter's type, to call a method with; only the request it sends counts."""
    members = [member for member in _union_members(hint) if member is not type(None)]
    origin = typing.get_origin(members[0]) or members[0]
    if origin in (list, dict):
        return origin()
    return SAMPLE_ARGUMENTS[origin]


def sent_request(method_name: str, *, every_argument: bool = False) -> SentRequest:
    """Call ``ApiClient.<method_name>`` with sample arguments (the optional ones too with
    ``every_argument``) against a transport that records the request and answers an empty
    envelope."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"data": [], "count": 0})

    api = ApiClient("http://api.test", "sample-token", transport=httpx.MockTransport(answer))
    method = getattr(api, method_name)
    hints = typing.get_type_hints(method)
    arguments = {
        name: sample_argument(hints[name])
        for name, parameter in inspect.signature(method).parameters.items()
        if (every_argument or parameter.default is inspect.Parameter.empty)
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    try:
        method(**arguments)
    except KeyError:
        pass  # a method that reads the answer (login reads its token): the request is what counts
    finally:
        api.close()
    assert len(sent) == 1, f"ApiClient.{method_name} sent {len(sent)} requests"
    (request,) = sent
    is_json = request.headers.get("Content-Type") == "application/json"
    body_keys = frozenset(json.loads(request.content)) if is_json and request.content else None
    return SentRequest(request.method, request.url.path.removeprefix(API_PREFIX), body_keys)


def typed_methods() -> Iterator[tuple[str, Any]]:
    """``ApiClient``'s methods that return a ``TypedDict`` (or a list of them), with that type."""
    for name, function in inspect.getmembers(ApiClient, inspect.isfunction):
        if name.startswith("_"):
            continue
        returns = typing.get_type_hints(function).get("return")
        inner = typing.get_args(returns)[0] if typing.get_origin(returns) is list else returns
        if typing.is_typeddict(inner):
            yield name, returns


def client_typed_dicts() -> set[type]:
    return {
        value
        for value in vars(client_module).values()
        if typing.is_typeddict(value) and value.__module__ == client_module.__name__
    }


def operation_for(paths: dict[str, Any], request: SentRequest) -> tuple[str, Schema]:
    """The OpenAPI path template the request's path matches, and its operation. A literal segment
    wins over a parameter (``/rounds/open`` over ``/rounds/{round_id}``), as the API routes it."""
    candidates = []
    for template, operations in paths.items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template.removeprefix(API_PREFIX)))
        if re.fullmatch(pattern, request.path) and request.method.lower() in operations:
            candidates.append((template.count("{"), template))
    assert candidates, f"no operation of the API answers {request.method} {request.path}"
    template = min(candidates)[1]
    return template, paths[template][request.method.lower()]


def success_schema(operation: Schema) -> Schema:
    for status, response in operation["responses"].items():
        if status.startswith("2") and "application/json" in response.get("content", {}):
            return dict(response["content"]["application/json"]["schema"])
    raise AssertionError(f"{operation['operationId']}: no JSON success response")


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> Schema:
    """The API's OpenAPI document, as ``/api/v1/openapi.json`` serves it (no request needs the
    database: the app is only built)."""
    folder: Path = tmp_path_factory.mktemp("openapi")
    settings = Settings(
        database_url=f"sqlite:///{folder / 'unused.db'}",
        environment="test",
        secret_key="test-suite-secret-key-0123456789",
        data_dir=folder,
    )
    app = create_app(settings)
    try:
        return app.openapi()
    finally:
        app.state.engine.dispose()


def stored_task_definition() -> Checker:
    """A checker of the task's definition as the API answers it: ``TaskPublic.definition`` is
    typed only as an object in the document, but it is what ``services/domain/tasks.py`` stored,
    ``services.taskdef.TaskDefinition.model_dump(mode="json")``, so every field is there (a
    dump writes them all) except those added after the task was stored."""
    schema = TaskDefinitionModel.model_json_schema(mode="serialization", ref_template=COMPONENTS + "{model}")
    components = {**schema.pop("$defs", {}), client_module.TaskDefinition.__name__: schema}
    for component in components.values():
        if "properties" in component:
            component["required"] = list(component["properties"])
    return Checker(components, stored_records=True)


def untyped_in_the_document() -> dict[Any, Checker | None]:
    """The web app's types of objects the API's document leaves untyped, and what checks them:
    the task's definition (:func:`stored_task_definition`) and a target span, which no schema
    describes (``{"start", "end", "text"}`` as services/domain/writing.py and controls.py build
    it). A new TypedDict for an untyped object fails until it is listed here."""
    return {client_module.TaskDefinition: stored_task_definition(), client_module.TargetSpan: None}


def check_client_types(openapi: Schema) -> Checker:
    checker = Checker(openapi["components"]["schemas"], stand_ins=untyped_in_the_document())
    for method_name, returns in typed_methods():
        request = sent_request(method_name)
        template, operation = operation_for(openapi["paths"], request)
        schema = success_schema(operation)
        where = f"ApiClient.{method_name} ({request.method} {template})"
        answer, _ = checker.resolve(schema)
        if typing.get_origin(returns) is list and answer.get("type") == "object":
            envelope = answer.get("properties", {})
            if "data" not in envelope:
                checker.problem(where, "returns a list, but the answer is an object without `data`")
                continue
            schema = envelope["data"]
        checker.compare(returns, schema, where)
    return checker


def test_the_web_app_types_match_the_api_schemas(openapi: Schema) -> None:
    problems = check_client_types(openapi).problems
    assert not problems, "frontend/client.py differs from the API's OpenAPI document:\n" + "\n".join(problems)


def test_every_type_of_the_client_is_checked(openapi: Schema) -> None:
    unchecked = client_typed_dicts() - check_client_types(openapi).checked
    assert not unchecked, (
        f"no ApiClient method returns {sorted(t.__name__ for t in unchecked)} (nor a checked type's "
        "field): make one return it, so that this module can find its schema"
    )


def test_the_methods_are_found_by_the_requests_they_send(openapi: Schema) -> None:
    """The derivation itself: a few methods and the operations their requests reach."""
    found = {name: operation_for(openapi["paths"], sent_request(name))[0] for name in ("open_rounds", "round", "login")}
    assert found == {
        "open_rounds": f"{API_PREFIX}/rounds/open",
        "round": f"{API_PREFIX}/rounds/{{round_id}}",
        "login": f"{API_PREFIX}/auth/login",
    }


def test_every_key_the_client_sends_is_a_field_of_the_request_schema(openapi: Schema) -> None:
    """The other direction, for the JSON bodies the client sends (every optional argument given):
    a key the API's request schema does not name is refused or ignored by the API."""
    checker = Checker(openapi["components"]["schemas"])
    problems = []
    for name, _ in inspect.getmembers(ApiClient, inspect.isfunction):
        if name.startswith("_") or name == "close":
            continue
        request = sent_request(name, every_argument=True)
        if request.body_keys is None:
            continue
        template, operation = operation_for(openapi["paths"], request)
        where = f"ApiClient.{name} ({request.method} {template})"
        schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        if schema is None:
            problems.append(f"{where}: sends a JSON body, but the API reads none")
            continue
        fields = checker.resolve(schema)[0].get("properties", {})
        problems += [
            f"{where}: sends {key!r}, not a field of the request" for key in sorted(request.body_keys - set(fields))
        ]
    assert not problems, "\n".join(problems)
