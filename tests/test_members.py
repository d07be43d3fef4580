"""A task's researchers: the creator owns the task, owners add and remove owners and members,
a task never loses its last owner, every change is audit-logged; the same from the command
line; and the members come with the tasks (no query per task)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, text
from typer.testing import CliRunner

from services.db.engine import session_scope
from services.db.models import AuditEntry, TaskMember, TaskRole
from services.domain import tasks
from services.errors import Conflict
from tests.conftest import Actor, MakeUser, example_yaml, table_snapshot

API = "/api/v1"
TASK = "dynasent-r2"
MEMBERS = f"{API}/tasks/{TASK}/members"


def _create(client: Any, actor: Actor, name: str = TASK, **overrides: Any) -> dict[str, Any]:
    response = client.post(
        f"{API}/tasks",
        content=example_yaml(name, **overrides).encode(),
        headers={**actor.headers, "Content-Type": "application/yaml"},
    )
    assert response.status_code == 201, response.text
    return response.json()


def _members(client: Any, actor: Actor) -> list[tuple[str, str]]:
    response = client.get(MEMBERS, headers=actor.headers)
    assert response.status_code == 200, response.text
    return [(m["username"], m["role"]) for m in response.json()["data"]]


def _audit(app: Any) -> list[tuple[str, dict[str, Any]]]:
    with session_scope(app.state.sessionmaker) as session:
        entries = session.scalars(
            select(AuditEntry).where(AuditEntry.action.like("task.member.%")).order_by(AuditEntry.id)
        )
        return [(e.action, {k: v for k, v in e.details.items() if k != "task"}) for e in entries]


def test_the_creator_owns_the_task_and_owners_decide_who_else_is_on_it(
    client: Any, app: Any, researcher: Actor, make_user: MakeUser
) -> None:
    _create(client, researcher)
    mia = make_user("mia", "researcher")
    make_user("pat", "researcher")
    assert _members(client, researcher) == [("rita", "owner")]
    response = client.put(f"{MEMBERS}/mia", json={"role": "member"}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    assert response.json()["role"] == "member" and response.json()["task"] == TASK
    # The same again changes nothing (200, no audit entry).
    assert client.put(f"{MEMBERS}/mia", json={"role": "member"}, headers=researcher.headers).status_code == 200
    # A member manages the task and sees who is on it, but does not change who is.
    assert _members(client, mia) == [("rita", "owner"), ("mia", "member")]
    refused = client.put(f"{MEMBERS}/pat", json={"role": "owner"}, headers=mia.headers)
    assert refused.status_code == 403, refused.text
    assert "only the owners of task 'dynasent-r2'" in refused.json()["error"]["message"]
    assert client.delete(f"{MEMBERS}/rita", headers=mia.headers).status_code == 403
    # Rita makes Mia an owner; now Mia adds Pat and Rita can leave.
    assert client.put(f"{MEMBERS}/mia", json={"role": "owner"}, headers=researcher.headers).status_code == 200
    assert client.put(f"{MEMBERS}/pat", json={"role": "member"}, headers=mia.headers).status_code == 201
    removed = client.delete(f"{MEMBERS}/rita", headers=mia.headers)
    assert removed.status_code == 200 and removed.json()["username"] == "rita", removed.text
    assert _members(client, mia) == [("mia", "owner"), ("pat", "member")]
    # Rita is off the task: it is gone for her, in the words of a missing task.
    response = client.get(f"{API}/tasks/{TASK}/jobs", headers=researcher.headers)
    assert response.status_code == 404
    assert response.json()["error"]["message"] == f"no task {TASK!r}; list tasks with GET /api/v1/tasks"
    assert _audit(app) == [
        ("task.member.add", {"username": "rita", "role": "owner"}),
        ("task.member.add", {"username": "mia", "role": "member"}),
        ("task.member.role", {"username": "mia", "role": "owner", "previous_role": "member"}),
        ("task.member.add", {"username": "pat", "role": "member"}),
        ("task.member.remove", {"username": "rita", "role": "owner"}),
    ]


def test_a_task_keeps_its_last_owner(client: Any, app: Any, researcher: Actor, make_user: MakeUser) -> None:
    _create(client, researcher)
    make_user("mia", "researcher")
    assert client.put(f"{MEMBERS}/mia", json={"role": "member"}, headers=researcher.headers).status_code == 201
    before = table_snapshot(app, "task_members", "audit_log")
    for method, url, body in [
        ("DELETE", f"{MEMBERS}/rita", None),
        ("PUT", f"{MEMBERS}/rita", {"role": "member"}),
    ]:
        response = client.request(method, url, json=body, headers=researcher.headers)
        assert response.status_code == 409, response.text
        assert response.json()["error"]["message"] == (
            "'rita' is the only owner of task 'dynasent-r2'; make another researcher an owner first "
            "(role: owner), then change this one"
        )
    assert table_snapshot(app, "task_members", "audit_log") == before


def test_only_an_active_researcher_can_be_put_on_a_task(
    client: Any, app: Any, researcher: Actor, make_user: MakeUser
) -> None:
    """A missing account and a writer's get the same 422: adding people is no username oracle."""
    _create(client, researcher)
    make_user("walt", "writer")
    before = table_snapshot(app, "task_members", "audit_log")
    for username in ("walt", "nobody-here"):
        response = client.put(f"{MEMBERS}/{username}", json={"role": "member"}, headers=researcher.headers)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["message"] == (
            f"{username!r} is not an active researcher account; add a user who holds the researcher role "
            "(an admin gives roles: POST /api/v1/users)"
        )
    for body in ({"role": "boss"}, {}, {"role": "member", "extra": 1}, ["member"]):
        response = client.put(f"{MEMBERS}/rita", json=body, headers=researcher.headers)
        assert response.status_code == 422 and set(response.json()) == {"error"}, (body, response.text)
    response = client.put(f"{MEMBERS}/{'x' * 65}", json={"role": "member"}, headers=researcher.headers)
    assert response.status_code == 422, response.text
    response = client.delete(f"{MEMBERS}/walt", headers=researcher.headers)
    assert response.status_code == 404 and "'walt' is not on task 'dynasent-r2'" in response.text
    assert table_snapshot(app, "task_members", "audit_log") == before


