"""The statistics of a build's report, each computed from the build's outcome
(:class:`rounds.build.round_data.BuildOutcome`) as one report section: counts per label and
split (DynaSent Table 4/7), the model on dev and test, agreement, the human F1 estimate
(DynaSent §3.5), fooling, the prompt vs no-prompt conditions (Fig. 2a-c), the workers (Fig. 6),
iSarcasm's intended vs perceived labels, the model-based labels beside gold and where imported
gold came from. A statistic a round cannot support is reported as missing, never fails the build.
(The multi-label section's statistics are rounds.build.multilabel_report's.)
"""

from __future__ import annotations

import math
import random
import warnings
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import chi2_contingency, fisher_exact
from sklearn.exceptions import UndefinedMetricWarning
from sklearn.metrics import cohen_kappa_score

from rounds.build import aggregation, agreement, human, multilabel_report, response_sets
from rounds.build.report import PlotData
from rounds.build.report_schema import (
    AgreementCounts,
    AssessmentSplit,
    ConditionSummary,
    CountRow,
    GoldSource,
    HumanF1,
    ImportedFile,
    IntendedVsPerceived,
    ReportAgreement,
    ReportCounts,
    ReportFooling,
    ReportModelBased,
    ReportSplits,
    ReportWorkerGold,
    ReportWorkers,
)
from rounds.build.round_data import BuildOutcome, RoundData
from services.taskdef import TaskFamily
from services.text import normalized_edit_distance


def split_counts(outcome: BuildOutcome) -> ReportCounts:
    """DynaSent Table 4/7: distributional train, majority train/dev/test by gold label."""
    split_report = outcome.result.report
    # Distributional labels come from responses (rounds.build.pipeline._distributional): a train
    # example with none (imported gold) has none, and the column counts only those that do.
    answered = answered_examples(outcome)
    dist_train: Counter[str] = Counter()
    for example_id in set(outcome.ids["train"]) & answered:
        gold = outcome.gold_of.get(example_id)
        dist_train[("+".join(gold) if isinstance(gold, tuple) else gold) if gold is not None else "no majority"] += 1
    # None: train examples, none with a distributional label (an empty train counts 0).
    has_dist = bool(set(outcome.ids["train"]) & answered) or not outcome.ids["train"]
    rows: dict[str, CountRow] = {}
    total = CountRow(
        dist_train=None, train=len(outcome.ids["train"]), dev=len(outcome.ids["dev"]), test=len(outcome.ids["test"])
    )
    for label, row in split_report.counts_by_gold.iterrows():
        name = str(label)
        counted = CountRow(
            dist_train=None, train=int(row.get("train", 0)), dev=int(row.get("dev", 0)), test=int(row.get("test", 0))
        )
        if name == "Total":
            total = counted
        else:
            # Multi-label: per label, the examples whose gold holds it (an example counts once
            # per gold label), so the distributional column is the train column.
            multi = outcome.data.definition.is_multi_label
            if not has_dist:
                counted.dist_train = None  # no train example has a distributional label
            elif multi:
                counted.dist_train = counted.train
            else:
                counted.dist_train = dist_train.get(name, 0)
            rows[name] = counted
    total.dist_train = sum(dist_train.values()) if has_dist else None
    excluded = Counter(
        str(reason) for reason, dropped in zip(outcome.gold["reason"], outcome.dropped, strict=True) if dropped
    )
    excluded.update({reason: n for reason, n in split_report.excluded.items() if n})
    return ReportCounts(
        labels=list(outcome.data.definition.labels), rows=rows, total=total, excluded=dict(excluded)
    )


def split_summary(outcome: BuildOutcome) -> ReportSplits:
    split_report = outcome.result.report
    assessment = {
        name: AssessmentSplit(
            examples=len(outcome.ids[name]),
            model_macro_f1=_finite(split_report.model_metrics.get(name, {}).get("macro_f1")),
            model_accuracy=_finite(split_report.model_metrics.get(name, {}).get("accuracy")),
        )
        for name in ("dev", "test")
    }
    return ReportSplits(
        assessment=assessment,
        chance=outcome.chance,
        cell_count=split_report.dev_per_cell,
        cell_bound=split_report.upper_bound_c,
        chance_macro_f1=_finite(split_report.chance_macro_f1),
        at_chance=split_report.at_chance,
        notes=list(split_report.notes),
        policy=outcome.policy,
        cells=_cells(outcome),
        independence=_independence(outcome),
        balance=dict(split_report.balance),
        model_predictions=with_prediction(outcome),
    )


