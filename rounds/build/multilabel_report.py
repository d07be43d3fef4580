"""The multi-label section of a build's report (EthioEmo's protocol, docs/round_builder.md
"Multi-label rounds"): agreement, the human F1 estimate, and the section itself
(:class:`rounds.build.report_schema.MultiLabelSection`).

* Gold, the model-based labels, agreement and human F1 read one response set per example
  (rounds.build.response_sets): its *last* annotation pass (a re-annotated example: the new
  validators' labels alone, services.domain.labels.last_pass), at most k =
  ``validations_per_example`` responses.
* Every agreement figure reads the examples with exactly k of them
  (rounds.build.response_sets.agreement_raters: another count stands in for k when more
  examples have it; Fleiss-type kappas need equal counts, and the others read the same examples
  so that no figure rests on examples another leaves out); the section counts those left out.
* Human F1: DynaSent §3.5's synthetic annotators applied to label sets. Each example's
  gold-deciding responses are shuffled (seeded); synthetic annotator a answers with its a-th
  response; per-label F1 and micro/macro F1 over labels are averaged over annotators.
  sklearn's ``precision_recall_fscore_support`` scores each annotator; the shuffle and the
  averaging over annotators are the only hand-written parts (no library implements
  DynaSent's estimate).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import f1_score

from rounds.build import agreement, response_sets
from rounds.build.report_schema import MultiLabelHuman, MultiLabelSection
from rounds.build.round_data import BuildOutcome


def last_pass_responses(responses: pd.DataFrame, passes: np.ndarray | None) -> pd.DataFrame:
    """Each example's responses of its last annotation pass (``passes`` aligned with rows)."""
    if passes is None or responses.empty:
        return responses
    series = pd.Series(passes, index=responses.index)
    last = series.groupby(responses["example_id"]).transform("max")
    return responses[series == last]


def _binary(values: Sequence[Any], labels: Sequence[str]) -> np.ndarray:
    position = {label: j for j, label in enumerate(labels)}
    matrix = np.zeros((len(values), len(labels)), dtype=np.int8)
    for i, value in enumerate(values):
        for label in value or ():
            if label in position:
                matrix[i, position[label]] = 1
    return matrix


def multilabel_human_f1(
    responses: pd.DataFrame,
    gold: Mapping[Hashable, tuple[str, ...]],
    *,
    labels: Sequence[str],
    examples: Sequence[Hashable],
    seed: int,
) -> dict[str, Any]:
    """Synthetic annotators against gold on ``examples`` (see the module docstring)."""
    scored = responses[responses["example_id"].isin([e for e in examples if e in gold])]
    if scored.empty:
        return {}
    rng = np.random.default_rng(seed)
    scored = scored.assign(_key=rng.random(len(scored))).sort_values(["example_id", "_key"], kind="stable")
    scored = scored.assign(_slot=scored.groupby("example_id").cumcount())
    per_label: list[np.ndarray] = []
    micro: list[float] = []
    macro: list[float] = []
    for _, annotator in scored.groupby("_slot"):
        y_true = _binary([gold[e] for e in annotator["example_id"]], labels)
        y_pred = _binary(list(annotator["label"]), labels)
        present = (y_true.sum(axis=0) + y_pred.sum(axis=0)) > 0
        scores = f1_score(y_true, y_pred, average=None, zero_division=0)
        per_label.append(np.where(present, scores, np.nan))
        micro.append(float(f1_score(y_true, y_pred, average="micro", zero_division=0)))
        macro.append(float(np.nanmean(scores[present])) if present.any() else float("nan"))
    stacked = np.vstack(per_label)
    with np.errstate(invalid="ignore"):
        label_means = [float(np.nanmean(column)) if (~np.isnan(column)).any() else float("nan") for column in stacked.T]
    return {
        "micro_f1": float(np.mean(micro)),
        "macro_f1": float(np.nanmean(macro)) if not np.isnan(macro).all() else float("nan"),
        "per_label": dict(zip(labels, label_means, strict=True)),
        "n_examples": int(scored["example_id"].nunique()),
        "n_annotators": len(per_label),
    }


def _round_floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _round_floats(v) for k, v in value.items()}
    if isinstance(value, float | np.floating):
        return None if np.isnan(value) else round(float(value), 4)
    return value


