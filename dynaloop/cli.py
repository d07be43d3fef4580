"""`dynaloop`: the one command that fronts the API, the database and the tasks.

This package is the composition root: it may import every part of the project, while the
parts keep DESIGN.md's dependency direction among themselves.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="dynaloop: adversarial human-and-model-in-the-loop dataset creation.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
task_app = typer.Typer(help="Task definitions.", no_args_is_help=True)
prompts_app = typer.Typer(help="Prompt sets.", no_args_is_help=True)
user_app = typer.Typer(help="Users and API tokens.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(task_app, name="task")
app.add_typer(prompts_app, name="prompts")
app.add_typer(user_app, name="user")
model_app = typer.Typer(help="Classifier directories for the model server.", no_args_is_help=True)
app.add_typer(model_app, name="model")

console = Console()
err = Console(stderr=True)

DatabaseOpt = Annotated[
    str | None, typer.Option("--database-url", envvar="DYNALOOP_DATABASE_URL",
                             help="SQLAlchemy URL; default: SQLite file in DYNALOOP_DATA_DIR.")
]


def _settings(database_url: str | None = None):  # type: ignore[no-untyped-def]
    from services.settings import Settings

    try:
        settings = Settings()
    except Exception as exc:  # pydantic's ValidationError: show its message, not a traceback
        err.print(f"[red]settings error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if database_url:
        settings = settings.model_copy(update={"database_url": database_url})
    return settings


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False, markup=True)
    return typer.Exit(code)


def _session_factory(url: str):  # type: ignore[no-untyped-def]
    from services.db.engine import make_engine, make_sessionmaker

    return make_sessionmaker(make_engine(url))


def _ensure_schema(url: str) -> None:
    from services.db.migrate import current_revision, head_revision

    if current_revision(url) != head_revision():
        raise _fail("the database schema is not up to date; run `dynaloop db upgrade` first")


# --- db -----------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseOpt = None, revision: str = "head") -> None:
    """Create or update the schema to the newest migration."""
    from services.db.migrate import current_revision, upgrade

    url = _settings(database_url).resolved_database_url
    upgrade(url, revision)
    console.print(f"schema at revision {current_revision(url)} ({_redact(url)})")


@db_app.command("downgrade")
def db_downgrade(revision: str, database_url: DatabaseOpt = None) -> None:
    """Step the schema back to REVISION (e.g. `base`). Data in dropped tables is lost."""
    from services.db.migrate import downgrade

    downgrade(_settings(database_url).resolved_database_url, revision)


@db_app.command("current")
def db_current(database_url: DatabaseOpt = None) -> None:
    """Print the schema revision of the database and of the code."""
    from services.db.migrate import current_revision, head_revision

    url = _settings(database_url).resolved_database_url
    console.print(f"database: {current_revision(url)}  code: {head_revision()}")


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# --- tasks --------------------------------------------------------------------------


@task_app.command("list-examples")
def task_list_examples() -> None:
    """List the example task files that ship with dynaloop (one per seed paper)."""
    from services.taskdef import example_paths, load_task_definition

    from services.taskdef import EXAMPLES_DIR

    table = Table()
    for column in ("example", "family", "language"):
        table.add_column(column, no_wrap=True)
    table.add_column("title")
    for path in example_paths():
        definition = load_task_definition(path)
        table.add_row(path.stem, definition.family.value, definition.language, definition.title)
    console.print(table)
    console.print(f"files in {EXAMPLES_DIR}; `dynaloop task show-example NAME` prints one", soft_wrap=True)


@task_app.command("show-example")
def task_show_example(name: str) -> None:
    """Print an example task's YAML (copy it to start your own task)."""
    from services.taskdef import example_path

    try:
        sys.stdout.write(example_path(name).read_text(encoding="utf-8"))
    except KeyError as exc:
        raise _fail(str(exc.args[0])) from exc


@task_app.command("validate")
def task_validate(path: Path) -> None:
    """Check a task YAML file; print each problem with its field and fix."""
    from services.taskdef import TaskDefinitionError, load_task_definition

    try:
        definition = load_task_definition(path)
    except FileNotFoundError as exc:
        raise _fail(f"no file {path}") from exc
    except TaskDefinitionError as exc:
        err.print(str(exc), highlight=False, markup=False)
        raise typer.Exit(1) from exc
    console.print(f"{path}: valid {definition.family.value} task {definition.name!r}")


def _task_yaml(source: str) -> str:
    from services.taskdef import example_path

    path = Path(source)
    if not path.exists():
        try:
            path = example_path(source)
        except KeyError as exc:
            raise _fail(f"{source} is neither a file nor an example task ({exc.args[0]})") from exc
    return path.read_text(encoding="utf-8")


