"""Study links: crowdworkers arrive from a crowd platform (Prolific, MTurk, or a generic one),
work through one session per link, and leave with the platform's completion.

A researcher creates a link for a round and a role (:func:`create_link`). A worker opens
``/study/{slug}`` with the parameters the platform appends; :func:`start_study_session`
checks them, finds or creates the worker behind the platform id (stored only as a keyed hash,
:class:`~services.db.models.PlatformAccount`), starts or resumes the one session of that worker
on that link, and issues a 24-hour API token. :func:`study_sessions_of` recounts the work done
since the session started and completes the sessions that met their quota;
:func:`finish_study_session` ends a session (idempotent) and answers the platform's completion.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import (
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
    utcnow,
)
from services.domain import audit, users
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid, NotFound, StudyLinkClosed, StudyLinkFull
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
) -> StudyLink:
    round_ = session.get(Round, round_id)
    if round_ is None or round_.task_id != task.id:
        raise Invalid(f"task {task.name!r} has no round with id {round_id}; list its rounds first")
    if quota < 1 or quota > 10_000:
        raise Invalid("quota must be between 1 and 10000")
    if max_workers is not None and not 1 <= max_workers <= 1_000_000:
        raise Invalid("max_workers must be between 1 and 1000000, or null for no cap")
    if platform is Platform.generic:
        if id_parameter is None or not PARAM_NAME_RE.match(id_parameter):
            raise Invalid(
                "a generic link needs id_parameter: the query parameter (1-64 letters, digits, '_' or '-') "
                "that carries the worker's id"
            )
    elif id_parameter is not None:
        raise Invalid(f"id_parameter is only for generic links; {platform.value} names its own parameters")
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
        completion_code=_code(completion_code, "completion_code") or new_code(),
        screened_out_code=_code(screened_out_code, "screened_out_code"),
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


def close_link(session: Session, actor: User | None, link: StudyLink) -> StudyLink:
    if link.closed_at is None:
        link.closed_at = utcnow()
        audit.record(session, actor, "study_link.close", "study_link", link.id)
    return link


_OPEN_ROUNDS = {
    StudyRole.writer: (RoundStatus.collecting,),
    StudyRole.validator: (RoundStatus.collecting, RoundStatus.validating),
}


def closed_reason(link: StudyLink, now: dt.datetime | None = None) -> str | None:
    """Why the link takes no workers now, or None when it is open."""
    now = now or utcnow()
    if link.closed_at is not None:
        return "this study link was closed by the researcher"
    if link.opens_at is not None and now < link.opens_at:
        return f"this study link opens at {link.opens_at.isoformat(timespec='minutes')}; come back then"
    if link.closes_at is not None and now >= link.closes_at:
        return "this study link has closed"
    allowed = (
        (RoundStatus.collecting,) if link.role is StudyRole.writer else (RoundStatus.collecting, RoundStatus.validating)
    )
    if link.round.status not in allowed:
        return f"the round of this study link is {link.round.status.value} and takes no more {link.role.value}s"
    return None


def query_template(link: StudyLink) -> str:
    if link.platform is Platform.prolific:
        return "?PROLIFIC_PID={{%PROLIFIC_PID%}}&STUDY_ID={{%STUDY_ID%}}&SESSION_ID={{%SESSION_ID%}}"
    if link.platform is Platform.mturk:
        return "?workerId=...&assignmentId=...&hitId=...&turkSubmitTo=... (added by MTurk's ExternalQuestion)"
    return f"?{link.id_parameter}=<worker id>"


def link_sessions(session: Session, link: StudyLink) -> list[StudySession]:
    return list(session.scalars(select(StudySession).where(StudySession.link_id == link.id).order_by(StudySession.id)))


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


def parse_params(link: StudyLink, params: dict[str, str]) -> PlatformIds:
    """The platform's ids from the link's query parameters (422 when missing or forged)."""
    check_params(params)
    if link.platform is Platform.generic:
        assert link.id_parameter is not None
        return PlatformIds(_param(params, link.id_parameter))
    worker, study, session_id = PLATFORM_PARAMS[link.platform]
    ids = PlatformIds(_param(params, worker), _param(params, study), _param(params, session_id))
    if link.platform is Platform.mturk:
        if ids.session_id == MTURK_PREVIEW:
            raise Invalid("accept the HIT first: a preview has no assignment")
        submit_to = params.get("turkSubmitTo", "")
        if submit_to.rstrip("/") not in MTURK_HOSTS:
            raise Invalid(
                f"turkSubmitTo must be one of {list(MTURK_HOSTS)}; open the HIT again from Mechanical Turk",
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


def worker_for(session: Session, platform: Platform, id_hash: str, role: StudyRole) -> User:
    """The one user behind a platform id, created on first use with the link's role (a link of
    the other role adds that role). Two first opens at once: the unique constraints decide, the
    loser reads the winner's user."""
    user = _account_user(session, platform, id_hash)
    if user is None:
        try:
            with session.begin_nested():
                user = User(username=f"{platform.value}-{id_hash[:12]}", roles=[role.value], password_hash=None)
                session.add(user)
                session.flush()
                session.add(PlatformAccount(platform=platform, id_hash=id_hash, user_id=user.id))
                session.flush()
        except IntegrityError:
            user = _account_user(session, platform, id_hash)
            if user is None:
                raise Conflict("another request is creating this worker; open the link again") from None
        else:
            audit.record(
                session,
                None,
                "user.create",
                "user",
                user.id,
                username=user.username,
                roles=user.roles,
                platform=platform.value,
            )
    if role.value not in (user.roles or []):
        user.roles = [*(user.roles or []), role.value]
    return user


