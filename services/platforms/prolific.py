"""Prolific's API through httpx: bonuses (set up, then pay), approving or rejecting submissions,
and creating a draft study from a study link.

The calls, as Prolific's API reference documents them (docs/crowdsourcing.md cites each page):

- ``POST /api/v1/submissions/bonus-payments/`` ``{"study_id", "csv_bonuses"}`` sets up a bulk
  bonus (``<participant_id>,<amount>`` lines, the amount in major units of the study's currency)
  and answers its ``id``; it pays nothing.
- ``POST /api/v1/bulk-bonus-payments/{id}/pay/`` pays it. Prolific warns that this call is **not
  idempotent**: each request pays again.
- ``POST /api/v1/submissions/{id}/transition/`` ``{"action": "APPROVE"}`` or ``{"action":
  "REJECT", "message" (100 characters or more), "rejection_category"}``; idempotent.
- ``POST /api/v1/studies/`` creates a draft (unpublished) study.

**Never paying twice from our side.** A set-up and a pay may each time out after Prolific acted.
:func:`pay_lines` therefore keeps a :class:`BonusPayment` record that the caller saves (its
``save`` callback commits it) *before* each next request: the set-up's id once Prolific answered
it, and that a pay request left, before it is sent. A pay whose outcome is unknown is never
sent again; a set-up whose outcome is unknown is not made again until the researcher records what
Prolific shows. Only a call that never reached Prolific (no connection) is retried at once.

The token is a ``SecretStr`` from settings; it goes only to ``DYNALOOP_PROLIFIC_API_URL``, never
into a log line, an error message or a recorded answer. Redirects are not followed (the token
would go with them). Every answer is read within ``platform_timeout_s`` in all and at most
``platform_max_response_bytes``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from services.db.models import Platform, StudyLink
from services.domain.ledger import format_amount
from services.errors import Invalid, PlatformError
from services.platforms import (
    Decision,
    DecisionResult,
    LineResult,
    LineStatus,
    PayLine,
    Verdict,
    bounded_answer,
    check_lines,
)
from services.settings import Settings

log = logging.getLogger(__name__)

PROLIFIC_ID_RE = re.compile(r"^[0-9a-f]{24}$")  # participant, study and submission ids (services/domain/study.py)
BULK_BONUS_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CONNECT_TRIES = 3  # a call that never connected is sent again this many times in all
MIN_REJECTION_MESSAGE = 100  # Prolific: "It must be at least 100 chars long"
REJECTION_CATEGORIES = (
    "TOO_QUICKLY",
    "TOO_SLOWLY",
    "FAILED_INSTRUCTIONS",
    "INCOMP_LONGITUDINAL",
    "FAILED_CHECK",
    "LOW_EFFORT",
    "MALINGERING",
    "NO_CODE",
    "BAD_CODE",
    "NO_DATA",
    "UNSUPP_DEVICE",
    "OTHER",
)


class CallFailed(Exception):
    """A call to Prolific without a success. ``reached``: whether the request may have reached
    Prolific (False only when no connection was made); ``refused``: Prolific answered 4xx, so it
    did not act. The message holds the status and a bounded answer, never the token."""

    def __init__(self, message: str, *, reached: bool, refused: bool, answer: dict[str, Any]) -> None:
        super().__init__(message)
        self.reached = reached
        self.refused = refused
        self.answer = answer


class ProlificClient:
    """Calls to ``settings.prolific_api_url`` with ``settings.prolific_api_token``. ``transport``
    is for tests only (an httpx transport); the address always comes from settings."""

    def __init__(self, settings: Settings, *, transport: httpx.BaseTransport | None = None) -> None:
        if settings.prolific_api_token is None:
            raise Invalid("DYNALOOP_PROLIFIC_API_TOKEN is not set: Prolific's API cannot be called")
        self._token = settings.prolific_api_token
        self._timeout_s = settings.platform_timeout_s
        self._max_bytes = settings.platform_max_response_bytes
        self._client = httpx.Client(
            base_url=settings.prolific_api_url.rstrip("/"),
            timeout=httpx.Timeout(settings.platform_timeout_s),
            follow_redirects=False,
            transport=transport,
        )

    def __repr__(self) -> str:  # never the token
        return f"ProlificClient({self._client.base_url})"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ProlificClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one call ------------------------------------------------------------------------------

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request to ``path`` (below the API's address; never a full URL); its JSON answer.
        Retried only while no connection was made (the request never left)."""
        if not path.startswith("/api/v1/") or "//" in path or ".." in path:
            raise Invalid(f"not a Prolific API path: {path!r}")
        for attempt in range(1, CONNECT_TRIES + 1):
            try:
                return self._once(method, path, body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # no connection: the request never left
                if attempt == CONNECT_TRIES:
                    raise CallFailed(
                        f"Prolific could not be reached ({type(exc).__name__}) for {method} {path}; nothing was sent",
                        reached=False,
                        refused=False,
                        answer={"error": type(exc).__name__},
                    ) from None
                time.sleep(0.2 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        deadline = time.monotonic() + self._timeout_s
        headers = {"Authorization": f"Token {self._token.get_secret_value()}", "Accept": "application/json"}
        log.debug("prolific %s %s", method, path)
        try:
            with self._client.stream(method, path, json=body, headers=headers) as response:
                content = bytearray()
                for chunk in response.iter_bytes():
                    content += chunk
                    if len(content) > self._max_bytes:
                        raise CallFailed(
                            f"Prolific's answer to {method} {path} is larger than {self._max_bytes} bytes; not read",
                            reached=True,
                            refused=False,
                            answer={"status": response.status_code, "error": "answer too large"},
                        )
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("answer not complete in time")
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise
        except httpx.TimeoutException as exc:
            raise CallFailed(
                f"Prolific did not answer {method} {path} within {self._timeout_s:g} s; it may have acted",
                reached=True,
                refused=False,
                answer={"error": type(exc).__name__},
            ) from None
        except httpx.HTTPError as exc:
            raise CallFailed(
                f"the call {method} {path} to Prolific broke off ({type(exc).__name__}); it may have acted",
                reached=True,
                refused=False,
                answer={"error": type(exc).__name__},
            ) from None
        status = response.status_code
        # A platform that echoes the request (an error page quoting its headers) must not put the
        # token into what is recorded or shown.
        text = bytes(content).decode("utf-8", errors="replace").replace(self._token.get_secret_value(), "[token]")
        try:
            parsed: Any = json.loads(text) if text.strip() else {}
        except ValueError:
            parsed = {"text": text[:500]}
        answer = bounded_answer(parsed)
        answer["status"] = status
        if 200 <= status < 300:
            return answer
        refused = 400 <= status < 500
        what = "refused" if refused else "failed on"
        detail = json.dumps(answer, sort_keys=True)[:300]
        raise CallFailed(
            f"Prolific {what} {method} {path} ({status}): {detail}", reached=True, refused=refused, answer=answer
        )

    # --- submissions ---------------------------------------------------------------------------

    def transition(
        self, submission_id: str, action: str, message: str | None = None, category: str | None = None
    ) -> dict[str, Any]:
        """Approve or reject one submission (idempotent on Prolific's side, so a call whose outcome
        is unknown is sent once more)."""
        _prolific_id(submission_id, "submission id")
        body: dict[str, Any] = {"action": action}
        if action == "REJECT":
            if message is None or len(message) < MIN_REJECTION_MESSAGE:
                raise Invalid(
                    f"a rejection needs a message of at least {MIN_REJECTION_MESSAGE} characters (Prolific's rule)"
                )
            if category not in REJECTION_CATEGORIES:
                raise Invalid(f"rejection_category must be one of {list(REJECTION_CATEGORIES)}")
            body |= {"message": message, "rejection_category": category}
        elif action != "APPROVE":
            raise Invalid("action is APPROVE or REJECT")
        path = f"/api/v1/submissions/{submission_id}/transition/"
        try:
            return self.call("POST", path, body)
        except CallFailed as exc:
            if exc.refused or not exc.reached:
                raise
            return self.call("POST", path, body)

    def decide(
        self, decisions: list[Decision], *, reject_message: str | None = None, reject_category: str = "OTHER"
    ) -> list[DecisionResult]:
        """Carry out each decision; a refusal or an error of one does not stop the others. A
        rejection without a valid message or category is refused before any call."""
        if any(d.verdict is Verdict.reject for d in decisions):
            if reject_message is None or len(reject_message) < MIN_REJECTION_MESSAGE:
                raise Invalid(
                    f"rejecting on Prolific needs a message of at least {MIN_REJECTION_MESSAGE} characters "
                    "(Prolific's rule); nothing was sent"
                )
            if reject_category not in REJECTION_CATEGORIES:
                raise Invalid(f"rejection_category must be one of {list(REJECTION_CATEGORIES)}; nothing was sent")
        results = []
        for decision in decisions:
            if decision.verdict is Verdict.skip or decision.submission_id is None:
                results.append(DecisionResult(decision.session_id, decision.submission_id, Verdict.skip, True))
                continue
            action = "APPROVE" if decision.verdict is Verdict.approve else "REJECT"
            try:
                answer = self.transition(decision.submission_id, action, reject_message, reject_category)
                results.append(
                    DecisionResult(decision.session_id, decision.submission_id, decision.verdict, True, answer)
                )
            except CallFailed as exc:
                results.append(
                    DecisionResult(decision.session_id, decision.submission_id, decision.verdict, False, exc.answer)
                )
        return results

    # --- studies -------------------------------------------------------------------------------

    def create_study(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a draft study. Not idempotent: never sent twice (a call whose outcome is unknown
        raises; look on Prolific before trying again)."""
        try:
            return self.call("POST", "/api/v1/studies/", body)
        except CallFailed as exc:
            raise PlatformError(str(exc), answer=exc.answer) from None


def _prolific_id(value: str, what: str) -> str:
    if not PROLIFIC_ID_RE.match(value):
        raise Invalid(f"{value!r} is not a Prolific {what} (24 lowercase hexadecimal characters)")
    return value


# --- paying a batch ------------------------------------------------------------------------------


@dataclass
class BonusPayment:
    """Where paying one batch on Prolific stands; the caller keeps it with the batch and saves it
    whenever :func:`pay_lines` hands it back through ``save`` (before the next request leaves).

    ``setup_id``: the bulk bonus Prolific set up; ``setup_unknown``: a set-up request left
    without an answer (one may exist on Prolific); ``pay_sent``: a pay request for ``setup_id``
    left and was not refused: it is never sent again."""

    setup_id: str | None = None
    setup_unknown: bool = False
    pay_sent: bool = False


def bonus_csv(lines: list[PayLine]) -> str:
    """Prolific's ``csv_bonuses``: ``<participant_id>,<amount>`` per line, the amount in major
    units of the study's currency (``1.50``), from integers only."""
    return "".join(f"{line.worker_id},{format_amount(line.amount_minor, line.currency)}\n" for line in lines)


def _all(lines: list[PayLine], status: LineStatus, reference: str | None, answer: dict[str, Any]) -> list[LineResult]:
    return [LineResult(line.unique_request_token, status, reference, answer) for line in lines]


def pay_lines(
    client: ProlificClient,
    study_id: str,
    currency: str,
    lines: list[PayLine],
    state: BonusPayment,
    save: Callable[[BonusPayment], None],
) -> list[LineResult]:
    """Pay ``lines`` as bonuses on the Prolific study ``study_id`` (whose currency is
    ``currency``): one bulk bonus set up, then paid. Every participant must be a 24-character
    Prolific id; a line in another currency refuses the whole batch before any call.

    The answer has one :class:`LineResult` per line: all ``paid`` once Prolific accepted the pay
    (it pays within minutes), all ``failed`` when it refused (nothing paid; calling again pays the
    same set-up), all ``unknown`` when its outcome is not known (never sent again from here)."""
    _prolific_id(study_id, "study id")
    check_lines(lines, currency)
    for line in lines:
        _prolific_id(line.worker_id, "participant id")
    if len({line.worker_id for line in lines}) != len(lines):
        raise Invalid("a Prolific bulk bonus has one line per participant; merge this batch's lines per participant")
    if state.pay_sent:
        return _all(
            lines,
            LineStatus.unknown,
            state.setup_id,
            {"error": f"a pay request for bulk bonus {state.setup_id} was sent before; check it on Prolific"},
        )
    if state.setup_id is None:
        if state.setup_unknown:
            return _all(
                lines,
                LineStatus.unknown,
                None,
                {"error": "a bonus set-up for this batch may exist on Prolific; record its id (or that there is none)"},
            )
        state.setup_unknown = True
        save(state)
        try:
            answer = client.call(
                "POST", "/api/v1/submissions/bonus-payments/", {"study_id": study_id, "csv_bonuses": bonus_csv(lines)}
            )
        except CallFailed as exc:
            if exc.refused or not exc.reached:
                state.setup_unknown = False
                save(state)
                return _all(lines, LineStatus.failed, None, exc.answer)
            return _all(lines, LineStatus.unknown, None, exc.answer)
        setup_id = answer.get("id")
        if not isinstance(setup_id, str) or not BULK_BONUS_ID_RE.match(setup_id):
            return _all(lines, LineStatus.unknown, None, {"error": "the set-up's answer has no usable id", **answer})
        state.setup_id, state.setup_unknown = setup_id, False
        save(state)
        expected = sum(line.amount_minor for line in lines)
        amount = answer.get("amount")
        if isinstance(amount, int | float) and round(amount) != expected:
            # Never paid, by this run or a later one: the next run sets up afresh.
            state.setup_id = None
            save(state)
            return _all(
                lines,
                LineStatus.failed,
                setup_id,
                {"error": f"Prolific set up {amount} minor units, the batch holds {expected}: not paid", **answer},
            )
    assert state.setup_id is not None
    if not BULK_BONUS_ID_RE.match(state.setup_id):
        raise Invalid(f"{state.setup_id!r} is not a bulk bonus id")
    state.pay_sent = True
    save(state)
    try:
        answer = client.call("POST", f"/api/v1/bulk-bonus-payments/{state.setup_id}/pay/")
    except CallFailed as exc:
        if exc.refused or not exc.reached:
            state.pay_sent = False
            save(state)
            return _all(lines, LineStatus.failed, state.setup_id, exc.answer)
        return _all(lines, LineStatus.unknown, state.setup_id, exc.answer)
    return _all(lines, LineStatus.paid, state.setup_id, answer)


# --- a study from a link ---------------------------------------------------------------------


def study_body(
    link: StudyLink,
    *,
    web_url: str,
    description: str,
    estimated_minutes: int,
    reward_minor: int,
) -> dict[str, Any]:
    """The draft study for ``link``: its name, the link's URL with Prolific's placeholders, the
    link's codes (completed: manual review; screened-out and partial codes too, as "OTHER" codes
    reviewed by hand), places = ``max_workers`` and the reward (minor units of the study's
    currency, the role's base pay)."""
    from services.domain.study import query_template

    if link.platform is not Platform.prolific:
        raise Invalid(f"link {link.id} is a {link.platform.value} link, not a Prolific one")
    if not web_url.startswith("https://"):
        raise Invalid("the web app's address must be https:// (Prolific sends participants to it)")
    if not 1 <= estimated_minutes <= 24 * 60:
        raise Invalid("estimated_minutes must be between 1 and 1440")
    if not 1 <= reward_minor <= 1_000_000:
        raise Invalid("the reward must be between 1 and 1000000 minor units; set the task's pay.base_pay")
    if not description.strip() or len(description) > 5000:
        raise Invalid("the study needs a description of 1-5000 characters (participants read it)")
    codes: list[dict[str, Any]] = [
        {"code": link.completion_code, "code_type": "COMPLETED", "actions": [{"action": "MANUALLY_REVIEW"}]}
    ]
    for code in (link.screened_out_code, link.partial_code):
        if code:
            codes.append({"code": code, "code_type": "OTHER", "actions": [{"action": "MANUALLY_REVIEW"}]})
    assert link.max_workers is not None  # a Prolific link always caps its workers (study.create_link)
    return {
        "name": link.name,
        "internal_name": f"dynaloop link {link.id} ({link.role.value})",
        "description": description,
        "external_study_url": f"{web_url.rstrip('/')}/study/{link.slug}{query_template(link)}",
        "prolific_id_option": "url_parameters",
        "completion_codes": codes,
        "total_available_places": link.max_workers,
        "estimated_completion_time": estimated_minutes,
        "reward": reward_minor,
    }
