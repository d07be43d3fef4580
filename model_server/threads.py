"""How many threads a forward pass may use on a machine the model server shares.

Torch runs a CPU forward pass on a team of OpenMP threads, one per core by default, and every
operator of the pass ends at a barrier where the team waits for its slowest thread. When another
process (the API, PostgreSQL, a training job, the load of a launch) holds one of those cores, the
thread the scheduler parked there stalls every operator until it runs again. Measured on 2 cores
with MiniLM (docs/benchmarks.md, "The model server beside a busy neighbour"): beside a process
burning one core, a server with a team of two answered 1.4 lone requests a second against 50 on
one thread; beside half a core, one thread served lone sentences 1.5 to 1.8 times faster than
the team. With the cores to itself, the team was up to 1.6 times faster.

So by default (``--threads auto``) the server measures, over short windows, how much CPU other
processes took on the cores it may run on, and runs the next forward passes on one thread per
core they left (mostly) idle. ``--threads N`` fixes the team at N, for a machine the server has
to itself.

What torch offers for this (``torch.set_num_threads``) is a setting, not a policy, and OpenMP's
own ``OMP_DYNAMIC`` in libgomp sizes teams by the one-minute load average, which counts the
server's own threads and reacts a minute late; the measurement below is written here for that
reason. It reads the kernel's per-CPU times (``psutil.cpu_times(percpu=True)``, ``/proc/stat``
on Linux) and this process's CPU time.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

__all__ = ["ThreadBudget", "cpu_quota", "threads_for", "usable_cpus"]

# A core counts as the server's when other processes leave at least this share of it idle. Beside
# a quarter of a core, a team of two still ran batches faster than one thread in three of four
# cells, but lone requests, what a launch mostly sends, ran as fast or faster on one; and in the
# launch-shaped load the API and its database took about 0.3 of a core, and a team of two made
# the model call slower and took twice the CPU (docs/benchmarks.md, "The model server beside a
# busy neighbour"). So the team is for a machine others leave nearly idle.
IDLE_SHARE_FOR_A_THREAD = 0.8
# How long a measurement window lasts. The kernel's per-CPU times tick at 100 Hz, so on 2 cores a
# window of 0.5 s reads others' CPU to within about 0.04 of a core; a neighbour that starts costs
# at most this long on the wrong team size.
WINDOW_S = 0.5
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def threads_for(free_cores: float, max_threads: int) -> int:
    """Threads for a forward pass when other processes left ``free_cores`` of the server's cores
    idle: one per core left at least :data:`IDLE_SHARE_FOR_A_THREAD` idle, between 1 and
    ``max_threads``."""
    whole = math.floor(free_cores + (1.0 - IDLE_SHARE_FOR_A_THREAD) + 1e-9)
    return max(1, min(max_threads, whole))


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: a container's cpuset, ``taskset``)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: every CPU the machine has
        return list(range(os.cpu_count() or 1))


def cpu_quota(path: Path = CGROUP_CPU_MAX) -> float | None:
    """The cores a cgroup v2 CPU limit allows (``docker run --cpus 1.5`` writes ``150000 100000``
    there), or None without a limit."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        cores = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
    return cores if cores > 0 else None


_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")  # those a platform has


def _busy_cpu_seconds(cpus: Sequence[int]) -> float:
    """CPU seconds the given CPUs spent on anything but idling, since boot. Time the hypervisor
    gave to other machines (steal) counts as busy: a thread it parks stalls the team too. (Guest
    time is already part of user time, and waiting for a disk is idle.)"""
    per_cpu = psutil.cpu_times(percpu=True)
    busy = 0.0
    for index in cpus:
        if index < len(per_cpu):
            times = per_cpu[index]
            busy += sum(getattr(times, name, 0.0) for name in _BUSY_FIELDS)
    return busy


@dataclass
class _Sample:
    wall: float
    busy: float
    own: float


class ThreadBudget:
    """The team size for the next forward pass (``--threads auto``), or a fixed one.

    :meth:`threads` is cheap between windows (a clock read); once a window has passed it reads
    the CPU times again. Others' CPU is the busy time of the server's CPUs minus this process's
    own CPU time (the server's own threads never count as neighbours)."""

    def __init__(
        self,
        max_threads: int,
        *,
        adaptive: bool = True,
        cpus: Sequence[int] | None = None,
        window_s: float = WINDOW_S,
        read_busy: Callable[[Sequence[int]], float] = _busy_cpu_seconds,
        read_own: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self.max_threads = max_threads
        self.adaptive = adaptive
        self.cpus = list(cpus) if cpus is not None else usable_cpus()
        self.window_s = window_s
        self._read_busy = read_busy
        self._read_own = read_own
        self._clock = clock
        self.current = max_threads
        self.others_cores = 0.0  # what the last window measured
        self._last: _Sample | None = self._sample() if adaptive else None

    @classmethod
    def for_server(cls, threads: int | None) -> ThreadBudget:
        """``threads`` fixed, or (None) adaptive up to torch's default team (one thread per
        physical core, or ``OMP_NUM_THREADS`` where it is set), within the usable cores and a
        cgroup CPU limit (torch's default counts the machine's cores, not the container's limit)."""
        if threads is not None:
            return cls(threads, adaptive=False)
        import torch

        cpus = usable_cpus()
        limit = min(len(cpus), torch.get_num_threads())
        quota = cpu_quota()
        if quota is not None:
            limit = min(limit, math.ceil(quota))
        return cls(max(1, limit), cpus=cpus)

    def _sample(self) -> _Sample:
        return _Sample(self._clock(), self._read_busy(self.cpus), self._read_own())

    def threads(self) -> int:
        """The team size for the forward pass about to run."""
        if not self.adaptive or self._last is None:
            return self.current
        now = self._clock()
        if now - self._last.wall < self.window_s:
            return self.current
        sample = self._sample()
        elapsed = sample.wall - self._last.wall
        others = (sample.busy - self._last.busy) - (sample.own - self._last.own)
        self._last = sample
        if elapsed <= 0:
            return self.current
        self.others_cores = max(0.0, others / elapsed)
        chosen = threads_for(len(self.cpus) - self.others_cores, self.max_threads)
        if chosen != self.current:
            logger.debug("forward passes now on %d threads (others took %.2f cores)", chosen, self.others_cores)
        self.current = chosen
        return chosen
