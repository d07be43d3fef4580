"""What every backend takes and returns."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from model_directory import ModelMetadata


@dataclass(frozen=True)
class ClassifyInput:
    text: str
    target: str | None = None  # target-dependent tasks: the sentence pair's second part


@dataclass(frozen=True)
class ClassifyOutput:
    labels: list[str]  # the predicted label (single-label) or label set (multi-label)
    probabilities: dict[str, float]
    truncated: bool


@dataclass(frozen=True)
class TokenAttribution:
    token: str
    score: float


class Backend(Protocol):
    metadata: ModelMetadata
    device: str

    def predict(self, inputs: Sequence[ClassifyInput]) -> list[ClassifyOutput]: ...

    def inspect(self, item: ClassifyInput, label: str) -> list[TokenAttribution]: ...

    def close(self) -> None: ...


def decide(metadata: ModelMetadata, scores: Sequence[float], truncated: bool) -> ClassifyOutput:
    """Turn one row of probabilities into the contract's output.

    Multi-label: every label above the threshold; when none is, the most probable one (an
    empty prediction would leave a writer with nothing to fool).
    """
    probabilities = {label: float(p) for label, p in zip(metadata.labels, scores, strict=True)}
    best = max(probabilities, key=probabilities.__getitem__)
    if metadata.family == "multi_label":
        chosen = [label for label in metadata.labels if probabilities[label] >= metadata.threshold]
        return ClassifyOutput(chosen or [best], probabilities, truncated)
    return ClassifyOutput([best], probabilities, truncated)


def softmax(values: Sequence[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def sigmoid(values: Sequence[float]) -> list[float]:
    return [1.0 / (1.0 + math.exp(-v)) for v in values]
