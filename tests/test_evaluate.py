"""Evaluation: metrics against scikit-learn and hand-computed answers, the solved flag, per-variety
and cross-variety figures, plots, prediction with a tiny random model, and `round evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, jaccard_score
from typer.testing import CliRunner

from dynaloop.cli import app as cli
from rounds.models.datasets import LabelledSet
from rounds.models.errors import EvaluationError
from rounds.models.evaluate import (
    cross_variety_from_predictions,
    cross_variety_matrix,
    evaluate_model,
    evaluate_probabilities,
)
from rounds.models.evaluation_report import plot_cross_variety, write_evaluation
from rounds.models.inference import LoadedClassifier, predict_loaded, predict_probabilities
from rounds.models.init_model import init_model_dir
from rounds.models.metrics import compute_metrics, default_positive_label
from rounds.models.registry import find_model
from services.db.engine import make_engine, make_sessionmaker, session_scope
from services.db.models import ModelVersionStatus
from services.domain.tasks import get_task

SENTIMENT = ["positive", "negative", "neutral"]
EMOTIONS = ["anger", "joy", "neutral"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def labelled(
    name: str,
    labels: list[str],
    gold: list[int],
    *,
    varieties: list[str | None] | None = None,
    origin: dict | None = None,
) -> LabelledSet:
    return LabelledSet(
        name=name,
        labels=labels,
        multi_label=False,
        texts=[f"text {i}" for i in range(len(gold))],
        y=np.eye(len(labels), dtype=np.float32)[gold],
        varieties=varieties,
        origin=origin or {},
    )


def one_hot_probabilities(predicted: list[int], n_labels: int) -> np.ndarray:
    """Probabilities whose argmax is ``predicted`` (0.6 on it, the rest spread)."""
    probabilities = np.full((len(predicted), n_labels), 0.4 / (n_labels - 1))
    probabilities[np.arange(len(predicted)), predicted] = 0.6
    return probabilities


def random_case(seed: int, n: int = 80, n_labels: int = 3) -> tuple[LabelledSet, np.ndarray]:
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, n_labels, n).tolist()
    probabilities = rng.dirichlet(np.ones(n_labels), n)
    labels = SENTIMENT[:n_labels] if n_labels <= 3 else [f"c{i}" for i in range(n_labels)]
    return labelled("random", labels, gold), probabilities


# ---------------------------------------------------------------------------- single-label metrics


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_label_metrics_equal_scikit_learn(seed: int) -> None:
    labelled_set, probabilities = random_case(seed)
    gold, predicted = labelled_set.hard(), probabilities.argmax(axis=1)
    metrics = compute_metrics(labelled_set, probabilities)
    per_class = f1_score(gold, predicted, labels=[0, 1, 2], average=None)
    assert [metrics.f1[label] for label in SENTIMENT] == pytest.approx(per_class.tolist())
    assert metrics.macro_f1 == pytest.approx(f1_score(gold, predicted, labels=[0, 1, 2], average="macro"))
    assert metrics.accuracy == pytest.approx(accuracy_score(gold, predicted))
    assert metrics.confusion == confusion_matrix(gold, predicted, labels=[0, 1, 2]).tolist()
    assert sum(metrics.support.values()) == len(labelled_set)
    assert metrics.positive_f1 is None, "three classes: no positive class unless one is named"


def test_hand_computed_small_case() -> None:
    # gold:      P P N U U U      positive: tp 1, fp 1, fn 1 -> F1 1/2
    # predicted: P N N U U P      negative: tp 1, fp 1, fn 0 -> F1 2/3
    #                             neutral:  tp 2, fp 0, fn 1 -> F1 4/5
    labelled_set = labelled("toy", SENTIMENT, [0, 0, 1, 2, 2, 2])
    metrics = compute_metrics(labelled_set, one_hot_probabilities([0, 1, 1, 2, 2, 0], 3))
    assert metrics.f1 == pytest.approx({"positive": 0.5, "negative": 2 / 3, "neutral": 0.8})
    assert metrics.precision == pytest.approx({"positive": 0.5, "negative": 0.5, "neutral": 1.0})
    assert metrics.recall == pytest.approx({"positive": 0.5, "negative": 1.0, "neutral": 2 / 3})
    assert metrics.macro_f1 == pytest.approx((0.5 + 2 / 3 + 0.8) / 3)
    assert metrics.accuracy == pytest.approx(4 / 6)
    assert metrics.confusion == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert metrics.support == {"positive": 2, "negative": 1, "neutral": 3}


def test_a_class_missing_from_gold_and_predictions_counts_as_zero_in_the_macro_average() -> None:
    labelled_set = labelled("two of three", SENTIMENT, [0, 1, 0, 1])
    metrics = compute_metrics(labelled_set, one_hot_probabilities([0, 1, 0, 1], 3))
    assert metrics.f1 == {"positive": 1.0, "negative": 1.0, "neutral": 0.0}
    assert metrics.macro_f1 == pytest.approx(2 / 3)


def test_wrong_shape_is_refused() -> None:
    with pytest.raises(EvaluationError, match="expected"):
        compute_metrics(labelled("toy", SENTIMENT, [0, 1]), np.ones((3, 3)) / 3)


# ---------------------------------------------------------------------------- positive class (binary tasks)


def test_positive_class_defaults_and_override() -> None:
    assert default_positive_label(["sarcastic", "not_sarcastic"]) == "sarcastic"
    assert default_positive_label(["negative", "positive"]) == "positive"
    assert default_positive_label(["Positive", "Negative"]) == "Positive"
    assert default_positive_label(["ham", "spam"]) == "spam"

    # gold S S S N N; predicted S N S S N -> sarcastic: tp 2, fp 1, fn 1 -> F1 2/3; not: tp 1, fp 1, fn 1 -> 1/2
    labels = ["sarcastic", "not_sarcastic"]
    labelled_set = labelled("sarcasm", labels, [0, 0, 0, 1, 1])
    probabilities = one_hot_probabilities([0, 1, 0, 0, 1], 2)
    metrics = compute_metrics(labelled_set, probabilities)
    assert metrics.positive_label == "sarcastic"
    assert metrics.positive_f1 == pytest.approx(2 / 3)
    assert metrics.positive_f1 == pytest.approx(f1_score(labelled_set.hard(), probabilities.argmax(1), pos_label=0))
    other = compute_metrics(labelled_set, probabilities, positive_label="not_sarcastic")
    assert other.positive_label == "not_sarcastic" and other.positive_f1 == pytest.approx(0.5)
    with pytest.raises(EvaluationError, match="not one of the labels"):
        compute_metrics(labelled_set, probabilities, positive_label="ironic")


# ---------------------------------------------------------------------------- multi-label


def multi_labelled(gold: list[list[int]]) -> LabelledSet:
    return LabelledSet(
        name="emotions",
        labels=EMOTIONS,
        multi_label=True,
        texts=[str(i) for i in range(len(gold))],
        y=np.array(gold, dtype=np.float32),
    )


def test_multi_label_hand_computed() -> None:
    gold = [[1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]]
    probabilities = np.array([[0.9, 0.2, 0.1], [0.1, 0.7, 0.6], [0.3, 0.4, 0.8], [0.6, 0.55, 0.2]])
    # predicted at 0.5: [1,0,0] [0,1,1] [0,0,1] [1,1,0]
    # anger: tp 2 -> 1; joy: tp 1, fp 1, fn 1 -> 1/2; neutral: tp 1, fp 1 -> 2/3
    # micro: tp 4, fp 2, fn 1 -> 8/11; exact match 1/4; Jaccard (1/2 + 1/2 + 1 + 1/2) / 4
    metrics = compute_metrics(multi_labelled(gold), probabilities, threshold=0.5)
    assert metrics.f1 == pytest.approx({"anger": 1.0, "joy": 0.5, "neutral": 2 / 3})
    assert metrics.macro_f1 == pytest.approx((1 + 0.5 + 2 / 3) / 3)
    assert metrics.micro_f1 == pytest.approx(8 / 11)
    assert metrics.accuracy == pytest.approx(0.25)
    assert metrics.jaccard == pytest.approx(0.625)
    assert metrics.confusion[1] == [[1, 1], [1, 1]]  # joy: tn, fp / fn, tp
    assert metrics.positive_f1 is None
    # At 0.65 the 0.6s and the 0.55 drop out: anger tp 1, fn 1 -> 2/3; joy tp 1, fn 1 -> 2/3; neutral tp 1 -> 1.
    strict = compute_metrics(multi_labelled(gold), probabilities, threshold=0.65)
    assert strict.f1 == pytest.approx({"anger": 2 / 3, "joy": 2 / 3, "neutral": 1.0})


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
def test_multi_label_metrics_equal_scikit_learn(threshold: float) -> None:
    rng = np.random.default_rng(3)
    gold = (rng.random((50, 3)) < 0.4).astype(int)
    probabilities = rng.random((50, 3))
    predicted = (probabilities >= threshold).astype(int)
    metrics = compute_metrics(multi_labelled(gold.tolist()), probabilities, threshold=threshold)
    assert [metrics.f1[label] for label in EMOTIONS] == pytest.approx(
        f1_score(gold, predicted, average=None, zero_division=0).tolist()
    )
    assert metrics.macro_f1 == pytest.approx(f1_score(gold, predicted, average="macro", zero_division=0))
    assert metrics.micro_f1 == pytest.approx(f1_score(gold, predicted, average="micro", zero_division=0))
    assert metrics.jaccard == pytest.approx(jaccard_score(gold, predicted, average="samples", zero_division=1.0))


# ---------------------------------------------------------------------------- evaluation, solved flag, varieties


def test_solved_flag_compares_macro_f1_with_the_human_estimate() -> None:
    gold, predicted = [0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0]  # macro-F1 0.6556 (hand-computed above)
    sets = [
        labelled("round 1 dev", SENTIMENT, gold, origin={"round": 1, "split": "dev"}),
        labelled("round 1 test", SENTIMENT, gold, origin={"round": 1, "split": "test"}),
        labelled("sst-3 test", SENTIMENT, gold),
    ]
    probabilities = [one_hot_probabilities(predicted, 3)] * 3
    evaluation = evaluate_probabilities(sets, probabilities, human_f1={"round 1 dev": 0.6, "round 1 test": 0.88})
    dev, test, external = evaluation.sets
    assert dev.solved is True and dev.human_f1 == 0.6 and dev.round == 1 and dev.split == "dev"
    assert test.solved is False
    assert external.solved is None and external.human_f1 is None
    assert evaluation.solved == {"round 1 dev": True, "round 1 test": False}
    exactly = evaluate_probabilities(sets[:1], probabilities[:1], human_f1={"round 1 dev": dev.macro_f1})
    assert exactly.sets[0].solved is True, "reaching the human estimate counts as solved"

    table = evaluation.table()
    assert list(table.index) == ["round 1 dev", "round 1 test", "sst-3 test"]
    assert list(table.columns) == ["rows", *SENTIMENT, "macro_f1", "human_f1", "solved"]
    assert table.loc["sst-3 test", "neutral"] == pytest.approx(0.8)


def test_duplicate_set_names_are_refused() -> None:
    sets = [labelled("same", SENTIMENT, [0, 1]), labelled("same", SENTIMENT, [1, 0])]
    with pytest.raises(EvaluationError, match="distinct names"):
        evaluate_probabilities(sets, [one_hot_probabilities([0, 1], 3)] * 2)


def test_per_variety_breakdown() -> None:
    rng = np.random.default_rng(5)
    gold = rng.integers(0, 2, 60).tolist()
    varieties = [["en-AU", "en-IN", "en-UK"][i % 3] for i in range(59)] + [None]
    labels = ["negative", "positive"]
    probabilities = rng.dirichlet(np.ones(2), 60)
    evaluation = evaluate_probabilities([labelled("besstie test", labels, gold, varieties=varieties)], [probabilities])
    by_variety = evaluation.sets[0].by_variety
    assert list(by_variety) == ["en-AU", "en-IN", "en-UK", "unspecified"]
    gold_array, predicted = np.array(gold), probabilities.argmax(1)
    for variety in ["en-AU", "en-IN", "en-UK"]:
        rows = [i for i, v in enumerate(varieties) if v == variety]
        assert by_variety[variety].rows == len(rows) == (19 if variety == "en-UK" else 20)
        assert by_variety[variety].macro_f1 == pytest.approx(
            f1_score(gold_array[rows], predicted[rows], labels=[0, 1], average="macro", zero_division=0)
        )
        assert by_variety[variety].positive_label == "positive"
    assert by_variety["unspecified"].rows == 1
    assert len(evaluation.variety_table()) == 4


def test_cross_variety_matrix_from_predictions() -> None:
    labels = ["negative", "positive"]
    first = labelled(
        "reddit test", labels, [0, 1, 0, 1, 1, 0], varieties=["en-AU", "en-AU", "en-IN", "en-IN", "en-UK", "en-UK"]
    )
    second = labelled("google test", labels, [1, 1, 0, 0], varieties=["en-IN", "en-UK", "en-AU", None])
    right = [one_hot_probabilities(first.hard().tolist(), 2), one_hot_probabilities(second.hard().tolist(), 2)]
    always_positive = [one_hot_probabilities([1] * 6, 2), one_hot_probabilities([1] * 4, 2)]
    matrix = cross_variety_from_predictions(
        {"PT": always_positive, "en-AU": right}, [first, second], test_varieties=["en-AU", "en-IN", "en-UK"]
    )
    assert matrix.train_varieties == ["PT", "en-AU"] and matrix.test_varieties == ["en-AU", "en-IN", "en-UK"]
    assert matrix.test_rows == {"en-AU": 3, "en-IN": 3, "en-UK": 3}
    assert matrix.macro_f1[1].tolist() == [1.0, 1.0, 1.0]
    # PT on en-AU: gold [0, 1, 0] (two from the first set, one from the second), predicted all positive.
    assert matrix.macro_f1[0, 0] == pytest.approx(
        f1_score([0, 1, 0], [1, 1, 1], labels=[0, 1], average="macro", zero_division=0)
    )
    assert matrix.to_frame().loc["en-AU", "en-IN"] == 1.0
    with pytest.raises(EvaluationError, match="no test rows for varieties"):
        cross_variety_from_predictions({"PT": always_positive}, [first, second], test_varieties=["en-US"])
    with pytest.raises(EvaluationError, match="records no varieties"):
        cross_variety_from_predictions({"PT": always_positive[:1]}, [labelled("x", labels, [0, 1])])


# ---------------------------------------------------------------------------- files


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_SIGNATURE), path


def test_write_evaluation_files(tmp_path: Path) -> None:
    single = evaluate_probabilities(
        [
            labelled("round 1 dev", SENTIMENT, [0, 0, 1, 2, 2, 2], varieties=["a", "b"] * 3),
            labelled("round 1 dev", SENTIMENT, [0, 1, 2]).subset([0, 1, 2], name="Round 1 dev!"),
        ],
        [one_hot_probabilities([0, 1, 1, 2, 2, 0], 3), one_hot_probabilities([0, 1, 2], 3)],
        human_f1={"round 1 dev": 0.7},
    )
    labels = ["negative", "positive"]
    test_set = labelled("t", labels, [0, 1, 1, 0], varieties=["en-AU", "en-AU", "en-IN", "en-IN"])
    matrix = cross_variety_from_predictions({"en-AU": [one_hot_probabilities([0, 1, 0, 0], 2)]}, [test_set])
    written = write_evaluation(single, tmp_path / "out", cross_variety=matrix)
    names = sorted(p.name for p in written)
    assert names == [
        "confusion-round-1-dev-2.png",
        "confusion-round-1-dev.png",
        "cross-variety.png",
        "evaluation.json",
        "evaluation.md",
        "predictions.parquet",
    ]
    for path in written:
        if path.suffix == ".png":
            assert_png(path)
    markdown = (tmp_path / "out" / "evaluation.md").read_text(encoding="utf-8")
    assert "| Set | n | positive | negative | neutral | Macro-F1 | Human F1 | Solved |" in markdown
    assert "| round 1 dev | 6 | 50.0 | 66.7 | 80.0 | 65.6 | 70.0 | no |" in markdown
    assert "| Macro avg | 65.6 | 100.0 |" in markdown  # the paper's orientation
    assert "## Per variety" in markdown and "## Cross-variety macro-F1" in markdown
    data = json.loads((tmp_path / "out" / "evaluation.json").read_text(encoding="utf-8"))
    assert data["macro_f1"]["round 1 dev"] == pytest.approx(0.6556, abs=1e-4)
    assert data["solved"] == {"round 1 dev": False}
    assert data["sets"][0]["by_variety"]["a"]["rows"] == 3
    assert data["cross_variety"]["test_varieties"] == ["en-AU", "en-IN"]

    multi = evaluate_probabilities(
        [multi_labelled([[1, 0, 0], [0, 1, 1]])], [np.array([[0.9, 0.1, 0.2], [0.2, 0.8, 0.3]])]
    )
    paths = write_evaluation(multi, tmp_path / "multi")
    assert_png(tmp_path / "multi" / "confusion-emotions.png")
    assert "Micro-F1" in (tmp_path / "multi" / "evaluation.md").read_text(encoding="utf-8")
    assert len(paths) == 4
    assert_png(plot_cross_variety(matrix, tmp_path / "alone.png"))


def test_per_example_predictions_beside_evaluation_json(tmp_path: Path) -> None:
    """predictions.parquet: every example of every set with its id, text, gold, the labels
    predicted as the metrics count them, and each label's probability."""
    probabilities = one_hot_probabilities([0, 1, 1, 2], 3)
    dev = labelled("round 1 dev", SENTIMENT, [0, 1, 2, 2])
    dev.texts[1] = "ሰላም\u200dለዓለም क्\u200dष"
    single = evaluate_probabilities([dev], [probabilities])
    write_evaluation(single, tmp_path / "single")
    data = json.loads((tmp_path / "single" / "evaluation.json").read_text(encoding="utf-8"))
    assert data["predictions_file"] == "predictions.parquet"
    rows = pq.read_table(tmp_path / "single" / "predictions.parquet").to_pylist()
    # The set's ids are integers (row positions here): they stay integers and sort numerically.
    assert [r["example_id"] for r in rows] == [0, 1, 2, 3] and {r["set"] for r in rows} == {"round 1 dev"}
    assert rows[1]["text"] == "ሰላም\u200dለዓለም क्\u200dष"
    assert [r["gold"] for r in rows] == [["positive"], ["negative"], ["neutral"], ["neutral"]]
    assert [r["predicted"] for r in rows] == [["positive"], ["negative"], ["negative"], ["neutral"]]
    assert [r["correct"] for r in rows] == [True, True, False, True]
    assert rows[2]["scores"] == pytest.approx({"positive": 0.2, "negative": 0.6, "neutral": 0.2})
    # The rows agree with the set's metrics: accuracy is the share marked correct.
    assert single.sets[0].accuracy == pytest.approx(sum(r["correct"] for r in rows) / len(rows))

    multi = evaluate_probabilities(
        [multi_labelled([[1, 0, 0], [0, 1, 1], [0, 0, 0]])],
        [np.array([[0.9, 0.1, 0.2], [0.2, 0.8, 0.3], [0.1, 0.2, 0.3]])],
    )
    write_evaluation(multi, tmp_path / "multi")
    rows = pq.read_table(tmp_path / "multi" / "predictions.parquet").to_pylist()
    assert [r["gold"] for r in rows] == [["anger"], ["joy", "neutral"], []]
    assert [r["predicted"] for r in rows] == [["anger"], ["joy"], []]
    assert [r["correct"] for r in rows] == [True, False, True]
    markdown = (tmp_path / "multi" / "evaluation.md").read_text(encoding="utf-8")
    # Jaccard: (1 + 1/2 + 1) / 3, as evaluation.json has it.
    assert multi.sets[0].jaccard == pytest.approx(5 / 6)
    assert "| Macro-F1 | Micro-F1 | Jaccard |" in markdown and "| 83.3 |" in markdown

    # With neutral exclusive (the model's exclusive_labels), the rows follow the metrics' rule:
    # neutral is dropped when an emotion passes, and predicted alone when nothing passes.
    exclusive = evaluate_probabilities(
        [multi_labelled([[1, 0, 0], [0, 1, 1], [0, 0, 0]])],
        [np.array([[0.9, 0.1, 0.7], [0.2, 0.8, 0.3], [0.1, 0.2, 0.3]])],
        exclusive_labels=["neutral"],
    )
    write_evaluation(exclusive, tmp_path / "exclusive")
    rows = pq.read_table(tmp_path / "exclusive" / "predictions.parquet").to_pylist()
    assert [r["predicted"] for r in rows] == [["anger"], ["joy"], ["neutral"]]
    assert exclusive.sets[0].accuracy == pytest.approx(sum(r["correct"] for r in rows) / len(rows))


