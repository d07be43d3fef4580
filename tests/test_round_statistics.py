"""Round statistics on hand-computed fixtures (no database).

Every expected number below is worked out by hand in the comment next to it, or comes from
the published worked example it cites (Fleiss 1971 via Wikipedia, Krippendorff 2011,
iSarcasm Table 5/7, DynaSent Table 3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import cohen_kappa_score

from rounds.build.aggregation import (
    compare_aggregations,
    consolidate_target_sentiment,
    dawid_skene_labels,
    distribution_settings,
    distributional_labels,
    exclude_workers,
    keep_top_ranked,
    mace_labels,
    majority_labels,
    multilabel_gold,
    multilabel_model_labels,
    top_ranked,
)
from rounds.build.agreement import (
    count_table,
    disagreeing_workers,
    fleiss_kappa,
    intended_vs_perceived,
    krippendorff_alpha,
    multilabel_agreement,
    multilabel_worker_agreement,
    randolph_kappa,
    slot_cohen_kappas,
    target_sentiment_kappas,
    worker_agreement,
    worker_pair_cohen_kappas,
)
from rounds.build.human import human_performance, human_performance_table
from services.taskdef import example_path, load_task_definition

SENTIMENT = ["positive", "negative", "neutral", "mixed"]
EMOTIONS = ["anger", "disgust", "fear", "joy", "sadness", "surprise", "neutral"]
FIVE_POINT = ["negative", "weakly_negative", "neutral", "weakly_positive", "positive", "unknown"]
COLLAPSE = {
    "negative": "negative",
    "weakly_negative": "negative",
    "neutral": "neutral",
    "weakly_positive": "positive",
    "positive": "positive",
}


def long_table(rows: dict[object, list[object]]) -> pd.DataFrame:
    """{example_id: [label of response 1, ...]} -> long table; workers w0, w1, ... by position."""
    records = [
        (example_id, f"w{position}", label)
        for example_id, labels in rows.items()
        for position, label in enumerate(labels)
    ]
    return pd.DataFrame.from_records(records, columns=["example_id", "worker_id", "label"])


def from_counts(counts: list[list[int]], labels: list[str]) -> pd.DataFrame:
    """A long table with the given examples x labels count table."""
    return long_table(
        {
            i: [label for label, count in zip(labels, row, strict=True) for _ in range(count)]
            for i, row in enumerate(counts)
        }
    )


# --- majority ---------------------------------------------------------------------------


def test_majority_k_of_n_on_dynasent_table_3_rows() -> None:
    table = long_table(
        {
            "good food": ["mixed", "mixed", "mixed", "negative", "negative"],  # Mixed majority 3/5
            "mistaken": ["negative", "positive", "positive", "positive", "positive"],  # 4/5
            "tie": ["positive", "positive", "negative", "negative", "neutral"],  # 2-2-1
            "two": ["positive", "positive", "negative", "neutral", "mixed"],  # 2-1-1-1
        }
    )
    result = majority_labels(table, labels=SENTIMENT)
    assert result.loc["good food"].tolist() == ["mixed", 3, 5]
    assert result.loc["mistaken"].tolist() == ["positive", 4, 5]
    assert result.loc["tie", "label"] is None and result.loc["tie", "votes"] == 2
    assert result.loc["two", "label"] is None  # 2 of 5 is not a strict majority

    two_of_five = majority_labels(table, labels=SENTIMENT, min_votes=2)
    assert two_of_five.loc["two", "label"] == "positive"
    assert two_of_five.loc["tie", "label"] is None  # ties never give gold
    assert majority_labels(table, labels=SENTIMENT, min_votes=4)["label"].tolist() == [
        None,
        "positive",
        None,
        None,
    ]


def test_majority_rejects_bad_min_votes() -> None:
    with pytest.raises(ValueError, match="min_votes"):
        majority_labels(long_table({1: ["positive"]}), labels=SENTIMENT, min_votes=0)


# --- distributional labels --------------------------------------------------------------


def test_distributional_labels_split_mixed_into_two_copies() -> None:
    table = long_table(
        {
            1: ["mixed", "mixed", "mixed", "negative", "negative"],  # pos 3, neg 3+2 -> 3/8, 5/8
            2: ["mixed", "neutral", "positive", "positive", "positive"],  # pos 4, neg 1, neu 1 of 6
            3: ["neutral"] * 5,
        }
    )
    dist = distributional_labels(
        table, labels=["positive", "negative", "neutral"], split={"mixed": ["positive", "negative"]}
    )
    assert list(dist.columns) == ["positive", "negative", "neutral"]
    np.testing.assert_allclose(dist.loc[1], [3 / 8, 5 / 8, 0])
    np.testing.assert_allclose(dist.loc[2], [4 / 6, 1 / 6, 1 / 6])
    np.testing.assert_allclose(dist.loc[3], [0, 0, 1])
    np.testing.assert_allclose(dist.sum(axis=1), 1.0)

    # "fraction": a mixed vote is half positive, half negative; every response weighs 1/5.
    fraction = distributional_labels(
        table,
        labels=["positive", "negative", "neutral"],
        split={"mixed": ["positive", "negative"]},
        mode="fraction",
    )
    np.testing.assert_allclose(fraction.loc[2], [3.5 / 5, 0.5 / 5, 1 / 5])


def test_distributional_labels_drop_discard_and_all_dropped_row_is_nan() -> None:
    table = long_table({1: ["sarcastic", "discard", "not_sarcastic"], 2: ["discard", "discard"]})
    dist = distributional_labels(table, labels=["sarcastic", "not_sarcastic"], drop=["discard"])
    np.testing.assert_allclose(dist.loc[1], [0.5, 0.5])
    assert dist.loc[2].isna().all()
    assert list(dist.dropna().index) == [1]


def test_distribution_settings_from_task_files() -> None:
    dynasent = distribution_settings(load_task_definition(example_path("dynasent-r2")))
    assert dynasent["split"] == {"mixed": ("positive", "negative")}
    besstie = distribution_settings(load_task_definition(example_path("besstie-en-in-sarcasm")))
    assert besstie["drop"] == ("discard",)
    mad = distribution_settings(load_task_definition(example_path("mad-tsc")))
    assert mad["split"] == {"weakly_negative": ("negative",), "weakly_positive": ("positive",)}
    assert mad["drop"] == ("unknown",)
    table = long_table({1: ["weakly_positive", "positive", "neutral"]})
    dist = distributional_labels(table, **mad)
    np.testing.assert_allclose(dist.loc[1], [0, 1 / 3, 2 / 3])  # negative, neutral, positive


# --- Dawid-Skene and MACE ---------------------------------------------------------------


def spammer_fixture() -> pd.DataFrame:
    """Three careful workers who agree and one who always says 'negative'."""
    truth = ["positive", "neutral", "positive", "neutral", "positive", "neutral"] * 3
    records = []
    for example_id, label in enumerate(truth):
        for worker in ("a", "b", "c"):
            records.append((example_id, worker, label))
        records.append((example_id, "spammer", "negative"))
    return pd.DataFrame.from_records(records, columns=["example_id", "worker_id", "label"])


def test_dawid_skene_and_mace_side_by_side_with_majority() -> None:
    table = spammer_fixture()
    labels = ["positive", "negative", "neutral"]
    both = compare_aggregations(table, labels=labels, methods=("dawid_skene", "mace"), mace_restarts=2)
    assert (both["dawid_skene"] == both["majority"]).all()
    assert (both["mace"] == both["majority"]).all()
    assert ((both["dawid_skene_probability"] > 0.9) & (both["dawid_skene_probability"] <= 1)).all()
    assert ((both["mace_probability"] > 0.5) & (both["mace_probability"] <= 1)).all()
    assert "mace" not in compare_aggregations(table, labels=labels).columns  # MACE is opt-in

    with_probas = dawid_skene_labels(table, labels=labels, probabilities=True)
    probas = with_probas[["p_positive", "p_negative", "p_neutral"]]
    np.testing.assert_allclose(probas.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(with_probas["probability"], probas.max(axis=1))


def test_mace_is_seeded() -> None:
    table = spammer_fixture()
    first = mace_labels(table, labels=["positive", "negative", "neutral"], random_state=7, n_restarts=2)
    again = mace_labels(table, labels=["positive", "negative", "neutral"], random_state=7, n_restarts=2)
    pd.testing.assert_frame_equal(first, again)


# --- multi-label (EthioEmo) --------------------------------------------------------------


def ethioemo_fixture() -> pd.DataFrame:
    return long_table(
        {
            1: [("disgust", "anger"), ("anger",), ("disgust", "fear")],
            2: [("joy",), ("sadness",), ("neutral",)],
            3: [(), ("joy",), ("surprise", "joy")],
        }
    )


def test_multilabel_gold_two_of_three() -> None:
    gold = multilabel_gold(ethioemo_fixture(), labels=EMOTIONS, min_votes=2)
    # anger 2, disgust 2, fear 1 -> {anger, disgust}, in the task's label order.
    assert gold.loc[1, "label"] == ("anger", "disgust")
    assert gold.loc[2, "label"] is None  # three different single labels: no gold
    assert gold.loc[3, "label"] == ("joy",)  # the empty response is a response
    assert gold["n_responses"].tolist() == [3, 3, 3]
    assert gold.loc[1, ["votes_anger", "votes_disgust", "votes_fear"]].tolist() == [2, 2, 1]
    assert multilabel_gold(ethioemo_fixture(), labels=EMOTIONS, min_votes=3)["label"].isna().all()


def test_multilabel_agreement_by_hand() -> None:
    result = multilabel_agreement(ethioemo_fixture(), labels=EMOTIONS)
    anger = result.per_label.loc["anger"]
    # anger chosen/not per example: [2,1], [0,3], [0,3]. P_i = 1/3, 1, 1 -> P = 7/9.
    # p_chosen = 2/9 -> P_e = (2/9)^2 + (7/9)^2 = 53/81; kappa = (63-53)/(81-53) = 10/28.
    assert anger["fleiss"] == pytest.approx(10 / 28)
    assert anger["randolph"] == pytest.approx((7 / 9 - 1 / 2) / (1 / 2))  # 5/9
    assert anger["prevalence"] == pytest.approx(2 / 9)
    # Jaccard: example 1 pairs 1/2, 1/3, 0 -> 5/18; example 2 -> 0; example 3 pairs 0, 0, 1/2 -> 1/6.
    assert result.mean_jaccard == pytest.approx((5 / 18 + 0 + 1 / 6) / 3)
    assert result.n_examples == 3
    assert np.isnan(result.per_label.loc["neutral", "alpha"]) or -1 <= result.per_label.loc["neutral", "alpha"] <= 1


def test_multilabel_model_labels_see_through_two_spammers_that_majority_follows() -> None:
    # Three reliable annotators (right 95% of the time) and two spammers who always answer
    # fear+surprise; each example gets three of the five. Where both spammers label an example,
    # the per-label majority is their fear+surprise; Dawid-Skene per label (crowd-kit's
    # BinaryRelevance) learns that their "fear" says nothing and follows the reliable one.
    truths = [("joy",), ("anger", "disgust"), ("sadness",), ("neutral",), ("anger",)]
    rng = np.random.default_rng(3)
    rows, truth = [], {}
    for example in range(100):
        truth[example] = truths[example % 5]
        for worker in rng.choice(["r1", "r2", "r3", "s1", "s2"], size=3, replace=False):
            spam = worker.startswith("s")
            label = ("fear", "surprise") if spam else truth[example] if rng.random() < 0.95 else ("surprise",)
            rows.append((example, worker, label))
    table = pd.DataFrame(rows, columns=["example_id", "worker_id", "label"])
    model = multilabel_model_labels(table, labels=EMOTIONS, n_iter=30)
    majority = multilabel_gold(table, labels=EMOTIONS, min_votes=2)
    right = sum(model.loc[e, "label"] == truth[e] for e in truth)
    assert model["label"].notna().all() and right >= 90
    assert right > sum(majority.loc[e, "label"] == truth[e] for e in truth) + 15
    assert (
        ((model[[f"p_{label}" for label in EMOTIONS]] >= 0) & (model[[f"p_{label}" for label in EMOTIONS]] <= 1))
        .all()
        .all()
    )
    # Seeded MACE gives the same sets twice.
    mace = multilabel_model_labels(table, labels=EMOTIONS, method="mace", n_iter=20, mace_restarts=2, random_state=4)
    again = multilabel_model_labels(table, labels=EMOTIONS, method="mace", n_iter=20, mace_restarts=2, random_state=4)
    assert mace["label"].equals(again["label"])
    with pytest.raises(ValueError, match="unknown model-based aggregation"):
        multilabel_model_labels(table, labels=EMOTIONS, method="glad")  # type: ignore[arg-type]
    assert multilabel_model_labels(table.iloc[:0], labels=EMOTIONS).empty


def test_multilabel_model_labels_give_no_set_for_a_tie() -> None:
    # One example, two workers who disagree on joy; nothing else to learn from: a tie, no set.
    table = pd.DataFrame({"example_id": [1, 1], "worker_id": ["a", "b"], "label": [("joy",), ("anger",)]})
    assert multilabel_model_labels(table, labels=EMOTIONS)["label"].tolist() == [None]


def test_multilabel_worker_agreement_by_hand() -> None:
    # Gold {anger, disgust} for 1, none for 2 (left out), {joy} for 3.
    gold = {1: ("anger", "disgust"), 2: None, 3: ("joy",)}
    rates = multilabel_worker_agreement(ethioemo_fixture(), gold, labels=EMOTIONS)
    # w0: {disgust, anger} -> 1; (), i.e. nothing, against {joy} -> 0: mean 1/2, one exact.
    assert rates.loc["w0", "agreement_rate"] == pytest.approx(0.5) and rates.loc["w0", "n_agree"] == 1
    # w1: {anger} -> 1/2; {joy} -> 1: mean 3/4. w2: {disgust, fear} -> 1/3; {surprise, joy} -> 1/2.
    assert rates.loc["w1", "agreement_rate"] == pytest.approx(0.75)
    assert rates.loc["w2", "agreement_rate"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert rates["n_with_gold"].tolist() == [2, 2, 2] and rates["n_labels"].tolist() == [3, 3, 3]


# --- MAD-TSC consolidation ---------------------------------------------------------------


def mad_fixture() -> pd.DataFrame:
    return long_table(
        {
            "unanimous": ["positive", "weakly_positive", "positive"],
            "pos_neu": ["positive", "weakly_positive", "neutral"],  # neighbour -> keep
            "neu_neg": ["neutral", "neutral", "weakly_negative"],  # neighbour -> keep
            "pos_neg": ["positive", "positive", "weakly_negative"],  # two steps -> drop
            "unknown": ["positive", "positive", "unknown"],
            "spread": ["negative", "neutral", "positive"],
            "short": ["positive", "positive"],
        }
    )


def test_mad_tsc_neighbour_rule() -> None:
    result = consolidate_target_sentiment(mad_fixture(), collapse=COLLAPSE, unknown_label="unknown")
    expected = {
        "unanimous": ("positive", True, "unanimous"),
        "pos_neu": ("positive", True, "neighbouring_majority"),
        "neu_neg": ("neutral", True, "neighbouring_majority"),
        "pos_neg": (None, False, "non_neighbouring_vote"),
        "unknown": (None, False, "unknown_vote"),
        "spread": (None, False, "no_majority"),
        "short": (None, False, "too_few_responses"),
    }
    for example_id, (label, kept, reason) in expected.items():
        row = result.loc[example_id]
        assert (row["label"], bool(row["kept"]), row["reason"]) == (label, kept, reason), example_id


def test_mad_tsc_order_may_be_the_five_point_scale() -> None:
    # Neighbours are judged on the collapsed scale, also when `order` lists all 5 points.
    result = consolidate_target_sentiment(mad_fixture(), collapse=COLLAPSE, unknown_label="unknown", order=FIVE_POINT)
    assert result.loc["pos_neu", "reason"] == "neighbouring_majority"
    assert result.loc["pos_neg", "reason"] == "non_neighbouring_vote"


def test_mad_tsc_uses_task_file_and_kappa_after_consolidation_by_hand() -> None:
    task = load_task_definition(example_path("mad-tsc"))
    kappas = target_sentiment_kappas(mad_fixture(), collapse=task.label_collapse, unknown_label=task.unknown_label)
    # Kept: unanimous [0,0,3], pos_neu [0,1,2], neu_neg [1,2,0] over (neg, neu, pos).
    # P_i = 1, 1/3, 1/3 -> P = 5/9; p = (1, 3, 5)/9 -> P_e = 35/81; kappa = (45-35)/(81-35).
    assert kappas["consolidated"] == pytest.approx(10 / 46)
    assert set(kappas) == {"five_point", "collapsed", "consolidated"}
    assert kappas["collapsed"] < kappas["consolidated"]


# --- response filters ---------------------------------------------------------------------


def test_keep_top_ranked_and_exclude_workers() -> None:
    table = pd.DataFrame(
        {
            "example_id": [1] * 7 + [2] * 2,
            "worker_id": ["a", "b", "c", "d", "e", "f", "g", "a", "g"],
            "label": ["positive"] * 9,
        }
    )
    ranking = {"a": 0.9, "b": 0.5, "c": 1.0, "d": 0.5, "e": 0.7, "f": 0.2}  # g unranked
    kept = keep_top_ranked(table, ranking, n=4)
    # Example 1: c (1.0), a (0.9), e (0.7), then b and d tie at 0.5 -> b, the earlier row.
    assert kept.loc[kept["example_id"] == 1, "worker_id"].tolist() == ["a", "b", "c", "e"]
    # Example 2 has only two responses: untouched, even the unranked worker.
    assert kept.loc[kept["example_id"] == 2, "worker_id"].tolist() == ["a", "g"]
    assert exclude_workers(table, ["g", "f"])["worker_id"].tolist() == ["a", "b", "c", "d", "e", "a"]
    # Per example and pass: example 1's seven responses as a first pass of four (a-d) and a
    # second of three (e-g): at most two of each pass are kept, the best-ranked.
    passes = np.array([0, 0, 0, 0, 1, 1, 1, 0, 0])
    mask = top_ranked(table, ranking, n=2, groups=passes)
    assert table.loc[mask, "worker_id"].tolist() == ["a", "c", "e", "f", "a", "g"]
    with pytest.raises(ValueError, match="groups has 2 values for 9 responses"):
        top_ranked(table, ranking, n=2, groups=passes[:2])


# --- agreement ---------------------------------------------------------------------------

# Fleiss (1971) worked example as on Wikipedia: 10 subjects, 14 raters, 5 categories.
FLEISS_WIKIPEDIA = [
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
]


def test_fleiss_kappa_wikipedia_worked_example() -> None:
    categories = ["c1", "c2", "c3", "c4", "c5"]
    table = from_counts(FLEISS_WIKIPEDIA, categories)
    assert count_table(table, labels=categories).to_numpy().tolist() == FLEISS_WIKIPEDIA
    assert round(fleiss_kappa(table, labels=categories), 3) == 0.210


def test_fleiss_and_randolph_by_hand() -> None:
    table = long_table({1: ["a", "a", "a"], 2: ["a", "a", "b"], 3: ["b", "b", "b"]})
    # P_i = 1, 1/3, 1 -> P = 7/9; p_a = 5/9, p_b = 4/9 -> P_e = 41/81; kappa = (63-41)/(81-41).
    assert fleiss_kappa(table, labels=["a", "b"]) == pytest.approx(22 / 40)
    # Randolph: P_e = 1/k. k = 2 -> (7/9 - 1/2) / (1/2) = 5/9; k = 3 -> (7/9 - 1/3) / (2/3) = 2/3.
    assert randolph_kappa(table, labels=["a", "b"]) == pytest.approx(5 / 9)
    assert randolph_kappa(table, labels=["a", "b", "c"]) == pytest.approx(2 / 3)


def test_fleiss_needs_equal_raters_or_n_raters() -> None:
    table = long_table({1: ["a", "a", "a"], 2: ["a", "b"], 3: ["b", "b", "b"]})
    with pytest.raises(ValueError, match="n_raters"):
        fleiss_kappa(table, labels=["a", "b"])
    # Only examples 1 and 3 have 3 responses: perfect agreement on both.
    assert fleiss_kappa(table, labels=["a", "b"], n_raters=3) == pytest.approx(1.0)


def test_krippendorff_alpha_krippendorff_2011_nominal_example() -> None:
    # Krippendorff (2011), "Computing Krippendorff's alpha-reliability", 4 observers x 12 units,
    # missing values allowed; nominal alpha = 0.743 (interval 0.849).
    observers = [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
        [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
    ]
    records = [
        (unit, f"observer{o}", str(value))
        for o, row in enumerate(observers)
        for unit, value in enumerate(row)
        if value is not None
    ]
    table = pd.DataFrame.from_records(records, columns=["example_id", "worker_id", "label"])
    labels = ["1", "2", "3", "4", "5"]
    assert round(krippendorff_alpha(table, labels=labels), 3) == 0.743
    assert round(krippendorff_alpha(table, labels=labels, level="interval"), 3) == 0.849


def test_krippendorff_alpha_by_hand() -> None:
    table = long_table({1: ["a", "a"], 2: ["a", "b"], 3: ["b", "b"]})
    # Coincidences o_aa = 2, o_ab = o_ba = 1, o_bb = 2; n_a = n_b = 3, n = 6.
    # D_o = 2/6; D_e = 2 * 3 * 3 / (6 * 5) = 0.6; alpha = 1 - (1/3) / 0.6 = 4/9.
    assert krippendorff_alpha(table, labels=["a", "b"]) == pytest.approx(4 / 9)


def cohen_fixture() -> pd.DataFrame:
    slot1 = ["a", "a", "b", "b"]
    slot2 = ["a", "b", "b", "b"]
    records = [(i, "w1", x) for i, x in enumerate(slot1)] + [(i, "w2", y) for i, y in enumerate(slot2)]
    return pd.DataFrame.from_records(records, columns=["example_id", "worker_id", "label"])


def test_cohen_kappa_by_hand_between_slots_and_worker_pairs() -> None:
    # p_o = 3/4; marginals slot 1 (1/2, 1/2), slot 2 (1/4, 3/4) -> p_e = 1/8 + 3/8 = 1/2;
    # kappa = (3/4 - 1/2) / (1/2) = 1/2.
    slots = slot_cohen_kappas(cohen_fixture(), labels=["a", "b"])
    assert slots.to_dict("records") == [{"slot_a": 1, "slot_b": 2, "n_examples": 4, "kappa": 0.5}]
    pairs = worker_pair_cohen_kappas(cohen_fixture(), labels=["a", "b"], min_shared=4)
    assert pairs.to_dict("records") == [{"worker_a": "w1", "worker_b": "w2", "n_shared": 4, "kappa": 0.5}]
    assert worker_pair_cohen_kappas(cohen_fixture(), labels=["a", "b"], min_shared=5).empty


def test_worker_pair_kappas_match_sklearn() -> None:
    rng = np.random.default_rng(3)
    records = []
    for example_id in range(300):
        for worker in rng.choice(6, size=3, replace=False):
            records.append((example_id, f"w{worker}", str(rng.choice(["x", "y", "z"], p=[0.5, 0.3, 0.2]))))
    table = pd.DataFrame.from_records(records, columns=["example_id", "worker_id", "label"])
    pairs = worker_pair_cohen_kappas(table, labels=["x", "y", "z"], min_shared=10)
    assert len(pairs) == 15
    wide = table.pivot(index="example_id", columns="worker_id", values="label")
    for row in pairs.itertuples():
        both = wide[[row.worker_a, row.worker_b]].dropna()
        assert row.n_shared == len(both)
        assert row.kappa == pytest.approx(
            cohen_kappa_score(both[row.worker_a], both[row.worker_b], labels=["x", "y", "z"])
        )


def test_worker_agreement_and_disagreeing_workers() -> None:
    table = long_table(
        {
            1: ["positive", "positive", "negative"],
            2: ["negative", "negative", "positive"],
            3: ["neutral", "positive", "negative"],  # no majority: left out of the rates
            4: ["positive", "positive", "positive"],
        }
    )
    rates = worker_agreement(table, labels=SENTIMENT)
    # w0 and w1 agree on 1, 2, 4; w2 disagrees on 1 and 2, agrees on 4.
    assert rates.loc["w0"].tolist() == [4, 3, 3, 1.0, 0.0]
    assert rates.loc["w2", "n_with_gold"] == 3 and rates.loc["w2", "n_agree"] == 1
    assert rates.loc["w2", "disagreement_rate"] == pytest.approx(2 / 3)
    assert disagreeing_workers(rates, threshold=0.6, min_labels=3) == ["w2"]
    assert disagreeing_workers(rates, threshold=0.6, min_labels=4) == []
    assert disagreeing_workers(rates, threshold=2 / 3, min_labels=1) == []  # strictly more than

    explicit = worker_agreement(table, labels=SENTIMENT, gold={1: "negative", 2: None})
    assert explicit.loc["w2", ["n_with_gold", "n_agree"]].tolist() == [1, 1]


def isarcasm_table_5() -> tuple[pd.DataFrame, dict[int, str]]:
    """459 tweets, three validators each, whose majorities reproduce iSarcasm Table 5."""
    s, n = "sarcastic", "not_sarcastic"
    cells = [(s, s, 61), (s, n, 26), (n, s, 50), (n, n, 322)]  # (intended, perceived, count)
    rows, intended = {}, {}
    for intended_label, perceived, count in cells:
        for _ in range(count):
            example_id = len(rows)
            other = n if perceived == s else s
            rows[example_id] = [perceived, perceived, other]
            intended[example_id] = intended_label
    return long_table(rows), intended


def test_intended_vs_perceived_reproduces_isarcasm_tables_5_and_7() -> None:
    table, intended = isarcasm_table_5()
    result = intended_vs_perceived(table, intended, labels=["sarcastic", "not_sarcastic"], positive="sarcastic")
    assert result.confusion.to_numpy().tolist() == [[61, 26], [50, 322]]
    # Table 7 "Manual Labelling": P = 61/111, R = 61/87, F = 0.616.
    assert (round(result.precision, 3), round(result.recall, 3), round(result.f1, 3)) == (0.550, 0.701, 0.616)
    assert result.n_examples == 459 and result.n_without_perceived == 0

    per_response = intended_vs_perceived(
        table, intended, labels=["sarcastic", "not_sarcastic"], positive="sarcastic", level="response"
    )
    # Per sarcastic-intended tweet 2 of 3 validations are 'sarcastic' (61 tweets) or 1 of 3 (26).
    tp = 61 * 2 + 26 * 1
    fp = 50 * 2 + 322 * 1
    assert per_response.precision == pytest.approx(tp / (tp + fp))
    assert per_response.recall == pytest.approx(tp / (87 * 3))


# --- human performance -------------------------------------------------------------------


def test_human_f1_by_hand() -> None:
    table = long_table(
        {
            1: ["positive", "positive"],
            2: ["negative", "positive"],  # the only disagreement
            3: ["neutral", "neutral"],
            4: ["negative", "negative"],
        }
    )
    gold = {1: "positive", 2: "negative", 3: "neutral", 4: "negative"}
    result = human_performance(table, gold, labels=SENTIMENT, random_state=11)
    # The annotator who drew the 'positive' vote on example 2: positive P = 1/2, R = 1, F1 = 2/3;
    # negative P = 1, R = 1/2, F1 = 2/3; neutral 1. The other annotator is perfect. Averages:
    expected = {
        "positive": (0.75, 1.0, 5 / 6),
        "negative": (1.0, 0.75, 5 / 6),
        "neutral": (1.0, 1.0, 1.0),
        # macro = mean over classes (= mean of the two annotators' macro scores):
        "macro avg": ((0.75 + 1 + 1) / 3, (1 + 0.75 + 1) / 3, (7 / 9 + 1) / 2),
    }
    assert list(result.scores.index) == list(expected)
    for name, values in expected.items():
        np.testing.assert_allclose(result.scores.loc[name].to_numpy(), values, err_msg=name)
    assert result.n_examples == 4 and result.n_annotators == 2


def test_human_recall_is_the_agreement_rate_and_shuffle_is_seeded() -> None:
    # Every example 4/5: the five synthetic annotators' recalls average 4/5 for every class,
    # whichever order the shuffle picks (DynaSent §3.5's "conservative" estimate).
    rows, gold = {}, {}
    classes = ["positive", "negative", "neutral"]
    for i in range(30):
        right = classes[i % 3]
        wrong = classes[(i + 1) % 3] if i % 2 else "mixed"
        rows[i] = [right] * 4 + [wrong]
        gold[i] = right
    table = long_table(rows)
    result = human_performance(table, gold, labels=SENTIMENT, random_state=0)
    np.testing.assert_allclose(result.scores["recall"], 0.8)
    assert result.n_annotators == 5
    again = human_performance(table, gold, labels=SENTIMENT, random_state=0)
    pd.testing.assert_frame_equal(result.per_annotator, again.per_annotator)
    # Each synthetic annotator labels every example exactly once.
    assert (result.per_annotator["n_examples"] == 30).all()

    layout = human_performance_table(table, gold, {"dev": range(15), "test": range(15, 30)}, labels=SENTIMENT)
    assert list(layout.columns) == ["dev", "test"]
    assert list(layout.index) == ["positive", "negative", "neutral", "macro avg"]


def test_human_performance_skips_examples_without_gold() -> None:
    table = long_table({1: ["positive", "positive"], 2: ["positive", "negative"]})
    result = human_performance(table, {1: "positive", 2: None}, labels=SENTIMENT)
    assert result.n_examples == 1
    assert result.scores.loc["macro avg", "f1"] == 1.0


# --- one edge-case test over every aggregator ----------------------------------------------


@dataclass(frozen=True)
class Aggregator:
    run: Callable[[pd.DataFrame], pd.DataFrame]
    columns: list[str]
    first: object  # a valid response label (or label set) ...
    second: object  # ... and another one
    outside: object  # a label outside the task


AGGREGATORS = {
    "majority": Aggregator(
        lambda t: majority_labels(t, labels=SENTIMENT),
        ["label", "votes", "n_responses"],
        "positive",
        "negative",
        "sarcastic",
    ),
    "distributional": Aggregator(
        lambda t: distributional_labels(
            t, labels=["positive", "negative", "neutral"], split={"mixed": ["positive", "negative"]}
        ),
        ["positive", "negative", "neutral"],
        "positive",
        "negative",
        "sarcastic",
    ),
    "dawid_skene": Aggregator(
        lambda t: dawid_skene_labels(t, labels=SENTIMENT),
        ["label", "probability"],
        "positive",
        "negative",
        "sarcastic",
    ),
    "mace": Aggregator(
        lambda t: mace_labels(t, labels=SENTIMENT, n_restarts=2, n_iter=20),
        ["label", "probability"],
        "positive",
        "negative",
        "sarcastic",
    ),
    "multilabel_gold": Aggregator(
        lambda t: multilabel_gold(t, labels=EMOTIONS, min_votes=2),
        ["label", "n_responses"] + [f"votes_{e}" for e in EMOTIONS],
        ("joy",),
        ("anger",),
        ("happiness",),
    ),
    "mad_tsc": Aggregator(
        lambda t: consolidate_target_sentiment(t, collapse=COLLAPSE, unknown_label="unknown", min_responses=2),
        ["label", "votes", "n_responses", "kept", "reason"],
        "positive",
        "negative",
        "very_positive",
    ),
}

# What each aggregator documents for: one worker labelling two examples (first, second),
# and a 1-1 tie on one example.
SINGLE_WORKER = {
    "majority": [("positive", 1), ("negative", 1)],  # 1 of 1 is a strict majority
    "distributional": [[1, 0, 0], [0, 1, 0]],
    "dawid_skene": [("positive", 1.0), ("negative", 1.0)],
    "mace": [("positive", None), ("negative", None)],  # probability < 1 (MACE's spam prior)
    "multilabel_gold": [(None, 1), (None, 1)],  # one vote never reaches 2 of n
    "mad_tsc": [(None, "too_few_responses"), (None, "too_few_responses")],
}
TIE = {
    "majority": (None, 1),  # label None, votes 1
    "distributional": [0.5, 0.5, 0],
    "dawid_skene": (None, 0.5),
    "mace": (None, None),  # see the test: depends on MACE's seeded restarts
    "multilabel_gold": (None, 1),  # 1 vote each: neither label reaches 2
    "mad_tsc": (None, "no_majority"),  # 1-1 has no strict majority (1-1-1: see neighbour test)
}


@pytest.mark.parametrize("case", ["empty", "single_worker", "tie", "outside_label"])
@pytest.mark.parametrize("name", list(AGGREGATORS))
def test_edge_cases_for_every_aggregator(name: str, case: str) -> None:
    spec = AGGREGATORS[name]
    if case == "empty":
        empty = pd.DataFrame({"example_id": [], "worker_id": [], "label": []}, dtype=object)
        result = spec.run(empty)
        assert len(result) == 0
        assert list(result.columns) == spec.columns
        assert result.index.name == "example_id"
    elif case == "single_worker":
        table = pd.DataFrame({"example_id": [1, 2], "worker_id": ["only", "only"], "label": [spec.first, spec.second]})
        result = spec.run(table)
        assert list(result.index) == [1, 2]
        for example_id, expected in zip([1, 2], SINGLE_WORKER[name], strict=True):
            row = result.loc[example_id]
            if name == "distributional":
                np.testing.assert_allclose(row.to_numpy(dtype=float), expected)
                continue
            label, second = expected
            assert row["label"] == label
            if name in ("majority", "multilabel_gold"):
                assert row["n_responses"] == second
            elif name == "mad_tsc":
                assert row["reason"] == second and not row["kept"]
            elif second is not None:
                assert row["probability"] == pytest.approx(second)
            else:
                assert 0.5 < row["probability"] <= 1
    elif case == "tie":
        table = pd.DataFrame({"example_id": [1, 1], "worker_id": ["a", "b"], "label": [spec.first, spec.second]})
        row = spec.run(table).loc[1]
        expected = TIE[name]
        if name == "distributional":
            np.testing.assert_allclose(row.to_numpy(dtype=float), expected)
            return
        label, second = expected
        if name != "mace":
            assert row["label"] is label
        if name == "majority":
            assert row["votes"] == second
        elif name == "multilabel_gold":
            assert row["votes_joy"] == second and row["votes_anger"] == second
        elif name == "mad_tsc":
            assert row["reason"] == second
        elif name == "dawid_skene":
            assert row["probability"] == pytest.approx(second)
        else:
            # MACE's posteriors for a 1-1 split depend on the random restarts: the label is
            # None when they are within tie_tolerance, else the likelier of the two.
            probas = mace_labels(table, labels=SENTIMENT, n_restarts=2, n_iter=20, probabilities=True).loc[1]
            p_first, p_second = probas["p_positive"], probas["p_negative"]
            assert row["probability"] == pytest.approx(max(p_first, p_second))
            if abs(p_first - p_second) < 1e-4:
                assert row["label"] is None
            else:
                assert row["label"] == ("positive" if p_first > p_second else "negative")
    else:
        table = pd.DataFrame({"example_id": [1, 1], "worker_id": ["a", "b"], "label": [spec.first, spec.outside]})
        bad = spec.outside[0] if isinstance(spec.outside, tuple) else spec.outside
        with pytest.raises(ValueError, match=f"'{bad}' is not one of the task's labels"):
            spec.run(table)


@pytest.mark.parametrize(
    "statistic",
    [
        lambda t: fleiss_kappa(t, labels=SENTIMENT),
        lambda t: randolph_kappa(t, labels=SENTIMENT),
        lambda t: krippendorff_alpha(t, labels=SENTIMENT),
        lambda t: slot_cohen_kappas(t, labels=SENTIMENT),
        lambda t: worker_pair_cohen_kappas(t, labels=SENTIMENT, min_shared=1),
        lambda t: worker_agreement(t, labels=SENTIMENT),
        lambda t: human_performance(t, {1: "positive"}, labels=SENTIMENT),
    ],
    ids=["fleiss", "randolph", "krippendorff", "slot_cohen", "pair_cohen", "worker_agreement", "human"],
)
def test_every_statistic_names_a_label_outside_the_task(statistic) -> None:
    table = long_table({1: ["positive", "ironic"]})
    with pytest.raises(ValueError, match="'ironic' is not one of the task's labels"):
        statistic(table)


def test_missing_columns_and_missing_labels_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="missing"):
        majority_labels(pd.DataFrame({"example_id": [1], "label": ["positive"]}), labels=SENTIMENT)
    with pytest.raises(ValueError, match="no label"):
        majority_labels(long_table({1: ["positive", None]}), labels=SENTIMENT)


def test_large_frame_is_consistent_across_aggregators() -> None:
    """A quick property check on a random round: distributional argmax agrees with majority."""
    rng = np.random.default_rng(0)
    n_examples = 2000
    truth = rng.choice(["positive", "negative", "neutral"], size=n_examples)
    labels = np.where(
        rng.random((n_examples, 5)) < 0.8,
        truth[:, None],
        rng.choice(SENTIMENT, size=(n_examples, 5)),
    )
    table = pd.DataFrame(
        {
            "example_id": np.repeat(np.arange(n_examples), 5),
            "worker_id": rng.integers(0, 200, size=n_examples * 5),
            "label": labels.ravel(),
        }
    ).drop_duplicates(["example_id", "worker_id"])
    majority = majority_labels(table, labels=SENTIMENT)
    dist = distributional_labels(table, labels=SENTIMENT)
    has = majority["label"].notna()
    assert (dist.loc[has].idxmax(axis=1) == majority.loc[has, "label"]).all()


def test_agreement_reads_the_count_most_examples_have_when_few_have_the_tasks() -> None:
    from rounds.build.response_sets import agreement_raters, with_k_responses

    # Four examples with 3 responses, one with 5, one with a single response (never pairable).
    table = long_table({**{e: ["positive"] * 3 for e in range(4)}, 10: ["negative"] * 5, 11: ["neutral"]})
    assert agreement_raters(table, 5) == 3
    assert sorted(with_k_responses(table, 3)["example_id"].unique()) == [0, 1, 2, 3]
    # As many with the task's 5 as with 3: the task's count.
    table = long_table({0: ["positive"] * 3, 1: ["positive"] * 3, 10: ["negative"] * 5, 12: ["neutral"] * 5})
    assert agreement_raters(table, 5) == 5
    assert agreement_raters(table.iloc[:0], 5) == 5
