"""The invariant checker: silent on a round built through the real API, and each rule finds
the corruption it is about (written straight into the database, as a bug or a hand edit would)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from services.db.engine import session_scope
from services.domain.invariants import RULES, check_database

pytestmark = pytest.mark.both_databases  # the database's constraints


def _check(app: Any) -> dict[str, Any]:
    with session_scope(app.state.sessionmaker) as session:
        return check_database(session).to_dict()


def _one(app: Any, sql: str) -> Any:
    with app.state.engine.connect() as connection:
        return connection.execute(text(sql)).scalar_one()


def _run(app: Any, *statements: str, without_foreign_keys: bool = False) -> None:
    with app.state.engine.begin() as connection:
        if without_foreign_keys:
            if connection.dialect.name == "sqlite":
                connection.execute(text("PRAGMA defer_foreign_keys=ON"))
            else:
                connection.execute(text("SET LOCAL session_replication_role = replica"))
        for statement in statements:
            connection.execute(text(statement))


def test_a_round_made_through_the_api_breaks_no_rule(built, app) -> None:
    report = _check(app)
    assert report["ok"], report["violations"]
    assert report["counts"]["validations"] > 100
    assert set(report["rules_checked"]) == set(RULES)


CORRUPTIONS: dict[str, Callable[[Any], list[str]]] = {
    # rule -> statements that break it (given the built round)
    "overcounted": lambda app: [
        f"UPDATE examples SET validations_needed = 2 WHERE id = {_one(app, 'SELECT MIN(id) FROM examples')}"
    ],
    "validation_count": lambda app: [
        f"UPDATE examples SET validation_count = validation_count + 1 "
        f"WHERE id = {_one(app, 'SELECT MIN(id) FROM examples')}"
    ],
    "self_validation": lambda app: [
        "UPDATE validations SET validator_id = "
        "(SELECT writer_id FROM examples WHERE examples.id = validations.example_id) "
        f"WHERE id = {_one(app, 'SELECT MIN(id) FROM validations')}"
    ],
    "tries_used": lambda app: [
        f"UPDATE assignments SET tries_used = tries_used + 1 WHERE id = {_one(app, 'SELECT MIN(id) FROM assignments')}"
    ],
    "unconfirmed_example": lambda app: [
        "UPDATE attempts SET confirmed = NULL WHERE id = "
        f"{_one(app, 'SELECT MIN(a.id) FROM attempts a JOIN examples e ON e.attempt_id = a.id WHERE a.fooled')}"
    ],
    "example_without_attempt": lambda app: [
        f"UPDATE attempts SET text = 'changed after submission' "
        f"WHERE id = {_one(app, 'SELECT MIN(attempt_id) FROM examples')}"
    ],
    "unscored_example": lambda app: [
        f"UPDATE attempts SET status = 'pending' WHERE id = {_one(app, 'SELECT MIN(attempt_id) FROM examples')}"
    ],
    "assignment_status": lambda app: [
        f"UPDATE assignments SET status = 'active' WHERE id = {_one(app, 'SELECT MIN(assignment_id) FROM examples')}"
    ],
    "validated_short": lambda app: [
        "UPDATE examples SET status = 'validated', validations_needed = validation_count + 1 "
        f"WHERE id = {_one(app, 'SELECT MIN(id) FROM examples')}"
    ],
}


@pytest.mark.parametrize("rule", sorted(CORRUPTIONS))
def test_each_rule_finds_its_corruption(built, app, rule: str) -> None:
    _run(app, *CORRUPTIONS[rule](app))
    report = _check(app)
    found = {v["rule"]: v for v in report["violations"]}
    assert rule in found, report
    assert found[rule]["count"] >= 1 and found[rule]["rows"]


def test_duplicate_validations_are_found(built, app) -> None:
    # The unique constraint forbids it; a restored dump or a dropped constraint would not.
    with app.state.engine.begin() as connection:
        if connection.dialect.name == "sqlite":
            pytest.skip("SQLite cannot drop a table constraint in place; covered on PostgreSQL")
        connection.execute(text("ALTER TABLE validations DROP CONSTRAINT uq_validations_example_validator"))
    try:
        _run(
            app,
            "INSERT INTO validations (example_id, validator_id, label, flagged, counted, created_at) "
            "SELECT example_id, validator_id, label, flagged, false, created_at FROM validations "
            "WHERE id = (SELECT MIN(id) FROM validations)",
        )
        found = {v["rule"] for v in _check(app)["violations"]}
        assert "duplicate_validation" in found
    finally:
        _run(
            app,
            "DELETE FROM validations WHERE id NOT IN (SELECT MIN(id) FROM validations "
            "GROUP BY example_id, validator_id)",
        )
        with app.state.engine.begin() as connection:
            connection.execute(
                text(
                    "ALTER TABLE validations ADD CONSTRAINT uq_validations_example_validator "
                    "UNIQUE (example_id, validator_id)"
                )
            )


def test_orphans_are_found(built, app) -> None:
    example = _one(app, "SELECT MIN(e.id) FROM examples e JOIN validations v ON v.example_id = e.id")
    # Outside the application's checks, on a raw driver connection, as a hand edit would do it.
    raw = app.state.engine.raw_connection()
    try:
        sqlite = app.state.engine.dialect.name == "sqlite"
        cursor = raw.cursor()
        cursor.execute("PRAGMA foreign_keys=OFF" if sqlite else "SET session_replication_role = replica")
        cursor.execute(f"DELETE FROM examples WHERE id = {example}")
        raw.commit()
        cursor.execute("PRAGMA foreign_keys=ON" if sqlite else "SET session_replication_role = DEFAULT")
        raw.commit()
    finally:
        raw.close()
    found = {v["rule"]: v for v in _check(app)["violations"]}
    assert "orphan_validations" in found
    assert all(row["points_to"] == example for row in found["orphan_validations"]["rows"])
    assert "orphan_built_examples" in found


def test_unknown_rule_is_refused(app) -> None:
    with session_scope(app.state.sessionmaker) as session, pytest.raises(ValueError, match="unknown rule"):
        check_database(session, ["no_such_rule"])


def test_check_command_reports_and_exits_nonzero(built, app, database_url) -> None:
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    runner = CliRunner()
    result = runner.invoke(cli, ["check", "--database-url", database_url])
    assert result.exit_code == 0, result.output
    assert "no violations" in result.output
    _run(
        app,
        f"UPDATE examples SET validation_count = validation_count + 1 "
        f"WHERE id = {_one(app, 'SELECT MIN(id) FROM examples')}",
    )
    result = runner.invoke(cli, ["check", "--database-url", database_url, "--json"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert [v["rule"] for v in report["violations"]] == ["validation_count"]
    result = runner.invoke(cli, ["check", "--database-url", database_url, "--rule", "nope"])
    assert result.exit_code == 1 and "unknown rule" in result.output and "Traceback" not in result.output
