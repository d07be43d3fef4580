"""Data sources for retraining and evaluation: external files with label maps, built rounds'
splits, upsampling, hashes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import select

from rounds.models.datasets import (
    DataError,
    DataFiles,
    DataMix,
    LabelledSet,
    SourceSpec,
    expand,
    labelled_from_frame,
    load_source,
    read_table,
)
from services.db.engine import session_scope
from services.db.models import BuiltExample, Task

LABELS = ["positive", "negative", "neutral"]
STARS = {"1": "negative", "2": "negative", "3": "neutral", "4": "positive", "5": "positive"}


def _reviews() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": ["a", "b", "c", "d", "e", "f"],
            "text": ["Awful.", "Meh.", "Fine I guess.", "Lovely!", "Best ever.", "   "],
            "stars": [1, 2, 3, 4, 5, 5],
        }
    )


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_files_of_every_format_load_with_star_ratings_binned(tmp_path: Path, suffix: str) -> None:
    frame = _reviews()
    path = tmp_path / f"reviews{suffix}"
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".tsv":
        frame.to_csv(path, index=False, sep="\t")
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True, force_ascii=False)
    else:
        frame.to_parquet(path)
    spec = SourceSpec.model_validate(
        {
            "file": str(path),
            "label_column": "stars",
            "label_map": {int(k): v for k, v in STARS.items()},
            "weight": 0.5,
            "upsample": 2,
        }
    )
    with pytest.raises(DataError, match="was not checked against the data root"):
        load_source(spec, labels=LABELS, multi_label=False)  # nothing reads a file DataFiles did not allow
    DataFiles.of(tmp_path, any_path=True).resolve(DataMix(train=[spec]))
    labelled = load_source(spec, labels=LABELS, multi_label=False)
    # The blank text is dropped and counted; stars map to classes whatever type the file gave.
    assert labelled.texts == ["Awful.", "Meh.", "Fine I guess.", "Lovely!", "Best ever."]
    assert [LABELS[i] for i in labelled.hard()] == ["negative", "negative", "neutral", "positive", "positive"]
    assert labelled.ids == ["a", "b", "c", "d", "e"]
    assert labelled.origin["dropped_rows"] == 1
    assert (labelled.weight, labelled.upsample) == (0.5, 2)
    np.testing.assert_allclose(labelled.y.sum(axis=1), 1.0)


def test_unknown_label_values_are_reported_by_row_and_column_with_the_fix() -> None:
    spec = SourceSpec(file=Path("x.csv"), label_column="stars", label_map={"1": "negative"})
    with pytest.raises(DataError) as refused:
        labelled_from_frame(_reviews().head(4), labels=LABELS, multi_label=False, spec=spec)
    assert str(refused.value) == (
        "x.csv: row 2, column `stars`: not one of the task's labels ['positive', 'negative', 'neutral'] nor in "
        "label_map (and 2 more row(s)); map such values in label_map (to null to drop them)"
    )


def test_label_mapped_to_null_drops_the_row() -> None:
    spec = SourceSpec(file=Path("x.csv"), label_column="stars", label_map={**STARS, "3": None})
    labelled = labelled_from_frame(_reviews().head(5), labels=LABELS, multi_label=False, spec=spec)
    assert "Fine I guess." not in labelled.texts
    assert labelled.origin["dropped_rows"] == 1


def test_a_missing_column_is_named_and_the_files_header_is_not_quoted() -> None:
    spec = SourceSpec(file=Path("x.csv"), label_column="rating")
    with pytest.raises(DataError) as refused:
        labelled_from_frame(_reviews(), labels=LABELS, multi_label=False, spec=spec)
    assert (
        str(refused.value)
        == "x.csv: there is no column `rating` (3 columns); set label_column to the name of the file's column"
    )
    assert "stars" not in str(refused.value)


SECRET = "root:x:0:0:hunter2-secret"


@pytest.mark.parametrize(
    ("frame", "spec", "expected"),
    [
        (  # a label cell holding a secret
            pd.DataFrame({"text": ["fine", "also fine"], "label": ["positive", SECRET]}),
            SourceSpec(file=Path("x.csv")),
            "x.csv: row 2, column `label`:",
        ),
        (  # a distribution with a secret key, then one with a secret value
            pd.DataFrame({"text": ["a"], "label": [{SECRET: 1.0}]}),
            SourceSpec(file=Path("x.jsonl")),
            "x.jsonl: row 1, column `label`:",
        ),
        (
            pd.DataFrame({"text": ["a"], "label": [{"positive": SECRET}]}),
            SourceSpec(file=Path("x.jsonl")),
            "x.jsonl: row 1, column `label`: a label distribution's values must be numbers",
        ),
        (  # a header that is the secret
            pd.DataFrame({SECRET: ["a"], "label": ["positive"]}),
            SourceSpec(file=Path("x.csv")),
            "x.csv: there is no column `text`",
        ),
    ],
)
def test_errors_never_quote_the_files_text(frame: pd.DataFrame, spec: SourceSpec, expected: str) -> None:
    with pytest.raises(DataError) as refused:
        labelled_from_frame(frame, labels=LABELS, multi_label=False, spec=spec)
    assert str(refused.value).startswith(expected) and "hunter2" not in str(refused.value)


def test_a_broken_file_is_reported_by_position_not_content(tmp_path: Path) -> None:
    path = tmp_path / "broken.csv"
    path.write_text(f"text,label\nok,positive\n{SECRET},a,b,c\n", encoding="utf-8")
    with pytest.raises(DataError) as refused:
        read_table(path)
    assert str(refused.value) == "broken.csv could not be read as csv (near line 3); check that it is a valid csv file"
    path = tmp_path / "broken.jsonl"
    path.write_text(f'{{"text": "ok"}}\n{SECRET}\n', encoding="utf-8")
    with pytest.raises(DataError) as refused:
        read_table(path)
    assert "hunter2" not in str(refused.value) and str(refused.value).startswith("broken.jsonl could not be read")


def test_the_api_reads_only_files_under_the_data_root(tmp_path: Path) -> None:
    """Outside the root, missing, ``..``, a symlink out of it, a folder: one message, which never
    says whether the file exists. Inside: the resolved file."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "ok.csv").write_text("text,label\na,positive\n", encoding="utf-8")
    (outside / "secret.csv").write_text("text,label\na,positive\n", encoding="utf-8")
    (root / "escape.csv").symlink_to(outside / "secret.csv")
    (root / "folder.csv").mkdir()
    files = DataFiles.of(tmp_path / "data", root)

    def refusal(file: str, files: DataFiles = files) -> str:
        with pytest.raises(DataError) as refused:
            files.resolve(DataMix(train=[SourceSpec(file=Path(file))]))
        return str(refused.value)

    expected = refusal("sub/missing.csv")
    assert expected.startswith("mix.train.0.file: not an uploaded dataset or a file under the data root; ")
    for file in [
        str(outside / "secret.csv"),
        "/etc/passwd",
        "/no/such/file.csv",
        "../outside/secret.csv",
        "sub/../../outside/secret.csv",
        "escape.csv",
        "folder.csv",
        "sub/ok.txt",
    ]:
        assert refusal(file) == expected, file
    # Without a data root, no server file at all (the message says to upload it instead).
    assert "upload it" in refusal("sub/ok.csv", DataFiles.of(tmp_path / "data"))
    allowed = DataMix(train=[SourceSpec(file=Path("sub/ok.csv")), SourceSpec(file=root / "sub" / "./ok.csv")])
    files.resolve(allowed)
    assert [source.path for source in allowed.train] == [(root / "sub" / "ok.csv").resolve()] * 2


