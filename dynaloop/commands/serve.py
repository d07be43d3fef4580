"""`dynaloop api`, `dynaloop ui` and `dynaloop model-server`: the three servers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from dynaloop.commands.common import DatabaseOpt, PrecisionOpt, console, err, fail, settings_for


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

    # A long-running server process: its start-up objects are frozen out of the garbage
    # collector's full passes (services/settings.py, freeze_gc_at_startup) unless set otherwise.
    os.environ.setdefault("DYNALOOP_FREEZE_GC_AT_STARTUP", "true")
    settings = settings_for(database_url)
    if warning := settings.placeholder_secret_warning:
        err.print(f"[bold red]WARNING:[/bold red] {warning}", soft_wrap=True)
    upgrade(settings.resolved_database_url)
    if database_url:
        # Worker processes read settings from the environment.
        os.environ["DYNALOOP_DATABASE_URL"] = database_url
    if settings.max_concurrent_requests >= settings.worker_threads:
        raise fail("DYNALOOP_MAX_CONCURRENT_REQUESTS must be below DYNALOOP_WORKER_THREADS (see docs/deploy.md)")
    # No `limit_concurrency`: uvicorn would answer a plain-text 503 and count idle keep-alive
    # connections too. The app counts requests in flight itself and answers beyond
    # DYNALOOP_MAX_CONCURRENT_REQUESTS in the JSON error shape (api/overload.py).
    uvicorn.run(
        "api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
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

    command = ui_command(host, port)
    console.print(f"web app: http://{host}:{port}   API: {api_url}   (Ctrl-C stops it)", highlight=False)
    try:
        code = subprocess.call(command, env={**os.environ, "DYNALOOP_API_URL": api_url})
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


def model_server(
    model: Annotated[Path, typer.Option("--model", help="Model directory with dynaloop_model.json")],
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
    admin_token: Annotated[
        str | None, typer.Option(envvar="DYNALOOP_MODEL_SERVER_ADMIN_TOKEN", help="Enables POST /admin/reload")
    ] = None,
    log_level: str = "info",
) -> None:
    """Serve a classifier: /predict with dynamic batching, /info, /health, /metrics, /inspect, /admin/reload."""
    import uvicorn

    from model_server.app import ServerConfig, create_model_app

    if not model.is_dir():
        raise fail(f"{model} is not a folder; build one with `dynaloop model init --task NAME --out {model}`")
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
    )
    uvicorn.run(create_model_app(config), host=host, port=port, log_level=log_level)
