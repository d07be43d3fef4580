"""The researcher dashboard's plots: pure functions from ``GET /rounds/{id}/plot-data`` to
Altair charts (shown with ``st.altair_chart``), plus the small tables behind them.

* :func:`edit_distance_chart` -- normalised edit distance of each example to its prompt, by
  condition (DynaSent Fig. 2a);
* :func:`length_chart` -- text length in words or characters, by condition (Fig. 2b);
* :func:`worker_agreement_chart` -- each validator's rate of agreement with the majority
  (Fig. 6), qualified and unqualified validators apart;
* :func:`confusion_chart` -- the model's prediction against the validated majority label (or
  the writer's target), a heatmap with the count in each cell.

Labels are shown by their display names (the task's ``label_names``, as on every other page);
those, task identifiers and numbers are never writers' text, and Vega draws text as SVG text,
not HTML, so nothing here needs escaping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import altair as alt
import pandas as pd

EXAMPLE_COLUMNS = [
    "example_id",
    "condition",
    "origin",
    "edit_distance",
    "chars",
    "words",
    "target",
    "prediction",
    "majority",
    "validated",
    "fooled",
    "validations",
]
AGREEMENT_COLUMNS = ["username", "labels", "judged", "agreement_rate", "qualified"]
CONDITIONS = ["prompt", "no_prompt"]
# Axes and legends that count things (examples, validators, words, characters) show whole
# numbers only: no tick at 0.5 examples.
COUNT_AXIS = alt.Axis(tickMinStep=1, format="d")
COUNT_LEGEND = alt.Legend(tickMinStep=1, format="d")


def examples_frame(plot_data: Mapping[str, Any]) -> pd.DataFrame:
    """One row per example (the ``examples`` of the plot data), with every column present."""
    return pd.DataFrame(list(plot_data.get("examples") or []), columns=EXAMPLE_COLUMNS)


def agreement_frame(plot_data: Mapping[str, Any]) -> pd.DataFrame:
    frame = pd.DataFrame(list(plot_data.get("worker_agreement") or []), columns=AGREEMENT_COLUMNS)
    frame["status"] = frame["qualified"].map({True: "qualified", False: "unqualified"})
    return frame


def _label_order(plot_data: Mapping[str, Any]) -> list[str]:
    return list(plot_data.get("validation_labels") or plot_data.get("labels") or [])


def edit_distance_chart(plot_data: Mapping[str, Any]) -> alt.Chart | None:
    """Histogram of the normalised Levenshtein distance to the prompt (0: unchanged, 1: all
    new), one colour per condition; None when no example has a distance."""
    frame = examples_frame(plot_data).dropna(subset=["edit_distance"])
    if frame.empty:
        return None
    return (
        alt.Chart(frame[["edit_distance", "condition"]], title="Edit distance to the prompt")
        .mark_bar(opacity=0.75)
        .encode(
            x=alt.X("edit_distance:Q", bin=alt.Bin(extent=[0, 1], step=0.05), title="normalised edit distance"),
            y=alt.Y("count():Q", stack=None, title="examples", axis=COUNT_AXIS),
            color=alt.Color("condition:N", sort=CONDITIONS, title="condition"),
            tooltip=[alt.Tooltip("condition:N"), alt.Tooltip("count():Q", title="examples")],
        )
    )


def length_chart(plot_data: Mapping[str, Any], unit: Literal["words", "chars"] = "words") -> alt.Chart | None:
    """Histogram of text lengths (words or characters) by condition; None without examples."""
    frame = examples_frame(plot_data)
    if frame.empty:
        return None
    title = "words" if unit == "words" else "characters"
    return (
        alt.Chart(frame[[unit, "condition"]], title=f"Length in {title}")
        .mark_bar(opacity=0.75)
        .encode(
            # Lengths are whole numbers: bins at least one word (or character) wide.
            x=alt.X(f"{unit}:Q", bin=alt.Bin(maxbins=30, minstep=1), title=title, axis=COUNT_AXIS),
            y=alt.Y("count():Q", stack=None, title="examples", axis=COUNT_AXIS),
            color=alt.Color("condition:N", sort=CONDITIONS, title="condition"),
            tooltip=[alt.Tooltip("condition:N"), alt.Tooltip("count():Q", title="examples")],
        )
    )


def worker_agreement_chart(plot_data: Mapping[str, Any]) -> alt.Chart | None:
    """Histogram of validators' agreement with the majority (DynaSent Fig. 6); validators not
    yet judged (no rate) are left out; None when there are none."""
    frame = agreement_frame(plot_data).dropna(subset=["agreement_rate"])
    if frame.empty:
        return None
    return (
        alt.Chart(frame[["agreement_rate", "status"]], title="Validators' agreement with the majority")
        .mark_bar()
        .encode(
            x=alt.X("agreement_rate:Q", bin=alt.Bin(extent=[0, 1], step=0.05), title="agreement rate"),
            y=alt.Y("count():Q", title="validators", axis=COUNT_AXIS),
            color=alt.Color(
                "status:N",
                sort=["qualified", "unqualified"],
                title="",
                scale=alt.Scale(domain=["qualified", "unqualified"], range=["#4c78a8", "#e45756"]),
            ),
            tooltip=[alt.Tooltip("status:N"), alt.Tooltip("count():Q", title="validators")],
        )
    )


def confusion_counts(plot_data: Mapping[str, Any], gold: Literal["majority", "target"] = "majority") -> pd.DataFrame:
    """Counts of (gold, predicted) pairs: ``gold`` is the validated majority label (examples
    without one are left out) or the writer's target. Columns ``gold``, ``predicted``,
    ``count``; the same labels on both axes (those that occur, in the task's order), every
    pair present, with 0 where no example falls."""
    frame = examples_frame(plot_data)
    frame = frame[frame[gold].notna() & frame["prediction"].notna()]
    if frame.empty:
        return pd.DataFrame(columns=["gold", "predicted", "count"])
    counts = frame.groupby([gold, "prediction"]).size()
    seen = set(frame[gold]) | set(frame["prediction"])
    order = _label_order(plot_data)
    axis = [label for label in order if label in seen] + sorted(seen - set(order))
    rows = [{"gold": g, "predicted": p, "count": int(counts.get((g, p), 0))} for g in axis for p in axis]
    return pd.DataFrame(rows, columns=["gold", "predicted", "count"])


def confusion_chart(
    plot_data: Mapping[str, Any],
    gold: Literal["majority", "target"] = "majority",
    label_names: Mapping[str, str] | None = None,
) -> alt.LayerChart | None:
    """Heatmap of the model's predictions against the majority (or the writer's target), with
    the count in each cell; the diagonal is where the model was right. Labels by their display
    names (``label_names``; a label without one as written). None without data."""
    counts = confusion_counts(plot_data, gold)
    if counts.empty:
        return None
    names = dict(label_names or {})
    for column in ("gold", "predicted"):
        counts[column] = [names.get(label, label) for label in counts[column]]
    gold_title = "validated majority" if gold == "majority" else "writer's target"
    order: Sequence[str] = list(dict.fromkeys([*counts["gold"], *counts["predicted"]]))
    base = alt.Chart(counts, title=f"Model prediction vs {gold_title}").encode(
        x=alt.X("predicted:N", sort=list(order), title="model prediction"),
        y=alt.Y("gold:N", sort=list(order), title=gold_title),
    )
    cells = base.mark_rect().encode(
        color=alt.Color("count:Q", scale=alt.Scale(scheme="blues"), title="examples", legend=COUNT_LEGEND),
        tooltip=[
            alt.Tooltip("gold:N", title=gold_title),
            alt.Tooltip("predicted:N", title="predicted"),
            alt.Tooltip("count:Q", title="examples"),
        ],
    )
    largest = max(int(counts["count"].max()), 1)
    text = base.mark_text(fontSize=13).encode(
        text=alt.Text("count:Q"),
        color=alt.condition(alt.datum.count > largest / 2, alt.value("white"), alt.value("black")),
    )
    return cells + text


def summary(plot_data: Mapping[str, Any]) -> dict[str, Any]:
    """Headline figures of the plotted examples: how many, validated, with a majority, the
    model's accuracy against the majority, mean edit distance."""
    frame = examples_frame(plot_data)
    with_majority = frame[frame["majority"].notna() & frame["prediction"].notna()]
    distances = frame["edit_distance"].dropna()
    return {
        "examples": len(frame),
        "validated": int(frame["validated"].fillna(False).astype(bool).sum()),
        "with_majority": len(with_majority),
        "model_accuracy": float((with_majority["majority"] == with_majority["prediction"]).mean())
        if len(with_majority)
        else None,
        "mean_edit_distance": float(distances.mean()) if len(distances) else None,
    }
