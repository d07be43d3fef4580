"""A task's researchers: who owns it and who else manages it (services/authorization.py
decides from them who may manage the task)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from dynaloop.api.deps import SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.members import MemberPublic, MembersPublic, MemberUpdate
from services.authorization import TaskPolicy, authorize
from services.db.models import User
from services.domain import members, tasks

router = APIRouter(tags=["members"], route_class=OneHopRoute)
Username = Annotated[str, Path(min_length=1, max_length=64, description="A researcher's username.")]


@router.get("/tasks/{task_name}/members", response_model=MembersPublic)
def list_members(
    task_name: str, session: SessionDep, researcher: Annotated[User, allowed(TaskPolicy.manage)]
) -> MembersPublic:
    """The task's owners, then its members."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    rows = [MemberPublic.of(member, task.name) for member in members.list_members(session, task)]
    return MembersPublic(data=rows, count=len(rows))


@router.put(
    "/tasks/{task_name}/members/{username}",
    response_model=MemberPublic,
    responses={201: {"model": MemberPublic, "description": "The researcher was added to the task."}},
)
def set_member(
    task_name: str,
    username: Username,
    body: MemberUpdate,
    response: Response,
    session: SessionDep,
    owner: Annotated[User, allowed(TaskPolicy.manage_members)],
) -> MemberPublic:
    """Add a researcher to the task as owner or member (201), or change their role (200).
    Owners only; the task's last owner cannot become a member (409)."""
    task = tasks.get_task(session, task_name)
    authorize(owner, TaskPolicy.manage_members(task))
    member, created = members.set_member(session, owner, task, username, body.role)
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return MemberPublic.of(member, task.name)


@router.delete("/tasks/{task_name}/members/{username}", response_model=MemberPublic)
def remove_member(
    task_name: str,
    username: Username,
    session: SessionDep,
    owner: Annotated[User, allowed(TaskPolicy.manage_members)],
) -> MemberPublic:
    """Take a researcher off the task; answers what they were. Owners only; never the last owner (409)."""
    task = tasks.get_task(session, task_name)
    authorize(owner, TaskPolicy.manage_members(task))
    return MemberPublic.of(members.remove_member(session, owner, task, username), task.name)