def test_evaluation_table_is_not_clipped_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """`round evaluate`'s table at COLUMNS=80 with eight labels: every set name, label and
    figure in full (rich would cut them to "…" to fit)."""
    import io

    from rich.console import Console

    from dynaloop.commands import progress

    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    monkeypatch.setattr(progress, "console", Console(file=out))
    assert progress.console.width == 80
    labels = ["anger", "disgust", "fear", "joy", "sadness", "surprise", "neutral", "trust"]
    emotions = LabelledSet(
        "round 12 test of the amharic emotions", labels, True, [f"t{i}" for i in range(8)], np.eye(8)[range(8)]
    )
    evaluation = evaluate_probabilities([emotions], [np.full((8, 8), 0.6)])
    progress.PrintedEvaluation(Path("out")).written(evaluation, [])
    printed = out.getvalue()
    assert "…" not in printed
    for word in ["round 12 test of the amharic emotions", *labels, "macro-F1", "micro-F1", "Jaccard", "22.2", "12.5"]:
        assert word in printed, word
    assert max(len(line) for line in printed.splitlines()) > 80, "wider than the terminal, not squeezed into it"


# ---------------------------------------------------------------------------- prediction with a tiny model


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    init_model_dir(root / "single", labels=SENTIMENT, tiny=True, seed=1, max_length=32)
    init_model_dir(root / "multi", labels=EMOTIONS, family="multi_label", tiny=True, seed=2)
    init_model_dir(root / "pair", labels=SENTIMENT, input_format="text_pair", tiny=True, seed=3)
    init_model_dir(root / "binary-a", labels=["negative", "positive"], tiny=True, seed=4)
    init_model_dir(root / "binary-b", labels=["positive", "negative"], tiny=True, seed=5)
    return {path.name: path for path in root.iterdir()}


