"""Study links: workers arriving from a crowd platform (issue 13, items 1 and 2).

The attacker's tests come first: missing and forged platform parameters, too many or too long
ones, a closed, not yet open or full link, a link on a round that no longer collects, another
group's researcher, a worker reaching for another's session, the same platform id opening the
link twice (one after the other, and at the same moment over real HTTP). After each refusal
the database is unchanged. Then the worker's way through: an MTurk preview that writes nothing,
a worker already unqualified screened out, the quota met through the real writer API, and the
completion each platform takes back."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from services.db.engine import session_scope
from services.db.models import (
    ApiToken,
    AuditEntry,
    LedgerEntry,
    PlatformAccount,
    StudySession,
    StudySessionStatus,
    User,
)
from services.domain import study
from tests.conftest import Actor, MakeUser, example_yaml, open_round, served_examples, table_counts, table_snapshot
from tests.test_concurrency import fire

# Completion codes issued once, concurrent arrivals, the database unchanged after each refusal.
pytestmark = pytest.mark.both_databases


API = "/api/v1"
TASK = "dynasent-r2"
PROMPTS = [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(10)]
# Ids in each platform's format: Prolific's are 24 lowercase hex characters; MTurk's worker id
# starts with "A", its HIT and assignment ids are 30 capital letters and digits.
PROLIFIC = {
    "PROLIFIC_PID": "5f1a2b3c4d5e6f7a8b9c0d1e",
    "STUDY_ID": "60aa11bb22cc33dd44ee55ff",
    "SESSION_ID": "6123456789abcdef01234567",
}
MTURK = {
    "workerId": "A1B2C3D4E5F6G7",
    "assignmentId": "3ABCDEFGHIJKLMNOPQRSTUVWXYZ012",
    "hitId": "3HITHITHIT0001ABCDEFGHIJKLMNOP",
    "turkSubmitTo": "https://workersandbox.mturk.com",
}


def prolific_id(n: int) -> str:
    """The n-th made-up (well-formed) Prolific id."""
    return f"5f{n:022x}"


def mturk_assignment(n: int) -> str:
    return f"3ASSIGN{n:023d}"


@pytest.fixture
def round_(client: Any, researcher: Actor, stub_model: Any) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None), stub_model.url, PROMPTS)


def make_link(client: Any, researcher: Actor, round_id: int, **body: Any) -> dict[str, Any]:
    payload = {"name": "pilot", "round_id": round_id, "role": "writer", "platform": "prolific", "quota": 2, **body}
    if payload["platform"] in ("prolific", "mturk"):
        payload.setdefault("max_workers", 50)  # a paid link must cap its workers
    response = client.post(f"{API}/tasks/{TASK}/study-links", json=payload, headers=researcher.headers)
    assert response.status_code == 201, response.text
    return response.json()


def open_link(client: Any, link: dict[str, Any], params: dict[str, str]) -> httpx.Response:
    response: httpx.Response = client.post(f"{API}/study/{link['slug']}/sessions", json={"params": params})
    return response


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


# --- the attacker's tests ----------------------------------------------------------------------


def test_missing_or_forged_platform_parameters_are_refused_and_write_nothing(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    prolific = make_link(client, researcher, round_["id"])
    mturk = make_link(client, researcher, round_["id"], platform="mturk")
    generic = make_link(client, researcher, round_["id"], platform="generic", id_parameter="worker")
    bad: list[tuple[dict[str, Any], dict[str, str]]] = [
        (prolific, {}),
        (prolific, {k: v for k, v in PROLIFIC.items() if k != "STUDY_ID"}),
        (prolific, {**PROLIFIC, "PROLIFIC_PID": ""}),
        (prolific, {**PROLIFIC, "PROLIFIC_PID": "abc def"}),
        (prolific, {**PROLIFIC, "PROLIFIC_PID": "<script>"}),
        (prolific, {**PROLIFIC, "PROLIFIC_PID": "x" * 129}),
        (prolific, {**PROLIFIC, "SESSION_ID": "../../etc"}),
        # Well-formed in general, but not in the platform's id format.
        (prolific, {**PROLIFIC, "PROLIFIC_PID": "made-up-worker-1"}),
        (prolific, {**PROLIFIC, "PROLIFIC_PID": PROLIFIC["PROLIFIC_PID"].upper()}),
        (prolific, {**PROLIFIC, "PROLIFIC_PID": PROLIFIC["PROLIFIC_PID"] + "0"}),
        (prolific, {**PROLIFIC, "STUDY_ID": "study-1"}),
        (prolific, {**PROLIFIC, "SESSION_ID": "x1"}),
        (mturk, {**MTURK, "workerId": "W1"}),
        (mturk, {**MTURK, "workerId": "a1b2c3d4e5f6g7"}),
        (mturk, {**MTURK, "workerId": "B1B2C3D4E5F6G7"}),
        (mturk, {**MTURK, "hitId": "H1"}),
        (mturk, {**MTURK, "assignmentId": "3ABCDEFGHIJKLMNOP"}),
        (mturk, {**MTURK, "assignmentId": MTURK["assignmentId"].lower()}),
        (mturk, {k: v for k, v in MTURK.items() if k != "workerId"}),
        (mturk, {k: v for k, v in MTURK.items() if k != "turkSubmitTo"}),
        (mturk, {**MTURK, "turkSubmitTo": "https://evil.example.com"}),
        (mturk, {**MTURK, "turkSubmitTo": "https://www.mturk.com.evil.example"}),
        (mturk, {**MTURK, "turkSubmitTo": "http://www.mturk.com"}),
        (mturk, {**MTURK, "turkSubmitTo": "https://www.mturk.com@evil.example"}),
        (generic, {}),
        (generic, {"workerId": "demo-1"}),  # not the link's id parameter
        (generic, {"worker": "demo 1"}),
        # Too many, too long, odd names.
        (prolific, {**PROLIFIC, **{f"p{i}": "x" for i in range(18)}}),
        (prolific, {**PROLIFIC, "note": "x" * 201}),
        (prolific, {**PROLIFIC, "bad name": "x"}),
    ]
    before = table_counts(app)
    for link, params in bad:
        response = open_link(client, link, params)
        assert response.status_code == 422, (params, response.text)
        assert len(response.json()["error"]["message"]) > 20
    assert table_counts(app) == before
    # Not a JSON object of strings; an unknown slug; a slug that is not one.
    assert client.post(f"{API}/study/{prolific['slug']}/sessions", json={"params": {"a": 1}}).status_code == 422
    assert client.post(f"{API}/study/{prolific['slug']}/sessions", json={"params": [1]}).status_code == 422
    assert open_link(client, {"slug": "no-such-link"}, PROLIFIC).status_code == 404
    assert client.post(f"{API}/study/{'x' * 65}/sessions", json={"params": PROLIFIC}).status_code == 422
    assert table_counts(app) == before


def test_a_closed_not_yet_open_or_full_link_and_a_closed_round_are_refused(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    closed = make_link(client, researcher, round_["id"])
    response = client.post(f"{API}/study-links/{closed['id']}/close", headers=researcher.headers)
    assert response.status_code == 200 and response.json()["is_open"] is False
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()
    not_yet = make_link(client, researcher, round_["id"], opens_at=later)
    assert not_yet["is_open"] is False
    full = make_link(client, researcher, round_["id"], max_workers=1)
    assert open_link(client, full, PROLIFIC).status_code == 201
    before = table_counts(app)
    for link, code in ((closed, "study_link_closed"), (not_yet, "study_link_closed")):
        response = open_link(client, link, PROLIFIC)
        assert response.status_code == 409 and error_code(response) == code, response.text
    response = open_link(client, full, {**PROLIFIC, "PROLIFIC_PID": prolific_id(2)})
    assert response.status_code == 409 and error_code(response) == "study_link_full", response.text
    assert table_counts(app) == before
    # The worker already in resumes: the cap counts sessions, not visits.
    assert open_link(client, full, PROLIFIC).status_code == 200

    writers = make_link(client, researcher, round_["id"], platform="generic", id_parameter="worker")
    validators = make_link(
        client, researcher, round_["id"], role="validator", platform="generic", id_parameter="worker"
    )
    response = client.post(
        f"{API}/rounds/{round_['id']}/status", json={"status": "validating"}, headers=researcher.headers
    )
    assert response.status_code == 200, response.text
    before = table_counts(app)
    response = open_link(client, writers, {"worker": "w-9"})
    assert response.status_code == 409 and error_code(response) == "study_link_closed"
    assert "validating" in response.json()["error"]["message"]
    assert table_counts(app) == before
    assert open_link(client, validators, {"worker": "v-9"}).status_code == 201  # validators still label
    client.post(f"{API}/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    before = table_counts(app)
    response = open_link(client, validators, {"worker": "v-10"})
    assert response.status_code == 409 and error_code(response) == "study_link_closed"
    assert table_counts(app) == before


def _audited_link_closes(app: Any) -> dict[int, dict[str, Any]]:
    """The audit log's study_link.close entries: link id -> details."""
    with session_scope(app.state.sessionmaker) as session:
        rows = session.scalars(select(AuditEntry).where(AuditEntry.action == "study_link.close"))
        return {int(row.target_id): dict(row.details or {}) for row in rows}


