"""``dynaloop demo``: the whole stack on one machine, with a DynaSent-style task.

Two parts:

* :func:`set_up_demo` -- the database: migrations, the ``dynasent-r2`` task, its round 1
  with the demo prompts and study links, one login per role. Idempotent: running it again
  keeps the data and what the researcher did (round 1 is opened only while the task has no
  round; prompts and links go to round 1 only, while it is open) and issues fresh tokens for
  the demo users.
* :func:`run_demo` -- the processes: the model server serving the task's promoted model, or
  Model 0 (:mod:`dynaloop.model_zero`, trained once and cached) while no model is promoted,
  the API and the Streamlit web app, each a child process in its own process group
  (:mod:`dynaloop.processes`). It waits until each one answers its health check, prints the
  addresses and logins, and on Ctrl-C or SIGTERM stops them all.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.table import Table
from sqlalchemy import select
from sqlalchemy.orm import Session

from dynaloop.model_zero import ModelZeroSpec, ensure_model_zero
from dynaloop.processes import Service, ServiceError, Supervisor, connect_host, port_in_use, still_running
from services.db.engine import make_engine, make_sessionmaker, session_scope
from services.db.migrate import upgrade
from services.db.models import Platform, Prompt, Round, RoundStatus, StudyLink, StudyRole, Task, TaskRole, User
from services.domain import members, model_servers, round_lifecycle, study, tasks, users
from services.errors import DomainError
from services.settings import Settings
from services.taskdef import example_path

DEMO_TASK = "dynasent-r2"
DEMO_PROMPTS = Path(__file__).parent / "demo_prompts.jsonl"
# Demo accounts: (role, username, roles). Their password is "<username>-demo-only" -- a demo only.
DEMO_USERS = [
    ("admin", "admin", ["admin", "researcher"]),
    ("researcher", "researcher", ["researcher"]),
    ("writer", "writer", ["writer"]),
    *[("validator", f"validator{i}", ["validator"]) for i in range(1, 6)],
    ("client", "client", ["client"]),  # a REST client: pulls built datasets, writes nothing
]
DEMO_OWNER = "researcher"  # the demo task's owner
# The demo's study links (generic platform, the worker's id in `?worker=`): (name, role, quota).
# (name, role, quota): examples per writer, labels per validator.
DEMO_STUDY_LINKS = [("demo writers", StudyRole.writer, 3), ("demo validators", StudyRole.validator, 5)]
DEMO_ID_PARAMETER = "worker"


@dataclass
class DemoLogin:
    role: str
    username: str
    password: str
    token: str


@dataclass
class DemoStudyLink:
    name: str
    role: str
    slug: str
    closed: str | None = None  # why it takes no workers (services/domain/study.py closed_reason); None: open

    def url(self, web_url: str, worker: str = "demo-1") -> str:
        """The link as a crowdworker opens it, with an example worker id."""
        return f"{web_url.rstrip('/')}/study/{self.slug}?{DEMO_ID_PARAMETER}={worker}"


@dataclass
class DemoSetup:
    database_url: str
    task: str
    round_id: int  # the demo's round: round 1 of the task
    round_number: int
    prompts: int
    model_servers: list[str]  # registered names, in the round's loop
    model_endpoints: list[str]  # their URLs (printed for the operator)
    logins: list[DemoLogin] = field(default_factory=list)
    study_links: list[DemoStudyLink] = field(default_factory=list)
    round_status: str = RoundStatus.collecting.value


#: The name the demo registers its own model server (Model 0) under.
DEMO_SERVER = "model-0"


def register_demo_servers(session: Session, urls: list[str], admin_token: str | None) -> list[str]:
    """Register the demo's model servers and return their names. With ``admin_token``, ``urls``
    is the demo's own server: it is (re-)registered as ``model-0`` with this start's token and
    port. Otherwise each URL (`--model-endpoint`) is registered under a name from its host and
    port, or found registered already. The operator who starts the demo is its admin."""
    if admin_token is not None:
        existing = model_servers.find_server(session, DEMO_SERVER)
        if existing is None:
            model_servers.register(
                session, None, DEMO_SERVER, urls[0], admin_token=admin_token, description="the demo's Model 0"
            )
        else:
            model_servers.update(session, None, existing, url=urls[0], admin_token=admin_token)
        return [DEMO_SERVER]
    names = []
    for url in urls:
        found = model_servers.find_by_url(session, url)
        if found is None:
            taken = [s.name for s in model_servers.list_servers(session)]
            found = model_servers.register(
                session, None, model_servers.name_for_url(model_servers.check_url(url), taken), url
            )
        names.append(found.name)
    return names


def set_up_demo(settings: Settings, model_endpoints: list[str], admin_token: str | None = None) -> DemoSetup:
    url = settings.resolved_database_url
    upgrade(url)
    engine = make_engine(url)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            logins = []
            for role, username, roles in DEMO_USERS:
                password = f"{username}-demo-only"
                user = session.scalar(select(User).where(User.username == username))
                if user is None:
                    user = users.create_user(session, None, username, roles, password=password)
                else:
                    users.set_password(session, None, user, password)
                _, token = users.issue_token(session, None, user, name="demo", expires_in_days=30)
                logins.append(DemoLogin(role, username, password, token))
            # The demo researcher owns the task (also in a database made before task ownership).
            owner = session.scalar(select(User).where(User.username == DEMO_OWNER))
            task = session.scalar(select(Task).where(Task.name == DEMO_TASK))
            if task is None:
                task = tasks.create_task(
                    session, None, example_path(DEMO_TASK).read_text(encoding="utf-8"), owner=owner
                )
            elif owner is not None and task.member_role(owner) is None:
                members.set_member(session, None, task, DEMO_OWNER, TaskRole.owner)
            servers = register_demo_servers(session, model_endpoints, admin_token) if model_endpoints else []
            # The demo's servers belong to its task: its researcher may promote to them.
            for name in servers:
                model_servers.grant(session, None, model_servers.get_server(session, name), task)
            # The demo's round is round 1, opened only while the task has no round: a rerun never
            # opens another round, nor touches a round the researcher opened.
            round_ = session.scalar(select(Round).where(Round.task_id == task.id, Round.number == 1))
            if round_ is None:
                round_ = round_lifecycle.create_round(session, None, task, model_servers=servers)
            still_open = round_.status in DEMO_ROUND_OPEN
            if still_open and servers:
                round_lifecycle.set_model_servers(session, None, round_, servers)
            if still_open:
                round_lifecycle.import_prompts(session, None, round_, DEMO_PROMPTS.read_bytes(), "jsonl")
            prompt_count = len(list(session.scalars(select(Prompt.id).where(Prompt.round_id == round_.id))))
            in_loop = model_servers.addresses(session, list(round_.model_servers))
            links = demo_study_links(session, task, round_)
            return DemoSetup(
                url,
                task.name,
                round_.id,
                round_.number,
                prompt_count,
                [s.name for s in in_loop],
                [s.url for s in in_loop],
                logins,
                [DemoStudyLink(link.name, link.role.value, link.slug, study.closed_reason(link)) for link in links],
                round_.status.value,
            )
    finally:
        engine.dispose()


DEMO_ROUND_OPEN = (RoundStatus.collecting, RoundStatus.validating)


def demo_study_links(session: Session, task: Task, round_: Round) -> list[StudyLink]:
    """A writer and a validator study link on the demo round, found again on a later run as
    they are (closed ones stay closed: by the researcher, or with their round); made only while
    the round is open."""
    existing: dict[tuple[str, StudyRole], StudyLink] = {}
    for found in study.list_links(session, task):  # oldest first: the first open one, else the newest
        key = (found.name, found.role)
        if found.round_id == round_.id and (key not in existing or study.closed_reason(existing[key]) is not None):
            existing[key] = found
    links = []
    for name, role, quota in DEMO_STUDY_LINKS:
        link = existing.get((name, role))
        if link is None:
            if round_.status not in DEMO_ROUND_OPEN:
                continue
            link = study.create_link(
                session,
                None,
                task,
                name=name,
                round_id=round_.id,
                role=role,
                platform=Platform.generic,
                quota=quota,
                id_parameter=DEMO_ID_PARAMETER,
                # The demo prints both links with the same example id: one worker may try both.
                other_role_allowed=True,
            )
        links.append(link)
    return links


def print_study_links(console: Console, setup: DemoSetup, web_url: str) -> None:
    console.print(
        f"study links (a crowdworker's first visit; any `{DEMO_ID_PARAMETER}=` id is a new worker, no password):"
    )
    for link in setup.study_links:
        if link.closed is None:
            # Plain print: the URL must stay on one line to be copied.
            print(f"  {link.role:<12} {link.url(web_url)}")
        else:
            console.print(f"  {link.role:<12} (takes no workers: {link.closed})", soft_wrap=True, highlight=False)
    if setup.round_status not in (status.value for status in DEMO_ROUND_OPEN):
        console.print(
            f"  round {setup.round_number} is {setup.round_status}; a rerun opens no other round: open the next "
            "one on the Tasks and rounds page and make its links on the Crowd page",
            soft_wrap=True,
            highlight=False,
        )


# --- the model in the loop ----------------------------------------------------------------


@dataclass(frozen=True)
class PromotedModel:
    """The demo task's promoted model: what the demo's model server serves on a rerun."""

    name: str
    directory: Path


def promoted_model(settings: Settings) -> PromotedModel | None:
    """The task's promoted model (None while none is), so that a rerun serves what the
    researcher promoted rather than Model 0. A promoted model whose folder is gone stops the
    start (:class:`DemoError`) with what to do, before any process is started."""
    from services.db.models import ModelVersion, ModelVersionStatus

    engine = make_engine(settings.resolved_database_url)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            task = tasks.get_task(session, DEMO_TASK)
            model = session.scalar(
                select(ModelVersion)
                .where(ModelVersion.task_id == task.id, ModelVersion.status == ModelVersionStatus.promoted)
                .order_by(ModelVersion.promoted_at.desc(), ModelVersion.id.desc())
                .limit(1)
            )
            if model is None:
                return None
            found = PromotedModel(model.name, Path(model.directory))
    finally:
        engine.dispose()
    if not (found.directory / "dynaloop_model.json").is_file():
        raise DemoError(
            f"the task's promoted model {found.name} is served from {found.directory}, which is missing or has no "
            "dynaloop_model.json, so the demo cannot serve it: put the folder back, or retire the model "
            f"(`dynaloop model retire --task {DEMO_TASK} --version {found.name}`) and start the demo again to serve "
            "Model 0"
        )
    return found


def put_model_in_loop(settings: Settings, directory: Path, server: str) -> tuple[str, str | None]:
    """Register the model in ``directory`` for the demo task (found again when registered) and
    record it as promoted on the registered model server ``server`` (running with that
    directory; its URL and admin token are in the registry of model servers). Returns the
    model's name and, when it is left unpromoted, why.

    * The task's promoted model (a rerun after the researcher promoted one) is promoted again
      only if it was recorded at another address (``--model-port`` changed); otherwise nothing
      changes.
    * Model 0 is promoted (with ``force``: it has no evaluation, there is no round data yet)
      only while no other model of the task ever was: a rerun never undoes a researcher's
      promotion, even one since retired.

    Rounds keep their loop (``update_open_rounds=False``): :func:`set_up_demo` put the demo's
    server in its round 1 while that is open."""
    from rounds.models.promotion import promote
    from rounds.models.registry import register_model
    from services.db.models import ModelVersion, ModelVersionStatus

    engine = make_engine(settings.resolved_database_url)
    try:
        factory = make_sessionmaker(engine)
        with session_scope(factory) as session:
            task = tasks.get_task(session, DEMO_TASK)
            model = register_model(session, task, directory)
            name = model.name
            endpoint = model_servers.get_server(session, server).url
            if model.status is ModelVersionStatus.promoted:
                unpromoted = None
                promote_now = model.endpoint != endpoint
            else:
                earlier = session.scalar(
                    select(ModelVersion.name)
                    .where(
                        ModelVersion.task_id == task.id,
                        ModelVersion.id != model.id,
                        ModelVersion.promoted_at.is_not(None),
                    )
                    .order_by(ModelVersion.promoted_at.desc())
                    .limit(1)
                )
                promote_now = earlier is None
                unpromoted = (
                    None
                    if earlier is None
                    else f"not promoted: no model of the task is, and {earlier} was before (promote one on the "
                    "Models and datasets page)"
                )
        if promote_now:
            promote(factory, DEMO_TASK, name, server=server, force=True, update_open_rounds=False)
        return name, unpromoted
    finally:
        engine.dispose()


# --- the running demo ------------------------------------------------------------------------


@dataclass
class DemoOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    model_port: int = 8001
    ui_port: int = 8501
    ui: bool = True
    # External model servers; when given, no Model 0 is trained and no model server started.
    model_endpoints: list[str] = field(default_factory=list)
    model: ModelZeroSpec = field(default_factory=ModelZeroSpec)
    retrain: bool = False
    model_start_timeout_s: float = 180.0
    api_start_timeout_s: float = 90.0
    ui_start_timeout_s: float = 90.0


class DemoError(RuntimeError):
    """The demo cannot start (a port in use, a service that fails); the message says why."""


class _StopRequested(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    # The first stop signal starts the clean-up; any later one is ignored from this moment on, not
    # only once the clean-up has begun: a second SIGTERM (a process manager and `timeout` both
    # sending one) or a second Ctrl-C while the message below is printed raised again out of the
    # `except` that handles the first, and the demo ended with a traceback and a failed status.
    for stop_signal in _STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_IGN)
    raise _StopRequested(signum)


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal closed) raise :class:`_StopRequested`
    in the main thread. The services run in sessions of their own, so none of these signals
    reaches them except through :meth:`Supervisor.stop_all`."""
    previous = {signum: signal.signal(signum, _raise_stop) for signum in _STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Only the training progress bar on the terminal: no weight-loading bars or load
    reports (a fresh classification head is expected, not a problem)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def web_app_path() -> Path:
    """The web app's server, ``frontend/server.py`` (an ``st.App`` around ``frontend/app.py``), next to this package."""
    return Path(__file__).resolve().parent.parent / "frontend" / "server.py"


def _check_ports(options: DemoOptions, start_model_server: bool, start_ui: bool, log_dir: Path) -> None:
    wanted = [("API", options.host, options.port, "--port")]
    if start_model_server:
        wanted.append(("model server", "127.0.0.1", options.model_port, "--model-port"))
    if start_ui:
        wanted.append(("web app", options.host, options.ui_port, "--ui-port"))
    ports = [port for _, _, port, _ in wanted]
    if len(set(ports)) != len(ports):
        raise DemoError(f"the API, model server and web app need three different ports, got {ports}")
    for name, host, port, option in wanted:
        if port_in_use(host, port):
            left = still_running(log_dir)
            hint = (
                f"; an earlier demo with this data directory left {', '.join(left)} running: stop it with `kill PID`"
                if left
                else ""
            )
            raise DemoError(
                f"port {port} on {host} is in use (another dynaloop demo, or another server){hint}; "
                f"stop it or give the {name} another port with {option}"
            )


SECRET_KEY_FILE = "secret_key"


def with_demo_secret(settings: Settings) -> Settings:
    """The demo's settings with a pseudonym key of its own, unless ``DYNALOOP_SECRET_KEY`` is
    set: a random key made on the first run and kept (readable by its owner only) in the data
    directory, so that pseudonyms stay the same across runs and cannot be recomputed by anyone
    who knows the placeholder."""
    if settings.placeholder_secret_warning is None:
        return settings
    path = settings.data_dir / SECRET_KEY_FILE
    if not path.is_file():
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        # Created with mode 0600 from the start, never readable by others even for a moment.
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(secrets.token_urlsafe(32))
    return settings.model_copy(update={"secret_key": path.read_text().strip()})


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> None:
    """Start the demo and block until Ctrl-C, SIGTERM or SIGHUP; stop every child process
    before returning. Raises :class:`DemoError` when it cannot start or a service dies."""
    python = sys.executable
    start_model_server = not options.model_endpoints
    app_file = web_app_path()
    start_ui = options.ui and app_file.is_file()
    _check_ports(options, start_model_server, start_ui, settings.data_dir / "logs")
    reach = connect_host(options.host)
    api_url = f"http://{reach}:{options.port}"
    model_url = f"http://127.0.0.1:{options.model_port}"
    ui_url = f"http://{reach}:{options.ui_port}"
    endpoints = options.model_endpoints or [model_url]
    supervisor = Supervisor(settings.data_dir / "logs")
    admin_token = secrets.token_urlsafe(24)
    # The web app names each browser's address to the API with this key (dynaloop/api/ratelimit.py).
    web_app_key = settings.web_app_key or secrets.token_urlsafe(32)

    with _stop_on_signals():
        try:
            setup = set_up_demo(
                settings, model_endpoints=endpoints, admin_token=admin_token if start_model_server else None
            )
            console.print(f"[bold]dynaloop demo[/bold] — database {_redacted(setup.database_url)}", soft_wrap=True)
            console.print(
                f"task {setup.task!r}, round {setup.round_number} (id {setup.round_id}), {setup.prompts} prompts",
                soft_wrap=True,
            )
            model_name = model_note = None
            if start_model_server:
                directory = _demo_model_directory(settings, options, console, setup.task)
                _start_model_server(console, supervisor, python, directory, options, model_url, admin_token)
                model_name, model_note = put_model_in_loop(settings, directory, DEMO_SERVER)
            _start_api(console, supervisor, python, options, settings, setup.database_url, api_url, web_app_key)
            _start_worker(console, supervisor, python, setup.database_url, settings, options.api_start_timeout_s)
            if start_ui:
                _start_web_app(console, supervisor, python, app_file, options, api_url, ui_url, web_app_key)
            _print_ready(
                console,
                setup,
                supervisor,
                api_url,
                model_name if model_note is None else f"{model_name} ({model_note})",
                admin_token if start_model_server else None,
                ui_url,
                ui_note=None
                if start_ui
                else (
                    "web app not started (--no-ui)"
                    if not options.ui
                    else f"web app not started: {app_file} does not exist"
                ),
            )
            _watch(supervisor)
        except _StopRequested as stop:
            console.print(f"\n{stop} received: stopping the demo …")
        except ServiceError as exc:
            raise DemoError(str(exc)) from exc
        except DomainError as exc:  # e.g. the registry refusing Model 0, or its promotion failing
            raise DemoError(exc.message) from exc
        finally:
            # A second Ctrl-C must not cut the clean-up short and leave children behind.
            for signum in _STOP_SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
            supervisor.stop_all()
    console.print("dynaloop demo stopped; every service it started is down")


def _demo_model_directory(settings: Settings, options: DemoOptions, console: Console, task_name: str) -> Path:
    """The model directory the demo's model server loads: the task's promoted model, else Model 0
    (trained once, then cached)."""
    promoted = promoted_model(settings)
    if promoted is not None:
        directory = promoted.directory
        console.print(
            f"model: {promoted.name}, the task's promoted model ({directory}); Model 0 is not used",
            soft_wrap=True,
        )
    else:
        spec = options.model
        console.print(
            f"Model 0: MiniLM fine-tuned on the seed corpus ({3 * spec.per_label} sentences, "
            f"{spec.epochs} epoch(s), max_length {spec.max_length})",
            soft_wrap=True,
        )
        try:
            with _quiet_transformers():
                model = ensure_model_zero(settings.data_dir, spec, task_name=task_name, retrain=options.retrain)
        except (ValueError, OSError) as exc:  # rounds.models.train's TrainingError is a ValueError
            raise DemoError(f"Model 0 could not be trained: {exc}") from exc
        console.print(
            (
                "  trained in {:.0f} s"
                if model.trained
                else "  cached (took {:.1f} s to find; --retrain trains it again)"
            ).format(model.seconds)
            + f": {model.directory}",
            soft_wrap=True,
        )
        directory = model.directory
    return directory


def _start_model_server(
    console: Console,
    supervisor: Supervisor,
    python: str,
    directory: Path,
    options: DemoOptions,
    model_url: str,
    admin_token: str,
) -> Service:
    """The demo's model server on ``directory``, on 127.0.0.1; ready once its health answers."""
    server = supervisor.start(
        "model server",
        [
            python,
            "-m",
            "dynaloop",
            "model-server",
            "--model",
            str(directory),
            "--host",
            "127.0.0.1",
            "--port",
            str(options.model_port),
        ],
        url=model_url,
        health_url=f"{model_url}/health",
        env={"DYNALOOP_MODEL_SERVER_ADMIN_TOKEN": admin_token},
    )
    _wait(console, supervisor, server, options.model_start_timeout_s)
    return server


def _start_api(
    console: Console,
    supervisor: Supervisor,
    python: str,
    options: DemoOptions,
    settings: Settings,
    database_url: str,
    api_url: str,
    web_app_key: str,
) -> Service:
    """The API on the demo's database; ready once its health answers."""
    api = supervisor.start(
        "API",
        [
            python,
            "-m",
            "dynaloop",
            "api",
            "--host",
            options.host,
            "--port",
            str(options.port),
            "--database-url",
            database_url,
        ],
        url=api_url,
        health_url=f"{api_url}/health",
        env={
            "DYNALOOP_DATA_DIR": str(settings.data_dir),
            "DYNALOOP_SECRET_KEY": settings.secret_key,
            "DYNALOOP_WEB_APP_KEY": web_app_key,
        },
    )
    _wait(console, supervisor, api, options.api_start_timeout_s)
    return api


def _start_web_app(
    console: Console,
    supervisor: Supervisor,
    python: str,
    app_file: Path,
    options: DemoOptions,
    api_url: str,
    ui_url: str,
    web_app_key: str,
) -> Service:
    """The Streamlit web app, talking to the demo's API; ready once its health answers."""
    web = supervisor.start(
        "web app",
        [
            python,
            "-m",
            "streamlit",
            "run",
            str(app_file),
            "--server.address",
            options.host,
            "--server.port",
            str(options.ui_port),
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
            "--client.toolbarMode",
            "minimal",
        ],
        url=ui_url,
        health_url=f"{ui_url}/_stcore/health",
        env={"DYNALOOP_API_URL": api_url, "DYNALOOP_WEB_APP_KEY": web_app_key},
    )
    _wait(console, supervisor, web, options.ui_start_timeout_s)
    return web


def _watch(supervisor: Supervisor) -> None:
    """Block while every service runs; :class:`DemoError` when one stops on its own."""
    while True:
        stopped = supervisor.exited()
        if stopped is not None:
            raise DemoError(
                f"the {stopped.name} stopped on its own (status {stopped.process.returncode}); see {stopped.log_path}"
            )
        time.sleep(0.5)


#: The demo's job worker (`dynaloop worker --name`): retraining and evaluation started from the web app.
DEMO_WORKER = "demo-cpu"


def _start_worker(
    console: Console, supervisor: Supervisor, python: str, database_url: str, settings: Settings, timeout_s: float
) -> Service:
    """A CPU worker for the jobs the researcher starts (rounds.models.worker), on the demo's SQLite
    database: the embedded default needs no other server. Ready once it has registered."""
    from rounds.models.jobs import live_workers
    from services.db.models import JobQueue

    worker = supervisor.start(
        "job worker",
        [python, "-m", "dynaloop", "worker", "--queue", "cpu", "--name", DEMO_WORKER, "--database-url", database_url],
        url="",
        health_url="",
        env={"DYNALOOP_DATA_DIR": str(settings.data_dir)},
    )
    factory = make_sessionmaker(make_engine(database_url))

    def registered() -> bool:
        with factory() as session:
            return any(w.name == DEMO_WORKER and w.pid == worker.pid for w in live_workers(session, JobQueue.cpu))

    console.print("starting the job worker (queue cpu) …", soft_wrap=True)
    started = time.perf_counter()
    supervisor.wait_ready(worker, registered, timeout_s, "register in the database")
    console.print(
        f"  ready in {time.perf_counter() - started:.1f} s (pid {worker.pid}, log {worker.log_path})", soft_wrap=True
    )
    return worker


def _wait(console: Console, supervisor: Supervisor, service: Service, timeout_s: float) -> None:
    console.print(f"starting the {service.name} at {service.url} …", soft_wrap=True)
    started = time.perf_counter()
    supervisor.wait_healthy(service, timeout_s)
    console.print(
        f"  ready in {time.perf_counter() - started:.1f} s (pid {service.pid}, log {service.log_path})", soft_wrap=True
    )


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def dataset_curl(api_url: str, task: str, round_number: int, token: str) -> str:
    """A one-line curl command that downloads the train split of a built round as JSONL."""
    return (
        f'curl -fsS -H "Authorization: Bearer {token}" '
        f'"{api_url}/api/v1/tasks/{task}/rounds/{round_number}/dataset?split=train&format=jsonl" '
        f"-o {task}-r{round_number}-train.jsonl"
    )


def _print_ready(
    console: Console,
    setup: DemoSetup,
    supervisor: Supervisor,
    api_url: str,
    model_name: str | None,
    admin_token: str | None,
    ui_url: str,
    ui_note: str | None,
) -> None:
    table = Table("role", "username", "password", title="Logins (web app and POST /api/v1/auth/login)")
    for login in setup.logins:
        table.add_row(login.role, login.username, login.password)
    console.print(table)
    console.print("API tokens (valid 30 days; `Authorization: Bearer <token>`):")
    for login in setup.logins:
        # Plain print: a token must never be folded by the terminal width.
        print(f"  {login.username:<12} {login.token}")
    print_study_links(console, setup, ui_url)
    for service in supervisor.services:
        address = f"{service.url}/api/v1  (docs: {service.url}/docs)" if service.name == "API" else service.url
        if not service.url:
            address = "(no address: it takes jobs from the database)"
        console.print(
            f"{service.name:<13} {address}  [dim](pid {service.pid}, log {service.log_path})[/dim]",
            soft_wrap=True,
            highlight=False,
        )
    model_server = next((service for service in supervisor.services if service.name == "model server"), None)
    if model_name and model_server is not None:
        console.print(
            f"model in the loop: {model_name} on model server {DEMO_SERVER} at {model_server.url}", soft_wrap=True
        )
    else:
        shown = ", ".join(f"{n} ({u})" for n, u in zip(setup.model_servers, setup.model_endpoints, strict=True))
        console.print(f"model in the loop: {shown} (external, registered)", soft_wrap=True)
    client = next((login for login in setup.logins if login.role == "client"), None)
    if client is not None:
        # Plain print: the command must stay on one line to be copied.
        print(
            f"export a built round (client token; round {setup.round_number} once it is built): "
            f"{dataset_curl(api_url, setup.task, setup.round_number, client.token)}"
        )
    if admin_token:
        print(
            "model server admin token (registered with the API, so the web app and API jobs promote without it; "
            f"for an operator's `dynaloop model promote --admin-token`): {admin_token}"
        )
    if ui_note:
        console.print(f"[yellow]{ui_note}[/yellow]; the API is at {api_url}", soft_wrap=True)
    else:
        web = next(service for service in supervisor.services if service.name == "web app")
        console.print(f"[bold]Open {web.url} and log in as writer / writer-demo-only.[/bold]", soft_wrap=True)
    console.print("dynaloop demo is running; press Ctrl-C to stop.")
    sys.stdout.flush()
