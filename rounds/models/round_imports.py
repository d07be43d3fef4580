"""Imports of what researchers already have, as a round (docs/round_builder.md "Imports").

One use case, :func:`import_round`, called alike by `dynaloop round import` and
``POST /api/v1/tasks/{task}/rounds/{n}/imports``. Two kinds of file:

* ``labelled``: a labelled dataset (one row per example: text, gold label or label set, and
  what the task's family needs: a target with character offsets, an intended label and a
  rephrase). Each row becomes a validated example of ``origin = imported`` whose *imported
  gold* (and, where the file has them, its vote counts and original split) is recorded in
  ``source_metadata``; the build takes that gold as is and says so in its report.
* ``responses``: earlier crowd responses, one row per (example, worker, label[, seconds]), or
  *wide* (``annotator_columns``): one row per example and one column per annotator. Each example
  becomes an imported example and each response a counted validation by a pseudonymous validator
  account, so the ordinary builder computes gold, agreement and splits from them exactly as for
  responses collected here.

An imported example keeps the file's text exactly as given (the text policy still refuses what it
refuses; normalisation is for matching rows and duplicates only) and the row's id as
``Example.source_id`` (the id column, ``id`` when the file has one), so an export joins back to
the file. An empty label set (``[]``) means what it means to the API: the task's one exclusive
label (services.domain.labels.check_label_set).

Everything is checked before anything is written, and the whole import is one transaction:
a bad row is one error naming the row (counted from 1, the header not counted) and the column,
never the row's text, and the database is left as it was.

Files are read through the rules of :mod:`rounds.models.datasets`: the `dynaloop` command reads any
path; the API only a task's uploaded dataset or a path under ``DYNALOOP_DATA_ROOT``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rounds.models.bounded_tables import (
    DEFAULT_MAX_CELL_CHARS,
    DEFAULT_MAX_DECODED_BYTES,
    ReadBounds,
    TooMuchData,
    read_table,
)
from rounds.models.datasets import (
    FILE_FORMATS,
    NOT_READABLE,
    DataError,
    under_root,
    upload_path,
    uploaded_dataset_field,
)
from services.db.models import (
    Condition,
    DatasetUpload,
    Example,
    ExampleOrigin,
    ExampleStatus,
    Role,
    Round,
    RoundStatus,
    Task,
    User,
    Validation,
    utcnow,
)
from services.domain import audit, duplicates, round_lifecycle
from services.domain.labels import check_label_set
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid, TooLarge
from services.taskdef import TaskDefinition, TaskFamily, WriterFieldName
from services.text import clean_text, duplicate_key

__all__ = ["MAX_IMPORT_BYTES", "MAX_TEXT_CHARS", "ImportOptions", "ImportedRound", "import_round", "worker_username"]

#: The largest file (or `datasets` directory) one import reads.
MAX_IMPORT_BYTES = 256 * 1024 * 1024
#: The longest text of one imported example. Imported texts were not written here, so the task's
#: writer limits (length, words) do not apply; the text policy (services/text.py) does.
MAX_TEXT_CHARS = 5000
#: The most distinct workers one responses import may bring in (each becomes an account).
MAX_WORKERS = 100_000
#: The longest id of an imported row (``Example.source_id``).
MAX_ID_CHARS = 500
SPLITS = ("train", "dev", "test")


class ImportOptions(BaseModel):
    """What `dynaloop round import` and ``POST /tasks/{task}/rounds/{n}/imports`` take."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["labelled", "responses"] = Field(
        description="labelled: one row per example with its gold; responses: one row per (example, worker, label)."
    )
    dataset: str | None = uploaded_dataset_field()
    file: Path | None = Field(
        None,
        description="CSV, TSV, JSONL, Parquet, or a directory written by `datasets`' save_to_disk; through "
        "the API a path relative to the server's data root (DYNALOOP_DATA_ROOT).",
    )
    text_column: str = Field("text", min_length=1, max_length=200)
    label_column: str = Field("label", min_length=1, max_length=200)
    label_separator: str | None = Field(
        None, min_length=1, max_length=10, description="Multi-label CSV/TSV: labels joined by this, e.g. ','."
    )
    id_column: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="The example's id in the file, kept as the export's `source_id`; default: the column `id` "
        "when the file has one (responses: rows with the same id are one example; without an id, rows with "
        "the same text are).",
    )
    worker_column: str = Field("worker", min_length=1, max_length=200, description="responses: the worker's id.")
    annotator_columns: list[str] | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="responses in the wide format: one row per example, one column per annotator (the column's "
        "name is the worker); names or patterns such as 'annotator_*'. A cell is a label, labels joined by "
        "`label_separator` or a JSON list; an empty cell: that annotator did not label the example.",
    )
    seconds_column: str | None = Field(
        None, min_length=1, max_length=200, description="responses: seconds the worker took (optional)."
    )
    target_start_column: str = Field("target_start", min_length=1, max_length=200)
    target_end_column: str = Field("target_end", min_length=1, max_length=200)
    target_column: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Target-dependent tasks: the target's text; checked against the text at the offsets.",
    )
    votes_column: str | None = Field(
        None, min_length=1, max_length=200, description="labelled: how many of the original annotators chose the gold."
    )
    responses_column: str | None = Field(
        None, min_length=1, max_length=200, description="labelled: how many original annotators labelled the row."
    )
    split_column: str | None = Field(
        None, min_length=1, max_length=200, description="labelled: the dataset's own split (train, dev or test)."
    )
    label_map: dict[str, str | list[str]] = Field(
        default_factory=dict,
        max_length=1000,
        description='A file\'s label value -> the task\'s label(s), e.g. {"0": "not_irony", "1": "irony"}; '
        "values are compared as text, so 1 and '1' are the same key.",
    )
    source: str | None = Field(None, max_length=200, description="What the data is, for the report (e.g. a citation).")

    @field_validator("file")
    @classmethod
    def _short_path(cls, value: Path | None) -> Path | None:
        if value is not None and (len(str(value)) > 1000 or "\x00" in str(value)):
            raise ValueError("a file path has at most 1000 characters and no NUL")
        return value

    @field_validator("annotator_columns")
    @classmethod
    def _column_names(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not name or len(name) > 200 for name in value):
            raise ValueError("each annotator column (or pattern) has 1 to 200 characters")
        return value

    @model_validator(mode="after")
    def _one_origin(self) -> ImportOptions:
        if (self.dataset is None) == (self.file is None):
            raise ValueError("give exactly one of `dataset` (an uploaded dataset) or `file`")
        if self.annotator_columns is not None and self.kind != "responses":
            raise ValueError("annotator_columns (the wide format) is for kind `responses`")
        return self


