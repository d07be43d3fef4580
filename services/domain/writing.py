"""The writer's flow (docs/design.md "One attempt, end to end"; DynaSent §4, App. C).

assignment (prompt + target label) -> attempts checked against the live model (at most
``tries_per_assignment``) -> confirmation of a fooling attempt -> submitted example, or skip.

The attempt is written *before* the model is called (status ``pending``) and updated after,
so accepted text is never lost; a model server that is down leaves it ``model_unavailable``
and consumes no try.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, Text, bindparam, cast, exists, func, inspect, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload, sessionmaker
from sqlalchemy.orm.attributes import set_committed_value

from services.authorization import AssignmentPolicy, authorize
from services.db.models import (
    Assignment,
    AssignmentStatus,
    Attempt,
    AttemptStatus,
    Condition,
    Example,
    ExampleStatus,
    Prompt,
    PromptStrategy,
    Round,
    RoundStatus,
    TargetLabelMode,
    User,
    utcnow,
)
from services.db.statements import (
    insert_persistent,
    object_by_id,
    rows_matched,
    table_of,
    update_by_id,
    update_loaded,
)
from services.db.transactions import commit_now
from services.domain import attention, duplicates, model_servers
from services.domain.in_flight import AttemptsInFlight
from services.domain.labels import check_target_label, is_fooled
from services.domain.model_servers import ServerAddress
from services.domain.quality import require_onboarded, require_qualified, task_worker
from services.domain.tasks import definition_of
from services.errors import Conflict, DuplicateText, Gone, Invalid, ModelBusy, ModelUnavailable, NotFound
from services.model_client import ModelAnswer, ModelClient, ModelServerError, ModelSlotsBusy, NoPrediction
from services.taskdef import TaskDefinition, TaskFamily, WriterFieldName
from services.text import clean_text, duplicate_hash, normalized_edit_distance

_rng = random.SystemRandom()
logger = logging.getLogger(__name__)

# The tables of the writer's hot writes and column reads, for Core statements (services/db/statements.py).
_assignments = table_of(Assignment).c
_attempts = table_of(Attempt).c
_prompts = table_of(Prompt).c
_examples = table_of(Example).c


# --- assignments -----------------------------------------------------------------------


def _expire_if_due(assignment: Assignment, now: dt.datetime) -> bool:
    if assignment.status is AssignmentStatus.active and assignment.expires_at <= now:
        assignment.status = AssignmentStatus.expired
        assignment.finished_at = now
        return True
    return False


def _pick_target(
    session: Session, round_: Round, definition: TaskDefinition, requested: str | list[str] | None
) -> list[str]:
    if requested is not None:
        return check_target_label(definition, requested)
    if round_.target_label_mode is TargetLabelMode.writer_choice:
        raise Invalid(f"this round lets writers choose the target label; send target_label, one of {definition.labels}")
    # Balanced: the label with the fewest assignments so far (ties broken at random).
    counts = Counter({label: 0 for label in definition.labels if label not in definition.exclusive_labels})
    for target, n in session.execute(assignments_per_target(round_.id)):
        labels = json.loads(target)
        if isinstance(labels, list) and len(labels) == 1 and labels[0] in counts:
            counts[labels[0]] += n
    fewest = min(counts.values())
    return [_rng.choice([label for label, n in counts.items() if n == fewest])]


def assignments_per_target(round_id: int) -> Select[str, int]:
    """The round's assignments counted per target label (as the stored JSON text), in SQL. The
    balanced pick read every assignment of the round instead, inside the transaction that holds
    SQLite's write lock: 2.4 ms at 800 assignments, and growing with the round
    (docs/benchmarks.md, "Load and faults")."""
    # JSON has no equality operator on PostgreSQL; its text has. Equal lists are written alike.
    target = cast(Assignment.target_label, Text)
    return select(target, func.count()).where(Assignment.round_id == round_id).group_by(target)


# Built once (services/db/statements.py): one more use of a prompt, if its count is still the one read.
_CLAIM_PROMPT = (
    update(table_of(Prompt))
    .where(_prompts.id == bindparam("prompt_id"), _prompts.times_used == bindparam("seen_times_used"))
    .values(times_used=_prompts.times_used + 1)
    .returning(_prompts.times_used)
)


# The candidates for a writer's next prompt, built once (services/db/statements.py): the round's
# prompts the writer has not had, in the order of the round's strategy, as (id, times_used) rows.
# Only the chosen one is loaded as an object: loading the 50 candidates (each with its metadata's
# JSON) cost more than the rest of the pick (docs/benchmarks.md, "API CPU per request").
_SEEN_BY_WRITER = select(_assignments.prompt_id).where(
    _assignments.round_id == bindparam("round_id"),
    _assignments.writer_id == bindparam("writer_id"),
    _assignments.prompt_id.is_not(None),
)
_UNSEEN_PROMPTS = select(_prompts.id, _prompts.times_used).where(
    _prompts.round_id == bindparam("round_id"), _prompts.id.not_in(_SEEN_BY_WRITER)
)
# Fewest fooling examples per use first; unused prompts count as never fooled.
_LEAST_FOOLED_FIRST = _UNSEEN_PROMPTS.order_by(
    func.coalesce(_prompts.times_fooled * 1.0 / func.nullif(_prompts.times_used, 0), 0.0),
    _prompts.times_used,
    _prompts.id,
).limit(50)
# unused_first and least_used share the order; unused_first differs only in intent (each prompt
# once, as DynaSent intended) and falls back to least used when all are used.
_LEAST_USED_FIRST = _UNSEEN_PROMPTS.order_by(_prompts.times_used, _prompts.id).limit(50)


def _pick_prompt(session: Session, round_: Round, writer: User) -> Prompt | None:
    """Choose a prompt by the round's strategy and count its use atomically."""
    least_fooled = round_.prompt_strategy is PromptStrategy.least_fooled
    candidates_of = _LEAST_FOOLED_FIRST if least_fooled else _LEAST_USED_FIRST
    for _ in range(5):
        candidates = session.execute(candidates_of, {"round_id": round_.id, "writer_id": writer.id}).all()
        if not candidates:
            return None
        fewest_uses = candidates[0].times_used
        pool = candidates[:10] if least_fooled else [c for c in candidates if c.times_used == fewest_uses]
        chosen = _rng.choice(pool)
        # Compare-and-set on times_used: two writers cannot both take the last unused prompt.
        claimed = session.execute(
            _CLAIM_PROMPT, {"prompt_id": chosen.id, "seen_times_used": chosen.times_used}
        ).scalar_one_or_none()
        if claimed is not None:
            prompt = session.get(Prompt, chosen.id)
            assert prompt is not None  # its row was updated in this transaction
            # The new count came back with the UPDATE (RETURNING): the object, if the session
            # already held it, has it too.
            set_committed_value(prompt, "times_used", claimed)
            return prompt
    raise Conflict("prompts are in heavy demand right now; retry in a moment")


