"""Imports of what researchers already have (issue 17, point 3; docs/round_builder.md "Imports").

A labelled dataset per task family becomes a round of validated examples whose gold is the
dataset's own, and builds, with a report that says so; earlier crowd responses become examples
and validations by pseudonymous accounts, and the build's gold and agreement match an
independent computation on the same responses; every bad file is one clear 4xx naming the row
and column, and the database is unchanged after it. The imports end to end, the refusals that
leave the database unchanged and the texts stored exactly run on SQLite and PostgreSQL
(``both_databases``, tests/conftest.py); the checks of paths and file contents that reach no
behaviour of the database's own run on SQLite."""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

import krippendorff
import numpy as np
import pandas as pd
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from statsmodels.stats.inter_rater import fleiss_kappa
from typer.testing import CliRunner

from dynaloop.api.app import create_app
from dynaloop.cli import app as cli
from rounds.models import round_imports
from services.db.engine import session_scope
from services.db.models import BuiltExample, Example, ExampleOrigin, User, Validation
from services.domain.invariants import check_database
from services.domain.tasks import create_task
from services.domain.users import get_user
from services.settings import Settings
from tests.conftest import Actor, MakeUser, example_yaml, table_counts

pytestmark = pytest.mark.timeout(300)

API = "/api/v1"
MAX_ROWS = 400
FAMILIES = {
    "single_label": "dynasent-r2",
    "binary_variety": "besstie-en-in-sarcasm",
    "intended_sarcasm": "isarcasm",
    "target_dependent": "mad-tsc",
    "multi_label": "ethioemo-amharic",
}


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    root = tmp_path / "data-root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    _write(outside / "private.csv", [{"text": "a private sentence", "label": "positive"}])
    (root / "escape.csv").symlink_to(outside / "private.csv")
    return root


@pytest.fixture
def rooted(settings: Settings, data_root: Path) -> FastAPI:
    return create_app(settings.model_copy(update={"data_root": data_root, "max_upload_rows": MAX_ROWS}))


@pytest.fixture
def api(rooted: FastAPI) -> Any:
    with TestClient(rooted) as test_client:
        yield test_client


def _task(app: FastAPI, researcher: Actor, name: str) -> str:
    with session_scope(app.state.sessionmaker) as session:
        create_task(
            session, None, example_yaml(name, onboarding_quiz=None), owner=get_user(session, researcher.username)
        )
    return name


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    frame = pd.DataFrame(rows)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    else:
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def _import(api: TestClient, who: Actor | None, task: str, number: int, **body: Any):  # type: ignore[no-untyped-def]
    return api.post(f"{API}/tasks/{task}/rounds/{number}/imports", json=body, headers=who.headers if who else {})


def _build(api: TestClient, who: Actor, round_id: int, **options: Any) -> dict[str, Any]:
    response = api.post(f"{API}/rounds/{round_id}/build", json={"chance": False, **options}, headers=who.headers)
    assert response.status_code == 201, response.text
    return response.json()["report"]


# --- a labelled dataset per family --------------------------------------------------------------


def _labelled_rows(family: str) -> list[dict[str, Any]]:
    """Forty rows, balanced over the family's gold classes, with the dataset's vote counts."""
    rows: list[dict[str, Any]] = []
    for i in range(40):
        row: dict[str, Any] = {"votes": 3, "responses": 3}
        if family == "single_label":
            row.update(text=f"Review number {i} of the corner cafe.", label=["positive", "negative", "neutral"][i % 3])
            row.update(votes=5, responses=5)
        elif family == "binary_variety":
            row.update(text=f"Oh great, another Monday number {i}.", label=["sarcastic", "not_sarcastic"][i % 2])
        elif family == "intended_sarcasm":
            label = ["sarcastic", "not_sarcastic"][i % 2]
            row.update(text=f"I just love queueing for hour {i}.", label=label, intended_label=label)
            if label == "sarcastic":
                row["rephrase"] = f"I hate queueing for hour {i}."
        elif family == "target_dependent":
            # The target occurs twice; the offsets pick the second mention.
            text = f"Smith met Jones, and Smith said the plan {i} was sound."
            start = text.index("Smith", 1)
            row.update(
                text=text,
                label=["negative", "neutral", "positive"][i % 3],
                target="Smith",
                target_start=start,
                target_end=start + 5,
            )
        else:
            row.update(text=f"ዛሬ ደስ ብሎኛል {i}", label=[["joy"], ["anger", "sadness"], ["neutral"]][i % 3])
        rows.append(row)
    return rows


# Both databases: the families whose rows store nested JSON (a label set; a target span).
@pytest.mark.both_databases
@pytest.mark.parametrize("family", ["multi_label", "target_dependent"])
def test_a_labelled_dataset_of_each_family_imports_as_a_round_and_builds_with_its_gold_said_to_be_imported(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, family: str
) -> None:
    _import_and_build_a_labelled_dataset(api, rooted, researcher, data_root, family)


@pytest.mark.parametrize("family", ["binary_variety", "intended_sarcasm", "single_label"])
def test_a_labelled_dataset_of_a_flat_family_imports_as_a_round_and_builds_with_its_gold_said_to_be_imported(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, family: str
) -> None:
    _import_and_build_a_labelled_dataset(api, rooted, researcher, data_root, family)


def _import_and_build_a_labelled_dataset(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, family: str
) -> None:
    task = _task(rooted, researcher, FAMILIES[family])
    rows = _labelled_rows(family)
    suffix = ".parquet" if family in ("multi_label", "target_dependent") else ".jsonl"
    _write(data_root / f"{family}{suffix}", rows)
    extra = {"target_column": "target"} if family == "target_dependent" else {}
    response = _import(
        api, researcher, task, 1, kind="labelled", file=f"{family}{suffix}", votes_column="votes",
        responses_column="responses", source="a test dataset", **extra,
    )  # fmt: skip
    assert response.status_code == 201, response.text
    imported = response.json()
    assert imported["examples"] == 40 and imported["validations"] == 0 and imported["round"] == 1

    with session_scope(rooted.state.sessionmaker) as session:
        examples = session.scalars(select(Example).where(Example.round_id == imported["round_id"])).all()
        assert {e.origin for e in examples} == {ExampleOrigin.imported}
        assert all(e.writer_id is None and e.validation_count == 0 for e in examples)
        if family == "target_dependent":
            spans = {(e.extras["target_span"]["start"], e.extras["target_span"]["text"]) for e in examples}
            assert all(text == "Smith" and start > 0 for start, text in spans)  # the second mention
        if family == "intended_sarcasm":
            assert all(e.extras["intended_label"] == e.source_metadata["gold"][0] for e in examples)
        assert check_database(session).ok, check_database(session).to_dict()

    report = _build(api, researcher, imported["round_id"])
    source = report["datasheet"]["gold_source"]
    assert source["imported_gold"] == 40 and source["imported_gold_with_votes"] == 40
    assert source["from_responses"] == 0
    assert source["imports"][0]["source"] == "a test dataset" and source["imports"][0]["kind"] == "labelled"
    assert "taken from the imported dataset as is, not from validation" in source["statement"]
    assert report["datasheet"]["gold_rule"].endswith("40 gold label(s) taken from the imported dataset")
    total = report["counts"]["total"]
    assert total["train"] + total["dev"] + total["test"] == 40
    assert total["dev"] > 0 and total["test"] > 0

    with session_scope(rooted.state.sessionmaker) as session:
        built = {
            b.example_id: b
            for b in session.scalars(
                select(BuiltExample).where(BuiltExample.build_id == report_build_id(api, researcher, task))
            )
        }
        for example in session.scalars(select(Example).where(Example.round_id == imported["round_id"])):
            assert built[example.id].gold_label == example.source_metadata["gold"]
            assert built[example.id].split in ("train", "dev", "test")
    markdown = api.get(f"{API}/tasks/{task}/rounds/1/report", params={"format": "markdown"}, headers=researcher.headers)
    assert "not from validation in dynaloop" in markdown.text