@dataclass(frozen=True)
class ImportedRound:
    task: str
    round: int
    round_id: int
    kind: str
    examples: int
    validations: int
    workers: int
    sha256: str
    # Responses: examples of the file with the text of an earlier one, pooled into it.
    repeats_merged: int = 0
    # Responses beyond the task's validations per example, which the build sets aside (it keeps
    # the best-agreeing validators' labels; docs/round_builder.md "Imports"), and what to say.
    responses_set_aside: int = 0
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------- reading


def _locate(
    session: Session, task: Task, options: ImportOptions, *, data_dir: Path, data_root: Path | None, any_path: bool
) -> Path:
    """The file or directory to read, decided before anything is opened."""
    if options.dataset is not None:
        upload = session.scalar(
            select(DatasetUpload).where(DatasetUpload.task_id == task.id, DatasetUpload.name == options.dataset)
        )
        if upload is None:
            raise Invalid(f"dataset: task {task.name!r} has no uploaded dataset {options.dataset!r}", field="dataset")
        path = upload_path(Path(data_dir) / "uploads", task.name, upload.sha256, upload.format)
        if not path.is_file():
            raise Invalid(f"dataset: the file of uploaded dataset {options.dataset!r} is missing; upload it again")
        return path
    assert options.file is not None
    if any_path:
        path = options.file.expanduser().resolve()
        if not path.exists():
            raise Invalid(f"file: {options.file} does not exist", field="file")
        return path
    found = under_root(data_root, options.file)
    # A `datasets` directory is read file by file by `datasets`: a symlink inside it could lead
    # out of the root, so a directory with any symlink is refused like a path outside it.
    escapes = found is not None and found.is_dir() and any(p.is_symlink() for p in found.rglob("*"))
    if found is None or escapes or not (found.is_dir() or found.suffix.lower() in FILE_FORMATS):
        raise Invalid(
            f"file: {NOT_READABLE}; give a path relative to the data root, or upload the file and name it "
            "with `dataset`",
            field="file",
        )
    return found


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode())
        with file.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _read(path: Path, options: ImportOptions, max_rows: int, bounds: ReadBounds) -> pd.DataFrame:
    """The file as a frame; a file (not a `datasets` directory) is read within ``bounds``
    (rounds.models.bounded_tables: decoded bytes, cell length, control characters)."""
    name = options.dataset or path.name
    size = _size(path)
    if size > MAX_IMPORT_BYTES:
        raise Invalid(f"{name} has {size} bytes; one import reads at most {MAX_IMPORT_BYTES}")
    if path.is_dir():
        frame = _read_saved_dataset(path, name, options)
    else:
        kind = FILE_FORMATS.get(path.suffix.lower())
        if kind is None:
            raise Invalid(f"{name}: unknown file type {path.suffix!r}; use one of {sorted(FILE_FORMATS)}")
        try:
            frame = read_table(path, name, kind, bounds)
        except TooMuchData as exc:
            raise TooLarge(str(exc)) from exc
        except DataError as exc:
            raise Invalid(str(exc)) from exc
    if frame.empty:
        raise Invalid(f"{name} has no rows")
    if len(frame) > max_rows:
        raise Invalid(f"{name} has {len(frame)} rows; one import takes at most {max_rows}")
    return frame.reset_index(drop=True)


