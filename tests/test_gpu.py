"""The GPU path of the transformers backend and of retraining: skipped without a CUDA GPU (CI has
none), run on a GPU machine (docs/benchmarks.md, "GPU", says where they last ran). What the CPU
predicts at fp32 is the reference: CUDA at fp32 must agree with it, and at bf16 within bf16's
rounding, for single-label, multi-label and (sentence, target) heads alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model_server.backends import ClassifyInput, load_backend
from model_server.directory import ModelMetadata
from rounds.models.datasets import LabelledSet
from rounds.models.init_model import init_model_dir
from rounds.models.train import TrainConfig, train_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LABELS = ["negative", "neutral", "positive"]
SENTENCES = [
    "The service was excellent and the food arrived hot.",
    "Cold food and a rude waiter.",
    "It is a restaurant on the corner of the street.",
    "I would not say it was bad, but I will not go back.",
    "Best pizza in town, honestly!!!",
    "meh",
    "The reviewer said it was awful; I loved it.",
    "Prices went up again this year.",
] * 8  # 64 inputs: several micro-batches of different lengths


def _compare(directory: Path, inputs: list[ClassifyInput], precision: str, tolerance: float) -> None:
    reference = load_backend(directory, "transformers", "cpu", "fp32").predict(inputs)
    served = load_backend(directory, "transformers", "cuda", precision).predict(inputs)
    assert len(served) == len(inputs)
    for a, b in zip(reference, served, strict=True):
        worst = max(abs(a.probabilities[label] - b.probabilities[label]) for label in a.probabilities)
        assert worst <= tolerance, (precision, a, b)
        if worst < tolerance / 4:  # far from a tie: the decision must be the same
            assert a.labels == b.labels, (precision, a, b)


@pytest.mark.parametrize(("precision", "tolerance"), [("fp32", 1e-3), ("bf16", 2e-2)])
def test_single_label_on_cuda_matches_the_cpu(tmp_path: Path, precision: str, tolerance: float) -> None:
    directory = tmp_path / "single"
    init_model_dir(directory, labels=LABELS, model_id="single", seed=3)
    _compare(directory, [ClassifyInput(text) for text in SENTENCES], precision, tolerance)


def test_multi_label_and_pair_heads_on_cuda_match_the_cpu(tmp_path: Path) -> None:
    multi = tmp_path / "multi"
    init_model_dir(multi, labels=["anger", "joy", "neutral"], family="multi_label", model_id="multi", seed=4)
    _compare(multi, [ClassifyInput(text) for text in SENTENCES], "fp32", 1e-3)
    pair = tmp_path / "pair"
    init_model_dir(pair, labels=LABELS, input_format="text_pair", model_id="pair", seed=5)
    inputs = [ClassifyInput(text, target) for text in SENTENCES[:16] for target in ("the food", "the waiter")]
    _compare(pair, inputs, "fp32", 1e-3)


def test_gpu_backend_batches_large_micro_batches(tmp_path: Path) -> None:
    """On CUDA one pass costs about as much as thousands of padded tokens, so a batch of tweets of
    ordinary lengths is not cut into CPU-sized micro-batches."""
    directory = tmp_path / "m"
    init_model_dir(directory, labels=LABELS, model_id="m", seed=6)
    backend = load_backend(directory, "transformers", "cuda", "fp32")
    assert backend.micro_batch_size >= 256  # type: ignore[attr-defined]
    calls: list[int] = []
    forward = backend.precision.forward  # type: ignore[attr-defined]

    def counting(tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, str]:
        calls.append(int(tensors["input_ids"].shape[0]))
        return forward(tensors)

    backend.precision.forward = counting  # type: ignore[attr-defined]
    backend.predict([ClassifyInput(text) for text in SENTENCES * 4])  # 256 inputs of 3 to 15 words
    assert calls == [256]


def test_retraining_on_cuda_with_bf16(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    texts = [f"{text} ({i})" for i, text in enumerate(SENTENCES * 4)]
    ids = rng.integers(0, len(LABELS), size=len(texts))
    train = LabelledSet(
        name="train", labels=LABELS, multi_label=False, texts=texts, y=np.eye(len(LABELS), dtype=np.float32)[ids]
    )
    result = train_model(
        [train],
        None,
        labels=LABELS,
        family="single_label",
        input_format="text",
        config=TrainConfig(epochs=1, batch_size=16, max_length=32, mixed_precision="bf16"),
        out_dir=tmp_path / "trained",
        model_id="gpu-trained",
        progress=False,
    )
    assert result.examples_per_second > 0
    metadata = ModelMetadata.load(tmp_path / "trained")
    assert metadata.labels == LABELS
    outputs = load_backend(tmp_path / "trained", "transformers", "cuda", "bf16").predict(
        [ClassifyInput(text) for text in SENTENCES[:4]]
    )
    assert [len(output.labels) for output in outputs] == [1, 1, 1, 1]
