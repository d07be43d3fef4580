"""The writer's flow: assignments, attempts checked against the model, confirmation, submit."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Response, status

from api.deps import (
    CurrentWriter,
    IdPath,
    ModelClientDep,
    SessionDep,
    SessionmakerDep,
    SettingsDep,
)
from api.schemas import (
    AssignmentPublic,
    AssignmentRequest,
    AttemptCreate,
    AttemptPublic,
    ConfirmationCreate,
    ErrorResponse,
    ExampleCreate,
    ExamplePublic,
    InspectRequest,
)
from services.db.models import Assignment, Condition
from services.domain import rounds, writing
from services.domain.tasks import definition_of
from services.taskdef import TaskFamily

router = APIRouter(tags=["writing"])
IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", max_length=200,
           description="Any unique string; a retried request with the same key is answered from "
           "the first one and creates nothing new."),
]
_REPLAYED = "A retry with the same Idempotency-Key: the first answer again (header `Idempotent-Replayed`)."
_ERRORS = {
    404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}, 410: {"model": ErrorResponse},
    422: {"model": ErrorResponse},
}


def goal_of(assignment: Assignment) -> str:
    """The writer's goal in words, as on DynaSent's interface (App. C, Fig. 7)."""
    definition = definition_of(assignment.round.task)
    target = " + ".join(assignment.target_label)
    others = [label for label in definition.labels if label not in assignment.target_label]
    where = "" if assignment.condition is Condition.no_prompt else " Edit the prompt to get there."
    if definition.is_multi_label:
        return (f"Write a sentence expressing exactly {target} that the model labels differently.{where}")
    if definition.family is TaskFamily.target_dependent:
        return (f"Write a sentence that is {target} towards a target you mark in it, so that the model "
                f"predicts {' or '.join(others)} for that target.{where}")
    return (f"Write a {target} sentence that fools the model into predicting "
            f"{' or '.join(others)}.{where}")


@router.post("/rounds/{round_id}/assignments", response_model=AssignmentPublic,
             responses={**_ERRORS, 201: {"model": AssignmentPublic, "description": "A new assignment."}})
def start_assignment(round_id: IdPath, body: AssignmentRequest, response: Response, session: SessionDep,
                     writer: CurrentWriter) -> AssignmentPublic:
    """Your open assignment in the round, or a new one (201): a prompt and a target label."""
    round_ = rounds.get_round(session, round_id)
    assignment, created = writing.start_assignment(session, writer, round_, body.target_label)
    session.commit()
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return AssignmentPublic.of(assignment, goal_of(assignment))


@router.get("/assignments/{assignment_id}", response_model=AssignmentPublic, responses=_ERRORS)
def get_assignment(assignment_id: IdPath, session: SessionDep, writer: CurrentWriter) -> AssignmentPublic:
    assignment = writing.get_own_assignment(session, writer, assignment_id)
    return AssignmentPublic.of(assignment, goal_of(assignment))


@router.post("/assignments/{assignment_id}/attempts", response_model=AttemptPublic,
             status_code=status.HTTP_201_CREATED,
             responses={**_ERRORS, 200: {"model": AttemptPublic, "description": _REPLAYED},
                        503: {"model": ErrorResponse,
                              "description": "Model unavailable: text saved, no try used; retry."}})
def create_attempt(assignment_id: IdPath, body: AttemptCreate, response: Response, writer: CurrentWriter,
                   factory: SessionmakerDep, client: ModelClientDep, settings: SettingsDep,
                   idempotency_key: IdempotencyKey = None) -> AttemptPublic:
    """Check a text with the model in the loop. Uses one try unless the model is unavailable."""
    attempt, replayed = writing.make_attempt(factory, client, writer.id, assignment_id, body.text,
                                             body.target_span, idempotency_key, settings.retry_after_s)
    if replayed:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    return AttemptPublic.of(attempt)


@router.post("/attempts/{attempt_id}/confirmation", response_model=AttemptPublic, responses=_ERRORS)
def confirm_attempt(attempt_id: IdPath, body: ConfirmationCreate, session: SessionDep,
                    writer: CurrentWriter) -> AttemptPublic:
    """Would a person say this text has the target label? Required before submitting a fooling attempt."""
    attempt = writing.confirm_attempt(session, writer, attempt_id, body.agrees, body.judged_label)
    session.commit()
    return AttemptPublic.of(attempt)


@router.post("/assignments/{assignment_id}/example", response_model=ExamplePublic,
             status_code=status.HTTP_201_CREATED,
             responses={**_ERRORS, 200: {"model": ExamplePublic, "description": _REPLAYED}})
def submit_example(assignment_id: IdPath, body: ExampleCreate, response: Response, session: SessionDep,
                   writer: CurrentWriter, idempotency_key: IdempotencyKey = None) -> ExamplePublic:
    """Submit one of the assignment's attempts, with the task's extra writer fields."""
    example, created = writing.submit_example(session, writer, assignment_id, body.attempt_id, body.extras,
                                              idempotency_key)
    session.commit()
    if not created:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    return ExamplePublic.of(example)


@router.post("/assignments/{assignment_id}/skip", response_model=AssignmentPublic, responses=_ERRORS)
def skip_assignment(assignment_id: IdPath, session: SessionDep, writer: CurrentWriter) -> AssignmentPublic:
    """Switch to the next prompt: this assignment ends without an example."""
    assignment = writing.skip_assignment(session, writer, assignment_id)
    session.commit()
    return AssignmentPublic.of(assignment, goal_of(assignment))


@router.post("/assignments/{assignment_id}/inspect", responses={**_ERRORS, 503: {"model": ErrorResponse}})
def inspect_draft(assignment_id: IdPath, body: InspectRequest, session: SessionDep, writer: CurrentWriter,
                  client: ModelClientDep) -> dict[str, Any]:
    """Which words push the model towards a label (the target label by default)? Token
    attributions for a draft; nothing is stored and no try is used."""
    result = writing.inspect_text(session, client, writer, assignment_id, body.text, body.label, body.target_span)
    session.commit()
    return result
