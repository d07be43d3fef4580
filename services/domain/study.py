"""Study links: crowdworkers arrive from a crowd platform (Prolific, MTurk, or a generic one),
work through one session per link, and leave with the platform's completion.

A researcher creates a link for a round and a role (:func:`create_link`); a paid link
(Prolific, MTurk) must cap its workers. A worker opens ``/study/{slug}`` with the parameters the
platform appends; :func:`start_study_session` checks them against the platform's id formats,
finds or creates the worker behind the platform id (stored only as a keyed hash,
:class:`~services.db.models.PlatformAccount`; new accounts are capped per link and per client
address per hour, counted in the database), starts or resumes the one session of that worker in
that round and role, and gives the session its one API token. :func:`study_sessions_of` recounts
the work done since the session started and completes the sessions that met their quota;
:func:`finish_study_session` ends a session (idempotent) and answers the platform's completion:
completed, stopped (the link's partial code, or "return the submission") and screened out never
share a code.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import (
    ApiToken,
    Example,
    Platform,
    PlatformAccount,
    Round,
    RoundStatus,
    StudyLink,
    StudyRole,
    StudySession,
    StudySessionStatus,
    Task,
    TaskWorker,
    User,
    Validation,
    ValidationBatch,
    ValidationBatchItem,
    utcnow,
)
from services.domain import audit, users, validating
from services.domain.tasks import definition_of
from services.errors import (
    Conflict,
    Invalid,
    NotFound,
    StudyLinkClosed,
    StudyLinkFull,
    StudySessionTaken,
    TooManyNewWorkers,
)
from services.taskdef import MAX_PAY_MINOR
from services.text import clean_name

NAME_MAX_CHARS = 200
CODE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
PARAM_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_PARAMS = 20
MAX_PARAM_CHARS = 200
# Unambiguous: no 0/O, 1/I/L.
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_CHARS = 8
TOKEN_DAYS = 1  # a study session's API token lasts 24 hours
MTURK_PREVIEW = "ASSIGNMENT_ID_NOT_AVAILABLE"
MTURK_HOSTS = ("https://www.mturk.com", "https://workersandbox.mturk.com")
PROLIFIC_COMPLETE = "https://app.prolific.com/submissions/complete?cc="

# The parameters each platform appends: (worker id, study id, session id).
PLATFORM_PARAMS: dict[Platform, tuple[str, str, str]] = {
    Platform.prolific: ("PROLIFIC_PID", "STUDY_ID", "SESSION_ID"),
    Platform.mturk: ("workerId", "hitId", "assignmentId"),
}
# What each platform's ids look like. Prolific's participant, study and session ids are
# 24-character lowercase hexadecimal ids (MongoDB ObjectIds). MTurk's API reference gives its
# ids as capital letters and digits (at most 64); in practice worker ids start with "A" and
# have 12 to 14 characters (up to 30 accepted here), and HIT and assignment ids have exactly
# 30. A value of another shape did not come from the platform: 422, nothing written. (Should
# MTurk ever issue ids of another length, MTURK_HIT_OR_ASSIGNMENT_RE is the one place to widen.)
PROLIFIC_ID_RE = re.compile(r"^[0-9a-f]{24}$")
MTURK_WORKER_RE = re.compile(r"^A[A-Z0-9]{9,29}$")
MTURK_HIT_OR_ASSIGNMENT_RE = re.compile(r"^[A-Z0-9]{30}$")
PLATFORM_ID_FORMATS: dict[Platform, tuple[tuple[re.Pattern[str], str], ...]] = {
    Platform.prolific: ((PROLIFIC_ID_RE, "a Prolific id: 24 lowercase hexadecimal characters"),) * 3,
    Platform.mturk: (
        (MTURK_WORKER_RE, "an MTurk worker id: 'A' and 9-29 capital letters or digits"),
        (MTURK_HIT_OR_ASSIGNMENT_RE, "an MTurk HIT id: 30 capital letters or digits"),
        (MTURK_HIT_OR_ASSIGNMENT_RE, "an MTurk assignment id: 30 capital letters or digits"),
    ),
}
# Links on these platforms pay their workers through the platform: they must cap their workers.
PAID_PLATFORMS = (Platform.prolific, Platform.mturk)
# The currencies each platform pays in. Prolific: a study pays in GBP or USD, and a bonus "in the
# study currency" (Prolific's API reference, "Set up bonuses"); MTurk: BonusAmount is "a US Dollar
# amount" (SendBonus, the MTurk API reference). services/domain/payouts.py refuses a batch in another.
PLATFORM_CURRENCIES = {Platform.prolific: ("GBP", "USD"), Platform.mturk: ("USD",)}
# What a validator whose round has no more work gets (StudyLink.when_out_of_work):
# "complete": the completion code and base pay, once at least one label is done;
# "partial": the link's partial code and partial pay, as a stop; "return": no code, return it.
OUT_OF_WORK = ("complete", "partial", "return")
NEW_WORKER_WINDOW = dt.timedelta(hours=1)


@dataclass(frozen=True)
class NewWorkerCaps:
    """Most new worker accounts per link and per client address in NEW_WORKER_WINDOW."""

    per_link: int
    per_address: int


def new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_CHARS))


def _aware(value: dt.datetime | None, field: str) -> dt.datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise Invalid(f"{field} has no time zone; give it in UTC, e.g. 2026-01-31T12:00:00Z")
    return value.astimezone(dt.UTC)


def _code(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    if not CODE_RE.match(value):
        problem = f"{field} must be 1-64 letters, digits, '_' or '-'"
        raise Invalid(problem, problems=[f"{field}: {problem}"])
    return value


# --- the researcher's links --------------------------------------------------------------------


def _check_capacity(platform: Platform, quota: int, max_workers: int | None) -> None:
    """A link's quota and its cap on workers, which a link that pays its workers must set."""
    if quota < 1 or quota > 10_000:
        raise Invalid("quota must be between 1 and 10000")
    if max_workers is not None and not 1 <= max_workers <= 1_000_000:
        raise Invalid("max_workers must be between 1 and 1000000, or null for no cap")
    if platform in PAID_PLATFORMS and max_workers is None:
        problem = (
            f"a {platform.value} link pays its workers: set max_workers, the most workers it takes (the places "
            "you pay for on the platform)"
        )
        raise Invalid(problem, problems=[f"max_workers: {problem}"])