TEXTS = [
    "Good.",
    "The soup was cold and the waiter never came back to our table, twice.",
    "Fine",
    "An enormous, rambling, and yet somehow perfectly pleasant evening " * 4,
    "meh",
    "Really not bad at all!",
]


def test_predict_single_label_shape_rows_sum_to_one_and_order_kept(models: dict[str, Path]) -> None:
    probabilities = predict_probabilities(models["single"], TEXTS, batch_size=2)
    assert probabilities.shape == (len(TEXTS), 3) and probabilities.dtype == np.float32
    assert probabilities.sum(axis=1) == pytest.approx(np.ones(len(TEXTS)), abs=1e-5)
    one_by_one = np.vstack([predict_probabilities(models["single"], [text]) for text in TEXTS])
    np.testing.assert_allclose(probabilities, one_by_one, atol=1e-5)
    assert predict_probabilities(models["single"], []).shape == (0, 3)


def test_predict_multi_label_is_independent_sigmoids(models: dict[str, Path]) -> None:
    probabilities = predict_probabilities(models["multi"], TEXTS)
    assert probabilities.shape == (len(TEXTS), 3)
    assert ((probabilities > 0) & (probabilities < 1)).all()
    assert not np.allclose(probabilities.sum(axis=1), 1.0)


def test_predict_sentence_pairs(models: dict[str, Path]) -> None:
    texts = ["Merkel met Macron in Paris.", "Macron was praised after the long summit in Paris " * 20]
    by_merkel = predict_probabilities(models["pair"], texts, ["Merkel", "Merkel"])
    by_macron = predict_probabilities(models["pair"], texts, ["Macron", "Macron"])
    assert by_merkel.shape == (2, 3) and by_merkel.sum(axis=1) == pytest.approx([1, 1], abs=1e-5)
    assert not np.allclose(by_merkel, by_macron), "the target is part of the input"
    with pytest.raises(EvaluationError, match="pairs"):
        predict_probabilities(models["pair"], texts)
    with pytest.raises(EvaluationError, match="do not give targets"):
        predict_probabilities(models["single"], texts, ["x", "y"])


