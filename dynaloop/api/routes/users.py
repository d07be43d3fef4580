"""Users and their roles (admins)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status

from dynaloop.api.deps import SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.users import UserCreate, UserPublic, UsersPublic
from services.authorization import UserPolicy
from services.db.models import User
from services.domain import users

router = APIRouter(tags=["users"], route_class=OneHopRoute)
Admin = Annotated[User, allowed(UserPolicy.manage)]


@router.post("/users", response_model=UserPublic, status_code=status.HTTP_201_CREATED)
def create_user(body: UserCreate, session: SessionDep, admin: Admin) -> UserPublic:
    user = users.create_user(
        session, admin, body.username, body.roles, display_name=body.display_name, password=body.password
    )
    return UserPublic.of(user)


@router.get("/users", response_model=UsersPublic)
def list_users(session: SessionDep, admin: Admin) -> UsersPublic:
    rows = [UserPublic.of(u) for u in users.list_users(session)]
    return UsersPublic(data=rows, count=len(rows))
