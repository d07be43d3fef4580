"""Builds of a closed round: aggregation, agreement, human F1, chance-level splits
(rounds.build.pipeline), and the newest build's report."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status

from dynaloop.api.deps import IdPath, SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.builds import BuildPreviewPublic, BuildPublic, RoundReportPublic
from rounds.build import export
from rounds.build.build_settings import BuildSettings
from rounds.build.report import render_markdown
from rounds.build.usecases import build, preview_build
from services.authorization import BuildPolicy, DatasetPolicy, authorize
from services.db.models import User
from services.domain import round_lifecycle, tasks

router = APIRouter(tags=["builds"], route_class=OneHopRoute)

_MARKDOWN: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"text/markdown": {"schema": {"type": "string"}}},
        "description": "The report as JSON, or with `format=markdown` as Markdown.",
    }
}


@router.post(
    "/rounds/{round_id}/build",
    response_model=BuildPublic,
    status_code=status.HTTP_201_CREATED,
    response_model_exclude_unset=True,
)
def build_round(
    round_id: IdPath, body: BuildSettings, session: SessionDep, researcher: Annotated[User, allowed(BuildPolicy.create)]
) -> BuildPublic:
    """Aggregate, compute agreement and human F1, build chance-level splits; returns the report."""
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(researcher, BuildPolicy.create(round_))
    built = build(session, researcher, round_, body)
    answer: dict[str, Any] = {
        "build_id": built.build_id,
        "round": built.round,
        "task": built.task,
        "report": built.report,
    }
    if built.ledger is not None:
        answer["ledger"] = built.ledger
    return BuildPublic.model_validate(answer)


@router.post("/rounds/{round_id}/build/preview", response_model=BuildPreviewPublic)
def preview_round_build(
    round_id: IdPath, body: BuildSettings, session: SessionDep, researcher: Annotated[User, allowed(BuildPolicy.create)]
) -> BuildPreviewPublic:
    """What these build options and each other policy (strict, relaxed, fewer votes) would give
    the round: dev/test per cell or class, train size, or what is short. Records nothing."""
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(researcher, BuildPolicy.create(round_))
    previewed = preview_build(session, round_, body)
    return BuildPreviewPublic.model_validate(
        {
            "task": previewed.task,
            "round": previewed.round,
            "requested": previewed.requested,
            "relaxations": previewed.relaxations,
        }
    )


@router.get(
    "/tasks/{task_name}/rounds/{number}/report",
    response_model=RoundReportPublic,
    response_model_exclude_unset=True,
    responses=_MARKDOWN,
)
def round_report(
    task_name: str,
    number: IdPath,
    session: SessionDep,
    reader: Annotated[User, allowed(DatasetPolicy.read)],
    format: str = Query("json", pattern="^(json|markdown)$"),
) -> RoundReportPublic | Response:
    """The newest build's report (DynaSent Table 4/7 counts, agreement, human F1, datasheet)."""
    task = tasks.get_task(session, task_name)
    authorize(reader, DatasetPolicy.read(task))
    build = export.current_build(session, round_lifecycle.get_round_by_number(session, task, number))
    if format == "markdown":
        return Response(render_markdown(build.report), media_type="text/markdown; charset=utf-8")
    return RoundReportPublic.model_validate({"build_id": build.id, **build.report})
