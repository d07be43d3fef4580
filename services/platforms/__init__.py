"""The crowd platforms' own APIs: pay a payout batch's lines, approve or reject submissions, and
create a Prolific study or an MTurk HIT from a study link (docs/crowdsourcing.md, "Paying and
approving through the APIs").

This package speaks in plain data so that the ledger's payout batches can drive it without it
knowing their tables: a :class:`PayLine` per line to pay (worker, assignment, amount in minor
units, currency, reason and the line's stable token), a :class:`LineResult` per line back (paid,
already paid, failed or unknown, the platform's reference and its answer, bounded). The clients
are :mod:`services.platforms.prolific` (httpx) and :mod:`services.platforms.mturk` (boto3); their
addresses and credentials come from :class:`~services.settings.Settings` only, never from a
request or the database.

:func:`decisions_for` turns a link's study sessions into approve / reject / skip decisions
(:class:`Decision`), which either client carries out with ``decide``.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any

from services.db.models import StudyLink, StudySession, StudySessionStatus
from services.errors import Invalid

# MTurk's UniqueRequestToken is at most 64 characters (MTurk's "Use request tokens" page); the
# same bound serves as the line token everywhere.
MAX_TOKEN_CHARS = 64
TOKEN_RE = re.compile(r"^[A-Za-z0-9_:.-]{1,64}$")
MAX_REASON_CHARS = 1000
MAX_LINES = 1000  # lines in one call of pay_lines: a payout batch of a study or HIT group
MAX_ANSWER_CHARS = 4000  # the platform's answer kept per line (JSON), cut beyond this


class LineStatus(str, enum.Enum):
    paid = "paid"  # the platform accepted the payment
    already_paid = "already_paid"  # the platform says this line's token was paid before
    failed = "failed"  # the platform refused it: nothing was paid; it may be sent again once fixed
    unknown = "unknown"  # no clear answer (a timeout, a 5xx): check on the platform before sending again


@dataclass(frozen=True)
class PayLine:
    """One line of a payout batch: what one worker is paid, in minor units of ``currency``."""

    worker_id: str
    amount_minor: int
    currency: str
    reason: str
    unique_request_token: str
    assignment_id: str | None = None  # MTurk: the assignment the bonus is for

    def __post_init__(self) -> None:
        if not 1 <= self.amount_minor <= 100_000_00:
            raise Invalid(f"a bonus line must pay 1 to 10000000 minor units, not {self.amount_minor}")
        if not TOKEN_RE.match(self.unique_request_token):
            raise Invalid(f"a line's unique_request_token must be 1-{MAX_TOKEN_CHARS} letters, digits or '_:.-'")
        if not self.reason.strip() or len(self.reason) > MAX_REASON_CHARS:
            raise Invalid(f"a bonus line needs a reason of 1-{MAX_REASON_CHARS} characters (the worker sees it)")


@dataclass(frozen=True)
class LineResult:
    """What the platform answered for one line. ``platform_answer`` is JSON-able and bounded
    (:func:`bounded_answer`); it never holds a credential."""

    unique_request_token: str
    status: LineStatus
    platform_reference: str | None = None
    platform_answer: dict[str, Any] = field(default_factory=dict)


def bounded_answer(answer: Any) -> dict[str, Any]:
    """The platform's answer as a JSON-able dict of at most MAX_ANSWER_CHARS characters of JSON:
    kept whole when small, else cut to its text's start (marked ``truncated``)."""
    if not isinstance(answer, dict):
        answer = {"answer": answer}
    text = json.dumps(answer, default=str, sort_keys=True)
    if len(text) <= MAX_ANSWER_CHARS:
        loaded: dict[str, Any] = json.loads(text)
        return loaded
    return {"truncated": True, "start": text[: MAX_ANSWER_CHARS - 100]}


def check_lines(lines: list[PayLine], currency: str) -> None:
    """Refuse a batch that is empty, too long, in another currency than ``currency`` or that
    names one token twice, before any call."""
    if not lines:
        raise Invalid("nothing to pay: the batch has no lines")
    if len(lines) > MAX_LINES:
        raise Invalid(f"a batch paid through an API holds at most {MAX_LINES} lines, not {len(lines)}")
    others = sorted({line.currency for line in lines} - {currency})
    if others:
        raise Invalid(
            f"the study pays in {currency}; lines in {', '.join(others)} cannot be paid on it (nothing was sent)"
        )
    tokens = [line.unique_request_token for line in lines]
    if len(tokens) != len(set(tokens)):
        raise Invalid("two lines share a unique_request_token; each line needs its own (nothing was sent)")


# --- approving and rejecting submissions ------------------------------------------------------


class Verdict(str, enum.Enum):
    approve = "approve"
    reject = "reject"
    skip = "skip"  # left to the researcher on the platform


SCREENED_OUT_CHOICES = ("approve", "reject", "skip")


@dataclass(frozen=True)
class Decision:
    """What to do with one session's submission (Prolific) or assignment (MTurk)."""

    session_id: int
    submission_id: str | None  # Prolific's SESSION_ID, MTurk's assignmentId
    verdict: Verdict
    why: str


def default_screened_out(link: StudyLink) -> str:
    """Screened-out workers are paid for their time by default where the link gave them a code to
    submit (both platforms expect a worker who did what was asked to be paid; a rejection counts
    against an MTurk worker's approval rate); without a code they were asked to return the study,
    so there is nothing to decide."""
    return "approve" if link.screened_out_code else "skip"


def decisions_for(sessions: list[StudySession], link: StudyLink, screened_out: str | None = None) -> list[Decision]:
    """One decision per session of ``link`` from its outcome: completed -> approve; screened out
    -> ``screened_out`` (default :func:`default_screened_out`); stopped with the link's partial
    code -> approve (the partial submission the link accepts), stopped without one -> skip (the
    worker was asked to return it); active -> skip (not submitted)."""
    from services.domain.study import partial_code_of

    policy = screened_out or default_screened_out(link)
    if policy not in SCREENED_OUT_CHOICES:
        raise Invalid(f"screened_out must be one of {list(SCREENED_OUT_CHOICES)}, not {policy!r}")
    decisions = []
    for study in sessions:
        if study.link_id != link.id:
            raise Invalid(f"session {study.id} is not a session of link {link.id}")
        verdict, why = Verdict.skip, "still active: nothing submitted"
        if study.status is StudySessionStatus.completed:
            verdict, why = Verdict.approve, "completed"
        elif study.status is StudySessionStatus.screened_out:
            verdict, why = Verdict(policy), f"screened out ({policy} for screened-out workers)"
        elif study.status is StudySessionStatus.stopped:
            if partial_code_of(study) is not None:
                verdict, why = Verdict.approve, "stopped with the link's partial code"
            else:
                verdict, why = Verdict.skip, "stopped without a partial code: asked to return the submission"
        if verdict is not Verdict.skip and not study.platform_session_id:
            verdict, why = Verdict.skip, f"{why}, but the session has no submission id"
        decisions.append(Decision(study.id, study.platform_session_id, verdict, why))
    return decisions


@dataclass(frozen=True)
class DecisionResult:
    session_id: int
    submission_id: str | None
    verdict: Verdict
    ok: bool
    platform_answer: dict[str, Any] = field(default_factory=dict)
