"""The model host: the backend that serves, its dynamic batching, and the hot swap.

The HTTP handlers (:mod:`model_server.app`) only validate and enqueue; the
:class:`~model_server.batching.Batcher` thread runs the forward passes on :attr:`ModelHost.backend`.
A reload (``POST /admin/reload``, or a replica that follows its task: :mod:`model_server.follow`)
builds the new backend in a thread while the old one keeps serving, then swaps one reference: a
batch already running finishes on the model it started with.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model_server.backends import Backend, ClassifyInput, ClassifyOutput, load_backend
from model_server.batching import Batcher, BatchStats
from model_server.config import ServerConfig
from model_server.metrics import Metrics
from model_server.threads import ThreadBudget

logger = logging.getLogger(__name__)

__all__ = ["ModelHost", "describe"]


class ModelHost:
    """Holds the serving backend and swaps it atomically."""

    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.backend: Backend | None = None
        self.backend_kind = config.backend
        self.precision = config.precision
        self.load_error: str | None = None
        self._reload_lock = threading.Lock()
        self.batcher: Batcher[ClassifyInput, tuple[ClassifyOutput, Backend]] = Batcher(
            self._forward,
            max_batch_size=config.max_batch_size,
            max_wait_s=config.max_wait_ms / 1000,
            request_timeout_s=config.request_timeout_s,
            linger_gap_s=config.linger_gap_ms / 1000,
            linger_max_s=config.linger_max_ms / 1000,
            stats=BatchStats(on_batch=metrics.batch_size.observe, on_queue_wait=metrics.queue_wait.observe),
            name="model-batcher",
        )
        self.thread_budget = ThreadBudget.for_server(config.threads)
        self._threads_set: int | None = None  # what the batcher thread last gave torch

    def _forward(self, inputs: Sequence[ClassifyInput]) -> list[tuple[ClassifyOutput, Backend]]:
        backend = self.backend  # one reference for the whole batch: a reload cannot split it
        if backend is None:
            raise RuntimeError("no model is loaded")
        if backend.device == "cpu":
            self._size_the_team()
        return [(output, backend) for output in backend.predict(inputs)]

    def _size_the_team(self) -> None:
        """Give torch the team size for this forward pass (model_server.threads). Called in the
        batcher thread: OpenMP's team size is a setting of the thread that starts the parallel
        regions, and the batcher runs every served forward pass."""
        threads = self.thread_budget.threads()
        if threads != self._threads_set:
            import torch  # only where a CPU backend serves: the model-server extra has it

            torch.set_num_threads(threads)
            if self._threads_set is not None:
                self.metrics.forward_thread_changes.inc()
            self._threads_set = threads
            self.metrics.forward_threads.set(threads)
        self.metrics.neighbour_cores.set(round(self.thread_budget.others_cores, 3))

    def _load(self, model_dir: str | Path, kind: str, precision: str) -> Backend:
        """Load a backend with the server's whole team. A thread torch has not seen takes the team
        size torch was last given, in any thread: after the batcher shrank it beside a busy
        neighbour, a reload would otherwise time its precision plan (``auto``) on that team."""
        if not (self.config.device or "").startswith("cuda"):
            import torch

            torch.set_num_threads(self.thread_budget.max_threads)
        return load_backend(model_dir, kind, self.config.device, precision)

    def load_initial(self) -> None:
        if self.config.model_dir is None:
            raise ValueError("no model directory to load (only a following server starts without one)")
        # Holding the reload lock: a reload asked for during start-up waits its turn (409).
        with self._reload_lock:
            try:
                self.backend = self._load(self.config.model_dir, self.config.backend, self.config.precision)
                logger.info("model %s loaded from %s", self.backend.metadata.model_id, self.config.model_dir)
            except Exception as exc:
                self.load_error = f"{type(exc).__name__}: {exc}"
                logger.exception("could not load %s", self.config.model_dir)

    def reload(self, model_dir: str, backend_kind: str | None, precision: str | None = None) -> Backend:
        if not self._reload_lock.acquire(blocking=False):
            raise RuntimeError("busy")
        try:
            kind = backend_kind or self.backend_kind
            precision = precision or self.precision
            new = self._load(model_dir, kind, precision)
            old, self.backend, self.backend_kind, self.precision = self.backend, new, kind, precision
            self.config.model_dir = Path(model_dir)
            self.load_error = None
            if old is not None:
                # Let batches that hold the old model finish before freeing it.
                threading.Timer(30.0, old.close).start()
            return new
        finally:
            self._reload_lock.release()


def describe(backend: Backend, kind: str) -> dict[str, Any]:
    return {
        **backend.metadata.public(),
        # A linear model directory is served by the linear backend whatever the server's default.
        "backend": "linear" if backend.metadata.kind == "linear" else kind,
        "device": backend.device,
        "precision": backend.precision_info(),
    }
