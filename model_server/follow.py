"""A model-server replica that follows its task's promoted model (`dynaloop model-server --follow-task`).

Every ``interval_s`` the :class:`Follower`'s thread asks the :class:`Registry` for the task's
promoted model and compares it with what the replica serves (``model_id`` and ``version``).
When they differ it loads the promoted directory with :meth:`ModelHost.reload
<model_server.host.ModelHost.reload>` in a loader thread: the old model keeps serving until the
new one is loaded, then one reference swaps. After each poll it reports its state to the
registry (:class:`ReplicaStatus`): *loading*, *serving*, *failed* (the promoted version could not
be loaded; the old model still serves) or *starting* (nothing to serve yet), with a heartbeat.

Nothing here may stop the server: a registry that cannot be read or written is logged (once per
distinct problem) and tried again at the next poll, while the loaded model keeps serving. A
promoted version that failed to load is not tried again at every poll, only when a version is
promoted again (the same one included: a new promotion is a new ``promoted_at``).

The model server imports nothing of the project but ``model_server.directory``, so the registry is an
interface here; the `dynaloop model-server` command passes one backed by the database
(``rounds.models.replicas``).
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from model_server.backends import Backend
from model_server.metrics import Metrics

logger = logging.getLogger(__name__)

__all__ = ["Follower", "Host", "PromotedModel", "Registry", "ReplicaState", "ReplicaStatus"]


class ReplicaState(enum.StrEnum):
    starting = "starting"  # nothing to serve yet
    loading = "loading"  # loading the promoted model (or --model); what it had still serves
    serving = "serving"
    failed = "failed"  # the promoted model could not be loaded; what it had still serves
    stopped = "stopped"  # shut down cleanly


@dataclass(frozen=True)
class PromotedModel:
    """The task's promoted model version, as the registry holds it."""

    model_version_id: int
    model_id: str
    version: str
    directory: str
    promoted_at: dt.datetime | None

    @property
    def name(self) -> str:
        return f"{self.model_id}@{self.version}"

    @property
    def promotion(self) -> tuple[int, dt.datetime | None]:
        """One promotion of one version: promoting the same version again is a new one."""
        return (self.model_version_id, self.promoted_at)


@dataclass(frozen=True)
class ReplicaStatus:
    """What the replica reports at each poll."""

    state: ReplicaState
    model_id: str | None  # what it serves (None: nothing yet)
    version: str | None
    precision: str | None
    message: str
    target_model_version_id: int | None  # the promoted version it last read
    target_promoted_at: dt.datetime | None  # and when it was promoted


class Registry(Protocol):
    """Where the replica reads its task's promoted model and reports itself."""

    def promoted_model(self) -> PromotedModel | None:
        """The task's promoted model, or None when none is promoted; raises when unreachable."""
        ...

    def report(self, status: ReplicaStatus) -> None:
        """Record the replica's status and a heartbeat; raises when unreachable."""
        ...


class Host(Protocol):
    """What a follower needs of the model it keeps up to date: :class:`model_server.host.ModelHost`
    (an interface here, so that the host, its config and the follower import one another in one
    direction only)."""

    backend: Backend | None
    precision: str
    load_error: str | None
    metrics: Metrics

    def reload(self, model_dir: str, backend_kind: str | None, precision: str | None = None) -> Backend: ...


