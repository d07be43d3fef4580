"""`dynaloop ledger`: the pay ledger of a task (docs/round_builder.md, "Pay and the ledger"):
compute it, show the totals or a worker's statement, correct a row, and pay bonuses in payout
batches (``dynaloop ledger batch create|list|show|file|paid|cancel|reconcile``), by hand or
through the platform's API (``dynaloop ledger pay BATCH``). The same use
cases as the API (services/domain/ledger.py, services/domain/payouts.py); the CLI acts as an
operator on the server (no user: rows it adds have no ``created_by``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from dynaloop.commands.common import DatabaseOpt, TaskOpt, console, domain_session, err, fail, settings_for

app = typer.Typer(help="The pay ledger: compute, show, correct, pay bonuses in batches.", no_args_is_help=True)


@app.command("compute")
def ledger_compute(
    task: TaskOpt,
    round_number: Annotated[
        int | None, typer.Option("--round", min=1, help="One round (its number); default all")
    ] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """Add the rows the task's pay policy gives that are not in the ledger yet."""
    from services.domain import ledger, round_lifecycle, tasks

    with domain_session(database_url) as session:
        found = tasks.get_task(session, task)
        round_ = round_lifecycle.get_round_by_number(session, found, round_number) if round_number is not None else None
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


batch_app = typer.Typer(
    help="Payout batches: record one study link's unpaid bonuses, write its file, mark it paid or cancel it, "
    "reconcile it with the platform's record.",
    no_args_is_help=True,
)
app.add_typer(batch_app, name="batch")


def _print_batch(batch: Any, lines: list[Any]) -> None:
    from services.domain import ledger

    print(
        f"# batch {batch.id}: link {batch.link_id} ({batch.platform.value}), {batch.status.value}, "
        f"{batch.line_count} lines, {ledger.format_amount(batch.total_minor, batch.currency)} {batch.currency}"
    )
    print("line\tworker_id\tassignment_id\tamount\tunique_request_token\tplatform_status\tplatform_reference")
    for line in lines:
        print(
            f"{line.line_number}\t{line.platform_worker_id}\t{line.assignment_id or ''}\t"
            f"{ledger.format_amount(line.amount_minor, batch.currency)}\t{line.unique_request_token}\t"
            f"{line.platform_status or ''}\t{line.platform_reference or ''}"
        )
        if line.platform_status in ("failed", "unknown") and line.platform_answer:
            print(f"#\tline {line.line_number}: {json.dumps(line.platform_answer, sort_keys=True)[:500]}")


def _task_batch(session: Any, task: str, batch_id: int) -> Any:
    from services.domain import payouts, tasks

    found = tasks.get_task(session, task)
    batch = payouts.get_batch(session, batch_id)
    if batch.task_id != found.id:
        raise fail(f"no payout batch {batch_id} on task {task!r}")
    return batch


