"""API endpoints of the round builder (mounted under /api/v1 by ``api.app``): the
researcher builds a closed round; REST clients (role `client`), researchers and admins pull its
splits as JSONL, CSV or Parquet. The backend itself never imports this package."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from round_builder import export
from modelling import jobs as job_runs
from round_builder.build import BuildConfig
from round_builder.build import build_round as run_build
from round_builder.dashboard import DEFAULT_LIMIT, round_plot_data
from modelling.registry import attempt_counts, list_models
from round_builder.report import render_markdown
from api.deps import CurrentResearcher, CurrentUser, IdPath, SessionDep, SessionmakerDep, SettingsDep
from api.schemas import ErrorResponse, error_responses
from services.db.models import Job, JobKind, JobStatus, ModelVersion, Role, User
from services.domain import rounds, tasks
from services.errors import Forbidden

router = APIRouter(tags=["round builder"], responses=error_responses(401, 403, 404, 409, 413, 422, 503))
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
def build_round(round_id: IdPath, body: BuildRequest, session: SessionDep,
                researcher: CurrentResearcher) -> dict[str, Any]:
    """Aggregate, compute agreement and human F1, build chance-level splits; returns the report."""
    round_ = rounds.get_round(session, round_id)
    build = run_build(session, researcher, round_, BuildConfig(**body.model_dump()))
    session.commit()
    return {"build_id": build.id, "round": round_.number, "task": round_.task.name, "report": build.report}


@router.get("/tasks/{task_name}/rounds/{number}/report", responses=_ERRORS)
def round_report(task_name: str, number: IdPath, session: SessionDep, reader: DatasetReader,
                 format: str = Query("json", pattern="^(json|markdown)$")) -> Any:
    """The newest build's report (DynaSent Table 4/7 counts, agreement, human F1, datasheet)."""
    round_ = rounds.get_round_by_number(session, tasks.get_task(session, task_name), number)
    build = export.current_build(session, round_)
    if format == "markdown":
        return Response(render_markdown(build.report), media_type="text/markdown; charset=utf-8")
    return {"build_id": build.id, **build.report}


