"""A DynaSent-style round, simulated through the real database and API (writers, five
validators per example, an unqualified validator; the ``built`` fixture of tests/built_round.py), built
and exported."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from statsmodels.stats.inter_rater import fleiss_kappa

from rounds.build.report import PLOTS_NOT_DRAWN, report_json
from rounds.build.report_schema import RoundReport
from tests.built_round import LABELS, BuiltRound, simulate_built_round, write_and_label, write_example
from tests.conftest import Actor, MakeUser, empty_tables, example_yaml, free_port, label_example, open_round
from tests.row_snapshots import read_rows, restore_rows
from tests.stub_model_server import ThreadedServer, create_stub_app

# Each test round's report JSON as the untyped report code wrote it before the report became
# typed (rounds/build/report_schema.py): builds store it, the API serves it and report.md renders
# it, so the typed report must write exactly the same. (Since the API answers with the builder's
# own models, its agreement section keeps the stored order: the split kappas after the counts.)
REPORTS = Path(__file__).parent / "data" / "round_reports"


def _comparable(report: dict[str, Any]) -> str:
    """The report as JSON text, key order included, with its clock times and the edit
    distances masked (a writer is handed a prompt drawn at random, so those vary by run)."""
    masked = json.loads(json.dumps(report))
    masked["built_at"] = "<built_at>"
    for summary in masked["conditions"].values():
        for key in ("edit_distance_mean", "edit_distance_median"):
            assert summary[key] is None or 0 <= summary[key] <= 1
            summary[key] = summary[key] if summary[key] is None else "<random prompt>"
    masked["datasheet"]["collected"] = {
        key: "<time>" if value else value for key, value in masked["datasheet"]["collected"].items()
    }
    return json.dumps(masked, indent=1, ensure_ascii=False)


def assert_report_unchanged(report: dict[str, Any], name: str) -> None:
    if os.environ.get("DYNALOOP_UPDATE_REPORT_SNAPSHOTS"):  # deliberate report changes: review the diff
        (REPORTS / f"{name}.json").write_text(_comparable(report) + "\n", encoding="utf-8")
    expected = (REPORTS / f"{name}.json").read_text(encoding="utf-8").rstrip("\n")
    assert _comparable(report) == expected


def test_build_report_figures(built: BuiltRound, client: TestClient) -> None:
    report = built["build"]["report"]
    counts = report["counts"]
    # 18 eligible examples: c = 1 per cell -> 9 dev and 9 test; the rest (and the extras) train.
    assert counts["total"] == {"train": 3, "dev": 9, "test": 9, "dist_train": 3}
    for label in LABELS:
        assert counts["rows"][label]["dev"] == 3 and counts["rows"][label]["test"] == 3
    assert counts["rows"]["mixed"]["train"] == 1 and counts["rows"]["no majority"]["train"] == 1
    assert counts["rows"]["negative"]["train"] == 1  # the 3-of-5 example
    for split in ("dev", "test"):
        assert report["splits"]["assessment"][split]["model_macro_f1"] == pytest.approx(1 / 3, abs=1e-4)
        assert report["splits"]["assessment"][split]["examples"] == 9
    assert report["splits"]["at_chance"] is True
    # Fleiss' kappa over every example's five counted labels, computed independently.
    table = []
    for _, labels in built["plan"]:
        table.append([labels.count(label) for label in [*LABELS, "mixed"]])
    assert report["agreement"]["fleiss_kappa"] == pytest.approx(fleiss_kappa(np.array(table)), abs=1e-4)
    # Human F1: every dev example has 4 of 5 for gold, so each synthetic annotator is right 4/5.
    dev = report["human_f1"]["dev"]
    assert set(dev) == {*LABELS, "macro avg"}
    assert 0.5 < dev["macro avg"]["f1"] <= 1.0
    assert report["fooling"]["examples"] == 21 and report["fooling"]["fooled_examples"] == 12  # gold != predicted
    assert report["workers"]["validators"] == 5, "the unqualified validator's labels never count"
    assert report["datasheet"]["licence"] == "CC BY 4.0"
    assert_report_unchanged(report, "dynasent-r2")
    markdown = client.get(
        "/api/v1/tasks/dynasent-r2/rounds/1/report?format=markdown", headers=built["researcher"].headers
    )
    assert markdown.status_code == 200 and "| positive |" in markdown.text and "Datasheet" in markdown.text


def test_export_formats_etag_and_roles(built: BuiltRound, client: TestClient, make_user: MakeUser) -> None:
    reader = make_user("robot", "client")
    url = "/api/v1/tasks/dynasent-r2/rounds/1/dataset"
    response = client.get(url, params={"split": "dev", "format": "jsonl"}, headers=reader.headers)
    assert response.status_code == 200, response.text
    rows = [json.loads(line) for line in response.text.splitlines()]
    assert len(rows) == 9 and {r["split"] for r in rows} == {"dev"}
    first = rows[0]
    assert len(first["responses"]) == 5 and all(r["worker"].startswith("w") for r in first["responses"])
    assert first["gold_label"][0] in LABELS and first["gold_votes"] == 4
    assert abs(sum(first["distributional_label"].values()) - 1) < 1e-6
    assert "spam" not in response.text and "val0" not in response.text, "worker ids are pseudonymous"
    tag = response.headers["ETag"]
    assert (
        client.get(
            url, params={"split": "dev", "format": "jsonl"}, headers={**reader.headers, "If-None-Match": tag}
        ).status_code
        == 304
    )
    csv_response = client.get(url, params={"split": "all", "format": "csv"}, headers=reader.headers)
    frame = pd.read_csv(io.StringIO(csv_response.text))
    assert len(frame) == 21 and sorted(frame["split"].unique()) == ["dev", "test", "train"]
    parquet = client.get(url, params={"split": "train", "format": "parquet"}, headers=reader.headers)
    table = pq.read_table(io.BytesIO(parquet.content))
    assert table.num_rows == 3 and "distributional_label" in table.column_names
    mixed = next(r for r in table.to_pylist() if r["gold_label"] == ["mixed"])
    assert dict(mixed["distributional_label"]) == pytest.approx({"positive": 0.5, "negative": 0.5, "neutral": 0.0})
    # A writer cannot read datasets; unknown split/format are clear 422s.
    denied = client.get(url, headers=built["writer"].headers)
    assert denied.status_code == 403 and "client or researcher role" in denied.json()["error"]["message"]
    bad = client.get(url, params={"split": "validation"}, headers=reader.headers)
    assert bad.status_code == 422 and "unknown split" in bad.json()["error"]["message"]


@pytest.mark.both_databases
def test_building_an_open_round_is_refused(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> None:
    round_ = open_round(
        client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, ["a b c d"]
    )
    response = client.post(f"/api/v1/rounds/{round_['id']}/build", json={}, headers=researcher.headers)
    assert response.status_code == 409 and "close it before building" in response.json()["error"]["message"]
    missing = client.get("/api/v1/tasks/dynasent-r2/rounds/1/dataset", headers=researcher.headers)
    assert missing.status_code == 404 and "has not been built yet" in missing.json()["error"]["message"]


def test_multi_label_round_builds_with_per_label_stratification(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_multi_label_model: ThreadedServer
) -> None:
    prompts = [f"Prompt {i}: ስለ ምግቡ አስተያየት" for i in range(12)]
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
    plan = []
    for i in range(2):
        plan.append((["joy"], f"a joy filled day {i} ደስታ", None, [["joy"], ["joy"], ["joy", "surprise"]]))
        plan.append((["anger"], f"an anger filled day {i} ቁጣ", None, [["anger"], ["anger", "disgust"], ["anger"]]))
    plan.append((["fear"], "a fear filled day ፍርሃት", None, [["fear"], ["sadness"], ["surprise"]]))  # no gold: re-queued
    write_and_label(client, writer, validators, round_["id"], plan)
    client.post(f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    response = client.post(f"/api/v1/rounds/{round_['id']}/build", json={"seed": 1}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    report = response.json()["report"]
    assert report["splits"]["chance"] is False
    # Four examples with gold: one each for dev and test (rounds.build.multilabel_splits).
    assert report["counts"]["total"]["dev"] == 1 and report["counts"]["total"]["test"] == 1
    assert report["agreement"]["mean_jaccard"] is not None
    # The disagreement is re-queued, but the round's three validators have all labelled it.
    assert report["counts"]["excluded"] == {"awaiting_reannotation": 1}
    rows = [
        json.loads(line)
        for line in client.get(
            "/api/v1/tasks/ethioemo-amharic/rounds/1/dataset", params={"split": "all"}, headers=researcher.headers
        ).text.splitlines()
    ]
    by_text = {r["text"]: r for r in rows}
    assert by_text["a joy filled day 0 ደስታ"]["gold_label"] == ["joy"]
    assert by_text["a joy filled day 0 ደስታ"]["distributional_label"]["joy"] == 1.0
    assert by_text["a joy filled day 0 ደስታ"]["distributional_label"]["surprise"] == pytest.approx(1 / 3, abs=1e-3)
    assert by_text["a fear filled day ፍርሃት"]["gold_label"] is None
    assert by_text["a fear filled day ፍርሃት"]["split"] == "excluded"
    assert_report_unchanged(report, "ethioemo-amharic")


def test_target_dependent_round_builds_with_consolidation(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
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
    # One sentence with the same two targets, a different day each time: a text with the same
    # target twice would be a duplicate, refused (docs/design.md "Duplicates").
    days = iter(["Monday", "Friday", "Sunday", "Monday.", "Friday.", "Sunday.", "Monday!", "Friday!", "Sunday!"])

    def text() -> str:
        day = next(days)
        return f"The minister met the mayor in the old town hall {'last' if '.' in day else 'on'} {day.strip('.!')}" + (
            " again." if "!" in day else "."
        )

    plan = []
    for label, weak in (("positive", "weakly_positive"), ("negative", "weakly_negative"), ("neutral", "neutral")):
        plan.append((label, text(), [4, 12], [label, weak, label]))  # unanimous after collapsing
        plan.append((label, text(), [20, 25], [label, label, label]))
    plan.append(("negative", text(), [20, 25], ["negative", "negative", "neutral"]))  # neighbouring majority
    plan.append(("neutral", text(), [4, 12], ["positive", "positive", "negative"]))  # non-neighbouring: dropped
    plan.append(("neutral", text(), [20, 25], ["neutral", "unknown", "neutral"]))  # unknown vote: dropped
    write_and_label(client, writer, validators, round_["id"], plan)
    client.post(f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    response = client.post(
        f"/api/v1/rounds/{round_['id']}/build",
        # Two examples per class: the relaxed policy's class-balance guard (half to dev+test)
        # would refuse them, so this build lets dev+test take every eligible example.
        json={"chance": False, "dev_test_min_votes": 3, "max_dev_test_share": 1.0},
        headers=researcher.headers,
    )
    assert response.status_code == 201, response.text
    report = response.json()["report"]
    assert report["counts"]["excluded"].get("non_neighbouring_vote") == 1
    assert report["counts"]["excluded"].get("unknown_vote") == 1
    assert "madtsc_kappas" in report["agreement"]
    assert report["counts"]["total"]["dev"] == 3 and report["counts"]["total"]["test"] == 3
    assert report["counts"]["total"]["train"] == 1  # the neighbouring majority (2 of 3 votes)
    assert_report_unchanged(report, "mad-tsc")


@pytest.fixture(scope="module")
def stub_sarcasm_model() -> Iterator[ThreadedServer]:
    server = ThreadedServer(create_stub_app(["sarcastic", "not_sarcastic"]), free_port()).start()
    yield server
    server.stop()


def test_intended_sarcasm_round_compares_intended_and_perceived_labels(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_sarcasm_model: ThreadedServer
) -> None:
    labels = ["sarcastic", "not_sarcastic"]
    prompts = [f"Prompt {i}: the bus was late again this morning." for i in range(16)]
    round_ = open_round(
        client,
        researcher,
        example_yaml("isarcasm", onboarding_quiz=None),
        stub_sarcasm_model.url,
        prompts,
        target_label_mode="writer_choice",
    )
    writer = make_user("sara", "writer")
    validators = [make_user(f"sv{i}", "validator") for i in range(3)]
    position = 0
    # Per (perceived, predicted) cell: one post meant as perceived and one meant the other way.
    for perceived in labels:
        for predicted in labels:
            for intended in labels:
                word = "sarcastic" if predicted == "sarcastic" else "plain"
                assignment = client.post(
                    f"/api/v1/rounds/{round_['id']}/assignments",
                    json={"target_label": intended},
                    headers=writer.headers,
                ).json()
                attempt = client.post(
                    f"/api/v1/assignments/{assignment['id']}/attempts",
                    json={"text": f"Post {position}: what a {word} way to start the day"},
                    headers=writer.headers,
                ).json()
                assert attempt["status"] == "scored", attempt
                if attempt["fooled"]:
                    client.post(
                        f"/api/v1/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers
                    )
                extras: dict[str, Any] = {"intended_label": intended}
                if intended == "sarcastic":
                    extras |= {"explanation": "The day started badly.", "rephrase": "The day started badly."}
                example = client.post(
                    f"/api/v1/assignments/{assignment['id']}/example",
                    json={"attempt_id": attempt["id"], "extras": extras},
                    headers=writer.headers,
                )
                assert example.status_code == 201, example.text
                other = next(label for label in labels if label != perceived)
                votes = [perceived, perceived, other]
                shift = position % 3
                for validator, label in zip(validators, votes[shift:] + votes[:shift], strict=True):
                    response = label_example(client, validator, example.json()["id"], label)
                    assert response.status_code == 201, response.text
                position += 1
    client.post(f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers)
    response = client.post(f"/api/v1/rounds/{round_['id']}/build", json={"seed": 3}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    report = response.json()["report"]
    comparison = report["intended_vs_perceived"]
    assert comparison["n_examples"] == 8 and comparison["n_without_perceived"] == 0
    assert comparison["confusion"] == {
        "sarcastic": {"sarcastic": 2, "not_sarcastic": 2},
        "not_sarcastic": {"sarcastic": 2, "not_sarcastic": 2},
    }
    assert comparison["f1"] == pytest.approx(0.5)
    assert_report_unchanged(report, "isarcasm")


@pytest.mark.both_databases
def test_cli_build_writes_report_and_plots_and_exports(built: BuiltRound, database_url: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    runner = CliRunner()
    out = tmp_path / "report"
    result = runner.invoke(
        cli,
        [
            "round",
            "build",
            "--task",
            "dynasent-r2",
            "--round",
            "1",
            "--seed",
            "7",
            "--out",
            str(out),
            "--database-url",
            database_url,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "dev 9, test 9" in result.output
    for name in ("report.md", "report.json"):
        assert (out / name).stat().st_size > 0, name
    if find_spec("matplotlib") is None:
        # A base install without the `plots` extra (.ci/base_install): the report says so, no PNG.
        assert (out / "report.md").read_text(encoding="utf-8").endswith(PLOTS_NOT_DRAWN)
        assert not list(out.glob("*.png"))
    else:
        for name in (
            "edit_distance.png",
            "length.png",
            "vocabulary.png",
            "worker_agreement.png",
            "model_vs_majority.png",
        ):
            assert (out / name).stat().st_size > 0, name
        assert (out / "edit_distance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "report.json").read_text(encoding="utf-8")
    report = json.loads(text)
    # One schema: report.json is RoundReport's stored JSON; read back, it is written again byte for byte.
    assert report_json(RoundReport.model_validate_json(text).to_dict()) == text
    # The same seed gives the same splits as the API's build.
    assert report["counts"] == built["build"]["report"]["counts"]
    data = tmp_path / "data"
    result = runner.invoke(
        cli,
        [
            "round",
            "export",
            "--task",
            "dynasent-r2",
            "--round",
            "1",
            "--out",
            str(data),
            "--database-url",
            database_url,
        ],
    )
    assert result.exit_code == 0, result.output
    tables = {split: pq.read_table(data / f"dynasent-r2-r1-{split}.parquet") for split in ("train", "dev", "test")}
    assert {split: t.num_rows for split, t in tables.items()} == {"train": 3, "dev": 9, "test": 9}
    # Bad options: one line, exit code 1, nothing written.
    refused = runner.invoke(
        cli,
        [
            "round",
            "export",
            "--task",
            "dynasent-r2",
            "--round",
            "1",
            "--out",
            str(tmp_path / "none"),
            "--splits",
            "train,validation",
            "--database-url",
            database_url,
        ],
    )
    assert refused.exit_code == 1 and "unknown split 'validation'" in refused.output
    assert not (tmp_path / "none").exists(), "a refused export writes no file"
    refused = runner.invoke(
        cli,
        [
            "round",
            "build",
            "--task",
            "dynasent-r2",
            "--round",
            "1",
            "--model-based",
            "vote",
            "--database-url",
            database_url,
        ],
    )
    assert refused.exit_code == 1 and "invalid build settings: model_based" in refused.output
    assert "Traceback" not in refused.output


@pytest.mark.both_databases
def test_dataset_download_names_the_newest_build(app: FastAPI, built: BuiltRound) -> None:
    """rounds.build.usecases.dataset_download: what the API's dataset route streams."""
    from rounds.build.usecases import dataset_download
    from services.db.engine import session_scope
    from services.domain.tasks import get_task
    from services.errors import Invalid, NotFound

    with session_scope(app.state.sessionmaker) as session:
        download = dataset_download(session, get_task(session, "dynasent-r2"), 1, "dev", "csv")
        assert download.build_id == built["build"]["build_id"] and download.media_type == "text/csv"
        assert download.filename == "dynasent-r2-r1-dev.csv" and download.etag.startswith('"')
        with pytest.raises(Invalid, match="unknown format 'xml'"):
            dataset_download(session, get_task(session, "dynasent-r2"), 1, "dev", "xml")
        with pytest.raises(NotFound):
            dataset_download(session, get_task(session, "dynasent-r2"), 2, "dev", "csv")


