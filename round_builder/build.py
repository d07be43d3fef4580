"""Build a round: read it from the database, aggregate, measure agreement and human F1, make
chance-level splits, and record the build (every example's split and labels) with its report.

DynaSent §3.3-3.5 and §4.4-4.6 in order: gold labels (majority; MAD-TSC consolidation;
EthioEmo per-label 2-of-3), distributional labels for train, a model-based alternative
(Dawid-Skene or MACE) side by side, agreement, the human-performance estimate on dev and test,
then the splits. A build is deterministic for its seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from round_builder import aggregation, agreement, splits
from round_builder.report import write_report
from round_builder.report_assembly import BuildOutcome, assemble_report
from round_builder.table import responses_frame
from services.db.models import (
    Assignment,
    Attempt,
    AttemptStatus,
    BuiltExample,
    Example,
    ExampleStatus,
    Prompt,
    Round,
    RoundBuild,
    RoundStatus,
    User,
    Validation,
    utcnow,
)
from services.domain import audit
from services.domain.tasks import definition_of
from services.errors import Conflict
from services.taskdef import TaskDefinition, TaskFamily

# EM iterations for Dawid-Skene: crowd-kit's 100 take ~40 s on a million labels on one core;
# the labels stop changing long before 30 (bench/round_builder.py measures both).
DAWID_SKENE_ITERATIONS = 30


@dataclass
class BuildConfig:
    seed: int = 0
    dev_test_min_votes: int | None = None  # default: the task's agreement.dev_test_min_votes
    chance: bool | None = None  # default: True for single-label families, False for multi-label
    max_per_cell: int | None = None
    model_based: str | None = "dawid_skene"  # dawid_skene | mace | None


@dataclass
class RoundData:
    definition: TaskDefinition
    examples: pd.DataFrame  # one row per example
    responses: pd.DataFrame  # the long table of counted responses
    attempts: pd.DataFrame  # one row per scored attempt
    prompts: dict[int, str]
    prompt_sources: list[str]


def counted_responses(session: Session, round_: Round, *, multi_label: bool) -> pd.DataFrame:
    """The round's counted labels as the long response table (round_builder.table)."""
    return responses_frame(
        session.execute(
            select(Validation.example_id, Validation.validator_id, Validation.label)
            .join(Example, Validation.example_id == Example.id)
            .where(Example.round_id == round_.id, Validation.counted.is_(True))
            .order_by(Validation.id)
        ).all(),
        multi_label=multi_label,
    )


def load_round(session: Session, round_: Round) -> RoundData:
    definition = definition_of(round_.task)
    multi = definition.is_multi_label
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
            Example.source_metadata,
        )
        # Outer join: harvested examples (DynaSent §3.2) have no attempt.
        .outerjoin(Attempt, Example.attempt_id == Attempt.id)
        .where(Example.round_id == round_.id)
        .order_by(Example.id)
    ).all()
    examples = pd.DataFrame.from_records(
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
                r[13],
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
            "source_metadata",
        ],
    )
    responses = counted_responses(session, round_, multi_label=multi)
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
    return RoundData(definition, examples, responses, attempts, prompts, sources)


def _gold(data: RoundData) -> pd.DataFrame:
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
        frame = aggregation.multilabel_gold(
            responses, labels=definition.labels, min_votes=definition.agreement.gold_min_votes
        )
        # The gold set's weakest label decides whether it is strong enough for dev/test.
        votes = frame[[f"votes_{label}" for label in definition.labels]].to_numpy(dtype=float)
        in_gold = votes >= definition.agreement.gold_min_votes
        weakest = np.where(in_gold, votes, np.inf).min(axis=1)
        gold_votes = np.where(np.isfinite(weakest), weakest, 0).astype(int)
        frame = frame.assign(gold=frame["label"], gold_votes=gold_votes, kept=True, reason=None)
    else:
        frame = aggregation.majority_labels(
            responses, labels=definition.effective_validation_labels, min_votes=definition.agreement.gold_min_votes
        )
        frame = frame.rename(columns={"label": "gold", "votes": "gold_votes"}).assign(kept=True, reason=None)
    frame = frame.reindex(index)
    frame["kept"] = frame["kept"].fillna(False).astype(bool) if "kept" in frame else False
    frame.loc[frame["n_responses"].isna(), "reason"] = "no_counted_labels"
    # Imported gold (modelling/round_imports.py, docs/round_builder.md "Imports"): a labelled
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


