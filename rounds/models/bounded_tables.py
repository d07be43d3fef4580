"""Reading an uploaded table (CSV, TSV, JSONL, Parquet) within bounds, before anything else
sees it.

A file's size says little about what it decodes to: Parquet's dictionary encoding stores one
4 MB string once and points 250 rows at it, so a 904-byte upload decoded to a gigabyte in
``pandas.read_parquet``. :func:`read_table` therefore reads every format as a stream and
counts what it decodes, so the memory one upload can take is bounded by settings, not by what
the file claims:

* ``max_rows`` rows (``DYNALOOP_MAX_UPLOAD_ROWS``; more is a 422, as before);
* ``max_decoded_bytes`` bytes of decoded values in all (``DYNALOOP_MAX_UPLOAD_DECODED_BYTES``;
  strings counted in UTF-8, numbers by their width, list and mapping cells by their values):
  more is :class:`TooMuchData` (the API's 413);
* ``max_cell_chars`` characters in any one string value (``DYNALOOP_MAX_UPLOAD_CELL_CHARS``;
  ``column_chars`` sets a tighter one for named columns, e.g. the task's longest sentence for
  the text column): a longer cell is :class:`CellTooLong` (422, naming its row and column);
* no control character (NUL and the other C0/C1 controls but tab, newline and carriage return)
  in any string value: :class:`ControlCharacter` (422, naming its row, column and position).

How each format is read:

* **Parquet**: the footer first, before any column is decoded: its row count, the uncompressed
  size its column chunks declare, the number of values of each leaf column (list cells), and the
  encodings (``DELTA_BYTE_ARRAY`` shares prefixes between consecutive strings, so its decoded
  size cannot be bounded by the file: refused). Then batches of :data:`PARQUET_BATCH_ROWS` rows
  with every string column read as a dictionary (``read_dictionary``): a repeated value stays
  one value, and the lengths of the values each row points to are summed and checked before a
  single string is copied out. A batch within bounds is then expanded at once (pyarrow gives
  each batch a dictionary of every value read so far, so keeping them would grow with the
  square of the rows).
* **CSV / TSV**: the ``csv`` module over a UTF-8 text stream, one row at a time; Python's field
  size limit (131,072 characters) bounds a cell even before the cell limit does.
* **JSONL**: one line at a time, each at most :func:`max_line_bytes` long and checked for
  nesting depth (``services.structured_input``) before ``json.loads``.

Errors name the file, the row (counted from 1, the header not counted) and the column, never
the file's text.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from rounds.models.datasets import DataError
from services.structured_input import DEFAULT_MAX_INPUT_DEPTH, TooDeep, check_json_depth

__all__ = [
    "DEFAULT_MAX_CELL_CHARS",
    "DEFAULT_MAX_DECODED_BYTES",
    "PARQUET_BATCH_ROWS",
    "CellTooLong",
    "ControlCharacter",
    "ReadBounds",
    "TooMuchData",
    "max_line_bytes",
    "read_table",
]

DEFAULT_MAX_DECODED_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_CELL_CHARS = 20_000
# Rows decoded at a time from a Parquet file: small, so that one batch of cells at the cell
# limit stays a few megabytes.
PARQUET_BATCH_ROWS = 256
# A list or mapping cell (a multi-label list, a label distribution) holds at most this many values.
MAX_VALUES_PER_CELL = 1000
# A file has at most this many columns (a dataset needs a handful; a header of a million empty
# names would cost a list per column).
MAX_COLUMNS = 1000
# Each cell also counts the slot that holds it, so a million empty cells are not free.
CELL_SLOT_BYTES = 8
# Parquet encodings whose decoded size the file's declared sizes do not bound.
_UNBOUNDED_ENCODINGS = {"DELTA_BYTE_ARRAY"}
# Control characters refused in a cell: C0 and C1 controls and DEL, but tab, newline and CR
# (a quoted CSV cell may hold a line break).
# Python's csv module (3.11) stops at a NUL without saying where; the CSV reader hands it a
# noncharacter in its place, refused here and reported as the NUL it stands for.
_NUL_STAND_IN = "\uffff"
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\uffff]")
DECODED_SETTING = "DYNALOOP_MAX_UPLOAD_DECODED_BYTES"
CELL_SETTING = "DYNALOOP_MAX_UPLOAD_CELL_CHARS"


class TooMuchData(DataError):
    """The file decodes to more than the bound on decoded bytes (or holds too many values)."""


class CellTooLong(DataError):
    """A cell longer than its column's character limit."""