def _check_partial_pay(partial_pay_minor: int | None, partial_code: str | None) -> None:
    """The pay of a stopped session, in minor units, and the partial code that earns it."""
    if partial_pay_minor is not None:
        if not 0 <= partial_pay_minor <= MAX_PAY_MINOR:
            raise Invalid(f"partial_pay_minor must be between 0 and {MAX_PAY_MINOR} (minor units)")
        if partial_code is None:
            raise Invalid("partial_pay_minor needs partial_code: the platform's code for a partial submission")


def _link_codes(
    completion_code: str | None, screened_out_code: str | None, partial_code: str | None
) -> dict[str, str | None]:
    """The link's codes for the platform, cleaned, each another outcome: none equal to another."""
    codes = {
        "completion_code": _code(completion_code, "completion_code"),
        "screened_out_code": _code(screened_out_code, "screened_out_code"),
        "partial_code": _code(partial_code, "partial_code"),
    }
    given = [value for value in codes.values() if value is not None]
    if len(given) != len(set(given)):
        problem = (
            "completion_code, screened_out_code and partial_code must differ: each tells the platform another outcome"
        )
        raise Invalid(problem, problems=[problem])
    return codes


def _check_worker_id_and_currency(platform: Platform, id_parameter: str | None, currency: str | None) -> None:
    """The query parameter that carries a generic link's worker id (generic links only), and the
    currency the study pays in (one the platform pays in)."""
    if platform is Platform.generic:
        if id_parameter is None or not PARAM_NAME_RE.match(id_parameter):
            raise Invalid(
                "a generic link needs id_parameter: the query parameter (1-64 letters, digits, '_' or '-') "
                "that carries the worker's id"
            )
    elif id_parameter is not None:
        raise Invalid(f"id_parameter is only for generic links; {platform.value} names its own parameters")
    if currency is not None:
        allowed = PLATFORM_CURRENCIES.get(platform)
        if not re.fullmatch(r"[A-Z]{3}", currency) or (allowed is not None and currency not in allowed):
            raise Invalid(
                "currency must be the ISO 4217 code the study pays in"
                + (f"; {platform.value} pays in {' or '.join(allowed)}" if allowed else ""),
                field="currency",
            )


