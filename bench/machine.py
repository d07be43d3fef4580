"""The machine a benchmark ran on, printed with its results (docs/benchmarks.md: these machines
vary; some have AMX/AVX-512 bf16, some do not)."""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import sys
from pathlib import Path
from typing import Any

import psutil


def cpu_model() -> dict[str, Any]:
    """The CPU's model name, its number of CPUs and the flags that matter for model serving,
    from /proc/cpuinfo."""
    name, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    wanted = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
    return {"model": name, "cpus": os.cpu_count(), "flags": [f for f in wanted if f in flags]}


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process and its live descendants have used so far; None once
    the process is gone. A child that exited before this call is not counted (psutil sees only
    live processes), so a benchmark reads it for processes that live through the run."""
    try:
        process = psutil.Process(pid)
        members = [process, *process.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for member in members:
        try:
            times = member.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def load_average() -> tuple[float, float, float]:
    """The machine's 1, 5 and 15 minute load averages: how busy it was beside the benchmark."""
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


@functools.cache
def model_server_bench() -> Any:
    """bench/model_server.py (named like the package it measures, so loaded by path, once): its
    server process handling, /proc CPU accounting, minimal socket client and data paths are
    reused by bench/precision.py, bench/gpu.py and bench/peers.py. Loading it also takes bench/
    off the import path, so that `import model_server` finds the package, not that script."""
    path = Path(__file__).resolve().parent / "model_server.py"
    spec = importlib.util.spec_from_file_location("bench_model_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_model_server"] = module
    spec.loader.exec_module(module)
    return module