class ControlCharacter(DataError):
    """A cell with NUL or another control character."""


@dataclass(frozen=True)
class ReadBounds:
    """What one upload may decode to (see the module docstring)."""

    max_rows: int
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES
    max_cell_chars: int = DEFAULT_MAX_CELL_CHARS
    column_chars: Mapping[str, int] = field(default_factory=dict)
    #: Where the limits of ``column_chars`` come from, for the error message.
    column_source: str = "the task's constraints.max_chars"

    def cell_limit(self, column: str) -> tuple[int, str]:
        """The character limit of a cell of ``column`` and where it comes from."""
        if column in self.column_chars:
            return min(self.column_chars[column], self.max_cell_chars), self.column_source
        return self.max_cell_chars, CELL_SETTING


def max_line_bytes(bounds: ReadBounds) -> int:
    """The longest JSONL line read: eight cells at the cell limit, four UTF-8 bytes a character,
    plus 64 KiB for keys, numbers and labels."""
    return 8 * 4 * bounds.max_cell_chars + 64 * 1024


class _Budget:
    """Counts decoded bytes and rows against the bounds."""

    def __init__(self, bounds: ReadBounds, name: str) -> None:
        self.bounds = bounds
        self.name = name
        self.bytes = 0

    def add(self, amount: int) -> None:
        self.bytes += amount
        if self.bytes > self.bounds.max_decoded_bytes:
            raise TooMuchData(
                f"{self.name} decodes to more than {self.bounds.max_decoded_bytes:,} bytes, the most one upload "
                f"may decode to ({DECODED_SETTING}); split the file"
            )

    def columns(self, count: int) -> None:
        if count > MAX_COLUMNS:
            raise TooMuchData(f"{self.name} has {count:,} columns; a file may have at most {MAX_COLUMNS:,}")

    def rows(self, count: int) -> None:
        if count > self.bounds.max_rows:
            raise DataError(
                f"{self.name}: {count:,} rows is more than the {self.bounds.max_rows:,} an upload may have "
                "(DYNALOOP_MAX_UPLOAD_ROWS); split the file or put it under the data root (DYNALOOP_DATA_ROOT)"
            )


def _too_long(name: str, row: int, column: str, chars: int, bounds: ReadBounds) -> CellTooLong:
    limit, source = bounds.cell_limit(column)
    return CellTooLong(
        f"{name}: row {row}, column `{column}`: a cell of {chars:,} characters is longer than the "
        f"{limit:,} allowed ({source}); shorten it"
    )


def _check_value(value: Any, *, name: str, row: int, column: str, bounds: ReadBounds) -> int:
    """Check one decoded cell (a string, a number, or a list/mapping of them from JSONL) and
    return its decoded size in bytes."""
    if isinstance(value, str):
        limit, _ = bounds.cell_limit(column)
        if len(value) > limit:
            raise _too_long(name, row, column, len(value), bounds)
        found = _CONTROL.search(value)
        if found is not None:
            char = "\x00" if found.group() == _NUL_STAND_IN else found.group()
            raise ControlCharacter(
                f"{name}: row {row}, column `{column}`: the cell contains a control character "
                f"(U+{ord(char):04X}) at position {found.start()}; remove it (only tab and line breaks are allowed)"
            )
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, Mapping):
        if len(value) > MAX_VALUES_PER_CELL:
            raise TooMuchData(f"{name}: row {row}, column `{column}`: more than {MAX_VALUES_PER_CELL} values in a cell")
        return sum(
            _check_value(str(key), name=name, row=row, column=column, bounds=bounds)
            + _check_value(item, name=name, row=row, column=column, bounds=bounds)
            for key, item in value.items()
        )
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) > MAX_VALUES_PER_CELL:
            raise TooMuchData(f"{name}: row {row}, column `{column}`: more than {MAX_VALUES_PER_CELL} values in a cell")
        return sum(_check_value(item, name=name, row=row, column=column, bounds=bounds) for item in value)
    return 8  # a number, a boolean, a null


