"""Build a round: read it from the database, aggregate, measure agreement and human F1, make
chance-level splits, and record the build (every example's split and labels) with its report.

DynaSent §3.3-3.5 and §4.4-4.6 in order: gold labels (majority; MAD-TSC consolidation;
EthioEmo per-label 2-of-3), distributional labels for train, a model-based alternative
(Dawid-Skene or MACE) side by side, agreement, the human-performance estimate on dev and test,
then the splits. A build is deterministic for its seed.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from round_builder import aggregation, agreement, human, splits
from round_builder.report import PlotData, write_report
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
from services.text import normalized_edit_distance


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
        select(Example.id, Example.text, Example.prompt_id, Example.condition, Example.model_prediction,
               Example.target_label, Example.writer_id, Example.fooled, Example.status, Example.extras,
               Attempt.edit_distance, Attempt.confirmed, Example.origin)
        # Outer join: harvested examples (DynaSent §3.2) have no attempt.
        .outerjoin(Attempt, Example.attempt_id == Attempt.id)
        .where(Example.round_id == round_.id)
        .order_by(Example.id)
    ).all()
    examples = pd.DataFrame.from_records(
        [(r[0], r[1], r[2], r[3].value, r[4], r[5], r[6], bool(r[7]), r[8].value, r[9], r[10], r[11], r[12].value)
         for r in rows],
        columns=["example_id", "text", "prompt_id", "condition", "model_prediction", "target_label", "writer_id",
                 "fooled", "status", "extras", "edit_distance", "confirmed", "origin"])
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
    sources = sorted(s for s in session.scalars(
        select(Prompt.source).where(Prompt.round_id == round_.id, Prompt.source.is_not(None)).distinct()) if s)
    return RoundData(definition, examples, responses, attempts, prompts, sources)


def _finite(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        return None if math.isnan(value) else round(float(value), 4)
    return value


def _gold(data: RoundData) -> pd.DataFrame:
    """Per example: gold (str, tuple or None), gold_votes, kept (False: drop), reason."""
    definition, responses = data.definition, data.responses
    index = pd.Index(data.examples["example_id"], name="example_id")
    if definition.family is TaskFamily.target_dependent:
        frame = aggregation.consolidate_target_sentiment(
            responses, collapse=definition.label_collapse or {}, unknown_label=definition.unknown_label,
            order=definition.effective_validation_labels, min_responses=1)
        frame = frame.rename(columns={"label": "gold", "votes": "gold_votes"})
    elif definition.is_multi_label:
        frame = aggregation.multilabel_gold(responses, labels=definition.labels,
                                            min_votes=definition.agreement.gold_min_votes)
        # The gold set's weakest label decides whether it is strong enough for dev/test.
        votes = frame[[f"votes_{label}" for label in definition.labels]].to_numpy(dtype=float)
        in_gold = votes >= definition.agreement.gold_min_votes
        weakest = np.where(in_gold, votes, np.inf).min(axis=1)
        gold_votes = np.where(np.isfinite(weakest), weakest, 0).astype(int)
        frame = frame.assign(gold=frame["label"], gold_votes=gold_votes, kept=True, reason=None)
    else:
        frame = aggregation.majority_labels(responses, labels=definition.effective_validation_labels,
                                            min_votes=definition.agreement.gold_min_votes)
        frame = frame.rename(columns={"label": "gold", "votes": "gold_votes"}).assign(kept=True, reason=None)
    frame = frame.reindex(index)
    frame["kept"] = frame["kept"].fillna(False).astype(bool) if "kept" in frame else False
    frame.loc[frame["n_responses"].isna(), "reason"] = "no_counted_labels"
    return frame


def _distributional(data: RoundData) -> dict[int, dict[str, float]]:
    definition = data.definition
    if data.responses.empty:
        return {}
    if definition.is_multi_label:
        # Share of validators who chose each label (EthioEmo's labels are not exclusive).
        frame = aggregation.multilabel_gold(data.responses, labels=definition.labels, min_votes=1)
        shares = frame[[f"votes_{label}" for label in definition.labels]].div(frame["n_responses"], axis=0).round(4)
        shares.columns = list(definition.labels)
        return {int(e): row for e, row in zip(shares.index, shares.to_dict("records"), strict=True)}
    frame = aggregation.distributional_labels(data.responses, **aggregation.distribution_settings(definition))
    frame = frame.dropna(how="all").round(4)
    return {int(e): {k: float(v) for k, v in row.items()} for e, row in zip(frame.index, frame.to_dict("records"), strict=True)}


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
    return {int(e): [label] for e, label in frame["label"].items() if isinstance(label, str)}


def _split_input(data: RoundData, gold: pd.DataFrame) -> pd.DataFrame:
    definition = data.definition
    examples = data.examples.set_index("example_id")

    def prediction(value: Any) -> Any:
        if not value:
            return None
        return tuple(value) if definition.is_multi_label else value[0]

    # dtype=object: pandas would otherwise store missing gold labels as NaN in a str column.
    return pd.DataFrame({
        "example_id": examples.index,
        "gold": pd.Series([g if isinstance(g, str | tuple) else None for g in gold["gold"]], dtype=object),
        "gold_votes": gold["gold_votes"].fillna(0).astype(int).to_numpy(),
        "prompt_id": examples["prompt_id"].to_numpy(),
        "condition": examples["condition"].to_numpy(),
        "model_prediction": [prediction(v) for v in examples["model_prediction"]],
    })


def _conditions(data: RoundData, seed: int) -> tuple[dict[str, Any], PlotData]:
    """Edit distance, length and vocabulary of the prompt vs no-prompt conditions (Fig. 2a-c).

    No-prompt examples have no prompt; as a baseline their edit distance is measured to a
    prompt of the round drawn at random (seeded), so the two histograms are comparable."""
    rng = random.Random(seed)
    prompt_texts = list(data.prompts.values())
    summary: dict[str, Any] = {}
    plot = PlotData(edit_distance={}, length_words={}, vocabulary_growth={})
    for condition, frame in data.examples.groupby("condition"):
        texts = frame["text"].tolist()
        if condition == "prompt":
            distances = [float(d) for d in frame["edit_distance"] if d is not None and not pd.isna(d)]
        else:
            distances = []
            for text in texts:
                if prompt_texts:
                    other = rng.choice(prompt_texts)
                    distances.append(normalized_edit_distance(other, text))
        lengths = [len(t.split()) for t in texts]
        seen: set[str] = set()
        growth, tokens = [], 0
        for text in texts:
            for word in text.lower().split():
                tokens += 1
                seen.add(word.strip(".,!?;:\"'()"))
            growth.append((tokens, len(seen)))
        summary[str(condition)] = {
            "examples": len(texts),
            "edit_distance_mean": _finite(float(np.mean(distances))) if distances else None,
            "edit_distance_median": _finite(float(np.median(distances))) if distances else None,
            "length_words_mean": _finite(float(np.mean(lengths))) if lengths else None,
            "vocabulary": len(seen),
            "types_per_token": _finite(len(seen) / tokens) if tokens else None,
        }
        plot.edit_distance[str(condition)] = distances  # type: ignore[index]
        plot.length_words[str(condition)] = lengths  # type: ignore[index]
        plot.vocabulary_growth[str(condition)] = growth[:: max(1, len(growth) // 200)]  # type: ignore[index]
    return summary, plot


def build_round(session: Session, actor: User | None, round_: Round, config: BuildConfig,
                out_dir: Path | None = None) -> RoundBuild:
    """Build ``round_`` (it must be closed, or built before) and record the build."""
    if round_.status not in (RoundStatus.closed, RoundStatus.built):
        raise Conflict(f"round {round_.number} is {round_.status.value}; close it before building "
                       f"(POST /api/v1/rounds/{round_.id}/status {{\"status\": \"closed\"}})")
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
        ranking = agreement.worker_agreement(data.responses, labels=definition.effective_validation_labels,
                                             min_votes=definition.agreement.gold_min_votes)["agreement_rate"]
        data.responses = aggregation.keep_top_ranked(data.responses, ranking, n=definition.validations_per_example)

    gold = _gold(data)
    dropped = (data.examples["status"].to_numpy() == ExampleStatus.dropped.value) | ~gold["kept"].to_numpy()
    split_input = _split_input(data, gold)
    eligible = split_input.loc[~dropped]
    result = splits.build_splits(eligible, labels, min_votes=min_votes, seed=config.seed,
                                 dev_size=config.max_per_cell, test_size=config.max_per_cell, chance=chance)
    assignment = dict(result.assignment.items())
    flags = result.flags
    distributional = _distributional(data)
    model_based = _model_based(data, config.model_based)

    responses_by_example: dict[int, list[list[Any]]] = {}
    for example_id, worker, label in data.responses.itertuples(index=False):
        responses_by_example.setdefault(int(example_id), []).append(
            [int(worker), list(label) if isinstance(label, tuple) else [str(label)]])

    build = RoundBuild(round_id=round_.id, seed=config.seed, config=dict(config.__dict__),
                       created_by_id=actor.id if actor else None, report={})
    session.add(build)
    session.flush()
    rows = []
    reasons = gold["reason"].to_dict()
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
        rows.append({
            "build_id": build.id, "example_id": example_id, "split": split_name,
            "gold_label": (list(gold_value) if isinstance(gold_value, tuple)
                           else [gold_value] if isinstance(gold_value, str) else None),
            "gold_votes": int(split_input["gold_votes"].iat[position]) or None,
            "responses": len(responses_by_example.get(example_id, [])),
            "response_labels": responses_by_example.get(example_id, []),
            "distributional_label": distributional.get(example_id),
            "model_based_label": model_based.get(example_id),
            "flags": example_flags,
        })
    for start in range(0, len(rows), 5000):
        session.execute(insert(BuiltExample), rows[start:start + 5000])

    report, plot = _report(round_, data, gold, result, config, split_input, assignment, dropped, chance)
    build.report = report
    round_.status = RoundStatus.built
    round_.built_at = utcnow()
    audit.record(session, actor, "round.build", "round", round_.id, build_id=build.id, seed=config.seed)
    session.flush()
    if out_dir is not None:
        written = write_report(report, plot, out_dir)
        build.report = {**report, "files": [p.name for p in written]}
    return build


def _report(round_: Round, data: RoundData, gold: pd.DataFrame, result: splits.SplitResult, config: BuildConfig,
            split_input: pd.DataFrame, assignment: dict[int, str], dropped: np.ndarray,
            chance: bool) -> tuple[dict[str, Any], PlotData]:
    definition = data.definition
    vlabels = definition.effective_validation_labels
    split_report = result.report
    ids = {name: [e for e, s in assignment.items() if s == name] for name in ("train", "dev", "test")}

    # DynaSent Table 4/7: distributional train, majority train/dev/test by gold label.
    counts_by_gold = split_report.counts_by_gold
    dist_train = Counter()
    train_ids = set(ids["train"])
    gold_of = dict(zip(split_input["example_id"], split_input["gold"], strict=True))
    for example_id in train_ids:
        g = gold_of.get(example_id)
        dist_train[("+".join(g) if isinstance(g, tuple) else g) if g is not None else "no majority"] += 1
    rows = {}
    for label, row in counts_by_gold.iterrows():
        name = str(label)
        rows[name] = {"dist_train": dist_train.get(name, int(row.get("train", 0))) if name != "Total" else None,
                      "train": int(row.get("train", 0)), "dev": int(row.get("dev", 0)), "test": int(row.get("test", 0))}
    total = rows.pop("Total", {"train": len(ids["train"]), "dev": len(ids["dev"]), "test": len(ids["test"])})
    total["dist_train"] = len(ids["train"])
    excluded = Counter(str(r) for r, d in zip(gold["reason"], dropped, strict=True) if d)
    excluded.update({k: v for k, v in split_report.excluded.items() if v})

    responses = data.responses
    report_agreement: dict[str, Any] = {}
    if not responses.empty:
        if definition.is_multi_label:
            ml = agreement.multilabel_agreement(responses, labels=definition.labels)
            report_agreement = {"mean_fleiss_kappa": _finite(ml.mean_fleiss), "mean_randolph_kappa": _finite(ml.mean_randolph),
                                "mean_krippendorff_alpha": _finite(ml.mean_alpha), "mean_jaccard": _finite(ml.mean_jaccard)}
        else:
            n = definition.validations_per_example
            report_agreement = {
                "fleiss_kappa": _finite(_safe(lambda: agreement.fleiss_kappa(responses, labels=vlabels, n_raters=n))),
                "krippendorff_alpha": _finite(_safe(lambda: agreement.krippendorff_alpha(responses, labels=vlabels))),
                "randolph_kappa": _finite(_safe(lambda: agreement.randolph_kappa(responses, labels=vlabels, n_raters=n))),
                "mean_pairwise_cohen_kappa": _finite(_safe(lambda: float(agreement.slot_cohen_kappas(
                    responses, labels=vlabels, random_state=config.seed)["kappa"].mean()))),
            }
            for name in ("dev", "test"):
                subset = responses[responses["example_id"].isin(ids[name])]
                if not subset.empty:
                    report_agreement[f"fleiss_kappa_{name}"] = _finite(_safe(
                        lambda subset=subset: agreement.fleiss_kappa(subset, labels=vlabels, n_raters=n)))
            if definition.family is TaskFamily.target_dependent:
                report_agreement["madtsc_kappas"] = {k: _finite(v) for k, v in _safe(lambda: agreement.target_sentiment_kappas(
                    responses, collapse=definition.label_collapse or {}, unknown_label=definition.unknown_label,
                    order=vlabels, n_raters=n), {}).items()}

    human_f1: dict[str, Any] = {}
    if not definition.is_multi_label and not responses.empty:
        labels = list(definition.labels)
        scored, response_labels = responses, vlabels
        if definition.family is TaskFamily.target_dependent:
            # MAD-TSC: annotators are scored on the 3-class scale the gold label uses.
            scored = aggregation.collapse_responses(responses, collapse=definition.label_collapse or {},
                                                    unknown_label=definition.unknown_label)
            response_labels = labels + ([definition.unknown_label] if definition.unknown_label else [])
        gold_series = pd.Series({e: g for e, g in gold_of.items() if isinstance(g, str) and g in labels})
        for name in ("dev", "test"):
            if ids[name]:
                scores = human.human_performance(scored, gold_series, labels=response_labels, classes=labels,
                                                 examples=ids[name], random_state=config.seed).scores
                human_f1[name] = {str(k): {m: _finite(float(v)) for m, v in row.items()} for k, row in scores.iterrows()}

    attempts = data.attempts
    examples = data.examples
    validated_fooling = 0
    for example_id, target, fooled in zip(examples["example_id"], examples["target_label"], examples["fooled"], strict=True):
        g = gold_of.get(example_id)
        if fooled and g is not None and (list(g) if isinstance(g, tuple) else [g]) == list(target):
            validated_fooling += 1
    fooling = {
        "attempts": len(attempts),
        "fooled_attempts": int(attempts["fooled"].fillna(False).sum()) if len(attempts) else 0,
        "attempt_fooling_rate": _finite(float(attempts["fooled"].fillna(False).mean())) if len(attempts) else None,
        "examples": len(examples),
        "harvested_examples": int((examples["origin"] == "harvested").sum()),
        "fooled_examples": int(examples["fooled"].sum()),
        "confirmed": int((examples["confirmed"] == True).sum()),  # noqa: E712
        "validated_fooling": validated_fooling,
        "validated_fooling_rate": _finite(validated_fooling / len(examples)) if len(examples) else None,
    }
    conditions, plot = _conditions(data, config.seed)

    workers: dict[str, Any] = {"writers": int(examples["writer_id"].nunique()),
                               "validators": int(responses["worker_id"].nunique()) if not responses.empty else 0}
    if not responses.empty and not definition.is_multi_label:
        rates = agreement.worker_agreement(responses, labels=vlabels, min_votes=definition.agreement.gold_min_votes)
        plot.worker_agreement = [float(r) for r in rates["agreement_rate"].dropna()]
        workers["never_disagreed"] = int((rates["agreement_rate"] == 1.0).sum())
        workers["mean_agreement_rate"] = _finite(float(rates["agreement_rate"].mean()))
        workers["labels_per_validator_median"] = _finite(float(rates["n_labels"].median()))
        labels_seen = [g for g in split_input["gold"] if isinstance(g, str)]
        preds = [p for p, g in zip(split_input["model_prediction"], split_input["gold"], strict=True) if isinstance(g, str)]
        rows_labels = sorted(set(labels_seen), key=lambda v: vlabels.index(v) if v in vlabels else 99)
        matrix = [[sum(1 for g, p in zip(labels_seen, preds, strict=True) if g == r and p == c) for c in definition.labels]
                  for r in rows_labels]
        plot.confusion = {"labels": list(definition.labels), "rows": rows_labels, "matrix": matrix}

    extra: dict[str, Any] = {}
    if definition.family is TaskFamily.intended_sarcasm and not responses.empty:
        intended = {e: (x or {}).get("intended_label") for e, x in zip(examples["example_id"], examples["extras"], strict=True)}
        intended = {e: v for e, v in intended.items() if v}
        if intended:
            comparison = agreement.intended_vs_perceived(responses, pd.Series(intended), labels=vlabels,
                                                         positive=definition.labels[0])
            extra = {k: (_finite(v) if not isinstance(v, pd.DataFrame) else v.to_dict())
                     for k, v in comparison.__dict__.items()}

    assessment = {name: {"examples": len(ids[name]),
                         "model_macro_f1": _finite(split_report.model_metrics.get(name, {}).get("macro_f1")),
                         "model_accuracy": _finite(split_report.model_metrics.get(name, {}).get("accuracy"))}
                  for name in ("dev", "test")}
    report = {
        "task": definition.name, "family": definition.family.value, "round": round_.number, "seed": config.seed,
        "built_at": dt.datetime.now(dt.UTC).isoformat(), "config": dict(config.__dict__),
        "counts": {"labels": list(definition.labels), "rows": rows, "total": total, "excluded": dict(excluded)},
        "splits": {"assessment": assessment, "chance": chance, "cell_count": split_report.dev_per_cell,
                   "cell_bound": split_report.upper_bound_c, "chance_macro_f1": _finite(split_report.chance_macro_f1),
                   "at_chance": split_report.at_chance, "notes": list(split_report.notes)},
        "agreement": report_agreement,
        "human_f1": human_f1,
        "fooling": fooling,
        "conditions": conditions,
        "workers": workers,
        "intended_vs_perceived": extra or None,
        "datasheet": {
            "title": definition.title, "task": definition.name, "family": definition.family.value,
            "language": definition.language, "domain": definition.domain, "licence": definition.licence or "not set",
            "round": round_.number, "collected": {"opened": _iso(round_.opened_at), "closed": _iso(round_.closed_at)},
            "prompt_sources": data.prompt_sources or ["prompts imported without a source"],
            "examples": len(examples), "validations": len(responses),
            "validations_per_example": definition.validations_per_example,
            "gold_rule": f"{definition.agreement.gold_min_votes} of {definition.validations_per_example}",
            "dev_test_rule": f"gold with at least {split_report.min_votes} votes; prompt condition; unique prompts; "
                             + ("the round's model at chance" if chance else "balanced over gold classes"),
            "agreement": report_agreement, "human_f1_macro": {k: v.get("macro avg", {}).get("f1") for k, v in human_f1.items()},
            "model_f1_macro": {k: v["model_macro_f1"] for k, v in assessment.items()},
        },
    }
    return report, plot


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def _safe(compute: Any, default: Any = float("nan")) -> Any:
    """A statistic that cannot be computed on this round (e.g. unequal rater counts) is
    reported as missing rather than failing the whole build."""
    try:
        return compute()
    except (ValueError, ZeroDivisionError):
        return default
