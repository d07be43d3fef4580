"""The registry of model servers: the only URLs the API and its jobs ever call.

An admin registers a server (a name, its URL, optionally its admin token); researchers name
registered servers when they put a model in a round's loop or promote a model, and the name is
resolved to the URL when the call is made. So no request can make the API call a URL, or send
a server's admin token anywhere, that an admin did not register.

Which hosts are allowed is the admin's decision: a local server (``http://127.0.0.1:8001``, the
demo's Model 0) is as valid as a remote one. What is refused is what no model server URL
needs: a scheme other than http(s), credentials in the URL (``user:pass@``), a query or a
fragment.

Servers belong to tasks. An admin grants a registered server to tasks (:func:`grant`); a task's
researchers may put in its rounds' loop, and promote its models to, only servers granted to that
task (:func:`require_granted`). A server granted to more than one task is *shared*: several
tasks' attempts are scored by it, so swapping its model (a promotion) changes other tasks' fooled
flags and bonuses; only an admin may do that. Whoever runs the ``dynaloop`` commands (the
server's shell, ``actor=None``) and admins are not bound by grants.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from services.db.models import ModelServer, ModelServerGrant, Role, Round, RoundStatus, Task, User, utcnow
from services.db.statements import table_of
from services.domain import audit
from services.errors import Conflict, Forbidden, Invalid, NotFound

NAME_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
NAME_MAX = 63
URL_MAX = 500
TOKEN_MAX = 500
DESCRIPTION_MAX = 2000
#: Most servers in one round's loop.
MAX_PER_ROUND = 20
_OPEN = (RoundStatus.collecting, RoundStatus.validating)


@dataclass(frozen=True)
class ServerAddress:
    """A registered server as a call needs it, read inside a transaction and used outside."""

    name: str
    url: str


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise Invalid(
            f"model server name {str(name)[:80]!r} is not a slug; use 1-{NAME_MAX} lowercase letters, digits "
            "and hyphens, starting and ending with a letter or digit (e.g. model-0)"
        )
    return name


def check_url(url: str) -> str:
    """``url`` as stored: http(s), a host, no credentials, query or fragment, no trailing slash."""
    if not isinstance(url, str):
        raise Invalid("the model server URL must be a string such as http://127.0.0.1:8001")
    cleaned = url.strip().rstrip("/")
    shown = cleaned[:100]
    if len(cleaned) > URL_MAX:
        raise Invalid(f"the model server URL is {len(cleaned)} characters long; at most {URL_MAX}")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in cleaned):
        raise Invalid("the model server URL contains spaces or control characters; remove them")
    try:
        parts = urlsplit(cleaned)
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError as exc:
        raise Invalid(f"the model server URL {shown!r} is malformed ({exc}); give e.g. http://127.0.0.1:8001") from exc
    if parts.scheme not in ("http", "https"):
        raise Invalid(f"the model server URL {shown!r} is not http(s); give e.g. http://127.0.0.1:8001")
    if not parts.hostname:
        raise Invalid(f"the model server URL {shown!r} has no host; give e.g. http://127.0.0.1:8001")
    if "@" in parts.netloc:
        raise Invalid(
            "the model server URL holds credentials (user:password@); register the server without them "
            "(its admin token is registered separately)"
        )
    if parts.query or parts.fragment or cleaned.endswith(("?", "#")):
        raise Invalid(f"the model server URL {shown!r} has a query or fragment; give the server's base URL only")
    return cleaned


def _check_token(token: str | None) -> str | None:
    if token is None:
        return None
    if not token or len(token) > TOKEN_MAX or any(ord(c) < 0x21 or ord(c) == 0x7F for c in token):
        raise Invalid(f"the admin token must be 1-{TOKEN_MAX} printable characters without spaces")
    return token


def _check_description(description: str | None) -> str | None:
    if description is None:
        return None
    if len(description) > DESCRIPTION_MAX:
        raise Invalid(f"the description is {len(description)} characters long; at most {DESCRIPTION_MAX}")
    if any((ord(c) < 0x20 and c not in "\n\t") or ord(c) == 0x7F for c in description):
        raise Invalid("the description contains control characters; remove them")
    return description


def name_for_url(url: str, taken: Iterable[str]) -> str:
    """A free name derived from ``url``'s host and port: ``http://127.0.0.1:8001`` -> ``127-0-0-1-8001``."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    base = re.sub(r"[^a-z0-9]+", "-", f"{host}-{port}" if port else host).strip("-")[:50].strip("-") or "server"
    used = set(taken)
    name, n = base, 1
    while name in used:
        n += 1
        name = f"{base}-{n}"
    return name


