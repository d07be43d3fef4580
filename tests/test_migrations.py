"""Alembic is the only source of the schema: migrations run both ways and match the models."""

from __future__ import annotations

import datetime as dt
import json
from contextlib import ExitStack
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, MetaData, create_engine, inspect, select, text
from sqlalchemy.orm import Session

from services.db.migrate import current_revision, downgrade, head_revision, upgrade
from services.db.models import Base, Task, TaskRole
from tests.conftest import BACKENDS, fresh_postgres_database

pytestmark = pytest.mark.both_databases  # migrations


def _database_at(stack: ExitStack, backend: str, tmp_path: Path, revision: str) -> tuple[str, Engine]:
    """A new database of ``backend`` migrated up to ``revision``, and an engine on it; both are
    closed (the engine disposed, a PostgreSQL database dropped) when ``stack`` closes."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / f'at-{revision}.db'}"
    else:
        url = stack.enter_context(fresh_postgres_database())
    upgrade(url, revision)
    engine = create_engine(url)
    stack.callback(engine.dispose)
    return url, engine


def test_models_match_the_migrations(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models and migrations differ; write a migration: {diff}"


def test_upgrade_downgrade_upgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nested' / 'folder' / 'm.db'}"
    upgrade(url)
    assert current_revision(url) == head_revision()
    engine = create_engine(url)
    tables = set(inspect(engine).get_table_names())
    assert {
        "tasks",
        "rounds",
        "prompts",
        "assignments",
        "attempts",
        "examples",
        "validations",
        "users",
        "api_tokens",
        "task_workers",
        "model_versions",
        "audit_log",
    } <= tables
    downgrade(url, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(url)
    upgrade(url)  # idempotent
    assert current_revision(url) == head_revision()
    engine.dispose()


def test_named_constraints_guard_the_invariants(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        inspector = inspect(engine)
        uniques = {c["name"] for c in inspector.get_unique_constraints("validations")}
        assert "uq_validations_example_validator" in uniques
        assert "uq_attempts_assignment_idempotency_key" in {
            c["name"] for c in inspector.get_unique_constraints("attempts")
        }
        assert "uq_api_tokens_token_hash" in {c["name"] for c in inspector.get_unique_constraints("api_tokens")}
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_0005_makes_each_tasks_creator_its_owner(backend: str, tmp_path: Path) -> None:
    """A database at 0004 (before task ownership) with a task created by Rita and one created
    from the command line (no creator): after the upgrade Rita owns hers, the other has no
    owner (admins only); the downgrade drops the table and keeps the tasks."""
    with ExitStack() as stack:
        url, engine = _database_at(stack, backend, tmp_path, "0004")
        tables = MetaData()
        tables.reflect(engine, only=["users", "tasks"])
        users, tasks = tables.tables["users"], tables.tables["tasks"]
        created = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
        with engine.begin() as connection:
            for username in ("ada", "rita"):
                connection.execute(
                    users.insert().values(username=username, roles=["researcher"], is_active=True, created_at=created)
                )
            rita = connection.execute(select(users.c.id).where(users.c.username == "rita")).scalar_one()
            for name, creator in (("dynasent-r2", rita), ("isarcasm", None)):
                connection.execute(
                    tasks.insert().values(
                        name=name,
                        title=name,
                        family="single_label",
                        definition={},
                        definition_yaml="",
                        created_by_id=creator,
                        created_at=created,
                    )
                )
        upgrade(url)
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT t.name, u.username, m.role, m.added_by_id, m.created_at FROM task_members m "
                    "JOIN tasks t ON t.id = m.task_id JOIN users u ON u.id = m.user_id ORDER BY m.id"
                )
            ).all()
        assert [tuple(row[:4]) for row in rows] == [("dynasent-r2", "rita", "owner", rita)]
        when = rows[0][4] if isinstance(rows[0][4], dt.datetime) else dt.datetime.fromisoformat(rows[0][4])
        assert when.replace(tzinfo=None) == created.replace(tzinfo=None)
        # The ORM reads the migrated row as it writes its own.
        with Session(engine) as session:
            task = session.scalars(select(Task).where(Task.name == "dynasent-r2")).one()
            assert [(m.user_id, m.role) for m in task.members] == [(rita, TaskRole.owner)]
        downgrade(url, "0004")
        assert "task_members" not in inspect(engine).get_table_names()
        with engine.connect() as connection:
            assert connection.execute(text("SELECT COUNT(*) FROM tasks")).scalar_one() == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_0015_marks_link_made_workers_and_fills_in_each_sessions_round_and_role(backend: str, tmp_path: Path) -> None:
    """A database at 0014 with an admin-made writer, a worker a study link made, and that worker
    holding two writer sessions of one round through two links (the double completion of issue
    26): after the upgrade the link's worker is link-made and the admin's is not; the older
    session takes its round and role, the later one keeps NULL (so the unique index could be
    built); the downgrade drops the columns and keeps the rows."""
    with ExitStack() as stack:
        url, engine = _database_at(stack, backend, tmp_path, "0014")
        tables = MetaData()
        tables.reflect(engine, only=["users", "tasks", "rounds", "study_links", "platform_accounts", "study_sessions"])
        t = tables.tables
        now = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)
        with engine.begin() as connection:

            def insert(table: str, **values: object) -> int:
                return int(connection.execute(t[table].insert().values(**values)).inserted_primary_key[0])

            admin_made = insert("users", username="walt", roles=["writer"], is_active=True, created_at=now)
            worker = insert("users", username="prolific-abc", roles=["writer"], is_active=True, created_at=now)
            insert("platform_accounts", platform="prolific", id_hash="h" * 64, user_id=worker, created_at=now)
            task = insert(
                "tasks",
                name="dynasent-r2",
                title="t",
                family="single_label",
                definition={},
                definition_yaml="",
                created_at=now,
            )
            round_ = insert(
                "rounds",
                task_id=task,
                number=1,
                status="collecting",
                model_servers=[],
                prompt_strategy="unused_first",
                no_prompt_fraction=0.0,
                target_label_mode="balanced",
                created_at=now,
            )
            links = [
                insert(
                    "study_links",
                    slug=f"slug-{i}",
                    name=f"writers {i}",
                    task_id=task,
                    round_id=round_,
                    role="writer",
                    platform="prolific",
                    quota=1,
                    completion_code=f"CODE{i}",
                    created_at=now,
                )
                for i in range(2)
            ]
            sessions = [
                insert(
                    "study_sessions",
                    link_id=link,
                    user_id=worker,
                    status="completed",
                    units_done=1,
                    started_at=now,
                    last_seen_at=now,
                )
                for link in links
            ]
        upgrade(url)
        with engine.connect() as connection:
            made = dict(connection.execute(text("SELECT id, made_by_link FROM users")).all())
            rows = connection.execute(text("SELECT id, round_id, role, token_id FROM study_sessions ORDER BY id")).all()
            link_row = connection.execute(
                text("SELECT other_role_allowed, when_out_of_work, partial_code FROM study_links ORDER BY id")
            ).first()
        assert bool(made[worker]) is True and bool(made[admin_made]) is False
        assert [tuple(row) for row in rows] == [(sessions[0], round_, "writer", None), (sessions[1], None, None, None)]
        assert link_row is not None and (bool(link_row[0]), link_row[1], link_row[2]) == (False, "complete", None)
        downgrade(url, "0014")
        columns = {c["name"] for c in inspect(engine).get_columns("study_sessions")}
        assert "round_id" not in columns and "token_id" not in columns
        with engine.connect() as connection:
            assert connection.execute(text("SELECT COUNT(*) FROM study_sessions")).scalar_one() == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_0021_makes_version_1_of_each_pay_block_and_stamps_the_ledger(backend: str, tmp_path: Path) -> None:
    """A database at 0019 with a task whose definition has a pay block and two ledger rows (one
    a correction), and a task without one: after the upgrade the first has pay policy version 1
    (its pay block, effective from the task's creation) and its computed row names version 1,
    the correction none; the second task has no version. The downgrade drops both again."""
    pay = {"currency": "GBP", "base_pay": {"writer": 150, "validator": 100}, "writer_bonus_per_example": 10}
    with ExitStack() as stack:
        url, engine = _database_at(stack, backend, tmp_path, "0019")
        tables = MetaData()
        tables.reflect(engine, only=["users", "tasks", "ledger_entries"])
        t = tables.tables
        created = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)
        with engine.begin() as connection:

            def insert(table: str, **values: object) -> int:
                return int(connection.execute(t[table].insert().values(**values)).inserted_primary_key[0])

            worker = insert("users", username="wanda", roles=["writer"], is_active=True, created_at=created)
            paid, unpaid = (
                insert(
                    "tasks",
                    name=name,
                    title="t",
                    family="single_label",
                    definition=definition,
                    definition_yaml="",
                    created_at=created,
                )
                for name, definition in (("paid-task", {"pay": pay}), ("unpaid-task", {}))
            )
            row = {"task_id": paid, "user_id": worker, "currency": "GBP", "reason": "r", "created_at": created}
            base = insert("ledger_entries", kind="base_pay", event_key="session:1", amount_minor=150, **row)
            insert(
                "ledger_entries",
                kind="correction",
                event_key="correction:1:1",
                amount_minor=-5,
                corrects_id=base,
                **row,
            )
        upgrade(url)
        with engine.connect() as connection:
            versions = connection.execute(
                text("SELECT task_id, version, policy, effective_from FROM pay_policies")
            ).all()
            stamped = connection.execute(text("SELECT kind, pay_policy_version FROM ledger_entries ORDER BY id")).all()
        assert len(versions) == 1
        task_id, version, policy, effective_from = versions[0]
        assert (task_id, version) == (paid, 1) and unpaid != paid
        assert (json.loads(policy) if isinstance(policy, str) else policy) == pay
        assert str(effective_from).startswith("2026-11-01 09:00:00")
        assert [tuple(r) for r in stamped] == [("base_pay", 1), ("correction", None)]
        downgrade(url, "0019")
        assert "pay_policies" not in inspect(engine).get_table_names()
        assert "pay_policy_version" not in {c["name"] for c in inspect(engine).get_columns("ledger_entries")}


@pytest.mark.parametrize("backend", BACKENDS)
def test_0023_copies_each_imported_examples_id_into_source_id(backend: str, tmp_path: Path) -> None:
    """A database at 0022 with two imported examples (one with ``source_metadata.id``, one
    without) and a written-like example whose metadata happens to have an id: after the upgrade
    only the imported example with an id has ``source_id``; the downgrade drops the column and
    leaves the metadata as it was."""
    with ExitStack() as stack:
        url, engine = _database_at(stack, backend, tmp_path, "0022")
        tables = MetaData()
        tables.reflect(engine, only=["tasks", "rounds", "examples"])
        t = tables.tables
        now = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)
        with engine.begin() as connection:
            task = connection.execute(
                t["tasks"]
                .insert()
                .values(name="t", title="t", family="single_label", definition={}, definition_yaml="", created_at=now)
            ).inserted_primary_key[0]
            round_ = connection.execute(
                t["rounds"]
                .insert()
                .values(
                    task_id=task,
                    number=1,
                    status="closed",
                    model_servers=[],
                    prompt_strategy="unused_first",
                    no_prompt_fraction=0.0,
                    target_label_mode="balanced",
                    created_at=now,
                )
            ).inserted_primary_key[0]
            for origin, metadata in (
                ("imported", {"row": 1, "id": "sent-0042 "}),
                ("imported", {"row": 2}),
                ("harvested", {"id": "doc-7"}),
            ):
                connection.execute(
                    t["examples"]
                    .insert()
                    .values(
                        round_id=round_,
                        origin=origin,
                        source_metadata=metadata,
                        condition="prompt",
                        text="a text",
                        target_label=[],
                        fooled=False,
                        extras={},
                        status="validated",
                        validation_count=0,
                        validations_needed=0,
                        requeue_count=0,
                        created_at=now,
                    )
                )
        upgrade(url)
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT origin, source_id FROM examples ORDER BY id")).all()
        assert [tuple(row) for row in rows] == [("imported", "sent-0042 "), ("imported", None), ("harvested", None)]
        downgrade(url, "0022")
        assert "source_id" not in {c["name"] for c in inspect(engine).get_columns("examples")}
        with engine.connect() as connection:
            kept = connection.execute(text("SELECT source_metadata FROM examples ORDER BY id")).scalars().all()
        first = kept[0]
        assert (json.loads(first) if isinstance(first, str) else first) == {"row": 1, "id": "sent-0042 "}


@pytest.mark.parametrize("backend", BACKENDS)
def test_0024_marks_the_accounts_earlier_imports_made_and_no_other(backend: str, tmp_path: Path) -> None:
    """A database at 0023 with an earlier import's account, an admin-made user who took a name
    like it, a deactivated link-made worker without a password and an ordinary user: after the
    upgrade only the import's account is ``made_by_import``; the downgrade drops the column."""
    with ExitStack() as stack:
        url, engine = _database_at(stack, backend, tmp_path, "0023")
        tables = MetaData()
        tables.reflect(engine, only=["users"])
        users = tables.tables["users"]
        now = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)
        people = [
            # username, display name, password hash, active, made by link
            ("imported-0123456789abcdef0123", "imported worker", None, False, False),
            ("imported-lookalike", "an admin's choice", "$argon2id$...", True, False),
            ("prolific-0123456789ab", None, None, False, True),
            ("alice", "Alice", "$argon2id$...", True, False),
        ]
        with engine.begin() as connection:
            for username, display_name, password_hash, active, by_link in people:
                connection.execute(
                    users.insert().values(
                        username=username,
                        display_name=display_name,
                        roles=["validator"],
                        password_hash=password_hash,
                        is_active=active,
                        made_by_link=by_link,
                        created_at=now,
                    )
                )
        upgrade(url)
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT username, made_by_import FROM users ORDER BY id")).all()
        assert [(name, bool(flag)) for name, flag in rows] == [
            ("imported-0123456789abcdef0123", True),
            ("imported-lookalike", False),
            ("prolific-0123456789ab", False),
            ("alice", False),
        ]
        downgrade(url, "0023")
        assert "made_by_import" not in {c["name"] for c in inspect(engine).get_columns("users")}
