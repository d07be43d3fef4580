"""Exports that load everywhere: every export format of a built round (from `dynaloop round
export` and from the API's download) loads with Hugging Face ``datasets.load_dataset`` offline,
with the one declared schema of rounds/build/export.py, and its values round-trip (labels,
distributional labels, writer fields, Ge'ez and Devanagari text with zero-width joiners byte
for byte); the dataset card written beside the files loads the folder; the README's loading
snippet runs as written. What depends on the database (the rows read back, their JSON columns,
the keyset chunks of a download) runs on both (``both_databases``, tests/conftest.py); what
depends only on the files runs on SQLite."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from rounds.build import dataset_card, export
from services.taskdef import example_path, example_paths, load_task_definition
from tests.built_round import LABELS, BuiltRound, write_and_label
from tests.conftest import Actor, MakeUser, example_yaml, open_round
from tests.stub_model_server import ThreadedServer

README = Path(__file__).parent.parent / "README.md"
FORMATS = ("parquet", "jsonl", "csv")
LOADER = {"parquet": "parquet", "jsonl": "json", "csv": "csv"}
# Devanagari with a zero-width joiner inside a conjunct (half form of क्ष), Ge'ez with one too.
DEVANAGARI = "क्\u200dषेत्र"
GEEZ = "ሰላም\u200dለዓለም"


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No hub access while loading, and a cache of the test's own."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    return cache


@contextmanager
def datasets_warnings() -> Iterator[list[str]]:
    """The warnings ``datasets`` logs meanwhile (it logs a card it ignores part of, e.g. a
    malformed ``splits`` entry, as a warning of its own logger, not a Python warning)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect(level=logging.WARNING)
    library = logging.getLogger("datasets")
    library.addHandler(handler)
    try:
        yield messages
    finally:
        library.removeHandler(handler)


def load(file_format: str, files: dict[str, Path], cache: Path, features: datasets.Features) -> datasets.DatasetDict:
    loaded = datasets.load_dataset(
        LOADER[file_format],
        data_files={split: str(path) for split, path in files.items()},
        features=features,
        cache_dir=str(cache),
    )
    assert isinstance(loaded, datasets.DatasetDict)
    return loaded


def features_of(file_format: str, task: str) -> datasets.Features:
    """The features the docs tell a user to pass: the declared schema (CSV: nested as JSON strings)."""
    schema = export.schema_for(load_task_definition(example_path(task)))
    return datasets.Features.from_arrow_schema(export.csv_schema(schema) if file_format == "csv" else schema)


def decoded(file_format: str, row: dict[str, Any], task: str) -> dict[str, Any]:
    """A loaded row as the Parquet/JSONL value: CSV's nested columns are JSON strings."""
    if file_format != "csv":
        return row
    schema = export.schema_for(load_task_definition(example_path(task)))
    nested = {f.name for f in schema if export.json_in_csv(f)}
    return {key: json.loads(value) if key in nested and value is not None else value for key, value in row.items()}