def with_prediction(outcome: BuildOutcome) -> int:
    """Examples of the round that carry a model prediction (none: no model in the loop)."""
    return int(sum(1 for p in outcome.data.examples["model_prediction"] if p))


def answered_examples(outcome: BuildOutcome) -> set[int]:
    """Examples with counted responses here (imported gold has none)."""
    responses = outcome.data.responses
    return set(responses["example_id"].astype(int)) if not responses.empty else set()


def _cells(outcome: BuildOutcome) -> list[dict[str, Any]]:
    """Dev and test examples per (gold, predicted) pair of task labels (single-label) or per
    gold class (multi-label), as they are."""
    labels = list(outcome.data.definition.labels)
    frame = outcome.split_input.assign(split=outcome.split_input["example_id"].map(outcome.assignment))
    if outcome.data.definition.is_multi_label or not with_prediction(outcome):
        # Per gold class: multi-label, or no model in the loop (every "predicted" cell would be 0).
        counts: Counter[tuple[str, str]] = Counter(
            ("+".join(g) if isinstance(g, tuple) else str(g), s)
            for g, s in zip(frame["gold"], frame["split"], strict=True)
            if s in ("dev", "test")
        )
        classes = sorted({g for g, _ in counts})
        return [{"gold": g, "dev": counts[(g, "dev")], "test": counts[(g, "test")]} for g in classes]
    pairs: Counter[tuple[Any, Any, str]] = Counter(
        zip(frame["gold"], frame["model_prediction"], frame["split"], strict=True)
    )
    return [
        {"gold": g, "predicted": p, "dev": pairs[(g, p, "dev")], "test": pairs[(g, p, "test")]}
        for g in labels
        for p in labels
    ]


# Below this many expected examples in a cell the chi-squared approximation is not trusted
# (the usual rule of thumb), and the report says so.
_MIN_EXPECTED = 5


def _independence(outcome: BuildOutcome) -> dict[str, dict[str, Any]]:
    """Per split: is the model's prediction independent of gold? Fisher's exact test on a 2×2
    table, else scipy's chi-squared test of independence; not applicable (and said so) when
    the table has fewer than two gold classes or two predicted labels present."""
    if outcome.data.definition.is_multi_label:
        return {}
    labels = list(outcome.data.definition.labels)
    out: dict[str, dict[str, Any]] = {}
    for name in ("dev", "test"):
        ids = set(outcome.ids[name])
        rows = outcome.split_input[outcome.split_input["example_id"].isin(ids)]
        table = pd.crosstab(
            pd.Categorical(rows["gold"], categories=labels), pd.Categorical(rows["model_prediction"], categories=labels)
        ).to_numpy()
        table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]
        n = int(table.sum())
        if n == 0:
            continue
        if min(table.shape) < 2:
            out[name] = {
                "test": None,
                "n": n,
                "statistic": None,
                "p_value": None,
                "dof": None,
                "note": "not applicable: fewer than two gold classes or two predicted labels present",
            }
        elif table.shape == (2, 2):
            odds, p_value = fisher_exact(table)
            out[name] = {
                "test": "fisher_exact",
                "n": n,
                "statistic": _finite(float(odds)) if np.isfinite(odds) else None,
                "p_value": _finite(float(p_value)),
                "dof": 1,
                "note": "statistic: the odds ratio" + ("" if np.isfinite(odds) else " (infinite)"),
            }
        else:
            result = chi2_contingency(table, correction=False)
            small = bool((result.expected_freq < _MIN_EXPECTED).any())
            out[name] = {
                "test": "chi2_contingency",
                "n": n,
                "statistic": _finite(float(result.statistic)),
                "p_value": _finite(float(result.pvalue)),
                "dof": int(result.dof),
                "note": f"expected counts below {_MIN_EXPECTED}: the chi-squared approximation is unreliable"
                if small
                else None,
            }
    return out


