"""The model server's forward passes on a shared machine: how many threads (model_server/threads.py).

The rule and the window arithmetic on a fake clock and fake CPU counters; the real counters with
a real neighbour process burning a core; and a real server whose forward passes run on the team
its budget gives (fixed with ``threads=1``; fewer than its cores beside a busy neighbour)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from model_server.backends.transformers_backend import TransformersBackend
from model_server.config import ServerConfig
from model_server.threads import ThreadBudget, cpu_quota, threads_for, usable_cpus
from rounds.models.init_model import init_model_dir
from tests.conftest import serve_model

BURN_ONE_CORE = "while True:\n    pass\n"


@pytest.fixture
def neighbour() -> Iterator[subprocess.Popen[bytes]]:
    """Another process that keeps one core busy for the test."""
    process = subprocess.Popen([sys.executable, "-c", BURN_ONE_CORE])
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture
def torch_threads_restored() -> Iterator[None]:
    """A server's batcher thread changes torch's team size, which new threads of this process
    inherit: put the process's default back for the tests that run after."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("free_cores", "max_threads", "expected"),
    [
        (2.0, 2, 2),  # nobody else: a thread per core
        (1.85, 2, 2),  # a neighbour at 0.15 of a core: the team
        (1.75, 2, 1),  # at a quarter of a core, one thread (lone requests ran faster on one)
        (1.5, 2, 1),  # at half a core, one thread was ahead everywhere but batches
        (1.0, 2, 1),  # a neighbour burning a core
        (0.0, 2, 1),  # never fewer than one
        (-3.0, 8, 1),
        (5.0, 8, 5),  # 8 cores, 3 taken
        (5.8, 8, 6),  # the 6th core is 80% idle: it counts
        (5.79, 8, 5),
        (16.0, 8, 8),  # never more than the maximum
    ],
)
def test_one_thread_per_core_others_leave_mostly_idle(free_cores: float, max_threads: int, expected: int) -> None:
    assert threads_for(free_cores, max_threads) == expected


class FakeMachine:
    """A clock and the two CPU counters the budget reads, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0
        self.busy = 1000.0  # CPU seconds of the server's cores, every process
        self.own = 10.0  # CPU seconds of the server's process
        self.reads = 0

    def read_busy(self, cpus: Sequence[int]) -> float:
        self.reads += 1
        return self.busy

    def advance(self, seconds: float, own_cores: float, other_cores: float) -> None:
        self.now += seconds
        self.own += own_cores * seconds
        self.busy += (own_cores + other_cores) * seconds


def _budget(machine: FakeMachine, max_threads: int = 2, window_s: float = 0.5) -> ThreadBudget:
    return ThreadBudget(
        max_threads,
        cpus=list(range(max_threads)),
        window_s=window_s,
        read_busy=machine.read_busy,
        read_own=lambda: machine.own,
        clock=lambda: machine.now,
    )


def test_the_team_follows_what_other_processes_take_window_by_window() -> None:
    machine = FakeMachine()
    budget = _budget(machine)
    assert budget.threads() == 2  # before any window: every core
    # The server itself busy on both cores: its own CPU never counts as a neighbour's.
    machine.advance(0.6, own_cores=1.9, other_cores=0.0)
    assert budget.threads() == 2 and budget.others_cores == pytest.approx(0.0)
    # A neighbour starts burning a core.
    machine.advance(0.6, own_cores=1.0, other_cores=1.0)
    assert budget.threads() == 1 and budget.others_cores == pytest.approx(1.0)
    # A quarter of a core is still too much for two threads; a tenth is not.
    machine.advance(0.5, own_cores=1.0, other_cores=0.25)
    assert budget.threads() == 1
    machine.advance(0.5, own_cores=1.0, other_cores=0.1)
    assert budget.threads() == 2 and budget.others_cores == pytest.approx(0.1)


def test_between_windows_nothing_is_read_and_the_team_stays() -> None:
    machine = FakeMachine()
    budget = _budget(machine, window_s=0.5)
    reads = machine.reads
    machine.advance(0.2, own_cores=0.0, other_cores=2.0)
    assert budget.threads() == 2 and machine.reads == reads  # the window has not passed
    machine.advance(0.2, own_cores=0.0, other_cores=2.0)
    assert budget.threads() == 2 and machine.reads == reads
    machine.advance(0.2, own_cores=0.0, other_cores=2.0)
    assert budget.threads() == 1 and machine.reads == reads + 1  # 0.6 s of a full machine taken
    assert budget.others_cores == pytest.approx(2.0)


def test_a_fixed_team_never_reads_the_machine() -> None:
    machine = FakeMachine()
    budget = ThreadBudget(
        3, adaptive=False, read_busy=machine.read_busy, read_own=lambda: machine.own, clock=lambda: machine.now
    )
    machine.advance(5.0, own_cores=0.0, other_cores=8.0)
    assert budget.threads() == 3 and machine.reads == 0
    assert ThreadBudget.for_server(1).threads() == 1
    with pytest.raises(ValueError, match="at least 1"):
        ThreadBudget(0)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("max 100000\n", None),
        ("150000 100000\n", 1.5),
        ("200000 100000", 2.0),
        ("0 100000", None),
        ("garbage", None),
        ("", None),
        ("100000 0", None),
    ],
)
def test_a_cgroup_cpu_limit_is_read_as_cores(tmp_path: Path, content: str, expected: float | None) -> None:
    path = tmp_path / "cpu.max"
    path.write_text(content)
    assert cpu_quota(path) == expected
    assert cpu_quota(tmp_path / "missing") is None


def test_an_adaptive_budget_stays_within_torchs_team_and_a_cgroup_cpu_limit(
    monkeypatch: pytest.MonkeyPatch, torch_threads_restored: None
) -> None:
    monkeypatch.setattr("model_server.threads.usable_cpus", lambda: list(range(16)))
    torch.set_num_threads(8)  # torch's default: the physical cores, or OMP_NUM_THREADS
    monkeypatch.setattr("model_server.threads.cpu_quota", lambda: 2.5)
    budget = ThreadBudget.for_server(None)
    assert budget.adaptive and budget.max_threads == 3 and len(budget.cpus) == 16
    monkeypatch.setattr("model_server.threads.cpu_quota", lambda: None)
    assert ThreadBudget.for_server(None).max_threads == 8
    torch.set_num_threads(1)  # OMP_NUM_THREADS=1: never more than that
    assert ThreadBudget.for_server(None).max_threads == 1


needs_two_cores = pytest.mark.skipif(
    len(usable_cpus()) < 2 or torch.get_num_threads() < 2, reason="needs 2 usable cores and a torch team of 2"
)


@needs_two_cores
def test_the_kernels_counters_show_a_neighbour_burning_a_core(neighbour: subprocess.Popen[bytes]) -> None:
    cpus = usable_cpus()
    budget = ThreadBudget(len(cpus), cpus=cpus, window_s=0.3)
    time.sleep(0.2)
    budget._last = budget._sample()  # start the window with the neighbour running
    time.sleep(0.6)
    threads = budget.threads()
    # The neighbour took a core's share, whatever else this machine ran (other tests count as
    # neighbours too): the server gets fewer threads than it may have.
    assert budget.others_cores >= 0.5, budget.others_cores
    assert threads < budget.max_threads


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("threads") / "tiny"
    init_model_dir(directory, labels=["negative", "neutral", "positive"], tiny=True, model_id="tiny-threads")
    return directory


@pytest.fixture
def teams_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """torch's team size in the thread that runs each served forward pass."""
    seen: list[int] = []
    original = TransformersBackend.predict

    def predict(self: TransformersBackend, inputs: Sequence[object]) -> object:
        seen.append(torch.get_num_threads())
        return original(self, inputs)  # type: ignore[arg-type]

    monkeypatch.setattr(TransformersBackend, "predict", predict)
    return seen


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_fixed_team_is_what_the_forward_passes_run_on(
    tiny_model: Path, teams_seen: list[int], torch_threads_restored: None
) -> None:
    server = serve_model(ServerConfig(model_dir=tiny_model, threads=1))
    try:
        for _ in range(3):
            response = httpx.post(f"{server.url}/predict", json={"texts": ["fine", "awful"]}, timeout=30)
            assert response.status_code == 200, response.text
        assert teams_seen and set(teams_seen) == {1}
        assert _metric(server.url, "dynaloop_model_forward_threads") == 1.0
    finally:
        server.stop()


