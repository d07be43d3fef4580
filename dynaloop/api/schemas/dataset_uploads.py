"""Uploaded datasets of a task (rounds.models.uploads)."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field

from services.db.models import DatasetUpload


class DatasetUploadPublic(BaseModel):
    id: int
    task: str
    name: str = Field(description='How a job\'s data mix names it: `{"dataset": NAME}`.')
    format: str = Field(description="csv, tsv, jsonl or parquet.")
    sha256: str
    size_bytes: int
    rows: int
    uploaded_by: str | None
    created_at: dt.datetime

    @classmethod
    def of(cls, upload: DatasetUpload) -> DatasetUploadPublic:
        return cls(
            id=upload.id,
            task=upload.task.name,
            name=upload.name,
            format=upload.format,
            sha256=upload.sha256,
            size_bytes=upload.size_bytes,
            rows=upload.rows,
            uploaded_by=upload.uploaded_by.username if upload.uploaded_by else None,
            created_at=upload.created_at,
        )


class DatasetUploadsPublic(BaseModel):
    data: list[DatasetUploadPublic]
    count: int