def read_table(source: bytes | Path, name: str, kind: str, bounds: ReadBounds) -> pd.DataFrame:
    """An uploaded file's bytes (or a file) of format ``kind`` (csv, tsv, jsonl, parquet) as a
    frame, read within ``bounds``; :class:`DataError` (or its :class:`TooMuchData`,
    :class:`CellTooLong`, :class:`ControlCharacter`) otherwise."""
    if kind == "parquet":
        return _read_parquet(source, name, bounds)
    if isinstance(source, Path):
        with source.open("rb") as handle:
            return _read_text_table(handle, name, kind, bounds)
    return _read_text_table(io.BytesIO(source), name, kind, bounds)


def _read_text_table(handle: IO[bytes], name: str, kind: str, bounds: ReadBounds) -> pd.DataFrame:
    try:
        if kind in ("csv", "tsv"):
            return _read_csv(handle, name, "\t" if kind == "tsv" else ",", bounds)
        if kind == "jsonl":
            return _read_jsonl(handle, name, bounds)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{name} could not be read as {kind}: it is not UTF-8 text (an invalid byte at offset {exc.start}); "
            "save it as UTF-8"
        ) from exc
    raise DataError(f"{name}: unknown format {kind!r}; use csv, tsv, jsonl or parquet")


def _read_csv(handle: IO[bytes], name: str, delimiter: str, bounds: ReadBounds) -> pd.DataFrame:
    text = io.TextIOWrapper(handle, encoding="utf-8-sig", errors="strict", newline="")
    lines = (line.replace("\x00", _NUL_STAND_IN) for line in text)
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    budget = _Budget(bounds, name)
    header: list[str] | None = None
    columns: list[list[str | None]] = []
    rows = 0
    try:
        for record in reader:
            if not record or record == [""]:
                continue  # a blank line, as pandas skips it
            if header is None:
                header = record
                budget.columns(len(header))
                seen: set[str] = set()
                for position, column in enumerate(header):
                    _check_value(column, name=name, row=0, column=f"header {position + 1}", bounds=bounds)
                    if column in seen:
                        raise DataError(f"{name}: the header names column `{column}` twice; rename one")
                    seen.add(column)
                columns = [[] for _ in header]
                continue
            rows += 1
            budget.rows(rows)
            if len(record) > len(header):
                raise DataError(
                    f"{name} could not be read as csv: row {rows} has {len(record)} fields, the header {len(header)}; "
                    "quote cells that contain the separator"
                )
            for position, column in enumerate(header):
                if position < len(record):
                    value = record[position]
                    budget.add(CELL_SLOT_BYTES + _check_value(value, name=name, row=rows, column=column, bounds=bounds))
                    columns[position].append(record[position])
                else:
                    columns[position].append(None)  # a short row: missing cells, as pandas reads them
    except csv.Error as exc:
        # The field size limit (131,072 characters) or a broken quote; the message quotes no cell.
        raise DataError(
            f"{name} could not be read as csv (row {rows + 1}: {exc}); check that it is a valid csv file"
        ) from exc
    if header is None:
        raise DataError(f"{name}: the file has no header row; the first line names the columns")
    return pd.DataFrame(
        {column: pd.Series(values, dtype=object) for column, values in zip(header, columns, strict=True)}
    )


def _lines(handle: IO[bytes], name: str, limit: int) -> Iterator[tuple[int, bytes]]:
    """The file's lines (numbered from 1), none read longer than ``limit`` bytes."""
    number = 0
    while True:
        line = handle.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) > limit and not line.endswith(b"\n"):
            raise TooMuchData(
                f"{name}: line {number} is longer than {limit:,} bytes, the most a JSONL row may have "
                f"(eight cells at {CELL_SETTING}); shorten it"
            )
        yield number, line


