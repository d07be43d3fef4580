"""A task's pay policy, versioned (docs/round_builder.md, "Pay and the ledger").

The policy is first the task YAML's ``pay:`` block (version 1, made when the task is created);
a researcher changes it at any time (:func:`set_pay_policy`), and each change is a new version,
never an edit of an old one. A version pays the work done from its ``effective_from`` (the moment
it was set) until the next version's: :class:`PolicyTimeline` answers which version was in force
at a given moment, and services/domain/ledger.py stamps each row it adds with that version.
Work done before a task's first version (the task had no policy then) is paid under the first.

The currency may not change once the task has any ledger row: the ledger's totals, corrections
and bonus files add a task's amounts together as one currency, and a platform study pays in one
currency, so a second currency would make those sums meaningless. While the ledger is empty a
version in another currency may be set; it then replaces every earlier version (work done before
it is paid under it too), for the same reason.

The platforms' published minimum hourly pay is here too (:data:`PLATFORM_MINIMUM_HOURLY_MINOR`),
in one place, for the crowd report's warnings.
"""

from __future__ import annotations

import datetime as dt
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import LedgerEntry, PayPolicyVersion, Platform, Task, User, utcnow
from services.domain import audit
from services.errors import Conflict, Invalid
from services.taskdef import PayPolicy
from services.text import clean_text

MAX_NOTE_CHARS = 500
MAX_VERSIONS_PER_TASK = 1000  # a bound on a task's history, far above any real round's changes

# The platforms' published minimum hourly pay, in minor units per hour of each currency they pay
# in. Source: Prolific's researcher help centre, "Prolific's payment principles" and "Deciding on
# a reward" (researcher-help.prolific.com, read 2026-11-25): "the minimum pay allowed is £6.00 /
# $8.00 per hour", recommended at least £9.00 / $12.00. These change (the same help centre said
# £5.00 / $6.50 earlier): check the page before a paid round and change the numbers here.
# Amazon Mechanical Turk publishes no minimum hourly pay (its reward is set per assignment), so
# MTurk has no entry: set `min_hourly_minor` in the task's pay policy for a floor of your own.
# Prolific pays participants in GBP and USD only (the same page), so it has no other currency.
PLATFORM_MINIMUM_HOURLY_MINOR: dict[Platform, dict[str, int]] = {
    Platform.prolific: {"GBP": 600, "USD": 800},
}
PLATFORM_RECOMMENDED_HOURLY_MINOR: dict[Platform, dict[str, int]] = {
    Platform.prolific: {"GBP": 900, "USD": 1200},
}
PLATFORM_MINIMUM_SOURCE = {
    Platform.prolific: "Prolific's researcher help centre, \"Prolific's payment principles\" (read 2026-11-25)",
    Platform.mturk: "Amazon Mechanical Turk publishes no minimum hourly pay",
}


def platform_minimum_hourly(platform: Platform, currency: str) -> int | None:
    """The platform's published minimum hourly pay in ``currency``'s minor units, or None where it
    publishes none (MTurk, a generic link) or does not pay in that currency."""
    return PLATFORM_MINIMUM_HOURLY_MINOR.get(platform, {}).get(currency)


# --- reading -----------------------------------------------------------------------------------


def parse_policy(data: Any) -> PayPolicy:
    """``data`` (a mapping, as from JSON or YAML) as a PayPolicy; a clear 422 naming each bad
    field otherwise (a float, negative or huge amount, an unknown key, a bad currency)."""
    if not isinstance(data, dict):
        raise Invalid("the pay policy must be a mapping such as {currency: GBP, base_pay: {writer: 150}}")
    try:
        return PayPolicy.model_validate(data)
    except ValidationError as exc:
        problems = [
            {"field": ".".join(str(part) for part in error["loc"]) or "pay", "problem": error["msg"]}
            for error in exc.errors(include_url=False)
        ]
        summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
        raise Invalid(f"the pay policy is not valid: {summary}", problems=problems) from exc


def versions(session: Session, task: Task) -> list[PayPolicyVersion]:
    """Every version of the task's pay policy, oldest first."""
    return list(
        session.scalars(
            select(PayPolicyVersion).where(PayPolicyVersion.task_id == task.id).order_by(PayPolicyVersion.version)
        )
    )


def current(session: Session, task: Task) -> PayPolicyVersion | None:
    """The task's newest version, or None for a task that never had a pay policy."""
    return session.scalar(
        select(PayPolicyVersion)
        .where(PayPolicyVersion.task_id == task.id)
        .order_by(PayPolicyVersion.version.desc())
        .limit(1)
    )


