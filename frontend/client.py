"""The front end's only way to the backend: a small client for the dynaloop REST API.

One method per endpoint the pages use (docs/api.md has the flows). Every method returns the
API's JSON (lists are unwrapped from their ``{"data": [...], "count": n}`` envelope) and
raises :class:`ApiError` with the API's own message on any error, so a page can show
``error.message`` as it is.

Writes that the API can deduplicate always carry an ``Idempotency-Key``. When the caller
gives none, the key is derived from the request's content (for an attempt: the assignment,
the text and the target span), so a click that is retried after a dropped connection, a
double click, or a retry after a 503 never uses a second try or stores a second label.

The pages depend on :class:`Api`, a :class:`~typing.Protocol` with the methods they call,
not on :class:`ApiClient` itself; the ``TypedDict`` classes below describe the JSON each
method returns (the API's response schemas in docs/api.md, written out here because the
front end imports nothing from the backend; tests/test_frontend_types.py checks them against
the API's OpenAPI document).

Example::

    client = ApiClient("http://127.0.0.1:8000")
    client.login("writer", "writer-demo-only")
    round_ = client.open_rounds()[0]
    assignment = client.start_assignment(round_["id"])
    attempt = client.attempt(assignment["id"], "The host did a great job of making me feel unwanted.")
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
from typing import Any, ClassVar, NotRequired, Protocol, TypedDict
from urllib.parse import quote

import httpx

API_PREFIX = "/api/v1"
# The web app names the browser's address to the API with the key both share (dynaloop/api/ratelimit.py),
# so that each browser, not the web app as a whole, has its rate limit and login-failure count.
WEB_APP_KEY_ENV = "DYNALOOP_WEB_APP_KEY"
CLIENT_ADDRESS_HEADER = "X-Dynaloop-Client-Address"
WEB_APP_KEY_HEADER = "X-Dynaloop-Web-App-Key"
# Every request carries an id of its own, which the API keeps (its access log and the model
# server's lines of the same request carry it) and sends back; an error of the API's shows it
# to the user as a reference and the web app logs it (docs/deploy.md, "Logs and metrics").
REQUEST_ID_HEADER = "X-Request-ID"

logger = logging.getLogger(__name__)
# An attempt waits for the model server (10 s timeout, 2 retries with backoff, by default).
DEFAULT_TIMEOUT_S = 60.0

JSON = dict[str, Any]
Label = str | list[str]  # one label, or several for multi-label tasks

# --- what the API answers (datetimes are ISO 8601 strings) --------------------------------


class User(TypedDict):
    id: int
    username: str
    display_name: str | None
    roles: list[str]
    is_active: bool


class Login(TypedDict):
    token: str
    user: User


class TokenInfo(TypedDict):
    """``GET /me/token``: the token of the request (never its plain value)."""

    id: int
    name: str
    prefix: str
    token: str | None
    expires_at: str | None


class TextConstraints(TypedDict):
    min_chars: int
    max_chars: int
    min_words: int


class WriterField(TypedDict):
    """An extra field writers fill in (``writer_fields`` of the task's YAML: services/taskdef.py)."""

    name: str
    required: bool
    max_chars: int
    choices: list[str] | None
    required_when_intended: str | None


class QuizQuestion(TypedDict):
    text: str
    options: list[str]


class OnboardingQuiz(TypedDict):
    max_attempts: int
    questions: list[QuizQuestion]  # without the answers


class TaskDefinition(TypedDict):
    """The task's YAML as the API checked it (services/taskdef.py; docs/design.md, "Task"), every field
    filled in."""

    name: str
    title: str
    validator_title: NotRequired[str | None]  # absent in tasks created before it existed
    family: str  # single_label, binary_variety, intended_sarcasm, multi_label, target_dependent
    description: str
    labels: list[str]
    validation_labels: list[str] | None
    label_collapse: dict[str, str] | None
    unknown_label: str | None
    exclusive_labels: list[str]
    language: str
    domain: str | None
    licence: str | None
    constraints: TextConstraints
    tries_per_assignment: int
    validations_per_example: int
    validation_batch_size: int
    assignment_timeout_minutes: int
    agreement: dict[str, Any]
    writer_fields: list[WriterField]
    instructions: str
    validator_instructions: str
    onboarding_quiz: OnboardingQuiz | None
    label_names: dict[str, str]  # display names as written in the YAML (Task.label_names has them all)
    positive_label: str | None  # two-label tasks: the class whose F1 evaluation reports
    training: dict[str, Any]  # training defaults, e.g. {"class_weights": "balanced"}


class Task(TypedDict):
    id: int
    name: str
    title: str
    family: str
    definition: TaskDefinition
    label_names: dict[str, str]  # every label (validation labels too) -> the name people see
    created_at: str
    warnings: list[str]  # empty except on creation (e.g. the tokenizer coverage warning)


class Round(TypedDict):
    id: int
    task: str
    number: int
    status: str  # collecting, validating, closed, built
    model_servers: list[str] | None  # registered server names; None unless you manage the task
    prompt_strategy: str
    no_prompt_fraction: float
    target_label_mode: str  # balanced, writer_choice
    opened_at: str | None
    validating_at: str | None
    closed_at: str | None
    # The round's study links that still take workers; None unless you manage the task.
    open_study_links: int | None
    # In the answer to closing the round: how many open study links the closing closed.
    study_links_closed: int | None


class PromptImport(TypedDict):
    rows: int
    imported: int
    duplicates_in_file: int
    already_present: int


class QuizStatus(TypedDict):
    required: bool
    passed: bool
    attempts_used: int
    attempts_left: int
    questions: list[QuizQuestion]


class QuizResult(TypedDict):
    passed: bool
    attempts_used: int
    attempts_left: int


class AttentionCheck(TypedDict):
    """An attention check served to the writer (never its expected answer)."""

    id: int
    task: str
    question: str
    options: list[str]
    served_at: str
    answered_at: str | None
    answer: str | None


class AttentionCheckResult(AttentionCheck):
    passed: bool
    qualified: bool


class Prompt(TypedDict):
    id: int
    text: str
    metadata: dict[str, Any]


class Attempt(TypedDict):
    id: int
    assignment_id: int
    text: str
    status: str  # pending, scored, model_unavailable
    prediction: list[str] | None
    probabilities: dict[str, float] | None
    model_id: str | None
    model_version: str | None
    latency_ms: float | None
    input_truncated: bool | None
    edit_distance: float | None
    seconds_since_start: float
    fooled: bool | None
    counts_as_try: bool
    confirmed: bool | None
    judged_label: list[str] | None
    target_span: list[int] | None
    created_at: str


class Assignment(TypedDict):
    id: int
    round_id: int
    task: str
    condition: str  # prompt, no_prompt
    prompt: Prompt | None
    target_label: list[str]
    label_names: dict[str, str]  # each task label -> the name people see
    goal: str  # the writer's goal in words (plain text, with display names)
    tries_used: int
    tries_allowed: int
    status: str  # active, submitted, skipped, expired
    started_at: str
    expires_at: str
    attempts: list[Attempt]


class Example(TypedDict):
    id: int
    round_id: int
    assignment_id: int | None
    attempt_id: int | None
    text: str
    target_label: list[str]
    condition: str
    fooled: bool
    extras: dict[str, Any]
    status: str
    created_at: str


class TokenScore(TypedDict):
    token: str
    score: float


class Inspection(TypedDict):
    label: str
    tokens: list[TokenScore]


class TargetSpan(TypedDict):
    start: int
    end: int
    text: str


class BatchItem(TypedDict):
    item_id: str  # opaque, of this serving: the same for an example and a control item
    text: str
    target_span: TargetSpan | None


class ValidationBatch(TypedDict):
    round_id: int
    task: str
    validation_labels: list[str]
    label_names: dict[str, str]  # each validation label -> the name validators see
    multi_label: bool
    data: list[BatchItem]
    count: int


class Validation(TypedDict):
    """A label given to a batch item (POST /validation-items/{item_id}/validations)."""

    item_id: str
    label: list[str]
    flagged: bool
    created_at: str


class AttemptStats(TypedDict):
    scored: int
    fooled: int
    model_unavailable: int
    fooling_rate: float | None


class ConfirmationStats(TypedDict):
    yes: int
    no: int
    rate: float | None


class ExampleStats(TypedDict):
    submitted: int
    fooled: int
    prompt: int
    no_prompt: int
    validating: int
    validated: int
    dropped: int
    # Multi-label re-annotation (docs/round_builder.md, "Multi-label rounds"): re-queued examples
    # still waiting, and those no validator of the round can take (all labelled them already).
    awaiting_reannotation: int
    awaiting_reannotation_no_new_validator: int
    by_target_label: dict[str, int]


class ValidationStats(TypedDict):
    given: int
    counted: int
    needed: int
    coverage: float | None


class PromptStats(TypedDict):
    total: int
    used: int


class RoundStats(TypedDict):
    round: int
    status: str
    assignments: dict[str, int]
    attempts: AttemptStats
    confirmations: ConfirmationStats
    examples: ExampleStats
    validations: ValidationStats
    prompts: PromptStats
    examples_by_origin: dict[str, int]


class WorkerAgreement(TypedDict):
    username: str
    labels: int
    judged: int
    agreement_rate: float | None
    qualified: bool
    control_answers: int  # answers to the round's control (gold) items
    gold_accuracy: float | None  # share of them right; None without answers


class PlotExample(TypedDict):
    example_id: int
    condition: str
    origin: str
    edit_distance: float | None
    chars: int
    words: int
    target: str | None
    prediction: str | None
    majority: str | None
    validated: bool
    fooled: bool
    validations: int


class PlotData(TypedDict):
    round_id: int
    round: int
    task: str
    labels: list[str]
    validation_labels: list[str]
    multi_label: bool
    total_examples: int
    truncated: bool
    examples: list[PlotExample]
    worker_agreement: list[WorkerAgreement]


class Build(TypedDict):
    build_id: int
    round: int
    task: str
    report: dict[str, Any]  # counts, agreement, human F1, datasheet (docs/round_builder.md)


class Job(TypedDict):
    id: int
    kind: str  # train, evaluate, promote
    task: str
    status: str  # queued, running, succeeded, failed, cancelled
    queue: str  # cpu or gpu: the workers that may run it
    worker: str | None  # the worker that took it
    progress: float  # 0 to 1
    message: str
    params: dict[str, Any]
    result: dict[str, Any] | None
    log: str | None  # the newest lines from job(); null from jobs()
    created_by: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None


class ModelServer(TypedDict):
    """A model server an admin registered (its admin token is never shown)."""

    name: str
    url: str
    description: str | None
    has_admin_token: bool
    created_by: str | None
    created_at: str
    updated_at: str


class Model(TypedDict):
    id: int
    name: str
    model_id: str
    version: str
    status: str  # trained, evaluated, promoted, retired
    trained_for_round: int | None
    base_model: str
    directory: str
    endpoint: str | None
    labels: list[Any]  # the task's labels; the API's schema leaves the items untyped
    attempts: int
    best_dev_macro_f1: float | None
    macro_f1: dict[str, Any]  # macro-F1 per set; the API's schema leaves the values untyped
    solved: dict[str, Any]
    hyperparameters: dict[str, Any]
    created_at: str
    evaluated_at: str | None
    promoted_at: str | None
    retired_at: str | None


# --- crowd platforms: study links, study sessions, the ledger -----------------------------


class StudyLink(TypedDict):
    """A study link a researcher made for a round and a role (``path`` + ``query_template``,
    after the web app's own address, is what the platform's study points at)."""

    id: int
    slug: str
    name: str
    task: str
    round_id: int
    role: str  # writer, validator
    platform: str  # prolific, mturk, generic
    quota: int
    max_workers: int | None
    id_parameter: str | None
    completion_code: str
    screened_out_code: str | None
    partial_code: str | None
    partial_pay_minor: int | None
    other_role_allowed: bool
    when_out_of_work: str  # complete, partial, return
    opens_at: str | None
    closes_at: str | None
    closed_at: str | None
    created_at: str
    path: str
    query_template: str
    is_open: bool


class CompletionForm(TypedDict):
    action: str
    fields: dict[str, str]


class Completion(TypedDict):
    """How a study session ends on its platform: a redirect (Prolific), a form post back
    (MTurk), or a code (generic); ``code`` and the rest are None where there is none."""

    status: str  # completed, screened_out, stopped
    code: str | None
    redirect_url: str | None
    form: CompletionForm | None
    message: str  # for the worker, e.g. "thank you: your work is recorded"


class StudySession(TypedDict):
    """A worker's own study session (``GET /me/study-sessions``)."""

    id: int
    link_id: int
    task: str
    round_id: int
    role: str
    platform: str
    quota: int
    units_done: int
    status: str  # active, completed, screened_out, stopped
    started_at: str
    ended_at: str | None
    completion: Completion | None


class LinkSession(TypedDict):
    """A study session as the link's researcher sees it."""

    id: int
    user_id: int
    username: str
    status: str
    units_done: int
    started_at: str
    last_seen_at: str
    ended_at: str | None
    platform_worker_id: str | None


class StudyStart(TypedDict):
    """``POST /study/{slug}/sessions``: a preview (MTurk before accepting: ``token``,
    ``expires_at`` and ``session`` are null), or a started or resumed session with the worker's
    token."""

    preview: bool
    token: str | None
    expires_at: str | None
    session: StudySession | None
    task: dict[str, Any]  # name, title, description
    link: dict[str, Any]  # name, role, platform, quota


class Api(Protocol):
    """What the pages need of an API client: the methods they call, with the JSON they get
    back. :class:`ApiClient` is the implementation; every method raises :class:`ApiError`."""

    token: str | None
    #: How many writes (requests other than GET) this client has sent and how many errors it
    #: has met: an answer cached before either changed may be out of date
    #: (frontend/state.py: session_cached).
    writes: int
    errors: int

    def login(self, username: str, password: str) -> Login: ...
    def me(self) -> User: ...

    def tasks(self) -> list[Task]: ...
    def task(self, name: str) -> Task: ...
    def rounds(self, task: str) -> list[Round]: ...
    def open_rounds(self) -> list[Round]: ...

    def quiz(self, task: str) -> QuizStatus: ...
    def answer_quiz(self, task: str, answers: list[str]) -> QuizResult: ...
    def start_assignment(self, round_id: int, target_label: Label | None = None) -> Assignment: ...
    def pending_attention_checks(self) -> list[AttentionCheck]: ...
    def answer_attention_check(self, check_id: int, answer: str) -> AttentionCheckResult: ...
    def assignment(self, assignment_id: int) -> Assignment: ...
    def attempt(
        self, assignment_id: int, text: str, *, target_span: list[int] | None = None, idempotency_key: str | None = None
    ) -> Attempt: ...
    def confirm(
        self, attempt_id: int, agrees: bool, judged_label: Label | None = None, *, idempotency_key: str | None = None
    ) -> Attempt: ...
    def submit_example(
        self,
        assignment_id: int,
        attempt_id: int,
        extras: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Example: ...
    def skip(self, assignment_id: int) -> Assignment: ...
    def inspect(
        self, assignment_id: int, text: str, *, label: str | None = None, target_span: list[int] | None = None
    ) -> Inspection: ...

    def validation_batch(self, round_id: int, size: int | None = None) -> ValidationBatch: ...
    def validate(
        self,
        item_id: str,
        label: Label,
        *,
        flagged: bool = False,
        flag_reason: str | None = None,
        seconds_taken: float | None = None,
        idempotency_key: str | None = None,
    ) -> Validation: ...

    def create_task(self, definition_yaml: str) -> Task: ...
    def open_round(
        self,
        task: str,
        *,
        model_servers: list[str] | None = None,
        prompt_strategy: str | None = None,
        no_prompt_fraction: float | None = None,
        target_label_mode: str | None = None,
        notes: str | None = None,
    ) -> Round: ...
    def set_model(self, round_id: int, model_servers: list[str]) -> Round: ...
    def model_servers(self) -> list[ModelServer]: ...
    def import_prompts(
        self, round_id: int, content: bytes, filename: str = "prompts.jsonl", *, format: str | None = None
    ) -> PromptImport: ...
    def set_round_status(self, round_id: int, status: str) -> Round: ...
    def round_stats(self, round_id: int) -> RoundStats: ...
    def plot_data(self, round_id: int, limit: int | None = None) -> PlotData: ...
    def worker_agreement(self, round_id: int) -> list[WorkerAgreement]: ...
    def build_round(self, round_id: int, **options: Any) -> Build: ...
    def preview_build(self, round_id: int, **options: Any) -> JSON: ...
    def report(self, task: str, number: int, format: str = "json") -> JSON | str: ...
    def download_dataset(self, task: str, number: int, split: str = "train", format: str = "jsonl") -> bytes: ...
    def start_job(self, task: str, kind: str, params: dict[str, Any] | None = None) -> Job: ...
    def job(self, job_id: int) -> Job: ...
    def cancel_job(self, job_id: int) -> Job: ...
    def jobs(
        self, task: str, *, kind: str | None = None, status: str | None = None, limit: int | None = None
    ) -> list[Job]: ...
    def models(self, task: str) -> list[Model]: ...

    def start_study_session(self, slug: str, params: dict[str, str]) -> StudyStart: ...
    def my_study_sessions(self) -> list[StudySession]: ...
    def finish_study_session(self, session_id: int, reason: str) -> Completion: ...
    def study_links(self, task: str) -> list[StudyLink]: ...
    def create_study_link(
        self,
        task: str,
        *,
        name: str,
        round_id: int,
        role: str,
        platform: str,
        quota: int,
        max_workers: int | None = None,
        id_parameter: str | None = None,
        opens_at: str | None = None,
        closes_at: str | None = None,
        completion_code: str | None = None,
        screened_out_code: str | None = None,
        partial_code: str | None = None,
        partial_pay_minor: int | None = None,
        other_role_allowed: bool = False,
        when_out_of_work: str = "complete",
    ) -> StudyLink: ...
    def close_study_link(self, link_id: int) -> StudyLink: ...
    def study_link_sessions(self, link_id: int) -> list[LinkSession]: ...
    def crowd_report(self, task: str) -> JSON: ...
    def pay_policy(self, task: str) -> JSON: ...
    def set_pay_policy(self, task: str, policy: JSON, note: str = "") -> JSON: ...
    def task_attention_checks(self, task: str) -> JSON: ...
    def ledger(self, task: str) -> JSON: ...
    def compute_ledger(self, task: str, round_id: int | None = None) -> JSON: ...
    def create_payout_batch(self, task: str, link_id: int, note: str | None = None) -> JSON: ...
    def payout_batches(self, task: str, link_id: int | None = None) -> list[JSON]: ...
    def payout_batch_file(self, batch_id: int) -> bytes: ...
    def mark_payout_batch_paid(self, batch_id: int) -> JSON: ...
    def cancel_payout_batch(self, batch_id: int) -> JSON: ...
    def reconcile_payout_batch(self, batch_id: int, record: bytes) -> JSON: ...


class ApiError(Exception):
    """An error answer of the API (or no answer at all: ``status`` 0).

    ``code`` and ``message`` come from the API's ``{"error": {"code", "message"}}`` body;
    ``retry_after`` (seconds) from its ``Retry-After`` header on a 503; ``request_id`` is the
    request's id (``X-Request-ID``), under which the API logged it, or for no answer the id the
    request was sent with.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retry_after: float | None = None,
        details: dict[str, Any] | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.details = details or {}
        self.request_id = request_id

    @property
    def reference(self) -> str | None:
        """The request id to quote, for an error on the service's side (no answer, or a 5xx),
        which the user cannot fix and whoever runs the service may have to look up; None for the
        user's own mistakes (4xx), whose message says what to do."""
        return self.request_id if self.status == 0 or self.status >= 500 else None

    @property
    def shown(self) -> str:
        """The message as a page shows it: with its reference when it has one."""
        return f"{self.message} (reference {self.reference})" if self.reference else self.message

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, {self.message!r}, retry_after={self.retry_after})"


def api_root(base_url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/api/v1`` -> ``http://host:8000/api/v1``."""
    root = base_url.strip().rstrip("/")
    return root if root.endswith(API_PREFIX) else root + API_PREFIX


def idempotency_key(kind: str, *parts: Any) -> str:
    """A key that is the same for the same request content (and differs otherwise)."""
    digest = hashlib.sha256(json.dumps(parts, ensure_ascii=False, sort_keys=True, default=str).encode("utf-8"))
    return f"{kind}-{digest.hexdigest()[:32]}"


# The methods' ``idempotency_key`` parameter shadows the function inside them.
_key = idempotency_key


def _retry_after(response: httpx.Response, details: dict[str, Any]) -> float | None:
    header = response.headers.get("Retry-After")
    if header is not None:
        try:
            return float(header)
        except ValueError:
            pass  # an HTTP date: fall back to the body
    value = details.get("retry_after_s")
    return float(value) if isinstance(value, (int, float)) else None


def error_from_response(response: httpx.Response) -> ApiError:
    """The API's error body as an :class:`ApiError`; a sensible message for any other body."""
    code, message = "http_error", ""
    details: dict[str, Any] = {}
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        code = str(error.get("code") or code)
        message = str(error.get("message") or "")
        details = error.get("details") if isinstance(error.get("details"), dict) else {}
    if not message:
        text = response.text.strip()[:300]
        message = f"the API answered HTTP {response.status_code}" + (f": {text}" if text else "")
    return ApiError(
        response.status_code, code, message, _retry_after(response, details), details, _request_id(response)
    )


def _request_id(response: httpx.Response) -> str | None:
    """The id the API answered under (it keeps a safe one it was sent, else makes its own), or,
    for an answer that is not the API's (a proxy's 502), the id the request was sent with."""
    answered = response.headers.get(REQUEST_ID_HEADER, "")
    if answered and len(answered) <= 64 and answered.isascii() and answered.isprintable():
        return answered
    return response.request.headers.get(REQUEST_ID_HEADER)


def new_request_id() -> str:
    """A request id the API keeps as it is (32 hex digits, within its 64 safe characters)."""
    return secrets.token_hex(16)


def _log(method: str, path: str, error: ApiError) -> None:
    """A line for an error on the service's side (no answer, or a 5xx), with the request id the
    API logged it under; the user's own mistakes (4xx) are theirs to read, not the operator's.
    The path only (quoted, so that nothing in it starts a line of its own): no query, token or
    body reaches the log."""
    if error.reference is not None:
        logger.warning(
            "API %s %r failed: %s %s (request id %s)",
            method,
            path,
            error.status or "no answer",
            error.code,
            error.request_id,
        )


class SharedTransport(httpx.BaseTransport):
    """One pool of keep-alive connections to the API for every client in this process: the web
    app makes a client per browser session and per request of its own routes, and each would
    otherwise open (and on close drop) connections of its own. Closing a client leaves the pool
    open; the pool lives as long as the process."""

    MAX_CONNECTIONS = 100
    MAX_KEEPALIVE = 20
    _pool: ClassVar[httpx.HTTPTransport | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def pool(cls) -> httpx.HTTPTransport:
        with cls._lock:
            if cls._pool is None:
                cls._pool = httpx.HTTPTransport(
                    limits=httpx.Limits(
                        max_connections=cls.MAX_CONNECTIONS, max_keepalive_connections=cls.MAX_KEEPALIVE
                    )
                )
            return cls._pool

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.pool().handle_request(request)

    def close(self) -> None:
        """Nothing: other clients go on using the pool."""


class ApiClient:
    """A synchronous client of the dynaloop REST API for one user (one token)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        on_behalf_of: str | None = None,
        web_app_key: str | None = None,
    ) -> None:
        """``on_behalf_of``: the browser's address, sent with ``web_app_key`` (only both together)
        by the web app, whose API address an admin configured; never give the key to a client
        whose ``base_url`` a user chose."""
        self.base_url = api_root(base_url)
        self.token = token
        self.timeout = timeout
        self.on_behalf_of = on_behalf_of if web_app_key else None
        self.web_app_key = web_app_key if on_behalf_of else None
        self.writes = 0
        self.errors = 0
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- plumbing ---------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        content: bytes | None = None,
        content_type: str | None = None,
        key: str | None = None,
    ) -> httpx.Response:
        request_id = new_request_id()
        headers = {"Accept": "application/json", REQUEST_ID_HEADER: request_id}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if key is not None:
            headers["Idempotency-Key"] = key
        if self.on_behalf_of and self.web_app_key:
            headers[CLIENT_ADDRESS_HEADER] = self.on_behalf_of
            headers[WEB_APP_KEY_HEADER] = self.web_app_key
        if content_type is not None:
            headers["Content-Type"] = content_type
        params = {k: v for k, v in (params or {}).items() if v is not None}
        if method != "GET":
            self.writes += 1
        try:
            response = self._http.request(
                method, path, json=json_body, params=params or None, content=content, headers=headers
            )
        except httpx.TimeoutException as exc:
            message = f"the API at {self.base_url} did not answer within {self.timeout:g} s; try again"
            raise self._failed(method, path, ApiError(0, "timeout", message, request_id=request_id)) from exc
        except httpx.TransportError as exc:
            message = f"cannot reach the API at {self.base_url} ({exc}); is the API running (`dynaloop api`)?"
            raise self._failed(method, path, ApiError(0, "unreachable", message, request_id=request_id)) from exc
        if response.is_error:
            raise self._failed(method, path, error_from_response(response))
        return response

    def _failed(self, method: str, path: str, error: ApiError) -> ApiError:
        """Count ``error`` (a cached answer is fetched again after one) and log it if it is the
        service's (:func:`_log`); the caller raises it."""
        self.errors += 1
        _log(method, path, error)
        return error

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    def _data(self, path: str, **kwargs: Any) -> list[Any]:
        return list(self._json("GET", path, **kwargs)["data"])

    # --- sign-in ----------------------------------------------------------------------

    def login(self, username: str, password: str) -> Login:
        """Trade a username and password for a 7-day token; the client uses it from now on."""
        result = self._json("POST", "/auth/login", json_body={"username": username, "password": password})
        self.token = result["token"]
        return result

    def me(self) -> User:
        return self._json("GET", "/me")

    def my_token(self) -> TokenInfo:
        """``GET /me/token``: this client's token's id, name and expiry."""
        return self._json("GET", "/me/token")

    def revoke_token(self, token_id: int) -> None:
        """``DELETE /tokens/{id}``: the token stops working at once."""
        self._request("DELETE", f"/tokens/{int(token_id)}")

    # --- tasks and rounds -------------------------------------------------------------

    def tasks(self) -> list[Task]:
        return self._data("/tasks")

    def task(self, name: str) -> Task:
        return self._json("GET", f"/tasks/{name}")

    def rounds(self, task: str) -> list[Round]:
        """The rounds of a task."""
        return self._data(f"/tasks/{task}/rounds")

    def open_rounds(self) -> list[Round]:
        """Rounds that are collecting or validating, of every task."""
        return self._data("/rounds/open")

    def round(self, round_id: int) -> Round:
        return self._json("GET", f"/rounds/{round_id}")

    # --- writer: onboarding quiz ------------------------------------------------------

    def quiz(self, task: str) -> QuizStatus:
        """``{"required", "passed", "attempts_used", "attempts_left", "questions"}``."""
        return self._json("GET", f"/tasks/{task}/quiz")

    def answer_quiz(self, task: str, answers: list[str]) -> QuizResult:
        """``{"passed", "attempts_used", "attempts_left"}``: never which answers were wrong."""
        return self._json("POST", f"/tasks/{task}/quiz/attempts", json_body={"answers": answers})

    # --- writer: assignments, attempts, examples ---------------------------------------

    def start_assignment(self, round_id: int, target_label: Label | None = None) -> Assignment:
        """The writer's open assignment in the round, or a new one (a prompt and a target)."""
        body = {} if target_label is None else {"target_label": target_label}
        return self._json("POST", f"/rounds/{round_id}/assignments", json_body=body)

    def pending_attention_checks(self) -> list[AttentionCheck]:
        """The writer's unanswered attention checks (a new assignment is refused with 409
        ``attention_check_pending`` while one is)."""
        rows: list[AttentionCheck] = self._json("GET", "/attention-checks/pending")["data"]
        return rows

    def answer_attention_check(self, check_id: int, answer: str) -> AttentionCheckResult:
        """Answer one attention check, once (the same answer again is a replay)."""
        return self._json("POST", f"/attention-checks/{check_id}/answer", json_body={"answer": answer})

    def assignment(self, assignment_id: int) -> Assignment:
        """An assignment with every attempt so far."""
        return self._json("GET", f"/assignments/{assignment_id}")

    def attempt(
        self, assignment_id: int, text: str, *, target_span: list[int] | None = None, idempotency_key: str | None = None
    ) -> Attempt:
        """Check a text against the model in the loop (one try, unless the model is unavailable:
        then :class:`ApiError` 503 with ``retry_after``; resend the same text to retry)."""
        key = idempotency_key or _key("attempt", assignment_id, text, target_span)
        body: JSON = {"text": text}
        if target_span is not None:
            body["target_span"] = list(target_span)
        return self._json("POST", f"/assignments/{assignment_id}/attempts", json_body=body, key=key)

    def confirm(
        self, attempt_id: int, agrees: bool, judged_label: Label | None = None, *, idempotency_key: str | None = None
    ) -> Attempt:
        """ "Would a person say this has the target label?" (yes, or no with the label they would give)."""
        key = idempotency_key or _key("confirmation", attempt_id, agrees, judged_label)
        body: JSON = {"agrees": agrees}
        if judged_label is not None:
            body["judged_label"] = judged_label
        return self._json("POST", f"/attempts/{attempt_id}/confirmation", json_body=body, key=key)

    def submit_example(
        self,
        assignment_id: int,
        attempt_id: int,
        extras: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Example:
        """Submit one attempt of the assignment as the example, with the task's writer fields."""
        key = idempotency_key or _key("example", assignment_id, attempt_id)
        return self._json(
            "POST",
            f"/assignments/{assignment_id}/example",
            json_body={"attempt_id": attempt_id, "extras": extras or {}},
            key=key,
        )

    def skip(self, assignment_id: int) -> Assignment:
        """Switch to the next prompt: the assignment ends without an example."""
        return self._json("POST", f"/assignments/{assignment_id}/skip")

    def inspect(
        self, assignment_id: int, text: str, *, label: str | None = None, target_span: list[int] | None = None
    ) -> Inspection:
        """Token attributions of a draft (``{"label", "tokens": [{"token", "score"}]}``); no try used."""
        body: JSON = {"text": text}
        if label is not None:
            body["label"] = label
        if target_span is not None:
            body["target_span"] = list(target_span)
        return self._json("POST", f"/assignments/{assignment_id}/inspect", json_body=body)

    # --- validator --------------------------------------------------------------------

    def validation_batch(self, round_id: int, size: int | None = None) -> ValidationBatch:
        """The validator's batch; asking again while it is live returns the same items."""
        return self._json("GET", f"/rounds/{round_id}/validation-batch", params={"size": size})

    def validate(
        self,
        item_id: str,
        label: Label,
        *,
        flagged: bool = False,
        flag_reason: str | None = None,
        seconds_taken: float | None = None,
        idempotency_key: str | None = None,
    ) -> Validation:
        """Label one item of the validator's batch (a list for multi-label tasks), optionally
        flagging it."""
        key = idempotency_key or _key("validation", item_id, label, flagged, flag_reason)
        body: JSON = {"label": label, "flagged": flagged}
        if flag_reason:
            body["flag_reason"] = flag_reason
        if seconds_taken is not None:
            body["seconds_taken"] = round(min(max(seconds_taken, 0.0), 86_400.0), 3)
        return self._json("POST", f"/validation-items/{item_id}/validations", json_body=body, key=key)

    # --- researcher -------------------------------------------------------------------

    def create_task(self, definition_yaml: str) -> Task:
        return self._json("POST", "/tasks", json_body={"definition_yaml": definition_yaml})

    def open_round(
        self,
        task: str,
        *,
        model_servers: list[str] | None = None,
        prompt_strategy: str | None = None,
        no_prompt_fraction: float | None = None,
        target_label_mode: str | None = None,
        notes: str | None = None,
    ) -> Round:
        """Open the task's next round (fields left out take the API's defaults); ``model_servers``
        names registered model servers (:meth:`model_servers`)."""
        body = {
            "model_servers": model_servers,
            "prompt_strategy": prompt_strategy,
            "no_prompt_fraction": no_prompt_fraction,
            "target_label_mode": target_label_mode,
            "notes": notes,
        }
        return self._json("POST", f"/tasks/{task}/rounds", json_body={k: v for k, v in body.items() if v is not None})

    def set_model(self, round_id: int, model_servers: list[str]) -> Round:
        """Put registered model servers (by name) in the round's loop."""
        return self._json("PUT", f"/rounds/{round_id}/model", json_body={"model_servers": model_servers})

    def model_servers(self) -> list[ModelServer]:
        """The model servers an admin registered, to choose from (researchers)."""
        return self._data("/model-servers")

    def import_prompts(
        self, round_id: int, content: bytes, filename: str = "prompts.jsonl", *, format: str | None = None
    ) -> PromptImport:
        """Upload a JSONL or CSV prompt file (the format from ``format`` or the file name)."""
        fmt = format or ("csv" if filename.lower().endswith(".csv") else "jsonl")
        content_type = "text/csv" if fmt == "csv" else "application/x-ndjson"
        return self._json(
            "POST", f"/rounds/{round_id}/prompts", content=content, content_type=content_type, params={"format": fmt}
        )

    def set_round_status(self, round_id: int, status: str) -> Round:
        """collecting -> validating -> closed."""
        return self._json("POST", f"/rounds/{round_id}/status", json_body={"status": status})

    def round_stats(self, round_id: int) -> RoundStats:
        return self._json("GET", f"/rounds/{round_id}/stats")

    def worker_agreement(self, round_id: int) -> list[WorkerAgreement]:
        return list(self._json("GET", f"/rounds/{round_id}/worker-agreement"))

    def example(self, example_id: int) -> JSON:
        """The full record of one example: every attempt, the confirmation, every label."""
        return self._json("GET", f"/examples/{example_id}")

    def apply_worker_quality(self, task: str) -> list[WorkerAgreement]:
        """Unqualify validators above the task's disagreement threshold; returns them."""
        return list(self._json("POST", f"/tasks/{task}/worker-quality/apply"))

    def unqualify(self, task: str, username: str, reason: str) -> JSON:
        return self._json("POST", f"/tasks/{task}/workers/{username}/unqualify", json_body={"reason": reason})

    def requalify(self, task: str, username: str) -> JSON:
        return self._json("POST", f"/tasks/{task}/workers/{username}/requalify")

    def build_round(self, round_id: int, **options: Any) -> Build:
        """Aggregate, compute agreement and build the splits of a closed round (options as
        ``BuildOptions``: seed, policy, dev_test_min_votes, chance, max_per_cell, min_per_cell,
        no_prompt_in_dev_test, max_dev_test_share, model_based). A refused build's
        :class:`ApiError` carries ``details.short`` and ``details.relaxations``."""
        return self._json("POST", f"/rounds/{round_id}/build", json_body=options)

    def preview_build(self, round_id: int, **options: Any) -> JSON:
        """What these options and each relaxation would give the round; records nothing."""
        return self._json("POST", f"/rounds/{round_id}/build/preview", json_body=options)

    def report(self, task: str, number: int, format: str = "json") -> JSON | str:
        """The newest build's report: a dict, or the Markdown text with ``format="markdown"``."""
        response = self._request("GET", f"/tasks/{task}/rounds/{number}/report", params={"format": format})
        return response.text if format == "markdown" else response.json()

    def download_dataset(self, task: str, number: int, split: str = "train", format: str = "jsonl") -> bytes:
        """One split of the newest build as JSONL, CSV or Parquet bytes."""
        return self._request(
            "GET", f"/tasks/{task}/rounds/{number}/dataset", params={"split": split, "format": format}
        ).content

    # --- jobs and models ------------------------------------------------------------

    def start_job(self, task: str, kind: str, params: dict[str, Any] | None = None) -> Job:
        """Start a train, evaluate or promote job (202); poll :meth:`job` for its progress."""
        return self._json("POST", f"/tasks/{task}/jobs", json_body={"kind": kind, "params": params or {}})

    def job(self, job_id: int) -> Job:
        """A job's status, progress (0-1), message, result and the newest lines of its log."""
        return self._json("GET", f"/jobs/{job_id}")

    def cancel_job(self, job_id: int) -> Job:
        """Cancel a queued job now, or ask the worker of a running one to stop it."""
        return self._json("POST", f"/jobs/{job_id}/cancel")

    def jobs(
        self, task: str, *, kind: str | None = None, status: str | None = None, limit: int | None = None
    ) -> list[Job]:
        """The task's jobs, newest first (without logs)."""
        return self._data(f"/tasks/{task}/jobs", params={"kind": kind, "status": status, "limit": limit})

    def models(self, task: str) -> list[Model]:
        """The task's model registry with the attempts each version scored."""
        return self._data(f"/tasks/{task}/models")

    def plot_data(self, round_id: int, limit: int | None = None) -> PlotData:
        """Per example edit distance, lengths, target / prediction / majority; worker agreement."""
        return self._json("GET", f"/rounds/{round_id}/plot-data", params={"limit": limit})

    # --- crowd platforms: study links and sessions ------------------------------------

    def start_study_session(self, slug: str, params: dict[str, str]) -> StudyStart:
        """``POST /study/{slug}/sessions`` (public): the platform's query parameters start or
        resume the worker's study session, or (MTurk before accepting) give a preview."""
        return self._json("POST", f"/study/{quote(slug, safe='')}/sessions", json_body={"params": dict(params)})

    def my_study_sessions(self) -> list[StudySession]:
        """The signed-in worker's study sessions (units done recomputed on read)."""
        return self._data("/me/study-sessions")

    def finish_study_session(self, session_id: int, reason: str) -> Completion:
        """End one's own study session (``reason``: quota, stop or out_of_work); asking again answers the same."""
        return self._json("POST", f"/study-sessions/{int(session_id)}/finish", json_body={"reason": reason})

    def study_links(self, task: str) -> list[StudyLink]:
        return self._data(f"/tasks/{task}/study-links")

    def study_link(self, link_id: int) -> StudyLink:
        return self._json("GET", f"/study-links/{int(link_id)}")

    def create_study_link(
        self,
        task: str,
        *,
        name: str,
        round_id: int,
        role: str,
        platform: str,
        quota: int,
        max_workers: int | None = None,
        id_parameter: str | None = None,
        opens_at: str | None = None,
        closes_at: str | None = None,
        completion_code: str | None = None,
        screened_out_code: str | None = None,
        partial_code: str | None = None,
        partial_pay_minor: int | None = None,
        other_role_allowed: bool = False,
        when_out_of_work: str = "complete",
    ) -> StudyLink:
        """A study link for a round and a role (datetimes as ISO 8601 strings; None: the API's default).
        A Prolific or MTurk link needs ``max_workers``."""
        body: JSON = {
            "name": name,
            "round_id": round_id,
            "role": role,
            "platform": platform,
            "quota": quota,
            "max_workers": max_workers,
            "id_parameter": id_parameter,
            "opens_at": opens_at,
            "closes_at": closes_at,
            "completion_code": completion_code,
            "screened_out_code": screened_out_code,
            "partial_code": partial_code,
            "partial_pay_minor": partial_pay_minor,
            "other_role_allowed": other_role_allowed,
            "when_out_of_work": when_out_of_work,
        }
        return self._json("POST", f"/tasks/{task}/study-links", json_body=body)

    def close_study_link(self, link_id: int) -> StudyLink:
        """No new sessions start from the link; started ones go on."""
        return self._json("POST", f"/study-links/{int(link_id)}/close")

    def study_link_sessions(self, link_id: int) -> list[LinkSession]:
        return self._data(f"/study-links/{int(link_id)}/sessions")

    # --- crowd platforms: the ledger ----------------------------------------------------

    def crowd_report(self, task: str) -> JSON:
        """Per study link: sessions by status, abandoned, median minutes, ledger totals and
        effective hourly pay (minor units per hour, None when not computable)."""
        return self._json("GET", f"/tasks/{task}/crowd-report")

    def pay_policy(self, task: str) -> JSON:
        """The task's pay policy in force (``current``, None without one) and every version."""
        return self._json("GET", f"/tasks/{task}/pay-policy")

    def set_pay_policy(self, task: str, policy: JSON, note: str = "") -> JSON:
        """A new version of the task's pay policy; it pays the work done from now on."""
        return self._json("PUT", f"/tasks/{task}/pay-policy", json_body={"policy": policy, "note": note})

    def task_attention_checks(self, task: str) -> JSON:
        """Each writer's attention checks on the task: served, answered, passed, failed, qualified."""
        return self._json("GET", f"/tasks/{task}/attention-checks")

    def ledger(self, task: str) -> JSON:
        """The task's ledger totals per worker and kind."""
        return self._json("GET", f"/tasks/{task}/ledger")

    def compute_ledger(self, task: str, round_id: int | None = None) -> JSON:
        """Compute the ledger's rows for the task (one round, or all); rows already there stay."""
        body: JSON = {} if round_id is None else {"round_id": round_id}
        return self._json("POST", f"/tasks/{task}/ledger/compute", json_body=body)

    # --- payout batches (docs/crowdsourcing.md, "Paying a round with payout batches") -------

    def create_payout_batch(self, task: str, link_id: int, note: str | None = None) -> JSON:
        """Record a payout batch of one study link's bonuses not yet in a batch: the batch, the
        workers held back and the bonuses that other links (or none) pay."""
        body: JSON = {"link_id": link_id} if note is None else {"link_id": link_id, "note": note}
        return self._json("POST", f"/tasks/{task}/payout-batches", json_body=body)

    def payout_batches(self, task: str, link_id: int | None = None) -> list[JSON]:
        """The task's payout batches (one link's, with ``link_id``), oldest first."""
        return self._data(f"/tasks/{task}/payout-batches", params=None if link_id is None else {"link_id": link_id})

    def payout_batch_file(self, batch_id: int) -> bytes:
        """The batch's bulk-bonus file: the same bytes every time."""
        return self._request("GET", f"/payout-batches/{batch_id}/file").content

    def mark_payout_batch_paid(self, batch_id: int) -> JSON:
        return self._json("POST", f"/payout-batches/{batch_id}/paid")

    def cancel_payout_batch(self, batch_id: int) -> JSON:
        """Cancel a batch that was not paid: its bonuses become payable again."""
        return self._json("POST", f"/payout-batches/{batch_id}/cancel")

    def reconcile_payout_batch(self, batch_id: int, record: bytes) -> JSON:
        """Compare the batch with the platform's record of what it paid (CSV or ListBonusPayments JSON)."""
        return self._json(
            "POST",
            f"/payout-batches/{batch_id}/reconciliation",
            content=record,
            content_type="application/octet-stream",
        )
