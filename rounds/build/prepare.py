"""Read a closed round and aggregate it, ready to split: what a build and a preview share.

:func:`prepare` reads the round (:func:`load_round`), keeps one response set per example
(rounds.build.response_sets), decides gold (majority; MAD-TSC consolidation; EthioEmo per-label
2-of-3; an imported dataset's own gold), excludes repeated texts (rounds.build.duplicates);
:func:`make_splits` then assigns dev, test and train under an effective policy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from rounds.build import aggregation, duplicates, multilabel_splits, response_sets, splits
from rounds.build.build_settings import EffectivePolicy
from rounds.build.round_data import Prepared, RoundData
from rounds.build.table import responses_frame
from services.db.models import (
    Assignment,
    Attempt,
    AttemptStatus,
    Example,
    ExampleStatus,
    Prompt,
    Round,
    RoundStatus,
    Validation,
    ValidationBatch,
    ValidationBatchItem,
)
from services.domain.labels import exclusive_gold
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid
from services.taskdef import TaskFamily


def control_answers(session: Session, round_: Round) -> pd.DataFrame:
    """Each answer to a control item in the round's batches: who gave it, and whether it was right."""
    return pd.DataFrame.from_records(
        session.execute(
            select(ValidationBatch.validator_id, ValidationBatchItem.correct)
            .join(ValidationBatch, ValidationBatchItem.batch_id == ValidationBatch.id)
            .where(
                ValidationBatch.round_id == round_.id,
                ValidationBatchItem.control_item_id.is_not(None),
                ValidationBatchItem.answered_at.is_not(None),
            )
            .order_by(ValidationBatchItem.id)
        ).all(),
        columns=["worker_id", "correct"],
    )


def counted_responses(session: Session, round_: Round, *, multi_label: bool) -> pd.DataFrame:
    """The round's counted labels as the long response table (rounds.build.table)."""
    return responses_frame(
        session.execute(
            select(Validation.example_id, Validation.validator_id, Validation.label)
            .join(Example, Validation.example_id == Example.id)
            .where(Example.round_id == round_.id, Validation.counted.is_(True))
            .order_by(Validation.id)
        ).all(),
        multi_label=multi_label,
    )


def examples_frame(session: Session, round_: Round) -> pd.DataFrame:
    """The round's examples, one row each, with their attempt's edit distance and confirmation."""
    rows = session.execute(
        select(
            Example.id,
            Example.text,
            Example.prompt_id,
            Example.condition,
            Example.model_prediction,
            Example.target_label,
            Example.writer_id,
            Example.fooled,
            Example.status,
            Example.extras,
            Attempt.edit_distance,
            Attempt.confirmed,
            Example.origin,
            Example.requeue_count,
            Example.source_metadata,
        )
        # Outer join: harvested examples (DynaSent §3.2) have no attempt.
        .outerjoin(Attempt, Example.attempt_id == Attempt.id)
        .where(Example.round_id == round_.id)
        .order_by(Example.id)
    ).all()
    return pd.DataFrame.from_records(
        [
            (
                r[0],
                r[1],
                r[2],
                r[3].value,
                r[4],
                r[5],
                r[6],
                bool(r[7]),
                r[8].value,
                r[9],
                r[10],
                r[11],
                r[12].value,
                int(r[13] or 0),
                r[14],
            )
            for r in rows
        ],
        columns=[
            "example_id",
            "text",
            "prompt_id",
            "condition",
            "model_prediction",
            "target_label",
            "writer_id",
            "fooled",
            "status",
            "extras",
            "edit_distance",
            "confirmed",
            "origin",
            "requeue_count",
            "source_metadata",
        ],
    )


