"""A built round's splits, streamed as JSONL, CSV or Parquet (REST clients and researchers), and
their Hugging Face dataset card."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from dynaloop.api.deps import IdPath, SessionDep, SessionmakerDep, SettingsDep, allowed
from dynaloop.api.routing import OneHopRoute
from rounds.build import export
from rounds.build.usecases import dataset_card_text, dataset_download
from services.authorization import DatasetPolicy, authorize
from services.db.models import User
from services.domain import tasks
from services.errors import Invalid

router = APIRouter(tags=["datasets"], route_class=OneHopRoute)

_FILES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {media_type: {} for media_type in export.FORMATS.values()},
        "description": "The split as a file (`Content-Disposition: attachment`), with its `ETag`.",
    },
    304: {"description": "Not modified (`If-None-Match` has the current `ETag`)."},
}


@router.get("/tasks/{task_name}/rounds/{number}/dataset", response_class=Response, responses=_FILES)
def dataset(
    task_name: str,
    number: IdPath,
    request: Request,
    session: SessionDep,
    factory: SessionmakerDep,
    settings: SettingsDep,
    reader: Annotated[User, allowed(DatasetPolicy.read)],
    split: str = Query("train", description="train, dev, test, excluded or all"),
    format: str = Query("jsonl", description="jsonl, csv or parquet"),
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Stream a split of the newest build. Supports ETag / If-None-Match.

    The request's transaction ends before the first byte is sent; the stream reads the rows in
    short transactions of its own."""
    export.check_request(split, format)
    task = tasks.get_task(session, task_name)
    authorize(reader, DatasetPolicy.read(task))
    download = dataset_download(session, task, number, split, format)
    headers = {"ETag": download.etag, "Cache-Control": "private, max-age=0, must-revalidate"}
    if if_none_match and download.etag in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=304, headers=headers)
    headers["Content-Disposition"] = f'attachment; filename="{download.filename}"'
    return StreamingResponse(
        export.stream(factory, download.build_id, split, format, settings.secret_key),
        media_type=download.media_type,
        headers=headers,
    )


@router.get(
    "/tasks/{task_name}/rounds/{number}/dataset/card",
    response_class=Response,
    responses={200: {"content": {"text/markdown": {}}, "description": "The dataset card (README.md)."}},
)
def dataset_card(
    task_name: str,
    number: IdPath,
    session: SessionDep,
    factory: SessionmakerDep,
    settings: SettingsDep,
    reader: Annotated[User, allowed(DatasetPolicy.read)],
    format: str = Query("parquet", description="jsonl, csv or parquet: the format of the files it describes"),
    splits: str = Query(
        "train,dev,test", max_length=100, description="Comma-separated splits it lists (train, dev, test, excluded)"
    ),
) -> Response:
    """The Hugging Face dataset card of the newest build's export (what `dynaloop round export`
    writes as README.md beside the files), with its YAML metadata header: licence, language,
    the split files and their declared features."""
    names = [split.strip() for split in splits.split(",") if split.strip()]
    if not names or len(names) > len(export.SPLITS):
        raise Invalid(f"splits: list 1 to {len(export.SPLITS)} of {', '.join(export.SPLITS)}")
    task = tasks.get_task(session, task_name)
    authorize(reader, DatasetPolicy.read(task))
    text = dataset_card_text(session, factory, task, number, format, names, secret=settings.secret_key)
    return Response(text, media_type="text/markdown; charset=utf-8")
