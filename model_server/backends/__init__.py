"""Backends behind the same /predict: transformers (CPU or GPU) and vLLM (GPU)."""

from __future__ import annotations

from pathlib import Path

from model_directory import ModelMetadata
from model_server.backends.base import Backend, ClassifyInput, ClassifyOutput

__all__ = ["Backend", "ClassifyInput", "ClassifyOutput", "load_backend"]

BACKENDS = ("transformers", "vllm-classify", "vllm-generate")


def load_backend(directory: Path | str, kind: str = "transformers", device: str | None = None) -> Backend:
    """Load a model directory with the named backend; raises with a message on any problem."""
    metadata = ModelMetadata.load(directory)
    if kind == "transformers":
        from model_server.backends.transformers_backend import TransformersBackend

        return TransformersBackend(Path(directory), metadata, device=device)
    if kind == "vllm-classify":
        from model_server.backends.vllm_backend import VllmClassifierBackend

        return VllmClassifierBackend(Path(directory), metadata)
    if kind == "vllm-generate":
        from model_server.backends.vllm_backend import VllmLabelGenerationBackend

        return VllmLabelGenerationBackend(Path(directory), metadata)
    raise ValueError(f"unknown backend {kind!r}; use one of {', '.join(BACKENDS)}")
