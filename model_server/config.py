"""The model server's settings (`dynaloop model-server`'s options, dynaloop/commands/serve.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model_server.follow import Registry

__all__ = ["FollowSettings", "ServerConfig"]


@dataclass
class FollowSettings:
    """Follow a task's promoted model (`dynaloop model-server --follow-task`)."""

    registry: Registry
    interval_s: float = 2.0


@dataclass
class ServerConfig:
    model_dir: Path | None  # None only when following: the promoted model is loaded
    backend: str = "transformers"
    device: str | None = None
    precision: str = "auto"  # fp32, bf16, int8 or auto (model_server.directory.runtime)
    max_batch_size: int = 32
    max_wait_ms: float = 0.0
    # Under load, keep collecting returning callers (see model_server.batching.linger); 0 turns it off.
    linger_gap_ms: float = 20.0
    linger_max_ms: float = 150.0
    request_timeout_s: float = 10.0
    max_texts_per_request: int = 64
    admin_token: str | None = None
    load_in_background: bool = True
    follow: FollowSettings | None = None
    log_format: str = "text"  # or json: one JSON object per line (model_server.logs)
    # Threads of a CPU forward pass: None sizes the team by the cores other processes leave idle
    # (model_server.threads); a number fixes it.
    threads: int | None = None