def create_link(
    session: Session,
    actor: User | None,
    task: Task,
    *,
    name: str,
    round_id: int,
    role: StudyRole,
    platform: Platform,
    quota: int,
    max_workers: int | None = None,
    id_parameter: str | None = None,
    opens_at: dt.datetime | None = None,
    closes_at: dt.datetime | None = None,
    completion_code: str | None = None,
    screened_out_code: str | None = None,
    partial_code: str | None = None,
    partial_pay_minor: int | None = None,
    other_role_allowed: bool = False,
    when_out_of_work: str = "complete",
    currency: str | None = None,
) -> StudyLink:
    round_ = session.get(Round, round_id)
    if round_ is None or round_.task_id != task.id:
        raise Invalid(f"task {task.name!r} has no round with id {round_id}; list its rounds first")
    _check_capacity(platform, quota, max_workers)
    if when_out_of_work not in OUT_OF_WORK:
        raise Invalid(f"when_out_of_work must be one of {list(OUT_OF_WORK)}")
    _check_partial_pay(partial_pay_minor, partial_code)
    codes = _link_codes(completion_code, screened_out_code, partial_code)
    _check_worker_id_and_currency(platform, id_parameter, currency)
    opens = _aware(opens_at, "opens_at")
    closes = _aware(closes_at, "closes_at")
    if opens is not None and closes is not None and closes <= opens:
        raise Invalid("closes_at must be after opens_at")
    link = StudyLink(
        slug=secrets.token_urlsafe(24),
        name=clean_name(name, field="name", max_chars=NAME_MAX_CHARS),
        task_id=task.id,
        round_id=round_.id,
        role=role,
        platform=platform,
        quota=quota,
        max_workers=max_workers,
        id_parameter=id_parameter,
        completion_code=codes["completion_code"] or new_code(),
        screened_out_code=codes["screened_out_code"],
        partial_code=codes["partial_code"],
        partial_pay_minor=partial_pay_minor,
        other_role_allowed=other_role_allowed,
        when_out_of_work=when_out_of_work,
        currency=currency,
        opens_at=opens,
        closes_at=closes,
        created_by_id=actor.id if actor else None,
    )
    session.add(link)
    session.flush()
    audit.record(
        session,
        actor,
        "study_link.create",
        "study_link",
        link.id,
        task=task.name,
        round_id=round_.id,
        role=role.value,
        platform=platform.value,
    )
    return link


def list_links(session: Session, task: Task) -> list[StudyLink]:
    return list(session.scalars(select(StudyLink).where(StudyLink.task_id == task.id).order_by(StudyLink.id)))


def missing_link(link_id: int) -> NotFound:
    return NotFound(f"no study link {link_id}")


def get_link(session: Session, link_id: int) -> StudyLink:
    link = session.get(StudyLink, link_id)
    if link is None:
        raise missing_link(link_id)
    return link


def link_by_slug(session: Session, slug: str) -> StudyLink:
    link = session.scalar(select(StudyLink).where(StudyLink.slug == slug)) if len(slug) <= 64 else None
    if link is None:
        raise NotFound("no such study link; check the address the platform gave you")
    return link


def close_link(session: Session, actor: User | None, link: StudyLink, *, reason: str | None = None) -> StudyLink:
    """Close the link now (idempotent): it starts no new sessions and resumes none. ``reason``
    goes into the audit entry (e.g. "round closed" when its round closed it)."""
    if link.closed_at is None:
        link.closed_at = utcnow()
        details = {} if reason is None else {"reason": reason}
        audit.record(session, actor, "study_link.close", "study_link", link.id, **details)
    return link


def is_open(link: StudyLink, now: dt.datetime | None = None) -> bool:
    """Whether the link may still take workers: not closed by hand, not past its closing time
    (a link that opens later counts: it would take workers then)."""
    now = now or utcnow()
    return link.closed_at is None and (link.closes_at is None or now < link.closes_at)


def open_links_of_rounds(session: Session, round_ids: list[int]) -> dict[int, list[StudyLink]]:
    """The open links (:func:`is_open`) of each of ``round_ids`` (one query), oldest first."""
    found: dict[int, list[StudyLink]] = {round_id: [] for round_id in round_ids}
    if not round_ids:
        return found
    now = utcnow()
    rows = session.scalars(
        select(StudyLink).where(StudyLink.round_id.in_(round_ids), StudyLink.closed_at.is_(None)).order_by(StudyLink.id)
    )
    for link in rows:
        if is_open(link, now):
            found[link.round_id].append(link)
    return found


ROUND_CLOSED = "round closed"


def close_round_links(session: Session, actor: User | None, round_: Round) -> list[StudyLink]:
    """Close the round's open links because the round closed (each audited with the reason
    ``ROUND_CLOSED``); returns them. Workers already in a session keep their token: they can
    still finish it (:func:`finish_study_session`), but the closed round takes no more work."""
    links = open_links_of_rounds(session, [round_.id])[round_.id]
    for link in links:
        close_link(session, actor, link, reason=ROUND_CLOSED)
    return links


_OPEN_ROUNDS = {
    StudyRole.writer: (RoundStatus.collecting,),
    StudyRole.validator: (RoundStatus.collecting, RoundStatus.validating),
}