def _read_jsonl(handle: IO[bytes], name: str, bounds: ReadBounds) -> pd.DataFrame:
    budget = _Budget(bounds, name)
    records: list[dict[str, Any]] = []
    seen: set[str] = set()  # every key of every line: the frame's columns
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    for number, line in _lines(handle, name, max_line_bytes(bounds)):
        text = decoder.decode(line)
        if not text.strip():
            continue
        try:
            check_json_depth(text, DEFAULT_MAX_INPUT_DEPTH, what=f"{name}: line {number}")
            record = json.loads(text)
        except TooDeep as exc:
            raise DataError(exc.message) from exc
        except ValueError as exc:
            raise DataError(
                f"{name} could not be read as jsonl: line {number} is not valid JSON (column "
                f"{getattr(exc, 'colno', '?')}); write one JSON object per line"
            ) from exc
        if not isinstance(record, dict):
            raise DataError(
                f"{name} could not be read as jsonl: line {number} is not a JSON object; write one object per line"
            )
        budget.rows(len(records) + 1)
        row = len(records) + 1
        for column, value in record.items():
            budget.add(_check_value(column, name=name, row=row, column="(a key)", bounds=bounds))
            budget.add(CELL_SLOT_BYTES + _check_value(value, name=name, row=row, column=column, bounds=bounds))
        records.append(record)
        seen.update(record)
        budget.columns(len(seen))
    return pd.DataFrame.from_records(records) if records else pd.DataFrame()


# --------------------------------------------------------------------------- Parquet