def list_servers(session: Session) -> list[ModelServer]:
    return list(session.scalars(select(ModelServer).order_by(ModelServer.name)))


def _is_name(name: object) -> bool:
    return isinstance(name, str) and NAME_PATTERN.fullmatch(name) is not None


def find_server(session: Session, name: str) -> ModelServer | None:
    # Not a slug: not registered (and never sent to the database: PostgreSQL refuses NUL).
    if not _is_name(name):
        return None
    return session.scalar(select(ModelServer).where(ModelServer.name == name))


def get_server(session: Session, name: str) -> ModelServer:
    server = find_server(session, name)
    if server is None:
        raise NotFound(f"no model server named {str(name)[:80]!r} is registered; GET /api/v1/model-servers lists them")
    return server


def find_by_url(session: Session, url: str) -> ModelServer | None:
    return session.scalar(select(ModelServer).where(ModelServer.url == check_url(url)).order_by(ModelServer.id))


def register(
    session: Session,
    actor: User | None,
    name: str,
    url: str,
    *,
    admin_token: str | None = None,
    description: str | None = None,
) -> ModelServer:
    """Register a model server (admins). The admin token is stored for promotions and never shown."""
    check_name(name)
    url = check_url(url)
    if find_server(session, name) is not None:
        raise Conflict(f"a model server named {name!r} is already registered; choose another name or change it")
    server = ModelServer(
        name=name,
        url=url,
        admin_token=_check_token(admin_token),
        description=_check_description(description),
        created_by_id=actor.id if actor else None,
    )
    session.add(server)
    session.flush()
    audit.record(
        session, actor, "model_server.register", "model_server", name, url=url, admin_token=admin_token is not None
    )
    return server


_UNSET = object()


def update(
    session: Session,
    actor: User | None,
    server: ModelServer,
    *,
    url: str | None = None,
    admin_token: str | object | None = _UNSET,
    description: str | object | None = _UNSET,
) -> ModelServer:
    """Change a server's URL, admin token (None removes it) or description (admins)."""
    changed: dict[str, object] = {}
    if url is not None:
        server.url = check_url(url)
        changed["url"] = server.url
    if admin_token is not _UNSET:
        server.admin_token = _check_token(admin_token if isinstance(admin_token, str) else None)
        changed["admin_token"] = "set" if server.admin_token else "removed"
    if description is not _UNSET:
        server.description = _check_description(description if isinstance(description, str) else None)
        changed["description"] = True
    if changed:
        server.updated_at = utcnow()
        session.flush()
        audit.record(session, actor, "model_server.update", "model_server", server.name, **changed)
    return server


def rounds_using(session: Session, name: str, *, open_only: bool = True) -> list[Round]:
    query = select(Round).order_by(Round.id)
    if open_only:
        query = query.where(Round.status.in_(_OPEN))
    return [r for r in session.scalars(query) if name in (r.model_servers or [])]


def remove(session: Session, actor: User | None, server: ModelServer) -> None:
    """Remove a server (admins); refused while an open round has it in its loop."""
    using = rounds_using(session, server.name)
    if using:
        shown = ", ".join(f"{r.task.name} round {r.number}" for r in using[:10])
        raise Conflict(
            f"model server {server.name!r} is in the loop of open round(s) ({shown}); put another server in "
            "their loop (PUT /api/v1/rounds/{id}/model) or close them first"
        )
    name = server.name
    session.delete(server)
    session.flush()
    audit.record(session, actor, "model_server.remove", "model_server", name)


