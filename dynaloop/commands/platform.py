"""`dynaloop platform`: a study link's side on its crowd platform, through the platform's API
(services/platforms/): create the Prolific study or the MTurk HIT that points at the link, and
approve or reject the submissions of the link's sessions from their outcomes. The platform's
address and credentials come from settings (DYNALOOP_PROLIFIC_API_TOKEN, DYNALOOP_MTURK_SANDBOX,
AWS credentials); nothing here takes an address to send them to."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

import typer

from dynaloop.commands.common import DatabaseOpt, console, domain_session, fail, settings_for

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from services.db.models import StudyLink
    from services.platforms import Decision

app = typer.Typer(help="A study link's study or HIT on its platform, through the platform's API.", no_args_is_help=True)

LinkArg = Annotated[int, typer.Argument(min=1, help="The study link's id (`dynaloop study link list`)")]
WebUrlOpt = Annotated[str, typer.Option("--web-url", help="The web app's public https:// address")]
MinutesOpt = Annotated[int, typer.Option("--minutes", min=1, max=1440, help="How long the work takes, in minutes")]


def _link(session: Session, link_id: int, platform: str) -> StudyLink:
    from services.domain import study

    link = study.get_link(session, link_id)
    if link.platform.value != platform:
        raise fail(f"link {link_id} is a {link.platform.value} link, not a {platform} one")
    return link


AgainOpt = Annotated[bool, typer.Option("--again", help="Create another even though the link has one already")]


def _refuse_a_second(session: Session, link: StudyLink, action: str, key: str, again: bool) -> None:
    """Creating a study or a HIT is not undone by running the command again: a link that has
    one (the audit log says so) gets another only with --again."""
    from sqlalchemy import select

    from services.db.models import AuditEntry

    earlier = session.scalars(
        select(AuditEntry)
        .where(AuditEntry.action == action, AuditEntry.target_type == "study_link")
        .where(AuditEntry.target_id == str(link.id))
        .order_by(AuditEntry.id)
    ).first()
    if earlier is not None and not again:
        raise fail(
            f"link {link.id} already has {key} {earlier.details.get(key)} "
            f"(audit log, {earlier.created_at:%Y-%m-%d %H:%M}); pass --again to create another"
        )


@app.command("create-study")
def create_study(
    link_id: LinkArg,
    web_url: WebUrlOpt,
    description: Annotated[str, typer.Option(help="What participants read about the study")],
    minutes: MinutesOpt,
    again: AgainOpt = False,
    database_url: DatabaseOpt = None,
) -> None:
    """Create a draft Prolific study for a Prolific link: its URL, codes, places and reward (the
    role's base pay). Publish it on Prolific after checking it there."""
    from services.domain import audit
    from services.platforms import paying

    settings = settings_for(database_url)
    with domain_session(database_url) as session:
        link = _link(session, link_id, "prolific")
        _refuse_a_second(session, link, "platform.create_study", "study_id", again)
        reward, currency = paying.base_pay_of(link)
        made = paying.create_study_from_link(
            settings, link, web_url=web_url, description=description, estimated_minutes=minutes
        )
        audit.record(session, None, "platform.create_study", "study_link", link.id, study_id=made.get("id"))
    console.print(
        f"Prolific draft study {made.get('id')} created for link {link_id} (reward {reward} minor units of the "
        f"workspace's currency; the task pays in {currency}): check it on Prolific, then publish it",
        highlight=False,
    )


@app.command("create-hit")
def create_hit(
    link_id: LinkArg,
    web_url: WebUrlOpt,
    title: Annotated[str, typer.Option(help="The HIT's title, shown to workers")],
    description: Annotated[str, typer.Option(help="The HIT's description")],
    minutes: MinutesOpt,
    lifetime_days: Annotated[int, typer.Option(min=1, max=365, help="Days the HIT stays listed")] = 7,
    frame_height: Annotated[int, typer.Option(min=0, max=5000, help="Frame height in pixels; 0: the window")] = 0,
    again: AgainOpt = False,
    database_url: DatabaseOpt = None,
) -> None:
    """Create an MTurk HIT (sandbox unless DYNALOOP_MTURK_SANDBOX=false) whose ExternalQuestion is
    the link, with MaxAssignments = the link's max_workers and the role's base pay as reward (USD)."""
    from services.domain import audit
    from services.platforms import paying

    settings = settings_for(database_url)
    with domain_session(database_url) as session:
        link = _link(session, link_id, "mturk")
        _refuse_a_second(session, link, "platform.create_hit", "hit_id", again)
        hit = paying.create_hit_from_link(
            settings,
            link,
            web_url=web_url,
            title=title,
            description=description,
            estimated_minutes=minutes,
            lifetime_days=lifetime_days,
            frame_height=frame_height,
        )
        audit.record(session, None, "platform.create_hit", "study_link", link.id, hit_id=hit.get("HITId"))
    where = "the sandbox" if settings.mturk_sandbox else "mturk.com"
    console.print(f"HIT {hit.get('HITId')} (group {hit.get('HITGroupId')}) created on {where} for link {link_id}")


def _not_decided_before(session: Session, decisions: list[Decision]) -> list[Decision]:
    """The decisions, with those of sessions the platform already approved or rejected (a
    successful decision in the audit log) turned into skips."""
    from sqlalchemy import select

    from services.db.models import AuditEntry
    from services.platforms import Verdict

    ids = [str(d.session_id) for d in decisions if d.verdict is not Verdict.skip]
    entries = session.scalars(
        select(AuditEntry).where(
            AuditEntry.action.in_(("platform.approve", "platform.reject")),
            AuditEntry.target_type == "study_session",
            AuditEntry.target_id.in_(ids),
        )
    ).all()
    decided = {int(e.target_id): e.action.removeprefix("platform.") for e in entries if e.details.get("ok")}
    return [
        dataclasses.replace(d, verdict=Verdict.skip, why=f"{decided[d.session_id]}d before (audit log)")
        if d.session_id in decided and d.verdict is not Verdict.skip
        else d
        for d in decisions
    ]


@app.command("approve")
def approve(
    link_id: LinkArg,
    screened_out: Annotated[
        str | None,
        typer.Option(
            help="approve, reject or skip screened-out workers (default: approve if the link has a "
            "screened-out code, else skip)"
        ),
    ] = None,
    reject_message: Annotated[
        str | None, typer.Option(help="What a rejected worker is told (Prolific: 100 characters or more)")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the decisions; call nothing")] = False,
    database_url: DatabaseOpt = None,
) -> None:
    """Approve (or reject) the submissions of a Prolific or MTurk link's sessions from their
    outcomes: completed -> approve; screened out -> --screened-out; stopped with the partial code
    -> approve; the rest are left alone. Each decision is recorded in the audit log, and a
    submission decided before (the audit log says so) is not sent again: the platforms keep a
    decision for good."""
    from services.domain import audit, study
    from services.platforms import decisions_for, paying

    settings = settings_for(database_url)
    with domain_session(database_url) as session:
        link = study.get_link(session, link_id)
        decisions = _not_decided_before(session, decisions_for(study.link_sessions(session, link), link, screened_out))
        for d in decisions:
            console.print(
                f"session {d.session_id}\t{d.submission_id or '-'}\t{d.verdict.value}\t{d.why}",
                highlight=False,
                soft_wrap=True,
            )
        if dry_run:
            return
        results = paying.decide_submissions(settings, link, decisions, reject_message=reject_message)
        failed = 0
        for result in results:
            if result.verdict.value == "skip":
                continue
            audit.record(
                session,
                None,
                f"platform.{result.verdict.value}",
                "study_session",
                result.session_id,
                submission_id=result.submission_id,
                ok=result.ok,
                answer=result.platform_answer,
            )
            failed += not result.ok
    done = sum(1 for r in results if r.ok and r.verdict.value != "skip")
    console.print(f"{done} decided on {link.platform.value}; {failed} failed (see the audit log)", highlight=False)
    if failed:
        raise typer.Exit(1)