def _screened_out(session: Session, link: StudyLink, user: User) -> bool:
    """Unqualified on the task, or out of quiz attempts without passing."""
    worker = session.scalar(select(TaskWorker).where(TaskWorker.task_id == link.task_id, TaskWorker.user_id == user.id))
    if worker is None:
        return False
    if not worker.qualified:
        return True
    quiz = definition_of(link.task).onboarding_quiz
    return quiz is not None and not worker.onboarding_passed and worker.quiz_attempts >= quiz.max_attempts


def _end(study: StudySession, status: StudySessionStatus) -> None:
    study.status = status
    study.ended_at = utcnow()


def start_study_session(session: Session, secret_key: str, slug: str, params: dict[str, str]) -> Started:
    """Open a study link with the platform's parameters: an MTurk preview (nothing written), or
    the worker's one session on the link (new or resumed) and a 24-hour API token."""
    link = link_by_slug(session, slug)
    check_params(params)
    reason = closed_reason(link)
    if is_mturk_preview(link, params):
        if reason is not None:
            raise StudyLinkClosed(reason)
        return Started(preview=True, link=link)
    ids = parse_params(link, params)
    if reason is not None:
        raise StudyLinkClosed(reason)
    id_hash = platform_id_hash(secret_key, link.platform, ids.worker_id)
    user = worker_for(session, link.platform, id_hash, link.role)
    if not user.is_active:
        raise Conflict("this worker's account is deactivated; contact the researcher")
    study, created = _session_for(session, link, user, ids)
    if study.status is StudySessionStatus.active and _screened_out(session, link, user):
        _end(study, StudySessionStatus.screened_out)
    token, plain = users.issue_token(session, None, user, name=f"study-{link.id}", expires_in_days=TOKEN_DAYS)
    return Started(preview=False, link=link, session=study, token=plain, expires_at=token.expires_at, created=created)


def _find_session(session: Session, link: StudyLink, user: User) -> StudySession | None:
    return session.scalar(select(StudySession).where(StudySession.link_id == link.id, StudySession.user_id == user.id))


def _session_for(session: Session, link: StudyLink, user: User, ids: PlatformIds) -> tuple[StudySession, bool]:
    study = _find_session(session, link, user)
    if study is not None:
        study.last_seen_at = utcnow()
        if study.status is StudySessionStatus.active:
            # The platform's newest ids: an MTurk worker who returned the HIT and accepted it again
            # has a new assignment, and the completion must name that one.
            study.platform_study_id = ids.study_id
            study.platform_session_id = ids.session_id
            study.submit_to = ids.submit_to
        return study, False
    if link.max_workers is not None:
        # On PostgreSQL the link's row lock makes concurrent first opens count one after another.
        session.scalar(select(StudyLink.id).where(StudyLink.id == link.id).with_for_update())
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
            )
            session.add(study)
            session.flush()
    except IntegrityError:
        found = _find_session(session, link, user)
        if found is None:
            raise Conflict("another request is starting this session; open the link again") from None
        return found, False
    return study, True


# --- the worker's sessions ---------------------------------------------------------------------


def units_done(session: Session, study: StudySession) -> int:
    """Writer: examples written in the link's round since the session started. Validator: whole
    validation batches (the task's ``validation_batch_size``) labelled in that round since then."""
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
    return labels // definition_of(link.task).validation_batch_size


def refresh(session: Session, study: StudySession) -> StudySession:
    """Recount an active session's work; complete it at its quota, screen it out when the worker
    lost their standing on the task."""
    if study.status is not StudySessionStatus.active:
        return study
    study.units_done = units_done(session, study)
    if study.units_done >= study.link.quota:
        _end(study, StudySessionStatus.completed)
    elif _screened_out(session, study.link, study.user):
        _end(study, StudySessionStatus.screened_out)
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


def finish_study_session(session: Session, study: StudySession, reason: str) -> dict[str, Any]:
    """End the session: ``quota`` once the quota is met (409 before), ``stop`` at any time.
    A session that has ended already answers its completion again."""
    refresh(session, study)
    if study.status is StudySessionStatus.active:
        if reason == "quota":
            raise Conflict(
                f"the quota is not met yet: {study.units_done} of {study.link.quota} done; "
                "keep working, or finish with reason 'stop'"
            )
        _end(study, StudySessionStatus.stopped)
    completion = completion_of(study)
    assert completion is not None
    return completion


def completion_of(study: StudySession) -> dict[str, Any] | None:
    """The platform's completion of an ended session (None while it is active)."""
    if study.status is StudySessionStatus.active:
        return None
    link = study.link
    screened = study.status is StudySessionStatus.screened_out
    code = link.screened_out_code if screened else link.completion_code
    message = (
        "you cannot take part in this study (onboarding not passed or not qualified)"
        if screened
        else "thank you: your work is recorded"
    )
    if screened and code is None:
        message += "; return the study on the platform"
    redirect_url = None
    form = None
    if link.platform is Platform.prolific and code is not None:
        redirect_url = PROLIFIC_COMPLETE + code
    if link.platform is Platform.mturk and study.submit_to in MTURK_HOSTS:
        form = {
            "action": f"{study.submit_to}/mturk/externalSubmit",
            "fields": {"assignmentId": study.platform_session_id or "", "completion_code": code or "screened_out"},
        }
    return {"status": study.status.value, "code": code, "redirect_url": redirect_url, "form": form, "message": message}
