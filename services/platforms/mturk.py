"""Mechanical Turk's API through boto3's ``mturk`` client: bonuses (``send_bonus``, one call per
line with the line's ``UniqueRequestToken``), approving or rejecting assignments, and creating a
HIT with an ExternalQuestion from a study link.

What MTurk documents and this module relies on (docs/crowdsourcing.md cites the pages):

- ``SendBonus`` takes ``WorkerId``, ``BonusAmount`` (a US dollar amount as a string, "1.50", no
  currency sign), ``AssignmentId``, ``Reason`` (the worker sees it) and ``UniqueRequestToken``
  (at most 64 characters). "If the bonus already exists in the system from a previous call using
  the same UniqueRequestToken, subsequent calls will return an error with a message containing
  the request ID"; the token expires after 24 hours. MTurk pays in US dollars only.
- The exact text of that error is not documented. A ``RequestError`` whose message speaks of the
  token being used, a duplicate or an operation already done (:data:`ALREADY_DONE_RE`) is taken
  as "already paid"; any other ``RequestError`` as a refusal (nothing paid; the line is
  ``failed`` and is not sent again in this run). A ``ServiceFault`` or a connection that broke
  off leaves the line ``unknown``: sending it again with the same token within 24 hours is safe.
- Only the sandbox or the production endpoint in ``us-east-1`` is called, chosen by
  ``DYNALOOP_MTURK_SANDBOX``; credentials come from settings or boto3's own chain, never from the
  database, and botocore never logs them.

boto3 is an optional dependency (the ``platforms`` extra): it is imported when a client is made,
with a clear error where it is missing.
"""

from __future__ import annotations

import re
from typing import Any
from xml.sax.saxutils import escape

from services.db.models import Platform, StudyLink
from services.domain.ledger import format_amount
from services.errors import Invalid, PlatformError
from services.platforms import (
    Decision,
    DecisionResult,
    LineResult,
    LineStatus,
    PayLine,
    Verdict,
    bounded_answer,
    check_lines,
)
from services.settings import Settings

REGION = "us-east-1"  # MTurk's API lives in this region only
SANDBOX_ENDPOINT = "https://mturk-requester-sandbox.us-east-1.amazonaws.com"
PRODUCTION_ENDPOINT = "https://mturk-requester.us-east-1.amazonaws.com"
EXTERNAL_QUESTION_NS = (
    "http://mechanicalturk.amazonaws.com/AWSMechanicalTurkDataSchemas/2006-07-14/ExternalQuestion.xsd"
)
ALREADY_DONE_RE = re.compile(
    r"unique ?request ?token|duplicate|already (been )?(processed|performed|exists|paid)", re.I
)
MTURK_WORKER_RE = re.compile(r"^A[A-Z0-9]{9,29}$")
MTURK_ASSIGNMENT_RE = re.compile(r"^[A-Z0-9]{30}$")
MAX_FEEDBACK_CHARS = 1024  # RequesterFeedback: "can be up to 1024 characters"


def boto3_client(settings: Settings) -> Any:
    """boto3's ``mturk`` client for the sandbox or production, as settings say; bounded timeouts
    and boto3's standard retries (safe: SendBonus and CreateHIT carry request tokens, approving
    an approved assignment changes nothing)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # the `platforms` extra is missing
        raise Invalid(
            "paying through MTurk needs boto3: pip install 'dynaloop[platforms]' (or pip install boto3)"
        ) from exc
    credentials: dict[str, str] = {}
    if settings.mturk_access_key_id and settings.mturk_secret_access_key:
        credentials = {
            "aws_access_key_id": settings.mturk_access_key_id,
            "aws_secret_access_key": settings.mturk_secret_access_key.get_secret_value(),
        }
    config = Config(
        connect_timeout=min(10.0, settings.platform_timeout_s),
        read_timeout=settings.platform_timeout_s,
        retries={"mode": "standard", "max_attempts": 3},
    )
    return boto3.client(
        "mturk",
        region_name=REGION,
        endpoint_url=SANDBOX_ENDPOINT if settings.mturk_sandbox else PRODUCTION_ENDPOINT,
        config=config,
        **credentials,
    )


def _error_answer(exc: Exception) -> tuple[str, str, dict[str, Any]]:
    """(code, message, bounded answer) of a botocore error, without request headers."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code, message = str(error.get("Code", "")), str(error.get("Message", ""))
        request_id = exc.response.get("ResponseMetadata", {}).get("RequestId")
        return code, message, bounded_answer({"error": code, "message": message[:500], "request_id": request_id})
    return type(exc).__name__, "", {"error": type(exc).__name__}