def _read_saved_dataset(path: Path, name: str, options: ImportOptions) -> pd.DataFrame:
    """A directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``; a
    DatasetDict's split names become the rows' original split."""
    try:
        import datasets  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        raise Invalid(f"{name} is a directory; reading a `datasets` directory needs the `datasets` package") from exc
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises many types for a directory it cannot read
        raise Invalid(f"{name} could not be read as a `datasets` directory (save_to_disk)") from exc
    if isinstance(loaded, datasets.DatasetDict):
        column = options.split_column or "split"
        frames = []
        for split, part in loaded.items():
            frame = part.to_pandas()
            assert isinstance(frame, pd.DataFrame)
            frames.append(frame.assign(**{column: split}))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    frame = loaded.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    return frame


# --------------------------------------------------------------------------- checking


def _where(row: int, column: str) -> str:
    return f"row {row + 1}, column {column!r}"


def _missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def _require_columns(frame: pd.DataFrame, columns: Sequence[str | None], hint: str = "") -> None:
    absent = [c for c in columns if c is not None and c not in frame.columns]
    if absent:
        raise Invalid(
            f"the file has no column {absent[0]!r}; its columns are {sorted(map(str, frame.columns))[:30]}{hint}"
        )


# Column names of the wide format's annotators in files seen in the wild: annotator_1, rater2, A3...
_ANNOTATOR_NAME = re.compile(r"(annotator|annotation|ann|rater|coder|judge|labell?er|worker|[arw])[ _-]?\d+", re.I)


def _wide_hint(frame: pd.DataFrame, definition: TaskDefinition, options: ImportOptions) -> str:
    """When a file without the long format's columns looks wide (two or more columns named like
    annotators, or whose first cells are all labels of the task), the option that reads it."""
    known = {options.text_column, options.id_column, options.split_column, options.target_column}
    candidates = []
    for column in frame.columns:
        if column in known or not isinstance(column, str):
            continue
        if _ANNOTATOR_NAME.fullmatch(column.strip()):
            candidates.append(column)
            continue
        cells = [value for value in frame[column].head(50) if not _missing(value)]
        try:
            for row, value in enumerate(cells):
                _labels(
                    definition,
                    value,
                    row,
                    column,
                    allowed=definition.effective_validation_labels,
                    separator=options.label_separator,
                    label_map=options.label_map,
                )
        except Invalid:
            continue
        if cells:
            candidates.append(column)
    if len(candidates) < 2:
        return ""
    shown = ", ".join(repr(c) for c in candidates[:5]) + (", ..." if len(candidates) > 5 else "")
    return (
        f"; the file looks wide (one column per annotator: {shown}): import it as kind `responses` with "
        'annotator_columns (`--annotator-columns`), docs/round_builder.md "Imports"'
    )


def _text(value: Any, row: int, column: str) -> tuple[str, str]:
    """The text exactly as the file gives it, and its form under the text policy (NFC, trimmed,
    invisible characters stripped), which is for comparing rows only. The policy's refusals
    (control characters, bidi overrides, no visible character, too long) apply to the text
    itself: what it would strip or normalise is kept, so an export gives back the file's bytes."""
    if _missing(value):
        raise Invalid(f"{_where(row, column)}: the text is empty")
    if not isinstance(value, str):
        raise Invalid(f"{_where(row, column)}: the text must be a string")
    try:
        return value, clean_text(value, field=_where(row, column), max_chars=MAX_TEXT_CHARS)
    except Invalid as exc:
        raise Invalid(str(exc)) from exc


def _source_id(value: Any, row: int, column: str) -> str | None:
    """A row's id as text, as the file has it (a whole number read as a float, e.g. from a
    Parquet column with nulls, without its ``.0``); None for an empty cell."""
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars from Parquet
        value = value.item()
    if _missing(value):
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise Invalid(f"{_where(row, column)}: an id is text or a whole number")
    if isinstance(value, float):
        if not value.is_integer():
            raise Invalid(f"{_where(row, column)}: an id is text or a whole number")
        value = int(value)
    text = str(value)
    if len(text) > MAX_ID_CHARS:
        raise Invalid(f"{_where(row, column)}: an id has at most {MAX_ID_CHARS} characters")
    return text