def current_policy(session: Session, task: Task) -> PayPolicy | None:
    newest = current(session, task)
    return None if newest is None else PayPolicy.model_validate(newest.policy)


@dataclass(frozen=True)
class PolicyInForce:
    version: int
    policy: PayPolicy
    effective_from: dt.datetime


class PolicyTimeline:
    """The versions a ledger compute chooses from: those in the newest version's currency (an
    earlier currency was replaced while the ledger was empty), ordered by ``effective_from``."""

    def __init__(self, rows: list[PayPolicyVersion]) -> None:
        if not rows:
            raise ValueError("a timeline needs at least one version")
        currency = rows[-1].policy.get("currency")
        start = len(rows) - 1
        while start > 0 and rows[start - 1].policy.get("currency") == currency:
            start -= 1
        # Version numbers and effective_from rise together (each version is effective when it is
        # set); sorting by both keeps the choice well defined even for equal timestamps.
        kept = sorted(rows[start:], key=lambda row: (row.effective_from, row.version))
        self._in_force = [
            PolicyInForce(row.version, PayPolicy.model_validate(row.policy), row.effective_from) for row in kept
        ]
        self._starts = [each.effective_from for each in self._in_force]

    @property
    def newest(self) -> PolicyInForce:
        return max(self._in_force, key=lambda each: each.version)

    @property
    def any_writer_bonus(self) -> bool:
        return any(each.policy.writer_bonus_per_example > 0 for each in self._in_force)

    @property
    def any_validator_bonus(self) -> bool:
        return any(
            each.policy.validator_bonus is not None and each.policy.validator_bonus.per_batch > 0
            for each in self._in_force
        )

    @property
    def currency(self) -> str:
        return self.newest.policy.currency

    def at(self, when: dt.datetime | None) -> PolicyInForce:
        """The version in force at ``when``: the last one effective at or before it; the first
        version for work done before any (or of unknown time: the newest)."""
        if when is None:
            return self.newest
        index = bisect_right(self._starts, when)
        return self._in_force[max(index - 1, 0)]


def timeline(session: Session, task: Task) -> PolicyTimeline | None:
    rows = versions(session, task)
    return PolicyTimeline(rows) if rows else None


# --- changing ----------------------------------------------------------------------------------


def _clean_note(note: str) -> str:
    if not note.strip():
        return ""
    # The text policy of every other entry point (services/text.py), on one line.
    return " ".join(clean_text(note, field="note", max_chars=MAX_NOTE_CHARS).split())


def set_pay_policy(
    session: Session,
    actor: User | None,
    task: Task,
    policy: PayPolicy | dict[str, Any],
    *,
    note: str = "",
    effective_from: dt.datetime | None = None,
) -> PayPolicyVersion:
    """A new version of the task's pay policy, in force from now (``effective_from``: only the
    task's creation passes one), numbered one above the newest. Refused (422, nothing written)
    for a bad policy or note, or for a currency other than the ledger's once the task has ledger
    rows. Concurrent changes each get their own number: the insert runs in a savepoint and a
    number taken meanwhile (the unique ``(task_id, version)``) is counted again."""
    checked = policy if isinstance(policy, PayPolicy) else parse_policy(policy)
    cleaned_note = _clean_note(note)
    ledger_currency = session.scalar(select(LedgerEntry.currency).where(LedgerEntry.task_id == task.id).limit(1))
    if ledger_currency is not None and checked.currency != ledger_currency:
        raise Invalid(
            f"the currency cannot change from {ledger_currency} to {checked.currency}: task {task.name!r} has "
            f"ledger rows in {ledger_currency}, and the ledger adds a task's amounts together as one currency",
            field="currency",
        )
    for _ in range(5):
        newest = session.scalar(select(func.max(PayPolicyVersion.version)).where(PayPolicyVersion.task_id == task.id))
        number = (newest or 0) + 1
        if number > MAX_VERSIONS_PER_TASK:
            raise Conflict(f"task {task.name!r} has {MAX_VERSIONS_PER_TASK} pay policy versions, the most it may have")
        row = PayPolicyVersion(
            task_id=task.id,
            version=number,
            policy=checked.model_dump(mode="json"),
            effective_from=effective_from or utcnow(),
            note=cleaned_note,
            created_by_id=actor.id if actor else None,
        )
        try:
            with session.begin_nested():
                session.add(row)
        except IntegrityError:
            continue  # a concurrent change took this number: count again
        audit.record(
            session,
            actor,
            "pay_policy.set",
            "task",
            task.id,
            version=number,
            policy=row.policy,
            note=cleaned_note,
        )
        return row
    raise Conflict(f"the pay policy of task {task.name!r} is being changed by someone else right now; try again")
