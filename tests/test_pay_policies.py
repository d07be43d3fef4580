"""Pay policies that can change (issue 27, part D): versions, the version each ledger row is paid
under, the API, the command, and each worker's effective hourly pay against the platforms'
published minimums.

The attackers come first (another group's researcher, workers, bad policies, a currency change
under a ledger); then the rules, on a round whose study sessions are planted with known times.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from services.db.engine import session_scope
from services.db.models import (
    AuditEntry,
    LedgerEntry,
    PayPolicyVersion,
    Platform,
    StudyLink,
    StudyRole,
    StudySession,
    StudySessionStatus,
    Task,
    User,
    utcnow,
)
from services.domain import ledger, pay_policies, tasks
from services.errors import Invalid
from tests.conftest import Actor, MakeUser, example_yaml, open_round, table_snapshot

pytestmark = pytest.mark.both_databases  # money: the policy version each ledger row is paid under


API = "/api/v1"
TASK = "dynasent-r2"
V1 = {"currency": "GBP", "base_pay": {"writer": 150, "validator": 100}, "writer_bonus_per_example": 10}
V2 = {"currency": "GBP", "base_pay": {"writer": 200, "validator": 120}, "writer_bonus_per_example": 10}
T0 = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)
POLICY_TABLES = ("pay_policies", "ledger_entries", "audit_log")


def _round(client: TestClient, researcher: Actor, pay: dict[str, Any] | None = V1) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None, pay=pay), None)


def _link(app: Any, round_id: int, name: str, role: StudyRole, platform: Platform) -> int:
    with session_scope(app.state.sessionmaker) as session:
        task_id = session.scalars(select(Task.id).where(Task.name == TASK)).one()
        link = StudyLink(
            slug=f"slug-{name}",
            name=name,
            task_id=task_id,
            round_id=round_id,
            role=role,
            platform=platform,
            quota=5,
            completion_code=f"C-{name}",
        )
        session.add(link)
        session.flush()
        return link.id


def _session(
    app: Any,
    link_id: int,
    user_id: int,
    status: StudySessionStatus,
    started: dt.datetime,
    ended: dt.datetime | None,
    last_seen: dt.datetime | None = None,
) -> int:
    with session_scope(app.state.sessionmaker) as session:
        row = StudySession(
            link_id=link_id,
            user_id=user_id,
            status=status,
            started_at=started,
            last_seen_at=last_seen or ended or started,
            ended_at=ended,
        )
        session.add(row)
        session.flush()
        return row.id


def _user_id(app: Any, username: str) -> int:
    with session_scope(app.state.sessionmaker) as session:
        return session.scalars(select(User.id).where(User.username == username)).one()


def _entries(app: Any) -> dict[str, tuple[int, int | None]]:
    """event key -> (amount, pay policy version)"""
    with session_scope(app.state.sessionmaker) as session:
        return {
            e.event_key: (e.amount_minor, e.pay_policy_version)
            for e in session.scalars(select(LedgerEntry).order_by(LedgerEntry.id))
        }


def _put(client: TestClient, actor: Actor, policy: Any, note: str = "") -> Any:
    return client.put(f"{API}/tasks/{TASK}/pay-policy", json={"policy": policy, "note": note}, headers=actor.headers)


# --- attackers ----------------------------------------------------------------------------------


def test_another_groups_researcher_is_told_there_is_no_such_task_and_nothing_changes(
    client: TestClient, app: Any, make_user: MakeUser
) -> None:
    rita = make_user("rita", "researcher")
    _round(client, rita)
    oscar = make_user("oscar", "researcher")
    before = table_snapshot(app, *POLICY_TABLES)
    no_task = f"no task {TASK!r}; list tasks with GET /api/v1/tasks"
    for response in (
        client.get(f"{API}/tasks/{TASK}/pay-policy", headers=oscar.headers),
        _put(client, oscar, V2, "mine now"),
    ):
        assert response.status_code == 404, response.text
        assert response.json()["error"]["message"] == no_task
    assert table_snapshot(app, *POLICY_TABLES) == before


def test_workers_cannot_read_or_change_a_pay_policy(client: TestClient, app: Any, make_user: MakeUser) -> None:
    rita = make_user("rita", "researcher")
    _round(client, rita)
    workers = (make_user("w", "writer"), make_user("v", "validator"))
    before = table_snapshot(app, *POLICY_TABLES)
    for actor in workers:
        assert client.get(f"{API}/tasks/{TASK}/pay-policy", headers=actor.headers).status_code == 403
        assert _put(client, actor, V2).status_code == 403
    assert client.put(f"{API}/tasks/{TASK}/pay-policy", json={"policy": V2}).status_code == 401
    assert table_snapshot(app, *POLICY_TABLES) == before


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"base_pay": {"writer": -1, "validator": 100}}, "base_pay.writer"),
        ({"base_pay": {"writer": 150.0, "validator": 100}}, "base_pay.writer"),
        ({"base_pay": {"writer": 1.5, "validator": 100}}, "base_pay.writer"),
        ({"writer_bonus_per_example": 10**12}, "writer_bonus_per_example"),
        ({"writer_bonus_per_example": "10"}, "writer_bonus_per_example"),
        ({"writer_bonus_per_example": True}, "writer_bonus_per_example"),
        ({"min_hourly_minor": -600}, "min_hourly_minor"),
        ({"tip": 5}, "tip"),
        ({"base_pay": {"writer": 150, "reviewer": 1}}, "reviewer"),
        ({"currency": "pounds"}, "currency"),
        ({"validator_bonus": {"per_batch": 20, "min_agreement": 2}}, "min_agreement"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field_and_nothing_is_written(
    client: TestClient, app: Any, make_user: MakeUser, change: dict[str, Any], words: str
) -> None:
    rita = make_user("rita", "researcher")
    _round(client, rita)
    before = table_snapshot(app, *POLICY_TABLES)
    response = _put(client, rita, {**V1, **change})
    assert response.status_code == 422, response.text
    assert words in response.text
    assert table_snapshot(app, *POLICY_TABLES) == before


@pytest.mark.parametrize(
    "body",
    [
        {"policy": V2, "note": "x" * 501},
        {"policy": V2, "note": "bidi \u202e override"},
        {"policy": V2, "extra": 1},
        {"policy": [V2]},
        {"policy": "GBP 150"},
        {},
    ],
)
def test_a_bad_request_body_is_refused_and_nothing_is_written(
    client: TestClient, app: Any, make_user: MakeUser, body: dict[str, Any]
) -> None:
    rita = make_user("rita", "researcher")
    _round(client, rita)
    before = table_snapshot(app, *POLICY_TABLES)
    response = client.put(f"{API}/tasks/{TASK}/pay-policy", json=body, headers=rita.headers)
    assert response.status_code == 422, response.text
    assert table_snapshot(app, *POLICY_TABLES) == before


def test_the_currency_cannot_change_once_the_ledger_has_rows(client: TestClient, app: Any, make_user: MakeUser) -> None:
    rita = make_user("rita", "researcher")
    round_ = _round(client, rita)
    wanda = make_user("wanda", "writer")
    link = _link(app, round_["id"], "writers", StudyRole.writer, Platform.prolific)
    _session(app, link, _user_id(app, "wanda"), StudySessionStatus.completed, T0, T0 + dt.timedelta(minutes=20))
    assert wanda.headers  # the worker exists; her session is planted
    computed = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=rita.headers)
    assert computed.status_code == 200 and computed.json()["entries_added"] == 1
    before = table_snapshot(app, *POLICY_TABLES)
    response = _put(client, rita, {**V2, "currency": "USD"})
    assert response.status_code == 422, response.text
    assert "currency cannot change from GBP to USD" in response.json()["error"]["message"]
    assert table_snapshot(app, *POLICY_TABLES) == before
    # The same amounts in GBP are a new version.
    assert _put(client, rita, V2, "more per session").status_code == 200


def test_a_currency_set_while_the_ledger_is_empty_replaces_the_earlier_versions(
    client: TestClient, app: Any, make_user: MakeUser
) -> None:
    rita = make_user("rita", "researcher")
    round_ = _round(client, rita)
    make_user("wanda", "writer")
    link = _link(app, round_["id"], "writers", StudyRole.writer, Platform.mturk)
    _session(app, link, _user_id(app, "wanda"), StudySessionStatus.completed, T0, T0 + dt.timedelta(minutes=20))
    # The session ended before the change: under GBP version 1 it would earn 150 pence; the USD
    # version replaces the GBP one, so it earns 300 cents and the ledger is in USD only.
    assert _put(client, rita, {"currency": "USD", "base_pay": {"writer": 300}}).status_code == 200
    computed = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=rita.headers).json()
    assert computed["currency"] == "USD"
    with session_scope(app.state.sessionmaker) as session:
        rows = [(e.amount_minor, e.currency, e.pay_policy_version) for e in session.scalars(select(LedgerEntry))]
    assert rows == [(300, "USD", 2)]


# --- the rules ----------------------------------------------------------------------------------


def test_the_task_yaml_is_version_1_and_get_shows_current_and_versions(
    client: TestClient, app: Any, make_user: MakeUser
) -> None:
    rita = make_user("rita", "researcher")
    _round(client, rita)
    shown = client.get(f"{API}/tasks/{TASK}/pay-policy", headers=rita.headers)
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["current"]["version"] == 1 and body["current"]["policy"]["base_pay"] == {
        "writer": 150,
        "validator": 100,
    }
    assert [v["version"] for v in body["versions"]] == [1]
    assert body["ledger_currency"] is None
    changed = _put(client, rita, V2, "pilot took longer than planned")
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert [v["version"] for v in body["versions"]] == [1, 2]
    assert body["current"]["policy"]["base_pay"] == {"writer": 200, "validator": 120}
    assert body["current"]["note"] == "pilot took longer than planned"
    assert body["versions"][0]["policy"]["base_pay"] == {"writer": 150, "validator": 100}  # never edited
    with session_scope(app.state.sessionmaker) as session:
        audit = session.execute(
            select(AuditEntry.action, AuditEntry.details).where(AuditEntry.action == "pay_policy.set")
        ).all()
    assert [details["version"] for _, details in audit] == [1, 2]


def test_a_task_without_a_policy_gets_one_and_then_pays_the_work_done_before_it(
    client: TestClient, app: Any, make_user: MakeUser
) -> None:
    rita = make_user("rita", "researcher")
    round_ = _round(client, rita, pay=None)
    make_user("wanda", "writer")
    assert client.get(f"{API}/tasks/{TASK}/pay-policy", headers=rita.headers).json()["current"] is None
    link = _link(app, round_["id"], "writers", StudyRole.writer, Platform.prolific)
    session_id = _session(
        app, link, _user_id(app, "wanda"), StudySessionStatus.completed, T0, T0 + dt.timedelta(minutes=20)
    )
    refused = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=rita.headers)
    assert refused.status_code == 422 and "has no pay policy" in refused.json()["error"]["message"]
    assert _put(client, rita, V1).status_code == 200
    assert client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=rita.headers).status_code == 200
    assert _entries(app) == {f"session:{session_id}": (150, 1)}


def test_a_change_mid_round_pays_work_before_it_at_the_old_rate_and_after_it_at_the_new(
    client: TestClient, app: Any, make_user: MakeUser
) -> None:
    rita = make_user("rita", "researcher")
    round_ = _round(client, rita)
    for name in ("wanda", "wes", "walt", "vera"):
        make_user(name, "validator" if name == "vera" else "writer")
    writers = _link(app, round_["id"], "writers", StudyRole.writer, Platform.prolific)
    validators = _link(app, round_["id"], "validators", StudyRole.validator, Platform.prolific)
    # Before the change: wanda's session ended (computed now); wes's ended too, computed only after
    # the change; walt's is still active when the policy changes and completes after it.
    before_wanda = _session(
        app, writers, _user_id(app, "wanda"), StudySessionStatus.completed, T0, T0 + dt.timedelta(minutes=20)
    )
    before_wes = _session(
        app, writers, _user_id(app, "wes"), StudySessionStatus.completed, T0, T0 + dt.timedelta(minutes=25)
    )
    first = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=rita.headers).json()
    assert first["entries_added"] == 2
    with session_scope(app.state.sessionmaker) as session:  # walt starts before the change
        walt = StudySession(
            link_id=writers,
            user_id=_user_id(app, "walt"),
            status=StudySessionStatus.active,
            started_at=utcnow() - dt.timedelta(minutes=5),
            last_seen_at=utcnow(),
        )
        session.add(walt)
        session.flush()
        walt_id = walt.id
    assert _put(client, rita, V2, "raise after the pilot").status_code == 200
    with session_scope(app.state.sessionmaker) as session:  # ...and completes after it
        row = session.get(StudySession, walt_id)
        assert row is not None
        row.status, row.ended_at = StudySessionStatus.completed, utcnow()
    vera = _session(app, validators, _user_id(app, "vera"), StudySessionStatus.completed, utcnow(), utcnow())
    rows_before = table_snapshot(app, "ledger_entries")["ledger_entries"]
    second = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=rita.headers).json()
    assert second["entries_added"] == 2 and second["already_paid"] == 2
    assert _entries(app) == {
        f"session:{before_wanda}": (150, 1),
        f"session:{before_wes}": (150, 1),
        f"session:{walt_id}": (200, 2),
        f"session:{vera}": (120, 2),
    }
    # The rows computed before the change are unchanged, column for column.
    assert table_snapshot(app, "ledger_entries")["ledger_entries"][: len(rows_before)] == rows_before


def test_the_timeline_chooses_the_version_in_force_when_the_work_was_done() -> None:
    def row(version: int, at: dt.datetime, currency: str = "GBP", writer: int = 100) -> PayPolicyVersion:
        return PayPolicyVersion(
            version=version,
            effective_from=at,
            policy={"currency": currency, "base_pay": {"writer": writer}},
        )

    t1, t2 = T0 + dt.timedelta(days=1), T0 + dt.timedelta(days=2)
    line = pay_policies.PolicyTimeline([row(1, T0, writer=100), row(2, t1, writer=200), row(3, t2, writer=300)])
    assert line.at(T0 - dt.timedelta(days=9)).version == 1  # before any version: the first
    assert line.at(T0).version == 1
    assert line.at(t1 - dt.timedelta(microseconds=1)).version == 1
    assert line.at(t1).version == 2  # in force from its effective_from on
    assert line.at(t2 + dt.timedelta(days=30)).policy.base_pay.writer == 300
    assert line.at(None).version == 3
    replaced = pay_policies.PolicyTimeline([row(1, T0, "GBP"), row(2, t1, "USD", writer=250)])
    assert replaced.at(T0).version == 2 and replaced.currency == "USD"


def test_concurrent_changes_get_distinct_versions(client: TestClient, app: Any, make_user: MakeUser) -> None:
    rita = make_user("rita", "researcher")
    _round(client, rita)
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def change(writer: int) -> None:
        try:
            barrier.wait(timeout=10)
            with session_scope(app.state.sessionmaker) as session:
                task = tasks.get_task(session, TASK)
                pay_policies.set_pay_policy(session, None, task, {**V1, "base_pay": {"writer": writer}}, note="race")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=change, args=(amount,)) for amount in (201, 202, 203)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    with session_scope(app.state.sessionmaker) as session:
        rows = session.execute(select(PayPolicyVersion.version, PayPolicyVersion.policy)).all()
    assert sorted(version for version, _ in rows) == [1, 2, 3, 4]
    assert sorted(policy["base_pay"]["writer"] for version, policy in rows if version > 1) == [201, 202, 203]


def test_parse_policy_refuses_what_is_not_a_mapping() -> None:
    for value in (None, [V1], "GBP", 150):
        with pytest.raises(Invalid):
            pay_policies.parse_policy(value)


# --- effective hourly pay -----------------------------------------------------------------------


def test_hourly_pay_per_worker_and_the_below_minimum_warning(client: TestClient, app: Any, make_user: MakeUser) -> None:
    """Planted sessions with known lengths and a computed ledger: each worker's earnings per
    hour of active time, in pence per hour, against Prolific's GBP 6.00 minimum and the policy's
    own floor (GBP 7.00) for the MTurk worker, for whom no minimum is published."""
    rita = make_user("rita", "researcher")
    round_ = _round(client, rita, pay={**V1, "min_hourly_minor": 700})
    for name in ("wanda", "wes", "mo"):
        make_user(name, "writer")
    prolific = _link(app, round_["id"], "writers", StudyRole.writer, Platform.prolific)
    second = _link(app, round_["id"], "writers-2", StudyRole.writer, Platform.prolific)
    mturk = _link(app, round_["id"], "mturk-writers", StudyRole.writer, Platform.mturk)
    minutes = dt.timedelta(minutes=1)
    # wanda: 150 for 20 minutes -> 450/h, below 600.  wes: 150 for 10 minutes + a stopped session
    # of 5 minutes (no pay) -> 150 per 15 minutes = 600/h, at the minimum, not below.
    # mo (MTurk): 150 for 12 minutes 30 seconds -> 720/h, above the policy's 700 floor.
    _session(app, prolific, _user_id(app, "wanda"), StudySessionStatus.completed, T0, T0 + 20 * minutes)
    _session(app, prolific, _user_id(app, "wes"), StudySessionStatus.completed, T0, T0 + 10 * minutes)
    _session(app, second, _user_id(app, "wes"), StudySessionStatus.stopped, T0, T0 + 5 * minutes)
    _session(
        app, mturk, _user_id(app, "mo"), StudySessionStatus.completed, T0, T0 + 12 * minutes + dt.timedelta(seconds=30)
    )
    assert client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=rita.headers).status_code == 200
    report = client.get(f"{API}/tasks/{TASK}/crowd-report", headers=rita.headers)
    assert report.status_code == 200, report.text
    workers = {w["username"]: w for w in report.json()["workers"]}
    assert set(workers) == {"wanda", "wes", "mo"}
    wanda, wes, mo = workers["wanda"], workers["wes"], workers["mo"]
    assert (wanda["earned_minor"], wanda["active_seconds"], wanda["effective_hourly_minor"]) == (150, 1200, 450)
    assert wanda["platform_minimum_minor"] == 600 and wanda["below_minimum"] is True
    assert "below the platform's published minimum of 6.00/h" in wanda["warning"]
    assert "below the pay policy's floor of 7.00/h" in wanda["warning"]
    assert (wes["sessions"], wes["active_seconds"], wes["effective_hourly_minor"]) == (2, 900, 600)
    assert wes["below_minimum"] is True  # 600 meets Prolific's minimum but not the policy's 700 floor
    assert "platform" not in wes["warning"] and "floor of 7.00/h" in wes["warning"]
    assert (mo["platforms"], mo["effective_hourly_minor"], mo["platform_minimum_minor"]) == (["mturk"], 720, None)
    assert mo["below_minimum"] is False and mo["warning"] is None


def test_the_platform_minimums_are_in_one_place() -> None:
    assert pay_policies.platform_minimum_hourly(Platform.prolific, "GBP") == 600
    assert pay_policies.platform_minimum_hourly(Platform.prolific, "USD") == 800
    assert pay_policies.platform_minimum_hourly(Platform.prolific, "EUR") is None  # Prolific pays GBP and USD
    assert pay_policies.platform_minimum_hourly(Platform.mturk, "USD") is None  # none published
    assert pay_policies.platform_minimum_hourly(Platform.generic, "GBP") is None


# --- the command --------------------------------------------------------------------------------


def test_the_pay_policy_command_shows_and_sets_versions(
    client: TestClient, app: Any, make_user: MakeUser, settings: Any, tmp_path: Any
) -> None:
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    rita = make_user("rita", "researcher")
    _round(client, rita, pay=None)
    runner = CliRunner()
    url = ["--database-url", settings.database_url]

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["task", "pay-policy", TASK, *args, *url], catch_exceptions=False)

    shown = run()
    assert shown.exit_code == 0, shown.output
    assert "has no pay policy" in shown.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("pay:\n  currency: GBP\n  base_pay: {writer: 1.5}\n", encoding="utf-8")
    before = table_snapshot(app, *POLICY_TABLES)
    refused = run("--file", str(bad))
    assert refused.exit_code == 1 and "base_pay.writer" in refused.stderr
    huge = tmp_path / "huge.yaml"
    huge.write_text("currency: GBP\n" + "#" * 70_000 + "\n", encoding="utf-8")
    assert run("--file", str(huge)).exit_code == 1
    assert run("--file", str(tmp_path / "missing.yaml")).exit_code == 1
    assert table_snapshot(app, *POLICY_TABLES) == before
    good = tmp_path / "policy.yaml"
    good.write_text("pay:\n  currency: GBP\n  base_pay: {writer: 180, validator: 110}\n", encoding="utf-8")
    set_ = run("--file", str(good), "--note", "first policy")
    assert set_.exit_code == 0, set_.output
    assert "pay policy version 1 is in force" in set_.stdout and "first policy" in set_.stdout
    with session_scope(app.state.sessionmaker) as session:
        policy = ledger.pay_policy(tasks.get_task(session, TASK))
    assert policy is not None and (policy.base_pay.writer, policy.base_pay.validator) == (180, 110)
