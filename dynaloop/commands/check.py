"""`dynaloop check`: the database against the rules (docs/reliability.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from dynaloop.commands.common import DatabaseOpt, console, ensure_schema, fail, session_factory, settings_for


def check(
    database_url: DatabaseOpt = None,
    rule: Annotated[list[str] | None, typer.Option(help="Only this rule (repeatable); default: all")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
) -> None:
    """Check the database against the rules (labels counted, no self-validation, counters, orphans).
    Exit code 1 when anything is violated."""
    import json

    from services.db.engine import session_scope
    from services.domain.invariants import check_database

    url = settings_for(database_url).resolved_database_url
    ensure_schema(url)
    try:
        with session_scope(session_factory(url)) as session:
            report = check_database(session, rule)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print(json.dumps(report.to_dict(), indent=1, default=str))
    else:
        counts = ", ".join(f"{n:,} {name}" for name, n in report.counts.items())
        console.print(f"checked {len(report.rules_checked)} rules over {counts}", soft_wrap=True)
        for violation in report.violations:
            console.print(
                f"[red]{violation.rule}[/red]: {violation.count:,} — {violation.description}; "
                f"e.g. {violation.rows[:3]}",
                soft_wrap=True,
                highlight=False,
            )
        if report.ok:
            console.print("no violations")
    if not report.ok:
        raise typer.Exit(1)
