"""Payout batches: each export of bonuses is recorded, so that no bonus is paid twice
(docs/crowdsourcing.md, "Paying a round with payout batches").

A batch belongs to one study link (one Prolific study, one MTurk HIT group) and holds the
bonus ledger entries of that link's sessions (writer and validator bonuses and their
corrections; base pay is the study's own reward, paid by the platform on approval) that no live
batch holds yet. Each line is one worker of the link (MTurk: one assignment) and names the
ledger entries it pays (``payout_events``). The database refuses a second live claim on one
entry (``payout_events.claimed_entry_id`` is unique), so two exports at once never pay one event
twice; cancelling a batch releases its entries exactly once (a conditional update of its status).

* Only positive lines: a worker whose new entries net to zero or less (a correction that takes
  back more than is new) is held back and named; their entries stay payable and are netted with
  their next bonuses. Workers without a platform id of the form the platform issues are named,
  never paid by a made-up id.
* One currency: the link's (``study_links.currency``, else the task's pay policy's). Prolific
  pays in the study's currency, GBP or USD; MTurk pays in USD only (the platforms' docs, cited in
  docs/crowdsourcing.md). Anything else is refused before anything is written.
* The file is stored as exported: downloading a batch again answers the same bytes.
* Reconciliation compares a batch with the platform's own record of what it paid (a CSV, or for
  MTurk the JSON of ListBonusPayments) and lists matched, missing and unexpected lines.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import (
    LedgerEntry,
    LedgerKind,
    PayoutBatch,
    PayoutEvent,
    PayoutLine,
    PayoutReconciliation,
    PayoutStatus,
    Platform,
    StudyLink,
    StudySession,
    Task,
    User,
    utcnow,
)
from services.domain import audit
from services.domain.ledger import BONUS_KINDS, format_amount, pay_policy, valid_platform_ids
from services.domain.study import PLATFORM_CURRENCIES
from services.errors import Conflict, Invalid, NotFound, missing_payout_batch
from services.text import clean_text

EXPORT_PLATFORMS = (Platform.prolific, Platform.mturk)
MTURK_HEADER = ["worker_id", "assignment_id", "amount", "reason", "unique_request_token"]
MAX_NOTE_CHARS = 500
MAX_RECONCILE_CELL_CHARS = 1000
MAX_REPORT_ITEMS = 10_000  # items of each list a reconciliation report keeps
TOKEN_PREFIX = "dynaloop-"  # + 48 hexadecimal characters: 57, within MTurk's 64


def missing_study_link(link_id: int) -> NotFound:
    return NotFound(f"no study link {link_id}")


def get_batch(session: Session, batch_id: int) -> PayoutBatch:
    batch = session.get(PayoutBatch, batch_id)
    if batch is None:
        raise missing_payout_batch(batch_id)
    return batch


def list_batches(session: Session, task: Task, link_id: int | None = None) -> list[PayoutBatch]:
    query = select(PayoutBatch).where(PayoutBatch.task_id == task.id)
    if link_id is not None:
        query = query.where(PayoutBatch.link_id == link_id)
    return list(session.scalars(query.order_by(PayoutBatch.id)))


def lines_of(session: Session, batch: PayoutBatch) -> list[PayoutLine]:
    return list(
        session.scalars(select(PayoutLine).where(PayoutLine.batch_id == batch.id).order_by(PayoutLine.line_number))
    )


def entry_ids_of(session: Session, batch: PayoutBatch) -> dict[int, list[int]]:
    """Each line's id with the ledger entries it pays, oldest first."""
    paid: dict[int, list[int]] = defaultdict(list)
    for line_id, entry_id in session.execute(
        select(PayoutEvent.line_id, PayoutEvent.ledger_entry_id)
        .where(PayoutEvent.batch_id == batch.id)
        .order_by(PayoutEvent.ledger_entry_id)
    ):
        paid[line_id].append(entry_id)
    return paid


