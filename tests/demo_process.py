"""`dynaloop demo` as a real child process, for the demo and browser tests.

Tests start the demo with a tiny Model 0 (one epoch on 20 seed sentences per label, 16 word
pieces): the real MiniLM weights, trained briefly. It is trained once per test session into a
shared folder that every demo's data directory links to, so only the first demo trains.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from dynaloop.model_zero import MODELS_DIR, ModelZeroSpec, ensure_model_zero
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
TINY_SPEC = ModelZeroSpec(epochs=1, per_label=20, max_length=16)
TINY_ARGS = ["--model-epochs", "1", "--seed-per-label", "20", "--model-max-length", "16"]
# DYNALOOP_TEST_DEMO_MODEL=full: the demo's own Model 0 instead (a minute or two of training;
# used to take the README's screenshots, where the tiny model's ~1/3 probabilities say little).
if os.environ.get("DYNALOOP_TEST_DEMO_MODEL") == "full":
    TINY_SPEC, TINY_ARGS = ModelZeroSpec(), []
READY_LINE = "press Ctrl-C to stop"
# The console script the README runs; `python -m dynaloop` where it is not installed.
_SCRIPT = Path(sys.executable).with_name("dynaloop")
DYNALOOP = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "dynaloop"]


# Debian's chromium and chromium-driver (.ci/run installs them): Selenium is pointed at this
# driver, so Selenium Manager never downloads one.
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def chromium_missing() -> list[str]:
    """What the headless browser needs and this machine lacks (empty when it can run)."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.is_file()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install -e '.[test]')")
    return missing


def headless_chromium(width: int = 1280, height: int = 900) -> Any:
    """Debian's Chromium, headless, driven by Selenium through Debian's chromedriver, with a
    ``width`` x ``height`` viewport (the window size would include the browser's own frame).
    The browser test and bench/web_app.py use this one set-up; the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--disable-extensions",
        "--no-first-run",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
    except BaseException:
        driver.quit()
        raise
    return driver


def tiny_model_cache(base: Path) -> Path:
    """A data folder holding the tiny Model 0 (trained on the first call of the session)."""
    ensure_model_zero(base, TINY_SPEC, task_name="dynasent-r2", progress=False)
    return base


def distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@dataclass
class RunningDemo:
    process: subprocess.Popen[str]
    data_dir: Path
    api_url: str
    model_url: str
    ui_url: str
    lines: list[str] = field(default_factory=list)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def service_pids(self) -> dict[str, int]:
        """The pid of each service, from the demo's `NAME  URL  (pid N, log ...)` lines."""
        pids = {}
        for line in self.lines:
            match = re.match(r"^(model server|API|web app)\s+http\S+.*\(pid (\d+),", line)
            if match:
                pids[match.group(1)] = int(match.group(2))
        return pids

    def stop(self, signum: int = signal.SIGINT, timeout_s: float = 60.0) -> int:
        self.process.send_signal(signum)
        return self.process.wait(timeout=timeout_s)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_members(pgids: set[int]) -> list[int]:
    """Live processes in any of the process groups ``pgids``."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) in pgids and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


@contextmanager
def running_demo(
    data_dir: Path,
    *args: str,
    model_cache: Path | None = None,
    ui: bool = False,
    timeout_s: float = 240.0,
    env: dict[str, str] | None = None,
) -> Iterator[RunningDemo]:
    """Start `dynaloop demo` on free ports and wait until it says it is running.

    On the way out it is stopped with SIGINT if still running, and anything left of it is
    killed, so a failing test leaves no processes behind."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if model_cache is not None and not (data_dir / MODELS_DIR).exists():
        (data_dir / MODELS_DIR).symlink_to(model_cache / MODELS_DIR, target_is_directory=True)
    api_port, model_port, ui_port = distinct_free_ports(3)
    command = [
        *DYNALOOP,
        "demo",
        "--data-dir",
        str(data_dir),
        "--port",
        str(api_port),
        "--model-port",
        str(model_port),
        "--ui-port",
        str(ui_port),
        *TINY_ARGS,
        *([] if ui else ["--no-ui"]),
        *args,
    ]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(env or {})},
    )
    demo = RunningDemo(
        process,
        data_dir,
        f"http://127.0.0.1:{api_port}",
        f"http://127.0.0.1:{model_port}",
        f"http://127.0.0.1:{ui_port}",
    )
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            demo.lines.append(line)
            if READY_LINE in line:
                ready.set()
        ready.set()  # the demo exited

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"dynaloop demo did not start within {timeout_s:.0f} s:\n{demo.output}")
        yield demo
    finally:
        pids = demo.service_pids().values()
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for pid in pids:  # only if the demo failed to stop them
            try:
                if alive(pid) and os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        reader.join(timeout=5)
