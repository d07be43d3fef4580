"""Uploaded datasets: the labelled files a task's researchers send for its jobs' data mixes.

A job started through the API reads no file a researcher names on the server except under the
configured data root (:class:`~rounds.models.datasets.DataFiles`); anything else comes in here. An
upload is checked on arrival as the data mix will read it (a text and a label column, every label
one of the task's labels; errors give the row and column, never the file's text), then kept as
``DATA_DIR/uploads/TASK/SHA256.FORMAT`` with a ``dataset_uploads`` row, and a data mix names it
``{"dataset": NAME}``. Sending the same bytes under the same name again changes nothing.

The file is read within bounds (:mod:`rounds.models.bounded_tables`): rows, decoded bytes, the
characters of a cell (the text column's limit is the task's ``constraints.max_chars``) and no
control characters; a file over the bound on decoded bytes is :class:`~services.errors.TooLarge`
(413), any other refusal :class:`~services.errors.Invalid` (422), and nothing is stored.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rounds.models.bounded_tables import (
    DEFAULT_MAX_CELL_CHARS,
    DEFAULT_MAX_DECODED_BYTES,
    ReadBounds,
    TooMuchData,
    read_table,
)
from rounds.models.datasets import (
    DataError,
    DataMix,
    SourceSpec,
    labelled_from_frame,
    model_labels,
    upload_path,
)
from rounds.models.jobs import check_liveness
from services.db.models import DatasetUpload, Job, JobStatus, Task, User
from services.domain import audit
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid, NotFound, TooLarge

__all__ = [
    "UPLOAD_FORMATS",
    "Received",
    "UploadFormat",
    "check_upload",
    "delete_upload",
    "get_upload",
    "list_uploads",
    "store_upload",
]

UploadFormat = Literal["csv", "tsv", "jsonl", "parquet"]
UPLOAD_FORMATS: tuple[UploadFormat, ...] = ("csv", "tsv", "jsonl", "parquet")


@dataclass(frozen=True)
class Received:
    upload: DatasetUpload
    created: bool  # False: the same bytes were already stored under this name


def _check_rows(rows: int, name: str, max_rows: int) -> None:
    if rows == 0:
        raise DataError(f"{name}: the file has no rows; a dataset needs at least one labelled row")
    if rows > max_rows:
        raise DataError(
            f"{name}: {rows:,} rows is more than the {max_rows:,} an upload may have (DYNALOOP_MAX_UPLOAD_ROWS); "
            "split the file or put it under the data root (DYNALOOP_DATA_ROOT)"
        )


def check_upload(
    task: Task,
    body: bytes,
    *,
    name: str,
    file_format: UploadFormat,
    max_rows: int,
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
    max_cell_chars: int = DEFAULT_MAX_CELL_CHARS,
    text_column: str = "text",
    label_column: str = "label",
    label_separator: str | None = None,
) -> int:
    """The number of rows of an upload that the task's data mixes can read; :class:`DataError`
    (row and column, never the file's text) otherwise, :class:`TooMuchData` when it decodes to
    more than ``max_decoded_bytes``."""
    if not body:
        raise DataError(f"{name}: the file is empty; send the file's bytes as the request body")
    definition = definition_of(task)
    bounds = ReadBounds(
        max_rows=max_rows,
        max_decoded_bytes=max_decoded_bytes,
        max_cell_chars=max_cell_chars,
        column_chars={text_column: definition.constraints.max_chars},
    )
    frame = read_table(body, name, file_format, bounds)
    _check_rows(len(frame), name, max_rows)
    spec = SourceSpec(dataset=name, text_column=text_column, label_column=label_column, label_separator=label_separator)
    labelled_from_frame(
        frame,
        labels=model_labels(definition),
        multi_label=definition.is_multi_label,
        spec=spec,
        name=name,
        strict=True,
    )
    return len(frame)


def _write(path: Path, body: bytes) -> None:
    """Write ``body`` to ``path`` whole or not at all (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and path.stat().st_size == len(body):
        return  # content-addressed: the same bytes are there (another name of the task)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".upload-", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _find(session: Session, task: Task, name: str) -> DatasetUpload | None:
    return session.scalar(select(DatasetUpload).where(DatasetUpload.task_id == task.id, DatasetUpload.name == name))


def store_upload(
    session: Session,
    actor: User | None,
    task: Task,
    body: bytes,
    *,
    name: str,
    file_format: UploadFormat,
    uploads_dir: Path,
    max_rows: int,
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
    max_cell_chars: int = DEFAULT_MAX_CELL_CHARS,
    text_column: str = "text",
    label_column: str = "label",
    label_separator: str | None = None,
) -> Received:
    """Check ``body`` (:func:`check_upload`) and keep it as task ``task``'s dataset ``name``.

    The same bytes under the same name again: the stored dataset, unchanged (``created`` False).
    Other bytes under a name the task already has: :class:`Conflict` (delete it first). A refused
    upload leaves no row and no file."""
    sha256 = hashlib.sha256(body).hexdigest()
    existing = _find(session, task, name)
    if existing is not None:
        if existing.sha256 == sha256 and existing.format == file_format:
            # Puts the file back should it have gone missing from the data folder.
            _write(upload_path(uploads_dir, task.name, sha256, file_format), body)
            return Received(existing, created=False)
        raise Conflict(
            f"task {task.name!r} already has a dataset named {name!r} with other content; choose another name, "
            f"or delete it first (DELETE /api/v1/tasks/{task.name}/datasets/uploads/{name})",
            name=name,
        )
    try:
        rows = check_upload(
            task,
            body,
            name=name,
            file_format=file_format,
            max_rows=max_rows,
            max_decoded_bytes=max_decoded_bytes,
            max_cell_chars=max_cell_chars,
            text_column=text_column,
            label_column=label_column,
            label_separator=label_separator,
        )
    except TooMuchData as exc:
        raise TooLarge(str(exc)) from exc
    except DataError as exc:
        raise Invalid(str(exc)) from exc
    upload = DatasetUpload(
        task_id=task.id,
        name=name,
        format=file_format,
        sha256=sha256,
        size_bytes=len(body),
        rows=rows,
        uploaded_by_id=actor.id if actor else None,
    )
    try:
        with session.begin_nested():  # two uploads racing for one name: the second is a conflict
            session.add(upload)
            session.flush()
    except IntegrityError as exc:
        raise Conflict(f"task {task.name!r} already has a dataset named {name!r}; choose another name") from exc
    # The row first (it may conflict), then the file: a refused upload leaves neither.
    _write(upload_path(uploads_dir, task.name, sha256, file_format), body)
    audit.record(
        session, actor, "dataset.upload", "dataset_upload", upload.id, task=task.name, name=name, sha256=sha256
    )
    return Received(upload, created=True)


def list_uploads(session: Session, task: Task) -> list[DatasetUpload]:
    return list(
        session.scalars(select(DatasetUpload).where(DatasetUpload.task_id == task.id).order_by(DatasetUpload.name))
    )


def get_upload(session: Session, task: Task, name: str) -> DatasetUpload:
    upload = _find(session, task, name)
    if upload is None:
        raise NotFound(f"task {task.name!r} has no uploaded dataset {name!r}")
    return upload


def _named_in(params: dict[str, Any], name: str) -> bool:
    """Whether a job's params name dataset ``name`` in their mix."""
    mix = params.get("mix")
    if not isinstance(mix, dict):
        return False
    try:
        return any(source.dataset == name for _, source in DataMix.model_validate(mix).sources())
    except ValueError:
        return False


def delete_upload(session: Session, actor: User | None, task: Task, name: str, *, uploads_dir: Path) -> None:
    """Forget dataset ``name`` and remove its file (unless another name of the task has the same
    bytes). A queued or running job that reads it: :class:`Conflict`."""
    upload = get_upload(session, task, name)
    active = session.scalars(
        select(Job).where(Job.task_id == task.id, Job.status.in_((JobStatus.queued, JobStatus.running)))
    )
    for job in active:
        if _named_in(job.params or {}, name) and not check_liveness(session, job):
            raise Conflict(
                f"job {job.id} ({job.kind.value}, {job.status.value}) reads dataset {name!r}; delete it when "
                f"the job has finished (GET /api/v1/jobs/{job.id})",
                job_id=job.id,
            )
    sha256, file_format = upload.sha256, upload.format
    session.delete(upload)
    session.flush()
    audit.record(session, actor, "dataset.delete", "dataset_upload", upload.id, task=task.name, name=name)
    shared = session.scalar(
        select(func.count())
        .select_from(DatasetUpload)
        .where(DatasetUpload.task_id == task.id, DatasetUpload.sha256 == sha256, DatasetUpload.format == file_format)
    )
    if not shared:
        upload_path(uploads_dir, task.name, sha256, file_format).unlink(missing_ok=True)