def _clean_note(note: str) -> str:
    """A note in one line, by the text policy of every other entry point (services/text.py):
    control characters and bidi overrides refused (422)."""
    return " ".join(clean_text(note, field="note", max_chars=MAX_NOTE_CHARS).split())


def link_currency(task: Task, link: StudyLink) -> str | None:
    """The currency the link's study pays in: its own, else the task's pay policy's."""
    if link.currency:
        return link.currency
    policy = pay_policy(task)
    return policy.currency if policy else None


# --- creating a batch ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HeldBack:
    """A worker of the link with payable entries who is not in the batch, and why."""

    username: str
    amount_minor: int
    reason: str


@dataclass(frozen=True)
class Elsewhere:
    """Payable bonuses of the task that this link's batch does not hold: a link's name (or none:
    workers who came through no study link) and its workers."""

    link_id: int | None
    link_name: str | None
    platform: str | None
    usernames: list[str]
    amount_minor: int
    advice: str


@dataclass
class BatchCreated:
    batch: PayoutBatch
    held_back: list[HeldBack] = field(default_factory=list)
    elsewhere: list[Elsewhere] = field(default_factory=list)


def _payable_bonus_entries(session: Session, task: Task) -> list[LedgerEntry]:
    """The task's bonus entries (bonuses and corrections of bonuses) that no live batch holds."""
    entries = list(session.scalars(select(LedgerEntry).where(LedgerEntry.task_id == task.id).order_by(LedgerEntry.id)))
    kinds = {e.id: e.kind for e in entries}

    def is_bonus(entry: LedgerEntry) -> bool:
        if entry.kind is LedgerKind.correction and entry.corrects_id is not None:
            return kinds.get(entry.corrects_id) in BONUS_KINDS
        return entry.kind in BONUS_KINDS

    claimed = set(
        session.scalars(
            select(PayoutEvent.claimed_entry_id)
            .join(LedgerEntry, LedgerEntry.id == PayoutEvent.ledger_entry_id)
            .where(LedgerEntry.task_id == task.id, PayoutEvent.claimed_entry_id.is_not(None))
        )
    )
    return [e for e in entries if is_bonus(e) and e.id not in claimed]


def request_token(task: Task, link: StudyLink, worker_id: str, assignment_id: str | None, entry_ids: list[int]) -> str:
    """MTurk SendBonus's UniqueRequestToken for one line: a digest of what the line pays (the
    task, the link, the worker, the assignment and its ledger entries), so the same events for
    the same assignment always carry the same token, in a re-exported batch too, and MTurk
    refuses to pay them twice within its token's window."""
    key = f"{task.id}:{link.id}:{worker_id}:{assignment_id or ''}:{','.join(map(str, sorted(entry_ids)))}"
    return TOKEN_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:48]


def _check_currency(task: Task, link: StudyLink, entries: list[LedgerEntry]) -> str:
    currency = link_currency(task, link)
    allowed = PLATFORM_CURRENCIES[link.platform]
    if currency is None:
        raise Invalid(
            f"task {task.name!r} has no pay policy and study link {link.id} no currency: nothing says what to pay in"
        )
    if currency not in allowed:
        raise Invalid(
            f"study link {link.id} ({link.platform.value}) pays in {currency}, but {link.platform.value} pays bonuses "
            f"in {' or '.join(allowed)} only; nothing was exported",
            field="currency",
        )
    other = sorted({e.currency for e in entries} - {currency})
    if other:
        raise Invalid(
            f"the ledger's bonuses on study link {link.id} are in {', '.join(other)}, "
            f"but its study pays in {currency}; "
            "a bonus file pays in the study's currency, so nothing was exported",
            field="currency",
        )
    return currency


def _usernames(session: Session, user_ids: set[int]) -> dict[int, str]:
    if not user_ids:
        return {}
    return dict(session.execute(select(User.id, User.username).where(User.id.in_(sorted(user_ids)))).all())