def test_distributions_multi_label_and_targets() -> None:
    frame = pd.DataFrame({"text": ["x", "y"], "label": [{"positive": 0.6, "negative": 0.4}, {"neutral": 1.0}]})
    soft = labelled_from_frame(frame, labels=LABELS, multi_label=False, spec=SourceSpec(file=Path("s.jsonl")))
    np.testing.assert_allclose(soft.y, [[0.6, 0.4, 0.0], [0.0, 0.0, 1.0]], rtol=1e-6)

    emotions = ["joy", "anger", "fear"]
    frame = pd.DataFrame({"text": ["a", "b", "c"], "label": ["joy,anger", "", "fear"]})
    multi = labelled_from_frame(
        frame, labels=emotions, multi_label=True, spec=SourceSpec(file=Path("e.csv"), label_separator=",")
    )
    assert multi.hard().tolist() == [[1, 1, 0], [0, 0, 0], [0, 0, 1]]  # no emotion is a valid answer

    frame = pd.DataFrame(
        {
            "text": ["The screen is great but the battery dies."] * 2,
            "target": ["screen", "battery"],
            "label": ["positive", "negative"],
        }
    )
    pairs = labelled_from_frame(
        frame, labels=LABELS, multi_label=False, spec=SourceSpec(file=Path("t.csv"), target_column="target")
    )
    assert pairs.targets == ["screen", "battery"]


