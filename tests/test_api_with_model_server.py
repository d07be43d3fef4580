"""The backend against the real model server (tiny random BERT) over real HTTP: attempts are
scored by the served model, target spans reach a sentence-pair model, Inspect is proxied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from model_server.config import ServerConfig
from rounds.models.init_model import init_model_dir
from tests.conftest import Actor, example_yaml, open_round, serve_model
from tests.stub_model_server import ThreadedServer


def _serve(model_dir: Path) -> ThreadedServer:
    return serve_model(ServerConfig(model_dir=model_dir))


@pytest.fixture(scope="module")
def sentiment_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("m") / "sentiment"
    init_model_dir(directory, labels=["positive", "negative", "neutral"], tiny=True, model_id="tiny-sentiment")
    server = _serve(directory)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pair_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("m") / "pair"
    init_model_dir(
        directory, labels=["negative", "neutral", "positive"], input_format="text_pair", tiny=True, model_id="tiny-tsc"
    )
    server = _serve(directory)
    yield server
    server.stop()


def test_attempts_are_scored_by_the_served_model(
    client: TestClient, researcher: Actor, writer: Actor, sentiment_server
) -> None:
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        sentiment_server.url,
        ["The soup was fine and the bread was fresh."],
    )
    assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()
    text = "The soup was cold and the bread was stale."
    attempt = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts", json={"text": text}, headers=writer.headers
    ).json()
    direct = httpx.post(f"{sentiment_server.url}/predict", json={"texts": [text]}).json()["predictions"][0]
    assert attempt["status"] == "scored" and attempt["model_id"] == "tiny-sentiment"
    assert attempt["prediction"] == direct["labels"]
    for label, probability in direct["probabilities"].items():
        assert attempt["probabilities"][label] == pytest.approx(probability, abs=1e-6)
    assert attempt["fooled"] == (direct["labels"] != assignment["target_label"])

    inspected = client.post(
        f"/api/v1/assignments/{assignment['id']}/inspect", json={"text": text}, headers=writer.headers
    )
    assert inspected.status_code == 200, inspected.text
    body = inspected.json()
    assert body["label"] == assignment["target_label"][0]
    assert [t["token"] for t in body["tokens"]][:3] == ["[CLS]", "the", "soup"]
    state = client.get(f"/api/v1/assignments/{assignment['id']}", headers=writer.headers).json()
    assert state["tries_used"] == 1, "inspect uses no try"


def test_target_span_reaches_the_sentence_pair_model(
    client: TestClient, researcher: Actor, writer: Actor, pair_server
) -> None:
    round_ = open_round(
        client,
        researcher,
        example_yaml("mad-tsc", onboarding_quiz=None),
        pair_server.url,
        ["The minister met the mayor in Lyon on Monday."],
    )
    assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()
    text = "The minister praised the mayor in Lyon on Monday."
    scores = {}
    for span in ([4, 12], [25, 30]):
        attempt = client.post(
            f"/api/v1/assignments/{assignment['id']}/attempts",
            json={"text": text, "target_span": span},
            headers=writer.headers,
        ).json()
        assert attempt["status"] == "scored", attempt
        direct = httpx.post(
            f"{pair_server.url}/predict", json={"texts": [text], "targets": [text[span[0] : span[1]]]}
        ).json()["predictions"][0]
        assert attempt["probabilities"] == pytest.approx(direct["probabilities"], abs=1e-6)
        scores[tuple(span)] = attempt["probabilities"]
    assert scores[(4, 12)] != scores[(25, 30)], "the target is part of the model's input"