def agreement_counts(outcome: BuildOutcome) -> AgreementCounts | None:
    """Examples by the votes their gold label got, out of the task's responses per example."""
    gold = outcome.gold
    # Responses collected or imported as responses; imported gold (a labelled dataset's own
    # label) is not votes out of the task's responses, and the datasheet's gold source says so.
    with_responses = gold[(gold["n_responses"].fillna(0) > 0) & gold.index.isin(list(answered_examples(outcome)))]
    if with_responses.empty:
        return None
    n = outcome.data.definition.validations_per_example
    has_gold = with_responses["gold"].map(lambda g: isinstance(g, str | tuple))
    votes = with_responses.loc[has_gold, "gold_votes"].fillna(0).astype(int)
    top = max(n, int(votes.max()) if len(votes) else 0)
    return AgreementCounts(
        responses=n,
        examples_with_responses=len(with_responses),
        examples_with_other_response_counts=int((with_responses["n_responses"] != n).sum()),
        by_votes={f"{k} of {n}": int((votes == k).sum()) for k in range(top, 0, -1) if (votes == k).any()},
        at_least={f">={k} of {n}": int((votes >= k).sum()) for k in range(top, 0, -1)},
        no_gold=int((~has_gold).sum()),
    )


def inter_annotator_agreement(outcome: BuildOutcome) -> ReportAgreement | None:
    """Chance-corrected agreement of the counted labels; a measure this round cannot support
    (e.g. unequal rater counts) is missing rather than failing the build."""
    definition, responses = outcome.data.definition, outcome.data.responses
    if responses.empty:
        return None
    n = response_sets.agreement_raters(responses, definition.validations_per_example)
    if definition.is_multi_label:
        # The responses gold was decided on (one set per example), examples with n of them.
        ml, part = multilabel_report.multilabel_agreement_summary(responses, labels=definition.labels, k=n)
        if ml is None:
            return None
        return ReportAgreement(
            mean_fleiss_kappa=_finite(ml.mean_fleiss),
            mean_randolph_kappa=_finite(ml.mean_randolph),
            mean_krippendorff_alpha=_finite(ml.mean_alpha),
            mean_jaccard=_finite(ml.mean_jaccard),
            n_raters=n,
            n_examples=ml.n_examples,
            examples_left_out=part["examples_left_out"],
        )
    labels = definition.effective_validation_labels
    # Every figure reads the same examples: those with n responses (response_sets).
    answered = int(responses["example_id"].nunique())
    responses = response_sets.with_k_responses(responses, n)
    rated = int(responses["example_id"].nunique())
    summary = ReportAgreement(
        fleiss_kappa=_finite(_safe(lambda: agreement.fleiss_kappa(responses, labels=labels, n_raters=n))),
        krippendorff_alpha=_finite(_safe(lambda: agreement.krippendorff_alpha(responses, labels=labels))),
        randolph_kappa=_finite(_safe(lambda: agreement.randolph_kappa(responses, labels=labels, n_raters=n))),
        mean_pairwise_cohen_kappa=_finite(
            _safe(
                lambda: float(
                    agreement.slot_cohen_kappas(responses, labels=labels, random_state=outcome.settings.seed)[
                        "kappa"
                    ].mean()
                )
            )
        ),
    )
    for name in ("dev", "test"):
        subset = responses[responses["example_id"].isin(outcome.ids[name])]
        if not subset.empty:
            kappa = _finite(_safe(lambda subset=subset: agreement.fleiss_kappa(subset, labels=labels, n_raters=n)))
            setattr(summary, f"fleiss_kappa_{name}", kappa)
    if definition.family is TaskFamily.target_dependent:
        kappas = _safe(
            lambda: agreement.target_sentiment_kappas(
                responses,
                collapse=definition.label_collapse or {},
                unknown_label=definition.unknown_label,
                order=labels,
                n_raters=n,
            ),
            {},
        )
        summary.madtsc_kappas = {name: _finite(kappa) for name, kappa in kappas.items()}
    summary.n_raters, summary.n_examples, summary.examples_left_out = n, rated, answered - rated
    return summary