def gold_source(data: RoundData, gold: pd.DataFrame) -> dict[str, Any] | None:
    """Where the build's gold labels came from, when any came from an import (None otherwise)."""
    metas = dict(zip(data.examples["example_id"].astype(int), data.examples["source_metadata"], strict=True))
    imports = {
        (meta["import"]["kind"], meta["import"]["name"], meta["import"]["sha256"], meta["import"].get("source"))
        for meta in metas.values()
        if isinstance(meta, dict) and isinstance(meta.get("import"), dict)
    }
    if not imports:
        return None
    has_gold = gold["gold"].map(lambda g: isinstance(g, str | tuple))
    answered = set(data.responses["example_id"].astype(int)) if not data.responses.empty else set()
    from_import = sum(
        1
        for e, meta in metas.items()
        if isinstance(meta, dict) and meta.get("gold") and e not in answered and bool(has_gold.get(e, False))
    )
    with_votes = sum(
        1 for meta in metas.values() if isinstance(meta, dict) and meta.get("gold") and meta.get("gold_votes")
    )
    kept_splits = sum(1 for meta in metas.values() if isinstance(meta, dict) and meta.get("split"))
    return {
        "imported_gold": from_import,
        "imported_gold_with_votes": with_votes,
        "imported_with_original_split": kept_splits,
        "from_responses": int(has_gold.sum()) - from_import,
        "imports": [
            {"kind": kind, "name": name, "sha256": sha256, **({"source": source} if source else {})}
            for kind, name, sha256, source in sorted(imports, key=str)
        ],
        "statement": (
            f"{from_import} gold label(s) were taken from the imported dataset as is, not from validation "
            "in dynaloop; "
            + (
                f"{with_votes} carry the dataset's own vote counts, the rest count as 1 vote"
                if from_import
                else "every gold label was computed here from the imported responses"
            )
            + "."
        ),
    }


def _distributional(data: RoundData) -> dict[int, dict[str, float]]:
    definition = data.definition
    if data.responses.empty:
        return {}
    if definition.is_multi_label:
        # Share of validators who chose each label (EthioEmo's labels are not exclusive).
        frame = aggregation.multilabel_gold(data.responses, labels=definition.labels, min_votes=1)
        shares = frame[[f"votes_{label}" for label in definition.labels]].div(frame["n_responses"], axis=0).round(4)
        shares.columns = list(definition.labels)
        return _label_shares(shares)
    frame = aggregation.distributional_labels(data.responses, **aggregation.distribution_settings(definition))
    return _label_shares(frame.dropna(how="all").round(4))


def _label_shares(frame: pd.DataFrame) -> dict[int, dict[str, float]]:
    """Per example (the frame's index) its row as label -> share (the columns are the labels)."""
    return {
        int(e): {str(label): float(share) for label, share in row.items()}
        for e, row in zip(frame.index, frame.to_dict("records"), strict=True)
    }


def _model_based(data: RoundData, method: str | None) -> dict[int, list[str]]:
    definition = data.definition
    if method is None or definition.is_multi_label or data.responses.empty:
        return {}
    labels = definition.effective_validation_labels
    if method == "dawid_skene":
        frame = aggregation.dawid_skene_labels(data.responses, labels=labels, n_iter=DAWID_SKENE_ITERATIONS)
    elif method == "mace":
        frame = aggregation.mace_labels(data.responses, labels=labels)
    else:
        raise ValueError(f"unknown model-based aggregation {method!r}; use dawid_skene, mace or null")
    return {int(e): [label] for e, label in zip(frame.index, frame["label"], strict=True) if isinstance(label, str)}


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


