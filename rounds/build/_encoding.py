"""Integer encoding of the long response table, shared by aggregation, agreement and human.

Every statistic in the round builder starts the same way: check the columns, check that each
label is one the task allows, and turn example ids, worker ids and labels into dense integer
codes so that counting is a ``numpy.bincount`` rather than a Python loop. A round of 200,000
examples x 5 responses encodes in well under a second.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rounds.build.table import check_frame


@dataclass(frozen=True)
class EncodedResponses:
    """A single-label response table as integer codes (one entry per response row)."""

    example_ids: pd.Index  # unique example ids; ``example`` indexes into it
    example: np.ndarray  # int64 code of each row's example
    worker_ids: pd.Index
    worker: np.ndarray
    labels: tuple[str, ...]  # the allowed labels; ``label`` indexes into it
    label: np.ndarray

    @property
    def n_examples(self) -> int:
        return len(self.example_ids)

    @property
    def n_labels(self) -> int:
        return len(self.labels)

    def counts(self) -> np.ndarray:
        """Examples x labels matrix of vote counts."""
        return bincount_2d(self.example, self.label, self.n_examples, self.n_labels)


def bincount_2d(rows: np.ndarray, cols: np.ndarray, n_rows: int, n_cols: int) -> np.ndarray:
    """Counts of (row, col) pairs as an ``n_rows x n_cols`` int64 matrix."""
    flat = rows.astype(np.int64) * n_cols + cols
    return np.bincount(flat, minlength=n_rows * n_cols).reshape(n_rows, n_cols)


def check_labels_argument(labels: Sequence[str]) -> tuple[str, ...]:
    if isinstance(labels, str):
        raise ValueError(f"labels must be a list of labels, not the single string {labels!r}")
    result = tuple(labels)
    if not result:
        raise ValueError("labels is empty; pass the task's labels, e.g. task.effective_validation_labels")
    duplicates = sorted({label for label in result if result.count(label) > 1})
    if duplicates:
        raise ValueError(f"labels {duplicates} appear more than once; list each label once")
    return result


def factorize_ids(values: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """Dense codes for ids, sorted when the ids are mutually comparable."""
    try:
        codes, uniques = pd.factorize(values, sort=True)
    except TypeError:  # mixed id types (e.g. int and str) cannot be sorted
        codes, uniques = pd.factorize(values, sort=False)
    if (codes < 0).any():
        raise ValueError(f"{values.name} is missing (None/NaN) in {int((codes < 0).sum())} responses")
    return codes.astype(np.int64), pd.Index(uniques, name=values.name)


def _is_missing(value: object) -> bool:
    return value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and np.isnan(value))


def label_codes(values: pd.Series | Sequence[object], labels: Sequence[str], *, what: str = "label") -> np.ndarray:
    """Codes of ``values`` in ``labels``; a clear ValueError names any label outside the set."""
    known = pd.Index(list(labels), dtype=object, tupleize_cols=False)
    # Factorize first (a hash pass over the column), then look up the few distinct values.
    value_codes, distinct = pd.factorize(
        values if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
    )
    lookup = known.get_indexer(pd.Index(np.asarray(distinct, dtype=object), dtype=object, tupleize_cols=False))
    # A missing value has code -1, which picks the appended -1.
    codes = np.append(lookup, -1).astype(np.int64)[value_codes]
    bad = codes < 0
    if bad.any():
        offending = list(distinct[lookup < 0]) + ([None] if (value_codes < 0).any() else [])
        unknown = [v for v in offending if not _is_missing(v)]
        if unknown:
            shown = ", ".join(repr(v) for v in unknown[:5])
            raise ValueError(
                f"{what} {shown} is not one of the task's labels {list(labels)}; "
                "fix the response or the task's label list"
            )
        raise ValueError(f"{int(bad.sum())} responses have no {what} (None/NaN); remove them first")
    return codes


def encode_single(responses: pd.DataFrame, labels: Sequence[str]) -> EncodedResponses:
    """Check and encode a single-label response table."""
    check_frame(responses)
    allowed = check_labels_argument(labels)
    example, example_ids = factorize_ids(responses["example_id"])
    worker, worker_ids = factorize_ids(responses["worker_id"])
    label = label_codes(responses["label"], allowed)
    return EncodedResponses(example_ids, example, worker_ids, worker, allowed, label)


@dataclass(frozen=True)
class EncodedLabelSets:
    """A multi-label response table as integer codes: one bitmask per response row.

    Bit ``j`` of ``masks[i]`` is set when response ``i`` chose ``labels[j]``; an empty set
    (the worker chose nothing) is the mask 0.
    """

    example_ids: pd.Index
    example: np.ndarray
    worker_ids: pd.Index
    worker: np.ndarray
    labels: tuple[str, ...]
    masks: np.ndarray

    @property
    def n_examples(self) -> int:
        return len(self.example_ids)

    @property
    def n_labels(self) -> int:
        return len(self.labels)

    def chosen(self, j: int) -> np.ndarray:
        """0/1 per response: did it choose label ``j``?"""
        return (self.masks >> j) & 1

    def counts(self) -> np.ndarray:
        """Examples x labels matrix: how many responses chose each label."""
        out = np.empty((self.n_examples, self.n_labels), dtype=np.int64)
        for j in range(self.n_labels):  # a loop over labels, not examples
            out[:, j] = np.bincount(self.example, weights=self.chosen(j), minlength=self.n_examples)
        return out

    def n_responses(self) -> np.ndarray:
        return np.bincount(self.example, minlength=self.n_examples)


def encode_multi(responses: pd.DataFrame, labels: Sequence[str]) -> EncodedLabelSets:
    """Check and encode a multi-label response table (``label`` holds tuples of labels)."""
    check_frame(responses)
    allowed = check_labels_argument(labels)
    if len(allowed) > 62:
        raise ValueError("multi-label statistics support at most 62 labels")
    example, example_ids = factorize_ids(responses["example_id"])
    worker, worker_ids = factorize_ids(responses["worker_id"])
    sets = [_as_label_tuple(value) for value in responses["label"]]
    lengths = np.fromiter((len(s) for s in sets), dtype=np.int64, count=len(sets))
    flat = [label for labels_of_row in sets for label in labels_of_row]
    codes = label_codes(pd.Series(flat, dtype=object), allowed) if flat else np.zeros(0, dtype=np.int64)
    row_of_flat = np.repeat(np.arange(len(sets), dtype=np.int64), lengths)
    masks = np.zeros(len(sets), dtype=np.int64)
    # A label listed twice in one response counts once (bitwise or).
    np.bitwise_or.at(masks, row_of_flat, np.left_shift(np.int64(1), codes))
    return EncodedLabelSets(example_ids, example, worker_ids, worker, allowed, masks)


def _as_label_tuple(value: object) -> tuple[object, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, tuple | list | set | frozenset | np.ndarray):
        return tuple(value)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        raise ValueError("a multi-label response has no label set (None/NaN); use an empty tuple for 'none'")
    raise ValueError(f"a multi-label response must be a tuple of labels, got {value!r}")


def popcount(values: np.ndarray) -> np.ndarray:
    """Number of set bits of each int64 (labels in a bitmask)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(values).astype(np.int64)
    return np.array([bin(int(v)).count("1") for v in values], dtype=np.int64)  # pragma: no cover


