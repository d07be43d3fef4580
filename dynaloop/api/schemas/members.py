"""A task's researchers: its owners and members."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field

from services.db.models import TaskMember, TaskRole


class MemberUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: TaskRole = Field(description="owner: manages the task and decides who else does; member: manages the task")


class MemberPublic(BaseModel):
    task: str
    username: str
    display_name: str | None
    role: TaskRole
    added_at: dt.datetime

    @classmethod
    def of(cls, member: TaskMember, task_name: str) -> MemberPublic:
        return cls(
            task=task_name,
            username=member.user.username,
            display_name=member.user.display_name,
            role=member.role,
            added_at=member.created_at,
        )


class MembersPublic(BaseModel):
    data: list[MemberPublic]
    count: int