def start_assignment(
    session: Session, writer: User, round_: Round, target_label: str | list[str] | None = None
) -> tuple[Assignment, bool]:
    """Give the writer their open assignment in the round, or a new one.

    Returns (assignment, created)."""
    task = round_.task
    definition = definition_of(task)
    if round_.status is not RoundStatus.collecting:
        raise Conflict(f"round {round_.number} of task {task.name!r} is {round_.status.value}, not collecting")
    worker = task_worker(session, task, writer)
    require_qualified(worker, task)
    require_onboarded(worker, task, definition)
    now = utcnow()
    if target_label is not None and round_.target_label_mode is TargetLabelMode.balanced:
        raise Invalid("this round assigns target labels to balance them; do not send target_label")
    current = session.scalar(
        select(Assignment).where(
            Assignment.round_id == round_.id,
            Assignment.writer_id == writer.id,
            Assignment.status == AssignmentStatus.active,
        )
    )
    if current is not None and not _expire_if_due(current, now):
        return current, False
    # Between assignments: an attention check, when one is pending or due (409 naming it).
    attention.require_no_check_due(session, task, writer)
    target = _pick_target(session, round_, definition, target_label)
    condition = Condition.no_prompt if _rng.random() < round_.no_prompt_fraction else Condition.prompt
    prompt = None
    if condition is Condition.prompt:
        prompt = _pick_prompt(session, round_, writer)
        if prompt is None:
            total = session.scalar(select(func.count()).where(Prompt.round_id == round_.id)) or 0
            if total == 0:
                raise Conflict(
                    f"round {round_.number} has no prompts yet; a researcher must import prompts "
                    "(POST /api/v1/rounds/{id}/prompts)"
                )
            raise Conflict(f"you have seen all {total} prompts of round {round_.number}; thank you!")
    assignment = Assignment(
        # Objects, not ids: the answer reads the round, the prompt and the (no) attempts of the
        # new assignment, and the session holds objects weakly (ids alone made each a query).
        round=round_,
        writer_id=writer.id,
        prompt=prompt,
        attempts=[],
        condition=condition,
        target_label=target,
        tries_used=0,
        tries_allowed=definition.tries_per_assignment,
        status=AssignmentStatus.active,
        started_at=now,
        expires_at=now + dt.timedelta(minutes=definition.assignment_timeout_minutes),
    )
    session.add(assignment)
    session.flush()
    return assignment, True


