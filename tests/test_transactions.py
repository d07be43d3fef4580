"""Transactions live in one layer: the request's unit of work (dynaloop.api.deps.get_session) commits,
routes and domain functions do not. The steps that must commit sooner say why through
services.db.transactions.commit_now; the attempt handler runs its own two transactions around
the model call (services.domain.writing.make_attempt)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from services.db.models import Assignment
from tests.conftest import example_yaml, open_round, table_counts

pytestmark = pytest.mark.both_databases  # transactions


ROOT = Path(__file__).resolve().parent.parent
# (file, function) pairs allowed to call .commit() themselves, and why.
OWN_TRANSACTIONS = {
    ("dynaloop/api/deps.py", "get_session"): "the request's unit of work",
    ("services/domain/writing.py", "make_attempt"): "the attempt's own transactions around the model call",
}


def _commits(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every `<something>.commit()` call in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "commit":
                    found.append((function.name, node.lineno))
    return found


def test_only_the_unit_of_work_commits() -> None:
    files = [*sorted((ROOT / "api").rglob("*.py")), *sorted((ROOT / "services" / "domain").rglob("*.py"))]
    stray = []
    for path in files:
        relative = path.relative_to(ROOT).as_posix()
        for function, line in _commits(path):
            if (relative, function) not in OWN_TRANSACTIONS:
                stray.append(f"{relative}:{line} in {function}(): use services.db.transactions.commit_now")
    assert not stray, "\n".join(stray)


def test_a_routes_pending_changes_are_committed_before_the_answer(
    client: Any, app: Any, researcher: Any, make_user: Any, stub_model: Any
) -> None:
    """Skipping leaves the assignment's new status pending in the session (nothing flushes
    it); the unit of work writes and commits it before the 200, so another connection sees it."""
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        stub_model.url,
        ["The soup was fine.", "The bread was fresh."],
    )
    writer = make_user("wes", "writer")
    assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()
    skipped = client.post(f"/api/v1/assignments/{assignment['id']}/skip", headers=writer.headers)
    assert skipped.status_code == 200 and skipped.json()["status"] == "skipped"
    with app.state.sessionmaker() as session:
        status = session.scalar(select(Assignment.status).where(Assignment.id == assignment["id"]))
    assert status is not None and status.value == "skipped"


def test_an_error_after_a_change_rolls_the_whole_request_back(
    client: Any, app: Any, researcher: Any, stub_model: Any
) -> None:
    """Opening a round while one is open: the task row is locked and read, then 409; the
    request leaves no trace (no audit entry, no round)."""
    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url)
    before = table_counts(app)
    again = client.post("/api/v1/tasks/dynasent-r2/rounds", json={}, headers=researcher.headers)
    assert again.status_code == 409 and f"round {round_['number']}" in again.json()["error"]["message"]
    assert table_counts(app) == before
