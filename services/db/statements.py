"""Conditional writes: an UPDATE whose WHERE clause is the condition, and how many rows it matched.

Statements built once. The queries of the crowd's hot paths (the token lookup every request
makes, a writer's overdue check, a worker's standing, the duplicate check, a batch item...) are
module-level statements with named ``bindparam`` values, executed with a dict of parameters,
rather than built anew on each call: building a SELECT with its WHERE clause and computing its
cache key cost about 100 microseconds of CPU each time here, more than running it on SQLite
(docs/benchmarks.md, "API CPU"). SQLAlchemy's ``lambda_stmt`` is meant for the same, but
measured slower than building the statement plainly on these queries, so it is not used."""

from __future__ import annotations

from typing import Any

from sqlalchemy import CursorResult, Delete, Update
from sqlalchemy.orm import Session


def rows_matched(session: Session, statement: Update | Delete, params: dict[str, Any] | None = None) -> int:
    """Execute ``statement`` (an UPDATE or DELETE without RETURNING) in ``session`` and return
    the number of rows its WHERE clause matched: 0 when the condition no longer held.

    ``Session.execute`` is typed to return a plain ``Result`` for every statement, because some
    ORM bulk statements return no cursor result; an UPDATE or DELETE with WHERE criteria and no
    RETURNING always returns a ``CursorResult``, which has the row count."""
    result = session.execute(statement, params)
    assert isinstance(result, CursorResult), f"{type(result).__name__} has no row count"
    return result.rowcount