def test_predict_loaded_keeps_the_training_mode(models: dict[str, Path]) -> None:
    classifier = LoadedClassifier.load(models["single"])
    classifier.model.train()
    predict_loaded(classifier.model, classifier.tokenizer, classifier.metadata, TEXTS[:2])
    assert classifier.model.training
    with pytest.raises(EvaluationError, match="does not exist"):
        LoadedClassifier.load(models["single"].parent / "missing")


def test_evaluate_model_aligns_label_order(models: dict[str, Path]) -> None:
    labels = ["negative", "positive"]
    test_set = labelled("t", labels, [0, 1, 1, 0, 1, 0], varieties=["en-AU", "en-IN"] * 3)
    test_set.texts = TEXTS
    # binary-b lists its labels the other way round: columns are reordered to the set's labels.
    probabilities = predict_probabilities(models["binary-b"], TEXTS)[:, ::-1]
    evaluation = evaluate_model(models["binary-b"], [test_set])
    expected = compute_metrics(test_set, probabilities)
    assert evaluation.sets[0].macro_f1 == pytest.approx(expected.macro_f1)
    assert evaluation.model_id == "model-0" and evaluation.positive_label == "positive"
    with pytest.raises(EvaluationError, match="not the set's labels"):
        evaluate_model(models["single"], [test_set])

    matrix = cross_variety_matrix({"PT": models["binary-a"], "en-AU": models["binary-b"]}, [test_set])
    assert matrix.macro_f1.shape == (2, 2) and matrix.train_varieties == ["PT", "en-AU"]
    assert ((matrix.macro_f1 >= 0) & (matrix.macro_f1 <= 1)).all()


