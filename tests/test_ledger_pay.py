"""`dynaloop ledger pay BATCH` (issue #27, part E): a payout batch paid through the platform's
API, on the real database (SQLite and PostgreSQL).

Prolific is the local server of tests/test_platforms.py (real HTTP on 127.0.0.1; every request
checked against tests/data/prolific_api_requests.json, written from Prolific's API reference);
MTurk is botocore's ``Stubber`` on the client the command makes (each call checked against
AWS's own MTurk service model and the exact parameters expected here; an unexpected call fails
the test). The refusals first: a batch that is cancelled or paid, a second run at the same time,
a claim another run holds, a study id that is not the batch's: nothing sent, nothing written.
Then the ways through: paid once, resumed after a failure or a crash without paying twice.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import select, update

from services.db.engine import session_scope
from services.db.models import (
    AuditEntry,
    LedgerEntry,
    LedgerKind,
    PayoutBatch,
    PayoutLine,
    PayoutStatus,
    Platform,
    Round,
    StudyLink,
    StudyRole,
    StudySession,
    StudySessionStatus,
    User,
    utcnow,
)
from services.domain import audit, payouts, tasks, users
from services.errors import Conflict
from services.platforms import mturk
from tests.conftest import MakeUser, example_yaml, table_snapshot
from tests.test_platforms import (  # the fake Prolific and the stubbed MTurk client, reused
    STUDY,
    TOKEN,
    FakeProlific,
    assignment,
    fake_prolific,  # noqa: F401  (a fixture)
    pid,
    stubbed_mturk,  # noqa: F401  (a fixture)
)

pytestmark = pytest.mark.both_databases  # money: payments issued once


TASK = "dynasent-r2"
PAY = {"currency": "USD", "base_pay": {"writer": 150, "validator": 100}, "writer_bonus_per_example": 10}
TABLES = ("payout_batches", "payout_lines", "payout_events", "ledger_entries", "audit_log")
REASON = f"Bonus for task {TASK}"


def worker(n: int) -> str:
    return f"AWORKER{n:05d}"


@dataclass
class Batches:
    prolific: int  # 3 lines: pid(1) 1.50, pid(2) 0.05, pid(3) 0.30 (USD)
    mturk: int  # 3 lines: worker(1) 1.50, worker(2) 0.05, worker(3) 0.30 (USD)


@pytest.fixture
def batches(app: Any, make_user: MakeUser) -> Batches:
    """A USD task with a Prolific writers' link (study STUDY) and an MTurk validators' link, three
    workers with a bonus on each, and a created payout batch per link."""
    make_user("rita", "researcher")
    for n in range(1, 4):
        make_user(f"w{n}", "writer", "validator")
    with session_scope(app.state.sessionmaker) as session:
        ids = {u.username: u.id for u in session.scalars(select(User))}
        task = tasks.create_task(
            session, users.get_user(session, "rita"), example_yaml(TASK, onboarding_quiz=None, pay=PAY)
        )
        round_ = Round(task_id=task.id, number=1)
        session.add(round_)
        session.flush()
        made = {}
        for platform, role in ((Platform.prolific, StudyRole.writer), (Platform.mturk, StudyRole.validator)):
            link = StudyLink(slug=f"slug-{platform.value}", name=platform.value, task_id=task.id, round_id=round_.id,
                             role=role, platform=platform, quota=5, completion_code="C-1")  # fmt: skip
            session.add(link)
            session.flush()
            for n, amount in ((1, 150), (2, 5), (3, 30)):
                prolific = platform is Platform.prolific
                study_session = StudySession(
                    link_id=link.id,
                    user_id=ids[f"w{n}"],
                    status=StudySessionStatus.completed,
                    platform_worker_id=pid(n) if prolific else worker(n),
                    platform_study_id=STUDY if prolific else None,
                    platform_session_id=pid(20 + n) if prolific else assignment(n),
                )
                session.add(study_session)
                session.flush()
                kind = LedgerKind.writer_bonus if prolific else LedgerKind.validator_bonus
                session.add(LedgerEntry(task_id=task.id, round_id=None, user_id=ids[f"w{n}"],
                                        session_id=study_session.id, kind=kind, event_key=f"{platform.value}-{n}",
                                        amount_minor=amount, currency="USD", reason="bonus"))  # fmt: skip
            session.flush()
            made[platform] = payouts.create_batch(session, None, task, link).batch.id
    return Batches(prolific=made[Platform.prolific], mturk=made[Platform.mturk])


def pay(settings: Any, *args: str) -> Any:
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli_app

    return CliRunner().invoke(
        cli_app,
        ["ledger", "pay", *args, "--task", TASK, "--database-url", settings.database_url],
        catch_exceptions=False,
    )


def lines(app: Any, batch_id: int) -> list[PayoutLine]:
    with session_scope(app.state.sessionmaker) as session:
        return list(
            session.scalars(select(PayoutLine).where(PayoutLine.batch_id == batch_id).order_by(PayoutLine.line_number))
        )


def batch_row(app: Any, batch_id: int) -> PayoutBatch:
    with session_scope(app.state.sessionmaker) as session:
        batch = session.get(PayoutBatch, batch_id)
        assert batch is not None
        return batch


def audit_actions(app: Any, batch_id: int) -> list[str]:
    with session_scope(app.state.sessionmaker) as session:
        return list(
            session.scalars(
                select(AuditEntry.action)
                .where(AuditEntry.target_type == "payout_batch", AuditEntry.target_id == str(batch_id))
                .order_by(AuditEntry.id)
            )
        )


@pytest.fixture
def prolific_env(fake_prolific: FakeProlific, monkeypatch: pytest.MonkeyPatch) -> FakeProlific:  # noqa: F811
    monkeypatch.setenv("DYNALOOP_PROLIFIC_API_TOKEN", TOKEN)
    monkeypatch.setenv("DYNALOOP_PROLIFIC_API_URL", fake_prolific.url)
    monkeypatch.setenv("DYNALOOP_PLATFORM_TIMEOUT_S", "2")
    return fake_prolific


@pytest.fixture
def mturk_stub(stubbed_mturk: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> Any:  # noqa: F811
    """The Stubber on the client the command makes (boto3_client answers the stubbed client)."""
    client, stubber = stubbed_mturk
    monkeypatch.setattr(mturk, "boto3_client", lambda settings: client)
    return stubber


def expect_bonus(stubber: Any, line: PayoutLine, amount: str, request_id: str) -> None:
    params = {"WorkerId": line.platform_worker_id, "BonusAmount": amount, "AssignmentId": line.assignment_id,
              "Reason": REASON, "UniqueRequestToken": line.unique_request_token}  # fmt: skip
    stubber.add_response("send_bonus", {"ResponseMetadata": {"RequestId": request_id}}, params)


# --- refusals: nothing sent, nothing written --------------------------------------------------------


@pytest.mark.parametrize("status", ["cancelled", "paid"])
def test_a_cancelled_or_paid_batch_is_refused_with_nothing_sent_or_written(
    app: Any, settings: Any, batches: Batches, prolific_env: FakeProlific, mturk_stub: Any, status: str
) -> None:
    with session_scope(app.state.sessionmaker) as session:
        for batch_id in (batches.prolific, batches.mturk):
            batch = payouts.get_batch(session, batch_id)
            (payouts.cancel if status == "cancelled" else payouts.mark_paid)(session, None, batch)
    before = table_snapshot(app, *TABLES)
    for batch_id in (batches.prolific, batches.mturk):
        refused = pay(settings, str(batch_id))
        assert refused.exit_code == 1 and f"is {status}; only a created batch is paid" in refused.output
    assert table_snapshot(app, *TABLES) == before
    assert prolific_env.requests == []  # and the Stubber, with nothing queued, saw no call


def test_a_study_id_that_is_not_the_batchs_is_refused_with_nothing_sent(
    app: Any, settings: Any, batches: Batches, prolific_env: FakeProlific
) -> None:
    before = table_snapshot(app, *TABLES)
    wrong_form = pay(settings, str(batches.prolific), "--study-id", "../../users/me")
    assert wrong_form.exit_code == 1 and "not a Prolific study id" in wrong_form.output
    other = pay(settings, str(batches.prolific), "--study-id", pid(99))
    assert other.exit_code == 1 and f"pays participants of Prolific study {STUDY}" in other.output
    with session_scope(app.state.sessionmaker) as session:  # no session recorded its study
        session.execute(update(StudySession).values(platform_study_id=None))
    before = table_snapshot(app, *TABLES)
    unknown = pay(settings, str(batches.prolific))
    assert unknown.exit_code == 1 and "pass the study's id (--study-id)" in unknown.output
    assert table_snapshot(app, *TABLES) == before and prolific_env.requests == []
    given = pay(settings, str(batches.prolific), "--study-id", STUDY)
    assert given.exit_code == 0, given.output
    assert [r["body"]["study_id"] for r in prolific_env.requests[:1]] == [STUDY]


def test_the_researchers_study_outranks_what_workers_sent_and_a_disagreement_is_refused(
    app: Any, settings: Any, batches: Batches, prolific_env: FakeProlific
) -> None:
    """STUDY_ID arrives in the worker's link: a worker-sent id never overrules the study that
    `dynaloop platform create-study` made for the link, and a disagreement sends nothing."""
    made = pid(42)
    with session_scope(app.state.sessionmaker) as session:
        batch = payouts.get_batch(session, batches.prolific)
        audit.record(session, None, "platform.create_study", "study_link", batch.link_id, study_id=made)
    before = table_snapshot(app, *TABLES)
    refused = pay(settings, str(batches.prolific))  # the sessions recorded STUDY, not the made study
    assert refused.exit_code == 1 and "the study made for study link" in refused.output, refused.output
    assert table_snapshot(app, *TABLES) == before and prolific_env.requests == []
    with session_scope(app.state.sessionmaker) as session:  # the sessions agree with the researcher
        session.execute(update(StudySession).values(platform_study_id=made))
    paid = pay(settings, str(batches.prolific))
    assert paid.exit_code == 0, paid.output
    assert [r["body"]["study_id"] for r in prolific_env.requests[:1]] == [made]


def test_a_claim_another_run_holds_is_refused_until_taken_over(
    app: Any, settings: Any, batches: Batches, prolific_env: FakeProlific
) -> None:
    with session_scope(app.state.sessionmaker) as session:  # a run that is still going (or was killed)
        session.execute(
            update(PayoutBatch)
            .where(PayoutBatch.id == batches.prolific)
            .values(pay_run_id="a" * 32, pay_run_at=utcnow())
        )
    before = table_snapshot(app, *TABLES)
    refused = pay(settings, str(batches.prolific))
    assert refused.exit_code == 1 and "another `dynaloop ledger pay` run holds" in refused.output
    assert "--take-over" in refused.output
    cancel = pay(settings, str(batches.prolific), "--record-line", "all", "--as", "paid")
    assert cancel.exit_code == 1
    with session_scope(app.state.sessionmaker) as session, pytest.raises(Conflict, match="being paid"):
        payouts.cancel(session, None, payouts.get_batch(session, batches.prolific))
    assert table_snapshot(app, *TABLES) == before and prolific_env.requests == []
    taken = pay(settings, str(batches.prolific), "--take-over")
    assert taken.exit_code == 0, taken.output
    assert [r["op"] for r in prolific_env.requests] == ["create-bonus-payments", "pay-bonus-payments"]
    assert batch_row(app, batches.prolific).pay_run_id is None


def test_two_runs_at_once_never_both_call_the_platform(
    app: Any, settings: Any, batches: Batches, prolific_env: FakeProlific
) -> None:
    run_settings = settings.model_copy(
        update={"prolific_api_token": SecretStr(TOKEN), "prolific_api_url": prolific_env.url, "platform_timeout_s": 5.0}
    )
    prolific_env.script["create-bonus-payments"] = [{"status": 201, "delay": 1.0, "body": None}]
    prolific_env.script["create-bonus-payments"][0]["body"] = {"id": "bulk-slow", "amount": 185}
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def one_run() -> None:
        barrier.wait()
        try:
            with session_scope(app.state.sessionmaker) as session:
                payouts.pay_batch_through_platform(
                    session, None, payouts.get_batch(session, batches.prolific), run_settings
                )
            outcomes.append("paid")
        except Conflict as exc:
            outcomes.append(f"refused: {exc.message}")

    threads = [threading.Thread(target=one_run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(o.split(":")[0] for o in outcomes) == ["paid", "refused"], outcomes
    assert "another `dynaloop ledger pay` run holds" in next(o for o in outcomes if o.startswith("refused"))
    assert [r["op"] for r in prolific_env.requests] == ["create-bonus-payments", "pay-bonus-payments"]
    assert batch_row(app, batches.prolific).status is PayoutStatus.paid


# --- MTurk --------------------------------------------------------------------------------------------


def test_an_mturk_batch_is_paid_line_by_line_with_its_tokens_and_marked_paid(
    app: Any, settings: Any, batches: Batches, mturk_stub: Any
) -> None:
    unpaid = lines(app, batches.mturk)
    for line, amount in zip(unpaid, ("1.50", "0.05", "0.30"), strict=True):
        expect_bonus(mturk_stub, line, amount, f"req-{line.line_number}")
    paid = pay(settings, str(batches.mturk))
    assert paid.exit_code == 0, paid.output
    assert "3 lines sent to mturk; the batch is paid" in paid.output
    mturk_stub.assert_no_pending_responses()
    recorded = lines(app, batches.mturk)
    assert [(ln.platform_status, ln.platform_reference) for ln in recorded] == [
        ("paid", "req-1"), ("paid", "req-2"), ("paid", "req-3"),
    ]  # fmt: skip
    assert all(
        ln.paid_at is not None and ln.platform_answer == {"request_id": ln.platform_reference} for ln in recorded
    )
    batch = batch_row(app, batches.mturk)
    assert batch.status is PayoutStatus.paid and batch.paid_at is not None and batch.pay_run_id is None
    assert audit_actions(app, batches.mturk) == ["payout.create", "payout.paid", "payout.pay"]
    before = table_snapshot(app, *TABLES)
    again = pay(settings, str(batches.mturk))  # the Stubber has nothing queued: a call would fail the test
    assert again.exit_code == 1 and "is paid; only a created batch is paid" in again.output
    assert table_snapshot(app, *TABLES) == before


def test_an_mturk_run_that_loses_line_2_stops_and_the_next_run_sends_line_3_alone(
    app: Any, settings: Any, batches: Batches, mturk_stub: Any
) -> None:
    first, second, third = lines(app, batches.mturk)
    expect_bonus(mturk_stub, first, "1.50", "req-1")
    params = {"WorkerId": second.platform_worker_id, "BonusAmount": "0.05", "AssignmentId": second.assignment_id,
              "Reason": REASON, "UniqueRequestToken": second.unique_request_token}  # fmt: skip
    mturk_stub.add_client_error("send_bonus", "ServiceFault", "Internal error", 500, expected_params=params)
    stopped = pay(settings, str(batches.mturk))
    assert stopped.exit_code == 1
    mturk_stub.assert_no_pending_responses()  # line 3 was not sent: the run stopped at line 2
    assert [ln.platform_status for ln in lines(app, batches.mturk)] == ["paid", "unknown", None]
    assert "stopped after line 2" in stopped.output and "--record-line N --as paid|failed" in stopped.output

    expect_bonus(mturk_stub, third, "0.30", "req-3")  # exactly one call: line 3; line 2 is never resent here
    resumed = pay(settings, str(batches.mturk))
    assert resumed.exit_code == 1 and "1 lines sent to mturk; the batch is created" in resumed.output
    mturk_stub.assert_no_pending_responses()
    assert [ln.platform_status for ln in lines(app, batches.mturk)] == ["paid", "unknown", "paid"]
    with session_scope(app.state.sessionmaker) as session, pytest.raises(Conflict, match="cannot be cancelled"):
        payouts.cancel(session, None, payouts.get_batch(session, batches.mturk))

    before = table_snapshot(app, *TABLES)
    for args, message in (
        (("--record-line", "3", "--as", "paid"), "line 3 of payout batch"),  # paid already: not recorded by hand
        (("--record-line", "2", "--as", "refunded"), "record a line as one of"),
        (("--record-line", "all", "--as", "paid"), "name the MTurk line"),
        (("--as", "paid"), "go with --record-line"),
    ):
        refused = pay(settings, str(batches.mturk), *args)
        assert refused.exit_code == 1 and message in refused.output, refused.output
    assert table_snapshot(app, *TABLES) == before
    recorded = pay(
        settings, str(batches.mturk), "--record-line", "2", "--as", "paid", "--reference", "checked-on-mturk"
    )
    assert recorded.exit_code == 0 and "the batch is paid" in recorded.output, recorded.output
    assert [(ln.platform_status, ln.platform_reference) for ln in lines(app, batches.mturk)] == [
        ("paid", "req-1"), ("paid", "checked-on-mturk"), ("paid", "req-3"),
    ]  # fmt: skip
    assert audit_actions(app, batches.mturk)[-3:] == ["payout.pay", "payout.record_line", "payout.paid"]


# --- Prolific ------------------------------------------------------------------------------------------


def test_a_prolific_batch_is_set_up_and_paid_once(
    app: Any, settings: Any, batches: Batches, prolific_env: FakeProlific
) -> None:
    paid = pay(settings, str(batches.prolific))
    assert paid.exit_code == 0, paid.output
    assert [r["op"] for r in prolific_env.requests] == ["create-bonus-payments", "pay-bonus-payments"]
    set_up = prolific_env.requests[0]["body"]
    assert set_up == {"study_id": STUDY, "csv_bonuses": f"{pid(1)},1.50\n{pid(2)},0.05\n{pid(3)},0.30\n"}
    assert prolific_env.requests[1]["path"] == "/api/v1/bulk-bonus-payments/bulk1/pay/"
    assert [(ln.platform_status, ln.platform_reference) for ln in lines(app, batches.prolific)] == [
        ("paid", "bulk1")
    ] * 3
    batch = batch_row(app, batches.prolific)
    assert batch.status is PayoutStatus.paid and batch.pay_run_id is None
    assert batch.platform_state == {
        "prolific": {"study_id": STUDY, "setup_id": "bulk1", "setup_unknown": False, "pay_sent": True}
    }
    assert pay(settings, str(batches.prolific)).exit_code == 1 and len(prolific_env.requests) == 2


class Crash(BaseException):
    """The process dying: not an error any code here handles."""


def test_a_crash_after_the_set_up_resumes_with_the_same_set_up(
    app: Any, settings: Any, batches: Batches, prolific_env: FakeProlific, monkeypatch: pytest.MonkeyPatch
) -> None:
    renew = payouts._renew
    saves: list[int] = []

    def dies_before_the_pay(*args: Any) -> None:
        # pay_lines saves three times: a set-up is asked for, its id, a pay is about to leave.
        # The process dies at the third, once the set-up's id is committed.
        saves.append(1)
        if len(saves) == 3:
            raise Crash
        renew(*args)

    monkeypatch.setattr(payouts, "_renew", dies_before_the_pay)
    with pytest.raises(Crash):
        pay(settings, str(batches.prolific))
    monkeypatch.setattr(payouts, "_renew", renew)
    assert [r["op"] for r in prolific_env.requests] == ["create-bonus-payments"]
    batch = batch_row(app, batches.prolific)
    assert batch.status is PayoutStatus.created
    assert batch.platform_state == {
        "prolific": {"study_id": STUDY, "setup_id": "bulk1", "setup_unknown": False, "pay_sent": False}
    }
    assert [ln.platform_status for ln in lines(app, batches.prolific)] == [None] * 3

    resumed = pay(settings, str(batches.prolific))
    assert resumed.exit_code == 0, resumed.output
    assert [r["op"] for r in prolific_env.requests] == ["create-bonus-payments", "pay-bonus-payments"]
    assert prolific_env.requests[1]["path"] == "/api/v1/bulk-bonus-payments/bulk1/pay/"  # the same set-up
    assert batch_row(app, batches.prolific).status is PayoutStatus.paid


def test_a_pay_without_an_answer_is_never_sent_again_and_the_token_never_shows(
    app: Any, settings: Any, batches: Batches, prolific_env: FakeProlific
) -> None:
    # Prolific fails on the pay with an error page that echoes the request's headers.
    prolific_env.script["pay-bonus-payments"] = [{"status": 502, "echo": True}]
    lost = pay(settings, str(batches.prolific))
    assert lost.exit_code == 1
    assert [ln.platform_status for ln in lines(app, batches.prolific)] == ["unknown"] * 3
    assert "--record-line all --as paid|failed" in lost.output
    kept = json.dumps([ln.platform_answer for ln in lines(app, batches.prolific)])
    assert TOKEN not in kept and "[token]" in kept  # the echoed header was kept, with the token cut out
    again = pay(settings, str(batches.prolific))
    assert again.exit_code == 1 and "nothing sent to prolific" in again.output
    assert [r["op"] for r in prolific_env.requests] == ["create-bonus-payments", "pay-bonus-payments"]
    with session_scope(app.state.sessionmaker) as session, pytest.raises(Conflict, match="may be paid"):
        payouts.cancel(session, None, payouts.get_batch(session, batches.prolific))

    # The researcher finds on Prolific that nothing was paid: the next run pays the same set-up.
    recorded = pay(settings, str(batches.prolific), "--record-line", "all", "--as", "failed")
    assert recorded.exit_code == 0, recorded.output
    paid = pay(settings, str(batches.prolific))
    assert paid.exit_code == 0, paid.output
    assert [r["path"] for r in prolific_env.requests[2:]] == ["/api/v1/bulk-bonus-payments/bulk1/pay/"]
    shown = pay(settings, str(batches.prolific), "--record-line", "all", "--as", "paid")  # paid: refused
    assert shown.exit_code == 1

    from typer.testing import CliRunner

    from dynaloop.cli import app as cli_app

    listing = CliRunner().invoke(cli_app, ["ledger", "batch", "show", str(batches.prolific), "--task", TASK,
                                           "--database-url", settings.database_url])  # fmt: skip
    assert listing.exit_code == 0
    stored = json.dumps([str(v) for v in table_snapshot(app, *TABLES).values()])
    for text in (lost.output, again.output, recorded.output, paid.output, listing.output, stored):
        assert TOKEN not in text


def test_a_set_up_for_another_amount_is_never_paid_by_a_later_run(
    app: Any, settings: Any, batches: Batches, prolific_env: FakeProlific
) -> None:
    prolific_env.script["create-bonus-payments"] = [{"status": 201, "body": {"id": "odd", "amount": 9999}}]
    refused = pay(settings, str(batches.prolific))
    assert refused.exit_code == 1 and "lines 1, 2, 3 failed" in refused.output
    assert [ln.platform_status for ln in lines(app, batches.prolific)] == ["failed"] * 3
    assert batch_row(app, batches.prolific).platform_state == {
        "prolific": {"study_id": STUDY, "setup_id": None, "setup_unknown": False, "pay_sent": False}
    }
    paid = pay(settings, str(batches.prolific))  # a fresh set-up, paid; "odd" never is
    assert paid.exit_code == 0, paid.output
    assert [r["path"] for r in prolific_env.requests] == [
        "/api/v1/submissions/bonus-payments/", "/api/v1/submissions/bonus-payments/",
        "/api/v1/bulk-bonus-payments/bulk2/pay/",
    ]  # fmt: skip