def model_based_comparison(outcome: BuildOutcome) -> ReportModelBased | None:
    """The model-based labels beside gold (computed from responses, not imported), on the
    examples that have both; per label the two chosen/not-chosen columns, with sklearn's
    Cohen's kappa (None where it is undefined: both columns hold one same value)."""
    method = outcome.settings.model_based
    if not method or not outcome.model_based:
        return None
    answered = set(outcome.data.responses["example_id"].astype(int))
    gold = {
        int(e): (list(g) if isinstance(g, tuple) else [g])
        for e, g in outcome.gold_of.items()
        if isinstance(g, str | tuple) and int(e) in answered
    }
    both = [e for e in outcome.model_based if e in gold]
    same = sum(1 for e in both if sorted(outcome.model_based[e]) == sorted(gold[e]))
    per_label: dict[str, dict[str, int | float | None]] = {}
    for label in outcome.data.definition.labels:
        in_gold = np.array([label in gold[e] for e in both], dtype=int)
        in_model = np.array([label in outcome.model_based[e] for e in both], dtype=int)
        kappa = None
        if len(both):
            with warnings.catch_warnings():
                # Both columns one same value: kappa is undefined (NaN, reported as None).
                warnings.simplefilter("ignore", RuntimeWarning)
                warnings.simplefilter("ignore", UndefinedMetricWarning)
                kappa = _finite(float(cohen_kappa_score(in_gold, in_model, labels=[0, 1])))
        per_label[str(label)] = {
            "gold": int(in_gold.sum()),
            "model_based": int(in_model.sum()),
            "both": int((in_gold & in_model).sum()),
            "agreement": _finite(float((in_gold == in_model).mean())) if len(both) else None,
            "kappa": kappa,
        }
    return ReportModelBased(
        method=str(method),
        examples=len(outcome.model_based),
        with_gold=len(both),
        same_as_gold=same,
        agreement=_finite(same / len(both)) if both else None,
        without_gold=len(outcome.model_based) - len(both),
        per_label=per_label,
    )


def human_f1(outcome: BuildOutcome) -> HumanF1:
    """DynaSent §3.5: synthetic annotators scored against gold on dev and test (single-label tasks)."""
    definition, responses = outcome.data.definition, outcome.data.responses
    if definition.is_multi_label or responses.empty:
        return {}
    labels = list(definition.labels)
    scored, response_labels = responses, definition.effective_validation_labels
    if definition.family is TaskFamily.target_dependent:
        # MAD-TSC: annotators are scored on the 3-class scale the gold label uses.
        scored = aggregation.collapse_responses(
            responses, collapse=definition.label_collapse or {}, unknown_label=definition.unknown_label
        )
        response_labels = labels + ([definition.unknown_label] if definition.unknown_label else [])
    gold = pd.Series({e: g for e, g in outcome.gold_of.items() if isinstance(g, str) and g in labels})
    human_f1: HumanF1 = {}
    for name in ("dev", "test"):
        if outcome.ids[name]:
            scores = human.human_performance(
                scored,
                gold,
                labels=response_labels,
                classes=labels,
                examples=outcome.ids[name],
                random_state=outcome.settings.seed,
            ).scores
            human_f1[name] = {
                str(k): {
                    "precision": _finite(float(row["precision"])),
                    "recall": _finite(float(row["recall"])),
                    "f1": _finite(float(row["f1"])),
                }
                for k, row in scores.iterrows()
            }
    return human_f1


def fooling(outcome: BuildOutcome) -> ReportFooling:
    attempts, examples = outcome.data.attempts, outcome.data.examples
    validated_fooling = 0
    for example_id, target, fooled in zip(
        examples["example_id"], examples["target_label"], examples["fooled"], strict=True
    ):
        gold = outcome.gold_of.get(example_id)
        if fooled and gold is not None and (list(gold) if isinstance(gold, tuple) else [gold]) == list(target):
            validated_fooling += 1
    predicted = with_prediction(outcome)
    return ReportFooling(
        attempts=len(attempts),
        fooled_attempts=int(attempts["fooled"].fillna(False).sum()) if len(attempts) else 0,
        attempt_fooling_rate=_finite(float(attempts["fooled"].fillna(False).mean())) if len(attempts) else None,
        examples=len(examples),
        harvested_examples=int((examples["origin"] == "harvested").sum()),
        fooled_examples=int(examples["fooled"].sum()),
        confirmed=int((examples["confirmed"] == True).sum()),  # noqa: E712
        validated_fooling=validated_fooling,
        # Over examples written against a model: none (an imported round) leaves no rate.
        validated_fooling_rate=_finite(validated_fooling / len(examples)) if len(examples) and predicted else None,
        examples_with_model_prediction=predicted,
    )