def test_hash_changes_with_text_label_or_target() -> None:
    base = LabelledSet(
        name="s", labels=LABELS, multi_label=False, texts=["a", "b"], y=np.eye(3, dtype=np.float32)[[0, 1]]
    )
    same = LabelledSet(
        name="other name", labels=LABELS, multi_label=False, texts=["a", "b"], y=np.eye(3, dtype=np.float32)[[0, 1]]
    )
    assert base.sha256() == same.sha256()
    assert base.sha256() != base.subset([1, 0]).sha256()
    relabelled = LabelledSet(
        name="s", labels=LABELS, multi_label=False, texts=["a", "b"], y=np.eye(3, dtype=np.float32)[[0, 2]]
    )
    assert base.sha256() != relabelled.sha256()


def test_expand_repeats_each_source_by_its_factor_and_is_seeded() -> None:
    small = LabelledSet(
        name="r1", labels=LABELS, multi_label=False, texts=["a"] * 4, y=np.eye(3, dtype=np.float32)[[0] * 4], upsample=5
    )
    large = LabelledSet(
        name="ext", labels=LABELS, multi_label=False, texts=["b"] * 10, y=np.eye(3, dtype=np.float32)[[1] * 10]
    )
    sources, rows = expand([small, large], seed=3)
    assert Counter(sources) == {0: 20, 1: 10}
    assert Counter(zip(sources, rows, strict=True))[(0, 2)] == 5
    assert expand([small, large], seed=3) == (sources, rows)
    assert expand([small, large], seed=4) != (sources, rows)


def test_mix_file_resolves_paths_and_reports_problems(tmp_path: Path) -> None:
    (tmp_path / "mix.yaml").write_text(
        "train:\n  - round: 1\n    upsample: 3\n  - file: data/sst.csv\n    label_map: {1: negative}\n"
        "dev:\n  round: 1\n  split: dev\n",
        encoding="utf-8",
    )
    mix = DataMix.load(tmp_path / "mix.yaml")
    assert mix.train[1].file == (tmp_path / "data" / "sst.csv").resolve()
    assert mix.train[1].label_map == {"1": "negative"}
    assert mix.dev is not None and mix.dev.describe() == "round 1 dev"
    (tmp_path / "bad.yaml").write_text("train:\n  - round: 1\n    file: x.csv\n", encoding="utf-8")
    with pytest.raises(DataError, match="exactly one of `round`"):
        DataMix.load(tmp_path / "bad.yaml")
    with pytest.raises(DataError, match="cannot read"):
        DataMix.load(tmp_path / "missing.yaml")
    with pytest.raises(DataError, match="unknown file type"):
        read_table(tmp_path / "mix.yaml")


