"""Running a model directory's classifier: padded batches, and the forward pass at a precision.

The model server (model_server.backends.transformers_backend) and offline prediction
(rounds.models.inference: evaluation, harvesting, the precision check) share this module, so a
sentence gets the same probabilities whichever of them scores it at the same precision.

Precisions (docs/models.md, "Precision"):

* ``fp32``: the weights as trained; runs everywhere and is the reference.
* ``bf16``: the same weights under ``torch.autocast(dtype=bfloat16)``, offered where the device
  computes bf16 natively (a CUDA GPU with bf16, or a CPU with AVX512-BF16 or AMX-BF16); elsewhere
  bf16 is emulated and slower than fp32, so it is refused.
* ``int8``: ONNX Runtime's dynamic quantization (int8 weights, activations quantized per batch)
  of the graph that ``torch.onnx.export`` (the dynamo exporter) writes; CPU only.
* ``auto``: a :class:`PrecisionPlan` measured at load: for each batch size it uses whichever
  admitted precision ran fastest on this machine, so a lone request may run in int8 and a full
  batch in bf16. A precision is admitted only when the directory's precision check
  (:class:`PrecisionCheck`, ``dynaloop_precision.json``) found it changes at most
  :data:`MAX_CHANGED_SHARE` of the fp32 predictions on real text.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import platform
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model_server.directory import ModelMetadataError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

Precision = Literal["fp32", "bf16", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16", "int8")
PRECISION_CHOICES = (*PRECISIONS, "auto")
PRECISION_CHECK_FILE = "dynaloop_precision.json"
# The most of fp32's predictions a precision may change, on the check's text, and still be used by auto.
MAX_CHANGED_SHARE = 0.01
# Batch sizes auto times at load; a batch of another size uses the plan of the nearest measured size.
CALIBRATION_BATCH_SIZES = (1, 4, 16, 64)
CALIBRATION_TOKENS = 40  # tokens a calibration sentence has: about a tweet
CALIBRATION_REPEATS = 3  # timed passes a (precision, size) gets after one warm-up pass; the fastest counts
# Dimensions torch.export keeps dynamic: any batch size and any sentence length.
_DYNAMIC_DIMS = {0: "batch", 1: "sequence"}

Forward = Callable[[dict[str, "torch.Tensor"]], "torch.Tensor"]


class PrecisionUnavailable(ValueError):
    """A precision this machine, device or installation cannot run; the message says why."""


def pad_rows(
    tokenizer: PreTrainedTokenizerBase,
    features: Mapping[str, Sequence[Sequence[int]]],
    rows: Sequence[int],
    device: Any,
) -> dict[str, torch.Tensor]:
    """The ``rows`` of unpadded token features as tensors padded to their own longest row."""
    import torch

    length = max(len(features["input_ids"][i]) for i in rows)
    pad_values = {
        "input_ids": tokenizer.pad_token_id or 0,
        "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0),
    }
    left = getattr(tokenizer, "padding_side", "right") == "left"
    tensors = {}
    for key, values in features.items():
        pad = pad_values.get(key, 0)  # attention_mask and anything else: 0
        padded = [
            [pad] * (length - len(values[i])) + list(values[i])
            if left
            else list(values[i]) + [pad] * (length - len(values[i]))
            for i in rows
        ]
        tensors[key] = torch.tensor(padded, dtype=torch.long, device=device)
    return tensors


# --- What the machine offers -------------------------------------------------------------------


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (empty where /proc/cpuinfo is missing)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_description() -> str:
    """The CPU model and the flags that decide precision speed, for reports."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "avx_vnni")
    return f"{model} ({', '.join(flag for flag in wanted if flag in cpu_flags()) or 'no AVX2'})"


def native_bf16(device: str) -> bool:
    """Whether ``device`` computes bf16 in hardware (else autocast emulates it, slower than fp32)."""
    import torch

    if device.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def why_unavailable(precision: str, device: str) -> str | None:
    """None when ``precision`` can run on ``device`` here, else the reason."""
    if precision not in PRECISIONS:
        return f"unknown precision {precision!r}; use one of {', '.join(PRECISION_CHOICES)}"
    if precision == "bf16" and not native_bf16(device):
        return (
            f"bf16 needs native bf16 on {device} (a CPU with AVX512-BF16 or AMX-BF16, or a GPU with bf16); "
            "this one would emulate it, slower than fp32"
        )
    if precision == "int8":
        if not device.startswith("cpu"):
            return "int8 (ONNX Runtime dynamic quantization) runs on the CPU only; use bf16 on a GPU"
        try:
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError as exc:
            return f"int8 needs onnxruntime and onnxscript ({exc.name} is not installed)"
    return None