@needs_two_cores
def test_beside_a_busy_neighbour_the_server_runs_on_fewer_threads(
    tiny_model: Path, teams_seen: list[int], torch_threads_restored: None, neighbour: subprocess.Popen[bytes]
) -> None:
    server = serve_model(ServerConfig(model_dir=tiny_model))  # --threads auto, the default
    try:
        cores = len(usable_cpus())
        deadline = time.monotonic() + 3.0  # several of the budget's half-second windows
        while time.monotonic() < deadline:
            response = httpx.post(f"{server.url}/predict", json={"texts": ["fine"]}, timeout=30)
            assert response.status_code == 200, response.text
            time.sleep(0.05)
        assert teams_seen[-1] < cores, teams_seen
        assert _metric(server.url, "dynaloop_model_forward_threads") == teams_seen[-1]
        assert _metric(server.url, "dynaloop_model_neighbour_cores") >= 0.5
    finally:
        server.stop()


def test_a_reload_loads_with_the_whole_team_after_the_batcher_shrank_it(
    tiny_model: Path, torch_threads_restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread torch has not seen starts with the team size torch was last given, in any thread:
    a reload after a busy spell must not time its precision plan, or size an int8 session, on
    the batcher's shrunken team."""
    import model_server.host

    loaded_with: list[int] = []
    original = model_server.host.load_backend

    def load_backend(*args: object, **kwargs: object) -> object:
        loaded_with.append(torch.get_num_threads())
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(model_server.host, "load_backend", load_backend)
    server = serve_model(ServerConfig(model_dir=tiny_model, admin_token="admin-secret-123"))
    try:
        app: Any = server.config.app
        host = app.state.host
        full_team = host.thread_budget.max_threads
        monkeypatch.setattr(host.thread_budget, "threads", lambda: 1)  # as beside a busy neighbour
        assert httpx.post(f"{server.url}/predict", json={"texts": ["fine"]}, timeout=30).status_code == 200
        assert _metric(server.url, "dynaloop_model_forward_threads") == 1.0
        response = httpx.post(
            f"{server.url}/admin/reload",
            json={"model_dir": str(tiny_model)},
            headers={"Authorization": "Bearer admin-secret-123"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert loaded_with == [full_team, full_team]  # the start-up load, then the reload
    finally:
        server.stop()
