"""Export a built round for REST clients and files: JSONL, CSV or Parquet, streamed in chunks
so a million rows never sit in memory at once.

Each row: the text, its split, gold and distributional labels, every counted response with a
pseudonymous worker id, the model's prediction, the prompt, the condition, language and the
writer's extra fields. Worker ids are pseudonymised with an HMAC of the deployment's secret,
so the same worker keeps one pseudonym across rounds without revealing their account.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from round_builder.builds import newest_build
from services.db.models import BuiltExample, Example, Prompt, Round, RoundBuild
from services.domain.tasks import definition_of
from services.errors import Invalid, NotFound

FORMATS = {"jsonl": "application/x-ndjson", "csv": "text/csv", "parquet": "application/vnd.apache.parquet"}
SPLITS = ("train", "dev", "test", "excluded", "all")
CHUNK_ROWS = 2000

FIELDS = [
    "example_id",
    "round",
    "split",
    "text",
    "gold_label",
    "gold_votes",
    "distributional_label",
    "model_based_label",
    "responses",
    "model_prediction",
    "model_id",
    "fooled",
    "target_label",
    "condition",
    "prompt_id",
    "prompt_text",
    "language",
    "writer",
    "extras",
    "flags",
]

_COLUMN_TYPES: list[tuple[str, pa.DataType]] = [
    ("example_id", pa.int64()),
    ("round", pa.int32()),
    ("split", pa.string()),
    ("text", pa.string()),
    ("gold_label", pa.list_(pa.string())),
    ("gold_votes", pa.int32()),
    ("distributional_label", pa.map_(pa.string(), pa.float64())),
    ("model_based_label", pa.list_(pa.string())),
    ("responses", pa.list_(pa.struct([("worker", pa.string()), ("label", pa.list_(pa.string()))]))),
    ("model_prediction", pa.list_(pa.string())),
    ("model_id", pa.string()),
    ("fooled", pa.bool_()),
    ("target_label", pa.list_(pa.string())),
    ("condition", pa.string()),
    ("prompt_id", pa.int64()),
    ("prompt_text", pa.string()),
    ("language", pa.string()),
    ("writer", pa.string()),
    ("extras", pa.string()),
    ("flags", pa.list_(pa.string())),
]
_SCHEMA = pa.schema(_COLUMN_TYPES)


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


def iter_rows(factory: sessionmaker[Session], build_id: int, split: str, secret: str) -> Iterator[list[dict[str, Any]]]:
    """Chunks of export rows, by example id (keyset pagination: one short transaction per
    chunk, so a long download never holds a database lock)."""
    after = 0
    while True:
        with factory() as session:
            build = session.get(RoundBuild, build_id)
            if build is None:
                raise NotFound(f"build {build_id} disappeared")
            round_ = session.get(Round, build.round_id)
            if round_ is None:
                raise NotFound(f"round {build.round_id} disappeared")
            language = definition_of(round_.task).language
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
            chunk = []
            for built, example, prompt_text in rows:
                chunk.append(
                    {
                        "example_id": example.id,
                        "round": round_.number,
                        "split": built.split,
                        "text": example.text,
                        "gold_label": built.gold_label,
                        "gold_votes": built.gold_votes,
                        "distributional_label": built.distributional_label,
                        "model_based_label": built.model_based_label,
                        "responses": [
                            {"worker": pseudonym(secret, worker), "label": label}
                            for worker, label in built.response_labels
                        ],
                        "model_prediction": example.model_prediction,
                        "model_id": example.model_id,
                        "fooled": example.fooled,
                        "target_label": example.target_label,
                        "condition": example.condition.value,
                        "prompt_id": example.prompt_id,
                        "prompt_text": prompt_text,
                        "language": language,
                        # Harvested examples have no writer.
                        "writer": pseudonym(secret, example.writer_id) if example.writer_id is not None else None,
                        "extras": example.extras,
                        "flags": built.flags,
                    }
                )
            after = rows[-1][0].example_id
        yield chunk


def stream(factory: sessionmaker[Session], build_id: int, split: str, file_format: str, secret: str) -> Iterator[bytes]:
    chunks = iter_rows(factory, build_id, split, secret)
    if file_format == "jsonl":
        for chunk in chunks:
            yield "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in chunk).encode("utf-8")
    elif file_format == "csv":
        yield from _csv(chunks)
    else:
        yield from _parquet(chunks)


def _csv(chunks: Iterator[list[dict[str, Any]]]) -> Iterator[bytes]:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELDS)
    writer.writeheader()
    for chunk in chunks:
        for row in chunk:
            # Nested values as JSON inside the cell: one row per example, still machine-readable.
            writer.writerow(
                {k: json.dumps(v, ensure_ascii=False) if isinstance(v, list | dict) else v for k, v in row.items()}
            )
        yield buffer.getvalue().encode("utf-8")
        buffer.seek(0)
        buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue().encode("utf-8")


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


def _parquet(chunks: Iterator[list[dict[str, Any]]]) -> Iterator[bytes]:
    sink = _Sink()
    # pyarrow wraps any object with a ``write`` method in a PythonFile; its stubs only name IO and NativeFile.
    writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), _SCHEMA, compression="zstd")
    for chunk in chunks:
        for row in chunk:
            row["extras"] = json.dumps(row["extras"], ensure_ascii=False)
            row["distributional_label"] = list((row["distributional_label"] or {}).items()) or None
        writer.write_table(pa.Table.from_pylist(chunk, schema=_SCHEMA))
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
