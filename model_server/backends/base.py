"""What every backend takes and returns."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from model_server.directory import ModelMetadata, multi_label_choice


@dataclass(frozen=True)
class ClassifyInput:
    text: str
    target: str | None = None  # target-dependent tasks: the sentence pair's second part


@dataclass(frozen=True)
class ClassifyOutput:
    labels: list[str]  # the predicted label (single-label) or label set (multi-label)
    probabilities: dict[str, float]
    truncated: bool
    precision: str | None = None  # what the forward pass ran at (fp32, bf16, int8); None: the backend's own


@dataclass(frozen=True)
class TokenAttribution:
    token: str
    score: float


class Backend(Protocol):
    metadata: ModelMetadata
    device: str

    def precision_info(self) -> dict[str, Any]:
        """What /info says of the precision: the mode asked for and what the backend chose."""
        ...

    def predict(self, inputs: Sequence[ClassifyInput]) -> list[ClassifyOutput]: ...

    def inspect(self, item: ClassifyInput, label: str) -> list[TokenAttribution]: ...

    def close(self) -> None: ...


def decide(
    metadata: ModelMetadata, scores: Sequence[float], truncated: bool, precision: str | None = None
) -> ClassifyOutput:
    """Turn one row of probabilities into the contract's output.

    Multi-label: every label above the threshold, the model's exclusive labels (neutral) never
    with others; when none is above it, the most probable exclusive label, or the most
    probable label (an empty prediction would leave a writer with nothing to fool); see
    model_server.directory.multi_label_choice.
    """
    probabilities = {label: float(p) for label, p in zip(metadata.labels, scores, strict=True)}
    best = max(probabilities, key=probabilities.__getitem__)
    if metadata.family == "multi_label":
        exclusive = [metadata.labels.index(label) for label in metadata.exclusive_labels]
        chosen = multi_label_choice(list(probabilities.values()), threshold=metadata.threshold, exclusive=exclusive)
        return ClassifyOutput([metadata.labels[j] for j in chosen], probabilities, truncated, precision)
    return ClassifyOutput([best], probabilities, truncated, precision)


def softmax(values: Sequence[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def sigmoid(values: Sequence[float]) -> list[float]:
    return [1.0 / (1.0 + math.exp(-v)) for v in values]