def test_an_admin_manages_every_task_and_its_researchers(client: Any, researcher: Actor, make_user: MakeUser) -> None:
    _create(client, researcher)
    ada, mia = make_user("ada", "admin"), make_user("mia", "researcher")
    assert client.put(f"{MEMBERS}/mia", json={"role": "owner"}, headers=ada.headers).status_code == 201
    assert client.delete(f"{MEMBERS}/rita", headers=ada.headers).status_code == 200
    assert _members(client, ada) == [("mia", "owner")]
    assert _members(client, mia) == [("mia", "owner")]
    assert client.post(f"{API}/tasks/{TASK}/rounds", json={}, headers=ada.headers).status_code == 201


def test_quiz_answers_only_for_the_tasks_researchers(client: Any, researcher: Actor, make_user: MakeUser) -> None:
    _create(client, researcher)  # DynaSent's task has a quiz
    mia = make_user("mia", "researcher")
    assert client.put(f"{MEMBERS}/mia", json={"role": "member"}, headers=researcher.headers).status_code == 201
    hank = make_user("hank", "researcher", "writer")  # sees the task as a writer, is not on it
    for actor, answers in [
        (researcher, True),
        (mia, True),
        (make_user("ada", "admin"), True),
        (make_user("walt", "writer"), False),
        (make_user("cora", "client"), False),
        (hank, False),
    ]:
        for body in (
            client.get(f"{API}/tasks/{TASK}", headers=actor.headers).json(),
            client.get(f"{API}/tasks", headers=actor.headers).json()["data"][0],
        ):
            questions = body["definition"]["onboarding_quiz"]["questions"]
            assert questions and all(("answer" in q) is answers for q in questions), actor.username
    # Hank may look, not manage: a 403 that says who can add him.
    response = client.get(f"{API}/tasks/{TASK}/jobs", headers=hank.headers)
    assert response.status_code == 403 and "one of its owners can add you" in response.text


@pytest.mark.both_databases
def test_listing_tasks_asks_for_the_members_once_not_once_per_task(client: Any, app: Any, make_user: MakeUser) -> None:
    """``GET /tasks`` checks each task against its members: the number of queries does not grow
    with the number of tasks."""
    oscar, walt = make_user("oscar", "researcher"), make_user("walt", "writer")
    names = ["dynasent-r2", "isarcasm", "mad-tsc", "ethioemo-amharic", "besstie-en-in-sarcasm"]

    def queries_for_list(actor: Actor) -> int:
        statements: list[str] = []

        def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            statements.append(statement)

        event.listen(app.state.engine, "before_cursor_execute", count)
        try:
            assert client.get(f"{API}/tasks", headers=actor.headers).status_code == 200
        finally:
            event.remove(app.state.engine, "before_cursor_execute", count)
        return len(statements)

    _create(client, oscar, names[0])
    one = queries_for_list(walt), queries_for_list(oscar)
    for name in names[1:]:
        _create(client, oscar, name)
    assert (queries_for_list(walt), queries_for_list(oscar)) == one


# --- the command line ----------------------------------------------------------------------------