def load_round(session: Session, round_: Round) -> RoundData:
    """The round as the build reads it: examples, counted responses (and their passes), scored
    attempts, prompts and their sources, answers to control items."""
    definition = definition_of(round_.task)
    multi = definition.is_multi_label
    examples = examples_frame(session, round_)
    responses = counted_responses(session, round_, multi_label=multi)
    passes = (
        np.asarray(
            session.scalars(
                select(Validation.annotation_pass)
                .join(Example, Validation.example_id == Example.id)
                .where(Example.round_id == round_.id, Validation.counted.is_(True))
                .order_by(Validation.id)
            ).all(),
            dtype=np.int64,
        )
        if multi
        else None
    )
    attempts = pd.DataFrame.from_records(
        session.execute(
            select(Attempt.id, Attempt.fooled, Attempt.confirmed, Assignment.condition)
            .join(Assignment, Attempt.assignment_id == Assignment.id)
            .where(Assignment.round_id == round_.id, Attempt.status == AttemptStatus.scored)
        ).all(),
        columns=["attempt_id", "fooled", "confirmed", "condition"],
    )
    prompts = dict(session.execute(select(Prompt.id, Prompt.text).where(Prompt.round_id == round_.id)).all())
    sources = sorted(
        s
        for s in session.scalars(
            select(Prompt.source).where(Prompt.round_id == round_.id, Prompt.source.is_not(None)).distinct()
        )
        if s
    )
    return RoundData(
        definition, examples, responses, attempts, prompts, sources, passes, control_answers(session, round_)
    )


def _multilabel_gold(data: RoundData) -> pd.DataFrame:
    """EthioEmo §3.3 gold: per label >= gold_min_votes of the last pass's responses, the
    task's exclusive label (neutral) never together with others (labels.exclusive_gold).
    Excluded with a reason: dropped after re-annotation (no_gold_after_reannotation), waiting
    for new validators that never came (awaiting_reannotation), and no gold (no_gold)."""
    definition = data.definition
    need = definition.agreement.gold_min_votes
    # data.responses is each example's last pass already (prepare, response_sets).
    frame = aggregation.multilabel_gold(data.responses, labels=definition.labels, min_votes=need)
    votes = frame[[f"votes_{label}" for label in definition.labels]]
    gold_sets: list[tuple[str, ...] | None] = []
    gold_votes: list[int] = []
    for value, row in zip(frame["label"], votes.to_numpy(), strict=True):
        kept = exclusive_gold(definition, list(value)) if isinstance(value, tuple) else None
        gold_sets.append(tuple(kept) if kept else None)
        # The gold set's weakest label decides whether it is strong enough for dev/test.
        gold_votes.append(min(int(row[definition.labels.index(label)]) for label in kept) if kept else 0)
    frame = frame.assign(gold=pd.Series(gold_sets, index=frame.index, dtype=object), gold_votes=gold_votes)
    examples = data.examples.set_index("example_id")
    frame = frame.reindex(examples.index)
    status = examples["status"].to_numpy()
    has_gold = frame["gold"].notna().to_numpy()
    reason = np.array([None if kept else "no_gold" for kept in has_gold], dtype=object)
    reason[(status == ExampleStatus.validating.value) & (examples["requeue_count"].to_numpy() > 0)] = (
        "awaiting_reannotation"
    )
    reason[status == ExampleStatus.dropped.value] = "no_gold_after_reannotation"
    frame["reason"] = reason
    frame["kept"] = [r is None for r in reason]
    return frame


def gold_labels(data: RoundData) -> pd.DataFrame:
    """Per example: gold (str, tuple or None), gold_votes, kept (False: drop), reason."""
    definition, responses = data.definition, data.responses
    index = pd.Index(data.examples["example_id"], name="example_id")
    if definition.family is TaskFamily.target_dependent:
        frame = aggregation.consolidate_target_sentiment(
            responses,
            collapse=definition.label_collapse or {},
            unknown_label=definition.unknown_label,
            order=definition.effective_validation_labels,
            min_responses=1,
        )
        frame = frame.rename(columns={"label": "gold", "votes": "gold_votes"})
    elif definition.is_multi_label:
        frame = _multilabel_gold(data)
    else:
        frame = aggregation.majority_labels(
            responses, labels=definition.effective_validation_labels, min_votes=definition.agreement.gold_min_votes
        )
        frame = frame.rename(columns={"label": "gold", "votes": "gold_votes"}).assign(kept=True, reason=None)
    frame = frame.reindex(index)
    frame["kept"] = frame["kept"].fillna(False).astype(bool) if "kept" in frame else False
    frame.loc[frame["n_responses"].isna(), "reason"] = "no_counted_labels"
    # Imported gold (rounds/models/round_imports.py, docs/round_builder.md "Imports"): a labelled
    # dataset's own label, taken as is for an example nobody labelled here, with the dataset's
    # vote counts where it had them (else 1 vote: the dataset's label); the datasheet says so.
    imported: dict[int, dict[str, Any]] = {
        int(e): meta
        for e, meta in zip(data.examples["example_id"], data.examples["source_metadata"], strict=True)
        if isinstance(meta, dict) and meta.get("gold")
    }
    answered = set(frame.index[frame["n_responses"].notna()])
    fill = [e for e in imported if e not in answered]
    if fill:
        values = [tuple(imported[e]["gold"]) if definition.is_multi_label else imported[e]["gold"][0] for e in fill]
        frame["gold"] = frame["gold"].astype(object)
        frame.loc[fill, "gold"] = pd.Series(values, index=fill, dtype=object)
        frame.loc[fill, "gold_votes"] = [imported[e].get("gold_votes") or 1 for e in fill]
        frame.loc[fill, "n_responses"] = [imported[e].get("responses") or 1 for e in fill]
        frame.loc[fill, "kept"] = True
        frame.loc[fill, "reason"] = None
    return frame


