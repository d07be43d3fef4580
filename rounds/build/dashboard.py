"""The numbers behind a round's dashboard plots (``GET /api/v1/rounds/{id}/plot-data``).

Per example: the normalised edit distance to its prompt (DynaSent Fig. 2a), its length in
characters and words (Fig. 2b), the writer's target label, the model's prediction and — once
the example is validated — the majority (gold) label of its counted validations, by the same
rules as the round builder (:mod:`rounds.build.aggregation`); plus each validator's agreement with
the majority (Fig. 6). Example texts are not included: the plots need none, and a dashboard
that never receives text cannot render it unescaped.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from rounds.build import aggregation
from rounds.build.prepare import counted_responses
from services.db.models import Attempt, Example, ExampleStatus, Round
from services.domain import controls, quality
from services.domain.tasks import definition_of
from services.taskdef import TaskDefinition, TaskFamily

#: At most this many examples are returned; a larger round is thinned evenly (by id).
DEFAULT_LIMIT = 50_000


def _joined(labels: Any) -> str | None:
    if not labels:
        return None
    return "+".join(str(label) for label in labels)


def majority_gold(definition: TaskDefinition, responses: pd.DataFrame) -> dict[int, str | None]:
    """Example id -> gold label of the counted responses ('+'-joined for multi-label sets), by
    the task's family rule: k-of-n majority, per-label k-of-n, or MAD-TSC consolidation."""
    if responses.empty:
        return {}
    if definition.family is TaskFamily.target_dependent:
        frame = aggregation.consolidate_target_sentiment(
            responses,
            collapse=definition.label_collapse or {},
            unknown_label=definition.unknown_label,
            order=definition.effective_validation_labels,
            min_responses=1,
        )
        return _gold_by_example(frame["label"])
    if definition.is_multi_label:
        frame = aggregation.multilabel_gold(
            responses, labels=definition.labels, min_votes=definition.agreement.gold_min_votes
        )
        return {int(e): _joined(label) for e, label in zip(frame.index, frame["label"], strict=True)}
    frame = aggregation.majority_labels(
        responses, labels=definition.effective_validation_labels, min_votes=definition.agreement.gold_min_votes
    )
    return _gold_by_example(frame["label"])


def _gold_by_example(gold: pd.Series) -> dict[int, str | None]:
    """Example id (the index) -> its gold label, None where it has none."""
    return {int(e): label if isinstance(label, str) else None for e, label in zip(gold.index, gold, strict=True)}


def round_plot_data(session: Session, round_: Round, *, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Everything the dashboard plots for ``round_`` (see the module docstring)."""
    definition = definition_of(round_.task)
    multi = definition.is_multi_label
    rows = session.execute(
        select(
            Example.id,
            Example.condition,
            Example.origin,
            Example.text,
            Example.target_label,
            Example.model_prediction,
            Example.fooled,
            Example.status,
            Example.validation_count,
            Attempt.edit_distance,
        )
        .outerjoin(Attempt, Example.attempt_id == Attempt.id)  # harvested examples have no attempt
        .where(Example.round_id == round_.id)
        .order_by(Example.id)
    ).all()
    total = len(rows)
    if total > limit:
        step = total / limit
        rows = [rows[int(i * step)] for i in range(limit)]
    responses = counted_responses(session, round_, multi_label=multi)
    gold = majority_gold(definition, responses)
    examples = []
    for example_id, condition, origin, text, target, prediction, fooled, status, validations, edit_distance in rows:
        validated = status is ExampleStatus.validated
        examples.append(
            {
                "example_id": example_id,
                "condition": condition.value,
                "origin": origin.value,
                "edit_distance": None if edit_distance is None else round(float(edit_distance), 4),
                "chars": len(text),
                "words": len(text.split()),
                "target": _joined(target),
                "prediction": _joined(prediction),
                "majority": gold.get(example_id) if validated else None,
                "validated": validated,
                "fooled": bool(fooled),
                "validations": validations,
            }
        )
    # Each validator's gold accuracy on the round's control items beside their agreement.
    gold_of = controls.gold_accuracy(session, round_.task, round_)
    agreement = [
        {
            "username": r.username,
            "labels": r.labels,
            "judged": r.judged,
            "agreement_rate": r.agreement_rate,
            "qualified": r.qualified,
            "control_answers": accuracy.answers if (accuracy := gold_of.get(r.user_id)) else 0,
            "gold_accuracy": accuracy.rate if accuracy else None,
        }
        for r in quality.validator_agreement(session, round_.task, round_, include_user_ids=list(gold_of))
    ]
    return {
        "round_id": round_.id,
        "round": round_.number,
        "task": round_.task.name,
        "labels": list(definition.labels),
        "validation_labels": list(definition.effective_validation_labels),
        "multi_label": multi,
        "total_examples": total,
        "truncated": total > len(examples),
        "examples": examples,
        "worker_agreement": agreement,
    }
