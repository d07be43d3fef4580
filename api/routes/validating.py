"""The validator's flow, and the researcher's full record of an example."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response, status

from api.deps import CurrentResearcher, CurrentValidator, IdPath, SessionDep
from api.schemas import BatchItem, BatchPublic, ErrorResponse, ValidationCreate, ValidationPublic
from services.domain import rounds, validating
from services.domain.tasks import definition_of

router = APIRouter()
_ERRORS = {403: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 409: {"model": ErrorResponse},
           422: {"model": ErrorResponse}}


@router.get("/rounds/{round_id}/validation-batch", response_model=BatchPublic, responses=_ERRORS,
            tags=["validating"])
def validation_batch(round_id: IdPath, session: SessionDep, validator: CurrentValidator,
                     size: int | None = Query(None, ge=1, le=100)) -> BatchPublic:
    """Up to 10 examples by others to label: fooling examples first, then the least-validated.
    Calling again returns the examples you still hold (nothing is lost on reload)."""
    round_ = rounds.get_round(session, round_id)
    examples = validating.get_batch(session, validator, round_, size)
    session.commit()
    definition = definition_of(round_.task)
    items = [BatchItem(example_id=e.id, text=e.text, target_span=e.extras.get("target_span")) for e in examples]
    return BatchPublic(round_id=round_.id, task=round_.task.name,
                       validation_labels=definition.effective_validation_labels,
                       multi_label=definition.is_multi_label, data=items, count=len(items))


@router.post("/examples/{example_id}/validations", response_model=ValidationPublic,
             status_code=status.HTTP_201_CREATED, tags=["validating"],
             responses={**_ERRORS, 200: {"model": ValidationPublic,
                                         "description": "A retried identical label: the first answer again."}})
def submit_validation(example_id: IdPath, body: ValidationCreate, response: Response, session: SessionDep,
                      validator: CurrentValidator,
                      idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None
                      ) -> ValidationPublic:
    """Label one example. A retried identical request is answered 200 and adds nothing."""
    validation, created = validating.submit_validation(
        session, validator, example_id, body.label, body.flagged, body.flag_reason, body.seconds_taken,
        idempotency_key,
    )
    session.commit()
    if not created:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    return ValidationPublic(id=validation.id, example_id=validation.example_id, label=validation.label,
                            flagged=validation.flagged, counted=validation.counted, created_at=validation.created_at)


@router.get("/examples/{example_id}", tags=["examples"])
def example_record(example_id: IdPath, session: SessionDep, researcher: CurrentResearcher) -> dict[str, Any]:
    """The whole record of an example: every attempt, edit distances, confirmation, every label."""
    return validating.example_record(session, example_id)
