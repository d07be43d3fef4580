"""`dynaloop api`, `dynaloop ui` and `dynaloop model-server`: the three servers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dynaloop.commands.common import DatabaseOpt, PrecisionOpt, console, err, fail, require_extras, settings_for

if TYPE_CHECKING:
    import datetime as dt

    from sqlalchemy.orm import Session, sessionmaker

    from model_server.config import FollowSettings
    from model_server.follow import PromotedModel, ReplicaStatus


def api(
    host: str = "127.0.0.1",
    port: int = 8000,
    database_url: DatabaseOpt = None,
    workers: int = 1,
    log_level: str = "info",
) -> None:
    """Run the REST API (migrates the database to the newest schema first)."""
    import os

    import uvicorn

    from services.db.migrate import upgrade
    from services.observability import configure_logging

    # A long-running server process: its start-up objects are frozen out of the garbage
    # collector's full passes (services/settings.py, freeze_gc_at_startup) unless set otherwise.
    os.environ.setdefault("DYNALOOP_FREEZE_GC_AT_STARTUP", "true")
    settings = settings_for(database_url)
    # JSON lines from the first one on (the migration's too); the app logs the same warning then.
    configure_logging(settings.log_format)
    if (warning := settings.placeholder_secret_warning) and settings.log_format == "text":
        err.print(f"[bold red]WARNING:[/bold red] {warning}", soft_wrap=True)
    upgrade(settings.resolved_database_url)
    if database_url:
        # Worker processes read settings from the environment.
        os.environ["DYNALOOP_DATABASE_URL"] = database_url
    if settings.max_concurrent_requests >= settings.worker_threads:
        raise fail("DYNALOOP_MAX_CONCURRENT_REQUESTS must be below DYNALOOP_WORKER_THREADS (see docs/deploy.md)")
    if workers > 1:
        from dynaloop.api.metrics import prepare_multiprocess_folder

        # One /metrics for all workers: each writes its figures to this folder (dynaloop/api/metrics.py).
        prepare_multiprocess_folder()
    # No `limit_concurrency`: uvicorn would answer a plain-text 503 and count idle keep-alive
    # connections too. The app counts requests in flight itself and answers beyond
    # DYNALOOP_MAX_CONCURRENT_REQUESTS in the JSON error shape (dynaloop/api/overload.py).
    uvicorn.run(
        "dynaloop.api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        # JSON: uvicorn's own lines go through the handler configured above (and in each worker,
        # by create_app), not through uvicorn's plain-text one.
        log_config=None if settings.log_format == "json" else uvicorn.config.LOGGING_CONFIG,
        # The API reads forwarded headers itself, from DYNALOOP_TRUSTED_PROXIES only
        # (services/forwarded.py); uvicorn's own handling would trust any 127.0.0.1 peer's.
        proxy_headers=False,
    )


def web_app_file() -> Path:
    """The web app's server ``frontend/server.py`` (source checkout or installed package): Streamlit
    runs its ``st.App``, the script ``frontend/app.py`` behind the login pages of ``frontend/web.py``."""
    source = Path(__file__).resolve().parents[2] / "frontend" / "server.py"
    if source.is_file():
        return source
    import importlib.util

    spec = importlib.util.find_spec("frontend")
    if spec is None or spec.origin is None:
        raise fail("the web app (package `frontend`) is not installed; reinstall dynaloop")
    return Path(spec.origin).parent / "server.py"


def ui_command(host: str, port: int) -> list[str]:
    """The `streamlit run` command line of `dynaloop ui`."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(web_app_file()),
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
    ]


def ui(
    host: Annotated[str, typer.Option(help="Address the web app listens on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Web app port")] = 8501,
    api_url: Annotated[
        str, typer.Option(envvar="DYNALOOP_API_URL", help="The API the web app talks to")
    ] = "http://127.0.0.1:8000",
) -> None:
    """Run the web app (Streamlit): login, then the writer, validator and researcher pages of your roles.
    It talks to the API over HTTP only (start that with `dynaloop api`)."""
    import os
    import subprocess

    require_extras("webapp")
    command = ui_command(host, port)
    console.print(f"web app: http://{host}:{port}   API: {api_url}   (Ctrl-C stops it)", highlight=False)
    try:
        code = subprocess.call(command, env={**os.environ, "DYNALOOP_API_URL": api_url})
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