def _labels(
    definition: TaskDefinition,
    value: Any,
    row: int,
    column: str,
    *,
    allowed: list[str],
    separator: str | None,
    label_map: dict[str, str | list[str]],
) -> list[str]:
    where = _where(row, column)
    if hasattr(value, "tolist") and not isinstance(value, str):  # numpy arrays from Parquet
        value = value.tolist()
    if definition.is_multi_label and isinstance(value, str) and value.strip().startswith("["):
        # A label set written as a JSON list in a text cell (CSV, TSV, the wide format's cells).
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise Invalid(f"{where}: starts with '[' but is not a JSON list of labels") from None
        if not isinstance(value, list):
            raise Invalid(f"{where}: starts with '[' but is not a JSON list of labels")
    if isinstance(value, list):
        items = value
    elif _missing(value):
        raise Invalid(f"{where}: the label is empty")
    elif definition.is_multi_label and separator is not None and isinstance(value, str):
        items = [part.strip() for part in value.split(separator) if part.strip()]
    else:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        items = [str(value).strip()]
    if label_map:
        mapped: list[Any] = []
        for item in items:
            key = str(int(item)) if isinstance(item, float) and item.is_integer() else str(item).strip()
            target = label_map.get(key, item)
            mapped.extend(target if isinstance(target, list) else [target])
        items = mapped
    if not all(isinstance(item, str) for item in items):
        raise Invalid(f"{where}: labels must be text")
    try:
        # An empty set ([]) means what it means in the API: the task's one exclusive label.
        return check_label_set(definition, items, allowed=allowed, what=where, empty_is_exclusive=True)
    except Invalid as exc:
        # check_label_set names the unknown label; it is one of the file's label values, not its text.
        # It puts the label right after ``what``: a colon keeps the place and the value apart.
        message = str(exc)
        if message.startswith(f"{where} ") and not message.startswith(f"{where}: "):
            message = f"{where}: {message[len(where) + 1 :]}"
        raise Invalid(message) from exc


def _count(value: Any, row: int, column: str, *, least: int) -> int | None:
    if _missing(value):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number.is_integer() or number < least or number > 10_000:
        raise Invalid(f"{_where(row, column)}: must be a whole number from {least} to 10000")
    return int(number)


def _span(frame: pd.DataFrame, row: int, text: str, options: ImportOptions) -> dict[str, Any]:
    """A target's character offsets, checked against the text (and the target's own text when the
    file has it: a text may contain its target twice, so the offsets decide which)."""
    offsets = []
    for column in (options.target_start_column, options.target_end_column):
        offset = _count(frame.at[row, column], row, column, least=0)
        if offset is None:
            raise Invalid(f"{_where(row, column)}: a target-dependent task needs the target's offsets")
        offsets.append(offset)
    start, end = offsets
    if not 0 <= start < end <= len(text):
        raise Invalid(
            f"{_where(row, options.target_start_column)}: target offsets [{start}, {end}] are outside the text "
            f"(0..{len(text)})"
        )
    if not text[start:end].strip():
        raise Invalid(f"{_where(row, options.target_start_column)}: target offsets [{start}, {end}] cover only space")
    if options.target_column is not None:
        target = frame.at[row, options.target_column]
        if not isinstance(target, str) or text[start:end] != target.strip():
            raise Invalid(
                f"{_where(row, options.target_column)}: the text at offsets [{start}, {end}] is not the target; "
                "check the offsets (counted in characters from 0, end exclusive)"
            )
    return {"start": start, "end": end, "text": text[start:end]}


def _extras(definition: TaskDefinition, frame: pd.DataFrame, row: int, text: str, options: ImportOptions) -> dict:
    """The writer fields the file has (an intended label, a rephrase, ...), checked as when a writer
    submits them; fields the file lacks are left out, whether the task requires them of writers or
    not (an imported example was not written here)."""
    extras: dict[str, Any] = {}
    for spec in definition.writer_fields:
        name = spec.name.value
        if name == WriterFieldName.target_span.value:
            extras[name] = _span(frame, row, text, options)
            continue
        if name not in frame.columns or _missing(frame.at[row, name]):
            continue
        value = frame.at[row, name]
        choices = definition.field_choices(spec)
        if choices is not None:
            value = str(value).strip()
            if value not in choices:
                raise Invalid(f"{_where(row, name)}: not one of {choices}")
            extras[name] = value
        elif not isinstance(value, str):
            raise Invalid(f"{_where(row, name)}: must be text")
        else:
            extras[name] = clean_text(value, field=_where(row, name), max_chars=spec.max_chars)
    return extras


def _key(text: str, extras: dict[str, Any]) -> tuple[str, str]:
    """The rows of one text: its :func:`~services.text.duplicate_key` (the normalized text and,
    for a target-dependent task, the normalized target), so ``Great food!`` and ``great food``
    are one text, as they are for writers and for the round builder."""
    span = extras.get(WriterFieldName.target_span.value)
    return ("text", duplicate_key(text, span["text"] if span else None))