def check_names(session: Session, names: list[str], *, field: str = "model_servers") -> list[str]:
    """``names`` if each is a registered server, listed once; else :class:`Invalid` naming the unknown."""
    if len(names) > MAX_PER_ROUND:
        raise Invalid(f"{field}: {len(names)} servers; at most {MAX_PER_ROUND}")
    cleaned = [name.strip() if isinstance(name, str) else name for name in names]
    if len(set(cleaned)) != len(cleaned):
        raise Invalid(f"{field} lists the same server twice; list each once")
    candidates = [name for name in cleaned if _is_name(name)]
    known = (
        set(session.scalars(select(ModelServer.name).where(ModelServer.name.in_(candidates)))) if candidates else set()
    )
    unknown = [str(name)[:80] for name in cleaned if name not in known]
    if unknown:
        registered = ", ".join([s.name for s in list_servers(session)][:50])
        verb = "is" if len(unknown) == 1 else "are"
        raise Invalid(
            f"{field}: {', '.join(repr(n) for n in unknown)} {verb} not a registered model server; registered: "
            f"{registered or 'none (an admin registers them: POST /api/v1/model-servers)'}",
            unknown=unknown,
        )
    return cleaned


# Read by every writer's check: built once (services/db/statements.py).
# Core, not the ORM (services/db/statements.py): two columns.
_servers = table_of(ModelServer).c
_ADDRESSES = select(_servers.name, _servers.url).where(_servers.name.in_(bindparam("names", expanding=True)))


def addresses(session: Session, names: list[str]) -> list[ServerAddress]:
    """The registered servers among ``names``, in that order (a name removed since is skipped)."""
    if not names:
        return []
    urls = dict(session.execute(_ADDRESSES, {"names": names}).all())
    return [ServerAddress(name, urls[name]) for name in names if name in urls]


# --- grants: which tasks may use a server ------------------------------------------------------

GRANT_HINT = "an admin grants servers to tasks: PUT /api/v1/model-servers/{name}/tasks/{task}"


def granted_tasks(session: Session, server: ModelServer) -> list[Task]:
    """The tasks ``server`` is granted to, by name."""
    return list(
        session.scalars(
            select(Task)
            .join(ModelServerGrant, ModelServerGrant.task_id == Task.id)
            .where(ModelServerGrant.server_id == server.id)
            .order_by(Task.name)
        )
    )


def granted_names(session: Session, task: Task) -> list[str]:
    """The names of the servers granted to ``task``, in name order."""
    return list(
        session.scalars(
            select(ModelServer.name)
            .join(ModelServerGrant, ModelServerGrant.server_id == ModelServer.id)
            .where(ModelServerGrant.task_id == task.id)
            .order_by(ModelServer.name)
        )
    )


def grant_counts(session: Session, names: list[str]) -> dict[str, int]:
    """How many tasks each of ``names`` is granted to (a name granted to none is left out)."""
    if not names:
        return {}
    rows = session.execute(
        select(ModelServer.name, func.count(ModelServerGrant.id))
        .join(ModelServerGrant, ModelServerGrant.server_id == ModelServer.id)
        .where(ModelServer.name.in_(names))
        .group_by(ModelServer.name)
    ).all()
    return {str(name): int(count) for name, count in rows}


def grants(session: Session, *, server: ModelServer | None = None, task: Task | None = None) -> list[ModelServerGrant]:
    """The grants of ``server`` and/or ``task``, by server name then task name."""
    query = (
        select(ModelServerGrant)
        .join(ModelServer, ModelServerGrant.server_id == ModelServer.id)
        .join(Task, ModelServerGrant.task_id == Task.id)
        .order_by(ModelServer.name, Task.name)
    )
    if server is not None:
        query = query.where(ModelServerGrant.server_id == server.id)
    if task is not None:
        query = query.where(ModelServerGrant.task_id == task.id)
    return list(session.scalars(query))


def _find_grant(session: Session, server: ModelServer, task: Task) -> ModelServerGrant | None:
    return session.scalar(
        select(ModelServerGrant).where(ModelServerGrant.server_id == server.id, ModelServerGrant.task_id == task.id)
    )


def get_grant(session: Session, server: ModelServer, task: Task) -> ModelServerGrant:
    """``server``'s grant to ``task``, or :class:`NotFound`."""
    row = _find_grant(session, server, task)
    if row is None:
        raise NotFound(
            f"model server {server.name!r} is not granted to task {task.name!r}; GET "
            f"/api/v1/model-servers/{server.name}/tasks lists the tasks it is granted to"
        )
    return row


