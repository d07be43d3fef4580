"""A task's pay policy (docs/round_builder.md, "Pay and the ledger"): read it with its versions,
set a new version. A researcher on the task only; another group's task reads as missing."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from sqlalchemy import select

from dynaloop.api.deps import SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.pay_policy import PayPolicyPublic, PayPolicyRequest, PayPolicyVersionPublic
from services.authorization import TaskPolicy, authorize
from services.db.models import LedgerEntry, Task, User
from services.domain import pay_policies, tasks

router = APIRouter(tags=["pay policy"], route_class=OneHopRoute)
Manager = Annotated[User, allowed(TaskPolicy.manage)]


def _answer(session: SessionDep, task: Task) -> PayPolicyPublic:
    rows = pay_policies.versions(session, task)
    return PayPolicyPublic(
        task=task.name,
        current=PayPolicyVersionPublic.of(rows[-1]) if rows else None,
        versions=[PayPolicyVersionPublic.of(row) for row in rows],
        ledger_currency=session.scalar(select(LedgerEntry.currency).where(LedgerEntry.task_id == task.id).limit(1)),
    )


@router.get("/tasks/{task_name}/pay-policy", response_model=PayPolicyPublic)
def read(task_name: str, session: SessionDep, researcher: Manager) -> PayPolicyPublic:
    """The pay policy in force and every earlier version."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    return _answer(session, task)


@router.put("/tasks/{task_name}/pay-policy", response_model=PayPolicyPublic)
def change(task_name: str, body: PayPolicyRequest, session: SessionDep, researcher: Manager) -> PayPolicyPublic:
    """Set a new version of the pay policy: it pays the work done from now on; rows already in
    the ledger never change. The currency cannot change once the ledger has rows (422)."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    pay_policies.set_pay_policy(session, researcher, task, body.policy, note=body.note)
    return _answer(session, task)