@task_app.command("create")
def task_create(source: Annotated[str, typer.Argument(help="YAML file, or the name of a shipped example")],
                database_url: DatabaseOpt = None) -> None:
    """Create a task in the database from a YAML file or a shipped example."""
    from services.db.engine import session_scope
    from services.domain.tasks import create_task
    from services.errors import DomainError

    url = _settings(database_url).resolved_database_url
    _ensure_schema(url)
    try:
        with session_scope(_session_factory(url)) as session:
            task = create_task(session, None, _task_yaml(source))
            console.print(f"created task {task.name!r} ({task.family})")
    except DomainError as exc:
        raise _fail(exc.message) from exc


# --- prompts ------------------------------------------------------------------------


@prompts_app.command("import")
def prompts_import(
    task: Annotated[str, typer.Option(help="Task name")],
    file: Annotated[Path, typer.Argument(help="JSONL or CSV file with a `text` field/column")],
    round_number: Annotated[int | None, typer.Option("--round", help="Round number; default: the open round")] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """Import prompts into a round's prompt set (all rows checked first; duplicates skipped)."""
    from sqlalchemy import select

    from services.db.engine import session_scope
    from services.db.models import Round, RoundStatus
    from services.domain import rounds, tasks
    from services.errors import DomainError

    settings = _settings(database_url)
    url = settings.resolved_database_url
    _ensure_schema(url)
    suffix = file.suffix.lower()
    file_format = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}.get(suffix)
    if file_format is None:
        raise _fail(f"cannot tell the format of {file.name}; name it .jsonl or .csv")
    try:
        content = file.read_bytes()
    except FileNotFoundError as exc:
        raise _fail(f"no file {file}") from exc
    try:
        with session_scope(_session_factory(url)) as session:
            task_row = tasks.get_task(session, task)
            if round_number is None:
                round_ = session.scalar(select(Round).where(
                    Round.task_id == task_row.id, Round.status.in_([RoundStatus.collecting, RoundStatus.validating])))
                if round_ is None:
                    raise _fail(f"task {task!r} has no open round; give --round")
            else:
                round_ = rounds.get_round_by_number(session, task_row, round_number)
            report = rounds.import_prompts(session, None, round_, content, file_format,
                                           max_rows=settings.max_prompt_import_rows)
    except DomainError as exc:
        raise _fail(exc.message) from exc
    console.print(f"imported {report.imported} of {report.rows} rows "
                  f"({report.duplicates_in_file} repeated in the file, {report.already_present} already present)")


# --- users --------------------------------------------------------------------------


def _create_user(url: str, username: str, roles: list[str], password: str | None) -> str:
    from services.db.engine import session_scope
    from services.domain import users
    from services.errors import DomainError

    _ensure_schema(url)
    try:
        with session_scope(_session_factory(url)) as session:
            user = users.create_user(session, None, username, roles, password=password)
            _, token = users.issue_token(session, None, user, name="cli")
    except DomainError as exc:
        raise _fail(exc.message) from exc
    return token


@user_app.command("create-admin")
def user_create_admin(username: str, database_url: DatabaseOpt = None,
                      password: Annotated[str | None, typer.Option(help="Also allow password login")] = None
                      ) -> None:
    """Create the first admin (also a researcher) and print their API token once."""
    token = _create_user(_settings(database_url).resolved_database_url, username, ["admin", "researcher"], password)
    console.print(f"admin {username!r} created. API token (shown once):")
    print(token)


@user_app.command("create")
def user_create(username: str,
                role: Annotated[list[str], typer.Option("--role", help="writer, validator, researcher, admin")],
                database_url: DatabaseOpt = None,
                password: Annotated[str | None, typer.Option(help="Also allow password login")] = None) -> None:
    """Create a user with the given roles and print their API token once."""
    token = _create_user(_settings(database_url).resolved_database_url, username, role, password)
    console.print(f"user {username!r} created with roles {role}. API token (shown once):")
    print(token)


@user_app.command("token")
def user_token(username: str, database_url: DatabaseOpt = None,
               name: str = "cli", expires_in_days: int | None = None) -> None:
    """Issue a new API token for an existing user and print it once."""
    from services.db.engine import session_scope
    from services.domain import users
    from services.errors import DomainError

    url = _settings(database_url).resolved_database_url
    _ensure_schema(url)
    try:
        with session_scope(_session_factory(url)) as session:
            _, token = users.issue_token(session, None, users.get_user(session, username), name, expires_in_days)
    except DomainError as exc:
        raise _fail(exc.message) from exc
    print(token)


# --- models -------------------------------------------------------------------------


