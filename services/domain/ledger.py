"""The pay ledger: what crowdworkers earned on a task, by the task's pay policy (its YAML's
``pay:`` block, services/taskdef.py :class:`~services.taskdef.PayPolicy`).

The ledger is append-only: :func:`compute_ledger` only adds rows and a correction
(:func:`add_correction`) is a new row pointing at the one it corrects; no row is ever updated or
deleted. Each rewarded event has one key, unique per task and kind (``ledger_entries``'s unique
constraint), so computing the ledger again, or twice at once, pays no event twice.

The rules (docs/round_builder.md, "Pay and the ledger"):

* **Base pay** (``session:<id>``): each *completed* study session gets the policy's base pay for
  its role. Stopped and screened-out sessions, and sessions still active, get none; a stopped
  session that earned its link's partial code gets the link's partial pay instead (the same
  ``session:<id>`` event, so a session is paid once), never base pay. A validator whose gold
  accuracy on the task is judged and below its threshold (they failed its control items) gets
  neither, even if their labels met the quota before enough control answers were in.
* **Writer bonus** (``example:<id>``): each written example that fooled the model *and* whose
  majority label equals the writer's target label (DynaSent's rule). The majority label is the
  newest build's gold label where the round has been built (and the example is in that build);
  otherwise the gold label of the example's counted validations (services.domain.labels). No
  majority, no bonus.
* **Validator bonus** (``batch:<round id>:<validator id>:<index>``): the labels of the accounts
  an import of crowd responses made (``User.made_by_import``) earn nothing here: those workers
  were paid, or not, where their responses were collected. All of a validator's
  validations in the round, in the order they were given, are cut into batches of the task's
  ``validation_batch_size``; each *whole* batch whose labels are all counted and in which the
  share of labels equal to their example's majority label is at least ``min_agreement`` earns
  ``per_batch``. A label on an example without a majority does not agree. Batches are cut from
  every validation, counted or not (validations are never deleted), so that a validator
  unqualified later keeps the same batch numbers: a batch paid once keeps its key and is never
  paid again under another.

Each row is computed under the version of the task's pay policy in force when its work was done
(services/domain/pay_policies.py) and names it (``pay_policy_version``): a completed or stopped
session's end for base and partial pay, the example's creation for the writer bonus, the batch's
last label for the validator bonus. A policy change therefore pays the work done after it at the
new rates; rows already in the ledger are never recomputed.

Amounts are integers in minor units of the policy's currency; no floating point touches money.
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, object_session

from services.db.models import (
    BuiltExample,
    Example,
    ExampleOrigin,
    ExampleText,
    LedgerEntry,
    LedgerKind,
    Platform,
    Round,
    StudyLink,
    StudyRole,
    StudySession,
    StudySessionStatus,
    Task,
    User,
    Validation,
    utcnow,
)
from services.domain import audit, controls, pay_policies, study
from services.domain.labels import agreement_with, gold_label, last_pass
from services.domain.round_lifecycle import newest_build
from services.domain.tasks import definition_of
from services.errors import Invalid, NotFound, missing_ledger_entry
from services.taskdef import MAX_PAY_MINOR, PayPolicy, TaskDefinition, currency_digits
from services.text import clean_text

BONUS_KINDS = (LedgerKind.writer_bonus, LedgerKind.validator_bonus)
ABANDONED_AFTER = dt.timedelta(hours=2)  # an active session not seen for this long counts as abandoned
MAX_CORRECTION_MINOR = 10 * MAX_PAY_MINOR  # one correction, either way
MAX_REASON_CHARS = 500
# The ids the platforms issue, as they document them: a Prolific participant id is 24 hexadecimal
# characters; an MTurk WorkerId matches ^A[A-Z0-9]+$ and an AssignmentId ^[A-Z0-9]+$, each at most
# 64 characters (the MTurk API reference). A bonus file carries only ids of these forms: a
# participant-chosen id such as "=HYPERLINK(..)" or "-1+1" is left out and named, never written
# into a cell a spreadsheet would evaluate, nor paid under a made-up id.
PLATFORM_WORKER_ID = {
    Platform.prolific: re.compile(r"[0-9a-fA-F]{24}"),
    Platform.mturk: re.compile(r"A[A-Z0-9]{1,63}"),
}
MTURK_ASSIGNMENT_ID = re.compile(r"[A-Z0-9]{1,64}")


def valid_platform_ids(platform: Platform, worker_id: str, assignment_id: str | None = None) -> bool:
    """Whether ``worker_id`` (and, for MTurk, ``assignment_id``) has the form the platform issues."""
    pattern = PLATFORM_WORKER_ID.get(platform)
    if pattern is None or not pattern.fullmatch(worker_id):
        return False
    return platform is not Platform.mturk or bool(assignment_id and MTURK_ASSIGNMENT_ID.fullmatch(assignment_id))


def pay_policy(task: Task) -> PayPolicy | None:
    """The task's pay policy in force now (its newest version, services/domain/pay_policies.py),
    or None when it never had one."""
    session = object_session(task)
    if session is None:  # a detached task: its YAML's block, the policy it was created with
        return definition_of(task).pay
    return pay_policies.current_policy(session, task)


def _no_policy(task: Task) -> Invalid:
    return Invalid(
        f"task {task.name!r} has no pay policy; set one (PUT /tasks/{task.name}/pay-policy, "
        f"`dynaloop task pay-policy {task.name} --file policy.yaml`, or the Crowd page)"
    )


def require_pay_policy(task: Task) -> PayPolicy:
    policy = pay_policy(task)
    if policy is None:
        raise _no_policy(task)
    return policy


def format_amount(amount_minor: int, currency: str) -> str:
    """``amount_minor`` in major units with the currency's minor digits, from integers only
    (150 GBP -> "1.50", -5 -> "-0.05", 7 JPY -> "7")."""
    digits = currency_digits(currency)
    sign = "-" if amount_minor < 0 else ""
    whole, part = divmod(abs(amount_minor), 10**digits)
    return f"{sign}{whole}.{part:0{digits}d}" if digits else f"{sign}{whole}"


# --- computing -------------------------------------------------------------------------------


@dataclass
class LedgerComputed:
    task: str
    currency: str
    rounds: list[int]  # round ids looked at
    added: list[LedgerEntry] = field(default_factory=list)
    already: int = 0  # events found already paid


@dataclass(frozen=True)
class _Candidate:
    kind: LedgerKind
    event_key: str
    user_id: int
    round_id: int | None
    session_id: int | None
    amount_minor: int
    reason: str
    pay_policy_version: int | None = None


def _add_once(session: Session, task: Task, currency: str, actor: User | None, candidate: _Candidate) -> bool:
    """Insert the row for one event unless the event is paid already; True when added.
    Check, then insert in a savepoint: a concurrent compute that inserted the same event first
    makes the unique constraint refuse ours, and only this savepoint is rolled back."""
    exists = session.scalar(
        select(LedgerEntry.id).where(
            LedgerEntry.task_id == task.id,
            LedgerEntry.kind == candidate.kind,
            LedgerEntry.event_key == candidate.event_key,
        )
    )
    if exists is not None:
        return False
    try:
        with session.begin_nested():
            session.add(
                LedgerEntry(
                    task_id=task.id,
                    round_id=candidate.round_id,
                    user_id=candidate.user_id,
                    session_id=candidate.session_id,
                    kind=candidate.kind,
                    event_key=candidate.event_key,
                    amount_minor=candidate.amount_minor,
                    currency=currency,
                    reason=candidate.reason,
                    pay_policy_version=candidate.pay_policy_version,
                    created_by_id=actor.id if actor else None,
                )
            )
    except IntegrityError:
        return False
    return True


def _sessions_of_round(session: Session, round_: Round) -> list[tuple[StudySession, StudyLink]]:
    rows = session.execute(
        select(StudySession, StudyLink)
        .join(StudyLink, StudySession.link_id == StudyLink.id)
        .where(StudyLink.round_id == round_.id)
        .order_by(StudySession.id)
    ).all()
    return [(row[0], row[1]) for row in rows]


def _session_for(
    sessions: Sequence[tuple[StudySession, StudyLink]], user_id: int, role: StudyRole, when: dt.datetime | None
) -> int | None:
    """The worker's study session of ``role`` in the round that the event belongs to: the latest
    one started at or before ``when`` (else their latest one); None for a worker who did not
    come through a study link."""
    own = [s for s, link in sessions if s.user_id == user_id and link.role is role]
    if not own:
        return None
    before = [s for s in own if when is None or s.started_at <= when]
    chosen = max(before or own, key=lambda s: (s.started_at, s.id))
    return chosen.id


def round_gold_labels(session: Session, definition: TaskDefinition, round_: Round) -> dict[int, list[str] | None]:
    """Each example of the round with its gold (majority) label: the newest build's gold label where the
    round is built and the example in that build, else the gold label of its counted validations
    (services.domain.labels.gold_label on the last annotation pass); None where there is none."""
    build = newest_build(session, round_)
    built: dict[int, list[str] | None] = {}
    if build is not None:
        for example_id, gold in session.execute(
            select(BuiltExample.example_id, BuiltExample.gold_label).where(BuiltExample.build_id == build.id)
        ):
            built[example_id] = list(gold) if gold else None
    passes: dict[int, list[int]] = defaultdict(list)
    responses: dict[int, list[list[str]]] = defaultdict(list)
    for example_id, label, annotation_pass in session.execute(
        select(Validation.example_id, Validation.label, Validation.annotation_pass)
        .join(Example, Example.id == Validation.example_id)
        .where(Example.round_id == round_.id, Validation.counted.is_(True))
        .order_by(Validation.id)
    ):
        passes[example_id].append(annotation_pass)
        responses[example_id].append(list(label))
    majority: dict[int, list[str] | None] = {}
    for example_id in session.scalars(select(Example.id).where(Example.round_id == round_.id)):
        if example_id in built:
            majority[example_id] = built[example_id]
        else:
            majority[example_id] = gold_label(definition, last_pass(passes[example_id], responses[example_id]))
    return majority


def _same_label(definition: TaskDefinition, a: Sequence[str], b: Sequence[str]) -> bool:
    return set(a) == set(b) if definition.is_multi_label else list(a)[:1] == list(b)[:1]


def _round_candidates(
    session: Session, task: Task, definition: TaskDefinition, policies: pay_policies.PolicyTimeline, round_: Round
) -> Iterable[_Candidate]:
    """The events of ``round_`` the task's policies pay, each with the amount of the version in
    force when its work was done (see the module's docstring)."""
    sessions = _sessions_of_round(session, round_)
    yield from _base_pay_candidates(session, task, policies, round_, sessions)
    majority = round_gold_labels(session, definition, round_)
    # Writer bonus: fooled the model and the majority label is the writer's target.
    if policies.any_writer_bonus:
        yield from _writer_bonus_candidates(session, definition, policies, round_, sessions, majority)
    # Validator bonus: whole batches whose agreement with the majority reaches min_agreement.
    if policies.any_validator_bonus:
        yield from _validator_bonus_candidates(session, definition, policies, round_, sessions, majority)


def _base_pay_candidates(
    session: Session,
    task: Task,
    policies: pay_policies.PolicyTimeline,
    round_: Round,
    sessions: Sequence[tuple[StudySession, StudyLink]],
) -> Iterable[_Candidate]:
    """Base pay of the round's study sessions: completed ones, and stopped ones that earned their
    link's partial pay."""
    # Recount active sessions first: one that met its quota is completed (and paid) even if its
    # worker never came back to finish it (services/domain/study.py refresh).
    for study_session, _ in sessions:
        study.refresh(session, study_session)
    # Base pay: completed sessions. A stopped session is paid only the link's partial pay, where
    # it earned the link's partial code (services/domain/study.py partial_pay_of); never base pay.
    # A validator who failed the task's control items (gold accuracy judged and below the
    # threshold) earns no base pay, even where their labels met the quota before enough control
    # answers were in to judge them: the labels that met it no longer count.
    failed = controls.failed_gold(
        session, task, [s.user_id for s, link in sessions if link.role is StudyRole.validator]
    )
    for study_session, link in sessions:
        if link.role is StudyRole.validator and study_session.user_id in failed:
            continue
        # The session's work ended when it ended (else when its worker was last seen).
        in_force = policies.at(study_session.ended_at or study_session.last_seen_at)
        if study_session.status is StudySessionStatus.stopped:
            partial = study.partial_pay_of(study_session)
            if partial:
                yield _Candidate(
                    LedgerKind.base_pay,
                    f"session:{study_session.id}",
                    study_session.user_id,
                    round_.id,
                    study_session.id,
                    partial,
                    f"partial pay: stopped {link.role.value} session {study_session.id} "
                    f"(study link {link.name!r}, round {round_.number})",
                    in_force.version,
                )
            continue
        if study_session.status is not StudySessionStatus.completed:
            continue
        base_pay = in_force.policy.base_pay
        amount = base_pay.writer if link.role is StudyRole.writer else base_pay.validator
        if amount > 0:
            yield _Candidate(
                LedgerKind.base_pay,
                f"session:{study_session.id}",
                study_session.user_id,
                round_.id,
                study_session.id,
                amount,
                f"base pay: completed {link.role.value} session {study_session.id} "
                f"(study link {link.name!r}, round {round_.number})",
                in_force.version,
            )


def _writer_bonus_candidates(
    session: Session,
    definition: TaskDefinition,
    policies: pay_policies.PolicyTimeline,
    round_: Round,
    sessions: Sequence[tuple[StudySession, StudyLink]],
    majority: dict[int, list[str] | None],
) -> Iterable[_Candidate]:
    """Writer bonus of the round's written examples that fooled the model and whose majority label
    is the writer's target."""
    for example in session.scalars(
        select(Example)
        .where(
            Example.round_id == round_.id,
            Example.origin == ExampleOrigin.written,
            Example.writer_id.is_not(None),
            Example.fooled.is_(True),
            # A repeat of a text that another example of the task holds (written before
            # repeats were refused, docs/design.md "Duplicates") earns no bonus of its own.
            ~select(ExampleText.example_id)
            .where(
                ExampleText.task_id == round_.task_id,
                ExampleText.normalized_hash == Example.normalized_hash,
                ExampleText.example_id != Example.id,
            )
            .exists(),
        )
        .order_by(Example.id)
    ):
        gold = majority.get(example.id)
        assert example.writer_id is not None
        if gold is None or not _same_label(definition, gold, example.target_label):
            continue
        written_under = policies.at(example.created_at)
        if written_under.policy.writer_bonus_per_example <= 0:
            continue
        yield _Candidate(
            LedgerKind.writer_bonus,
            f"example:{example.id}",
            example.writer_id,
            round_.id,
            _session_for(sessions, example.writer_id, StudyRole.writer, example.created_at),
            written_under.policy.writer_bonus_per_example,
            f"writer bonus: example {example.id} fooled the model and its majority label "
            f"{'/'.join(gold)} is the target (round {round_.number})",
            written_under.version,
        )


def _validator_bonus_candidates(
    session: Session,
    definition: TaskDefinition,
    policies: pay_policies.PolicyTimeline,
    round_: Round,
    sessions: Sequence[tuple[StudySession, StudyLink]],
    majority: dict[int, list[str] | None],
) -> Iterable[_Candidate]:
    """Validator bonus of whole batches of a validator's labels in the round whose agreement with
    the majority reaches the bonus's min_agreement."""
    size = definition.validation_batch_size
    by_validator: dict[int, list[tuple[int, list[str], dt.datetime, bool]]] = defaultdict(list)
    for validator_id, example_id, label, created_at, counted in session.execute(
        select(
            Validation.validator_id,
            Validation.example_id,
            Validation.label,
            Validation.created_at,
            Validation.counted,
        )
        .join(Example, Example.id == Validation.example_id)
        .join(User, User.id == Validation.validator_id)
        # An imported worker's labels were paid for (or not) where they were collected.
        .where(Example.round_id == round_.id, User.made_by_import.is_(False))
        .order_by(Validation.created_at, Validation.id)
    ):
        by_validator[validator_id].append((example_id, list(label), created_at, bool(counted)))
    for validator_id in sorted(by_validator):
        labels = by_validator[validator_id]
        for index in range(len(labels) // size):
            batch = labels[index * size : (index + 1) * size]
            if not all(counted for *_, counted in batch):
                continue  # a label that does not count (an unqualified validator's) earns nothing
            # The batch's work is done with its last label: the version in force then pays it.
            labelled_under = policies.at(batch[-1][2])
            bonus = labelled_under.policy.validator_bonus
            if bonus is None or bonus.per_batch <= 0:
                continue
            agreeing = 0
            for example_id, label, _, _ in batch:
                gold = majority.get(example_id)
                if gold is not None and agreement_with(definition, label, gold) == 1.0:
                    agreeing += 1
            # agreeing / size >= min_agreement, compared exactly (min_agreement as written).
            if Fraction(agreeing, size) < Fraction(str(bonus.min_agreement)):
                continue
            yield _Candidate(
                LedgerKind.validator_bonus,
                f"batch:{round_.id}:{validator_id}:{index}",
                validator_id,
                round_.id,
                _session_for(sessions, validator_id, StudyRole.validator, batch[-1][2]),
                bonus.per_batch,
                f"validator bonus: batch {index + 1} of round {round_.number}, "
                f"{agreeing} of {size} labels agree with the majority",
                labelled_under.version,
            )


def compute_ledger(session: Session, actor: User | None, task: Task, round_: Round | None = None) -> LedgerComputed:
    """Add the rows the task's pay policy gives for ``round_`` (every round of the task when
    None) that are not in the ledger yet, in the caller's transaction. Only adds: an event paid
    before is skipped (``already``), even if the policy changed since. Stopped and screened-out
    study sessions get no base pay; each row is paid under the version of the pay policy in force
    when its work was done and names it; see the module's docstring for every rule."""
    policies = pay_policies.timeline(session, task)
    if policies is None:
        raise _no_policy(task)
    definition = definition_of(task)
    if round_ is not None and round_.task_id != task.id:
        raise NotFound(f"no round with id {round_.id}")
    rounds = [round_] if round_ is not None else list(session.scalars(select(Round).where(Round.task_id == task.id)))
    result = LedgerComputed(task=task.name, currency=policies.currency, rounds=[r.id for r in rounds])
    for each in sorted(rounds, key=lambda r: r.id):
        for candidate in list(_round_candidates(session, task, definition, policies, each)):
            if _add_once(session, task, policies.currency, actor, candidate):
                result.added.append(
                    session.scalars(
                        select(LedgerEntry).where(
                            LedgerEntry.task_id == task.id,
                            LedgerEntry.kind == candidate.kind,
                            LedgerEntry.event_key == candidate.event_key,
                        )
                    ).one()
                )
            else:
                result.already += 1
    if result.added:
        audit.record(
            session,
            actor,
            "ledger.compute",
            "task",
            task.id,
            rounds=result.rounds,
            added=len(result.added),
            amount_minor=sum(e.amount_minor for e in result.added),
        )
    return result


# --- corrections -------------------------------------------------------------------------------


def get_entry(session: Session, entry_id: int) -> LedgerEntry:
    entry = session.get(LedgerEntry, entry_id)
    if entry is None:
        raise missing_ledger_entry(entry_id)
    return entry


def add_correction(
    session: Session, actor: User | None, entry: LedgerEntry, amount_minor: int, reason: str
) -> LedgerEntry:
    """A new ``correction`` row that changes ``entry`` by ``amount_minor`` (negative takes pay
    back); ``entry`` itself is never edited. Its event is ``correction:<entry id>:<n>``, n
    counting the entry's corrections from 1. A correction of a correction is refused: correct
    the original row again."""
    if isinstance(amount_minor, bool) or not isinstance(amount_minor, int):
        raise Invalid("amount_minor must be a whole number of minor units (e.g. 150 for 1.50)")
    if amount_minor == 0 or abs(amount_minor) > MAX_CORRECTION_MINOR:
        raise Invalid(f"amount_minor must be non-zero and at most {MAX_CORRECTION_MINOR} either way")
    if not reason.strip():
        raise Invalid(f"reason must say why, in 1-{MAX_REASON_CHARS} characters", field="reason")
    # The text policy of every other entry point (services/text.py): control characters and bidi
    # overrides or isolates are refused, joiners inside a word (Devanagari, Persian) kept; then one line.
    reason = " ".join(clean_text(reason, field="reason", max_chars=MAX_REASON_CHARS).split())
    if entry.kind is LedgerKind.correction:
        raise Invalid(
            f"ledger entry {entry.id} is itself a correction; correct the entry it corrects ({entry.corrects_id})"
        )
    task = session.get(Task, entry.task_id)
    assert task is not None
    for _ in range(5):
        count = len(
            session.scalars(
                select(LedgerEntry.id).where(
                    LedgerEntry.task_id == entry.task_id,
                    LedgerEntry.kind == LedgerKind.correction,
                    LedgerEntry.corrects_id == entry.id,
                )
            ).all()
        )
        candidate = _Candidate(
            LedgerKind.correction,
            f"correction:{entry.id}:{count + 1}",
            entry.user_id,
            entry.round_id,
            entry.session_id,
            amount_minor,
            reason,
        )
        row = LedgerEntry(
            task_id=entry.task_id,
            round_id=entry.round_id,
            user_id=entry.user_id,
            session_id=entry.session_id,
            kind=LedgerKind.correction,
            event_key=candidate.event_key,
            amount_minor=amount_minor,
            currency=entry.currency,
            reason=reason,
            corrects_id=entry.id,
            created_by_id=actor.id if actor else None,
        )
        try:
            with session.begin_nested():
                session.add(row)
        except IntegrityError:
            continue  # a concurrent correction took this number: count again
        audit.record(
            session, actor, "ledger.correct", "ledger_entry", entry.id, correction=row.id, amount_minor=amount_minor
        )
        return row
    raise Invalid(f"ledger entry {entry.id} is being corrected by someone else right now; try again")


# --- reading -----------------------------------------------------------------------------------


def _kind_of(entry: LedgerEntry, originals: dict[int, LedgerKind]) -> LedgerKind:
    """The kind an entry counts as: a correction as the kind of the row it corrects."""
    if entry.kind is LedgerKind.correction and entry.corrects_id is not None:
        return originals.get(entry.corrects_id, LedgerKind.correction)
    return entry.kind


def _entries(session: Session, task: Task, *, user_id: int | None = None) -> list[LedgerEntry]:
    query = select(LedgerEntry).where(LedgerEntry.task_id == task.id)
    if user_id is not None:
        query = query.where(LedgerEntry.user_id == user_id)
    return list(session.scalars(query.order_by(LedgerEntry.id)))


@dataclass(frozen=True)
class WorkerTotals:
    user_id: int
    username: str
    base_pay: int
    writer_bonus: int
    validator_bonus: int
    corrections: int  # sum of the correction rows (also counted in the kinds they correct above)
    total: int


@dataclass(frozen=True)
class LedgerTotals:
    task: str
    currency: str | None
    workers: list[WorkerTotals]
    total: int


def ledger_totals(session: Session, task: Task) -> LedgerTotals:
    """Per worker: base pay, writer and validator bonuses (each with its corrections) and total."""
    entries = _entries(session, task)
    originals = {e.id: e.kind for e in entries}
    sums: dict[int, dict[LedgerKind, int]] = defaultdict(lambda: defaultdict(int))
    corrections: dict[int, int] = defaultdict(int)
    for entry in entries:
        sums[entry.user_id][_kind_of(entry, originals)] += entry.amount_minor
        if entry.kind is LedgerKind.correction:
            corrections[entry.user_id] += entry.amount_minor
    names = dict(session.execute(select(User.id, User.username).where(User.id.in_(list(sums)))).all())
    workers = [
        WorkerTotals(
            user_id=user_id,
            username=names.get(user_id, str(user_id)),
            base_pay=kinds[LedgerKind.base_pay],
            writer_bonus=kinds[LedgerKind.writer_bonus],
            validator_bonus=kinds[LedgerKind.validator_bonus],
            corrections=corrections[user_id],
            total=sum(kinds.values()),
        )
        for user_id, kinds in sorted(sums.items(), key=lambda item: names.get(item[0], ""))
    ]
    policy = pay_policy(task)
    currency = entries[0].currency if entries else (policy.currency if policy else None)
    return LedgerTotals(task=task.name, currency=currency, workers=workers, total=sum(w.total for w in workers))


@dataclass(frozen=True)
class WorkerStatement:
    task: str
    user_id: int
    username: str
    currency: str | None
    entries: list[LedgerEntry]
    totals: WorkerTotals


def worker_statement(session: Session, task: Task, user_id: int) -> WorkerStatement:
    """Every ledger row of one worker on the task, oldest first, with their totals. A worker with
    no rows on the task answers 404 (as a missing one)."""
    entries = _entries(session, task, user_id=user_id)
    if not entries:
        raise NotFound(f"no ledger entries for user {user_id} on task {task.name!r}")
    totals = next(w for w in ledger_totals(session, task).workers if w.user_id == user_id)
    return WorkerStatement(
        task=task.name,
        user_id=user_id,
        username=totals.username,
        currency=entries[0].currency,
        entries=entries,
        totals=totals,
    )


# --- the researcher's view ----------------------------------------------------------------------


@dataclass(frozen=True)
class LinkReport:
    link_id: int
    name: str
    round_id: int
    role: str
    platform: str
    sessions: dict[str, int]  # started, completed, screened_out, stopped, active, abandoned
    median_minutes: float | None
    base_pay: int
    bonuses: int
    corrections: int
    effective_hourly_minor: int | None


@dataclass(frozen=True)
class WorkerHourly:
    """One worker's effective hourly pay on the task: their ledger total (every row, corrections
    included) over the active time of their study sessions on the task's links."""

    user_id: int
    username: str
    platforms: list[str]  # the platforms of their sessions' links
    sessions: int
    active_seconds: int
    earned_minor: int
    effective_hourly_minor: int | None  # None: no active time to divide by
    platform_minimum_minor: int | None  # the highest published minimum of their platforms, in the currency
    policy_floor_minor: int | None  # the pay policy's min_hourly_minor
    below_minimum: bool
    warning: str | None


@dataclass(frozen=True)
class CrowdReport:
    task: str
    currency: str | None
    links: list[LinkReport]
    workers: list[WorkerHourly] = field(default_factory=list)


def _round_half_up(value: Fraction) -> int:
    return int((value + Fraction(1, 2)).__floor__())


def crowd_report(session: Session, task: Task, *, now: dt.datetime | None = None) -> CrowdReport:
    """Per study link of the task: its sessions by status (``abandoned``: active and not seen
    for 2 hours), the median length in minutes of its completed sessions, the ledger totals of
    its sessions' rows, and the effective hourly pay: the median, over its completed sessions,
    of (base pay + bonuses, with corrections, of that session's worker in the link's round) per
    hour of that session's length, in minor units per hour rounded half-up; None where no
    completed session has a length."""
    now = now or utcnow()
    links = list(session.scalars(select(StudyLink).where(StudyLink.task_id == task.id).order_by(StudyLink.id)))
    entries = _entries(session, task)
    originals = {e.id: e.kind for e in entries}
    by_session: dict[int, list[LedgerEntry]] = defaultdict(list)
    by_user_round: dict[tuple[int, int | None], int] = defaultdict(int)
    for entry in entries:
        if entry.session_id is not None:
            by_session[entry.session_id].append(entry)
        by_user_round[(entry.user_id, entry.round_id)] += entry.amount_minor
    reports = []
    for link in links:
        sessions = list(session.scalars(select(StudySession).where(StudySession.link_id == link.id)))
        counts = {"started": len(sessions), "abandoned": 0}
        for status in StudySessionStatus:
            counts[status.value] = sum(1 for s in sessions if s.status is status)
        counts["abandoned"] = sum(
            1 for s in sessions if s.status is StudySessionStatus.active and now - s.last_seen_at > ABANDONED_AFTER
        )
        minutes: list[Fraction] = []
        rates: list[Fraction] = []
        for s in sessions:
            if s.status is not StudySessionStatus.completed or s.ended_at is None:
                continue
            length = s.ended_at - s.started_at
            micros = (length.days * 86_400 + length.seconds) * 1_000_000 + length.microseconds
            if micros <= 0:
                continue
            minutes.append(Fraction(micros, 60_000_000))
            earned = by_user_round[(s.user_id, link.round_id)]
            rates.append(Fraction(earned * 3_600_000_000, micros))
        base = bonuses = corrections = 0
        for s in sessions:
            for entry in by_session[s.id]:
                if entry.kind is LedgerKind.correction:
                    corrections += entry.amount_minor
                elif entry.kind is LedgerKind.base_pay:
                    base += entry.amount_minor
                elif _kind_of(entry, originals) in BONUS_KINDS:
                    bonuses += entry.amount_minor
        reports.append(
            LinkReport(
                link_id=link.id,
                name=link.name,
                round_id=link.round_id,
                role=link.role.value,
                platform=link.platform.value,
                sessions=counts,
                median_minutes=round(float(statistics.median(minutes)), 2) if minutes else None,
                base_pay=base,
                bonuses=bonuses,
                corrections=corrections,
                effective_hourly_minor=_round_half_up(statistics.median(rates)) if rates else None,
            )
        )
    policy = pay_policy(task)
    currency = entries[0].currency if entries else (policy.currency if policy else None)
    workers = _workers_hourly(session, links, entries, currency, policy, now)
    return CrowdReport(task=task.name, currency=currency, links=reports, workers=workers)


def _micros(length: dt.timedelta) -> int:
    return (length.days * 86_400 + length.seconds) * 1_000_000 + length.microseconds


def _workers_hourly(
    session: Session,
    links: list[StudyLink],
    entries: list[LedgerEntry],
    currency: str | None,
    policy: PayPolicy | None,
    now: dt.datetime,
) -> list[WorkerHourly]:
    """Each worker who came through a study link of the task: ledger total per hour of their
    sessions' active time (started_at to ended_at, else to last_seen_at), in minor units per hour
    rounded half-up (Fraction math, no float), and whether it is below the published minimum of
    their links' platforms (services/domain/pay_policies.py) or the policy's own floor."""
    platform_of = {link.id: link.platform for link in links}
    if not platform_of:
        return []
    active: dict[int, int] = defaultdict(int)
    counts: dict[int, int] = defaultdict(int)
    platforms: dict[int, set[Platform]] = defaultdict(set)
    for study_session in session.scalars(
        select(StudySession).where(StudySession.link_id.in_(list(platform_of))).order_by(StudySession.id)
    ):
        end = study_session.ended_at or study_session.last_seen_at or now
        active[study_session.user_id] += max(_micros(end - study_session.started_at), 0)
        counts[study_session.user_id] += 1
        platforms[study_session.user_id].add(platform_of[study_session.link_id])
    earned: dict[int, int] = defaultdict(int)
    for entry in entries:
        earned[entry.user_id] += entry.amount_minor
    names = dict(session.execute(select(User.id, User.username).where(User.id.in_(list(counts)))).all())
    floor = policy.min_hourly_minor if policy is not None else None
    rows = []
    for user_id in sorted(counts, key=lambda uid: (names.get(uid, ""), uid)):
        micros = active[user_id]
        hourly = _round_half_up(Fraction(earned[user_id] * 3_600_000_000, micros)) if micros > 0 else None
        minimums = [
            minimum
            for platform in platforms[user_id]
            if currency is not None
            and (minimum := pay_policies.platform_minimum_hourly(platform, currency)) is not None
        ]
        platform_minimum = max(minimums) if minimums else None
        warnings = []
        if hourly is not None and currency is not None:
            if platform_minimum is not None and hourly < platform_minimum:
                warnings.append(
                    f"{format_amount(hourly, currency)}/h is below the platform's published minimum of "
                    f"{format_amount(platform_minimum, currency)}/h"
                )
            if floor is not None and hourly < floor:
                warnings.append(
                    f"{format_amount(hourly, currency)}/h is below the pay policy's floor of "
                    f"{format_amount(floor, currency)}/h"
                )
        rows.append(
            WorkerHourly(
                user_id=user_id,
                username=names.get(user_id, str(user_id)),
                platforms=sorted(p.value for p in platforms[user_id]),
                sessions=counts[user_id],
                active_seconds=micros // 1_000_000,
                earned_minor=earned[user_id],
                effective_hourly_minor=hourly,
                platform_minimum_minor=platform_minimum,
                policy_floor_minor=floor,
                below_minimum=bool(warnings),
                warning="; ".join(warnings) or None,
            )
        )
    return rows


def summary(computed: LedgerComputed) -> dict[str, Any]:
    """What a build's response and the CLI say about a compute."""
    return {
        "currency": computed.currency,
        "entries_added": len(computed.added),
        "amount_added_minor": sum(e.amount_minor for e in computed.added),
        "already_paid": computed.already,
    }
