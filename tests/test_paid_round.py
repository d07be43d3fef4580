"""A simulated paid round (issue 26, "Done when" item 2): the acceptance test of worker
identity, scope, validation integrity, control items, duplicates, completion codes and the
ledger together, through the real API over real HTTP, on SQLite and PostgreSQL.

A task with a pay policy (base pay, a writer bonus, a validator bonus) and control items; a
Prolific writer link and two Prolific validator links of one round, each with ``max_workers``.
20 genuine workers, each from their own client address: 10 writers write two examples each
(half fool the stub model), 10 validators label the items served in their batches (control
items right) until their quota of labels. 50 made-up Prolific ids from ONE address try
everything, before the genuine validators start: they open the links (at most the per-address
cap of them make accounts), label examples by id and items of another validator's batch, send a
genuine writer's sentence again, open the round's second validator link, label their own batches
wrongly, and stop early and ask for the completion code.

Asserted: the made-up ids never pass the caps; every refusal is a 4xx that says why and writes
nothing; no label of theirs counts, so no majority label is theirs and the writer bonuses are
exactly those the genuine labels give; every ledger row is a genuine worker's; each genuine
session is paid its base pay once (computing the ledger again adds nothing); no session that did
not complete has the completion code."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from services.db.engine import session_scope
from services.db.models import Example, LedgerEntry, LedgerKind, Round, StudySession, StudySessionStatus, Validation
from services.domain import controls, ledger, study
from services.domain.tasks import definition_of
from tests.conftest import Actor, example_yaml, free_port, open_round, register_model_server, table_snapshot
from tests.stub_model_server import ThreadedServer

pytestmark = pytest.mark.both_databases  # money: a paid round end to end


API = "/api/v1"
TASK = "dynasent-r2"
WEB_APP_KEY = "web-app-key-of-the-simulated-paid-round"
ATTACKER_ADDRESS = "203.0.113.66"
PROMPTS = [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(5)]
PAY = {
    "currency": "GBP",
    "base_pay": {"writer": 150, "validator": 100},
    "writer_bonus_per_example": 10,
    "validator_bonus": {"per_batch": 20, "min_agreement": 0.6},
}
# Control items with one obvious label each (none of them "mixed", the attackers' answer).
CONTROLS = {
    "The food was absolutely delicious and the staff were wonderful to us.": "positive",
    "I loved every minute of our stay and cannot wait to come back.": "positive",
    "The waiter was rude to us and my soup arrived cold.": "negative",
    "Worst haircut I have ever had, and they still charged me double.": "negative",
    "The restaurant opens at nine in the morning on weekdays.": "neutral",
    "The parking lot is behind the building, next to the bank.": "neutral",
}
QUALITY = {
    # Controls as many as examples in each batch: an attacker meets one whatever they label first.
    "control_rate": 0.5,
    "gold_accuracy_threshold": 0.7,
    "min_control_answers": 2,
    "control_items": [{"text": text, "labels": [label]} for text, label in CONTROLS.items()],
}
# Three labels per example, two make a majority: small enough for a quick run.
AGREEMENT = {
    "gold_min_votes": 2,
    "dev_test_min_votes": 3,
    "unqualify_disagreement_rate": 0.8,
    "min_labels_for_quality": 10,
    "requeue_disagreements": 0,
}
PLACES = ["bakery", "diner", "bistro", "canteen", "noodle bar", "pizzeria", "taqueria", "brewery", "tea room", "deli"]


def writer_plan(n: int) -> list[tuple[str, str]]:
    """Writer n's two examples as (target label, text): the stub model calls any sentence with
    "great" positive, so the first fools it (a negative sentence); the second, plain, does not."""
    place = PLACES[n]
    return [
        ("negative", f"The host at the {place} did a great job of making me feel unwanted."),
        ("neutral", f"The {place} opens at noon and closes at ten on weekdays."),
    ]


# What a genuine validator answers for each text they are shown: the writer's target.
INTENDED = {text: target for n in range(10) for target, text in writer_plan(n)}


def prolific_params(n: int) -> dict[str, str]:
    """The n-th worker's Prolific parameters (ids of Prolific's form: 24 lowercase hex)."""
    return {"PROLIFIC_PID": f"5f{n:022x}", "STUDY_ID": "60aa11bb22cc33dd44ee55ff", "SESSION_ID": f"6a{n:022x}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def paid_server(settings: Any, stub_model: ThreadedServer, reset_stubs: None) -> Iterator[tuple[Any, str]]:
    """The API over real HTTP, trusting the web app's key, so that each request names the client
    address it counts against (``X-Dynaloop-Client-Address``, dynaloop/api/ratelimit.py), as the web app
    does for each browser."""
    from dynaloop.api.app import create_app

    paid_app = create_app(settings.model_copy(update={"web_app_key": WEB_APP_KEY}))
    server = ThreadedServer(paid_app, free_port()).start()
    try:
        yield paid_app, server.url
    finally:
        server.stop()
        paid_app.state.model_client.close()
        paid_app.state.engine.dispose()


class Crowd:
    """The crowd's side of the API: each call from a named client address."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    @staticmethod
    def address(address: str) -> dict[str, str]:
        return {"X-Dynaloop-Client-Address": address, "X-Dynaloop-Web-App-Key": WEB_APP_KEY}

    def arrive(self, link: dict[str, Any], n: int, address: str) -> httpx.Response:
        return self.http.post(
            f"{API}/study/{link['slug']}/sessions", json={"params": prolific_params(n)}, headers=self.address(address)
        )

    def call(self, method: str, path: str, token: str, address: str, **kwargs: Any) -> httpx.Response:
        return self.http.request(method, f"{API}{path}", headers={**bearer(token), **self.address(address)}, **kwargs)

    def write(self, token: str, address: str, round_id: int, target: str, text: str) -> dict[str, Any]:
        """One example through the writer's API: assignment, attempt, confirmation when it fooled
        the model, submission."""
        assignment = self.call("POST", f"/rounds/{round_id}/assignments", token, address, json={"target_label": target})
        assert assignment.status_code in (200, 201), assignment.text
        assignment_id = assignment.json()["id"]
        attempt = self.call("POST", f"/assignments/{assignment_id}/attempts", token, address, json={"text": text})
        assert attempt.status_code == 201, attempt.text
        scored = attempt.json()
        if scored["fooled"]:
            confirmed = self.call(
                "POST", f"/attempts/{scored['id']}/confirmation", token, address, json={"agrees": True}
            )
            assert confirmed.status_code == 200, confirmed.text
        example = self.call(
            "POST", f"/assignments/{assignment_id}/example", token, address, json={"attempt_id": scored["id"]}
        )
        assert example.status_code == 201, example.text
        return {**example.json(), "fooled": scored["fooled"]}

    def my_session(self, token: str, address: str) -> dict[str, Any]:
        response = self.call("GET", "/me/study-sessions", token, address)
        assert response.status_code == 200, response.text
        (row,) = response.json()["data"]
        return dict(row)


