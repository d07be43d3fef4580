"""Rows a costly fixture wrote, kept and copied back for the next test that asks for it.

A fixture such as ``built`` (tests/built_round.py) or ``hand`` (tests/test_ledger.py) writes a
whole round through the API: hundreds of requests, one to four seconds, and a hundred tests ask for
one of them. :func:`reuse_rows` runs the fixture's work once per test process, database and
settings, keeps every table's rows, and gives later tests a copy: the same rows with the same ids
(PostgreSQL's id sequences moved past them, as after the inserts of a real run), so a test starts
from the state it would have built. The accounts a test's own fixtures made before (users and
their tokens: ``researcher``, ``make_user``) are carried over, under the copied user of the same
name where there is one, so their tokens keep working; a test whose fixtures wrote anything else
first gets the work done anew. tests/test_round_build.py checks a copy against a fresh run on
both databases."""

from __future__ import annotations

import json
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI
from sqlalchemy import Table, func, insert, select, text

from services.db.models import Base
from tests.conftest import _REGISTERED_IN, empty_tables

T = TypeVar("T")
Rows = dict[str, list[dict[str, Any]]]

# Tables a test's fixtures may have written before the costly fixture runs (its users, their
# tokens, the audit of their creation): carried over a copy. Rows in any other table: done anew.
ACCOUNT_TABLES = ("users", "api_tokens", "audit_log")


@dataclass
class RowSnapshot:
    rows: Rows  # every table's rows, parents first
    value: Any  # what the fixture returned for them


_SNAPSHOTS: dict[tuple[str, str], RowSnapshot] = {}


def reuse_rows(app: FastAPI, name: str, make: Callable[[], T]) -> T:
    """``make()`` the first time in this process for this database and settings; later, a copy of
    the rows it wrote and (a deep copy of) what it returned."""
    key = (name, _settings_key(app))
    before = read_rows(app)
    snapshot = _SNAPSHOTS.get(key)
    if snapshot is not None and _only_accounts(before):
        restore_rows(app, snapshot.rows, before)
        return deepcopy(snapshot.value)  # type: ignore[no-any-return]
    value = make()
    if _only_accounts(before):
        _SNAPSHOTS[key] = RowSnapshot(rows=read_rows(app), value=deepcopy(value))
    return value


def _settings_key(app: FastAPI) -> str:
    """The database and every setting but the data folder (a test's own): a test that changes a
    setting the fixture's work reads gets a run of its own."""
    settings = app.state.settings.model_dump(mode="json", exclude={"data_dir"})
    return json.dumps(settings, sort_keys=True, default=str)


def read_rows(app: FastAPI) -> Rows:
    """Every table's rows, parents first, each table in the order of its primary key."""
    with app.state.engine.connect() as connection:
        return {
            table.name: [dict(row) for row in connection.execute(select(table).order_by(*table.primary_key)).mappings()]
            for table in Base.metadata.sorted_tables
        }


def _only_accounts(rows: Rows) -> bool:
    return not any(table_rows for name, table_rows in rows.items() if name not in ACCOUNT_TABLES)


def restore_rows(app: FastAPI, rows: Rows, before: Rows) -> None:
    """``rows`` in place of the database's, ids included; then the accounts of ``before`` (users
    and tokens this test's fixtures made) added again, so that their tokens keep working."""
    empty_tables(app.state.settings.resolved_database_url)
    with app.state.engine.begin() as connection:
        for table in Base.metadata.sorted_tables:
            if rows[table.name]:
                connection.execute(insert(table), rows[table.name])
        if connection.dialect.name == "postgresql":
            for table in Base.metadata.sorted_tables:
                if "id" in table.c and table.c.id.primary_key and table.c.id.autoincrement:
                    largest = connection.execute(select(func.max(table.c.id))).scalar()
                    connection.execute(
                        text("SELECT setval(pg_get_serial_sequence(:table, 'id'), :value, :called)"),
                        {"table": table.name, "value": largest or 1, "called": largest is not None},
                    )
        _carry_accounts(connection, rows, before)
    for server in rows["model_servers"]:
        _REGISTERED_IN[server["name"]] = app  # open_round over HTTP grants servers through this app


def _carry_accounts(connection: Any, rows: Rows, before: Rows) -> None:
    tables: dict[str, Table] = {table.name: table for table in Base.metadata.sorted_tables}
    user_ids = {row["username"]: row["id"] for row in rows["users"]}
    for user in before["users"]:
        if user["username"] not in user_ids:
            fields = {key: value for key, value in user.items() if key != "id"}
            user_ids[user["username"]] = connection.execute(
                insert(tables["users"]).values(fields).returning(tables["users"].c.id)
            ).scalar_one()
    names = {row["id"]: row["username"] for row in before["users"]}
    for token in before["api_tokens"]:
        fields = {key: value for key, value in token.items() if key != "id"}
        fields["user_id"] = user_ids[names[token["user_id"]]]
        connection.execute(insert(tables["api_tokens"]).values(fields))