# What a writer's step reads with an assignment (get_assignment, get_attempt).
ASSIGNMENT_WITH_ROUND = (
    joinedload(Assignment.round).joinedload(Round.task),
    joinedload(Assignment.prompt),
)


# Built once (services/db/statements.py): ``Session.get`` with loader options builds its SELECT
# and that SELECT's cache key (the options' paths included) anew on every call.
_ASSIGNMENT = select(Assignment).options(*ASSIGNMENT_WITH_ROUND).where(Assignment.id == bindparam("assignment_id"))
_ATTEMPT = (
    select(Attempt)
    .options(joinedload(Attempt.assignment).options(*ASSIGNMENT_WITH_ROUND))
    .where(Attempt.id == bindparam("attempt_id"))
)


def get_assignment(session: Session, assignment_id: int) -> Assignment:
    """The assignment; whose it is, is for ``AssignmentPolicy.use`` (another writer's one is
    reported as missing, in the same words). Loaded with its round, the round's task and its
    prompt, which every writer's step reads, in one statement instead of four."""
    assignment = session.scalar(_ASSIGNMENT, {"assignment_id": assignment_id})
    if assignment is None:
        raise NotFound(f"no assignment {assignment_id} of yours")
    return assignment


def goal_of(assignment: Assignment) -> str:
    """The writer's goal in words, as on DynaSent's interface (App. C, Fig. 7)."""
    definition = definition_of(assignment.round.task)
    # People read display names (label_names); the API's label fields keep the labels themselves.
    target = " + ".join(definition.label_name(label) for label in assignment.target_label)
    others = [definition.label_name(label) for label in definition.labels if label not in assignment.target_label]
    where = "" if assignment.condition is Condition.no_prompt else " Edit the prompt to get there."
    if definition.is_multi_label:
        return f"Write a sentence expressing exactly {target} that the model labels differently.{where}"
    if definition.family is TaskFamily.target_dependent:
        return (
            f"Write a sentence that is {target} towards a target you mark in it, so that the model "
            f"predicts {' or '.join(others)} for that target.{where}"
        )
    return (
        f"Write a sentence a person would label {target} that fools the model into predicting "
        f"{' or '.join(others)}.{where}"
    )


def _require_active(assignment: Assignment, now: dt.datetime) -> None:
    if _expire_if_due(assignment, now):
        raise Gone(
            f"assignment {assignment.id} expired at {assignment.expires_at.isoformat()}; request a new assignment"
        )
    # The round first: closing a round expires its assignments, and "request a new
    # assignment" would be wrong advice there.
    if assignment.round.status is not RoundStatus.collecting:
        raise Conflict(f"round {assignment.round.number} is {assignment.round.status.value}, not collecting")
    if assignment.status is AssignmentStatus.expired:
        # Usually marked already (and committed) by the writer dependency; still 410, not 409.
        raise Gone(
            f"assignment {assignment.id} expired at {assignment.expires_at.isoformat()}; request a new assignment"
        )
    if assignment.status is not AssignmentStatus.active:
        raise Conflict(f"assignment {assignment.id} is {assignment.status.value}; request a new assignment")


def skip_assignment(assignment: Assignment) -> Assignment:
    if assignment.status is AssignmentStatus.skipped:
        return assignment
    _require_active(assignment, utcnow())
    assignment.status = AssignmentStatus.skipped
    assignment.finished_at = utcnow()
    return assignment


# --- attempts --------------------------------------------------------------------------


def _check_span(text: str, span: list[int] | None, definition: TaskDefinition) -> list[int] | None:
    if definition.family is not TaskFamily.target_dependent:
        if span is not None:
            raise Invalid(
                f"target_span only applies to target-dependent tasks; task {definition.name!r} is "
                f"{definition.family.value}, remove it"
            )
        return None
    if span is None:
        raise Invalid("target_span is required: give [start, end] character offsets of the target in the text")
    if len(span) != 2 or not all(isinstance(v, int) for v in span):
        raise Invalid("target_span must be two integers [start, end]")
    start, end = span
    if not 0 <= start < end <= len(text):
        raise Invalid(
            f"target_span [{start}, {end}] is outside the text (0..{len(text)}); mark the target inside the text"
        )
    if not text[start:end].strip():
        raise Invalid("target_span covers only white space; mark the target's words")
    return [start, end]


# Built once (services/db/statements.py): an attempt already made with this Idempotency-Key.
# Core (services/db/statements.py): a first try finds none, and the object is loaded only when
# there is one.
_ATTEMPT_BY_KEY = select(_attempts.id).where(
    _attempts.assignment_id == bindparam("assignment_id"), _attempts.idempotency_key == bindparam("key")
)


# Every column of a new attempt (insert_persistent writes them all): those a pending attempt
# does not have yet are None.
_ATTEMPT_COLUMNS = tuple(column.key for column in inspect(Attempt).column_attrs if column.key != "id")