def cli_export(
    database_url: str, task: str, out: Path, file_format: str, splits: str = "train,dev,test", number: int = 1
) -> None:
    """`dynaloop round export`, keyed like the test app (tests/conftest.py ``settings``)."""
    from dynaloop.cli import app as cli

    result = CliRunner(env={"DYNALOOP_SECRET_KEY": "test-suite-secret-key-0123456789"}).invoke(
        cli,
        [
            "round",
            "export",
            "--task",
            task,
            "--round",
            str(number),
            "--out",
            str(out),
            "--format",
            file_format,
            "--splits",
            splits,
            "--database-url",
            database_url,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "README.md" in result.output


@pytest.fixture
def scripts_round(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> list[tuple[str, str, list[str]]]:
    """A MAD-TSC round (a writer field: the target span) of texts in Devanagari and Ge'ez with
    zero-width joiners, built without the chance rule; returns (text, gold, labels) per example."""
    prompts = [f"Prompt {i}: the minister visited the city." for i in range(12)]
    round_ = open_round(
        client,
        researcher,
        example_yaml("mad-tsc", onboarding_quiz=None),
        stub_model.url,
        prompts,
        target_label_mode="writer_choice",
    )
    writer = make_user("tess", "writer")
    validators = [make_user(f"tv{i}", "validator") for i in range(3)]
    plan: list[tuple[str, str, list[int] | None, list[str]]] = []
    written = []
    for i, (label, weak) in enumerate(
        (("positive", "weakly_positive"), ("negative", "weakly_negative"), ("neutral", "neutral"))
    ):
        for copy, script in enumerate((DEVANAGARI, GEEZ)):
            text = f"The minister met the mayor {i}{copy} and wrote {script} on the old town hall."
            labels = [label, weak, label] if copy == 0 else [label, label, label]
            plan.append((label, text, [4, 12], labels))
            written.append((text, label, labels))
    write_and_label(client, writer, validators, round_["id"], plan)
    client.post(f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    response = client.post(
        f"/api/v1/rounds/{round_['id']}/build",
        # Two examples per class: without the class-balance guard, so that dev and test have rows.
        json={"chance": False, "dev_test_min_votes": 3, "max_dev_test_share": 1.0},
        headers=researcher.headers,
    )
    assert response.status_code == 201, response.text
    return written


@pytest.mark.both_databases
def test_every_format_loads_with_datasets_and_round_trips(
    scripts_round: list[tuple[str, str, list[str]]],
    client: TestClient,
    researcher: Actor,
    database_url: str,
    offline: Path,
    tmp_path: Path,
) -> None:
    """CLI and API exports of each format: declared features, the same values in every format,
    the written text byte for byte, gold and distributional labels and the writer's span."""
    loaded_rows: dict[str, list[dict[str, Any]]] = {}
    for file_format in FORMATS:
        out = tmp_path / f"cli-{file_format}"
        cli_export(database_url, "mad-tsc", out, file_format, "all")
        api_file = tmp_path / f"api-mad-tsc-r1-all.{file_format}"
        response = client.get(
            "/api/v1/tasks/mad-tsc/rounds/1/dataset",
            params={"split": "all", "format": file_format},
            headers=researcher.headers,
        )
        assert response.status_code == 200, response.text
        api_file.write_bytes(response.content)
        cli_file = out / f"mad-tsc-r1-all.{file_format}"
        assert cli_file.read_bytes() == response.content, "the CLI and the API write the same file"
        features = features_of(file_format, "mad-tsc")
        data = load(file_format, {"train": cli_file, "test": api_file}, offline, features)
        assert data["train"].features == features
        rows = [decoded(file_format, row, "mad-tsc") for row in data["train"]]
        assert [decoded(file_format, row, "mad-tsc") for row in data["test"]] == rows
        loaded_rows[file_format] = rows
        if file_format != "csv":
            # Parquet carries its schema; JSON Lines infers the same without being told.
            plain = datasets.load_dataset(
                LOADER[file_format], data_files=str(cli_file), cache_dir=str(offline / "plain")
            )["train"]
            assert [decoded(file_format, row, "mad-tsc") for row in plain] == rows
    assert loaded_rows["parquet"] == loaded_rows["jsonl"] == loaded_rows["csv"]
    by_text = {row["text"]: row for row in loaded_rows["parquet"]}
    assert len(by_text) == len(scripts_round) == 6
    for text, gold, labels in scripts_round:
        row = by_text[text]  # the exact text: a normalised or joiner-stripped text would miss
        assert row["text"].encode("utf-8") == text.encode("utf-8")
        assert ("\u200d" in row["text"]) and (DEVANAGARI in text or GEEZ in text)
        assert row["gold_label"] == [gold]
        # Every 5-point label collapses to the written class (weakly_x -> x): a share of 1.
        assert row["distributional_label"] == {label: (1.0 if label == gold else 0.0) for label in LABELS}
        assert sorted(r["label"][0] for r in row["responses"]) == sorted(labels)
        assert row["extras"] == {"target_span": {"start": 4, "end": 12, "text": "minister"}}
        assert row["language"] == "en" and row["round"] == 1


def test_readme_snippet_loads_the_cli_export(built: BuiltRound, database_url: str, tmp_path: Path) -> None:
    """The README's loading code, exactly as written, in a fresh offline Python process on the
    files `dynaloop round export` writes where the README writes them."""
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("## Building and exporting a round") :]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None
    assert "dynaloop round export --task dynasent-r2 --round 1 --out data/r1 --format parquet" in section
    cli_export(database_url, "dynasent-r2", tmp_path / "data" / "r1", "parquet")
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf-home"),
        "PYTHONIOENCODING": "utf-8",
    }
    result = subprocess.run(
        [sys.executable, "-c", snippet.group(1)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "sentence about lunch" in result.stdout or "remark on the menu" in result.stdout
    assert "'positive':" in result.stdout and "'neutral':" in result.stdout, "the distributional label printed"


@pytest.mark.parametrize("file_format", FORMATS)
def test_dataset_card_loads_the_folder(
    built: BuiltRound, database_url: str, client: TestClient, offline: Path, tmp_path: Path, file_format: str
) -> None:
    """README.md beside the files: Hub metadata from the task, features equal to what
    ``datasets`` derives from the declared schema, split counts equal to the build's, the
    build's datasheet restated; ``load_dataset(FOLDER)`` reads it; the API serves the same card."""
    out = tmp_path / "r1"
    cli_export(database_url, "dynasent-r2", out, file_format)
    card = (out / "README.md").read_text(encoding="utf-8")
    header = yaml.safe_load(card.split("---\n")[1])
    assert header["license"] == "cc-by-4.0" and header["language"] == ["en"]
    assert header["task_categories"] == ["text-classification"]
    assert header["configs"] == [
        {
            "config_name": "default",
            "data_files": [
                {"split": hub, "path": f"dynasent-r2-r1-{split}.{file_format}"}
                for split, hub in (("train", "train"), ("dev", "validation"), ("test", "test"))
            ],
        }
    ]
    counts = built["build"]["report"]["counts"]["total"]
    sizes = {
        split: (out / f"dynasent-r2-r1-{split}.{file_format}").stat().st_size for split in ("train", "dev", "test")
    }
    assert header["dataset_info"]["splits"] == [
        {"name": "train", "num_bytes": sizes["train"], "num_examples": counts["train"]},
        {"name": "validation", "num_bytes": sizes["dev"], "num_examples": counts["dev"]},
        {"name": "test", "num_bytes": sizes["test"], "num_examples": counts["test"]},
    ]
    features = features_of(file_format, "dynasent-r2")
    assert header["dataset_info"]["features"] == features._to_yaml_list()
    # The datasheet, field by field as the report has it: the card adds no claim of its own.
    # (Structured values compared as JSON: the API's schema may order an object's keys otherwise.)
    card_lines = dict(
        line[4:].split("**: ", 1) for line in card.splitlines() if line.startswith("- **") and "**: " in line
    )
    for key, value in built["build"]["report"]["datasheet"].items():
        shown = card_lines[key.replace("_", " ")]
        assert (json.loads(shown) if isinstance(value, dict | list) else shown) == (
            value if isinstance(value, dict | list) else str(value)
        ), key
    if file_format == "csv":
        assert "hold the JSON text of their value" in card and "`prompt_id`" in card
    with datasets_warnings() as warned:
        folder = datasets.load_dataset(str(out), cache_dir=str(offline))
    assert warned == [], "the card validates: no part of it is ignored"
    assert isinstance(folder, datasets.DatasetDict)
    assert {name: len(split) for name, split in folder.items()} == {
        "train": counts["train"],
        "validation": counts["dev"],
        "test": counts["test"],
    }
    assert folder["validation"].features == features
    assert {row["split"] for row in folder["validation"]} == {"dev"}
    served = client.get(
        "/api/v1/tasks/dynasent-r2/rounds/1/dataset/card",
        params={"format": file_format},
        headers=built["researcher"].headers,
    )
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/markdown")
    assert served.text == card


def test_dataset_card_route_refusals(built: BuiltRound, client: TestClient, make_user: MakeUser) -> None:
    url = "/api/v1/tasks/dynasent-r2/rounds/1/dataset/card"
    reader = make_user("robot", "client")
    assert client.get(url, headers=reader.headers).status_code == 200
    denied = client.get(url, headers=built["writer"].headers)
    assert denied.status_code == 403
    for params, message in (
        ({"format": "xml"}, "unknown format 'xml'"),
        ({"splits": "train,validation"}, "unknown split 'validation'"),
        ({"splits": ","}, "splits: list 1 to"),
        ({"splits": "x" * 101}, ""),
    ):
        refused = client.get(url, params=params, headers=reader.headers)
        assert refused.status_code == 422 and message in refused.text, (params, refused.text)
    missing = client.get("/api/v1/tasks/dynasent-r2/rounds/2/dataset/card", headers=reader.headers)
    assert missing.status_code == 404


def test_card_features_match_datasets_for_every_example_task() -> None:
    """rounds.build.dataset_card.feature_yaml writes what ``datasets`` itself writes."""
    for path in example_paths():
        schema = export.schema_for(load_task_definition(path))
        for declared in (schema, export.csv_schema(schema)):
            ours = [{"name": f.name, **dataset_card.feature_yaml(f.type)} for f in declared]
            assert ours == datasets.Features.from_arrow_schema(declared)._to_yaml_list(), path.name


def _filled_row(definition: Any, schema: Any) -> dict[str, Any]:
    labels = list(definition.labels)
    extras = {
        spec.name.value: {"start": 0, "end": 3, "text": "ሰላም"} if spec.name.value == "target_span" else f"{GEEZ} 1"
        for spec in definition.writer_fields
    }
    row: dict[str, Any] = {
        "example_id": 2**40,
        "source_id": "row-7 ",
        "round": 3,
        "split": "dev",
        "text": f'"{DEVANAGARI}", {GEEZ}\nline two, with a comma',
        "gold_label": labels[:2] if definition.is_multi_label else labels[:1],
        "gold_votes": 4,
        "distributional_label": {label: round(1 / len(labels), 4) for label in labels},
        "model_based_label": labels[:1],
        "responses": [{"worker": "w0123456789ab", "label": labels[:1], "annotation_pass": 1}],
        "model_prediction": labels[-1:],
        "model_id": "model-0",
        "fooled": False,
        "target_label": labels[:1],
        "condition": "prompt",
        "prompt_id": 7,
        "prompt_text": "a prompt",
        "language": definition.language,
        "writer": "w0123456789ab",
        "flags": ["train_only"],
    }
    if "extras" in schema.names:
        row["extras"] = extras
    return row


@pytest.mark.parametrize("file_format", FORMATS)
def test_every_task_schema_round_trips_through_datasets(offline: Path, tmp_path: Path, file_format: str) -> None:
    """For each example task (every family): a row with every field set and one with every
    nullable field null, written by the export's encoder, load with ``datasets`` (CSV with the
    documented features) to the same values; an empty split loads as an empty split."""
    for path in example_paths():
        definition = load_task_definition(path)
        schema = export.schema_for(definition)
        filled = _filled_row(definition, schema)
        empty = {f.name: (filled[f.name] if not f.nullable else None) for f in schema}
        empty["example_id"] = 1
        rows = [empty, filled]
        out = tmp_path / f"{definition.name}.{file_format}"
        out.write_bytes(b"".join(export.encode(schema, [pa.Table.from_pylist(rows, schema=schema)], file_format)))
        features = datasets.Features.from_arrow_schema(export.csv_schema(schema) if file_format == "csv" else schema)
        data = load(file_format, {"train": out}, offline / definition.name, features)
        assert data["train"].features == features
        assert [decoded(file_format, row, definition.name) for row in data["train"]] == rows, path.name
        # An empty split is a file of no rows (``datasets`` refuses to load a split of no rows,
        # so the dataset card leaves such a split out of its configs).
        nothing = b"".join(export.encode(schema, [], file_format))
        if file_format == "parquet":
            empty_table = pq.read_table(io.BytesIO(nothing))
            assert empty_table.num_rows == 0 and empty_table.schema.equals(schema)
        elif file_format == "csv":
            assert nothing.decode("utf-8").splitlines() == [",".join(f'"{name}"' for name in schema.names)]
        else:
            assert nothing == b""


def test_dataset_card_leaves_out_what_datasets_cannot_load(
    built: BuiltRound, database_url: str, offline: Path, tmp_path: Path
) -> None:
    """`all` (a reserved split name in ``datasets``) and a split without rows are written and
    listed, but not configured, so the folder still loads."""
    counts = built["build"]["report"]["counts"]["total"]
    out = tmp_path / "r1"
    cli_export(database_url, "dynasent-r2", out, "jsonl", "train,dev,test,excluded,all")
    assert (out / "dynasent-r2-r1-excluded.jsonl").read_bytes() == b"", "the fixture's round excludes nothing"
    card = (out / "README.md").read_text(encoding="utf-8")
    header = yaml.safe_load(card.split("---\n")[1])
    assert [f["split"] for f in header["configs"][0]["data_files"]] == ["train", "validation", "test"]
    total = counts["train"] + counts["dev"] + counts["test"]
    assert f"| all | `dynasent-r2-r1-all.jsonl` | {total} |" in card
    assert "| excluded | `dynasent-r2-r1-excluded.jsonl` | 0 |" in card
    assert (
        "Not in the configs above: `dynasent-r2-r1-excluded.jsonl` (no rows: `datasets` cannot load an empty "
        "split); `dynasent-r2-r1-all.jsonl` (every split together: `all` is a split name `datasets` reserves)."
    ) in card
    folder = datasets.load_dataset(str(out), cache_dir=str(offline))
    assert isinstance(folder, datasets.DatasetDict) and sorted(folder) == ["test", "train", "validation"]
    assert len(folder["train"]) == counts["train"]


@pytest.mark.both_databases
def test_multi_label_round_in_geez_loads_in_every_format(
    client: TestClient,
    researcher: Actor,
    make_user: MakeUser,
    stub_multi_label_model: ThreadedServer,
    offline: Path,
    tmp_path: Path,
) -> None:
    """An EthioEmo-style round (Amharic, label sets) through the API download: gold label sets,
    per-label shares and Ge'ez text with a zero-width joiner, the same in every format; the
    card names the language and the multi-label task."""
    prompts = [f"Prompt {i}: ስለ ምግቡ አስተያየት" for i in range(16)]
    round_ = open_round(
        client,
        researcher,
        example_yaml("ethioemo-amharic", onboarding_quiz=None),
        stub_multi_label_model.url,
        prompts,
        target_label_mode="writer_choice",
    )
    writer = make_user("amara", "writer")
    validators = [make_user(f"ev{i}", "validator") for i in range(3)]
    plan: list[tuple[Any, str, list[int] | None, list[Any]]] = []
    for i in range(4):
        plan.append((["joy"], f"ደስታ {i} በዓል {GEEZ}", None, [["joy"], ["joy"], ["joy", "surprise"]]))
        plan.append((["anger"], f"ቁጣ {i} በዓል {GEEZ}", None, [["anger", "disgust"], ["anger", "disgust"], ["anger"]]))
        plan.append((["sadness"], f"ሀዘን {i} በዓል {GEEZ}", None, [["sadness"], ["sadness"], ["sadness"]]))
    write_and_label(client, writer, validators, round_["id"], plan)
    client.post(f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    response = client.post(f"/api/v1/rounds/{round_['id']}/build", json={"seed": 1}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    expected = {
        "ደስታ": (["joy"], {"joy": 1.0, "surprise": 0.3333}),
        "ቁጣ": (["anger", "disgust"], {"anger": 1.0, "disgust": 0.6667}),
        "ሀዘን": (["sadness"], {"sadness": 1.0}),
    }
    labels = ["anger", "disgust", "fear", "joy", "sadness", "surprise", "neutral"]
    loaded = {}
    for file_format in FORMATS:
        download = client.get(
            "/api/v1/tasks/ethioemo-amharic/rounds/1/dataset",
            params={"split": "all", "format": file_format},
            headers=researcher.headers,
        )
        assert download.status_code == 200, download.text
        path = tmp_path / f"ethioemo-amharic-r1-all.{file_format}"
        path.write_bytes(download.content)
        features = features_of(file_format, "ethioemo-amharic")
        data = load(file_format, {"train": path}, offline / file_format, features)
        assert data["train"].features == features
        loaded[file_format] = [decoded(file_format, row, "ethioemo-amharic") for row in data["train"]]
    assert loaded["parquet"] == loaded["jsonl"] == loaded["csv"]
    rows = loaded["parquet"]
    assert sorted(row["text"] for row in rows) == sorted(text for _, text, _, _ in plan)
    for row in rows:
        assert row["text"].encode("utf-8").endswith(GEEZ.encode("utf-8"))
        gold, shares = expected[row["text"].split(" ")[0]]
        assert sorted(row["gold_label"]) == gold
        assert list(row["distributional_label"]) == labels
        assert row["distributional_label"] == pytest.approx({label: shares.get(label, 0.0) for label in labels})
        assert row["language"] == "am" and len(row["responses"]) == 3
    card = client.get(
        "/api/v1/tasks/ethioemo-amharic/rounds/1/dataset/card",
        params={"format": "jsonl", "splits": "all"},
        headers=researcher.headers,
    )
    header = yaml.safe_load(card.text.split("---\n")[1])
    assert header["language"] == ["am"] and header["task_ids"] == ["multi-label-classification"]
    assert header["configs"][0]["data_files"] == [], "`all` alone: nothing the Hub can configure"


@pytest.mark.both_databases
def test_a_download_streams_in_chunks_and_still_loads(
    built: BuiltRound, client: TestClient, monkeypatch: pytest.MonkeyPatch, offline: Path, tmp_path: Path
) -> None:
    """Keyset chunks of 4 rows: the 21-row Parquet download is six row groups (one per chunk,
    never the whole split at once), the JSONL and CSV files have their rows once each, and every
    format loads with ``datasets`` as one table."""
    monkeypatch.setattr(export, "CHUNK_ROWS", 4)
    url = "/api/v1/tasks/dynasent-r2/rounds/1/dataset"
    headers = built["researcher"].headers
    ids = None
    for file_format in FORMATS:
        response = client.get(url, params={"split": "all", "format": file_format}, headers=headers)
        assert response.status_code == 200
        path = tmp_path / f"all.{file_format}"
        path.write_bytes(response.content)
        if file_format == "parquet":
            assert pq.ParquetFile(path).metadata.num_row_groups == 6
        data = load(file_format, {"train": path}, offline / file_format, features_of(file_format, "dynasent-r2"))
        loaded_ids = [row["example_id"] for row in data["train"]]
        assert len(loaded_ids) == 21 and loaded_ids == sorted(set(loaded_ids))
        assert ids is None or loaded_ids == ids
        ids = loaded_ids


# --- issue 29: an import joins back to its source; every split file loads with one schema --------

# Texts a file may hold that the text policy would change: a trailing space, a decomposed "é"
# (e + U+0301), Devanagari with a zero-width joiner, Ge'ez with one, a leading space.
EXACT = ["The cafe\u0301 was fine. ", f"{DEVANAGARI} the minister spoke  ", f" {GEEZ} ዛሬ"]


def _import_cli(database_url: str, task: str, number: int, path: Path, *options: str) -> None:
    from dynaloop.cli import app as cli

    result = CliRunner(env={"DYNALOOP_SECRET_KEY": "test-suite-secret-key-0123456789"}).invoke(
        cli,
        ["round", "import", "--task", task, "--round", str(number), "--file", str(path),
         "--database-url", database_url, *options],
    )  # fmt: skip
    assert result.exit_code == 0, result.output


def _source_files(folder: Path, multi_label: bool) -> list[tuple[str, str]]:
    """Round 1: a labelled file of 2 texts. Round 2: responses in the wide format, 3 annotators
    per item: 24 ordinary items, 3 with the exact texts above, and round 1's 2 texts again (the
    build excludes them as texts of an earlier round: the excluded split). Returns round 2's
    (id, text) pairs."""
    labels: list[Any] = (
        [["joy"], ["anger", "disgust"], ["sadness"]] if multi_label else ["positive", "negative", "neutral"]
    )
    earlier = [f"A sentence the first study had, number {i}." for i in range(2)]
    (folder / "round1.jsonl").write_text(
        "".join(json.dumps({"text": text, "label": labels[0]}) + "\n" for text in earlier), encoding="utf-8"
    )
    rows = []
    texts = [f"Item {i} of the earlier study, sentence {i * 7}." for i in range(24)] + EXACT + earlier
    for i, text in enumerate(texts):
        gold = labels[i % len(labels)]
        # The ids keep a trailing space; multi-label cells are JSON lists in a text cell.
        cells = {f"a{a}": json.dumps(gold) if multi_label else gold for a in range(3)}
        rows.append({"id": f"src-{i:03d} ", "text": text, **cells})
    (folder / "round2.jsonl").write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8"
    )
    return [(row["id"], row["text"]) for row in rows]


@pytest.mark.both_databases
@pytest.mark.parametrize("task", ["dynasent-r2", "ethioemo-amharic"])
def test_an_import_exports_its_source_ids_and_exact_texts_and_all_four_splits_load(
    client: TestClient, researcher: Actor, database_url: str, offline: Path, tmp_path: Path, task: str
) -> None:
    """Import (wide responses with ids and texts the policy would change) -> build -> export of
    train, dev, test and excluded in every format: each row's `source_id` and text are the
    file's, byte for byte; each response says its pass; the four files load together with the
    card's features (`load_dataset("json"|"csv"|"parquet", data_files=...)`), Parquet also
    without them, and the folder loads with no part of its card ignored."""
    response = client.post(
        "/api/v1/tasks",
        content=example_yaml(task, onboarding_quiz=None).encode("utf-8"),
        headers={**researcher.headers, "Content-Type": "application/yaml"},
    )
    assert response.status_code == 201, response.text
    items = _source_files(tmp_path, multi_label=task == "ethioemo-amharic")
    _import_cli(database_url, task, 1, tmp_path / "round1.jsonl", "--kind", "labelled")
    _import_cli(database_url, task, 2, tmp_path / "round2.jsonl", "--kind", "responses", "--annotator-columns", "a*")
    round_id = client.get(f"/api/v1/tasks/{task}/rounds", headers=researcher.headers).json()["data"][-1]["id"]
    built = client.post(
        f"/api/v1/rounds/{round_id}/build",
        json={"chance": False, "dev_test_min_votes": 1, "max_dev_test_share": 1.0, "seed": 3},
        headers=researcher.headers,
    )
    assert built.status_code == 201, built.text
    report_counts = built.json()["report"]["counts"]
    counts = report_counts["total"] | {"excluded": sum(report_counts["excluded"].values())}
    assert counts["excluded"] == 2 and min(counts["train"], counts["dev"], counts["test"]) > 0, report_counts
    splits = ("train", "dev", "test", "excluded")
    by_format: dict[str, list[dict[str, Any]]] = {}
    for file_format in FORMATS:
        out = tmp_path / file_format
        cli_export(database_url, task, out, file_format, ",".join(splits), number=2)
        files = {split: out / f"{task}-r2-{split}.{file_format}" for split in splits}
        with datasets_warnings() as warned:
            folder = datasets.load_dataset(str(out), cache_dir=str(offline / f"folder-{file_format}"))
            features = datasets.load_dataset_builder(str(out)).info.features
        assert warned == [], "the card validates: no part of it is ignored"
        assert isinstance(folder, datasets.DatasetDict) and len(folder["excluded"]) == 2
        assert features == features_of(file_format, task)
        data = load(file_format, files, offline / file_format, features)
        assert {split: len(data[split]) for split in splits} == {split: counts[split] for split in splits}
        rows = [decoded(file_format, row, task) for split in splits for row in data[split]]
        assert rows == [decoded(file_format, row, task) for split in ("train", "validation", "test", "excluded")
                        for row in folder[split]]  # fmt: skip
        if file_format == "parquet":
            plain = datasets.load_dataset(
                "parquet", data_files={s: str(p) for s, p in files.items()}, cache_dir=str(offline / "plain")
            )
            assert plain["excluded"].features == features
        by_format[file_format] = sorted(rows, key=lambda row: row["example_id"])
    assert by_format["parquet"] == by_format["jsonl"] == by_format["csv"]
    rows = by_format["parquet"]
    assert sorted((row["source_id"], row["text"]) for row in rows) == sorted(items)
    for row in rows:
        source_text = dict(items)[row["source_id"]]
        assert row["text"].encode("utf-8") == source_text.encode("utf-8")
        assert [response["annotation_pass"] for response in row["responses"]] == [0, 0, 0]
        assert (row["flags"] == ["duplicate_of_earlier_round"]) == (row["split"] == "excluded"), row["flags"]
    # The API's download is the same file as the command's.
    api = client.get(
        f"/api/v1/tasks/{task}/rounds/2/dataset", params={"split": "excluded", "format": "jsonl"},
        headers=researcher.headers,
    )  # fmt: skip
    assert api.content == (tmp_path / "jsonl" / f"{task}-r2-excluded.jsonl").read_bytes()
