"""The round builder's long operations, one function each, called alike by the `dynaloop`
command (``dynaloop/commands/round.py``) and the API (docs/round_builder.md):

* :func:`build`: aggregate a closed round's labels, measure agreement and human F1, make the
  chance-level splits and record the build (:func:`rounds.build.pipeline.build_round`);
* :func:`export_files`: write the newest build's splits to files, one per split, and their
  Hugging Face dataset card;
* :func:`dataset_download`: what the API needs to stream one split of the newest build;
* :func:`dataset_card_text`: the Hugging Face dataset card of an export.

Each takes one options schema (:class:`~rounds.build.build_settings.BuildSettings`,
:class:`ExportOptions`) and returns a typed result. Errors are raised as :class:`~services.errors.DomainError`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from rounds.build import dataset_card, export
from rounds.build.pipeline import build_round
from rounds.build.build_settings import BuildSettings, resolve_policy
from rounds.build.prepare import prepare
from rounds.build.preview import preview, relaxations_for
from services.db.models import Round, RoundBuild, Task, User
from services.db.transactions import commit_now
from services.domain import ledger, round_lifecycle, tasks
from services.errors import DomainError, Invalid, NotFound

logger = logging.getLogger(__name__)

__all__ = [
    "BuildPreview",
    "BuiltRound",
    "DatasetDownload",
    "ExportOptions",
    "ExportedFile",
    "build",
    "dataset_card_text",
    "dataset_download",
    "default_build_dir",
    "export_files",
    "preview_build",
]


@dataclass(frozen=True)
class BuildPreview:
    """What the requested options and each other policy would give the round; nothing recorded."""

    task: str
    round: int
    requested: dict[str, Any]  # PolicyPreview.to_dict() of the options as given
    relaxations: list[dict[str, Any]]  # the other policies, each a PolicyPreview.to_dict()


def preview_build(session: Session, round_: Round, settings: BuildSettings) -> BuildPreview:
    """Preview ``settings`` and the other policies on ``round_`` (closed, or built before)
    without recording a build."""
    prepared = prepare(session, round_)
    requested = preview(prepared, "requested", settings, settings.model_dump(exclude_defaults=True))
    try:
        policy = resolve_policy(settings, prepared.data.definition, prepared.data.examples)
    except Invalid:
        policy = None
    return BuildPreview(
        task=round_.task.name,
        round=round_.number,
        requested=requested.to_dict(),
        relaxations=[p.to_dict() for p in relaxations_for(prepared, settings, policy, refused_by=requested.constraint)],
    )


@dataclass(frozen=True)
class BuiltRound:
    build_id: int
    task: str
    round: int
    report: dict[str, Any]
    #: The folder with report.md, report.json and the plots; None when none was asked for.
    out_dir: Path | None
    #: The pay ledger computed after the build (services.domain.ledger.summary), or
    #: ``{"error": ...}`` when computing it failed; None when the task has no pay policy.
    ledger: dict[str, Any] | None = None


def default_build_dir(data_dir: Path, task_name: str, number: int, seed: int) -> Path:
    """Where `dynaloop round build` writes a build's report unless told otherwise."""
    return Path(data_dir) / "builds" / f"{task_name}-r{number}-seed{seed}"


def build(
    session: Session, actor: User | None, round_: Round, settings: BuildSettings, *, out_dir: Path | None = None
) -> BuiltRound:
    """Build ``round_`` (closed, or built before) in the caller's transaction; with ``out_dir``
    the report and its plots are written there too.

    A build never ends in a traceback: a statistic or split that cannot be computed and is not
    already a domain error (e.g. a library's ValueError on a degenerate round) becomes a
    one-line :class:`~services.errors.Invalid` (422 in the API, an error line in the CLI)
    naming what failed, and is logged with its traceback (it is a bug to report); the
    caller's transaction is rolled back with it. Database errors stay what they are."""
    try:
        built = build_round(session, actor, round_, settings, out_dir=out_dir)
    except (DomainError, SQLAlchemyError):
        raise
    except Exception as exc:
        logger.exception("building round %s failed", round_.id)
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise Invalid(f"round {round_.number} cannot be built: {message}") from exc
    return BuiltRound(
        build_id=built.id,
        task=round_.task.name,
        round=round_.number,
        report=built.report,
        out_dir=out_dir,
        ledger=_ledger_after_build(session, actor, round_),
    )