def closed_reason(link: StudyLink, now: dt.datetime | None = None) -> str | None:
    """Why the link takes no workers now, or None when it is open."""
    now = now or utcnow()
    # The round first: closing a round closes its links too, and the worker is told why.
    if link.round.status not in _OPEN_ROUNDS[link.role]:
        return f"the round of this study link is {link.round.status.value} and takes no more {link.role.value}s"
    if link.closed_at is not None:
        return "this study link was closed by the researcher"
    if link.opens_at is not None and now < link.opens_at:
        return f"this study link opens at {link.opens_at.isoformat(timespec='minutes')}; come back then"
    if link.closes_at is not None and now >= link.closes_at:
        return "this study link has closed"
    return None


def query_template(link: StudyLink) -> str:
    if link.platform is Platform.prolific:
        return "?PROLIFIC_PID={{%PROLIFIC_PID%}}&STUDY_ID={{%STUDY_ID%}}&SESSION_ID={{%SESSION_ID%}}"
    if link.platform is Platform.mturk:
        return "?workerId=...&assignmentId=...&hitId=...&turkSubmitTo=... (added by MTurk's ExternalQuestion)"
    return f"?{link.id_parameter}=<worker id>"


def link_sessions(session: Session, link: StudyLink) -> list[StudySession]:
    """The link's sessions, oldest first, their work recounted (:func:`refresh`): the researcher
    sees a session that met its quota as completed even if its worker has not come back."""
    rows = list(session.scalars(select(StudySession).where(StudySession.link_id == link.id).order_by(StudySession.id)))
    for study in rows:
        refresh(session, study)
    return rows


# --- a worker arrives --------------------------------------------------------------------------


@dataclass(frozen=True)
class PlatformIds:
    worker_id: str
    study_id: str | None = None
    session_id: str | None = None
    submit_to: str | None = None


@dataclass(frozen=True)
class Started:
    preview: bool
    link: StudyLink
    session: StudySession | None = None
    token: str | None = None
    expires_at: dt.datetime | None = None
    created: bool = False


def _param(params: dict[str, str], name: str) -> str:
    value = params.get(name)
    if value is None or value == "":
        raise Invalid(
            f"the link was opened without its {name} parameter; open it again from the platform",
            problems=[f"params.{name}: missing"],
        )
    if not ID_RE.match(value):
        raise Invalid(
            f"the {name} parameter is not a platform id (1-128 letters, digits, '_' or '-'); "
            "open the link again from the platform",
            problems=[f"params.{name}: not a platform id"],
        )
    return value


def check_params(params: dict[str, str]) -> None:
    if len(params) > MAX_PARAMS:
        raise Invalid(f"too many parameters ({len(params)}); a study link takes at most {MAX_PARAMS}")
    for name, value in params.items():
        if not PARAM_NAME_RE.match(name) or len(value) > MAX_PARAM_CHARS:
            raise Invalid(
                f"parameter names are 1-64 letters, digits, '_' or '-', and values at most {MAX_PARAM_CHARS} "
                "characters; open the link again from the platform"
            )


def is_mturk_preview(link: StudyLink, params: dict[str, str]) -> bool:
    return link.platform is Platform.mturk and params.get("assignmentId") == MTURK_PREVIEW


def parse_params(link: StudyLink, params: dict[str, str], submit_origins: tuple[str, ...] = MTURK_HOSTS) -> PlatformIds:
    """The platform's ids from the link's query parameters (422 when missing or forged).
    ``submit_origins``: the hosts an MTurk ``turkSubmitTo`` may name (the admin's
    ``DYNALOOP_MTURK_SUBMIT_ORIGINS``; MTurk's two by default)."""
    check_params(params)
    if link.platform is Platform.generic:
        assert link.id_parameter is not None
        return PlatformIds(_param(params, link.id_parameter))
    names = PLATFORM_PARAMS[link.platform]
    values = [_param(params, name) for name in names]
    if link.platform is Platform.mturk and values[2] == MTURK_PREVIEW:
        raise Invalid("accept the HIT first: a preview has no assignment")
    for name, value, (pattern, shape) in zip(names, values, PLATFORM_ID_FORMATS[link.platform], strict=True):
        if not pattern.match(value):
            raise Invalid(
                f"the {name} parameter is not {shape}; open the link again from {link.platform.value}",
                problems=[f"params.{name}: not {shape}"],
            )
    ids = PlatformIds(*values)
    if link.platform is Platform.mturk:
        submit_to = params.get("turkSubmitTo", "")
        if submit_to.rstrip("/") not in submit_origins:
            raise Invalid(
                f"turkSubmitTo must be one of {list(submit_origins)}; open the HIT again from Mechanical Turk",
                problems=["params.turkSubmitTo: not an MTurk host"],
            )
        ids = PlatformIds(ids.worker_id, ids.study_id, ids.session_id, submit_to.rstrip("/"))
    return ids


