"""Model-server replicas that follow their task's promoted model, as the registry records them.

A replica started with `dynaloop model-server --follow-task TASK` (:mod:`model_server.follow`)
reads the task's promoted :class:`~services.db.models.ModelVersion` every few seconds
(:func:`promoted_version`), loads it when it differs from what it serves, and reports itself at
every poll (:func:`record_replica`): what it serves, the promoted version it works towards, its
state and a heartbeat. No admin token is involved: the replica reads the registry, nobody
pushes to it.

A replica is *live* while its heartbeat is younger than :data:`LIVE_WITHIN_S` (and it did not
report that it stopped). A promotion
without a model server (:func:`rounds.models.promotion.promote` with ``server=None``) records the
promotion and then waits (:func:`wait_for_replicas`) until every live replica serves the new
version, has failed to load it, or the time is up; :class:`Rollout` says which is which.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.db.models import ModelReplica, ModelVersion, ModelVersionStatus, Task, utcnow
from services.db.transactions import begin_read_only

__all__ = [
    "FOLLOW_INTERVAL_S",
    "LIVE_WITHIN_S",
    "MAX_FOLLOW_INTERVAL_S",
    "PromotedVersion",
    "ReplicaReport",
    "ReplicaView",
    "Rollout",
    "list_replicas",
    "promoted_version",
    "record_replica",
    "wait_for_replicas",
]

#: How often a following replica reads the registry by default (`--follow-interval`).
FOLLOW_INTERVAL_S = 2.0
#: The longest `--follow-interval` the command accepts: liveness below is judged without knowing
#: each replica's own interval, so it must allow for the slowest one.
MAX_FOLLOW_INTERVAL_S = 5.0
#: A replica is live while its last report is younger than this: three of the longest polls plus
#: slack for a slow database write.
LIVE_WITHIN_S = 3 * MAX_FOLLOW_INTERVAL_S + 5.0

# The states a replica reports (model_server.follow.ReplicaState).
STARTING, LOADING, SERVING, FAILED, STOPPED = "starting", "loading", "serving", "failed", "stopped"


@dataclass(frozen=True)
class PromotedVersion:
    """The task's promoted model version, as a following replica needs it."""

    id: int
    model_id: str
    version: str
    directory: str
    promoted_at: dt.datetime | None

    @property
    def name(self) -> str:
        return f"{self.model_id}@{self.version}"


def promoted_version(factory: sessionmaker[Session], task_id: int) -> PromotedVersion | None:
    """The task's promoted version (the newest promotion, should there be two), read in a short
    read-only transaction; None when no version is promoted."""
    with factory() as session:
        begin_read_only(session)
        model = session.scalar(
            select(ModelVersion)
            .where(ModelVersion.task_id == task_id, ModelVersion.status == ModelVersionStatus.promoted)
            .order_by(ModelVersion.promoted_at.desc(), ModelVersion.id.desc())
            .limit(1)
        )
        found = (
            None
            if model is None
            else PromotedVersion(model.id, model.model_id, model.version, model.directory, model.promoted_at)
        )
        session.commit()
    return found


@dataclass(frozen=True)
class ReplicaReport:
    """What a replica says about itself at one poll."""

    name: str
    url: str | None
    state: str  # starting, loading, serving, failed, stopped
    model_id: str | None  # what it serves now (None: nothing yet)
    version: str | None
    precision: str | None
    message: str
    target_model_version_id: int | None  # the promoted version it last read
    target_promoted_at: dt.datetime | None  # and when that version was promoted
    started_at: dt.datetime


def record_replica(factory: sessionmaker[Session], task_id: int, report: ReplicaReport) -> None:
    """Insert or update the replica's row (task, name) with ``report`` and a fresh heartbeat.
    The version it serves is linked to the registry when the registry has it."""
    with factory.begin() as session:
        serving_id = None
        if report.model_id is not None and report.version is not None:
            serving_id = session.scalar(
                select(ModelVersion.id).where(
                    ModelVersion.task_id == task_id,
                    ModelVersion.model_id == report.model_id,
                    ModelVersion.version == report.version,
                )
            )
        target_id, target_at = report.target_model_version_id, report.target_promoted_at
        if target_id is not None and session.get(ModelVersion, target_id) is None:
            target_id = target_at = None  # deleted since it was read
        row = session.scalar(
            select(ModelReplica).where(ModelReplica.task_id == task_id, ModelReplica.name == report.name)
        )
        if row is None:
            row = ModelReplica(task_id=task_id, name=report.name)
            session.add(row)
        row.url = report.url
        row.state = report.state
        row.model_version_id = serving_id
        row.model_id = report.model_id
        row.version = report.version
        row.precision = report.precision
        row.target_model_version_id = target_id
        row.target_promoted_at = target_at
        row.message = report.message[:2000]
        row.started_at = report.started_at
        row.heartbeat_at = utcnow()


@dataclass(frozen=True)
class ReplicaView:
    """One replica as the registry shows it (`GET /tasks/{task}/model-replicas`)."""

    name: str
    url: str | None
    state: str
    model_id: str | None
    version: str | None
    model_version_id: int | None
    target_model_version_id: int | None
    target_promoted_at: dt.datetime | None
    precision: str | None
    message: str
    started_at: dt.datetime
    heartbeat_at: dt.datetime
    live: bool

    @property
    def serving(self) -> str | None:
        """``model_id@version`` of what it serves, or None."""
        return None if self.model_id is None else f"{self.model_id}@{self.version}"

    def serves(self, model_id: str, version: str) -> bool:
        return (self.model_id, self.version) == (model_id, version)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "state": self.state,
            "serving": self.serving,
            "model_id": self.model_id,
            "version": self.version,
            "precision": self.precision,
            "message": self.message,
            "live": self.live,
            "heartbeat_at": self.heartbeat_at.isoformat(),
        }

    def describe(self) -> str:
        """One line: name, what it serves, its state (and, when not live, since when)."""
        where = f" ({self.url})" if self.url else ""
        serving = self.serving or "nothing"
        text = f"{self.name}{where} serves {serving}, {self.state}"
        if not self.live:
            text += f", not live (last report {self.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC)"
        return text


