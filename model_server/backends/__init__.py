"""Backends behind the same /predict: transformers (CPU or GPU), vLLM (GPU), and the linear
backend that a directory of the linear kind (model_server.directory.linear) always gets."""

from __future__ import annotations

from pathlib import Path

from model_server.backends.base import Backend, ClassifyInput, ClassifyOutput
from model_server.directory import ModelMetadata
from model_server.directory.runtime import PRECISION_CHOICES

__all__ = ["Backend", "ClassifyInput", "ClassifyOutput", "load_backend"]

BACKENDS = ("transformers", "vllm-classify", "vllm-generate")


def load_backend(
    directory: Path | str, kind: str = "transformers", device: str | None = None, precision: str = "fp32"
) -> Backend:
    """Load a model directory with the named backend at ``precision`` (fp32, bf16, int8 or auto;
    model_server.directory.runtime); raises with a message on any problem. A directory of the linear
    kind is served by the linear backend whatever the server's default backend (transformers),
    so a server hot-swaps between the kinds; a vLLM backend named for it is refused."""
    metadata = ModelMetadata.load(directory)
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISION_CHOICES)}")
    if metadata.kind == "linear":
        if kind != "transformers":
            raise ValueError(f"{directory} holds a linear model; the {kind} backend serves encoder models only")
        from model_server.backends.linear_backend import LinearBackend

        return LinearBackend(Path(directory), metadata)
    if kind == "transformers":
        from model_server.backends.transformers_backend import TransformersBackend

        return TransformersBackend(Path(directory), metadata, device=device, precision=precision)
    if precision not in ("fp32", "auto"):
        raise ValueError(f"--precision {precision} is for the transformers backend; vLLM picks its own dtype")
    if kind == "vllm-classify":
        from model_server.backends.vllm_backend import VllmClassifierBackend

        return VllmClassifierBackend(Path(directory), metadata)
    if kind == "vllm-generate":
        from model_server.backends.vllm_backend import VllmLabelGenerationBackend

        return VllmLabelGenerationBackend(Path(directory), metadata)
    raise ValueError(f"unknown backend {kind!r}; use one of {', '.join(BACKENDS)}")
