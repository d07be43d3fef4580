"""A real HTTP model server for the backend's tests, speaking the model-server contract.

It classifies with transparent keyword rules so tests can write sentences that do or do not
fool it, and its behaviour can be switched over HTTP (``POST /admin/mode``) to fail, hang,
answer garbage or predict labels the task does not have. Run it alone with
``python -m tests.stub_model_server --port 8001 --labels positive,negative,neutral``.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

POSITIVE_WORDS = {"great", "love", "loved", "best", "wonderful", "excellent", "amazing", "delicious"}
NEGATIVE_WORDS = {"bad", "terrible", "worst", "rude", "awful", "cold", "dirty", "horrible"}


class PredictRequest(BaseModel):
    texts: list[str]
    targets: list[str | None] | None = None


class ModeRequest(BaseModel):
    mode: str  # normal | fail | slow | garbage | alien | error | precision (a hostile `precision` string)
    delay_s: float = 0.0
    status: int = 500  # mode `error`: answer this status ...
    body: str = ""  # ... with this text


def classify(text: str, labels: list[str], multi_label: bool) -> list[str]:
    words = {w.strip(".,!?;:'\"").lower() for w in text.split()}
    if multi_label:
        chosen = [label for label in labels if label in words]
        return chosen or (["neutral"] if "neutral" in labels else labels[:1])
    if "positive" in labels and words & POSITIVE_WORDS:
        return ["positive"]
    if "negative" in labels and words & NEGATIVE_WORDS:
        return ["negative"]
    if "neutral" in labels:
        return ["neutral"]
    for label in labels:  # binary tasks: a label named in the text, else the second label
        if label in words:
            return [label]
    return [labels[-1]]


def create_stub_app(labels: list[str], multi_label: bool = False, model_id: str = "stub-model") -> FastAPI:
    app = FastAPI()
    state: dict[str, Any] = {"mode": "normal", "delay_s": 0.0, "calls": 0, "targets": [], "status": 500, "body": ""}
    lock = threading.Lock()
    app.state.stub = state

    @app.get("/info")
    def info() -> dict[str, Any]:
        return {
            "model_id": model_id,
            "version": "1",
            "labels": labels,
            "family": "multi_label" if multi_label else "single_label",
        }

    def error_answer() -> PlainTextResponse | None:
        """Mode `error`: the status and text set with /admin/mode (a model server's own error page)."""
        if state["mode"] != "error":
            return None
        return PlainTextResponse(state["body"], status_code=state["status"])

    @app.post("/predict", response_model=None)
    def predict(body: PredictRequest) -> dict[str, Any] | PlainTextResponse:
        with lock:
            state["calls"] += 1
            state["targets"].append(body.targets)
            mode, delay = state["mode"], state["delay_s"]
        if (error := error_answer()) is not None:
            return error
        if mode == "fail":
            raise HTTPException(500, "stub model failure")
        if mode == "slow":
            time.sleep(delay)
        if mode == "garbage":
            return {"unexpected": True}
        predictions = []
        for text in body.texts:
            predicted = ["alien_label"] if mode == "alien" else classify(text, labels, multi_label)
            share = 1.0 / len(predicted)
            probabilities = {
                label: (0.9 * share if label in predicted else 0.1 / max(1, len(labels) - len(predicted)))
                for label in labels
            }
            predictions.append(
                {"label": predicted[0], "labels": predicted, "probabilities": probabilities, "truncated": False}
            )
        if mode == "precision":
            return {
                "model": {"id": model_id, "version": "1", "precision": "<img src=x onerror=alert(1)>"},
                "predictions": predictions,
            }
        return {"model": {"id": model_id, "version": "1"}, "predictions": predictions}

    @app.post("/admin/mode")
    def set_mode(body: ModeRequest) -> dict[str, Any]:
        with lock:
            state["mode"], state["delay_s"] = body.mode, body.delay_s
            state["status"], state["body"] = body.status, body.body
        return {"mode": body.mode}

    @app.get("/admin/calls")
    def calls() -> dict[str, Any]:
        return {"calls": state["calls"], "targets": state["targets"]}

    return app


class ThreadedServer:
    """Run an ASGI app with uvicorn on a real port in a background thread."""

    def __init__(self, app: Any, port: int) -> None:
        self.config = uvicorn.Config(
            # As `dynaloop api` runs: the app, not uvicorn, reads forwarded headers (DYNALOOP_TRUSTED_PROXIES).
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            proxy_headers=False,
        )
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--labels", default="positive,negative,neutral")
    parser.add_argument("--multi-label", action="store_true")
    args = parser.parse_args()
    uvicorn.run(
        create_stub_app(args.labels.split(","), args.multi_label), host="127.0.0.1", port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
