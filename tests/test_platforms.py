"""The crowd platforms' APIs (issue 27, "Platform APIs"; services/platforms/).

Prolific is played by a local HTTP server (real HTTP on 127.0.0.1, in a thread) that checks
every request against the request schemas in tests/data/prolific_api_requests.json, written from
Prolific's API reference (that file cites the pages), and the token in its Authorization
header. MTurk is played by botocore's ``Stubber``, which checks each call's parameters against
AWS's own service model for MTurk (shipped with botocore) and the expected values given here.

The attacker's and the failure tests come first: the token never leaves for another address and
never shows in logs, errors or recorded answers; answers are bounded in size and time; a pay
that may have happened is never sent again and a set-up is never made twice; bad input sends
nothing and writes nothing. Then the ways through, and the CLI on the real database.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import SecretStr, ValidationError
from sqlalchemy import select

from services.db.engine import session_scope
from services.db.models import AuditEntry, StudySession, StudySessionStatus
from services.errors import Invalid
from services.platforms import LineStatus, PayLine, Verdict, decisions_for, mturk, prolific
from services.settings import Settings
from tests.conftest import Actor, example_yaml, open_round, table_counts

pytestmark = pytest.mark.both_databases  # money: approvals and bonuses issued once per platform id


TOKEN = "prolific-test-token-7f3a9c1e5b2d4f60"
STUDY = "60aa11bb22cc33dd44ee55ff"
SPEC = json.loads((Path(__file__).parent / "data" / "prolific_api_requests.json").read_text(encoding="utf-8"))


def pid(n: int) -> str:
    return f"5f{n:022x}"


# --- a Prolific that checks what it is sent ----------------------------------------------------


class _QuietServer(ThreadingHTTPServer):
    """A server whose client may hang up first (the timeout tests give up on a slow answer):
    the answer it could not write is not a failure of the test, so no traceback for it."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class FakeProlific:
    """Prolific's API on 127.0.0.1: each request is matched to an operation of SPEC, its token
    and body checked (400 and a recorded violation otherwise), recorded, and answered with the
    next scripted answer of its operation or the documented success."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.script: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                fake.handle(self)

            def do_GET(self) -> None:
                fake.handle(self)

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def count(self, operation: str) -> int:
        return sum(1 for r in self.requests if r["op"] == operation)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        raw = request.rfile.read(min(length, 1_000_000))
        path = request.path
        operation = next(
            (op for op in SPEC["operations"] if op["method"] == request.command and re.match(op["path"], path)), None
        )
        problem = None
        if request.headers.get("Authorization") != f"Token {TOKEN}":
            problem = "missing or wrong token"
        elif operation is None:
            problem = f"no documented operation {request.command} {path}"
        else:
            body = json.loads(raw) if raw else None
            try:
                if operation["request"] is None:
                    assert body is None, "this call takes no body"
                else:
                    jsonschema.validate(body, operation["request"])
            except (jsonschema.ValidationError, AssertionError) as exc:
                problem = f"{operation['operationId']}: {str(exc).splitlines()[0]}"
        if problem is not None:
            with self.lock:
                self.violations.append(problem)
            self.answer(request, 400, {"error": problem, "echo": dict(request.headers)})
            return
        assert operation is not None
        name = operation["operationId"]
        with self.lock:
            self.requests.append({"op": name, "path": path, "body": body})
            scripted = self.script.get(name, [])
            reply = scripted.pop(0) if scripted else None
        if reply is None:
            reply = {"status": operation["success"], "body": self.default(name, path, body)}
        if reply.get("delay"):
            time.sleep(reply["delay"])
        if reply.get("drip"):  # a slow answer: a byte at a time, forever
            request.send_response(200)
            request.send_header("Content-Length", "100000")
            request.end_headers()
            try:
                for _ in range(100000):
                    request.wfile.write(b" ")
                    request.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass
            return
        if reply.get("echo"):
            reply["body"] = {"detail": "bad", "headers": dict(request.headers)}
        self.answer(request, reply["status"], reply.get("body", {}), reply.get("headers", {}))

    def default(self, name: str, path: str, body: Any) -> dict[str, Any]:
        if name == "create-bonus-payments":
            cents = sum(round(float(line.split(",")[1]) * 100) for line in body["csv_bonuses"].splitlines())
            return {"id": f"bulk{self.count(name)}", "study": body["study_id"], "amount": cents, "total_amount": cents}
        if name == "transition-submission":
            return {"id": path.split("/")[4], "status": "APPROVED" if body["action"] == "APPROVE" else "REJECTED"}
        if name == "create-study":
            return {"id": "6" + "0" * 22 + "1", "status": "UNPUBLISHED", "name": body["name"]}
        return {}

    @staticmethod
    def answer(request: BaseHTTPRequestHandler, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request.send_response(status)
        for key, value in (headers or {}).items():
            request.send_header(key, value)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)


@pytest.fixture
def fake_prolific() -> Iterator[FakeProlific]:
    fake = FakeProlific()
    yield fake
    fake.close()
    assert not fake.violations, fake.violations  # every request matched Prolific's documented shape


def prolific_settings(fake: FakeProlific, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "prolific_api_token": SecretStr(TOKEN),
        "prolific_api_url": fake.url,
        "platform_timeout_s": 1.0,
        "platform_max_response_bytes": 4096,
        **overrides,
    }
    return Settings(**values)


def lines(*amounts: int, currency: str = "GBP") -> list[PayLine]:
    return [
        PayLine(pid(i), amount, currency, "bonus for round 1", f"batch7-line{i}") for i, amount in enumerate(amounts)
    ]


class Journal:
    """The caller's side of pay_lines: each saved state, and how many requests Prolific had
    received when it was saved (so the order of saving and sending shows)."""

    def __init__(self, fake: FakeProlific) -> None:
        self.fake = fake
        self.saved: list[tuple[prolific.BonusPayment, int]] = []

    def __call__(self, state: prolific.BonusPayment) -> None:
        self.saved.append((prolific.BonusPayment(**vars(state)), len(self.fake.requests)))


# --- Prolific: attacks and failures ------------------------------------------------------------


def test_the_token_goes_only_to_the_configured_https_address() -> None:
    """The address comes from settings alone and must be https (plain http only to this machine,
    for tests); nothing in pay_lines or the CLI takes an address."""
    for url in ("http://api.prolific.example", "ftp://127.0.0.1", "https://user:pw@api.prolific.com",
                "https://api.prolific.com/?x=1"):  # fmt: skip
        with pytest.raises(ValidationError):
            Settings(prolific_api_token=SecretStr(TOKEN), prolific_api_url=url)
    assert Settings(prolific_api_url="https://api.prolific.com").prolific_api_url == "https://api.prolific.com"
    with pytest.raises(Invalid, match="not set"):
        prolific.ProlificClient(Settings(prolific_api_token=None))
    with pytest.raises(ValidationError, match="both"):
        Settings(mturk_access_key_id="AKIATESTTESTTEST")
    real = mturk.boto3_client(
        Settings(mturk_sandbox=False, mturk_access_key_id="AKIATESTTESTTEST", mturk_secret_access_key=SecretStr("s"))
    )
    assert real.meta.endpoint_url == mturk.PRODUCTION_ENDPOINT and real.meta.region_name == "us-east-1"


def test_a_redirect_never_takes_the_token_elsewhere(fake_prolific: FakeProlific) -> None:
    elsewhere = FakeProlific()
    try:
        fake_prolific.script["create-bonus-payments"] = [
            {"status": 307, "body": {}, "headers": {"Location": f"{elsewhere.url}/api/v1/submissions/bonus-payments/"}}
        ]
        journal = Journal(fake_prolific)
        with prolific.ProlificClient(prolific_settings(fake_prolific)) as client:
            results = prolific.pay_lines(client, STUDY, "GBP", lines(150), prolific.BonusPayment(), journal)
        assert elsewhere.requests == [] and elsewhere.violations == []  # not followed: nothing reached it
        assert {r.status for r in results} == {LineStatus.unknown}  # a 3xx is no answer: not set up again blindly
    finally:
        elsewhere.close()


def test_ids_that_are_not_prolifics_are_refused_before_any_request(fake_prolific: FakeProlific) -> None:
    """A study or participant id cannot steer the request to another path."""
    journal = Journal(fake_prolific)
    with prolific.ProlificClient(prolific_settings(fake_prolific)) as client:
        for study_id in ("../../studies", "http://127.0.0.1:9/x", STUDY.upper(), STUDY + "/pay"):
            with pytest.raises(Invalid):
                prolific.pay_lines(client, study_id, "GBP", lines(150), prolific.BonusPayment(), journal)
        bad = [PayLine("../users/me", 150, "GBP", "bonus", "t1")]
        with pytest.raises(Invalid, match="participant id"):
            prolific.pay_lines(client, STUDY, "GBP", bad, prolific.BonusPayment(), journal)
        with pytest.raises(Invalid, match="USD"):  # a line in another currency than the study's
            prolific.pay_lines(
                client, STUDY, "GBP", [*lines(150), *lines(10, currency="USD")[:1]], prolific.BonusPayment(), journal
            )
        twice = [PayLine(pid(1), 10, "GBP", "bonus", "a"), PayLine(pid(1), 20, "GBP", "bonus", "b")]
        with pytest.raises(Invalid, match="one line per participant"):
            prolific.pay_lines(client, STUDY, "GBP", twice, prolific.BonusPayment(), journal)
        with pytest.raises(Invalid, match="100 characters"):
            client.transition(pid(3), "REJECT", "too short", "OTHER")
        with pytest.raises(Invalid, match="not a Prolific API path"):
            client.call("GET", "https://elsewhere.example/api/v1/users/me/")
    for bad_line in ({"amount_minor": 0}, {"amount_minor": -5}, {"unique_request_token": "x" * 65},
                     {"unique_request_token": "a b"}, {"reason": " "}):  # fmt: skip
        with pytest.raises(Invalid):
            dataclasses.replace(PayLine(pid(1), 10, "GBP", "r", "t"), **bad_line)
    assert fake_prolific.requests == [] and journal.saved == []


def test_a_failed_pay_after_a_set_up_never_sets_up_again(fake_prolific: FakeProlific) -> None:
    """Pay answered 503 (it may have paid): the lines are unknown and nothing is sent again,
    however often the caller retries. Pay refused (400: nothing paid): a retry pays the same
    set-up, never a second one."""
    settings = prolific_settings(fake_prolific)
    fake_prolific.script["pay-bonus-payments"] = [{"status": 503, "body": {"error": "busy"}}]
    journal = Journal(fake_prolific)
    state = prolific.BonusPayment()
    with prolific.ProlificClient(settings) as client:
        first = prolific.pay_lines(client, STUDY, "GBP", lines(150, 25), state, journal)
        assert {r.status for r in first} == {LineStatus.unknown}
        assert all(r.platform_reference == "bulk1" for r in first)
        # The set-up's id was saved before the pay request left, and "pay sent" before it too.
        setup_saved = next(n for s, n in journal.saved if s.setup_id == "bulk1")
        pay_saved = next(n for s, n in journal.saved if s.pay_sent)
        assert setup_saved == 1 and pay_saved == 1  # one request (the set-up) had reached Prolific then
        for _ in range(3):
            again = prolific.pay_lines(client, STUDY, "GBP", lines(150, 25), state, journal)
            assert {r.status for r in again} == {LineStatus.unknown}
            assert "sent before" in again[0].platform_answer["error"]
    assert (fake_prolific.count("create-bonus-payments"), fake_prolific.count("pay-bonus-payments")) == (1, 1)

    fake_prolific.script["pay-bonus-payments"] = [{"status": 400, "body": {"error": "insufficient balance"}}]
    refused_state = prolific.BonusPayment()
    with prolific.ProlificClient(settings) as client:
        refused = prolific.pay_lines(client, STUDY, "GBP", lines(300), refused_state, journal)
        assert {r.status for r in refused} == {LineStatus.failed} and refused_state.pay_sent is False
        assert refused[0].platform_answer["error"] == "insufficient balance"
        paid = prolific.pay_lines(client, STUDY, "GBP", lines(300), refused_state, journal)
    assert {r.status for r in paid} == {LineStatus.paid} and paid[0].platform_reference == "bulk2"
    assert (fake_prolific.count("create-bonus-payments"), fake_prolific.count("pay-bonus-payments")) == (2, 3)
    pays = [r["path"] for r in fake_prolific.requests if r["op"] == "pay-bonus-payments"]
    assert pays == ["/api/v1/bulk-bonus-payments/bulk1/pay/", "/api/v1/bulk-bonus-payments/bulk2/pay/",
                    "/api/v1/bulk-bonus-payments/bulk2/pay/"]  # fmt: skip


def test_a_set_up_without_an_answer_is_not_made_again(fake_prolific: FakeProlific) -> None:
    """The set-up timed out (it may exist on Prolific): unknown, and no second set-up until the
    researcher records what Prolific shows (the set-up's id, or a fresh state)."""
    fake_prolific.script["create-bonus-payments"] = [{"status": 201, "delay": 1.5, "body": {"id": "late"}}]
    journal = Journal(fake_prolific)
    state = prolific.BonusPayment()
    with prolific.ProlificClient(prolific_settings(fake_prolific)) as client:
        started = time.monotonic()
        results = prolific.pay_lines(client, STUDY, "GBP", lines(150), state, journal)
        assert time.monotonic() - started < 1.4  # the 1 s timeout, not the server's 1.5 s
        assert {r.status for r in results} == {LineStatus.unknown} and state.setup_unknown
        again = prolific.pay_lines(client, STUDY, "GBP", lines(150), state, journal)
        assert "may exist" in again[0].platform_answer["error"]
        # The researcher found the set-up on Prolific and recorded its id: only the pay is sent.
        found = prolific.BonusPayment(setup_id="late")
        paid = prolific.pay_lines(client, STUDY, "GBP", lines(150), found, journal)
    assert {r.status for r in paid} == {LineStatus.paid}
    assert (fake_prolific.count("create-bonus-payments"), fake_prolific.count("pay-bonus-payments")) == (1, 1)


def test_a_set_up_for_another_amount_is_not_paid(fake_prolific: FakeProlific) -> None:
    fake_prolific.script["create-bonus-payments"] = [{"status": 201, "body": {"id": "odd", "amount": 9999}}]
    with prolific.ProlificClient(prolific_settings(fake_prolific)) as client:
        results = prolific.pay_lines(client, STUDY, "GBP", lines(150), prolific.BonusPayment(), lambda s: None)
    assert {r.status for r in results} == {LineStatus.failed} and "9999" in results[0].platform_answer["error"]
    assert fake_prolific.count("pay-bonus-payments") == 0


def test_answers_are_bounded_in_size_and_time(fake_prolific: FakeProlific) -> None:
    fake_prolific.script["transition-submission"] = [
        {"status": 200, "body": {"padding": "x" * 10_000}},
        {"drip": True},
        {"drip": True},
    ]
    with prolific.ProlificClient(prolific_settings(fake_prolific)) as client:
        with pytest.raises(prolific.CallFailed, match="larger than 4096 bytes"):
            client.call("POST", f"/api/v1/submissions/{pid(1)}/transition/", {"action": "APPROVE"})
        started = time.monotonic()
        with pytest.raises(prolific.CallFailed, match="may have acted") as caught:
            client.call("POST", f"/api/v1/submissions/{pid(2)}/transition/", {"action": "APPROVE"})
        assert time.monotonic() - started < 2.5  # a byte every 50 ms never resets a 1 s deadline
        assert caught.value.reached and not caught.value.refused


def test_the_token_never_shows_in_logs_errors_or_answers(
    fake_prolific: FakeProlific, caplog: pytest.LogCaptureFixture
) -> None:
    """Prolific (or a proxy) echoing the request's headers in an error: the token is replaced
    before anything is recorded; httpx's and our own log lines at DEBUG never hold it."""
    caplog.set_level(logging.DEBUG)
    fake_prolific.script["create-bonus-payments"] = [{"status": 400, "echo": True}]
    fake_prolific.script["transition-submission"] = [{"status": 500, "echo": True}, {"status": 500, "echo": True}]
    with prolific.ProlificClient(prolific_settings(fake_prolific)) as client:
        assert TOKEN not in repr(client)
        results = prolific.pay_lines(client, STUDY, "GBP", lines(150), prolific.BonusPayment(), lambda s: None)
        assert results[0].status is LineStatus.failed
        assert results[0].platform_answer["headers"]["Authorization"] == "Token [token]"
        with pytest.raises(prolific.CallFailed) as caught:
            client.transition(pid(4), "APPROVE")
    shown = [json.dumps(r.platform_answer) for r in results] + [str(caught.value), repr(caught.value)]
    shown += [json.dumps(caught.value.answer)] + [record.getMessage() for record in caplog.records]
    assert caplog.records and not [text for text in shown if TOKEN in text]
    assert fake_prolific.count("transition-submission") == 2  # idempotent on Prolific: sent once more, no further


def test_an_unreachable_prolific_is_tried_again_and_sends_nothing() -> None:
    """No connection: retried (the request never left), then failed (nothing paid, nothing set up)."""
    fake = FakeProlific()
    settings = prolific_settings(fake)
    fake.close()
    state = prolific.BonusPayment()
    with prolific.ProlificClient(settings) as client:
        results = prolific.pay_lines(client, STUDY, "GBP", lines(150), state, lambda s: None)
    assert {r.status for r in results} == {LineStatus.failed} and state == prolific.BonusPayment()


# --- Prolific: the way through ------------------------------------------------------------------


def test_bonuses_are_set_up_then_paid_once(fake_prolific: FakeProlific) -> None:
    journal = Journal(fake_prolific)
    state = prolific.BonusPayment()
    batch = lines(150, 5, 1200)
    with prolific.ProlificClient(prolific_settings(fake_prolific)) as client:
        results = prolific.pay_lines(client, STUDY, "GBP", batch, state, journal)
        assert [(r.unique_request_token, r.status) for r in results] == [
            (line.unique_request_token, LineStatus.paid) for line in batch
        ]
        again = prolific.pay_lines(client, STUDY, "GBP", batch, state, journal)  # the caller forgot it was paid
    assert {r.status for r in again} == {LineStatus.unknown}  # never a second pay
    setup = fake_prolific.requests[0]
    assert setup["body"] == {"study_id": STUDY, "csv_bonuses": f"{pid(0)},1.50\n{pid(1)},0.05\n{pid(2)},12.00\n"}
    assert [r["op"] for r in fake_prolific.requests] == ["create-bonus-payments", "pay-bonus-payments"]
    assert state == prolific.BonusPayment(setup_id="bulk1", setup_unknown=False, pay_sent=True)


# --- MTurk, against botocore's own service model --------------------------------------------------

WORKER = "A1B2C3D4E5F6G7"


def assignment(n: int) -> str:
    return f"3ASSIGN{n:023d}"


@pytest.fixture
def stubbed_mturk() -> Iterator[tuple[Any, Any]]:
    from botocore.stub import Stubber

    settings = Settings(mturk_access_key_id="AKIATESTTESTTEST", mturk_secret_access_key=SecretStr("test-secret"))
    client = mturk.boto3_client(settings)
    assert client.meta.endpoint_url == mturk.SANDBOX_ENDPOINT and client.meta.region_name == "us-east-1"
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()  # every expected call was made, and no other


def usd(*amounts: int) -> list[PayLine]:
    return [
        PayLine(WORKER, amount, "USD", "Bonus: 3 examples validated", f"b12-l{i}", assignment(i))
        for i, amount in enumerate(amounts)
    ]


def bonus_params(line: PayLine, amount: str) -> dict[str, Any]:
    return {
        "WorkerId": line.worker_id,
        "BonusAmount": amount,
        "AssignmentId": line.assignment_id,
        "Reason": line.reason,
        "UniqueRequestToken": line.unique_request_token,
    }


def test_mturk_bonuses_carry_their_token_and_a_duplicate_token_counts_as_paid(stubbed_mturk: tuple[Any, Any]) -> None:
    client, stubber = stubbed_mturk
    batch = usd(150, 5, 30, 45)
    stubber.add_response("send_bonus", {}, bonus_params(batch[0], "1.50"))
    # MTurk's documented answer to a token already used: an error whose message holds the
    # request id. Its exact words are not documented; these stand for them.
    stubber.add_client_error(
        "send_bonus", "RequestError", "The request is a duplicate of a previous request (token b12-l1).", 400,
        expected_params=bonus_params(batch[1], "0.05"),
    )  # fmt: skip
    stubber.add_client_error(
        "send_bonus", "RequestError", "You do not have enough funds to pay for this bonus.", 400,
        expected_params=bonus_params(batch[2], "0.30"),
    )  # fmt: skip
    stubber.add_client_error(
        "send_bonus", "ServiceFault", "Internal error", 500, expected_params=bonus_params(batch[3], "0.45")
    )
    results = mturk.pay_lines(client, batch)
    assert [r.status for r in results] == [
        LineStatus.paid, LineStatus.already_paid, LineStatus.failed, LineStatus.unknown,
    ]  # fmt: skip
    # The refused line was sent once, not again blindly (the Stubber would refuse an extra call).
    assert results[2].platform_answer["error"] == "RequestError" and "funds" in results[2].platform_answer["message"]


def test_mturk_refuses_other_currencies_and_bad_ids_before_any_call(stubbed_mturk: tuple[Any, Any]) -> None:
    client, _ = stubbed_mturk
    with pytest.raises(Invalid, match="USD"):
        mturk.pay_lines(client, [PayLine(WORKER, 150, "GBP", "bonus", "t1", assignment(1))])
    with pytest.raises(Invalid, match="worker id"):
        mturk.pay_lines(client, [PayLine("not-a-worker", 150, "USD", "bonus", "t1", assignment(1))])
    with pytest.raises(Invalid, match="assignment id"):
        mturk.pay_lines(client, [PayLine(WORKER, 150, "USD", "bonus", "t1", None)])
    from services.platforms import Decision

    with pytest.raises(Invalid, match="feedback"):
        mturk.decide(client, [Decision(1, assignment(1), Verdict.reject, "screened out")], reject_feedback=None)


def test_mturk_approves_and_rejects_with_feedback(stubbed_mturk: tuple[Any, Any]) -> None:
    from services.platforms import Decision

    client, stubber = stubbed_mturk
    feedback = "You failed the task's onboarding quiz; the HIT asked workers to return it in that case."
    stubber.add_response("approve_assignment", {}, {"AssignmentId": assignment(1)})
    stubber.add_response("reject_assignment", {}, {"AssignmentId": assignment(2), "RequesterFeedback": feedback})
    stubber.add_client_error("approve_assignment", "RequestError", "not in Submitted status", 400,
                             expected_params={"AssignmentId": assignment(4)})  # fmt: skip
    decisions = [
        Decision(1, assignment(1), Verdict.approve, "completed"),
        Decision(2, assignment(2), Verdict.reject, "screened out"),
        Decision(3, assignment(3), Verdict.skip, "active"),
        Decision(4, assignment(4), Verdict.approve, "completed"),
    ]
    results = mturk.decide(client, decisions, reject_feedback=feedback)
    assert [(r.session_id, r.verdict, r.ok) for r in results] == [
        (1, Verdict.approve, True), (2, Verdict.reject, True), (3, Verdict.skip, True), (4, Verdict.approve, False),
    ]  # fmt: skip


def test_the_external_question_is_mturks_schema_with_the_links_url() -> None:
    url = "https://crowd.example.org/study/abc?x=1&y=<2>"
    root = ET.fromstring(mturk.external_question(url, 0))
    ns = "{" + mturk.EXTERNAL_QUESTION_NS + "}"
    assert root.tag == f"{ns}ExternalQuestion"
    assert root.find(f"{ns}ExternalURL").text == url  # type: ignore[union-attr]  # escaped, and read back whole
    assert root.find(f"{ns}FrameHeight").text == "0"  # type: ignore[union-attr]
    with pytest.raises(Invalid, match="https"):
        mturk.external_question("http://crowd.example.org/study/abc", 0)


# --- the CLI on the real database ------------------------------------------------------------------

TASK = "dynasent-r2"
PROMPTS = [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(6)]
API = "/api/v1"


def paid_round(client: Any, researcher: Actor, stub_model: Any, currency: str) -> dict[str, Any]:
    pay = {"currency": currency, "base_pay": {"writer": 150, "validator": 100}}
    return open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None, pay=pay), stub_model.url, PROMPTS)