def _run(*args: str) -> Any:
    from dynaloop.cli import app as cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_cli_creates_a_task_with_its_owner_and_changes_its_members(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert _run("db", "upgrade", "--database-url", url).exit_code == 0
    for username, role in (("rita", "researcher"), ("mia", "researcher"), ("walt", "writer")):
        assert _run("user", "create", username, "--role", role, "--database-url", url).exit_code == 0
    refused = _run("task", "create", TASK, "--owner", "walt", "--database-url", url)
    assert refused.exit_code == 1 and "'walt' is not an active researcher account" in refused.output
    created = _run("task", "create", TASK, "--owner", "rita", "--database-url", url)
    assert created.exit_code == 0 and "owned by 'rita'" in created.output, created.output
    assert _run("task", "add-member", TASK, "mia", "--role", "owner", "--database-url", url).exit_code == 0
    assert _run("task", "remove-member", TASK, "rita", "--database-url", url).exit_code == 0
    last = _run("task", "remove-member", TASK, "mia", "--database-url", url)
    assert last.exit_code == 1 and "'mia' is the only owner" in last.output
    listed = _run("task", "members", TASK, "--database-url", url)
    assert listed.exit_code == 0 and "mia" in listed.output and "rita" not in listed.output
    bad_role = _run("task", "add-member", TASK, "rita", "--role", "boss", "--database-url", url)
    assert bad_role.exit_code == 2
    unowned = _run("task", "create", "isarcasm", "--database-url", url)
    assert unowned.exit_code == 0 and "has no owner: only admins manage it" in unowned.output
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT t.name, u.username, m.role FROM task_members m JOIN tasks t ON t.id = m.task_id "
                    "JOIN users u ON u.id = m.user_id ORDER BY m.id"
                )
            ).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in rows] == [(TASK, "mia", "owner")]


def test_domain_create_task_makes_the_actor_or_the_named_owner_the_owner(app: Any, make_user: MakeUser) -> None:
    make_user("rita", "researcher")
    with session_scope(app.state.sessionmaker) as session:
        from services.domain import users

        rita = users.get_user(session, "rita")
        task = tasks.create_task(session, rita, example_yaml(TASK, onboarding_quiz=None))
        other = tasks.create_task(session, None, example_yaml("isarcasm", onboarding_quiz=None), owner=rita)
        nobody = tasks.create_task(session, None, example_yaml("mad-tsc", onboarding_quiz=None))
        assert [(m.user_id, m.role) for m in task.members] == [(rita.id, TaskRole.owner)]
        assert [(m.user_id, m.role) for m in other.members] == [(rita.id, TaskRole.owner)]
        assert nobody.members == []
        assert session.scalar(select(TaskMember.added_by_id).where(TaskMember.task_id == other.id)) is None


@pytest.mark.both_databases
def test_one_row_per_researcher_and_task(app: Any, make_user: MakeUser) -> None:
    from sqlalchemy.exc import IntegrityError

    make_user("rita", "researcher")
    with session_scope(app.state.sessionmaker) as session:
        from services.domain import users

        rita = users.get_user(session, "rita")
        task = tasks.create_task(session, rita, example_yaml(TASK, onboarding_quiz=None))
        task_id, rita_id = task.id, rita.id
    with pytest.raises(IntegrityError), session_scope(app.state.sessionmaker) as session:
        session.add(TaskMember(task_id=task_id, user_id=rita_id, role=TaskRole.member))


@pytest.mark.both_databases
def test_two_owners_removing_each_other_at_once_leave_one_owner(app: Any, make_user: MakeUser) -> None:
    """The second removal waits for the first (the task's row lock on PostgreSQL, the write
    lock on SQLite) and then sees that it would remove the last owner."""
    import threading

    from services.domain import members, users

    make_user("rita", "researcher")
    make_user("mia", "researcher")
    factory = app.state.sessionmaker
    with session_scope(factory) as session:
        task = tasks.create_task(session, users.get_user(session, "rita"), example_yaml(TASK, onboarding_quiz=None))
        members.set_member(session, None, task, "mia", TaskRole.owner)
    first = factory()
    refused: list[str] = []

    def remove_rita() -> None:
        try:
            with session_scope(factory) as session:
                members.remove_member(session, None, tasks.get_task(session, TASK), "rita")
        except Conflict as exc:
            refused.append(exc.message)

    try:
        members.remove_member(first, None, tasks.get_task(first, TASK), "mia")
        other = threading.Thread(target=remove_rita)
        other.start()
        other.join(0.5)
        assert other.is_alive(), "the second removal did not wait for the first"
        first.commit()
    finally:
        first.close()
    other.join(30)
    assert refused and refused[0].startswith("'rita' is the only owner of task 'dynasent-r2'")
    with session_scope(factory) as session:
        assert [(m.user.username, m.role) for m in members.list_members(session, tasks.get_task(session, TASK))] == [
            ("rita", TaskRole.owner)
        ]