def usd_amount(line: PayLine) -> str:
    """BonusAmount: US dollars as MTurk writes them ("1.50"), from integer cents."""
    if line.currency != "USD":
        raise Invalid(f"MTurk pays in USD only; this line is in {line.currency}")
    return format_amount(line.amount_minor, "USD")


def pay_lines(client: Any, lines: list[PayLine]) -> list[LineResult]:
    """Send one bonus per line (``send_bonus`` with the line's token). Lines are checked before
    any call: USD only, an MTurk worker id and an assignment id on each."""
    check_lines(lines, "USD")
    for line in lines:
        if not MTURK_WORKER_RE.match(line.worker_id):
            raise Invalid(f"{line.worker_id!r} is not an MTurk worker id; nothing was sent")
        if line.assignment_id is None or not MTURK_ASSIGNMENT_RE.match(line.assignment_id):
            raise Invalid(f"line {line.unique_request_token} needs the MTurk assignment id its bonus is for")
    from botocore.exceptions import BotoCoreError, ClientError

    results = []
    for line in lines:
        try:
            answer = client.send_bonus(
                WorkerId=line.worker_id,
                BonusAmount=usd_amount(line),
                AssignmentId=line.assignment_id,
                Reason=line.reason,
                UniqueRequestToken=line.unique_request_token,
            )
        except ClientError as exc:
            code, message, recorded = _error_answer(exc)
            if code == "RequestError" and ALREADY_DONE_RE.search(message):
                status = LineStatus.already_paid
            elif code == "RequestError":
                status = LineStatus.failed
            else:  # ServiceFault, throttling after boto3's retries: it may have been paid
                status = LineStatus.unknown
            results.append(LineResult(line.unique_request_token, status, recorded.get("request_id"), recorded))
            continue
        except BotoCoreError as exc:  # the connection broke off or timed out: unknown, the token makes a resend safe
            results.append(LineResult(line.unique_request_token, LineStatus.unknown, None, _error_answer(exc)[2]))
            continue
        request_id = answer.get("ResponseMetadata", {}).get("RequestId")
        results.append(
            LineResult(
                line.unique_request_token, LineStatus.paid, request_id, bounded_answer({"request_id": request_id})
            )
        )
    return results


def decide(client: Any, decisions: list[Decision], *, reject_feedback: str | None = None) -> list[DecisionResult]:
    """Approve or reject each decided assignment (``approve_assignment``;
    ``reject_assignment`` with ``RequesterFeedback``, which MTurk requires for a rejection)."""
    from botocore.exceptions import BotoCoreError, ClientError

    if any(d.verdict is Verdict.reject for d in decisions) and not (reject_feedback or "").strip():
        raise Invalid("rejecting an assignment needs feedback for the worker (MTurk requires RequesterFeedback)")
    if reject_feedback is not None and len(reject_feedback) > MAX_FEEDBACK_CHARS:
        raise Invalid(f"the feedback holds at most {MAX_FEEDBACK_CHARS} characters")
    results = []
    for decision in decisions:
        if decision.verdict is Verdict.skip or decision.submission_id is None:
            results.append(DecisionResult(decision.session_id, decision.submission_id, Verdict.skip, True))
            continue
        if not MTURK_ASSIGNMENT_RE.match(decision.submission_id):
            results.append(
                DecisionResult(
                    decision.session_id,
                    decision.submission_id,
                    decision.verdict,
                    False,
                    {"error": "not an assignment id"},
                )
            )
            continue
        try:
            if decision.verdict is Verdict.approve:
                client.approve_assignment(AssignmentId=decision.submission_id)
            else:
                client.reject_assignment(AssignmentId=decision.submission_id, RequesterFeedback=reject_feedback)
        except (ClientError, BotoCoreError) as exc:
            answer = _error_answer(exc)[2]
            results.append(DecisionResult(decision.session_id, decision.submission_id, decision.verdict, False, answer))
            continue
        results.append(DecisionResult(decision.session_id, decision.submission_id, decision.verdict, True))
    return results


