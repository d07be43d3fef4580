"""A built round's splits, streamed as JSONL, CSV or Parquet (REST clients and researchers)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from api.deps import IdPath, SessionDep, SessionmakerDep, SettingsDep, allowed
from round_builder import export
from round_builder.usecases import dataset_download
from services.authorization import DatasetPolicy, authorize
from services.db.models import User
from services.domain import tasks

router = APIRouter(tags=["datasets"])

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