# --- The forward pass at one precision ---------------------------------------------------------


def fp32_forward(model: PreTrainedModel) -> Forward:
    def forward(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(**tensors).logits.float()

    return forward


def bf16_forward(model: PreTrainedModel) -> Forward:
    import torch

    device_type = next(model.parameters()).device.type

    def forward(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return model(**tensors).logits.float()

    return forward


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's and quantizer's progress lines and warnings (about optional packages such as
    torchvision, and about its own internals) are not the user's business: they go to the debug log."""
    captured = io.StringIO()
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch._export", "root", "onnxscript")]
    levels = [each.level for each in loggers]
    try:
        for each in loggers:
            each.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(captured):
            warnings.simplefilter("ignore")
            yield
    finally:
        for each, level in zip(loggers, levels, strict=True):
            each.setLevel(level)
        logger.debug("ONNX export: %s", captured.getvalue()[-2000:])


class Int8Model:
    """The classifier as an ONNX Runtime session with dynamically quantized int8 weights.

    Exported from the model directory (eager attention: the exporter's graph of PyTorch's fused
    attention gave wrong outputs for padded batches in our trials) into a temporary folder,
    quantized there, loaded, and the files removed; takes about 10 s for MiniLM-L6 on 2 cores.
    Only the MatMul weights are quantized, per output channel: on a MiniLM trained on TweetEval,
    ONNX Runtime's defaults (every supported op, one scale per tensor) changed 5.0% of 500 dev
    predictions, per-channel MatMuls 1.0% (docs/benchmarks.md, "Precision").
    """

    def __init__(self, directory: Path, input_names: Sequence[str], threads: int) -> None:
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from transformers import AutoModelForSequenceClassification

        self.input_names = list(input_names)
        scratch = Path(tempfile.mkdtemp(prefix="dynaloop-int8-"))
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                directory, local_files_only=True, attn_implementation="eager"
            ).eval()
            example = {name: torch.ones((2, 8), dtype=torch.long) for name in self.input_names}
            batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
            exported = scratch / "model.onnx"
            quantized = scratch / "model.int8.onnx"
            try:
                with _quiet_exporter():
                    torch.onnx.export(
                        model,
                        (),
                        str(exported),
                        kwargs=example,
                        input_names=self.input_names,
                        output_names=["logits"],
                        dynamic_shapes={name: {0: batch, 1: sequence} for name in self.input_names},
                        dynamo=True,
                        verbose=False,
                    )
                    quantize_dynamic(
                        str(exported),
                        str(quantized),
                        weight_type=QuantType.QInt8,
                        per_channel=True,
                        op_types_to_quantize=["MatMul"],
                    )
            except Exception as exc:  # the exporter raises many types; say which model could not be exported
                raise PrecisionUnavailable(
                    f"{directory} could not be exported to ONNX for int8 ({type(exc).__name__}: {str(exc)[:300]})"
                ) from exc
            self._graph = quantized.read_bytes()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        # One session per team size, made when a forward pass first asks for it: ONNX Runtime
        # fixes a session's threads when it is made, and the model server sizes its team per
        # forward pass beside busy neighbours (model_server/threads.py).
        self._sessions: dict[int, Any] = {}
        self._sessions_lock = threading.Lock()
        self.session = self.session_for(threads)
        # The graph's own inputs: the exporter drops an input the model never reads.
        self.input_names = [each.name for each in self.session.get_inputs()]

    def session_for(self, threads: int) -> Any:
        """The session that runs on ``threads`` intra-op threads (made on first use)."""
        threads = max(1, threads)
        with self._sessions_lock:
            session = self._sessions.get(threads)
            if session is None:
                import onnxruntime

                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads = threads
                options.log_severity_level = 3  # errors only: the quantizer's graph is fine, its warnings are noise
                session = onnxruntime.InferenceSession(self._graph, options, providers=["CPUExecutionProvider"])
                self._sessions[threads] = session
            return session

    def __call__(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        import torch

        feeds = {name: tensors[name].cpu().numpy() for name in self.input_names}
        # The calling thread's torch team: what the model server's batcher set for this pass.
        session = self.session_for(torch.get_num_threads())
        return torch.from_numpy(session.run(["logits"], feeds)[0]).float()


def build_forward(
    model: PreTrainedModel,
    precision: str,
    *,
    directory: Path | None,
    input_names: Sequence[str],
) -> Forward:
    """The forward pass of ``model`` at ``precision``; raises :class:`PrecisionUnavailable`."""
    import torch

    device = next(model.parameters()).device.type
    reason = why_unavailable(precision, device)
    if reason:
        raise PrecisionUnavailable(reason)
    if precision == "fp32":
        return fp32_forward(model)
    if precision == "bf16":
        return bf16_forward(model)
    if directory is None:
        raise PrecisionUnavailable("int8 needs the model's directory (it exports the saved weights)")
    return Int8Model(directory, input_names, torch.get_num_threads())


# --- The precision check record ----------------------------------------------------------------


class PrecisionResult(BaseModel):
    model_config = ConfigDict(extra="ignore")

    agreement: float = Field(ge=0, le=1, description="Share of texts whose prediction equals fp32's.")
    changed: int = Field(ge=0, description="Texts whose prediction differs from fp32's.")
    max_probability_difference: float = Field(ge=0, description="Largest |p - p_fp32| over texts and labels.")
    macro_f1: float | None = Field(None, description="Against the file's gold labels, where it has them.")
    macro_f1_vs_fp32_points: float | None = Field(None, description="macro_f1 minus fp32's, in points (x100).")
    sentences_per_second: float | None = Field(None, description="How fast the check's texts were scored.")
    accepted: bool = Field(description="At most MAX_CHANGED_SHARE of the predictions changed.")


class PrecisionCheck(BaseModel):
    """What ``dynaloop model check-precision`` (or ``round train``, on its dev set) found."""

    model_config = ConfigDict(extra="ignore")

    data: str = Field(description="The text the check ran on (a file name, or the training dev set).")
    texts: int = Field(ge=1)
    max_changed_share: float = MAX_CHANGED_SHARE
    checked_at: str = Field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    cpu: str = Field(default_factory=cpu_description)
    results: dict[str, PrecisionResult]
    unavailable: dict[str, str] = Field(default_factory=dict, description="Precisions not checked, and why.")

    def admits(self, precision: str) -> str | None:
        """None when auto may use ``precision``, else why not."""
        if precision == "fp32":
            return None
        result = self.results.get(precision)
        if result is None:
            why = self.unavailable.get(precision, "it was not checked")
            return f"{precision} has no check on real text ({why})"
        if not result.accepted:
            return (
                f"{precision} changed {result.changed} of {self.texts} predictions "
                f"({100 * (1 - result.agreement):.2f}%) on {self.data}; the limit is {100 * self.max_changed_share:g}%"
            )
        return None

    @classmethod
    def load(cls, directory: Path | str) -> PrecisionCheck | None:
        path = Path(directory) / PRECISION_CHECK_FILE
        if not path.is_file():
            return None
        try:
            return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            problem = f"not JSON: {exc.msg} at line {exc.lineno}"
        except ValidationError as exc:
            problem = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}" for e in exc.errors())
        raise ModelMetadataError(f"{path} is not valid ({problem}); run `dynaloop model check-precision` again")

    def save(self, directory: Path | str) -> Path:
        path = Path(directory) / PRECISION_CHECK_FILE
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
        return path


# --- auto: the fastest admitted precision per batch size ---------------------------------------


@dataclass
class PrecisionPlan:
    """Which precision a batch of each size runs at, and the forward passes it needs.

    A fixed precision is a plan with one entry; ``auto`` measures each admitted precision at
    :data:`CALIBRATION_BATCH_SIZES` and keeps the fastest per size (``timings`` holds the
    measured sentences per second, ``notes`` why a precision was left out)."""

    mode: str
    forwards: dict[str, Forward]
    by_size: dict[int, str]
    timings: dict[int, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def precision_for(self, batch_size: int) -> str:
        """The precision of a batch of ``batch_size``: that of the nearest measured size (ties: the larger)."""
        sizes = sorted(self.by_size)
        nearest = min(sizes, key=lambda size: (abs(_log2(size) - _log2(batch_size)), -size))
        return self.by_size[nearest]

    def forward(self, tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, str]:
        precision = self.precision_for(int(tensors["input_ids"].shape[0]))
        return self.forwards[precision](tensors), precision

    def describe(self) -> dict[str, Any]:
        """What /info and reports say about the plan."""
        return {
            "mode": self.mode,
            "by_batch_size": {str(size): precision for size, precision in sorted(self.by_size.items())},
            "measured_seq_per_s": {
                str(size): {precision: round(rate, 1) for precision, rate in rates.items()}
                for size, rates in sorted(self.timings.items())
            },
            "notes": list(self.notes),
        }


def _log2(value: int) -> float:
    import math

    return math.log2(max(1, value))


def plan_precision(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    precision: str,
    *,
    directory: Path | None,
    max_batch_size: int = max(CALIBRATION_BATCH_SIZES),
    check: PrecisionCheck | None = None,
) -> PrecisionPlan:
    """The plan for ``precision`` (fp32, bf16, int8 or auto); raises :class:`PrecisionUnavailable`
    for a fixed precision this machine cannot run. ``auto`` never raises: what it cannot use is
    left out and said in ``notes``, and fp32 always remains."""
    input_names = list(tokenizer.model_input_names)
    if precision != "auto":
        forward = build_forward(model, precision, directory=directory, input_names=input_names)
        refused = check.admits(precision) if check is not None else None
        warnings = [f"used as asked, though auto would refuse it: {refused}"] if refused else []
        return PrecisionPlan(precision, {precision: forward}, {1: precision}, notes=warnings)
    device = next(model.parameters()).device.type
    notes: list[str] = []
    forwards: dict[str, Forward] = {"fp32": fp32_forward(model)}
    for candidate in ("bf16", "int8"):
        reason = why_unavailable(candidate, device)
        if reason is None:
            reason = (
                f"{candidate} has no check on real text; run `dynaloop model check-precision`"
                if check is None
                else check.admits(candidate)
            )
        if reason:
            notes.append(f"{candidate} left out: {reason}")
            continue
        try:
            forwards[candidate] = build_forward(model, candidate, directory=directory, input_names=input_names)
        except PrecisionUnavailable as exc:
            notes.append(f"{candidate} left out: {exc}")
    sizes = [size for size in CALIBRATION_BATCH_SIZES if size <= max_batch_size] or [1]
    if len(forwards) == 1:
        return PrecisionPlan("auto", forwards, dict.fromkeys(sizes, "fp32"), notes=notes)
    timings = calibrate(forwards, tokenizer, sizes, device=next(model.parameters()).device)
    by_size = {size: max(rates, key=rates.__getitem__) for size, rates in timings.items()}
    used = set(by_size.values())
    plan = PrecisionPlan("auto", {p: f for p, f in forwards.items() if p in used}, by_size, timings, notes)
    logger.info("precision auto: %s (sentences/s per batch size: %s)", by_size, timings)
    return plan


def calibrate(
    forwards: Mapping[str, Forward], tokenizer: PreTrainedTokenizerBase, sizes: Sequence[int], *, device: Any
) -> dict[int, dict[str, float]]:
    """Sentences per second of each forward pass at each batch size, on batches of
    :data:`CALIBRATION_TOKENS`-token sentences (the fastest of :data:`CALIBRATION_REPEATS` passes).
    Precisions are timed in turns at each size, so a drift in the machine's speed hits them alike."""
    import torch

    text = " ".join(["the film was not as good as I had hoped"] * 8)
    features = dict(tokenizer([text], truncation=True, max_length=CALIBRATION_TOKENS))
    timings: dict[int, dict[str, float]] = {}
    with torch.inference_mode():
        for size in sizes:
            tensors = pad_rows(tokenizer, {k: v * size for k, v in features.items()}, range(size), device)
            best = dict.fromkeys(forwards, float("inf"))
            for repeat in range(CALIBRATION_REPEATS + 1):
                for precision, forward in forwards.items():
                    started = time.perf_counter()
                    forward(tensors)
                    elapsed = time.perf_counter() - started
                    if repeat > 0:  # the first pass warms caches and kernels up
                        best[precision] = min(best[precision], elapsed)
            timings[size] = {precision: size / seconds for precision, seconds in best.items()}
    return timings
