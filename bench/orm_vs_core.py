"""What the crowd's reads cost through SQLAlchemy's ORM and through Core: the bound a rewrite of
the hot routes onto Core could reach (docs/benchmarks.md, "Where it goes now").

The same statements the API runs, on a database seeded as ``bench/load.py`` seeds it, in this
process, one at a time, CPU time per statement (``time.process_time``; on PostgreSQL the
server's own CPU is not in it):

* ``token``: the token and its user (``services.domain.users.TOKEN_BY_HASH``, the token read of
  every request) against the same columns as Core rows;
* ``assignment``: an assignment with its round, task and prompt
  (``services.domain.writing._ASSIGNMENT``, read by every check, example and skip) against the
  same join as Core rows;
* ``request``: the two of them in the shape of a request, a transaction for the token and one
  for the assignment, through a session against through a connection.

The ORM builds objects with identity, history and relationships that the routes' rules use;
Core rows have none of that, so the Core column is a floor, not a drop-in replacement.

Usage:
    python bench/orm_vs_core.py [--database sqlite|postgresql] [--repeat 1000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import bindparam, select  # noqa: E402

from bench.load import DEFAULT_POSTGRES_URL, fresh_postgres, seed_database  # noqa: E402
from bench.machine import cpu_model  # noqa: E402
from services.db.engine import make_engine, make_sessionmaker  # noqa: E402
from services.db.models import ApiToken, Assignment, Prompt, Round, Task, User  # noqa: E402
from services.domain import round_lifecycle, writing  # noqa: E402
from services.domain.users import TOKEN_BY_HASH  # noqa: E402
from services.security import hash_token  # noqa: E402

_tokens, _users = ApiToken.__table__, User.__table__
_assignments, _rounds, _tasks, _prompts = (Assignment.__table__, Round.__table__, Task.__table__, Prompt.__table__)
CORE_TOKEN = (
    select(_tokens, _users)
    .join_from(_tokens, _users, _tokens.c.user_id == _users.c.id)
    .where(_tokens.c.token_hash == bindparam("token_hash"))
)
CORE_ASSIGNMENT = (
    select(_assignments, _rounds, _tasks, _prompts)
    .join_from(_assignments, _rounds, _assignments.c.round_id == _rounds.c.id)
    .join(_tasks, _rounds.c.task_id == _tasks.c.id)
    .outerjoin(_prompts, _assignments.c.prompt_id == _prompts.c.id)
    .where(_assignments.c.id == bindparam("assignment_id"))
)


def measure(run: Callable[[int], None], repeat: int, blocks: int = 5) -> float:
    """Median CPU µs per call of ``run`` over ``blocks`` blocks of ``repeat`` calls, after a warm-up."""
    run(max(1, repeat // 5))
    per_call = []
    for _ in range(blocks):
        started = time.process_time()
        run(repeat)
        per_call.append((time.process_time() - started) / repeat * 1e6)
    return statistics.median(per_call)


def main(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-orm-vs-core-"))
    url = fresh_postgres(args.postgres_url) if args.database == "postgresql" else f"sqlite:///{folder / 'load.db'}"
    round_id, writers, _ = seed_database(url, 2, 1, 50, "http://127.0.0.1:9")  # the model is never called
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        writer = session.scalar(select(User).where(User.username == "writer0"))
        assert writer is not None
        assignment, _ = writing.start_assignment(session, writer, round_lifecycle.get_round(session, round_id), None)
        session.commit()
        assignment_id = assignment.id
    token = {"token_hash": hash_token(writers[0])}
    by_id = {"assignment_id": assignment_id}

    def orm_token(n: int) -> None:
        with sessions() as session:
            for _ in range(n):
                assert session.execute(TOKEN_BY_HASH, token).first() is not None
                session.expunge_all()  # a request's session starts empty

    def core_token(n: int) -> None:
        with engine.connect() as connection:
            for _ in range(n):
                assert connection.execute(CORE_TOKEN, token).first() is not None

    def orm_assignment(n: int) -> None:
        with sessions() as session:
            for _ in range(n):
                loaded = session.scalar(writing._ASSIGNMENT, by_id)
                assert loaded is not None and loaded.round.task.name
                session.expunge_all()

    def core_assignment(n: int) -> None:
        with engine.connect() as connection:
            for _ in range(n):
                assert connection.execute(CORE_ASSIGNMENT, by_id).first() is not None

    def orm_request(n: int) -> None:
        for _ in range(n):
            with sessions() as session:
                assert session.execute(TOKEN_BY_HASH, token).first() is not None
                session.commit()
                assert session.scalar(writing._ASSIGNMENT, by_id) is not None
                session.commit()

    def core_request(n: int) -> None:
        for _ in range(n):
            with engine.connect() as connection:
                assert connection.execute(CORE_TOKEN, token).first() is not None
                connection.commit()
                assert connection.execute(CORE_ASSIGNMENT, by_id).first() is not None
                connection.commit()

    rows = {}
    for name, orm, core in (
        ("token", orm_token, core_token),
        ("assignment", orm_assignment, core_assignment),
        ("request", orm_request, core_request),
    ):
        orm_us, core_us = measure(orm, args.repeat), measure(core, args.repeat)
        rows[name] = {
            "orm_us": round(orm_us, 1),
            "core_us": round(core_us, 1),
            "core_over_orm": round(core_us / orm_us, 3),
        }
    engine.dispose()
    print(f"CPU µs per call, {args.database}, median of 5 blocks of {args.repeat}:")
    print("| read | ORM | Core | Core ÷ ORM |")
    print("| --- | ---: | ---: | ---: |")
    for name, row in rows.items():
        print(f"| {name} | {row['orm_us']} | {row['core_us']} | {row['core_over_orm']:.2f} |")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument(
        "--postgres-url",
        default=DEFAULT_POSTGRES_URL,
    )
    parser.add_argument("--repeat", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None)
    arguments = parser.parse_args()
    result = main(arguments)
    if arguments.json is not None:
        arguments.json.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "command": "python bench/orm_vs_core.py " + " ".join(sys.argv[1:]),
            "database": arguments.database,
            "reads": result,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": cpu_model(),
        }
        arguments.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
