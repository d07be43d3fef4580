"""The pure parts of bench/web_app.py, the launch-burst benchmark: percentiles, the model's time
taken out of a check, the verdict on how many sessions a process holds, the sentences and the
Prolific ids its browsers send. The benchmark itself drives real browsers (docs/benchmarks.md)."""

from __future__ import annotations

import random
import re

import pytest

from bench.web_app import (
    LABEL_NAMES,
    PLAIN,
    Step,
    attach_model_time,
    percentile,
    prolific_query,
    sentences_against,
    sessions_held,
    summarize,
)


def test_percentile_is_a_measured_value_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]  # 1 .. 20
    assert percentile(values, 95) == 19.0  # ceil(0.95 * 20) = 19th
    assert percentile(values, 50) == 10.0
    assert percentile(values, 100) == 20.0
    assert percentile([7.0], 95) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input
    with pytest.raises(ValueError, match="no values"):
        percentile([], 95)
    with pytest.raises(ValueError, match="q must be in"):
        percentile(values, 0)


def test_a_checks_model_time_is_taken_out_never_below_zero() -> None:
    steps = [
        Step(1, "open", 900.0),
        Step(1, "check 1", 700.0, text="a"),
        Step(1, "check 2", 100.0, text="b"),
        Step(2, "check 1", 500.0, text="c"),  # no latency recorded for "c"
    ]
    attach_model_time(steps, {"a": 450.0, "b": 130.0, "unrelated": 1.0})
    assert [step.model_ms for step in steps] == [0.0, 450.0, 130.0, 0.0]
    assert [step.web_app_ms for step in steps] == [900.0, 250.0, 0.0, 500.0]


def test_summary_leaves_the_page_load_out_of_the_interactions() -> None:
    steps = [Step(0, "open", 5000.0)] + [Step(0, "check 1", float(ms)) for ms in range(100, 2100, 100)]
    summary = summarize(steps)
    assert summary["steps"] == 20  # the 20 checks, not the page load
    assert summary["p95_ms"] == 1900.0 and summary["max_ms"] == 2000.0
    assert summary["by_step"]["open"] == {"n": 1, "p50_ms": 5000.0, "p95_ms": 5000.0}
    assert summarize([]) == {"steps": 0}


def test_sessions_held_stops_at_the_first_level_over_the_limit() -> None:
    assert sessions_held({1: 400.0, 2: 780.0, 4: 1300.0}) == 2
    assert sessions_held({4: 990.0, 1: 300.0, 2: 500.0}) == 4  # levels in any order
    # A level that held after one that did not is not counted (noise, not capacity).
    assert sessions_held({1: 400.0, 2: 1001.0, 3: 900.0}) == 1
    assert sessions_held({1: 1000.0}) == 0  # "under" one second
    assert sessions_held({}) == 0


def test_each_session_checks_its_own_sentences_of_another_label() -> None:
    for target in LABEL_NAMES:  # every label of dynasent-r2 a goal may name
        texts = sentences_against(target, 41)
        assert len(texts) == 3 and len(set(texts)) == 3
        assert all("41" in text for text in texts)
        other = "negative" if target == "positive" else "positive"
        assert other != target and texts == [text.format(n=41) for text in PLAIN[other]]
    assert not set(sentences_against("positive", 1)) & set(sentences_against("positive", 2))


def test_prolific_ids_are_24_hex_digits() -> None:
    query = prolific_query(random.Random(0))
    assert re.fullmatch(r"PROLIFIC_PID=[0-9a-f]{24}&STUDY_ID=[0-9a-f]{24}&SESSION_ID=[0-9a-f]{24}", query)
    assert prolific_query(random.Random(0)) == query and prolific_query(random.Random(1)) != query
