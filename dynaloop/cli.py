"""`dynaloop`: the one command that fronts the API, the database and the tasks.

This module only assembles the command groups; each lives in its own module of
``dynaloop/commands/`` (``db``, ``task``, ``prompts``, ``user``, ``model``, ``round``, ``job`` (and
`worker`), ``ledger``; ``study``; ``platform``; ``serve`` holds `api`, `ui` and `model-server`, ``check`` and
``demo`` one command each), and
each command calls a use case or a domain function of ``services``, ``rounds.build`` or
``rounds.models``. This package is the composition root: it may import every part of the project.

``python -m dynaloop.cli`` runs the same command (a worker starts ``python -m dynaloop.cli
job run ID`` for each job; ``accelerate launch -m dynaloop.cli round train ...`` trains on several GPUs).
"""

from __future__ import annotations

import logging

import typer

from dynaloop.commands import check, demo, serve
from dynaloop.commands.db import app as db_app
from dynaloop.commands.job import app as job_app
from dynaloop.commands.job import worker as worker_command
from dynaloop.commands.ledger import app as ledger_app
from dynaloop.commands.model import app as model_app
from dynaloop.commands.platform import app as platform_app
from dynaloop.commands.prompts import app as prompts_app
from dynaloop.commands.round import app as round_app
from dynaloop.commands.serve import ui_command, web_app_file
from dynaloop.commands.study import app as study_app
from dynaloop.commands.task import app as task_app
from dynaloop.commands.user import app as user_app

__all__ = ["app", "main", "ui_command", "web_app_file"]

app = typer.Typer(
    help="dynaloop: adversarial human-and-model-in-the-loop dataset creation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # click's plain help: at 80 columns rich's panels cut long option names ("--max-dev-test-sh…").
    rich_markup_mode=None,
)
app.add_typer(db_app, name="db")
app.add_typer(task_app, name="task")
app.add_typer(prompts_app, name="prompts")
app.add_typer(user_app, name="user")
app.add_typer(model_app, name="model")
app.command("model-server")(serve.model_server)
app.add_typer(round_app, name="round")
app.command("check")(check.check)
app.command("api")(serve.api)
app.command("ui")(serve.ui)
app.command("demo")(demo.demo)
app.add_typer(job_app, name="job")
app.command("worker")(worker_command)
app.add_typer(ledger_app, name="ledger")
app.add_typer(study_app, name="study")
app.add_typer(platform_app, name="platform")


def main() -> None:  # pragma: no cover - console entry point
    logging.basicConfig(level=logging.INFO)
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
