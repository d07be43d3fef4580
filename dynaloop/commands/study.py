"""`dynaloop study link`: study links for crowd platforms (services/domain/study.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from dynaloop.commands.common import DatabaseOpt, TaskOpt, console, domain_session

if TYPE_CHECKING:
    from services.db.models import StudyLink

app = typer.Typer(help="Study links: crowdworkers arrive from a crowd platform.", no_args_is_help=True)
link_app = typer.Typer(help="Create, list and close study links.", no_args_is_help=True)
app.add_typer(link_app, name="link")

DEFAULT_WEB_URL = "http://127.0.0.1:8501"
WebUrlOpt = Annotated[str, typer.Option("--web-url", help="The web app's address, for the link's full URL")]


def link_url(web_url: str, link: StudyLink) -> str:
    """The address to post on the platform: the web app's /study/<slug> and the query the
    platform fills in."""
    from services.domain import study

    return f"{web_url.rstrip('/')}/study/{link.slug}{study.query_template(link)}"


@link_app.command("create")
def link_create(
    task: TaskOpt,
    name: Annotated[str, typer.Option(help="What you call the link")],
    round_number: Annotated[int, typer.Option("--round", help="Round number")],
    role: Annotated[str, typer.Option(help="writer or validator")],
    platform: Annotated[str, typer.Option(help="prolific, mturk or generic")],
    quota: Annotated[int, typer.Option(help="Examples per writer, or labels per validator")],
    max_workers: Annotated[
        int | None, typer.Option(help="Most sessions the link starts (required for prolific and mturk)")
    ] = None,
    id_parameter: Annotated[str | None, typer.Option(help="generic: the query parameter with the worker id")] = None,
    completion_code: Annotated[str | None, typer.Option(help="Default: 8 random letters and digits")] = None,
    screened_out_code: Annotated[str | None, typer.Option(help="The platform's code for screened-out workers")] = None,
    partial_code: Annotated[
        str | None, typer.Option(help="The platform's code for stopped workers (none: they return the study)")
    ] = None,
    partial_pay_minor: Annotated[
        int | None, typer.Option(help="Pay of a stopped session with the partial code (minor units)")
    ] = None,
    other_role_allowed: Annotated[
        bool, typer.Option(help="Take workers who came through a link of the other role")
    ] = False,
    when_out_of_work: Annotated[
        str, typer.Option(help="Validators whose round has no more work: complete, partial or return")
    ] = "complete",
    currency: Annotated[
        str | None, typer.Option(help="The currency the study pays in (Prolific: GBP or USD; MTurk: USD)")
    ] = None,
    web_url: WebUrlOpt = DEFAULT_WEB_URL,
    database_url: DatabaseOpt = None,
) -> None:
    """Create a study link for a round and a role, and print its URL."""
    from services.db.models import Platform, StudyRole
    from services.domain import round_lifecycle, study, tasks
    from services.errors import Invalid

    with domain_session(database_url) as session:
        try:
            role_, platform_ = StudyRole(role), Platform(platform)
        except ValueError as exc:
            raise Invalid(f"{exc}; role is writer or validator, platform prolific, mturk or generic") from exc
        task_ = tasks.get_task(session, task)
        round_ = round_lifecycle.get_round_by_number(session, task_, round_number)
        link = study.create_link(
            session,
            None,
            task_,
            name=name,
            round_id=round_.id,
            role=role_,
            platform=platform_,
            quota=quota,
            max_workers=max_workers,
            id_parameter=id_parameter,
            completion_code=completion_code,
            screened_out_code=screened_out_code,
            partial_code=partial_code,
            partial_pay_minor=partial_pay_minor,
            other_role_allowed=other_role_allowed,
            when_out_of_work=when_out_of_work,
            currency=currency,
        )
        url = link_url(web_url, link)
        console.print(f"study link {link.id} created; completion code {link.completion_code}")
        print(url)


@link_app.command("list")
def link_list(task: TaskOpt, web_url: WebUrlOpt = DEFAULT_WEB_URL, database_url: DatabaseOpt = None) -> None:
    """The task's study links with their URLs."""
    from services.domain import study, tasks

    with domain_session(database_url) as session:
        table = Table("id", "name", "round", "role", "platform", "quota", "open")
        links = study.list_links(session, tasks.get_task(session, task))
        for link in links:
            table.add_row(
                str(link.id),
                link.name,
                str(link.round.number),
                link.role.value,
                link.platform.value,
                str(link.quota),
                "yes" if study.closed_reason(link) is None else "no",
            )
        console.print(table)
        for link in links:  # whole, never wrapped: to copy onto the platform
            print(f"{link.id}\t{link_url(web_url, link)}")


@link_app.command("close")
def link_close(link_id: int, database_url: DatabaseOpt = None) -> None:
    """Close a study link now: it starts and resumes no sessions."""
    from services.domain import study

    with domain_session(database_url) as session:
        link = study.close_link(session, None, study.get_link(session, link_id))
        console.print(f"study link {link.id} closed at {link.closed_at}")