def condition_summaries(data: RoundData, seed: int) -> tuple[dict[str, ConditionSummary], PlotData]:
    """Edit distance, length and vocabulary of the prompt vs no-prompt conditions (Fig. 2a-c).

    No-prompt examples have no prompt; as a baseline their edit distance is measured to a
    prompt of the round drawn at random (seeded), so the two histograms are comparable."""
    rng = random.Random(seed)
    prompt_texts = list(data.prompts.values())
    summary: dict[str, ConditionSummary] = {}
    edit_distance: dict[str, list[float]] = {}
    length_words: dict[str, list[int]] = {}
    vocabulary_growth: dict[str, list[tuple[int, int]]] = {}
    # Imported examples were not written here, with or without a prompt: their own group.
    groups = data.examples["condition"].where(data.examples["origin"] != "imported", "imported")
    for condition, frame in data.examples.groupby(groups):
        texts = frame["text"].tolist()
        if condition == "prompt":
            distances = [float(d) for d in frame["edit_distance"] if d is not None and not pd.isna(d)]
        elif condition == "imported":
            distances = []
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
        summary[str(condition)] = ConditionSummary(
            examples=len(texts),
            edit_distance_mean=_finite(float(np.mean(distances))) if distances else None,
            edit_distance_median=_finite(float(np.median(distances))) if distances else None,
            length_words_mean=_finite(float(np.mean(lengths))) if lengths else None,
            vocabulary=len(seen),
            types_per_token=_finite(len(seen) / tokens) if tokens else None,
        )
        edit_distance[str(condition)] = distances
        length_words[str(condition)] = lengths
        vocabulary_growth[str(condition)] = growth[:: max(1, len(growth) // 200)]
    return summary, PlotData(
        edit_distance=edit_distance, length_words=length_words, vocabulary_growth=vocabulary_growth
    )


def worker_summary(outcome: BuildOutcome) -> tuple[ReportWorkers, pd.DataFrame | None]:
    """Writers and validators, with the validators' agreement with the majority (DynaSent
    Fig. 6) on single-label tasks and, for a round whose batches held control items, their gold
    accuracy; the per-validator rates come back for the plot."""
    definition, examples, responses = outcome.data.definition, outcome.data.examples, outcome.data.responses
    workers = ReportWorkers(
        writers=int(examples["writer_id"].nunique()),
        validators=int(responses["worker_id"].nunique()) if not responses.empty else 0,
    )
    if responses.empty or definition.is_multi_label:
        _set_gold(workers, worker_gold(outcome, None))
        return workers, None
    rates = agreement.worker_agreement(
        responses, labels=definition.effective_validation_labels, min_votes=definition.agreement.gold_min_votes
    )
    workers.never_disagreed = int((rates["agreement_rate"] == 1.0).sum())
    workers.mean_agreement_rate = _finite(float(rates["agreement_rate"].mean()))
    workers.labels_per_validator_median = _finite(float(rates["n_labels"].median()))
    _set_gold(workers, worker_gold(outcome, rates))
    return workers, rates


def _set_gold(workers: ReportWorkers, rows: list[ReportWorkerGold] | None) -> None:
    """Each validator's gold accuracy and their mean; nothing for a round without control items."""
    if rows is None:
        return
    rates = [row.gold_accuracy for row in rows if row.gold_accuracy is not None]
    workers.mean_gold_accuracy = round(sum(rates) / len(rates), 4) if rates else None
    workers.gold_accuracy = rows


def worker_gold(outcome: BuildOutcome, rates: pd.DataFrame | None) -> list[ReportWorkerGold] | None:
    """Each validator's gold accuracy on the round's control items beside their agreement with
    the majority; None for a round whose batches held no control item."""
    answers = outcome.data.control_answers
    if answers is None or answers.empty:
        return None
    responses = outcome.data.responses
    labels = responses.groupby("worker_id").size() if not responses.empty else pd.Series(dtype=int)
    given = answers.groupby("worker_id")["correct"].agg(["size", "sum"])
    workers = sorted({int(w) for w in given.index} | {int(w) for w in labels.index})
    rows = []
    for number, worker in enumerate(workers, start=1):
        answered = int(given["size"].get(worker, 0))
        right = int(given["sum"].get(worker, 0))
        rate = rates["agreement_rate"].get(worker) if rates is not None else None
        rows.append(
            ReportWorkerGold(
                validator=f"v{number}",
                labels=int(labels.get(worker, 0)),
                agreement_rate=None if rate is None or pd.isna(rate) else round(float(rate), 4),
                control_answers=answered,
                gold_accuracy=round(right / answered, 4) if answered else None,
            )
        )
    return rows


def model_vs_majority(outcome: BuildOutcome) -> dict[str, Any]:
    """The round's model's predictions against the majority label, for the plot."""
    definition, split_input = outcome.data.definition, outcome.split_input
    validation_labels = definition.effective_validation_labels
    gold = [g for g in split_input["gold"] if isinstance(g, str)]
    predicted = [
        p for p, g in zip(split_input["model_prediction"], split_input["gold"], strict=True) if isinstance(g, str)
    ]
    rows = sorted(set(gold), key=lambda v: validation_labels.index(v) if v in validation_labels else 99)
    matrix = [
        [sum(1 for g, p in zip(gold, predicted, strict=True) if g == r and p == c) for c in definition.labels]
        for r in rows
    ]
    return {"labels": list(definition.labels), "rows": rows, "matrix": matrix}


def intended_vs_perceived(outcome: BuildOutcome) -> IntendedVsPerceived | None:
    """iSarcasm §5.2: the writers' intended labels against the validators' majority."""
    definition, examples, responses = outcome.data.definition, outcome.data.examples, outcome.data.responses
    if definition.family is not TaskFamily.intended_sarcasm or responses.empty:
        return None
    intended = {
        e: (x or {}).get("intended_label") for e, x in zip(examples["example_id"], examples["extras"], strict=True)
    }
    intended = {e: v for e, v in intended.items() if v}
    if not intended:
        return None
    comparison = agreement.intended_vs_perceived(
        responses, pd.Series(intended), labels=definition.effective_validation_labels, positive=definition.labels[0]
    )
    return IntendedVsPerceived(
        # perceived -> intended -> examples (the frame's columns, then its rows)
        confusion={
            str(perceived): {str(intended): int(n) for intended, n in column.items()}
            for perceived, column in comparison.confusion.to_dict().items()
        },
        precision=_finite(comparison.precision),
        recall=_finite(comparison.recall),
        f1=_finite(comparison.f1),
        n_examples=comparison.n_examples,
        n_without_perceived=comparison.n_without_perceived,
    )


def imported_gold_examples(outcome: BuildOutcome) -> int:
    """Examples whose gold is a labelled dataset's own label (nobody labelled them here)."""
    answered = answered_examples(outcome)
    return sum(
        1
        for e, meta in zip(outcome.data.examples["example_id"], outcome.data.examples["source_metadata"], strict=True)
        if isinstance(meta, dict) and meta.get("gold") and int(e) not in answered
    )


def gold_source(data: RoundData, gold: pd.DataFrame) -> GoldSource | None:
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
    return GoldSource(
        imported_gold=from_import,
        imported_gold_with_votes=with_votes,
        imported_with_original_split=kept_splits,
        from_responses=int(has_gold.sum()) - from_import,
        # An import that named no source has none (the key is absent, not null).
        imports=[
            ImportedFile(kind=kind, name=name, sha256=sha256, **({"source": source} if source else {}))
            for kind, name, sha256, source in sorted(imports, key=str)
        ],
        statement=(
            f"{from_import} gold label(s) were taken from the imported dataset as is, not from validation "
            "in dynaloop; "
            + (
                f"{with_votes} carry the dataset's own vote counts, the rest count as 1 vote"
                if from_import
                else "every gold label was computed here from the imported responses"
            )
            + "."
        ),
    )


def _safe(compute: Any, default: Any = float("nan")) -> Any:
    """A statistic that cannot be computed on this round (e.g. unequal rater counts) is
    reported as missing rather than failing the whole build."""
    try:
        return compute()
    except (ValueError, ZeroDivisionError):
        return default


def _finite(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        return None if math.isnan(value) else round(float(value), 4)
    return value
