"""Transactions: one unit of work per request, and the few steps that must commit sooner.

An API request is one unit of work: ``dynaloop.api.deps.get_session`` commits it once the route has
built its answer (before the answer is sent) and rolls it back on any error. Work outside the
API (the CLI, a job's process) uses :func:`services.db.engine.session_scope`; the attempt
handler (``services.domain.writing.make_attempt``) runs its own two transactions around the
model call.

A step that must commit before its unit of work ends calls :func:`commit_now` and says why.
On SQLite every transaction holds the database's one write lock from its first statement
(``BEGIN IMMEDIATE``, ``services/db/engine.py``), so the usual reasons are to keep a change
that a later error of the same request would roll back, to release the lock before waiting
for something slow (a model server), and to let another transaction (a job's own process)
see a row.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from services.db.engine import READ_ONLY

logger = logging.getLogger(__name__)


def commit_now(session: Session, why: str) -> None:
    """Commit ``session``'s transaction now, before its unit of work ends, because of ``why``.

    The session stays usable: its objects keep their loaded values (``expire_on_commit`` is
    off), and its next statement begins a new transaction in the same unit of work."""
    logger.debug("early commit: %s", why)
    session.commit()


def begin_read_only(session: Session) -> None:
    """Begin ``session``'s next transaction as a reader, for a step that only reads and then
    commits (:func:`commit_now`). On SQLite it does not queue for the one write lock: a WAL
    reader runs beside the writer, on the last committed state, and any statement but a SELECT
    in it fails. On PostgreSQL it is an ordinary transaction."""
    if session.in_transaction():
        raise RuntimeError("begin_read_only: the session's transaction has already begun")
    session.connection(execution_options={READ_ONLY: True})