class TaskRegistry:
    """The registry a following model server reads and reports to (model_server.follow.Registry):
    the task's promoted version and the replica's row in ``model_replicas`` (rounds.models.replicas)."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        task_id: int,
        name: str,
        url: str | None,
        started_at: dt.datetime,
    ) -> None:
        self.factory = factory
        self.task_id = task_id
        self.name = name
        self.url = url
        self.started_at = started_at

    def promoted_model(self) -> PromotedModel | None:
        from model_server.follow import PromotedModel
        from rounds.models.replicas import promoted_version

        found = promoted_version(self.factory, self.task_id)
        if found is None:
            return None
        return PromotedModel(found.id, found.model_id, found.version, found.directory, found.promoted_at)

    def report(self, status: ReplicaStatus) -> None:
        from rounds.models.replicas import ReplicaReport, record_replica

        record_replica(
            self.factory,
            self.task_id,
            ReplicaReport(
                name=self.name,
                url=self.url,
                state=status.state.value,
                model_id=status.model_id,
                version=status.version,
                precision=status.precision,
                message=status.message,
                target_model_version_id=status.target_model_version_id,
                target_promoted_at=status.target_promoted_at,
                started_at=self.started_at,
            ),
        )


def _replica_registry(database_url: str | None, task: str, name: str, url: str | None) -> TaskRegistry:
    """The task's registry for a following replica; exits with the reason when the database cannot
    be reached, its schema is old, or the task does not exist."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from dynaloop.commands.common import ensure_schema, redact
    from services.db.engine import make_engine, make_sessionmaker
    from services.db.models import utcnow
    from services.domain.tasks import get_task
    from services.errors import DomainError

    resolved = settings_for(database_url).resolved_database_url
    # A replica's few statements are small: a short connect and statement timeout keep a
    # database that hangs from holding the poll for long (serving never waits on it).
    options: dict[str, Any] = {}
    if make_url(resolved).get_backend_name() == "postgresql":
        options = {
            "pool_size": 2,
            "max_overflow": 2,
            "connect_args": {"connect_timeout": 5, "options": "-c statement_timeout=10000"},
        }
    try:
        ensure_schema(resolved)
        factory = make_sessionmaker(make_engine(resolved, **options))
        with factory() as session:
            task_id = get_task(session, task).id
    except DomainError as exc:
        raise fail(f"--follow-task: {exc.message}") from exc
    except SQLAlchemyError as exc:
        reason = str(exc).strip().splitlines()[0][:300]
        raise fail(
            f"--follow-task: cannot read the registry at {redact(resolved)} ({type(exc).__name__}: {reason}); "
            "a following replica needs the database when it starts (--database-url or DYNALOOP_DATABASE_URL)"
        ) from exc
    return TaskRegistry(factory, task_id, name, url, utcnow())


def _follow_settings(
    follow_task: str,
    follow_interval: float,
    replica_name: str | None,
    advertise_url: str | None,
    port: int,
    database_url: str | None,
) -> FollowSettings:
    """--follow-task's settings: the replica's name, its entry in the task's registry and how
    often it reads it."""
    import socket

    from model_server.config import FollowSettings
    from rounds.models.replicas import MAX_FOLLOW_INTERVAL_S

    if not 0.1 <= follow_interval <= MAX_FOLLOW_INTERVAL_S:
        raise fail(
            f"--follow-interval must be between 0.1 and {MAX_FOLLOW_INTERVAL_S:g} seconds: the registry judges a "
            "replica live by how recently it reported"
        )
    if advertise_url is not None and not advertise_url.startswith(("http://", "https://")):
        raise fail(f"--advertise-url {advertise_url!r} is not an http(s) URL")
    name = (replica_name or f"{socket.gethostname()}-{port}").strip()
    if not name or len(name) > 255:
        raise fail("--replica-name must have 1 to 255 characters")
    registry = _replica_registry(database_url, follow_task, name, advertise_url)
    follow = FollowSettings(registry, follow_interval)
    console.print(
        f"model server replica {name} follows task {follow_task!r} (registry read every {follow_interval:g} s)",
        highlight=False,
        soft_wrap=True,
    )
    return follow


