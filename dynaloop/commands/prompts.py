"""`dynaloop prompts`: prompt sets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynaloop.commands.common import DatabaseOpt, console, ensure_schema, fail, session_factory, settings_for

app = typer.Typer(help="Prompt sets.", no_args_is_help=True)


@app.command("import")
def prompts_import(
    task: Annotated[str, typer.Option(help="Task name")],
    file: Annotated[Path, typer.Argument(help="JSONL or CSV file with a `text` field/column")],
    round_number: Annotated[int | None, typer.Option("--round", help="Round number; default: the open round")] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """Import prompts into a round's prompt set (all rows checked first; duplicates skipped)."""
    from sqlalchemy import select

    from services.db.engine import session_scope
    from services.db.models import Round, RoundStatus
    from services.domain import round_lifecycle, tasks
    from services.errors import DomainError

    settings = settings_for(database_url)
    url = settings.resolved_database_url
    ensure_schema(url)
    suffix = file.suffix.lower()
    file_format = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}.get(suffix)
    if file_format is None:
        raise fail(f"cannot tell the format of {file.name}; name it .jsonl or .csv")
    try:
        content = file.read_bytes()
    except FileNotFoundError as exc:
        raise fail(f"no file {file}") from exc
    try:
        with session_scope(session_factory(url)) as session:
            task_row = tasks.get_task(session, task)
            if round_number is None:
                round_ = session.scalar(
                    select(Round).where(
                        Round.task_id == task_row.id, Round.status.in_([RoundStatus.collecting, RoundStatus.validating])
                    )
                )
                if round_ is None:
                    raise fail(f"task {task!r} has no open round; give --round")
            else:
                round_ = round_lifecycle.get_round_by_number(session, task_row, round_number)
            report = round_lifecycle.import_prompts(
                session, None, round_, content, file_format, max_rows=settings.max_prompt_import_rows
            )
    except DomainError as exc:
        raise fail(exc.message) from exc
    console.print(
        f"imported {report.imported} of {report.rows} rows "
        f"({report.duplicates_in_file} repeated in the file, {report.already_present} already present)"
    )