def multilabel_agreement_summary(
    responses: pd.DataFrame, *, labels: Sequence[str], k: int
) -> tuple[agreement.MultiLabelAgreement | None, dict[str, Any]]:
    """Per-label agreement of the examples with exactly k responses (``responses``: one set
    per example, rounds.build.response_sets) and how many examples it leaves out."""
    rated = response_sets.with_k_responses(responses, k)
    left_out = (int(responses["example_id"].nunique()) if not responses.empty else 0) - (
        int(rated["example_id"].nunique()) if not rated.empty else 0
    )
    try:
        ml = agreement.multilabel_agreement(rated, labels=labels, n_raters=k)
    except ValueError as exc:
        return None, {"n_raters": k, "n_examples": 0, "examples_left_out": left_out, "unavailable": str(exc)}
    return ml, _round_floats(
        {
            "n_raters": k,
            "n_examples": ml.n_examples,
            "examples_left_out": left_out,
            "mean_jaccard": ml.mean_jaccard,
            "per_label": {
                str(label): {key: float(row[key]) for key in ("prevalence", "fleiss", "randolph", "alpha")}
                for label, row in ml.per_label.iterrows()
            },
        }
    )


def multilabel_section(outcome: BuildOutcome) -> MultiLabelSection:
    data = outcome.data
    definition = data.definition
    labels = list(definition.labels)
    k = definition.validations_per_example
    _, agreement_part = multilabel_agreement_summary(
        data.responses, labels=labels, k=response_sets.agreement_raters(data.responses, k)
    )
    gold_responses = data.responses  # one set per example: the last pass, at most k
    gold: dict[Hashable, tuple[str, ...]] = {
        int(e): tuple(g)
        for e, g, dropped in zip(
            outcome.split_input["example_id"], outcome.split_input["gold"], outcome.dropped, strict=True
        )
        if isinstance(g, tuple) and not dropped
    }
    human: dict[str, MultiLabelHuman] = {}
    for name in ("dev", "test"):
        # No responses on a split (e.g. imported gold): no human estimate there, not an empty one.
        estimate = multilabel_human_f1(
            gold_responses, gold, labels=labels, examples=outcome.ids[name], seed=outcome.settings.seed
        )
        if estimate:
            human[name] = MultiLabelHuman.model_validate(_round_floats(estimate))
    counts = outcome.result.report.counts_by_gold.to_dict("index")
    label_counts = {
        label: {s: int(counts.get(label, {}).get(s, 0)) for s in ("train", "dev", "test")} for label in labels
    }
    reasons = [str(r) for r, d in zip(outcome.gold["reason"], outcome.dropped, strict=True) if d]
    examples = data.examples
    requeued = int((examples["requeue_count"] > 0).sum())
    reannotation = {
        "requeued": requeued,
        "resolved_by_new_validators": int(
            sum(
                1
                for e, c in zip(examples["example_id"], examples["requeue_count"], strict=True)
                if c > 0 and int(e) in gold
            )
        ),
        "dropped_after_reannotation": reasons.count("no_gold_after_reannotation"),
        "awaiting_reannotation": reasons.count("awaiting_reannotation"),
    }
    notes = list(outcome.result.report.notes)
    if reannotation["awaiting_reannotation"]:
        notes.append(
            f"{reannotation['awaiting_reannotation']} example(s) re-queued for new validators who never labelled "
            "them (every qualified validator had labelled them already, or the round closed first); they are "
            "excluded from every split"
        )
    model = {name: _round_floats(dict(m)) for name, m in outcome.result.report.model_metrics.items()}
    return MultiLabelSection(
        gold_rule=(
            f"a label is gold when at least {definition.agreement.gold_min_votes} of the "
            f"{k} responses of the example's last pass chose it; disagreements re-annotated "
            f"{definition.agreement.requeue_disagreements} time(s) by new validators, gold then from the new "
            "labels only; still no gold: excluded"
        ),
        exclusive_labels=list(definition.exclusive_labels),
        label_counts=label_counts,
        reannotation=reannotation,
        agreement=agreement_part,
        human_f1=human,
        model=model,
        notes=notes,
    )