def test_closing_a_round_closes_its_open_links_and_a_worker_then_gets_409_and_nothing(
    client: Any, app: Any, researcher: Actor, make_user: MakeUser, round_: dict[str, Any]
) -> None:
    """Closing a round closes the links that still took workers (audited, reason "round
    closed"); a new worker and one already in a session who open a link then get 409 with no
    account, token or session; writers and validators never see the link counts, and cannot
    close the round."""
    writers = make_link(client, researcher, round_["id"], name="writers")
    validators = make_link(
        client, researcher, round_["id"], name="validators", role="validator", platform="generic", id_parameter="w"
    )
    by_hand = make_link(client, researcher, round_["id"], name="closed by hand")
    assert client.post(f"{API}/study-links/{by_hand['id']}/close", headers=researcher.headers).status_code == 200
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).isoformat()
    expired = make_link(client, researcher, round_["id"], name="expired", closes_at=past)
    in_session = open_link(client, writers, PROLIFIC)
    assert in_session.status_code == 201, in_session.text
    writer = make_user("wendy", "writer")
    # The manager sees how many links closing would close; a writer sees no count at all.
    shown = client.get(f"{API}/rounds/{round_['id']}", headers=researcher.headers).json()
    assert shown["open_study_links"] == 2 and shown["study_links_closed"] is None
    listed = client.get(f"{API}/tasks/{TASK}/rounds", headers=researcher.headers).json()["data"]
    assert [r["open_study_links"] for r in listed] == [2]
    for path in (f"/rounds/{round_['id']}", f"/tasks/{TASK}/rounds", "/rounds/open"):
        answer = client.get(f"{API}{path}", headers=writer.headers).json()
        rows = answer.get("data", [answer])
        assert rows and all(r["open_study_links"] is None and r["model_servers"] is None for r in rows), answer

    # A writer cannot close the round: nothing changes, the links stay open.
    before = table_snapshot(app, "rounds", "study_links", "audit_log")
    refused = client.post(f"{API}/rounds/{round_['id']}/status", json={"status": "closed"}, headers=writer.headers)
    assert refused.status_code == 403
    assert table_snapshot(app, "rounds", "study_links", "audit_log") == before

    closed = client.post(f"{API}/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    assert closed.status_code == 200, closed.text
    assert closed.json()["status"] == "closed"
    assert closed.json()["study_links_closed"] == 2 and closed.json()["open_study_links"] == 0
    audited = _audited_link_closes(app)
    assert audited[writers["id"]] == audited[validators["id"]] == {"reason": "round closed"}
    assert audited[by_hand["id"]] == {} and expired["id"] not in audited
    links = {
        link["id"]: link
        for link in client.get(f"{API}/tasks/{TASK}/study-links", headers=researcher.headers).json()["data"]
    }
    assert not any(link["is_open"] for link in links.values())
    # Closing again closes nothing more.
    again = client.post(f"{API}/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    assert again.status_code == 200 and again.json()["study_links_closed"] == 0
    assert _audited_link_closes(app) == audited

    tables = ("users", "platform_accounts", "api_tokens", "study_sessions", "study_links", "audit_log")
    before = table_snapshot(app, *tables)
    counts = table_counts(app)
    attempts = (
        (writers, {**PROLIFIC, "PROLIFIC_PID": prolific_id(40), "SESSION_ID": prolific_id(41)}),  # a new worker
        (writers, PROLIFIC),  # the worker already in a session, resuming
        (validators, {"w": "v-40"}),
    )
    for link, params in attempts:
        response = open_link(client, link, params)
        assert response.status_code == 409 and error_code(response) == "study_link_closed", response.text
        message = response.json()["error"]["message"]
        assert "round of this study link is closed" in message, message
        assert "token" not in response.json() and link["completion_code"] not in response.text
    assert table_snapshot(app, *tables) == before and table_counts(app) == counts


def test_bad_link_bodies_are_refused(client: Any, app: Any, researcher: Actor, round_: dict[str, Any]) -> None:
    before = table_counts(app)
    base = {
        "name": "pilot",
        "round_id": round_["id"],
        "role": "writer",
        "platform": "prolific",
        "quota": 2,
        "max_workers": 10,
    }
    for changes in (
        {"max_workers": None},  # a paid link without a cap on its workers
        {"platform": "mturk", "max_workers": None},
        {"partial_pay_minor": 50},  # partial pay without a partial code
        {"partial_pay_minor": -1, "partial_code": "PART1"},
        {"completion_code": "SAME1", "partial_code": "SAME1"},  # a stop would read as a completion
        {"completion_code": "SAME1", "screened_out_code": "SAME1"},
        {"partial_code": "SAME1", "screened_out_code": "SAME1"},
        {"when_out_of_work": "pay-anyway"},
        {"platform": "generic"},  # no id_parameter
        {"id_parameter": "worker"},  # not a generic link
        {"platform": "generic", "id_parameter": "bad name"},
        {"quota": 0},
        {"max_workers": 0},
        {"round_id": 987654},
        {"completion_code": "has space"},
        {"opens_at": "2030-01-01T00:00:00"},  # no time zone
        {"opens_at": "2030-01-02T00:00:00Z", "closes_at": "2030-01-01T00:00:00Z"},
        {"platform": "paypal"},
        {"surprise": 1},
    ):
        response = client.post(f"{API}/tasks/{TASK}/study-links", json={**base, **changes}, headers=researcher.headers)
        assert response.status_code == 422, (changes, response.text)
    assert table_counts(app) == before


def test_another_groups_researcher_is_told_the_link_does_not_exist(
    client: Any, app: Any, researcher: Actor, make_user: MakeUser, round_: dict[str, Any]
) -> None:
    link = make_link(client, researcher, round_["id"])
    oscar = make_user("oscar", "researcher")
    worker = make_user("wanda", "writer")
    before = table_counts(app)
    for method, path in (
        ("GET", "/study-links/{id}"),
        ("POST", "/study-links/{id}/close"),
        ("GET", "/study-links/{id}/sessions"),
    ):
        theirs = client.request(method, f"{API}{path.format(id=link['id'])}", headers=oscar.headers)
        missing = client.request(method, f"{API}{path.format(id=987654)}", headers=oscar.headers)
        assert theirs.status_code == missing.status_code == 404, theirs.text
        assert theirs.json()["error"]["message"] == missing.json()["error"]["message"].replace(
            "987654", str(link["id"])
        )
        assert client.request(method, f"{API}{path.format(id=link['id'])}", headers=worker.headers).status_code == 403
    response = client.get(f"{API}/tasks/{TASK}/study-links", headers=oscar.headers)
    assert response.status_code == 404
    response = client.post(
        f"{API}/tasks/{TASK}/study-links",
        json={"name": "x", "round_id": round_["id"], "role": "writer", "platform": "prolific", "quota": 1},
        headers=oscar.headers,
    )
    assert response.status_code == 404
    assert table_counts(app) == before
    # The owner sees it, with a working path and the query Prolific fills in.
    mine = client.get(f"{API}/study-links/{link['id']}", headers=researcher.headers).json()
    assert mine["path"] == f"/study/{link['slug']}" and "{{%PROLIFIC_PID%}}" in mine["query_template"]
    assert len(mine["completion_code"]) == 8 and mine["is_open"] is True


def test_a_worker_cannot_read_or_finish_another_workers_session(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    link = make_link(client, researcher, round_["id"])
    alice = open_link(client, link, PROLIFIC).json()
    bob = open_link(client, link, {**PROLIFIC, "PROLIFIC_PID": prolific_id(1), "SESSION_ID": prolific_id(101)}).json()
    assert alice["session"]["id"] != bob["session"]["id"]
    before = table_counts(app)
    theirs = client.post(
        f"{API}/study-sessions/{alice['session']['id']}/finish", json={"reason": "stop"}, headers=bearer(bob["token"])
    )
    missing = client.post(f"{API}/study-sessions/987654/finish", json={"reason": "stop"}, headers=bearer(bob["token"]))
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"]["message"] == missing.json()["error"]["message"].replace(
        "987654", str(alice["session"]["id"])
    )
    assert table_counts(app) == before
    mine = client.get(f"{API}/me/study-sessions", headers=bearer(bob["token"])).json()
    assert [row["id"] for row in mine["data"]] == [bob["session"]["id"]]
    # A study token is a worker's token, nothing more.
    assert client.get(f"{API}/study-links/{link['id']}", headers=bearer(bob["token"])).status_code == 403
    response = client.post(
        f"{API}/study-sessions/{bob['session']['id']}/finish", json={"reason": "later"}, headers=bearer(bob["token"])
    )
    assert response.status_code == 422


def test_the_same_platform_id_resumes_its_one_session(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    link = make_link(client, researcher, round_["id"])
    first = open_link(client, link, PROLIFIC)
    assert first.status_code == 201, first.text
    # Someone who knows the worker's Prolific id, but not the submission's session id, is refused.
    before = table_counts(app)
    hijack = open_link(client, link, {**PROLIFIC, "SESSION_ID": prolific_id(2)})
    assert hijack.status_code == 409 and "another prolific submission" in hijack.json()["error"]["message"]
    assert "token" not in hijack.text and table_counts(app) == before
    again = open_link(client, link, PROLIFIC)
    assert again.status_code == 200, again.text
    assert again.json()["session"]["id"] == first.json()["session"]["id"]
    after = table_counts(app)
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {"api_tokens": 1, "audit_log": 1}
    body = first.json()
    assert body["token"].startswith("dl_") and body["preview"] is False
    expires = dt.datetime.fromisoformat(body["expires_at"])
    assert dt.timedelta(hours=23) < expires - dt.datetime.now(dt.UTC) <= dt.timedelta(hours=24)
    # The re-open replaced the session's token (same expiry): the first one no longer works.
    assert dt.datetime.fromisoformat(again.json()["expires_at"]) == expires
    assert client.get(f"{API}/me", headers=bearer(body["token"])).status_code == 401
    body = again.json()
    me = client.get(f"{API}/me", headers=bearer(body["token"])).json()
    assert me["roles"] == ["writer"] and me["username"].startswith("prolific-")
    assert PROLIFIC["PROLIFIC_PID"] not in me["username"]
    with session_scope(app.state.sessionmaker) as session:
        accounts = list(session.scalars(select(PlatformAccount)))
        assert len(accounts) == 1 and PROLIFIC["PROLIFIC_PID"] not in accounts[0].id_hash
        study = session.scalars(select(StudySession)).one()
        assert study.platform_worker_id == PROLIFIC["PROLIFIC_PID"]  # kept for paying
        assert study.platform_session_id == PROLIFIC["SESSION_ID"]  # the submission that started it
    # A validator link of the same task takes the writer only where it says so: then the same
    # worker, with the validator role added.
    closed_to_writers = make_link(client, researcher, round_["id"], role="validator")
    before = table_counts(app)
    response = open_link(client, closed_to_writers, PROLIFIC)
    assert response.status_code == 409 and error_code(response) == "study_session_taken", response.text
    assert table_counts(app) == before
    validators = make_link(client, researcher, round_["id"], role="validator", other_role_allowed=True)
    response = open_link(client, validators, PROLIFIC)
    assert response.status_code == 201, response.text
    me = client.get(f"{API}/me", headers=bearer(response.json()["token"])).json()
    assert me["username"] == client.get(f"{API}/me", headers=bearer(body["token"])).json()["username"]
    assert sorted(me["roles"]) == ["validator", "writer"]
    # The same id on another platform is another worker.
    generic = make_link(client, researcher, round_["id"], platform="generic", id_parameter="PROLIFIC_PID")
    response = open_link(client, generic, PROLIFIC)
    assert client.get(f"{API}/me", headers=bearer(response.json()["token"])).json()["username"].startswith("generic-")


def test_two_first_opens_at_once_make_one_worker_and_one_session(
    app: Any, app_server: Any, researcher: Actor, stub_model: Any
) -> None:
    with httpx.Client(base_url=app_server.url, timeout=60) as http:
        round_ = open_round(http, researcher, example_yaml(TASK, onboarding_quiz=None), None, PROMPTS)
        link = make_link(http, researcher, round_["id"], platform="mturk")
        responses = fire(8, lambda i: open_link(http, link, MTURK))
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 7 + [201], [r.text for r in responses]
    assert len({r.json()["session"]["id"] for r in responses}) == 1
    with session_scope(app.state.sessionmaker) as session:
        assert len(list(session.scalars(select(PlatformAccount)))) == 1
        assert len(list(session.scalars(select(StudySession)))) == 1
        assert len(list(session.scalars(select(User).where(User.username.like("mturk-%"))))) == 1


def test_the_links_lock_lets_other_transactions_foreign_key_checks_through(
    app: Any, client: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    """The lock under which a link's new workers and sessions are counted (study._LOCK_LINK)
    does not hold up another transaction's foreign-key check on the link (PostgreSQL's
    ``FOR KEY SHARE``, taken by a new study session or platform account, or by an update of a
    session inserted in the same transaction). ``FOR UPDATE`` did: a worker's second request,
    holding it, waited for the first request's session, whose update waited for the lock -- a
    deadlock, seen in CI with eight first opens at once."""
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    if app.state.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no row locks (BEGIN IMMEDIATE serialises its writers)")
    link_id = make_link(client, researcher, round_["id"])["id"]
    foreign_key_check = text("SELECT 1 FROM study_links WHERE id = :link_id FOR KEY SHARE")
    with app.state.engine.connect() as holder, app.state.engine.connect() as other:
        holder.execute(study._LOCK_LINK, {"link_id": link_id})
        other.execute(text("SET LOCAL lock_timeout = '2s'"))
        assert other.execute(foreign_key_check, {"link_id": link_id}).scalar() == 1
        other.rollback()
        holder.rollback()
        # The lock it replaced would have held the check up (and here, timed it out).
        holder.execute(text("SELECT id FROM study_links WHERE id = :link_id FOR UPDATE"), {"link_id": link_id})
        other.execute(text("SET LOCAL lock_timeout = '200ms'"))
        with pytest.raises(OperationalError, match="lock timeout"):
            other.execute(foreign_key_check, {"link_id": link_id})
        other.rollback()
        holder.rollback()


def test_an_mturk_preview_shows_the_task_and_writes_nothing(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    link = make_link(client, researcher, round_["id"], platform="mturk")
    before = table_counts(app)
    preview = {**MTURK, "assignmentId": "ASSIGNMENT_ID_NOT_AVAILABLE"}
    preview.pop("workerId")
    response = open_link(client, link, preview)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["preview"] is True and body["token"] is None and body["session"] is None
    assert body["task"]["name"] == TASK and body["link"] == {
        "name": "pilot",
        "role": "writer",
        "platform": "mturk",
        "quota": 2,
    }
    assert table_counts(app) == before


def test_a_worker_already_unqualified_is_screened_out(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    link = make_link(client, researcher, round_["id"], screened_out_code="NOPE42")
    first = open_link(client, link, PROLIFIC).json()
    username = client.get(f"{API}/study-links/{link['id']}/sessions", headers=researcher.headers).json()["data"][0][
        "username"
    ]
    response = client.post(
        f"{API}/tasks/{TASK}/workers/{username}/unqualify", json={"reason": "pilot"}, headers=researcher.headers
    )
    assert response.status_code == 200, response.text
    # A second link of the task (validators, open to its writers): the worker arrives unqualified.
    other = make_link(
        client,
        researcher,
        round_["id"],
        name="main",
        role="validator",
        other_role_allowed=True,
        screened_out_code="NOPE42",
    )
    response = open_link(client, other, PROLIFIC)
    assert response.status_code == 201, response.text
    session = response.json()["session"]
    assert session["status"] == "screened_out"
    assert session["completion"]["redirect_url"] == "https://app.prolific.com/submissions/complete?cc=NOPE42"
    assert session["completion"]["code"] == "NOPE42"
    # The first session is screened out when it is next read.
    sessions = client.get(f"{API}/me/study-sessions", headers=bearer(first["token"])).json()["data"]
    assert {row["status"] for row in sessions} == {"screened_out"}
    # Finishing does not turn it into a completion.
    done = client.post(
        f"{API}/study-sessions/{first['session']['id']}/finish", json={"reason": "stop"}, headers=bearer(first["token"])
    ).json()
    assert done["status"] == "screened_out" and done["code"] == "NOPE42"


def test_a_worker_out_of_quiz_attempts_is_screened_out(
    client: Any, app: Any, researcher: Actor, stub_model: Any
) -> None:
    round_ = open_round(client, researcher, example_yaml(TASK), stub_model.url, PROMPTS)
    link = make_link(client, researcher, round_["id"], platform="generic", id_parameter="worker")
    started = open_link(client, link, {"worker": "quiz-1"}).json()
    assert started["session"]["status"] == "active"
    token = bearer(started["token"])
    quiz = client.get(f"{API}/tasks/{TASK}/quiz", headers=token).json()
    wrong = [question["options"][-1] for question in quiz["questions"]]
    for _ in range(quiz["attempts_left"]):
        answer = client.post(f"{API}/tasks/{TASK}/quiz/attempts", json={"answers": wrong}, headers=token).json()
        if answer.get("passed"):
            pytest.skip("the last options happen to be the right answers")
    sessions = client.get(f"{API}/me/study-sessions", headers=token).json()["data"]
    assert sessions[0]["status"] == "screened_out"
    completion = sessions[0]["completion"]
    assert completion["code"] is None and completion["redirect_url"] is None and completion["message"]


def _write_example(client: Any, headers: dict[str, str], round_id: int, text: str) -> None:
    assignment = client.post(f"{API}/rounds/{round_id}/assignments", json={}, headers=headers)
    assert assignment.status_code in (200, 201), assignment.text
    assignment_id = assignment.json()["id"]
    attempt = client.post(f"{API}/assignments/{assignment_id}/attempts", json={"text": text}, headers=headers).json()
    assert attempt["status"] == "scored", attempt
    if attempt["fooled"]:
        client.post(f"{API}/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=headers)
    response = client.post(
        f"{API}/assignments/{assignment_id}/example", json={"attempt_id": attempt["id"]}, headers=headers
    )
    assert response.status_code == 201, response.text


def test_the_quota_completes_the_session_with_prolifics_redirect(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    link = make_link(client, researcher, round_["id"], completion_code="C0MPLETE")
    started = open_link(client, link, PROLIFIC).json()
    token = bearer(started["token"])
    session_id = started["session"]["id"]
    assert started["session"]["completion"] is None
    _write_example(client, token, round_["id"], "A plain remark about the lunch menu today.")
    before = table_counts(app)
    early = client.post(f"{API}/study-sessions/{session_id}/finish", json={"reason": "quota"}, headers=token)
    assert early.status_code == 409 and "1 of 2" in early.json()["error"]["message"]
    assert table_counts(app) == before
    row = client.get(f"{API}/me/study-sessions", headers=token).json()["data"][0]
    assert row["units_done"] == 1 and row["status"] == "active"
    _write_example(client, token, round_["id"], "We went there on a Sunday afternoon with friends.")
    row = client.get(f"{API}/me/study-sessions", headers=token).json()["data"][0]
    assert row["units_done"] == 2 and row["status"] == "completed" and row["ended_at"]
    expected = {
        "status": "completed",
        "code": "C0MPLETE",
        "redirect_url": "https://app.prolific.com/submissions/complete?cc=C0MPLETE",
        "form": None,
    }
    assert {k: row["completion"][k] for k in expected} == expected
    for _ in range(2):  # idempotent
        done = client.post(f"{API}/study-sessions/{session_id}/finish", json={"reason": "quota"}, headers=token)
        assert done.status_code == 200 and {k: done.json()[k] for k in expected} == expected
    # Resuming a completed session answers it as it is.
    again = open_link(client, link, PROLIFIC).json()
    assert again["session"]["status"] == "completed"
    researcher_view = client.get(f"{API}/study-links/{link['id']}/sessions", headers=researcher.headers).json()
    assert researcher_view["count"] == 1 and researcher_view["data"][0]["units_done"] == 2


def test_mturk_completion_posts_back_to_the_mturk_host(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    link = make_link(client, researcher, round_["id"], platform="mturk", completion_code="TURKDONE")
    started = open_link(client, link, {**MTURK, "turkSubmitTo": "https://www.mturk.com/"}).json()
    token = bearer(started["token"])
    # A forged turkSubmitTo is refused; another assignment (someone who knows the worker id, or
    # the worker after returning the HIT) cannot take the session over; the same one resumes it.
    before = table_counts(app)
    again = {**MTURK, "assignmentId": mturk_assignment(2), "turkSubmitTo": "https://attacker.example/"}
    assert open_link(client, link, again).status_code == 422
    other = open_link(client, link, {**again, "turkSubmitTo": "https://www.mturk.com"})
    assert other.status_code == 409 and "assignmentId differs" in other.json()["error"]["message"]
    assert table_counts(app) == before
    resumed = open_link(client, link, {**MTURK, "turkSubmitTo": "https://www.mturk.com"})
    assert resumed.status_code == 200 and resumed.json()["session"]["id"] == started["session"]["id"]
    token = bearer(resumed.json()["token"])  # the re-open replaced the session's token
    done = client.post(
        f"{API}/study-sessions/{started['session']['id']}/finish", json={"reason": "stop"}, headers=token
    )
    assert done.status_code == 200, done.text
    # A stop is not a completion: the form posts back the status, never the completion code.
    assert done.json() == {
        "status": "stopped",
        "code": None,
        "redirect_url": None,
        "form": {
            "action": "https://www.mturk.com/mturk/externalSubmit",
            "fields": {"assignmentId": MTURK["assignmentId"], "completion_code": "stopped"},
        },
        "message": done.json()["message"],
    }
    assert "return" in done.json()["message"]
    # A generic link with a partial code answers that code alone.
    generic = make_link(
        client,
        researcher,
        round_["id"],
        name="generic",
        platform="generic",
        id_parameter="worker",
        partial_code="PART1",
    )
    started = open_link(client, generic, {"worker": "demo-1"}).json()
    done = client.post(
        f"{API}/study-sessions/{started['session']['id']}/finish",
        json={"reason": "stop"},
        headers=bearer(started["token"]),
    ).json()
    assert done["code"] == "PART1" and done["redirect_url"] is None and done["form"] is None


def test_the_cli_creates_lists_and_closes_links(
    client: Any, app: Any, settings: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    runner = CliRunner()
    url = settings.database_url

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["study", "link", *args, "--database-url", url], catch_exceptions=False)

    created = run(
        "create", "--task", TASK, "--name", "cli pilot", "--round", "1", "--role", "writer",
        "--platform", "generic", "--id-parameter", "worker", "--quota", "3", "--web-url", "https://crowd.example.org/",
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    printed = created.output.strip().splitlines()[-1]
    assert printed.startswith("https://crowd.example.org/study/") and printed.endswith("?worker=<worker id>")
    slug = printed.removeprefix("https://crowd.example.org/study/").split("?")[0]
    assert open_link(client, {"slug": slug}, {"worker": "cli-1"}).status_code == 201
    listed = run("list", "--task", TASK)
    assert listed.exit_code == 0 and slug in listed.output and "cli pilot" in listed.output
    link_id = client.get(f"{API}/tasks/{TASK}/study-links", headers=researcher.headers).json()["data"][0]["id"]
    assert run("close", str(link_id)).exit_code == 0
    response = open_link(client, {"slug": slug}, {"worker": "cli-1"})
    assert response.status_code == 409 and error_code(response) == "study_link_closed"
    before = table_counts(app)
    bad = run("create", "--task", TASK, "--name", "x", "--round", "1", "--role", "boss", "--platform", "generic",
              "--quota", "1")  # fmt: skip
    assert bad.exit_code == 1 and "writer or validator" in bad.output
    bad = run("create", "--task", TASK, "--name", "x", "--round", "1", "--role", "writer", "--platform", "generic",
              "--quota", "1")  # fmt: skip
    assert bad.exit_code == 1 and "id_parameter" in bad.output
    bad = run("create", "--task", TASK, "--name", "x", "--round", "1", "--role", "writer", "--platform", "prolific",
              "--quota", "1")  # fmt: skip
    assert bad.exit_code == 1 and "max_workers" in bad.output
    assert run("close", "987654").exit_code == 1
    assert table_counts(app) == before
    paid = run("create", "--task", TASK, "--name", "paid", "--round", "1", "--role", "validator", "--platform",
               "prolific", "--quota", "20", "--max-workers", "40", "--partial-code", "PART9", "--partial-pay-minor",
               "30", "--when-out-of-work", "partial", "--other-role-allowed")  # fmt: skip
    assert paid.exit_code == 0, paid.output
    made = client.get(f"{API}/tasks/{TASK}/study-links", headers=researcher.headers).json()["data"][-1]
    assert (made["max_workers"], made["partial_code"], made["partial_pay_minor"]) == (40, "PART9", 30)
    assert made["when_out_of_work"] == "partial" and made["other_role_allowed"] is True


def test_opening_links_is_limited_per_address_and_a_refusal_writes_nothing(
    settings: Any, researcher: Actor, stub_model: Any, reset_stubs: Any
) -> None:
    from fastapi.testclient import TestClient

    from dynaloop.api.app import create_app

    limited = settings.model_copy(update={"rate_limit_per_token": "none", "rate_limit_per_ip": "3/minute"})
    with TestClient(create_app(limited)) as client:
        round_ = open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None), stub_model.url, PROMPTS)
        link = make_link(client, researcher, round_["id"], platform="generic", id_parameter="worker")
        codes = [open_link(client, link, {"worker": f"flood-{i}"}).status_code for i in range(3)]
        assert codes == [201, 201, 201]
        before = table_counts(client.app)
        refused = open_link(client, link, {"worker": "flood-9"})
        assert refused.status_code == 429 and error_code(refused) == "rate_limited"
        assert refused.headers["Retry-After"]
        assert table_counts(client.app) == before


def test_a_validator_session_counts_labels_not_whole_batches(
    client: Any, app: Any, researcher: Actor, make_user: MakeUser, stub_model: Any
) -> None:
    yaml_text = example_yaml(TASK, onboarding_quiz=None, validation_batch_size=3)
    round_ = open_round(client, researcher, yaml_text, stub_model.url, PROMPTS)
    writers = [make_user(f"writer{i}", "writer") for i in range(3)]
    texts = ["A plain remark about the lunch menu today.", "We went there on a Sunday afternoon with friends."]
    for writer in writers:
        for text in texts:
            _write_example(client, writer.headers, round_["id"], f"{text} ({writer.username})")
    # A quota of 4 labels with batches of 3: the quota is met in the middle of the second batch.
    link = make_link(
        client, researcher, round_["id"], role="validator", platform="generic", id_parameter="worker", quota=4
    )
    started = open_link(client, link, {"worker": "val-1"}).json()
    token = bearer(started["token"])
    quota = 4
    labelled = 0
    while labelled < quota:
        batch = client.get(f"{API}/rounds/{round_['id']}/validation-batch", headers=token).json()
        examples = batch["data"]
        assert examples, batch
        for example in examples:
            if labelled == quota:
                break
            response = client.post(
                f"{API}/validation-items/{example['item_id']}/validations", json={"label": "neutral"}, headers=token
            )
            assert response.status_code == 201, response.text
            labelled += 1
            row = client.get(f"{API}/me/study-sessions", headers=token).json()["data"][0]
            assert row["units_done"] == labelled
    assert row["status"] == "completed" and row["completion"]["code"] == link["completion_code"]


def test_a_full_link_never_takes_more_workers_than_its_cap_under_concurrent_first_opens(
    app: Any, app_server: Any, researcher: Actor, stub_model: Any
) -> None:
    with httpx.Client(base_url=app_server.url, timeout=60) as http:
        round_ = open_round(http, researcher, example_yaml(TASK, onboarding_quiz=None), None, PROMPTS)
        link = make_link(http, researcher, round_["id"], platform="generic", id_parameter="worker", max_workers=2)
        responses = fire(8, lambda i: open_link(http, link, {"worker": f"crowd-{i}"}))
    codes = sorted(r.status_code for r in responses)
    assert codes == [201, 201] + [409] * 6, [r.text for r in responses]
    assert {error_code(r) for r in responses if r.status_code == 409} == {"study_link_full"}
    with session_scope(app.state.sessionmaker) as session:
        assert len(list(session.scalars(select(StudySession)))) == 2
        assert len(list(session.scalars(select(PlatformAccount)))) == 2  # the refused ones left nothing


# --- issue 26: worker identity, scope and truthful completion (the attacker's tests first) ------


def _live_tokens(app: Any, user_id: int) -> int:
    now = dt.datetime.now(dt.UTC)
    with session_scope(app.state.sessionmaker) as session:
        tokens = session.scalars(select(ApiToken).where(ApiToken.user_id == user_id, ApiToken.revoked_at.is_(None)))
        return sum(1 for token in tokens if token.expires_at is None or token.expires_at.replace(tzinfo=dt.UTC) > now)


def _user_id(client: Any, token: str) -> int:
    return int(client.get(f"{API}/me", headers=bearer(token)).json()["id"])


def test_made_up_prolific_ids_from_one_address_stop_at_the_cap_and_write_nothing_more(
    client: Any, app: Any, settings: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    """The issue's reproduction: 150 made-up (well-formed) PROLIFIC_PID values from one address.
    The first DYNALOOP_STUDY_NEW_WORKERS_PER_ADDRESS_PER_HOUR make accounts; every later one is
    429 ``too_many_new_workers`` and leaves the database as it was."""
    cap = settings.study_new_workers_per_address_per_hour
    link = make_link(client, researcher, round_["id"], max_workers=1000)
    codes = []
    before = None
    for i in range(150):
        if i == cap:
            before = table_counts(app)
        response = open_link(client, link, {**PROLIFIC, "PROLIFIC_PID": prolific_id(i), "SESSION_ID": prolific_id(i)})
        codes.append(response.status_code)
        if response.status_code == 429:
            assert error_code(response) == "too_many_new_workers"
            assert "this hour" in response.json()["error"]["message"] and response.headers["Retry-After"]
    assert codes == [201] * cap + [429] * (150 - cap)
    assert table_counts(app) == before
    with session_scope(app.state.sessionmaker) as session:
        accounts = list(session.scalars(select(PlatformAccount)))
        assert len(accounts) == cap
        assert all(a.link_id == link["id"] for a in accounts)
        # Only a keyed hash of the address is kept.
        assert {a.address_hash for a in accounts} == {study.address_hash(settings.secret_key, "testclient")}
        assert len(list(session.scalars(select(User).where(User.made_by_link.is_(True))))) == cap
    # A worker who already has an account resumes past the cap: the cap counts new accounts.
    again = open_link(client, link, {**PROLIFIC, "PROLIFIC_PID": prolific_id(0), "SESSION_ID": prolific_id(0)})
    assert again.status_code == 200, again.text


def test_new_workers_per_link_are_capped_whatever_the_address(
    settings: Any, researcher: Actor, stub_model: Any, reset_stubs: Any
) -> None:
    from fastapi.testclient import TestClient

    from dynaloop.api.app import create_app

    capped = settings.model_copy(
        update={
            "study_new_workers_per_link_per_hour": 3,
            "study_new_workers_per_address_per_hour": 100,
            "web_app_key": "web-app-key-0123456789abcdef",
        }
    )
    with TestClient(create_app(capped)) as client:
        round_ = open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None), stub_model.url, PROMPTS)
        link = make_link(client, researcher, round_["id"], max_workers=1000)
        other = make_link(client, researcher, round_["id"], name="other", max_workers=1000)

        def from_address(target: dict[str, Any], n: int) -> httpx.Response:
            headers = {"X-Dynaloop-Client-Address": f"203.0.113.{n}", "X-Dynaloop-Web-App-Key": capped.web_app_key}
            params = {**PROLIFIC, "PROLIFIC_PID": prolific_id(n), "SESSION_ID": prolific_id(n)}
            response: httpx.Response = client.post(
                f"{API}/study/{target['slug']}/sessions", json={"params": params}, headers=headers
            )
            return response

        assert [from_address(link, n).status_code for n in range(3)] == [201, 201, 201]
        before = table_counts(client.app)
        refused = from_address(link, 3)
        assert refused.status_code == 429 and error_code(refused) == "too_many_new_workers"
        assert "this study link" in refused.json()["error"]["message"]
        assert table_counts(client.app) == before
        # Another link of the round has its own count.
        assert from_address(other, 4).status_code == 201
        with session_scope(client.app.state.sessionmaker) as session:
            hashes = [a.address_hash for a in session.scalars(select(PlatformAccount))]
            assert len(set(hashes)) == 4 and not any("203.0.113" in (h or "") for h in hashes)


def test_the_same_prolific_id_on_two_writer_links_of_one_round_gets_one_session(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    """Two writer links of one round, one Prolific id: the second link is refused (409), so one
    piece of work never earns two completion codes and two base pays."""
    first = make_link(client, researcher, round_["id"], name="writers A")
    second = make_link(client, researcher, round_["id"], name="writers B")
    assert open_link(client, first, PROLIFIC).status_code == 201
    before = table_snapshot(app, "users", "platform_accounts", "study_sessions", "api_tokens")
    counts = table_counts(app)
    for params in (PROLIFIC, {**PROLIFIC, "SESSION_ID": prolific_id(77)}):
        response = open_link(client, second, params)
        assert response.status_code == 409 and error_code(response) == "study_session_taken", response.text
        assert "already have a writer session in this round" in response.json()["error"]["message"]
        assert "token" not in response.json()
    assert table_snapshot(app, "users", "platform_accounts", "study_sessions", "api_tokens") == before
    assert table_counts(app) == counts


def test_reopening_a_session_ten_times_leaves_one_live_token(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    link = make_link(client, researcher, round_["id"])
    first = open_link(client, link, PROLIFIC).json()
    user_id = _user_id(client, first["token"])
    tokens = [first["token"]]
    for _ in range(10):
        again = open_link(client, link, PROLIFIC)
        assert again.status_code == 200, again.text
        assert again.json()["expires_at"] == first["expires_at"]  # the first open's expiry, not a new 24 h
        tokens.append(again.json()["token"])
    assert _live_tokens(app, user_id) == 1
    assert [client.get(f"{API}/me", headers=bearer(t)).status_code for t in tokens] == [401] * 10 + [200]
    with session_scope(app.state.sessionmaker) as session:
        row = session.scalars(select(StudySession)).one()
        token = session.get(ApiToken, row.token_id)
        assert token is not None and token.revoked_at is None


def _renamed(yaml_text: str, name: str) -> str:
    import yaml

    data = yaml.safe_load(yaml_text)
    data["name"] = name
    return str(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))


def _two_groups(client: Any, researcher: Actor, make_user: MakeUser, stub_model: Any) -> tuple[Any, ...]:
    """Task A (this group's) and task B (another group's), each with a round and two examples."""
    round_a = open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None), stub_model.url, PROMPTS)
    other = make_user("olga", "researcher")
    round_b = open_round(
        client, other, _renamed(example_yaml(TASK, onboarding_quiz=None), "group-b-task"), stub_model.url, PROMPTS
    )
    author = make_user("ann", "writer")  # made by an admin: every task
    for round_id in (round_a["id"], round_b["id"]):
        _write_example(client, author.headers, round_id, f"A plain remark about lunch in round {round_id}.")
        _write_example(client, author.headers, round_id, f"We went there on a Sunday, round {round_id}.")
    batch_b = client.get(
        f"{API}/rounds/{round_b['id']}/validation-batch", headers=make_user("vic", "validator").headers
    ).json()
    examples_b = [example_id for example_id in served_examples(client, batch_b) if example_id is not None]
    return round_a, round_b, examples_b


def test_a_link_made_worker_reaches_only_its_links_task_and_role(
    client: Any, app: Any, researcher: Actor, make_user: MakeUser, stub_model: Any
) -> None:
    round_a, round_b, examples_b = _two_groups(client, researcher, make_user, stub_model)
    link = make_link(client, researcher, round_a["id"], role="validator", platform="generic", id_parameter="worker")
    token = open_link(client, link, {"worker": "val-a"}).json()["token"]
    headers = bearer(token)
    # Only task A's round is open to them; task B is missing, in the words of a missing one.
    assert [r["id"] for r in client.get(f"{API}/rounds/open", headers=headers).json()["data"]] == [round_a["id"]]
    assert [t["name"] for t in client.get(f"{API}/tasks", headers=headers).json()["data"]] == [TASK]
    before = table_counts(app)
    missing_round = 987654
    for path in ("/rounds/{id}/validation-batch", "/rounds/{id}"):
        theirs = client.get(f"{API}{path.format(id=round_b['id'])}", headers=headers)
        missing = client.get(f"{API}{path.format(id=missing_round)}", headers=headers)
        assert theirs.status_code == missing.status_code == 404, theirs.text
        assert theirs.json()["error"]["message"] == missing.json()["error"]["message"].replace(
            str(missing_round), str(round_b["id"])
        )
    assert client.get(f"{API}/tasks/group-b-task", headers=headers).status_code == 404
    for example_id in examples_b:
        response = client.post(f"{API}/examples/{example_id}/validations", json={"label": "neutral"}, headers=headers)
        assert response.status_code == 404 and f"no example {example_id}" in response.json()["error"]["message"]
    # A validator link grants no writing, on either task.
    for round_id in (round_a["id"], round_b["id"]):
        assert client.post(f"{API}/rounds/{round_id}/assignments", json={}, headers=headers).status_code == 403
    assert table_counts(app) == before
    # On their own task they work as before.
    assert client.get(f"{API}/rounds/{round_a['id']}/validation-batch", headers=headers).status_code == 200
    # A validator an admin made keeps the reach of the role: every task.
    admin_made = make_user("vera", "validator")
    assert client.get(f"{API}/rounds/{round_b['id']}/validation-batch", headers=admin_made.headers).status_code == 200
    assert {r["id"] for r in client.get(f"{API}/rounds/open", headers=admin_made.headers).json()["data"]} == {
        round_a["id"],
        round_b["id"],
    }


def test_a_link_made_writer_cannot_write_or_take_the_quiz_on_another_task(
    client: Any, app: Any, researcher: Actor, make_user: MakeUser, stub_model: Any
) -> None:
    round_a, round_b, _ = _two_groups(client, researcher, make_user, stub_model)
    link = make_link(client, researcher, round_a["id"], platform="generic", id_parameter="worker")
    headers = bearer(open_link(client, link, {"worker": "writer-a"}).json()["token"])
    before = table_counts(app)
    theirs = client.post(f"{API}/rounds/{round_b['id']}/assignments", json={}, headers=headers)
    assert theirs.status_code == 404 and f"no round with id {round_b['id']}" in theirs.json()["error"]["message"]
    assert client.get(f"{API}/tasks/group-b-task/quiz", headers=headers).status_code == 404
    assert client.get(f"{API}/rounds/{round_a['id']}/validation-batch", headers=headers).status_code == 403
    assert table_counts(app) == before
    assert client.post(f"{API}/rounds/{round_a['id']}/assignments", json={}, headers=headers).status_code in (200, 201)


def test_a_writer_links_worker_opening_a_validator_link_is_refused_unless_it_allows(
    client: Any, app: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    writers = make_link(client, researcher, round_["id"], platform="generic", id_parameter="worker")
    closed = make_link(client, researcher, round_["id"], role="validator", platform="generic", id_parameter="worker")
    started = open_link(client, writers, {"worker": "w-1"}).json()
    before = table_snapshot(app, "users", "platform_accounts", "study_sessions", "api_tokens")
    response = open_link(client, closed, {"worker": "w-1"})
    assert response.status_code == 409 and error_code(response) == "study_session_taken"
    assert "does not take workers of the other role" in response.json()["error"]["message"]
    assert table_snapshot(app, "users", "platform_accounts", "study_sessions", "api_tokens") == before
    me = client.get(f"{API}/me", headers=bearer(started["token"])).json()
    assert me["roles"] == ["writer"]
    # And the reverse: a validator link's worker on a writer link.
    validator = open_link(client, closed, {"worker": "v-1"})
    assert validator.status_code == 201
    response = open_link(client, writers, {"worker": "v-1"})
    assert response.status_code == 409 and error_code(response) == "study_session_taken"


@pytest.fixture
def paid_round(client: Any, researcher: Actor, stub_model: Any) -> dict[str, Any]:
    pay = {"currency": "GBP", "base_pay": {"writer": 150, "validator": 100}}
    yaml_text = example_yaml(TASK, onboarding_quiz=None, pay=pay, validation_batch_size=3)
    return open_round(client, researcher, yaml_text, stub_model.url, PROMPTS)


def _ledger_rows(app: Any) -> set[tuple[str, str, int]]:
    with session_scope(app.state.sessionmaker) as session:
        return {(e.kind.value, e.event_key, e.amount_minor) for e in session.scalars(select(LedgerEntry))}


def test_a_stopped_prolific_session_gets_no_completion_code_and_no_pay(
    client: Any, app: Any, researcher: Actor, paid_round: dict[str, Any]
) -> None:
    """Finish at 0 of N: the worker is told to return the submission; no code, no redirect, no
    base pay. A link with a partial code and pay gives that code (never the completion code)
    and only that pay."""
    bare = make_link(client, researcher, paid_round["id"], name="bare", completion_code="FULL1")
    started = open_link(client, bare, PROLIFIC).json()
    session_id = started["session"]["id"]
    for _ in range(2):  # idempotent
        done = client.post(
            f"{API}/study-sessions/{session_id}/finish", json={"reason": "stop"}, headers=bearer(started["token"])
        )
        assert done.status_code == 200, done.text
        body = done.json()
        assert body["status"] == "stopped" and body["code"] is None and body["redirect_url"] is None
        assert "return it on Prolific" in body["message"] and "FULL1" not in done.text
    # The researcher's view and the worker's own list say the same.
    row = client.get(f"{API}/me/study-sessions", headers=bearer(started["token"])).json()["data"][0]
    assert row["completion"]["code"] is None and row["completion"]["redirect_url"] is None

    partial = make_link(
        client,
        researcher,
        paid_round["id"],
        name="partial",
        completion_code="FULL2",
        partial_code="PART2",
        partial_pay_minor=40,
    )
    other = {**PROLIFIC, "PROLIFIC_PID": prolific_id(5), "SESSION_ID": prolific_id(5)}
    started2 = open_link(client, partial, other).json()
    done = client.post(
        f"{API}/study-sessions/{started2['session']['id']}/finish",
        json={"reason": "stop"},
        headers=bearer(started2["token"]),
    ).json()
    assert done["code"] == "PART2" and done["redirect_url"].endswith("?cc=PART2") and "FULL2" not in str(done)
    # The ledger: the partial session is paid its partial pay once; the bare stop nothing.
    for _ in range(2):
        response = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=researcher.headers)
        assert response.status_code == 200, response.text
    assert _ledger_rows(app) == {("base_pay", f"session:{started2['session']['id']}", 40)}


def test_a_validator_out_of_work_completes_as_the_link_says(
    client: Any, app: Any, researcher: Actor, make_user: MakeUser, paid_round: dict[str, Any]
) -> None:
    """Two examples to label, a quota of 10 labels: once the round has nothing more to serve,
    the validator finishes with reason out_of_work; the link's policy decides the completion."""
    author = make_user("ann", "writer")
    _write_example(client, author.headers, paid_round["id"], "A plain remark about the lunch menu today.")
    _write_example(client, author.headers, paid_round["id"], "We went there on a Sunday afternoon with friends.")
    complete = make_link(
        client, researcher, paid_round["id"], role="validator", quota=10, completion_code="VALDONE", max_workers=5
    )
    started = open_link(client, complete, PROLIFIC).json()
    headers = bearer(started["token"])
    session_id = started["session"]["id"]
    # While there is work, out_of_work is refused and writes nothing (no claims kept either).
    before = table_counts(app)
    early = client.post(f"{API}/study-sessions/{session_id}/finish", json={"reason": "out_of_work"}, headers=headers)
    assert early.status_code == 409 and "still has examples" in early.json()["error"]["message"]
    assert table_counts(app) == before
    batch = client.get(f"{API}/rounds/{paid_round['id']}/validation-batch", headers=headers).json()["data"]
    assert len(batch) == 2
    for example in batch:
        response = client.post(
            f"{API}/validation-items/{example['item_id']}/validations", json={"label": "neutral"}, headers=headers
        )
        assert response.status_code == 201, response.text
    row = client.get(f"{API}/me/study-sessions", headers=headers).json()["data"][0]
    assert row["units_done"] == 2 and row["status"] == "active"  # labels, not batches
    done = client.post(f"{API}/study-sessions/{session_id}/finish", json={"reason": "out_of_work"}, headers=headers)
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "completed" and done.json()["code"] == "VALDONE"
    client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=researcher.headers)
    assert _ledger_rows(app) == {("base_pay", f"session:{session_id}", 100)}

    # A "return" link: the validator with nothing to do is told to return it, no code, no pay.
    returning = make_link(
        client,
        researcher,
        paid_round["id"],
        name="return",
        role="validator",
        quota=10,
        when_out_of_work="return",
        partial_code="PART3",
        max_workers=5,
    )
    other = {**PROLIFIC, "PROLIFIC_PID": prolific_id(9), "SESSION_ID": prolific_id(9)}
    started = open_link(client, returning, other).json()
    headers = bearer(started["token"])
    # This validator has the two examples still to label (they were not theirs).
    for example in client.get(f"{API}/rounds/{paid_round['id']}/validation-batch", headers=headers).json()["data"]:
        client.post(
            f"{API}/validation-items/{example['item_id']}/validations", json={"label": "neutral"}, headers=headers
        )
    done = client.post(
        f"{API}/study-sessions/{started['session']['id']}/finish", json={"reason": "out_of_work"}, headers=headers
    ).json()
    assert done["status"] == "stopped" and done["code"] is None and "return" in done["message"]
    client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=researcher.headers)
    assert _ledger_rows(app) == {("base_pay", f"session:{session_id}", 100)}
    # A writer session does not end for want of work.
    writers = make_link(client, researcher, paid_round["id"], name="writers")
    started = open_link(client, writers, {**PROLIFIC, "PROLIFIC_PID": prolific_id(11)}).json()
    response = client.post(
        f"{API}/study-sessions/{started['session']['id']}/finish",
        json={"reason": "out_of_work"},
        headers=bearer(started["token"]),
    )
    assert response.status_code == 422


def test_a_worker_mid_session_when_the_round_closes_cannot_work_on_and_gets_only_what_the_link_pays(
    client: Any, app: Any, researcher: Actor, make_user: MakeUser, paid_round: dict[str, Any]
) -> None:
    """The round closes under three workers: a writer halfway to the quota (with a scored
    attempt not yet submitted), a writer who met it, and a validator with one label of three.
    After the close nothing they send is written; the one who met the quota gets the
    completion code, the others only the stop their link allows (its partial code), never the
    completion code; the ledger pays each what the pay policy and the link give, nothing more."""
    author = make_user("ann", "writer")
    for text in ("A plain remark about the lunch menu today.", "We went there on a Sunday afternoon with friends."):
        _write_example(client, author.headers, paid_round["id"], text)
    writers = make_link(
        client,
        researcher,
        paid_round["id"],
        name="writers",
        quota=2,
        completion_code="WDONE",
        partial_code="WPART",
        partial_pay_minor=40,
    )
    validators = make_link(
        client,
        researcher,
        paid_round["id"],
        name="validators",
        role="validator",
        quota=3,
        completion_code="VDONE",
        partial_code="VPART",
        partial_pay_minor=30,
        when_out_of_work="partial",
    )
    halfway = open_link(client, writers, PROLIFIC).json()
    halfway_headers = bearer(halfway["token"])
    _write_example(client, halfway_headers, paid_round["id"], "The soup arrived cold and nobody came to ask.")
    assignment = client.post(f"{API}/rounds/{paid_round['id']}/assignments", json={}, headers=halfway_headers).json()
    attempt = client.post(
        f"{API}/assignments/{assignment['id']}/attempts",
        json={"text": "Honestly the staff could not have been kinder to us."},
        headers=halfway_headers,
    ).json()
    assert attempt["status"] == "scored", attempt
    done_ids = {**PROLIFIC, "PROLIFIC_PID": prolific_id(20), "SESSION_ID": prolific_id(21)}
    finished = open_link(client, writers, done_ids).json()
    for text in ("My sister loved the garden seating out back.", "The bill was split without any fuss at all."):
        _write_example(client, bearer(finished["token"]), paid_round["id"], text)
    labeller = open_link(client, validators, {**PROLIFIC, "PROLIFIC_PID": prolific_id(30)}).json()
    labeller_headers = bearer(labeller["token"])
    batch = client.get(f"{API}/rounds/{paid_round['id']}/validation-batch", headers=labeller_headers).json()["data"]
    assert len(batch) >= 2
    labelled = client.post(
        f"{API}/validation-items/{batch[0]['item_id']}/validations", json={"label": "neutral"}, headers=labeller_headers
    )
    assert labelled.status_code == 201, labelled.text

    closed = client.post(
        f"{API}/rounds/{paid_round['id']}/status", json={"status": "closed"}, headers=researcher.headers
    )
    assert closed.status_code == 200 and closed.json()["study_links_closed"] == 2, closed.text

    # Nothing the workers send now is written.
    before = table_counts(app)
    refused = {
        "submit the scored attempt": client.post(
            f"{API}/assignments/{assignment['id']}/example",
            json={"attempt_id": attempt["id"]},
            headers=halfway_headers,
        ),
        "try again": client.post(
            f"{API}/assignments/{assignment['id']}/attempts",
            json={"text": "The dessert menu was short but every item was good."},
            headers=halfway_headers,
        ),
        "take a new assignment": client.post(
            f"{API}/rounds/{paid_round['id']}/assignments", json={}, headers=halfway_headers
        ),
        "label the next item": client.post(
            f"{API}/validation-items/{batch[1]['item_id']}/validations",
            json={"label": "neutral"},
            headers=labeller_headers,
        ),
        "ask for a batch": client.get(f"{API}/rounds/{paid_round['id']}/validation-batch", headers=labeller_headers),
        "finish the writer at the quota": client.post(
            f"{API}/study-sessions/{halfway['session']['id']}/finish", json={"reason": "quota"}, headers=halfway_headers
        ),
        "finish the validator at the quota": client.post(
            f"{API}/study-sessions/{labeller['session']['id']}/finish",
            json={"reason": "quota"},
            headers=labeller_headers,
        ),
        "finish the writer out of work": client.post(
            f"{API}/study-sessions/{halfway['session']['id']}/finish",
            json={"reason": "out_of_work"},
            headers=halfway_headers,
        ),
    }
    statuses = {what: answer.status_code for what, answer in refused.items()}
    expected = {**dict.fromkeys(refused, 409), "finish the writer out of work": 422}
    assert statuses == expected, {what: answer.text for what, answer in refused.items()}
    assert "is closed" in refused["submit the scored attempt"].json()["error"]["message"]
    assert "1 of 2 done" in refused["finish the writer at the quota"].json()["error"]["message"]
    assert "WDONE" not in str([a.text for a in refused.values()]) and "VDONE" not in str(
        [a.text for a in refused.values()]
    )
    assert table_counts(app) == before

    # The one who met the quota completes; the others get their link's partial code, never the completion code.
    completion = client.post(
        f"{API}/study-sessions/{finished['session']['id']}/finish",
        json={"reason": "quota"},
        headers=bearer(finished["token"]),
    ).json()
    assert completion["status"] == "completed" and completion["code"] == "WDONE"
    stop = client.post(
        f"{API}/study-sessions/{halfway['session']['id']}/finish", json={"reason": "stop"}, headers=halfway_headers
    ).json()
    assert stop["status"] == "stopped" and stop["code"] == "WPART" and "WDONE" not in str(stop)
    out = client.post(
        f"{API}/study-sessions/{labeller['session']['id']}/finish",
        json={"reason": "out_of_work"},
        headers=labeller_headers,
    ).json()
    assert out["status"] == "stopped" and out["code"] == "VPART" and "VDONE" not in str(out)
    for _ in range(2):
        response = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=researcher.headers)
        assert response.status_code == 200, response.text
    assert _ledger_rows(app) == {
        ("base_pay", f"session:{finished['session']['id']}", 150),
        ("base_pay", f"session:{halfway['session']['id']}", 40),
        ("base_pay", f"session:{labeller['session']['id']}", 30),
    }


def test_concurrent_first_opens_from_one_address_never_pass_its_cap(
    app: Any, app_server: Any, settings: Any, researcher: Actor, stub_model: Any
) -> None:
    """Twelve made-up ids at the same moment from one address, over two links of one round (so
    the link's row lock alone would not serialise them): exactly the per-address cap of them
    make accounts."""
    cap = settings.study_new_workers_per_address_per_hour
    with httpx.Client(base_url=app_server.url, timeout=60) as http:
        round_ = open_round(http, researcher, example_yaml(TASK, onboarding_quiz=None), None, PROMPTS)
        links = [make_link(http, researcher, round_["id"], name=f"link {i}", max_workers=100) for i in range(2)]

        def first_open(i: int) -> httpx.Response:
            params = {**PROLIFIC, "PROLIFIC_PID": prolific_id(i), "SESSION_ID": prolific_id(i)}
            return open_link(http, links[i % 2], params)

        responses = fire(12, first_open)
    codes = sorted(r.status_code for r in responses)
    assert codes == [201] * cap + [429] * (12 - cap), [r.text for r in responses]
    with session_scope(app.state.sessionmaker) as session:
        assert len(list(session.scalars(select(PlatformAccount)))) == cap
        assert len(list(session.scalars(select(StudySession)))) == cap


WEB_APP_KEY = "web-app-key-for-the-paid-round-0123"


@pytest.fixture
def named_address_server(settings: Any, stub_model: Any, reset_stubs: Any) -> Iterator[tuple[Any, str]]:
    """The API over real HTTP, trusting the web app's key, so that each request can name the
    client address it counts against (X-Dynaloop-Client-Address)."""
    from dynaloop.api.app import create_app
    from tests.conftest import free_port
    from tests.stub_model_server import ThreadedServer

    paid_app = create_app(settings.model_copy(update={"web_app_key": WEB_APP_KEY}))
    server = ThreadedServer(paid_app, free_port()).start()
    try:
        yield paid_app, server.url
    finally:
        server.stop()
        paid_app.state.engine.dispose()


def test_a_simulated_paid_round_pays_each_genuine_session_once(
    named_address_server: tuple[Any, str], researcher: Actor, stub_model: Any
) -> None:
    """Issue 26's paid round, the identity part: 20 genuine workers (10 writers, 10 validators,
    each from their own address) and 50 made-up Prolific ids from one address, all over real
    HTTP. The made-up ids make at most the per-address cap of accounts; the ledger pays each
    genuine completed session once, and nothing to the made-up ones."""
    paid_app, url = named_address_server
    cap = paid_app.state.settings.study_new_workers_per_address_per_hour
    pay = {"currency": "GBP", "base_pay": {"writer": 150, "validator": 100}}
    from tests.conftest import register_model_server

    server = register_model_server(paid_app, stub_model.url)
    with httpx.Client(base_url=url, timeout=60) as http:

        def from_address(address: str) -> dict[str, str]:
            return {"X-Dynaloop-Client-Address": address, "X-Dynaloop-Web-App-Key": WEB_APP_KEY}

        def arrive(link: dict[str, Any], n: int, address: str) -> httpx.Response:
            params = {**PROLIFIC, "PROLIFIC_PID": prolific_id(n), "SESSION_ID": prolific_id(10_000 + n)}
            response: httpx.Response = http.post(
                f"{API}/study/{link['slug']}/sessions", json={"params": params}, headers=from_address(address)
            )
            return response

        round_ = open_round(
            http,
            researcher,
            example_yaml(TASK, onboarding_quiz=None, pay=pay, validation_batch_size=2),
            server,
            PROMPTS,
        )
        writers = make_link(http, researcher, round_["id"], name="writers", quota=1, max_workers=20)
        validators = make_link(http, researcher, round_["id"], name="validators", role="validator", quota=2)
        writer_tokens = []
        for n in range(10):
            started = arrive(writers, n, f"198.51.100.{n}")
            assert started.status_code == 201, started.text
            token = started.json()["token"]
            _write_example(http, bearer(token), round_["id"], f"Genuine writer {n} found the soup cold and bland.")
            writer_tokens.append(token)
        # A genuine writer cannot come back as a validator of the round.
        assert arrive(validators, 0, "198.51.100.0").status_code == 409
        for n in range(100, 110):
            started = arrive(validators, n, f"192.0.2.{n}")
            assert started.status_code == 201, started.text
            headers = bearer(started.json()["token"])
            batch = http.get(f"{API}/rounds/{round_['id']}/validation-batch", headers=headers).json()["data"]
            for example in batch[:2]:
                response = http.post(
                    f"{API}/validation-items/{example['item_id']}/validations",
                    json={"label": "negative"},
                    headers=headers,
                )
                assert response.status_code == 201, response.text
        # 50 made-up ids from one address.
        made_up = [arrive(validators, 1000 + n, "203.0.113.66").status_code for n in range(50)]
        assert made_up == [201] * cap + [429] * (50 - cap)
        for token in writer_tokens:
            (row,) = http.get(f"{API}/me/study-sessions", headers=bearer(token)).json()["data"]
            assert row["status"] == "completed"
        sessions = http.get(f"{API}/study-links/{validators['id']}/sessions", headers=researcher.headers).json()
        statuses = [row["status"] for row in sessions["data"]]
        assert statuses.count("completed") == 10 and statuses.count("active") == cap
        for _ in range(2):
            response = http.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=researcher.headers)
            assert response.status_code == 200, response.text
    with session_scope(paid_app.state.sessionmaker) as session:
        accounts = list(session.scalars(select(PlatformAccount)))
        assert len(accounts) == 20 + cap
        rows = [(e.kind.value, e.session_id, e.amount_minor) for e in session.scalars(select(LedgerEntry))]
        base = [row for row in rows if row[0] == "base_pay"]
        assert len(base) == len({row[1] for row in base}) == 20
        assert sorted(amount for _, _, amount in base) == [100] * 10 + [150] * 10
        completed = set(
            session.scalars(select(StudySession.id).where(StudySession.status == StudySessionStatus.completed))
        )
        assert {row[1] for row in base} == completed