def prepare_attempt(
    session: Session,
    writer: User,
    assignment_id: int,
    raw_text: str,
    target_span: list[int] | None,
    idempotency_key: str | None,
) -> tuple[Attempt, bool]:
    """Validate and record a pending attempt (first transaction of POST /attempts).

    Returns (attempt, needs_model). A retried request with the same Idempotency-Key gets the
    same attempt back: already scored -> no model call; pending/unavailable -> scored again.
    """
    assignment = get_assignment(session, assignment_id)
    # The attempt handler runs outside the request's unit of work, so it asks the policy here,
    # in its own first transaction.
    authorize(writer, AssignmentPolicy.use(assignment))
    definition = definition_of(assignment.round.task)
    now = utcnow()
    constraints = definition.constraints
    text = clean_text(
        raw_text, min_chars=constraints.min_chars, max_chars=constraints.max_chars, min_words=constraints.min_words
    )
    span = _check_span(text, target_span, definition)
    if idempotency_key is not None:
        existing = object_by_id(
            session, Attempt, _ATTEMPT_BY_KEY, {"assignment_id": assignment.id, "key": idempotency_key}
        )
        if existing is not None:
            if existing.text != text or existing.target_span != span:
                raise Conflict("this Idempotency-Key was already used for a different text; use a new key")
            if existing.status is AttemptStatus.scored:
                return existing, False
            _require_active(assignment, now)
            return existing, True
    _require_active(assignment, now)
    if assignment.tries_used >= assignment.tries_allowed:
        raise Conflict(
            f"all {assignment.tries_allowed} tries of this assignment are used; submit one of your "
            "attempts or switch to the next prompt"
        )
    # A text that is already an example of the task is refused before the model sees it:
    # nothing is stored, no try is used (services/domain/duplicates.py).
    _refuse_duplicate(session, assignment, text, span)
    prompt = assignment.prompt
    values: dict[str, Any] = dict.fromkeys(_ATTEMPT_COLUMNS)
    values.update(
        assignment_id=assignment.id,
        idempotency_key=idempotency_key,
        text=text,
        target_span=span,
        status=AttemptStatus.pending,
        counts_as_try=False,
        edit_distance=normalized_edit_distance(prompt.text, text) if prompt is not None else None,
        seconds_since_start=(now - assignment.started_at).total_seconds(),
        created_at=now,
    )
    try:
        attempt = insert_persistent(session, Attempt, values)
    except IntegrityError as exc:
        raise Conflict("a request with this Idempotency-Key is being processed; retry shortly") from exc
    # The assignment object, not only its id: the attempt keeps it (and its round) loaded for
    # the caller, which reads the round's model servers and records the model's answer with it.
    set_committed_value(attempt, "assignment", assignment)
    return attempt, True


def call_model(client: ModelClient, servers: list[ServerAddress], attempt: Attempt) -> ModelAnswer:
    """Ask one of the round's registered model servers (picked per attempt, docs/design.md
    "Domain model", Round) about the text. ``servers``: :func:`model_servers.addresses` of the
    round's ``model_servers``, read in the attempt's first transaction."""
    if not servers:
        return NoPrediction("no model is in the loop for this round; a researcher must set one", for_writer=True)
    endpoint = _rng.choice(servers).url
    target = None
    if attempt.target_span is not None:
        start, end = attempt.target_span
        target = attempt.text[start:end]
    try:
        return client.predict(endpoint, attempt.text, target)
    except ModelSlotsBusy as exc:
        return NoPrediction(str(exc), busy=True)
    except ModelServerError as exc:
        # A short reason, never the server's body (ModelServerError): the body is only logged.
        return NoPrediction(str(exc))


def _not_answering(retry_after_s: int) -> str:
    """What a writer is told when the model gave no usable answer: the same words whatever
    the model server said (its answer goes to the log and, as a short reason, to
    ``Attempt.model_error``)."""
    return (
        "the model is not answering right now; your text is saved and no try was used. "
        f"Retry in {retry_after_s} s with the same Idempotency-Key"
    )


# Built once (services/db/statements.py): one more try used, if one is left, and the new count.
_USE_A_TRY = (
    update(table_of(Assignment))
    .where(_assignments.id == bindparam("assignment_id"), _assignments.tries_used < _assignments.tries_allowed)
    .values(tries_used=_assignments.tries_used + 1)
    .returning(_assignments.tries_used)
)


