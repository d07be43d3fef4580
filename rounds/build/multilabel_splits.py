"""Train/dev/test splits of a multi-label round, stratified per label (EthioEmo's family).

Whole label *sets* are too many and too rare to stratify on (a set chosen for one example
would be a class of one), so dev and test are drawn with iterative stratification per label
(Sechidis et al. 2011) from the maintained ``iterative-stratification`` package
(``MultilabelStratifiedShuffleSplit``): every label keeps about the same share in train, dev
and test whatever sets it occurs in. The rules (docs/round_builder.md, "Multi-label rounds"):

* The input holds only examples with gold (rounds.build.pipeline excludes the rest).
* Dev/test candidates: examples whose every gold label has at least ``min_votes`` votes
  (``gold_votes`` is the weakest gold label's count); one per prompt (the first of a
  seeded shuffle), so no two dev/test examples share a prompt.
* Each of dev and test takes ``DEV_TEST_SHARE`` of the examples, at most a third of the
  candidates each, at most ``max_per_label`` x number of labels when that cap is given.
* An example that shares its prompt with a dev/test example is excluded
  (``prompt_shared_with_assessment``), as in the single-label splits: its prompt must not
  reach train.
* Train never lacks a label that has examples: if stratification left one out of train, the
  dev/test example with that label and the fewest gold labels moves to train (noted).

Deterministic for the seed: the input is put in ``example_id`` order first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from iterstrat.ml_stratifiers import MultilabelStratifiedShuffleSplit
from sklearn.metrics import accuracy_score, f1_score

from rounds.build.splits import SPLITS, SplitReport, SplitResult

# Share of the examples each of dev and test takes (EthioEmo's dev is about a tenth of the
# data and test about a third; a tenth-to-a-fifth each is the usual compromise for a round).
DEV_TEST_SHARE = 0.15


def _binary(gold: Sequence[object], labels: Sequence[str]) -> np.ndarray:
    position = {label: j for j, label in enumerate(labels)}
    matrix = np.zeros((len(gold), len(labels)), dtype=np.int8)
    for i, value in enumerate(gold):
        for label in value if isinstance(value, tuple | list) else ():
            if label in position:
                matrix[i, position[label]] = 1
    return matrix


def _stratified(y: np.ndarray, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``y``'s rows (rest, chosen): ``size`` rows chosen stratified per label."""
    splitter = MultilabelStratifiedShuffleSplit(n_splits=1, test_size=size, random_state=seed)
    rest, chosen = next(splitter.split(np.zeros((len(y), 1)), y))
    return np.sort(rest), np.sort(chosen)