def make_link(client: Any, researcher: Actor, round_id: int, platform: str, **body: Any) -> dict[str, Any]:
    payload = {"name": "R1 writers", "round_id": round_id, "role": "writer", "platform": platform, "quota": 2,
               "max_workers": 40, **body}  # fmt: skip
    response = client.post(f"{API}/tasks/{TASK}/study-links", json=payload, headers=researcher.headers)
    assert response.status_code == 201, response.text
    return dict(response.json())


def cli(*args: str, database_url: str) -> Any:
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli_app

    return CliRunner().invoke(cli_app, ["platform", *args, "--database-url", database_url], catch_exceptions=False)


def test_the_cli_approves_a_prolific_links_submissions_from_their_outcomes(
    client: Any, app: Any, settings: Any, researcher: Actor, stub_model: Any, fake_prolific: FakeProlific,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("DYNALOOP_PROLIFIC_API_TOKEN", TOKEN)
    monkeypatch.setenv("DYNALOOP_PROLIFIC_API_URL", fake_prolific.url)
    round_ = paid_round(client, researcher, stub_model, "GBP")
    link = make_link(client, researcher, round_["id"], "prolific", screened_out_code="SCREEN1", partial_code="PART1")
    ids = {}
    for n, outcome in enumerate(("completed", "stopped", "screened_out", "active")):
        params = {"PROLIFIC_PID": pid(10 + n), "STUDY_ID": STUDY, "SESSION_ID": pid(20 + n)}
        started = client.post(f"{API}/study/{link['slug']}/sessions", json={"params": params})
        assert started.status_code == 201, started.text
        ids[outcome] = started.json()["session"]["id"]
        if outcome == "stopped":
            finished = client.post(
                f"{API}/study-sessions/{ids[outcome]}/finish", json={"reason": "stop"},
                headers={"Authorization": f"Bearer {started.json()['token']}"},
            )  # fmt: skip
            assert finished.status_code == 200, finished.text
    # Completing through the quota and screening out are tested in tests/test_study_links.py;
    # here the outcomes are set on the rows so that each decision shows.
    with session_scope(app.state.sessionmaker) as session:
        for outcome in ("completed", "screened_out"):
            row = session.get(StudySession, ids[outcome])
            assert row is not None
            row.status = StudySessionStatus(outcome)

    # Bad input first: a rejection without Prolific's 100-character message, the wrong platform,
    # a missing link. Nothing is sent and nothing written.
    before = table_counts(app)
    refused = cli(
        "approve",
        str(link["id"]),
        "--screened-out",
        "reject",
        "--reject-message",
        "no",
        database_url=settings.database_url,
    )
    assert refused.exit_code == 1 and "100 characters" in refused.output
    assert cli("create-hit", str(link["id"]), "--web-url", "https://c.example", "--title", "t", "--description", "d",
               "--minutes", "5", database_url=settings.database_url).exit_code == 1  # fmt: skip
    assert cli("approve", "987654", database_url=settings.database_url).exit_code == 1
    assert table_counts(app) == before and fake_prolific.requests == []

    dry = cli("approve", str(link["id"]), "--dry-run", database_url=settings.database_url)
    assert dry.exit_code == 0 and fake_prolific.requests == [] and table_counts(app) == before
    done = cli("approve", str(link["id"]), database_url=settings.database_url)
    assert done.exit_code == 0, done.output
    sent = {(r["path"].split("/")[4], r["body"]["action"]) for r in fake_prolific.requests}
    assert sent == {(pid(20), "APPROVE"), (pid(21), "APPROVE"), (pid(22), "APPROVE")}  # the active one is left alone
    with session_scope(app.state.sessionmaker) as session:
        audited = session.scalars(select(AuditEntry).where(AuditEntry.action == "platform.approve")).all()
        assert sorted(int(a.target_id) for a in audited) == sorted(
            ids[o] for o in ("completed", "stopped", "screened_out")
        )
        assert all(a.details["ok"] for a in audited) and TOKEN not in json.dumps([a.details for a in audited])

    # Run again: what the platform decided for good is not sent again. A new screened-out worker
    # is rejected when asked, with Prolific's message and category.
    again = cli("approve", str(link["id"]), database_url=settings.database_url)
    assert again.exit_code == 0 and "approved before (audit log)" in again.output and len(fake_prolific.requests) == 3
    params = {"PROLIFIC_PID": pid(30), "STUDY_ID": STUDY, "SESSION_ID": pid(31)}
    late = client.post(f"{API}/study/{link['slug']}/sessions", json={"params": params})
    assert late.status_code == 201, late.text
    with session_scope(app.state.sessionmaker) as session:
        row = session.get(StudySession, late.json()["session"]["id"])
        assert row is not None
        row.status = StudySessionStatus.screened_out
    message = "Your submission was screened out by the task's onboarding: " + "the instructions asked " * 5
    rejected = cli("approve", str(link["id"]), "--screened-out", "reject", "--reject-message", message,
                   database_url=settings.database_url)  # fmt: skip
    assert rejected.exit_code == 0, rejected.output
    [reject] = fake_prolific.requests[3:]
    assert reject["path"] == f"/api/v1/submissions/{pid(31)}/transition/"
    assert reject["body"] == {"action": "REJECT", "message": message, "rejection_category": "OTHER"}


def test_decisions_follow_each_sessions_outcome_and_the_links_codes(
    client: Any, app: Any, researcher: Actor, stub_model: Any
) -> None:
    round_ = paid_round(client, researcher, stub_model, "GBP")
    bare = make_link(client, researcher, round_["id"], "prolific")  # no screened-out or partial code
    params = {"PROLIFIC_PID": pid(1), "STUDY_ID": STUDY, "SESSION_ID": pid(2)}
    started = client.post(f"{API}/study/{bare['slug']}/sessions", json={"params": params}).json()
    client.post(f"{API}/study-sessions/{started['session']['id']}/finish", json={"reason": "stop"},
                headers={"Authorization": f"Bearer {started['token']}"})  # fmt: skip
    from services.domain import study

    with session_scope(app.state.sessionmaker) as session:
        link = study.get_link(session, bare["id"])
        sessions = study.link_sessions(session, link)
        [stopped] = decisions_for(sessions, link)
        assert stopped.verdict is Verdict.skip and "return" in stopped.why  # asked to return it: not approved
        sessions[0].status = StudySessionStatus.screened_out
        assert decisions_for(sessions, link)[0].verdict is Verdict.skip  # no screened-out code: returned
        assert decisions_for(sessions, link, "approve")[0].verdict is Verdict.approve
        with pytest.raises(Invalid):
            decisions_for(sessions, link, "pay-twice")
        session.rollback()


def test_the_cli_creates_a_draft_prolific_study_from_a_link(
    client: Any, app: Any, settings: Any, researcher: Actor, stub_model: Any, fake_prolific: FakeProlific,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("DYNALOOP_PROLIFIC_API_TOKEN", TOKEN)
    monkeypatch.setenv("DYNALOOP_PROLIFIC_API_URL", fake_prolific.url)
    round_ = paid_round(client, researcher, stub_model, "GBP")
    link = make_link(client, researcher, round_["id"], "prolific", completion_code="DONE1", screened_out_code="OUT1")
    before = table_counts(app)
    http = cli("create-study", str(link["id"]), "--web-url", "http://crowd.example.org", "--description", "Write",
               "--minutes", "20", database_url=settings.database_url)  # fmt: skip
    assert http.exit_code == 1 and "https" in http.output and fake_prolific.requests == []
    assert table_counts(app) == before
    made = cli("create-study", str(link["id"]), "--web-url", "https://crowd.example.org/", "--description",
               "Write sentences that fool a sentiment model.", "--minutes", "20",
               database_url=settings.database_url)  # fmt: skip
    assert made.exit_code == 0, made.output
    assert "600000000000000000000001" in made.output
    [request] = fake_prolific.requests
    body = request["body"]
    assert body["external_study_url"] == (
        f"https://crowd.example.org/study/{link['slug']}"
        "?PROLIFIC_PID={{%PROLIFIC_PID%}}&STUDY_ID={{%STUDY_ID%}}&SESSION_ID={{%SESSION_ID%}}"
    )
    assert (body["total_available_places"], body["reward"], body["estimated_completion_time"]) == (40, 150, 20)
    assert [c["code"] for c in body["completion_codes"]] == ["DONE1", "OUT1"]
    assert body["completion_codes"][0]["code_type"] == "COMPLETED"
    # Running it again would make a second draft (Prolific's call is not idempotent): refused
    # unless asked for, and nothing sent.
    args = ("create-study", str(link["id"]), "--web-url", "https://crowd.example.org/", "--description", "W",
            "--minutes", "20")  # fmt: skip
    before = table_counts(app)
    second = cli(*args, database_url=settings.database_url)
    assert second.exit_code == 1 and "already has study_id 600000000000000000000001" in second.output
    assert len(fake_prolific.requests) == 1 and table_counts(app) == before
    assert cli(*args, "--again", database_url=settings.database_url).exit_code == 0
    assert len(fake_prolific.requests) == 2


def test_the_cli_creates_an_mturk_hit_with_the_links_external_question(
    client: Any, app: Any, settings: Any, researcher: Actor, stub_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.stub import ANY, Stubber

    round_ = paid_round(client, researcher, stub_model, "USD")
    link = make_link(client, researcher, round_["id"], "mturk", max_workers=25)
    boto = mturk.boto3_client(Settings(mturk_access_key_id="AKIATESTTESTTEST", mturk_secret_access_key=SecretStr("s")))
    monkeypatch.setattr(mturk, "boto3_client", lambda settings: boto)
    expected = {
        "Title": "Fool a sentiment model", "Description": "Write sentences", "Reward": "1.50", "MaxAssignments": 25,
        "AssignmentDurationInSeconds": 3600, "LifetimeInSeconds": 7 * 86400, "Question": ANY,
        "RequesterAnnotation": f"dynaloop link {link['id']}", "UniqueRequestToken": ANY,
    }  # fmt: skip
    hit = {"HIT": {"HITId": "3HIT" + "0" * 26, "HITTypeId": "3TYPE" + "0" * 25, "HITGroupId": "3GROUP" + "0" * 24}}
    with Stubber(boto) as stubber:
        stubber.add_response("create_hit", hit, expected)
        made = cli("create-hit", str(link["id"]), "--web-url", "https://crowd.example.org", "--title",
                   "Fool a sentiment model", "--description", "Write sentences", "--minutes", "15",
                   database_url=settings.database_url)  # fmt: skip
        assert made.exit_code == 0, made.output
        stubber.assert_no_pending_responses()
    assert "3HIT" + "0" * 26 in made.output and "sandbox" in made.output
    from services.domain import study

    with session_scope(app.state.sessionmaker) as session:
        row = study.get_link(session, link["id"])
        request = mturk.hit_request(
            row, web_url="https://crowd.example.org", title="t", description="d", reward_minor=150, currency="USD",
            estimated_minutes=15,
        )  # fmt: skip
        with pytest.raises(Invalid, match="USD"):
            mturk.hit_request(row, web_url="https://c.example", title="t", description="d", reward_minor=150,
                              currency="GBP", estimated_minutes=15)  # fmt: skip
    assert len(request["UniqueRequestToken"]) <= 64
    ns = "{" + mturk.EXTERNAL_QUESTION_NS + "}"
    question = ET.fromstring(request["Question"])
    assert question.find(f"{ns}ExternalURL").text == f"https://crowd.example.org/study/{link['slug']}"  # type: ignore[union-attr]
    with session_scope(app.state.sessionmaker) as session:
        [audited] = session.scalars(select(AuditEntry).where(AuditEntry.action == "platform.create_hit")).all()
        assert audited.details["hit_id"] == "3HIT" + "0" * 26

    # A worker accepts the HIT, is screened out (the link has no screened-out code: they were
    # asked to return it) and another completes: `approve` approves the completed assignment only.
    sessions = {}
    for n, outcome in enumerate(("completed", "screened_out")):
        params = {"workerId": f"A{n}WORKER00000", "assignmentId": assignment(n), "hitId": "3HIT" + "0" * 26,
                  "turkSubmitTo": "https://workersandbox.mturk.com"}  # fmt: skip
        started = client.post(f"{API}/study/{link['slug']}/sessions", json={"params": params})
        assert started.status_code == 201, started.text
        sessions[outcome] = started.json()["session"]["id"]
    with session_scope(app.state.sessionmaker) as session:
        for outcome, session_id in sessions.items():  # the ways there are tests/test_study_links.py's
            study_row = session.get(StudySession, session_id)
            assert study_row is not None
            study_row.status = StudySessionStatus(outcome)
    with Stubber(boto) as stubber:
        stubber.add_response("approve_assignment", {}, {"AssignmentId": assignment(0)})
        approved = cli("approve", str(link["id"]), database_url=settings.database_url)
        assert approved.exit_code == 0, approved.output
        stubber.assert_no_pending_responses()
    with session_scope(app.state.sessionmaker) as session:
        [decided] = session.scalars(select(AuditEntry).where(AuditEntry.action == "platform.approve")).all()
        assert decided.target_id == str(sessions["completed"]) and decided.details["submission_id"] == assignment(0)


def test_pay_batch_picks_the_platform_and_refuses_what_it_cannot_pay(
    fake_prolific: FakeProlific, monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.stub import Stubber

    from services.db.models import Platform
    from services.platforms.paying import pay_batch

    settings = prolific_settings(fake_prolific)
    saved: list[prolific.BonusPayment] = []
    state = prolific.BonusPayment()
    with pytest.raises(Invalid, match="study id"):
        pay_batch(settings, Platform.prolific, currency="GBP", lines=lines(150))
    with pytest.raises(Invalid, match="by hand"):
        pay_batch(settings, Platform.generic, currency="GBP", lines=lines(150))
    with pytest.raises(Invalid, match="USD only"):
        pay_batch(settings, Platform.mturk, currency="GBP", lines=lines(150))
    assert fake_prolific.requests == []
    results = pay_batch(
        settings, Platform.prolific, currency="GBP", lines=lines(150, 20), prolific_study_id=STUDY,
        prolific_state=state, save_prolific_state=saved.append,
    )  # fmt: skip
    assert {r.status for r in results} == {LineStatus.paid} and state.setup_id == "bulk1" and saved

    boto = mturk.boto3_client(Settings(mturk_access_key_id="AKIATESTTESTTEST", mturk_secret_access_key=SecretStr("s")))
    monkeypatch.setattr(mturk, "boto3_client", lambda settings: boto)
    [line] = usd(250)
    with Stubber(boto) as stubber:
        stubber.add_response("send_bonus", {}, bonus_params(line, "2.50"))
        [result] = pay_batch(settings, Platform.mturk, currency="USD", lines=[line])
        stubber.assert_no_pending_responses()
    assert result.status is LineStatus.paid and result.unique_request_token == line.unique_request_token


def test_without_boto3_everything_imports_and_mturk_says_how_to_install_it() -> None:
    """`pip install -e .` has no boto3: the CLI and the modules load, and an MTurk call says
    which extra to install (a fresh interpreter in which importing boto3 fails)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['boto3'] = None; sys.modules['botocore'] = None\n"
        "import dynaloop.cli, services.platforms.paying\n"
        "from services.platforms import mturk\n"
        "from services.settings import Settings\n"
        "try:\n    mturk.boto3_client(Settings())\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Invalid ") and "dynaloop[platforms]" in done.stdout