def report_build_id(api: TestClient, who: Actor, task: str) -> int:
    response = api.get(f"{API}/tasks/{task}/rounds/1/report", headers=who.headers)
    assert response.status_code == 200, response.text
    return int(response.json()["build_id"])


@pytest.mark.both_databases
def test_imported_gold_without_vote_counts_counts_as_one_vote_and_the_dataset_splits_are_recorded(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    task = _task(rooted, researcher, "dynasent-r2")
    rows = [
        {"text": f"Sentence {i} about lunch.", "label": ["positive", "negative", "neutral"][i % 3], "split": s}
        for i, s in enumerate(["train"] * 24 + ["validation"] * 6 + ["test"] * 6)
    ]
    _write(data_root / "plain.csv", rows)
    response = _import(api, researcher, task, 1, kind="labelled", file="plain.csv", split_column="split")
    assert response.status_code == 201, response.text
    with session_scope(rooted.state.sessionmaker) as session:
        splits = Counter(e.source_metadata["split"] for e in session.scalars(select(Example)))
    assert splits == {"train": 24, "dev": 6, "test": 6}
    # One vote each: below the task's dev/test rule (4 votes) unless the build is told otherwise.
    # A default build is refused, and the relaxations it offers include the one that builds.
    round_id = response.json()["round_id"]
    before = table_counts(rooted)
    refused = api.post(f"{API}/rounds/{round_id}/build", json={}, headers=researcher.headers)
    assert refused.status_code == 422, refused.text
    offered = {r["name"]: r for r in refused.json()["error"]["details"]["relaxations"]}
    imported = offered["relaxed, imported gold as given (dev/test min votes 1)"]
    assert imported["feasible"] and imported["settings"] == {
        "policy": "relaxed",
        "chance": False,
        "dev_test_min_votes": 1,
    }
    assert not offered["relaxed"]["feasible"]
    assert table_counts(rooted) == before
    report = _build(api, researcher, round_id, **imported["settings"])
    assert report["splits"]["policy"]["dev_test_min_votes"] == 1
    assert {k: v for k, v in report["counts"]["total"].items() if k != "dist_train"} == {
        k: imported["counts"][k] for k in ("train", "dev", "test")
    }
    source = report["datasheet"]["gold_source"]
    assert source["imported_gold"] == 36 and source["imported_gold_with_votes"] == 0
    assert source["imported_with_original_split"] == 36
    assert "the rest count as 1 vote" in source["statement"]


def test_a_datasets_directory_with_a_symlink_out_of_the_root_is_refused(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, tmp_path: Path
) -> None:
    task = _task(rooted, researcher, "dynasent-r2")
    (data_root / "hf").mkdir()
    (data_root / "hf" / "data.arrow").symlink_to(tmp_path / "outside" / "private.csv")
    before = table_counts(rooted)
    response = _import(api, researcher, task, 1, kind="labelled", file="hf")
    assert response.status_code == 422 and "not an uploaded dataset or a file under the data root" in response.text
    assert table_counts(rooted) == before


def test_numeric_labels_are_mapped_with_the_label_map(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    task = _task(rooted, researcher, "besstie-en-in-sarcasm")
    _write(data_root / "numbers.parquet", [{"text": f"Tweet {i}.", "label": i % 2} for i in range(6)])
    unmapped = _import(api, researcher, task, 1, kind="labelled", file="numbers.parquet")
    assert unmapped.status_code == 422 and "row 1, column 'label'" in unmapped.text
    mapping = {"0": "not_sarcastic", "1": "sarcastic"}
    response = _import(api, researcher, task, 1, kind="labelled", file="numbers.parquet", label_map=mapping)
    assert response.status_code == 201, response.text
    with session_scope(rooted.state.sessionmaker) as session:
        gold = Counter(e.source_metadata["gold"][0] for e in session.scalars(select(Example)))
    assert gold == {"not_sarcastic": 3, "sarcastic": 3}


def test_a_saved_datasets_directory_imports_with_its_split_names(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    datasets = pytest.importorskip("datasets")
    task = _task(rooted, researcher, "besstie-en-in-sarcasm")
    parts = {
        split: datasets.Dataset.from_list(
            [{"text": f"{split} tweet {i}", "label": ["sarcastic", "not_sarcastic"][i % 2]} for i in range(n)]
        )
        for split, n in (("train", 10), ("validation", 4))
    }
    datasets.DatasetDict(parts).save_to_disk(str(data_root / "hf"))
    response = _import(api, researcher, task, 1, kind="labelled", file="hf")
    assert response.status_code == 201, response.text
    with session_scope(rooted.state.sessionmaker) as session:
        splits = Counter(e.source_metadata["split"] for e in session.scalars(select(Example)))
    assert splits == {"train": 10, "dev": 4}


# --- crowd responses ------------------------------------------------------------------------------


def _responses(seed: int = 7) -> list[dict[str, Any]]:
    """Sixty examples, five of twelve workers each, labels drawn around a true label."""
    rng = np.random.default_rng(seed)
    labels = ["positive", "negative", "neutral", "mixed"]
    rows = []
    for item in range(60):
        true = item % 3
        for worker in rng.choice(12, size=5, replace=False):
            label = labels[true] if rng.random() < 0.8 else labels[int(rng.integers(4))]
            text = f"Example {item} of the old responses."
            seconds = float(rng.integers(3, 40))
            rows.append(
                {
                    "item": f"x{item}",
                    "text": text,
                    "worker": f"PLATFORM-{worker:03d}",
                    "label": label,
                    "seconds": seconds,
                }
            )
    return rows


@pytest.mark.both_databases
def test_crowd_responses_build_with_gold_and_agreement_matching_an_independent_computation(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    task = _task(rooted, researcher, "dynasent-r2")
    rows = _responses()
    _write(data_root / "responses.csv", rows)
    response = _import(
        api, researcher, task, 1, kind="responses", file="responses.csv", id_column="item", seconds_column="seconds"
    )
    assert response.status_code == 201, response.text
    assert response.json() | {"round_id": 0, "sha256": ""} == {
        "task": task, "round": 1, "round_id": 0, "kind": "responses", "examples": 60, "validations": 300,
        "workers": 12, "sha256": "", "repeats_merged": 0, "responses_set_aside": 0, "notes": [],
    }  # fmt: skip

    with session_scope(rooted.state.sessionmaker) as session:
        accounts = session.scalars(select(User).where(User.username.like("imported-%"))).all()
        assert len(accounts) == 12
        assert all(not a.is_active and a.password_hash is None for a in accounts)
        assert not any("PLATFORM" in (a.username + (a.display_name or "")) for a in accounts)
        assert session.scalar(select(Validation).limit(1)) is not None
        assert check_database(session).ok, check_database(session).to_dict()
    for password in ("", "x" * 12):
        login = api.post(f"{API}/auth/login", json={"username": accounts[0].username, "password": password})
        assert login.status_code in (401, 422), login.text

    report = _build(api, researcher, response.json()["round_id"], dev_test_min_votes=3, model_based=None)
    assert report["datasheet"]["gold_source"]["from_responses"] > 0
    assert report["datasheet"]["gold_source"]["imported_gold"] == 0

    # Independently: gold is the label with at least 3 of 5 votes (the task's rule), collapsed
    # nothing; Fleiss' kappa over the five responses (statsmodels).
    frame = pd.DataFrame(rows)
    expected: dict[str, str | None] = {}
    table = []
    for item, group in frame.groupby("item"):
        counts = Counter(group["label"])
        label, votes = counts.most_common(1)[0]
        expected[str(item)] = label if votes >= 3 else None
        table.append([counts.get(name, 0) for name in ["positive", "negative", "neutral", "mixed"]])
    with session_scope(rooted.state.sessionmaker) as session:
        ids = {e.id: e.source_id for e in session.scalars(select(Example))}
        built = {ids[b.example_id]: b for b in session.scalars(select(BuiltExample))}
    for item, gold in expected.items():
        assert (built[item].gold_label or [None])[0] == (gold if gold != "mixed" else None) or (
            gold == "mixed" and built[item].split == "excluded"
        ), item
        assert built[item].responses == 5
    kappa = fleiss_kappa(np.array(table))
    found = report["agreement"]
    fleiss = next(v for k, v in found.items() if "fleiss" in k.lower() and isinstance(v, float))
    assert fleiss == pytest.approx(kappa, abs=1e-3)


def test_the_cli_imports_a_file_from_any_path(settings: Settings, tmp_path: Path, make_user: MakeUser) -> None:
    researcher = make_user("ruth", "researcher")
    app = create_app(settings)
    _task(app, researcher, "dynasent-r2")
    file = _write(tmp_path / "anywhere.jsonl", [{"text": f"Line {i}.", "label": "positive"} for i in range(3)])
    env = {"DYNALOOP_DATABASE_URL": settings.database_url or "", "DYNALOOP_SECRET_KEY": settings.secret_key}
    result = CliRunner().invoke(
        cli, ["round", "import", "--task", "dynasent-r2", "--round", "1", "--kind", "labelled", "--file", str(file)],
        env=env, catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "imported 3 examples" in result.output
    bad = _write(tmp_path / "bad.jsonl", [{"text": "Line.", "label": "glad"}])
    result = CliRunner().invoke(
        cli, ["round", "import", "--task", "dynasent-r2", "--round", "2", "--kind", "labelled", "--file", str(bad)],
        env=env, catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code != 0 and "row 1, column 'label'" in result.output

    # The imported round builds; its examples carry no model prediction, and the command says so
    # instead of printing "model macro-F1 on dev: None".
    labels = ["positive", "negative", "neutral"]
    rows = [{"text": f"Sentence number {i}.", "label": labels[i % 3]} for i in range(60)]
    result = CliRunner().invoke(
        cli,
        ["round", "import", "--task", "dynasent-r2", "--round", "2", "--kind", "labelled", "--file",
         str(_write(tmp_path / "sixty.jsonl", rows))],
        env=env, catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(
        cli,
        ["round", "build", "--task", "dynasent-r2", "--round", "2", "--policy", "relaxed", "--no-chance",
         "--dev-test-min-votes", "1", "--out", str(tmp_path / "build")],
        env=env, catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "None" not in output
    assert "model macro-F1 on dev: none (its examples have no model prediction)" in output


# --- bad input: one clear error, nothing written ----------------------------------------------------


GOOD = {"text": "A fine sentence.", "label": "positive"}
BAD_FILES: dict[str, tuple[str, list[dict[str, Any]] | str, dict[str, Any], str]] = {
    "empty": ("empty.jsonl", "", {}, "has no rows"),
    "no rows": ("header.csv", "text,label\n", {}, "has no rows"),
    "too many rows": (
        "many.csv",
        [GOOD | {"text": f"Row {i}."} for i in range(MAX_ROWS + 1)],
        {},
        "401 rows is more than the 400",
    ),
    "malformed": ("broken.jsonl", '{"text": "ok", "label": "positive"}\n{"text": ', {}, "could not be read"),
    "unknown label": (
        "labels.csv",
        [GOOD, GOOD | {"text": "Another.", "label": "glad"}],
        {},
        "row 2, column 'label': 'glad' is not a label of task dynasent-r2",
    ),
    "duplicate rows": ("dupes.csv", [GOOD, GOOD], {}, "row 2 repeats row 1"),
    "missing column": ("cols.csv", [{"sentence": "x", "label": "positive"}], {}, "no column 'text'"),
    "huge text": (
        "long.csv",
        [GOOD | {"text": "word " * 1200}],
        {},
        "row 1, column `text`: a cell of 6,000 characters is longer than the 5,000 allowed",
    ),
    "control character": (
        "ctl.jsonl",
        [GOOD | {"text": "bad \x07 bell"}],
        {},
        "row 1, column `text`: the cell contains a control character (U+0007)",
    ),
    "same worker twice": (
        "twice.csv",
        [GOOD | {"worker": "w1"}, GOOD | {"worker": "w1", "label": "negative"}],
        {"kind": "responses"},
        "the same worker labelled this example already in row 1",
    ),
    "bad votes": ("votes.csv", [GOOD | {"votes": "many"}], {"votes_column": "votes"}, "row 1, column 'votes'"),
    "outside the root": ("../outside/private.csv", [], {}, "not an uploaded dataset or a file under the data root"),
    "symlink out": ("escape.csv", [], {}, "not an uploaded dataset or a file under the data root"),
    "absolute path": ("/etc/passwd", [], {}, "not an uploaded dataset or a file under the data root"),
}


# Both databases: a bad row of each kind of import (labelled, responses), refused after the
# round was written in the request's transaction, which must then roll back.
ROLLED_BACK = ["same worker twice", "unknown label"]


@pytest.mark.both_databases
@pytest.mark.parametrize("case", ROLLED_BACK)
def test_a_bad_row_is_one_clear_error_and_the_database_is_unchanged(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, case: str
) -> None:
    _refuse_a_bad_file(api, rooted, researcher, data_root, case)


@pytest.mark.parametrize("case", sorted(set(BAD_FILES) - set(ROLLED_BACK)))
def test_a_bad_file_is_one_clear_error_and_the_database_is_unchanged(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, case: str
) -> None:
    _refuse_a_bad_file(api, rooted, researcher, data_root, case)


def _refuse_a_bad_file(api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, case: str) -> None:
    task = _task(rooted, researcher, "dynasent-r2")
    name, content, options, message = BAD_FILES[case]
    if content or content == "":
        path = data_root / name
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            _write(path, content)
    before = table_counts(rooted)
    response = _import(api, researcher, task, 1, **({"kind": "labelled", "file": name} | options))
    assert response.status_code in (400, 409, 422), response.text
    assert message in response.text
    assert "private sentence" not in response.text and "word word" not in response.text
    assert table_counts(rooted) == before


def _dictionary_bomb(path: Path, *, rows: int, chars: int, column: str = "text") -> None:
    """A Parquet file of ``rows`` cells pointing at one ``chars``-character string (issue 26,
    point 8: a few hundred bytes that pandas decodes to rows x chars)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cells = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * chars]))
    columns = {"text": pa.array(["Fine."] * rows), "label": pa.array(["positive"] * rows), column: cells}
    pq.write_table(pa.table(columns), path, compression="zstd")


@pytest.mark.parametrize(
    ("bomb", "status", "message"),
    [
        # The footer declares a 4 MB dictionary page: refused before a page is read.
        ({"rows": 250, "chars": 4 * 1024 * 1024}, 413, "bomb.parquet decodes to more than 1,048,576 bytes"),
        ({"rows": 250, "chars": 200_000}, 422, "row 1, column `text`: a cell of 200,000 characters"),
        ({"rows": 400, "chars": 15_000, "column": "note"}, 413, "bomb.parquet decodes to more than 1,048,576 bytes"),
    ],
)
def test_a_hostile_parquet_file_is_refused_before_it_is_decoded(
    settings: Settings, data_root: Path, researcher: Actor, bomb: dict[str, Any], status: int, message: str
) -> None:
    bounded = create_app(
        settings.model_copy(
            update={"data_root": data_root, "max_upload_rows": MAX_ROWS, "max_upload_decoded_bytes": 1024 * 1024}
        )
    )
    _dictionary_bomb(data_root / "bomb.parquet", **bomb)
    with TestClient(bounded) as client:
        task = _task(bounded, researcher, "dynasent-r2")
        before = table_counts(bounded)
        response = _import(client, researcher, task, 1, kind="labelled", file="bomb.parquet")
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]
    assert "xxxxxxxx" not in response.text
    assert table_counts(bounded) == before


BAD_OFFSETS = {
    "outside the text": ({"target_start": 3, "target_end": 500}, "outside the text"),
    "not the target": ({"target_start": 0, "target_end": 5, "target": "Jones"}, "is not the target"),
    "missing": ({"target_start": None, "target_end": 4}, "needs the target's offsets"),
    "reversed": ({"target_start": 9, "target_end": 4}, "outside the text"),
}


@pytest.mark.parametrize("case", sorted(BAD_OFFSETS))
def test_bad_target_offsets_are_refused_and_nothing_is_written(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, case: str
) -> None:
    task = _task(rooted, researcher, "mad-tsc")
    good = {"text": "Smith met Jones.", "label": "neutral", "target": "Smith", "target_start": 0, "target_end": 5}
    change, message = BAD_OFFSETS[case]
    _write(data_root / "targets.jsonl", [good | {"text": "Smith met Jones again."}, good | change])
    before = table_counts(rooted)
    response = _import(api, researcher, task, 1, kind="labelled", file="targets.jsonl", target_column="target")
    assert response.status_code == 422, response.text
    assert "row 2" in response.text and message in response.text
    assert table_counts(rooted) == before


def test_only_the_tasks_researchers_may_import(
    api: TestClient, rooted: FastAPI, researcher: Actor, make_user: MakeUser, data_root: Path
) -> None:
    task = _task(rooted, researcher, "dynasent-r2")
    _write(data_root / "ok.csv", [GOOD])
    others = [None, make_user("other", "researcher"), make_user("val", "validator"), make_user("wri", "writer")]
    before = table_counts(rooted)
    for who in others:
        response = _import(api, who, task, 1, kind="labelled", file="ok.csv")
        # Another researcher does not learn that the task exists (404); crowdworkers are refused.
        assert response.status_code in (401, 403, 404), response.text
    assert table_counts(rooted) == before
    assert _import(api, researcher, task, 1, kind="labelled", file="ok.csv").status_code == 201


@pytest.mark.both_databases
def test_a_round_with_examples_or_a_skipped_number_is_refused(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    task = _task(rooted, researcher, "dynasent-r2")
    _write(data_root / "ok.csv", [GOOD])
    assert _import(api, researcher, task, 1, kind="labelled", file="ok.csv").status_code == 201
    before = table_counts(rooted)
    again = _import(api, researcher, task, 1, kind="labelled", file="ok.csv")
    assert again.status_code == 409 and "import into a new round" in again.text
    skipped = _import(api, researcher, task, 5, kind="labelled", file="ok.csv")
    assert skipped.status_code == 422 and "round 2" in skipped.text
    assert table_counts(rooted) == before


def test_a_file_over_the_size_limit_is_refused_before_it_is_parsed(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = _task(rooted, researcher, "dynasent-r2")
    _write(data_root / "big.csv", [GOOD | {"text": f"Row {i}."} for i in range(50)])
    monkeypatch.setattr(round_imports, "MAX_IMPORT_BYTES", 100)
    before = table_counts(rooted)
    response = _import(api, researcher, task, 1, kind="labelled", file="big.csv")
    assert response.status_code == 422 and "at most 100" in response.text
    assert table_counts(rooted) == before


# --- repeated texts (issue 26, item 4; docs/round_builder.md "Duplicates") --------------------------


@pytest.mark.both_databases
def test_a_responses_import_with_repeated_texts_makes_one_example_per_text(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    """The issue's reproduction: a responses file with the same sentence under two item ids (as
    a platform export has it when a sentence was posted twice), once labelled positive and once
    negative, was two examples that the builder put into different splits with opposite gold.
    Now the two ids are one example with the responses pooled; the build has the text once."""
    task = _task(rooted, researcher, "dynasent-r2")
    rows = []
    for item in range(12):
        for worker in range(3):
            rows.append(
                {"item": f"i{item}", "text": f"Example {item} of the old responses.", "worker": f"w{worker}",
                 "label": ["positive", "negative", "neutral"][item % 3]}
            )  # fmt: skip
    # i12 and i13: one sentence written two ways; i13's workers label it the other way.
    for item, text, label in (("i12", "The pasta was fine.", "positive"), ("i13", "the pasta was FINE", "negative")):
        for worker in ("w0", "w1", "w2") if item == "i12" else ("w3", "w4"):
            rows.append({"item": item, "text": text, "worker": worker, "label": label})
    _write(data_root / "repeats.csv", rows)
    response = _import(api, researcher, task, 1, kind="responses", file="repeats.csv", id_column="item")
    assert response.status_code == 201, response.text
    assert response.json()["examples"] == 13 and response.json()["repeats_merged"] == 1
    with session_scope(rooted.state.sessionmaker) as session:
        pasta = session.scalars(select(Example).where(Example.text == "The pasta was fine.")).one()
        assert pasta.source_id == "i12" and pasta.source_metadata["merged_ids"] == ["i13"]
        labels = sorted(
            v.label[0] for v in session.scalars(select(Validation).where(Validation.example_id == pasta.id))
        )
        assert labels == ["negative", "negative", "positive", "positive", "positive"]  # pooled: 3 to 2
        assert pasta.validation_count == pasta.validations_needed == 5
        assert not session.scalars(select(Example).where(Example.text == "the pasta was FINE")).all()
        assert check_database(session).violations == []
    report = _build(api, researcher, response.json()["round_id"], max_dev_test_share=1.0, dev_test_min_votes=1)
    assert report["duplicates"]["merged"] == 0  # nothing left to merge: the import did it


@pytest.mark.both_databases
def test_a_worker_who_labelled_one_text_two_ways_is_refused_and_nothing_is_written(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    task = _task(rooted, researcher, "dynasent-r2")
    rows = [
        {"item": "a", "text": "The pasta was fine.", "worker": "w1", "label": "positive"},
        {"item": "a", "text": "The pasta was fine.", "worker": "w2", "label": "positive"},
        {"item": "b", "text": "THE PASTA WAS FINE!", "worker": "w1", "label": "negative"},
    ]
    _write(data_root / "twoways.csv", rows)
    before = table_counts(rooted)
    response = _import(api, researcher, task, 1, kind="responses", file="twoways.csv", id_column="item")
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert "rows 1 and 3 have the same text" in message and "different labels" in message
    assert "pasta" not in message.lower()  # rows are named, never their text
    assert table_counts(rooted) == before
    # Without ids, rows of one text (in any case and punctuation) are one example already.
    _write(data_root / "noids.csv", [{k: v for k, v in row.items() if k != "item"} for row in rows[:2]]
           + [{"text": "the pasta was fine", "worker": "w3", "label": "neutral"}])  # fmt: skip
    response = _import(api, researcher, task, 1, kind="responses", file="noids.csv")
    assert response.status_code == 201, response.text
    assert response.json()["examples"] == 1 and response.json()["validations"] == 3


def test_a_labelled_dataset_with_a_repeated_text_is_refused(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    task = _task(rooted, researcher, "dynasent-r2")
    _write(data_root / "repeat.jsonl", [GOOD, GOOD | {"text": "a FINE sentence", "label": "negative"}])
    before = table_counts(rooted)
    response = _import(api, researcher, task, 1, kind="labelled", file="repeat.jsonl")
    assert response.status_code == 422, response.text
    assert "row 2 repeats row 1" in response.text and "ignoring case, spacing and punctuation" in response.text
    assert table_counts(rooted) == before


def test_a_text_of_an_earlier_round_is_left_out_of_a_later_rounds_splits(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    """Two rounds of one task that overlap (a dataset imported twice, in part): each text
    reaches one round's splits only, so the rounds together hold it once."""
    task = _task(rooted, researcher, "dynasent-r2")
    first = [{"text": f"Sentence {i} of the first file.", "label": ["positive", "negative", "neutral"][i % 3]}
             for i in range(12)]  # fmt: skip
    second = [{"text": f"Sentence {i} of the second file.", "label": ["positive", "negative", "neutral"][i % 3]}
              for i in range(12)] + [first[0] | {"text": first[0]["text"].upper()}, first[1]]  # fmt: skip
    _write(data_root / "first.jsonl", first)
    _write(data_root / "second.jsonl", second)
    assert _import(api, researcher, task, 1, kind="labelled", file="first.jsonl").status_code == 201
    imported = _import(api, researcher, task, 2, kind="labelled", file="second.jsonl")
    assert imported.status_code == 201, imported.text
    report = _build(api, researcher, imported.json()["round_id"], max_dev_test_share=1.0, dev_test_min_votes=1)
    assert report["duplicates"]["in_an_earlier_round"] == 2
    assert report["counts"]["excluded"]["duplicate_of_earlier_round"] == 2
    assert (
        report["counts"]["total"]["train"] + report["counts"]["total"]["dev"] + report["counts"]["total"]["test"] == 12
    )


# --- what the report of a round with no model says (issue 29, item 8) -------------------------------


def test_an_imported_round_with_no_model_reports_no_model_and_gold_as_imported(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    """A labelled dataset without vote counts into a 3-validation task: the strict build is refused
    for the reason that holds (no model prediction), and the relaxed build's report speaks of no
    model, per-class cells, no fooling rate, imported texts, no distributional labels and gold
    as imported, never of prompts, (gold, predicted) cells or "1 of 3 votes"."""
    task = _task(rooted, researcher, "besstie-en-in-sarcasm")
    rows = [{"text": f"Oh great, another Monday number {i}.", "label": ["sarcastic", "not_sarcastic"][i % 2]}
            for i in range(40)]  # fmt: skip
    _write(data_root / "plain.jsonl", rows)
    imported = _import(api, researcher, task, 1, kind="labelled", file="plain.jsonl")
    assert imported.status_code == 201, imported.text
    round_id = imported.json()["round_id"]

    refused = api.post(f"{API}/rounds/{round_id}/build", json={"policy": "strict"}, headers=researcher.headers)
    assert refused.status_code == 422, refused.text
    message = refused.json()["error"]["message"]
    assert "has a model prediction (imported examples carry none)" in message
    assert "eligible examples from distinct prompts" not in message
    assert "build without the chance constraint" in message

    report = _build(api, researcher, round_id, policy="relaxed", dev_test_min_votes=1)
    splits = report["splits"]
    assert splits["model_predictions"] == 0
    assert splits["cells"] and all("predicted" not in cell for cell in splits["cells"])
    assert sum(c["dev"] for c in splits["cells"]) == splits["assessment"]["dev"]["examples"]
    assert report["fooling"]["validated_fooling_rate"] is None
    assert report["fooling"]["examples_with_model_prediction"] == 0
    assert set(report["conditions"]) == {"imported"}
    assert report["counts"]["total"]["dist_train"] is None
    assert all(row["dist_train"] is None for row in report["counts"]["rows"].values())
    assert report["agreement_counts"] is None  # no response was counted here: no "k of 3"
    sheet = report["datasheet"]
    assert sheet["prompt_sources"] == ["none: the round's examples were imported, not written to prompts"]
    assert sheet["dev_test_rule"].startswith("gold as imported (the dataset's own label)")
    assert "unique prompts" not in sheet["dev_test_rule"] and "of 3 votes" not in sheet["dev_test_rule"]
    assert "no model in the loop" in sheet["build_policy"]

    markdown = api.get(
        f"{API}/tasks/{task}/rounds/1/report", params={"format": "markdown"}, headers=researcher.headers
    ).text
    assert "no model in the loop (no example has a model prediction)" in markdown
    assert "model not held at chance" not in markdown
    assert "(gold, predicted) cell" not in markdown and "Examples per gold class" in markdown
    assert (
        "validated_fooling_rate" not in markdown and "none of the 40 examples was checked against a model" in markdown
    )
    assert "Prompt vs no-prompt" not in markdown and "| imported |" in markdown
    assert "Dist train: none" in markdown
    assert "1 of 3" not in markdown and "prompts imported without a source" not in markdown


def test_the_cli_refuses_a_strict_build_in_its_own_words(settings: Settings, tmp_path: Path) -> None:
    """`round build --policy strict --no-chance` names the options, not the API's JSON; a strict
    build of an imported round says it has no model prediction, with the command that builds."""
    app = create_app(settings)
    with session_scope(app.state.sessionmaker) as session:
        create_task(session, None, example_yaml("besstie-en-in-sarcasm", onboarding_quiz=None))
    rows = [{"text": f"Tweet number {i}.", "label": ["sarcastic", "not_sarcastic"][i % 2]} for i in range(20)]
    file = _write(tmp_path / "plain.jsonl", rows)
    env = {"DYNALOOP_DATABASE_URL": settings.database_url or "", "DYNALOOP_SECRET_KEY": settings.secret_key,
           "DYNALOOP_DATA_DIR": str(tmp_path / "data")}  # fmt: skip
    where = ["--task", "besstie-en-in-sarcasm", "--round", "1"]
    runner = CliRunner()
    imported = runner.invoke(cli, ["round", "import", *where, "--kind", "labelled", "--file", str(file)], env=env)
    assert imported.exit_code == 0, imported.output
    mixed = runner.invoke(cli, ["round", "build", *where, "--policy", "strict", "--no-chance"], env=env)
    assert mixed.exit_code == 1
    assert "--policy strict keeps the task's dev/test rules, and --no-chance relaxes them" in mixed.output
    assert "use --policy relaxed instead" in mixed.output and '"policy"' not in mixed.output
    strict = runner.invoke(cli, ["round", "build", *where], env=env)
    assert strict.exit_code == 1
    assert "has a model prediction (imported examples carry none)" in " ".join(strict.output.split())
    assert "--policy relaxed --no-chance --dev-test-min-votes 1" in strict.output


def test_importing_more_responses_than_the_task_validates_says_how_many_the_build_sets_aside(
    settings: Settings, tmp_path: Path
) -> None:
    """Five responses per example into a 3-validation task: the import says, before any build,
    that 2 per example will be set aside (the API's answer and the command alike)."""
    app = create_app(settings)
    with session_scope(app.state.sessionmaker) as session:
        create_task(session, None, example_yaml("besstie-en-in-sarcasm", onboarding_quiz=None))
    rows = [
        {"item": f"x{item}", "text": f"Oh great, Tuesday {item}.", "worker": f"w{worker}",
         "label": ["sarcastic", "not_sarcastic"][(item + (worker == 4)) % 2]}
        for item in range(12)
        for worker in range(5 if item < 10 else 3)
    ]  # fmt: skip
    file = _write(tmp_path / "five.jsonl", rows)
    env = {"DYNALOOP_DATABASE_URL": settings.database_url or "", "DYNALOOP_SECRET_KEY": settings.secret_key}
    result = CliRunner().invoke(
        cli, ["round", "import", "--task", "besstie-en-in-sarcasm", "--round", "1", "--kind", "responses",
              "--file", str(file), "--id-column", "item"], env=env, catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "imported 12 examples and 56 responses" in said
    assert (
        "note: 10 example(s) have more responses than the task's 3 validations per example: the build keeps each "
        "one's 3 best-agreeing validators' labels and sets the other 20 response(s) aside (2 per example)"
    ) in said
    with session_scope(app.state.sessionmaker) as session:
        assert session.scalar(select(func.count()).select_from(Validation)) == 56  # nothing dropped at import


def test_a_multi_label_responses_import_reports_examples_apart_from_labels_and_no_prompts(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    """The counts table's last row counts examples while its label rows count labels: it is named
    for what it counts. A responses import has no prompts, and the datasheet says so."""
    task = _task(rooted, researcher, FAMILIES["multi_label"])
    sets = [["joy"], ["anger", "sadness"], ["neutral"]]
    rows = [
        {"item": f"e{i}", "text": f"ዛሬ ደስ ብሎኛል {i}", "worker": f"w{w}", "label": sets[i % 3]}
        for i in range(30)
        for w in range(3)
    ]
    _write(data_root / "ml.jsonl", rows)
    response = _import(api, researcher, task, 1, kind="responses", file="ml.jsonl", id_column="item")
    assert response.status_code == 201, response.text
    report = _build(api, researcher, response.json()["round_id"], policy="relaxed")
    assert report["datasheet"]["prompt_sources"] == ["none: the round's examples were imported, not written to prompts"]
    total = report["counts"]["total"]
    label_rows = report["counts"]["rows"]
    assert sum(row["train"] for row in label_rows.values()) > total["train"]  # anger+sadness count twice
    markdown = api.get(f"{API}/tasks/{task}/rounds/1/report", params={"format": "markdown"}, headers=researcher.headers)
    assert f"| **examples** (each once) | {total['dist_train']} | {total['train']} |" in markdown.text
    assert "**total**" not in markdown.text
    assert "the last row counts examples, each once" in markdown.text
    assert "prompts imported without a source" not in markdown.text


# --- issue 29: exact texts and source ids, `[]` as the API reads it, the wide format -------------

# A trailing space, a decomposed "é" (e + U+0301, not NFC), Devanagari with a zero-width joiner,
# a CRLF line break: each would change under the text policy's normalisation.
EXACT_TEXTS = [
    "The cafe\u0301 was fine.  ",
    "  क्\u200dष the minister spoke",
    "Two lines\r\nof one review",
]


@pytest.mark.both_databases
def test_imported_texts_are_kept_exactly_and_ids_become_source_ids(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    """Labelled and responses imports keep each text's bytes and the `id` column (the default)
    as `source_id`; rows of one id that differ only in what the policy normalises are one
    example with the first row's text; matching rows still works on the normalised form."""
    task = _task(rooted, researcher, "dynasent-r2")
    labels = ["positive", "negative", "neutral"]
    labelled = [{"id": f"L-{i:03d}", "text": text, "label": labels[i]} for i, text in enumerate(EXACT_TEXTS)]
    _write(data_root / "labelled.jsonl", labelled)
    response = _import(api, researcher, task, 1, kind="labelled", file="labelled.jsonl")
    assert response.status_code == 201, response.text
    rows = []
    for i, text in enumerate(EXACT_TEXTS):
        for worker in range(3):
            # The second worker's row of each item has the text trimmed and NFC: still the same example.
            shown = text if worker != 1 else unicodedata.normalize("NFC", text.strip())
            rows.append({"id": 100 + i, "text": shown, "worker": f"w{worker}", "label": labels[i]})
    _write(data_root / "responses.csv", rows)
    second = _import(api, researcher, task, 2, kind="responses", file="responses.csv")
    assert second.status_code == 201, second.text
    assert second.json()["examples"] == 3 and second.json()["validations"] == 9
    with session_scope(rooted.state.sessionmaker) as session:
        stored = {(e.round_id, e.source_id): e.text for e in session.scalars(select(Example))}
    first_round, second_round = response.json()["round_id"], second.json()["round_id"]
    for i, text in enumerate(EXACT_TEXTS):
        assert stored[(first_round, f"L-{i:03d}")].encode() == text.encode()
        assert stored[(second_round, str(100 + i))].encode() == text.encode()


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_an_empty_label_set_means_what_it_means_to_the_api(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, suffix: str
) -> None:
    """`[]` is the task's one exclusive label (EthioEmo's neutral) in an import as in
    POST /examples/{id}/validations (services.domain.labels.check_validation_label); where the
    task has no exclusive label, both refuse it with the same reason."""
    from services.domain.labels import check_validation_label
    from services.errors import Invalid
    from services.taskdef import parse_task_definition

    task = _task(rooted, researcher, "ethioemo-amharic")
    rows = []
    for i in range(4):
        for worker, label in enumerate([[], ["joy"], []]):
            rows.append({"id": f"e{i}", "text": f"ዛሬ ተራ ቀን ነው {i}", "worker": f"w{worker}", "label": label})
    if suffix == ".csv":  # a CSV cell holds the label set as a JSON list
        rows = [row | {"label": json.dumps(row["label"])} for row in rows]
    _write(data_root / f"empty{suffix}", rows)
    response = _import(api, researcher, task, 1, kind="responses", file=f"empty{suffix}")
    assert response.status_code == 201, response.text
    with session_scope(rooted.state.sessionmaker) as session:
        stored = Counter(tuple(v.label) for v in session.scalars(select(Validation)))
        definition = parse_task_definition(example_yaml("ethioemo-amharic", onboarding_quiz=None))
    assert stored == {("neutral",): 8, ("joy",): 4}
    assert check_validation_label(definition, []) == ["neutral"], "the API's reading"

    # A multi-label task without an exclusive label: the API and the import both refuse `[]`.
    no_neutral = example_yaml("ethioemo-amharic", onboarding_quiz=None, exclusive_labels=[]).replace(
        "name: ethioemo-amharic", "name: emotions-plain", 1
    )
    with session_scope(rooted.state.sessionmaker) as session:
        create_task(session, None, no_neutral, owner=get_user(session, researcher.username))
    with pytest.raises(Invalid) as api_refusal:
        check_validation_label(parse_task_definition(no_neutral), [])
    before = table_counts(rooted)
    refused = _import(api, researcher, "emotions-plain", 1, kind="responses", file=f"empty{suffix}")
    assert refused.status_code == 422
    assert "row 1, column 'label'" in refused.text
    assert "this task has no exclusive no-emotion label an empty set could mean" in str(api_refusal.value)
    assert "this task has no exclusive no-emotion label an empty set could mean" in refused.text
    assert table_counts(rooted) == before


def _wide_rows() -> list[dict[str, Any]]:
    """30 items as a per-annotator emotion file has them: an id, the text, five annotator columns
    (each one person), some cells empty (not annotated), label sets as "anger,joy" or as JSON
    lists, and `[]` for no emotion."""
    sets = [["joy"], ["anger", "disgust"], ["sadness"], [], ["fear", "surprise"], ["joy", "surprise"]]
    rows = []
    for i in range(30):
        gold = sets[i % len(sets)]
        row: dict[str, Any] = {"item_id": f"amh_{i:04d}", "text": f"ዛሬ {i} ስለ ምግቡ አስተያየት "}
        for a in range(5):
            if (i + a) % 7 == 0:
                row[f"annotator_{a + 1}"] = ""  # not annotated
            elif a % 2 == 0:
                row[f"annotator_{a + 1}"] = ",".join(gold) if gold else "[]"
            else:
                # a dissenting annotator now and then, written as a JSON list
                row[f"annotator_{a + 1}"] = json.dumps(gold if (i + a) % 5 else ["sadness"])
        rows.append(row)
    return rows


@pytest.mark.both_databases
def test_the_wide_per_annotator_format_imports_one_response_per_filled_cell(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    """One row per item, one column per annotator: each filled cell is that annotator's response
    (the column names the worker), an empty cell none; without the option the error says the
    file looks wide and names the option; the build computes gold from the cells."""
    task = _task(rooted, researcher, "ethioemo-amharic")
    rows = _wide_rows()
    _write(data_root / "wide.csv", rows)
    before = table_counts(rooted)
    hinted = _import(api, researcher, task, 1, kind="responses", file="wide.csv", label_separator=",")
    assert hinted.status_code == 422
    assert "the file has no column 'label'" in hinted.text and "looks wide" in hinted.text
    assert "annotator_columns" in hinted.text and "'annotator_1'" in hinted.text
    assert table_counts(rooted) == before
    response = _import(
        api,
        researcher,
        task,
        1,
        kind="responses",
        file="wide.csv",
        id_column="item_id",
        annotator_columns=["annotator_*"],
        label_separator=",",
    )
    assert response.status_code == 201, response.text
    filled = sum(1 for row in rows for a in range(5) if row[f"annotator_{a + 1}"] != "")
    # More filled cells than the task's 3 validations per example: the answer says how many the
    # build will set aside (every cell over 3 in its row).
    set_aside = sum(max(0, sum(1 for a in range(5) if row[f"annotator_{a + 1}"] != "") - 3) for row in rows)
    answer = response.json()
    assert answer.pop("responses_set_aside") == set_aside
    assert len(answer.pop("notes")) == (1 if set_aside else 0)
    assert answer | {"round_id": 0, "sha256": ""} == {
        "task": task, "round": 1, "round_id": 0, "kind": "responses", "examples": 30, "validations": filled,
        "workers": 5, "sha256": "", "repeats_merged": 0,
    }  # fmt: skip
    expected: dict[str, list[tuple[str, ...]]] = {}
    for row in rows:
        cells = [row[f"annotator_{a + 1}"] for a in range(5) if row[f"annotator_{a + 1}"] != ""]
        parsed = [json.loads(c) if c.startswith("[") else c.split(",") for c in cells]
        expected[row["item_id"]] = sorted(tuple(labels or ["neutral"]) for labels in parsed)
    with session_scope(rooted.state.sessionmaker) as session:
        examples = {e.id: e for e in session.scalars(select(Example))}
        found: dict[str, list[tuple[str, ...]]] = {}
        for validation in session.scalars(select(Validation)):
            found.setdefault(examples[validation.example_id].source_id or "", []).append(tuple(validation.label))
        assert {e.source_id: e.text for e in examples.values()} == {r["item_id"]: r["text"] for r in rows}
        assert check_database(session).violations == []
    assert {item: sorted(labels) for item, labels in found.items()} == expected
    report = _build(api, researcher, response.json()["round_id"], dev_test_min_votes=1, max_dev_test_share=1.0)
    assert report["counts"]["total"]["train"] + report["counts"]["total"]["dev"] + report["counts"]["total"]["test"] > 0


def test_wide_format_options_that_cannot_be_read_are_refused(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    task = _task(rooted, researcher, "ethioemo-amharic")
    _write(data_root / "wide.csv", _wide_rows())
    before = table_counts(rooted)
    for options, message in (
        ({"annotator_columns": ["rater_*"]}, "no column of the file is 'rater_*'"),
        ({"annotator_columns": ["text", "annotator_1"]}, "'text' is the text, id or target column"),
        ({"annotator_columns": ["annotator_*"], "seconds_column": "s"}, "the file has no column 's'"),
        ({"annotator_columns": ["annotator_*"], "kind": "labelled"}, "annotator_columns (the wide format) is for"),
    ):
        body = {"kind": "responses", "file": "wide.csv", "label_separator": ","} | options
        refused = _import(api, researcher, task, 1, **body)
        assert refused.status_code == 422 and message in refused.text, (options, refused.text)
    assert table_counts(rooted) == before


# --- more annotators per item than the task's validations ------------------------------------------

NOISY = "NOISY-1"
SETS = [("joy",), ("anger", "disgust"), ("sadness",), ("neutral",)]


def _four_annotators(family: str) -> list[dict[str, Any]]:
    """Forty items, four annotators each: three of seven reliable ones (right 85% of the time)
    and one noisy annotator in every item (wrong most of the time), listed first in half the
    items so that the file's order cannot decide who is kept."""
    rng = np.random.default_rng(29)
    rows = []
    for item in range(40):
        workers = [f"R{w}" for w in rng.choice(7, size=3, replace=False)]
        workers = [NOISY, *workers] if item % 2 else [*workers, NOISY]
        for worker in workers:
            if family == "multi_label":
                true = SETS[item % 4]
                if worker == NOISY:
                    label: Any = sorted(rng.choice(["fear", "surprise", "joy", "sadness"], size=2, replace=False))
                elif rng.random() < 0.85:
                    label = list(true)
                else:
                    label = ["surprise"] if true == ("neutral",) else [*true, "surprise"]
            else:
                true_label = ["sarcastic", "not_sarcastic"][item % 2]
                other = ["not_sarcastic", "sarcastic"][item % 2]
                right = rng.random() < (0.25 if worker == NOISY else 0.85)
                label = true_label if right else other
            rows.append({"item": f"x{item}", "text": f"Item {item} of a four-annotator file ጽሑፍ", "worker": worker,
                         "label": label})  # fmt: skip
    return rows


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


@pytest.mark.parametrize("family", ["multi_label", "binary_variety"])
def test_four_annotators_into_a_three_validation_task_read_the_same_three_responses_everywhere(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path, family: str
) -> None:
    """Issue 29, item 2: gold, agreement, human F1 and model-based labels read the same three
    responses of each example (the three best-agreeing validators'), and the report says that
    one response per example was set aside; every figure matches an independent computation
    on those three responses."""
    task = _task(rooted, researcher, FAMILIES[family])
    rows = _four_annotators(family)
    _write(data_root / "four.jsonl", rows)
    response = _import(api, researcher, task, 1, kind="responses", file="four.jsonl", id_column="item")
    assert response.status_code == 201, response.text
    assert response.json()["validations"] == 160
    report = _build(api, researcher, response.json()["round_id"])

    with session_scope(rooted.state.sessionmaker) as session:
        # The noisy annotator is the one validator of every example.
        counts = Counter(v.validator_id for v in session.scalars(select(Validation)))
        (noisy, forty), *_ = counts.most_common(1)
        assert forty == 40 and sorted(counts.values())[-2] < 40
        ids = {e.id: e.source_id for e in session.scalars(select(Example))}
        built = {ids[b.example_id]: b for b in session.scalars(select(BuiltExample))}
    assert len(built) == 40
    for row in built.values():
        assert row.responses == 3 and noisy not in {worker for worker, _ in row.response_labels}

    # What the report says about the responses.
    selection = report["responses"]
    assert selection | {"statement": ""} == {
        "per_example": 3, "counted": 160, "used": 120, "examples": 40, "set_aside": 40, "examples_with_set_aside": 40,
        "set_aside_per_example": {"1": 40}, "earlier_passes": 0, "examples_reannotated": 0, "examples_with_fewer": 0,
        "statement": "",
    }  # fmt: skip
    assert "1 response(s) per example set aside for 40 example(s)" in selection["statement"]
    assert report["datasheet"]["responses_used"] == selection["statement"]
    assert report["agreement_counts"]["examples_with_other_response_counts"] == 0
    markdown = api.get(f"{API}/tasks/{task}/rounds/1/report", params={"format": "markdown"}, headers=researcher.headers)
    assert "## Responses used" in markdown.text and "1 response(s) per example set aside" in markdown.text
    assert "Every agreement figure reads the same 40 examples, 3 responses each" in markdown.text

    # Independently, on the three responses of the reliable annotators of each item.
    kept = pd.DataFrame([r for r in rows if r["worker"] != NOISY])
    assert (kept.groupby("item").size() == 3).all()
    if family == "multi_label":
        labels = ["anger", "disgust", "fear", "joy", "sadness", "surprise", "neutral"]
        for item, group in kept.groupby("item"):
            votes = Counter(label for labels_of_row in group["label"] for label in labels_of_row)
            gold = [label for label in labels if votes[label] >= 2]
            gold = [label for label in gold if label != "neutral"] or gold
            assert built[str(item)].gold_label == (gold or None), item
        section = report["multi_label"]["agreement"]
        assert section["n_raters"] == 3 and section["n_examples"] == 40 and section["examples_left_out"] == 0
        for label in labels:
            chosen = np.array([sum(label in lab for lab in g["label"]) for _, g in kept.groupby("item")])
            if chosen.sum() == 0:
                continue
            alpha = krippendorff.alpha(value_counts=np.c_[chosen, 3 - chosen], level_of_measurement="nominal")
            assert section["per_label"][label]["alpha"] == pytest.approx(alpha, abs=1e-4), label
            assert section["per_label"][label]["prevalence"] == pytest.approx(chosen.sum() / 120, abs=1e-4)
        jaccard = np.mean(
            [
                np.mean([_jaccard(set(a), set(b)) for i, a in enumerate(g["label"]) for b in list(g["label"])[i + 1 :]])
                for _, g in kept.groupby("item")
            ]
        )
        assert report["agreement"]["mean_jaccard"] == pytest.approx(jaccard, abs=1e-4)
        for name, human in report["multi_label"]["human_f1"].items():
            assert human["n_annotators"] == 3, name
        # Model-based label sets from the same responses: non-null and, on this data, gold's.
        with_gold = [row for row in built.values() if row.gold_label]
        assert all(row.model_based_label for row in with_gold)
        same = sum(row.model_based_label == row.gold_label for row in with_gold)
        assert same >= 0.9 * len(with_gold) and report["model_based"]["same_as_gold"] == same
    else:
        table = []
        for item, group in kept.groupby("item"):
            votes = Counter(group["label"])
            label, top = votes.most_common(1)[0]
            assert built[str(item)].gold_label == ([label] if top >= 2 else None), item
            table.append([votes.get("sarcastic", 0), votes.get("not_sarcastic", 0)])
        agreement = report["agreement"]
        assert agreement["n_raters"] == 3 and agreement["n_examples"] == 40 and agreement["examples_left_out"] == 0
        assert agreement["fleiss_kappa"] == pytest.approx(fleiss_kappa(np.array(table)), abs=1e-4)
        alpha = krippendorff.alpha(value_counts=np.array(table), level_of_measurement="nominal")
        assert agreement["krippendorff_alpha"] == pytest.approx(alpha, abs=1e-4)
        assert all(row.model_based_label == row.gold_label for row in built.values() if row.gold_label)


# --- money: the workers of an import are never paid --------------------------------------------


@pytest.mark.both_databases
def test_the_workers_of_imported_responses_are_never_paid(
    api: TestClient, rooted: FastAPI, researcher: Actor, data_root: Path
) -> None:
    """Imported responses were paid for (or not) where they were collected: their pseudonymous
    accounts exist so that the builder has validators to count, and the ledger must not pay them
    a validator bonus. The pay policy here pays any whole batch of 10 with half its labels
    agreeing, which most of the imported workers' batches do."""
    with session_scope(rooted.state.sessionmaker) as session:
        create_task(
            session,
            None,
            example_yaml(
                "dynasent-r2",
                onboarding_quiz=None,
                pay={
                    "currency": "GBP",
                    "base_pay": {"writer": 150, "validator": 100},
                    "writer_bonus_per_example": 10,
                    "validator_bonus": {"per_batch": 20, "min_agreement": 0.5},
                },
            ),
            owner=get_user(session, researcher.username),
        )
    _write(data_root / "responses.csv", _responses())
    response = _import(api, researcher, "dynasent-r2", 1, kind="responses", file="responses.csv", id_column="item")
    assert response.status_code == 201, response.text
    _build(api, researcher, response.json()["round_id"], dev_test_min_votes=3, model_based=None)
    with session_scope(rooted.state.sessionmaker) as session:
        accounts = session.scalars(select(User).where(User.username.like("imported-%"))).all()
        assert len(accounts) == 12
        assert all(a.made_by_import for a in accounts)
        # Every one of them has at least one whole batch of ten labels to be paid for.
        per_worker = Counter(session.scalars(select(Validation.validator_id)))
        assert all(per_worker[a.id] >= 10 for a in accounts)

    computed = api.post("/api/v1/tasks/dynasent-r2/ledger/compute", json={}, headers=researcher.headers)
    assert computed.status_code == 200, computed.text
    # The build computed the ledger already (a task with a pay policy); neither it nor this added a row.
    assert (computed.json()["entries_added"], computed.json()["already_paid"]) == (0, 0)
    assert table_counts(rooted)["ledger_entries"] == 0
