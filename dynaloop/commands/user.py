"""`dynaloop user`: users and API tokens."""

from __future__ import annotations

from typing import Annotated

import typer

from dynaloop.commands.common import (
    DatabaseOpt,
    console,
    domain_session,
    ensure_schema,
    fail,
    session_factory,
    settings_for,
)

app = typer.Typer(help="Users and API tokens.", no_args_is_help=True)

PasswordOpt = Annotated[str | None, typer.Option(help="Also allow password login")]


def _create_user(
    url: str, username: str, roles: list[str], password: str | None, display_name: str | None = None
) -> str:
    from services.db.engine import session_scope
    from services.domain import users
    from services.errors import DomainError

    ensure_schema(url)
    try:
        with session_scope(session_factory(url)) as session:
            user = users.create_user(session, None, username, roles, password=password, display_name=display_name)
            _, token = users.issue_token(session, None, user, name="cli")
    except DomainError as exc:
        raise fail(exc.message) from exc
    return token


@app.command("create-admin")
def user_create_admin(username: str, database_url: DatabaseOpt = None, password: PasswordOpt = None) -> None:
    """Create the first admin (also a researcher) and print their API token once."""
    token = _create_user(settings_for(database_url).resolved_database_url, username, ["admin", "researcher"], password)
    console.print(f"admin {username!r} created. API token (shown once):")
    print(token)


@app.command("create")
def user_create(
    username: str,
    role: Annotated[list[str], typer.Option("--role", help="writer, validator, researcher, admin")],
    database_url: DatabaseOpt = None,
    password: PasswordOpt = None,
    display_name: Annotated[
        str | None, typer.Option(help="Name shown in the web app: one line of text, no < or >")
    ] = None,
) -> None:
    """Create a user with the given roles and print their API token once."""
    token = _create_user(settings_for(database_url).resolved_database_url, username, role, password, display_name)
    console.print(f"user {username!r} created with roles {role}. API token (shown once):")
    print(token)


@app.command("password")
def user_password(
    username: str,
    password: Annotated[str, typer.Option(prompt=True, hide_input=True, confirmation_prompt=True)],
    database_url: DatabaseOpt = None,
) -> None:
    """Set a user's login password (at least 12 characters, not a common password)."""
    from services.domain import users

    with domain_session(database_url) as session:
        users.set_password(session, None, users.get_user(session, username), password)
    console.print(f"password of {username!r} set.")


@app.command("token")
def user_token(
    username: str, database_url: DatabaseOpt = None, name: str = "cli", expires_in_days: int | None = None
) -> None:
    """Issue a new API token for an existing user and print it once."""
    from services.domain import users

    with domain_session(database_url) as session:
        _, token = users.issue_token(session, None, users.get_user(session, username), name, expires_in_days)
    print(token)


@app.command("tokens")
def user_tokens(username: str, database_url: DatabaseOpt = None) -> None:
    """List a user's API tokens (id, name, prefix, dates); the tokens themselves are never stored."""
    from rich.table import Table

    from services.db.models import utcnow
    from services.domain import users

    with domain_session(database_url) as session:
        tokens = users.tokens_of(session, users.get_user(session, username))
        now = utcnow()
        table = Table("id", "name", "starts with", "created", "expires", "last used", "state")
        for token in tokens:
            if token.revoked_at is not None:
                state = f"revoked {token.revoked_at:%Y-%m-%d %H:%M}"
            elif token.expires_at is not None and token.expires_at <= now:
                state = "expired"
            else:
                state = "active"
            table.add_row(
                str(token.id),
                token.name,
                token.prefix,
                f"{token.created_at:%Y-%m-%d %H:%M}",
                f"{token.expires_at:%Y-%m-%d %H:%M}" if token.expires_at else "never",
                f"{token.last_used_at:%Y-%m-%d %H:%M}" if token.last_used_at else "never",
                state,
            )
    console.print(table if tokens else f"{username!r} has no tokens.")


@app.command("revoke-token")
def user_revoke_token(
    token_id: Annotated[int, typer.Argument(help="The token's id (`dynaloop user tokens USERNAME`)")],
    database_url: DatabaseOpt = None,
) -> None:
    """Revoke an API token at once (a lost token, a worker who left); revoking it again changes nothing."""
    from services.domain import users

    with domain_session(database_url) as session:
        token = users.revoke_token(session, None, users.get_token(session, token_id))
        console.print(f"token {token.id} ({token.name!r} of user {token.user.username!r}) is revoked.")
