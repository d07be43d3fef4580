"""A task's owners and members: the researchers who manage it (services/authorization.py decides
what each may do; this module only keeps the rows). Every change is audit-logged, and a task
never loses its last owner through here."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session, joinedload

from services.db.models import Role, Task, TaskMember, TaskRole, User
from services.domain import audit
from services.errors import Conflict, Invalid, NotFound


def list_members(session: Session, task: Task) -> list[TaskMember]:
    """The task's owners first, then its members, each in the order they were added."""
    return list(
        session.scalars(
            select(TaskMember)
            .options(joinedload(TaskMember.user))
            .where(TaskMember.task_id == task.id)
            .order_by(TaskMember.role != TaskRole.owner, TaskMember.id)
        )
    )


def researcher_account(session: Session, username: str) -> User:
    """The active researcher ``username``, the only kind of account that can be on a task.

    A missing account and one without the researcher role get the same answer, so this does
    not tell a researcher which usernames exist."""
    user = session.scalar(select(User).where(User.username == username))
    if user is None or not user.is_active or not user.has_role(Role.researcher):
        raise Invalid(
            f"{username!r} is not an active researcher account; add a user who holds the researcher role "
            "(an admin gives roles: POST /api/v1/users)"
        )
    return user


def add_creator(session: Session, actor: User | None, task: Task, owner: User) -> TaskMember:
    """Make ``owner`` the first owner of the task just created."""
    member = TaskMember(user_id=owner.id, role=TaskRole.owner, added_by_id=actor.id if actor else None)
    task.members.append(member)
    session.flush()
    audit.record(
        session, actor, "task.member.add", "task", task.id, task=task.name, username=owner.username, role="owner"
    )
    return member


def set_member(
    session: Session, actor: User | None, task: Task, username: str, role: TaskRole
) -> tuple[TaskMember, bool]:
    """Put ``username`` on the task with ``role``, or change their role. Returns the row and
    whether it is new. Demoting the last owner is refused (409)."""
    user = researcher_account(session, username)
    _lock_members(session, task)
    member = _find(session, task, user)
    if member is None:
        member = TaskMember(user_id=user.id, role=role, added_by_id=actor.id if actor else None)
        task.members.append(member)
        session.flush()
        audit.record(
            session, actor, "task.member.add", "task", task.id, task=task.name, username=username, role=role.value
        )
        return member, True
    if member.role is not role:
        if member.role is TaskRole.owner:
            _keep_an_owner(session, task, f"{username!r} is the only owner of task {task.name!r}")
        previous = member.role
        member.role = role
        session.flush()
        audit.record(
            session,
            actor,
            "task.member.role",
            "task",
            task.id,
            task=task.name,
            username=username,
            role=role.value,
            previous_role=previous.value,
        )
    return member, False


def remove_member(session: Session, actor: User | None, task: Task, username: str) -> TaskMember:
    """Take ``username`` off the task. Removing the last owner is refused (409)."""
    _lock_members(session, task)
    user = session.scalar(select(User).where(User.username == username))
    member = None if user is None else _find(session, task, user)
    if member is None:
        raise NotFound(
            f"{username!r} is not on task {task.name!r}; list its members with GET /api/v1/tasks/{task.name}/members"
        )
    if member.role is TaskRole.owner:
        _keep_an_owner(session, task, f"{username!r} is the only owner of task {task.name!r}")
    task.members.remove(member)  # delete-orphan: the row goes with it
    session.flush()
    audit.record(
        session, actor, "task.member.remove", "task", task.id, task=task.name, username=username, role=member.role.value
    )
    return member


def _find(session: Session, task: Task, user: User) -> TaskMember | None:
    return session.scalar(select(TaskMember).where(TaskMember.task_id == task.id, TaskMember.user_id == user.id))


def _lock_members(session: Session, task: Task) -> None:
    """Changes to one task's members take turns (PostgreSQL: the task's row lock; SQLite has one
    writer at a time anyway): two owners removing each other at once cannot leave none."""
    session.execute(select(Task.id).where(Task.id == task.id).with_for_update())
    session.refresh(task, ["members"])


def _keep_an_owner(session: Session, task: Task, who: str) -> None:
    owners = session.scalar(
        select(func.count())
        .select_from(TaskMember)
        .where(TaskMember.task_id == task.id, TaskMember.role == TaskRole.owner)
    )
    if (owners or 0) <= 1:
        raise Conflict(f"{who}; make another researcher an owner first (role: owner), then change this one")
