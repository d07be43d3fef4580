"""The round dashboard (researcher): live statistics and the plots of DynaSent's analysis.

Metrics: attempts, fooling rate, confirmation rate, examples, validation coverage
(``GET /rounds/{id}/stats``). Plots (``GET /rounds/{id}/plot-data``, drawn by
``frontend.plots``): edit distance to the prompt (Fig. 2a), text lengths (Fig. 2b), validators'
agreement with the majority (Fig. 6), and the model's predictions against the validated
majority as a heatmap. With auto-refresh on, the figures reload every few seconds
(``st.fragment(run_every=...)``) without rerunning the rest of the page.
"""

from __future__ import annotations

from typing import Literal

import pandas as pd
import streamlit as st

from frontend import plots, state
from frontend.client import Api, ApiError, PlotData, RoundStats
from frontend.researcher import choose_round, choose_task, percent

REFRESH_CHOICES = [5, 10, 30, 60]
LENGTH_UNITS: list[Literal["words", "chars"]] = ["words", "chars"]
GOLD_STANDARDS: list[Literal["majority", "target"]] = ["majority", "target"]


# Six metrics in one row left each about 110 pixels at 1280 pixels wide, and cut "Confirmation
# rate" and "Validation coverage" short; in rows of three every label reads in full.
METRICS_PER_ROW = 3


def metric_cells(stats: RoundStats) -> list[tuple[str, str, str]]:
    """(label, value, help) of each metric, in reading order."""
    attempts = stats.get("attempts") or {}
    confirmations = stats.get("confirmations") or {}
    examples = stats.get("examples") or {}
    validations = stats.get("validations") or {}
    return [
        ("Attempts", f"{attempts.get('scored', 0):,}", "Scored attempts (model_unavailable ones are not counted)"),
        (
            "Fooling rate",
            percent(attempts.get("fooling_rate")),
            f"{attempts.get('fooled', 0):,} of the scored attempts fooled the model",
        ),
        (
            "Confirmation rate",
            percent(confirmations.get("rate")),
            f"Writers said yes to {confirmations.get('yes', 0):,} and no to {confirmations.get('no', 0):,} "
            "of their fooling attempts",
        ),
        (
            "Examples",
            f"{examples.get('submitted', 0):,}",
            f"{examples.get('fooled', 0):,} fooled the model; {examples.get('no_prompt', 0):,} without a prompt",
        ),
        (
            "Validated",
            f"{examples.get('validated', 0):,}",
            f"{examples.get('validating', 0):,} still need labels; {examples.get('dropped', 0):,} dropped",
        ),
        (
            "Validation coverage",
            percent(validations.get("coverage")),
            f"{validations.get('counted', 0):,} of {validations.get('needed', 0):,} labels needed",
        ),
    ]


def metrics(stats: RoundStats) -> None:
    attempts = stats.get("attempts") or {}
    examples = stats.get("examples") or {}
    cells = metric_cells(stats)
    for first in range(0, len(cells), METRICS_PER_ROW):
        row = st.columns(METRICS_PER_ROW)
        for column, (label, value, help_text) in zip(row, cells[first : first + METRICS_PER_ROW], strict=False):
            column.metric(label, value, help=help_text)
    model_down = attempts.get("model_unavailable", 0)
    if model_down:
        st.warning(f"{model_down:,} attempt(s) found the model unavailable (the writers were asked to retry).")
    stuck = examples.get("awaiting_reannotation_no_new_validator", 0)
    if stuck:
        st.warning(
            f"{stuck:,} example(s) wait for re-annotation by new validators, but every validator of this round "
            "has labelled them already: add validators to the task before closing the round, or a build "
            "excludes them (awaiting_reannotation)."
        )


def charts(data: PlotData, round_id: int, label_names: dict[str, str] | None = None) -> None:
    if data.get("truncated"):
        st.caption(
            f"The plots show {len(data['examples']):,} of the round's {data['total_examples']:,} examples, "
            "spread evenly over the round."
        )
    if not data.get("examples"):
        st.info("No example has been submitted in this round yet: the plots appear with the first ones.")
    left, right = st.columns(2)
    with left:
        chart = plots.edit_distance_chart(data)
        if chart is None:
            st.caption("Edit distance: no example was written from a prompt yet.")
        else:
            st.altair_chart(chart, width="stretch")
    with right:
        unit = st.radio(
            "Length in",
            LENGTH_UNITS,
            horizontal=True,
            key=f"researcher_dash_unit_{round_id}",
            format_func=lambda u: "words" if u == "words" else "characters",
        )
        chart = plots.length_chart(data, unit or "words")
        if chart is not None:
            st.altair_chart(chart, width="stretch")
    left, right = st.columns(2)
    with left:
        chart = plots.worker_agreement_chart(data)
        if chart is None:
            st.caption("Validators' agreement: nobody has labelled enough examples to be judged yet.")
        else:
            st.altair_chart(chart, width="stretch")
    with right:
        gold = st.radio(
            "Model prediction against",
            GOLD_STANDARDS,
            horizontal=True,
            key=f"researcher_dash_gold_{round_id}",
            format_func=lambda g: "validated majority" if g == "majority" else "writer's target",
        )
        confusion = plots.confusion_chart(data, gold or "majority", label_names)
        if confusion is None:
            st.caption("No validated example with a majority label yet." if gold == "majority" else "No example yet.")
        else:
            st.altair_chart(confusion, width="stretch")
    headline = plots.summary(data)
    if headline["model_accuracy"] is not None:
        st.caption(
            f"The model agrees with the validated majority on {percent(headline['model_accuracy'])} of the "
            f"{headline['with_majority']:,} examples that have one."
        )
    agreement = plots.agreement_frame(data)
    if not agreement.empty:
        with st.expander("Validators"):
            st.dataframe(
                pd.DataFrame(
                    {
                        "validator": agreement["username"],
                        "labels": agreement["labels"],
                        "judged": agreement["judged"],
                        "agreement with the majority": agreement["agreement_rate"],
                        "status": agreement["status"],
                    }
                ),
                hide_index=True,
                key=f"researcher_dash_validators_{round_id}",
            )


def live(client: Api, round_id: int, label_names: dict[str, str]) -> None:
    """The part of the page that reloads: statistics, then plots (labels by their display names)."""
    try:
        stats = client.round_stats(round_id)
        data = client.plot_data(round_id)
    except ApiError as error:
        state.show_api_error(error)
        return
    metrics(stats)
    charts(data, round_id, label_names)


def main() -> None:
    client = state.require_role("researcher")
    st.title("Dashboard")
    state.show_flash()
    task = choose_task(client, "researcher_dash_task")
    if task is None:
        st.info("No task yet: create one on the Tasks and rounds page.")
        return
    round_ = choose_round(client, task, "researcher_dash_round")
    if round_ is None:
        st.info("This task has no round yet: open one on the Tasks and rounds page.")
        return
    top = st.columns([1, 1, 2])
    auto = top[0].toggle("Auto-refresh", key="researcher_dash_auto", value=round_["status"] == "collecting")
    every = top[1].selectbox("Every (seconds)", REFRESH_CHOICES, key="researcher_dash_every", disabled=not auto)
    top[2].text(f"Round {round_['number']}: {round_['status']}")
    # A fragment reruns alone: with auto-refresh only the figures reload, not the selectors.
    st.fragment(live, run_every=every if auto else None)(client, round_["id"], dict(task.get("label_names") or {}))


main()