MAX_THREADS = 1024


def _threads_choice(value: str) -> int | None:
    """``--threads``: None for auto, else a number of threads."""
    if value.strip().lower() == "auto":
        return None
    try:
        threads = int(value)
    except ValueError:
        raise fail(f"--threads must be auto or a whole number, not {value[:40]!r}") from None
    if not 1 <= threads <= MAX_THREADS:
        raise fail(f"--threads must be between 1 and {MAX_THREADS}")
    return threads


def model_server(
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="Model directory with dynaloop_model.json (optional with --follow-task: used until a "
            "model is promoted)",
        ),
    ] = None,
    host: str = "127.0.0.1",
    port: int = 8001,
    backend: Annotated[str, typer.Option(help="transformers, vllm-classify or vllm-generate")] = "transformers",
    device: Annotated[str | None, typer.Option(help="cpu or cuda; default: cuda when available")] = None,
    precision: PrecisionOpt = "auto",
    max_batch_size: int = 32,
    max_wait_ms: Annotated[float, typer.Option(help="Wait this long for a batch to fill (0: greedy)")] = 0.0,
    linger_gap_ms: Annotated[
        float,
        typer.Option(help="Under load, keep collecting callers that come back within this gap of each other (0: off)"),
    ] = 20.0,
    linger_max_ms: Annotated[
        float, typer.Option(help="Lingering never goes past this long after the previous batch ended")
    ] = 150.0,
    request_timeout_s: float = 10.0,
    threads: Annotated[
        str,
        typer.Option(
            envvar="DYNALOOP_MODEL_THREADS",
            help="Threads of a CPU forward pass: auto (one per core that other processes leave idle, measured "
            "every half second), or a number for a machine the server has to itself (docs/model_server.md)",
        ),
    ] = "auto",
    admin_token: Annotated[
        str | None, typer.Option(envvar="DYNALOOP_MODEL_SERVER_ADMIN_TOKEN", help="Enables POST /admin/reload")
    ] = None,
    follow_task: Annotated[
        str | None,
        typer.Option(
            help="Follow this task's promoted model: load it at start and whenever another version is promoted, "
            "and report to the registry which model this replica serves (docs/model_server.md)"
        ),
    ] = None,
    replica_name: Annotated[
        str | None,
        typer.Option(
            envvar="DYNALOOP_MODEL_REPLICA_NAME", help="With --follow-task: this replica's name; default HOSTNAME-PORT"
        ),
    ] = None,
    advertise_url: Annotated[
        str | None,
        typer.Option(
            envvar="DYNALOOP_MODEL_REPLICA_URL",
            help="With --follow-task: the URL others reach this replica at, shown in the registry",
        ),
    ] = None,
    follow_interval: Annotated[
        float, typer.Option(help="With --follow-task: seconds between two reads of the registry")
    ] = 2.0,
    database_url: DatabaseOpt = None,
    log_level: str = "info",
    log_format: Annotated[str, typer.Option(envvar="DYNALOOP_LOG_FORMAT", help="text or json")] = "text",
) -> None:
    """Serve a classifier: /predict with dynamic batching, /info, /health, /metrics, /inspect, /admin/reload.
    With --follow-task it serves the task's promoted model and swaps itself when another is promoted."""
    import uvicorn

    require_extras("model-server")
    from model_server.app import create_model_app
    from model_server.config import ServerConfig

    team = _threads_choice(threads)
    if model is None and follow_task is None:
        raise fail("give --model DIR (a model directory), or --follow-task TASK to serve the task's promoted model")
    if model is not None and not model.is_dir():
        raise fail(f"{model} is not a folder; build one with `dynaloop model init --task NAME --out {model}`")
    follow = None
    if follow_task is not None:
        follow = _follow_settings(follow_task, follow_interval, replica_name, advertise_url, port, database_url)
    config = ServerConfig(
        model_dir=model,
        backend=backend,
        device=device,
        precision=precision,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        linger_gap_ms=linger_gap_ms,
        linger_max_ms=linger_max_ms,
        request_timeout_s=request_timeout_s,
        admin_token=admin_token,
        follow=follow,
        log_format=log_format,
        threads=team,
    )
    uvicorn.run(create_model_app(config), host=host, port=port, log_level=log_level)