# --------------------------------------------------------------------------- the round


def _empty_round(session: Session, actor: User | None, task: Task, number: int) -> Round:
    """Round ``number`` of ``task``: a new one when it is the next number, else an existing round
    that has no examples yet (an import never mixes with collected examples)."""
    round_ = session.scalar(select(Round).where(Round.task_id == task.id, Round.number == number))
    if round_ is None:
        following = (session.scalar(select(func.max(Round.number)).where(Round.task_id == task.id)) or 0) + 1
        if number != following:
            raise Invalid(f"task {task.name!r} has no round {number}; import into round {following} (the next one)")
        return round_lifecycle.create_round(session, actor, task, model_servers=[], notes="imported")
    if round_.status in (RoundStatus.closed, RoundStatus.built):
        raise Conflict(f"round {number} is {round_.status.value}; import into a new round")
    if session.scalar(select(func.count()).select_from(Example).where(Example.round_id == round_.id)):
        raise Conflict(f"round {number} already has examples; import into a new round")
    return round_


def worker_username(secret: str, worker: str) -> str:
    """The pseudonymous account of an external worker: an HMAC of the platform's worker id with
    the deployment's secret, so the id itself is never stored and the same worker maps to the same
    account in every import of one deployment."""
    digest = hmac.new(secret.encode(), f"imported-worker:{worker}".encode(), hashlib.sha256).hexdigest()
    return f"imported-{digest[:20]}"


def _workers(session: Session, secret: str, ids: list[str]) -> dict[str, int]:
    names = {worker: worker_username(secret, worker) for worker in ids}
    existing: dict[str, int] = {}
    wanted = sorted(set(names.values()))
    for start in range(0, len(wanted), 1000):
        existing.update(
            session.execute(select(User.username, User.id).where(User.username.in_(wanted[start : start + 1000]))).all()
        )
    new = [name for name in wanted if name not in existing]
    # Accounts that cannot log in: no password and inactive; they exist so that validations and
    # the builder's per-worker statistics have a validator to point at. They were paid (or not)
    # where the responses were collected: the ledger never pays them (made_by_import).
    users = [
        User(
            username=name,
            display_name="imported worker",
            roles=[Role.validator.value],
            password_hash=None,
            is_active=False,
            made_by_import=True,
        )
        for name in new
    ]
    session.add_all(users)
    session.flush()
    existing.update({user.username: user.id for user in users})
    return {worker: existing[name] for worker, name in names.items()}


def _example(
    round_: Round, definition: TaskDefinition, text: str, extras: dict, metadata: dict, source_id: str | None
) -> Example:
    return Example(
        round_id=round_.id,
        origin=ExampleOrigin.imported,
        source_metadata=metadata,
        source_id=source_id,
        # As for harvested sentences: the prompt condition lets an imported example reach dev/test;
        # with no prompt id each example stands alone.
        condition=Condition.prompt,
        prompt_id=None,
        text=text,
        target_label=[],  # nobody wrote it for a label here
        model_prediction=None,
        model_id=None,
        fooled=False,
        extras=extras,
        status=ExampleStatus.validated,
        validation_count=0,
        # What it was labelled with, not what the task asks of a new example: none for a labelled
        # row (its gold is imported), the imported responses' count for a crowd one (set below),
        # so the database's invariants (services/domain/invariants.py) hold for imported examples.
        validations_needed=0,
        requeue_count=0,
    )


