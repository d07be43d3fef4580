"""API endpoints of the round builder (mounted under /api/v1 by ``dynaloop.app``): the
researcher builds a closed round; REST clients (role `client`), researchers and admins pull its
splits as JSONL, CSV or Parquet. The backend itself never imports this package."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from rounds import export
from rounds.build import BuildConfig
from rounds.build import build_round as run_build
from rounds.report import render_markdown
from services.api.deps import CurrentResearcher, CurrentUser, SessionDep, SessionmakerDep, SettingsDep
from services.api.schemas import ErrorResponse
from services.db.models import Role, User
from services.domain import rounds, tasks
from services.errors import Forbidden

router = APIRouter(tags=["round builder"])
_ERRORS = {403: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 409: {"model": ErrorResponse},
           422: {"model": ErrorResponse}}


def _dataset_reader(user: CurrentUser) -> User:
    if not (user.has_role(Role.researcher) or user.has_role(Role.client)):
        raise Forbidden("reading datasets needs the client or researcher role; your roles: "
                        + (", ".join(user.roles) or "none"))
    return user


DatasetReader = Annotated[User, Depends(_dataset_reader)]


class BuildRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    dev_test_min_votes: int | None = Field(None, ge=1, description="Default: the task's agreement setting.")
    chance: bool | None = Field(None, description="Require the round's model at chance on dev/test "
                                "(default: yes for single-label families, no for multi-label).")
    max_per_cell: int | None = Field(None, ge=1, description="Cap dev and test at this many per (gold, predicted) cell.")
    model_based: str | None = Field("dawid_skene", description="dawid_skene, mace or null.")


@router.post("/rounds/{round_id}/build", status_code=status.HTTP_201_CREATED, responses=_ERRORS)
def build_round(round_id: int, body: BuildRequest, session: SessionDep, researcher: CurrentResearcher) -> dict[str, Any]:
    """Aggregate, compute agreement and human F1, build chance-level splits; returns the report."""
    round_ = rounds.get_round(session, round_id)
    build = run_build(session, researcher, round_, BuildConfig(**body.model_dump()))
    session.commit()
    return {"build_id": build.id, "round": round_.number, "task": round_.task.name, "report": build.report}


@router.get("/tasks/{task_name}/rounds/{number}/report", responses=_ERRORS)
def round_report(task_name: str, number: int, session: SessionDep, reader: DatasetReader,
                 format: str = Query("json", pattern="^(json|markdown)$")) -> Any:
    """The newest build's report (DynaSent Table 4/7 counts, agreement, human F1, datasheet)."""
    round_ = rounds.get_round_by_number(session, tasks.get_task(session, task_name), number)
    build = export.current_build(session, round_)
    if format == "markdown":
        return Response(render_markdown(build.report), media_type="text/markdown; charset=utf-8")
    return {"build_id": build.id, **build.report}


@router.get("/tasks/{task_name}/rounds/{number}/dataset", responses={**_ERRORS, 304: {"description": "Not modified"}})
def dataset(task_name: str, number: int, request: Request, session: SessionDep, factory: SessionmakerDep,
            settings: SettingsDep, reader: DatasetReader,
            split: str = Query("train", description="train, dev, test, excluded or all"),
            format: str = Query("jsonl", description="jsonl, csv or parquet"),
            if_none_match: Annotated[str | None, Header()] = None) -> Response:
    """Stream a split of the newest build. Supports ETag / If-None-Match."""
    export.check_request(split, format)
    round_ = rounds.get_round_by_number(session, tasks.get_task(session, task_name), number)
    build = export.current_build(session, round_)
    tag = export.etag(build, split, format)
    headers = {"ETag": tag, "Cache-Control": "private, max-age=0, must-revalidate"}
    if if_none_match and tag in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=304, headers=headers)
    extension = {"jsonl": "jsonl", "csv": "csv", "parquet": "parquet"}[format]
    filename = f"{task_name}-r{number}-{split}.{extension}"
    headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    session.commit()  # release the request's transaction: the stream uses its own short ones
    return StreamingResponse(export.stream(factory, build.id, split, format, settings.secret_key),
                             media_type=export.FORMATS[format], headers=headers)