# ---------------------------------------------------------------------------- `dynaloop round evaluate`


def flat(output: str) -> str:
    """Command output with rich's line wrapping undone."""
    return " ".join(output.split())


def test_round_evaluate_command(built, client, settings, models, tmp_path: Path) -> None:
    runner = CliRunner()
    url = settings.database_url
    base = ["round", "evaluate", "--task", "dynasent-r2", "--database-url", url]
    external = tmp_path / "sst3.csv"
    external.write_text("text,label\nGreat pie.,5\nAwful pie.,1\nA pie.,3\nLovely.,5\n", encoding="utf-8")
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        yaml.safe_dump(
            {
                "train": [{"round": 1}],
                "dev": {"round": 1, "split": "dev"},
                "evaluate": [
                    {
                        "file": "sst3.csv",
                        "name": "sst-3 test",
                        "label_map": {"1": "negative", "3": "neutral", "5": "positive"},
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    out = tmp_path / "evaluation"
    result = runner.invoke(cli, [*base, "--model", str(models["single"]), "--out", str(out), "--mix", str(mix)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    sets = {s["name"]: s for s in data["sets"]}
    assert list(sets) == ["round 1 dev", "round 1 test", "sst-3 test"], "the mix's dev is round 1 dev: once"
    assert sets["round 1 dev"]["rows"] == 9 and sets["round 1 test"]["rows"] == 9 and sets["sst-3 test"]["rows"] == 4
    report = built["build"]["report"]
    assert sets["round 1 dev"]["human_f1"] == pytest.approx(report["human_f1"]["dev"]["macro avg"]["f1"])
    assert sets["round 1 dev"]["solved"] is (sets["round 1 dev"]["macro_f1"] >= sets["round 1 dev"]["human_f1"])
    assert sets["sst-3 test"]["solved"] is None
    # Per-example predictions: every row of every set; a round split's rows are its examples.
    assert data["predictions_file"] == "predictions.parquet"
    predictions = pq.read_table(out / "predictions.parquet").to_pylist()
    assert len(predictions) == 9 + 9 + 4 and [p["set"] for p in predictions].count("round 1 dev") == 9
    written = {str(example["id"]): example["text"] for example, _ in built["plan"]}
    for row in predictions:
        if row["set"].startswith("round 1"):
            assert written[str(row["example_id"])] == row["text"]
        assert row["predicted"][0] in SENTIMENT and sum(row["scores"].values()) == pytest.approx(1, abs=1e-4)
    assert_png(out / "confusion-round-1-test.png")
    assert "round 1 test" in result.output and "macro-F1" in result.output
    assert "registry: model-0@0 is evaluated" in flat(result.output)
    engine = make_engine(url)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            version = find_model(session, get_task(session, "dynasent-r2"), "model-0@0")
            assert version.status is ModelVersionStatus.evaluated
            assert version.evaluation["macro_f1"]["round 1 dev"] == pytest.approx(sets["round 1 dev"]["macro_f1"])
    finally:
        engine.dispose()

    only_mix = runner.invoke(
        cli,
        [
            *base,
            "--model",
            str(models["single"]),
            "--out",
            str(tmp_path / "mix-only"),
            "--mix",
            str(mix),
            "--rounds",
            "none",
            "--no-record",
        ],
    )
    assert only_mix.exit_code == 0, only_mix.output
    assert "registry" not in only_mix.output
    data = json.loads((tmp_path / "mix-only" / "evaluation.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in data["sets"]] == ["round 1 dev", "sst-3 test"]
    assert data["sets"][0]["human_f1"] == sets["round 1 dev"]["human_f1"], "a mix's round split has its estimate"

    missing = runner.invoke(cli, [*base, "--model", str(tmp_path / "nope"), "--out", str(out)])
    assert (
        missing.exit_code == 1 and "does not exist" in flat(missing.output) and "Traceback" not in flat(missing.output)
    )
    no_round = runner.invoke(cli, [*base, "--model", str(models["single"]), "--out", str(out), "--rounds", "3"])
    assert no_round.exit_code == 1 and "has no round 3" in flat(no_round.output)
    response = client.post("/api/v1/tasks/dynasent-r2/rounds", json={}, headers=built["researcher"].headers)
    assert response.status_code == 201, response.text
    unbuilt = runner.invoke(cli, [*base, "--model", str(models["single"]), "--out", str(out), "--rounds", "1,2"])
    assert unbuilt.exit_code == 1 and "round 2 of 'dynasent-r2' has not been built" in flat(unbuilt.output)
    bad_mix = tmp_path / "bad.yaml"
    bad_mix.write_text("evaluate: [{file: x.csv, round: 1}]\n", encoding="utf-8")
    bad = runner.invoke(cli, [*base, "--model", str(models["single"]), "--out", str(out), "--mix", str(bad_mix)])
    assert bad.exit_code == 1 and "is not a valid data mix" in flat(bad.output) and "Traceback" not in flat(bad.output)
    wrong_labels = runner.invoke(cli, [*base, "--model", str(models["multi"]), "--out", str(out)])
    assert wrong_labels.exit_code == 1 and "multi-label" in flat(wrong_labels.output)
