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
capacity is their number; 150,000 prompts become a few hundred nodes and each max-flow takes
milliseconds. A binary search on ``k`` with ``scipy.sparse.csgraph.maximum_flow`` finds the
largest feasible ``k``; a min-cost version of the same flow (``scipy.optimize.linprog``,
exact because a network matrix is totally unimodular) then picks, among the optimal
assignments, one that excludes the fewest other examples of the chosen prompts. The seed
decides which interchangeable prompt, which example of a prompt, and dev vs test.

When a constraint cannot be met a :class:`SplitError` says which and by how much, using the
min cut of the flow to name the cells that lack prompts (Hall's condition).

Example::

    >>> import pandas as pd
    >>> rows = [(f"e{g}{p}{i}", g, 5, f"p{g}{p}{i}", "prompt", p)
    ...         for g in "ab" for p in "ab" for i in range(2)]
    >>> frame = pd.DataFrame(rows, columns=["example_id", "gold", "gold_votes", "prompt_id",
    ...                                     "condition", "model_prediction"])
    >>> result = build_splits(frame, ["a", "b"], min_votes=4, seed=0)
    >>> result.assignment.value_counts().to_dict()
    {'dev': 4, 'test': 4}
    >>> result.report.model_metrics["dev"]["macro_f1"]
    0.5
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.optimize import linprog
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from services.errors import Invalid

__all__ = ["COLUMNS", "SPLITS", "SplitError", "SplitReport", "SplitResult", "build_splits"]

COLUMNS = ["example_id", "gold", "gold_votes", "prompt_id", "condition", "model_prediction"]
SPLITS = ("train", "dev", "test", "excluded")
CONDITIONS = ("prompt", "no_prompt")

NO_MAJORITY = "no majority"
NO_PREDICTION = "no prediction"

# Why an example could not go to dev/test (first that applies).
INELIGIBLE_REASONS = ("no_prompt", "no_majority", "gold_not_in_labels", "class_not_assessed",
                      "below_min_votes", "no_model_prediction", "prediction_not_in_labels")

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

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable form (for the build record and the datasheet)."""

        def table(frame: pd.DataFrame | None) -> list[dict[str, object]] | None:
            if frame is None:
                return None
            out = frame.reset_index()
            return [{str(k): _plain(v) for k, v in row.items()} for row in out.to_dict("records")]

        return {
            "labels": list(self.labels), "classes": list(self.classes), "chance": self.chance,
            "seed": self.seed, "min_votes": self.min_votes, "unit": self.unit,
            "counts_by_gold": table(self.counts_by_gold),
            "counts_by_cell": table(self.counts_by_cell),
            "availability": table(self.availability),
            "dev_per_cell": self.dev_per_cell, "test_per_cell": self.test_per_cell,
            "max_c": self.max_c, "upper_bound_c": self.upper_bound_c,
            "max_total_per_cell": self.max_total_per_cell,
            "upper_bound_total_per_cell": self.upper_bound_total_per_cell,
            "capped": self.capped,
            "model_metrics": {s: {k: _plain(v) for k, v in m.items()} for s, m in self.model_metrics.items()},
            "chance_macro_f1": self.chance_macro_f1, "at_chance": self.at_chance,
            "excluded": dict(self.excluded), "ineligible": dict(self.ineligible),
            "eligible_in_train": self.eligible_in_train, "no_prompt_in_train": self.no_prompt_in_train,
            "notes": list(self.notes),
        }

    def to_markdown(self) -> str:
        """The Table 4/7 layout (majority-label counts per split) and the chance evidence."""
        lines = ["| gold | " + " | ".join(self.counts_by_gold.columns) + " |",
                 "|---" * (len(self.counts_by_gold.columns) + 1) + "|"]
        for name, row in self.counts_by_gold.iterrows():
            lines.append(f"| {name} | " + " | ".join(f"{int(v):,}" for v in row) + " |")
        lines.append("")
        per = "cell" if self.unit == "cell" else "class"
        lines.append(f"dev: {self.dev_per_cell} per {per}, test: {self.test_per_cell} per {per}; "
                     f"largest feasible c = {self.max_c} (bound ignoring shared prompts: {self.upper_bound_c})")
        for split in ("dev", "test"):
            m = self.model_metrics.get(split)
            if m:
                lines.append(f"model on {split}: macro-F1 {m['macro_f1']:.4f}, accuracy {m['accuracy']:.4f} "
                             f"(n={int(m['n'])})" + (f"; chance = {self.chance_macro_f1:.4f}"
                                                      if self.chance_macro_f1 is not None else ""))
        if self.excluded:
            lines.append("excluded: " + ", ".join(f"{k} {v}" for k, v in self.excluded.items()))
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SplitResult:
    """``assignment``: example_id → split (input order); ``flags``: per-example flags."""

    assignment: pd.Series  # name "split", values in SPLITS
    # Columns: no_prompt (bool, a no-prompt example, always train), prompt_shared_with_assessment
    # (bool, excluded because its prompt serves a dev/test example), ineligible_reason (str or
    # None: why it could not be a dev/test example).
    flags: pd.DataFrame
    report: SplitReport

    def ids(self, split: str) -> list[Hashable]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        return self.assignment.index[self.assignment.to_numpy() == split].tolist()


def build_splits(examples: pd.DataFrame, labels: Sequence[str], *, min_votes: int = 4, seed: int = 0,
                 dev_size: int | None = None, test_size: int | None = None, min_size: int = 1,
                 chance: bool = True, classes: Sequence[object] | None = None) -> SplitResult:
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
    """
    labels = _check_arguments(examples, labels, min_votes, dev_size, test_size, min_size)
    K = len(labels)

    # Canonical order (sorted by example_id) so that the result does not depend on row order.
    frame = examples
    try:
        order = np.argsort(frame["example_id"].to_numpy(), kind="stable")
    except TypeError:  # ids of mixed types: keep the input order
        order = np.arange(len(frame))
    frame = frame.iloc[order].reset_index(drop=True)
    n = len(frame)
    rng = np.random.default_rng(seed)

    condition = frame["condition"].astype(object).to_numpy()
    bad = ~np.isin(condition, CONDITIONS)
    if bad.any():
        raise ValueError(f"condition must be one of {CONDITIONS}; got {sorted(set(map(str, condition[bad])))[:5]}")
    is_prompt = condition == "prompt"

    gold = frame["gold"]
    gold_na = gold.isna().to_numpy()
    votes = pd.to_numeric(frame["gold_votes"], errors="coerce").fillna(0).to_numpy()
    prediction = frame["model_prediction"]
    pred_na = prediction.isna().to_numpy()

    # Class codes: index into class_keys, -1 outside the label set.
    class_keys, class_names, gold_code, in_labels, assessed = _classes(gold, gold_na, labels, chance, classes,
                                                                        votes >= min_votes, is_prompt)
    pred_code = _codes(prediction, labels) if not pred_na.all() else np.full(n, -1, dtype=np.int64)

    reason = np.full(n, None, dtype=object)
    checks = [(~is_prompt, "no_prompt"), (gold_na, "no_majority"), (~in_labels, "gold_not_in_labels"),
              (~assessed, "class_not_assessed"), (votes < min_votes, "below_min_votes")]
    if chance:
        checks += [(pred_na, "no_model_prediction"), (pred_code < 0, "prediction_not_in_labels")]
    for mask, name in reversed(checks):  # the first listed reason wins
        reason[mask] = name
    eligible = pd.isna(reason)

    if chance:
        n_cells = K * K
        cell = np.where(eligible, gold_code * K + pred_code, -1)
        cell_names = [f"gold={g}/predicted={p}" for g in labels for p in labels]
    else:
        n_cells = len(class_keys)
        cell = np.where(eligible, gold_code, -1)
        cell_names = list(class_names)

    if n_cells == 0:
        raise SplitError("no gold class has an eligible example (prompt condition, gold within the task's labels, "
                         f"at least {min_votes} votes), so there is nothing to balance dev and test over",
                         constraint="dev_test_size", min_size=min_size)

    # Prompts: the prompt condition's prompt_id; a missing one is a prompt of its own.
    prompt_code = np.full(n, -1, dtype=np.int64)
    pid = frame["prompt_id"].to_numpy()[is_prompt]
    codes, uniques = pd.factorize(pid, use_na_sentinel=True)
    missing = codes < 0
    codes = codes.astype(np.int64)
    codes[missing] = len(uniques) + np.arange(missing.sum())
    prompt_code[is_prompt] = codes
    n_prompts = len(uniques) + int(missing.sum())
    prompt_size = np.bincount(codes, minlength=n_prompts)

    # Unique eligible (prompt, cell) pairs; a prompt counts once per cell however many examples.
    el = np.flatnonzero(eligible)
    pair_key = prompt_code[el] * n_cells + cell[el]
    pairs = np.unique(pair_key)
    pair_prompt, pair_cell = pairs // n_cells, pairs % n_cells
    available = np.bincount(pair_cell, minlength=n_cells)  # distinct prompts per cell
    eligible_examples = np.bincount(cell[el], minlength=n_cells)

    graph = _PromptGraph(pair_prompt, pair_cell, prompt_size, n_cells)
    bound_total = int(min(available.min(), graph.n_eligible_prompts // n_cells))
    need = 2 * min_size
    if bound_total < need or not graph.feasible(need):
        raise SplitError(graph.diagnose(need, min_size, available, cell_names, chance),
                         constraint="dev_test_size", min_size=min_size)
    max_total = graph.largest_feasible(need, bound_total)

    d_cap = math.inf if dev_size is None else dev_size
    t_cap = math.inf if test_size is None else test_size
    if dev_size is None and test_size is None:
        d = t = max_total // 2
    else:  # caps: balanced where possible, a capped split leaves its share to the other
        d = int(min(d_cap, max_total // 2))
        t = int(min(t_cap, max_total - d))
        d = int(min(d_cap, max_total - t))
    capped = (dev_size is not None or test_size is not None) and d + t < max_total

    x = graph.assignment(d + t)  # units of each (group, cell) variable

    # Which prompts: a seeded random order within each interchangeable group.
    chosen_prompt, chosen_cell = graph.realise(x, rng)
    # Which example of a chosen prompt in its cell: a seeded random one.
    rand = rng.random(len(el))
    by_pair = np.lexsort((rand, pair_key))
    first = np.ones(len(by_pair), dtype=bool)
    first[1:] = pair_key[by_pair][1:] != pair_key[by_pair][:-1]
    rep_rows = el[by_pair[first]]  # one representative row per unique pair, aligned with `pairs`
    chosen_rows = rep_rows[np.searchsorted(pairs, chosen_prompt * n_cells + chosen_cell)]

    # Dev or test: seeded shuffle within each cell, first d to dev, next t to test.
    within = np.lexsort((rng.random(len(chosen_rows)), chosen_cell))
    sorted_cells = chosen_cell[within]
    starts = np.searchsorted(sorted_cells, sorted_cells, side="left")
    rank = np.arange(len(within)) - starts
    split = np.full(n, "train", dtype=object)
    split[chosen_rows[within[rank < d]]] = "dev"
    split[chosen_rows[within[rank >= d]]] = "test"

    used_prompt = np.zeros(n_prompts, dtype=bool)
    used_prompt[chosen_prompt] = True
    assessed_row = np.zeros(n, dtype=bool)
    assessed_row[chosen_rows] = True
    shared = is_prompt & (prompt_code >= 0) & used_prompt[np.maximum(prompt_code, 0)] & ~assessed_row
    split[shared] = "excluded"

    ids = frame["example_id"]
    assignment = pd.Series(split, index=pd.Index(ids, name="example_id"), name="split")
    flags = pd.DataFrame({"no_prompt": ~is_prompt, "prompt_shared_with_assessment": shared,
                          "ineligible_reason": reason}, index=assignment.index)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    assignment, flags = assignment.iloc[inverse], flags.iloc[inverse]

    report = _report(frame, labels, class_names, class_keys, gold_code, gold_na, pred_na, split, reason,
                     eligible, shared, is_prompt, chance, seed, min_votes, cell_names, cell, available,
                     eligible_examples, d, t, max_total, bound_total, capped)
    return SplitResult(assignment=assignment, flags=flags, report=report)


class _PromptGraph:
    """Prompts merged into groups of interchangeable ones (same cells, same size)."""

    def __init__(self, pair_prompt: np.ndarray, pair_cell: np.ndarray, prompt_size: np.ndarray,
                 n_cells: int) -> None:
        self.n_cells = n_cells
        prompts, starts = np.unique(pair_prompt, return_index=True)
        self.n_eligible_prompts = len(prompts)
        if n_cells <= _BITMASK_MAX_CELLS:
            bits = np.left_shift(np.int64(1), pair_cell.astype(np.int64))
            masks = np.bitwise_or.reduceat(bits, starts) if len(bits) else np.zeros(0, dtype=np.int64)
            mask_values, mask_id = np.unique(masks, return_inverse=True)
            mask_cells = [np.flatnonzero((int(m) >> np.arange(n_cells)) & 1) for m in mask_values]
        else:
            bounds = np.append(starts, len(pair_cell))
            keys = [tuple(pair_cell[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            # The bit-mask order (a binary number compares by its highest bits first).
            distinct = sorted(set(keys), key=lambda cells: cells[::-1])
            index = {k: i for i, k in enumerate(distinct)}
            mask_id = np.array([index[k] for k in keys], dtype=np.int64)
            mask_cells = [np.array(k, dtype=np.int64) for k in distinct]
        size = prompt_size[prompts]
        group_keys = np.stack([mask_id, size], axis=1) if len(prompts) else np.zeros((0, 2), dtype=np.int64)
        uniq, group_of = np.unique(group_keys, axis=0, return_inverse=True)
        self.prompts = prompts
        self.group_of = group_of.reshape(-1)
        self.group_count = np.bincount(self.group_of, minlength=len(uniq)).astype(np.int64)
        self.group_cost = (uniq[:, 1] - 1).astype(float) if len(uniq) else np.zeros(0)
        self.group_cells = [mask_cells[m] for m in uniq[:, 0]]
        G = len(uniq)
        self.var_group = np.concatenate([np.full(len(c), g) for g, c in enumerate(self.group_cells)] or
                                        [np.zeros(0, dtype=np.int64)]).astype(np.int64)
        self.var_cell = np.concatenate(self.group_cells or [np.zeros(0, dtype=np.int64)]).astype(np.int64)
        # Node ids: 0 source, 1..G groups, G+1..G+C cells, G+C+1 sink.
        self.source, self.sink = 0, G + n_cells + 1
        self._rows = np.concatenate([np.zeros(G, dtype=np.int64), 1 + self.var_group,
                                     1 + G + np.arange(n_cells)])
        self._cols = np.concatenate([1 + np.arange(G), 1 + G + self.var_cell, np.full(n_cells, self.sink)])
        self._fixed = np.concatenate([self.group_count, self.group_count[self.var_group]])
        self.G = G

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

    def assignment(self, k: int) -> np.ndarray:
        """Units per (group, cell) variable filling every cell to k, excluding fewest others."""
        value, _, flow = self._flow(k)
        if value != k * self.n_cells:  # k is at most the largest feasible, so this cannot happen
            raise SplitError(f"internal: the flow for {k} per cell is not full ({value})")
        x_flow = np.asarray(flow[1 + self.var_group, 1 + self.G + self.var_cell]).reshape(-1).astype(np.int64)
        costs = self.group_cost[self.var_group]
        if len(costs) == 0 or np.all(costs == costs[0]) or k == 0:
            return x_flow
        V = len(costs)
        a_eq = sp.csr_array((np.ones(V), (self.var_cell, np.arange(V))), shape=(self.n_cells, V))
        a_ub = sp.csr_array((np.ones(V), (self.var_group, np.arange(V))), shape=(self.G, V))
        # Dual simplex returns a vertex; network constraint matrices are totally unimodular, so
        # the vertex is integral.
        lp = linprog(costs, A_ub=a_ub, b_ub=self.group_count, A_eq=a_eq, b_eq=np.full(self.n_cells, k),
                     bounds=(0, None), method="highs-ds")
        if lp.status != 0:
            return x_flow
        x = np.rint(lp.x).astype(np.int64)
        ok = (np.abs(lp.x - x).max() < 1e-6 and (x >= 0).all()
              and (np.bincount(self.var_cell, weights=x, minlength=self.n_cells) == k).all()
              and (np.bincount(self.var_group, weights=x, minlength=self.G) <= self.group_count).all()
              and costs @ x <= costs @ x_flow)
        return x if ok else x_flow

    def realise(self, x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Concrete prompts for the units of x: a seeded random order within each group."""
        order = np.lexsort((rng.random(len(self.prompts)), self.group_of))
        members = self.prompts[order]
        group_start = np.concatenate([[0], np.cumsum(self.group_count)])
        taken = np.zeros(self.G, dtype=np.int64)
        out_prompt, out_cell = [], []
        for v in np.flatnonzero(x):
            g = self.var_group[v]
            start = group_start[g] + taken[g]
            out_prompt.append(members[start:start + x[v]])
            out_cell.append(np.full(x[v], self.var_cell[v], dtype=np.int64))
            taken[g] += x[v]
        if not out_prompt:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(out_prompt), np.concatenate(out_cell)

    def diagnose(self, need: int, min_size: int, available: np.ndarray, cell_names: list[str],
                 chance: bool) -> str:
        what = "cell" if chance else "class"
        wanted = f"dev and test need at least 2×{min_size}"
        short = [j for j in np.argsort(available, kind="stable") if available[j] < need]
        if short:
            j = short[0]
            message = (f"{what} {cell_names[j]} has {available[j]} eligible examples from distinct prompts; "
                       f"{wanted} (short by {need - available[j]})")
            if len(short) > 1:
                message += (f"; {len(short) - 1} other {what}{'s' if len(short) > 2 else ''} short too: "
                            + ", ".join(f"{cell_names[i]} ({available[i]})" for i in short[1:6])
                            + (", ..." if len(short) > 6 else ""))
            return message
        # Hall's condition fails jointly. The cells on the sink side of a minimum cut draw on
        # fewer prompts than they need between them; the cut nearest the sink (nodes that can
        # still reach it in the residual graph) gives the smallest such set of cells.
        value, capacity, flow = self._flow(need)
        residual = (capacity - flow).tocsr()
        residual.data[residual.data < 0] = 0
        residual.eliminate_zeros()
        reaches_sink = np.zeros(self.sink + 1, dtype=bool)
        reaches_sink[breadth_first_order(residual.T.tocsr(), self.sink, directed=True,
                                         return_predecessors=False)] = True
        cells = [j for j in range(self.n_cells) if reaches_sink[1 + self.G + j]]
        in_set = np.zeros(self.n_cells, dtype=bool)
        in_set[cells] = True
        prompts = int(sum(self.group_count[g] for g in range(self.G) if in_set[self.group_cells[g]].any()))
        names = ", ".join(cell_names[j] for j in cells)
        total = need * len(cells)
        return (f"{what}s {names} have eligible examples from only {prompts} distinct prompts between them "
                f"(each prompt serves at most one dev/test example); {wanted} from each, {total} in all "
                f"(short by {total - prompts})")


def _check_arguments(examples: pd.DataFrame, labels: Sequence[str], min_votes: int, dev_size: int | None,
                     test_size: int | None, min_size: int) -> list[str]:
    missing = [c for c in COLUMNS if c not in examples.columns]
    if missing:
        raise ValueError(f"examples need the columns {COLUMNS}; missing {missing}")
    labels = list(labels)
    if not labels or len(set(labels)) != len(labels):
        raise ValueError(f"labels must be a non-empty list of distinct labels, got {labels}")
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


def _codes(values: pd.Series, labels: list[str]) -> np.ndarray:
    """Index of each value in labels; -1 for missing or other values (tuples included)."""
    if values.dtype == object:
        values = values.map(lambda v: v if isinstance(v, str) else None)
    return pd.Index(labels, dtype=object).get_indexer(values.to_numpy(dtype=object)).astype(np.int64)


def _is_set(value: object) -> bool:
    return isinstance(value, tuple | list | frozenset | set)


def _display(value: object) -> str:
    if _is_set(value):
        members = sorted(map(str, value))  # type: ignore[call-overload]
        return "+".join(members) if members else "(none)"
    return str(value)


def _classes(gold: pd.Series, gold_na: np.ndarray, labels: list[str], chance: bool,
             classes: Sequence[object] | None, enough_votes: np.ndarray, is_prompt: np.ndarray,
             ) -> tuple[list[object], list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(class keys, display names, class code per row (-1: none), gold within labels, class assessed)."""
    n = len(gold)
    sets = np.zeros(n, dtype=bool)
    if gold.dtype == object:
        sets = gold.map(_is_set).to_numpy(dtype=bool)
    if chance and sets.any():
        raise ValueError("chance=True needs one gold label per example; multi-label gold (tuples) "
                         "needs chance=False")
    if not sets.any():
        code = _codes(gold, labels)
        in_labels = gold_na | (code >= 0)
        keys: list[object] = list(labels) if classes is None else [c for c in labels if c in set(classes)]
        if classes is not None and len(keys) != len(set(classes)):
            raise ValueError(f"classes must be task labels; got {list(classes)}")
        remap = np.full(len(labels) + 1, -1, dtype=np.int64)
        for i, c in enumerate(keys):
            remap[labels.index(c)] = i
        cls = remap[code]  # code -1 → last entry → -1
        assessed = gold_na | (code < 0) | (cls >= 0)
        return keys, [_display(k) for k in keys], cls, in_labels, assessed
    # Multi-label: canonical sorted tuples; a string is a one-label set.
    position = {label: i for i, label in enumerate(labels)}
    canon = np.full(n, None, dtype=object)
    in_labels = gold_na.copy()
    values = gold.to_numpy(dtype=object)
    for i in np.flatnonzero(~gold_na):
        v = values[i]
        members = tuple(v) if _is_set(v) else (v,)
        if all(m in position for m in members):
            canon[i] = tuple(sorted(set(members)))  # the order rounds.table uses
            in_labels[i] = True
    if classes is None:
        seen = {canon[i] for i in np.flatnonzero(~gold_na & in_labels & enough_votes & is_prompt)}
    else:
        seen = set()
        for c in classes:
            members = tuple(c) if _is_set(c) else (c,)
            if not all(m in position for m in members):
                raise ValueError(f"class {c!r} has labels outside the task's labels {labels}")
            seen.add(tuple(sorted(set(members))))
    keys = sorted(seen, key=lambda s: (len(s), [position[m] for m in s]))
    index = {k: i for i, k in enumerate(keys)}
    cls = np.array([index.get(c, -1) if c is not None else -1 for c in canon], dtype=np.int64)
    assessed = gold_na | ~in_labels | (cls >= 0)
    return keys, [_display(k) for k in keys], cls, in_labels, assessed


def _report(frame: pd.DataFrame, labels: list[str], class_names: list[str], class_keys: list[object],
            gold_code: np.ndarray, gold_na: np.ndarray, pred_na: np.ndarray, split: np.ndarray,
            reason: np.ndarray, eligible: np.ndarray, shared: np.ndarray, is_prompt: np.ndarray, chance: bool,
            seed: int, min_votes: int, cell_names: list[str], cell: np.ndarray, available: np.ndarray,
            eligible_examples: np.ndarray, d: int, t: int, max_total: int, bound_total: int,
            capped: bool) -> SplitReport:
    # Imported here: scikit-learn is slow to import and only the report needs it.
    from sklearn.metrics import accuracy_score, f1_score

    split_code = pd.Categorical(split, categories=SPLITS).codes
    n_splits = len(SPLITS)

    # Gold rows: the balanced classes first, then other values (e.g. mixed), then no majority.
    gold_display = _display_column(frame["gold"], gold_na, NO_MAJORITY)
    gold_cat, gold_values = pd.factorize(gold_display, sort=True)
    rows = class_names + [v for v in labels if v not in class_names] \
        + sorted(v for v in gold_values if v not in set(class_names) | set(labels) | {NO_MAJORITY}) + [NO_MAJORITY]
    counts = np.bincount(gold_cat * n_splits + split_code, minlength=len(gold_values) * n_splits)
    counts = counts.reshape(len(gold_values), n_splits)
    by_gold = pd.DataFrame(counts, index=pd.Index(gold_values, name="gold"), columns=list(SPLITS))
    by_gold = by_gold.reindex(rows, fill_value=0)
    by_gold.loc["Total"] = by_gold.sum()

    by_cell = None
    if not pred_na.all() and not any(_is_set(v) for v in class_keys):
        pred_display = _display_column(frame["model_prediction"], pred_na, NO_PREDICTION)
        cell_frame = pd.DataFrame({"gold": gold_display, "predicted": pred_display,
                                   "split": pd.Categorical(split, categories=SPLITS)})
        by_cell = cell_frame.groupby(["gold", "predicted", "split"], observed=False).size().unstack("split")
        full = pd.MultiIndex.from_product([labels, labels], names=["gold", "predicted"])
        extra = [i for i in by_cell.index if i not in set(full)]
        by_cell = by_cell.reindex(list(full) + sorted(extra), fill_value=0)
        by_cell.index = pd.MultiIndex.from_tuples(by_cell.index, names=["gold", "predicted"])
        by_cell = by_cell[list(SPLITS)].fillna(0).astype(np.int64)
        by_cell = by_cell[(by_cell.sum(axis=1) > 0) | by_cell.index.isin(full)]

    n_cells = len(cell_names)
    dev_cells = np.bincount(cell[split == "dev"], minlength=n_cells)
    test_cells = np.bincount(cell[split == "test"], minlength=n_cells)
    availability = pd.DataFrame({"eligible_examples": eligible_examples, "distinct_prompts": available,
                                 "dev": dev_cells, "test": test_cells},
                                index=pd.Index(cell_names, name="cell" if chance else "class"))

    metrics: dict[str, dict[str, float]] = {}
    single_label = not any(_is_set(v) for v in class_keys)
    for name in ("dev", "test"):
        rows_ = (split == name) & ~pred_na
        if not single_label or not rows_.any():
            continue
        y_true = frame["gold"].to_numpy(dtype=object)[rows_].astype(str)
        y_pred = frame["model_prediction"].to_numpy(dtype=object)[rows_].astype(str)
        metrics[name] = {"n": int(rows_.sum()),
                         "macro_f1": float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
                         "accuracy": float(accuracy_score(y_true, y_pred))}
    chance_f1 = 1 / len(labels) if chance else None
    at_chance = None
    if chance:
        at_chance = all(math.isclose(m["macro_f1"], chance_f1, rel_tol=1e-9) and
                        math.isclose(m["accuracy"], chance_f1, rel_tol=1e-9) for m in metrics.values())

    reasons = pd.Series(reason[~eligible]).value_counts()
    ineligible = {r: int(reasons.get(r, 0)) for r in INELIGIBLE_REASONS if reasons.get(r, 0)}
    notes = []
    if capped:
        notes.append(f"dev/test capped below the largest feasible size ({max_total // 2} per "
                     f"{'cell' if chance else 'class'} each)")
    if max_total < bound_total:
        notes.append(f"prompts shared between cells cost {bound_total // 2 - max_total // 2} per "
                     f"{'cell' if chance else 'class'} against the naive bound")
    return SplitReport(
        labels=list(labels), classes=list(class_names), chance=chance, seed=seed, min_votes=min_votes,
        unit="cell" if chance else "class", counts_by_gold=by_gold, counts_by_cell=by_cell,
        availability=availability, dev_per_cell=d, test_per_cell=t, max_c=max_total // 2,
        upper_bound_c=bound_total // 2, max_total_per_cell=max_total, upper_bound_total_per_cell=bound_total,
        capped=capped, model_metrics=metrics, chance_macro_f1=chance_f1, at_chance=at_chance,
        excluded={"prompt_shared_with_assessment": int(shared.sum())} if shared.any() else {},
        ineligible=ineligible, eligible_in_train=int((eligible & (split == "train")).sum()),
        no_prompt_in_train=int((~is_prompt & (split == "train")).sum()), notes=notes)


def _display_column(values: pd.Series, na: np.ndarray, missing: str) -> np.ndarray:
    out = values.to_numpy(dtype=object).copy()
    if values.dtype == object:
        out = np.array([_display(v) if not m else missing for v, m in zip(out, na, strict=True)], dtype=object)
    else:
        out = out.astype(object)
        out[na] = missing
        out = out.astype(str).astype(object)
    return out


def _plain(value: object) -> object:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value