def _labelled(
    session: Session,
    round_: Round,
    definition: TaskDefinition,
    frame: pd.DataFrame,
    options: ImportOptions,
    origin: dict,
) -> int:
    _require_columns(
        frame,
        [
            options.text_column,
            options.label_column,
            options.votes_column,
            options.responses_column,
            options.split_column,
            options.target_column,
            options.id_column,
            *(
                [options.target_start_column, options.target_end_column]
                if definition.family is TaskFamily.target_dependent
                else []
            ),
        ],
        hint=_wide_hint(frame, definition, options) if options.label_column not in frame.columns else "",
    )
    seen: dict[tuple[Any, ...], int] = {}
    examples = []
    for row in range(len(frame)):
        text, _cleaned = _text(frame.at[row, options.text_column], row, options.text_column)
        gold = _labels(
            definition,
            frame.at[row, options.label_column],
            row,
            options.label_column,
            allowed=list(definition.labels),
            separator=options.label_separator,
            label_map=options.label_map,
        )
        extras = _extras(definition, frame, row, text, options)
        key = _key(text, extras)
        if key in seen:
            target = " and target" if WriterFieldName.target_span.value in extras else ""
            raise Invalid(
                f"row {row + 1} repeats row {seen[key] + 1} (the same text{target}, ignoring case, spacing and "
                "punctuation); a labelled dataset gives each text one gold label: remove one of the rows, or "
                "import the labels as responses to pool them"
            )
        seen[key] = row
        votes = (
            _count(frame.at[row, options.votes_column], row, options.votes_column, least=1)
            if options.votes_column
            else None
        )
        answered = (
            _count(frame.at[row, options.responses_column], row, options.responses_column, least=1)
            if options.responses_column
            else None
        )
        if votes is not None and answered is not None and votes > answered:
            raise Invalid(f"{_where(row, options.votes_column or '')}: more votes for the gold than responses")
        split = None
        if options.split_column and not _missing(frame.at[row, options.split_column]):
            split = str(frame.at[row, options.split_column]).strip().lower()
            split = {"validation": "dev", "valid": "dev", "val": "dev"}.get(split, split)
            if split not in SPLITS:
                raise Invalid(f"{_where(row, options.split_column)}: not one of {list(SPLITS)} (or validation)")
        source_id = _source_id(frame.at[row, options.id_column], row, options.id_column) if options.id_column else None
        metadata = {
            **origin,
            "row": row + 1,
            "gold": gold,
            "gold_votes": votes,
            "responses": answered,
            "split": split,
        }
        examples.append(_example(round_, definition, text, extras, metadata, source_id))
    session.add_all(examples)
    session.flush()
    duplicates.record_texts(session, round_.task, examples)
    return len(examples)


def _annotator_columns(frame: pd.DataFrame, options: ImportOptions) -> list[str]:
    """The wide format's annotator columns: each name or pattern of ``annotator_columns``
    (``fnmatch``: ``annotator_*``) matched against the file's columns, in the file's order."""
    assert options.annotator_columns is not None
    reserved = {
        options.text_column,
        options.id_column,
        options.target_column,
        options.target_start_column,
        options.target_end_column,
    }
    names = [str(column) for column in frame.columns]
    chosen: list[str] = []
    for pattern in options.annotator_columns:
        matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise Invalid(
                f"annotator_columns: no column of the file is {pattern!r}; its columns are {sorted(names)[:30]}"
            )
        chosen.extend(name for name in matched if name not in chosen)
    clash = [name for name in chosen if name in reserved]
    if clash:
        raise Invalid(f"annotator_columns: {clash[0]!r} is the text, id or target column, not an annotator's")
    return chosen


def _response_cells(
    frame: pd.DataFrame, options: ImportOptions, annotators: list[str] | None
) -> Iterator[tuple[int, str, str]]:
    """Each response of the file as (row, worker, the column holding its label). Long format: one
    per row, the worker from ``worker_column``. Wide format: one per non-empty annotator cell, the
    worker the column's name; an empty cell is an example that annotator did not label, and a row
    no annotator labelled is refused (an example without responses has nothing to build on)."""
    for row in range(len(frame)):
        if annotators is None:
            worker = frame.at[row, options.worker_column]
            if _missing(worker):
                raise Invalid(f"{_where(row, options.worker_column)}: the worker id is empty")
            worker = str(int(worker) if isinstance(worker, float) and worker.is_integer() else worker).strip()[:200]
            yield row, worker, options.label_column
            continue
        labelled = [column for column in annotators if not _missing(frame.at[row, column])]
        if not labelled:
            raise Invalid(f"row {row + 1}: no annotator column has a label; remove the row or label it")
        for column in labelled:
            yield row, column, column


def _check_response_columns(frame: pd.DataFrame, definition: TaskDefinition, options: ImportOptions) -> None:
    """The file has every column the options name (the long format: a label and a worker column
    too), and the wide format names no seconds column."""
    wide = options.annotator_columns is not None
    _require_columns(
        frame,
        [
            options.text_column,
            *([] if wide else [options.label_column, options.worker_column]),
            options.id_column,
            options.seconds_column,
            options.target_column,
            *(
                [options.target_start_column, options.target_end_column]
                if definition.family is TaskFamily.target_dependent
                else []
            ),
        ],
        hint=""
        if wide or {options.label_column, options.worker_column} <= set(frame.columns)
        else _wide_hint(frame, definition, options),
    )
    if wide and options.seconds_column:
        raise Invalid("seconds_column: the wide format has one cell per annotator and no seconds; leave it out")