def platform_id_hash(secret_key: str, platform: Platform, worker_id: str) -> str:
    return hmac.new(secret_key.encode(), f"{platform.value}:{worker_id}".encode(), hashlib.sha256).hexdigest()


def _account_user(session: Session, platform: Platform, id_hash: str) -> User | None:
    account = session.scalar(
        select(PlatformAccount).where(PlatformAccount.platform == platform, PlatformAccount.id_hash == id_hash)
    )
    return account.user if account is not None else None


def address_hash(secret_key: str, address: str) -> str:
    """A keyed hash of a client address: what the caps on new workers count, never the address."""
    return hmac.new(secret_key.encode(), f"address:{address}".encode(), hashlib.sha256).hexdigest()


# The link's row, locked against other counters of its new workers and sessions but not against
# foreign-key checks (PostgreSQL renders FOR NO KEY UPDATE; SQLite has no row locks).
_LOCK_LINK = select(StudyLink.id).where(StudyLink.id == bindparam("link_id")).with_for_update(key_share=True)


def _check_new_worker_caps(session: Session, link: StudyLink, address: str | None, caps: NewWorkerCaps) -> None:
    """Refuse (429, nothing written) a new worker account beyond the link's or the address's
    hourly cap. Counted in the database, so that every API process agrees. On PostgreSQL the
    link's row lock, and a transaction-scoped advisory lock on the address's hash, make first
    opens of one link, or from one address on any links, count one after another (SQLite's
    BEGIN IMMEDIATE already serialises them).

    The lock is ``FOR NO KEY UPDATE``: it serialises the counting as ``FOR UPDATE`` would, but it
    does not block the foreign-key checks of other transactions (``FOR KEY SHARE`` on the link),
    which ``FOR UPDATE`` did. A worker's second request, holding the link's lock here, waited for
    the first request's new study session while the first, updating that session, waited for the
    lock's holder to let its foreign-key check through: a deadlock, seen in CI with eight first
    opens at once (tests/test_study_links.py)."""
    session.scalar(_LOCK_LINK, {"link_id": link.id})
    if address is not None and session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _advisory_key(address)})
    since = utcnow() - NEW_WORKER_WINDOW
    recent = select(func.count(PlatformAccount.id)).where(PlatformAccount.created_at >= since)
    on_link = session.scalar(recent.where(PlatformAccount.link_id == link.id)) or 0
    if on_link >= caps.per_link:
        raise TooManyNewWorkers(
            f"this study link took its most new workers for this hour ({caps.per_link}); try again in an hour, "
            "or ask the researcher",
            retry_after_s=int(NEW_WORKER_WINDOW.total_seconds()),
        )
    if address is not None:
        from_address = session.scalar(recent.where(PlatformAccount.address_hash == address)) or 0
        if from_address >= caps.per_address:
            raise TooManyNewWorkers(
                f"too many new workers from your network this hour ({caps.per_address}); try again in an hour, "
                "or ask the researcher",
                retry_after_s=int(NEW_WORKER_WINDOW.total_seconds()),
            )


def _advisory_key(address_hash: str) -> int:
    """A signed 64-bit key for PostgreSQL's advisory locks, from an address's hash."""
    return int.from_bytes(bytes.fromhex(address_hash[:16]), "big", signed=True)


def worker_for(
    session: Session,
    link: StudyLink,
    id_hash: str,
    *,
    address: str | None = None,
    caps: NewWorkerCaps | None = None,
) -> tuple[User, bool]:
    """The one user behind a platform id and whether it is new: created on first use with the
    link's role, as a link-made worker (scoped to the tasks of their links), within the hourly
    caps on new workers. A worker who came through a link of the other role is refused unless
    this link takes them (``other_role_allowed``). Two first opens at once: the unique
    constraints decide, the loser reads the winner's user."""
    platform, role = link.platform, link.role
    user = _account_user(session, platform, id_hash)
    if user is not None:
        _check_other_role(user, link)
        if role.value not in (user.roles or []):
            user.roles = [*(user.roles or []), role.value]
        return user, False
    if caps is not None:
        _check_new_worker_caps(session, link, address, caps)
    try:
        with session.begin_nested():
            user = User(
                username=f"{platform.value}-{id_hash[:12]}", roles=[role.value], password_hash=None, made_by_link=True
            )
            session.add(user)
            session.flush()
            session.add(
                PlatformAccount(
                    platform=platform, id_hash=id_hash, user_id=user.id, link_id=link.id, address_hash=address
                )
            )
            session.flush()
    except IntegrityError:
        user = _account_user(session, platform, id_hash)
        if user is None:
            raise Conflict("another request is creating this worker; open the link again") from None
        _check_other_role(user, link)
        return user, False
    audit.record(
        session,
        None,
        "user.create",
        "user",
        user.id,
        username=user.username,
        roles=user.roles,
        platform=platform.value,
        study_link=link.id,
    )
    return user, True