@model_app.command("init")
def model_init(
    out: Annotated[Path, typer.Option("--out", help="Folder to write the model directory to")],
    task: Annotated[str | None, typer.Option(help="Take labels and family from a task YAML file or example")] = None,
    labels: Annotated[str | None, typer.Option(help="Comma-separated labels (instead of --task)")] = None,
    multi_label: Annotated[bool, typer.Option(help="With --labels: a multi-label head")] = False,
    pair: Annotated[bool, typer.Option(help="With --labels: (sentence, target) input")] = False,
    model_id: Annotated[str, typer.Option(help="Name reported by /info")] = "model-0",
    base: Annotated[Path | None, typer.Option(help="Local Hugging Face checkpoint; default: packaged MiniLM")] = None,
    tiny: Annotated[bool, typer.Option(help="A tiny random BERT for tests, not MiniLM")] = False,
    seed: int = 0,
    overwrite: bool = False,
) -> None:
    """Build an (untrained) classifier directory with dynaloop_model.json, offline."""
    from model_server.init_model import init_model_dir

    family = "multi_label" if multi_label else "single_label"
    input_format = "text_pair" if pair else "text"
    task_name = None
    if task is not None:
        from services.taskdef import TaskDefinitionError, TaskFamily, parse_task_definition

        try:
            definition = parse_task_definition(_task_yaml(task), source=task)
        except TaskDefinitionError as exc:
            raise _fail(str(exc)) from exc
        label_list = list(definition.labels)
        family = "multi_label" if definition.is_multi_label else "single_label"
        input_format = "text_pair" if definition.family is TaskFamily.target_dependent else "text"
        task_name = definition.name
    elif labels:
        label_list = [label.strip() for label in labels.split(",") if label.strip()]
    else:
        raise _fail("give --task or --labels")
    try:
        metadata = init_model_dir(out, labels=label_list, family=family, input_format=input_format,  # type: ignore[arg-type]
                                  model_id=model_id, base=base, tiny=tiny, seed=seed, task=task_name,
                                  overwrite=overwrite)
    except (FileExistsError, FileNotFoundError, OSError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    console.print(f"wrote {out} ({metadata.family}, {metadata.input_format}, labels {metadata.labels}, "
                  f"base {metadata.base_model})", soft_wrap=True)


@app.command("model-server")
def model_server(
    model: Annotated[Path, typer.Option("--model", help="Model directory with dynaloop_model.json")],
    host: str = "127.0.0.1",
    port: int = 8001,
    backend: Annotated[str, typer.Option(help="transformers, vllm-classify or vllm-generate")] = "transformers",
    device: Annotated[str | None, typer.Option(help="cpu or cuda; default: cuda when available")] = None,
    max_batch_size: int = 32,
    max_wait_ms: Annotated[float, typer.Option(help="Wait this long for a batch to fill (0: greedy)")] = 0.0,
    request_timeout_s: float = 10.0,
    admin_token: Annotated[str | None, typer.Option(envvar="DYNALOOP_MODEL_SERVER_ADMIN_TOKEN",
                                                    help="Enables POST /admin/reload")] = None,
    log_level: str = "info",
) -> None:
    """Serve a classifier: /predict with dynamic batching, /info, /health, /metrics, /inspect, /admin/reload."""
    import uvicorn

    from model_server.app import ServerConfig, create_model_app

    if not model.is_dir():
        raise _fail(f"{model} is not a folder; build one with `dynaloop model init --task NAME --out {model}`")
    config = ServerConfig(model_dir=model, backend=backend, device=device, max_batch_size=max_batch_size,
                          max_wait_ms=max_wait_ms, request_timeout_s=request_timeout_s, admin_token=admin_token)
    uvicorn.run(create_model_app(config), host=host, port=port, log_level=log_level)


# --- rounds -------------------------------------------------------------------------

round_app = typer.Typer(help="Build and export rounds.", no_args_is_help=True)
app.add_typer(round_app, name="round")


def _round(session, task: str, number: int):  # type: ignore[no-untyped-def]
    from services.domain import rounds, tasks

    return rounds.get_round_by_number(session, tasks.get_task(session, task), number)


@round_app.command("build")
def round_build(task: Annotated[str, typer.Option(help="Task name")],
                number: Annotated[int, typer.Option("--round", help="Round number")],
                out: Annotated[Path | None, typer.Option(help="Folder for report.md, report.json and plots")] = None,
                seed: int = 0,
                dev_test_min_votes: int | None = None,
                chance: Annotated[bool | None, typer.Option(help="Require the model at chance on dev/test")] = None,
                max_per_cell: int | None = None,
                model_based: str = "dawid_skene",
                database_url: DatabaseOpt = None) -> None:
    """Aggregate labels, compute agreement and human F1, build chance-level splits, write the report."""
    from rounds.build import BuildConfig, build_round
    from services.db.engine import session_scope
    from services.errors import DomainError

    settings = _settings(database_url)
    url = settings.resolved_database_url
    _ensure_schema(url)
    config = BuildConfig(seed=seed, dev_test_min_votes=dev_test_min_votes, chance=chance,
                         max_per_cell=max_per_cell, model_based=None if model_based in ("", "none") else model_based)
    try:
        with session_scope(_session_factory(url)) as session:
            round_ = _round(session, task, number)
            folder = out or settings.data_dir / "builds" / f"{task}-r{number}-seed{seed}"
            build = build_round(session, None, round_, config, out_dir=folder)
            report = build.report
    except DomainError as exc:
        raise _fail(exc.message) from exc
    total = report["counts"]["total"]
    console.print(f"build {build.id}: train {total['train']:,}, dev {total['dev']:,}, test {total['test']:,}; "
                  f"report in {folder}", soft_wrap=True)
    for name, values in report["splits"]["assessment"].items():
        console.print(f"  model macro-F1 on {name}: {values['model_macro_f1']}")


@round_app.command("export")
def round_export(task: Annotated[str, typer.Option(help="Task name")],
                 number: Annotated[int, typer.Option("--round", help="Round number")],
                 out: Annotated[Path, typer.Option(help="Folder to write the files to")],
                 format: Annotated[str, typer.Option(help="jsonl, csv or parquet")] = "parquet",
                 splits: Annotated[str, typer.Option(help="Comma-separated splits")] = "train,dev,test",
                 database_url: DatabaseOpt = None) -> None:
    """Write the newest build's splits to files (one per split)."""
    from rounds import export
    from services.errors import DomainError

    settings = _settings(database_url)
    url = settings.resolved_database_url
    _ensure_schema(url)
    factory = _session_factory(url)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with factory() as session:
            build = export.current_build(session, _round(session, task, number))
        for split in [s.strip() for s in splits.split(",") if s.strip()]:
            export.check_request(split, format)
            path = out / f"{task}-r{number}-{split}.{format}"
            size = export.write_file(factory, build.id, split, format, settings.secret_key, path)
            console.print(f"wrote {path} ({size:,} bytes)")
    except DomainError as exc:
        raise _fail(exc.message) from exc


# --- servers ------------------------------------------------------------------------


@app.command("api")
def api(host: str = "127.0.0.1", port: int = 8000, database_url: DatabaseOpt = None,
        workers: int = 1, log_level: str = "info") -> None:
    """Run the REST API (migrates the database to the newest schema first)."""
    import uvicorn

    from services.db.migrate import upgrade

    settings = _settings(database_url)
    upgrade(settings.resolved_database_url)
    if database_url:
        # Worker processes read settings from the environment.
        import os

        os.environ["DYNALOOP_DATABASE_URL"] = database_url
    uvicorn.run("dynaloop.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level)


@app.command("demo")
def demo(host: str = "127.0.0.1", port: int = 8000,
         model_endpoint: Annotated[list[str] | None, typer.Option(
             help="Model server(s) in the loop for the demo round (e.g. http://127.0.0.1:8001)")] = None,
         data_dir: Annotated[Path | None, typer.Option(help="Where the demo's SQLite file lives")] = None,
         serve: Annotated[bool, typer.Option(help="Start the API after setting up")] = True) -> None:
    """Set up a DynaSent-style demo on SQLite (task, round, prompts, one user per role) and run the API."""
    from dynaloop.demo import DemoSetup, set_up_demo

    settings = _settings()
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    setup: DemoSetup = set_up_demo(settings, model_endpoints=model_endpoint or [])
    base = f"http://{host}:{port}"
    console.print(f"[bold]dynaloop demo[/bold] — database {_redact(setup.database_url)}")
    console.print(f"task {setup.task!r}, round {setup.round_number} (id {setup.round_id}), "
                  f"{setup.prompts} prompts; model in the loop: {', '.join(setup.model_endpoints) or 'none yet'}")
    table = Table("role", "username", "password")
    for login in setup.logins:
        table.add_row(login.role, login.username, login.password)
    console.print(table)
    console.print("API tokens (valid 30 days; `Authorization: Bearer <token>`):")
    for login in setup.logins:
        # Plain print: a token must never be folded by the terminal width.
        print(f"  {login.username:<12} {login.token}")
    console.print(f"API: {base}/api/v1   docs: {base}/docs")
    if not setup.model_endpoints:
        console.print("[yellow]No model server is in the loop yet: attempts answer 503 until one is set "
                      f"(PUT {base}/api/v1/rounds/{setup.round_id}/model).[/yellow]")
    if serve:
        import uvicorn

        from dynaloop.app import create_app

        uvicorn.run(create_app(settings), host=host, port=port, log_level="info")


def main() -> None:  # pragma: no cover - console entry point
    logging.basicConfig(level=logging.INFO)
    app()


if __name__ == "__main__":  # pragma: no cover
    main()