def grant(session: Session, actor: User | None, server: ModelServer, task: Task) -> tuple[ModelServerGrant, bool]:
    """Grant ``server`` to ``task`` (admins): its researchers may then put it in their rounds'
    loop and, while no other task has it, promote their models to it. Granting again changes
    nothing; the answer's second item says whether the grant is new."""
    existing = _find_grant(session, server, task)
    if existing is not None:
        return existing, False
    row = ModelServerGrant(server_id=server.id, task_id=task.id, granted_by_id=actor.id if actor else None)
    session.add(row)
    session.flush()
    shared_with = len(granted_tasks(session, server)) - 1
    audit.record(
        session, actor, "model_server.grant", "model_server", server.name, task=task.name, shared_with=shared_with
    )
    return row, True


def revoke(session: Session, actor: User | None, server: ModelServer, task: Task) -> None:
    """Take ``server`` away from ``task`` (admins); refused while one of the task's open rounds
    has it in its loop (its writers would lose the model mid-round)."""
    row = get_grant(session, server, task)
    using = [r for r in rounds_using(session, server.name) if r.task_id == task.id]
    if using:
        shown = ", ".join(f"round {r.number}" for r in using)
        raise Conflict(
            f"model server {server.name!r} is in the loop of task {task.name!r}'s open {shown}; put another "
            "server in its loop (PUT /api/v1/rounds/{id}/model) or close it first"
        )
    session.delete(row)
    session.flush()
    audit.record(session, actor, "model_server.revoke", "model_server", server.name, task=task.name)


def _bound_by_grants(actor: User | None) -> bool:
    # The shell's operator (actor None) and admins manage the registry itself.
    return actor is not None and not actor.has_role(Role.admin)


def require_granted(
    session: Session,
    actor: User | None,
    task: Task,
    names: list[str],
    *,
    field: str = "model_servers",
    swap: bool = False,
) -> list[str]:
    """``names`` (checked as :func:`check_names` does) if ``actor`` may use each for ``task``:
    a researcher only servers granted to ``task``, and with ``swap`` (a promotion hot-swaps the
    server's model) only servers granted to no other task. Admins and the shell's operator
    (``actor`` None) are not bound by grants. Otherwise :class:`Forbidden` names the servers
    granted to ``task`` and nothing is changed; ``force`` or any other option cannot lift it.

    Called by the routes and use cases that put a server in a round's loop or promote to one
    (dynaloop/api/routes/rounds.py, rounds/models/jobs.py when a promote job is submitted, and again by
    rounds/models/promotion.py when it runs)."""
    names = check_names(session, names, field=field)
    if not _bound_by_grants(actor):
        return names
    granted = granted_names(session, task)
    refused = [name for name in names if name not in granted]
    if refused:
        verb = "is" if len(refused) == 1 else "are"
        raise Forbidden(
            f"{field}: {', '.join(repr(n) for n in refused)} {verb} not granted to task {task.name!r}; "
            f"granted to it: {', '.join(granted) if granted else 'none'} ({GRANT_HINT})",
            granted=granted,
            refused=refused,
        )
    if swap:
        shared = {name: count for name, count in grant_counts(session, names).items() if count > 1}
        if shared:
            shown = ", ".join(f"{name!r} (granted to {count} tasks)" for name, count in sorted(shared.items()))
            raise Forbidden(
                f"{field}: {shown} is shared with other tasks, whose attempts it also scores, so only an "
                "admin may swap its model; promote without a server to the replicas that follow your "
                f"task, or ask an admin to grant your task a server of its own (granted to task {task.name!r}: "
                f"{', '.join(granted)})",
                granted=granted,
                shared=sorted(shared),
            )
    return names


def grant_loop(session: Session, actor: User | None, task: Task, names: list[str]) -> None:
    """Grant ``task`` each server of ``names`` that is now in one of its rounds' loops and not
    granted to it yet: a server that scores a task's attempts belongs to it (and, granted to
    another task too, becomes shared). Researchers only reach here with servers already
    granted (:func:`require_granted`); an admin's or the shell's choice is recorded this way."""
    granted = set(granted_names(session, task))
    for name in names:
        if name not in granted:
            server = find_server(session, name)
            if server is not None:
                grant(session, actor, server, task)