def _ledger_after_build(session: Session, actor: User | None, round_: Round) -> dict[str, Any] | None:
    """Compute the round's pay ledger (services.domain.ledger) when the task has a pay policy.
    The build stands whatever happens here: a failure is logged with its traceback, rolled back
    alone (a savepoint) and reported in the build's answer; `POST /tasks/{task}/ledger/compute`
    or `dynaloop ledger compute` computes it again."""
    if ledger.pay_policy(round_.task) is None:
        return None
    try:
        with session.begin_nested():
            return ledger.summary(ledger.compute_ledger(session, actor, round_.task, round_))
    except Exception as exc:
        logger.exception("computing the ledger of round %s after its build failed", round_.id)
        message = " ".join(str(exc).split())[:300] or type(exc).__name__
        return {
            "error": f"the ledger was not computed: {message}; "
            "compute it again with POST /tasks/{task}/ledger/compute"
        }


class ExportOptions(BaseModel):
    """What `dynaloop round export` takes: the file format and the splits, one file each."""

    model_config = ConfigDict(extra="forbid")

    format: str = Field("parquet", description="jsonl, csv or parquet.")
    splits: list[str] = Field(
        default_factory=lambda: ["train", "dev", "test"], description="train, dev, test, excluded or all."
    )


@dataclass(frozen=True)
class ExportedFile:
    split: str
    path: Path
    size: int  # bytes


def export_files(
    factory: sessionmaker[Session],
    task_name: str,
    number: int,
    out_dir: Path,
    options: ExportOptions,
    *,
    secret: str,
    on_file: Callable[[ExportedFile], None] | None = None,
) -> list[ExportedFile]:
    """Write each of ``options.splits`` of the round's newest build to
    ``out_dir/TASK-rN-SPLIT.FORMAT`` and, beside them, its Hugging Face dataset card
    (``README.md``, :mod:`rounds.build.dataset_card`; its split is ``card``); ``on_file`` hears
    of each file when it is written. Worker ids are pseudonymised with ``secret`` (the
    deployment's secret key)."""
    for split in options.splits:
        export.check_request(split, options.format)
    out_dir.mkdir(parents=True, exist_ok=True)
    with factory() as session:
        build_id = export.current_build(
            session, round_lifecycle.get_round_by_number(session, tasks.get_task(session, task_name), number)
        ).id
    written = []
    for split in options.splits:
        path = out_dir / dataset_card.file_name(task_name, number, split, options.format)
        size = export.write_file(factory, build_id, split, options.format, secret, path)
        written.append(ExportedFile(split=split, path=path, size=size))
        if on_file is not None:
            on_file(written[-1])
    with factory() as session:
        build = session.get(RoundBuild, build_id)
        if build is None:
            raise NotFound(f"build {build_id} disappeared during the export")
        sizes = {file.split: file.size for file in written}
        card = dataset_card.card_for_build(session, build, options.format, options.splits, sizes).encode("utf-8")
    path = out_dir / dataset_card.CARD_NAME
    path.write_bytes(card)
    written.append(ExportedFile(split="card", path=path, size=len(card)))
    if on_file is not None:
        on_file(written[-1])
    return written


@dataclass(frozen=True)
class DatasetDownload:
    """One split of a round's newest build, ready to stream with :func:`rounds.build.export.stream`."""

    build_id: int
    split: str
    format: str
    etag: str
    filename: str
    media_type: str


def dataset_download(session: Session, task: Task, number: int, split: str, file_format: str) -> DatasetDownload:
    """Check the request and find the newest build of round ``number`` of ``task`` (whose
    reader the caller has authorized)."""
    export.check_request(split, file_format)
    built = export.current_build(session, round_lifecycle.get_round_by_number(session, task, number))
    return DatasetDownload(
        build_id=built.id,
        split=split,
        format=file_format,
        etag=export.etag(built, split, file_format),
        filename=dataset_card.file_name(task.name, number, split, file_format),
        media_type=export.FORMATS[file_format],
    )


def dataset_card_text(
    session: Session,
    factory: sessionmaker[Session],
    task: Task,
    number: int,
    file_format: str,
    splits: list[str],
    *,
    secret: str,
) -> str:
    """The Hugging Face dataset card of the newest build of round ``number`` of ``task`` (whose
    reader the caller has authorized) for the files of ``splits`` in ``file_format``: what
    `dynaloop round export` writes as README.md beside them. Each file's size is counted by
    encoding it (``factory``'s short transactions, as a download), so this reads every row once."""
    for split in splits:
        export.check_request(split, file_format)
    built = export.current_build(session, round_lifecycle.get_round_by_number(session, task, number))
    counts = dataset_card.split_counts(session, built.id)
    commit_now(session, "end the lookup's read (on SQLite, the write lock) before the splits are read to size them")
    sizes = dataset_card.export_sizes(factory, built.id, file_format, splits, secret)
    return dataset_card.card_for_build(session, built, file_format, splits, sizes, counts=counts)
