"""Chance-level dev/test splits (rounds.build.splits): hand-made cases with exact answers, failure
messages, and property tests of DynaSent's split invariants (§3.4, §4.5)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

import rounds.build.splits as splits_module
from rounds.build.splits import COLUMNS, SplitError, build_splits

LABELS = ["positive", "negative", "neutral"]


def frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


def row(example_id, gold, prompt, predicted, votes=5, condition="prompt") -> tuple:
    return (example_id, gold, votes, prompt, condition, predicted)


def full_grid(labels, per_cell, prefix="") -> list[tuple]:
    """per_cell examples in every (gold, predicted) cell, each from its own prompt."""
    return [
        row(f"{prefix}{g}-{p}-{i}", g, f"{prefix}P-{g}-{p}-{i}", p)
        for g in labels
        for p in labels
        for i in range(per_cell)
    ]


def split_of(result) -> dict:
    return result.assignment.to_dict()


# --- hand-made cases -------------------------------------------------------------------------


def test_exact_small_case() -> None:
    labels = ["pos", "neg"]
    rows = full_grid(labels, 2)  # exactly 2 prompts per cell: all of them are needed
    rows += [
        row("mixed-1", "mixed", "M1", "pos"),  # outside the labels: train
        row("nomaj-1", None, "M2", "neg", votes=2),  # no majority: train
        row("weak-1", "pos", "M3", "pos", votes=3),  # 3 of 5: train
        row("noprompt-1", "neg", None, "pos", condition="no_prompt"),  # always train, flagged
        row("sibling-1", "mixed", "P-pos-neg-0", "neg"),  # shares a dev/test prompt: excluded
        row("nopred-1", "pos", "M4", None),  # no model prediction: train
    ]
    result = build_splits(frame(rows), labels, min_votes=4, seed=7)
    got = split_of(result)
    assessed = {r[0] for r in full_grid(labels, 2)}
    assert {k for k, v in got.items() if v in ("dev", "test")} == assessed
    assert {k: v for k, v in got.items() if k not in assessed} == {
        "mixed-1": "train",
        "nomaj-1": "train",
        "weak-1": "train",
        "noprompt-1": "train",
        "sibling-1": "excluded",
        "nopred-1": "train",
    }
    assert list(result.assignment.index) == [r[0] for r in rows]  # input order kept
    flags = result.flags
    assert flags["no_prompt"][flags["no_prompt"]].index.tolist() == ["noprompt-1"]
    assert flags.index[flags["prompt_shared_with_assessment"]].tolist() == ["sibling-1"]
    reasons = flags["ineligible_reason"].dropna().to_dict()
    assert reasons == {
        "mixed-1": "gold_not_in_labels",
        "nomaj-1": "no_majority",
        "weak-1": "below_min_votes",
        "noprompt-1": "no_prompt",
        "sibling-1": "gold_not_in_labels",
        "nopred-1": "no_model_prediction",
    }

    report = result.report
    assert (report.dev_per_cell, report.test_per_cell, report.max_c, report.upper_bound_c) == (1, 1, 1, 1)
    by_gold = report.counts_by_gold
    assert by_gold.loc["pos"].to_dict() == {"train": 2, "dev": 2, "test": 2, "excluded": 0}
    assert by_gold.loc["neg"].to_dict() == {"train": 1, "dev": 2, "test": 2, "excluded": 0}
    assert by_gold.loc["mixed"].to_dict() == {"train": 1, "dev": 0, "test": 0, "excluded": 1}
    assert by_gold.loc["no majority"].to_dict() == {"train": 1, "dev": 0, "test": 0, "excluded": 0}
    assert by_gold.loc["Total"].to_dict() == {"train": 5, "dev": 4, "test": 4, "excluded": 1}
    assert list(by_gold.index) == ["pos", "neg", "mixed", "no majority", "Total"]
    cells = report.counts_by_cell
    for g, p in itertools.product(labels, labels):
        assert cells.loc[(g, p), "dev"] == 1 and cells.loc[(g, p), "test"] == 1
    assert report.model_metrics["dev"] == {"n": 4, "macro_f1": 0.5, "accuracy": 0.5}
    assert report.model_metrics["test"] == {"n": 4, "macro_f1": 0.5, "accuracy": 0.5}
    assert report.at_chance is True and report.chance_macro_f1 == 0.5
    assert report.excluded == {"prompt_shared_with_assessment": 1}
    assert report.ineligible == {
        "no_prompt": 1,
        "no_majority": 1,
        "gold_not_in_labels": 2,
        "below_min_votes": 1,
        "no_model_prediction": 1,
    }
    assert report.no_prompt_in_train == 1 and report.eligible_in_train == 0
    assert "| Total | 5 | 4 | 4 | 1 |" in report.to_markdown()
    assert report.to_dict()["counts_by_gold"][-1] == {"gold": "Total", "train": 5, "dev": 4, "test": 4, "excluded": 1}


def test_dynasent_like_three_labels_sizes_and_leftovers_to_train() -> None:
    rows = full_grid(LABELS, 5)
    result = build_splits(frame(rows), LABELS, seed=3)
    r = result.report
    assert (r.dev_per_cell, r.test_per_cell, r.max_total_per_cell) == (2, 2, 5)
    counts = result.assignment.value_counts().to_dict()
    assert counts == {"dev": 18, "test": 18, "train": 9, "excluded": 0}  # 9 cells × (2 + 2), one left per cell
    for split in ("dev", "test"):
        sub = frame(rows).set_index("example_id").loc[result.ids(split)]
        assert sub.groupby(["gold", "model_prediction"]).size().eq(2).all()
        assert math.isclose(r.model_metrics[split]["macro_f1"], 1 / 3, rel_tol=1e-12)


def greedy_c1(rows, labels):
    """The obvious greedy: fill cells in order with the first unused prompts. Returns success."""
    used, df = set(), frame(rows)
    for g, p in itertools.product(labels, labels):
        cand = sorted(set(df[(df.gold == g) & (df.model_prediction == p)].prompt_id) - used)
        if len(cand) < 2:
            return False
        used.update(cand[:2])
    return True


def test_shared_prompts_flow_beats_greedy() -> None:
    labels = ["a", "b"]
    rows = [
        # prompt A has examples in (a,a) and (a,b); B and C only in (a,a); D only in (a,b)
        row("A-aa", "a", "A", "a"),
        row("A-ab", "a", "A", "b"),
        row("B-aa", "a", "B", "a"),
        row("C-aa", "a", "C", "a"),
        row("D-ab", "a", "D", "b"),
        row("E-ba", "b", "E", "a"),
        row("F-ba", "b", "F", "a"),
        row("G-bb", "b", "G", "b"),
        row("H-bb", "b", "H", "b"),
    ]
    assert not greedy_c1(rows, labels)  # greedy gives A and B to (a,a) and starves (a,b)
    result = build_splits(frame(rows), labels, seed=0)
    got = split_of(result)
    assert {k for k, v in got.items() if v in ("dev", "test")} == {
        "A-ab",
        "B-aa",
        "C-aa",
        "D-ab",
        "E-ba",
        "F-ba",
        "G-bb",
        "H-bb",
    }
    assert got["A-aa"] == "excluded"  # its prompt serves (a,b) in dev/test
    assert result.report.max_c == 1


def test_prefers_prompts_with_fewer_other_examples() -> None:
    labels = ["a", "b"]
    rows = full_grid(labels, 2)
    # A third (a,a) prompt with two other (train-only) examples: choosing it would exclude both.
    rows += [row("big-aa", "a", "BIG", "a"), row("big-x", "mixed", "BIG", "a"), row("big-y", None, "BIG", "b")]
    for seed in range(8):
        got = split_of(build_splits(frame(rows), labels, seed=seed))
        assert got["big-aa"] == "train" and got["big-x"] == "train" and got["big-y"] == "train"
        assert "excluded" not in got.values()


def test_uses_a_shared_prompt_when_size_needs_it_and_excludes_its_siblings() -> None:
    labels = ["a", "b"]
    rows = full_grid(labels, 2)
    rows = [r for r in rows if r[0] != "a-a-1"]
    rows += [row("big-aa", "a", "BIG", "a"), row("big-x", "mixed", "BIG", "a"), row("big-y", "b", "BIG", "b", votes=3)]
    result = build_splits(frame(rows), labels, seed=1)
    got = split_of(result)
    assert got["big-aa"] in ("dev", "test")
    assert got["big-x"] == got["big-y"] == "excluded"
    assert result.report.excluded == {"prompt_shared_with_assessment": 2}


def test_caps_and_unequal_sizes() -> None:
    rows = full_grid(["a", "b"], 6)
    r = build_splits(frame(rows), ["a", "b"], seed=0).report
    assert (r.dev_per_cell, r.test_per_cell, r.capped) == (3, 3, False)
    r = build_splits(frame(rows), ["a", "b"], dev_size=2, test_size=2, seed=0).report
    assert (r.dev_per_cell, r.test_per_cell, r.capped) == (2, 2, True)
    r = build_splits(frame(rows), ["a", "b"], dev_size=1, seed=0).report
    assert (r.dev_per_cell, r.test_per_cell) == (1, 5)  # the cap on dev leaves the rest to test
    with pytest.raises(ValueError, match="dev_size=1 is below min_size=2"):
        build_splits(frame(rows), ["a", "b"], dev_size=1, min_size=2)


def test_no_prompt_and_missing_prompt_id() -> None:
    labels = ["a", "b"]
    rows = full_grid(labels, 2)
    # A prompt-condition example without a prompt_id counts as its own prompt.
    rows += [row("lone-aa", "a", None, "a"), row("lone-ab", "a", None, "b")]
    rows += [row(f"np-{i}", "a", None, "b", condition="no_prompt") for i in range(5)]
    result = build_splits(frame(rows), labels, seed=0)
    got = split_of(result)
    assert all(got[f"np-{i}"] == "train" for i in range(5))
    assert result.flags.loc[[f"np-{i}" for i in range(5)], "no_prompt"].all()
    assert result.report.max_total_per_cell == 2


def test_multilabel_without_chance_balances_label_sets() -> None:
    labels = ["joy", "anger", "fear"]
    rows = []
    for k, gold in enumerate([("joy",), ("anger",), ("anger", "joy"), ("fear", "joy")]):
        rows += [(f"{k}-{i}", gold, 5, f"P{k}-{i}", "prompt", None) for i in range(2 + 2 * k)]
    rows += [("weak", ("joy",), 2, "PW", "prompt", None), ("np", ("fear",), 5, None, "no_prompt", None)]
    result = build_splits(frame(rows), labels, chance=False, seed=2)
    r = result.report
    assert r.classes == ["joy", "anger", "anger+joy", "fear+joy"]  # ("fear",) only in train: not a class
    assert (r.dev_per_cell, r.test_per_cell) == (1, 1)
    df = frame(rows).set_index("example_id")
    for split in ("dev", "test"):
        golds = df.loc[result.ids(split), "gold"].map(lambda g: tuple(sorted(g))).value_counts()
        assert len(golds) == 4 and (golds == 1).all()
    assert r.counts_by_gold.loc["anger+joy", "dev"] == 1
    assert r.model_metrics == {} and r.counts_by_cell is None
    with pytest.raises(ValueError, match="chance=False"):
        build_splits(frame(rows), labels, chance=True)


def test_single_label_without_chance_balances_classes_only() -> None:
    labels = ["a", "b"]
    rows = [row(f"a{i}", "a", f"Pa{i}", "a") for i in range(6)] + [row(f"b{i}", "b", f"Pb{i}", "a") for i in range(4)]
    r = build_splits(frame(rows), labels, chance=False, seed=0).report
    assert (r.dev_per_cell, r.test_per_cell, r.unit) == (2, 2, "class")
    assert r.model_metrics["dev"]["accuracy"] == 0.5  # reported, not controlled


def test_row_order_does_not_matter() -> None:
    rows = full_grid(LABELS, 4) + [row("x", "mixed", "P-positive-neutral-0", "neutral")]
    a = build_splits(frame(rows), LABELS, seed=11).assignment
    b = build_splits(frame(rows[::-1]), LABELS, seed=11).assignment
    assert a.sort_index().equals(b.sort_index())


def test_generic_cell_sets_match_bitmask_path(monkeypatch) -> None:
    rows = full_grid(["a", "b"], 3) + [row("s", "a", "P-a-b-0", "a"), row("t", "b", "P-a-b-1", "b")]
    fast = build_splits(frame(rows), ["a", "b"], seed=5).assignment
    monkeypatch.setattr(splits_module, "_BITMASK_MAX_CELLS", 0)
    slow = build_splits(frame(rows), ["a", "b"], seed=5).assignment
    assert fast.equals(slow)


# --- failure messages ------------------------------------------------------------------------


def test_error_names_the_short_cell_and_the_shortfall() -> None:
    rows = full_grid(LABELS, 25)
    rows = [r for r in rows if not (r[1] == "neutral" and r[5] == "positive" and int(r[0].rsplit("-", 1)[1]) >= 3)]
    with pytest.raises(SplitError) as info:
        build_splits(frame(rows), LABELS, min_size=10)
    assert str(info.value) == (
        "cell gold=neutral/predicted=positive has 3 eligible examples from distinct "
        "prompts; dev and test need at least 2×10 (short by 17)"
    )
    assert isinstance(info.value, ValueError) and info.value.status_code == 422


def test_error_for_an_empty_cell_lists_other_short_cells() -> None:
    rows = [r for r in full_grid(["a", "b"], 2) if r[1] != "b"]
    with pytest.raises(
        SplitError,
        match=r"^cell gold=b/predicted=a has 0 eligible examples from distinct "
        r"prompts; dev and test need at least 2×1 \(short by 2\); 1 other cell "
        r"short too: gold=b/predicted=b \(0\)$",
    ):
        build_splits(frame(rows), ["a", "b"])


def test_error_when_shared_prompts_make_cells_jointly_infeasible() -> None:
    labels = ["a", "b"]
    rows = [r for r in full_grid(labels, 2) if r[1] != "a"]
    # (a,a) and (a,b) each see two prompts, but the same two: together they need four.
    rows += [
        row("X-aa", "a", "X", "a"),
        row("X-ab", "a", "X", "b"),
        row("Y-aa", "a", "Y", "a"),
        row("Y-ab", "a", "Y", "b"),
    ]
    with pytest.raises(SplitError) as info:
        build_splits(frame(rows), labels)
    assert str(info.value) == (
        "cells gold=a/predicted=a, gold=a/predicted=b have eligible examples from only 2 distinct prompts "
        "between them (each prompt serves at most one dev/test example); dev and test need at least 2×1 "
        "from each, 4 in all (short by 2)"
    )


def test_error_without_chance_names_the_class() -> None:
    rows = [row(f"a{i}", "a", f"Pa{i}", None) for i in range(6)] + [row("b0", "b", "Pb0", None)]
    with pytest.raises(
        SplitError,
        match=r"^class b has 1 eligible examples from distinct prompts; "
        r"dev and test need at least 2×1 \(short by 1\)$",
    ):
        build_splits(frame(rows), ["a", "b"], chance=False)


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="missing"):
        build_splits(pd.DataFrame({"example_id": [1]}), ["a"])
    rows = full_grid(["a", "b"], 2)
    with pytest.raises(ValueError, match="unique"):
        build_splits(frame(rows + rows[:1]), ["a", "b"])
    with pytest.raises(ValueError, match="condition"):
        build_splits(frame([row("x", "a", "P", "a", condition="scratch")]), ["a", "b"])


# --- properties ------------------------------------------------------------------------------


def brute_force(df: pd.DataFrame, labels, min_votes: int, chance: bool) -> tuple[int, int]:
    """Exhaustive search over tiny inputs: the largest c such that distinct prompts can fill
    every cell with 2c, and the fewest examples such a filling excludes (other examples of the
    prompts it uses)."""
    ok = (df.condition == "prompt") & df.gold.isin(labels) & (df.gold_votes >= min_votes)
    if chance:
        ok &= df.model_prediction.isin(labels)
        cells = list(itertools.product(labels, labels))
        key = list(zip(df.gold, df.model_prediction, strict=True))
    else:
        cells = list(labels)
        key = list(df.gold)
    prompts = [f"__own{i}" if pd.isna(p) else p for i, p in enumerate(df.prompt_id)]
    in_prompt = [prompts[i] for i in range(len(df)) if df.condition.iloc[i] == "prompt"]
    others = {p: in_prompt.count(p) - 1 for p in set(in_prompt)}
    avail = {c: sorted({prompts[i] for i in range(len(df)) if ok.iloc[i] and key[i] == c}) for c in cells}

    def fillings(k: int, need: int, used: frozenset):
        if k == len(cells):
            yield used
            return
        free = [p for p in avail[cells[k]] if p not in used]
        for pick in itertools.combinations(free, need):
            yield from fillings(k + 1, need, used | set(pick))

    c = min(len(v) for v in avail.values()) // 2
    while c > 0 and next(fillings(0, 2 * c, frozenset()), None) is None:
        c -= 1
    if c == 0:
        return 0, 0
    return c, min(sum(others[p] for p in used) for used in fillings(0, 2 * c, frozenset()))


@st.composite
def round_data(draw, labels=("a", "b"), chance=True, extra_prompts=10):
    """Every cell gets a few examples whose prompts come from a small shared pool (so prompts
    collide across cells and the assignment matters), plus noise rows of every kind."""
    cells = list(itertools.product(labels, labels)) if chance else [(g, None) for g in labels]
    pool = [f"P{i}" for i in range(draw(st.integers(2 * len(cells), 2 * len(cells) + extra_prompts)))]
    rows = []
    for gold, predicted in cells:
        shuffled = draw(st.permutations(pool + [None]))
        for prompt in shuffled[: draw(st.integers(2, 6))]:
            votes = draw(st.sampled_from([3, 4, 5, 5, 5, 5]))
            if not chance:
                predicted = draw(st.sampled_from(list(labels) + [None]))
            rows.append((gold, votes, prompt, "prompt", predicted))
    for _ in range(draw(st.integers(0, 6))):
        condition = draw(st.sampled_from(["prompt", "prompt", "no_prompt"]))
        prompt = draw(st.sampled_from(pool + [None])) if condition == "prompt" else None
        gold = draw(st.sampled_from(list(labels) + ["mixed", None]))
        votes = 0 if gold is None else draw(st.integers(2, 5))
        predicted = draw(st.sampled_from(list(labels) + [None]))
        rows.append((gold, votes, prompt, condition, predicted))
    order = draw(st.permutations(range(len(rows))))
    return frame([(f"e{i:03d}", *rows[j]) for i, j in enumerate(order)])


def check_invariants(df: pd.DataFrame, result, labels, min_votes: int, chance: bool) -> None:
    split = result.assignment
    assert split.index.tolist() == df.example_id.tolist()
    data = df.set_index("example_id").assign(split=split)
    dev, test = data[data.split == "dev"], data[data.split == "test"]
    assert len(dev) and len(test)
    for part in (dev, test):
        # agreement threshold, gold in labels, prompt condition only
        assert (part.gold_votes >= min_votes).all() and part.gold.isin(labels).all()
        assert (part.condition == "prompt").all()
        # balance over gold classes
        per_class = part.gold.value_counts()
        assert set(per_class.index) == set(labels) and per_class.nunique() == 1
        if chance:
            cells = part.groupby(["gold", "model_prediction"]).size()
            assert len(cells) == len(labels) ** 2 and cells.nunique() == 1
            y, p = part.gold.astype(str), part.model_prediction.astype(str)
            assert math.isclose(f1_score(y, p, labels=labels, average="macro"), 1 / len(labels), rel_tol=1e-12)
            assert accuracy_score(y, p) == pytest.approx(1 / len(labels), abs=0)
            cm = confusion_matrix(y, p, labels=labels)
            assert (cm == cm[0, 0]).all()  # prediction independent of gold, exactly
    # no prompt leakage
    assessed = data[data.split.isin(["dev", "test"])]
    known = assessed.prompt_id.dropna()
    assert not known.duplicated().any()
    assert not set(data[data.split == "train"].prompt_id.dropna()) & set(known)
    excluded = data[data.split == "excluded"]
    assert excluded.prompt_id.isin(set(known)).all()
    assert result.flags.loc[excluded.index, "prompt_shared_with_assessment"].all()
    # no-prompt examples only in train, flagged
    assert (data[data.condition == "no_prompt"].split == "train").all()
    assert result.flags["no_prompt"].equals((df.condition == "no_prompt").set_axis(split.index))
    # the report agrees with the assignment
    report = result.report
    assert report.counts_by_gold.loc["Total"].to_dict() == {
        s: int((split == s).sum()) for s in ("train", "dev", "test", "excluded")
    }
    assert len(dev) == report.dev_per_cell * (len(labels) if chance else 1) * len(labels)
    if chance:
        assert report.at_chance


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(df=round_data(), seed=st.integers(0, 2**32 - 1), min_votes=st.sampled_from([3, 4]))
def test_properties_with_chance_and_optimal_size(df, seed, min_votes) -> None:
    labels = ["a", "b"]
    best, fewest_excluded = brute_force(df, labels, min_votes, chance=True)
    event(f"c={best}")
    if best == 0:
        with pytest.raises(SplitError):
            build_splits(df, labels, min_votes=min_votes, seed=seed)
        return
    result = build_splits(df, labels, min_votes=min_votes, seed=seed)
    assert result.report.max_c == best and result.report.dev_per_cell == best
    assert (result.assignment == "excluded").sum() == fewest_excluded
    check_invariants(df, result, labels, min_votes, chance=True)
    again = build_splits(df, labels, min_votes=min_votes, seed=seed)
    assert again.assignment.equals(result.assignment) and again.flags.equals(result.flags)


@SETTINGS
@given(df=round_data(labels=("a", "b", "c"), chance=False), seed=st.integers(0, 1000))
def test_properties_without_chance_and_optimal_size(df, seed) -> None:
    labels = ["a", "b", "c"]
    best, fewest_excluded = brute_force(df, labels, 4, chance=False)
    event(f"c={best}")
    if best == 0:
        with pytest.raises(SplitError):
            build_splits(df, labels, chance=False, seed=seed)
        return
    result = build_splits(df, labels, chance=False, seed=seed)
    assert result.report.max_c == best
    assert (result.assignment == "excluded").sum() == fewest_excluded
    check_invariants(df, result, labels, 4, chance=False)


@settings(max_examples=25, deadline=None)
@given(per_cell=st.integers(3, 6), shared=st.integers(0, 6), seed=st.integers(0, 10**6))
def test_larger_random_rounds_keep_the_invariants(per_cell, shared, seed) -> None:
    rng = np.random.default_rng(seed)
    rows = full_grid(LABELS, per_cell)
    # extra examples reusing existing prompts, with arbitrary gold/votes/predictions
    prompts = [r[3] for r in rows]
    for i in range(shared * 5):
        rows.append(
            row(
                f"x{i}",
                rng.choice(LABELS + ["mixed"]),
                rng.choice(prompts),
                rng.choice(LABELS),
                votes=int(rng.integers(3, 6)),
            )
        )
    rows += [row(f"np{i}", rng.choice(LABELS), None, rng.choice(LABELS), condition="no_prompt") for i in range(3)]
    df = frame(rows)
    result = build_splits(df, LABELS, seed=seed)
    check_invariants(df, result, LABELS, 4, chance=True)
    assert result.report.max_c >= per_cell // 2 >= 1  # the disjoint grid alone gives this


def test_determinism_and_seed_sensitivity() -> None:
    rows = full_grid(LABELS, 6) + [row(f"s{i}", "positive", f"P-positive-negative-{i}", "negative") for i in range(3)]
    df = frame(rows)
    first = build_splits(df, LABELS, seed=123)
    assert build_splits(df, LABELS, seed=123).assignment.equals(first.assignment)
    others = [build_splits(df, LABELS, seed=s).assignment for s in range(5)]
    assert any(not o.equals(first.assignment) for o in others)
    # whatever the seed, the sizes are the same optimum
    assert {build_splits(df, LABELS, seed=s).report.max_c for s in range(5)} == {3}


def test_error_when_nothing_is_eligible() -> None:
    rows = [("x", ("a",), 2, "P", "prompt", None), ("y", ("b",), 5, None, "no_prompt", None)]
    with pytest.raises(SplitError, match=r"no gold class has an eligible example .* at least 4 votes"):
        build_splits(frame(rows), ["a", "b"], chance=False)
    with pytest.raises(SplitError, match=r"^cell gold=a/predicted=a has 0 eligible"):
        build_splits(pd.DataFrame(columns=COLUMNS), ["a", "b"])
