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
import dataclasses
import datetime as dt
import hashlib
import io
import re
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import exists, or_, select, update
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
    StudySessionStatus,
    Task,
    User,
    utcnow,
)
from services.db.transactions import commit_now
from services.domain import audit
from services.domain.ledger import BONUS_KINDS, format_amount, pay_policy, valid_platform_ids
from services.domain.study import PLATFORM_CURRENCIES
from services.errors import Conflict, Invalid, NotFound, missing_payout_batch
from services.text import clean_text

if TYPE_CHECKING:
    from services.platforms import LineResult, PayLine
    from services.platforms.prolific import BonusPayment
    from services.settings import Settings

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
    """The task's entries that a bonus pays and that no live batch holds: bonuses, every
    correction (an adjustment, e.g. Prolific's minimum-pay top-up on base pay, or pay taken
    back) and a stopped session's partial pay. Not the base pay of a completed session: the
    platform pays that as the study's (HIT's) own reward when the submission is approved."""
    entries = list(session.scalars(select(LedgerEntry).where(LedgerEntry.task_id == task.id).order_by(LedgerEntry.id)))
    stopped = set(
        session.scalars(
            select(StudySession.id)
            .join(StudyLink, StudySession.link_id == StudyLink.id)
            .where(StudyLink.task_id == task.id, StudySession.status == StudySessionStatus.stopped)
        )
    )

    def is_bonus(entry: LedgerEntry) -> bool:
        if entry.kind is LedgerKind.correction:
            return True
        if entry.kind is LedgerKind.base_pay:
            return entry.session_id in stopped  # partial pay (services/domain/ledger.py)
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
            writer.writerow(
                [line.platform_worker_id, line.assignment_id, amount, line_reason(task), line.unique_request_token]
            )
        else:
            writer.writerow([line.platform_worker_id, amount])
    return out.getvalue()


def _plan_lines(
    link: StudyLink,
    currency: str,
    sessions: dict[int, StudySession],
    mine: list[LedgerEntry],
    names: dict[int, str],
) -> tuple[list[tuple[StudySession, list[LedgerEntry], int]], list[HeldBack]]:
    """The lines a batch of ``link`` would pay (a session, its entries, their sum), one per
    session of the entries ``mine``, and the workers held back: no platform id to pay by, an id
    the platform does not issue, or new entries that net to nothing or less."""
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
    return planned, held_back


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
    planned, held_back = _plan_lines(link, currency, sessions, mine, names)
    elsewhere = _elsewhere(session, link, payable, link_of_session)
    if not planned:
        raise Conflict(
            f"nothing to pay on study link {link.id}: no bonus of its workers is outside a payout batch"
            + (f"; held back: {', '.join(h.username for h in held_back)}" if held_back else "")
            + "; compute the ledger first (POST /api/v1/tasks/{task}/ledger/compute) if it is not up to date",
            held_back=[h.__dict__ for h in held_back],
        )
    planned.sort(key=lambda p: (p[0].platform_worker_id or "", p[0].platform_session_id or ""))
    batch = _write_batch(session, actor, task, link, currency, planned, note)
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


def _write_batch(
    session: Session,
    actor: User | None,
    task: Task,
    link: StudyLink,
    currency: str,
    planned: list[tuple[StudySession, list[LedgerEntry], int]],
    note: str | None,
) -> PayoutBatch:
    """Write the batch, its lines in ``planned``'s order, the events claiming their ledger entries,
    and its file, in one savepoint; :class:`Conflict` (nothing written) when a concurrent batch
    claimed some of the entries."""
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
    return batch


# --- paid, cancelled ------------------------------------------------------------------------------


