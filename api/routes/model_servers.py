"""The registry of model servers: the only URLs the API calls (admins manage; researchers list)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status

from api.deps import SessionDep, allowed
from api.schemas.model_servers import ModelServerCreate, ModelServerPublic, ModelServersPublic, ModelServerUpdate
from services.authorization import ModelServerPolicy, authorize
from services.db.models import User
from services.domain import model_servers

router = APIRouter(tags=["model servers"])
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