# Built once (services/db/statements.py): the attempt's row lock and its status (PostgreSQL;
# SQLite's BEGIN IMMEDIATE already serialises), and its two outcomes, written as UPDATEs by id
# rather than through the unit of work (which sorts and diffs the session's objects for one row).
_LOCK_ATTEMPT = select(_attempts.status).where(_attempts.id == bindparam("attempt_id")).with_for_update()
_NOT_SCORED = update_by_id(Attempt, "attempt_id", "status", "model_error")
_SCORED = update_by_id(
    Attempt,
    "attempt_id",
    "status",
    "counts_as_try",
    "prediction",
    "probabilities",
    "model_id",
    "model_version",
    "model_precision",
    "model_endpoint",
    "latency_ms",
    "input_truncated",
    "model_error",
    "fooled",
    "scored_at",
)


def record_prediction(
    session: Session, attempt: Attempt, definition: TaskDefinition, prediction: ModelAnswer, retry_after_s: int
) -> Attempt:
    """Second transaction of POST /attempts: store what the model said, or that it was down.

    ``attempt``: the pending attempt as the first transaction left it, with its assignment
    (its target label and tries allowed, which a writer's step does not change); ``definition``:
    its task's. Neither is read again; the try count comes back with its UPDATE."""
    # Two retries with the same Idempotency-Key that both found the attempt pending must not
    # both consume a try: the row lock orders them and the second finds it scored.
    status = session.execute(_LOCK_ATTEMPT, {"attempt_id": attempt.id}).scalar_one_or_none()
    if status is None:
        raise NotFound(f"attempt {attempt.id} disappeared")
    if status is AttemptStatus.scored:
        # A concurrent retry with the same key scored it first: its answer, as stored.
        scored = session.get(Attempt, attempt.id)
        assert scored is not None  # the row is locked
        return scored
    assignment = attempt.assignment
    if isinstance(prediction, NoPrediction):
        unavailable = {"status": AttemptStatus.model_unavailable, "model_error": prediction.error[:500]}
        update_loaded(session, attempt, _NOT_SCORED, {"attempt_id": attempt.id}, unavailable)
        if prediction.busy:
            raise ModelBusy(
                "the model is busy with other writers' checks right now; your text is saved and no try was "
                f"used. Retry in {retry_after_s} s with the same Idempotency-Key",
                attempt_id=attempt.id,
                retry_after_s=retry_after_s,
            )
        if prediction.for_writer:
            message = f"{prediction.error}; your text is saved and no try was used"
        else:
            message = _not_answering(retry_after_s)
        raise ModelUnavailable(message, attempt_id=attempt.id, retry_after_s=retry_after_s)
    unknown = [label for label in prediction.labels if label not in definition.labels]
    if unknown:
        # The labels came from the model server: kept (bounded) for researchers, not shown to writers.
        error = f"the model predicted labels the task does not have: {unknown!r:.300}"
        update_loaded(
            session,
            attempt,
            _NOT_SCORED,
            {"attempt_id": attempt.id},
            {"status": AttemptStatus.model_unavailable, "model_error": error},
        )
        raise ModelUnavailable(
            f"the model in the loop gives answers that task {definition.name!r} cannot use; a researcher must "
            "fix the model in the loop. Your text is saved and no try was used",
            attempt_id=attempt.id,
            retry_after_s=retry_after_s,
        )
    # The new count comes back with the UPDATE (RETURNING: SQLite 3.35+, PostgreSQL), not from
    # a second read of the row; no row back means the condition failed (no try left).
    tries_used = session.execute(_USE_A_TRY, {"assignment_id": assignment.id}).scalar_one_or_none()
    consumed = tries_used is not None
    if consumed:
        set_committed_value(assignment, "tries_used", tries_used)
    update_loaded(
        session,
        attempt,
        _SCORED,
        {"attempt_id": attempt.id},
        {
            "status": AttemptStatus.scored,
            "counts_as_try": consumed,
            "prediction": list(prediction.labels),
            "probabilities": dict(prediction.probabilities),
            "model_id": prediction.model_id,
            "model_version": prediction.model_version,
            "model_precision": prediction.precision,
            "model_endpoint": prediction.endpoint,
            "latency_ms": prediction.latency_ms,
            "input_truncated": prediction.truncated,
            "model_error": None,
            "fooled": is_fooled(definition, assignment.target_label, list(prediction.labels)),
            "scored_at": utcnow(),
        },
    )
    if not consumed:
        raise Conflict(
            f"all {assignment.tries_allowed} tries of this assignment were used by other requests; "
            "submit one of your attempts or switch to the next prompt"
        )
    return attempt


