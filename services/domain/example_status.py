"""An example's status once it has all its counted labels (DynaSent §3.3; EthioEmo's re-queue of
disagreements). Both a validator's label (services.domain.validating) and a requalified
validator's restored labels (services.domain.quality) can complete an example."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.db.models import Example, ExampleStatus, Validation
from services.domain.labels import gold_label, last_pass
from services.taskdef import TaskDefinition


def finalize_example(session: Session, example: Example, definition: TaskDefinition) -> None:
    """An example that has all its counted labels: validated, re-queued once more (EthioEmo's
    disagreements), or dropped."""
    counted = list(
        session.execute(
            select(Validation.annotation_pass, Validation.label)
            .where(Validation.example_id == example.id, Validation.counted.is_(True))
            .order_by(Validation.id)
        ).all()
    )
    # Gold on the last pass's labels only: a re-annotated example's first labels no longer count.
    responses = last_pass([p for p, _ in counted], [label for _, label in counted])
    if gold_label(definition, responses) is not None or definition.agreement.requeue_disagreements == 0:
        example.status = ExampleStatus.validated
    elif example.requeue_count < definition.agreement.requeue_disagreements:
        # New validators (earlier ones cannot label it twice) give another full set of labels.
        example.requeue_count += 1
        example.validations_needed += definition.validations_per_example
        example.status = ExampleStatus.validating
    else:
        example.status = ExampleStatus.dropped