def _read_responses(
    frame: pd.DataFrame, definition: TaskDefinition, options: ImportOptions, annotators: list[str] | None
) -> dict[Any, dict[str, Any]]:
    """The file's examples by key (their id, else their text and target), each with its first
    row, text, extras and every worker's (label, seconds, row); :class:`Invalid` for a cell
    that is not a label or a number of seconds, an example given two texts, or a worker who
    labelled one example twice."""
    items: dict[Any, dict[str, Any]] = {}
    allowed = definition.effective_validation_labels
    rows: dict[int, tuple[str, str, dict, Any]] = {}
    for row, worker, label_column in _response_cells(frame, options, annotators):
        if row not in rows:
            text, cleaned = _text(frame.at[row, options.text_column], row, options.text_column)
            extras = _extras(definition, frame, row, text, options)
            if options.id_column:
                source_id = _source_id(frame.at[row, options.id_column], row, options.id_column)
                if source_id is None:
                    raise Invalid(f"{_where(row, options.id_column)}: the example id is empty")
                key: Any = ("id", source_id)
            else:
                key = _key(text, extras)
            rows = {row: (text, cleaned, extras, key)}
        text, cleaned, extras, key = rows[row]
        label = _labels(
            definition,
            frame.at[row, label_column],
            row,
            label_column,
            allowed=allowed,
            separator=options.label_separator,
            label_map=options.label_map,
        )
        seconds = None
        raw_seconds: Any = frame.at[row, options.seconds_column] if options.seconds_column else None
        if options.seconds_column and not _missing(raw_seconds):
            try:
                seconds = float(raw_seconds)
            except (TypeError, ValueError):
                seconds = math.nan
            if not 0 <= seconds <= 86_400:
                raise Invalid(f"{_where(row, options.seconds_column)}: seconds must be a number from 0 to 86400")
        # The first row of an example gives its text exactly; later rows of the same id may
        # differ from it only in what the text policy normalises (spacing, NFC, invisible marks).
        item = items.setdefault(key, {"row": row, "text": text, "cleaned": cleaned, "extras": extras, "labels": {}})
        if key[0] == "id" and (item["cleaned"] != cleaned or item["extras"] != extras):
            what = "text" if item["cleaned"] != cleaned else "target"
            raise Invalid(f"row {row + 1} gives example {key[1]} a different {what} than row {item['row'] + 1}")
        if worker in item["labels"]:
            raise Invalid(
                f"row {row + 1}: the same worker labelled this example already in row {item['labels'][worker][2] + 1}"
            )
        item["labels"][worker] = (label, seconds, row)
    return items


def _write_responses(
    session: Session,
    round_: Round,
    definition: TaskDefinition,
    items: dict[Any, dict[str, Any]],
    accounts: dict[str, int],
    origin: dict,
) -> tuple[list[Example], list[Validation]]:
    """Write one example per item, with as many labels needed as it has, and each worker's label
    as a counted validation."""
    examples = []
    for key, item in items.items():
        metadata = {
            **origin,
            "row": item["row"] + 1,
            **({"merged_ids": item["merged_ids"]} if item.get("merged_ids") else {}),
        }
        example = _example(
            round_, definition, item["text"], item["extras"], metadata, key[1] if key[0] == "id" else None
        )
        example.validation_count = example.validations_needed = len(item["labels"])
        examples.append(example)
    session.add_all(examples)
    session.flush()
    created = utcnow()
    validations = [
        Validation(
            example_id=example.id,
            validator_id=accounts[worker],
            label=label,
            seconds_taken=seconds,
            counted=True,
            created_at=created,
        )
        for example, item in zip(examples, items.values(), strict=True)
        for worker, (label, seconds, _row) in item["labels"].items()
    ]
    session.add_all(validations)
    session.flush()
    duplicates.record_texts(session, round_.task, examples)
    return examples, validations


def _responses(
    session: Session,
    round_: Round,
    definition: TaskDefinition,
    frame: pd.DataFrame,
    options: ImportOptions,
    origin: dict,
    secret: str,
) -> tuple[int, int, int, int]:
    wide = options.annotator_columns is not None
    _check_response_columns(frame, definition, options)
    annotators = _annotator_columns(frame, options) if wide else None
    items = _read_responses(frame, definition, options, annotators)
    items, repeats = _pool_repeated_texts(items)
    workers = sorted({worker for item in items.values() for worker in item["labels"]})
    if len(workers) > MAX_WORKERS:
        raise Invalid(f"the file has {len(workers)} workers; one import takes at most {MAX_WORKERS}")
    accounts = _workers(session, secret, workers)
    examples, validations = _write_responses(session, round_, definition, items, accounts, origin)
    return len(examples), len(validations), len(workers), repeats


