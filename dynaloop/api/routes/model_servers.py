"""The registry of model servers: the only URLs the API calls (admins manage; researchers list),
and the tasks each is granted to (admins grant; a task's researchers see their task's)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status

from dynaloop.api.deps import SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.model_servers import (
    ModelServerCreate,
    ModelServerGrantPublic,
    ModelServerGrantsPublic,
    ModelServerPublic,
    ModelServersPublic,
    ModelServerUpdate,
)
from services.authorization import ModelServerPolicy, TaskPolicy, authorize
from services.db.models import ModelServer, ModelServerGrant, Task, User
from services.domain import model_servers, tasks

router = APIRouter(tags=["model servers"], route_class=OneHopRoute)
Admin = Annotated[User, allowed(ModelServerPolicy.manage)]
Lister = Annotated[User, allowed(ModelServerPolicy.list)]


@router.post("/model-servers", response_model=ModelServerPublic, status_code=status.HTTP_201_CREATED)
def register_model_server(body: ModelServerCreate, session: SessionDep, admin: Admin) -> ModelServerPublic:
    """Register a model server. Any http(s) host is accepted, local ones included: which hosts
    the API may call is the admin's decision. No credentials, query or fragment in the URL."""
    authorize(admin, ModelServerPolicy.manage())
    server = model_servers.register(
        session, admin, body.name, body.url, admin_token=body.admin_token, description=body.description
    )
    return ModelServerPublic.of(server)


@router.get("/model-servers", response_model=ModelServersPublic)
def list_model_servers(session: SessionDep, user: Lister) -> ModelServersPublic:
    """The registered servers, to choose from for a round's loop or a promotion."""
    authorize(user, ModelServerPolicy.list())
    rows = [ModelServerPublic.of(s) for s in model_servers.list_servers(session)]
    return ModelServersPublic(data=rows, count=len(rows))


@router.get("/model-servers/{name}", response_model=ModelServerPublic)
def get_model_server(name: str, session: SessionDep, user: Lister) -> ModelServerPublic:
    authorize(user, ModelServerPolicy.list())
    return ModelServerPublic.of(model_servers.get_server(session, name))


@router.patch("/model-servers/{name}", response_model=ModelServerPublic)
def update_model_server(name: str, body: ModelServerUpdate, session: SessionDep, admin: Admin) -> ModelServerPublic:
    """Change a server's URL, admin token (``null`` removes it) or description."""
    server = model_servers.get_server(session, name)
    authorize(admin, ModelServerPolicy.manage())
    sent = body.model_fields_set
    changes: dict[str, object] = {}
    if "admin_token" in sent:
        changes["admin_token"] = body.admin_token
    if "description" in sent:
        changes["description"] = body.description
    server = model_servers.update(session, admin, server, url=body.url, **changes)
    return ModelServerPublic.of(server)


@router.delete("/model-servers/{name}", response_model=ModelServerPublic)
def remove_model_server(name: str, session: SessionDep, admin: Admin) -> ModelServerPublic:
    """Remove a server (the answer is what was removed); refused (409) while an open round has
    it in its loop. Closed rounds keep its name in their history."""
    server = model_servers.get_server(session, name)
    authorize(admin, ModelServerPolicy.manage())
    removed = ModelServerPublic.of(server)
    model_servers.remove(session, admin, server)
    return removed


def _grant_public(grant: ModelServerGrant, shared: bool) -> ModelServerGrantPublic:
    return ModelServerGrantPublic(
        server=grant.server.name,
        task=grant.task.name,
        shared=shared,
        granted_by=grant.granted_by.username if grant.granted_by else None,
        granted_at=grant.granted_at,
    )


def _grants(
    session: SessionDep, *, server: ModelServer | None = None, task: Task | None = None
) -> ModelServerGrantsPublic:
    rows = model_servers.grants(session, server=server, task=task)
    counts = model_servers.grant_counts(session, sorted({row.server.name for row in rows}))
    data = [_grant_public(row, counts.get(row.server.name, 0) > 1) for row in rows]
    return ModelServerGrantsPublic(data=data, count=len(data))


@router.put("/model-servers/{name}/tasks/{task_name}", response_model=ModelServerGrantPublic)
def grant_model_server(name: str, task_name: str, session: SessionDep, admin: Admin) -> ModelServerGrantPublic:
    """Grant a server to a task (admins): the task's researchers may put it in their rounds'
    loop, and promote their models to it while it is granted to no other task. Granting again
    changes nothing. A server granted to several tasks is swapped (promoted to) by admins only."""
    authorize(admin, ModelServerPolicy.manage())
    server = model_servers.get_server(session, name)
    task = tasks.get_task(session, task_name)
    grant, _ = model_servers.grant(session, admin, server, task)
    shared = model_servers.grant_counts(session, [server.name]).get(server.name, 0) > 1
    return _grant_public(grant, shared)


@router.delete("/model-servers/{name}/tasks/{task_name}", response_model=ModelServerGrantPublic)
def revoke_model_server(name: str, task_name: str, session: SessionDep, admin: Admin) -> ModelServerGrantPublic:
    """Take a server away from a task (admins); the answer is the grant removed. Refused (409)
    while one of the task's open rounds has it in its loop; 404 when it was not granted."""
    authorize(admin, ModelServerPolicy.manage())
    server = model_servers.get_server(session, name)
    task = tasks.get_task(session, task_name)
    shared = model_servers.grant_counts(session, [server.name]).get(server.name, 0) > 1
    removed = _grant_public(model_servers.get_grant(session, server, task), shared)
    model_servers.revoke(session, admin, server, task)
    return removed


@router.get("/model-servers/{name}/tasks", response_model=ModelServerGrantsPublic)
def list_server_grants(name: str, session: SessionDep, admin: Admin) -> ModelServerGrantsPublic:
    """The tasks a server is granted to (admins: they span groups)."""
    authorize(admin, ModelServerPolicy.manage())
    return _grants(session, server=model_servers.get_server(session, name))


@router.get("/tasks/{task_name}/model-servers", response_model=ModelServerGrantsPublic)
def list_task_servers(
    task_name: str, session: SessionDep, researcher: Annotated[User, allowed(TaskPolicy.manage)]
) -> ModelServerGrantsPublic:
    """The servers granted to a task: the ones its researchers may put in a round's loop, and,
    those not ``shared``, promote to."""
    task = tasks.get_task(session, task_name)
    authorize(researcher, TaskPolicy.manage(task))
    return _grants(session, task=task)