@router.get("/tasks/{task_name}/rounds/{number}/dataset", responses={**_ERRORS, 304: {"description": "Not modified"}})
def dataset(task_name: str, number: IdPath, request: Request, session: SessionDep, factory: SessionmakerDep,
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


# --- jobs: train, evaluate and promote in their own process (modelling.jobs) ------------------


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: JobKind = Field(description="train, evaluate or promote.")
    params: dict[str, Any] = Field(default_factory=dict, description="The kind's parameters (docs/api.md, Jobs).")


class JobPublic(BaseModel):
    id: int
    kind: JobKind
    task: str
    status: JobStatus
    progress: float = Field(description="0 to 1.")
    message: str
    params: dict[str, Any]
    result: dict[str, Any] | None
    log: str | None = Field(None, description="The newest lines of the job's log (only on GET /jobs/{id}).")
    created_by: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None

    @classmethod
    def of(cls, job: Job, *, with_log: bool = False) -> JobPublic:
        return cls(id=job.id, kind=job.kind, task=job.task.name, status=job.status, progress=job.progress,
                   message=job.message, params=job.params or {}, result=job.result,
                   log=job.log if with_log else None, created_by=job.created_by.username if job.created_by else None,
                   created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at)


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


@router.post("/tasks/{task_name}/jobs", status_code=status.HTTP_202_ACCEPTED, response_model=JobPublic,
             tags=["jobs"], responses=_ERRORS)
def create_job(task_name: str, body: JobCreate, session: SessionDep, factory: SessionmakerDep,
               settings: SettingsDep, researcher: CurrentResearcher) -> JobPublic:
    """Start a train, evaluate or promote job in its own process; poll GET /jobs/{id} for progress."""
    task = tasks.get_task(session, task_name)
    default_token = settings.model_server_admin_token.get_secret_value() if settings.model_server_admin_token \
        else None
    job, secret = job_runs.create_job(session, researcher, task, body.kind, body.params,
                                      data_dir=settings.data_dir, admin_token=default_token)
    session.commit()  # the job's process reads the row
    job_runs.start_job(factory, job.id, database_url=settings.resolved_database_url, data_dir=settings.data_dir,
                       admin_token=secret)
    session.refresh(job)
    return JobPublic.of(job, with_log=True)


@router.get("/jobs/{job_id}", response_model=JobPublic, tags=["jobs"], responses=_ERRORS)
def get_job(job_id: IdPath, session: SessionDep, researcher: CurrentResearcher) -> JobPublic:
    """A job's status, progress (0-1), message, result and the newest lines of its log."""
    return JobPublic.of(job_runs.get_job(session, job_id), with_log=True)


@router.get("/tasks/{task_name}/jobs", response_model=JobsPublic, tags=["jobs"], responses=_ERRORS)
def list_jobs(task_name: str, session: SessionDep, researcher: CurrentResearcher,
              kind: JobKind | None = None, job_status: JobStatus | None = Query(None, alias="status"),
              limit: int = Query(50, ge=1, le=500)) -> JobsPublic:
    """The task's jobs, newest first (without their logs)."""
    found = job_runs.list_jobs(session, tasks.get_task(session, task_name), kind=kind, status=job_status,
                               limit=limit)
    return JobsPublic(data=[JobPublic.of(job) for job in found], count=len(found))


class ModelPublic(BaseModel):
    id: int
    name: str
    model_id: str
    version: str
    status: str
    trained_for_round: int | None
    base_model: str
    directory: str
    endpoint: str | None
    labels: list[Any]
    attempts: int = Field(description="Attempts of the task's rounds this version scored.")
    best_dev_macro_f1: float | None
    macro_f1: dict[str, Any] = Field(description="Evaluation: macro-F1 per set (fractions).")
    solved: dict[str, Any] = Field(description="Evaluation: set -> macro-F1 reached the human estimate.")
    hyperparameters: dict[str, Any]
    created_at: dt.datetime
    evaluated_at: dt.datetime | None
    promoted_at: dt.datetime | None
    retired_at: dt.datetime | None

    @classmethod
    def of(cls, model: ModelVersion, attempts: int) -> ModelPublic:
        evaluation = model.evaluation or {}
        best = (model.metrics or {}).get("best_dev_macro_f1")
        return cls(id=model.id, name=model.name, model_id=model.model_id, version=model.version,
                   status=model.status.value, trained_for_round=model.trained_for_round, base_model=model.base_model,
                   directory=model.directory, endpoint=model.endpoint, labels=list(model.labels or []),
                   attempts=attempts, best_dev_macro_f1=best if isinstance(best, int | float) else None,
                   macro_f1=dict(evaluation.get("macro_f1") or {}), solved=dict(evaluation.get("solved") or {}),
                   hyperparameters=model.hyperparameters or {}, created_at=model.created_at,
                   evaluated_at=model.evaluated_at, promoted_at=model.promoted_at, retired_at=model.retired_at)


class ModelsPublic(BaseModel):
    data: list[ModelPublic]
    count: int


@router.get("/tasks/{task_name}/models", response_model=ModelsPublic, tags=["jobs"], responses=_ERRORS)
def task_models(task_name: str, session: SessionDep, researcher: CurrentResearcher) -> ModelsPublic:
    """The task's model registry, oldest first, with the attempts each version scored."""
    task = tasks.get_task(session, task_name)
    counts = attempt_counts(session, task)
    rows = [ModelPublic.of(model, counts.get(model.id, 0)) for model in list_models(session, task)]
    return ModelsPublic(data=rows, count=len(rows))


@router.get("/rounds/{round_id}/plot-data", tags=["jobs"], responses=_ERRORS)
def plot_data(round_id: IdPath, session: SessionDep, researcher: CurrentResearcher,
              limit: int = Query(DEFAULT_LIMIT, ge=1, le=500_000,
                                 description="Most examples returned; a larger round is thinned evenly.")
              ) -> dict[str, Any]:
    """Per example: edit distance, length, target vs prediction vs majority; worker agreement."""
    return round_plot_data(session, rounds.get_round(session, round_id), limit=limit)