def _check_other_role(user: User, link: StudyLink) -> None:
    """A writer link's worker never becomes a validator (nor the reverse) unless the link says so."""
    crowd_roles = {StudyRole.writer.value, StudyRole.validator.value}
    held = crowd_roles & set(user.roles or [])
    if link.role.value in held or not held or link.other_role_allowed:
        return
    raise StudySessionTaken(
        f"you took part as a {', '.join(sorted(held))} through another study link, and this {link.role.value} "
        "link does not take workers of the other role; ask the researcher"
    )


def _screened_out(session: Session, link: StudyLink, user: User) -> bool:
    """Unqualified on the task, or out of quiz attempts without passing."""
    worker = session.scalar(select(TaskWorker).where(TaskWorker.task_id == link.task_id, TaskWorker.user_id == user.id))
    if worker is None:
        return False
    if not worker.qualified:
        return True
    quiz = definition_of(link.task).onboarding_quiz
    return quiz is not None and not worker.onboarding_passed and worker.quiz_attempts >= quiz.max_attempts


def _end(study: StudySession, status: StudySessionStatus, reason: str) -> None:
    study.status = status
    study.ended_at = utcnow()
    study.end_reason = reason


def start_study_session(
    session: Session,
    secret_key: str,
    slug: str,
    params: dict[str, str],
    *,
    address: str | None = None,
    caps: NewWorkerCaps | None = None,
    mturk_submit_origins: tuple[str, ...] = MTURK_HOSTS,
) -> Started:
    """Open a study link with the platform's parameters: an MTurk preview (nothing written), or
    the worker's one session on the link (new or resumed) and the session's one API token.

    ``address`` is the client's address (only its keyed hash is stored, on a new account) and
    ``caps`` the hourly caps on new worker accounts (None: no caps, for the command line);
    ``mturk_submit_origins`` where an MTurk assignment may be posted back (:func:`parse_params`)."""
    link = link_by_slug(session, slug)
    check_params(params)
    reason = closed_reason(link)
    if is_mturk_preview(link, params):
        if reason is not None:
            raise StudyLinkClosed(reason)
        return Started(preview=True, link=link)
    ids = parse_params(link, params, mturk_submit_origins)
    if reason is not None:
        raise StudyLinkClosed(reason)
    id_hash = platform_id_hash(secret_key, link.platform, ids.worker_id)
    hashed_address = None if address is None else address_hash(secret_key, address)
    user, _ = worker_for(session, link, id_hash, address=hashed_address, caps=caps)
    if not user.is_active:
        raise Conflict("this worker's account is deactivated; contact the researcher")
    study, created = _session_for(session, link, user, ids)
    if study.status is StudySessionStatus.active and _screened_out(session, link, user):
        _end(study, StudySessionStatus.screened_out, "screened_out")
    token, plain = _session_token(session, link, study, user)
    return Started(preview=False, link=link, session=study, token=plain, expires_at=token.expires_at, created=created)


def _session_token(session: Session, link: StudyLink, study: StudySession, user: User) -> tuple[ApiToken, str]:
    """The session's one API token. Only a token's hash is stored, so a re-open cannot hand the
    same token back: it revokes the session's previous token and issues one with the same expiry
    (24 hours from the first open); once that has passed, a fresh 24-hour one. Opening the link
    any number of times leaves at most one live token for the session."""
    now = utcnow()
    previous = session.get(ApiToken, study.token_id) if study.token_id is not None else None
    expires_at = None
    if previous is not None and previous.revoked_at is None:
        if previous.expires_at is not None and previous.expires_at > now:
            expires_at = previous.expires_at
        previous.revoked_at = now
    token, plain = users.issue_token(session, None, user, name=f"study-{link.id}", expires_in_days=TOKEN_DAYS)
    if expires_at is not None:
        token.expires_at = expires_at
    study.token_id = token.id
    return token, plain


def _find_session(session: Session, link: StudyLink, user: User) -> StudySession | None:
    return session.scalar(select(StudySession).where(StudySession.link_id == link.id, StudySession.user_id == user.id))


def _other_link_session(session: Session, link: StudyLink, user: User) -> StudySession | None:
    """The worker's session of the link's round and role through another link, if any."""
    return session.scalar(
        select(StudySession)
        .join(StudyLink, StudyLink.id == StudySession.link_id)
        .where(
            StudySession.user_id == user.id,
            StudyLink.round_id == link.round_id,
            StudyLink.role == link.role,
            StudyLink.id != link.id,
        )
    )


