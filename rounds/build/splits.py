"""Chance-level dev/test splits for a round (DynaSent §3.4 and §4.5, Tables 4 and 7).

No library provides this construction (neither scikit-learn's splitters nor crowd-kit know
about prompts, agreement thresholds or a model held at chance), so it is written here by hand
on top of SciPy's max-flow and linear-programming solvers.

Rules, as DynaSent states them for its Round 1 and Round 2 splits:

* dev and test are each balanced over the gold classes;
* dev/test examples have a majority gold label in the task's label set (so no ``mixed``, no
  "no majority") chosen by at least ``min_votes`` validators (DynaSent: 4 of 5);
* only the prompt condition reaches dev/test; no-prompt examples go to train, flagged;
* each prompt is used at most once across dev+test, and a prompt used there is never shared
  with train: its other examples are *excluded*, not trained on;
* the round's model is at chance: with ``chance=True`` every (gold, predicted) cell of dev
  holds the same number of examples, and likewise for test, so the model's prediction is
  independent of gold, its accuracy is ``1/K`` and its macro-F1 exactly ``1/K`` for ``K``
  labels (each class has ``K·c`` gold and ``K·c`` predicted examples, ``c`` of them right);
* everything else is train (used with distributional labels by the trainer).

Size is maximised exactly. Each dev/test example costs one prompt, so this is a b-matching
of prompts to cells: source → prompt (capacity 1) → cell (where the prompt has an eligible
example in the cell) → sink (capacity ``k``, the dev+test examples wanted per cell). Prompts
with the same set of cells are interchangeable, so they are merged into one node whose
capacity is their number; 150,000 prompts become at most a few hundred nodes and each
max-flow takes milliseconds. A binary search on ``k`` with
``scipy.sparse.csgraph.maximum_flow`` finds the largest feasible ``k``. A min-cost version of
the same flow (``scipy.optimize.linprog``; exact, because a network matrix is totally
unimodular) then picks, among the assignments of that size, one that excludes the fewest
other examples of the chosen prompts. The seed decides which of equally good prompts, which
example of a prompt, and dev vs test.

When a constraint cannot be met a :class:`SplitError` says which and by how much, using the
min cut of the flow to name the cells that lack prompts (Hall's condition).

Example::

    >>> import pandas as pd
    >>> rows = [(f"e{g}{p}{i}", g, 5, f"p{g}{p}{i}", "prompt", p)
    ...         for g in "ab" for p in "ab" for i in range(2)]
    >>> frame = pd.DataFrame(rows, columns=["example_id", "gold", "gold_votes", "prompt_id",
    ...                                     "condition", "model_prediction"])
    >>> result = build_splits(frame, ["a", "b"], min_votes=4, seed=0)
    >>> result.assignment.value_counts(sort=False).to_dict()
    {'train': 0, 'dev': 4, 'test': 4, 'excluded': 0}
    >>> result.report.model_metrics["dev"]["macro_f1"]
    0.5
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard, cast

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.optimize import linprog
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from services.errors import Invalid

__all__ = [
    "COLUMNS",
    "CONDITIONS",
    "INELIGIBLE_REASONS",
    "SPLITS",
    "SplitError",
    "SplitReport",
    "SplitResult",
    "build_splits",
]

COLUMNS = ["example_id", "gold", "gold_votes", "prompt_id", "condition", "model_prediction"]
SPLITS = ("train", "dev", "test", "excluded")
_TRAIN, _DEV, _TEST, _EXCLUDED = range(4)
CONDITIONS = ("prompt", "no_prompt")

NO_MAJORITY = "no majority"
NO_PREDICTION = "no prediction"

# Why an example could not go to dev/test (first that applies).
INELIGIBLE_REASONS = (
    "no_prompt",
    "no_majority",
    "gold_not_in_labels",
    "class_not_assessed",
    "below_min_votes",
    "no_model_prediction",
    "prediction_not_in_labels",
)

# Up to this many cells a prompt's set of cells is an int64 bit mask (fast path).
_BITMASK_MAX_CELLS = 62


class SplitError(Invalid, ValueError):
    """A split constraint cannot be met; the message names it and the shortfall."""

    code = "split_infeasible"


@dataclass(frozen=True)
class SplitReport:
    """DynaSent Table 4/7-style counts plus the evidence that the model is at chance."""

    labels: list[str]
    classes: list[str]
    chance: bool
    seed: int
    min_votes: int
    unit: str  # "cell" ((gold, predicted) pair) with chance, "class" without
    # Rows: each class/label, other gold values (e.g. mixed), "no majority", "Total";
    # columns: train, dev, test, excluded.
    counts_by_gold: pd.DataFrame
    # Index (gold, predicted); columns as above. None when there are no predictions.
    counts_by_cell: pd.DataFrame | None
    # Per dev/test cell: eligible examples, distinct prompts among them, dev and test counts.
    availability: pd.DataFrame
    dev_per_cell: int
    test_per_cell: int
    max_c: int  # largest c with c per cell in dev and c in test (exact, from the flow)
    upper_bound_c: int  # naive bound ignoring prompt sharing: min(cell bound, prompt bound) // 2
    max_total_per_cell: int  # largest feasible dev+test per cell
    upper_bound_total_per_cell: int
    capped: bool
    model_metrics: dict[str, dict[str, float]]  # split -> n, macro_f1, accuracy
    chance_macro_f1: float | None
    at_chance: bool | None
    excluded: dict[str, int]
    ineligible: dict[str, int]
    eligible_in_train: int
    no_prompt_in_train: int
    notes: list[str] = field(default_factory=list)
    # Per class: eligible examples and how many went to train, dev and test; the guard's share.
    balance: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable form (for the build record and the datasheet)."""

        def table(frame: pd.DataFrame | None) -> list[dict[str, object]] | None:
            if frame is None:
                return None
            out = frame.reset_index()
            return [{str(k): _plain(v) for k, v in row.items()} for row in out.to_dict("records")]

        return {
            "labels": list(self.labels),
            "classes": list(self.classes),
            "chance": self.chance,
            "seed": self.seed,
            "min_votes": self.min_votes,
            "unit": self.unit,
            "counts_by_gold": table(self.counts_by_gold),
            "counts_by_cell": table(self.counts_by_cell),
            "availability": table(self.availability),
            "dev_per_cell": self.dev_per_cell,
            "test_per_cell": self.test_per_cell,
            "max_c": self.max_c,
            "upper_bound_c": self.upper_bound_c,
            "max_total_per_cell": self.max_total_per_cell,
            "upper_bound_total_per_cell": self.upper_bound_total_per_cell,
            "capped": self.capped,
            "model_metrics": {s: {k: _plain(v) for k, v in m.items()} for s, m in self.model_metrics.items()},
            "chance_macro_f1": self.chance_macro_f1,
            "at_chance": self.at_chance,
            "excluded": dict(self.excluded),
            "ineligible": dict(self.ineligible),
            "eligible_in_train": self.eligible_in_train,
            "no_prompt_in_train": self.no_prompt_in_train,
            "notes": list(self.notes),
            "balance": self.balance,
        }

    def to_markdown(self) -> str:
        """The Table 4/7 layout (majority-label counts per split) and the chance evidence."""
        lines = [
            "| gold | " + " | ".join(self.counts_by_gold.columns) + " |",
            "|---" * (len(self.counts_by_gold.columns) + 1) + "|",
        ]
        for name, row in self.counts_by_gold.iterrows():
            lines.append(f"| {name} | " + " | ".join(f"{int(v):,}" for v in row) + " |")
        lines.append("")
        per = "cell" if self.unit == "cell" else "class"
        lines.append(
            f"dev: {self.dev_per_cell} per {per}, test: {self.test_per_cell} per {per}; "
            f"largest feasible c = {self.max_c} (bound ignoring shared prompts: {self.upper_bound_c})"
        )
        for split in ("dev", "test"):
            m = self.model_metrics.get(split)
            if m:
                lines.append(
                    f"model on {split}: macro-F1 {m['macro_f1']:.4f}, accuracy {m['accuracy']:.4f} "
                    f"(n={int(m['n'])})"
                    + (f"; chance = {self.chance_macro_f1:.4f}" if self.chance_macro_f1 is not None else "")
                )
        if self.excluded:
            lines.append("excluded: " + ", ".join(f"{k} {v:,}" for k, v in self.excluded.items()))
        if self.ineligible:
            lines.append("not eligible for dev/test: " + ", ".join(f"{k} {v:,}" for k, v in self.ineligible.items()))
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SplitResult:
    """The assignment and per-example flags, both indexed by example_id in the input's order."""

    # Categorical with the categories of SPLITS (train, dev, test, excluded).
    assignment: pd.Series
    # no_prompt: a no-prompt example (always train); prompt_shared_with_assessment: excluded
    # because its prompt serves a dev/test example; ineligible_reason: why it could not be a
    # dev/test example (categorical over INELIGIBLE_REASONS; missing where it could).
    flags: pd.DataFrame
    report: SplitReport

    def ids(self, split: str) -> list[Hashable]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        return self.assignment.index[self.assignment.to_numpy() == split].tolist()