def slots(example: np.ndarray, n_examples: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Position (0, 1, ...) of each response within its example.

    With ``rng`` the order inside each example is a random permutation (DynaSent §3.5's
    "randomize the responses for each example"); without it, the table's row order.
    """
    n = len(example)
    order = np.argsort(example, kind="stable") if rng is None else np.lexsort((rng.random(n), example))
    starts = np.zeros(n_examples + 1, dtype=np.int64)
    np.cumsum(np.bincount(example, minlength=n_examples), out=starts[1:])
    sorted_examples = example[order]
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n, dtype=np.int64) - starts[sorted_examples]
    return position


def as_generator(random_state: int | np.random.Generator | None) -> np.random.Generator:
    if isinstance(random_state, np.random.Generator):
        return random_state
    return np.random.default_rng(random_state)


def gold_codes(gold: pd.Series | Mapping[Hashable, object], example_ids: pd.Index, labels: Sequence[str]) -> np.ndarray:
    """Per example (in ``example_ids`` order) the code of its gold label, -1 for none/missing."""
    series = gold if isinstance(gold, pd.Series) else pd.Series(gold, dtype=object)
    aligned = series.reindex(example_ids)
    values = aligned.astype(object).where(aligned.notna(), None)
    present = values.notna().to_numpy()
    codes = np.full(len(example_ids), -1, dtype=np.int64)
    if present.any():
        codes[present] = label_codes(values[present], labels, what="gold label")
    return codes
