"""The entry points of the platforms' APIs, in plain values: :func:`pay_batch` for `dynaloop
ledger pay BATCH`, and a link's study or HIT and its submissions for `dynaloop platform`.

Paying a payout batch (the payout batches of services/domain/ledger.py map onto these plain values: the
batch's platform, its Prolific study id, its currency and lines, and the Prolific state the
batch keeps). Each line's :class:`~services.platforms.LineResult` is what the batch records per
line (status, platform reference, answer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.db.models import Platform, StudyLink, StudyRole
from services.errors import Invalid
from services.platforms import Decision, DecisionResult, LineResult, PayLine, mturk, prolific
from services.settings import Settings


def pay_batch(
    settings: Settings,
    platform: Platform,
    *,
    currency: str,
    lines: list[PayLine],
    prolific_study_id: str | None = None,
    prolific_state: prolific.BonusPayment | None = None,
    save_prolific_state: Callable[[prolific.BonusPayment], None] | None = None,
    mturk_client: Any | None = None,
) -> list[LineResult]:
    """Pay ``lines`` on ``platform``: Prolific as one bulk bonus of ``prolific_study_id`` (the
    batch's ``prolific_state`` saved through ``save_prolific_state`` before each next request,
    see :func:`services.platforms.prolific.pay_lines`); MTurk one ``send_bonus`` per line with its
    token (USD only). The client is made from settings here: nothing else picks its address;
    ``mturk_client``, a client :func:`services.platforms.mturk.boto3_client` made from settings
    before, serves a batch paid one line per call."""
    if platform is Platform.prolific:
        if prolific_study_id is None or prolific_state is None or save_prolific_state is None:
            raise Invalid("paying on Prolific needs the batch's study id and its saved bonus state")
        with prolific.ProlificClient(settings) as client:
            return prolific.pay_lines(client, prolific_study_id, currency, lines, prolific_state, save_prolific_state)
    if platform is Platform.mturk:
        if currency != "USD":
            raise Invalid(f"MTurk pays in USD only; this batch is in {currency} (nothing was sent)")
        return mturk.pay_lines(mturk_client or mturk.boto3_client(settings), lines)
    raise Invalid(f"{platform.value} has no payment API: pay these workers by hand")


# --- a link's study or HIT, and its submissions ---------------------------------------------------


def base_pay_of(link: StudyLink) -> tuple[int, str]:
    """The role's base pay of the link's task (minor units) and its currency: what the study or
    HIT pays on the platform when a submission is approved."""
    from services.domain.tasks import definition_of

    pay = definition_of(link.task).pay
    if pay is None:
        raise Invalid(f"task {link.task.name!r} has no pay policy: set pay.base_pay, the reward of the study")
    amount = pay.base_pay.writer if link.role is StudyRole.writer else pay.base_pay.validator
    if amount < 1:
        raise Invalid(f"task {link.task.name!r} pays no base pay to {link.role.value}s: set pay.base_pay")
    return amount, pay.currency


def create_study_from_link(
    settings: Settings, link: StudyLink, *, web_url: str, description: str, estimated_minutes: int
) -> dict[str, Any]:
    """A draft Prolific study for a Prolific link (its reward the role's base pay); Prolific's
    answer (bounded), with the study's ``id``."""
    reward, _ = base_pay_of(link)
    body = prolific.study_body(
        link, web_url=web_url, description=description, estimated_minutes=estimated_minutes, reward_minor=reward
    )
    with prolific.ProlificClient(settings) as client:
        return client.create_study(body)


def create_hit_from_link(
    settings: Settings,
    link: StudyLink,
    *,
    web_url: str,
    title: str,
    description: str,
    estimated_minutes: int,
    lifetime_days: int = 7,
    frame_height: int = 0,
) -> dict[str, Any]:
    """An MTurk HIT (sandbox unless settings say otherwise) whose ExternalQuestion is the link;
    its HITId, HITTypeId and HITGroupId."""
    reward, currency = base_pay_of(link)
    request = mturk.hit_request(
        link,
        web_url=web_url,
        title=title,
        description=description,
        reward_minor=reward,
        currency=currency,
        estimated_minutes=estimated_minutes,
        lifetime_days=lifetime_days,
        frame_height=frame_height,
    )
    return mturk.create_hit(mturk.boto3_client(settings), request)


def decide_submissions(
    settings: Settings, link: StudyLink, decisions: list[Decision], *, reject_message: str | None = None
) -> list[DecisionResult]:
    """Carry out :func:`services.platforms.decisions_for`'s decisions on the link's platform."""
    if link.platform is Platform.prolific:
        with prolific.ProlificClient(settings) as client:
            return client.decide(decisions, reject_message=reject_message)
    if link.platform is Platform.mturk:
        return mturk.decide(mturk.boto3_client(settings), decisions, reject_feedback=reject_message)
    raise Invalid("a generic link has no platform API: approve its workers where they came from")
