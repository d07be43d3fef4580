"""The writer's assignments: a prompt and a target label, attempts checked against the model
in the loop, confirmation of a fooling attempt, the submitted example, skip, inspect
(DynaSent §4, App. C)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Response, status

from dynaloop.api.deps import (
    AttemptsInFlightDep,
    IdPath,
    ModelClientDep,
    SessionDep,
    SessionmakerDep,
    SettingsDep,
    allowed_writer,
)
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.assignments import (
    AssignmentPublic,
    AssignmentRequest,
    AttemptCreate,
    AttemptPublic,
    ConfirmationCreate,
    ExampleCreate,
    InspectionPublic,
    InspectRequest,
)
from dynaloop.api.schemas.errors import ErrorResponse
from dynaloop.api.schemas.examples import ExamplePublic
from services.authorization import AssignmentPolicy, AttemptPolicy, RoundPolicy, authorize
from services.db.models import User
from services.domain import round_lifecycle, writing

router = APIRouter(tags=["assignments"], route_class=OneHopRoute)
AssignmentWriter = Annotated[User, allowed_writer(AssignmentPolicy.use)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=200,
        description="Any unique string; a retried request with the same key is answered from "
        "the first one and creates nothing new.",
    ),
]
_REPLAYED = "A retry with the same Idempotency-Key: the first answer again (header `Idempotent-Replayed`)."


@router.post(
    "/rounds/{round_id}/assignments",
    response_model=AssignmentPublic,
    responses={201: {"model": AssignmentPublic, "description": "A new assignment."}},
)
def start_assignment(
    round_id: IdPath,
    body: AssignmentRequest,
    response: Response,
    session: SessionDep,
    writer: Annotated[User, allowed_writer(RoundPolicy.write)],
) -> AssignmentPublic:
    """Your open assignment in the round, or a new one (201): a prompt and a target label."""
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(writer, RoundPolicy.write(round_))
    assignment, created = writing.start_assignment(session, writer, round_, body.target_label)
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return AssignmentPublic.of(assignment, writing.goal_of(assignment))


@router.get("/assignments/{assignment_id}", response_model=AssignmentPublic)
def get_assignment(assignment_id: IdPath, session: SessionDep, writer: AssignmentWriter) -> AssignmentPublic:
    assignment = writing.get_assignment(session, assignment_id)
    authorize(writer, AssignmentPolicy.use(assignment))
    return AssignmentPublic.of(assignment, writing.goal_of(assignment))


@router.post(
    "/assignments/{assignment_id}/attempts",
    response_model=AttemptPublic,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": AttemptPublic, "description": _REPLAYED},
        429: {
            "model": ErrorResponse,
            "description": "`too_many_in_flight`: another attempt of this assignment (or too many of yours) is "
            "still with the model; nothing saved, retry after `Retry-After`.",
        },
        503: {
            "model": ErrorResponse,
            "description": "`model_unavailable` (text saved, no try used) or `model_busy` (every model slot "
            "taken); retry after `Retry-After`.",
        },
    },
)
def create_attempt(
    assignment_id: IdPath,
    body: AttemptCreate,
    response: Response,
    writer: AssignmentWriter,
    factory: SessionmakerDep,
    client: ModelClientDep,
    settings: SettingsDep,
    in_flight: AttemptsInFlightDep,
    idempotency_key: IdempotencyKey = None,
) -> AttemptPublic:
    """Check a text with the model in the loop. Uses one try unless the model is unavailable.

    The attempt runs in transactions of its own, around the model call (services.domain.writing),
    and asks ``AssignmentPolicy.use`` in the first of them."""
    attempt, replayed = writing.make_attempt(
        factory,
        client,
        writer,
        assignment_id,
        body.text,
        body.target_span,
        idempotency_key,
        settings.retry_after_s,
        in_flight,
    )
    if replayed:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    return AttemptPublic.of(attempt)


@router.post("/attempts/{attempt_id}/confirmation", response_model=AttemptPublic)
def confirm_attempt(
    attempt_id: IdPath,
    body: ConfirmationCreate,
    session: SessionDep,
    writer: Annotated[User, allowed_writer(AttemptPolicy.use)],
) -> AttemptPublic:
    """Would a person say this text has the target label? Required before submitting a fooling attempt."""
    attempt = writing.get_attempt(session, attempt_id)
    authorize(writer, AttemptPolicy.use(attempt))
    return AttemptPublic.of(writing.confirm_attempt(session, attempt, body.agrees, body.judged_label))


@router.post(
    "/assignments/{assignment_id}/example",
    response_model=ExamplePublic,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": ExamplePublic, "description": _REPLAYED}},
)
def submit_example(
    assignment_id: IdPath,
    body: ExampleCreate,
    response: Response,
    session: SessionDep,
    writer: AssignmentWriter,
    idempotency_key: IdempotencyKey = None,
) -> ExamplePublic:
    """Submit one of the assignment's attempts, with the task's extra writer fields."""
    assignment = writing.get_assignment(session, assignment_id)
    authorize(writer, AssignmentPolicy.use(assignment))
    example, created = writing.submit_example(session, assignment, body.attempt_id, body.extras, idempotency_key)
    if not created:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    return ExamplePublic.of(example)


@router.post("/assignments/{assignment_id}/skip", response_model=AssignmentPublic)
def skip_assignment(assignment_id: IdPath, session: SessionDep, writer: AssignmentWriter) -> AssignmentPublic:
    """Switch to the next prompt: this assignment ends without an example."""
    assignment = writing.get_assignment(session, assignment_id)
    authorize(writer, AssignmentPolicy.use(assignment))
    skipped = writing.skip_assignment(assignment)
    return AssignmentPublic.of(skipped, writing.goal_of(skipped))


@router.post(
    "/assignments/{assignment_id}/inspect",
    response_model=InspectionPublic,
    responses={
        503: {
            "model": ErrorResponse,
            "description": "The model server is down, busy (`model_busy`) or offers no token attributions.",
        }
    },
)
def inspect_draft(
    assignment_id: IdPath, body: InspectRequest, session: SessionDep, writer: AssignmentWriter, client: ModelClientDep
) -> InspectionPublic:
    """Which words push the model towards a label (the target label by default)? Token
    attributions for a draft; nothing is stored and no try is used."""
    assignment = writing.get_assignment(session, assignment_id)
    authorize(writer, AssignmentPolicy.use(assignment))
    inspection = writing.inspect_text(session, client, assignment, body.text, body.label, body.target_span)
    return InspectionPublic.of(inspection)


# The endpoints that call the model server: dynaloop/api/overload.py gives them their own, smaller
# share of the requests in flight.
MODEL_BOUND_ENDPOINTS = (create_attempt, inspect_draft)