def _split_input(data: RoundData, gold: pd.DataFrame) -> pd.DataFrame:
    definition = data.definition
    examples = data.examples.set_index("example_id")

    def prediction(value: Any) -> Any:
        if not value:
            return None
        return tuple(value) if definition.is_multi_label else value[0]

    # dtype=object: pandas would otherwise store missing gold labels as NaN in a str column.
    return pd.DataFrame(
        {
            "example_id": examples.index,
            "gold": pd.Series([g if isinstance(g, str | tuple) else None for g in gold["gold"]], dtype=object),
            "gold_votes": gold["gold_votes"].fillna(0).astype(int).to_numpy(),
            "prompt_id": examples["prompt_id"].to_numpy(),
            "condition": examples["condition"].to_numpy(),
            "model_prediction": [prediction(v) for v in examples["model_prediction"]],
        }
    )


def prepare(session: Session, round_: Round) -> Prepared:
    """Read ``round_`` (closed or built), aggregate its labels; refuse one with no examples."""
    if round_.status not in (RoundStatus.closed, RoundStatus.built):
        raise Conflict(
            f"round {round_.number} is {round_.status.value}; close it before building "
            f'(POST /api/v1/rounds/{round_.id}/status {{"status": "closed"}})'
        )
    data = load_round(session, round_)
    definition = data.definition
    if data.examples.empty:
        raise Conflict(f"round {round_.number} has no examples to build")

    # One response set per example for every statistic: its last pass, and where a pass has
    # more than the task's validations, the top-ranked validators' (response_sets).
    sets = response_sets.select_responses(definition, data.responses, data.passes)
    data.responses, data.passes = sets.used, sets.used_passes
    data.kept, data.kept_passes, data.selection = sets.kept, sets.kept_passes, sets.selection

    gold = gold_labels(data)
    dropped = (data.examples["status"].to_numpy() == ExampleStatus.dropped.value) | ~gold["kept"].to_numpy()
    # One copy of each normalized text: repeats are excluded before the splits see them.
    hashes = duplicates.hashes_of(data.examples)
    earlier = duplicates.earlier_round_hashes(session, round_, hashes)
    summary = duplicates.collapse(data.examples["example_id"].to_numpy(), hashes, gold, dropped, earlier)
    split_input = _split_input(data, gold)
    return Prepared(data, gold, dropped, split_input, split_input.loc[~dropped], summary)


def make_splits(prepared: Prepared, policy: EffectivePolicy, seed: int) -> splits.SplitResult:
    """The dev/test/train assignment of the eligible examples under ``policy``."""
    definition = prepared.data.definition
    if definition.is_multi_label:
        # Per-label iterative stratification; examples without gold never reach it (excluded).
        try:
            return multilabel_splits.build_multilabel_splits(
                prepared.eligible,
                list(definition.labels),
                min_votes=policy.dev_test_min_votes,
                seed=seed,
                max_per_label=policy.max_per_cell,
            )
        except ValueError as exc:
            raise Invalid(str(exc)) from exc
    return splits.build_splits(
        prepared.eligible,
        list(prepared.data.definition.labels),
        min_votes=policy.dev_test_min_votes,
        seed=seed,
        dev_size=policy.max_per_cell,
        test_size=policy.max_per_cell,
        min_size=policy.min_per_cell,
        chance=policy.chance,
        no_prompt_eligible=policy.no_prompt_in_dev_test,
        max_dev_test_share=policy.max_dev_test_share,
    )
