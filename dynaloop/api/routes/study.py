"""Study links (researchers), a worker's arrival from a crowd platform (public), and the
worker's study sessions (services/domain/study.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response, status

from dynaloop.api.deps import IdPath, SessionDep, SettingsDep, allowed
from dynaloop.api.ratelimit import client_address
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.study import (
    Completion,
    LinkSessionPublic,
    LinkSessionsPublic,
    StudyFinish,
    StudyLinkCreate,
    StudyLinkPublic,
    StudyLinksPublic,
    StudyLinkSummary,
    StudySessionPublic,
    StudySessionsPublic,
    StudyStart,
    StudyStarted,
    StudyTaskSummary,
)
from services.authorization import StudyLinkPolicy, StudySessionPolicy, TaskPolicy, authorize
from services.db.models import StudyLink, User
from services.domain import study, tasks

router = APIRouter(tags=["study"], route_class=OneHopRoute)
# The worker's own sessions: rate-limited like the other crowd routes (dynaloop/api/routes/__init__.py).
worker_router = APIRouter(tags=["study"], route_class=OneHopRoute)
# No token: the worker arrives from the platform. Limited per address (dynaloop/api/routes/__init__.py).
public_router = APIRouter(tags=["study"], route_class=OneHopRoute)

Slug = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="The link's slug.")]


@router.post("/tasks/{task_name}/study-links", response_model=StudyLinkPublic, status_code=status.HTTP_201_CREATED)
def create_link(
    task_name: str,
    body: StudyLinkCreate,
    session: SessionDep,
    researcher: Annotated[User, allowed(StudyLinkPolicy.manage)],
) -> StudyLinkPublic:
    """A study link for one round and one role of the task, to post on a crowd platform."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    link = study.create_link(session, researcher, task, **body.model_dump())
    return StudyLinkPublic.of(link)


@router.get("/tasks/{task_name}/study-links", response_model=StudyLinksPublic)
def list_links(
    task_name: str, session: SessionDep, researcher: Annotated[User, allowed(StudyLinkPolicy.manage)]
) -> StudyLinksPublic:
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    rows = [StudyLinkPublic.of(link) for link in study.list_links(session, task)]
    return StudyLinksPublic(data=rows, count=len(rows))


def _managed_link(session: SessionDep, link_id: int, researcher: User) -> StudyLink:
    link = study.get_link(session, link_id)
    authorize(researcher, StudyLinkPolicy.manage(link))
    return link


@router.get("/study-links/{link_id}", response_model=StudyLinkPublic)
def get_link(
    link_id: IdPath, session: SessionDep, researcher: Annotated[User, allowed(StudyLinkPolicy.manage)]
) -> StudyLinkPublic:
    return StudyLinkPublic.of(_managed_link(session, link_id, researcher))


@router.post("/study-links/{link_id}/close", response_model=StudyLinkPublic)
def close_link(
    link_id: IdPath, session: SessionDep, researcher: Annotated[User, allowed(StudyLinkPolicy.manage)]
) -> StudyLinkPublic:
    """Close the link now: it starts no new sessions and resumes none (idempotent)."""
    link = _managed_link(session, link_id, researcher)
    return StudyLinkPublic.of(study.close_link(session, researcher, link))


@router.get("/study-links/{link_id}/sessions", response_model=LinkSessionsPublic)
def link_sessions(
    link_id: IdPath, session: SessionDep, researcher: Annotated[User, allowed(StudyLinkPolicy.manage)]
) -> LinkSessionsPublic:
    """The link's sessions, oldest first."""
    link = _managed_link(session, link_id, researcher)
    rows = [LinkSessionPublic.of(row) for row in study.link_sessions(session, link)]
    return LinkSessionsPublic(data=rows, count=len(rows))


@public_router.post(
    "/study/{slug}/sessions",
    response_model=StudyStarted,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": StudyStarted, "description": "An MTurk preview, or the worker's session resumed."}},
)
def start_session(
    slug: Slug, body: StudyStart, request: Request, response: Response, session: SessionDep, settings: SettingsDep
) -> StudyStarted:
    """A worker opens a study link with the parameters the platform appended: no token needed.
    Answers an MTurk preview (200, nothing written), or the worker's session on the link, new
    (201) or resumed (200), with the session's API token (a re-open replaces it, same expiry).
    409 ``study_link_closed``, ``study_link_full`` or ``study_session_taken`` (a session in this
    round and role through another link; a link of the other role); 422 for missing parameters
    or ids not in the platform's format; 429 ``too_many_new_workers`` past the hourly caps on
    new worker accounts per link and per client address."""
    caps = study.NewWorkerCaps(
        per_link=settings.study_new_workers_per_link_per_hour,
        per_address=settings.study_new_workers_per_address_per_hour,
    )
    started = study.start_study_session(
        session,
        settings.secret_key,
        slug,
        body.params,
        address=client_address(request, settings),
        caps=caps,
        mturk_submit_origins=settings.mturk_submit_origin_list,
    )
    link = started.link
    definition = tasks.definition_of(link.task)
    response.status_code = status.HTTP_201_CREATED if started.created else status.HTTP_200_OK
    return StudyStarted(
        preview=started.preview,
        link=StudyLinkSummary(name=link.name, role=link.role, platform=link.platform, quota=link.quota),
        task=StudyTaskSummary(name=link.task.name, title=definition.title, description=definition.description),
        token=started.token,
        expires_at=started.expires_at,
        session=None if started.session is None else StudySessionPublic.of(started.session),
    )


@worker_router.get("/me/study-sessions", response_model=StudySessionsPublic)
def my_sessions(session: SessionDep, user: Annotated[User, allowed(StudySessionPolicy.own)]) -> StudySessionsPublic:
    """Your study sessions, their work recounted: one that met its quota is completed here."""
    rows = [StudySessionPublic.of(row) for row in study.study_sessions_of(session, user)]
    return StudySessionsPublic(data=rows, count=len(rows))


@worker_router.post("/study-sessions/{session_id}/finish", response_model=Completion)
def finish_session(
    session_id: IdPath, body: StudyFinish, session: SessionDep, user: Annotated[User, allowed(StudySessionPolicy.own)]
) -> Completion:
    """End your session (``quota``: once met, 409 before; ``stop``: now; ``out_of_work``: a
    validator whose round has no more work for them, 409 while it has) and get the platform's
    completion. Finishing again answers the same completion."""
    row = study.get_session(session, session_id)
    authorize(user, StudySessionPolicy.own(row))
    return Completion.of(study.finish_study_session(session, row, body.reason))
