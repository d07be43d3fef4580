"""The validator's flow: batches of others' examples, and one label per example
(DynaSent §3.3, App. B)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Response, status

from dynaloop.api.deps import IdPath, SessionDep, allowed
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.validation import BatchItem, BatchPublic, ItemLabelPublic, ValidationCreate, ValidationPublic
from services.authorization import ExamplePolicy, RoundPolicy, authorize
from services.db.models import User
from services.domain import round_lifecycle, validating
from services.domain.tasks import definition_of

router = APIRouter(tags=["validation"], route_class=OneHopRoute)


@router.get("/rounds/{round_id}/validation-batch", response_model=BatchPublic)
def validation_batch(
    round_id: IdPath,
    session: SessionDep,
    validator: Annotated[User, allowed(RoundPolicy.validate)],
    size: int | None = Query(None, ge=1, le=100),
) -> BatchPublic:
    """Your batch: up to 10 examples by others to label (picked fooling examples first, then the
    least-validated) with the task's control items mixed in, in an order shuffled per batch.
    Calling again while the batch is yours returns the same items in the same order (nothing is
    lost on reload, nothing new is gained); once every item is labelled, or after 30 minutes,
    a new batch is served. Label each item through its ``item_id``."""
    round_ = round_lifecycle.get_round(session, round_id)
    authorize(validator, RoundPolicy.validate(round_))
    served = validating.get_batch(session, validator, round_, size)
    definition = definition_of(round_.task)
    items = [BatchItem(item_id=s.item_key, text=s.text, target_span=s.target_span) for s in served]
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
    """Label one example of your live batch, by its id (tasks without control items only; label
    batch items through POST /validation-items/{item_id}/validations). An example that is not
    in a batch served to you and still yours is refused (403) and nothing is written. A retried
    identical request is answered 200 and adds nothing."""
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


@router.post(
    "/validation-items/{item_id}/validations",
    response_model=ItemLabelPublic,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": ItemLabelPublic, "description": "A retried identical label: the first answer again."}},
)
def label_item(
    item_id: Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")],
    body: ValidationCreate,
    response: Response,
    session: SessionDep,
    validator: Annotated[User, allowed(RoundPolicy.validate)],
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> ItemLabelPublic:
    """Label one item of your live validation batch. An item of another validator's batch is
    answered as a missing one (404); an item of a batch that expired or was replaced is refused
    (409) and nothing is written. A retried identical request is answered 200 and adds nothing."""
    item = validating.get_batch_item(session, validator, item_id)
    authorize(validator, RoundPolicy.validate(item.batch.round))
    if item.example is not None:
        authorize(validator, ExamplePolicy.validate(item.example))
    answer = validating.label_item(
        session,
        validator,
        item_id,
        body.label,
        body.flagged,
        body.flag_reason,
        body.seconds_taken,
        idempotency_key,
        item=item,
    )
    if not answer.created:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    return ItemLabelPublic.of(answer)
