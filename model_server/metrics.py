"""The model server's Prometheus metrics (``GET /metrics``): requests, texts, batch sizes, queue
wait and depth, latency, the forward passes' threads and reloads."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "dynaloop_model_requests", "Requests by endpoint and outcome", ["endpoint", "outcome"], registry=r
        )
        self.texts = Counter("dynaloop_model_texts", "Texts classified", registry=r)
        self.batch_size = Histogram(
            "dynaloop_model_batch_size", "Texts per forward pass", buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r
        )
        self.queue_wait = Histogram(
            "dynaloop_model_queue_wait_seconds",
            "Time a text waited for its batch",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.latency = Histogram(
            "dynaloop_model_request_latency_seconds",
            "Latency of /predict",
            buckets=(0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.queue_depth = Gauge("dynaloop_model_queue_depth", "Texts waiting", registry=r)
        self.forward_threads = Gauge(
            "dynaloop_model_forward_threads", "Threads the last CPU forward pass ran on", registry=r
        )
        self.forward_thread_changes = Counter(
            "dynaloop_model_forward_thread_changes", "Times --threads auto changed the forward passes' team", registry=r
        )
        self.neighbour_cores = Gauge(
            "dynaloop_model_neighbour_cores",
            "Cores other processes took on this server's CPUs in the last measured window (--threads auto)",
            registry=r,
        )
        self.reloads = Counter("dynaloop_model_reloads", "Model reloads by outcome", ["outcome"], registry=r)