def make_attempt(
    factory: sessionmaker[Session],
    client: ModelClient,
    writer: User,
    assignment_id: int,
    text: str,
    target_span: list[int] | None,
    idempotency_key: str | None,
    retry_after_s: int,
    in_flight: AttemptsInFlight,
) -> tuple[Attempt, bool]:
    """The whole attempt: record pending, call the model outside any transaction, record the result.

    The assignment's one in-flight slot (``in_flight``) is claimed in the first transaction,
    after the policy check: a second attempt while one is with the model is refused (429)
    and saves nothing. ``writer``: the user the request authenticated, as its token lookup
    read them (copied into this transaction's session without a query). Returns (attempt,
    replayed)."""
    writer_id = writer.id
    with ExitStack() as claimed:
        with factory.begin() as session:
            writer = session.merge(writer, load=False)
            attempt, needs_model = prepare_attempt(session, writer, assignment_id, text, target_span, idempotency_key)
            # Names resolve to URLs here, from the registry an admin keeps: nothing else is called.
            servers = model_servers.addresses(session, list(attempt.assignment.round.model_servers or []))
            definition = definition_of(attempt.assignment.round.task)
            if needs_model:
                claimed.enter_context(in_flight.claim(writer_id, assignment_id))
        if not needs_model:
            return attempt, True
        # No transaction is open while the model thinks (SQLite would hold its write lock).
        prediction = call_model(client, servers, attempt)
        session = factory()
        try:
            result = record_prediction(session, attempt, definition, prediction, retry_after_s)
            session.commit()
            return result, False
        except (ModelUnavailable, Conflict):
            # The attempt's new status (unavailable, or scored without a try) is kept.
            session.commit()
            raise
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()


def get_attempt(session: Session, attempt_id: int) -> Attempt:
    """The attempt; whose it is, is for ``AttemptPolicy.use``. With its assignment, round and
    task (one statement)."""
    attempt = session.scalar(_ATTEMPT, {"attempt_id": attempt_id})
    if attempt is None:
        raise NotFound(f"no attempt {attempt_id} of yours")
    return attempt


# Built once (services/db/statements.py): a writer's answer, written by the attempt's id.
_CONFIRM = update_by_id(Attempt, "attempt_id", "confirmed", "judged_label", "confirmed_at")
_CONFIRM_AGREED = update_by_id(Attempt, "attempt_id", "confirmed", "confirmed_at")


def confirm_attempt(session: Session, attempt: Attempt, agrees: bool, judged_label: str | list[str] | None) -> Attempt:
    """The writer's answer to "would a person say this is <target>?" for a fooling attempt."""
    assignment = attempt.assignment
    definition = definition_of(assignment.round.task)
    if attempt.status is not AttemptStatus.scored:
        raise Conflict(f"attempt {attempt.id} has no model prediction yet ({attempt.status.value}); retry it first")
    if not attempt.fooled:
        raise Conflict(f"attempt {attempt.id} did not fool the model; only fooling attempts are confirmed")
    judged = None
    if judged_label is not None:
        if agrees:
            raise Invalid("judged_label is only given when you answer no (you judge it otherwise)")
        judged = check_target_label(definition, judged_label)
    if attempt.confirmed is not None:
        if attempt.confirmed == agrees and (judged is None or judged == attempt.judged_label):
            return attempt
        raise Conflict(f"attempt {attempt.id} was already confirmed as {'yes' if attempt.confirmed else 'no'}")
    if assignment.status is not AssignmentStatus.active:
        raise Conflict(f"assignment {assignment.id} is {assignment.status.value}")
    # By id (update_loaded). ``judged_label`` is written only when the writer disagreed.
    answer: dict[str, Any] = {"confirmed": agrees, "confirmed_at": utcnow()}
    if judged is not None:
        answer["judged_label"] = judged
    statement = _CONFIRM if judged is not None else _CONFIRM_AGREED
    update_loaded(session, attempt, statement, {"attempt_id": attempt.id}, answer)
    return attempt


# --- examples --------------------------------------------------------------------------


