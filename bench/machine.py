"""The machine a benchmark ran on, printed with its results (docs/benchmarks.md: these machines
vary; some have AMX/AVX-512 bf16, some do not)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


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
