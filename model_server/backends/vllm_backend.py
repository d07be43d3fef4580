"""vLLM backends (GPU, optional extra ``dynaloop[vllm]``), behind the same /predict.

* :class:`VllmClassifierBackend` -- an encoder (or any ``*ForSequenceClassification``)
  checkpoint through vLLM's pooling runner (``LLM(runner="pooling").classify``), with raw
  logits (``use_activation=False``) turned into softmax or sigmoid probabilities here, so a
  multi-label head gets its own threshold.
* :class:`VllmLabelGenerationBackend` -- a (possibly quantized) decoder LLM prompted to answer
  with one of the task's labels, as BESSTIE prompts its LLMs. Each label is scored as a
  continuation of the prompt from the log-probabilities of its tokens
  (``prompt_logprobs``), so multi-token labels are compared fairly; the probabilities are the
  softmax of those scores over the task's labels.

Neither runs without a CUDA GPU; their tests skip with a reason on machines without one.
Settings beyond ``dynaloop_model.json``: ``DYNALOOP_VLLM_GPU_MEMORY`` (fraction, default 0.5),
and for the generation backend the metadata keys ``prompt_template`` (with ``{text}``,
``{target}`` and ``{labels}``), ``quantization`` (e.g. ``awq``, ``gptq``, ``bitsandbytes``) and
``base_model`` (the decoder's directory if the weights live elsewhere).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model_server.backends.base import ClassifyInput, ClassifyOutput, TokenAttribution, decide, sigmoid, softmax
from model_server.directory import ModelMetadata, ModelMetadataError

DEFAULT_PROMPT = (
    "Classify the text into exactly one of these labels: {labels}.\n"
    "Text: {text}\n{target_line}Answer with the label only.\nLabel:"
)


def _require_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ModelMetadataError(
            "the vLLM backends need the optional extra: pip install 'dynaloop[vllm]' on a machine with a CUDA GPU"
        ) from exc
    import torch

    if not torch.cuda.is_available():
        raise ModelMetadataError("the vLLM backends need a CUDA GPU; use --backend transformers on this machine")
    return vllm


def _gpu_memory() -> float:
    return float(os.environ.get("DYNALOOP_VLLM_GPU_MEMORY", "0.5"))


def _vllm_precision(llm: Any) -> dict[str, Any]:
    """vLLM serves at the dtype it picked for the weights (its ``dtype="auto"``); /info says which."""
    dtype = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "dtype", None)
    return {"mode": "vllm", "dtype": str(dtype) if dtype is not None else "unknown", "notes": []}


class VllmClassifierBackend:
    device = "cuda"

    def __init__(self, directory: Path, metadata: ModelMetadata) -> None:
        vllm = _require_vllm()
        self.metadata = metadata
        self.llm = vllm.LLM(
            model=str(directory),
            runner="pooling",
            max_model_len=metadata.max_length,
            gpu_memory_utilization=_gpu_memory(),
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.pooling_params = vllm.PoolingParams(use_activation=False)

    def close(self) -> None:
        del self.llm

    def precision_info(self) -> dict[str, Any]:
        return _vllm_precision(self.llm)

    def predict(self, inputs: Sequence[ClassifyInput]) -> list[ClassifyOutput]:
        prompts, truncated = [], []
        for item in inputs:
            target = item.target if self.metadata.input_format == "text_pair" else None
            full = self.tokenizer(item.text, target, truncation=False)["input_ids"]
            ids = self.tokenizer(
                item.text, target, truncation="only_first" if target else True, max_length=self.metadata.max_length
            )["input_ids"]
            prompts.append({"prompt_token_ids": ids})
            truncated.append(len(full) > len(ids))
        outputs = self.llm.classify(prompts, pooling_params=self.pooling_params, use_tqdm=False)
        results = []
        for output, cut in zip(outputs, truncated, strict=True):
            logits = list(output.outputs.probs)
            scores = sigmoid(logits) if self.metadata.family == "multi_label" else softmax(logits)
            results.append(decide(self.metadata, scores, cut))
        return results

    def inspect(self, item: ClassifyInput, label: str) -> list[TokenAttribution]:
        raise NotImplementedError("token attributions need gradients; serve this model with --backend transformers")


class VllmLabelGenerationBackend:
    device = "cuda"

    def __init__(self, directory: Path, metadata: ModelMetadata) -> None:
        if metadata.family != "single_label":
            raise ModelMetadataError("the generation backend serves single-label tasks; use vllm-classify")
        vllm = _require_vllm()
        self.vllm = vllm
        self.metadata = metadata
        extra = metadata.model_extra or {}
        self.template = str(extra.get("prompt_template") or DEFAULT_PROMPT)
        model = str(extra.get("decoder_dir") or directory)
        self.llm = vllm.LLM(
            model=model,
            quantization=extra.get("quantization"),
            enable_prefix_caching=True,
            max_model_len=metadata.max_length,
            gpu_memory_utilization=_gpu_memory(),
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)

    def close(self) -> None:
        del self.llm

    def precision_info(self) -> dict[str, Any]:
        return _vllm_precision(self.llm)

    def _prompt(self, item: ClassifyInput) -> str:
        target_line = f"Target: {item.target}\n" if item.target else ""
        content = self.template.format(
            text=item.text, target=item.target or "", target_line=target_line, labels=", ".join(self.metadata.labels)
        )
        if getattr(self.tokenizer, "chat_template", None):
            return str(
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
                )
            )
        return content

    def predict(self, inputs: Sequence[ClassifyInput]) -> list[ClassifyOutput]:
        requests, spans = [], []
        for item in inputs:
            prompt_ids = self.tokenizer(self._prompt(item), add_special_tokens=False)["input_ids"]
            truncated = len(prompt_ids) > self.metadata.max_length - 8
            prompt_ids = prompt_ids[-(self.metadata.max_length - 8) :]
            for label in self.metadata.labels:
                label_ids = self.tokenizer(" " + label, add_special_tokens=False)["input_ids"]
                requests.append({"prompt_token_ids": prompt_ids + label_ids})
                spans.append((len(prompt_ids), len(label_ids), truncated))
        outputs = self.llm.generate(requests, self.params, use_tqdm=False)
        results = []
        per_item = len(self.metadata.labels)
        for start in range(0, len(outputs), per_item):
            scores, truncated = [], False
            for output, (offset, length, cut) in zip(
                outputs[start : start + per_item], spans[start : start + per_item], strict=True
            ):
                ids = output.prompt_token_ids
                logprobs = output.prompt_logprobs
                # log p(label | prompt) = sum of the label tokens' log-probabilities.
                scores.append(sum(logprobs[i][ids[i]].logprob for i in range(offset, offset + length)))
                truncated = cut
            results.append(decide(self.metadata, softmax(scores), truncated))
        return results

    def inspect(self, item: ClassifyInput, label: str) -> list[TokenAttribution]:
        raise NotImplementedError("token attributions need gradients; serve an encoder with --backend transformers")
