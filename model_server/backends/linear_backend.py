"""A linear model directory (model_server.directory.linear: TF-IDF n-grams + logistic regression) behind
the same /predict: chosen by ``load_backend`` when the directory's ``dynaloop_model.json`` says
``"kind": "linear"``, so promotion, hot swap and replicas work unchanged. CPU only, no batching
cost worth planning (one sparse matrix product per batch), no truncation, no precision choice."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model_server.backends.base import ClassifyInput, ClassifyOutput, TokenAttribution, decide
from model_server.directory import ModelMetadata
from model_server.directory.linear import LinearModel


class LinearBackend:
    def __init__(self, directory: Path, metadata: ModelMetadata) -> None:
        self.directory = directory
        self.metadata = metadata
        self.device = "cpu"
        self.model = LinearModel.load(directory, metadata)

    def precision_info(self) -> dict[str, Any]:
        return {
            "mode": "linear",
            "by_batch_size": {},
            "measured_seq_per_s": {},
            "notes": ["a linear model runs in float64 on the CPU; it has no precision to choose"],
        }

    def predict(self, inputs: Sequence[ClassifyInput]) -> list[ClassifyOutput]:
        if not inputs:
            return []
        targets = [item.target for item in inputs] if self.metadata.input_format == "text_pair" else None
        # model_inputs raises ValueError for a missing target: the server answers 422.
        probabilities = self.model.predict_proba([item.text for item in inputs], targets)
        return [decide(self.metadata, row.tolist(), False, None) for row in probabilities]

    def inspect(self, item: ClassifyInput, label: str) -> list[TokenAttribution]:
        raise NotImplementedError("token attributions are for encoder models; this model is of the linear kind")

    def close(self) -> None:
        del self.model
