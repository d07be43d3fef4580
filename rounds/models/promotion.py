"""Promotion: putting a registered model version in the loop (docs/models.md, "Promoting without
downtime" and "Promoting to every replica that follows the task").

:func:`promote` puts a version in the loop (not one that scores below the promoted model on
a round's dev split, or near chance, unless ``confirm_worse``: :func:`check_not_worse`), one of
two ways:

* with a ``server``, it hot-swaps that running model server to the directory (``POST
  /admin/reload``), checks ``GET /info`` reports the new ``model_id``/``version``, and only
  then marks it *promoted*, retires the model promoted before it and puts the server in the
  task's open rounds' loop. The server is one an admin registered
  (:mod:`services.domain.model_servers`): its URL and admin token come from that registry, so
  the token only ever goes to the URL registered with it. Any failure leaves the database as
  it was, with a message that says what happened;
* without one, it marks the version *promoted* (the one before *retired*) and waits until
  every live replica that follows the task (:mod:`rounds.models.replicas`) serves it: the replicas
  read the registry and swap themselves, so no token travels. A replica that fails to load it,
  or does not within the time, makes it raise :class:`PromotionIncomplete`; the promotion
  stays recorded.

:func:`retire <rounds.models.registry.retire>` takes a model out of use; registering and finding
versions are :mod:`rounds.models.registry`'s.

Example::

    >>> promote(factory, "dynasent-r2", "model-1@1", server="model-0")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from rounds.models.registry import find_model
from rounds.models.replicas import PromotedVersion, ReplicaView, Rollout, wait_for_replicas
from services.db.models import ModelVersion, ModelVersionStatus, Round, RoundStatus, Task, User, utcnow
from services.domain import audit
from services.domain.model_servers import get_server, grant_loop, require_granted
from services.domain.tasks import definition_of, get_task
from services.errors import Conflict, DomainError, Invalid, NotFound

logger = logging.getLogger(__name__)

__all__ = [
    "NEAR_CHANCE_MARGIN",
    "RELOAD_TIMEOUT_S",
    "ConfirmWorse",
    "DevScore",
    "Promotion",
    "PromotionError",
    "PromotionIncomplete",
    "chance_macro_f1",
    "check_not_worse",
    "dev_scores",
    "promote",
    "promote_to_replicas",
    "reload_model_server",
]

# How long a reload may take: a large checkpoint loads in tens of seconds on a CPU.
RELOAD_TIMEOUT_S = 300.0
#: A model whose macro-F1 on a round's dev split is at most this far above chance is near chance:
#: promoting it needs confirm_worse (:func:`check_not_worse`).
NEAR_CHANCE_MARGIN = 0.05
_OPEN_ROUNDS = (RoundStatus.collecting, RoundStatus.validating)


class PromotionError(DomainError):
    """The model server did not switch to the model; nothing in the registry changed."""

    status_code = 502
    code = "promotion_failed"


class ConfirmWorse(Conflict):
    """Promoting the model would put a worse one in the loop: it scores below the promoted model
    on a round's dev split, or near chance (:func:`check_not_worse`). Nothing changed; the same
    promotion with ``confirm_worse`` goes ahead."""

    code = "confirm_worse"


@dataclass
class Promotion:
    """What :func:`promote` did."""

    model: ModelVersion
    server: str | None  # the registered model server's name (None: promoted to the following replicas)
    endpoint: str | None  # its URL
    retired: list[ModelVersion] = field(default_factory=list)
    rounds_updated: list[int] = field(default_factory=list)  # round numbers now with the server in their loop
    server_info: dict[str, Any] = field(default_factory=dict)
    rollout: Rollout | None = None  # without a server: where the version stands on the following replicas

    @property
    def replicas(self) -> list[ReplicaView]:
        return self.rollout.replicas if self.rollout is not None else []


class PromotionIncomplete(DomainError):
    """The version is promoted in the registry, but a live replica that follows the task failed
    to load it or did not within the time: the replicas disagree until it does (``promotion``
    says which replica serves what)."""

    status_code = 502
    code = "promotion_incomplete"

    def __init__(self, message: str, promotion: Promotion) -> None:
        super().__init__(message, replicas=[view.to_dict() for view in promotion.replicas])
        self.promotion = promotion


# --- is it worse? ----------------------------------------------------------------------

_ROUND_DEV_SET = re.compile(r"^round ([0-9]+) dev$")


@dataclass(frozen=True)
class DevScore:
    """A model's macro-F1 on a round's dev split, as its recorded evaluation holds it, and what
    chance scores on that split (None where it cannot be said)."""

    model: str
    model_pk: int
    round: int
    set: str
    macro_f1: float
    chance_macro_f1: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "model_id": self.model_pk,
            "round": self.round,
            "set": self.set,
            "macro_f1": round(self.macro_f1, 4),
            "chance_macro_f1": None if self.chance_macro_f1 is None else round(self.chance_macro_f1, 4),
        }


def chance_macro_f1(labels: int, *, multi_label: bool, support: dict[str, Any] | None, rows: Any) -> float | None:
    """The macro-F1 a guess scores in expectation on a set: one label drawn uniformly for each
    row (single-label), or each label with probability 1/2 (multi-label). A class with share
    ``p`` of the rows, guessed at rate ``r``, has precision ``p`` and recall ``r``, so F1 ``2pr /
    (p + r)``; macro-F1 averages that over the labels. The shares come from the set's gold counts
    (``support``, ``rows``); without them a single-label set is taken as balanced (``1/labels``)
    and a multi-label one has no figure (None)."""
    if labels < 1:
        return None
    rate = 0.5 if multi_label else 1 / labels
    counts = [c for c in (support or {}).values() if isinstance(c, int | float)]
    if counts and isinstance(rows, int | float) and rows > 0:
        shares = [c / rows for c in counts] + [0.0] * max(labels - len(counts), 0)
    elif not multi_label:
        shares = [1 / labels] * labels
    else:
        return None
    return sum(2 * p * rate / (p + rate) if p > 0 else 0.0 for p in shares) / len(shares)


def dev_scores(model: ModelVersion, *, multi_label: bool) -> dict[int, DevScore]:
    """Round number -> the model's macro-F1 on that round's dev split, from its recorded
    evaluation: the ``sets`` of rounds.models.evaluate (with their gold counts), else the ``macro_f1``
    entries named ``round N dev``."""
    evaluation = model.evaluation or {}
    labels = len(model.labels or [])
    scores: dict[int, DevScore] = {}
    for entry in evaluation.get("sets") or []:
        if not isinstance(entry, dict) or entry.get("split") != "dev" or not isinstance(entry.get("round"), int):
            continue
        value = entry.get("macro_f1")
        if isinstance(value, int | float) and math.isfinite(value):
            chance = chance_macro_f1(
                labels, multi_label=multi_label, support=entry.get("support"), rows=entry.get("rows")
            )
            name = str(entry.get("name") or f"round {entry['round']} dev")
            scores[entry["round"]] = DevScore(model.name, model.id, entry["round"], name, float(value), chance)
    for name, value in (evaluation.get("macro_f1") or {}).items():
        match = _ROUND_DEV_SET.match(str(name))
        if match is None or int(match[1]) in scores or not isinstance(value, int | float) or not math.isfinite(value):
            continue
        chance = chance_macro_f1(labels, multi_label=multi_label, support=None, rows=None)
        scores[int(match[1])] = DevScore(model.name, model.id, int(match[1]), str(name), float(value), chance)
    return scores


def check_not_worse(session: Session, task: Task, model: ModelVersion, confirm_worse: bool) -> None:
    """Refuse (:class:`ConfirmWorse`, with the scores) to promote ``model`` when, on its recorded
    evaluation, it scores below the task's promoted model on the newest round's dev split both
    were evaluated on, or its macro-F1 on the newest round's dev split it was evaluated on is
    within :data:`NEAR_CHANCE_MARGIN` of chance (:func:`chance_macro_f1`). Nothing is refused
    with ``confirm_worse``, for a model already promoted, or for one with no dev score."""
    if confirm_worse or model.status is ModelVersionStatus.promoted:
        return
    multi_label = definition_of(task).is_multi_label
    mine = dev_scores(model, multi_label=multi_label)
    if not mine:
        return
    newest = mine[max(mine)]
    promoted = session.scalars(
        select(ModelVersion)
        .where(
            ModelVersion.task_id == task.id,
            ModelVersion.status == ModelVersionStatus.promoted,
            ModelVersion.id != model.id,
        )
        .order_by(ModelVersion.promoted_at.desc(), ModelVersion.id.desc())
    ).first()
    theirs = dev_scores(promoted, multi_label=multi_label) if promoted is not None else {}
    common = sorted(set(mine) & set(theirs))
    reasons, parts = [], []
    scores = [newest]
    if common:
        compared = common[-1]
        if compared != newest.round:
            scores.append(mine[compared])
        scores.append(theirs[compared])
        if mine[compared].macro_f1 < theirs[compared].macro_f1:
            reasons.append("below_promoted")
            parts.append(
                f"{model.name} scores macro-F1 {mine[compared].macro_f1:.3f} on {mine[compared].set}, below "
                f"{theirs[compared].model}, the promoted model ({theirs[compared].macro_f1:.3f})"
            )
    chance = newest.chance_macro_f1
    if chance is not None and newest.macro_f1 <= chance + NEAR_CHANCE_MARGIN:
        reasons.append("near_chance")
        guess = "guessing each label with probability 1/2" if multi_label else "a uniformly guessed label"
        parts.append(
            f"{model.name} scores macro-F1 {newest.macro_f1:.3f} on {newest.set}, within {NEAR_CHANCE_MARGIN:g} "
            f"of chance ({chance:.3f}, what {guess} scores)"
        )
    if reasons:
        raise ConfirmWorse(
            "; ".join(parts) + ". Promote it anyway with confirm_worse (`dynaloop model promote --confirm-worse`, "
            "or Promote anyway on the Models page), or do not promote it",
            reasons=reasons,
            model=model.name,
            promoted=promoted.name if promoted is not None else None,
            scores=[score.to_dict() for score in scores],
            near_chance_margin=NEAR_CHANCE_MARGIN,
        )


# --- promoting -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    task_id: int
    task_name: str
    model_pk: int
    name: str
    model_id: str
    version: str
    directory: str
    server: str
    endpoint: str
    admin_token: str = field(repr=False)
    previous_directory: str | None  # the model promoted at this endpoint before, for a rollback


def _check_evaluated(model: ModelVersion, force: bool) -> None:
    if model.status is ModelVersionStatus.trained and not force:
        raise Conflict(
            f"model {model.name} was never evaluated, so nobody knows whether it beats the one in the loop; "
            "evaluate it first (record_evaluation / `dynaloop model register --evaluation FILE`) or pass "
            "--force to promote it anyway"
        )


def _plan(
    session: Session,
    task: Task,
    reference: str | int,
    server_name: str,
    admin_token: str | None,
    force: bool,
    confirm_worse: bool,
) -> _Plan:
    server = get_server(session, server_name)
    token = admin_token or server.admin_token
    if not token:
        raise Invalid(
            f"model server {server.name!r} is registered without an admin token, so no model can be promoted "
            f"to it; an admin sets one (PATCH /api/v1/model-servers/{server.name} with admin_token)"
        )
    endpoint = server.url
    model = find_model(session, task, reference)
    _check_evaluated(model, force)
    check_not_worse(session, task, model, confirm_worse)
    previous = session.scalar(
        select(ModelVersion).where(
            ModelVersion.task_id == task.id,
            ModelVersion.status == ModelVersionStatus.promoted,
            ModelVersion.endpoint == endpoint,
            ModelVersion.id != model.id,
        )
    )
    return _Plan(
        task.id,
        task.name,
        model.id,
        model.name,
        model.model_id,
        model.version,
        model.directory,
        server.name,
        endpoint,
        token,
        previous.directory if previous is not None else None,
    )


def _server_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return str(body["error"].get("message", ""))
    except ValueError:
        pass
    return response.text[:300]


def reload_model_server(
    http: httpx.Client,
    endpoint: str,
    directory: str,
    admin_token: str,
    *,
    backend: str | None = None,
    timeout_s: float = RELOAD_TIMEOUT_S,
) -> dict[str, Any]:
    """``POST {endpoint}/admin/reload`` and wait until it succeeds; returns the server's answer.
    Raises :class:`PromotionError` saying what went wrong (down, wrong token, cannot load)."""
    deadline = time.monotonic() + timeout_s
    body: dict[str, Any] = {"model_dir": directory}
    if backend:
        body["backend"] = backend
    while True:
        try:
            response = http.post(
                f"{endpoint}/admin/reload",
                json=body,
                headers={"Authorization": f"Bearer {admin_token}"},
                timeout=httpx.Timeout(timeout_s, connect=5.0),
            )
        except httpx.TimeoutException as exc:
            raise PromotionError(
                f"the model server at {endpoint} did not finish loading {directory} within "
                f"{timeout_s:.0f} s ({type(exc).__name__}); check its log"
            ) from exc
        except httpx.TransportError as exc:
            raise PromotionError(
                f"the model server at {endpoint} is down or unreachable ({type(exc).__name__}); "
                "start it (`dynaloop model-server --admin-token ...`) or check the URL"
            ) from exc
        if response.status_code == 200:
            try:
                answer = response.json()
            except ValueError as exc:
                raise PromotionError(
                    f"the model server at {endpoint} answered the reload with a non-JSON body"
                ) from exc
            return answer if isinstance(answer, dict) else {}
        message = _server_message(response)
        if response.status_code == 409 and time.monotonic() < deadline:
            time.sleep(0.5)  # another load (e.g. the server's start-up) holds the reload lock
            continue
        if response.status_code == 401:
            raise PromotionError(
                f"the model server at {endpoint} refused the admin token (HTTP 401); register the "
                "token it was started with (PATCH /api/v1/model-servers/{name} with admin_token)"
            )
        if response.status_code == 403:
            raise PromotionError(f"the model server at {endpoint} does not allow reloads (HTTP 403): {message}")
        if response.status_code == 422:
            raise PromotionError(f"the model server at {endpoint} could not load {directory} (HTTP 422): {message}")
        if response.status_code == 404:
            raise PromotionError(f"{endpoint} has no /admin/reload (HTTP 404); is it a dynaloop model server?")
        raise PromotionError(
            f"the model server at {endpoint} answered the reload with HTTP {response.status_code}: {message}"
        )


def _verify(http: httpx.Client, plan: _Plan) -> dict[str, Any]:
    try:
        response = http.get(f"{plan.endpoint}/info", timeout=10.0)
        info = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        raise PromotionError(
            f"the model server at {plan.endpoint} reloaded but GET /info failed "
            f"({type(exc).__name__}); check the server"
        ) from exc
    if not isinstance(info, dict):
        raise PromotionError(
            f"the model server at {plan.endpoint} reloaded but GET /info answered HTTP "
            f"{response.status_code}: {_server_message(response)}"
        )
    served = (str(info.get("model_id")), str(info.get("version")))
    if served != (plan.model_id, plan.version):
        raise PromotionError(
            f"after the reload the model server at {plan.endpoint} reports model {served[0]} "
            f"version {served[1]}, not {plan.model_id} version {plan.version}; another reload may "
            "have raced this one, or the directory's dynaloop_model.json changed"
        )
    return info


@dataclass(frozen=True)
class _Choice:
    """The version to promote and where: a registered server, or (``server`` None) the replicas
    that follow the task."""

    task_id: int
    task_name: str
    model_pk: int
    name: str
    server: str | None
    endpoint: str | None

    @classmethod
    def of(cls, plan: _Plan) -> _Choice:
        return cls(plan.task_id, plan.task_name, plan.model_pk, plan.name, plan.server, plan.endpoint)


def _record(session: Session, plan: _Choice, actor: User | None, update_open_rounds: bool) -> Promotion:
    # Lock the task row (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises) so two
    # promotions cannot both leave a model promoted.
    session.execute(select(Task.id).where(Task.id == plan.task_id).with_for_update())
    model = session.get(ModelVersion, plan.model_pk)
    if model is None:
        raise NotFound(f"model {plan.name} disappeared from the registry during the promotion")
    now = utcnow()
    retired = list(
        session.scalars(
            select(ModelVersion).where(
                ModelVersion.task_id == plan.task_id,
                ModelVersion.status == ModelVersionStatus.promoted,
                ModelVersion.id != model.id,
            )
        )
    )
    for old in retired:
        old.status = ModelVersionStatus.retired
        old.retired_at = now
    model.status = ModelVersionStatus.promoted
    model.promoted_at = now
    model.retired_at = None
    model.endpoint = plan.endpoint
    rounds_updated = []
    if update_open_rounds and plan.server is not None:
        for round_ in session.scalars(
            select(Round).where(Round.task_id == plan.task_id, Round.status.in_(_OPEN_ROUNDS)).order_by(Round.number)
        ):
            if plan.server not in (round_.model_servers or []):
                audit.record(
                    session,
                    actor,
                    "round.model",
                    "round",
                    round_.id,
                    servers=[plan.server],
                    previous=list(round_.model_servers or []),
                    reason=f"promoted {plan.name}",
                )
                round_.model_servers = [plan.server]
                rounds_updated.append(round_.number)
        if rounds_updated:
            # A server in a task's loop is granted to it (only admins and the shell's operator
            # reach here with a server not granted yet: require_granted stops researchers).
            task = session.get(Task, plan.task_id)
            if task is not None:
                grant_loop(session, actor, task, [plan.server])
    audit.record(
        session,
        actor,
        "model.promote",
        "model_version",
        model.id,
        task=plan.task_name,
        name=model.name,
        server=plan.server,
        endpoint=plan.endpoint,
        retired=[m.name for m in retired],
    )
    session.flush()
    return Promotion(
        model=model, server=plan.server, endpoint=plan.endpoint, retired=retired, rounds_updated=rounds_updated
    )


def promote(
    factory: sessionmaker[Session],
    task_name: str,
    reference: str | int,
    *,
    server: str | None,
    admin_token: str | None = None,
    http: httpx.Client | None = None,
    force: bool = False,
    confirm_worse: bool = False,
    actor_id: int | None = None,
    backend: str | None = None,
    update_open_rounds: bool = True,
    timeout_s: float = RELOAD_TIMEOUT_S,
) -> Promotion:
    """Put model ``reference`` of task ``task_name`` in the loop on the registered model server
    named ``server``, or, with ``server=None``, on the replicas that follow the task
    (:func:`promote_to_replicas`).

    The server's URL and admin token come from the registry (``model_servers``); ``admin_token``
    overrides the registered token and is for an operator at the server's shell only (`dynaloop
    model promote`), never for a request. Three steps, each in its own transaction or none, so no
    database lock is held while the model server loads the weights (on SQLite a transaction
    holds the write lock):

    1. read and check: the server is registered with an admin token, the model exists and was
       evaluated (or ``force``), and it is not worse than the promoted model nor near chance (or
       ``confirm_worse``: :func:`check_not_worse`);
    2. ``POST {endpoint}/admin/reload`` with the model directory, then ``GET /info`` must report
       its ``model_id`` and ``version``;
    3. record: the model is *promoted* (``promoted_at``, ``endpoint``: the server's URL), the
       one promoted before is *retired*, and the task's open rounds whose loop does not include
       the server get it as their only server (``update_open_rounds``).

    On any failure the registry is unchanged and :class:`PromotionError` (or another domain
    error) says what happened. Should recording fail after the server switched, the model
    promoted before at that endpoint is reloaded.

    Replicas that follow the task load the version on their own in either case.
    """
    if server is None:
        return promote_to_replicas(
            factory,
            task_name,
            reference,
            force=force,
            confirm_worse=confirm_worse,
            actor_id=actor_id,
            timeout_s=timeout_s,
        )
    with factory.begin() as session:
        task = get_task(session, task_name)
        plan = _plan(session, task, reference, server, admin_token, force, confirm_worse)
        # Checked again when the job runs: a grant revoked since it was submitted stops it.
        actor = session.get(User, actor_id) if actor_id is not None else None
        require_granted(session, actor, task, [plan.server], field="server", swap=True)
    endpoint = plan.endpoint
    own_http = http is None
    client = http or httpx.Client()
    try:
        answer = reload_model_server(
            client, endpoint, plan.directory, plan.admin_token, backend=backend, timeout_s=timeout_s
        )
        info = _verify(client, plan)
        try:
            with factory.begin() as session:
                actor = session.get(User, actor_id) if actor_id is not None else None
                result = _record(session, _Choice.of(plan), actor, update_open_rounds)
        except (DomainError, SQLAlchemyError) as exc:
            restored = _restore(client, plan, backend, timeout_s)
            reason = (
                exc.message if isinstance(exc, DomainError) else f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            )
            raise PromotionError(
                f"the model server at {endpoint} switched to {plan.name} but the registry could "
                f"not record it ({reason}); {restored}"
            ) from exc
    finally:
        if own_http:
            client.close()
    result.server_info = {**answer, **info}
    logger.info("promoted %s at %s (retired: %s)", plan.name, endpoint, [m.name for m in result.retired])
    return result


def promote_to_replicas(
    factory: sessionmaker[Session],
    task_name: str,
    reference: str | int,
    *,
    force: bool = False,
    confirm_worse: bool = False,
    actor_id: int | None = None,
    timeout_s: float = RELOAD_TIMEOUT_S,
    poll_s: float = 0.5,
) -> Promotion:
    """Promote model ``reference`` of task ``task_name`` in the registry, then wait for the
    replicas that follow the task (`dynaloop model-server --follow-task`) to serve it.

    1. read and check, as :func:`promote` does (the model exists and was evaluated, or ``force``;
       it is not worse nor near chance, or ``confirm_worse``);
    2. record: the model is *promoted* (with no ``endpoint``: no single server holds it), the
       one promoted before is *retired*; the open rounds keep their model servers (put the
       balancer in front of the replicas in their loop);
    3. wait, up to ``timeout_s``, until every live replica (:data:`rounds.models.replicas.LIVE_WITHIN_S`)
       serves it or failed to load it. Each replica swaps itself: its old model serves until
       the new one is loaded.

    Returns the promotion with its :attr:`Promotion.rollout`. Raises
    :class:`PromotionIncomplete` when a live replica failed to load the version or did not serve
    it within ``timeout_s``; the registry keeps the promotion (the replicas that loaded it serve
    it, and the others load it once they can). No live replica at all is not an error: a
    replica started later loads the promoted version when it starts.
    """
    with factory.begin() as session:
        task = get_task(session, task_name)
        model = find_model(session, task, reference)
        _check_evaluated(model, force)
        check_not_worse(session, task, model, confirm_worse)
        choice = _Choice(task.id, task.name, model.id, model.name, None, None)
    with factory.begin() as session:
        actor = session.get(User, actor_id) if actor_id is not None else None
        result = _record(session, choice, actor, update_open_rounds=False)
    with factory() as session:  # promoted_at as the replicas read it back
        stored = session.get(ModelVersion, choice.model_pk)
        assert stored is not None
        promoted = PromotedVersion(stored.id, stored.model_id, stored.version, stored.directory, stored.promoted_at)
    logger.info("promoted %s in the registry (retired: %s)", choice.name, [m.name for m in result.retired])
    result.rollout = wait_for_replicas(factory, choice.task_id, promoted, timeout_s, poll_s=poll_s)
    if not result.rollout.complete:
        raise PromotionIncomplete(
            f"{choice.name} is promoted in the registry, but not every replica serves it: {result.rollout.describe()}",
            result,
        )
    return result


def _restore(http: httpx.Client, plan: _Plan, backend: str | None, timeout_s: float) -> str:
    if plan.previous_directory is None:
        return "no model was promoted there before, so it keeps serving the new one"
    try:
        reload_model_server(
            http, plan.endpoint, plan.previous_directory, plan.admin_token, backend=backend, timeout_s=timeout_s
        )
    except PromotionError as exc:
        return f"reloading the previous model failed too ({exc.message})"
    return f"the previous model ({plan.previous_directory}) was reloaded"