def build_splits(
    examples: pd.DataFrame,
    labels: Sequence[str],
    *,
    min_votes: int = 4,
    seed: int = 0,
    dev_size: int | None = None,
    test_size: int | None = None,
    min_size: int = 1,
    chance: bool = True,
    classes: Sequence[object] | None = None,
    no_prompt_eligible: bool = False,
    max_dev_test_share: float | None = None,
) -> SplitResult:
    """Assign every example to train, dev, test or excluded (see the module docstring).

    ``examples`` has the columns of :data:`COLUMNS`, one row per example. ``dev_size`` and
    ``test_size`` cap dev and test per cell (``chance=True``: per (gold, predicted) cell, so
    ``K`` times that per class) or per class (``chance=False``); without caps dev and test get
    the same, largest feasible size. ``min_size`` is the least acceptable size per cell/class
    of each of dev and test; below it a :class:`SplitError` is raised.

    With ``chance=False`` (multi-label tasks) gold may be a tuple of labels; each distinct set
    is a class and only class balance is required. ``classes`` then restricts which classes
    dev/test balance over (default: string gold → the task labels; tuple gold → every set
    seen among examples otherwise eligible); examples of other classes stay in train.

    ``no_prompt_eligible`` lets no-prompt examples reach dev/test, each standing alone (a prompt
    of its own, so the distinct-prompt rule cannot bind them); by default they stay in train.
    ``max_dev_test_share`` is the class-balance guard: dev+test take at most this share (rounded
    down) of each class's eligible examples, so train keeps the rest of every class.
    """
    labels = _check_arguments(examples, labels, min_votes, dev_size, test_size, min_size)
    K = len(labels)

    order = _canonical_order(examples)
    frame = examples.iloc[order].reset_index(drop=True)
    rng = np.random.default_rng(seed)

    is_prompt = _is_prompt(frame["condition"])
    # The pool dev/test draws on: prompt examples, and no-prompt ones where allowed (each alone).
    in_pool = is_prompt | no_prompt_eligible

    gold = _Column.of(frame["gold"])
    prediction = _Column.of(frame["model_prediction"])
    gold_na, pred_na = gold.codes < 0, prediction.codes < 0
    votes = pd.to_numeric(frame["gold_votes"], errors="coerce").fillna(0).to_numpy()
    enough_votes = votes >= min_votes

    gc = _GoldClasses.build(gold, labels, chance, classes, enough_votes & in_pool)
    pred_label = prediction.lookup(_label_index(prediction.values, labels), -1)

    checks = [~in_pool, gold_na, ~gc.in_labels, ~gc.assessed, ~enough_votes]
    reason = _ineligible_reason(checks + [pred_na, pred_label < 0] if chance else checks)
    eligible = reason < 0

    if chance:
        _require_predictions(in_pool & ~gold_na & gc.in_labels & gc.assessed, pred_na, min_size)
    n_cells, cell, cell_names = _cells(labels, gc, pred_label, eligible, chance)
    _require_a_cell(n_cells, min_votes, min_size)
    prompt_code, prompt_size = _prompt_codes(frame["prompt_id"], is_prompt, in_pool)
    pairs = _PromptCellPairs.of(eligible, prompt_code, cell, n_cells)
    available = pairs.distinct_prompts_per_cell()
    eligible_examples = np.bincount(cell[pairs.rows], minlength=n_cells)

    graph = _PromptGraph(pairs.prompt, pairs.cell, prompt_size, n_cells)
    bound_total = _feasible_bound(graph, available, cell_names, min_size, chance)
    # The class-balance guard: per class, dev+test hold (chance: K cells of) the per-cell total.
    class_eligible = np.bincount(gc.class_code[eligible], minlength=len(gc.keys))
    guard = _BalanceGuard.of(max_dev_test_share, class_eligible, gc.names, K if chance else 1)
    sizes = _Sizes.of(graph, guard, bound_total, min_size, dev_size, test_size)

    split, shared = _draw(graph, pairs, sizes.dev, sizes.test, rng, in_pool, prompt_code, len(prompt_size))

    assignment, flags = _in_input_order(examples, order, split, is_prompt, shared, reason)

    report = _report(
        _ReportInput(
            labels=labels,
            gold=gold,
            prediction=prediction,
            gc=gc,
            pred_label=pred_label,
            split=split,
            reason=reason,
            shared=shared,
            is_prompt=is_prompt,
            chance=chance,
            seed=seed,
            min_votes=min_votes,
            cell_names=cell_names,
            cell=cell,
            available=available,
            eligible_examples=eligible_examples,
            sizes=sizes,
            class_eligible=class_eligible,
        )
    )
    return SplitResult(assignment=assignment, flags=flags, report=report)


