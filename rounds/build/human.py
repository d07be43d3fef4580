"""Human performance estimate of a round (DynaSent §3.5, §4.6; Tables 6 and 9).

"We randomize the responses for each example to create five synthetic annotators, and we
calculate the precision, recall, and F1 scores for each of these annotators with respect to
the gold label. We average those scores." The estimate is conservative: it "heavily weights
the single annotator who disagreed for the cases with 4/5 majorities".

The shuffle is one seeded ``numpy`` permutation per example (a single ``lexsort`` over random
keys, not a Python loop), and each synthetic annotator is scored by sklearn's
``precision_recall_fscore_support`` on integer codes.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.metrics import precision_recall_fscore_support

from rounds.build._encoding import as_generator, check_labels_argument, encode_single, gold_codes, slots

__all__ = ["HumanPerformance", "human_performance", "human_performance_table"]

MACRO = "macro avg"


@dataclass(frozen=True)
class HumanPerformance:
    """Averaged scores of the synthetic annotators.

    ``scores``: rows are the scored classes then ``"macro avg"``; columns ``precision``,
    ``recall``, ``f1`` (fractions in [0, 1]; DynaSent prints them x 100). ``per_annotator``:
    the same scores for each synthetic annotator (columns ``annotator`` 1..n, ``class``,
    ``precision``, ``recall``, ``f1``, ``n_examples``). ``n_examples`` gold-labelled examples
    were scored by ``n_annotators`` synthetic annotators.
    """

    scores: pd.DataFrame
    per_annotator: pd.DataFrame
    n_examples: int
    n_annotators: int


def human_performance(
    responses: pd.DataFrame,
    gold: pd.Series | Mapping[Hashable, object],
    *,
    labels: Sequence[str],
    classes: Sequence[str] | None = None,
    examples: Iterable[Hashable] | None = None,
    n_annotators: int | None = None,
    random_state: int | np.random.Generator | None = 0,
) -> HumanPerformance:
    """Estimate human P/R/F1 with synthetic annotators (DynaSent §3.5).

    ``gold`` maps example id to its gold label (``None`` for none, e.g. the ``label`` column
    of :func:`rounds.build.aggregation.majority_labels`); only examples with gold (and, when given,
    in ``examples``, e.g. the dev split's ids) are scored. ``labels`` are the labels responses
    may carry (validation labels such as ``mixed`` included); ``classes`` are the classes
    scored (default: the labels that occur as gold, in ``labels`` order). A response outside
    ``classes`` (a ``mixed`` vote on a positive example) is a miss for the gold class and a
    false positive for no class, as in DynaSent.

    Each example's responses are put in a random order (``random_state``: seed or Generator);
    synthetic annotator ``i`` gives each example its ``i``-th response. With unequal numbers of
    responses, annotator ``i`` only labels the examples that have at least ``i`` responses;
    ``n_annotators`` defaults to the largest number of responses of a scored example
    (DynaSent: 5). Each annotator's per-class and macro precision/recall/F1 are computed with
    sklearn, then averaged over annotators (the macro row is the mean of the annotators'
    macro scores).

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 2, 2], "worker_id": list("abab"),
    ...                       "label": ["pos", "pos", "neg", "pos"]})
    >>> result = human_performance(table, {1: "pos", 2: "neg"}, labels=["pos", "neg"])
    >>> result.scores.loc["macro avg", "f1"].round(3)
    np.float64(0.667)
    """
    allowed = check_labels_argument(labels)
    encoded = encode_single(responses, allowed)
    example_gold = gold_codes(gold, encoded.example_ids, allowed)
    scored_example = example_gold >= 0
    if examples is not None:
        scored_example &= np.asarray(encoded.example_ids.isin(list(examples)))
    if classes is None:
        present = np.unique(example_gold[scored_example])
        class_codes = [int(c) for c in present]
    else:
        class_codes = [int(c) for c in _class_codes(classes, allowed)]
    class_names = [allowed[c] for c in class_codes]

    rng = as_generator(random_state)
    slot = slots(encoded.example, encoded.n_examples, rng)
    row_scored = scored_example[encoded.example]
    n_scored = int(scored_example.sum())
    if n_annotators is None:
        per_example = np.bincount(encoded.example[row_scored], minlength=encoded.n_examples)
        n_annotators = int(per_example.max()) if n_scored else 0
    rows = []
    for annotator in range(n_annotators):
        mine = row_scored & (slot == annotator)
        truth = example_gold[encoded.example[mine]]
        guess = encoded.label[mine]
        if len(truth) == 0 or not class_codes:
            continue
        precision, recall, f1, _ = precision_recall_fscore_support(
            truth, guess, labels=class_codes, average=None, zero_division=0
        )
        for name, p, r, f in zip(class_names, precision, recall, f1, strict=True):
            rows.append(
                {
                    "annotator": annotator + 1,
                    "class": name,
                    "precision": p,
                    "recall": r,
                    "f1": f,
                    "n_examples": len(truth),
                }
            )
        rows.append(
            {
                "annotator": annotator + 1,
                "class": MACRO,
                "precision": precision.mean(),
                "recall": recall.mean(),
                "f1": f1.mean(),
                "n_examples": len(truth),
            }
        )
    per_annotator = pd.DataFrame(rows, columns=["annotator", "class", "precision", "recall", "f1", "n_examples"])
    order = class_names + [MACRO]
    if per_annotator.empty:
        scores = pd.DataFrame(np.nan, index=pd.Index(order, name="class"), columns=["precision", "recall", "f1"])
    else:
        scores = per_annotator.groupby("class", sort=False)[["precision", "recall", "f1"]].mean().reindex(order)
        scores.index.name = "class"
    return HumanPerformance(
        scores=scores,
        per_annotator=per_annotator,
        n_examples=n_scored,
        n_annotators=int(per_annotator["annotator"].nunique()) if not per_annotator.empty else 0,
    )


def _class_codes(classes: Sequence[str], allowed: Sequence[str]) -> list[int]:
    unknown = [c for c in classes if c not in allowed]
    if unknown:
        raise ValueError(f"classes {unknown} are not among the labels {list(allowed)}")
    return [list(allowed).index(c) for c in classes]


def human_performance_table(
    responses: pd.DataFrame,
    gold: pd.Series | Mapping[Hashable, object],
    subsets: Mapping[str, Iterable[Hashable]],
    *,
    labels: Sequence[str],
    classes: Sequence[str] | None = None,
    metric: str = "f1",
    random_state: int | None = 0,
) -> pd.DataFrame:
    """DynaSent Table 6 / Table 9: one column per subset (e.g. Dev, Test), one row per class.

    Runs :func:`human_performance` on each subset of example ids with the same seed and
    returns ``metric`` (``"precision"``, ``"recall"`` or ``"f1"``) as fractions; rows are the
    classes then ``"macro avg"``. ``classes`` defaults to the labels occurring as gold in any
    subset, so every column has the same rows.

    >>> import pandas as pd
    >>> table = pd.DataFrame({"example_id": [1, 1, 2, 2], "worker_id": list("abab"),
    ...                       "label": ["pos", "pos", "neg", "neg"]})
    >>> human_performance_table(table, {1: "pos", 2: "neg"}, {"dev": [1, 2]},
    ...                         labels=["pos", "neg"]).to_dict()
    {'dev': {'pos': 1.0, 'neg': 1.0, 'macro avg': 1.0}}
    """
    if metric not in ("precision", "recall", "f1"):
        raise ValueError(f"metric must be precision, recall or f1, got {metric!r}")
    allowed = check_labels_argument(labels)
    subset_ids: dict[str, list[Hashable]] = {name: list(ids) for name, ids in subsets.items()}
    if classes is None:
        gold_series = gold if isinstance(gold, pd.Series) else pd.Series(dict(gold), dtype=object)
        wanted = set()
        for ids in subset_ids.values():
            wanted |= set(gold_series.reindex(ids).dropna())
        classes = [label for label in allowed if label in wanted]
    columns = {}
    for name, ids in subset_ids.items():
        result = human_performance(
            responses, gold, labels=allowed, classes=classes, examples=ids, random_state=random_state
        )
        columns[name] = result.scores[metric]
    return pd.DataFrame(columns)
