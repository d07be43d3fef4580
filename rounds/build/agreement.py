"""Agreement statistics of a round (round builder step 2).

All functions read the long response table of :mod:`rounds.build.table` and the labels the task
allows (a label outside them raises ``ValueError`` naming it). They work on count tables
(examples x labels) or per-slot label vectors, never on a dense workers x examples matrix, so
200,000 examples x 5 responses and thousands of workers take seconds.

* :func:`fleiss_kappa` -- Fleiss (1971), statsmodels ``fleiss_kappa`` on the count table
  (DynaSent Tables 6 and 9 report it for dev and test; MAD-TSC §3.4 before and after
  consolidation, see :func:`target_sentiment_kappas`).
* :func:`randolph_kappa` -- Randolph's (2005) free-marginal kappa (statsmodels
  ``method="randolph"``; EthioEmo §3.4 "Free M.").
* :func:`krippendorff_alpha` -- Krippendorff (2011), the ``krippendorff`` package fed with
  ``value_counts`` (units x values).
* :func:`slot_cohen_kappas`, :func:`worker_pair_cohen_kappas` -- pairwise Cohen (1960) kappa
  between response slots (synthetic annotators, as iSarcasm §5.2's kappa_12, kappa_13, kappa_23)
  or between workers who share enough examples.
* :func:`multilabel_agreement` -- per-label kappas and mean pairwise Jaccard for multi-label
  tasks (EthioEmo §3.4).
* :func:`worker_agreement`, :func:`disagreeing_workers` -- each worker's rate of agreement
  with the gold label (DynaSent §3.3, App. B.2 and Fig. 6); :func:`multilabel_worker_agreement`
  for label sets (mean Jaccard similarity with the gold set).
* :func:`intended_vs_perceived` -- iSarcasm §5.2 Table 5 and Table 7 "Manual Labelling".
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import krippendorff
import numpy as np
import pandas as pd
from sklearn.exceptions import UndefinedMetricWarning
from sklearn.metrics import cohen_kappa_score, precision_recall_fscore_support
from statsmodels.stats.inter_rater import fleiss_kappa as _statsmodels_fleiss_kappa

from rounds.build._encoding import (
    as_generator,
    bincount_2d,
    check_labels_argument,
    encode_multi,
    encode_single,
    gold_codes,
    label_codes,
    popcount,
    slots,
)
from rounds.build.aggregation import (
    _collapse_order,
    _majority_frame,
    collapse_responses,
    consolidate_target_sentiment,
    majority_labels,
)

__all__ = [
    "IntendedPerceived",
    "MultiLabelAgreement",
    "count_table",
    "disagreeing_workers",
    "fleiss_kappa",
    "intended_vs_perceived",
    "krippendorff_alpha",
    "multilabel_agreement",
    "multilabel_worker_agreement",
    "randolph_kappa",
    "slot_cohen_kappas",
    "target_sentiment_kappas",
    "worker_agreement",
    "worker_pair_cohen_kappas",
]


def count_table(responses: pd.DataFrame, *, labels: Sequence[str]) -> pd.DataFrame:
    """Examples x labels table of how many responses chose each label (Fleiss 1971's n_ij).

    Every label in ``labels`` is a column, also when nobody chose it (Randolph's kappa
    depends on the number of categories).

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 2], "worker_id": ["a", "b", "a"],
    ...                       "label": ["pos", "neg", "pos"]})
    >>> count_table(table, labels=["pos", "neg", "neu"]).to_numpy().tolist()
    [[1, 1, 0], [1, 0, 0]]
    """
    encoded = encode_single(responses, labels)
    return pd.DataFrame(
        encoded.counts(), index=pd.Index(encoded.example_ids, name="example_id"), columns=list(encoded.labels)
    )


def _rater_count(per_example: np.ndarray, n_raters: int | None) -> int:
    """The number of responses per example a Fleiss-type kappa will use (checked)."""
    if len(per_example) == 0:
        raise ValueError("no responses: kappa needs at least one example with two or more responses")
    if n_raters is None:
        low, high = int(per_example.min()), int(per_example.max())
        if low != high:
            raise ValueError(
                f"examples have between {low} and {high} responses; Fleiss-type kappas need the same "
                f"number for every example: pass n_raters=k to use only the examples with exactly k "
                "responses, or trim with rounds.build.aggregation.keep_top_ranked first"
            )
        n_raters = high
    if n_raters < 2:
        raise ValueError(f"kappa needs at least 2 responses per example, got n_raters={n_raters}")
    if not (per_example == n_raters).any():
        raise ValueError(f"no example has exactly n_raters={n_raters} responses")
    return int(n_raters)


def _equal_raters(counts: np.ndarray, n_raters: int | None) -> np.ndarray:
    """Rows of ``counts`` usable by Fleiss-type kappas (every example rated n_raters times)."""
    per_example = counts.sum(axis=1)
    return counts[per_example == _rater_count(per_example, n_raters)]


def _kappa(table: np.ndarray, method: str) -> float:
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(_statsmodels_fleiss_kappa(table, method=method))


def fleiss_kappa(responses: pd.DataFrame, *, labels: Sequence[str], n_raters: int | None = None) -> float:
    """Fleiss' (1971) kappa for many raters, via statsmodels ``fleiss_kappa``.

    Fleiss' kappa assumes every example has the same number of responses. With
    ``n_raters=None`` they must all have the same count (else ``ValueError`` says how to fix
    it); with ``n_raters=k`` only examples with exactly ``k`` responses are used (DynaSent:
    5). It is ``NaN`` when chance agreement is 1 (everyone always chose one label).

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 2, 2], "worker_id": list("abab"),
    ...                       "label": ["pos", "pos", "neg", "neg"]})
    >>> fleiss_kappa(table, labels=["pos", "neg"])
    1.0
    """
    encoded = encode_single(responses, labels)
    return _kappa(_equal_raters(encoded.counts(), n_raters), "fleiss")


def randolph_kappa(responses: pd.DataFrame, *, labels: Sequence[str], n_raters: int | None = None) -> float:
    """Randolph's (2005) free-marginal multirater kappa (statsmodels, ``method="randolph"``).

    kappa_free = (P_o - 1/k) / (1 - 1/k) with k = ``len(labels)``: chance is a uniform choice
    among the labels offered, not the observed label marginals (EthioEmo §3.4 reports it as
    "Free M."). Same example selection as :func:`fleiss_kappa`.

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 2, 2], "worker_id": list("abab"),
    ...                       "label": ["pos", "pos", "pos", "neg"]})
    >>> randolph_kappa(table, labels=["pos", "neg"])  # P_o = (1 + 0) / 2
    0.0
    """
    encoded = encode_single(responses, labels)
    return _kappa(_equal_raters(encoded.counts(), n_raters), "randolph")


def krippendorff_alpha(
    responses: pd.DataFrame,
    *,
    labels: Sequence[str],
    level: Literal["nominal", "ordinal", "interval", "ratio"] = "nominal",
) -> float:
    """Krippendorff's (2011) alpha, from the ``krippendorff`` package's ``value_counts`` input.

    Units are examples and values are labels; missing responses are fine (examples with a
    single response are unpairable and contribute nothing). For ``level`` other than
    ``"nominal"`` the order of ``labels`` is the order of the scale (e.g. MAD-TSC's 5 points).
    The count table is examples x labels, so the cost does not grow with the number of
    workers.

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 2, 2], "worker_id": list("abab"),
    ...                       "label": ["pos", "pos", "neg", "neg"]})
    >>> krippendorff_alpha(table, labels=["pos", "neg"])
    1.0
    """
    encoded = encode_single(responses, labels)
    if len(encoded.labels) < 2:
        raise ValueError("Krippendorff's alpha needs at least two labels")
    counts = encoded.counts()
    if not (counts.sum(axis=1) >= 2).any():
        raise ValueError("Krippendorff's alpha needs at least one example with two or more responses")
    return float(krippendorff.alpha(value_counts=counts, level_of_measurement=level))


def _slot_matrix(example: np.ndarray, values: np.ndarray, n_examples: int, slot: np.ndarray) -> np.ndarray:
    """Examples x slots matrix of ``values``, -1 where an example has no response in a slot."""
    n_slots = int(slot.max()) + 1 if len(slot) else 0
    matrix = np.full((n_examples, n_slots), -1, dtype=np.int64)
    matrix[example, slot] = values
    return matrix


def slot_cohen_kappas(
    responses: pd.DataFrame,
    *,
    labels: Sequence[str],
    random_state: int | np.random.Generator | None = None,
    min_shared: int = 1,
) -> pd.DataFrame:
    """Cohen's (1960) kappa between response *slots*, via sklearn ``cohen_kappa_score``.

    Crowd workers each label a different subset of examples, so "annotator 1, 2, 3" are
    synthetic: slot ``i`` is the ``i``-th response of each example, in table order, or in a
    random order per example when ``random_state`` is given (DynaSent §3.5's synthetic
    annotators). iSarcasm §5.2 reports exactly such pairwise kappas (kappa_12 = 0.37,
    kappa_13 = 0.39, kappa_23 = 0.36) for three labels per tweet. One row per slot pair with at
    least ``min_shared`` examples in both slots: ``slot_a``, ``slot_b`` (1-based),
    ``n_examples``, ``kappa``. ``frame["kappa"].mean()`` is the mean pairwise kappa.

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 2, 2], "worker_id": list("abcd"),
    ...                       "label": ["pos", "pos", "neg", "neg"]})
    >>> slot_cohen_kappas(table, labels=["pos", "neg"]).to_dict("records")
    [{'slot_a': 1, 'slot_b': 2, 'n_examples': 2, 'kappa': 1.0}]
    """
    encoded = encode_single(responses, labels)
    rng = None if random_state is None else as_generator(random_state)
    slot = slots(encoded.example, encoded.n_examples, rng)
    matrix = _slot_matrix(encoded.example, encoded.label, encoded.n_examples, slot)
    rows = []
    all_labels = np.arange(encoded.n_labels)
    for a in range(matrix.shape[1]):
        for b in range(a + 1, matrix.shape[1]):
            both = (matrix[:, a] >= 0) & (matrix[:, b] >= 0)
            n_shared = int(both.sum())
            if n_shared < max(min_shared, 1):
                continue
            with warnings.catch_warnings():
                # One label only in both slots: kappa is undefined (NaN), not an error.
                warnings.simplefilter("ignore", RuntimeWarning)
                warnings.simplefilter("ignore", UndefinedMetricWarning)
                kappa = float(cohen_kappa_score(matrix[both, a], matrix[both, b], labels=all_labels))
            rows.append({"slot_a": a + 1, "slot_b": b + 1, "n_examples": n_shared, "kappa": kappa})
    return pd.DataFrame(rows, columns=["slot_a", "slot_b", "n_examples", "kappa"])


def worker_pair_cohen_kappas(responses: pd.DataFrame, *, labels: Sequence[str], min_shared: int = 20) -> pd.DataFrame:
    """Cohen's kappa for every pair of workers who labelled at least ``min_shared`` common examples.

    The pairs come from each example's own responses (no workers x workers matrix), and the
    kappas are computed for all pairs at once from per-pair counts: p_o is the share of shared
    examples where the two agree, p_e = sum over labels of the product of the two workers'
    label shares on those examples, kappa = (p_o - p_e) / (1 - p_e) -- the formula of sklearn's
    ``cohen_kappa_score`` (``NaN`` when p_e = 1). Columns ``worker_a``, ``worker_b``
    (``worker_a`` sorts first), ``n_shared``, ``kappa``.

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 2, 2], "worker_id": list("abab"),
    ...                       "label": ["pos", "pos", "neg", "neg"]})
    >>> worker_pair_cohen_kappas(table, labels=["pos", "neg"], min_shared=2).to_dict("records")
    [{'worker_a': 'a', 'worker_b': 'b', 'n_shared': 2, 'kappa': 1.0}]
    """
    encoded = encode_single(responses, labels)
    columns = ["worker_a", "worker_b", "n_shared", "kappa"]
    slot = slots(encoded.example, encoded.n_examples)
    workers = _slot_matrix(encoded.example, encoded.worker, encoded.n_examples, slot)
    values = _slot_matrix(encoded.example, encoded.label, encoded.n_examples, slot)
    pair_a, pair_b, label_a, label_b = [], [], [], []
    for a in range(workers.shape[1]):
        for b in range(a + 1, workers.shape[1]):
            both = (workers[:, a] >= 0) & (workers[:, b] >= 0)
            wa, wb = workers[both, a], workers[both, b]
            la, lb = values[both, a], values[both, b]
            swap = wa > wb
            pair_a.append(np.where(swap, wb, wa))
            pair_b.append(np.where(swap, wa, wb))
            label_a.append(np.where(swap, lb, la))
            label_b.append(np.where(swap, la, lb))
    if not pair_a:
        return pd.DataFrame({c: [] for c in columns})
    first, second = np.concatenate(pair_a), np.concatenate(pair_b)
    first_label, second_label = np.concatenate(label_a), np.concatenate(label_b)
    n_workers, n_labels = len(encoded.worker_ids), encoded.n_labels
    pair_codes, pair = np.unique(first * n_workers + second, return_inverse=True)
    n_pairs = len(pair_codes)
    shared = np.bincount(pair, minlength=n_pairs)
    agree = np.bincount(pair, weights=first_label == second_label, minlength=n_pairs)
    marg_a = bincount_2d(pair, first_label, n_pairs, n_labels)
    marg_b = bincount_2d(pair, second_label, n_pairs, n_labels)
    p_o = agree / shared
    p_e = (marg_a * marg_b).sum(axis=1) / shared.astype(float) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        kappa = np.where(p_e < 1, (p_o - p_e) / np.where(p_e < 1, 1 - p_e, 1.0), np.nan)
    keep = shared >= min_shared
    return pd.DataFrame(
        {
            "worker_a": np.asarray(encoded.worker_ids)[pair_codes[keep] // n_workers],
            "worker_b": np.asarray(encoded.worker_ids)[pair_codes[keep] % n_workers],
            "n_shared": shared[keep].astype(np.int64),
            "kappa": kappa[keep],
        },
        columns=columns,
    )


@dataclass(frozen=True)
class MultiLabelAgreement:
    """Agreement of a multi-label round (EthioEmo §3.4).

    ``per_label`` has one row per label: ``prevalence`` (share of responses choosing it) and
    the binary (chosen / not chosen) ``fleiss``, ``randolph`` and ``alpha``; the ``mean_*``
    fields are their macro averages over labels (NaN kappas of never-chosen labels skipped).
    ``mean_jaccard`` is the mean over examples of the mean pairwise Jaccard similarity of the
    responses' label sets (two empty sets count as agreeing).
    """

    per_label: pd.DataFrame
    mean_fleiss: float
    mean_randolph: float
    mean_alpha: float
    mean_jaccard: float
    n_examples: int


def _nanmean(values: np.ndarray) -> float:
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if len(finite) else float("nan")


def multilabel_agreement(
    responses: pd.DataFrame, *, labels: Sequence[str], n_raters: int | None = None
) -> MultiLabelAgreement:
    """Multi-label agreement (EthioEmo §3.4).

    EthioEmo reports the multi-label agreement (MLA) of Li et al. (2023), Cohen's kappa and
    Randolph's free-marginal kappa, noting that Fleiss, Cohen and Krippendorff "do not support
    multi-label with multiple annotators at the same time". The MLA formula is not given in
    the paper, so this function reports two standard, documented substitutes: each label as
    its own binary (chosen / not chosen) question, scored with Fleiss' kappa, Randolph's
    kappa (k = 2) and Krippendorff's alpha and macro-averaged over labels; and the mean
    pairwise Jaccard similarity of label sets (observed multi-label agreement, no chance
    correction). Every measure, prevalence included, uses the same examples: those with
    ``n_raters`` responses (as :func:`fleiss_kappa` selects them; ``n_examples``), so no figure
    rests on examples another leaves out.

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 2, 2], "worker_id": list("abab"),
    ...                       "label": [("joy",), ("joy",), ("anger", "fear"), ("anger",)]})
    >>> round(multilabel_agreement(table, labels=["anger", "fear", "joy"]).mean_jaccard, 3)
    0.75
    """
    encoded = encode_multi(responses, labels)
    n_responses = encoded.n_responses()
    rated = n_responses == _rater_count(n_responses, n_raters)
    counts = encoded.counts()[rated]
    n_responses = n_responses[rated]
    rows = []
    for j, label in enumerate(encoded.labels):
        binary = np.c_[counts[:, j], n_responses - counts[:, j]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                alpha = float(krippendorff.alpha(value_counts=binary, level_of_measurement="nominal"))
            except (ValueError, ZeroDivisionError):
                alpha = float("nan")
        rows.append(
            {
                "label": label,
                "prevalence": float(counts[:, j].sum() / max(n_responses.sum(), 1)),
                "fleiss": _kappa(binary, "fleiss"),
                "randolph": _kappa(binary, "randolph"),
                "alpha": alpha,
            }
        )
    per_label = pd.DataFrame(rows).set_index("label")

    slot = slots(encoded.example, encoded.n_examples)
    masks = _slot_matrix(encoded.example, encoded.masks, encoded.n_examples, slot)
    pair_sum = np.zeros(encoded.n_examples)
    pair_n = np.zeros(encoded.n_examples)
    for a in range(masks.shape[1]):
        for b in range(a + 1, masks.shape[1]):
            both = (masks[:, a] >= 0) & (masks[:, b] >= 0)
            inter = popcount(masks[both, a] & masks[both, b])
            union = popcount(masks[both, a] | masks[both, b])
            pair_sum[both] += np.where(union > 0, inter / np.maximum(union, 1), 1.0)
            pair_n[both] += 1
    with_pairs = (pair_n > 0) & rated
    mean_jaccard = float((pair_sum[with_pairs] / pair_n[with_pairs]).mean()) if with_pairs.any() else float("nan")
    return MultiLabelAgreement(
        per_label=per_label,
        mean_fleiss=_nanmean(per_label["fleiss"].to_numpy()),
        mean_randolph=_nanmean(per_label["randolph"].to_numpy()),
        mean_alpha=_nanmean(per_label["alpha"].to_numpy()),
        mean_jaccard=mean_jaccard,
        n_examples=int(rated.sum()),
    )


def worker_agreement(
    responses: pd.DataFrame,
    *,
    labels: Sequence[str],
    gold: pd.Series | Mapping[Hashable, object] | None = None,
    min_votes: int | None = None,
) -> pd.DataFrame:
    """Each worker's rate of agreement with the gold label (DynaSent §3.3, App. B.2, Fig. 6).

    "We assessed workers by the percentage of examples they labeled for which they agreed
    with the majority." ``gold`` maps example id to its gold label (``None`` for none); by
    default it is :func:`rounds.build.aggregation.majority_labels` with ``min_votes``, the worker's
    own vote included. Examples without gold are left out of the rate (one can neither agree
    nor disagree with a majority that does not exist).

    One row per worker (index ``worker_id``): ``n_labels`` (all their responses),
    ``n_with_gold``, ``n_agree``, ``agreement_rate`` = n_agree / n_with_gold and
    ``disagreement_rate`` = 1 - agreement_rate (``NaN`` without gold examples). A histogram
    of ``agreement_rate`` is DynaSent Fig. 6; the rate is also the ranking
    :func:`rounds.build.aggregation.keep_top_ranked` expects.

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 1], "worker_id": list("abc"),
    ...                       "label": ["pos", "pos", "neg"]})
    >>> worker_agreement(table, labels=["pos", "neg"])["agreement_rate"].tolist()
    [1.0, 1.0, 0.0]
    """
    encoded = encode_single(responses, labels)
    if gold is None:
        frame = _majority_frame(encoded.counts(), encoded.example_ids, encoded.labels, min_votes)
        example_gold = gold_codes(frame["label"], encoded.example_ids, encoded.labels)
    else:
        example_gold = gold_codes(gold, encoded.example_ids, encoded.labels)
    row_gold = example_gold[encoded.example]
    n_workers = len(encoded.worker_ids)
    n_labels = np.bincount(encoded.worker, minlength=n_workers)
    n_with_gold = np.bincount(encoded.worker, weights=row_gold >= 0, minlength=n_workers).astype(np.int64)
    n_agree = np.bincount(encoded.worker, weights=encoded.label == row_gold, minlength=n_workers).astype(np.int64)
    judged = n_with_gold > 0
    denominator = np.maximum(n_with_gold, 1)
    # Both rates as ratios of counts, so 4 of 5 is exactly 0.8 against an 80% threshold.
    rate = np.where(judged, n_agree / denominator, np.nan)
    disagreement = np.where(judged, (n_with_gold - n_agree) / denominator, np.nan)
    return pd.DataFrame(
        {
            "n_labels": n_labels.astype(np.int64),
            "n_with_gold": n_with_gold,
            "n_agree": n_agree,
            "agreement_rate": rate,
            "disagreement_rate": disagreement,
        },
        index=pd.Index(encoded.worker_ids, name="worker_id"),
    )


def multilabel_worker_agreement(
    responses: pd.DataFrame, gold: pd.Series | Mapping[Hashable, object], *, labels: Sequence[str]
) -> pd.DataFrame:
    """Each worker's agreement with the gold label *sets* of a multi-label task.

    A response agrees with its example's gold set by their Jaccard similarity (shared labels
    over labels in either; services.domain.labels.agreement_with, which the live quality check
    uses), and a worker's ``agreement_rate`` is the mean over their responses to examples with
    gold. ``gold`` maps example id to a tuple of labels (``None``: no gold, left out). Columns
    as :func:`worker_agreement` (``n_agree``: responses whose set is the gold set), so the rate
    is the ranking :func:`rounds.build.aggregation.keep_top_ranked` expects.

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 1], "worker_id": list("abc"),
    ...                       "label": [("joy",), ("joy", "fear"), ("anger",)]})
    >>> multilabel_worker_agreement(table, {1: ("joy",)}, labels=["anger", "fear", "joy"])["agreement_rate"].tolist()
    [1.0, 0.5, 0.0]
    """
    encoded = encode_multi(responses, labels)
    series = gold if isinstance(gold, pd.Series) else pd.Series(dict(gold), dtype=object)
    position = {label: j for j, label in enumerate(encoded.labels)}
    gold_mask = np.full(encoded.n_examples, -1, dtype=np.int64)
    for i, value in enumerate(series.reindex(encoded.example_ids)):
        if isinstance(value, tuple | list) and value:
            unknown = [label for label in value if label not in position]
            if unknown:
                raise ValueError(f"gold label {unknown[0]!r} is not one of the task's labels {list(encoded.labels)}")
            gold_mask[i] = sum(1 << position[label] for label in value)
    row_gold = gold_mask[encoded.example]
    judged_row = row_gold >= 0
    inter = popcount(encoded.masks & np.maximum(row_gold, 0))
    union = popcount(encoded.masks | np.maximum(row_gold, 0))
    jaccard = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
    n_workers = len(encoded.worker_ids)
    n_labels = np.bincount(encoded.worker, minlength=n_workers)
    n_with_gold = np.bincount(encoded.worker, weights=judged_row, minlength=n_workers).astype(np.int64)
    n_agree = np.bincount(encoded.worker, weights=judged_row & (encoded.masks == row_gold), minlength=n_workers).astype(
        np.int64
    )
    total = np.bincount(encoded.worker, weights=np.where(judged_row, jaccard, 0.0), minlength=n_workers)
    judged = n_with_gold > 0
    rate = np.where(judged, total / np.maximum(n_with_gold, 1), np.nan)
    return pd.DataFrame(
        {
            "n_labels": n_labels.astype(np.int64),
            "n_with_gold": n_with_gold,
            "n_agree": n_agree,
            "agreement_rate": rate,
            "disagreement_rate": np.where(judged, 1 - rate, np.nan),
        },
        index=pd.Index(encoded.worker_ids, name="worker_id"),
    )


def disagreeing_workers(agreement: pd.DataFrame, *, threshold: float = 0.8, min_labels: int = 10) -> list[Hashable]:
    """Workers whose disagreement rate exceeds ``threshold`` (DynaSent §3.3: 80%).

    ``agreement`` is the output of :func:`worker_agreement`. Only workers with at least
    ``min_labels`` gold-labelled responses are judged (the task's
    ``agreement.min_labels_for_quality``); the rule is strictly "more than", as in "disagreed
    more than 80% of the time". Returned in the frame's order.

    >>> import pandas as pd
    >>> rates = pd.DataFrame({"n_with_gold": [20, 20, 5], "disagreement_rate": [0.85, 0.8, 1.0]},
    ...                      index=pd.Index(["a", "b", "c"], name="worker_id"))
    >>> disagreeing_workers(rates, threshold=0.8, min_labels=10)
    ['a']
    """
    if not 0 <= threshold <= 1:
        raise ValueError(f"threshold must be a rate between 0 and 1, got {threshold!r}")
    judged = agreement["n_with_gold"] >= min_labels
    flagged = judged & (agreement["disagreement_rate"] > threshold)
    return list(agreement.index[flagged.to_numpy()])


@dataclass(frozen=True)
class IntendedPerceived:
    """Intended (writer) vs perceived (validators) labels, iSarcasm §5.2.

    ``confusion``: rows ``intended``, columns ``perceived`` (iSarcasm Table 5);
    ``precision``, ``recall``, ``f1`` of the ``positive`` class taking the intended label as
    truth (iSarcasm Table 7, "Manual Labelling": 0.550 / 0.701 / 0.616); ``n_examples``
    compared and ``n_without_perceived`` (examples with no perceived gold, left out).
    """

    confusion: pd.DataFrame
    precision: float
    recall: float
    f1: float
    n_examples: int
    n_without_perceived: int


def intended_vs_perceived(
    responses: pd.DataFrame,
    intended: pd.Series | Mapping[Hashable, str],
    *,
    labels: Sequence[str],
    positive: str,
    min_votes: int | None = None,
    level: Literal["majority", "response"] = "majority",
) -> IntendedPerceived:
    """Compare writers' intended labels with validators' perceived labels (iSarcasm §5.2).

    iSarcasm collects three third-party labels per tweet, takes the majority as the
    *perceived* label, tabulates it against the author's *intended* label (Table 5) and scores
    it as a sarcasm detector against the intended labels (Table 7: F1 of the sarcastic class).
    With ``level="majority"`` (the paper's) each example's perceived label is its
    :func:`~rounds.build.aggregation.majority_labels` gold (``min_votes``; examples without one are
    counted in ``n_without_perceived``); with ``level="response"`` every individual validation
    is compared with the intended label (the average validator). Only examples present in
    both ``responses`` and ``intended`` are compared.

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 1, 2, 2, 2], "worker_id": list("abcabc"),
    ...                       "label": ["sarcastic"] * 2 + ["not_sarcastic"] * 4})
    >>> result = intended_vs_perceived(table, {1: "sarcastic", 2: "sarcastic"},
    ...                                labels=["sarcastic", "not_sarcastic"], positive="sarcastic")
    >>> result.precision, result.recall, result.f1
    (1.0, 0.5, 0.6666666666666666)
    """
    allowed = check_labels_argument(labels)
    if positive not in allowed:
        raise ValueError(f"positive {positive!r} is not one of the labels {list(allowed)}")
    if level not in ("majority", "response"):
        raise ValueError(f"level must be 'majority' or 'response', got {level!r}")
    intended_series = intended if isinstance(intended, pd.Series) else pd.Series(dict(intended), dtype=object)
    if level == "majority":
        perceived = majority_labels(responses, labels=allowed, min_votes=min_votes)["label"]
        common = perceived.index.intersection(intended_series.index)
        perceived = perceived.loc[common]
        has_perceived = perceived.notna().to_numpy()
        n_without = int((~has_perceived).sum())
        truth = label_codes(intended_series.loc[common][has_perceived], allowed, what="intended label")
        guess = label_codes(perceived[has_perceived], allowed)
    else:
        encoded = encode_single(responses, allowed)
        example_truth = gold_codes(intended_series, encoded.example_ids, allowed)
        row_truth = example_truth[encoded.example]
        known = row_truth >= 0
        truth, guess = row_truth[known], encoded.label[known]
        n_without = 0
    confusion = pd.DataFrame(
        bincount_2d(truth, guess, len(allowed), len(allowed)),
        index=pd.Index(list(allowed), name="intended"),
        columns=pd.Index(list(allowed), name="perceived"),
    )
    positive_code = allowed.index(positive)
    precision, recall, f1, _ = precision_recall_fscore_support(
        truth, guess, labels=[positive_code], average=None, zero_division=0
    )
    return IntendedPerceived(
        confusion=confusion,
        precision=float(precision[0]),
        recall=float(recall[0]),
        f1=float(f1[0]),
        n_examples=len(truth),
        n_without_perceived=n_without,
    )


def target_sentiment_kappas(
    responses: pd.DataFrame,
    *,
    collapse: Mapping[str, str],
    unknown_label: str | None = "unknown",
    order: Sequence[str] | None = None,
    n_raters: int = 3,
) -> dict[str, float]:
    """Fleiss' kappa before and after MAD-TSC §3.4 consolidation.

    MAD-TSC reports kappa_F = 0.58 "before" and 0.67 "after consolidation" without saying on
    which scale "before" is measured, so three values are returned, each over the examples
    with exactly ``n_raters`` responses: ``"five_point"`` (raw validation labels, ``unknown``
    a category of its own), ``"collapsed"`` (3 classes, examples with an ``unknown`` vote
    removed: the first two consolidation steps) and ``"consolidated"`` (3 classes, only the
    kept examples of :func:`~rounds.build.aggregation.consolidate_target_sentiment`).

    >>> import pandas as pd
    >>> collapse = {"negative": "negative", "neutral": "neutral", "positive": "positive"}
    >>> table = pd.DataFrame({"example_id": [1, 1, 1, 2, 2, 2], "worker_id": list("abcabc"),
    ...                       "label": ["positive"] * 3 + ["negative"] * 3})
    >>> target_sentiment_kappas(table, collapse=collapse)["consolidated"]
    1.0
    """
    classes = _collapse_order(collapse, order)
    five_point = list(collapse) + ([unknown_label] if unknown_label is not None else [])
    result = {"five_point": fleiss_kappa(responses, labels=five_point, n_raters=n_raters)}
    consolidated = consolidate_target_sentiment(
        responses, collapse=collapse, unknown_label=unknown_label, order=order, min_responses=n_raters
    )
    without_unknown = consolidated.index[consolidated["reason"] != "unknown_vote"]
    kept = consolidated.index[consolidated["kept"].to_numpy()]
    collapsed = collapse_responses(responses, collapse=collapse, unknown_label=unknown_label)
    for name, ids in (("collapsed", without_unknown), ("consolidated", kept)):
        subset = collapsed.loc[collapsed["example_id"].isin(ids)]
        try:
            result[name] = fleiss_kappa(subset, labels=classes, n_raters=n_raters)
        except ValueError:
            result[name] = float("nan")
    return result
