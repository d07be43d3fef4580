"""Any local Hugging Face sequence-classification directory (BERT, RoBERTa, XLM-R, ...), on
CPU or GPU: softmax for single-label heads, sigmoid with a threshold for multi-label ones,
(sentence, target) pairs for target-dependent tasks."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from model_server.backends.base import ClassifyInput, ClassifyOutput, TokenAttribution, decide
from model_server.directory import ModelMetadata, ModelMetadataError
from model_server.directory.runtime import PrecisionCheck, pad_rows, plan_precision
from model_server.directory.tokenizer_coverage import TokenCoverage, count_unknown, max_unknown_token_share_from_env

logger = logging.getLogger(__name__)

# What one extra forward pass costs, in padded tokens: the price of splitting a batch. Measured
# on 2 CPU cores with MiniLM-L6 (~0.15 ms a token, ~10 ms fixed per pass); any value from 32 to
# 128 gave about the same throughput on tweets (+15-25% over padding a batch of 32 to its longest).
SPLIT_COST_TOKENS = 96
# On a GPU the fixed cost of a pass (kernel launches from Python) dwarfs the cost of padding: on an
# H200, MiniLM-L6 at bf16 took 3.3-3.7 ms a pass for anything from 8 to 16,384 padded tokens
# (bench/gpu.py, "fixed cost of one pass"; docs/benchmarks.md, GPU section), so a server batch is
# one pass unless its padding alone would exceed that many tokens.
GPU_SPLIT_COST_TOKENS = 16384
GPU_MICRO_BATCH_SIZE = 256
CPU_MICRO_BATCH_SIZE = 64
# The unknown-token warning is logged at most this often (a busy server would repeat it per request).
UNKNOWN_TOKEN_WARNING_INTERVAL_S = 300.0


def split_by_length(
    lengths: Sequence[int], max_size: int, split_cost: float = SPLIT_COST_TOKENS
) -> list[tuple[int, int]]:
    """Cut ascending ``lengths`` into contiguous micro-batches ``[start, end)`` of at most
    ``max_size`` items, minimising padded tokens (items x longest, per micro-batch) plus
    ``split_cost`` per micro-batch: tweets of 11 and 44 tokens need not pad to 44 together.
    Exact dynamic programme, O(n * max_size), skipped when one micro-batch is optimal anyway.
    """
    n = len(lengths)
    if 0 < n <= max_size and n * lengths[-1] - sum(lengths) <= split_cost:
        # Any split saves at most the padding of one micro-batch (n x longest - the tokens
        # themselves) and costs at least split_cost: one micro-batch is optimal. On a GPU this is
        # the usual case, and the programme's Python loop would cost more than the pass itself.
        return [(0, n)]
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(max(0, end - max_size), end):
            cost = best[start] + (end - start) * lengths[end - 1] + split_cost
            if cost < best[end]:
                best[end], cut[end] = cost, start
    spans = []
    end = n
    while end > 0:
        spans.append((cut[end], end))
        end = cut[end]
    return spans[::-1]


class TransformersBackend:
    def __init__(
        self,
        directory: Path,
        metadata: ModelMetadata,
        *,
        device: str | None = None,
        micro_batch_size: int | None = None,
        precision: str = "fp32",
        split_cost_tokens: float | None = None,
    ) -> None:
        self.directory = directory
        self.metadata = metadata
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        on_gpu = self.device.startswith("cuda")
        self.micro_batch_size = micro_batch_size or (GPU_MICRO_BATCH_SIZE if on_gpu else CPU_MICRO_BATCH_SIZE)
        self.split_cost_tokens = (
            split_cost_tokens
            if split_cost_tokens is not None
            else (GPU_SPLIT_COST_TOKENS if on_gpu else SPLIT_COST_TOKENS)
        )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
            self.model = AutoModelForSequenceClassification.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ModelMetadataError(f"cannot load a sequence classifier from {directory}: {exc}") from exc
        if self.model.config.num_labels != len(metadata.labels):
            raise ModelMetadataError(
                f"{directory}: the classifier head has {self.model.config.num_labels} outputs but "
                f"dynaloop_model.json lists {len(metadata.labels)} labels; they must match"
            )
        self.model.to(self.device).eval()
        # The forward pass at the asked precision; auto times the admitted ones here (docs/models.md).
        self.precision = plan_precision(
            self.model,
            self.tokenizer,
            precision,
            directory=directory,
            max_batch_size=self.micro_batch_size,
            check=PrecisionCheck.load(directory),
        )
        self.max_length = min(metadata.max_length, getattr(self.tokenizer, "model_max_length", 10**6) or 10**6)
        self.max_unknown_token_share = max_unknown_token_share_from_env()
        unknown = getattr(self.tokenizer, "unk_token_id", None)
        self._unknown_id: int | None = unknown
        self._special_ids = frozenset(getattr(self.tokenizer, "all_special_ids", ())) - {unknown}
        self._last_unknown_warning = -float("inf")
        self.requests_over_unknown_limit = 0  # requests whose texts were above the share (since load)

    def unknown_tokens(self, input_ids: Sequence[Sequence[int]]) -> TokenCoverage:
        """The unknown-token share of tokenized inputs, special tokens left out (docs/models.md)."""
        return count_unknown(
            ([token for token in row if token not in self._special_ids] for row in input_ids),
            self._unknown_id,
            str(getattr(self.tokenizer, "unk_token", None)),
        )

    def _check_unknown_tokens(self, input_ids: Sequence[Sequence[int]]) -> None:
        """Log a warning when a request's texts are mostly the tokenizer's unknown token (the
        model cannot read their script), at most every UNKNOWN_TOKEN_WARNING_INTERVAL_S."""
        if self._unknown_id is None:
            return  # byte-level BPE: every string is covered
        coverage = self.unknown_tokens(input_ids)
        if not coverage.exceeds(self.max_unknown_token_share):
            return
        self.requests_over_unknown_limit += 1
        now = time.monotonic()
        if now - self._last_unknown_warning >= UNKNOWN_TOKEN_WARNING_INTERVAL_S:
            self._last_unknown_warning = now
            logger.warning(
                "model %s: %s (%d request(s) over the %.0f%% limit since load)",
                self.metadata.model_id,
                coverage.message("a request's texts"),
                self.requests_over_unknown_limit,
                100 * self.max_unknown_token_share,
            )

    def close(self) -> None:
        del self.model

    def _pairs(self, inputs: Sequence[ClassifyInput]) -> tuple[list[str], list[str] | None]:
        texts = [item.text for item in inputs]
        if self.metadata.input_format == "text_pair":
            missing = [i for i, item in enumerate(inputs) if not item.target]
            if missing:
                raise ValueError(f"this model takes (text, target) pairs; inputs {missing} have no target")
            return texts, [item.target or "" for item in inputs]
        return texts, None

    def _tokenize(self, inputs: Sequence[ClassifyInput], **padding: object) -> tuple[dict[str, Any], list[bool]]:
        """The tokenizer's features (lists of token ids, or tensors with ``return_tensors``) and which inputs
        were truncated."""
        texts, targets = self._pairs(inputs)
        strategy = "only_first" if targets is not None else True
        encoded = self.tokenizer(texts, targets, truncation=strategy, max_length=self.max_length, **padding)
        # Which inputs were cut (the response says so). A fast tokenizer keeps what truncation
        # removed in each encoding's ``overflowing``: one tokenization pass, not two.
        encodings = getattr(encoded, "encodings", None)
        if encodings is not None and len(encodings) == len(texts):
            truncated = [bool(encoding.overflowing) for encoding in encodings]
        else:  # a slow (pure Python) tokenizer: lengths without truncation
            full = self.tokenizer(texts, targets, truncation=False, verbose=False)["input_ids"]
            truncated = [len(ids) > self.max_length for ids in full]
        return dict(encoded), truncated

    def encode(self, inputs: Sequence[ClassifyInput]) -> tuple[dict[str, torch.Tensor], list[bool]]:
        encoded, truncated = self._tokenize(inputs, padding=True, return_tensors="pt")
        return {k: v.to(self.device) for k, v in encoded.items()}, truncated

    def precision_info(self) -> dict[str, Any]:
        return self.precision.describe()

    @torch.inference_mode()
    def predict(self, inputs: Sequence[ClassifyInput]) -> list[ClassifyOutput]:
        if not inputs:
            return []
        # Tokenize once, unpadded; sort by token count; run length-homogeneous micro-batches
        # (each padded only to its own longest) and restore the order after.
        features, truncated = self._tokenize(inputs)
        self._check_unknown_tokens(features["input_ids"])
        lengths = [len(ids) for ids in features["input_ids"]]
        order = sorted(range(len(inputs)), key=lengths.__getitem__)
        results: list[ClassifyOutput | None] = [None] * len(inputs)
        spans = split_by_length([lengths[i] for i in order], self.micro_batch_size, self.split_cost_tokens)
        for start, end in spans:
            rows = order[start:end]
            logits, precision = self.precision.forward(pad_rows(self.tokenizer, features, rows, self.device))
            if self.metadata.family == "multi_label":
                probabilities = torch.sigmoid(logits)
            else:
                probabilities = torch.softmax(logits, dim=-1)
            # One copy to the host for the whole micro-batch: a .tolist() per row would wait for
            # the GPU once per sentence.
            for index, row_probabilities in zip(rows, probabilities.cpu().tolist(), strict=True):
                results[index] = decide(self.metadata, row_probabilities, truncated[index], precision)
        return [r for r in results if r is not None]

    def inspect(self, item: ClassifyInput, label: str, n_steps: int = 32) -> list[TokenAttribution]:
        """Integrated gradients (Sundararajan et al., 2017) over the input embeddings, via
        captum: one score per token for how much it pushes the model towards ``label``."""
        from captum.attr import IntegratedGradients

        if label not in self.metadata.labels:
            raise ValueError(f"unknown label {label!r}; use one of {self.metadata.labels}")
        target_index = self.metadata.labels.index(label)
        encoded, _ = self.encode([item])
        input_ids = encoded["input_ids"]
        embeddings_layer = self.model.get_input_embeddings()
        special = torch.tensor(
            [[token in self.tokenizer.all_special_ids for token in row] for row in input_ids.tolist()],
            device=input_ids.device,
        )
        # Baseline: padding everywhere except the special tokens ([CLS], [SEP], ...).
        baseline_ids = torch.where(special, input_ids, torch.full_like(input_ids, self.tokenizer.pad_token_id or 0))
        extra = {k: v for k, v in encoded.items() if k != "input_ids"}

        def forward(embeds: torch.Tensor) -> torch.Tensor:
            repeat = embeds.shape[0]
            kwargs = {k: v.expand(repeat, -1) for k, v in extra.items()}
            logits = self.model(inputs_embeds=embeds, **kwargs).logits
            if self.metadata.family == "multi_label":
                return torch.sigmoid(logits)
            return torch.softmax(logits, dim=-1)

        with torch.enable_grad():
            inputs_embeds = embeddings_layer(input_ids).detach()
            baseline_embeds = embeddings_layer(baseline_ids).detach()
            attributions = IntegratedGradients(forward).attribute(
                inputs_embeds,
                baselines=baseline_embeds,
                target=target_index,
                n_steps=n_steps,
                internal_batch_size=n_steps,
            )
        scores = attributions.sum(dim=-1).squeeze(0)
        norm = torch.linalg.vector_norm(scores)
        if norm > 0:
            scores = scores / norm
        tokens = self.tokenizer.convert_ids_to_tokens(input_ids[0].tolist())
        return [TokenAttribution(token, float(score)) for token, score in zip(tokens, scores.tolist(), strict=True)]
