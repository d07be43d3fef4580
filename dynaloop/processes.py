"""Child processes of ``dynaloop demo``: start, wait until healthy, stop without orphans.

Each service (model server, API, web app) runs in its own session, hence its own process
group, so that

* a Ctrl-C in the terminal reaches only ``dynaloop demo``, which then stops the services in
  order, instead of every process receiving it at once and racing;
* stopping a service signals its whole group, so a grandchild it started cannot outlive it.

A service's output goes to a log file; when it fails to start, the tail of that log is
shown in the error.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

STOP_TIMEOUT_S = 10.0
RUNNING_FILE = "services.json"  # the services of a running demo, for "who holds my port?"


class ServiceError(RuntimeError):
    """A service could not start or stopped on its own; the message says which and why."""


def connect_host(host: str) -> str:
    """The address to reach a server bound to ``host`` from this machine."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def port_in_use(host: str, port: int) -> bool:
    """Whether a server could not listen on ``host:port`` (someone else is listening there).

    Binds with SO_REUSEADDR as uvicorn and Tornado do, so a port held only by connections in
    TIME_WAIT (a demo just stopped) counts as free, as it is for them.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Service:
    name: str
    url: str
    health_url: str
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None


@dataclass
class Supervisor:
    """The demo's services, stopped in reverse start order by :meth:`stop_all`."""

    log_dir: Path
    services: list[Service] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        url: str,
        health_url: str,
        env: Mapping[str, str] | None = None,
        log_name: str | None = None,
    ) -> Service:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / (log_name or f"{name.lower().replace(' ', '-')}.log")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        service = Service(name, url, health_url, log_path, process)
        self.services.append(service)
        self._write_running()
        return service

    def _write_running(self) -> None:
        path = self.log_dir / RUNNING_FILE
        if not self.services:
            path.unlink(missing_ok=True)
            return
        path.write_text(
            json.dumps([{"name": s.name, "pid": s.pid, "url": s.url} for s in self.services], indent=2) + "\n",
            encoding="utf-8",
        )

    def wait_healthy(self, service: Service, timeout_s: float) -> None:
        """Return once ``GET health_url`` answers 200; raise :class:`ServiceError` if the
        process exits first or ``timeout_s`` passes."""
        with httpx.Client(timeout=2.0) as http:

            def healthy() -> bool:
                try:
                    return http.get(service.health_url).status_code == 200
                except httpx.HTTPError:
                    return False

            self.wait_ready(service, healthy, timeout_s, f"answer {service.health_url}")

    def wait_ready(self, service: Service, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Return once ``ready()``; raise :class:`ServiceError` if the process exits first or
        ``timeout_s`` passes (``what``: what it did not do, for the message)."""
        deadline = time.monotonic() + timeout_s
        while True:
            code = service.process.poll()
            if code is not None:
                raise ServiceError(
                    f"the {service.name} exited with status {code} while starting; "
                    f"its log ({service.log_path}) ends with:\n{log_tail(service.log_path)}"
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"the {service.name} did not {what} within {timeout_s:.0f} s; its log ({service.log_path}) "
                    f"ends with:\n{log_tail(service.log_path)}"
                )
            time.sleep(0.25)

    def exited(self) -> Service | None:
        """The first service that is no longer running, if any."""
        return next((service for service in self.services if not service.running()), None)

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every service's process group (newest first), wait up to ``timeout_s`` in
        all, then SIGKILL what is left. Safe to call twice."""
        for service in reversed(self.services):
            _signal_group(service.process, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for service in reversed(self.services):
            try:
                service.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(service.process, signal.SIGKILL)
                service.process.wait()
            # Anything the service started in its group and left behind.
            _kill_leftovers(service.pid, deadline=time.monotonic() + 5.0)
        self.services.clear()
        self._write_running()


def still_running(log_dir: Path) -> list[str]:
    """Services that an earlier supervisor using ``log_dir`` started and that are still alive
    (e.g. its own process was killed with SIGKILL), as ``"name (pid N)"``."""
    try:
        entries = json.loads((log_dir / RUNNING_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    alive = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            pid = int(entry["pid"])
            os.kill(pid, 0)
        except (KeyError, TypeError, ValueError, ProcessLookupError, PermissionError):
            continue
        alive.append(f"{entry.get('name', '?')} (pid {pid})")
    return alive


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def _kill_leftovers(pgid: int, deadline: float) -> None:
    """SIGKILL what is left of group ``pgid`` once its leader is gone, and wait until it is
    dead (an orphan is reparented, so it can only be watched, not waited for)."""
    while _group_members(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    # The process leads its own group (start_new_session), so its pid is the group id.
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)