def _sizes(array: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per element of an Arrow array: its decoded size in bytes, and the length in characters
    of its longest string value (0 for none), computed without expanding dictionaries."""
    import pyarrow as pa
    import pyarrow.compute as pc

    count = len(array)
    kind = array.type
    if pa.types.is_dictionary(kind):
        value_bytes, value_chars = _sizes(array.dictionary)
        indices = array.indices
        valid = pc.is_valid(indices).to_numpy(zero_copy_only=False)
        positions = pc.fill_null(indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        if len(value_bytes) == 0:
            return np.zeros(count, np.int64), np.zeros(count, np.int64)
        return np.where(valid, value_bytes[positions], 0), np.where(valid, value_chars[positions], 0)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        chars = pc.fill_null(pc.utf8_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        size = pc.fill_null(pc.binary_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        return size, chars
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        size = pc.fill_null(pc.binary_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        return size, size
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        # The offsets of this (perhaps sliced) array into its whole child array.
        offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        first, last = int(offsets[0]), int(offsets[-1])
        parents = np.repeat(np.arange(count, dtype=np.int64), np.diff(offsets))
        parts = [array.keys, array.items] if pa.types.is_map(kind) else [array.values]
        child_bytes = np.zeros(last - first, np.int64)
        child_chars = np.zeros(last - first, np.int64)
        for part in parts:
            part_bytes, part_chars = _sizes(part.slice(first, last - first))
            child_bytes += part_bytes
            child_chars = np.maximum(child_chars, part_chars)
        size = np.bincount(parents, weights=child_bytes, minlength=count).astype(np.int64)[:count]
        longest = np.zeros(count, np.int64)
        np.maximum.at(longest, parents, child_chars)
        return size, longest
    if pa.types.is_fixed_size_list(kind):
        width = kind.list_size
        child_bytes, child_chars = _sizes(array.values.slice(array.offset * width, count * width))
        return child_bytes.reshape(count, width).sum(axis=1), child_chars.reshape(count, width).max(axis=1, initial=0)
    if pa.types.is_struct(kind):
        size = np.zeros(count, np.int64)
        longest = np.zeros(count, np.int64)
        for child in array.flatten():
            child_bytes, child_chars = _sizes(child)
            size += child_bytes
            longest = np.maximum(longest, child_chars)
        return size, longest
    try:
        width = max(1, kind.bit_width // 8)
    except ValueError:  # not a fixed-width type: spread its buffers over its elements
        width = max(1, array.nbytes // max(1, count))
    return np.full(count, width, np.int64), np.zeros(count, np.int64)


def _parquet_footer(source: bytes | Path, name: str, bounds: ReadBounds) -> Any:
    """The Parquet file's footer, checked: rows, declared sizes, values and encodings."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.ParquetFile(io.BytesIO(source) if isinstance(source, bytes) else source).metadata
    except Exception as exc:  # pyarrow's errors for a broken footer
        raise DataError(f"{name} could not be read as parquet; check that it is a valid parquet file") from exc
    budget = _Budget(bounds, name)
    budget.rows(metadata.num_rows)
    budget.columns(metadata.num_columns)
    values = [0] * metadata.num_columns
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(metadata.num_columns):
            chunk = row_group.column(index)
            unbounded = _UNBOUNDED_ENCODINGS.intersection(chunk.encodings)
            if unbounded:
                raise DataError(
                    f"{name}: column `{chunk.path_in_schema}` uses the {sorted(unbounded)[0]} encoding, whose decoded "
                    "size the file does not bound; write the file with pandas' or pyarrow's default encodings"
                )
            # What the file says its pages hold once decompressed: dictionaries included.
            budget.add(max(0, chunk.total_uncompressed_size))
            values[index] += max(0, chunk.num_values)
    most = max(1, metadata.num_rows) * MAX_VALUES_PER_CELL
    for index, count in enumerate(values):
        if count > most:
            raise TooMuchData(
                f"{name}: column `{metadata.schema.column(index).path}` holds {count:,} values in "
                f"{metadata.num_rows:,} rows; a cell holds at most {MAX_VALUES_PER_CELL}"
            )
    return metadata


def _read_parquet(source: bytes | Path, name: str, bounds: ReadBounds) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    metadata = _parquet_footer(source, name, bounds)
    # String columns stored with a dictionary are read as one: the dictionary (bounded by the
    # footer's declared sizes) stays one copy, and what each row points at is measured before any
    # string is copied out. Plain pages hold every byte they decode to: they are read as they are.
    strings = [
        metadata.schema.column(index).path
        for index in range(metadata.num_columns)
        if metadata.schema.column(index).physical_type == "BYTE_ARRAY"
        and any(metadata.row_group(group).column(index).has_dictionary_page for group in range(metadata.num_row_groups))
    ]
    budget = _Budget(bounds, name)
    batches = []
    row = 0
    try:
        plain = pq.ParquetFile(io.BytesIO(source) if isinstance(source, bytes) else source)
        schema = plain.schema_arrow
        reader = pq.ParquetFile(io.BytesIO(source) if isinstance(source, bytes) else source, read_dictionary=strings)
        for batch in reader.iter_batches(batch_size=PARQUET_BATCH_ROWS, use_pandas_metadata=True):
            for column, array in zip(batch.schema.names, batch.columns, strict=True):
                size, longest = _sizes(array)
                limit, _ = bounds.cell_limit(column)
                over = np.flatnonzero(longest > limit)
                if len(over):
                    raise _too_long(name, row + int(over[0]) + 1, column, int(longest[over[0]]), bounds)
                budget.add(int(size.sum()) + CELL_SLOT_BYTES * len(size))
            # Within bounds: this batch's dictionaries may be expanded now (a batch's dictionary
            # may hold every value read so far, so no dictionary batch is kept).
            batches.append(pa.Table.from_batches([batch]).cast(schema))
            row += batch.num_rows
        table = pa.concat_tables(batches) if batches else schema.empty_table()
        del batches
    except DataError:
        raise
    except Exception as exc:  # pyarrow's errors for broken pages; their text may quote the file
        raise DataError(f"{name} could not be read as parquet; check that it is a valid parquet file") from exc
    frame = table.to_pandas()
    _check_controls(frame, name, bounds)
    return frame


def _check_controls(frame: pd.DataFrame, name: str, bounds: ReadBounds) -> None:
    """Refuse control characters in a decoded frame's text cells (the lengths were checked
    before decoding)."""
    for column in frame.columns:
        series = frame[column]
        if series.dtype != object and not isinstance(series.dtype, pd.StringDtype):
            continue
        for position, value in enumerate(series.tolist()):
            if isinstance(value, (str, list, tuple, dict, np.ndarray)):
                _check_value(value, name=name, row=position + 1, column=str(column), bounds=bounds)