def _require_a_cell(n_cells: int, min_votes: int, min_size: int) -> None:
    if n_cells == 0:
        raise SplitError(
            "no gold class has an eligible example (prompt condition, gold within the task's labels, "
            f"at least {min_votes} votes), so there is nothing to balance dev and test over",
            constraint="dev_test_size",
            min_size=min_size,
        )


def _draw(
    graph: _PromptGraph,
    pairs: _PromptCellPairs,
    d: int,
    t: int,
    rng: np.random.Generator,
    in_pool: np.ndarray,
    prompt_code: np.ndarray,
    n_prompts: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's split (index into SPLITS) with ``d`` per cell in dev and ``t`` in test, and
    which rows are excluded because their prompt serves a dev/test example."""
    plan = graph.assignment(d + t)  # (group, cell, units)
    # Which prompts: a seeded random order within each interchangeable group.
    chosen_prompt, chosen_cell = graph.realise(plan, rng)
    chosen_keys = chosen_prompt * pairs.n_cells + chosen_cell
    chosen_rows = _chosen_rows(pairs.rows, pairs.row_key, pairs.keys, chosen_keys, rng)
    split = _dev_or_test(len(prompt_code), chosen_rows, chosen_cell, d, rng)
    shared = _shares_a_chosen_prompt(in_pool, prompt_code, chosen_prompt, chosen_rows, n_prompts)
    split[shared] = _EXCLUDED
    return split, shared


def _ineligible_reason(checks: list[np.ndarray]) -> np.ndarray:
    """Per example, an index into INELIGIBLE_REASONS (the first check that applies), -1: eligible."""
    reason = np.full(len(checks[0]), -1, dtype=np.int8)
    for i in reversed(range(len(checks))):  # the first reason that applies wins
        reason[checks[i]] = i
    return reason


@dataclass(frozen=True)
class _PromptCellPairs:
    """The unique eligible (prompt, cell) pairs; a prompt counts once per cell however many
    examples it has there. ``rows``: the eligible rows; ``row_key``: each one's pair key;
    ``keys``: the distinct pair keys, ``prompt * n_cells + cell``."""

    rows: np.ndarray
    row_key: np.ndarray
    keys: np.ndarray
    prompt: np.ndarray
    cell: np.ndarray
    n_cells: int

    @classmethod
    def of(cls, eligible: np.ndarray, prompt_code: np.ndarray, cell: np.ndarray, n_cells: int) -> _PromptCellPairs:
        rows = np.flatnonzero(eligible)
        row_key = prompt_code[rows] * n_cells + cell[rows]
        keys = np.unique(row_key)
        return cls(rows, row_key, keys, keys // n_cells, keys % n_cells, n_cells)

    def distinct_prompts_per_cell(self) -> np.ndarray:
        return np.bincount(self.cell, minlength=self.n_cells)


def _is_prompt(condition_column: pd.Series) -> np.ndarray:
    """Whether each row was written to a prompt; a condition outside :data:`CONDITIONS` is refused."""
    condition = _Column.of(condition_column)
    bad = [v for v in condition.values if v not in CONDITIONS] + (["<missing>"] if (condition.codes < 0).any() else [])
    if bad:
        raise ValueError(f"condition must be one of {CONDITIONS}; got {sorted(map(str, bad))[:5]}")
    return condition.lookup(np.array([v == "prompt" for v in condition.values], dtype=bool), False)


def _require_predictions(candidates: np.ndarray, pred_na: np.ndarray, min_size: int) -> None:
    """Refuse the chance constraint when none of the examples that could reach dev or test has a
    model prediction. Imported examples carry none: no (gold, predicted) cell can be filled,
    and saying "0 eligible examples from distinct prompts" per cell would hide why."""
    if candidates.any() and pred_na[candidates].all():
        raise SplitError(
            f"none of the {int(candidates.sum()):,} examples with gold that could reach dev or test has a model "
            "prediction "
            "(imported examples carry none), so no (gold, predicted) cell can be filled: holding the model at "
            "chance needs the round's model's predictions; build without the chance constraint (the relaxed "
            "policy with chance off)",
            constraint="dev_test_size",
            min_size=min_size,
            unit="cell",
        )


def _short_cells(available: np.ndarray, cell_names: Sequence[str], need: int) -> list[dict[str, Any]]:
    """The cells with fewer distinct prompts than ``need``, fewest first: what a refusal lists."""
    return [
        {"cell": cell_names[j], "available": int(available[j]), "needed": need, "short_by": int(need - available[j])}
        for j in np.argsort(available, kind="stable")
        if available[j] < need
    ]


def _feasible_bound(
    graph: _PromptGraph, available: np.ndarray, cell_names: list[str], min_size: int, chance: bool
) -> int:
    """The naive bound on the per-cell dev+test total (ignoring shared prompts); refused when
    not even ``min_size`` per cell in each of dev and test is feasible."""
    bound_total = int(min(available.min(), graph.n_eligible_prompts // graph.n_cells))
    need = 2 * min_size
    if bound_total < need or not graph.feasible(need):
        raise SplitError(
            graph.diagnose(need, min_size, available, cell_names, chance),
            constraint="dev_test_size",
            min_size=min_size,
            unit="cell" if chance else "class",
            short=_short_cells(available, cell_names, need),
        )
    return bound_total


@dataclass(frozen=True)
class _Sizes:
    """Dev and test per cell, the largest feasible dev+test total per cell and its naive
    bound, whether dev_size/test_size capped them, and the class-balance guard as used."""

    dev: int
    test: int
    max_total: int
    bound_total: int
    capped: bool
    guard: _BalanceGuard | None

    @classmethod
    def of(
        cls,
        graph: _PromptGraph,
        guard: _BalanceGuard | None,
        bound_total: int,
        min_size: int,
        dev_size: int | None,
        test_size: int | None,
    ) -> _Sizes:
        need = 2 * min_size
        bound_total = _guarded_bound(guard, bound_total, need, min_size)
        max_total = graph.largest_feasible(need, bound_total)
        if guard is not None:
            guard = guard.used(max_total)
        d, t = _dev_test_sizes(max_total, dev_size, test_size)
        capped = (dev_size is not None or test_size is not None) and d + t < max_total
        return cls(d, t, max_total, bound_total, capped, guard)


def _guarded_bound(guard: _BalanceGuard | None, bound_total: int, need: int, min_size: int) -> int:
    """The per-cell total dev+test may reach under the class-balance guard; refused when the
    guard leaves less than ``need``."""
    if guard is None or guard.total >= bound_total:
        return bound_total
    if guard.total < need:
        raise SplitError(guard.message(need), constraint="balance_guard", min_size=min_size, short=guard.short(need))
    return guard.total


def _shares_a_chosen_prompt(
    in_pool: np.ndarray, prompt_code: np.ndarray, chosen_prompt: np.ndarray, chosen_rows: np.ndarray, n_prompts: int
) -> np.ndarray:
    """The rows not in dev or test whose prompt is a dev/test example's: excluded from train."""
    used_prompt = np.zeros(n_prompts, dtype=bool)
    used_prompt[chosen_prompt] = True
    assessed_row = np.zeros(len(prompt_code), dtype=bool)
    assessed_row[chosen_rows] = True
    return in_pool & used_prompt[np.maximum(prompt_code, 0)] & ~assessed_row


def _canonical_order(examples: pd.DataFrame) -> np.ndarray:
    """The rows sorted by example_id, so that the result does not depend on row order."""
    try:
        return np.asarray(examples["example_id"].argsort(kind="stable"), dtype=np.int64)
    except TypeError:  # ids of mixed types: keep the input order
        return np.arange(len(examples))


def _cells(
    labels: Sequence[str], gc: _GoldClasses, pred_label: np.ndarray, eligible: np.ndarray, chance: bool
) -> tuple[int, np.ndarray, list[str]]:
    """How many cells dev and test balance over, each row's cell (-1: not eligible) and the
    cells' names: (gold, predicted) pairs with ``chance``, gold classes without."""
    K = len(labels)
    if chance:
        cell = np.where(eligible, gc.class_code * K + pred_label, -1)
        return K * K, cell, [f"gold={g}/predicted={p}" for g in labels for p in labels]
    return len(gc.keys), np.where(eligible, gc.class_code, -1), list(gc.names)


def _prompt_codes(prompt_id: pd.Series, is_prompt: np.ndarray, in_pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's prompt in the pool (-1: not in the pool) and each prompt's examples: the prompt
    condition's prompt_id; a missing one (and a no-prompt example in the pool) is a prompt of
    its own."""
    prompt_code = np.full(len(prompt_id), -1, dtype=np.int64)
    pool_prompts = pd.Series(prompt_id.to_numpy(), dtype=object).where(is_prompt, None).to_numpy()
    codes, uniques = pd.factorize(pool_prompts[in_pool], use_na_sentinel=True)
    missing = codes < 0
    codes = codes.astype(np.int64)
    codes[missing] = len(uniques) + np.arange(missing.sum())
    prompt_code[in_pool] = codes
    n_prompts = len(uniques) + int(missing.sum())
    return prompt_code, np.bincount(codes, minlength=n_prompts)


def _dev_test_sizes(max_total: int, dev_size: int | None, test_size: int | None) -> tuple[int, int]:
    """Dev and test per cell out of ``max_total``: halves without caps; with caps balanced where
    possible, a capped split leaving its share to the other."""
    if dev_size is None and test_size is None:
        return max_total // 2, max_total // 2
    d_cap = math.inf if dev_size is None else dev_size
    t_cap = math.inf if test_size is None else test_size
    d = int(min(d_cap, max_total // 2))
    t = int(min(t_cap, max_total - d))
    return int(min(d_cap, max_total - t)), t


def _chosen_rows(
    el: np.ndarray, pair_key: np.ndarray, pairs: np.ndarray, chosen_keys: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """For each chosen (prompt, cell) pair, a seeded random one of its eligible examples (rows)."""
    by_pair = np.lexsort((rng.random(len(el)), pair_key))
    first = np.ones(len(by_pair), dtype=bool)
    first[1:] = pair_key[by_pair][1:] != pair_key[by_pair][:-1]
    rep_rows = el[by_pair[first]]  # one representative row per unique pair, aligned with `pairs`
    return rep_rows[np.searchsorted(pairs, chosen_keys)]


def _dev_or_test(
    n: int, chosen_rows: np.ndarray, chosen_cell: np.ndarray, d: int, rng: np.random.Generator
) -> np.ndarray:
    """Each row's split (index into SPLITS, train unless chosen): a seeded shuffle within each
    cell, the first ``d`` chosen rows to dev, the rest to test."""
    within = np.lexsort((rng.random(len(chosen_rows)), chosen_cell))
    sorted_cells = chosen_cell[within]
    rank = np.arange(len(within)) - np.searchsorted(sorted_cells, sorted_cells, side="left")
    split = np.zeros(n, dtype=np.int8)
    split[chosen_rows[within[rank < d]]] = _DEV
    split[chosen_rows[within[rank >= d]]] = _TEST
    return split


def _in_input_order(
    examples: pd.DataFrame,
    order: np.ndarray,
    split: np.ndarray,
    is_prompt: np.ndarray,
    shared: np.ndarray,
    reason: np.ndarray,
) -> tuple[pd.Series, pd.DataFrame]:
    """The assignment and the flags, indexed by example_id in the input's row order."""
    n = len(order)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    index = pd.Index(examples["example_id"], name="example_id")
    assignment = pd.Series(
        pd.Categorical.from_codes(split[inverse], categories=pd.Index(SPLITS)), index=index, name="split"
    )
    flags = pd.DataFrame(
        {
            "no_prompt": ~is_prompt[inverse],
            "prompt_shared_with_assessment": shared[inverse],
            "ineligible_reason": pd.Categorical.from_codes(reason[inverse], categories=pd.Index(INELIGIBLE_REASONS)),
        },
        index=index,
    )
    return assignment, flags


class _PromptGraph:
    """Eligible prompts merged into interchangeable groups.

    A prompt's *mask* is the set of cells it has an eligible example in. Prompts with the same
    mask are interchangeable for size, so the flow network has one node per mask, whose
    capacity is how many prompts have it: source → mask → cell → sink. For the min-cost step a
    mask's prompts are further split into groups by cost (their number of other examples,
    which using them would exclude); within a mask the cheapest are always used first.
    """

    def __init__(self, pair_prompt: np.ndarray, pair_cell: np.ndarray, prompt_size: np.ndarray, n_cells: int) -> None:
        self.n_cells = C = n_cells
        prompts, starts = np.unique(pair_prompt, return_index=True)
        self.n_eligible_prompts = len(prompts)
        if n_cells <= _BITMASK_MAX_CELLS:
            bits = np.left_shift(np.int64(1), pair_cell.astype(np.int64))
            masks = np.bitwise_or.reduceat(bits, starts) if len(bits) else np.zeros(0, dtype=np.int64)
            mask_values, mask_id = np.unique(masks, return_inverse=True)
            self.mask_cells = [np.flatnonzero((int(m) >> np.arange(n_cells)) & 1) for m in mask_values]
        else:
            bounds = np.append(starts, len(pair_cell))
            keys = [tuple(pair_cell[a:b].tolist()) for a, b in itertools.pairwise(bounds)]
            # The bit-mask order (a binary number compares by its highest bits first).
            distinct = sorted(set(keys), key=lambda cells: cells[::-1])
            index = {k: i for i, k in enumerate(distinct)}
            mask_id = np.array([index[k] for k in keys], dtype=np.int64)
            self.mask_cells = [np.array(k, dtype=np.int64) for k in distinct]
        mask_id = np.asarray(mask_id, dtype=np.int64).reshape(-1)
        self.M = M = len(self.mask_cells)
        self.mask_count = np.bincount(mask_id, minlength=M).astype(np.int64)

        # Groups: (mask, size), sorted by mask then size, so each mask's groups are contiguous
        # and cheapest first.
        size = prompt_size[prompts].astype(np.int64)
        stride = int(size.max(initial=0)) + 1
        uniq, group_of = np.unique(mask_id * stride + size, return_inverse=True)
        self.prompts = prompts
        self.group_of = group_of.reshape(-1)
        self.G = len(uniq)
        self.group_count = np.bincount(self.group_of, minlength=self.G).astype(np.int64)
        self.group_mask = uniq // stride
        self.group_cost = (uniq % stride - 1).astype(float)
        self.mask_groups = np.searchsorted(self.group_mask, np.arange(M + 1))  # group range per mask

        # Arcs mask → cell.
        self.arc_mask = np.repeat(np.arange(M), [len(c) for c in self.mask_cells]).astype(np.int64)
        self.arc_cell = (np.concatenate(self.mask_cells) if M else np.zeros(0)).astype(np.int64)
        # Node ids: 0 source, 1..M masks, M+1..M+C cells, M+C+1 sink.
        self.source, self.sink = 0, M + C + 1
        self._rows = np.concatenate([np.zeros(M, dtype=np.int64), 1 + self.arc_mask, 1 + M + np.arange(C)])
        self._cols = np.concatenate([1 + np.arange(M), 1 + M + self.arc_cell, np.full(C, self.sink)])
        self._fixed = np.concatenate([self.mask_count, self.mask_count[self.arc_mask]])

    def _capacity(self, k: int) -> sp.csr_array:
        data = np.concatenate([self._fixed, np.full(self.n_cells, k, dtype=np.int64)]).astype(np.int32)
        size = self.sink + 1
        return sp.csr_array((data, (self._rows, self._cols)), shape=(size, size))

    def _flow(self, k: int) -> tuple[int, sp.csr_array, sp.csr_array]:
        capacity = self._capacity(k)
        result = maximum_flow(capacity, self.source, self.sink, method="dinic")
        return int(result.flow_value), capacity, sp.csr_array(result.flow)

    def feasible(self, k: int) -> bool:
        return self._flow(k)[0] == k * self.n_cells

    def largest_feasible(self, low: int, high: int) -> int:
        """Largest k in [low, high] with a full flow; ``low`` is known feasible."""
        if self.feasible(high):
            return high
        high -= 1
        while low < high:
            mid = (low + high + 1) // 2
            if self.feasible(mid):
                low = mid
            else:
                high = mid - 1
        return low

    def assignment(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(group, cell, units) filling every cell to k while excluding the fewest other examples."""
        value, _, flow = self._flow(k)
        if value != k * self.n_cells:  # k is at most the largest feasible, so this cannot happen
            raise SplitError(f"internal: the flow for {k} per cell is not full ({value})")
        arc_units = np.asarray(flow[1 + self.arc_mask, 1 + self.M + self.arc_cell]).reshape(-1).astype(np.int64)
        if self.G and k and not np.all(self.group_cost == self.group_cost[0]):
            arc_units = self._cheapest(k, arc_units)
        return self._by_group(arc_units)

    def _cheapest(self, k: int, arc_units: np.ndarray) -> np.ndarray:
        """Min-cost version of the flow as a linear program: z_g units from group g into its
        mask (cost: its size - 1 each, at most its count), y_a units along arc a (mask → cell);
        each mask passes on what it receives and each cell gets k. A network matrix is totally
        unimodular, so the simplex vertex HiGHS returns is integral (checked; else the plain
        max-flow is kept)."""
        G, A, M, C = self.G, len(self.arc_mask), self.M, self.n_cells
        cost = np.concatenate([self.group_cost, np.zeros(A)])
        rows = np.concatenate([self.group_mask, self.arc_mask, M + self.arc_cell])
        cols = np.concatenate([np.arange(G), G + np.arange(A), G + np.arange(A)])
        vals = np.concatenate([np.ones(G), -np.ones(A), np.ones(A)])
        a_eq = sp.csr_array((vals, (rows, cols)), shape=(M + C, G + A))
        b_eq = np.concatenate([np.zeros(M), np.full(C, k)])
        bounds = [(0.0, upper) for upper in np.concatenate([self.group_count, np.full(A, np.inf)])]
        # HiGHS takes a sparse A_eq (scipy.optimize._linprog_util._check_sparse_inputs); scipy-stubs type it dense only.
        lp = linprog(cost, A_eq=cast(Any, a_eq), b_eq=b_eq, bounds=bounds, method="highs-ipm")
        if lp.status != 0 or lp.x is None:
            return arc_units
        y = np.rint(lp.x[G:]).astype(np.int64)
        through = np.bincount(self.arc_mask, weights=y, minlength=M)
        ok = (
            np.abs(lp.x[G:] - y).max(initial=0) < 1e-6
            and (y >= 0).all()
            and (np.bincount(self.arc_cell, weights=y, minlength=C) == k).all()
            and (through <= self.mask_count).all()
            and self._cost(y) <= self._cost(arc_units)
        )
        return y if ok else arc_units

    def _fill(self, arc_units: np.ndarray) -> np.ndarray:
        """Units per group: each mask's throughput taken from its cheapest groups first."""
        through = np.bincount(self.arc_mask, weights=arc_units, minlength=self.M).astype(np.int64)
        start = self.mask_groups[self.group_mask]  # first group of each group's mask
        before = np.cumsum(self.group_count) - self.group_count  # count of earlier groups overall
        earlier_in_mask = before - before[start]
        return np.clip(through[self.group_mask] - earlier_in_mask, 0, self.group_count)

    def _cost(self, arc_units: np.ndarray) -> float:
        return float(self.group_cost @ self._fill(arc_units))

    def _by_group(self, arc_units: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Split each mask's arc units among its groups (cheapest first): (group, cell, units)."""
        group_units = self._fill(arc_units)
        out_group, out_cell, out_units = [], [], []
        arc_start = np.searchsorted(self.arc_mask, np.arange(self.M + 1))
        for m in range(self.M):
            groups = [
                [g, int(group_units[g])] for g in range(self.mask_groups[m], self.mask_groups[m + 1]) if group_units[g]
            ]
            gi = 0
            for a in range(arc_start[m], arc_start[m + 1]):
                need = int(arc_units[a])
                while need:
                    take = min(need, groups[gi][1])
                    out_group.append(groups[gi][0])
                    out_cell.append(self.arc_cell[a])
                    out_units.append(take)
                    groups[gi][1] -= take
                    need -= take
                    if not groups[gi][1]:
                        gi += 1
        return (
            np.asarray(out_group, dtype=np.int64),
            np.asarray(out_cell, dtype=np.int64),
            np.asarray(out_units, dtype=np.int64),
        )

    def realise(
        self, plan: tuple[np.ndarray, np.ndarray, np.ndarray], rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Concrete prompts for a plan: a seeded random order within each group."""
        order = np.lexsort((rng.random(len(self.prompts)), self.group_of))
        members = self.prompts[order]
        group_start = np.concatenate([[0], np.cumsum(self.group_count)])
        taken = np.zeros(self.G, dtype=np.int64)
        out_prompt, out_cell = [], []
        for g, cell, units in zip(*plan, strict=True):
            start = group_start[g] + taken[g]
            out_prompt.append(members[start : start + units])
            out_cell.append(np.full(units, cell, dtype=np.int64))
            taken[g] += units
        if not out_prompt:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(out_prompt), np.concatenate(out_cell)

    def diagnose(self, need: int, min_size: int, available: np.ndarray, cell_names: list[str], chance: bool) -> str:
        what = "cell" if chance else "class"
        wanted = f"dev and test need at least 2×{min_size}"
        short = [j for j in np.argsort(available, kind="stable") if available[j] < need]
        if short:
            j = short[0]
            message = (
                f"{what} {cell_names[j]} has {available[j]} eligible examples from distinct prompts; "
                f"{wanted} (short by {need - available[j]})"
            )
            if len(short) > 1:
                message += (
                    f"; {len(short) - 1} other {what}{'s' if len(short) > 2 else ''} short too: "
                    + ", ".join(f"{cell_names[i]} ({available[i]})" for i in short[1:6])
                    + (", ..." if len(short) > 6 else "")
                )
            return message
        # Hall's condition fails jointly. The cells on the sink side of a minimum cut draw on
        # fewer prompts than they need between them; the cut nearest the sink (nodes that can
        # still reach it in the residual graph) gives the smallest such set of cells.
        _value, capacity, flow = self._flow(need)
        residual = (capacity - flow).tocsr()
        residual.data[residual.data < 0] = 0
        residual.eliminate_zeros()
        reaches_sink = np.zeros(self.sink + 1, dtype=bool)
        reaches_sink[breadth_first_order(residual.T.tocsr(), self.sink, directed=True, return_predecessors=False)] = (
            True
        )
        cells = [j for j in range(self.n_cells) if reaches_sink[1 + self.M + j]]
        in_set = np.zeros(self.n_cells, dtype=bool)
        in_set[cells] = True
        prompts = int(sum(self.mask_count[m] for m in range(self.M) if in_set[self.mask_cells[m]].any()))
        names = ", ".join(cell_names[j] for j in cells)
        total = need * len(cells)
        return (
            f"{what}s {names} have eligible examples from only {prompts} distinct prompts between them "
            f"(each prompt serves at most one dev/test example); {wanted} from each, {total} in all "
            f"(short by {total - prompts})"
        )


def _check_arguments(
    examples: pd.DataFrame,
    labels: Sequence[str],
    min_votes: int,
    dev_size: int | None,
    test_size: int | None,
    min_size: int,
) -> list[str]:
    missing = [c for c in COLUMNS if c not in examples.columns]
    if missing:
        raise ValueError(f"examples need the columns {COLUMNS}; missing {missing}")
    labels = list(labels)
    if not labels or len(set(labels)) != len(labels) or not all(isinstance(v, str) for v in labels):
        raise ValueError(f"labels must be a non-empty list of distinct strings, got {labels}")
    if examples["example_id"].isna().any() or examples["example_id"].duplicated().any():
        dup = examples["example_id"][examples["example_id"].duplicated()].head(3).tolist()
        raise ValueError(f"example_id must be unique and present; duplicates or missing: {dup}")
    if min_votes < 1:
        raise ValueError(f"min_votes must be at least 1, got {min_votes}")
    if min_size < 1:
        raise ValueError(f"min_size must be at least 1 (dev and test may not be empty), got {min_size}")
    for name, value in (("dev_size", dev_size), ("test_size", test_size)):
        if value is not None and value < min_size:
            raise ValueError(f"{name}={value} is below min_size={min_size}")
    return labels


def _is_set(value: object) -> TypeGuard[tuple[object, ...] | list[object] | frozenset[object] | set[object]]:
    return isinstance(value, tuple | list | frozenset | set)


def _display(value: object) -> str:
    if _is_set(value):
        members = sorted(map(str, value))
        return "+".join(members) if members else "(none)"
    return str(value)


def _label_set(value: object, position: Mapping[str, int]) -> tuple[str, ...] | None:
    """A gold value (a set of labels or one label) as its sorted labels; None if one is not a task label."""
    members = value if _is_set(value) else (value,)
    labels = [m for m in members if m in position and isinstance(m, str)]
    if len(labels) != len(members):
        return None
    return tuple(sorted(set(labels)))


def _label_index(values: list[object], labels: list[str]) -> np.ndarray:
    position = {label: i for i, label in enumerate(labels)}
    return np.array([position.get(v, -1) if isinstance(v, str) else -1 for v in values], dtype=np.int64)


@dataclass(frozen=True)
class _Column:
    """A column as codes into its distinct values (-1: missing), so that per-value work
    (label lookups, display names) runs once per distinct value rather than once per row."""

    codes: np.ndarray
    values: list[object]  # lists and sets made tuples

    @classmethod
    def of(cls, series: pd.Series) -> _Column:
        try:
            codes, uniques = pd.factorize(series, use_na_sentinel=True)
        except TypeError:  # lists or sets: unhashable
            codes, uniques = pd.factorize(
                series.map(lambda v: tuple(v) if isinstance(v, list | set) else v), use_na_sentinel=True
            )
        return cls(np.asarray(codes, dtype=np.int64), list(uniques))

    def lookup(self, per_value: np.ndarray, missing: object) -> np.ndarray:
        table = np.append(np.asarray(per_value), np.asarray([missing], dtype=np.asarray(per_value).dtype))
        return table[self.codes]  # code -1 picks the last entry: the missing value


@dataclass(frozen=True)
class _GoldClasses:
    keys: Sequence[object]  # the classes dev/test balance over (labels, or sorted label tuples)
    names: list[str]
    class_code: np.ndarray  # per row: index into keys, -1 for none
    label_code: np.ndarray  # per row: index into labels (single-label gold), -1 otherwise
    in_labels: np.ndarray  # per row: gold within the task's labels (True where gold is missing)
    assessed: np.ndarray  # per row: not excluded from dev/test by the choice of classes
    display: list[str]  # per distinct gold value
    single_label: bool

    @classmethod
    def build(
        cls, gold: _Column, labels: list[str], chance: bool, classes: Sequence[object] | None, could_assess: np.ndarray
    ) -> _GoldClasses:
        is_set = [_is_set(v) for v in gold.values]
        if chance and any(is_set):
            raise ValueError(
                "chance=True needs one gold label per example; multi-label gold (tuples) needs chance=False"
            )
        display = [_display(v) for v in gold.values]
        label_index = _label_index(gold.values, labels)
        if not any(is_set):
            keys: Sequence[object] = list(labels)
            if classes is not None:
                wanted = set(classes)
                if not wanted <= set(labels):
                    raise ValueError(f"classes must be task labels {labels}; got {list(classes)}")
                keys = [c for c in labels if c in wanted]
            remap = np.array([keys.index(v) if v in keys else -1 for v in labels] + [-1], dtype=np.int64)
            class_index = remap[label_index]
            in_labels = label_index >= 0
        else:  # multi-label: each distinct set (canonical: sorted tuple, as rounds.build.table stores it)
            position = {label: i for i, label in enumerate(labels)}
            canon = [_label_set(v, position) for v in gold.values]
            in_labels = np.array([c is not None for c in canon], dtype=bool)
            if classes is None:
                present = np.bincount(gold.codes[could_assess & (gold.codes >= 0)], minlength=len(canon)) > 0
                seen = {c for c, p in zip(canon, present, strict=True) if p and c is not None}
            else:
                seen = set()
                for c in classes:
                    label_set = _label_set(c, position)
                    if label_set is None:
                        raise ValueError(f"class {c!r} has labels outside the task's labels {labels}")
                    seen.add(label_set)
            label_sets = sorted(seen, key=lambda s: (len(s), [position[m] for m in s]))
            index = {k: i for i, k in enumerate(label_sets)}
            keys = label_sets
            class_index = np.array([index.get(c, -1) if c is not None else -1 for c in canon], dtype=np.int64)
        class_code = gold.lookup(class_index, -1)
        in_labels_row = gold.lookup(in_labels, True)
        return cls(
            keys=keys,
            names=[_display(k) for k in keys],
            class_code=class_code,
            label_code=gold.lookup(label_index, -1),
            in_labels=in_labels_row,
            assessed=(gold.codes < 0) | ~in_labels_row | (class_code >= 0),
            display=display,
            single_label=not any(is_set),
        )


@dataclass(frozen=True)
class _ReportInput:
    labels: list[str]
    gold: _Column
    prediction: _Column
    gc: _GoldClasses
    pred_label: np.ndarray
    split: np.ndarray
    reason: np.ndarray
    shared: np.ndarray
    is_prompt: np.ndarray
    chance: bool
    seed: int
    min_votes: int
    cell_names: list[str]
    cell: np.ndarray
    available: np.ndarray
    eligible_examples: np.ndarray
    sizes: _Sizes
    class_eligible: np.ndarray


@dataclass(frozen=True)
class _BalanceGuard:
    """At most ``share`` of each class's eligible examples go to dev+test (docs/round_builder.md,
    "Class balance guard"): ``total`` is the largest per-cell dev+test total that allows."""

    share: float
    class_eligible: np.ndarray
    names: list[str]
    cells_per_class: int
    total: int

    @classmethod
    def of(cls, share: float | None, class_eligible: np.ndarray, names: list[str], cells: int) -> _BalanceGuard | None:
        if share is None:
            return None
        if not 0 < share <= 1:
            raise ValueError(f"max_dev_test_share must be in (0, 1], got {share}")
        allowed = np.floor(class_eligible * share + 1e-9).astype(np.int64) // cells
        return cls(share, class_eligible, names, cells, int(allowed.min()) if len(allowed) else 0)

    def used(self, total: int) -> _BalanceGuard:
        return _BalanceGuard(self.share, self.class_eligible, self.names, self.cells_per_class, total)

    def short(self, need: int) -> list[dict[str, object]]:
        out = []
        for j in np.argsort(self.class_eligible, kind="stable"):
            have = int(self.class_eligible[j])
            wanted = math.ceil(need * self.cells_per_class / self.share)
            if have < wanted:
                out.append({"cell": self.names[j], "available": have, "needed": wanted, "short_by": wanted - have})
        return out

    def message(self, need: int) -> str:
        short = self.short(need)
        listed = ", ".join(f"{s['cell']} ({s['available']} of {s['needed']})" for s in short[:6])
        return (
            f"the class-balance guard lets dev+test take at most {self.share:g} of each class's eligible "
            f"examples; dev and test need {need * self.cells_per_class} of a class, so a class needs "
            f"{short[0]['needed'] if short else '?'} eligible examples: short are {listed}"
        )


def _display_codes(column: _Column, display: list[str], missing: str) -> tuple[np.ndarray, list[str]]:
    """Per row, an index into the returned distinct display names (``missing`` last)."""
    codes, names = pd.factorize(pd.Series(display + [missing], dtype=object))
    return column.lookup(codes[:-1], codes[-1]), list(names)


def _report(r: _ReportInput) -> SplitReport:
    by_gold, gold_row, gold_names = _counts_by_gold(r)
    metrics = _model_metrics(r)
    at_chance = None
    if r.chance:
        K = len(r.labels)
        at_chance = all(
            math.isclose(m["macro_f1"], 1 / K, rel_tol=1e-9) and math.isclose(m["accuracy"], 1 / K, rel_tol=1e-9)
            for m in metrics.values()
        )
    reasons = np.bincount(r.reason[r.reason >= 0], minlength=len(INELIGIBLE_REASONS))
    eligible = r.reason < 0
    balance_classes = _class_balance(r)
    return SplitReport(
        labels=list(r.labels),
        classes=list(r.gc.names),
        chance=r.chance,
        seed=r.seed,
        min_votes=r.min_votes,
        unit=_unit(r.chance),
        counts_by_gold=by_gold,
        counts_by_cell=_counts_by_cell(r, gold_row, gold_names),
        availability=_availability(r),
        dev_per_cell=r.sizes.dev,
        test_per_cell=r.sizes.test,
        max_c=r.sizes.max_total // 2,
        upper_bound_c=r.sizes.bound_total // 2,
        max_total_per_cell=r.sizes.max_total,
        upper_bound_total_per_cell=r.sizes.bound_total,
        capped=r.sizes.capped,
        model_metrics=metrics,
        chance_macro_f1=1 / len(r.labels) if r.chance else None,
        at_chance=at_chance,
        excluded={"prompt_shared_with_assessment": int(r.shared.sum())} if r.shared.any() else {},
        ineligible={name: int(c) for name, c in zip(INELIGIBLE_REASONS, reasons, strict=True) if c},
        eligible_in_train=int((eligible & (r.split == _TRAIN)).sum()),
        no_prompt_in_train=int((~r.is_prompt & (r.split == _TRAIN)).sum()),
        notes=_notes(r, balance_classes),
        balance={
            "max_dev_test_share": r.sizes.guard.share if r.sizes.guard is not None else None,
            "classes": balance_classes,
        },
    )


def _unit(chance: bool) -> str:
    return "cell" if chance else "class"


def _counts_by_gold(r: _ReportInput) -> tuple[pd.DataFrame, np.ndarray, list[str]]:
    """Table 4/7: rows the balanced classes, other labels, other gold values (e.g. mixed), no
    majority and Total; also each row's gold row code and the distinct gold display names."""
    labels, gc = r.labels, r.gc
    n_splits = len(SPLITS)
    gold_row, gold_names = _display_codes(r.gold, gc.display, NO_MAJORITY)
    counts = np.bincount(gold_row * n_splits + r.split, minlength=len(gold_names) * n_splits)
    by_gold = pd.DataFrame(
        counts.reshape(len(gold_names), n_splits), index=pd.Index(gold_names, name="gold"), columns=list(SPLITS)
    )
    known = set(gc.names) | set(labels) | {NO_MAJORITY}
    rows = (
        gc.names
        + [v for v in labels if v not in gc.names]
        + sorted(v for v in gold_names if v not in known)
        + [NO_MAJORITY]
    )
    by_gold = by_gold.reindex(rows, fill_value=0)
    by_gold.loc["Total"] = by_gold.sum()
    return by_gold, gold_row, gold_names


def _counts_by_cell(r: _ReportInput, gold_row: np.ndarray, gold_names: list[str]) -> pd.DataFrame | None:
    """Counts per (gold, predicted) cell: every pair of labels, then other pairs seen; None for
    multi-label gold or without predictions."""
    if not (r.gc.single_label and len(r.prediction.values)):
        return None
    labels, n_splits = r.labels, len(SPLITS)
    pred_row, pred_names = _display_codes(r.prediction, [_display(v) for v in r.prediction.values], NO_PREDICTION)
    P = len(pred_names)
    counts = np.bincount(
        (gold_row * P + pred_row) * n_splits + r.split, minlength=len(gold_names) * P * n_splits
    ).reshape(-1, n_splits)
    present = np.flatnonzero(counts.sum(axis=1))
    table = {(gold_names[k // P], pred_names[k % P]): counts[k] for k in present}
    full = list(itertools.product(labels, labels))
    extra = sorted(k for k in table if k not in set(full))
    zero = np.zeros(n_splits, dtype=np.int64)
    return pd.DataFrame(
        [table.get(k, zero) for k in full + extra],
        columns=list(SPLITS),
        index=pd.MultiIndex.from_tuples(full + extra, names=["gold", "predicted"]),
    )


def _availability(r: _ReportInput) -> pd.DataFrame:
    """Per dev/test cell (or class): eligible examples, distinct prompts, dev and test counts."""
    n_cells = len(r.cell_names)
    return pd.DataFrame(
        {
            "eligible_examples": r.eligible_examples,
            "distinct_prompts": r.available,
            "dev": np.bincount(r.cell[r.split == _DEV], minlength=n_cells),
            "test": np.bincount(r.cell[r.split == _TEST], minlength=n_cells),
        },
        index=pd.Index(r.cell_names, name=_unit(r.chance)),
    )


def _model_metrics(r: _ReportInput) -> dict[str, dict[str, float]]:
    """The model's n, macro-F1 and accuracy on dev and test (single-label gold only)."""
    # Imported here: scikit-learn is slow to import and only the report needs it.
    from sklearn.metrics import accuracy_score, f1_score

    metrics: dict[str, dict[str, float]] = {}
    K = len(r.labels)
    for name, code in (("dev", _DEV), ("test", _TEST)):
        rows = (r.split == code) & (r.prediction.codes >= 0)
        if not r.gc.single_label or not rows.any():
            continue
        # Integer codes (K: a prediction outside the labels) are much faster than strings.
        y_true = r.gc.label_code[rows]
        y_pred = np.where(r.pred_label[rows] >= 0, r.pred_label[rows], K)
        metrics[name] = {
            "n": int(rows.sum()),
            "macro_f1": float(f1_score(y_true, y_pred, labels=list(range(K)), average="macro", zero_division=0)),
            "accuracy": float(accuracy_score(y_true, y_pred)),
        }
    return metrics


def _class_balance(r: _ReportInput) -> dict[str, dict[str, int]]:
    """Per class: eligible examples and how many of them went to train, dev and test; all of
    the class's examples in train."""
    eligible = r.reason < 0
    balance_classes: dict[str, dict[str, int]] = {}
    for j, name in enumerate(r.gc.names):
        of_class = eligible & (r.gc.class_code == j)
        balance_classes[name] = {
            "eligible": int(r.class_eligible[j]),
            "train": int((of_class & (r.split == _TRAIN)).sum()),
            "dev": int((of_class & (r.split == _DEV)).sum()),
            "test": int((of_class & (r.split == _TEST)).sum()),
            "train_all": int(((r.gc.class_code == j) & (r.split == _TRAIN)).sum()),
        }
    return balance_classes


def _notes(r: _ReportInput, balance_classes: dict[str, dict[str, int]]) -> list[str]:
    """The report's notes: a cap, the cost of shared prompts, many excluded, a class missing in train."""
    unit = _unit(r.chance)
    notes = []
    if r.sizes.capped:
        notes.append(f"dev/test capped below the largest feasible size ({r.sizes.max_total // 2} per {unit} each)")
    if r.sizes.max_total // 2 < r.sizes.bound_total // 2:
        notes.append(
            f"prompts shared between cells cost {r.sizes.bound_total // 2 - r.sizes.max_total // 2} per {unit} "
            "against the naive bound"
        )
    n_excluded = int(r.shared.sum())
    if n_excluded > int((r.split == _DEV).sum() + (r.split == _TEST).sum()):
        notes.append(
            f"{n_excluded} examples are excluded because their prompt serves dev/test, more than "
            "dev and test hold; capping dev/test (dev_size/test_size) keeps more of them for train"
        )
    empty = [name for name, c in balance_classes.items() if c["train_all"] == 0]
    if empty:
        notes.append(f"train has no example of {', '.join(empty)}")
    return notes


def _plain(value: object) -> object:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value
