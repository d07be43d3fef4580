"""Rounds, their model in the loop, prompt sets and live statistics."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, joinedload, selectinload

from services.db.models import (
    Assignment,
    AssignmentStatus,
    Attempt,
    AttemptStatus,
    Example,
    ExampleOrigin,
    ExampleStatus,
    Prompt,
    PromptStrategy,
    Round,
    RoundBuild,
    RoundStatus,
    StudyLink,
    TargetLabelMode,
    Task,
    User,
    Validation,
    utcnow,
)
from services.domain import audit, study
from services.domain.model_servers import check_names
from services.errors import Conflict, Invalid, NotFound, missing_round
from services.structured_input import DEFAULT_MAX_INPUT_DEPTH, TooDeep, check_json_depth
from services.text import check_text, clean_text, normalize_text

_FORWARD = {
    RoundStatus.collecting: {RoundStatus.validating, RoundStatus.closed},
    RoundStatus.validating: {RoundStatus.closed},
    RoundStatus.closed: set(),
    RoundStatus.built: set(),
}
PROMPT_MAX_CHARS = 5000
ROUND_NOTES_MAX_CHARS = 5000


def create_round(
    session: Session,
    actor: User | None,
    task: Task,
    *,
    model_servers: list[str],
    prompt_strategy: PromptStrategy = PromptStrategy.unused_first,
    no_prompt_fraction: float = 0.0,
    target_label_mode: TargetLabelMode = TargetLabelMode.balanced,
    notes: str | None = None,
) -> Round:
    if not 0.0 <= no_prompt_fraction <= 1.0:
        raise Invalid(f"no_prompt_fraction must be between 0 and 1, got {no_prompt_fraction}")
    names = check_names(session, model_servers)
    # Lock the task row (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises) so two
    # concurrent requests cannot both find no open round and open rounds 1 and 2.
    session.execute(select(Task.id).where(Task.id == task.id).with_for_update())
    open_round = session.scalar(
        select(Round).where(
            Round.task_id == task.id,
            Round.status.in_([RoundStatus.collecting, RoundStatus.validating]),
        )
    )
    if open_round is not None:
        raise Conflict(
            f"round {open_round.number} of task {task.name!r} is still {open_round.status.value}; "
            "close it before opening the next"
        )
    number = (session.scalar(select(func.max(Round.number)).where(Round.task_id == task.id)) or 0) + 1
    round_ = Round(
        task_id=task.id,
        number=number,
        status=RoundStatus.collecting,
        model_servers=names,
        prompt_strategy=prompt_strategy,
        no_prompt_fraction=no_prompt_fraction,
        target_label_mode=target_label_mode,
        notes=clean_text(notes, field="notes", max_chars=ROUND_NOTES_MAX_CHARS) if notes else None,
        opened_at=utcnow(),
    )
    session.add(round_)
    session.flush()
    audit.record(session, actor, "round.create", "round", round_.id, task=task.name, number=number)
    return round_


def get_round(session: Session, round_id: int) -> Round:
    # With its task, in one statement: every caller reads the task (its definition, its policy).
    round_ = session.get(Round, round_id, options=[joinedload(Round.task)])
    if round_ is None:
        raise missing_round(round_id)
    return round_


def open_rounds(session: Session) -> list[Round]:
    return list(
        session.scalars(
            select(Round)
            # Each round is checked against its task's members (RoundPolicy.read): load the
            # tasks, and with them their members, in one query each rather than one per round.
            .options(selectinload(Round.task))
            .where(Round.status.in_([RoundStatus.collecting, RoundStatus.validating]))
            .order_by(Round.id)
        )
    )


def newest_build(session: Session, round_: Round) -> RoundBuild | None:
    """The round's most recent build, or None while it has never been built (the one exported,
    trained on, evaluated on and paid by: rebuilding adds a build, never changes one)."""
    return session.scalar(
        select(RoundBuild).where(RoundBuild.round_id == round_.id).order_by(RoundBuild.id.desc()).limit(1)
    )


def get_round_by_number(session: Session, task: Task, number: int) -> Round:
    round_ = session.scalar(select(Round).where(Round.task_id == task.id, Round.number == number))
    if round_ is None:
        raise NotFound(f"task {task.name!r} has no round {number}")
    return round_


@dataclass(frozen=True)
class StatusChange:
    """A round moved on, and the study links the move closed (closing the round closes them)."""

    round: Round
    study_links_closed: list[StudyLink] = field(default_factory=list)


def set_status(session: Session, actor: User | None, round_: Round, status: RoundStatus) -> StatusChange:
    """Move the round forward (``_FORWARD``). Closing it expires its active assignments and
    closes its open study links (:func:`services.domain.study.close_round_links`)."""
    if status == round_.status:
        return StatusChange(round_)
    if status not in _FORWARD[round_.status]:
        allowed = sorted(s.value for s in _FORWARD[round_.status]) or ["none"]
        raise Conflict(
            f"round {round_.number} is {round_.status.value} and cannot become {status.value}; "
            f"allowed next: {', '.join(allowed)}"
        )
    previous = round_.status
    round_.status = status
    now = utcnow()
    if status is RoundStatus.validating:
        round_.validating_at = now
    elif status is RoundStatus.closed:
        round_.closed_at = now
        # Assignments left open can no longer be used.
        for assignment in session.scalars(
            select(Assignment).where(Assignment.round_id == round_.id, Assignment.status == AssignmentStatus.active)
        ):
            assignment.status = AssignmentStatus.expired
            assignment.finished_at = now
    audit.record(session, actor, "round.status", "round", round_.id, **{"from": previous.value, "to": status.value})
    closed_links = study.close_round_links(session, actor, round_) if status is RoundStatus.closed else []
    return StatusChange(round_, closed_links)


def ensure_model_can_change(round_: Round) -> None:
    """A closed or built round's loop is history: :class:`Conflict`."""
    if round_.status in (RoundStatus.closed, RoundStatus.built):
        raise Conflict(f"round {round_.number} is {round_.status.value}; its model can no longer change")


