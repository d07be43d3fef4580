"""Duplicate texts (docs/design.md "Duplicates"): a text that is already an example of the
task, in this round or an earlier one, is not accepted again.

Two texts are the same when their :func:`services.text.duplicate_key` is (the normalized text
and, for a target-dependent task, the normalized target). Each example stores the key's hash
(``examples.normalized_hash``); the task's first example of each text holds its row in
``example_texts``, whose primary key (task, hash) makes the rule race-safe: of two concurrent
submissions of one text, the second one's insert fails and it is refused.

A writer's attempt is checked before the model is called (no model call, no try, nothing
stored), the submission again when the example is created. Imports and harvested sentences
record their texts without being refused by earlier rounds (a researcher may import a dataset
that overlaps an earlier round); the round builder keeps one copy per split
(rounds/build/duplicates.py). A task may also refuse *near* duplicates
(``near_duplicate_similarity`` in its YAML): see :func:`refuse_near_duplicate`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from rapidfuzz import fuzz, process
from sqlalchemy import bindparam, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import Example, ExampleText, Round, Task, utcnow
from services.db.statements import table_of
from services.errors import DuplicateText
from services.taskdef import TaskDefinition
from services.text import duplicate_key, key_hash

#: Near-duplicate checks compare a text with at most this many of the task's examples of a
#: similar length (the newest first): the cost of one check is bounded whatever the task's size.
NEAR_DUPLICATE_CANDIDATES = 20_000


def target_of(text: str, span: list[int] | dict[str, Any] | None) -> str | None:
    """The target's text of an attempt's span ([start, end]) or an example's extras
    (``{"start", "end", "text"}``); None when the task marks no target."""
    if isinstance(span, dict):
        target = span.get("text")
        return target if isinstance(target, str) else None
    if isinstance(span, list) and len(span) == 2:
        return text[span[0] : span[1]]
    return None


def example_key(text: str, extras: dict[str, Any] | None) -> str:
    """``examples.normalized_text`` of an example with this text and extras."""
    return duplicate_key(text, target_of(text, (extras or {}).get("target_span")))


def example_hash(text: str, extras: dict[str, Any] | None) -> str:
    """``examples.normalized_hash`` of an example with this text and extras."""
    return key_hash(example_key(text, extras))


def normalize(example: Example) -> None:
    """Set the example's ``normalized_text`` and ``normalized_hash`` from its text and extras."""
    example.normalized_text = example_key(example.text, example.extras)
    example.normalized_hash = key_hash(example.normalized_text)


def _refusal(task: Task, round_number: int | None, *, near: bool = False) -> DuplicateText:
    where = f"round {round_number}" if round_number is not None else "an earlier round"
    what = "is almost the same as" if near else "is the same as"
    rule = "" if near else " (ignoring case, spacing, punctuation and invisible characters)"
    return DuplicateText(
        f"this text {what} an example already in {where} of task {task.name!r}{rule}; each text is accepted "
        "once, so write a different sentence. Nothing was saved and no try was used",
        round=round_number,
    )


# Asked before every writer's check: built once, and Core, not the ORM (services/db/statements.py):
# a round's number is all it reads.
_texts, _examples, _rounds = table_of(ExampleText), table_of(Example), table_of(Round)
_DUPLICATE = (
    select(_rounds.c.number)
    .select_from(_texts)
    .join(_examples, _examples.c.id == _texts.c.example_id)
    .join(_rounds, _rounds.c.id == _examples.c.round_id)
    .where(_texts.c.task_id == bindparam("task_id"), _texts.c.normalized_hash == bindparam("digest"))
)


def refuse_duplicate(session: Session, task: Task, digest: str) -> None:
    """Raise :class:`DuplicateText` when an example of ``task`` already holds the text whose
    hash is ``digest`` (one primary-key lookup)."""
    round_number = session.execute(_DUPLICATE, {"task_id": task.id, "digest": digest}).scalar_one_or_none()
    if round_number is not None:
        raise _refusal(task, round_number)


