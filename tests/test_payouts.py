"""Payout batches (issue #27, part A): every bonus export is recorded, per study link and
currency, and no ledger event is ever in two batches that are not cancelled.

The attackers first (another group's researcher, workers, bad uploads); then the issue's "Done
when": export -> correction -> export pays the correction alone, a batch downloads as the same
bytes, a cancelled batch's events come back once, concurrent exports never share an event, a
Prolific file never holds another study's id, and reconciliation finds a planted missing and a
planted unexpected line. The ledger rows are written as the ledger leaves them (bonus rows on
the sessions they were earned in); how amounts are computed is tests/test_ledger.py's.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from services.db.engine import session_scope
from services.db.models import (
    LedgerEntry,
    LedgerKind,
    PayoutBatch,
    PayoutEvent,
    Platform,
    Round,
    StudyLink,
    StudyRole,
    StudySession,
    StudySessionStatus,
    Task,
    User,
)
from services.domain import payouts, tasks, users
from services.errors import Conflict
from tests.conftest import Actor, MakeUser, example_yaml, table_counts, table_snapshot

pytestmark = pytest.mark.both_databases  # money: payout batches, concurrent exports, reconciliation


API = "/api/v1"
TASK = "dynasent-r2"
PAY = {
    "currency": "USD",
    "base_pay": {"writer": 150, "validator": 100},
    "writer_bonus_per_example": 10,
    "validator_bonus": {"per_batch": 20, "min_agreement": 0.8},
}
PAYOUT_TABLES = ("payout_batches", "payout_lines", "payout_events", "payout_reconciliations", "ledger_entries")
# Prolific participant ids (24 hexadecimal characters) and MTurk worker/assignment ids.
WANDA, WES, PAT = "5a0c0ffee0000000000000a1", "5b0c0ffee0000000000000b2", "5c0c0ffee0000000000000c3"


@dataclass
class Crowd:
    researcher: Actor
    links: dict[str, int]  # writers (Prolific), checkers (Prolific), labellers (MTurk), local (generic)
    users: dict[str, int]
    sessions: dict[str, int]
    entries: dict[str, int]  # name -> ledger entry id


def _entry(
    session: Any, task: Task, user_id: int, session_id: int | None, kind: LedgerKind, key: str, amount: int
) -> int:
    row = LedgerEntry(
        task_id=task.id,
        round_id=None,
        user_id=user_id,
        session_id=session_id,
        kind=kind,
        event_key=key,
        amount_minor=amount,
        currency="USD",
        reason=f"{kind.value} {key}",
    )
    session.add(row)
    session.flush()
    return row.id


@pytest.fixture
def crowd(app: Any, make_user: MakeUser) -> Crowd:
    """Rita's task (USD) with a Prolific writers' link, a Prolific link of another study, an
    MTurk validators' link and a generic link; bonus and base-pay rows on their sessions, and a
    bonus earned without a study session (v4)."""
    rita = make_user("rita", "researcher")
    names = ["wanda", "wes", "pat", "v1", "v2", "v4", "gina"]
    for name in names:
        make_user(name, "writer", "validator")
    ids: dict[str, int] = {}
    links: dict[str, int] = {}
    sessions: dict[str, int] = {}
    entries: dict[str, int] = {}
    with session_scope(app.state.sessionmaker) as session:
        ids = {u.username: u.id for u in session.scalars(select(User))}
        task = tasks.create_task(
            session,
            users.get_user(session, "rita"),
            example_yaml(TASK, onboarding_quiz=None, pay=PAY),
        )
        round_ = Round(task_id=task.id, number=1)
        session.add(round_)
        session.flush()
        for name, role, platform in (
            ("writers", StudyRole.writer, Platform.prolific),
            ("checkers", StudyRole.validator, Platform.prolific),
            ("labellers", StudyRole.validator, Platform.mturk),
            ("local", StudyRole.writer, Platform.generic),
        ):
            link = StudyLink(
                slug=f"slug-{name}",
                name=name,
                task_id=task.id,
                round_id=round_.id,
                role=role,
                platform=platform,
                quota=5,
                completion_code=f"C-{name}",
            )
            session.add(link)
            session.flush()
            links[name] = link.id
        for user, link_key, worker, assignment in (
            ("wanda", "writers", WANDA, None),
            ("wes", "writers", WES, None),
            ("pat", "checkers", PAT, None),
            ("v1", "labellers", "A1WORKER", "ASG1"),
            ("v2", "labellers", "A2WORKER", "ASG2"),
            ("gina", "local", "gina-local-id", None),
        ):
            row = StudySession(
                link_id=links[link_key],
                user_id=ids[user],
                status=StudySessionStatus.completed,
                platform_worker_id=worker,
                platform_session_id=assignment,
            )
            session.add(row)
            session.flush()
            sessions[user] = row.id
        for name, user, kind, amount in (
            ("wanda-base", "wanda", LedgerKind.base_pay, 150),
            ("wanda-e1", "wanda", LedgerKind.writer_bonus, 10),
            ("wanda-e2", "wanda", LedgerKind.writer_bonus, 10),
            ("wes-e3", "wes", LedgerKind.writer_bonus, 10),
            ("pat-b0", "pat", LedgerKind.validator_bonus, 20),
            ("v1-b0", "v1", LedgerKind.validator_bonus, 20),
            ("v1-b1", "v1", LedgerKind.validator_bonus, 20),
            ("v2-b0", "v2", LedgerKind.validator_bonus, 20),
            ("gina-e4", "gina", LedgerKind.writer_bonus, 10),
        ):
            entries[name] = _entry(session, task, ids[user], sessions[user], kind, name, amount)
        entries["v4-b0"] = _entry(session, task, ids["v4"], None, LedgerKind.validator_bonus, "v4-b0", 20)
    return Crowd(rita, links, ids, sessions, entries)


def _create(client: TestClient, crowd: Crowd, link: str, **extra: Any) -> Any:
    return client.post(
        f"{API}/tasks/{TASK}/payout-batches",
        json={"link_id": crowd.links[link], **extra},
        headers=crowd.researcher.headers,
    )


def _file(client: TestClient, crowd: Crowd, batch_id: int) -> bytes:
    response = client.get(f"{API}/payout-batches/{batch_id}/file", headers=crowd.researcher.headers)
    assert response.status_code == 200, response.text
    return response.content


def _correct(client: TestClient, crowd: Crowd, entry: str, amount: int) -> int:
    response = client.post(
        f"{API}/ledger/{crowd.entries[entry]}/corrections",
        json={"amount_minor": amount, "reason": "recounted"},
        headers=crowd.researcher.headers,
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _live_claims(app: Any) -> list[int]:
    with session_scope(app.state.sessionmaker) as session:
        return list(
            session.scalars(select(PayoutEvent.claimed_entry_id).where(PayoutEvent.claimed_entry_id.is_not(None)))
        )


# --- attackers ------------------------------------------------------------------------------------


def test_another_groups_researcher_finds_no_batch_and_changes_nothing(
    client: TestClient, app: Any, crowd: Crowd, make_user: MakeUser
) -> None:
    batch_id = _create(client, crowd, "writers").json()["batch"]["id"]
    oscar = make_user("oscar", "researcher")
    before = table_snapshot(app, *PAYOUT_TABLES)
    counts = table_counts(app)
    no_task = f"no task {TASK!r}; list tasks with GET /api/v1/tasks"
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", f"{API}/tasks/{TASK}/payout-batches", {"json": {"link_id": crowd.links["writers"]}}),
        ("GET", f"{API}/tasks/{TASK}/payout-batches", {}),
        ("GET", f"{API}/tasks/{TASK}/ledger/bonuses.csv", {}),
    ]
    for method, url, kwargs in calls:
        response = client.request(method, url, headers=oscar.headers, **kwargs)
        assert response.status_code == 404, (url, response.text)
        assert response.json()["error"]["message"] == no_task
    batch_calls: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "", {}),
        ("GET", "/file", {}),
        ("POST", "/paid", {}),
        ("POST", "/cancel", {}),
        ("POST", "/reconciliation", {"content": f"participant_id,amount\n{WANDA},0.20\n".encode()}),
    ]
    for method, suffix, kwargs in batch_calls:
        theirs = client.request(method, f"{API}/payout-batches/{batch_id}{suffix}", headers=oscar.headers, **kwargs)
        missing = client.request(method, f"{API}/payout-batches/987654{suffix}", headers=oscar.headers, **kwargs)
        assert theirs.status_code == missing.status_code == 404, (suffix, theirs.text)
        assert theirs.json()["error"]["message"] == missing.json()["error"]["message"].replace("987654", str(batch_id))
    assert table_snapshot(app, *PAYOUT_TABLES) == before
    assert table_counts(app) == counts


def test_workers_cannot_call_the_payout_routes(client: TestClient, app: Any, crowd: Crowd, make_user: MakeUser) -> None:
    batch_id = _create(client, crowd, "writers").json()["batch"]["id"]
    actors = (make_user("sneaky-w", "writer"), make_user("sneaky-v", "validator"))
    counts = table_counts(app)
    for actor in actors:
        for method, url in [
            ("POST", f"{API}/tasks/{TASK}/payout-batches"),
            ("GET", f"{API}/tasks/{TASK}/payout-batches"),
            ("GET", f"{API}/payout-batches/{batch_id}"),
            ("GET", f"{API}/payout-batches/{batch_id}/file"),
            ("POST", f"{API}/payout-batches/{batch_id}/paid"),
            ("POST", f"{API}/payout-batches/{batch_id}/cancel"),
            ("POST", f"{API}/payout-batches/{batch_id}/reconciliation"),
        ]:
            response = client.request(method, url, headers=actor.headers, json={"link_id": crowd.links["writers"]})
            assert response.status_code == 403, (actor.username, url, response.text)
    assert table_counts(app) == counts


def test_a_link_of_another_task_or_none_at_all_is_missing(
    client: TestClient, app: Any, crowd: Crowd, make_user: MakeUser
) -> None:
    oscar = make_user("oscar", "researcher")
    with session_scope(app.state.sessionmaker) as session:
        other = tasks.create_task(
            session, users.get_user(session, "oscar"), example_yaml("isarcasm", onboarding_quiz=None)
        )
        assert other.id
    counts = table_counts(app)
    # Oscar names Rita's link under his own task: the link is not his task's.
    response = client.post(
        f"{API}/tasks/isarcasm/payout-batches", json={"link_id": crowd.links["writers"]}, headers=oscar.headers
    )
    assert response.status_code == 404, response.text
    assert response.json()["error"]["message"] == f"no study link {crowd.links['writers']}"
    for body in ({"link_id": 987654}, {"link_id": 0}, {"link_id": 2**40}, {"link_id": "1; DROP"}, {}, {"x": 1}):
        response = client.post(f"{API}/tasks/{TASK}/payout-batches", json=body, headers=crowd.researcher.headers)
        assert response.status_code in (404, 422), (body, response.text)
    assert table_counts(app) == counts


def test_the_retired_export_answers_410_naming_payout_batches(client: TestClient, crowd: Crowd) -> None:
    response = client.get(
        f"{API}/tasks/{TASK}/ledger/bonuses.csv", params={"platform": "prolific"}, headers=crowd.researcher.headers
    )
    assert response.status_code == 410, response.text
    assert "/payout-batches" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"", 422, "empty"),
        (b"   \n", 422, "empty"),
        (b"\xff\xfe\x00garbage", 422, "UTF-8"),
        (b"who,what\nA1WORKER,ASG1\n", 422, "needs a header"),
        (b"WorkerId,AssignmentId,BonusAmount\nA1WORKER,ASG1,twenty\n", 422, "not an amount"),
        (b"WorkerId,AssignmentId,BonusAmount\nA1WORKER,ASG1,0.201\n", 422, "not an amount"),
        (b"WorkerId,AssignmentId,BonusAmount\nA1WORKER,ASG1,-0.20\n", 422, "not an amount"),
        (b"WorkerId,AssignmentId,BonusAmount\nA1\x01WORKER,ASG1,0.20\n", 422, "control character"),
        (b"WorkerId,AssignmentId,BonusAmount\n" + b"A" * 2000 + b",ASG1,0.20\n", 422, "characters"),
        (b'{"BonusPayments": [[[[[["deep"]]]]]]}', 422, "deep"),
        (b'{"BonusPayments": "all of them"}', 422, "BonusPayments"),
        (b'{"BonusPayments": [{"WorkerId": 7, "AssignmentId": "ASG1", "BonusAmount": "0.20"}]}', 422, "WorkerId"),
        (b'{"BonusPayments": [', 422, "not JSON"),
        (b"WorkerId,AssignmentId,BonusAmount\n" + b"A1WORKER,ASG1,0.20\n" * 20_000, 413, ""),
    ],
)
def test_a_bad_record_is_refused_clearly_and_records_nothing(
    client: TestClient, app: Any, crowd: Crowd, body: bytes, status: int, words: str
) -> None:
    batch_id = _create(client, crowd, "labellers").json()["batch"]["id"]
    before = table_snapshot(app, *PAYOUT_TABLES, "audit_log")
    response = client.post(
        f"{API}/payout-batches/{batch_id}/reconciliation", content=body, headers=crowd.researcher.headers
    )
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"}
    assert words in response.json()["error"]["message"], response.text
    assert table_snapshot(app, *PAYOUT_TABLES, "audit_log") == before


def test_a_currency_the_study_does_not_pay_in_is_refused_and_nothing_is_written(
    client: TestClient, app: Any, crowd: Crowd
) -> None:
    before = table_snapshot(app, *PAYOUT_TABLES, "audit_log")
    with session_scope(app.state.sessionmaker) as session:
        writers = session.get(StudyLink, crowd.links["writers"])
        labellers = session.get(StudyLink, crowd.links["labellers"])
        assert writers is not None and labellers is not None
        writers.currency = "GBP"  # the Prolific study pays in GBP; the ledger is in USD
        labellers.currency = "EUR"  # MTurk pays in USD only
    response = _create(client, crowd, "writers")
    assert response.status_code == 422, response.text
    assert "USD" in response.json()["error"]["message"] and "GBP" in response.json()["error"]["message"]
    response = _create(client, crowd, "labellers")
    assert response.status_code == 422, response.text
    assert "mturk pays bonuses in USD only" in response.json()["error"]["message"]
    response = _create(client, crowd, "local")  # a generic link has no bonus file
    assert response.status_code == 422, response.text
    assert table_snapshot(app, *PAYOUT_TABLES, "audit_log") == before


# --- the issue's "Done when" -------------------------------------------------------------------------


def test_export_then_correction_then_export_pays_the_correction_alone(
    client: TestClient, app: Any, crowd: Crowd
) -> None:
    first = _create(client, crowd, "writers")
    assert first.status_code == 201, first.text
    batch = first.json()["batch"]
    # Bonuses only (base pay is the study's reward): wanda 10 + 10, wes 10. Sorted by id.
    assert _file(client, crowd, batch["id"]) == f"{WANDA},0.20\n{WES},0.10\n".encode()
    assert (batch["status"], batch["line_count"], batch["total_minor"], batch["currency"]) == ("created", 2, 30, "USD")
    assert [line["ledger_entry_ids"] for line in batch["lines"]] == [
        [crowd.entries["wanda-e1"], crowd.entries["wanda-e2"]],
        [crowd.entries["wes-e3"]],
    ]
    paid = client.post(f"{API}/payout-batches/{batch['id']}/paid", headers=crowd.researcher.headers)
    assert paid.status_code == 200 and paid.json()["status"] == "paid", paid.text
    correction = _correct(client, crowd, "wanda-e1", 10)  # +0.10 for wanda
    second = _create(client, crowd, "writers")
    assert second.status_code == 201, second.text
    assert _file(client, crowd, second.json()["batch"]["id"]) == f"{WANDA},0.10\n".encode()
    assert second.json()["batch"]["lines"][0]["ledger_entry_ids"] == [correction]
    # Nothing new: 409, nothing written.
    counts = table_counts(app)
    third = _create(client, crowd, "writers")
    assert third.status_code == 409, third.text
    assert "nothing to pay" in third.json()["error"]["message"]
    assert table_counts(app) == counts


def test_partial_pay_and_an_adjustment_of_base_pay_are_paid_once_completed_base_pay_never(
    client: TestClient, app: Any, crowd: Crowd, make_user: MakeUser
) -> None:
    """What the platform does not pay by itself goes in the batch: a stopped session's partial
    pay (the platform's reward is not paid for a partial submission) and a correction of base
    pay (e.g. Prolific's minimum-pay adjustment). A completed session's base pay is the study's
    own reward, paid on approval: never in a batch."""
    make_user("sol", "writer")
    sol_id = "5d0c0ffee0000000000000d4"
    with session_scope(app.state.sessionmaker) as session:
        task = tasks.get_task(session, TASK)
        stopped = StudySession(
            link_id=crowd.links["writers"],
            user_id=users.get_user(session, "sol").id,
            status=StudySessionStatus.stopped,
            platform_worker_id=sol_id,
        )
        session.add(stopped)
        session.flush()
        partial = _entry(session, task, stopped.user_id, stopped.id, LedgerKind.base_pay, "sol-partial", 40)
    adjustment = _correct(client, crowd, "wanda-base", 25)  # topped up to the hourly minimum
    first = _create(client, crowd, "writers")
    assert first.status_code == 201, first.text
    batch = first.json()["batch"]
    # wanda: 10 + 10 + the 25 adjustment (not her 150 base pay); wes 10; sol's partial 40.
    assert sorted(_file(client, crowd, batch["id"]).decode().splitlines()) == sorted(
        [f"{WANDA},0.45", f"{WES},0.10", f"{sol_id},0.40"]
    )
    paid_ids = {i for line in batch["lines"] for i in line["ledger_entry_ids"]}
    assert {partial, adjustment} <= paid_ids and crowd.entries["wanda-base"] not in paid_ids
    assert client.post(f"{API}/payout-batches/{batch['id']}/paid", headers=crowd.researcher.headers).status_code == 200
    assert _create(client, crowd, "writers").status_code == 409  # paid once


def test_a_batch_downloads_as_the_same_bytes_every_time(client: TestClient, app: Any, crowd: Crowd) -> None:
    created = _create(client, crowd, "labellers").json()["batch"]
    first = client.get(f"{API}/payout-batches/{created['id']}/file", headers=crowd.researcher.headers)
    assert first.headers["content-type"].startswith("text/csv")
    assert first.headers["content-disposition"] == f'attachment; filename="{created["filename"]}"'
    lines = first.content.decode().splitlines()
    assert lines[0] == "worker_id,assignment_id,amount,reason,unique_request_token"
    tokens = [line["unique_request_token"] for line in created["lines"]]
    assert lines[1:] == [
        f"A1WORKER,ASG1,0.40,Bonus for task {TASK},{tokens[0]}",
        f"A2WORKER,ASG2,0.20,Bonus for task {TASK},{tokens[1]}",
    ]
    assert all(len(token) <= 64 for token in tokens) and len(set(tokens)) == 2
    # More ledger rows, a correction, the batch marked paid: the file stays the same bytes.
    _correct(client, crowd, "v1-b0", -5)
    client.post(f"{API}/payout-batches/{created['id']}/paid", headers=crowd.researcher.headers)
    assert _file(client, crowd, created["id"]) == first.content
    assert _file(client, crowd, created["id"]) == first.content


def test_a_cancelled_batchs_events_come_back_once(client: TestClient, app: Any, crowd: Crowd) -> None:
    first = _create(client, crowd, "labellers").json()["batch"]
    cancelled = client.post(f"{API}/payout-batches/{first['id']}/cancel", headers=crowd.researcher.headers)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
    assert _live_claims(app) == []
    counts = table_counts(app)
    again = client.post(f"{API}/payout-batches/{first['id']}/cancel", headers=crowd.researcher.headers)
    assert again.status_code == 409, again.text
    paid = client.post(f"{API}/payout-batches/{first['id']}/paid", headers=crowd.researcher.headers)
    assert paid.status_code == 409, paid.text
    assert table_counts(app) == counts
    second = _create(client, crowd, "labellers")
    assert second.status_code == 201, second.text
    batch = second.json()["batch"]
    # The same events, the same lines and the same request tokens: MTurk refuses a repeat.
    assert [(ln["ledger_entry_ids"], ln["amount_minor"], ln["unique_request_token"]) for ln in batch["lines"]] == [
        (ln["ledger_entry_ids"], ln["amount_minor"], ln["unique_request_token"]) for ln in first["lines"]
    ]
    third = _create(client, crowd, "labellers")
    assert third.status_code == 409, third.text
    claims = _live_claims(app)
    assert sorted(claims) == sorted([crowd.entries["v1-b0"], crowd.entries["v1-b1"], crowd.entries["v2-b0"]])
    # A paid batch is never cancelled: a wrong payment is put right with a correction.
    client.post(f"{API}/payout-batches/{batch['id']}/paid", headers=crowd.researcher.headers)
    refused = client.post(f"{API}/payout-batches/{batch['id']}/cancel", headers=crowd.researcher.headers)
    assert refused.status_code == 409 and "correction" in refused.json()["error"]["message"], refused.text
    listed = client.get(f"{API}/tasks/{TASK}/payout-batches", headers=crowd.researcher.headers).json()
    assert [(b["id"], b["status"]) for b in listed["data"]] == [(first["id"], "cancelled"), (batch["id"], "paid")]


def test_concurrent_exports_never_put_one_event_in_two_batches(app: Any, crowd: Crowd) -> None:
    threads_n = 4
    barrier = threading.Barrier(threads_n)
    outcomes: list[str] = []
    lock = threading.Lock()

    def export() -> None:
        barrier.wait()
        try:
            with session_scope(app.state.sessionmaker) as session:
                task = tasks.get_task(session, TASK)
                link = session.get(StudyLink, crowd.links["labellers"])
                assert link is not None
                created = payouts.create_batch(session, users.get_user(session, "rita"), task, link)
                result = f"batch {created.batch.id}"
        except Conflict as exc:
            result = f"conflict: {exc.message}"
        with lock:
            outcomes.append(result)

    workers = [threading.Thread(target=export) for _ in range(threads_n)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert len(outcomes) == threads_n, outcomes
    assert sum(o.startswith("batch") for o in outcomes) == 1, outcomes
    claims = _live_claims(app)
    assert len(claims) == len(set(claims)) == 3
    with session_scope(app.state.sessionmaker) as session:
        assert len(session.scalars(select(PayoutBatch)).all()) == 1


def test_a_prolific_file_holds_its_own_studys_ids_alone(client: TestClient, app: Any, crowd: Crowd) -> None:
    response = _create(client, crowd, "writers")
    assert response.status_code == 201, response.text
    text = _file(client, crowd, response.json()["batch"]["id"]).decode()
    assert PAT not in text and "A1WORKER" not in text and "gina" not in text
    assert {line.split(",")[0] for line in text.splitlines()} == {WANDA, WES}
    # What the export says about the others is true: where each of them is paid.
    elsewhere = {(e["link_name"], tuple(e["usernames"])): e["advice"] for e in response.json()["elsewhere"]}
    assert set(elsewhere) == {
        ("checkers", ("pat",)),
        ("labellers", ("v1", "v2")),
        ("local", ("gina",)),
        (None, ("v4",)),
    }
    advice = elsewhere[("checkers", ("pat",))]
    assert f"create a payout batch for study link {crowd.links['checkers']} (prolific)" in advice
    assert "another way" in elsewhere[("local", ("gina",))]
    assert "no study link" in elsewhere[(None, ("v4",))]
    # The other Prolific study has its own file, with its own id alone.
    checkers = _create(client, crowd, "checkers")
    assert _file(client, crowd, checkers.json()["batch"]["id"]) == f"{PAT},0.20\n".encode()


def test_a_negative_net_and_an_id_the_platform_never_issues_are_held_back_and_named(
    client: TestClient, app: Any, crowd: Crowd
) -> None:
    _correct(client, crowd, "wanda-e1", -30)  # wanda: 10 + 10 - 30 = -10
    with session_scope(app.state.sessionmaker) as session:
        row = session.get(StudySession, crowd.sessions["wes"])
        assert row is not None
        row.platform_worker_id = '=HYPERLINK("http://evil.example/","pay")'
    counts = table_counts(app)
    response = _create(client, crowd, "writers")
    assert response.status_code == 409, response.text
    assert "wanda" in response.json()["error"]["message"] and "wes" in response.json()["error"]["message"]
    assert table_counts(app) == counts
    with session_scope(app.state.sessionmaker) as session:
        row = session.get(StudySession, crowd.sessions["wes"])
        assert row is not None
        row.platform_worker_id = WES
    response = _create(client, crowd, "writers")
    assert response.status_code == 201, response.text
    assert _file(client, crowd, response.json()["batch"]["id"]) == f"{WES},0.10\n".encode()
    held = response.json()["held_back"]
    assert [(h["username"], h["amount_minor"]) for h in held] == [("wanda", -10)]
    assert "held back" in held[0]["reason"]
    # A later bonus covers the take-back: wanda's next line is the net, 20 - 10.
    _correct(client, crowd, "wanda-e2", 20)
    response = _create(client, crowd, "writers")
    assert response.status_code == 201, response.text
    assert _file(client, crowd, response.json()["batch"]["id"]) == f"{WANDA},0.10\n".encode()


def test_reconciliation_finds_a_planted_missing_and_a_planted_unexpected_line(
    client: TestClient, app: Any, crowd: Crowd
) -> None:
    batch = _create(client, crowd, "labellers").json()["batch"]
    # MTurk's record, as ListBonusPayments lists it: v1's bonus paid; v2's missing (planted);
    # a worker who is in no batch (planted) and v1 paid a second time with another amount.
    record = {
        "NumResults": 3,
        "BonusPayments": [
            {"WorkerId": "A1WORKER", "AssignmentId": "ASG1", "BonusAmount": "0.40", "Reason": "Bonus", "GrantTime": 0},
            {"WorkerId": "A9STRANGER", "AssignmentId": "ASG9", "BonusAmount": "5.00", "Reason": "?", "GrantTime": 0},
            {"WorkerId": "A1WORKER", "AssignmentId": "ASG1", "BonusAmount": "0.05", "Reason": "?", "GrantTime": 0},
        ],
    }
    response = client.post(
        f"{API}/payout-batches/{batch['id']}/reconciliation",
        content=json.dumps(record).encode(),
        headers=crowd.researcher.headers,
    )
    assert response.status_code == 201, response.text
    report = response.json()
    assert [(m["worker_id"], m["line"]) for m in report["matched"]] == [("A1WORKER", 1)]
    assert [(m["worker_id"], m["assignment_id"], m["amount"]) for m in report["missing"]] == [
        ("A2WORKER", "ASG2", "0.20")
    ]
    assert [(u["worker_id"], u["amount"], u["reason"]) for u in report["unexpected"]] == [
        ("A9STRANGER", "5.00", "not in this batch"),
        ("A1WORKER", "0.05", "this batch pays them 0.40, not 0.05"),
    ]
    # The same record as a CSV with ListBonusPayments' column names.
    csv_record = b"WorkerId,AssignmentId,BonusAmount,Reason\nA2WORKER,ASG2,$0.20,Bonus\nA1WORKER,ASG1,0.40,Bonus\n"
    response = client.post(
        f"{API}/payout-batches/{batch['id']}/reconciliation", content=csv_record, headers=crowd.researcher.headers
    )
    assert response.status_code == 201, response.text
    assert (len(response.json()["matched"]), response.json()["missing"], response.json()["unexpected"]) == (2, [], [])
    with session_scope(app.state.sessionmaker) as session:
        from services.db.models import PayoutReconciliation

        recorded = session.scalars(select(PayoutReconciliation).order_by(PayoutReconciliation.id)).all()
        assert [(r.matched, r.missing, r.unexpected) for r in recorded] == [(1, 1, 2), (2, 0, 0)]


def test_reconciling_a_prolific_batch_with_its_bare_file_and_an_earlier_batch(
    client: TestClient, app: Any, crowd: Crowd
) -> None:
    first = _create(client, crowd, "writers").json()["batch"]
    client.post(f"{API}/payout-batches/{first['id']}/paid", headers=crowd.researcher.headers)
    _correct(client, crowd, "wes-e3", 15)
    second = _create(client, crowd, "writers").json()["batch"]
    # The study's record holds both batches' payments: the first batch's are listed apart.
    record = f"{WANDA},0.20\n{WES},0.10\n{WES},0.15\n".encode()
    response = client.post(
        f"{API}/payout-batches/{second['id']}/reconciliation", content=record, headers=crowd.researcher.headers
    )
    assert response.status_code == 201, response.text
    report = response.json()
    assert [(m["worker_id"], m["amount"]) for m in report["matched"]] == [(WES, "0.15")]
    assert [(m["worker_id"], m["batch_id"]) for m in report["in_other_batches"]] == [
        (WANDA, first["id"]),
        (WES, first["id"]),
    ]
    assert report["missing"] == [] and report["unexpected"] == []
    header = f"Participant id,Bonus\n{WES},0.15\n".encode()
    response = client.post(
        f"{API}/payout-batches/{second['id']}/reconciliation", content=header, headers=crowd.researcher.headers
    )
    assert response.status_code == 201 and len(response.json()["matched"]) == 1, response.text


def test_a_links_currency_is_one_its_platform_pays_in(client: TestClient, app: Any, crowd: Crowd) -> None:
    with session_scope(app.state.sessionmaker) as session:
        round_id = session.scalars(select(Round.id)).one()
    base = {"round_id": round_id, "role": "writer", "quota": 2, "max_workers": 10}
    counts = table_counts(app)
    for platform, currency in (("mturk", "GBP"), ("prolific", "EUR"), ("prolific", "gbp"), ("prolific", "POUND")):
        response = client.post(
            f"{API}/tasks/{TASK}/study-links",
            json={**base, "name": f"{platform} {currency}", "platform": platform, "currency": currency},
            headers=crowd.researcher.headers,
        )
        assert response.status_code == 422, (platform, currency, response.text)
    assert table_counts(app) == counts
    made = client.post(
        f"{API}/tasks/{TASK}/study-links",
        json={**base, "name": "GBP study", "platform": "prolific", "currency": "GBP"},
        headers=crowd.researcher.headers,
    )
    assert made.status_code == 201 and made.json()["currency"] == "GBP", made.text


@pytest.mark.parametrize("note", ["refund \u202egnp.exe", "bell \x07", "x" * 501])
def test_a_bad_note_is_refused_and_writes_nothing(client: TestClient, app: Any, crowd: Crowd, note: str) -> None:
    counts = table_counts(app)
    response = _create(client, crowd, "writers", note=note)
    assert response.status_code == 422, response.text
    assert table_counts(app) == counts
    kept = _create(client, crowd, "writers", note="  paid   on Monday ")
    assert kept.status_code == 201 and kept.json()["batch"]["note"] == "paid on Monday", kept.text


def test_an_mturk_assignment_id_mturk_never_issues_is_held_back(client: TestClient, app: Any, crowd: Crowd) -> None:
    with session_scope(app.state.sessionmaker) as session:
        row = session.get(StudySession, crowd.sessions["v2"])
        assert row is not None
        row.platform_session_id = "-2+3"
    response = _create(client, crowd, "labellers")
    assert response.status_code == 201, response.text
    text = _file(client, crowd, response.json()["batch"]["id"]).decode()
    assert "-2+3" not in text and "A2WORKER" not in text
    assert [(h["username"], h["amount_minor"]) for h in response.json()["held_back"]] == [("v2", 20)]


def test_the_batch_commands_create_write_reconcile_and_cancel(
    app: Any, crowd: Crowd, settings: Any, tmp_path: Any
) -> None:
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["ledger", "batch", *args, "--database-url", settings.database_url])

    out = tmp_path / "labellers.csv"
    created = run("create", "--task", TASK, "--link-id", str(crowd.links["labellers"]), "--out", str(out))
    assert created.exit_code == 0, created.output
    assert out.read_text().startswith("worker_id,assignment_id,amount,reason,unique_request_token\nA1WORKER,ASG1,0.40,")
    written = run("file", "1", "--task", TASK)
    assert written.exit_code == 0 and written.stdout == out.read_text()
    record = tmp_path / "record.csv"
    record.write_text("WorkerId,AssignmentId,BonusAmount\nA1WORKER,ASG1,0.40\n")
    reconciled = run("reconcile", "1", str(record), "--task", TASK)
    assert reconciled.exit_code == 1, reconciled.output  # v2's line is missing
    report = json.loads(reconciled.stdout)
    assert [m["worker_id"] for m in report["missing"]] == ["A2WORKER"] and len(report["matched"]) == 1
    record.write_text("WorkerId,AssignmentId,BonusAmount\nA1WORKER,ASG1,0.40\nA2WORKER,ASG2,0.20\n")
    assert run("reconcile", "1", str(record), "--task", TASK).exit_code == 0
    assert run("show", "1", "--task", "isarcasm").exit_code == 1  # no such task here
    cancelled = run("cancel", "1", "--task", TASK)
    assert cancelled.exit_code == 0, cancelled.output
    assert run("cancel", "1", "--task", TASK).exit_code == 1
    assert _live_claims(app) == []
    again = run("create", "--task", TASK, "--link-id", str(crowd.links["labellers"]))
    assert again.exit_code == 0, again.output
    assert sorted(_live_claims(app)) == sorted(crowd.entries[k] for k in ("v1-b0", "v1-b1", "v2-b0"))
