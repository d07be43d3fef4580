"""Dynamic batching: requests queue with a monotonic timestamp; one worker thread collects
them into batches, runs one forward pass per batch off the event loop, and answers every
waiting request -- all of them, with the error, when the batch fails.

The collection policy is greedy: the worker takes whatever is queued (up to
``max_batch_size``), waiting at most ``max_wait_s`` for more only while the batch is not
full. With ``max_wait_s=0`` a lone request is served at once (its latency is one forward
pass), and under load batches fill up by themselves while the previous forward runs.

Under load it also *lingers* (:func:`linger`): the callers a batch just answered tend to come
straight back with their next text, so right after a batch of ``k`` texts, with ``q`` more
already queued, the worker expects ``k + q`` and keeps collecting while texts keep arriving
(each within ``linger_gap_s`` of the last, never past ``linger_max_s`` after the previous
batch ended). Without it, 32 closed-loop clients split into two cohorts of ~16 that alternate
forever, and a batch of 16 costs more per text than one of 32 (measured in
``bench/model_server.py`` / ``docs/benchmarks.md``). A lone caller (last batch 1, nothing
queued) never waits, and neither does the first request after a quiet spell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

In = TypeVar("In")
Out = TypeVar("Out")


class DeadlineExceeded(Exception):
    """The request waited in the queue past its deadline and was not run."""


class ServerStopping(Exception):
    """The server is shutting down; the request was not run."""


@dataclass
class Pending(Generic[In]):
    """One queued input, its arrival time, its deadline and the future its caller awaits."""

    payload: In
    enqueued_at: float
    deadline: float
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    started_at: float | None = field(default=None)

    def resolve(self, result: Any = None, error: BaseException | None = None) -> None:
        def _set() -> None:
            if self.future.done():  # the caller gave up (timeout, disconnect)
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # the caller's event loop is closed: nobody is waiting any more
            self.loop.call_soon_threadsafe(_set)


def collect(
    source: queue.Queue[Any],
    max_batch_size: int,
    max_wait_s: float,
    *,
    poll_s: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
) -> list[Any]:
    """Take up to ``max_batch_size`` items from ``source``.

    Blocks up to ``poll_s`` for the first item (returns ``[]`` if none comes, so the caller
    can check for shutdown), then takes what is queued, waiting at most ``max_wait_s`` after
    the first item for the batch to fill.
    """
    try:
        first = source.get(timeout=poll_s)
    except queue.Empty:
        return []
    batch = [first]
    deadline = clock() + max_wait_s
    while len(batch) < max_batch_size:
        remaining = deadline - clock()
        try:
            item = source.get_nowait() if remaining <= 0 else source.get(timeout=remaining)
        except queue.Empty:
            break
        batch.append(item)
    return batch


def linger(
    source: queue.Queue[Any],
    batch: list[Any],
    target: int,
    gap_s: float,
    until: float,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Add items from ``source`` to ``batch`` until it holds ``target``, as long as each comes
    within ``gap_s`` of the last and the clock has not passed ``until``."""
    while len(batch) < target:
        timeout = min(gap_s, until - clock())
        if timeout <= 0:
            return
        try:
            batch.append(source.get(timeout=timeout))
        except queue.Empty:
            return


@dataclass
class BatchStats:
    """What the metrics endpoint reports about batching (observers are optional)."""

    on_batch: Callable[[int], None] | None = None
    on_queue_wait: Callable[[float], None] | None = None


class Batcher(Generic[In, Out]):
    """Runs ``forward(list[In]) -> list[Out]`` over batches collected from concurrent callers."""

    def __init__(
        self,
        forward: Callable[[Sequence[In]], Sequence[Out]],
        *,
        max_batch_size: int = 32,
        max_wait_s: float = 0.0,
        request_timeout_s: float = 10.0,
        stats: BatchStats | None = None,
        name: str = "batcher",
        linger_gap_s: float = 0.0,
        linger_max_s: float = 0.0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if max_wait_s < 0:
            raise ValueError("max_wait_s cannot be negative")
        self.forward = forward
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.request_timeout_s = request_timeout_s
        self.linger_gap_s = linger_gap_s
        self.linger_max_s = linger_max_s
        self.stats = stats or BatchStats()
        self._queue: queue.Queue[Pending[In]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Batcher[In, Out]:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        # Answer whoever is still queued: never leave a caller hanging.
        while True:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                break
            pending.resolve(error=ServerStopping("the model server is shutting down; retry"))

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    async def submit(self, payloads: Sequence[In], timeout_s: float | None = None) -> list[Out]:
        """Queue ``payloads`` (one item each) and wait for all their results, in order."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        deadline = now + (timeout_s if timeout_s is not None else self.request_timeout_s)
        items = [Pending(payload, now, deadline, loop, loop.create_future()) for payload in payloads]
        for item in items:
            self._queue.put(item)
        try:
            return list(
                await asyncio.wait_for(
                    asyncio.gather(*(i.future for i in items)), timeout=max(0.0, deadline - now) + 0.05
                )
            )
        except TimeoutError as exc:
            raise DeadlineExceeded(f"no answer within {deadline - now:.1f} s") from exc

    def _run(self) -> None:
        expect, expect_until = 1, 0.0
        while not self._stop.is_set():
            batch = collect(self._queue, self.max_batch_size, self.max_wait_s)
            if not batch:
                continue
            if self.linger_gap_s > 0 and len(batch) < expect:
                linger(self._queue, batch, min(expect, self.max_batch_size), self.linger_gap_s, expect_until)
            # Those just answered will likely be back, and whoever queued during the forward pass
            # is waiting. The queue is counted before the callers are answered: a caller who comes
            # straight back is one of ``len(batch)``, not also one more queued (counted after, a
            # lone caller quick enough to return first made the worker linger for a second one).
            queued = self._process(batch)
            expect = len(batch) + queued
            expect_until = time.monotonic() + self.linger_max_s

    def _process(self, batch: list[Pending[In]]) -> int:
        """Run ``batch`` and answer its callers; returns how many requests were queued when the
        forward pass ended, before any caller was answered."""
        now = time.monotonic()
        live = []
        for pending in batch:
            if pending.future.done():
                continue  # the caller already timed out
            if pending.deadline <= now:
                pending.resolve(
                    error=DeadlineExceeded(f"waited {now - pending.enqueued_at:.2f} s in the queue, past its deadline")
                )
                continue
            pending.started_at = now
            if self.stats.on_queue_wait:
                self.stats.on_queue_wait(now - pending.enqueued_at)
            live.append(pending)
        if not live:
            return self._queue.qsize()
        if self.stats.on_batch:
            self.stats.on_batch(len(live))
        try:
            results = self.forward([p.payload for p in live])
            if len(results) != len(live):
                raise RuntimeError(f"forward returned {len(results)} results for {len(live)} inputs")
        except Exception as exc:  # answer every caller of the failed batch
            queued = self._queue.qsize()
            logger.exception("batch of %d failed", len(live))
            for pending in live:
                pending.resolve(error=exc)
            return queued
        queued = self._queue.qsize()
        for pending, result in zip(live, results, strict=True):
            pending.resolve(result)
        return queued