# --- a HIT from a link ---------------------------------------------------------------------------


def external_question(url: str, frame_height: int) -> str:
    """The ExternalQuestion XML: the page MTurk shows in its frame (HTTPS), and the frame's
    height in pixels (0: MTurk sizes the frame to the window, as its HTMLQuestion example uses)."""
    if not url.startswith("https://"):
        raise Invalid("an ExternalQuestion's URL must be https:// (MTurk's rule)")
    if not 0 <= frame_height <= 5000:
        raise Invalid("frame_height must be between 0 and 5000 pixels")
    return (
        f'<ExternalQuestion xmlns="{EXTERNAL_QUESTION_NS}">'
        f"<ExternalURL>{escape(url)}</ExternalURL>"
        f"<FrameHeight>{frame_height}</FrameHeight>"
        "</ExternalQuestion>"
    )


def hit_request(
    link: StudyLink,
    *,
    web_url: str,
    title: str,
    description: str,
    reward_minor: int,
    currency: str,
    estimated_minutes: int,
    lifetime_days: int = 7,
    frame_height: int = 0,
    keywords: str = "",
) -> dict[str, Any]:
    """``create_hit``'s parameters for ``link``: the link's URL as an ExternalQuestion (MTurk
    appends its own parameters), MaxAssignments = ``max_workers``, the reward (the role's base pay,
    USD only), and a token from the link so that a retried creation makes one HIT."""
    if link.platform is not Platform.mturk:
        raise Invalid(f"link {link.id} is a {link.platform.value} link, not an MTurk one")
    if currency != "USD":
        raise Invalid(f"MTurk pays in USD only; the task pays in {currency}")
    if not 1 <= reward_minor <= 1_000_000:
        raise Invalid("the reward must be between 1 and 1000000 cents; set the task's pay.base_pay")
    if not 1 <= estimated_minutes <= 24 * 60 or not 1 <= lifetime_days <= 365:
        raise Invalid("estimated_minutes must be 1-1440 and lifetime_days 1-365")
    for field, value, most in (("title", title, 128), ("description", description, 2000), ("keywords", keywords, 1000)):
        if len(value) > most or (field != "keywords" and not value.strip()):
            raise Invalid(f"{field} must be 1-{most} characters")
    assert link.max_workers is not None  # an MTurk link always caps its workers (study.create_link)
    request: dict[str, Any] = {
        "Title": title,
        "Description": description,
        "Reward": format_amount(reward_minor, "USD"),
        "MaxAssignments": link.max_workers,
        # The time a worker has once they accept: three times the estimate, at least an hour.
        "AssignmentDurationInSeconds": max(3600, 3 * 60 * estimated_minutes),
        "LifetimeInSeconds": lifetime_days * 24 * 3600,
        "Question": external_question(f"{web_url.rstrip('/')}/study/{link.slug}", frame_height),
        "RequesterAnnotation": f"dynaloop link {link.id}",
        "UniqueRequestToken": f"dynaloop-link-{link.id}-{link.slug[:16]}",
    }
    if keywords:
        request["Keywords"] = keywords
    return request


def create_hit(client: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Create the HIT; its id, type and group (bounded). A retry within 24 hours with the same
    token answers an error naming the HIT already made, never a second HIT."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        answer = client.create_hit(**request)
    except (ClientError, BotoCoreError) as exc:
        _, message, recorded = _error_answer(exc)
        raise PlatformError(
            f"MTurk did not create the HIT: {recorded.get('error')} {message[:300]}", answer=recorded
        ) from None
    hit = answer.get("HIT", {})
    return bounded_answer({k: hit.get(k) for k in ("HITId", "HITTypeId", "HITGroupId", "HITStatus", "MaxAssignments")})