class Follower:
    """Keeps ``host`` serving the task's promoted model (see the module's docstring).

    ``fallback_dir`` (`--model`) is loaded when the registry has no promoted model, or cannot be
    read, or its promoted model cannot be loaded, while the replica serves nothing."""

    def __init__(self, host: Host, registry: Registry, *, interval_s: float, fallback_dir: Path | None = None) -> None:
        self.host = host
        self.registry = registry
        self.interval_s = interval_s
        self.fallback_dir = fallback_dir
        self.state = ReplicaState.starting
        self.message = "starting: reading the task's promoted model"
        self._target: PromotedModel | None = None  # the promoted model last read
        self._failed: tuple[int, dt.datetime | None] | None = None  # the promotion that failed to load
        self._failure = ""  # why it failed
        self._fallback_tried = False
        self._loader: threading.Thread | None = None
        self._lock = threading.Lock()  # state and message: written by the loader, read by the poll
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_problem: dict[str, str] = {}

    # --- the thread ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="replica-follower", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop polling and report *stopped* (best effort)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.poll()
            except Exception:  # never let the follower die: the next poll tries again
                logger.exception("the replica's poll failed; trying again in %.1f s", self.interval_s)
            self._wake.wait(self.interval_s)
            self._wake.clear()
        with self._lock:
            self.state, self.message = ReplicaState.stopped, "the replica was stopped"
        self._report()

    # --- one poll -----------------------------------------------------------------------

    def poll(self) -> None:
        """Read the promoted model, start a load if one is due, report."""
        try:
            promoted = self.registry.promoted_model()
        except Exception as exc:
            self._problem("read", f"could not read the task's promoted model ({_reason(exc)}); serving what it has")
            self._when_unread()
        else:
            self._cleared("read")
            self._target = promoted
            self._decide(promoted)
        self._report()

    def _decide(self, promoted: PromotedModel | None) -> None:
        if self._loading():
            return
        served = self._served()
        if promoted is None:
            self._failed = None
            if served is None and self._load_fallback("the task has no promoted model"):
                return
            with self._lock:
                if served is None:
                    self.state, self.message = ReplicaState.starting, "waiting: the task has no promoted model yet"
                else:
                    self.state = ReplicaState.serving
                    self.message = "the task has no promoted model; serving the model it has"
            return
        if served == (promoted.model_id, promoted.version):
            self._failed = None
            with self._lock:
                self.state, self.message = ReplicaState.serving, ""
            return
        if self._failed == promoted.promotion:
            # Not tried again until a version is promoted again; meanwhile --model may serve.
            if served is None:
                self._load_fallback(f"the promoted {promoted.name} could not be loaded")
            return
        self._start_load(promoted.directory, promoted)

    def _when_unread(self) -> None:
        if self._loading() or self._served() is not None:
            return
        self._load_fallback("the registry cannot be read")

    def _load_fallback(self, why: str) -> bool:
        if self.fallback_dir is None or self._fallback_tried:
            return False
        self._fallback_tried = True
        logger.info("%s: loading --model %s", why, self.fallback_dir)
        self._start_load(str(self.fallback_dir), None)
        return True

    # --- loading ------------------------------------------------------------------------

    def _loading(self) -> bool:
        return self._loader is not None and self._loader.is_alive()

    def _served(self) -> tuple[str, str] | None:
        backend = self.host.backend
        return None if backend is None else (backend.metadata.model_id, backend.metadata.version)

    def _start_load(self, directory: str, promoted: PromotedModel | None) -> None:
        what = promoted.name if promoted is not None else "--model"
        with self._lock:
            self.state, self.message = ReplicaState.loading, f"loading {what} from {directory}; {self._still()}"
        self._loader = threading.Thread(
            target=self._load, args=(directory, promoted), name="replica-loader", daemon=True
        )
        self._loader.start()

    def _load(self, directory: str, promoted: PromotedModel | None) -> None:
        what = promoted.name if promoted is not None else f"--model {directory}"
        try:
            new = self.host.reload(directory, None)
        except RuntimeError as exc:
            if str(exc) != "busy":
                self._load_failed(what, directory, promoted, exc)
            else:  # an admin reload holds the lock: the next poll decides again
                with self._lock:
                    self.state, self.message = ReplicaState.loading, "another reload is in progress; waiting for it"
        except Exception as exc:
            self._load_failed(what, directory, promoted, exc)
        else:
            self.host.metrics.reloads.labels("ok").inc()
            loaded = (new.metadata.model_id, new.metadata.version)
            if promoted is not None and loaded != (promoted.model_id, promoted.version):
                # Not tried again at every poll: it would load the same directory over and over.
                self._failed = promoted.promotion
                with self._lock:
                    self.state = ReplicaState.failed
                    self.message = (
                        f"{directory} holds {loaded[0]}@{loaded[1]}, not the promoted {promoted.name} (its "
                        "dynaloop_model.json changed since it was registered); serving it anyway"
                    )
                logger.error("%s", self.message)
            else:
                with self._lock:
                    if promoted is None and self._failed is not None:
                        # --model stands in for the promoted version that failed: still a failure.
                        self.state = ReplicaState.failed
                        self.message = f"{self._failure}; serving --model {loaded[0]}@{loaded[1]} instead"
                    else:
                        self.state, self.message = ReplicaState.serving, ""
                logger.info("serving %s@%s from %s", loaded[0], loaded[1], directory)
        finally:
            self._wake.set()  # report at once, not at the next interval

    def _load_failed(self, what: str, directory: str, promoted: PromotedModel | None, exc: BaseException) -> None:
        self.host.metrics.reloads.labels("failed").inc()
        if promoted is not None:
            self._failed = promoted.promotion
        message = f"could not load {what} from {directory} ({_reason(exc)}); {self._still()}"
        if promoted is not None:
            message += "; it is tried again when a version is promoted again"
            self._failure = message
        with self._lock:
            self.state, self.message = ReplicaState.failed, message
        if self.host.backend is None:
            self.host.load_error = message
        logger.error("%s", message)

    def _still(self) -> str:
        served = self._served()
        return "no model serves yet" if served is None else f"{served[0]}@{served[1]} still serves"

    # --- reporting ----------------------------------------------------------------------

    def status(self) -> ReplicaStatus:
        served = self._served()
        with self._lock:
            state, message = self.state, self.message
        return ReplicaStatus(
            state=state,
            model_id=served[0] if served else None,
            version=served[1] if served else None,
            precision=self.host.precision if served else None,
            message=message,
            target_model_version_id=self._target.model_version_id if self._target is not None else None,
            target_promoted_at=self._target.promoted_at if self._target is not None else None,
        )

    def _report(self) -> None:
        try:
            self.registry.report(self.status())
        except Exception as exc:
            self._problem("report", f"could not report to the registry ({_reason(exc)}); serving what it has")
        else:
            self._cleared("report")

    def _problem(self, kind: str, message: str) -> None:
        """Log a problem once, and again only when it changes (a database down for an hour
        would otherwise log a line per poll)."""
        if self._last_problem.get(kind) != message:
            logger.warning("%s", message)
            self._last_problem[kind] = message

    def _cleared(self, kind: str) -> None:
        if self._last_problem.pop(kind, None) is not None:
            logger.info("the registry answers again (%s)", kind)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__