def test_round_splits_carry_soft_train_labels_and_gold_dev_labels(built, app) -> None:
    with session_scope(app.state.sessionmaker) as session:
        task = session.scalar(select(Task).where(Task.name == "dynasent-r2"))
        train = load_source(SourceSpec(round=1), labels=LABELS, multi_label=False, session=session, task=task)
        dev = load_source(
            SourceSpec(round=1, split="dev"), labels=LABELS, multi_label=False, session=session, task=task
        )
        build_id = train.origin["build_id"]
        rows = {
            (b.example_id, b.split): b
            for b in session.scalars(select(BuiltExample).where(BuiltExample.build_id == build_id))
        }
    assert train.origin["round"] == 1 and train.origin["split"] == "train"
    for example_id, vector in zip(train.ids, train.y, strict=True):
        distribution = rows[(int(example_id), "train")].distributional_label
        assert {label: round(float(p), 4) for label, p in zip(LABELS, vector, strict=True) if p} == {
            label: p for label, p in distribution.items() if p
        }
    assert len(dev) > 0
    for example_id, vector in zip(dev.ids, dev.y, strict=True):
        assert [LABELS[int(np.argmax(vector))]] == rows[(int(example_id), "dev")].gold_label
        assert vector.max() == 1.0
    with session_scope(app.state.sessionmaker) as session:
        task = session.scalar(select(Task).where(Task.name == "dynasent-r2"))
        with pytest.raises(DataError, match="no round 9"):
            load_source(SourceSpec(round=9), labels=LABELS, multi_label=False, session=session, task=task)
    json.dumps(train.summary())  # summaries go into model metadata as JSON


def test_target_offsets_pick_the_occurrence_and_are_checked_against_the_target() -> None:
    """Issue 17: a text that contains its target twice (23 SemEval-2014 test rows do) is only
    unambiguous with offsets; offsets that do not point at the target fail naming the row."""
    text = "The pasta was cold but the pasta sauce was great."
    second = text.index("pasta", 10)
    frame = pd.DataFrame(
        {
            "text": [text, "Service was slow."],
            "label": ["positive", "negative"],
            "aspect": ["pasta", "Service"],
            "from": [second, 0],
            "to": [second + 5, 7],
        }
    )
    spec = SourceSpec(file=Path("sem.csv"), target_column="aspect", target_start_column="from", target_end_column="to")
    loaded = labelled_from_frame(frame, labels=LABELS, multi_label=False, spec=spec)
    assert loaded.targets == ["pasta", "Service"]
    assert loaded.target_spans == [(second, second + 5), (0, 7)]
    assert loaded.subset([1]).target_spans == [(0, 7)]
    # The same text and target at the first occurrence is different training data.
    first = frame.assign(**{"from": [4, 0], "to": [9, 7]})
    assert labelled_from_frame(first, labels=LABELS, multi_label=False, spec=spec).sha256() != loaded.sha256()
    # Offsets alone: the target's text is read from them (floats from a CSV column with a gap are fine).
    offsets_only = SourceSpec(file=Path("sem.csv"), target_start_column="from", target_end_column="to")
    derived = labelled_from_frame(
        frame.drop(columns="aspect").astype({"from": float}), labels=LABELS, multi_label=False, spec=offsets_only
    )
    assert derived.targets == ["pasta", "Service"] and derived.target_spans == loaded.target_spans
    # Offsets that miss the target, leave the text, are empty, or are not whole numbers: the row is named.
    bad = [
        ({"from": [second + 1, 0], "to": [second + 6, 7]}, r"row 1, .*is not the row's target.*occurs 2 time"),
        ({"from": [0, 0], "to": [len(text) + 1, 7]}, rf"row 1, .*outside the text \(0\.\.{len(text)}\)"),
        ({"from": [second, 3], "to": [second + 5, 3]}, r"row 2, .*outside the text"),
        ({"from": [second, 7], "to": [second + 5, 8]}, r"row 2, .*cover only white space"),
        ({"from": [second, "zero"], "to": [second + 5, 7]}, r"row 2, .*whole numbers"),
        ({"from": [4.5, 0], "to": [9, 7]}, r"row 1, .*whole numbers"),
    ]
    for columns, message in bad:
        with pytest.raises(DataError, match=message) as error:
            labelled_from_frame(frame.assign(**columns), labels=LABELS, multi_label=False, spec=spec)
        assert "pasta" not in str(error.value) and "sem.csv" in str(error.value)
    with pytest.raises(ValueError, match="both `target_start_column` and `target_end_column`"):
        SourceSpec(file=Path("sem.csv"), target_start_column="from")
    with pytest.raises(DataError, match="no column `start`"):
        labelled_from_frame(
            frame,
            labels=LABELS,
            multi_label=False,
            spec=SourceSpec(file=Path("sem.csv"), target_start_column="start", target_end_column="to"),
        )