def _set_aside(definition: TaskDefinition, session: Session, round_: Round) -> tuple[int, list[str]]:
    """Responses the build will set aside: an example with more than the task's validations
    keeps its best-agreeing validators' labels (rounds.build.aggregation.keep_top_ranked); said
    at import, so the researcher knows before the build."""
    n = definition.validations_per_example
    counts = session.scalars(
        select(Example.validation_count).where(Example.round_id == round_.id, Example.validation_count > n)
    ).all()
    if not counts:
        return 0, []
    extra = sum(count - n for count in counts)
    each = {count - n for count in counts}
    per = f"{next(iter(each))} per example" if len(each) == 1 else f"{min(each)} to {max(each)} per example"
    return extra, [
        f"{len(counts):,} example(s) have more responses than the task's {n} validations per example: the build "
        f"keeps each one's {n} best-agreeing validators' labels and sets the other {extra:,} response(s) aside "
        f"({per}); the build's report counts them"
    ]


def _pool_repeated_texts(items: dict[Any, dict[str, Any]]) -> tuple[dict[Any, dict[str, Any]], int]:
    """Examples of the file (by id) that have one text (:func:`_key`) become one example whose
    responses are theirs pooled: one text is never two examples, which the builder could put in
    two splits with different gold. A worker who labelled two of them counts once when the
    labels agree; labels that differ are refused (which one would be the worker's?).
    Returns the pooled items and how many examples were merged into another."""
    pooled: dict[Any, dict[str, Any]] = {}
    by_text: dict[tuple[str, str], Any] = {}
    repeats = 0
    for key, item in items.items():
        text_key = _key(item["text"], item["extras"])
        first = by_text.get(text_key)
        if first is None:
            by_text[text_key] = key
            pooled[key] = item
            continue
        into = pooled[first]
        for worker, response in item["labels"].items():
            if worker in into["labels"]:
                earlier = into["labels"][worker]
                if earlier[0] != response[0]:
                    raise Invalid(
                        f"rows {earlier[2] + 1} and {response[2] + 1} have the same text (ignoring case, spacing and "
                        "punctuation), which is one example, and the same worker gave it different labels; remove "
                        "one of the two rows"
                    )
                continue
            into["labels"][worker] = response
        into.setdefault("merged_ids", []).append(str(key[1]))
        repeats += 1
    return pooled, repeats


def import_round(
    session: Session,
    actor: User | None,
    task: Task,
    number: int,
    options: ImportOptions,
    *,
    secret: str,
    data_dir: Path,
    data_root: Path | None,
    any_path: bool,
    max_rows: int,
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
    max_cell_chars: int = DEFAULT_MAX_CELL_CHARS,
) -> ImportedRound:
    """Import ``options``' file as round ``number`` of ``task`` in the caller's transaction, and
    close the round so it can be built. Nothing is written unless every row is valid. The file is
    read within ``max_decoded_bytes`` (413 beyond) and ``max_cell_chars`` a cell (the text
    column's limit is :data:`MAX_TEXT_CHARS`)."""
    definition = definition_of(task)
    path = _locate(session, task, options, data_dir=data_dir, data_root=data_root, any_path=any_path)
    bounds = ReadBounds(
        max_rows=max_rows,
        max_decoded_bytes=max_decoded_bytes,
        max_cell_chars=max_cell_chars,
        column_chars={options.text_column: MAX_TEXT_CHARS},
        column_source="the longest text an import takes",
    )
    frame = _read(path, options, max_rows, bounds)
    if path.is_dir() and options.split_column is None and "split" in frame.columns:
        options = options.model_copy(update={"split_column": "split"})  # a DatasetDict's split names
    if options.id_column is None and "id" in frame.columns:
        options = options.model_copy(update={"id_column": "id"})  # the source's ids, for `source_id`
    sha256 = _digest(path)
    round_ = _empty_round(session, actor, task, number)
    origin = {
        "import": {
            "kind": options.kind,
            "name": options.dataset or path.name,
            "sha256": sha256,
            **({"source": clean_text(options.source, field="source", max_chars=200)} if options.source else {}),
        }
    }
    if options.kind == "labelled":
        count, validations, workers = _labelled(session, round_, definition, frame, options, origin), 0, 0
        repeats = 0
    else:
        count, validations, workers, repeats = _responses(session, round_, definition, frame, options, origin, secret)
    set_aside, notes = _set_aside(definition, session, round_) if options.kind == "responses" else (0, [])
    now = utcnow()
    round_.status = RoundStatus.closed
    round_.validating_at = round_.validating_at or now
    round_.closed_at = now
    audit.record(
        session,
        actor,
        "round.import",
        "round",
        round_.id,
        task=task.name,
        number=round_.number,
        kind=options.kind,
        sha256=sha256,
        examples=count,
        validations=validations,
        repeats_merged=repeats,
    )
    session.flush()
    return ImportedRound(
        task=task.name,
        round=round_.number,
        round_id=round_.id,
        kind=options.kind,
        examples=count,
        validations=validations,
        workers=workers,
        sha256=sha256,
        repeats_merged=repeats,
        responses_set_aside=set_aside,
        notes=tuple(notes),
    )
