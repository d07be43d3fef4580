"""Build a round: read it from the database, aggregate, measure agreement and human F1, make
chance-level splits, and record the build (every example's split and labels) with its report.

DynaSent §3.3-3.5 and §4.4-4.6 in order: gold labels (majority; MAD-TSC consolidation;
EthioEmo per-label 2-of-3), distributional labels for train, a model-based alternative
(Dawid-Skene or MACE) side by side, agreement, the human-performance estimate on dev and test,
then the splits. A build is deterministic for its seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import insert
from sqlalchemy.orm import Session

from rounds.build import aggregation, splits, statistics
from rounds.build.build_settings import BuildSettings, EffectivePolicy, resolve_policy
from rounds.build.prepare import make_splits, prepare
from rounds.build.preview import nothing_builds, relaxations_for
from rounds.build.report import write_report
from rounds.build.report_assembly import assemble_report
from rounds.build.report_schema import RoundReport
from rounds.build.round_data import BuildOutcome, Prepared, RoundData
from services.db.models import BuiltExample, Round, RoundBuild, RoundStatus, User, utcnow
from services.domain import audit
from services.domain.labels import exclusive_gold

# EM iterations for Dawid-Skene: crowd-kit's 100 take ~40 s on a million labels on one core;
# the labels stop changing long before 30 (bench/round_builder.py measures both).
DAWID_SKENE_ITERATIONS = 30


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
    """Per example with responses, its model-based label (a list of one label, or a label set):
    crowd-kit's Dawid-Skene or MACE on the responses gold reads; multi-label per label, with
    the task's exclusive labels kept exclusive as in gold. No label (a tie): left out."""
    definition = data.definition
    if method is None or data.responses.empty:
        return {}
    if method not in ("dawid_skene", "mace"):
        raise ValueError(f"unknown model-based aggregation {method!r}; use dawid_skene, mace or null")
    if definition.is_multi_label:
        sets = aggregation.multilabel_model_labels(
            data.responses,
            labels=definition.labels,
            method="mace" if method == "mace" else "dawid_skene",
            n_iter=DAWID_SKENE_ITERATIONS if method == "dawid_skene" else 50,
        )["label"]
        chosen = {
            int(e): exclusive_gold(definition, list(v))
            for e, v in zip(sets.index, sets, strict=True)
            if isinstance(v, tuple)
        }
        return {e: value for e, value in chosen.items() if value}
    labels = definition.effective_validation_labels
    if method == "dawid_skene":
        frame = aggregation.dawid_skene_labels(data.responses, labels=labels, n_iter=DAWID_SKENE_ITERATIONS)
    elif method == "mace":
        frame = aggregation.mace_labels(data.responses, labels=labels)
    else:
        raise ValueError(f"unknown model-based aggregation {method!r}; use dawid_skene, mace or null")
    return {int(e): [label] for e, label in zip(frame.index, frame["label"], strict=True) if isinstance(label, str)}


def build_round(
    session: Session, actor: User | None, round_: Round, settings: BuildSettings, out_dir: Path | None = None
) -> RoundBuild:
    """Build ``round_`` (it must be closed, or built before) and record the build. A policy the
    round cannot meet is refused with what is short and the relaxations' previews."""
    prepared = prepare(session, round_)
    data = prepared.data
    policy = resolve_policy(settings, data.definition, data.examples)
    result = _split_or_refuse(prepared, settings, policy, round_.number)
    assignment = {int(e): str(split) for e, split in zip(result.assignment.index, result.assignment, strict=True)}
    model_based = _model_based(data, settings.model_based)

    build = RoundBuild(
        round_id=round_.id,
        seed=settings.seed,
        config={**settings.model_dump(), "effective": policy.model_dump()},
        created_by_id=actor.id if actor else None,
        report={},
    )
    session.add(build)
    session.flush()
    rows = _built_example_rows(build.id, prepared, assignment, result.flags, model_based)
    for start in range(0, len(rows), 5000):
        session.execute(insert(BuiltExample), rows[start : start + 5000])

    outcome = BuildOutcome(
        round_,
        data,
        settings,
        prepared.gold,
        prepared.split_input,
        result,
        assignment,
        prepared.dropped,
        policy.chance,
        policy,
        model_based,
    )
    report, plot = assemble_report(outcome)
    _add_sources(report, prepared)
    build.report = report.to_dict()
    round_.status = RoundStatus.built
    round_.built_at = utcnow()
    audit.record(session, actor, "round.build", "round", round_.id, build_id=build.id, seed=settings.seed)
    session.flush()
    if out_dir is not None:
        written = write_report(report.to_dict(), plot, out_dir)
        report.files = [p.name for p in written]
        build.report = report.to_dict()
    return build


def _split_or_refuse(
    prepared: Prepared, settings: BuildSettings, policy: EffectivePolicy, number: int
) -> splits.SplitResult:
    """The round's splits under ``policy``; a policy the round cannot meet is refused with the
    relaxations that build (or what to do when none does)."""
    try:
        return make_splits(prepared, policy, settings.seed)
    except splits.SplitError as exc:
        options = relaxations_for(prepared, settings, policy, refused_by=exc.details.get("constraint"))
        offered = "; ".join(o.summary() for o in options if o.feasible)
        raise splits.SplitError(
            f"the {policy.name} policy cannot be met: {exc.message}. "
            + (f"Relaxations that build: {offered}" if offered else nothing_builds(number)),
            **exc.details,
            policy=policy.model_dump(),
            relaxations=[o.to_dict() for o in options],
        ) from None


def _recorded_responses(data: RoundData) -> dict[int, list[list[Any]]]:
    """Per example, every pass's kept responses as recorded (and exported): [worker, labels];
    the statistics read data.responses."""
    kept = data.kept if data.kept is not None else data.responses
    responses_by_example: dict[int, list[list[Any]]] = {}
    for example_id, worker, label in kept.itertuples(index=False):
        responses_by_example.setdefault(int(example_id), []).append(
            [int(worker), list(label) if isinstance(label, tuple) else [str(label)]]
        )
    return responses_by_example


def _built_example_rows(
    build_id: int,
    prepared: Prepared,
    assignment: dict[int, str],
    flags: pd.DataFrame,
    model_based: dict[int, list[str]],
) -> list[dict[str, Any]]:
    """One ``BuiltExample`` row per example of the round: its split (or why it is excluded),
    gold, responses and labels."""
    split_input, dropped = prepared.split_input, prepared.dropped
    distributional = _distributional(prepared.data)
    responses_by_example = _recorded_responses(prepared.data)
    reasons = prepared.gold["reason"].to_dict()
    gold_votes = split_input["gold_votes"].to_numpy()
    rows = []
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
                "build_id": build_id,
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
    return rows


def _add_sources(report: RoundReport, prepared: Prepared) -> None:
    """What the build did with repeated texts and, for a round with imported examples, where its
    gold labels came from, into the report."""
    if prepared.duplicates is not None:
        report.duplicates = prepared.duplicates
    source = statistics.gold_source(prepared.data, prepared.gold)
    if source is not None:
        sheet = report.datasheet
        sheet.gold_source = source
        if source.imported_gold:
            sheet.gold_rule = (
                f"{sheet.gold_rule} for gold computed here; {source.imported_gold} gold label(s) "
                "taken from the imported dataset"
            )
