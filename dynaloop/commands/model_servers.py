"""`dynaloop model servers`: the registry of model servers the API may call (admins).

Whoever runs these commands has the server's shell and database: an admin. Rounds and promote
jobs name the servers registered here; the API calls no other URL and sends a server's admin
token nowhere but to the URL registered with it (services/domain/model_servers.py)."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.table import Table

from dynaloop.commands.common import (
    DatabaseOpt,
    console,
    domain_session,
    ensure_schema,
    fail,
    session_factory,
    settings_for,
)

app = typer.Typer(
    help="The model servers the API may call (register, list, remove) and the tasks each is granted to "
    "(grant, revoke); rounds and promotions name them.",
    no_args_is_help=True,
)


@app.command("register")
def servers_register(
    name: Annotated[str, typer.Argument(help="A slug (a-z, 0-9, -), e.g. model-0")],
    url: Annotated[str, typer.Argument(help="The server's base URL, e.g. http://127.0.0.1:8001")],
    admin_token_env: Annotated[
        str | None,
        typer.Option(
            help="Name of an environment variable that holds the server's admin token (for promotions), "
            "e.g. DYNALOOP_MODEL_SERVER_ADMIN_TOKEN; the token itself never goes on the command line"
        ),
    ] = None,
    description: Annotated[str | None, typer.Option(help="What the server is for")] = None,
    update: Annotated[bool, typer.Option(help="Change the URL (and token) of a server already registered")] = False,
    database_url: DatabaseOpt = None,
) -> None:
    """Register a model server (any http(s) host, local ones included: which hosts the API may
    call is the admin's decision)."""
    from services.domain import model_servers

    token = None
    if admin_token_env is not None:
        token = os.environ.get(admin_token_env)
        if not token:
            raise fail(f"the environment variable {admin_token_env} is not set or empty")
    with domain_session(database_url) as session:
        existing = model_servers.find_server(session, name)
        if existing is not None and update:
            changes: dict[str, object] = {"admin_token": token} if token is not None else {}
            if description is not None:
                changes["description"] = description
            model_servers.update(session, None, existing, url=url, **changes)
            verb = "updated"
        else:
            model_servers.register(session, None, name, url, admin_token=token, description=description)
            verb = "registered"
    console.print(
        f"{verb} model server {name} at {url.strip().rstrip('/')}"
        + (" with its admin token" if token else " (no admin token: models cannot be promoted to it)"),
        soft_wrap=True,
        highlight=False,
    )


@app.command("list")
def servers_list(database_url: DatabaseOpt = None) -> None:
    """The registered model servers (never their admin tokens)."""
    from services.db.engine import session_scope
    from services.domain import model_servers

    url_db = settings_for(database_url).resolved_database_url
    ensure_schema(url_db)
    table = Table("name", "url", "admin token", "granted to", "description")
    with session_scope(session_factory(url_db)) as session:
        for server in model_servers.list_servers(session):
            granted = ", ".join(task.name for task in model_servers.granted_tasks(session, server)) or "-"
            table.add_row(
                server.name, server.url, "set" if server.admin_token else "-", granted, server.description or ""
            )
    console.print(table)


@app.command("remove")
def servers_remove(name: str, database_url: DatabaseOpt = None) -> None:
    """Remove a model server (refused while an open round has it in its loop)."""
    from services.domain import model_servers

    with domain_session(database_url) as session:
        model_servers.remove(session, None, model_servers.get_server(session, name))
    console.print(f"removed model server {name}")


@app.command("grant")
def servers_grant(
    name: Annotated[str, typer.Argument(help="A registered model server, e.g. model-0")],
    task: Annotated[str, typer.Argument(help="The task whose researchers may use it, e.g. dynasent-r2")],
    database_url: DatabaseOpt = None,
) -> None:
    """Grant a model server to a task: its researchers may put it in their rounds' loop and, while
    no other task has it, promote their models to it (a server granted to several tasks is
    swapped by admins only)."""
    from services.domain import model_servers, tasks

    with domain_session(database_url) as session:
        server = model_servers.get_server(session, name)
        _, new = model_servers.grant(session, None, server, tasks.get_task(session, task))
        others = [t.name for t in model_servers.granted_tasks(session, server) if t.name != task]
    verb = "granted" if new else "already granted"
    shared = f"; shared with {', '.join(others)}: only admins may promote to it" if others else ""
    console.print(f"model server {name} {verb} to task {task}{shared}", soft_wrap=True, highlight=False)


@app.command("revoke")
def servers_revoke(
    name: Annotated[str, typer.Argument(help="A registered model server, e.g. model-0")],
    task: Annotated[str, typer.Argument(help="The task it is taken from")],
    database_url: DatabaseOpt = None,
) -> None:
    """Take a model server away from a task (refused while one of the task's open rounds has it
    in its loop)."""
    from services.domain import model_servers, tasks

    with domain_session(database_url) as session:
        model_servers.revoke(session, None, model_servers.get_server(session, name), tasks.get_task(session, task))
    console.print(f"model server {name} revoked from task {task}", soft_wrap=True, highlight=False)
