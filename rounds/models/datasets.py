"""Labelled data for retraining and evaluation: built rounds' splits and external files.

A :class:`DataMix` (a YAML file, DynaSent Table 5a) declares where training data comes from —
every built round's train split with its distributional (soft) labels, external labelled files
(CSV, JSONL or Parquet) with a label mapping such as 5-star ratings binned to three classes —
each with a loss ``weight`` and an ``upsample`` factor, plus the dev set that early stopping
watches and the sets to evaluate on. Every source becomes a :class:`LabelledSet`: texts,
optional second segments (the target of a target-dependent task), optional varieties, and a
float matrix ``y`` with one column per model label (a probability distribution for single-label
tasks, per-label probabilities for multi-label ones).

>>> mix = DataMix.model_validate({"train": [{"round": 1, "upsample": 3}, {"dataset": "reviews"},
...     {"file": "sst.csv", "label_map": {"1": "negative", "5": "positive"}}]})
>>> [source.describe() for source in mix.train]
['round 1 train', 'reviews', 'sst.csv']

Where a file may come from is decided by :class:`DataFiles` before anything is read: a job
started through the API reads only the task's uploaded datasets (``dataset``, rounds.models.uploads)
and files under the configured data root (``file``, relative to ``DYNALOOP_DATA_ROOT``);
the `dynaloop` command, run by an operator with a shell, reads any path. Errors about a file's
rows name the row and the column, never the file's text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from services.db.models import BuiltExample, DatasetUpload, Example, Round, RoundBuild, Task
from services.domain.round_lifecycle import newest_build
from services.domain.tasks import definition_of
from services.errors import validation_problems
from services.structured_input import load_yaml
from services.taskdef import TaskDefinition, TaskFamily

FILE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
#: Names of uploaded datasets (rounds.models.uploads): letters, digits, dot, dash and underscore.
DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
#: The one answer for a ``file`` the API may not read, whatever the reason (outside the data
#: root, missing, a symlink out of it, not a plain file): it never tells whether a path exists.
NOT_READABLE = "not an uploaded dataset or a file under the data root"


def uploaded_dataset_field() -> Any:
    """The ``dataset`` field of a request that reads an uploaded dataset of the task by name
    (a training mix's source, a round import)."""
    return Field(
        None,
        min_length=1,
        max_length=100,
        pattern=DATASET_NAME_PATTERN,
        description="An uploaded dataset of the task, by name (GET /tasks/{task}/datasets/uploads).",
    )


class DataError(ValueError):
    """A data source that cannot be read as declared; the message names the source and the fix."""


class SourceSpec(BaseModel):
    """One source of labelled examples: a built round's split, an uploaded dataset or a file."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="Shown in tables; defaults to 'round N split' or the file name.")
    round: int | None = Field(None, ge=1, description="A round of the task, read from its newest build.")
    build_id: int | None = Field(None, description="A specific build instead of the round's newest.")
    split: Literal["train", "dev", "test"] = "train"
    dataset: str | None = uploaded_dataset_field()
    file: Path | None = Field(
        None,
        description="CSV, TSV, JSONL or Parquet with a text and a label column; through the API a path "
        "relative to the server's data root (DYNALOOP_DATA_ROOT).",
    )
    text_column: str = "text"
    label_column: str = "label"
    target_column: str | None = Field(None, description="Second segment (the target) for sentence-pair models.")
    target_start_column: str | None = Field(
        None,
        description="Column of the target's first character offset in the text (0-based); with "
        "target_end_column. The offsets say WHICH occurrence is the target when the text contains it twice.",
    )
    target_end_column: str | None = Field(
        None, description="Column of the offset one past the target's last character (Python slicing: text[start:end])."
    )
    variety_column: str | None = Field(None, description="Variety or language of each row (BESSTIE).")
    label_map: dict[str, str | list[str] | None] = Field(
        default_factory=dict,
        description="Raw label value -> task label(s); a value mapped to null is dropped. Raw values "
        "are compared as text, so 1 and '1' are the same key.",
    )
    label_separator: str | None = Field(None, description="Multi-label files: labels joined by this, e.g. ','.")
    weight: float = Field(1.0, gt=0, description="Multiplies each example's loss.")
    upsample: int = Field(1, ge=1, le=100, description="Each example appears this many times per epoch.")
    limit: int | None = Field(None, ge=1, description="Keep a seeded random sample of this many rows.")
    seed: int = 0
    #: Where the file of a ``file`` or ``dataset`` source is, once :class:`DataFiles` allowed it.
    _path: Path | None = PrivateAttr(None)

    @field_validator("file")
    @classmethod
    def _short_path(cls, value: Path | None) -> Path | None:
        if value is not None and (len(str(value)) > 1000 or "\x00" in str(value)):
            raise ValueError("a file path has at most 1000 characters and no NUL")
        return value

    @field_validator("label_map", mode="before")
    @classmethod
    def _text_keys(cls, value: Any) -> Any:
        # YAML reads `1: negative` with an integer key; raw values are compared as text.
        if isinstance(value, Mapping):
            return {_label_key(k): v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _one_origin(self) -> SourceSpec:
        if sum(origin is not None for origin in (self.round, self.dataset, self.file)) != 1:
            raise ValueError(
                "give exactly one of `round` (a built round), `dataset` (an uploaded dataset) or `file` "
                "(a file under the data root)"
            )
        if self.build_id is not None and self.round is None:
            raise ValueError("`build_id` only applies to a `round` source")
        if (self.target_start_column is None) != (self.target_end_column is None):
            raise ValueError("give both `target_start_column` and `target_end_column`, or neither")
        if self.target_start_column is not None and self.round is not None:
            raise ValueError("a `round` source takes its targets' offsets from the round; offset columns are for files")
        return self

    def describe(self) -> str:
        if self.name:
            return self.name
        if self.round is not None:
            return f"round {self.round} {self.split}"
        if self.dataset is not None:
            return self.dataset
        return Path(str(self.file)).name

    @property
    def path(self) -> Path:
        """The file to read; only a source that :meth:`DataFiles.resolve` allowed has one."""
        if self._path is None:
            raise DataError(f"{self.describe()}: the source's file was not checked against the data root")
        return self._path


class DataMix(BaseModel):
    """What to train on, what to stop on, what to evaluate on."""

    model_config = ConfigDict(extra="forbid")

    train: list[SourceSpec] = Field(min_length=1)
    dev: SourceSpec | None = Field(None, description="Early stopping and checkpoint choice watch macro-F1 here.")
    evaluate: list[SourceSpec] = Field(default_factory=list)

    def sources(self) -> list[tuple[str, SourceSpec]]:
        """Every source with its location in the mix (``train.0``, ``dev``, ``evaluate.1``)."""
        return [
            *((f"train.{i}", source) for i, source in enumerate(self.train)),
            *([("dev", self.dev)] if self.dev is not None else []),
            *((f"evaluate.{i}", source) for i, source in enumerate(self.evaluate)),
        ]

    @classmethod
    def load(cls, path: Path | str) -> DataMix:
        path = Path(path)
        try:
            # The bounded loader of task YAML: no aliases, no duplicate keys, bounded depth.
            raw = load_yaml(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise DataError(f"cannot read the data mix {path}: {exc}") from exc
        try:
            mix = cls.model_validate(raw or {})
        except ValidationError as exc:
            problems = "; ".join(validation_problems(exc.errors(), wording={}))  # pydantic's own messages
            raise DataError(f"{path} is not a valid data mix: {problems}") from exc
        # Relative file paths are relative to the mix file.
        for source in [*mix.train, *([mix.dev] if mix.dev else []), *mix.evaluate]:
            if source.file is not None and not source.file.is_absolute():
                source.file = (path.parent / source.file).resolve()
        return mix


@dataclass
class LabelledSet:
    name: str
    labels: list[str]
    multi_label: bool
    texts: list[str]
    y: np.ndarray  # (n, len(labels)) float32
    targets: list[str] | None = None
    # (start, end) of each target in its text (text[start:end] == target), where the source gave
    # offsets (a file's offset columns, a round's marked spans); None where it gave only the text.
    target_spans: list[tuple[int, int]] | None = None
    varieties: list[str | None] | None = None
    # Each row's id as its source gives it: an example's id (int) for a round, a file's `id` column
    # (ints stay ints, so predictions sort numerically), else the row's position.
    ids: list[str | int] = field(default_factory=list)
    weight: float = 1.0
    upsample: int = 1
    origin: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.texts)
        if self.y.shape != (n, len(self.labels)):
            raise ValueError(f"{self.name}: y has shape {self.y.shape}, expected {(n, len(self.labels))}")
        if self.targets is not None and len(self.targets) != n:
            raise ValueError(f"{self.name}: {len(self.targets)} targets for {n} texts")
        if self.target_spans is not None and (self.targets is None or len(self.target_spans) != n):
            raise ValueError(f"{self.name}: target spans need one target per text")
        if not self.ids:
            self.ids = list(range(n))

    def __len__(self) -> int:
        return len(self.texts)

    def hard(self) -> np.ndarray:
        """Gold labels: argmax indices (single-label) or a 0/1 matrix at 0.5 (multi-label)."""
        if self.multi_label:
            return (self.y >= 0.5).astype(int)
        return self.y.argmax(axis=1)

    def sha256(self) -> str:
        """Content hash (texts, targets and labels) recorded in a model's metadata."""
        digest = hashlib.sha256()
        digest.update(json.dumps(self.labels).encode())
        for i, text in enumerate(self.texts):
            digest.update(text.encode("utf-8"))
            digest.update(b"\x1f")
            if self.targets is not None:
                digest.update(self.targets[i].encode("utf-8"))
            if self.target_spans is not None:
                digest.update(b"\x1f%d:%d" % self.target_spans[i])
            digest.update(b"\x1e")
        digest.update(np.ascontiguousarray(self.y.round(6), dtype=np.float32).tobytes())
        return digest.hexdigest()

    def subset(self, rows: Sequence[int], name: str | None = None) -> LabelledSet:
        rows = list(rows)
        return LabelledSet(
            name=name or self.name,
            labels=self.labels,
            multi_label=self.multi_label,
            texts=[self.texts[i] for i in rows],
            y=self.y[rows],
            targets=None if self.targets is None else [self.targets[i] for i in rows],
            target_spans=None if self.target_spans is None else [self.target_spans[i] for i in rows],
            varieties=None if self.varieties is None else [self.varieties[i] for i in rows],
            ids=[self.ids[i] for i in rows],
            weight=self.weight,
            upsample=self.upsample,
            origin=dict(self.origin),
        )

    def summary(self) -> dict[str, Any]:
        counts = self.hard().sum(axis=0) if self.multi_label else np.bincount(self.hard(), minlength=len(self.labels))
        return {
            "name": self.name,
            "rows": len(self),
            "weight": self.weight,
            "upsample": self.upsample,
            "label_counts": {label: int(c) for label, c in zip(self.labels, counts, strict=True)},
            "sha256": self.sha256(),
            **self.origin,
        }


def model_labels(definition: TaskDefinition) -> list[str]:
    """The classifier's outputs for a task: its labels (not the validators' extra options)."""
    return list(definition.labels)


def input_format(definition: TaskDefinition) -> Literal["text", "text_pair"]:
    return "text_pair" if definition.family is TaskFamily.target_dependent else "text"


# ---------------------------------------------------------------------------- files


def upload_path(uploads_dir: Path, task_name: str, sha256: str, file_format: str) -> Path:
    """Where an uploaded dataset's bytes are kept: ``DATA_DIR/uploads/TASK/SHA256.FORMAT``."""
    return Path(uploads_dir) / task_name / f"{sha256}.{file_format}"


def under_root(root: Path | None, relative: Path | str) -> Path | None:
    """``relative`` (a path relative to ``root``) resolved, ``..`` and symlinks followed, when it
    exists and still lies under ``root``; None otherwise, whatever the reason (no root, missing,
    outside), so a caller's refusal cannot tell them apart."""
    if root is None:
        return None
    try:
        resolved_root = root.resolve(strict=True)
        path = (resolved_root / relative).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a symlink loop, a NUL
        return None
    return path if path.is_relative_to(resolved_root) else None


@dataclass(frozen=True)
class DataFiles:
    """Which files a data mix may read, decided before any is opened.

    ``dataset`` sources are the task's uploads, kept under ``uploads``. ``file`` sources are, with
    ``any_path`` (the `dynaloop` command, run by an operator with a shell), any path; without it
    (everything the API starts), a path relative to ``root`` (``DYNALOOP_DATA_ROOT``) that still
    lies under it once resolved (``..`` and symlinks followed), and nothing when ``root`` is None.
    """

    uploads: Path
    root: Path | None = None
    any_path: bool = False

    @classmethod
    def of(cls, data_dir: Path, data_root: Path | None = None, *, any_path: bool = False) -> DataFiles:
        return cls(uploads=Path(data_dir) / "uploads", root=data_root, any_path=any_path)

    def resolve(
        self, mix: DataMix | None, *, session: Session | None = None, task: Task | None = None, where: str = "mix"
    ) -> None:
        """Give every file and dataset source of ``mix`` its :attr:`SourceSpec.path`, or raise
        :class:`DataError` naming the first source that may not be read (``where.train.0.file``).
        Dataset sources need the task (and a session to look its uploads up)."""
        for location, source in mix.sources() if mix is not None else []:
            if source.dataset is not None:
                if session is None or task is None:
                    raise DataError(f"{where}.{location}.dataset: an uploaded dataset needs the task and the database")
                source._path = self._upload(session, task, source.dataset, f"{where}.{location}.dataset")
            elif source.file is not None:
                source._path = self._file(source.file, f"{where}.{location}.file", task)

    def _upload(self, session: Session, task: Task, name: str, where: str) -> Path:
        upload = session.scalar(
            select(DatasetUpload).where(DatasetUpload.task_id == task.id, DatasetUpload.name == name)
        )
        if upload is None:
            raise DataError(
                f"{where}: task {task.name!r} has no uploaded dataset {name!r}; "
                f"GET /api/v1/tasks/{task.name}/datasets/uploads lists them"
            )
        path = upload_path(self.uploads, task.name, upload.sha256, upload.format)
        if not path.is_file():
            raise DataError(f"{where}: the file of uploaded dataset {name!r} is missing on the server; upload it again")
        return path

    def _file(self, file: Path, where: str, task: Task | None) -> Path:
        if self.any_path:
            return file.expanduser().resolve()
        hint = (
            f"upload it (POST /api/v1/tasks/{task.name if task else '{task}'}/datasets/uploads) and name it "
            "with `dataset`"
            if self.root is None
            else "give a path relative to the data root, or upload the file and name it with `dataset`"
        )
        path = under_root(self.root, file)
        if path is None or not path.is_file() or path.suffix.lower() not in FILE_FORMATS:
            raise DataError(f"{where}: {NOT_READABLE}; {hint}")
        return path


def _position(error: Exception) -> str:
    """Where a parser stopped ("line 7"), never what it read there."""
    found = re.search(r"\b(line|row|column|position)\s+(\d+)", str(error))
    return f" (near {found.group(1)} {found.group(2)})" if found else ""


def read_table(path: Path, name: str | None = None) -> pd.DataFrame:
    """A CSV, TSV, JSONL or Parquet file as a frame (labels read as text where the file has text).
    Errors call it ``name`` (default: the file's name) and give a position, never its contents."""
    name = name or path.name
    kind = FILE_FORMATS.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"{name}: unknown file type {path.suffix!r}; use one of {sorted(FILE_FORMATS)}")
    if not path.is_file():
        raise DataError(f"{name} does not exist")
    return parse_table(path, name, kind)


