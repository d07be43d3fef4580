"""Precision (issue 14): fp32, bf16, int8 and auto in the model server and offline prediction,
the precision check that auto obeys, and what an attempt records. A tiny random BERT stands in
for a real model: the tests check the wiring and the rules; bench/model_server.py and
bench/precision.py measure speed and fidelity on MiniLM and real tweets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dynaloop.cli import app as cli
from dynaloop.commands.common import PRECISION_CHOICES as CLI_CHOICES
from model_server.backends import ClassifyInput, load_backend
from model_server.config import ServerConfig
from model_server.directory import runtime
from model_server.directory.runtime import (
    PRECISION_CHECK_FILE,
    PRECISION_CHOICES,
    PrecisionCheck,
    PrecisionPlan,
    PrecisionResult,
    PrecisionUnavailable,
)
from rounds.models.errors import EvaluationError
from rounds.models.inference import LoadedClassifier, predict_probabilities
from rounds.models.init_model import init_model_dir
from rounds.models.precision_check import CheckTexts, check_precisions, read_check_texts
from services.db.models import Attempt
from tests.conftest import Actor, example_yaml, open_round, serve_model, table_counts
from tests.stub_model_server import ThreadedServer

LABELS = ["positive", "negative", "neutral"]
TEXTS = [
    "I loved every minute of it.",
    "The soup was cold and the bread was stale.",
    "It opens at nine.",
    "Not bad at all, honestly.",
    "Worst service I have had in years, and the waiter did not care.",
    "ok",
]
NATIVE_BF16 = runtime.native_bf16("cpu")
runner = CliRunner()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("precision") / "tiny"
    init_model_dir(directory, labels=LABELS, tiny=True, model_id="tiny-precision")
    return directory


def _agreeing_check(**results: float) -> PrecisionCheck:
    """A check record in which each named precision agreed with fp32 on the given share of 1,000 texts."""
    return PrecisionCheck(
        data="dev",
        texts=1000,
        results={
            "fp32": PrecisionResult(agreement=1, changed=0, max_probability_difference=0, accepted=True),
            **{
                precision: PrecisionResult(
                    agreement=share,
                    changed=round(1000 * (1 - share)),
                    max_probability_difference=0.01,
                    accepted=round(1000 * (1 - share)) <= 10,
                )
                for precision, share in results.items()
            },
        },
    )


# --- the runtime ---------------------------------------------------------------------------


def test_the_cli_offers_the_runtimes_precisions() -> None:
    assert CLI_CHOICES == PRECISION_CHOICES == ("fp32", "bf16", "int8", "auto")


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16 (AVX512-BF16 or AMX)")
@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_each_precision_predicts_what_fp32_predicts_within_its_rounding(model_dir: Path, precision: str) -> None:
    reference = load_backend(model_dir, precision="fp32").predict([ClassifyInput(text) for text in TEXTS])
    backend = load_backend(model_dir, precision=precision)
    outputs = backend.predict([ClassifyInput(text) for text in TEXTS])
    assert [output.precision for output in outputs] == [precision] * len(TEXTS)
    assert {o.precision for o in reference} == {"fp32"}
    for got, want in zip(outputs, reference, strict=True):
        assert set(got.probabilities) == set(LABELS)
        assert sum(got.probabilities.values()) == pytest.approx(1, abs=1e-4)
        for label in LABELS:
            assert got.probabilities[label] == pytest.approx(want.probabilities[label], abs=0.03)
    assert backend.precision_info()["mode"] == precision


def test_int8_handles_any_batch_size_and_length(model_dir: Path) -> None:
    """The exported graph keeps batch and sequence dynamic: a lone short text and a batch of long ones."""
    backend = load_backend(model_dir, precision="int8")
    lone = backend.predict([ClassifyInput("ok")])
    many = backend.predict([ClassifyInput(" ".join([text] * 6)) for text in TEXTS * 5])
    assert len(lone) == 1 and len(many) == 30
    assert {output.precision for output in lone + many} == {"int8"}


def test_int8_runs_on_the_team_size_of_the_thread_that_calls_it(model_dir: Path) -> None:
    """ONNX Runtime fixes a session's threads when it is made; the model server sizes torch's
    team per forward pass (model_server/threads.py), and int8 follows it with a session per team."""
    import torch

    backend = load_backend(model_dir, precision="int8")
    int8 = backend.precision.forwards["int8"]  # type: ignore[attr-defined]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = backend.predict([ClassifyInput(text) for text in TEXTS])
        torch.set_num_threads(2)
        two = backend.predict([ClassifyInput(text) for text in TEXTS])
    finally:
        torch.set_num_threads(before)
    assert {1, 2} <= set(int8._sessions)
    assert int8.session_for(1).get_session_options().intra_op_num_threads == 1
    assert int8.session_for(2).get_session_options().intra_op_num_threads == 2
    assert int8.session_for(1) is int8.session_for(1)  # made once
    for a, b in zip(one, two, strict=True):
        for label in LABELS:
            assert a.probabilities[label] == pytest.approx(b.probabilities[label], abs=1e-5)


def test_bf16_is_refused_on_a_cpu_that_would_emulate_it(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    with pytest.raises(PrecisionUnavailable, match="native bf16"):
        load_backend(model_dir, precision="bf16")
    # auto leaves it out and says why, and still serves.
    backend = load_backend(model_dir, precision="auto")
    notes = " ".join(backend.precision_info()["notes"])
    assert "bf16 left out" in notes and "native bf16" in notes


def test_int8_is_refused_without_onnx_runtime(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_onnxruntime(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "onnxruntime":
            raise ImportError("No module named 'onnxruntime'", name="onnxruntime")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnxruntime)
    with pytest.raises(PrecisionUnavailable, match="onnxruntime"):
        load_backend(model_dir, precision="int8")


def test_an_unknown_precision_is_refused(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        load_backend(model_dir, precision="fp16")


def test_auto_without_a_check_serves_fp32_and_says_why(model_dir: Path) -> None:
    backend = load_backend(model_dir, precision="auto")
    info = backend.precision_info()
    assert info["mode"] == "auto"
    assert set(info["by_batch_size"].values()) == {"fp32"}
    assert info["measured_seq_per_s"] == {}, "nothing to choose between: no calibration"
    assert any("no check on real text" in note and "check-precision" in note for note in info["notes"])


def test_auto_obeys_the_check_and_times_what_it_admits(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "checked"
    init_model_dir(directory, labels=LABELS, tiny=True, model_id="tiny-checked")
    # int8 changed 2% of the dev predictions: refused; bf16 (where native) changed 0.5%: admitted.
    _agreeing_check(bf16=0.995, int8=0.98).save(directory)
    backend = load_backend(directory, precision="auto")
    info = backend.precision_info()
    notes = " ".join(info["notes"])
    assert "int8 left out" in notes and "changed 20 of 1000 predictions (2.00%)" in notes and "limit is 1%" in notes
    assert "int8" not in info["by_batch_size"].values()
    if NATIVE_BF16:
        # Both were timed at every calibration size, and each size uses the faster one.
        assert set(info["measured_seq_per_s"]) == {"1", "4", "16", "64"}
        for size, rates in info["measured_seq_per_s"].items():
            assert set(rates) == {"fp32", "bf16"}
            assert info["by_batch_size"][size] == max(rates, key=rates.__getitem__)
    outputs = backend.predict([ClassifyInput(text) for text in TEXTS])
    assert {output.precision for output in outputs} <= set(info["by_batch_size"].values())


def test_a_fixed_precision_that_the_check_refused_is_served_with_a_warning(model_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "refused"
    init_model_dir(directory, labels=LABELS, tiny=True, model_id="tiny-refused")
    _agreeing_check(int8=0.9).save(directory)
    info = load_backend(directory, precision="int8").precision_info()
    assert info["mode"] == "int8"
    assert any("auto would refuse it" in note for note in info["notes"])


def test_the_plan_uses_the_nearest_measured_batch_size() -> None:
    plan = PrecisionPlan("auto", {}, {1: "int8", 4: "int8", 16: "bf16", 64: "bf16"})
    assert [plan.precision_for(n) for n in (1, 2, 3, 5, 8, 12, 16, 40, 64, 500)] == [
        "int8",  # 1
        "int8",  # 2: as near 1 as 4 (log scale); the larger wins
        "int8",  # 3
        "int8",  # 5
        "bf16",  # 8: as near 4 as 16; the larger wins
        "bf16",
        "bf16",
        "bf16",
        "bf16",
        "bf16",
    ]


def test_a_broken_check_record_is_a_clear_error(model_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "broken"
    init_model_dir(directory, labels=LABELS, tiny=True)
    (directory / PRECISION_CHECK_FILE).write_text('{"data": "dev", "texts": 0}', encoding="utf-8")
    expected = r"dynaloop_precision\.json is not valid \(texts: .*; results: Field required\); run `dynaloop model"
    with pytest.raises(ValueError, match=expected):
        load_backend(directory, precision="auto")


# --- offline prediction: evaluation and harvesting share the runtime ------------------------------


def test_offline_prediction_at_each_precision_matches_the_server(model_dir: Path) -> None:
    served = load_backend(model_dir, precision="int8").predict([ClassifyInput(text) for text in TEXTS])
    offline = predict_probabilities(model_dir, TEXTS, precision="int8")
    for row, output in zip(offline, served, strict=True):
        assert row.tolist() == pytest.approx([output.probabilities[label] for label in LABELS], abs=1e-5)
    fp32 = predict_probabilities(model_dir, TEXTS)
    assert np.abs(fp32 - offline).max() < 0.03


def test_offline_prediction_refuses_an_unavailable_precision_clearly(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "cpu_flags", lambda: frozenset())
    with pytest.raises(EvaluationError, match="cannot predict at bf16: bf16 needs native bf16"):
        LoadedClassifier.load(model_dir, precision="bf16")


def test_evaluation_records_its_precision(model_dir: Path, tmp_path: Path) -> None:
    from rounds.models.datasets import LabelledSet
    from rounds.models.evaluate import evaluate_model
    from rounds.models.evaluation_report import write_evaluation

    labelled = LabelledSet(
        name="dev",
        labels=LABELS,
        multi_label=False,
        texts=TEXTS,
        y=np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1, 2]],
    )
    evaluation = evaluate_model(model_dir, [labelled], precision="int8")
    assert evaluation.precision is not None and evaluation.precision["mode"] == "int8"
    write_evaluation(evaluation, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "evaluation.json").read_text())["precision"]["mode"] == "int8"
    assert "precision int8" in (tmp_path / "out" / "evaluation.md").read_text()


# --- the precision check --------------------------------------------------------------------


def test_the_check_compares_each_precision_with_fp32(model_dir: Path) -> None:
    gold = [["positive"], ["negative"], ["neutral"], ["positive"], ["negative"], ["neutral"]]
    check = check_precisions(model_dir, CheckTexts("dev", TEXTS * 4, gold=gold * 4))
    assert check.texts == 24 and check.data == "dev"
    assert check.results["fp32"].agreement == 1 and check.results["fp32"].macro_f1 is not None
    expected = {"fp32", "int8"} | ({"bf16"} if NATIVE_BF16 else set())
    assert set(check.results) == expected
    for precision, result in check.results.items():
        assert result.agreement == pytest.approx(1 - result.changed / 24)
        assert result.accepted == (result.changed <= 0.24)
        assert result.macro_f1 is not None and result.macro_f1_vs_fp32_points == pytest.approx(
            100 * (result.macro_f1 - check.results["fp32"].macro_f1)  # type: ignore[operator]
        )
        assert (check.admits(precision) is None) == result.accepted
    if not NATIVE_BF16:
        assert "native bf16" in check.unavailable["bf16"]


def test_the_check_refuses_gold_labels_the_model_does_not_have(model_dir: Path) -> None:
    with pytest.raises(EvaluationError, match="gold labels \\['sarcastic'\\] are not among"):
        check_precisions(model_dir, CheckTexts("dev", TEXTS[:1], gold=[["sarcastic"]]))


def test_check_texts_from_files(tmp_path: Path) -> None:
    lines = tmp_path / "tweets.txt"
    lines.write_text("first tweet\n\n  second tweet  \nthird\n", encoding="utf-8")
    texts = read_check_texts(lines)
    assert texts.texts == ["first tweet", "second tweet", "third"] and texts.gold is None
    sampled = read_check_texts(lines, max_texts=2)
    assert len(sampled.texts) == 2 and "(2 of 3 texts, seed 0)" in sampled.name
    table = tmp_path / "dev.csv"
    table.write_text("text,label\nI loved it,positive\nawful,negative\n", encoding="utf-8")
    assert read_check_texts(table).gold == [["positive"], ["negative"]]
    no_labels = tmp_path / "dev.jsonl"
    no_labels.write_text('{"sentence": "I loved it"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="has no column 'text'"):
        read_check_texts(no_labels)
    assert read_check_texts(no_labels, text_column="sentence").gold is None


def test_check_precision_command_writes_what_auto_reads(model_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "cli"
    init_model_dir(directory, labels=LABELS, tiny=True, model_id="tiny-cli")
    data = tmp_path / "dev.csv"
    data.write_text("text,label\n" + "".join(f'"{t}",{LABELS[i % 3]}\n' for i, t in enumerate(TEXTS)), encoding="utf-8")
    result = runner.invoke(cli, ["model", "check-precision", "--model", str(directory), "--data", str(data)])
    assert result.exit_code == 0, result.output
    assert "written to" in result.output and "int8" in result.output
    recorded = PrecisionCheck.load(directory)
    assert recorded is not None and recorded.texts == len(TEXTS) and "int8" in recorded.results


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        ("", "empty.txt", "has no texts to check"),
        ("text,label\nhello,sarcastic\n", "alien.csv", "are not among the model's labels"),
        ("{not json\n", "broken.jsonl", "could not be read as jsonl"),
        ("x" * 20_001 + "\n", "huge.txt", "longer than 20000 characters"),
    ],
)
def test_check_precision_command_rejects_bad_data_and_writes_nothing(
    model_dir: Path, tmp_path: Path, content: str, name: str, message: str
) -> None:
    data = tmp_path / name
    data.write_text(content, encoding="utf-8")
    result = runner.invoke(cli, ["model", "check-precision", "--model", str(model_dir), "--data", str(data)])
    assert result.exit_code != 0 and message in " ".join(result.output.split()), result.output
    assert not (model_dir / PRECISION_CHECK_FILE).exists()


def test_training_records_the_check_on_its_dev_set(tmp_path: Path) -> None:
    from rounds.models.datasets import LabelledSet
    from rounds.models.usecases import _check_precision_on_dev

    directory = tmp_path / "trained"
    init_model_dir(directory, labels=LABELS, tiny=True)
    dev = LabelledSet(
        name="round 1 dev", labels=LABELS, multi_label=False, texts=TEXTS, y=np.eye(3, dtype=np.float32)[[0, 1, 2] * 2]
    )
    check = _check_precision_on_dev(directory, dev)
    assert check is not None and check.data == "round 1 dev" and check.texts == len(TEXTS)
    assert PrecisionCheck.load(directory) == check
    assert _check_precision_on_dev(directory, None) is None


# --- the model server and the attempt ---------------------------------------------------------


@pytest.fixture(scope="module")
def int8_server(model_dir: Path) -> Any:
    server = serve_model(ServerConfig(model_dir=model_dir, precision="int8", admin_token="admin-secret-123"))
    yield server
    server.stop()


def test_the_server_says_its_precision_in_info_and_every_prediction(int8_server: ThreadedServer) -> None:
    info = httpx.get(f"{int8_server.url}/info").json()
    assert info["precision"]["mode"] == "int8"
    body = httpx.post(f"{int8_server.url}/predict", json={"texts": TEXTS[:3]}).json()
    assert body["model"]["precision"] == "int8"
    assert [prediction["precision"] for prediction in body["predictions"]] == ["int8"] * 3


def test_a_reload_may_change_the_precision_and_refuses_an_unknown_one(
    int8_server: ThreadedServer, model_dir: Path
) -> None:
    headers = {"Authorization": "Bearer admin-secret-123"}
    refused = httpx.post(
        f"{int8_server.url}/admin/reload", json={"model_dir": str(model_dir), "precision": "fp8"}, headers=headers
    )
    assert refused.status_code == 422
    assert httpx.get(f"{int8_server.url}/info").json()["precision"]["mode"] == "int8", "unchanged"
    reloaded = httpx.post(
        f"{int8_server.url}/admin/reload",
        json={"model_dir": str(model_dir), "precision": "fp32"},
        headers=headers,
        timeout=60,
    )
    assert reloaded.status_code == 200, reloaded.text
    assert reloaded.json()["precision"]["mode"] == "fp32"
    body = httpx.post(f"{int8_server.url}/predict", json={"texts": TEXTS[:1]}).json()
    assert body["model"]["precision"] == "fp32" and body["predictions"][0]["precision"] == "fp32"
    back = httpx.post(
        f"{int8_server.url}/admin/reload", json={"model_dir": str(model_dir)}, headers=headers, timeout=60
    )
    assert back.status_code == 200 and back.json()["precision"]["mode"] == "fp32", "a reload keeps the precision"


@pytest.mark.slow
def test_an_attempt_records_the_precision_it_was_scored_at(
    client: TestClient, app: Any, researcher: Actor, writer: Actor, model_dir: Path
) -> None:
    server = serve_model(ServerConfig(model_dir=model_dir, precision="int8"))
    try:
        round_ = open_round(
            client,
            researcher,
            example_yaml("dynasent-r2", onboarding_quiz=None),
            server.url,
            ["The soup was fine and the bread was fresh."],
        )
        assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()
        attempt = client.post(
            f"/api/v1/assignments/{assignment['id']}/attempts",
            json={"text": "The soup was cold and the bread was stale."},
            headers=writer.headers,
        )
        assert attempt.status_code == 201, attempt.text
        assert attempt.json()["model_precision"] == "int8"
        with app.state.sessionmaker() as session:
            assert session.get(Attempt, attempt.json()["id"]).model_precision == "int8"
        assert table_counts(app)["attempts"] == 1
    finally:
        server.stop()
