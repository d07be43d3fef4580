"""The validator's flow: batches of others' examples, and one label per example
(DynaSent §3.3, App. B)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response, status

from api.deps import IdPath, SessionDep, allowed
from api.schemas.validation import BatchItem, BatchPublic, ValidationCreate, ValidationPublic
from services.authorization import ExamplePolicy, RoundPolicy, authorize
from services.db.models import User
from services.domain import rounds, validating
from services.domain.tasks import definition_of

router = APIRouter(tags=["validation"])


@router.get("/rounds/{round_id}/validation-batch", response_model=BatchPublic)
def validation_batch(
    round_id: IdPath,
    session: SessionDep,
    validator: Annotated[User, allowed(RoundPolicy.validate)],
    size: int | None = Query(None, ge=1, le=100),
) -> BatchPublic:
    """Up to 10 examples by others to label, picked fooling examples first, then the
    least-validated, and shown in an order unrelated to the model (a hash of your id and the
    example's). Calling again returns the examples you still hold (nothing is lost on reload)."""
    round_ = rounds.get_round(session, round_id)
    authorize(validator, RoundPolicy.validate(round_))
    examples = validating.get_batch(session, validator, round_, size)
    definition = definition_of(round_.task)
    items = [BatchItem(example_id=e.id, text=e.text, target_span=e.extras.get("target_span")) for e in examples]
    return BatchPublic(
        round_id=round_.id,
        task=round_.task.name,
        validation_labels=definition.effective_validation_labels,
        label_names={label: definition.label_name(label) for label in definition.effective_validation_labels},
        multi_label=definition.is_multi_label,
        data=items,
        count=len(items),
    )


@router.post(
    "/examples/{example_id}/validations",
    response_model=ValidationPublic,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": ValidationPublic, "description": "A retried identical label: the first answer again."}},
)
def submit_validation(
    example_id: IdPath,
    body: ValidationCreate,
    response: Response,
    session: SessionDep,
    validator: Annotated[User, allowed(ExamplePolicy.validate)],
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> ValidationPublic:
    """Label one example. A retried identical request is answered 200 and adds nothing."""
    example = validating.get_example(session, example_id)
    authorize(validator, ExamplePolicy.validate(example))
    validation, created = validating.submit_validation(
        session,
        validator,
        example,
        body.label,
        body.flagged,
        body.flag_reason,
        body.seconds_taken,
        idempotency_key,
    )
    if not created:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    return ValidationPublic.of(validation)
