"""`dynaloop demo`: the whole demo on SQLite (``dynaloop.demo`` does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dynaloop.commands.common import console, fail, redact, require_extras, settings_for


def demo(
    host: Annotated[str, typer.Option(help="Address the API and the web app listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port")] = 8000,
    model_port: Annotated[int, typer.Option(help="Model server port (it listens on 127.0.0.1 only)")] = 8001,
    ui_port: Annotated[int, typer.Option(help="Web app (Streamlit) port")] = 8501,
    ui: Annotated[bool, typer.Option(help="Start the web app")] = True,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Folder for the SQLite file, Model 0 and the logs (default: DYNALOOP_DATA_DIR or .dynaloop)"),
    ] = None,
    model_epochs: Annotated[int, typer.Option(help="Epochs of Model 0 on the seed corpus")] = 2,
    model_max_length: Annotated[int, typer.Option(help="Model 0's longest input, in word pieces")] = 48,
    seed_per_label: Annotated[int, typer.Option(help="Seed sentences per label Model 0 trains on")] = 300,
    retrain: Annotated[bool, typer.Option(help="Train Model 0 again even if a cached one fits")] = False,
    model_endpoint: Annotated[
        list[str] | None,
        typer.Option(
            help="Use this model server (e.g. http://127.0.0.1:8001) instead of training Model 0 and starting one; "
            "repeat for an ensemble. Each URL is registered as a model server (named after its host and port) "
            "and the round names it"
        ),
    ] = None,
    serve: Annotated[
        bool, typer.Option(help="Start the services; --no-serve only sets up the database and prints the logins")
    ] = True,
) -> None:
    """The whole demo on SQLite: Model 0, model server, API and web app, with one login per role.

    Trains Model 0 (the packaged MiniLM on a seed corpus; cached under the data directory), starts
    the model server, the API and the Streamlit app as child processes, sets up the DynaSent-style
    task `dynasent-r2` with prompts and users, and prints the addresses and logins. Ctrl-C stops
    everything."""
    from dynaloop.demo import (
        DemoError,
        DemoOptions,
        DemoSetup,
        print_study_links,
        run_demo,
        set_up_demo,
        with_demo_secret,
    )
    from dynaloop.model_zero import ModelZeroSpec

    if serve:
        # Model 0 and its server unless the demo uses given model servers; the web app unless --no-ui.
        require_extras(*(() if model_endpoint else ("training", "model-server")), *(("webapp",) if ui else ()))
    settings = settings_for()
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    settings = with_demo_secret(settings)
    if serve:
        try:
            spec = ModelZeroSpec(epochs=model_epochs, max_length=model_max_length, per_label=seed_per_label)
        except ValueError as exc:
            raise fail(str(exc)) from exc
        options = DemoOptions(
            host=host,
            port=port,
            model_port=model_port,
            ui_port=ui_port,
            ui=ui,
            model_endpoints=model_endpoint or [],
            model=spec,
            retrain=retrain,
        )
        try:
            run_demo(settings, options, console)
        except DemoError as exc:
            raise fail(str(exc)) from exc
        return
    setup: DemoSetup = set_up_demo(settings, model_endpoints=model_endpoint or [])
    console.print(f"[bold]dynaloop demo[/bold] — database {redact(setup.database_url)}")
    console.print(
        f"task {setup.task!r}, round {setup.round_number} (id {setup.round_id}), "
        f"{setup.prompts} prompts; model in the loop: "
        + (
            ", ".join(f"{n} ({u})" for n, u in zip(setup.model_servers, setup.model_endpoints, strict=True))
            or "none yet"
        )
    )
    table = Table("role", "username", "password")
    for login in setup.logins:
        table.add_row(login.role, login.username, login.password)
    console.print(table)
    console.print("API tokens (valid 30 days; `Authorization: Bearer <token>`):")
    for login in setup.logins:
        # Plain print: a token must never be folded by the terminal width.
        print(f"  {login.username:<12} {login.token}")
    print_study_links(console, setup, f"http://127.0.0.1:{ui_port}")
    console.print("set up only (--no-serve); `dynaloop demo` starts the model server, the API and the web app")