def refuse_near_duplicate(
    session: Session, task: Task, definition: TaskDefinition, text: str, target: str | None
) -> None:
    """With the task's ``near_duplicate_similarity`` set (0 < s <= 1), raise
    :class:`DuplicateText` when the text is at least that similar to an example of the task
    (rapidfuzz's normalized Indel similarity, ``fuzz.ratio / 100``, of the two
    :func:`~services.text.duplicate_key`).

    The cost is bounded: ``ratio`` >= s needs the shorter key to be at least s / (2 - s) of the
    longer one (the Indel distance is at least the difference of the lengths), so only examples
    whose stored key (``examples.normalized_text``) has a length in that range are read, at most
    :data:`NEAR_DUPLICATE_CANDIDATES` of them, newest first; ``process.extractOne`` with
    ``score_cutoff`` skips most candidates without computing their score (about 1 ms for 20,000)."""
    similarity = definition.near_duplicate_similarity
    if similarity is None:
        return
    key = duplicate_key(text, target)
    if not key:
        return
    low = math.floor(len(key) * similarity / (2 - similarity))
    high = math.ceil(len(key) * (2 - similarity) / similarity)
    rows = session.execute(
        select(Example.normalized_text, Round.number)
        .join(Round, Round.id == Example.round_id)
        .where(
            Round.task_id == task.id,
            Example.normalized_text.is_not(None),
            func.length(Example.normalized_text).between(low, high),
        )
        .order_by(Example.id.desc())
        .limit(NEAR_DUPLICATE_CANDIDATES)
    ).all()
    found = process.extractOne(key, [row[0] for row in rows], scorer=fuzz.ratio, score_cutoff=similarity * 100)
    if found is not None:
        raise _refusal(task, rows[found[2]][1], near=True)


# Core, built once (services/db/statements.py): every submitted example claims its text.
_CLAIM_TEXT = insert(_texts)


def claim(session: Session, task: Task, example: Example) -> None:
    """Record ``example`` (flushed, its normalized text and hash set by :func:`normalize`) as
    the task's one example of its text, or raise :class:`DuplicateText` when another example
    holds it, including one that a concurrent request inserted a moment ago (the primary key decides; the failed insert
    is undone in a savepoint so the caller's transaction stays usable)."""
    assert example.normalized_hash is not None
    try:
        with session.begin_nested():
            session.execute(
                _CLAIM_TEXT,
                {
                    "task_id": task.id,
                    "normalized_hash": example.normalized_hash,
                    "example_id": example.id,
                    "created_at": utcnow(),
                },
            )
    except IntegrityError as exc:
        holder = session.execute(
            _DUPLICATE, {"task_id": task.id, "digest": example.normalized_hash}
        ).scalar_one_or_none()
        raise _refusal(task, holder) from exc


def record_texts(session: Session, task: Task, examples: Iterable[Example]) -> int:
    """Hash ``examples`` (flushed) and let each claim its text where no example of the task
    holds it yet (imports, harvested sentences: not refused by earlier rounds). Returns how many
    claimed a text."""
    by_hash: dict[str, Example] = {}
    for example in examples:
        normalize(example)
        assert example.normalized_hash is not None
        by_hash.setdefault(example.normalized_hash, example)
    if not by_hash:
        return 0
    held: set[str] = set()
    hashes = sorted(by_hash)
    for start in range(0, len(hashes), 1000):
        held.update(
            session.scalars(
                select(ExampleText.normalized_hash).where(
                    ExampleText.task_id == task.id, ExampleText.normalized_hash.in_(hashes[start : start + 1000])
                )
            )
        )
    now = utcnow()
    rows = [
        {"task_id": task.id, "normalized_hash": digest, "example_id": example.id, "created_at": now}
        for digest, example in by_hash.items()
        if digest not in held
    ]
    for start in range(0, len(rows), 5000):
        session.execute(insert(ExampleText), rows[start : start + 5000])
    session.flush()
    return len(rows)