def _transition(session: Session, batch: PayoutBatch, to: PayoutStatus, values: dict[str, Any], *also: Any) -> bool:
    """Move a created batch to ``to`` with one conditional UPDATE (and the conditions ``also``):
    of two concurrent calls, one finds the batch still created; the other changes nothing."""
    result = session.execute(
        update(PayoutBatch)
        .where(PayoutBatch.id == batch.id, PayoutBatch.status == PayoutStatus.created, *also)
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
    _, state = _prolific_state(batch)
    if state.pay_sent or state.setup_unknown:
        raise Conflict(
            f"a Prolific pay or set-up request of payout batch {batch.id} got no clear answer: it may be paid; "
            f"check the study's bonuses and record it (`dynaloop ledger pay {batch.id} --record-line all --as ...`)"
        )
    sent_through_api = exists().where(
        PayoutLine.batch_id == PayoutBatch.id, PayoutLine.platform_status.in_((*PAID_STATUSES, "unknown"))
    )
    # A batch the API paid in part (or may have) is never cancelled: its entries would be paid again.
    if not _transition(
        session, batch, PayoutStatus.cancelled, values, PayoutBatch.pay_run_id.is_(None), ~sent_through_api
    ):
        if batch.status is PayoutStatus.created:
            raise Conflict(
                f"payout batch {batch.id} is being paid through the platform's API, or some of its lines were paid "
                "(or may have been): it cannot be cancelled; see `dynaloop ledger batch show`"
            )
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


# --- paying a batch through the platform's API ---------------------------------------------------

PAID_STATUSES = ("paid", "already_paid")
RECORDABLE_OUTCOMES = ("paid", "failed")
REFERENCE_RE = re.compile(r"^[A-Za-z0-9_:.\-]{1,200}$")


def line_reason(task: Task) -> str:
    """What the worker reads beside a bonus (MTurk's ``Reason``), the same in the file and the API."""
    return f"Bonus for task {task.name}"


def pay_run_stale_after(settings: Settings) -> dt.timedelta:
    """How long a pay run's claim lasts without being renewed. A run renews it before each
    request to the platform, and one request takes at most ``platform_timeout_s`` (boto3 tries
    an MTurk call up to three times): a claim this old belongs to a run that is gone."""
    return dt.timedelta(seconds=10 * settings.platform_timeout_s + 60)


@dataclass
class PayRun:
    """What one `dynaloop ledger pay` run did: the lines it sent, every line's status after it,
    whether the batch is now paid, and what the researcher should do next."""

    batch_id: int
    platform: str
    sent: list[int] = field(default_factory=list)  # line numbers sent to the platform in this run
    statuses: dict[int, str | None] = field(default_factory=dict)
    marked_paid: bool = False
    advice: list[str] = field(default_factory=list)


def _pay_line(task: Task, batch: PayoutBatch, line: PayoutLine) -> PayLine:
    from services.platforms import PayLine

    return PayLine(
        worker_id=line.platform_worker_id,
        amount_minor=line.amount_minor,
        currency=batch.currency,
        reason=line_reason(task),
        unique_request_token=line.unique_request_token,
        assignment_id=line.assignment_id,
    )


def _check_payable(batch: PayoutBatch, pay_lines: list[PayLine]) -> None:
    """The platform clients' own checks, made before the batch is claimed, so that a batch they
    would refuse is refused with nothing written."""
    from services.platforms import check_lines, mturk, prolific

    check_lines(pay_lines, batch.currency)
    if batch.platform is Platform.mturk:
        if batch.currency != "USD":
            raise Invalid(f"MTurk pays in USD only; batch {batch.id} is in {batch.currency} (nothing was sent)")
        for line in pay_lines:
            if not mturk.MTURK_WORKER_RE.match(line.worker_id) or not (
                line.assignment_id and mturk.MTURK_ASSIGNMENT_RE.match(line.assignment_id)
            ):
                raise Invalid(
                    f"line {line.unique_request_token} has ids MTurk does not issue "
                    f"({line.worker_id!r}, {line.assignment_id!r}); nothing was sent"
                )
    else:
        for line in pay_lines:
            if not prolific.PROLIFIC_ID_RE.match(line.worker_id):
                raise Invalid(f"{line.worker_id!r} is not a Prolific participant id; nothing was sent")
        if len({line.worker_id for line in pay_lines}) != len(pay_lines):
            raise Invalid("a Prolific bulk bonus has one line per participant; this batch names one twice")


def _prolific_state(batch: PayoutBatch) -> tuple[str | None, BonusPayment]:
    from services.platforms.prolific import BonusPayment

    saved = dict((batch.platform_state or {}).get("prolific") or {})
    study_id = saved.pop("study_id", None)
    known = {f.name for f in dataclasses.fields(BonusPayment)}
    return study_id, BonusPayment(**{k: v for k, v in saved.items() if k in known})


def prolific_study_of(session: Session, batch: PayoutBatch, lines: list[PayoutLine], given: str | None) -> str:
    """The Prolific study a batch pays bonuses on: the one its run began with (kept in its
    state), else the study `dynaloop platform create-study` made for the link (audit log: the
    researcher's record), else the study its lines' participants came from (the ``STUDY_ID``
    each session recorded: sent by the worker's browser, so it never overrules the researcher's
    record, and a disagreement is refused), else ``given`` (``--study-id``). A ``given`` id of
    the wrong form, or that differs from what the batch's own records say, is refused: Prolific
    refuses ids outside the study."""
    from services.db.models import AuditEntry
    from services.platforms.prolific import PROLIFIC_ID_RE

    if given is not None and not PROLIFIC_ID_RE.match(given):
        raise Invalid(f"{given!r} is not a Prolific study id (24 lowercase hexadecimal characters)", field="study_id")
    started, _ = _prolific_state(batch)
    session_ids = [line.session_id for line in lines if line.session_id is not None]
    recorded = {
        study
        for study in session.scalars(select(StudySession.platform_study_id).where(StudySession.id.in_(session_ids)))
        if study
    }
    if len(recorded) > 1:
        raise Invalid(
            f"the participants of batch {batch.id} came from several Prolific studies ({', '.join(sorted(recorded))}); "
            "a bulk bonus pays one study's participants: pay this batch by hand"
        )
    created_study: str | None = None
    if started is None:
        created = session.scalars(
            select(AuditEntry)
            .where(
                AuditEntry.action == "platform.create_study",
                AuditEntry.target_type == "study_link",
                AuditEntry.target_id == str(batch.link_id),
            )
            .order_by(AuditEntry.id.desc())
        ).first()
        study = created.details.get("study_id") if created is not None else None
        created_study = study if isinstance(study, str) and PROLIFIC_ID_RE.match(study) else None
        if created_study is not None and recorded - {created_study}:
            raise Invalid(
                f"the participants of batch {batch.id} say they came from Prolific study "
                f"{', '.join(sorted(recorded))}, but the study made for study link {batch.link_id} is "
                f"{created_study}; nothing was sent: check the study on Prolific and pay this batch by hand"
            )
    known = started or created_study or (next(iter(recorded)) if recorded else None)
    if known is not None and given is not None and given != known:
        raise Invalid(
            f"batch {batch.id} pays participants of Prolific study {known}, not {given}; nothing was sent",
            field="study_id",
        )
    study_id = known or given
    if study_id is None or not PROLIFIC_ID_RE.match(study_id):
        raise Invalid(
            f"nothing records which Prolific study batch {batch.id} pays (no session recorded a STUDY_ID); "
            "pass the study's id (--study-id)",
            field="study_id",
        )
    return study_id


def _claim(session: Session, batch: PayoutBatch, run_id: str, settings: Settings, take_over: bool) -> None:
    """Take the batch for this run with one conditional UPDATE, committed before any request:
    of two runs at once, one finds the batch free and the other is refused (409) having sent
    nothing. A claim older than :func:`pay_run_stale_after` (a run that crashed) is taken over;
    ``take_over`` takes a younger one (the researcher knows that run is gone)."""
    now = utcnow()
    conditions = [PayoutBatch.id == batch.id, PayoutBatch.status == PayoutStatus.created]
    if not take_over:
        conditions.append(
            or_(PayoutBatch.pay_run_id.is_(None), PayoutBatch.pay_run_at < now - pay_run_stale_after(settings))
        )
    result = session.execute(
        update(PayoutBatch)
        .where(*conditions)
        .values(pay_run_id=run_id, pay_run_at=now)
        .execution_options(synchronize_session=False)
    )
    claimed = bool(getattr(result, "rowcount", 0))
    commit_now(session, "the claim on the batch is committed before any platform request: a second run sees it")
    session.refresh(batch)
    commit_now(session, "the claim is read back as committed")
    if claimed:
        return
    if batch.status is not PayoutStatus.created:
        raise Conflict(f"payout batch {batch.id} is {batch.status.value}; only a created batch is paid")
    raise Conflict(
        f"another `dynaloop ledger pay` run holds payout batch {batch.id} (since {batch.pay_run_at:%Y-%m-%d %H:%M:%S} "
        "UTC); nothing was sent. If that run crashed, run again once its claim lapses "
        f"({int(pay_run_stale_after(settings).total_seconds())} s after it was last renewed) or pass --take-over"
    )


def _renew(session: Session, batch: PayoutBatch, run_id: str) -> None:
    """Renew this run's claim before a request leaves, committed (no transaction stays open
    while the platform answers: on SQLite one would hold every writer). A claim another run took
    over, or a batch marked paid or cancelled meanwhile, stops this run before it sends more."""
    result = session.execute(
        update(PayoutBatch)
        .where(PayoutBatch.id == batch.id, PayoutBatch.pay_run_id == run_id, PayoutBatch.status == PayoutStatus.created)
        .values(pay_run_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    commit_now(session, "the renewed claim is committed before the next platform request")
    if not getattr(result, "rowcount", 0):
        raise Conflict(
            f"payout batch {batch.id} was taken over by another run, marked paid or cancelled while this run paid it; "
            "this run stopped (what it sent is recorded on its lines)"
        )


def _release(session: Session, batch: PayoutBatch, run_id: str) -> None:
    session.execute(
        update(PayoutBatch)
        .where(PayoutBatch.id == batch.id, PayoutBatch.pay_run_id == run_id)
        .values(pay_run_id=None, pay_run_at=None)
        .execution_options(synchronize_session=False)
    )


def _record_result(line: PayoutLine, result: LineResult) -> None:
    line.platform_status = result.status.value
    line.platform_reference = (result.platform_reference or "")[:200] or None
    line.platform_answer = result.platform_answer
    line.paid_at = utcnow() if result.status.value in PAID_STATUSES else None


def _finish(session: Session, actor: User | None, batch: PayoutBatch, lines: list[PayoutLine]) -> bool:
    """Mark the batch paid, through the same function as ``POST /payout-batches/{id}/paid``,
    when every line is paid or was paid before."""
    if batch.status is PayoutStatus.created and all(line.platform_status in PAID_STATUSES for line in lines):
        mark_paid(session, actor, batch, note="paid through the platform's API (dynaloop ledger pay)")
        return True
    return False


def _advice(batch: PayoutBatch, lines: list[PayoutLine], stopped_at: int | None) -> list[str]:
    failed = [line.line_number for line in lines if line.platform_status == "failed"]
    unknown = [line.line_number for line in lines if line.platform_status == "unknown"]
    unsent = [line.line_number for line in lines if line.platform_status is None]
    where = (
        "the study's bonuses on Prolific"
        if batch.platform is Platform.prolific
        else "the worker's bonuses on MTurk (list-bonus-payments for the HIT)"
    )
    advice = []
    if failed:
        advice.append(
            f"lines {_numbers(failed)} failed: {batch.platform.value} refused them and paid nothing (their answers: "
            f"`dynaloop ledger batch show {batch.id}`); fix what it said, then run `dynaloop ledger pay {batch.id}` "
            "again, which sends them again"
            + (" (the same set-up, never a second one)" if batch.platform is Platform.prolific else " (same tokens)")
        )
    if unknown:
        record = "--record-line all" if batch.platform is Platform.prolific else "--record-line N"
        advice.append(
            f"lines {_numbers(unknown)} have no clear answer and are never sent again by this command: check {where}, "
            f"then record what happened: `dynaloop ledger pay {batch.id} --task T {record} --as paid|failed`"
        )
    if stopped_at is not None and unsent:
        advice.append(
            f"the run stopped after line {stopped_at} (no clear answer from {batch.platform.value}); lines "
            f"{_numbers(unsent)} were not sent: run `dynaloop ledger pay {batch.id}` again to send them"
        )
    return advice


def _numbers(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:20]))
    return shown + (f" and {len(numbers) - 20} more" if len(numbers) > 20 else "")


def _send_mturk_lines(
    session: Session,
    batch: PayoutBatch,
    run_id: str,
    settings: Settings,
    run: PayRun,
    to_send: list[PayoutLine],
    pay_lines: list[PayLine],
    mturk_client: Any,
) -> int | None:
    """MTurk: one ``send_bonus`` per line with its token, each line's answer committed before the
    next line leaves. The number of the line without a clear answer, which stops the run; None
    when every line got one."""
    from services.platforms import LineStatus, paying

    for line, pay_line in zip(to_send, pay_lines, strict=True):
        _renew(session, batch, run_id)
        [result] = paying.pay_batch(
            settings, Platform.mturk, currency=batch.currency, lines=[pay_line], mturk_client=mturk_client
        )
        _record_result(line, result)
        commit_now(session, "each line's answer from the platform is kept even if the run dies after it")
        run.sent.append(line.line_number)
        if result.status is LineStatus.unknown:
            return line.line_number
    return None


def _send_prolific_lines(
    session: Session,
    batch: PayoutBatch,
    run_id: str,
    settings: Settings,
    run: PayRun,
    to_send: list[PayoutLine],
    pay_lines: list[PayLine],
    chosen_study: str,
) -> None:
    """Prolific: one bulk bonus on ``chosen_study``, where it stands committed before each next
    request, then the lines' answers committed together."""
    from services.platforms import LineStatus, paying

    _, state = _prolific_state(batch)

    def save(state: BonusPayment) -> None:
        _renew(session, batch, run_id)
        batch.platform_state = {"prolific": {"study_id": chosen_study, **dataclasses.asdict(state)}}
        commit_now(session, "the Prolific state is committed before the next request (no second set-up or pay)")

    before = dataclasses.asdict(state)
    results = paying.pay_batch(
        settings,
        Platform.prolific,
        currency=batch.currency,
        lines=pay_lines,
        prolific_study_id=chosen_study,
        prolific_state=state,
        save_prolific_state=save,
    )
    by_token = {result.unique_request_token: result for result in results}
    for line in to_send:
        _record_result(line, by_token[line.unique_request_token])
    commit_now(session, "the lines' answers from the platform are kept even if the run dies after them")
    if dataclasses.asdict(state) != before or any(r.status is not LineStatus.unknown for r in results):
        run.sent = [line.line_number for line in to_send]


def pay_batch_through_platform(
    session: Session,
    actor: User | None,
    batch: PayoutBatch,
    settings: Settings,
    *,
    study_id: str | None = None,
    take_over: bool = False,
) -> PayRun:
    """Pay a created batch through its platform's API (`dynaloop ledger pay`), committing as it
    goes so that a crash loses nothing that was sent:

    * Lines already paid (or paid before) are never sent; lines whose outcome is unknown are
      never sent again here (:func:`record_line_outcome`); lines not sent yet and lines the
      platform refused are sent.
    * MTurk: one ``send_bonus`` per line with its token, each line's answer committed before
      the next line leaves; a line without a clear answer stops the run.
    * Prolific: one bulk bonus on the batch's study (:func:`prolific_study_of`); where it
      stands (``platform_state``) is committed before each next request, so a second run pays
      the same set-up and never sends a pay twice.

    The run holds a claim on the batch (:func:`_claim`), so two runs never both call the
    platform. A batch whose every line ends paid is marked paid. Refusals (a batch not created,
    bad ids, a missing credential, a study id that is not the batch's) send and write nothing."""
    if batch.status is not PayoutStatus.created:
        raise Conflict(f"payout batch {batch.id} is {batch.status.value}; only a created batch is paid")
    if batch.platform not in EXPORT_PLATFORMS:
        raise Invalid(f"{batch.platform.value} has no payment API")
    task = batch.task
    lines = lines_of(session, batch)
    to_send = [line for line in lines if line.platform_status in (None, "failed")]
    pay_lines = [_pay_line(task, batch, line) for line in to_send]
    run = PayRun(batch_id=batch.id, platform=batch.platform.value)
    chosen_study: str | None = None
    mturk_client: Any = None
    if pay_lines:
        _check_payable(batch, pay_lines)
        if batch.platform is Platform.prolific:
            chosen_study = prolific_study_of(session, batch, lines, study_id)
            if settings.prolific_api_token is None:
                raise Invalid("DYNALOOP_PROLIFIC_API_TOKEN is not set: Prolific's API cannot be called")
        else:
            from services.platforms import mturk

            mturk_client = mturk.boto3_client(settings)
    run_id = uuid.uuid4().hex
    _claim(session, batch, run_id, settings, take_over)
    stopped_at: int | None = None
    try:
        if batch.platform is Platform.mturk:
            stopped_at = _send_mturk_lines(session, batch, run_id, settings, run, to_send, pay_lines, mturk_client)
        elif pay_lines:
            assert chosen_study is not None
            _send_prolific_lines(session, batch, run_id, settings, run, to_send, pay_lines, chosen_study)
        run.marked_paid = _finish(session, actor, batch, lines)
        commit_now(session, "the run's outcome and the batch's status are kept")
    finally:
        session.rollback()  # whatever a failure left half-done; every result was committed as it came
        _release(session, batch, run_id)
        audit.record(
            session,
            actor,
            "payout.pay",
            "payout_batch",
            batch.id,
            platform=batch.platform.value,
            study_id=chosen_study,
            sent=run.sent,
            statuses={str(line.line_number): line.platform_status for line in lines},
        )
        commit_now(session, "the run's audit record and the released claim are kept")
    session.refresh(batch)
    run.statuses = {line.line_number: line.platform_status for line in lines}
    run.advice = _advice(batch, lines, stopped_at)
    return run


def record_line_outcome(
    session: Session,
    actor: User | None,
    batch: PayoutBatch,
    line_number: int | None,
    outcome: str,
    settings: Settings,
    *,
    setup_id: str | None = None,
    reference: str | None = None,
) -> list[PayoutLine]:
    """Record what the platform shows for lines left ``unknown`` (checked there by the
    researcher), audited. MTurk: one line (``line_number``). Prolific: the whole batch
    (``line_number`` None: one bulk bonus pays all its lines): ``paid``, or ``failed`` (nothing
    was paid: the next run pays the same set-up again; for a set-up left without an answer,
    ``setup_id`` names the one Prolific shows, none: there is none and the next run sets one
    up). A batch whose every line is then paid is marked paid."""
    from services.platforms.prolific import BULK_BONUS_ID_RE

    if outcome not in RECORDABLE_OUTCOMES:
        raise Invalid(f"record a line as one of {list(RECORDABLE_OUTCOMES)}, not {outcome!r}", field="as")
    if reference is not None and not REFERENCE_RE.match(reference):
        raise Invalid("a reference is 1-200 letters, digits or '_:.-'", field="reference")
    if batch.status is not PayoutStatus.created:
        raise Conflict(f"payout batch {batch.id} is {batch.status.value}; only a created batch's lines are recorded")
    lines = lines_of(session, batch)
    state_values: dict[str, Any] | None = None
    if batch.platform is Platform.prolific:
        if line_number is not None:
            raise Invalid("a Prolific batch is one bulk bonus: record all its lines at once (--record-line all)")
        study, state = _prolific_state(batch)
        if not (state.pay_sent or state.setup_unknown):
            raise Conflict(f"no request of payout batch {batch.id} is without an answer: nothing to record")
        if setup_id is not None and (not state.setup_unknown or not BULK_BONUS_ID_RE.match(setup_id)):
            raise Invalid("--setup-id names the set-up Prolific shows for a set-up request that got no answer")
        if outcome == "failed":
            if state.setup_unknown:
                state.setup_unknown, state.setup_id = False, setup_id
            state.pay_sent = False
        chosen = lines
        reference = reference or state.setup_id
        state_values = {"prolific": {"study_id": study, **dataclasses.asdict(state)}}
    else:
        if line_number is None:
            raise Invalid("name the MTurk line to record (--record-line N): each line is its own bonus")
        if setup_id is not None:
            raise Invalid("--setup-id is for a Prolific batch")
        chosen = [line for line in lines if line.line_number == line_number]
        if not chosen:
            raise NotFound(f"payout batch {batch.id} has no line {line_number}")
        if chosen[0].platform_status != "unknown":
            raise Conflict(
                f"line {line_number} of payout batch {batch.id} is {chosen[0].platform_status or 'not sent'}; "
                "only a line without a clear answer is recorded by hand"
            )
    now = utcnow()
    values: dict[str, Any] = {"status": PayoutStatus.created}  # unchanged: the row is taken with the rest
    if state_values is not None:
        values["platform_state"] = state_values
    result = session.execute(
        update(PayoutBatch)
        .where(
            PayoutBatch.id == batch.id,
            PayoutBatch.status == PayoutStatus.created,
            or_(PayoutBatch.pay_run_id.is_(None), PayoutBatch.pay_run_at < now - pay_run_stale_after(settings)),
        )
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if not getattr(result, "rowcount", 0):
        raise Conflict(f"a `dynaloop ledger pay` run holds payout batch {batch.id}; record once it has finished")
    for line in chosen:
        line.platform_status = "paid" if outcome == "paid" else "failed"
        line.platform_reference = reference or line.platform_reference
        line.platform_answer = {"recorded_by_hand": outcome, "previous": line.platform_answer}
        line.paid_at = now if outcome == "paid" else None
    session.flush()
    session.refresh(batch)
    audit.record(
        session,
        actor,
        "payout.record_line",
        "payout_batch",
        batch.id,
        lines=[line.line_number for line in chosen],
        outcome=outcome,
        setup_id=setup_id,
        reference=reference,
    )
    _finish(session, actor, batch, lines)
    return chosen
