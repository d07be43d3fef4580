"""`dynaloop db`: the database schema (Alembic migrations)."""

from __future__ import annotations

import typer

from dynaloop.commands.common import DatabaseOpt, console, redact, settings_for

app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)


@app.command("upgrade")
def db_upgrade(database_url: DatabaseOpt = None, revision: str = "head") -> None:
    """Create or update the schema to the newest migration."""
    from services.db.migrate import current_revision, upgrade

    url = settings_for(database_url).resolved_database_url
    upgrade(url, revision)
    console.print(f"schema at revision {current_revision(url)} ({redact(url)})")


@app.command("downgrade")
def db_downgrade(revision: str, database_url: DatabaseOpt = None) -> None:
    """Step the schema back to REVISION (e.g. `base`). Data in dropped tables is lost."""
    from services.db.migrate import downgrade

    downgrade(settings_for(database_url).resolved_database_url, revision)


@app.command("current")
def db_current(database_url: DatabaseOpt = None) -> None:
    """Print the schema revision of the database and of the code."""
    from services.db.migrate import current_revision, head_revision

    url = settings_for(database_url).resolved_database_url
    console.print(f"database: {current_revision(url)}  code: {head_revision()}")
