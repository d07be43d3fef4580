"""Export a built round for REST clients and files: JSONL, CSV or Parquet, streamed in chunks
so a million rows never sit in memory at once.

Each row: the text exactly as stored (an imported one as its file gave it) and, for an imported
example, its id in that file (``source_id``), its split, gold and distributional labels, every
counted response with a pseudonymous worker id and the annotation pass it came from (0 the first
set of labels, 1 a re-annotation), the model's prediction, the prompt, the condition, language and the
writer's extra fields. Every format is written through one declared pyarrow schema per task
(:func:`schema_for`; CSV's form of it: :func:`csv_schema`), so each loads with Hugging Face
``datasets`` to the same values (docs/round_builder.md, "Export"). Worker ids are pseudonymised
with an HMAC of the deployment's secret, so the same worker keeps one pseudonym across rounds
without revealing their account.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.db.models import BuiltExample, Example, Prompt, Round, RoundBuild, Validation
from services.domain.round_lifecycle import newest_build
from services.domain.tasks import definition_of
from services.errors import Invalid, NotFound
from services.taskdef import TaskDefinition, WriterFieldName

FORMATS = {"jsonl": "application/x-ndjson", "csv": "text/csv", "parquet": "application/vnd.apache.parquet"}
SPLITS = ("train", "dev", "test", "excluded", "all")
CHUNK_ROWS = 2000

_TARGET_SPAN = pa.struct([("start", pa.int64()), ("end", pa.int64()), ("text", pa.string())])
# One counted response: the worker's pseudonym, the label (set), and Validation.annotation_pass.
_RESPONSE = pa.struct([("worker", pa.string()), ("label", pa.list_(pa.string())), ("annotation_pass", pa.int32())])


def schema_for(definition: TaskDefinition) -> pa.Schema:
    """The one declared schema of a task's exports, shared by every format.

    Parquet carries it as is; JSONL rows are its values as JSON objects (a struct is an object
    with every field present, null where empty); CSV writes each nested column (lists and
    structs) and each nullable number or boolean as the JSON text of the same value
    (:func:`csv_schema`). ``distributional_label`` is
    a struct with one float per task label (the task's ``labels``, in order), and ``extras`` a
    struct with one field per writer field of the task (``target_span`` as start/end/text, the
    others text); a task without writer fields has no ``extras`` column (Parquet cannot store a
    struct without fields). Every type here has a Hugging Face ``datasets`` feature (no maps).
    """
    extras = [
        (spec.name.value, _TARGET_SPAN if spec.name is WriterFieldName.target_span else pa.string())
        for spec in definition.writer_fields
    ]
    # Never null: the example's id, round, split, text, condition, language, responses and flags.
    required = {"example_id", "round", "split", "text", "responses", "condition", "language", "flags"}
    columns: list[tuple[str, pa.DataType]] = [
        ("example_id", pa.int64()),
        ("source_id", pa.string()),
        ("round", pa.int32()),
        ("split", pa.string()),
        ("text", pa.string()),
        ("gold_label", pa.list_(pa.string())),
        ("gold_votes", pa.int32()),
        ("distributional_label", pa.struct([(label, pa.float64()) for label in definition.labels])),
        ("model_based_label", pa.list_(pa.string())),
        ("responses", pa.list_(_RESPONSE)),
        ("model_prediction", pa.list_(pa.string())),
        ("model_id", pa.string()),
        ("fooled", pa.bool_()),
        ("target_label", pa.list_(pa.string())),
        ("condition", pa.string()),
        ("prompt_id", pa.int64()),
        ("prompt_text", pa.string()),
        ("language", pa.string()),
        ("writer", pa.string()),
        *([("extras", pa.struct(extras))] if extras else []),
        ("flags", pa.list_(pa.string())),
    ]
    return pa.schema([pa.field(name, data_type, nullable=name not in required) for name, data_type in columns])


def json_in_csv(field: pa.Field) -> bool:
    """Whether CSV writes ``field`` as the JSON text of its value: lists and structs, and the
    nullable numbers and booleans (``gold_votes``, ``fooled``, ``prompt_id``), which a CSV reader
    that types columns (pandas, so ``datasets``' csv loader) cannot hold with an empty cell."""
    if pa.types.is_struct(field.type) or pa.types.is_list(field.type):
        return True
    return field.nullable and not pa.types.is_string(field.type)


def csv_schema(schema: pa.Schema) -> pa.Schema:
    """The CSV form of an export schema: the columns of :func:`json_in_csv` are strings holding
    the JSON text of the value (an empty cell for null); the others keep their type."""
    return pa.schema([pa.field(f.name, pa.string(), nullable=f.nullable) if json_in_csv(f) else f for f in schema])


def pseudonym(secret: str, user_id: int) -> str:
    return "w" + hmac.new(secret.encode(), f"worker:{user_id}".encode(), hashlib.sha256).hexdigest()[:12]


def current_build(session: Session, round_: Round) -> RoundBuild:
    """The build an export reads: the round's newest."""
    build = newest_build(session, round_)
    if build is None:
        raise NotFound(
            f"round {round_.number} has not been built yet; run `dynaloop round build` "
            f"or POST /api/v1/rounds/{round_.id}/build"
        )
    return build


def check_request(split: str, file_format: str) -> None:
    if split not in SPLITS:
        raise Invalid(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if file_format not in FORMATS:
        raise Invalid(f"unknown format {file_format!r}; use one of {', '.join(FORMATS)}")


def etag(build: RoundBuild, split: str, file_format: str) -> str:
    digest = hashlib.sha256(f"{build.id}:{build.created_at.isoformat()}:{split}:{file_format}".encode()).hexdigest()
    return f'"{digest[:32]}"'


def export_schema(factory: sessionmaker[Session], build_id: int) -> pa.Schema:
    """The declared schema (:func:`schema_for`) of a build's task."""
    with factory() as session:
        return schema_for(definition_of(_round_of(session, build_id).task))


def _round_of(session: Session, build_id: int) -> Round:
    build = session.get(RoundBuild, build_id)
    if build is None:
        raise NotFound(f"build {build_id} disappeared")
    round_ = session.get(Round, build.round_id)
    if round_ is None:
        raise NotFound(f"round {build.round_id} disappeared")
    return round_


def _declared(value: dict[str, Any] | None, fields: list[str]) -> dict[str, Any] | None:
    """A stored mapping as the declared struct: every declared field present (null when absent)."""
    if value is None:
        return None
    return {name: value.get(name) for name in fields}


def iter_rows(factory: sessionmaker[Session], build_id: int, split: str, secret: str) -> Iterator[list[dict[str, Any]]]:
    """Chunks of export rows, by example id (keyset pagination: one short transaction per
    chunk, so a long download never holds a database lock). ``distributional_label`` and
    ``extras`` come as the declared structs of :func:`schema_for`."""
    after = 0
    while True:
        with factory() as session:
            round_ = _round_of(session, build_id)
            definition = definition_of(round_.task)
            writer_fields = [spec.name.value for spec in definition.writer_fields]
            query = (
                select(BuiltExample, Example, Prompt.text)
                .join(Example, BuiltExample.example_id == Example.id)
                .outerjoin(Prompt, Example.prompt_id == Prompt.id)
                .where(BuiltExample.build_id == build_id, BuiltExample.example_id > after)
                .order_by(BuiltExample.example_id)
                .limit(CHUNK_ROWS)
            )
            if split != "all":
                query = query.where(BuiltExample.split == split)
            rows = session.execute(query).all()
            if not rows:
                return
            passes = _annotation_passes(session, build_id, after, rows[-1][0].example_id)
            chunk = []
            for built, example, prompt_text in rows:
                row: dict[str, Any] = {
                    "example_id": example.id,
                    "source_id": example.source_id,
                    "round": round_.number,
                    "split": built.split,
                    "text": example.text,
                    "gold_label": built.gold_label,
                    "gold_votes": built.gold_votes,
                    "distributional_label": _declared(built.distributional_label, list(definition.labels)),
                    "model_based_label": built.model_based_label,
                    "responses": [
                        {
                            "worker": pseudonym(secret, worker),
                            "label": label,
                            "annotation_pass": passes.get((example.id, worker)),
                        }
                        for worker, label in built.response_labels
                    ],
                    "model_prediction": example.model_prediction,
                    "model_id": example.model_id,
                    "fooled": example.fooled,
                    "target_label": example.target_label,
                    "condition": example.condition.value,
                    "prompt_id": example.prompt_id,
                    "prompt_text": prompt_text,
                    "language": definition.language,
                    # Harvested examples have no writer.
                    "writer": pseudonym(secret, example.writer_id) if example.writer_id is not None else None,
                }
                if writer_fields:
                    row["extras"] = _declared(example.extras or {}, writer_fields)
                row["flags"] = built.flags
                chunk.append(row)
            after = rows[-1][0].example_id
        yield chunk


def _annotation_passes(session: Session, build_id: int, after: int, last: int) -> dict[tuple[int, int], int]:
    """(example, validator) -> the pass of that validation, for the build's examples in
    (``after``, ``last``]. A validator labels an example once (uq_validations_example_validator),
    so the pair names one validation; its pass never changes once written."""
    return {
        (example_id, validator_id): annotation_pass
        for example_id, validator_id, annotation_pass in session.execute(
            select(Validation.example_id, Validation.validator_id, Validation.annotation_pass)
            .join(BuiltExample, BuiltExample.example_id == Validation.example_id)
            .where(
                BuiltExample.build_id == build_id,
                BuiltExample.example_id > after,
                BuiltExample.example_id <= last,
            )
        )
    }


def stream(factory: sessionmaker[Session], build_id: int, split: str, file_format: str, secret: str) -> Iterator[bytes]:
    """The export as bytes, one part per chunk of rows, every format through the task's declared
    schema (:func:`schema_for`): a row that does not fit it fails here, not in a reader."""
    schema = export_schema(factory, build_id)
    tables = (pa.Table.from_pylist(chunk, schema=schema) for chunk in iter_rows(factory, build_id, split, secret))
    yield from encode(schema, tables, file_format)


def encode(schema: pa.Schema, tables: Iterable[pa.Table], file_format: str) -> Iterator[bytes]:
    """Tables of ``schema`` as the bytes of one file in ``file_format``, a part per table."""
    if file_format == "jsonl":
        for table in tables:
            yield "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in table.to_pylist()).encode("utf-8")
    elif file_format == "csv":
        yield from _csv(schema, iter(tables))
    else:
        yield from _parquet(schema, iter(tables))


def _csv(schema: pa.Schema, tables: Iterator[pa.Table]) -> Iterator[bytes]:
    """CSV through pyarrow's writer (RFC 4180 quoting, an empty cell for null), the columns of
    :func:`json_in_csv` as JSON text: one row per example, still machine-readable."""
    target = csv_schema(schema)
    nested = {f.name for f in schema if json_in_csv(f)}
    sink = io.BytesIO()
    with pa_csv.CSVWriter(sink, target) as writer:
        for table in tables:
            columns = [
                pa.array(
                    [None if value is None else json.dumps(value, ensure_ascii=False) for value in column.to_pylist()],
                    pa.string(),
                )
                if name in nested
                else column
                for name, column in zip(table.column_names, table.columns, strict=True)
            ]
            writer.write_table(pa.Table.from_arrays(columns, schema=target))
            yield sink.getvalue()
            sink.seek(0)
            sink.truncate()
    if sink.tell():
        yield sink.getvalue()


class _Sink(io.RawIOBase):
    """A write-only file that hands its bytes over after each row group."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.parts.append(chunk)
        self.position += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self.position

    def drain(self) -> bytes:
        data = b"".join(self.parts)
        self.parts.clear()
        return data


def _parquet(schema: pa.Schema, tables: Iterator[pa.Table]) -> Iterator[bytes]:
    sink = _Sink()
    # pyarrow wraps any object with a ``write`` method in a PythonFile; its stubs only name IO and NativeFile.
    writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), schema, compression="zstd")
    for table in tables:
        writer.write_table(table)
        yield sink.drain()
    writer.close()
    yield sink.drain()


def write_file(
    factory: sessionmaker[Session], build_id: int, split: str, file_format: str, secret: str, path: Any
) -> int:
    """Write an export to ``path``; returns the bytes written."""
    total = 0
    with open(path, "wb") as handle:
        for part in stream(factory, build_id, split, file_format, secret):
            handle.write(part)
            total += len(part)
    return total
