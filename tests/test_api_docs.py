"""docs/api.md's "Endpoints at a glance" lists every route of the API with its role.

The routes come from the app itself (its OpenAPI operations and its top-level routes, as in
tests/test_authorization.py), and the roles from that file's authorization matrix ``ALLOWED``,
which is checked against the running API there. A new route, or a route whose roles change,
fails here until the table says so."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.test_authorization import ALLOWED, ANY, API, PUBLIC, app_routes

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
SECTION = "## Endpoints at a glance"
# Written in full in the table; every other path there is under /api/v1.
TOP_LEVEL = ("/health", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc")
ROLE_WORDS = ("none", "any", "writer", "validator", "researcher", "client", "admin")
ROW = re.compile(r"^\| (GET|POST|PUT|PATCH|DELETE) \| `([^`]+)` \| ([^|]+) \|")


def _shape(path: str) -> str:
    """A path with its parameters unnamed: the docs say `{id}` where the app says `{round_id}`."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def documented_routes(markdown: str) -> dict[tuple[str, str], str]:
    """(method, path shape) -> the Role cell, for each row of the section's table."""
    start = markdown.index(SECTION)
    end = markdown.find("\n---", start)
    rows: dict[tuple[str, str], str] = {}
    for line in markdown[start : end if end > 0 else None].splitlines():
        found = ROW.match(line)
        if not found:
            continue
        method, path, role = found.group(1), found.group(2).split("?", 1)[0], found.group(3).strip()
        full = path if path in TOP_LEVEL else f"{API}{path}"
        key = (method, _shape(full))
        assert key not in rows, f"{method} {path} is in the table twice"
        rows[key] = role
    return rows


def role_words(cell: str) -> set[str]:
    """The roles a Role cell names, before any explanation in parentheses."""
    head = cell.split("(", 1)[0].lower()
    return {word for word in ROLE_WORDS if re.search(rf"\b{word}\b", head)}


def expected_words(allowed: str | set[str]) -> set[str]:
    if allowed == PUBLIC:
        return {"none"}
    if allowed == ANY:
        return {"any"}
    assert isinstance(allowed, set)
    return set(allowed) or {"admin"}  # an empty set: admins only (they pass every check)


def test_every_route_is_in_the_api_docs_with_its_roles(app: Any) -> None:
    documented = documented_routes(API_DOC.read_text(encoding="utf-8"))
    served = {(method, _shape(path)): (method, path) for method, path in app_routes(app)}
    missing = sorted(f"{method} {path}" for key, (method, path) in served.items() if key not in documented)
    assert not missing, f"routes missing from docs/api.md's '{SECTION}' table: {missing}"
    stale = sorted(f"{method} {path}" for method, path in set(documented) - set(served))
    assert not stale, f"rows in docs/api.md's table for routes the app does not serve: {stale}"
    wrong = {
        f"{method} {path}": (documented[key], sorted(expected_words(ALLOWED[(method, path)])))
        for key, (method, path) in served.items()
        if role_words(documented[key]) != expected_words(ALLOWED[(method, path)])
    }
    assert not wrong, f"Role cells that differ from tests/test_authorization.py's ALLOWED: {wrong}"


def test_the_table_reader_finds_rows_and_roles() -> None:
    table = f"""{SECTION}

| Method | Path | Role | What it does |
| --- | --- | --- | --- |
| GET | `/health` | none | up |
| GET | `/tasks/{{task}}/rounds/{{n}}/dataset?split=&format=` | client, researcher | a split |
| PUT | `/tasks/{{task}}/members/{{username}}` | researcher (an owner of the task) | add |
| DELETE | `/tokens/{{token_id}}` | any (your own; an admin anyone's) | revoke |

---
| GET | `/after/the/section` | admin | not read |
"""
    rows = documented_routes(table)
    assert rows == {
        ("GET", "/health"): "none",
        ("GET", f"{API}/tasks/{{}}/rounds/{{}}/dataset"): "client, researcher",
        ("PUT", f"{API}/tasks/{{}}/members/{{}}"): "researcher (an owner of the task)",
        ("DELETE", f"{API}/tokens/{{}}"): "any (your own; an admin anyone's)",
    }
    assert [role_words(cell) for cell in rows.values()] == [{"none"}, {"client", "researcher"}, {"researcher"}, {"any"}]
    assert expected_words(set()) == {"admin"} and expected_words({"writer"}) == {"writer"}
