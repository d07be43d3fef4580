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
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from services.db.engine import session_scope
from services.db.models import PlatformAccount, StudySession, User
from tests.conftest import Actor, MakeUser, example_yaml, open_round, table_counts
from tests.test_concurrency import fire

API = "/api/v1"
TASK = "dynasent-r2"
PROMPTS = [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(10)]
PROLIFIC = {"PROLIFIC_PID": "5f1a2b3c4d5e6f7a8b9c0d1e", "STUDY_ID": "60aa11bb22cc", "SESSION_ID": "sess-0001"}
MTURK = {
    "workerId": "A1B2C3D4E5F6G7",
    "assignmentId": "3ABCDEFGHIJKLMNOP",
    "hitId": "3HITHITHIT0001",
    "turkSubmitTo": "https://workersandbox.mturk.com",
}


@pytest.fixture
def round_(client: Any, researcher: Actor, stub_model: Any) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None), stub_model.url, PROMPTS)


def make_link(client: Any, researcher: Actor, round_id: int, **body: Any) -> dict[str, Any]:
    payload = {"name": "pilot", "round_id": round_id, "role": "writer", "platform": "prolific", "quota": 2, **body}
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
    response = open_link(client, full, {**PROLIFIC, "PROLIFIC_PID": "another-worker"})
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


def test_bad_link_bodies_are_refused(client: Any, app: Any, researcher: Actor, round_: dict[str, Any]) -> None:
    before = table_counts(app)
    base = {"name": "pilot", "round_id": round_["id"], "role": "writer", "platform": "prolific", "quota": 2}
    for changes in (
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
    bob = open_link(client, link, {**PROLIFIC, "PROLIFIC_PID": "bob-0000000001"}).json()
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
    hijack = open_link(client, link, {**PROLIFIC, "SESSION_ID": "sess-0002"})
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
    me = client.get(f"{API}/me", headers=bearer(body["token"])).json()
    assert me["roles"] == ["writer"] and me["username"].startswith("prolific-")
    assert PROLIFIC["PROLIFIC_PID"] not in me["username"]
    with session_scope(app.state.sessionmaker) as session:
        accounts = list(session.scalars(select(PlatformAccount)))
        assert len(accounts) == 1 and PROLIFIC["PROLIFIC_PID"] not in accounts[0].id_hash
        study = session.scalars(select(StudySession)).one()
        assert study.platform_worker_id == PROLIFIC["PROLIFIC_PID"]  # kept for paying
        assert study.platform_session_id == PROLIFIC["SESSION_ID"]  # the submission that started it
    # A validator link of the same task: the same worker, with the validator role added.
    validators = make_link(client, researcher, round_["id"], role="validator")
    response = open_link(client, validators, PROLIFIC)
    assert response.status_code == 201
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
    # A second link of the task: the worker arrives unqualified.
    other = make_link(client, researcher, round_["id"], name="main", screened_out_code="NOPE42")
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
    again = {**MTURK, "assignmentId": "3NEWASSIGNMENT", "turkSubmitTo": "https://attacker.example/"}
    assert open_link(client, link, again).status_code == 422
    other = open_link(client, link, {**again, "turkSubmitTo": "https://www.mturk.com"})
    assert other.status_code == 409 and "assignmentId differs" in other.json()["error"]["message"]
    assert table_counts(app) == before
    resumed = open_link(client, link, {**MTURK, "turkSubmitTo": "https://www.mturk.com"})
    assert resumed.status_code == 200 and resumed.json()["session"]["id"] == started["session"]["id"]
    done = client.post(
        f"{API}/study-sessions/{started['session']['id']}/finish", json={"reason": "stop"}, headers=token
    )
    assert done.status_code == 200, done.text
    assert done.json() == {
        "status": "stopped",
        "code": "TURKDONE",
        "redirect_url": None,
        "form": {
            "action": "https://www.mturk.com/mturk/externalSubmit",
            "fields": {"assignmentId": MTURK["assignmentId"], "completion_code": "TURKDONE"},
        },
        "message": done.json()["message"],
    }
    # A generic link answers the code alone.
    generic = make_link(client, researcher, round_["id"], platform="generic", id_parameter="worker")
    started = open_link(client, generic, {"worker": "demo-1"}).json()
    done = client.post(
        f"{API}/study-sessions/{started['session']['id']}/finish",
        json={"reason": "stop"},
        headers=bearer(started["token"]),
    ).json()
    assert done["code"] == generic["completion_code"] and done["redirect_url"] is None and done["form"] is None


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
    assert run("close", "987654").exit_code == 1
    assert table_counts(app) == before


def test_opening_links_is_limited_per_address_and_a_refusal_writes_nothing(
    settings: Any, researcher: Actor, stub_model: Any, reset_stubs: Any
) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app

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


def test_a_validator_session_counts_whole_batches(
    client: Any, app: Any, researcher: Actor, make_user: MakeUser, stub_model: Any
) -> None:
    yaml_text = example_yaml(TASK, onboarding_quiz=None, validation_batch_size=3)
    round_ = open_round(client, researcher, yaml_text, stub_model.url, PROMPTS)
    writers = [make_user(f"writer{i}", "writer") for i in range(3)]
    texts = ["A plain remark about the lunch menu today.", "We went there on a Sunday afternoon with friends."]
    for writer in writers:
        for text in texts:
            _write_example(client, writer.headers, round_["id"], f"{text} ({writer.username})")
    link = make_link(
        client, researcher, round_["id"], role="validator", platform="generic", id_parameter="worker", quota=1
    )
    started = open_link(client, link, {"worker": "val-1"}).json()
    token = bearer(started["token"])
    batch_size = 3
    labelled = 0
    while labelled < batch_size:
        batch = client.get(f"{API}/rounds/{round_['id']}/validation-batch", headers=token).json()
        examples = batch["data"]
        assert examples, batch
        for example in examples:
            if labelled == batch_size:
                break
            response = client.post(
                f"{API}/validation-items/{example['item_id']}/validations", json={"label": "neutral"}, headers=token
            )
            assert response.status_code == 201, response.text
            labelled += 1
            row = client.get(f"{API}/me/study-sessions", headers=token).json()["data"][0]
            assert row["units_done"] == (1 if labelled == batch_size else 0)
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