def list_replicas(session: Session, task: Task, *, now: dt.datetime | None = None) -> list[ReplicaView]:
    """The task's replicas by name, each with ``live``: it reported within :data:`LIVE_WITHIN_S` and
    was not stopped."""
    now = now or utcnow()
    live_after = now - dt.timedelta(seconds=LIVE_WITHIN_S)
    rows = session.scalars(select(ModelReplica).where(ModelReplica.task_id == task.id).order_by(ModelReplica.name))
    return [
        ReplicaView(
            name=row.name,
            url=row.url,
            state=row.state,
            model_id=row.model_id,
            version=row.version,
            model_version_id=row.model_version_id,
            target_model_version_id=row.target_model_version_id,
            target_promoted_at=row.target_promoted_at,
            precision=row.precision,
            message=row.message,
            started_at=row.started_at,
            heartbeat_at=row.heartbeat_at,
            live=row.heartbeat_at > live_after and row.state != STOPPED,
        )
        for row in rows
    ]


@dataclass
class Rollout:
    """Where a promoted version stands on the live replicas of its task."""

    model_version_id: int
    promoted_at: dt.datetime | None
    model_id: str
    version: str
    serving: list[ReplicaView] = field(default_factory=list)  # live, serve it
    failed: list[ReplicaView] = field(default_factory=list)  # live, failed to load it
    pending: list[ReplicaView] = field(default_factory=list)  # live, not there yet
    not_live: list[ReplicaView] = field(default_factory=list)  # not waited for
    waited_s: float = 0.0

    @classmethod
    def of(cls, views: list[ReplicaView], promoted: PromotedVersion, waited_s: float = 0.0) -> Rollout:
        rollout = cls(promoted.id, promoted.promoted_at, promoted.model_id, promoted.version, waited_s=waited_s)
        for view in views:
            if not view.live:
                rollout.not_live.append(view)
            elif view.serves(promoted.model_id, promoted.version):
                rollout.serving.append(view)
            elif view.state == FAILED and (view.target_model_version_id, view.target_promoted_at) == (
                promoted.id,
                promoted.promoted_at,
            ):
                # It failed on this promotion, not on an earlier one of the same version.
                rollout.failed.append(view)
            else:
                rollout.pending.append(view)
        return rollout

    @property
    def replicas(self) -> list[ReplicaView]:
        return sorted([*self.serving, *self.failed, *self.pending, *self.not_live], key=lambda view: view.name)

    @property
    def complete(self) -> bool:
        """Every live replica serves the version (also true when no replica is live)."""
        return not self.failed and not self.pending

    def describe(self) -> str:
        """What happened, in one paragraph."""
        name = f"{self.model_id}@{self.version}"
        if not (self.serving or self.failed or self.pending):
            return (
                "no live replica follows the task, so none serves it yet; a replica started with "
                "`dynaloop model-server --follow-task` loads it when it starts"
            )
        parts = []
        if self.serving:
            parts.append(f"{len(self.serving)} serve it ({', '.join(v.name for v in self.serving)})")
        for view in self.failed:
            parts.append(f"{view.name} failed to load it and still serves {view.serving or 'nothing'}: {view.message}")
        for view in self.pending:
            parts.append(
                f"{view.name} did not serve it within {self.waited_s:.0f} s (it serves {view.serving or 'nothing'}, "
                f"{view.state}{': ' + view.message if view.message else ''})"
            )
        text = f"of the {len(self.serving) + len(self.failed) + len(self.pending)} live replica(s), " + "; ".join(parts)
        if not self.complete:
            text += (
                f". The registry keeps {name} promoted: the replicas that loaded it serve it; the others keep "
                "serving their model, a replica still loading serves it once loaded, and one that failed "
                "tries again only when a version is promoted again (fix the cause, then promote it again)"
            )
        return text


def _rollout(factory: sessionmaker[Session], task_id: int, version: PromotedVersion, waited_s: float) -> Rollout:
    with factory() as session:
        begin_read_only(session)
        task = session.get(Task, task_id)
        views = list_replicas(session, task) if task is not None else []
        session.commit()
    return Rollout.of(views, version, waited_s)


def wait_for_replicas(
    factory: sessionmaker[Session],
    task_id: int,
    version: PromotedVersion,
    timeout_s: float,
    *,
    poll_s: float = 0.5,
    on_wait: Callable[[Rollout], None] | None = None,
) -> Rollout:
    """Wait until every live replica of the task serves ``version`` or failed to load it, or
    ``timeout_s`` passed; returns where the rollout stands then. Each check is a short read-only
    transaction (no lock is held while the replicas load)."""
    started = time.monotonic()
    while True:
        rollout = _rollout(factory, task_id, version, time.monotonic() - started)
        if not rollout.pending or rollout.waited_s >= timeout_s:
            return rollout
        if on_wait is not None:
            on_wait(rollout)
        time.sleep(min(poll_s, max(0.0, timeout_s - rollout.waited_s)))