@batch_app.command("create")
def batch_create(
    task: TaskOpt,
    link_id: Annotated[int, typer.Option("--link-id", min=1, help="The study link (Prolific study, MTurk HIT group)")],
    out: Annotated[Path | None, typer.Option(help="Also write the batch's file here")] = None,
    note: Annotated[str | None, typer.Option(help="A note kept with the batch")] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """Record a payout batch of the link's bonuses that no batch holds yet. Workers held back
    and bonuses that other links (or none) pay are named on standard error."""
    from sqlalchemy import select

    from services.db.models import StudyLink
    from services.domain import payouts, tasks

    with domain_session(database_url) as session:
        found = tasks.get_task(session, task)
        link = session.scalar(select(StudyLink).where(StudyLink.id == link_id, StudyLink.task_id == found.id))
        if link is None:
            raise fail(f"no study link {link_id} on task {task!r}")
        created = payouts.create_batch(session, None, found, link, note=note)
        _print_batch(created.batch, payouts.lines_of(session, created.batch))
        text = created.batch.file_text
        held = list(created.held_back)
        elsewhere = list(created.elsewhere)
    if out is not None:
        out.write_bytes(text.encode("utf-8"))
        err.print(f"file written to {out}")
    for h in held:
        err.print(f"held back: {h.username} ({h.amount_minor} minor units): {h.reason}", highlight=False)
    for e in elsewhere:
        err.print(f"not in this batch: {', '.join(e.usernames)}: {e.advice}", highlight=False)


@batch_app.command("list")
def batch_list(task: TaskOpt, database_url: DatabaseOpt = None) -> None:
    """The task's payout batches, oldest first."""
    from services.domain import ledger, payouts, tasks

    with domain_session(database_url) as session:
        print("id\tlink\tplatform\tstatus\tlines\ttotal\tcurrency\tcreated")
        for b in payouts.list_batches(session, tasks.get_task(session, task)):
            print(
                f"{b.id}\t{b.link_id}\t{b.platform.value}\t{b.status.value}\t{b.line_count}\t"
                f"{ledger.format_amount(b.total_minor, b.currency)}\t{b.currency}\t{b.created_at.isoformat()}"
            )


@batch_app.command("show")
def batch_show(
    batch_id: Annotated[int, typer.Argument(min=1)], task: TaskOpt, database_url: DatabaseOpt = None
) -> None:
    """One batch with its lines."""
    from services.domain import payouts

    with domain_session(database_url) as session:
        batch = _task_batch(session, task, batch_id)
        _print_batch(batch, payouts.lines_of(session, batch))


@batch_app.command("file")
def batch_file(
    batch_id: Annotated[int, typer.Argument(min=1)],
    task: TaskOpt,
    out: Annotated[Path | None, typer.Option(help="File to write; default: standard output")] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """The batch's file, the same bytes as when it was created."""
    with domain_session(database_url) as session:
        text = _task_batch(session, task, batch_id).file_text
    if out is None:
        print(text, end="")
    else:
        out.write_bytes(text.encode("utf-8"))
        err.print(f"file written to {out}")


@batch_app.command("paid")
def batch_paid(
    batch_id: Annotated[int, typer.Argument(min=1)], task: TaskOpt, database_url: DatabaseOpt = None
) -> None:
    """Mark a created batch paid (the platform paid its file)."""
    from services.domain import payouts

    with domain_session(database_url) as session:
        batch = payouts.mark_paid(session, None, _task_batch(session, task, batch_id))
        console.print(f"payout batch {batch.id} marked paid")


@batch_app.command("cancel")
def batch_cancel(
    batch_id: Annotated[int, typer.Argument(min=1)], task: TaskOpt, database_url: DatabaseOpt = None
) -> None:
    """Cancel a created batch that was never paid: its bonuses become payable again."""
    from services.domain import payouts

    with domain_session(database_url) as session:
        batch = payouts.cancel(session, None, _task_batch(session, task, batch_id))
        console.print(f"payout batch {batch.id} cancelled; its bonuses are payable again")


@batch_app.command("reconcile")
def batch_reconcile(
    batch_id: Annotated[int, typer.Argument(min=1)],
    record: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The platform's record of what it paid")],
    task: TaskOpt,
    database_url: DatabaseOpt = None,
) -> None:
    """Compare the batch with the platform's record (a CSV, or MTurk's ListBonusPayments JSON) and
    record the report: matched, missing and unexpected lines. Exit status 1 when any line is
    missing or unexpected."""
    from rounds.models import payout_records
    from services.domain import payouts

    settings = settings_for(database_url)
    size = record.stat().st_size
    if size > settings.max_upload_decoded_bytes:
        raise fail(f"{record} is {size:,} bytes, more than DYNALOOP_MAX_UPLOAD_DECODED_BYTES allows")
    bounds = payout_records.record_bounds(settings)
    with domain_session(database_url) as session:
        batch = _task_batch(session, task, batch_id)
        rows = payout_records.parse_record(record.read_bytes(), batch.platform, batch.currency, bounds)
        report = payouts.reconcile(session, None, batch, rows)
    print(json.dumps(report.as_dict(), indent=2))
    if report.missing or report.unexpected:
        raise typer.Exit(1)


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


@app.command("pay")
def ledger_pay(
    batch_id: Annotated[int, typer.Argument(min=1, help="The payout batch (`dynaloop ledger batch list`)")],
    task: TaskOpt,
    study_id: Annotated[
        str | None,
        typer.Option("--study-id", help="Prolific: the study, where no session of the batch recorded its STUDY_ID"),
    ] = None,
    take_over: Annotated[
        bool, typer.Option("--take-over", help="Take the batch from a pay run you know has crashed")
    ] = False,
    record_line: Annotated[
        str | None,
        typer.Option(
            "--record-line",
            help="Record, instead of paying, what the platform shows for a line without a clear answer: "
            "its number (MTurk) or all (Prolific)",
        ),
    ] = None,
    outcome: Annotated[str | None, typer.Option("--as", help="With --record-line: paid or failed")] = None,
    setup_id: Annotated[
        str | None, typer.Option("--setup-id", help="With --record-line all --as failed: the set-up Prolific shows")
    ] = None,
    reference: Annotated[
        str | None, typer.Option("--reference", help="With --record-line: the platform's reference for the payment")
    ] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """Pay a created payout batch through its platform's API: Prolific (one bulk bonus on the
    batch's study: set up, then paid) or MTurk (send_bonus per line with its token). Each line's
    answer is recorded as it comes; lines paid before are never sent again, nor lines without a
    clear answer (check them on the platform and record them with --record-line). A batch whose
    every line is paid is marked paid. Exit status 1 while any line is not paid."""
    from services.domain import ledger, payouts

    settings = settings_for(database_url)
    if record_line is None and (outcome or setup_id or reference):
        raise fail("--as, --setup-id and --reference go with --record-line")
    with domain_session(database_url) as session:
        batch = _task_batch(session, task, batch_id)
        if record_line is not None:
            if outcome is None:
                raise fail("--record-line needs --as paid or --as failed")
            if record_line != "all" and not record_line.isdigit():
                raise fail("--record-line is a line number or all")
            number = None if record_line == "all" else int(record_line)
            recorded = payouts.record_line_outcome(
                session, None, batch, number, outcome, settings, setup_id=setup_id, reference=reference
            )
            console.print(
                f"payout batch {batch.id}: lines {', '.join(str(line.line_number) for line in recorded)} recorded "
                f"as {outcome}" + ("; the batch is paid" if batch.status.value == "paid" else ""),
                highlight=False,
            )
            return
        run = payouts.pay_batch_through_platform(session, None, batch, settings, study_id=study_id, take_over=take_over)
        lines = payouts.lines_of(session, batch)
        print("line\tworker_id\tamount\tstatus\tplatform_reference")
        for line in lines:
            amount = ledger.format_amount(line.amount_minor, batch.currency)
            print(
                f"{line.line_number}\t{line.platform_worker_id}\t{amount}"
                f"\t{line.platform_status or 'not sent'}\t{line.platform_reference or ''}"
            )
        status = batch.status.value
    sent = f"{len(run.sent)} lines sent to {run.platform}" if run.sent else f"nothing sent to {run.platform}"
    err.print(f"payout batch {batch_id}: {sent}; the batch is {status}", highlight=False)
    for advice in run.advice:
        err.print(f"to do: {advice}", highlight=False, soft_wrap=True)
    if status != "paid":
        raise typer.Exit(1)