def build_round(
    session: Session, actor: User | None, round_: Round, config: BuildConfig, out_dir: Path | None = None
) -> RoundBuild:
    """Build ``round_`` (it must be closed, or built before) and record the build."""
    if round_.status not in (RoundStatus.closed, RoundStatus.built):
        raise Conflict(
            f"round {round_.number} is {round_.status.value}; close it before building "
            f'(POST /api/v1/rounds/{round_.id}/status {{"status": "closed"}})'
        )
    data = load_round(session, round_)
    definition = data.definition
    if data.examples.empty:
        raise Conflict(f"round {round_.number} has no examples to build")
    labels = list(definition.labels)
    multi = definition.is_multi_label
    min_votes = config.dev_test_min_votes or definition.agreement.dev_test_min_votes
    chance = (not multi) if config.chance is None else config.chance

    # Keep only the top-ranked validators' labels where an example has more than enough.
    if not data.responses.empty and not multi:
        ranking = agreement.worker_agreement(
            data.responses, labels=definition.effective_validation_labels, min_votes=definition.agreement.gold_min_votes
        )["agreement_rate"]
        data.responses = aggregation.keep_top_ranked(data.responses, ranking, n=definition.validations_per_example)

    gold = _gold(data)
    dropped = (data.examples["status"].to_numpy() == ExampleStatus.dropped.value) | ~gold["kept"].to_numpy()
    split_input = _split_input(data, gold)
    eligible = split_input.loc[~dropped]
    result = splits.build_splits(
        eligible,
        labels,
        min_votes=min_votes,
        seed=config.seed,
        dev_size=config.max_per_cell,
        test_size=config.max_per_cell,
        chance=chance,
    )
    assignment = {int(e): str(split) for e, split in zip(result.assignment.index, result.assignment, strict=True)}
    flags = result.flags
    distributional = _distributional(data)
    model_based = _model_based(data, config.model_based)

    responses_by_example: dict[int, list[list[Any]]] = {}
    for example_id, worker, label in data.responses.itertuples(index=False):
        responses_by_example.setdefault(int(example_id), []).append(
            [int(worker), list(label) if isinstance(label, tuple) else [str(label)]]
        )

    build = RoundBuild(
        round_id=round_.id,
        seed=config.seed,
        config=dict(config.__dict__),
        created_by_id=actor.id if actor else None,
        report={},
    )
    session.add(build)
    session.flush()
    rows = []
    reasons = gold["reason"].to_dict()
    gold_votes = split_input["gold_votes"].to_numpy()
    for position, example_id in enumerate(split_input["example_id"]):
        example_id = int(example_id)
        if dropped[position]:
            split_name = "excluded"
            example_flags = [str(reasons.get(example_id) or "dropped_in_validation")]
        else:
            split_name = assignment[example_id]
            row_flags = flags.loc[example_id]
            example_flags = [name for name in ("no_prompt", "prompt_shared_with_assessment") if bool(row_flags[name])]
        gold_value = split_input["gold"].iat[position]
        rows.append(
            {
                "build_id": build.id,
                "example_id": example_id,
                "split": split_name,
                "gold_label": (
                    list(gold_value)
                    if isinstance(gold_value, tuple)
                    else [gold_value]
                    if isinstance(gold_value, str)
                    else None
                ),
                "gold_votes": int(gold_votes[position]) or None,
                "responses": len(responses_by_example.get(example_id, [])),
                "response_labels": responses_by_example.get(example_id, []),
                "distributional_label": distributional.get(example_id),
                "model_based_label": model_based.get(example_id),
                "flags": example_flags,
            }
        )
    for start in range(0, len(rows), 5000):
        session.execute(insert(BuiltExample), rows[start : start + 5000])

    assembled, plot = assemble_report(
        BuildOutcome(round_, data, config, gold, split_input, result, assignment, dropped, chance)
    )
    report = assembled.to_dict()
    source = gold_source(data, gold)
    if source is not None:
        report["datasheet"]["gold_source"] = source
        if source["imported_gold"]:
            sheet = report["datasheet"]
            sheet["gold_rule"] = (
                f"{sheet['gold_rule']} for gold computed here; {source['imported_gold']} gold label(s) "
                "taken from the imported dataset"
            )
    build.report = report
    round_.status = RoundStatus.built
    round_.built_at = utcnow()
    audit.record(session, actor, "round.build", "round", round_.id, build_id=build.id, seed=config.seed)
    session.flush()
    if out_dir is not None:
        written = write_report(report, plot, out_dir)
        build.report = {**report, "files": [p.name for p in written]}
    return build
