"""One copy of each text per build (docs/round_builder.md "Duplicates").

Writers can no longer submit a text the task already has (services/domain/duplicates.py), but a
round may still hold repeats: examples written before that rule (migration 0017), an import's
and a harvest's overlap with an earlier round. Before the splits are made, the examples of the
round are grouped by :func:`services.domain.duplicates.example_hash` (the normalized text and,
for a target-dependent task, the normalized target), so no text reaches two splits or one split
twice:

* a group whose copies agree on their gold label (or have none) keeps one copy: the one with
  the most votes for its gold, then the earliest; the others are excluded as ``duplicate``.
  Their labels are not pooled into the kept copy: each copy was labelled as its own example by
  the task's number of validators, and pooling would give the kept copy more than that number
  (an import pools repeated rows itself, before the round is built: rounds/models/round_imports.py);
* a group whose copies have different gold labels is excluded whole, as
  ``duplicate_conflicting_gold``: the same text cannot be evidence for two labels;
* a copy of a text that an earlier round of the task holds is excluded as
  ``duplicate_of_earlier_round``, so a dataset made of several rounds has each text once.

Copies that were excluded for another reason already (no gold, dropped in validation) keep that
reason and are not counted here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from rounds.build.report_schema import ReportDuplicates
from services.db.models import Example, ExampleText, Round
from services.domain.duplicates import example_hash

DUPLICATE = "duplicate"
CONFLICTING = "duplicate_conflicting_gold"
EARLIER_ROUND = "duplicate_of_earlier_round"


# The rule the report's ``duplicates`` section states.
RULE = (
    "one copy per normalized text (NFC, case folded, punctuation and invisible characters removed, "
    "white space collapsed): copies that agree keep the one with the most votes, copies with "
    "different gold labels are all excluded, texts of an earlier round of the task are excluded"
)


def hashes_of(examples: pd.DataFrame) -> list[str]:
    """The duplicate hash of each example (columns ``text`` and ``extras``), in order."""
    return [example_hash(text, extras) for text, extras in zip(examples["text"], examples["extras"], strict=True)]


def earlier_round_hashes(session: Session, round_: Round, hashes: list[str]) -> set[str]:
    """Which of ``hashes`` an example of an earlier round (a lower number) of the task holds."""
    wanted = sorted(set(hashes))
    found: set[str] = set()
    for start in range(0, len(wanted), 1000):
        found.update(
            session.scalars(
                select(ExampleText.normalized_hash)
                .join(Example, Example.id == ExampleText.example_id)
                .join(Round, Round.id == Example.round_id)
                .where(
                    ExampleText.task_id == round_.task_id,
                    ExampleText.normalized_hash.in_(wanted[start : start + 1000]),
                    Round.number < round_.number,
                )
            )
        )
    return found


def _gold_key(value: Any) -> Any:
    return value if isinstance(value, str | tuple) else None


def collapse(
    example_ids: np.ndarray, hashes: list[str], gold: pd.DataFrame, dropped: np.ndarray, earlier: set[str]
) -> ReportDuplicates:
    """Mark the repeats of each text as excluded, in place: ``gold`` (indexed by example id, with
    ``gold``, ``gold_votes``, ``kept`` and ``reason``) gets their reason and ``kept = False``,
    ``dropped`` (aligned with ``example_ids``) is set for them. Returns the report's
    ``duplicates`` section."""
    groups: dict[str, list[int]] = {}
    for position, digest in enumerate(hashes):
        if not dropped[position]:
            groups.setdefault(digest, []).append(position)
    merged = conflicting_groups = conflicting = in_earlier = 0

    def exclude(position: int, reason: str) -> None:
        example_id = example_ids[position]
        gold.loc[example_id, "kept"] = False
        gold.loc[example_id, "reason"] = reason
        dropped[position] = True

    ids = [int(e) for e in example_ids]
    gold_of = {int(e): _gold_key(g) for e, g in zip(gold.index, gold["gold"], strict=True)}
    votes_of = {int(e): float(v) for e, v in zip(gold.index, gold["gold_votes"].fillna(0), strict=True)}
    for digest, positions in groups.items():
        if digest in earlier:
            for position in positions:
                exclude(position, EARLIER_ROUND)
            in_earlier += len(positions)
            continue
        if len(positions) == 1:
            continue
        labels = {gold_of.get(ids[p]) for p in positions} - {None}
        if len(labels) > 1:
            for position in positions:
                exclude(position, CONFLICTING)
            conflicting_groups += 1
            conflicting += len(positions)
            continue
        keep = min(positions, key=lambda p: (gold_of.get(ids[p]) is None, -votes_of.get(ids[p], 0.0), ids[p]))
        for position in positions:
            if position != keep:
                exclude(position, DUPLICATE)
                merged += 1
    return ReportDuplicates(
        merged=merged,
        conflicting_gold_texts=conflicting_groups,
        conflicting_gold_examples=conflicting,
        in_an_earlier_round=in_earlier,
        rule=RULE,
    )