def parse_table(source: Any, name: str, kind: str) -> pd.DataFrame:
    """A file (a path or a binary stream) of format ``kind`` (csv, tsv, jsonl, parquet) as a frame."""
    try:
        if kind in ("csv", "tsv"):
            return pd.read_csv(source, sep="\t" if kind == "tsv" else ",", dtype=str, keep_default_na=False)
        if kind == "jsonl":
            frame = pd.read_json(source, lines=True, dtype=False)
            if not isinstance(frame, pd.DataFrame):
                raise ValueError("not one JSON object per line")
            return frame
        return pd.read_parquet(source)
    except Exception as exc:  # pandas raises many types for a broken file; their text may quote it
        raise DataError(
            f"{name} could not be read as {kind}{_position(exc)}; check that it is a valid {kind} file"
        ) from exc


def _label_key(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def _offset(value: Any) -> int | None:
    """An offset as an int: ints, floats that are whole numbers (a Parquet or JSONL column with a
    gap reads as float), and the text of either (CSV and TSV files are read as text: "12",
    "12.0"); anything else (other text, booleans, NaN, fractions) is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip()) if value.strip() else None
        except ValueError:
            return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and np.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def target_from_offsets(
    text: str, start: Any, end: Any, target: str | None = None, *, where: str
) -> tuple[str, int, int]:
    """The target ``text[start:end]`` and its offsets, checked: whole-number offsets with
    ``0 <= start < end <= len(text)``, not only white space, and, where the row also gives the
    target's text, exactly that text. Offsets count characters (Python string indices, as the
    API's ``target_span``), not bytes. ``where`` names the row in the error (e.g. ``"mix.csv:
    row 3"``); the message never quotes the row's text.

    Used by the mix loader for files with offset columns; an importer of labelled datasets can
    call it for each row the same way."""
    first, last = _offset(start), _offset(end)
    if first is None or last is None:
        raise DataError(
            f"{where}: the target's offsets must be whole numbers (start and end); got a missing or other value"
        )
    if not 0 <= first < last <= len(text):
        raise DataError(
            f"{where}: target offsets [{first}, {last}] are outside the text (0..{len(text)}) or empty; "
            "give 0-based character offsets with start < end (end one past the target's last character)"
        )
    found = text[first:last]
    if not found.strip():
        raise DataError(f"{where}: target offsets [{first}, {last}] cover only white space")
    if target is not None and found != target:
        raise DataError(
            f"{where}: the text at offsets [{first}, {last}] ({last - first} characters) is not the row's target "
            f"({len(target)} characters); the offsets must point at the target's own characters"
            + (f" (it occurs {text.count(target)} time(s) in the text)" if target else "")
        )
    return found, first, last


def _check_columns(frame: pd.DataFrame, spec: SourceSpec, name: str) -> None:
    """Every column the source names is one of the frame's."""
    for option, column in [
        ("text_column", spec.text_column),
        ("label_column", spec.label_column),
        ("target_column", spec.target_column),
        ("target_start_column", spec.target_start_column),
        ("target_end_column", spec.target_end_column),
        ("variety_column", spec.variety_column),
    ]:
        if column is not None and column not in frame.columns:
            raise DataError(
                f"{name}: there is no column `{column}` ({len(frame.columns)} columns); set {option} to "
                "the name of the file's column"
            )


def _label_vector(
    raw: Any,
    labels: Sequence[str],
    index: dict[str, int],
    mapping: dict[str, Any],
    spec: SourceSpec,
    name: str,
    row: int,
) -> tuple[np.ndarray, bool]:
    """One row's label value as a vector over the task's ``labels`` (``index``: each label's
    position), mapped with ``mapping``: a distribution ``{label: p}``, a list of labels, or one
    value (cut at ``spec.label_separator`` where it is set); and whether every label in it is
    one of the task's."""
    vector = np.zeros(len(labels), dtype=np.float32)
    known = True
    if isinstance(raw, Mapping):  # a distribution {label: p}
        for label, p in raw.items():
            if label not in index:
                known = False
                continue
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not np.isfinite(p) or p < 0:
                raise DataError(
                    f"{name}: row {row}, column `{spec.label_column}`: a label distribution's values must "
                    "be numbers of at least 0"
                )
            vector[index[label]] = float(p)
    else:
        values = (
            raw
            if isinstance(raw, list)
            else ([v for v in str(raw).split(spec.label_separator) if v.strip()] if spec.label_separator else [raw])
        )
        for value in values:
            key = _label_key(value)
            mapped = mapping.get(key, key) if mapping else key
            if mapped is None:
                continue
            for label in [mapped] if isinstance(mapped, str) else mapped:
                if label not in index:
                    known = False
                    continue
                vector[index[label]] = 1.0
    return vector, known


def labelled_from_frame(
    frame: pd.DataFrame,
    *,
    labels: Sequence[str],
    multi_label: bool,
    spec: SourceSpec,
    name: str | None = None,
    strict: bool = False,
) -> LabelledSet:
    """Map a frame's label column onto ``labels`` with ``spec.label_map``.

    A value that is neither a label nor in the map is reported by its row (counted from 1, the
    header not counted) and column, never by the value itself: the file's text stays out of
    every message, job log and response. ``strict`` (an upload arriving) also refuses a row
    without a text or a label instead of dropping it."""
    name = name or spec.describe()
    _check_columns(frame, spec, name)
    if spec.limit is not None and len(frame) > spec.limit:
        frame = frame.sample(n=spec.limit, random_state=spec.seed)
    index = {label: i for i, label in enumerate(labels)}
    mapping = {_label_key(k): v for k, v in spec.label_map.items()}
    texts: list[str] = []
    targets: list[str] = []
    spans: list[tuple[int, int]] = []
    has_targets = spec.target_column is not None or spec.target_start_column is not None
    varieties: list[str | None] = []
    ids: list[str | int] = []
    rows: list[np.ndarray] = []
    unknown: list[int] = []  # row numbers
    dropped = 0
    for position, (row_index, record) in enumerate(zip(frame.index, frame.to_dict("records"), strict=True)):
        row = int(row_index) + 1 if isinstance(row_index, (int, np.integer)) else position + 1
        text = record[spec.text_column]
        if not isinstance(text, str) or not text.strip():
            if strict:
                raise DataError(f"{name}: row {row}, column `{spec.text_column}`: no text; every row needs one")
            dropped += 1
            continue
        raw = record[spec.label_column]
        vector, known = _label_vector(raw, labels, index, mapping, spec, name, row)
        if not known:
            unknown.append(row)
        total = vector.sum()
        if total == 0 and not multi_label:  # multi-label: no label at all is a valid answer
            if strict and known:
                raise DataError(f"{name}: row {row}, column `{spec.label_column}`: no label; every row needs one")
            dropped += 1
            continue
        if not multi_label:
            vector = vector / total
        if spec.target_start_column is not None and spec.target_end_column is not None:
            given = None if spec.target_column is None else str(record[spec.target_column])
            target, start, end = target_from_offsets(
                text,
                record[spec.target_start_column],
                record[spec.target_end_column],
                given,
                where=f"{name}: row {row}, columns `{spec.target_start_column}`/`{spec.target_end_column}`",
            )
            targets.append(target)
            spans.append((start, end))
        elif spec.target_column is not None:
            targets.append(str(record[spec.target_column]))
        texts.append(text)
        if spec.variety_column is not None:
            value = record[spec.variety_column]
            varieties.append(None if value is None or value == "" else str(value))
        ids.append(_row_id(record.get("id", position)))
        rows.append(vector)
    if unknown:
        more = f" (and {len(unknown) - 1} more row(s))" if len(unknown) > 1 else ""
        raise DataError(
            f"{name}: row {min(unknown)}, column `{spec.label_column}`: not one of the task's labels "
            f"{list(labels)} nor in label_map{more}; map such values in label_map (to null to drop them)"
        )
    if not texts:
        raise DataError(f"{name}: no usable rows (every row had an empty text or a dropped label)")
    y = np.stack(rows) if rows else np.zeros((0, len(labels)), dtype=np.float32)
    return LabelledSet(
        name=name,
        labels=list(labels),
        multi_label=multi_label,
        texts=texts,
        y=y,
        targets=targets if has_targets else None,
        target_spans=spans if spec.target_start_column is not None else None,
        varieties=varieties if spec.variety_column is not None else None,
        ids=ids,
        weight=spec.weight,
        upsample=spec.upsample,
        origin={
            **({"dataset": spec.dataset} if spec.dataset else {"file": str(spec.file) if spec.file else None}),
            "dropped_rows": dropped,
        },
    )


def _row_id(value: Any) -> str | int:
    """A file row's id: an integer stays one (not a bool, not a float such as 3.0), anything else is text."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return str(value)


# ---------------------------------------------------------------------------- rounds


def _build_for(session: Session, task: Task, spec: SourceSpec) -> tuple[Round, RoundBuild]:
    round_ = session.scalar(select(Round).where(Round.task_id == task.id, Round.number == spec.round))
    if round_ is None:
        raise DataError(f"task {task.name!r} has no round {spec.round}")
    if spec.build_id is None:
        build = newest_build(session, round_)
        if build is None:
            raise DataError(
                f"round {spec.round} of {task.name!r} has not been built; "
                f"run `dynaloop round build --task {task.name} --round {spec.round}` first"
            )
        return round_, build
    build = session.get(RoundBuild, spec.build_id)
    if build is None or build.round_id != round_.id:
        raise DataError(f"build {spec.build_id} is not a build of round {spec.round} of {task.name!r}")
    return round_, build


def labelled_from_round(session: Session, task: Task, spec: SourceSpec) -> LabelledSet:
    """A built round's split: train rows carry their distributional label (soft targets,
    DynaSent §3.4), dev and test rows their gold label. Rows without one are skipped."""
    definition = definition_of(task)
    labels = model_labels(definition)
    index = {label: i for i, label in enumerate(labels)}
    multi = definition.is_multi_label
    round_, build = _build_for(session, task, spec)
    rows = session.execute(
        select(
            BuiltExample.example_id,
            BuiltExample.gold_label,
            BuiltExample.distributional_label,
            Example.text,
            Example.extras,
        )
        .join(Example, BuiltExample.example_id == Example.id)
        .where(BuiltExample.build_id == build.id, BuiltExample.split == spec.split)
        .order_by(BuiltExample.example_id)
    ).all()
    texts: list[str] = []
    targets: list[str] = []
    spans: list[tuple[int, int] | None] = []
    varieties: list[str | None] = []
    ids: list[str | int] = []
    vectors: list[np.ndarray] = []
    skipped = 0
    for example_id, gold, distribution, text, extras in rows:
        vector = np.zeros(len(labels), dtype=np.float32)
        if spec.split == "train" and distribution:
            for label, p in distribution.items():
                if label in index and p:
                    vector[index[label]] = float(p)
        elif gold:
            for label in gold:
                if label in index:
                    vector[index[label]] = 1.0
        if vector.sum() == 0 and not (multi and gold is not None and spec.split != "train"):
            skipped += 1
            continue
        if not multi:
            vector /= vector.sum()
        extras = extras or {}
        if definition.family is TaskFamily.target_dependent:
            span = extras.get("target_span") or {}
            target = span.get("text") if isinstance(span, dict) else None
            if not target:
                skipped += 1
                continue
            targets.append(target)
            start, end = span.get("start"), span.get("end")
            spans.append((start, end) if isinstance(start, int) and isinstance(end, int) else None)
        texts.append(text)
        varieties.append(extras.get("variety"))
        ids.append(int(example_id))
        vectors.append(vector)
    if spec.limit is not None and len(texts) > spec.limit:
        keep = sorted(np.random.default_rng(spec.seed).choice(len(texts), spec.limit, replace=False).tolist())
    else:
        keep = list(range(len(texts)))
    if not keep:
        raise DataError(f"{spec.describe()} of {task.name!r} (build {build.id}) has no labelled examples")
    y = np.stack([vectors[i] for i in keep])
    # A round's spans where every kept example has one (examples written before spans were stored have none).
    full_spans = [span for span in (spans[i] for i in keep) if span is not None] if spans else []
    has_variety = any(v is not None for v in varieties)
    return LabelledSet(
        name=spec.describe(),
        labels=labels,
        multi_label=multi,
        texts=[texts[i] for i in keep],
        y=y,
        targets=[targets[i] for i in keep] if definition.family is TaskFamily.target_dependent else None,
        target_spans=full_spans if len(full_spans) == len(keep) and targets else None,
        varieties=[varieties[i] for i in keep] if has_variety else None,
        ids=[ids[i] for i in keep],
        weight=spec.weight,
        upsample=spec.upsample,
        origin={"round": round_.number, "build_id": build.id, "split": spec.split, "skipped_rows": skipped},
    )


def load_source(
    spec: SourceSpec,
    *,
    labels: Sequence[str],
    multi_label: bool,
    session: Session | None = None,
    task: Task | None = None,
) -> LabelledSet:
    if spec.round is not None:
        if session is None or task is None:
            raise DataError(f"{spec.describe()}: a round source needs the database and a task")
        return labelled_from_round(session, task, spec)
    return labelled_from_frame(
        read_table(spec.path, spec.describe()), labels=labels, multi_label=multi_label, spec=spec
    )


def expand(sets: Sequence[LabelledSet], *, seed: int = 0) -> tuple[list[int], list[int]]:
    """The training stream of one epoch as (set index, row) pairs, every row repeated its set's
    ``upsample`` times, shuffled with ``seed``: DynaSent Table 5a's "3×" and "5×" sources."""
    pairs = [
        (s, row) for s, labelled in enumerate(sets) for _ in range(labelled.upsample) for row in range(len(labelled))
    ]
    order = np.random.default_rng(seed).permutation(len(pairs))
    return [pairs[i][0] for i in order], [pairs[i][1] for i in order]
