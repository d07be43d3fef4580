"""Rounds of a task: opening and moving them forward, their model in the loop, prompt
imports, live statistics and the dashboard's plot data (researchers; reading: anyone)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from sqlalchemy.orm import Session

from dynaloop.api.deps import IdPath, RawBody, SessionDep, SettingsDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.rounds import (
    PlotDataPublic,
    PromptImportPublic,
    RoundCreate,
    RoundModelUpdate,
    RoundPublic,
    RoundsPublic,
    RoundStats,
    RoundStatusUpdate,
)
from rounds.build.dashboard import DEFAULT_LIMIT, round_plot_data
from services.authorization import RoundPolicy, TaskPolicy, allows, authorize
from services.db.models import Round, RoundStatus, User
from services.domain import model_servers, round_lifecycle, study, tasks
from services.errors import Invalid

router = APIRouter(tags=["rounds"], route_class=OneHopRoute)
Reader = Annotated[User, allowed(RoundPolicy.read)]
Manager = Annotated[User, allowed(RoundPolicy.manage)]

_PROMPT_BODY = {
    "requestBody": {
        "required": True,
        "description": "JSONL (one object per line with `text`, optional `id`, `source` and metadata "
        "fields) or CSV with a header row that has a `text` column.",
        "content": {
            "application/x-ndjson": {"schema": {"type": "string"}},
            "text/csv": {"schema": {"type": "string"}},
        },
    }
}


def _public(session: Session, user: User, round_: Round, *, study_links_closed: int | None = None) -> RoundPublic:
    """The round as ``user`` may see it: which model servers are in its loop, and its open study
    links, only for those who manage its task (admins, the task's researchers), never for
    writers and validators."""
    return _publics(session, user, [round_], study_links_closed=study_links_closed)[0]


def _publics(
    session: Session, user: User, rows: list[Round], *, study_links_closed: int | None = None
) -> list[RoundPublic]:
    managed = {r.id for r in rows if allows(user, RoundPolicy.manage(r))}
    open_links = study.open_links_of_rounds(session, sorted(managed))
    return [
        RoundPublic.of(
            r,
            show_model=r.id in managed,
            open_study_links=len(open_links[r.id]) if r.id in managed else None,
            study_links_closed=study_links_closed,
        )
        for r in rows
    ]


@router.get("/tasks/{task_name}/rounds", response_model=RoundsPublic)
def list_rounds(task_name: str, session: SessionDep, user: Annotated[User, allowed(TaskPolicy.read)]) -> RoundsPublic:
    task = tasks.get_task(session, task_name)
    authorize(user, TaskPolicy.read(task))
    rows = _publics(session, user, list(task.rounds))
    return RoundsPublic(data=rows, count=len(rows))


@router.post("/tasks/{task_name}/rounds", response_model=RoundPublic, status_code=status.HTTP_201_CREATED)
def create_round(
    task_name: str, body: RoundCreate, session: SessionDep, researcher: Annotated[User, allowed(TaskPolicy.manage)]
) -> RoundPublic:
    """Open the task's next round (the previous one must be closed)."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    model_servers.require_granted(session, researcher, task, body.model_servers)
    round_ = round_lifecycle.create_round(
        session,
        researcher,
        task,
        model_servers=body.model_servers,
        prompt_strategy=body.prompt_strategy,
        no_prompt_fraction=body.no_prompt_fraction,
        target_label_mode=body.target_label_mode,
        notes=body.notes,
    )
    model_servers.grant_loop(session, researcher, task, list(round_.model_servers or []))
    return _public(session, researcher, round_)


@router.get("/rounds/open", response_model=RoundsPublic)
def open_rounds(session: SessionDep, user: Reader) -> RoundsPublic:
    """Rounds that are collecting (writers) or validating (validators)."""
    rows = _publics(
        session, user, [r for r in round_lifecycle.open_rounds(session) if allows(user, RoundPolicy.read(r))]
    )
    return RoundsPublic(data=rows, count=len(rows))


@router.get("/rounds/{round_id}", response_model=RoundPublic)
def get_round(round_id: IdPath, session: SessionDep, user: Reader) -> RoundPublic:
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(user, RoundPolicy.read(round_))
    return _public(session, user, round_)


@router.post("/rounds/{round_id}/status", response_model=RoundPublic)
def set_round_status(
    round_id: IdPath, body: RoundStatusUpdate, session: SessionDep, researcher: Manager
) -> RoundPublic:
    """Move a round forward: collecting -> validating -> closed. Closing it closes its open
    study links (``study_links_closed`` says how many): a worker who opens one then gets 409
    ``study_link_closed``; one already in a session can finish it but work no more."""
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(researcher, RoundPolicy.manage(round_))
    change = round_lifecycle.set_status(session, researcher, round_, body.status)
    closed = len(change.study_links_closed) if body.status is RoundStatus.closed else None
    return _public(session, researcher, change.round, study_links_closed=closed)


@router.put("/rounds/{round_id}/model", response_model=RoundPublic)
def set_round_model(round_id: IdPath, body: RoundModelUpdate, session: SessionDep, researcher: Manager) -> RoundPublic:
    """Put registered model servers (by name) in the loop; with several, one is picked per attempt.
    A name that is not registered is refused (422), one not granted to the round's task (by an
    admin: PUT /model-servers/{name}/tasks/{task}) is refused (403), and nothing changes."""
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(researcher, RoundPolicy.manage(round_))
    round_lifecycle.ensure_model_can_change(round_)
    model_servers.require_granted(session, researcher, round_.task, body.model_servers)
    round_ = round_lifecycle.set_model_servers(session, researcher, round_, body.model_servers)
    model_servers.grant_loop(session, researcher, round_.task, list(round_.model_servers or []))
    return _public(session, researcher, round_)


@router.post("/rounds/{round_id}/prompts", response_model=PromptImportPublic, openapi_extra=_PROMPT_BODY)
def import_prompts(
    round_id: IdPath,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    researcher: Manager,
    content: RawBody,
    format: str | None = Query(None, description="jsonl or csv; default from Content-Type"),
) -> PromptImportPublic:
    """Import prompts into the round's prompt set. One bad row and nothing is imported."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    file_format = format or {
        "text/csv": "csv",
        "application/x-ndjson": "jsonl",
        "application/jsonl": "jsonl",
        "application/json": "jsonl",
    }.get(content_type)
    if file_format is None:
        raise Invalid("say what the file is: Content-Type text/csv or application/x-ndjson, or ?format=csv|jsonl")
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(researcher, RoundPolicy.manage(round_))
    report = round_lifecycle.import_prompts(
        session,
        researcher,
        round_,
        content,
        file_format,
        max_rows=settings.max_prompt_import_rows,
        max_depth=settings.max_input_depth,
    )
    return PromptImportPublic(
        rows=report.rows,
        imported=report.imported,
        duplicates_in_file=report.duplicates_in_file,
        already_present=report.already_present,
    )


@router.get("/rounds/{round_id}/stats", response_model=RoundStats)
def round_stats(round_id: IdPath, session: SessionDep, researcher: Manager) -> RoundStats:
    """Live statistics: assignments, attempts and fooling rate, confirmations, examples, coverage."""
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(researcher, RoundPolicy.manage(round_))
    return RoundStats.model_validate(round_lifecycle.round_stats(session, round_))


@router.get("/rounds/{round_id}/plot-data", response_model=PlotDataPublic)
def plot_data(
    round_id: IdPath,
    session: SessionDep,
    researcher: Manager,
    limit: int = Query(
        DEFAULT_LIMIT, ge=1, le=500_000, description="Most examples returned; a larger round is thinned evenly."
    ),
) -> PlotDataPublic:
    """Per example: edit distance, length, target vs prediction vs majority; worker agreement."""
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(researcher, RoundPolicy.manage(round_))
    return PlotDataPublic.model_validate(round_plot_data(session, round_, limit=limit))