# Columns a copy may not reproduce: when a row was written, and the tokens' own secrets.
_UNSTABLE = {"created_at", "updated_at", "last_used_at", "token_hash", "prefix"}


def _stable(rows: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [{k: v for k, v in row.items() if k not in _UNSTABLE and not k.endswith("_at")} for row in table_rows]
        for name, table_rows in rows.items()
        if name not in ("api_tokens", "audit_log")
    }


@pytest.mark.both_databases
def test_a_restored_built_round_is_the_round_simulated_anew(
    app: FastAPI, client: TestClient, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    """The ``built`` fixture simulates its round once and gives later tests a copy
    (tests/row_snapshots.py): the copy holds the same rows with the same ids, this test's researcher
    keeps a working token, and the next row of every table takes the next id."""
    first_researcher = make_user("rita", "researcher")
    result = simulate_built_round(client, first_researcher, make_user, stub_model)
    simulated = read_rows(app)

    empty_tables(app.state.settings.resolved_database_url)
    researcher = make_user("rita", "researcher")
    outsider = make_user("olga", "validator")  # a user the snapshot does not hold
    restore_rows(app, simulated, read_rows(app))
    restored = read_rows(app)

    assert _stable(restored)["users"][:-1] == _stable(simulated)["users"]
    assert _stable(restored) | {"users": []} == _stable(simulated) | {"users": []}
    for actor in (researcher, result["writer"], outsider):
        assert client.get("/api/v1/me", headers=actor.headers).status_code == 200, actor.username
    report = client.get("/api/v1/tasks/dynasent-r2/rounds/1/report", headers=researcher.headers)
    assert report.status_code == 200 and report.json()["build_id"] == result["build"]["build_id"], report.text
    largest = max(row["id"] for row in restored["users"])
    assert make_user("next", "writer") and read_rows(app)["users"][-1]["id"] == largest + 1
    # A second round written after the copy: its task, round, assignment, attempt and example take
    # the next ids (PostgreSQL's sequences were moved past the copied rows).
    second = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None).replace("name: dynasent-r2", "name: second", 1),
        stub_model.url,
        ["A prompt."],
        target_label_mode="writer_choice",
    )
    example = write_example(client, make_user("wes", "writer"), second["id"], "positive", "A great one.")
    after = read_rows(app)
    for table in ("tasks", "rounds", "assignments", "attempts", "examples"):
        assert after[table][-1]["id"] == max(row["id"] for row in restored[table]) + 1, table
    assert example["id"] == after["examples"][-1]["id"]