def set_model_servers(session: Session, actor: User | None, round_: Round, names: list[str]) -> Round:
    """Put registered model servers (by name) in the round's loop; one is picked per attempt."""
    ensure_model_can_change(round_)
    round_.model_servers = check_names(session, names)
    audit.record(session, actor, "round.model", "round", round_.id, servers=round_.model_servers)
    return round_


def text_hash(text: str) -> str:
    return hashlib.sha256(normalize_text(text).encode("utf-8")).hexdigest()


@dataclass
class PromptImportReport:
    imported: int = 0
    duplicates_in_file: int = 0
    already_present: int = 0
    rows: int = 0
    errors: list[str] = field(default_factory=list)


def _rows_from_jsonl(text: str, max_depth: int) -> list[tuple[int, dict[str, Any] | str]]:
    rows: list[tuple[int, dict[str, Any] | str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            # Before json.loads, which recurses once per level (RecursionError past ~1000).
            check_json_depth(line, max_depth, what=f"line {number}")
        except TooDeep as exc:
            rows.append((number, exc.message))
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            rows.append((number, f"line {number}: not valid JSON ({exc.msg}); write one JSON object per line"))
            continue
        if not isinstance(value, dict):
            rows.append((number, f'line {number}: expected a JSON object with a "text" field'))
            continue
        rows.append((number, value))
    return rows


def _rows_from_csv(text: str) -> list[tuple[int, dict[str, Any] | str]]:
    # strict: an unterminated quote or stray text after a closing quote is an error, not a
    # prompt that silently swallows the rest of the file.
    reader = csv.DictReader(io.StringIO(text), strict=True)
    if reader.fieldnames is None or "text" not in reader.fieldnames:
        raise Invalid(
            f"the CSV has no `text` column (columns: {reader.fieldnames or []}); add a header row with a `text` column"
        )
    rows: list[tuple[int, dict[str, Any] | str]] = []
    try:
        for row in reader:
            if None in row:
                rows.append((reader.line_num, f"line {reader.line_num}: more fields than header columns"))
                continue
            rows.append((reader.line_num, dict(row)))
    except csv.Error as exc:
        raise Invalid(f"the CSV is malformed near line {reader.line_num}: {exc}") from exc
    return rows


def parse_prompt_file(
    content: bytes, file_format: str, max_rows: int, max_depth: int = DEFAULT_MAX_INPUT_DEPTH
) -> list[tuple[int, dict[str, Any] | str]]:
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Invalid(f"the prompt file is not UTF-8 (bad byte at offset {exc.start}); save it as UTF-8") from exc
    if file_format == "jsonl":
        rows = _rows_from_jsonl(text, max_depth)
    elif file_format == "csv":
        rows = _rows_from_csv(text)
    else:
        raise Invalid(f"unknown prompt file format {file_format!r}; use jsonl or csv")
    if not rows:
        raise Invalid("the prompt file has no rows; add at least one prompt")
    if len(rows) > max_rows:
        raise Invalid(f"the prompt file has {len(rows)} rows; the limit is {max_rows}, split it")
    return rows


def _checked_metadata(meta: dict[str, Any], line: int) -> dict[str, Any]:
    """``meta`` with every string in it (keys and values, at any depth) under the text policy
    (services/text.py); raises :class:`Invalid` naming the line and key. Walks without recursion."""
    checked: dict[str, Any] = {}
    stack: list[tuple[dict[str, Any] | list[Any], dict[str, Any] | list[Any], str]] = [(meta, checked, "")]
    while stack:
        source, target, path = stack.pop()
        entries = list(source.items()) if isinstance(source, dict) else list(enumerate(source))
        for key, value in entries:
            if isinstance(key, str):
                key = check_text(key, field=f"line {line}: a key of {path or 'the row'}", multiline=False)
            where = (f"{path}.{key}" if path else key) if isinstance(key, str) else f"{path}[{key}]"
            if isinstance(value, str):
                value = check_text(value, field=f"line {line}: {where}")
            elif isinstance(value, (dict, list)):
                copy: dict[str, Any] | list[Any] = {} if isinstance(value, dict) else [None] * len(value)
                stack.append((value, copy, where))
                value = copy
            if isinstance(target, dict):
                target[str(key)] = value
            else:
                target[int(key)] = value
    return checked


def import_prompts(
    session: Session,
    actor: User | None,
    round_: Round,
    content: bytes,
    file_format: str,
    *,
    max_rows: int = 200_000,
    max_depth: int = DEFAULT_MAX_INPUT_DEPTH,
) -> PromptImportReport:
    """Add prompts to a round's prompt set. All rows are checked first: one bad row and
    nothing is written (the report lists up to 50 problems with their line numbers).
    Prompts already in the round, or repeated in the file, are skipped and counted."""
    if round_.status in (RoundStatus.closed, RoundStatus.built):
        raise Conflict(f"round {round_.number} is {round_.status.value}; prompts can no longer be added")
    rows = parse_prompt_file(content, file_format, max_rows, max_depth)
    report = PromptImportReport(rows=len(rows))
    candidates: list[Prompt] = []
    seen: set[str] = set()
    for number, row in rows:
        if isinstance(row, str):
            report.errors.append(row)
            continue
        raw = row.get("text")
        if not isinstance(raw, str):
            report.errors.append(f"line {number}: `text` is missing or not a string")
            continue
        try:
            text = clean_text(raw, field=f"line {number}: text", max_chars=PROMPT_MAX_CHARS)
        except Invalid as exc:
            report.errors.append(exc.message)
            continue
        digest = text_hash(text)
        if digest in seen:
            report.duplicates_in_file += 1
            continue
        seen.add(digest)
        external_id = row.get("id", row.get("external_id"))
        source = row.get("source")
        try:
            # Metadata is shown to writers beside the prompt: the same text policy applies.
            meta = _checked_metadata(
                {k: v for k, v in row.items() if k not in {"text", "id", "external_id", "source"}}, number
            )
            source = check_text(str(source), field=f"line {number}: source", multiline=False) if source else None
            external_id = (
                check_text(str(external_id), field=f"line {number}: id", multiline=False) if external_id else None
            )
        except Invalid as exc:
            report.errors.append(exc.message)
            continue
        candidates.append(
            Prompt(
                round_id=round_.id,
                text=text,
                text_hash=digest,
                source=source[:200] if source else None,
                external_id=external_id[:200] if external_id else None,
                meta=meta,
            )
        )
    if report.errors:
        shown = report.errors[:50]
        more = len(report.errors) - len(shown)
        raise Invalid(
            f"{len(report.errors)} row(s) of the prompt file are invalid; nothing was imported. "
            "Fix them and upload again:\n" + "\n".join(shown) + (f"\n... and {more} more" if more else ""),
            errors=shown,
        )
    existing = set(session.scalars(select(Prompt.text_hash).where(Prompt.round_id == round_.id)))
    new = [p for p in candidates if p.text_hash not in existing]
    report.already_present = len(candidates) - len(new)
    session.add_all(new)
    session.flush()
    report.imported = len(new)
    audit.record(session, actor, "round.prompts", "round", round_.id, imported=report.imported, rows=report.rows)
    return report


def _awaiting_reannotation(session: Session, round_id: int) -> tuple[int, int]:
    """Examples re-queued for new validators (EthioEmo's re-annotation of disagreements) that
    still wait for their labels, and how many of them every validator who has labelled in
    this round has already labelled (with exactly as many validators as labels per example
    nobody new exists: they wait until new validators join, and a build excludes them as
    ``awaiting_reannotation``; docs/round_builder.md "Multi-label rounds")."""
    waiting = dict(
        session.execute(
            select(Example.id, Example.writer_id).where(
                Example.round_id == round_id,
                Example.status == ExampleStatus.validating,
                Example.requeue_count > 0,
            )
        ).all()
    )
    if not waiting:
        return 0, 0
    labelled: dict[int, set[int]] = {}
    validators: set[int] = set()
    for example_id, validator_id in session.execute(
        select(Validation.example_id, Validation.validator_id).join(Example).where(Example.round_id == round_id)
    ):
        validators.add(validator_id)
        labelled.setdefault(example_id, set()).add(validator_id)
    without_new = sum(
        1
        for example_id, writer_id in waiting.items()
        if not (validators - {writer_id} - labelled.get(example_id, set()))
    )
    return len(waiting), without_new


def _assignment_stats(session: Session, rid: int) -> dict[str, int]:
    """The round's assignments by status, the overdue ones counted as expired."""
    assignments = Counter(
        dict(
            session.execute(
                select(Assignment.status, func.count()).where(Assignment.round_id == rid).group_by(Assignment.status)
            ).all()
        )
    )
    # Overdue assignments are expired even before their writer comes back to find out.
    overdue = (
        session.scalar(
            select(func.count()).where(
                Assignment.round_id == rid,
                Assignment.status == AssignmentStatus.active,
                Assignment.expires_at <= utcnow(),
            )
        )
        or 0
    )
    assignments[AssignmentStatus.active] -= overdue
    assignments[AssignmentStatus.expired] += overdue
    return {s.value: assignments.get(s, 0) for s in AssignmentStatus}


def _attempt_stats(session: Session, rid: int) -> dict[str, Any]:
    """The round's scored attempts, those that fooled the model, and those the model was unavailable for."""
    attempt_rows = session.execute(
        select(Attempt.status, Attempt.fooled, func.count())
        .join(Assignment, Attempt.assignment_id == Assignment.id)
        .where(Assignment.round_id == rid)
        .group_by(Attempt.status, Attempt.fooled)
    ).all()
    scored = sum(n for status, _, n in attempt_rows if status is AttemptStatus.scored)
    fooled_attempts = sum(n for status, fooled, n in attempt_rows if status is AttemptStatus.scored and fooled)
    unavailable = sum(n for status, _, n in attempt_rows if status is AttemptStatus.model_unavailable)
    return {
        "scored": scored,
        "fooled": fooled_attempts,
        "model_unavailable": unavailable,
        "fooling_rate": fooled_attempts / scored if scored else None,
    }


def _confirmation_stats(session: Session, rid: int) -> dict[str, Any]:
    """The writers' answers, for attempts that fooled the model, to whether it really was fooled."""
    confirmations = Counter(
        dict(
            session.execute(
                select(Attempt.confirmed, func.count())
                .join(Assignment, Attempt.assignment_id == Assignment.id)
                .where(Assignment.round_id == rid, Attempt.fooled.is_(True), Attempt.confirmed.is_not(None))
                .group_by(Attempt.confirmed)
            ).all()
        )
    )
    return {
        "yes": confirmations.get(True, 0),
        "no": confirmations.get(False, 0),
        "rate": (confirmations.get(True, 0) / sum(confirmations.values())) if confirmations else None,
    }


def _example_stats(session: Session, rid: int, example_rows: Sequence[Any]) -> dict[str, Any]:
    """The round's examples: fooled, by condition, status and target label, and those awaiting re-annotation."""
    examples = sum(row[3] for row in example_rows)
    # Harvested examples have no target label (nobody wrote them for one).
    targets = Counter(
        "+".join(target)
        for (target,) in session.execute(select(Example.target_label).where(Example.round_id == rid))
        if target
    )
    awaiting, without_new = _awaiting_reannotation(session, rid)
    return {
        "submitted": examples,
        "fooled": sum(row[3] for row in example_rows if row[1]),
        "prompt": sum(row[3] for row in example_rows if row[2].value == "prompt"),
        "no_prompt": sum(row[3] for row in example_rows if row[2].value == "no_prompt"),
        **{s.value: sum(row[3] for row in example_rows if row[0] is s) for s in ExampleStatus},
        "by_target_label": dict(targets),
        "awaiting_reannotation": awaiting,
        "awaiting_reannotation_no_new_validator": without_new,
    }


def _validation_stats(session: Session, rid: int, example_rows: Sequence[Any]) -> dict[str, Any]:
    """The round's validations: all given, those counted, and the labels its examples need."""
    labels_given = sum(int(row[4] or 0) for row in example_rows)
    labels_needed = sum(int(row[5] or 0) for row in example_rows)
    validations_total = (
        session.scalar(select(func.count()).select_from(Validation).join(Example).where(Example.round_id == rid)) or 0
    )
    return {
        "given": validations_total,
        "counted": labels_given,
        "needed": labels_needed,
        "coverage": labels_given / labels_needed if labels_needed else None,
    }


def round_stats(session: Session, round_: Round) -> dict[str, Any]:
    """Live statistics a researcher watches while a round runs."""
    rid = round_.id
    assignments = _assignment_stats(session, rid)
    attempts = _attempt_stats(session, rid)
    # The round's examples by status, fooled and condition, with the labels they have and need.
    example_rows = session.execute(
        select(
            Example.status,
            Example.fooled,
            Example.condition,
            func.count(),
            func.sum(Example.validation_count),
            func.sum(Example.validations_needed),
        )
        .where(Example.round_id == rid)
        .group_by(Example.status, Example.fooled, Example.condition)
    ).all()
    confirmations = _confirmation_stats(session, rid)
    validations = _validation_stats(session, rid, example_rows)
    prompts_total = session.scalar(select(func.count()).where(Prompt.round_id == rid)) or 0
    prompts_used = session.scalar(select(func.count()).where(Prompt.round_id == rid, Prompt.times_used > 0)) or 0
    examples = _example_stats(session, rid, example_rows)
    origins = dict(
        session.execute(
            select(Example.origin, func.count()).where(Example.round_id == rid).group_by(Example.origin)
        ).all()
    )
    return {
        "round": round_.number,
        "status": round_.status.value,
        "assignments": assignments,
        "attempts": attempts,
        "confirmations": confirmations,
        "examples": examples,
        "validations": validations,
        "prompts": {"total": prompts_total, "used": prompts_used},
        "examples_by_origin": {origin.value: origins.get(origin, 0) for origin in ExampleOrigin},
    }
