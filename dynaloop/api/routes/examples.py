"""The researcher's full record of one example."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from dynaloop.api.deps import IdPath, SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.examples import ExampleRecord
from services.authorization import ExamplePolicy, authorize
from services.db.models import User
from services.domain import validating

router = APIRouter(tags=["examples"], route_class=OneHopRoute)


@router.get("/examples/{example_id}", response_model=ExampleRecord)
def example_record(
    example_id: IdPath, session: SessionDep, researcher: Annotated[User, allowed(ExamplePolicy.read)]
) -> ExampleRecord:
    """The whole record of an example: every attempt, edit distances, confirmation, every label."""
    example = validating.get_example(session, example_id)
    authorize(researcher, ExamplePolicy.read(example))
    return ExampleRecord.model_validate(validating.example_record(session, example))