def assert_refused(response: httpx.Response, status: int, *, says: str) -> None:
    assert response.status_code == status, response.text
    assert says in response.json()["error"]["message"], response.text


TABLES = (
    "users",
    "api_tokens",
    "platform_accounts",
    "study_sessions",
    "assignments",
    "attempts",
    "examples",
    "example_texts",
    "validations",
    "validation_batches",
    "validation_batch_items",
    "validation_claims",
)


def test_a_simulated_paid_round_holds_against_fifty_made_up_ids_from_one_address(
    paid_server: tuple[Any, str], researcher: Actor, stub_model: ThreadedServer
) -> None:
    paid_app, url = paid_server
    cap = paid_app.state.settings.study_new_workers_per_address_per_hour
    assert cap >= 3, "the scenario needs an attacking writer, a stopping validator and a labelling one"
    server = register_model_server(paid_app, stub_model.url)
    yaml_text = example_yaml(
        TASK,
        onboarding_quiz=None,
        pay=PAY,
        quality=QUALITY,
        agreement=AGREEMENT,
        validations_per_example=3,
        validation_batch_size=3,
    )
    with httpx.Client(base_url=url, timeout=60) as http:
        crowd = Crowd(http)
        round_ = open_round(http, researcher, yaml_text, server, PROMPTS, target_label_mode="writer_choice")
        round_id = round_["id"]

        def link(**body: Any) -> dict[str, Any]:
            payload = {"round_id": round_id, "platform": "prolific", **body}
            response = http.post(f"{API}/tasks/{TASK}/study-links", json=payload, headers=researcher.headers)
            assert response.status_code == 201, response.text
            return dict(response.json())

        writers = link(name="writers", role="writer", quota=2, max_workers=20, completion_code="WRITEDONE")
        validators = link(name="validators", role="validator", quota=3, max_workers=20, completion_code="VALIDDONE")
        second = link(name="validators B", role="validator", quota=3, max_workers=20, completion_code="VALIDDONE2")

        # --- 10 genuine writers, each from their own address, write two examples each ----------
        genuine_writers: dict[int, tuple[str, str]] = {}  # session id -> (token, address)
        examples: dict[int, dict[str, Any]] = {}
        for n in range(10):
            address = f"198.51.100.{n + 1}"
            started = crowd.arrive(writers, n, address)
            assert started.status_code == 201, started.text
            token = started.json()["token"]
            for target, text in writer_plan(n):
                example = crowd.write(token, address, round_id, target, text)
                examples[example["id"]] = {**example, "target": target}
            row = crowd.my_session(token, address)
            assert row["status"] == "completed" and row["completion"]["code"] == "WRITEDONE", row
            genuine_writers[started.json()["session"]["id"]] = (token, address)
        assert sum(e["fooled"] for e in examples.values()) == 10

        # --- 50 made-up ids from one address open the links -------------------------------------
        # The first cap-1 on the validator link, the next on the writer link, then both in turn.
        plan = [validators] * (cap - 1) + [writers] + [writers if n % 2 else validators for n in range(50 - cap)]
        attackers: list[tuple[dict[str, Any], int, httpx.Response]] = []
        for i, target_link in enumerate(plan):
            attackers.append((target_link, 1000 + i, crowd.arrive(target_link, 1000 + i, ATTACKER_ADDRESS)))
        assert [r.status_code for _, _, r in attackers] == [201] * cap + [429] * (50 - cap)
        for _, _, refused in attackers[cap:]:
            assert refused.json()["error"]["code"] == "too_many_new_workers"
        attacker_validators = [(n, r.json()) for lk, n, r in attackers[:cap] if lk is validators]
        ((_, attacker_writer),) = [(n, r.json()) for lk, n, r in attackers[:cap] if lk is writers]
        with session_scope(paid_app.state.sessionmaker) as session:
            attacker_users = set(
                session.scalars(
                    select(StudySession.user_id).where(
                        StudySession.id.in_(
                            [body["session"]["id"] for _, _, r in attackers[:cap] for body in [r.json()]]
                        )
                    )
                )
            )
        assert len(attacker_users) == cap

        # The attacking writer sends a genuine writer's sentences again, exactly and varied: each
        # is refused before the model is asked, and nothing is written.
        token, address = attacker_writer["token"], ATTACKER_ADDRESS
        assignment = crowd.call(
            "POST", f"/rounds/{round_id}/assignments", token, address, json={"target_label": "negative"}
        )
        assert assignment.status_code in (200, 201), assignment.text
        before = table_snapshot(paid_app, *TABLES)
        for text in (writer_plan(0)[0][1], writer_plan(3)[0][1].upper().replace(".", "!!"), writer_plan(5)[1][1]):
            response = crowd.call(
                "POST", f"/assignments/{assignment.json()['id']}/attempts", token, address, json={"text": text}
            )
            assert response.status_code == 409 and response.json()["error"]["code"] == "duplicate_text", response.text
            assert "already in round" in response.json()["error"]["message"]
        # It asks for the completion code at 0 of 2: refused; it stops: no code.
        session_id = attacker_writer["session"]["id"]
        early = crowd.call("POST", f"/study-sessions/{session_id}/finish", token, address, json={"reason": "quota"})
        assert_refused(early, 409, says="0 of 2")
        assert table_snapshot(paid_app, *TABLES) == before
        stopped = crowd.call("POST", f"/study-sessions/{session_id}/finish", token, address, json={"reason": "stop"})
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["status"] == "stopped" and stopped.json()["code"] is None
        assert "WRITEDONE" not in stopped.text and stopped.json()["redirect_url"] is None

        # The attacking validators: a second validator link of the same round, then labels by
        # example id (none of them served to them), then their own batches labelled wrongly.
        for n, body in attacker_validators:
            before = table_snapshot(paid_app, *TABLES)
            again = crowd.arrive(second, n, ATTACKER_ADDRESS)
            assert again.status_code == 409 and again.json()["error"]["code"] == "study_session_taken", again.text
            assert "token" not in again.json()
            for example_id in examples:
                response = crowd.call(
                    "POST",
                    f"/examples/{example_id}/validations",
                    body["token"],
                    ATTACKER_ADDRESS,
                    json={"label": "mixed"},
                )
                assert_refused(response, 409, says="/validation-items/{item_id}/validations")
            assert table_snapshot(paid_app, *TABLES) == before
        *labellers, (_, quitter) = attacker_validators
        # One stops at once and asks for the completion code: none.
        for reason, status in (("quota", 409), ("out_of_work", 409), ("stop", 200)):
            response = crowd.call(
                "POST",
                f"/study-sessions/{quitter['session']['id']}/finish",
                quitter["token"],
                ATTACKER_ADDRESS,
                json={"reason": reason},
            )
            assert response.status_code == status, response.text
        assert response.json()["status"] == "stopped" and response.json()["code"] is None
        # The others label every item served to them "mixed" (control items included): after
        # min_control_answers wrong control answers they are out and their labels stop counting.
        for _, body in labellers:
            token, answers = body["token"], []
            for _ in range(10):
                batch = crowd.call("GET", f"/rounds/{round_id}/validation-batch", token, ATTACKER_ADDRESS)
                if batch.status_code == 403:  # out: no more batches for them
                    assert "unqualified" in batch.json()["error"]["message"] or batch.json()["error"]["message"]
                    break
                assert batch.status_code == 200, batch.text
                items = batch.json()["data"]
                assert items, "an attacker ran out of work before the control items caught them"
                # The examples of the batch first, then its control items: the attacker's labels
                # reach examples before the control items catch them (in the batch's own order,
                # shuffled unseeded, they could be caught before labelling any example, and there
                # would be nothing to check below).
                for item in sorted(items, key=lambda item: item["text"] in CONTROLS):
                    answer = crowd.call(
                        "POST",
                        f"/validation-items/{item['item_id']}/validations",
                        token,
                        ATTACKER_ADDRESS,
                        json={"label": "mixed"},
                    )
                    answers.append(answer.status_code)
                    assert answer.status_code in (201, 403), answer.text
            else:
                pytest.fail(f"an attacker labelling everything wrongly was never stopped: {answers}")
            assert 201 in answers, answers

        # --- 10 genuine validators label what they are served, each from their own address -----
        genuine_validators: dict[int, tuple[str, str]] = {}
        stolen_item: str | None = None
        for n in range(100, 110):
            address = f"192.0.2.{n}"
            started = crowd.arrive(validators, n, address)
            assert started.status_code == 201, started.text
            token = started.json()["token"]
            genuine_validators[started.json()["session"]["id"]] = (token, address)
            while crowd.my_session(token, address)["status"] == "active":
                batch = crowd.call("GET", f"/rounds/{round_id}/validation-batch", token, address)
                assert batch.status_code == 200, batch.text
                items = batch.json()["data"]
                assert items, "the round ran out of work before the genuine validators met their quota"
                if stolen_item is None:
                    # An attacker labels an item of this validator's batch: as a missing one.
                    stolen_item = items[0]["item_id"]
                    before = table_snapshot(paid_app, *TABLES)
                    for _, body in attacker_validators:
                        response = crowd.call(
                            "POST",
                            f"/validation-items/{stolen_item}/validations",
                            body["token"],
                            ATTACKER_ADDRESS,
                            json={"label": "mixed"},
                        )
                        assert response.status_code in (403, 404), response.text
                    assert table_snapshot(paid_app, *TABLES) == before
                # Control items first (the test knows them; the validator does not), then
                # examples, stopping once the session is complete.
                for item in sorted(items, key=lambda item: item["text"] not in CONTROLS):
                    label = CONTROLS.get(item["text"]) or INTENDED[item["text"]]
                    answer = crowd.call(
                        "POST",
                        f"/validation-items/{item['item_id']}/validations",
                        token,
                        address,
                        json={"label": label},
                    )
                    assert answer.status_code == 201, answer.text
                    if item["text"] not in CONTROLS and crowd.my_session(token, address)["status"] != "active":
                        break
            row = crowd.my_session(token, address)
            assert row["status"] == "completed" and row["completion"]["code"] == "VALIDDONE", row
            assert row["units_done"] == 3

        # --- the ledger, computed twice --------------------------------------------------------
        first = http.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=researcher.headers)
        assert first.status_code == 200, first.text
        again = http.post(f"{API}/tasks/{TASK}/ledger/compute", json={}, headers=researcher.headers)
        assert again.status_code == 200, again.text
        assert again.json()["entries_added"] == 0 and again.json()["amount_added_minor"] == 0
        assert again.json()["already_paid"] == first.json()["entries_added"]

    with session_scope(paid_app.state.sessionmaker) as session:
        sessions = {row.id: row for row in session.scalars(select(StudySession))}
        genuine_sessions = set(genuine_writers) | set(genuine_validators)
        genuine_users = {sessions[i].user_id for i in genuine_sessions}
        assert len(sessions) == 20 + cap and len(genuine_users) == 20
        # No label of a made-up id counts, and each counted label is a genuine validator's.
        counted = list(session.scalars(select(Validation).where(Validation.counted.is_(True))))
        assert counted and {v.validator_id for v in counted} <= genuine_users - {
            sessions[i].user_id for i in genuine_writers
        }
        attacker_labels = list(session.scalars(select(Validation).where(Validation.validator_id.in_(attacker_users))))
        assert attacker_labels and not any(v.counted for v in attacker_labels)
        # So no majority label is theirs: each is the writer's target or there is none yet.
        round_row = session.get(Round, round_id)
        assert round_row is not None
        majority = ledger.round_gold_labels(session, definition_of(round_row.task), round_row)
        targets = {e.id: e.target_label for e in session.scalars(select(Example))}
        assert all(label is None or label == targets[example_id] for example_id, label in majority.items())
        fooled = {e.id for e in session.scalars(select(Example).where(Example.fooled.is_(True)))}
        # The ledger: only genuine workers; base pay once per completed genuine session; writer
        # bonuses exactly for the fooling examples whose (genuine) majority is the target.
        entries = list(session.scalars(select(LedgerEntry)))
        assert {e.user_id for e in entries} <= genuine_users, [
            (e.user_id, e.kind, e.event_key, e.amount_minor, e.session_id and sessions[e.session_id].status)
            for e in entries
            if e.user_id not in genuine_users
        ]
        base = [e for e in entries if e.kind is LedgerKind.base_pay]
        assert sorted(e.session_id or 0 for e in base) == sorted(genuine_sessions)
        assert Counter(e.amount_minor for e in base) == {150: 10, 100: 10}
        bonuses = {int(e.event_key.split(":")[1]) for e in entries if e.kind is LedgerKind.writer_bonus}
        expected = {i for i in fooled if majority.get(i) == targets[i]}
        assert bonuses == expected and bonuses, (bonuses, expected)
        validator_bonus = [e for e in entries if e.kind is LedgerKind.validator_bonus]
        assert {e.user_id for e in validator_bonus} <= {sessions[i].user_id for i in genuine_validators}
        # No session that did not complete has the completion code (nor any code here: the
        # links define no partial code). A made-up validator whose wrong labels met the quota
        # before enough control answers were in to judge them did get the completion code: the
        # ledger pays them nothing (above), and their failed control items are the platform's
        # ground to reject the submission.
        failed = controls.failed_gold(session, round_row.task, list(attacker_users))
        for study_session in sessions.values():
            completion = study.completion_of(study_session)
            if study_session.id in genuine_sessions:
                assert study_session.status is StudySessionStatus.completed
            elif study_session.status is StudySessionStatus.completed:
                assert study_session.user_id in failed, "a made-up id completed a session and passed the control items"
            else:
                assert completion is None or completion["code"] is None, completion
