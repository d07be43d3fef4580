"""Conditional writes: an UPDATE whose WHERE clause is the condition, and how many rows it matched.

Statements built once. The queries of the crowd's hot paths (the token lookup every request
makes, a writer's overdue check, a worker's standing, the duplicate check, a batch item...) are
module-level statements with named ``bindparam`` values, executed with a dict of parameters,
rather than built anew on each call: building a SELECT with its WHERE clause and computing its
cache key cost about 100 microseconds of CPU each time here, more than running it on SQLite
(docs/benchmarks.md, "API CPU"). SQLAlchemy's ``lambda_stmt`` is meant for the same, but
measured slower than building the statement plainly on these queries, so it is not used.

Core, not the ORM, where no object is loaded. An UPDATE, a DELETE or a SELECT of columns written
against an entity (``update(Attempt)``, ``select(Attempt.status)``) is an ORM statement: the
session runs it through the ORM's bulk-update and loading machinery, which cost 2 to 3 times the
same statement written against the entity's table (:func:`table_of`) in process on SQLite, about
100 microseconds more an UPDATE (docs/benchmarks.md, "API CPU per request"). The crowd's hot
writes and column reads are written against tables. A Core statement does not autoflush the
session first: what it must see is flushed (or inserted with :func:`insert_persistent`) before."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from sqlalchemy import JSON, CursorResult, Delete, Insert, Select, Table, Update, bindparam, insert, inspect, update
from sqlalchemy.orm import DeclarativeBase, Session, make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value

T = TypeVar("T", bound=DeclarativeBase)


def rows_matched(session: Session, statement: Update | Delete, params: dict[str, Any] | None = None) -> int:
    """Execute ``statement`` (an UPDATE or DELETE without RETURNING) in ``session`` and return
    the number of rows its WHERE clause matched: 0 when the condition no longer held.

    ``Session.execute`` is typed to return a plain ``Result`` for every statement, because some
    ORM bulk statements return no cursor result; an UPDATE or DELETE with WHERE criteria and no
    RETURNING always returns a ``CursorResult``, which has the row count."""
    result = session.execute(statement, params)
    assert isinstance(result, CursorResult), f"{type(result).__name__} has no row count"
    return result.rowcount


def table_of(entity: type[DeclarativeBase]) -> Table:
    """The table ``entity`` is mapped to, for Core statements (see the module's docstring)."""
    return cast(Table, inspect(entity).local_table)


def update_by_id(entity: type[DeclarativeBase], key: str, *attributes: str) -> Update:
    """A Core UPDATE of one row of ``entity``'s table, built once: the row whose ``id`` is the
    parameter ``key`` (not a column's name: an UPDATE reserves those for its SET clause), the
    column of each of ``attributes`` set from the parameter named after the attribute. For
    :func:`update_loaded`."""
    mapper = inspect(entity)
    return (
        update(table_of(entity))
        .where(mapper.columns["id"] == bindparam(key))
        .values({mapper.columns[attribute]: bindparam(attribute) for attribute in attributes})
    )


def update_loaded(
    session: Session, instance: Any, statement: Update, keys: dict[str, Any], values: dict[str, Any]
) -> None:
    """Write ``values`` to ``instance``'s row with ``statement`` (an UPDATE built once, whose WHERE
    clause takes ``keys`` and whose SET clause binds one parameter per key of ``values``), and keep
    them on ``instance`` as its loaded state: nothing is left for the unit of work to write.

    A changed object made the request's commit flush it, sorting and diffing the session, in a
    worker thread of its own (dynaloop/api/deps.py, get_session). A JSON column must not be in
    ``values`` as None: bound as a parameter, it would be stored as the JSON text ``null``."""
    session.execute(statement, {**keys, **values})
    for column, value in values.items():
        set_committed_value(instance, column, value)


def object_by_id(session: Session, entity: type[T], statement: Select[Any], params: dict[str, Any]) -> T | None:
    """The object of ``entity`` whose id ``statement`` (a Core SELECT of one id, built once) finds
    with ``params``, or None. For reads that almost never find a row (an idempotency key's
    earlier request): the Core SELECT costs about half the ORM's, and the object is loaded only
    when there is one."""
    found = session.scalar(statement, params)
    return session.get(entity, found) if found is not None else None


_INSERTS: dict[tuple[type[Any], frozenset[str]], Insert] = {}


def insert_persistent(session: Session, entity: type[T], values: dict[str, Any]) -> T:
    """INSERT one row of ``entity`` with ``values`` (every column but the primary key ``id``)
    and return it as a persistent object of ``session``, without the unit of work.

    A flush of one new object sorts and diffs the session's objects, and cost twice a plain
    INSERT here (docs/benchmarks.md, "API CPU per request"). The statement is built once per
    entity and set of columns; the object is made from the values and the id the INSERT
    returns, so every column attribute is loaded (none is read again, and the object stays
    readable once detached). Relationships are not set: the caller sets those it reads
    (``set_committed_value``).

    A JSON column whose value is None is left out of the INSERT, so that it is SQL NULL as the
    unit of work writes it: bound as a parameter, None would be stored as the JSON text ``null``."""
    mapper = inspect(entity)
    missing = {column.key for column in mapper.column_attrs if column.key != "id"} - values.keys()
    if missing:
        raise ValueError(f"insert_persistent({entity.__name__}): no value for {sorted(missing)}")
    table = table_of(entity)
    sent = {key: value for key, value in values.items() if not (value is None and isinstance(table.c[key].type, JSON))}
    if any(table.c[key].default is not None for key in values.keys() - sent.keys()):
        raise ValueError(f"insert_persistent({entity.__name__}): a JSON column with a default is None")
    statement = _INSERTS.get((entity, frozenset(sent)))
    if statement is None:
        statement = _INSERTS[(entity, frozenset(sent))] = insert(table).returning(table.c.id)
    row_id = session.execute(statement, sent).scalar_one()
    return _persistent(session, entity, {"id": row_id, **values})


def _persistent(session: Session, entity: type[T], values: dict[str, Any]) -> T:
    """An object of ``entity`` with every column's value, as its row holds them, made
    persistent in ``session`` without a statement: its values are its loaded, unchanged state
    (nothing is written for it unless it is changed), its relationships load when read."""
    instance = entity(**values)
    make_transient_to_detached(instance)
    session.add(instance)
    return instance
