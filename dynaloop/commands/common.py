"""What every command group shares: the consoles, the ``--database-url`` and ``--task``
options, settings, the session factory, the schema check and error output."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from model_server.directory.runtime import PRECISION_CHOICES
from services.extras import install_hint, missing_modules

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from services.settings import Settings

console = Console()
err = Console(stderr=True)

DatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="DYNALOOP_DATABASE_URL",
        help="SQLAlchemy URL; default: SQLite file in DYNALOOP_DATA_DIR.",
    ),
]
TaskOpt = Annotated[str, typer.Option("--task", help="Task name")]


def _precision_choice(value: str) -> str:
    if value not in PRECISION_CHOICES:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(PRECISION_CHOICES)}")
    return value


PrecisionOpt = Annotated[
    str,
    typer.Option(
        callback=_precision_choice,
        help="What the model's forward passes run at: fp32; bf16 (CPUs with AVX512-BF16/AMX, GPUs); int8 (CPU, "
        "ONNX Runtime); auto: per batch size the fastest precision the model's precision check admits "
        "(docs/models.md, Precision)",
    ),
]


def settings_for(database_url: str | None = None) -> Settings:
    """The settings from the environment, with ``--database-url`` when given; exit 2 when invalid."""
    from services.settings import Settings

    try:
        settings = Settings()
    except Exception as exc:  # pydantic's ValidationError: show its message, not a traceback
        err.print(f"[red]settings error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if database_url:
        settings = settings.model_copy(update={"database_url": database_url})
    return settings


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``message`` as an error, on one line however wide the terminal (a log or a pipe
    reads it whole; a terminal wraps it itself); raise the returned exit."""
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(code)


def require_extras(*extras: str) -> None:
    """Stop with a message naming each extra (pyproject.toml) whose packages this install lacks,
    before a command that needs them starts anything."""
    lacking = {extra: missing for extra in extras if (missing := missing_modules(extra))}
    if lacking:
        what = "; ".join(f"{', '.join(missing)} (the {extra!r} extra)" for extra, missing in lacking.items())
        raise fail(f"not installed here: {what}. Install with `{install_hint(','.join(lacking))}`")


def problems(exc: ValidationError) -> str:
    """A pydantic error as one line: ``field: message; ...``."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())


def session_factory(url: str) -> sessionmaker[Session]:
    from services.db.engine import make_engine, make_sessionmaker

    return make_sessionmaker(make_engine(url))


def ensure_schema(url: str) -> None:
    from services.db.migrate import current_revision, head_revision

    if current_revision(url) != head_revision():
        raise fail("the database schema is not up to date; run `dynaloop db upgrade` first")


@contextmanager
def domain_session(database_url: str | None = None) -> Iterator[Session]:
    """A unit of work on the database of ``--database-url`` (its schema up to date), committed
    when the block ends; a domain error (a missing task, a refused password...) becomes the
    command's error message and exit code 1, with nothing saved."""
    from services.db.engine import session_scope
    from services.errors import DomainError

    url = settings_for(database_url).resolved_database_url
    ensure_schema(url)
    try:
        with session_scope(session_factory(url)) as session:
            yield session
    except DomainError as exc:
        raise fail(exc.message) from exc


def redact(url: str) -> str:
    """A database URL without its password."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def task_yaml(source: str) -> str:
    """The YAML of a task file, or of the shipped example named ``source``."""
    from services.taskdef import example_path

    path = Path(source)
    if not path.exists():
        try:
            path = example_path(source)
        except KeyError as exc:
            raise fail(f"{source} is neither a file nor an example task ({exc.args[0]})") from exc
    return path.read_text(encoding="utf-8")