def _session_taken(link: StudyLink) -> StudySessionTaken:
    return StudySessionTaken(
        f"you already have a {link.role.value} session in this round, through another study link; one session per "
        "round and role is paid: go on with that one"
    )


def _session_for(session: Session, link: StudyLink, user: User, ids: PlatformIds) -> tuple[StudySession, bool]:
    study = _find_session(session, link, user)
    if study is not None:
        if link.platform is not Platform.generic and study.platform_session_id != ids.session_id:
            # A platform's worker ids are not secret (a researcher sees them, workers quote them on
            # forums); its session or assignment id is known only to the worker's own submission.
            # The session stays with the submission that started it, so knowing a worker's id is
            # not enough to take their session over. The price: an MTurk worker who returned the
            # HIT and accepted it again (a new assignment) cannot resume, and asks the researcher.
            name = PLATFORM_PARAMS[link.platform][2]
            raise Conflict(
                f"this worker already has a session on this study link, started from another {link.platform.value} "
                f"submission ({name} differs); open the link from that submission, or contact the researcher"
            )
        study.last_seen_at = utcnow()
        return study, False
    # One session per worker per round and role, whatever the link: two writer links of one
    # round do not make two completions (and two base pays) for the same work.
    if _other_link_session(session, link, user) is not None:
        raise _session_taken(link)
    if link.max_workers is not None:
        # On PostgreSQL the link's row lock makes concurrent first opens count one after another
        # (FOR NO KEY UPDATE: see _check_new_worker_caps).
        session.scalar(_LOCK_LINK, {"link_id": link.id})
        taken = session.scalar(select(func.count(StudySession.id)).where(StudySession.link_id == link.id)) or 0
        if taken >= link.max_workers:
            raise StudyLinkFull(f"this study link has all its {link.max_workers} workers; it takes no more")
    try:
        with session.begin_nested():
            study = StudySession(
                link_id=link.id,
                user_id=user.id,
                status=StudySessionStatus.active,
                platform_worker_id=ids.worker_id,
                platform_study_id=ids.study_id,
                platform_session_id=ids.session_id,
                submit_to=ids.submit_to,
                units_done=0,
                round_id=link.round_id,
                role=link.role,
            )
            session.add(study)
            session.flush()
    except IntegrityError:
        found = _find_session(session, link, user)
        if found is None:
            if _other_link_session(session, link, user) is not None:
                raise _session_taken(link) from None
            raise Conflict("another request is starting this session; open the link again") from None
        return found, False
    return study, True


# --- the worker's sessions ---------------------------------------------------------------------


def units_done(session: Session, study: StudySession) -> int:
    """Writer: examples written in the link's round since the session started. Validator:
    labels and control-item answers given in that round since then (the quota counts labels,
    not whole batches, so a round that runs out of work mid-batch does not leave the validator
    short)."""
    link = study.link
    if link.role is StudyRole.writer:
        return (
            session.scalar(
                select(func.count(Example.id)).where(
                    Example.round_id == link.round_id,
                    Example.writer_id == study.user_id,
                    Example.created_at >= study.started_at,
                )
            )
            or 0
        )
    labels = (
        session.scalar(
            select(func.count(Validation.id))
            .join(Example, Example.id == Validation.example_id)
            .where(
                Example.round_id == link.round_id,
                Validation.validator_id == study.user_id,
                Validation.created_at >= study.started_at,
            )
        )
        or 0
    )
    # Control items count like examples: the progress a validator sees must not change
    # differently after a control answer, or it would tell the controls apart.
    control_answers = (
        session.scalar(
            select(func.count(ValidationBatchItem.id))
            .join(ValidationBatch, ValidationBatch.id == ValidationBatchItem.batch_id)
            .where(
                ValidationBatch.round_id == link.round_id,
                ValidationBatch.validator_id == study.user_id,
                ValidationBatchItem.control_item_id.is_not(None),
                ValidationBatchItem.answered_at.is_not(None),
                ValidationBatchItem.answered_at >= study.started_at,
            )
        )
        or 0
    )
    return labels + control_answers


def refresh(session: Session, study: StudySession) -> StudySession:
    """Recount an active session's work; complete it at its quota, screen it out when the worker
    lost their standing on the task."""
    if study.status is not StudySessionStatus.active:
        return study
    study.units_done = units_done(session, study)
    if study.units_done >= study.link.quota:
        _end(study, StudySessionStatus.completed, "quota")
    elif _screened_out(session, study.link, study.user):
        _end(study, StudySessionStatus.screened_out, "screened_out")
    return study


def study_sessions_of(session: Session, user: User) -> list[StudySession]:
    rows = list(session.scalars(select(StudySession).where(StudySession.user_id == user.id).order_by(StudySession.id)))
    for study in rows:
        refresh(session, study)
    return rows


