"""Labelled files a task's researchers upload for its jobs' data mixes (rounds.models.uploads)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from dynaloop.api.deps import RawBody, SessionDep, SettingsDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.dataset_uploads import DatasetUploadPublic, DatasetUploadsPublic
from rounds.models import uploads
from rounds.models.datasets import DATASET_NAME_PATTERN
from services.authorization import TaskPolicy, authorize
from services.db.models import User
from services.domain import tasks

router = APIRouter(tags=["dataset uploads"], route_class=OneHopRoute)

Manager = Annotated[User, allowed(TaskPolicy.manage)]
DatasetName = Annotated[str, Path(min_length=1, max_length=100, pattern=DATASET_NAME_PATTERN)]
ColumnName = Query(min_length=1, max_length=200)

_FILE_BODY = {
    "requestBody": {
        "required": True,
        "description": "The file's bytes (at most DYNALOOP_MAX_REQUEST_BYTES).",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post(
    "/tasks/{task_name}/datasets/uploads",
    response_model=DatasetUploadPublic,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": DatasetUploadPublic, "description": "The same bytes were already stored under the name."}
    },
    openapi_extra=_FILE_BODY,
)
def upload_dataset(
    task_name: str,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    researcher: Manager,
    raw: RawBody,
    name: Annotated[
        str,
        Query(
            min_length=1,
            max_length=100,
            pattern=DATASET_NAME_PATTERN,
            description='The dataset\'s name in the task; a data mix names it `{"dataset": NAME}`.',
        ),
    ],
    format: Annotated[uploads.UploadFormat, Query(description="csv, tsv, jsonl or parquet.")],
    text_column: Annotated[str, ColumnName] = "text",
    label_column: Annotated[str, ColumnName] = "label",
    label_separator: Annotated[
        str | None, Query(min_length=1, max_length=10, description="Multi-label CSV/TSV: labels joined by this.")
    ] = None,
) -> DatasetUploadPublic:
    """Upload a labelled file (the request body) for the task's jobs; it is checked on arrival: a
    text and a label column, every label one of the task's labels, read within bounds: 413 when it
    decodes to more than DYNALOOP_MAX_UPLOAD_DECODED_BYTES, 422 for a cell longer than its limit
    or holding a control character (its row and column named). The same bytes under the same
    name again: 200 and the stored dataset."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    received = uploads.store_upload(
        session,
        researcher,
        task,
        raw,
        name=name,
        file_format=format,
        uploads_dir=settings.data_dir / "uploads",
        max_rows=settings.max_upload_rows,
        max_decoded_bytes=settings.max_upload_decoded_bytes,
        max_cell_chars=settings.max_upload_cell_chars,
        text_column=text_column,
        label_column=label_column,
        label_separator=label_separator,
    )
    if not received.created:
        response.status_code = status.HTTP_200_OK
    return DatasetUploadPublic.of(received.upload)


@router.get("/tasks/{task_name}/datasets/uploads", response_model=DatasetUploadsPublic)
def list_uploaded_datasets(task_name: str, session: SessionDep, researcher: Manager) -> DatasetUploadsPublic:
    """The task's uploaded datasets, by name."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    rows = [DatasetUploadPublic.of(upload) for upload in uploads.list_uploads(session, task)]
    return DatasetUploadsPublic(data=rows, count=len(rows))


@router.delete("/tasks/{task_name}/datasets/uploads/{dataset_name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_uploaded_dataset(
    task_name: str, dataset_name: DatasetName, session: SessionDep, settings: SettingsDep, researcher: Manager
) -> Response:
    """Delete an uploaded dataset (409 while a queued or running job reads it)."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    uploads.delete_upload(session, researcher, task, dataset_name, uploads_dir=settings.data_dir / "uploads")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
