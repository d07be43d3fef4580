"""Domain errors. Domain functions raise these; the API maps them to HTTP status codes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any


class DomainError(Exception):
    """Base class: ``message`` says what went wrong and what to do about it."""

    status_code = 400
    code = "invalid"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class Invalid(DomainError):
    status_code = 422
    code = "invalid"


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


# The 404s of a missing task, round, example and job. services/authorization.py answers the same
# words for one the caller may not see (another group's task): nobody learns that it exists.


def missing_task(name: str) -> NotFound:
    return NotFound(f"no task {name!r}; list tasks with GET /api/v1/tasks")


def missing_round(round_id: int) -> NotFound:
    return NotFound(f"no round with id {round_id}")


def missing_example(example_id: int) -> NotFound:
    return NotFound(f"no example {example_id}")


def missing_job(job_id: int) -> NotFound:
    return NotFound(f"there is no job {job_id}")


def missing_ledger_entry(entry_id: int) -> NotFound:
    return NotFound(
        f"no ledger entry {entry_id}; "
        "a worker's entries are listed by GET /api/v1/tasks/{task}/ledger/workers/{user_id}"
    )


def missing_payout_batch(batch_id: int) -> NotFound:
    return NotFound(
        f"no payout batch {batch_id}; a task's batches are listed by GET /api/v1/tasks/{{task}}/payout-batches"
    )


def missing_attention_check(check_id: int) -> NotFound:
    return NotFound(
        f"no attention check {check_id} of yours; list your pending checks with GET /api/v1/attention-checks/pending"
    )


class Conflict(DomainError):
    status_code = 409
    code = "conflict"


class Forbidden(DomainError):
    status_code = 403
    code = "forbidden"


class Unauthorized(DomainError):
    status_code = 401
    code = "unauthorized"


class Gone(DomainError):
    status_code = 410
    code = "gone"


class RateLimited(DomainError):
    """Too many requests from one token or one address; retry after ``retry_after_s``."""

    status_code = 429
    code = "rate_limited"


class ModelUnavailable(DomainError):
    """The model server did not answer; the client should retry after ``retry_after_s``."""

    status_code = 503
    code = "model_unavailable"


class ModelBusy(ModelUnavailable):
    """Every model-call slot of the API stayed taken (services/model_client.py): the model was
    not asked; the client should retry after ``retry_after_s``."""

    code = "model_busy"


class TooManyInFlight(RateLimited):
    """The writer already has a model check running on this assignment (or their most at
    once); nothing was saved, the client should retry after ``retry_after_s``."""

    code = "too_many_in_flight"


# --- pydantic validation errors as problems ---------------------------------------------------

# How a problem names the common kinds of pydantic error; other kinds keep pydantic's message.
PROBLEM_WORDING: Mapping[str, str] = {
    "missing": "is required",
    "extra_forbidden": "is not a known field; remove it",
}
# The API's request bodies also say what to do about text that is not Unicode.
REQUEST_PROBLEM_WORDING: Mapping[str, str] = {
    **PROBLEM_WORDING,
    "string_unicode": "is not valid Unicode text (it contains a lone surrogate such as \\ud800); "
    "send the text encoded as UTF-8",
}
# Errors about the whole input rather than one field: the problem is the sentence alone.
WHOLE_INPUT_PROBLEMS: Mapping[str, str] = {
    "json_invalid": "the body is not valid JSON (or not UTF-8); send a UTF-8 JSON object",
}


# Fields a request body once had (or that readers of older docs send) -> the field that does
# the job now: an unknown field with one of these names says which field to send instead.
RENAMED_FIELDS: Mapping[str, str] = {
    "model_endpoints": "model_servers (the names of registered model servers, GET /model-servers)",
}


def validation_problems(
    errors: Iterable[Mapping[str, Any]],
    prefix: str | None = None,
    *,
    wording: Mapping[str, str] = PROBLEM_WORDING,
    explain: Callable[[Mapping[str, Any]], str | None] | None = None,
) -> list[str]:
    """One human-readable line per pydantic error (``ValidationError.errors()``): ``location:
    what to fix``, the location's parts joined by dots after ``prefix`` (``params.epochs``).

    ``wording`` maps error kinds to their message (``{}``: pydantic's own messages); ``explain``
    may give an error a message of its own (None: the usual one).

    >>> validation_problems([{"type": "missing", "loc": ("model_id",), "msg": "Field required"}], "params")
    ['params.model_id: is required']
    """
    problems = []
    for error in errors:
        kind = str(error.get("type", ""))
        if kind in WHOLE_INPUT_PROBLEMS:
            problems.append(WHOLE_INPUT_PROBLEMS[kind])
            continue
        parts = ([prefix] if prefix else []) + [part for part in error.get("loc", ()) if part != "__root__"]
        location = ".".join(str(part) for part in parts)
        message = wording.get(kind) or (explain(error) if explain else None) or str(error.get("msg", "invalid"))
        field = str(parts[-1]) if parts else ""
        if kind == "extra_forbidden" and field in RENAMED_FIELDS:
            message = f"is not a known field; send {RENAMED_FIELDS[field]} instead"
        problems.append(f"{location}: {message}" if location else message)
    return problems


class StudyLinkClosed(Conflict):
    """A study link that is closed, not yet open, or on a round that no longer takes this work."""

    code = "study_link_closed"


class StudyLinkFull(Conflict):
    """A study link whose cap on workers is reached."""

    code = "study_link_full"


class TooManyNewWorkers(RateLimited):
    """A study link, or one client address, created its most new worker accounts this hour
    (DYNALOOP_STUDY_NEW_WORKERS_PER_LINK_PER_HOUR, ..._PER_ADDRESS_PER_HOUR); nothing was written."""

    code = "too_many_new_workers"


class StudySessionTaken(Conflict):
    """The worker already has a session of this round and role (through another link), or came
    through a link of the other role and this link does not take them."""

    code = "study_session_taken"


class DuplicateText(Conflict):
    """A text that is (after services.text.normalized_for_duplicates) already an example of the
    task, or too close to one (docs/design.md "Duplicates"); nothing was stored or counted."""

    code = "duplicate_text"


class TooLarge(DomainError):
    """Input that would take more than a configured bound to decode (an uploaded file)."""

    status_code = 413
    code = "too_large"


class PlatformError(DomainError):
    """A crowd platform's API (Prolific, MTurk; services/platforms/) refused a call, or could not
    be reached. The message names the call and the platform's answer, never a credential."""

    status_code = 502
    code = "platform_error"