def _elsewhere(
    session: Session, link: StudyLink, entries: list[LedgerEntry], link_of_session: dict[int, StudyLink]
) -> list[Elsewhere]:
    """Payable bonuses of the task on other links, or on no link, with what to do about them."""
    groups: dict[int | None, list[LedgerEntry]] = defaultdict(list)
    for entry in entries:
        other = link_of_session.get(entry.session_id) if entry.session_id is not None else None
        if other is not None and other.id == link.id:
            continue
        groups[other.id if other else None].append(entry)
    names = _usernames(session, {e.user_id for e in entries})
    links = {lk.id: lk for lk in link_of_session.values()}
    found = []
    for link_id, rows in sorted(groups.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        users = sorted({names.get(e.user_id, str(e.user_id)) for e in rows})
        other = links.get(link_id) if link_id is not None else None
        if other is None:
            advice = (
                "earned without a study session (they came through no study link), so no platform id pays them: "
                "pay them outside the platforms and record it with a ledger correction if needed"
            )
        elif other.platform in EXPORT_PLATFORMS:
            advice = f"create a payout batch for study link {other.id} ({other.platform.value}) to pay them"
        else:
            advice = (
                f"study link {other.id} is a {other.platform.value} link: no platform file pays them; "
                "pay them another way"
            )
        found.append(
            Elsewhere(
                link_id=other.id if other else None,
                link_name=other.name if other else None,
                platform=other.platform.value if other else None,
                usernames=users,
                amount_minor=sum(e.amount_minor for e in rows),
                advice=advice,
            )
        )
    return found


def render_file(platform: Platform, task: Task, currency: str, lines: list[PayoutLine]) -> str:
    """The platform's bulk-bonus file. Prolific: ``participant_id,amount`` lines, no header (the
    ``csv_bonuses`` format of Prolific's "Set up bonuses"); MTurk: a header, then
    ``worker_id,assignment_id,amount,reason,unique_request_token`` (SendBonus's parameters).
    Amounts in major units with the currency's minor digits ("0.25"), from integers only."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if platform is Platform.mturk:
        writer.writerow(MTURK_HEADER)
    for line in lines:
        amount = format_amount(line.amount_minor, currency)
        if platform is Platform.mturk:
            reason = f"Bonus for task {task.name}"
            writer.writerow([line.platform_worker_id, line.assignment_id, amount, reason, line.unique_request_token])
        else:
            writer.writerow([line.platform_worker_id, amount])
    return out.getvalue()


def create_batch(
    session: Session, actor: User | None, task: Task, link: StudyLink, *, note: str | None = None
) -> BatchCreated:
    """Record a payout batch for ``link``: one positive line per worker (MTurk: per assignment)
    of the link's bonus entries that no live batch holds. :class:`Invalid` (422) for a link of
    another platform or currency, :class:`Conflict` (409) when there is nothing to pay or a
    concurrent export claimed the same entries; nothing is written then."""
    if link.task_id != task.id:
        raise missing_study_link(link.id)
    if link.platform not in EXPORT_PLATFORMS:
        raise Invalid(
            f"study link {link.id} is a {link.platform.value} link: only prolific and mturk links have a bonus file; "
            "pay its workers another way",
            field="link_id",
        )
    if note is not None:
        note = _clean_note(note)
    payable = _payable_bonus_entries(session, task)
    link_of_session: dict[int, StudyLink] = {}
    for study_session, its_link in session.execute(
        select(StudySession, StudyLink)
        .join(StudyLink, StudySession.link_id == StudyLink.id)
        .where(StudyLink.task_id == task.id)
    ).all():
        link_of_session[study_session.id] = its_link
    sessions = {s.id: s for s in session.scalars(select(StudySession).where(StudySession.link_id == link.id))}
    mine = [e for e in payable if e.session_id is not None and e.session_id in sessions]
    currency = _check_currency(task, link, mine)
    names = _usernames(session, {e.user_id for e in mine})
    by_session: dict[int, list[LedgerEntry]] = defaultdict(list)
    for entry in mine:
        assert entry.session_id is not None
        by_session[entry.session_id].append(entry)
    held_back: list[HeldBack] = []
    planned: list[tuple[StudySession, list[LedgerEntry], int]] = []
    for session_id, rows in by_session.items():
        study_session = sessions[session_id]
        amount = sum(e.amount_minor for e in rows)
        username = names.get(study_session.user_id, str(study_session.user_id))
        worker_id = study_session.platform_worker_id
        assignment_id = study_session.platform_session_id
        if not worker_id or (link.platform is Platform.mturk and not assignment_id):
            held_back.append(HeldBack(username, amount, f"their session has no {link.platform.value} id to pay by"))
        elif not valid_platform_ids(link.platform, worker_id, assignment_id):
            held_back.append(
                HeldBack(
                    username, amount, f"their session's id is not one {link.platform.value} issues; check it by hand"
                )
            )
        elif amount <= 0:
            held_back.append(
                HeldBack(
                    username,
                    amount,
                    f"their new entries net to {format_amount(amount, currency)} {currency} (a correction takes back "
                    "more than is new); held back until later bonuses cover it",
                )
            )
        else:
            planned.append((study_session, rows, amount))
    elsewhere = _elsewhere(session, link, payable, link_of_session)
    if not planned:
        raise Conflict(
            f"nothing to pay on study link {link.id}: no bonus of its workers is outside a payout batch"
            + (f"; held back: {', '.join(h.username for h in held_back)}" if held_back else "")
            + "; compute the ledger first (POST /api/v1/tasks/{task}/ledger/compute) if it is not up to date",
            held_back=[h.__dict__ for h in held_back],
        )
    planned.sort(key=lambda p: (p[0].platform_worker_id or "", p[0].platform_session_id or ""))
    try:
        with session.begin_nested():
            batch = PayoutBatch(
                task_id=task.id,
                link_id=link.id,
                platform=link.platform,
                currency=currency,
                status=PayoutStatus.created,
                line_count=len(planned),
                total_minor=sum(amount for _, _, amount in planned),
                filename="",
                file_text="",
                note=note,
                created_by_id=actor.id if actor else None,
                created_at=utcnow(),
            )
            session.add(batch)
            session.flush()
            lines = []
            for number, (study_session, rows, amount) in enumerate(planned, start=1):
                assert study_session.platform_worker_id is not None
                assignment = study_session.platform_session_id if link.platform is Platform.mturk else None
                line = PayoutLine(
                    batch_id=batch.id,
                    line_number=number,
                    user_id=study_session.user_id,
                    session_id=study_session.id,
                    platform_worker_id=study_session.platform_worker_id,
                    assignment_id=assignment,
                    amount_minor=amount,
                    unique_request_token=request_token(
                        task, link, study_session.platform_worker_id, assignment, [e.id for e in rows]
                    ),
                )
                session.add(line)
                session.flush()
                lines.append(line)
                session.add_all(
                    PayoutEvent(batch_id=batch.id, line_id=line.id, ledger_entry_id=e.id, claimed_entry_id=e.id)
                    for e in rows
                )
            batch.filename = f"{task.name}-link{link.id}-batch{batch.id}-{link.platform.value}.csv"
            batch.file_text = render_file(link.platform, task, currency, lines)
            session.flush()
    except IntegrityError as exc:
        raise Conflict(
            f"another payout batch of study link {link.id} claimed some of these bonuses at the same moment; "
            "nothing was written: list the batches, then create one again for what is still payable"
        ) from exc
    audit.record(
        session,
        actor,
        "payout.create",
        "payout_batch",
        batch.id,
        link_id=link.id,
        lines=batch.line_count,
        total_minor=batch.total_minor,
        currency=currency,
    )
    return BatchCreated(batch=batch, held_back=held_back, elsewhere=elsewhere)


# --- paid, cancelled ------------------------------------------------------------------------------


def _transition(session: Session, batch: PayoutBatch, to: PayoutStatus, values: dict[str, Any]) -> bool:
    """Move a created batch to ``to`` with one conditional UPDATE: of two concurrent calls, one
    finds the batch still created; the other changes nothing."""
    result = session.execute(
        update(PayoutBatch)
        .where(PayoutBatch.id == batch.id, PayoutBatch.status == PayoutStatus.created)
        .values(status=to, **values)
        .execution_options(synchronize_session=False)
    )
    session.refresh(batch)
    return bool(getattr(result, "rowcount", 0))


def mark_paid(session: Session, actor: User | None, batch: PayoutBatch, *, note: str | None = None) -> PayoutBatch:
    """The researcher says the platform paid the batch (its file pasted, or paid through the
    API). Only a created batch; a paid one stays paid, a cancelled one was never paid."""
    values: dict[str, Any] = {"paid_at": utcnow(), "paid_by_id": actor.id if actor else None}
    if note:
        values["note"] = _clean_note(note)
    if not _transition(session, batch, PayoutStatus.paid, values):
        raise Conflict(f"payout batch {batch.id} is {batch.status.value}; only a created batch can be marked paid")
    audit.record(session, actor, "payout.paid", "payout_batch", batch.id)
    return batch


def cancel(session: Session, actor: User | None, batch: PayoutBatch, *, note: str | None = None) -> PayoutBatch:
    """Cancel a created batch that was not paid: its ledger entries become payable again, once
    (a second cancel finds it cancelled and changes nothing). A paid batch is never cancelled: a
    payment that was wrong is put right by a ledger correction, which a later batch pays."""
    values: dict[str, Any] = {"cancelled_at": utcnow(), "cancelled_by_id": actor.id if actor else None}
    if note:
        values["note"] = _clean_note(note)
    if not _transition(session, batch, PayoutStatus.cancelled, values):
        advice = "; a wrong payment is put right with a ledger correction" if batch.status is PayoutStatus.paid else ""
        raise Conflict(
            f"payout batch {batch.id} is {batch.status.value}; only a created batch can be cancelled{advice}"
        )
    session.execute(
        update(PayoutEvent)
        .where(PayoutEvent.batch_id == batch.id)
        .values(claimed_entry_id=None)
        .execution_options(synchronize_session=False)
    )
    audit.record(session, actor, "payout.cancel", "payout_batch", batch.id)
    return batch


def live_entry_ids(session: Session, task: Task) -> set[int]:
    """The ledger entries of the task that a batch that is not cancelled holds."""
    return set(
        session.scalars(
            select(PayoutEvent.claimed_entry_id).where(
                PayoutEvent.claimed_entry_id.is_not(None),
                exists().where(PayoutBatch.id == PayoutEvent.batch_id, PayoutBatch.task_id == task.id),
            )
        )
    )


# --- reconciliation -------------------------------------------------------------------------------


# The column names a platform's record may use, compared folded (lower case, no spaces,
# underscores or hyphens). MTurk: ListBonusPayments' fields (WorkerId, AssignmentId,
# BonusAmount); Prolific: the participant id as its bonus file and its submissions export name it.
@dataclass(frozen=True)
class RecordRow:
    row: int  # counted from 1, the header not counted
    worker_id: str
    assignment_id: str | None
    amount_minor: int


@dataclass
class ReconcileReport:
    batch_id: int
    matched: list[dict[str, Any]] = field(default_factory=list)
    missing: list[dict[str, Any]] = field(default_factory=list)  # in the batch, not in the record
    unexpected: list[dict[str, Any]] = field(
        default_factory=list
    )  # in the record, not in the batch (or another amount)
    in_other_batches: list[dict[str, Any]] = field(default_factory=list)  # a line of another live batch of the link
    reconciliation_id: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The report with at most MAX_REPORT_ITEMS items a list (the counts are whole), so a
        record of a million rows is not stored a million times over."""
        lists = {
            "matched": self.matched,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "in_other_batches": self.in_other_batches,
        }
        return {
            "batch_id": self.batch_id,
            **{name: items[:MAX_REPORT_ITEMS] for name, items in lists.items()},
            "counts": {name: len(items) for name, items in lists.items()},
            "truncated": any(len(items) > MAX_REPORT_ITEMS for items in lists.values()),
        }


def reconcile(session: Session, actor: User | None, batch: PayoutBatch, record: list[RecordRow]) -> ReconcileReport:
    """Compare the batch with the platform's record of what it paid, and record the report.
    A record row matches a line of the batch with the same worker (MTurk: and assignment) and the
    same amount, each line at most once. Unmatched lines are missing; unmatched rows that match a
    line of another batch of the link that is not cancelled are listed apart (the record covers
    the whole study); the rest are unexpected, with the batch's amount where the worker is in it."""
    report = ReconcileReport(batch_id=batch.id)
    mturk = batch.platform is Platform.mturk

    def key(worker_id: str, assignment_id: str | None) -> tuple[str, str]:
        return (worker_id, (assignment_id or "") if mturk else "")

    open_lines: dict[tuple[str, str], list[PayoutLine]] = defaultdict(list)
    for line in lines_of(session, batch):
        open_lines[key(line.platform_worker_id, line.assignment_id)].append(line)
    in_batch = {k: [ln.amount_minor for ln in v] for k, v in open_lines.items()}
    others: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for line, other_id in session.execute(
        select(PayoutLine, PayoutBatch.id)
        .join(PayoutBatch, PayoutBatch.id == PayoutLine.batch_id)
        .where(
            PayoutBatch.link_id == batch.link_id,
            PayoutBatch.id != batch.id,
            PayoutBatch.status != PayoutStatus.cancelled,
        )
        .order_by(PayoutLine.id)
    ).all():
        others[(*key(line.platform_worker_id, line.assignment_id), line.amount_minor)].append(other_id)

    def shown(amount: int) -> str:
        return format_amount(amount, batch.currency)

    for row in record:
        k = key(row.worker_id, row.assignment_id)
        candidates = open_lines.get(k, [])
        match = next((ln for ln in candidates if ln.amount_minor == row.amount_minor), None)
        described = {
            "row": row.row,
            "worker_id": row.worker_id[:128],
            "assignment_id": (row.assignment_id or "")[:128] or None,
            "amount": shown(row.amount_minor),
        }
        if match is not None:
            candidates.remove(match)
            report.matched.append({**described, "line": match.line_number})
        elif others.get((*k, row.amount_minor)):
            report.in_other_batches.append({**described, "batch_id": others[(*k, row.amount_minor)].pop(0)})
        else:
            reason = (
                f"this batch pays them {', '.join(shown(a) for a in in_batch[k])}, not {shown(row.amount_minor)}"
                if k in in_batch
                else "not in this batch"
            )
            report.unexpected.append({**described, "reason": reason})
    for lines in open_lines.values():
        for line in lines:
            report.missing.append(
                {
                    "line": line.line_number,
                    "worker_id": line.platform_worker_id,
                    "assignment_id": line.assignment_id,
                    "amount": shown(line.amount_minor),
                }
            )
    report.missing.sort(key=lambda item: item["line"])
    recorded = PayoutReconciliation(
        batch_id=batch.id,
        matched=len(report.matched),
        missing=len(report.missing),
        unexpected=len(report.unexpected),
        report=report.as_dict(),
        created_by_id=actor.id if actor else None,
        created_at=utcnow(),
    )
    session.add(recorded)
    session.flush()
    report.reconciliation_id = recorded.id
    audit.record(
        session,
        actor,
        "payout.reconcile",
        "payout_batch",
        batch.id,
        matched=recorded.matched,
        missing=recorded.missing,
        unexpected=recorded.unexpected,
    )
    return report
