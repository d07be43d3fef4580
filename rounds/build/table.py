"""The long table of responses every statistic reads.

One row per (example, worker) response, with the columns ``example_id``, ``worker_id`` and
``label``. For single-label families ``label`` is a string. For multi-label tasks it is a
tuple of the labels the worker chose (possibly of length 1). Unqualified workers' responses
never reach this table: :func:`responses_frame` takes only counted validations.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

COLUMNS = ["example_id", "worker_id", "label"]


def responses_frame(rows: Iterable[tuple[Any, Any, Any]], *, multi_label: bool = False) -> pd.DataFrame:
    """Build the long table from (example_id, worker_id, label) rows.

    Stored labels are lists (see services.domain.labels); single-label responses become the
    string, multi-label ones a sorted tuple.
    """
    records = []
    for example_id, worker_id, label in rows:
        if isinstance(label, list | tuple):
            value: Any = tuple(sorted(label)) if multi_label else label[0]
        else:
            value = (label,) if multi_label else label
        records.append((example_id, worker_id, value))
    frame = pd.DataFrame.from_records(records, columns=COLUMNS)
    if not multi_label:
        frame["label"] = frame["label"].astype("string")
    return frame


def check_frame(responses: pd.DataFrame) -> None:
    missing = [c for c in COLUMNS if c not in responses.columns]
    if missing:
        raise ValueError(f"responses need the columns {COLUMNS}; missing {missing}")
