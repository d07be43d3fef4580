"""Alembic is the only source of the schema: migrations run both ways and match the models."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from services.db.migrate import current_revision, downgrade, head_revision, upgrade
from services.db.models import Base


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
