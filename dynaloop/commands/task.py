"""`dynaloop task`: task definitions (the shipped examples, checking and creating tasks)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.table import Table

from dynaloop.commands.common import (
    DatabaseOpt,
    console,
    domain_session,
    ensure_schema,
    err,
    fail,
    session_factory,
    settings_for,
    task_yaml,
)

app = typer.Typer(help="Task definitions.", no_args_is_help=True)


@app.command("list-examples")
def task_list_examples() -> None:
    """List the example task files that ship with dynaloop (one per seed paper)."""
    from services.taskdef import EXAMPLES_DIR, example_paths, load_task_definition

    table = Table()
    for column in ("example", "family", "language"):
        table.add_column(column, no_wrap=True)
    table.add_column("title")
    for path in example_paths():
        definition = load_task_definition(path)
        table.add_row(path.stem, definition.family.value, definition.language, definition.title)
    console.print(table)
    console.print(f"files in {EXAMPLES_DIR}; `dynaloop task show-example NAME` prints one", soft_wrap=True)


@app.command("show-example")
def task_show_example(name: str) -> None:
    """Print an example task's YAML (copy it to start your own task)."""
    from services.taskdef import example_path

    try:
        sys.stdout.write(example_path(name).read_text(encoding="utf-8"))
    except KeyError as exc:
        raise fail(str(exc.args[0])) from exc


@app.command("validate")
def task_validate(path: Path) -> None:
    """Check a task YAML file; print each problem with its field and fix."""
    from services.taskdef import TaskDefinitionError, load_task_definition

    try:
        definition = load_task_definition(path)
    except FileNotFoundError as exc:
        raise fail(f"no file {path}") from exc
    except TaskDefinitionError as exc:
        err.print(str(exc), highlight=False, markup=False)
        raise typer.Exit(1) from exc
    console.print(f"{path}: valid {definition.family.value} task {definition.name!r}")


@app.command("create")
def task_create(
    source: Annotated[str, typer.Argument(help="YAML file, or the name of a shipped example")],
    database_url: DatabaseOpt = None,
    owner: Annotated[
        str | None,
        typer.Option(help="The researcher who owns the task (without one, only admins manage it)"),
    ] = None,
) -> None:
    """Create a task in the database from a YAML file or a shipped example."""
    from services.domain import members
    from services.domain.tasks import create_task, definition_of, tokenizer_coverage_warnings

    with domain_session(database_url) as session:
        owning = members.researcher_account(session, owner) if owner else None
        task = create_task(session, None, task_yaml(source), owner=owning)
        console.print(f"created task {task.name!r} ({task.family})" + (f", owned by {owner!r}" if owner else ""))
        warnings = tokenizer_coverage_warnings(
            definition_of(task), max_unknown_token_share=settings_for(database_url).max_unknown_token_share
        )
    for warning in warnings:
        err.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)
    if not owner:
        err.print(
            f"task {task.name!r} has no owner: only admins manage it until you add one "
            f"(dynaloop task add-member {task.name} USERNAME --role owner)",
            highlight=False,
            markup=False,
        )


RoleOpt = Annotated[
    Literal["owner", "member"], typer.Option("--role", help="owner: also decides who else is on the task")
]


@app.command("add-member")
def task_add_member(task: str, username: str, role: RoleOpt = "member", database_url: DatabaseOpt = None) -> None:
    """Put a researcher on a task as owner or member (or change their role on it)."""
    from services.db.models import TaskRole
    from services.domain import members, tasks

    with domain_session(database_url) as session:
        _, created = members.set_member(session, None, tasks.get_task(session, task), username, TaskRole(role))
    console.print(f"{username!r} {'added to' if created else 'is now'} task {task!r} as {role}")


@app.command("remove-member")
def task_remove_member(task: str, username: str, database_url: DatabaseOpt = None) -> None:
    """Take a researcher off a task (never its last owner)."""
    from services.domain import members, tasks

    with domain_session(database_url) as session:
        members.remove_member(session, None, tasks.get_task(session, task), username)
    console.print(f"{username!r} is no longer on task {task!r}")


@app.command("members")
def task_members(task: str, database_url: DatabaseOpt = None) -> None:
    """List a task's owners and members."""
    from services.db.engine import session_scope
    from services.domain import members, tasks
    from services.errors import DomainError

    url = settings_for(database_url).resolved_database_url
    ensure_schema(url)
    table = Table()
    for column in ("username", "role", "added"):
        table.add_column(column, no_wrap=True)
    try:
        with session_scope(session_factory(url)) as session:
            for member in members.list_members(session, tasks.get_task(session, task)):
                table.add_row(member.user.username, member.role.value, f"{member.created_at:%Y-%m-%d %H:%M}")
    except DomainError as exc:
        raise fail(exc.message) from exc
    console.print(table)


MAX_POLICY_FILE_BYTES = 64 * 1024  # a pay policy is a few lines; anything larger is not one


@app.command("pay-policy")
def task_pay_policy(
    task: str,
    file: Annotated[
        Path | None,
        typer.Option("--file", help="YAML (or JSON) file with the new policy: the keys of a task YAML's `pay:` block"),
    ] = None,
    note: Annotated[str, typer.Option(help="Why the policy changes (kept with the version)")] = "",
    database_url: DatabaseOpt = None,
) -> None:
    """Show the task's pay policy and its versions; with --file, set a new version (it pays the
    work done from now on; rows already in the ledger never change)."""
    import json

    import yaml

    from services.domain import pay_policies, tasks
    from services.structured_input import load_yaml

    policy_data = None
    if file is not None:
        try:
            size = file.stat().st_size
        except OSError as exc:
            raise fail(f"cannot read {file}: {exc.strerror}") from exc
        if size > MAX_POLICY_FILE_BYTES:
            raise fail(f"{file} has {size:,} bytes; a pay policy file has at most {MAX_POLICY_FILE_BYTES:,}")
        try:
            policy_data = load_yaml(file.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise fail(f"{file} is not YAML: {exc}") from exc
        if isinstance(policy_data, dict) and set(policy_data) == {"pay"}:
            policy_data = policy_data["pay"]  # a `pay:` block copied from a task YAML
    with domain_session(database_url) as session:
        found = tasks.get_task(session, task)
        if policy_data is not None:
            row = pay_policies.set_pay_policy(session, None, found, policy_data, note=note)
            console.print(
                f"task {task!r}: pay policy version {row.version} is in force from "
                f"{row.effective_from:%Y-%m-%d %H:%M:%S} UTC",
                soft_wrap=True,
            )
        rows = pay_policies.versions(session, found)
        if not rows:
            err.print(
                f"warning: task {task!r} has no pay policy: no ledger is computed and workers are paid nothing "
                "beyond the platform's reward. Set one with --file.",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
            return
        table = Table()
        for column in ("version", "in force from (UTC)", "policy", "note"):
            table.add_column(column)
        for row in rows:
            table.add_row(
                str(row.version),
                f"{row.effective_from:%Y-%m-%d %H:%M:%S}",
                json.dumps(row.policy, sort_keys=True),
                row.note,
            )
    console.print(table)
