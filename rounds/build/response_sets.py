"""Which responses a build's statistics read: one response set per example
(docs/round_builder.md "Responses").

Gold, distributional and model-based labels, agreement and the human-F1 estimate all read the
same responses of an example:

* its **last annotation pass** (a re-annotated multi-label example's gold is decided on its new
  validators' labels alone, services.domain.labels.last_pass); earlier passes are exported
  with the example and read by no statistic;
* **at most k** = the task's ``validations_per_example`` of them. Where a pass has more (an
  import with more annotators per item than the task's validations), the k responses of the
  validators who agree most with the gold over the round are kept, as DynaSent App. B.2 does
  ("we keep only those by the top-ranked workers according to agreement with the majority");
  the rest are set aside and counted in the report.

The agreement figures also need the same number of responses for every example they read, so
they use the examples with exactly k (:func:`with_k_responses`; :func:`agreement_raters` says
when another count stands in for k) and the report counts the examples they leave out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rounds.build import aggregation, agreement
from rounds.build.report_schema import ReportResponses
from services.domain.labels import exclusive_gold
from services.taskdef import TaskDefinition


@dataclass
class ResponseSets:
    """A round's counted responses, split by what reads them."""

    used: pd.DataFrame  # the responses every statistic reads (long table, rounds.build.table)
    used_passes: np.ndarray | None  # each used response's annotation pass (multi-label), aligned
    kept: pd.DataFrame  # every pass's kept responses: what the build records and exports
    kept_passes: np.ndarray | None
    selection: ReportResponses


def _ranking(definition: TaskDefinition, responses: pd.DataFrame) -> pd.Series:
    """Each worker's agreement with the gold of ``responses`` (their own vote included), the
    ranking :func:`rounds.build.aggregation.top_ranked` keeps the best of."""
    need = definition.agreement.gold_min_votes
    if not definition.is_multi_label:
        return agreement.worker_agreement(responses, labels=definition.effective_validation_labels, min_votes=need)[
            "agreement_rate"
        ]
    frame = aggregation.multilabel_gold(responses, labels=definition.labels, min_votes=need)
    gold = {
        example: (tuple(kept) if (kept := exclusive_gold(definition, list(value))) else None)
        for example, value in zip(frame.index, frame["label"], strict=True)
        if isinstance(value, tuple)
    }
    return agreement.multilabel_worker_agreement(responses, pd.Series(gold, dtype=object), labels=definition.labels)[
        "agreement_rate"
    ]


def _last_pass_mask(responses: pd.DataFrame, passes: np.ndarray | None) -> np.ndarray:
    if passes is None or responses.empty:
        return np.ones(len(responses), dtype=bool)
    series = pd.Series(passes, index=responses.index)
    return (series == series.groupby(responses["example_id"]).transform("max")).to_numpy()


def select_responses(definition: TaskDefinition, responses: pd.DataFrame, passes: np.ndarray | None) -> ResponseSets:
    """The responses of each example that every statistic reads, and what was left out and why."""
    k = definition.validations_per_example
    last = _last_pass_mask(responses, passes)
    if responses.empty:
        kept_mask = np.ones(0, dtype=bool)
    else:
        ranking = _ranking(definition, responses.loc[last])
        kept_mask = aggregation.top_ranked(responses, ranking, n=k, groups=passes)
    used_mask = kept_mask & last
    kept = responses.loc[kept_mask].copy()
    used = responses.loc[used_mask].copy()
    set_aside = Counter(int(e) for e in responses.loc[~kept_mask, "example_id"])
    earlier = responses.loc[kept_mask & ~last, "example_id"]
    per_example = used.groupby("example_id").size() if not used.empty else pd.Series(dtype=int)
    fewer = int((per_example < k).sum())
    histogram = Counter(set_aside.values())
    selection = ReportResponses(
        per_example=k,
        counted=len(responses),
        used=len(used),
        examples=len(per_example),
        set_aside=sum(set_aside.values()),
        examples_with_set_aside=len(set_aside),
        set_aside_per_example={str(n): histogram[n] for n in sorted(histogram)},
        earlier_passes=len(earlier),
        examples_reannotated=int(earlier.nunique()),
        examples_with_fewer=fewer,
        statement="",
    )
    selection.statement = statement(selection)
    return ResponseSets(
        used=used,
        used_passes=None if passes is None else passes[used_mask],
        kept=kept,
        kept_passes=None if passes is None else passes[kept_mask],
        selection=selection,
    )


def statement(selection: ReportResponses) -> str:
    """What the report and the datasheet say about the responses the statistics read."""
    k = selection.per_example
    parts = [
        f"Gold, distributional and model-based labels, agreement and human F1 all read the same "
        f"{selection.used} response(s): at most {k} per example, from its last annotation pass"
    ]
    if selection.set_aside:
        histogram = selection.set_aside_per_example
        if len(histogram) == 1:
            (count, examples), *_ = histogram.items()
            shown = f"{count} response(s) per example set aside for {examples} example(s)"
        else:
            shown = "; ".join(f"{count} set aside for {examples} example(s)" for count, examples in histogram.items())
        parts.append(
            f"{selection.examples_with_set_aside} example(s) had more than {k} responses in a pass: {shown} "
            f"({selection.set_aside} in all). The {k} kept are those of the validators who agree most with the "
            "gold over the round (DynaSent App. B.2); the set-aside responses are read by no statistic and not "
            "exported"
        )
    else:
        parts.append(f"no example had more than {k} responses in a pass, so none was set aside")
    if selection.earlier_passes:
        parts.append(
            f"{selection.examples_reannotated} re-annotated example(s) take gold and every statistic from their "
            f"last pass; their earlier passes' {selection.earlier_passes} response(s) are exported and read by no "
            "statistic"
        )
    if selection.examples_with_fewer:
        parts.append(
            f"{selection.examples_with_fewer} example(s) have fewer than {k} responses (the agreement section "
            "says which examples its figures read)"
        )
    return "; ".join(parts) + "."


def agreement_raters(responses: pd.DataFrame, k: int) -> int:
    """How many responses per example the agreement figures read: the task's k, unless fewer
    examples have k than another count (an import of three annotators per item into a
    five-validation task): then the count most examples with two or more have (the larger on a
    tie). The examples with another count are left out of every figure, and the report says so."""
    if responses.empty:
        return k
    sizes = responses.groupby("example_id").size()
    counts = sizes[sizes >= 2].value_counts()
    if counts.empty or counts.get(k, 0) == counts.max():
        return k
    return int(max(counts[counts == counts.max()].index))


def with_k_responses(responses: pd.DataFrame, k: int) -> pd.DataFrame:
    """The responses of the examples that have exactly ``k`` of them: what every agreement
    figure reads, so that Fleiss, Randolph, Krippendorff, Cohen, prevalence and Jaccard rest on
    the same examples."""
    if responses.empty:
        return responses
    sizes = responses.groupby("example_id")["example_id"].transform("size")
    return responses[(sizes == k).to_numpy()]