def get_session(session: Session, session_id: int) -> StudySession:
    study = session.get(StudySession, session_id)
    if study is None:
        raise missing_session(session_id)
    return study


def missing_session(session_id: int) -> NotFound:
    return NotFound(f"no study session {session_id} of yours")


def out_of_work(session: Session, study: StudySession) -> bool:
    """Whether the validator's round has nothing more to serve them: the round takes no more
    labels, or their next validation batch comes back empty (services/domain/validating.py;
    the examples it would hand out are claimed only if the caller's transaction commits)."""
    round_ = study.link.round
    if round_.status not in _OPEN_ROUNDS[StudyRole.validator]:
        return True
    return not validating.get_batch(session, study.user, round_)


def finish_study_session(session: Session, study: StudySession, reason: str) -> dict[str, Any]:
    """End the session: ``quota`` once the quota is met (409 before), ``stop`` at any time,
    ``out_of_work`` (validators) once their round has no more work to serve them (409 while it
    has): then the link's ``when_out_of_work`` decides. A session that has ended already answers
    its completion again, unchanged: a completion code is issued at most once per session."""
    refresh(session, study)
    if study.status is StudySessionStatus.active:
        if reason == "quota":
            raise Conflict(
                f"the quota is not met yet: {study.units_done} of {study.link.quota} done; "
                "keep working, or finish with reason 'stop'"
            )
        if reason == "out_of_work":
            link = study.link
            if link.role is not StudyRole.validator:
                raise Invalid("only a validator session ends for want of work; finish with reason 'quota' or 'stop'")
            if not out_of_work(session, study):
                raise Conflict(
                    "the round still has examples for you to label; ask for the next batch, or finish with reason "
                    "'stop'"
                )
            if link.when_out_of_work == "complete" and study.units_done >= 1:
                _end(study, StudySessionStatus.completed, "out_of_work")
            else:
                _end(study, StudySessionStatus.stopped, "out_of_work")
        else:
            _end(study, StudySessionStatus.stopped, "stop")
    completion = completion_of(study)
    assert completion is not None
    return completion


def partial_code_of(study: StudySession) -> str | None:
    """The link's partial code where a stopped session earns it: a stop, or a validator out of
    work on a link whose policy is not "return" (None otherwise, and for other statuses)."""
    if study.status is not StudySessionStatus.stopped:
        return None
    link = study.link
    if study.end_reason == "out_of_work" and link.when_out_of_work == "return":
        return None
    return link.partial_code


def partial_pay_of(study: StudySession) -> int | None:
    """What a stopped session is paid (services/domain/ledger.py): the link's partial pay where
    the session earned its partial code; None: nothing."""
    if partial_code_of(study) is None:
        return None
    return study.link.partial_pay_minor


def completion_of(study: StudySession) -> dict[str, Any] | None:
    """The platform's completion of an ended session (None while it is active). Completed,
    screened out and stopped never share a code: a stopped worker gets the link's partial code,
    or none and is told to return the submission (no Prolific redirect without a code)."""
    if study.status is StudySessionStatus.active:
        return None
    link = study.link
    code: str | None
    if study.status is StudySessionStatus.completed:
        code = link.completion_code
        message = "thank you: your work is recorded"
        if study.end_reason == "out_of_work":
            message = "thank you: the round has no more work, and what you did is recorded as complete"
    elif study.status is StudySessionStatus.screened_out:
        code = link.screened_out_code
        message = "you cannot take part in this study (onboarding not passed or not qualified)"
        if code is None:
            message += f"; return the study on {_platform_name(link.platform)}"
    else:
        code = partial_code_of(study)
        why = "the round has no more work" if study.end_reason == "out_of_work" else "you stopped before the quota"
        if code is not None:
            message = f"{why}: your partial submission is recorded with the code below"
        else:
            message = (
                f"{why}, so this is not a completed submission: please return it on "
                f"{_platform_name(link.platform)} (no completion code)"
            )
    redirect_url = None
    form = None
    if link.platform is Platform.prolific and code is not None:
        redirect_url = PROLIFIC_COMPLETE + code
    # submit_to was checked against the admin's MTurk origins when the session started.
    if link.platform is Platform.mturk and study.submit_to:
        form = {
            "action": f"{study.submit_to}/mturk/externalSubmit",
            "fields": {"assignmentId": study.platform_session_id or "", "completion_code": code or study.status.value},
        }
    return {"status": study.status.value, "code": code, "redirect_url": redirect_url, "form": form, "message": message}


def _platform_name(platform: Platform) -> str:
    return {Platform.prolific: "Prolific", Platform.mturk: "Mechanical Turk"}.get(platform, "the platform")
