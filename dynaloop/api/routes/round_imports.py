"""Imports of what researchers already have as a round: a labelled dataset or earlier crowd
responses (rounds.models.round_imports, docs/round_builder.md "Imports"). One request imports the
whole file; this router is not under the crowd's per-token rate limits (the bulk path)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status
from pydantic import BaseModel, Field

from dynaloop.api.deps import IdPath, SessionDep, SettingsDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.common import ANSWER_CONFIG
from rounds.models.round_imports import ImportOptions, import_round
from services.authorization import TaskPolicy, authorize
from services.db.models import User
from services.domain import tasks

router = APIRouter(tags=["round imports"], route_class=OneHopRoute)


class RoundImportPublic(BaseModel):
    """What an import wrote: the round (closed, ready to build) and its counts."""

    model_config = ANSWER_CONFIG

    task: str
    round: int
    round_id: int
    kind: str
    examples: int
    validations: int
    workers: int
    sha256: str
    repeats_merged: int = Field(
        0,
        description="Responses: examples of the file with the text of an earlier one (ignoring case, spacing "
        "and punctuation), pooled into it.",
    )
    responses_set_aside: int = Field(
        0,
        description="Responses: responses beyond the task's validations per example; the build keeps each "
        "example's best-agreeing validators' labels and sets these aside.",
    )
    notes: list[str] = Field(default_factory=list, description="What the build will do with the import, in words.")


@router.post(
    "/tasks/{task_name}/rounds/{number}/imports", response_model=RoundImportPublic, status_code=status.HTTP_201_CREATED
)
def import_into_round(
    task_name: str,
    number: IdPath,
    body: ImportOptions,
    session: SessionDep,
    settings: SettingsDep,
    researcher: Annotated[User, allowed(TaskPolicy.manage)],
) -> RoundImportPublic:
    """Import an uploaded dataset of the task, or a file under the data root, as round ``number``
    (the task's next round, or an empty one): a labelled dataset as validated examples with their
    imported gold, or crowd responses as examples and validations. All rows or none; the round is
    closed, ready to build."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    imported = import_round(
        session,
        researcher,
        task,
        number,
        body,
        secret=settings.secret_key,
        data_dir=settings.data_dir,
        data_root=settings.data_root,
        any_path=False,
        max_rows=settings.max_upload_rows,
        max_decoded_bytes=settings.max_upload_decoded_bytes,
        max_cell_chars=settings.max_upload_cell_chars,
    )
    return RoundImportPublic(**{**imported.__dict__, "notes": list(imported.notes)})