def model_scores(gold: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Micro and macro F1 over labels (labels never gold nor predicted are left out of the
    macro average) and exact-set accuracy of label-set predictions (binary matrices)."""
    present = (gold.sum(axis=0) + predicted.sum(axis=0)) > 0
    if not present.any():
        return {"n": len(gold), "micro_f1": float("nan"), "macro_f1": float("nan"), "accuracy": float("nan")}
    g, p = gold[:, present], predicted[:, present]
    return {
        "n": len(gold),
        "micro_f1": float(f1_score(g, p, average="micro", zero_division=0)),
        "macro_f1": float(f1_score(g, p, average="macro", zero_division=0)),
        "accuracy": float(accuracy_score(g, p)),
    }


def _one_per_prompt(
    strong: np.ndarray, prompt: np.ndarray, has_prompt: np.ndarray, ids: np.ndarray, seed: int
) -> np.ndarray:
    """The dev/test candidates: examples with strong enough gold, one per prompt (a seeded
    choice among a prompt's examples; an example without a prompt stands alone)."""
    rng = np.random.default_rng(seed)
    candidate = np.zeros(len(strong), dtype=bool)
    seen: set[object] = set()
    for i in rng.permutation(len(strong)):
        if not strong[i]:
            continue
        key = prompt[i] if has_prompt[i] else ("example", ids[i])
        if key in seen:
            continue
        seen.add(key)
        candidate[i] = True
    return candidate


def _keep_every_label_in_train(y: np.ndarray, split: np.ndarray, ids: np.ndarray, labels: list[str]) -> list[str]:
    """Never leave train without a label that has examples: move one dev/test example of such a
    label (the fewest gold labels, then the smallest id) to train. ``split`` changes in place;
    returns a note per move."""
    notes = []
    for j, label in enumerate(labels):
        with_label = y[:, j] == 1
        if with_label.any() and not (with_label & (split == "train")).any():
            movable = np.flatnonzero(with_label & np.isin(split, ["dev", "test"]))
            i = min(movable, key=lambda k: (int(y[k].sum()), ids[k]))
            notes.append(f"example {ids[i]} moved from {split[i]} to train: train had no example of {label!r}")
            split[i] = "train"
    return notes


def _exclude_shared_prompts(split: np.ndarray, prompt: np.ndarray, has_prompt: np.ndarray) -> np.ndarray:
    """A prompt that serves dev/test keeps its other examples out of train: they become
    excluded (``split`` changes in place); returns which rows."""
    assessed_prompts = {prompt[i] for i in np.flatnonzero(np.isin(split, ["dev", "test"]) & has_prompt)}
    shared = (split == "train") & has_prompt & np.array([p in assessed_prompts for p in prompt], dtype=bool)
    split[shared] = "excluded"
    return shared


def _counts_per_label(
    y: np.ndarray, split: np.ndarray, candidate: np.ndarray, labels: list[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per label and split, the examples whose gold holds the label (and the examples, each once,
    in Total); per label, the candidates and how many are in dev and test."""
    columns = ["train", "dev", "test", "excluded"]
    counts = pd.DataFrame(
        [[int((y[:, j] == 1)[split == s].sum()) for s in columns] for j in range(len(labels))]
        + [[int((split == s).sum()) for s in columns]],
        index=pd.Index([*labels, "Total"], name="gold"),
        columns=columns,
    )
    availability = pd.DataFrame(
        {
            "eligible": [int((y[:, j] == 1)[candidate].sum()) for j in range(len(labels))],
            "dev": counts["dev"].iloc[: len(labels)].to_numpy(),
            "test": counts["test"].iloc[: len(labels)].to_numpy(),
        },
        index=pd.Index(labels, name="label"),
    )
    return counts, availability


def _model_metrics(
    y: np.ndarray, split: np.ndarray, model_prediction: pd.Series, labels: list[str]
) -> dict[str, dict[str, float]]:
    """The model's scores on dev and test, over the examples it predicted."""
    predicted = _binary([p if isinstance(p, tuple | list) else () for p in model_prediction], labels)
    has_prediction = np.array([isinstance(p, tuple | list) and len(p) > 0 for p in model_prediction], dtype=bool)
    metrics = {}
    for name in ("dev", "test"):
        rows = (split == name) & has_prediction
        if rows.any():
            metrics[name] = model_scores(y[rows], predicted[rows])
    return metrics


def build_multilabel_splits(
    examples: pd.DataFrame,
    labels: Sequence[str],
    *,
    min_votes: int,
    seed: int = 0,
    max_per_label: int | None = None,
) -> SplitResult:
    """Assign every example (columns of rounds.build.splits.COLUMNS, gold a tuple of labels)
    to train, dev, test or excluded; see the module docstring for the rules."""
    labels = list(labels)
    if max_per_label is not None and max_per_label < 1:
        raise ValueError(f"max_per_cell must be at least 1 for a multi-label build, got {max_per_label}")
    frame = examples.sort_values("example_id", kind="stable").reset_index(drop=True)
    n = len(frame)
    ids = frame["example_id"].to_numpy()
    y = _binary(list(frame["gold"]), labels)
    votes = pd.to_numeric(frame["gold_votes"], errors="coerce").fillna(0).to_numpy()
    prompt = frame["prompt_id"].to_numpy(dtype=object)
    has_prompt = np.array([p is not None and not pd.isna(p) for p in prompt], dtype=bool)
    no_prompt = (frame["condition"].to_numpy() != "prompt") | ~has_prompt

    # Candidates: strong enough gold, one per prompt (seeded choice among a prompt's examples).
    strong = (votes >= min_votes) & (y.sum(axis=1) > 0)
    candidate = _one_per_prompt(strong, prompt, has_prompt, ids, seed)
    cand = np.flatnonzero(candidate)

    size = round(DEV_TEST_SHARE * n)
    size = min(size, len(cand) // 3)
    if max_per_label is not None:
        size = min(size, max_per_label * len(labels))
    split = np.full(n, "train", dtype=object)
    notes: list[str] = []
    if size >= 1:
        _, assess = _stratified(y[cand], 2 * size, seed)
        assess_rows = cand[assess]
        dev_pos, test_pos = _stratified(y[assess_rows], size, seed)
        split[assess_rows[dev_pos]] = "dev"
        split[assess_rows[test_pos]] = "test"
    else:
        notes.append(
            f"{len(cand)} examples qualify for dev/test (every gold label with at least {min_votes} votes, "
            "one per prompt): too few for dev and test, so every example is in train"
        )

    notes += _keep_every_label_in_train(y, split, ids, labels)

    shared = _exclude_shared_prompts(split, prompt, has_prompt)

    ineligible = np.full(n, None, dtype=object)
    ineligible[~strong] = "below_min_votes"
    ineligible[strong & ~candidate] = "prompt_already_a_candidate"
    flags = pd.DataFrame(
        {
            "no_prompt": no_prompt,
            "prompt_shared_with_assessment": shared,
            "ineligible_reason": ineligible,
        },
        index=pd.Index(ids, name="example_id"),
    )
    assignment = pd.Series(
        pd.Categorical(split, categories=list(SPLITS)), index=pd.Index(ids, name="example_id"), name="split"
    )

    counts, availability = _counts_per_label(y, split, candidate, labels)
    metrics = _model_metrics(y, split, frame["model_prediction"], labels)
    dev_n, test_n = int((split == "dev").sum()), int((split == "test").sum())
    report = SplitReport(
        labels=labels,
        classes=labels,
        chance=False,
        seed=seed,
        min_votes=min_votes,
        unit="label",
        counts_by_gold=counts,
        counts_by_cell=None,
        availability=availability,
        dev_per_cell=dev_n,
        test_per_cell=test_n,
        max_c=len(cand) // 3,
        upper_bound_c=len(cand) // 3,
        max_total_per_cell=2 * (len(cand) // 3),
        upper_bound_total_per_cell=2 * (len(cand) // 3),
        capped=max_per_label is not None,
        model_metrics=metrics,
        chance_macro_f1=None,
        at_chance=None,
        excluded={"prompt_shared_with_assessment": int(shared.sum())} if shared.any() else {},
        ineligible={
            str(reason): int((ineligible == reason).sum())
            for reason in ("below_min_votes", "prompt_already_a_candidate")
            if (ineligible == reason).any()
        },
        eligible_in_train=int((candidate & (split == "train")).sum()),
        no_prompt_in_train=int((no_prompt & (split == "train")).sum()),
        notes=notes,
    )
    return SplitResult(assignment=assignment, flags=flags, report=report)