def _check_extras(definition: TaskDefinition, extras: dict[str, Any], attempt: Attempt) -> dict[str, Any]:
    known = {f.name.value: f for f in definition.writer_fields}
    unknown = sorted(set(extras) - set(known))
    if unknown:
        raise Invalid(
            f"extra field(s) {unknown} are not part of task {definition.name!r}; allowed: {sorted(known) or 'none'}"
        )
    cleaned: dict[str, Any] = {}
    intended = extras.get(WriterFieldName.intended_label.value)
    for name, spec in known.items():
        value = extras.get(name)
        if name == WriterFieldName.target_span.value:
            # The span is marked on the attempt itself (the model saw it); submit may repeat it.
            if value is not None and (not isinstance(value, list) or value != attempt.target_span):
                raise Invalid(
                    "target_span differs from the span of the submitted attempt; send the same span or leave it out"
                )
            if attempt.target_span is not None:
                start, end = attempt.target_span
                cleaned[name] = {"start": start, "end": end, "text": attempt.text[start:end]}
            continue
        required = spec.required
        if spec.required_when_intended is not None:
            required = intended == spec.required_when_intended
        if value is None or (isinstance(value, str) and not value.strip()):
            if required:
                when = (
                    f" when the intended label is {spec.required_when_intended!r}"
                    if spec.required_when_intended
                    else ""
                )
                raise Invalid(f"{name} is required{when}; fill it in")
            continue
        if not isinstance(value, str):
            raise Invalid(f"{name} must be text")
        choices = definition.field_choices(spec)
        if choices is not None:
            if value not in choices:
                raise Invalid(f"{name} {value!r} is not allowed; choose one of {choices}")
            cleaned[name] = value
        else:
            cleaned[name] = clean_text(value, field=name, max_chars=spec.max_chars)
    if WriterFieldName.intended_label.value in cleaned:
        # iSarcasm: the intended label is the writer's own. It is the target they wrote for,
        # or the label they gave when they said "no, I judge it otherwise" at confirmation.
        own = attempt.judged_label if attempt.confirmed is False and attempt.judged_label else None
        expected = (own or attempt.assignment.target_label)[0]
        if cleaned[WriterFieldName.intended_label.value] != expected:
            why = "the label you gave at confirmation" if own else "this assignment's target label"
            raise Invalid(f"intended_label {intended!r} contradicts {why} ({expected!r}); send {expected!r}")
    return cleaned


# Built once (services/db/statements.py): one more confirmed fooling example from a prompt.
_COUNT_FOOLED = (
    update(table_of(Prompt)).where(_prompts.id == bindparam("prompt_id")).values(times_fooled=_prompts.times_fooled + 1)
)


# Core (services/db/statements.py): the assignment's example, if it has one (a first submission
# finds none; the object is loaded only when there is one).
_EXAMPLE_OF = select(_examples.id).where(_examples.assignment_id == bindparam("assignment_id"))


def _example_of(session: Session, assignment_id: int) -> Example | None:
    return object_by_id(session, Example, _EXAMPLE_OF, {"assignment_id": assignment_id})


def submit_example(
    session: Session, assignment: Assignment, attempt_id: int, extras: dict[str, Any], idempotency_key: str | None
) -> tuple[Example, bool]:
    """Submit one scored attempt as the assignment's example. Returns (example, created)."""
    assignment_id = assignment.id
    definition = definition_of(assignment.round.task)
    attempt = session.get(Attempt, attempt_id)
    if attempt is None or attempt.assignment_id != assignment.id:
        raise Invalid(f"attempt {attempt_id} does not belong to assignment {assignment.id}")
    existing = _example_of(session, assignment.id)
    if existing is not None:
        if existing.attempt_id == attempt.id:
            return existing, False
        raise Conflict(f"assignment {assignment.id} was already submitted with attempt {existing.attempt_id}")
    _require_active(assignment, utcnow())
    if attempt.status is not AttemptStatus.scored or not attempt.counts_as_try:
        raise Conflict(f"attempt {attempt.id} has no model prediction; check it with the model before submitting")
    if attempt.fooled and attempt.confirmed is None:
        raise Conflict(
            f"attempt {attempt.id} fooled the model; confirm first whether a person would say it is "
            f"{'/'.join(assignment.target_label)} (POST /api/v1/attempts/{attempt.id}/confirmation)"
        )
    cleaned = _check_extras(definition, extras, attempt)
    task = assignment.round.task
    # Again at submission: another writer may have submitted the same text since the attempt.
    try:
        _refuse_duplicate(session, assignment, attempt.text, attempt.target_span)
    except DuplicateText:
        # A copy of this request may have committed the example since ``existing`` was read
        # (PostgreSQL reads each statement afresh): its example is the answer, not a refusal.
        racing = _example_of(session, assignment.id)
        if racing is not None and racing.attempt_id == attempt.id:
            return racing, False
        raise
    example = Example(
        round_id=assignment.round_id,
        assignment_id=assignment.id,
        attempt_id=attempt.id,
        writer_id=assignment.writer_id,
        prompt_id=assignment.prompt_id,
        condition=assignment.condition,
        text=attempt.text,
        target_label=assignment.target_label,
        model_prediction=attempt.prediction,
        model_id=attempt.model_id,
        fooled=bool(attempt.fooled),
        extras=cleaned,
        status=ExampleStatus.validating,
        validation_count=0,
        validations_needed=definition.validations_per_example,
        requeue_count=0,
        idempotency_key=idempotency_key,
    )
    duplicates.normalize(example)
    session.add(example)
    assignment.status = AssignmentStatus.submitted
    assignment.finished_at = utcnow()
    if example.fooled and attempt.confirmed and assignment.prompt_id is not None:
        session.execute(_COUNT_FOOLED, {"prompt_id": assignment.prompt_id})
    try:
        session.flush()
    except IntegrityError as exc:
        # assignment_id, not assignment.id: the failed flush expired the object.
        raise Conflict(f"assignment {assignment_id} is being submitted by another request; retry") from exc
    # The task's one example of this text, or DuplicateText when a concurrent submission of the
    # same text got there first (the primary key of example_texts decides).
    duplicates.claim(session, task, example)
    return example, True


