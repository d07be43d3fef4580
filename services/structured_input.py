"""Bounds on structured input (JSON, NDJSON, YAML) checked before anything is built from it.

Python's ``json`` module and PyYAML's composer recurse once per level of nesting, so a body
nested a few thousand levels deep raises ``RecursionError`` (a 500) instead of an answer.
Nothing dynaloop accepts needs more than a handful of levels (a task YAML's onboarding quiz is
five deep), so input nested deeper than ``max_depth`` is refused before it is parsed, by
scans that do not recurse themselves:

* JSON and NDJSON: :func:`check_json_depth` counts brackets outside strings.
* YAML: :func:`load_yaml` composes with :class:`BoundedSafeLoader`, which stops at
  ``max_depth`` levels or ``max_nodes`` nodes, refuses aliases (``*name``, the "billion
  laughs" expansion) and refuses a key repeated in one mapping.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

import yaml
from yaml.error import Mark, MarkedYAMLError
from yaml.nodes import MappingNode, Node

from services.errors import Invalid

DEFAULT_MAX_INPUT_DEPTH = 32
DEFAULT_MAX_YAML_NODES = 10_000
DEPTH_SETTING = "DYNALOOP_MAX_INPUT_DEPTH"
YAML_NODES_SETTING = "DYNALOOP_MAX_YAML_NODES"

# A JSON string, escapes included (the unrolled form matches long strings without backtracking).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPENERS = b"[{"
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
# +1 for an opening bracket, -1 for a closing one, indexed by byte value.
_STEP = [1 if byte in _OPENERS else -1 for byte in range(256)]


class TooDeep(Invalid):
    """Input nested deeper than the configured limit (422)."""


def json_depth(data: bytes | str) -> int:
    """The deepest nesting of arrays and objects in JSON text (0 for a scalar), found without
    recursion. Brackets inside strings do not count. Text that is not valid JSON gets a depth
    too (its parser then reports what is wrong with it)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets))))


def check_json_depth(data: bytes | str, max_depth: int, what: str = "the JSON body") -> None:
    """Raise :class:`TooDeep` when ``data`` nests arrays and objects deeper than ``max_depth``."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    # Fewer brackets than the limit cannot nest deeper than it: most input stops here.
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return
    depth = json_depth(raw)
    if depth > max_depth:
        raise TooDeep(
            f"{what} is nested {depth} levels deep; the limit is {max_depth} ({DEPTH_SETTING}), flatten it",
            limit=max_depth,
            depth=depth,
        )


class YamlInputError(MarkedYAMLError):
    """Refused YAML (too deep, too many nodes, an alias, a duplicate key), with its position."""

    def __init__(self, problem: str, mark: Mark | None) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class BoundedSafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader with bounds: at most ``max_depth`` levels and ``max_nodes`` nodes,
    no aliases and no key given twice in one mapping.

    The composer builds a node per event and recurses once per level; counting in
    :meth:`compose_node` stops it at the limit, long before Python's recursion limit.
    PyYAML's scanner and parser keep their own stacks and do not recurse.
    """

    def __init__(self, stream: str, *, max_depth: int, max_nodes: int) -> None:
        super().__init__(stream)
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if self.check_event(yaml.AliasEvent):
            raise YamlInputError(
                f"aliases (*{event.anchor}) are not accepted; write the value out where it is used",
                event.start_mark,
            )
        self._nodes += 1
        if self._nodes > self.max_nodes:
            raise YamlInputError(
                f"the document has more than {self.max_nodes} values; the limit is {self.max_nodes} "
                f"({YAML_NODES_SETTING}), shorten it",
                event.start_mark,
            )
        # Levels are mappings and lists, as in JSON: a scalar adds none.
        collection = self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent)
        self._depth += collection
        try:
            if self._depth > self.max_depth:
                raise YamlInputError(
                    f"the document is nested more than {self.max_depth} levels deep; the limit is "
                    f"{self.max_depth} ({DEPTH_SETTING}), flatten it",
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= collection

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        # YAML itself says keys are unique; PyYAML keeps the last value of a repeated key,
        # which silently drops what the author wrote first.
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the constructor below says so
            if first is not None:
                raise YamlInputError(
                    f"the key {key!r} appears twice in one mapping (first at line {first + 1}); keep one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, *, max_depth: int = DEFAULT_MAX_INPUT_DEPTH, max_nodes: int = DEFAULT_MAX_YAML_NODES) -> Any:
    """``yaml.safe_load`` with the bounds of :class:`BoundedSafeLoader` (raises ``yaml.YAMLError``)."""
    loader = BoundedSafeLoader(text, max_depth=max_depth, max_nodes=max_nodes)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
