"""`dynaloop ledger`: the pay ledger of a task (docs/round_builder.md, "Pay and the ledger"):
compute it, show the totals or a worker's statement, export a platform's bulk-bonus file and
correct a row. The same use cases as the API (services/domain/ledger.py); the CLI acts as an
operator on the server (no user: rows it adds have no ``created_by``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynaloop.commands.common import DatabaseOpt, TaskOpt, console, domain_session, err, fail

app = typer.Typer(help="The pay ledger: compute, show, export bonuses, correct.", no_args_is_help=True)


@app.command("compute")
def ledger_compute(
    task: TaskOpt,
    round_number: Annotated[
        int | None, typer.Option("--round", min=1, help="One round (its number); default all")
    ] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """Add the rows the task's pay policy gives that are not in the ledger yet."""
    from services.domain import ledger, rounds, tasks

    with domain_session(database_url) as session:
        found = tasks.get_task(session, task)
        round_ = rounds.get_round_by_number(session, found, round_number) if round_number is not None else None
        computed = ledger.compute_ledger(session, None, found, round_)
        added = sum(e.amount_minor for e in computed.added)
        console.print(
            f"{len(computed.added)} rows added ({ledger.format_amount(added, computed.currency)} "
            f"{computed.currency}); {computed.already} events were paid already"
        )


@app.command("show")
def ledger_show(
    task: TaskOpt,
    user_id: Annotated[int | None, typer.Option("--user-id", min=1, help="One worker's statement")] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """The totals per worker, or one worker's statement (amounts in minor units)."""
    from services.domain import ledger, tasks

    with domain_session(database_url) as session:
        found = tasks.get_task(session, task)
        if user_id is not None:
            statement = ledger.worker_statement(session, found, user_id)
            print(f"# {statement.username} on {statement.task} ({statement.currency}, minor units)")
            print("id\tkind\tevent\tamount\tcorrects\treason")
            for entry in statement.entries:
                print(
                    f"{entry.id}\t{entry.kind.value}\t{entry.event_key}\t{entry.amount_minor}\t"
                    f"{entry.corrects_id or ''}\t{entry.reason}"
                )
            print(f"total\t\t\t{statement.totals.total}")
            return
        totals = ledger.ledger_totals(session, found)
        print(f"# {totals.task} ({totals.currency or 'no currency'}, minor units)")
        print("user_id\tusername\tbase_pay\twriter_bonus\tvalidator_bonus\tcorrections\ttotal")
        for w in totals.workers:
            print(
                f"{w.user_id}\t{w.username}\t{w.base_pay}\t{w.writer_bonus}\t{w.validator_bonus}\t"
                f"{w.corrections}\t{w.total}"
            )
        print(f"total\t\t\t\t\t\t{totals.total}")


@app.command("export")
def ledger_export(
    task: TaskOpt,
    platform: Annotated[str, typer.Option(help="prolific or mturk")],
    out: Annotated[Path | None, typer.Option(help="File to write; default: standard output")] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """The platform's bulk-bonus file. Workers with bonuses but no id on the platform are named
    on standard error (they are not in the file)."""
    from services.domain import ledger, tasks

    with domain_session(database_url) as session:
        export = ledger.bonus_csv(session, tasks.get_task(session, task), platform)
    if out is None:
        print(export.text, end="")
    else:
        out.write_text(export.text, encoding="utf-8")
        err.print(f"{export.lines} lines written to {out}")
    if export.without_platform_id:
        err.print(
            f"{len(export.without_platform_id)} workers with bonuses have no {export.platform.value} id "
            f"(pay them another way): {', '.join(export.without_platform_id)}",
            highlight=False,
        )
    if export.invalid_platform_id:
        err.print(
            f"{len(export.invalid_platform_id)} workers with bonuses have an id {export.platform.value} never issues "
            f"(left out; check them by hand): {', '.join(export.invalid_platform_id)}",
            highlight=False,
        )


@app.command("correct")
def ledger_correct(
    entry_id: Annotated[int, typer.Argument(min=1, help="The ledger row to correct")],
    amount_minor: Annotated[int, typer.Option("--amount", help="Minor units to add (negative takes back)")],
    reason: Annotated[str, typer.Option(help="Why; shown on the worker's statement")],
    task: TaskOpt,
    database_url: DatabaseOpt = None,
) -> None:
    """Add a correction row to a ledger row of the task (the row itself never changes)."""
    from services.domain import ledger, tasks

    with domain_session(database_url) as session:
        found = tasks.get_task(session, task)
        entry = ledger.get_entry(session, entry_id)
        if entry.task_id != found.id:
            raise fail(f"no ledger entry {entry_id} on task {task!r}")
        row = ledger.add_correction(session, None, entry, amount_minor, reason)
        console.print(f"correction {row.id} added: {row.event_key}, {row.amount_minor} minor units")