def _refuse_duplicate(session: Session, assignment: Assignment, text: str, span: list[int] | None) -> None:
    """Raise DuplicateText when ``text`` (with its target) is already an example of the
    assignment's task, or, with the task's ``near_duplicate_similarity``, too close to one."""
    task = assignment.round.task
    target = duplicates.target_of(text, span)
    duplicates.refuse_duplicate(session, task, duplicate_hash(text, target))
    duplicates.refuse_near_duplicate(session, task, definition_of(task), text, target)


# The writer's (``writer_id``) active assignments whose time ran out by ``now``; asked with every
# writer's request, so the statements are built once (services/db/statements.py).
_RAN_OUT = (
    _assignments.status == AssignmentStatus.active,
    # Not named after a column: an UPDATE reserves those names for its SET clause.
    _assignments.expires_at <= bindparam("due_now"),
)
_DUE_WHERE = (_assignments.writer_id == bindparam("due_writer_id"), *_RAN_OUT)
# Whether there is one, as a column of a query that reads the user: the API's token lookup asks
# it with every request (dynaloop/api/deps.py), so that a writer's takes no round trip of its own.
OVERDUE_ASSIGNMENT_OF_USER = (
    exists().where(_assignments.writer_id == table_of(User).c.id, *_RAN_OUT).label("has_overdue_assignment")
)
_EXPIRE_DUE = (
    update(table_of(Assignment))
    .where(*_DUE_WHERE)
    .values(status=AssignmentStatus.expired, finished_at=bindparam("due_now"))
)


def expire_due_assignments(session: Session, writer_id: int) -> int:
    """Mark the writer's assignments whose time ran out as expired (its own transaction, so
    the change survives an error the request may raise afterwards)."""
    return rows_matched(session, _EXPIRE_DUE, {"due_writer_id": writer_id, "due_now": utcnow()})


@dataclass(frozen=True)
class TokenScore:
    token: str
    score: float


@dataclass(frozen=True)
class Inspection:
    """Which words push the model towards ``label``: one signed score per token."""

    label: str
    tokens: list[TokenScore]


def _token_scores(tokens: list[dict[str, object]], server: str) -> list[TokenScore]:
    scores = []
    for item in tokens:
        token, score = (item.get("token"), item.get("score")) if isinstance(item, dict) else (None, None)
        if not isinstance(token, str) or isinstance(score, bool) or not isinstance(score, int | float):
            logger.warning("model server %s answered /inspect with tokens that are not token-score pairs", server)
            raise ModelUnavailable(
                "token attributions are unavailable right now (the model server answered with tokens that "
                "are not token-score pairs); nothing was counted, retry in 5 s",
                retry_after_s=5,
            )
        scores.append(TokenScore(token, float(score)))
    return scores


def inspect_text(
    session: Session,
    client: ModelClient,
    assignment: Assignment,
    raw_text: str,
    label: str | None,
    target_span: list[int] | None,
) -> Inspection:
    """Token attributions from the round's model for a draft (DynaSent's "Inspect" button).
    Nothing is stored and no try is used."""
    definition = definition_of(assignment.round.task)
    constraints = definition.constraints
    text = clean_text(raw_text, max_chars=constraints.max_chars)
    span = _check_span(text, target_span, definition)
    chosen = label or assignment.target_label[0]
    if chosen not in definition.labels:
        raise Invalid(f"label {chosen!r} is not a label of task {definition.name!r}; use one of {definition.labels}")
    servers = model_servers.addresses(session, list(assignment.round.model_servers or []))
    if not servers:
        raise ModelUnavailable("no model is in the loop for this round", retry_after_s=5)
    target = text[span[0] : span[1]] if span else None
    commit_now(session, "nothing is written; release SQLite's write lock while the model server works")
    try:
        tokens = client.inspect(servers[0].url, text, chosen, target)
    except ModelSlotsBusy as exc:
        raise ModelBusy(
            "the model is busy with other writers' checks right now; nothing was counted, retry in 5 s",
            retry_after_s=5,
        ) from exc
    except ModelServerError as exc:
        # A short reason that quotes nothing of the server's answer (services/model_client.py).
        raise ModelUnavailable(
            f"token attributions are unavailable right now ({exc}); nothing was counted, retry in 5 s",
            retry_after_s=5,
        ) from exc
    return Inspection(chosen, _token_scores(tokens, servers[0].name))
