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
    from modelling.init_model import init_model_dir

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


TaskOpt = Annotated[str, typer.Option("--task", help="Task name")]


def _model_row(model, attempts: int | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    when = model.promoted_at or model.evaluated_at or model.created_at
    return [str(model.id), model.name, model.status.value, "" if model.trained_for_round is None
            else str(model.trained_for_round), model.endpoint or "", when.strftime("%Y-%m-%d %H:%M"),
            "" if attempts is None else f"{attempts:,}", model.directory]


@model_app.command("list")
def model_list(task: TaskOpt, database_url: DatabaseOpt = None) -> None:
    """The task's registered model versions, their status and the attempts each one scored."""
    from modelling.registry import attempt_counts, list_models
    from services.domain.tasks import get_task
    from services.errors import DomainError

    url = _settings(database_url).resolved_database_url
    _ensure_schema(url)
    try:
        with _session_factory(url)() as session:
            task_row = get_task(session, task)
            models = list_models(session, task_row)
            counts = attempt_counts(session, task_row)
    except DomainError as exc:
        raise _fail(exc.message) from exc
    if not models:
        console.print(f"task {task!r} has no registered models; add one with "
                      f"`dynaloop model register --task {task} --dir DIR`")
        return
    table = Table()
    for column in ("id", "name", "status", "for round", "endpoint", "since", "attempts", "directory"):
        table.add_column(column, no_wrap=column != "directory")
    for model in models:
        table.add_row(*_model_row(model, counts.get(model.id, 0)))
    console.print(table)


@model_app.command("register")
def model_register(task: TaskOpt,
                   directory: Annotated[Path, typer.Option("--dir", help="Model directory with dynaloop_model.json")],
                   evaluation: Annotated[Path | None, typer.Option(
                       help="JSON file of evaluation results: recorded too (trained -> evaluated)")] = None,
                   database_url: DatabaseOpt = None) -> None:
    """Record a model directory in the task's registry (again: no change)."""
    import json

    from modelling.registry import record_evaluation, register_model
    from services.db.engine import session_scope
    from services.domain.tasks import get_task
    from services.errors import DomainError

    metrics = None
    if evaluation is not None:
        try:
            metrics = json.loads(evaluation.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise _fail(f"no evaluation file {evaluation}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _fail(f"{evaluation} is not a JSON file: {exc}") from exc
    url = _settings(database_url).resolved_database_url
    _ensure_schema(url)
    try:
        with session_scope(_session_factory(url)) as session:
            task_row = get_task(session, task)
            model = register_model(session, task_row, directory)
            if metrics is not None:
                model = record_evaluation(session, task_row, directory, metrics)
            summary = f"{model.name} (id {model.id}) is {model.status.value}"
    except DomainError as exc:
        raise _fail(exc.message) from exc
    console.print(f"registered {summary}", soft_wrap=True)


@model_app.command("promote")
def model_promote(
    task: TaskOpt,
    version: Annotated[str, typer.Option("--version", help="Registry id, name (model_id@version) or model_id")],
    endpoint: Annotated[str, typer.Option(help="The running model server, e.g. http://127.0.0.1:8001")],
    admin_token: Annotated[str | None, typer.Option(envvar="DYNALOOP_MODEL_SERVER_ADMIN_TOKEN",
                                                    help="The model server's admin token")] = None,
    force: Annotated[bool, typer.Option(help="Promote a model that was never evaluated")] = False,
    keep_round_endpoints: Annotated[bool, typer.Option(
        help="Do not point the task's open rounds at --endpoint")] = False,
    backend: Annotated[str | None, typer.Option(help="Model server backend for the new model; default: same")]
    = None,
    timeout_s: Annotated[float, typer.Option(help="How long the server may take to load the model")] = 300.0,
    database_url: DatabaseOpt = None,
) -> None:
    """Hot-swap the model server to a registered model, then mark it promoted (the previous one retired)."""
    from modelling.registry import promote
    from services.errors import DomainError

    if not admin_token:
        raise _fail("give the model server's admin token: --admin-token or DYNALOOP_MODEL_SERVER_ADMIN_TOKEN")
    url = _settings(database_url).resolved_database_url
    _ensure_schema(url)
    try:
        result = promote(_session_factory(url), task, version, endpoint=endpoint, admin_token=admin_token,
                         force=force, backend=backend, update_open_rounds=not keep_round_endpoints,
                         timeout_s=timeout_s)
    except DomainError as exc:
        raise _fail(exc.message) from exc
    console.print(f"promoted {result.model.name}: {result.endpoint} now serves it", soft_wrap=True)
    for old in result.retired:
        console.print(f"retired {old.name}")
    if result.rounds_updated:
        console.print(f"round(s) {', '.join(map(str, result.rounds_updated))} now use {result.endpoint}")


@model_app.command("retire")
def model_retire(task: TaskOpt,
                 version: Annotated[str, typer.Option("--version", help="Registry id, name or model_id")],
                 database_url: DatabaseOpt = None) -> None:
    """Mark a model version retired (a model server keeps serving it until another is promoted)."""
    from modelling.registry import retire
    from services.db.engine import session_scope
    from services.domain.tasks import get_task
    from services.errors import DomainError

    url = _settings(database_url).resolved_database_url
    _ensure_schema(url)
    try:
        with session_scope(_session_factory(url)) as session:
            model = retire(session, get_task(session, task), version)
            name, endpoint = model.name, model.endpoint
    except DomainError as exc:
        raise _fail(exc.message) from exc
    console.print(f"retired {name}" + (f"; {endpoint} still serves it until another model is promoted there"
                                       if endpoint else ""), soft_wrap=True)


@app.command("model-server")
def model_server(
    model: Annotated[Path, typer.Option("--model", help="Model directory with dynaloop_model.json")],
    host: str = "127.0.0.1",
    port: int = 8001,
    backend: Annotated[str, typer.Option(help="transformers, vllm-classify or vllm-generate")] = "transformers",
    device: Annotated[str | None, typer.Option(help="cpu or cuda; default: cuda when available")] = None,
    max_batch_size: int = 32,
    max_wait_ms: Annotated[float, typer.Option(help="Wait this long for a batch to fill (0: greedy)")] = 0.0,
    linger_gap_ms: Annotated[float, typer.Option(
        help="Under load, keep collecting callers that come back within this gap of each other (0: off)")] = 20.0,
    linger_max_ms: Annotated[float, typer.Option(
        help="Lingering never goes past this long after the previous batch ended")] = 150.0,
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
                          max_wait_ms=max_wait_ms, linger_gap_ms=linger_gap_ms, linger_max_ms=linger_max_ms,
                          request_timeout_s=request_timeout_s, admin_token=admin_token)
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
    from round_builder.build import BuildConfig, build_round
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
    from round_builder import export
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


@round_app.command("harvest")
def round_harvest(
    task: Annotated[str, typer.Option(help="Task name")],
    number: Annotated[int, typer.Option("--round", help="Round number (collecting or validating)")],
    corpus: Annotated[Path, typer.Option(help="CSV, TSV, JSONL or Parquet file with a text and a rating column")],
    model: Annotated[Path, typer.Option(help="The harvesting model's directory (Model 0)")],
    n: Annotated[int, typer.Option("--n", help="How many sentences to harvest")],
    seed: int = 0,
    as_: Annotated[str, typer.Option("--as", help="examples (validated directly) or prompts (for writers)")]
    = "examples",
    text_column: str = "text",
    rating_column: str = "rating",
    id_column: Annotated[str | None, typer.Option(help="Document id column; default: the row number")] = None,
    low_rating: Annotated[float, typer.Option(help="Ratings at or below this are low (DynaSent: 1 star)")] = 1,
    high_rating: Annotated[float, typer.Option(help="Ratings at or above this are high (DynaSent: 5 stars)")] = 5,
    positive_label: str = "positive",
    negative_label: str = "negative",
    min_chars: Annotated[int | None, typer.Option(help="Shortest sentence; default: the task's min_chars")] = None,
    max_chars: Annotated[int | None, typer.Option(help="Longest sentence; default: the task's max_chars")] = None,
    batch_size: int = 64,
    database_url: DatabaseOpt = None,
) -> None:
    """Harvest corpus sentences the model likely gets wrong (DynaSent §3.2): half from low-rated
    texts it calls positive and high-rated texts it calls negative, half at random."""
    from modelling.errors import EvaluationError
    from modelling.harvest import harvest
    from services.errors import DomainError

    if as_ not in ("examples", "prompts"):
        raise _fail(f"--as takes examples or prompts, not {as_!r}")
    url = _settings(database_url).resolved_database_url
    _ensure_schema(url)
    try:
        report = harvest(_session_factory(url), task, number, corpus, model, n, mode=as_,  # type: ignore[arg-type]
                         text_column=text_column, rating_column=rating_column, id_column=id_column, seed=seed,
                         low_rating=low_rating, high_rating=high_rating, positive_label=positive_label,
                         negative_label=negative_label, min_chars=min_chars, max_chars=max_chars,
                         batch_size=batch_size)
    except DomainError as exc:
        raise _fail(exc.message) from exc
    except (EvaluationError, OSError) as exc:
        raise _fail(str(exc)) from exc
    table = Table("pool", "available", "wanted", "selected")
    for pool, counts in report.pools.items():
        table.add_row(pool, f"{counts['available']:,}", f"{counts['wanted']:,}", f"{counts['selected']:,}")
    console.print(f"{report.corpus}: {report.documents:,} texts, {report.sentences:,} sentences; model "
                  f"{report.model_id} version {report.model_version}", soft_wrap=True)
    console.print(table)
    left_out = {k: v for k, v in report.skipped.items() if v}
    if left_out:
        console.print("left out: " + ", ".join(f"{k} {v:,}" for k, v in left_out.items()), soft_wrap=True)
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}", soft_wrap=True, highlight=False)
    console.print(f"wrote {report.written:,} {report.mode} to {task} round {number}"
                  + (f" ({report.already_present:,} already there)" if report.already_present else ""))


def _show_training_log() -> None:
    """Per-epoch lines of `modelling.train` on stderr when nothing else shows INFO logs."""
    train_logger = logging.getLogger("modelling.train")
    if not logging.getLogger().handlers and not train_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        train_logger.addHandler(handler)
        train_logger.setLevel(logging.INFO)


@round_app.command("train")
def round_train(
    task: Annotated[str, typer.Option(help="Task name")],
    mix: Annotated[Path, typer.Option(help="Data mix YAML: train sources (weights, upsampling) and the dev set")],
    out: Annotated[Path, typer.Option(help="New folder for the model directory")],
    number: Annotated[int | None, typer.Option(
        "--round", help="The round this model will serve (the next round to collect)")] = None,
    base: Annotated[Path | None, typer.Option(
        help="Backbone checkpoint folder (never a dynaloop-trained model); default: packaged MiniLM")] = None,
    epochs: int = 3,
    batch_size: int = 32,
    learning_rate: float = 2e-5,
    max_length: int = 128,
    seed: int = 0,
    class_weights: Annotated[str, typer.Option(help="none or balanced (from the mix's label mass)")] = "none",
    patience: Annotated[int, typer.Option(
        help="Early stopping: epochs without a better dev macro-F1 (0: never stop early)")] = 2,
    gradient_accumulation_steps: int = 1,
    checkpoint_every: Annotated[str, typer.Option(
        help="Resumable checkpoint every N optimizer steps, or 'epoch'")] = "epoch",
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its newest checkpoint")] = False,
    cpu: Annotated[bool, typer.Option(help="Train on the CPU even when a GPU is present")] = False,
    model_id: Annotated[str | None, typer.Option(help="Name in dynaloop_model.json; default from task and round")]
    = None,
    tiny: Annotated[bool, typer.Option(help="Tests: a tiny random BERT as the base, not --base")] = False,
    database_url: DatabaseOpt = None,
) -> None:
    """Retrain from scratch on the mix: base checkpoint, fresh head, all rounds' data (DynaSent §5.3)."""
    import os
    import tempfile

    from accelerate import PartialState
    from pydantic import ValidationError

    from modelling.init_model import init_model_dir
    from modelling.datasets import DataError, DataMix, input_format, load_source, model_labels
    from modelling.registry import register_model
    from modelling.train import TrainConfig, TrainingError, train_model
    from services.db.engine import session_scope
    from services.domain.tasks import definition_of, get_task
    from services.errors import DomainError

    if class_weights not in ("none", "balanced"):
        raise _fail(f"--class-weights takes none or balanced, not {class_weights!r}")
    if tiny and base is not None:
        raise _fail("give --base or --tiny, not both")
    every: int | str = checkpoint_every
    if checkpoint_every != "epoch":
        try:
            every = int(checkpoint_every)
        except ValueError as exc:
            raise _fail(f"--checkpoint-every takes a number of steps or 'epoch', not {checkpoint_every!r}") from exc
    settings = _settings(database_url)
    url = settings.resolved_database_url
    _ensure_schema(url)
    factory = _session_factory(url)
    try:
        data_mix = DataMix.load(mix)
        with factory() as session:
            task_row = get_task(session, task)
            definition = definition_of(task_row)
            labels = model_labels(definition)
            multi = definition.is_multi_label
            train_sets = [load_source(spec, labels=labels, multi_label=multi, session=session, task=task_row)
                          for spec in data_mix.train]
            dev = None if data_mix.dev is None else load_source(
                data_mix.dev, labels=labels, multi_label=multi, session=session, task=task_row)
    except DomainError as exc:
        raise _fail(exc.message) from exc
    except DataError as exc:
        raise _fail(str(exc)) from exc
    family = "multi_label" if multi else "single_label"
    if os.environ.get("RANK", "0") == "0":  # once under `accelerate launch` / torchrun
        for labelled in train_sets:
            console.print(f"train: {labelled.name} — {len(labelled):,} rows, weight {labelled.weight}, "
                          f"×{labelled.upsample}", soft_wrap=True)
        if dev is not None:
            console.print(f"dev: {dev.name} — {len(dev):,} rows", soft_wrap=True)
    _show_training_log()
    with tempfile.TemporaryDirectory(prefix="dynaloop-tiny-base-") as scratch:
        try:
            if tiny:
                base = Path(scratch) / "base"
                init_model_dir(base, labels=labels, family=family, tiny=True, seed=seed)  # type: ignore[arg-type]
            config = TrainConfig(base=base, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                                 max_length=max_length, seed=seed, class_weights=class_weights,  # type: ignore[arg-type]
                                 early_stopping_patience=patience or None,
                                 gradient_accumulation_steps=gradient_accumulation_steps, cpu=cpu,
                                 checkpoint_every=every, resume=resume)  # type: ignore[arg-type]
            result = train_model(train_sets, dev, labels=labels, family=family,  # type: ignore[arg-type]
                                 input_format=input_format(definition), config=config, out_dir=out,
                                 model_id=model_id or (f"{task}-for-round-{number}" if number else f"{task}-{out.name}"),
                                 trained_for_round=number, task_name=task)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise _fail(f"invalid training settings: {problems}") from exc
        except (TrainingError, FileNotFoundError, OSError) as exc:
            raise _fail(str(exc)) from exc
    if not PartialState().is_main_process:  # `accelerate launch`: one process registers the model
        return
    best = result.best_dev_macro_f1
    console.print(f"trained {result.metadata.model_id} version {result.metadata.version}: {result.epochs_run} "
                  f"epoch(s), best epoch {result.best_epoch}"
                  + ("" if best is None else f", dev macro-F1 {best:.4f}")
                  + f", {result.examples_per_second:.1f} examples/s; wrote {out}", soft_wrap=True)
    try:
        with session_scope(factory) as session:
            version = register_model(session, get_task(session, task), out)
            console.print(f"registered model version {version.id} ({version.status.value})")
    except DomainError as exc:
        raise _fail(exc.message) from exc


def _round_numbers(value: str) -> list[int] | None:
    """`--rounds`: 'all' (None: every built round), 'none' ([]), or numbers such as 1,2."""
    if value.strip().lower() == "all":
        return None
    if value.strip().lower() == "none":
        return []
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError as exc:
        raise _fail(f"--rounds takes 'all', 'none' or round numbers such as 1,2; not {value!r}") from exc


@round_app.command("evaluate")
def round_evaluate(task: Annotated[str, typer.Option(help="Task name")],
                   model: Annotated[Path, typer.Option(help="Model directory (with dynaloop_model.json)")],
                   out: Annotated[Path, typer.Option(help="Folder for evaluation.md, evaluation.json and plots")],
                   mix: Annotated[Path | None, typer.Option(
                       help="Data mix YAML: its dev and evaluate sources are evaluated too")] = None,
                   rounds: Annotated[str, typer.Option(
                       help="Built rounds whose dev/test splits to evaluate: all, none, or e.g. 1,2")] = "all",
                   positive_label: Annotated[str | None, typer.Option(
                       help="Binary tasks: the class whose F1 is reported (default: positive/sarcastic, "
                            "else the second label)")] = None,
                   batch_size: int = 64,
                   device: Annotated[str | None, typer.Option(help="cpu, cuda, ...; default: cuda if present")] = None,
                   record: Annotated[bool, typer.Option(
                       help="Store the results in the model registry (trained -> evaluated)")] = True,
                   database_url: DatabaseOpt = None) -> None:
    """Evaluate a model on every built round's dev/test split and the mix's sets (DynaSent Table 5b)."""
    from model_directory import ModelMetadata, ModelMetadataError
    from modelling.datasets import DataError, DataMix
    from modelling.errors import EvaluationError
    from modelling.evaluate import evaluate_model
    from modelling.evaluation_report import write_evaluation
    from modelling.evaluation_sets import load_evaluation_sets
    from modelling.registry import record_evaluation
    from services.db.engine import session_scope
    from services.domain.tasks import get_task
    from services.errors import DomainError

    if not model.is_dir():
        raise _fail(f"model directory {model} does not exist")
    try:
        ModelMetadata.load(model)
        data_mix = DataMix.load(mix) if mix is not None else None
    except (ModelMetadataError, DataError) as exc:
        raise _fail(str(exc)) from exc
    numbers = _round_numbers(rounds)
    settings = _settings(database_url)
    url = settings.resolved_database_url
    _ensure_schema(url)
    extra = [spec for spec in ([data_mix.dev] + data_mix.evaluate if data_mix else []) if spec is not None]
    try:
        with _session_factory(url)() as session:
            chosen = load_evaluation_sets(session, get_task(session, task), rounds=numbers, extra=extra)
        for name in chosen.skipped:
            err.print(f"[yellow]skipped {name}: it has no labelled examples[/yellow]")
        if not chosen.sets:
            raise _fail(f"nothing to evaluate: task {task!r} has no built round with dev/test examples and "
                        "no --mix with evaluate sources")
        evaluation = evaluate_model(model, chosen.sets, human_f1=chosen.human_f1, positive_label=positive_label,
                                    batch_size=batch_size, device=device, progress=True)
    except DomainError as exc:
        raise _fail(exc.message) from exc
    except (DataError, EvaluationError, ModelMetadataError) as exc:
        raise _fail(str(exc)) from exc
    written = write_evaluation(evaluation, out)

    table = Table(title=f"{evaluation.model_id}: F1 (%)")
    table.add_column("set", no_wrap=True)
    for column in ["n", *evaluation.labels, "macro-F1", "human F1", "solved"]:
        table.add_column(column, justify="right")
    for metrics in evaluation.sets:
        table.add_row(metrics.name, str(metrics.rows), *[f"{100 * metrics.f1[label]:.1f}" for label in evaluation.labels],
                      f"{100 * metrics.macro_f1:.1f}",
                      "–" if metrics.human_f1 is None else f"{100 * metrics.human_f1:.1f}",
                      "–" if metrics.solved is None else ("yes" if metrics.solved else "no"))
    console.print(table)
    console.print(f"wrote {len(written)} files to {out}", soft_wrap=True)
    if not record:
        return
    try:
        with session_scope(_session_factory(url)) as session:
            version = record_evaluation(session, get_task(session, task), model, evaluation.to_dict())
            name, status = version.name, version.status.value
    except DomainError as exc:
        raise _fail(f"the evaluation files are written, but the model registry refused it: {exc.message}") from exc
    console.print(f"registry: {name} is {status}")


# --- servers ------------------------------------------------------------------------


@app.command("check")
def check(database_url: DatabaseOpt = None,
          rule: Annotated[list[str] | None, typer.Option(help="Only this rule (repeatable); default: all")] = None,
          as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False) -> None:
    """Check the database against the rules (labels counted, no self-validation, counters, orphans).
    Exit code 1 when anything is violated."""
    import json

    from services.db.engine import session_scope
    from services.domain.invariants import check_database

    url = _settings(database_url).resolved_database_url
    _ensure_schema(url)
    try:
        with session_scope(_session_factory(url)) as session:
            report = check_database(session, rule)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        print(json.dumps(report.to_dict(), indent=1, default=str))
    else:
        counts = ", ".join(f"{n:,} {name}" for name, n in report.counts.items())
        console.print(f"checked {len(report.rules_checked)} rules over {counts}", soft_wrap=True)
        for violation in report.violations:
            console.print(f"[red]{violation.rule}[/red]: {violation.count:,} — {violation.description}; "
                          f"e.g. {violation.rows[:3]}", soft_wrap=True, highlight=False)
        if report.ok:
            console.print("no violations")
    if not report.ok:
        raise typer.Exit(1)


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
    if settings.max_concurrent_requests >= settings.worker_threads:
        raise _fail("DYNALOOP_MAX_CONCURRENT_REQUESTS must be below DYNALOOP_WORKER_THREADS (see docs/deploy.md)")
    uvicorn.run("api.app:create_app", factory=True, host=host, port=port, workers=workers,
                limit_concurrency=settings.max_concurrent_requests,
                log_level=log_level)


def web_app_file() -> Path:
    """The Streamlit entry point ``frontend/app.py`` (source checkout or installed package)."""
    source = Path(__file__).resolve().parent.parent / "frontend" / "app.py"
    if source.is_file():
        return source
    import importlib.util

    spec = importlib.util.find_spec("frontend")
    if spec is None or spec.origin is None:
        raise _fail("the web app (package `frontend`) is not installed; reinstall dynaloop")
    return Path(spec.origin).parent / "app.py"


def ui_command(host: str, port: int) -> list[str]:
    """The `streamlit run` command line of `dynaloop ui`."""
    return [sys.executable, "-m", "streamlit", "run", str(web_app_file()), "--server.port", str(port),
            "--server.address", host, "--server.headless", "true", "--browser.gatherUsageStats", "false"]


@app.command("ui")
def ui(host: Annotated[str, typer.Option(help="Address the web app listens on")] = "127.0.0.1",
       port: Annotated[int, typer.Option(help="Web app port")] = 8501,
       api_url: Annotated[str, typer.Option(envvar="DYNALOOP_API_URL",
                                            help="The API the web app talks to")] = "http://127.0.0.1:8000") -> None:
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


@app.command("demo")
def demo(
    host: Annotated[str, typer.Option(help="Address the API and the web app listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port")] = 8000,
    model_port: Annotated[int, typer.Option(help="Model server port (it listens on 127.0.0.1 only)")] = 8001,
    ui_port: Annotated[int, typer.Option(help="Web app (Streamlit) port")] = 8501,
    ui: Annotated[bool, typer.Option(help="Start the web app")] = True,
    data_dir: Annotated[Path | None, typer.Option(
        help="Folder for the SQLite file, Model 0 and the logs (default: DYNALOOP_DATA_DIR or .dynaloop)")] = None,
    model_epochs: Annotated[int, typer.Option(help="Epochs of Model 0 on the seed corpus")] = 2,
    model_max_length: Annotated[int, typer.Option(help="Model 0's longest input, in word pieces")] = 48,
    seed_per_label: Annotated[int, typer.Option(help="Seed sentences per label Model 0 trains on")] = 300,
    retrain: Annotated[bool, typer.Option(help="Train Model 0 again even if a cached one fits")] = False,
    model_endpoint: Annotated[list[str] | None, typer.Option(
        help="Use this model server (e.g. http://127.0.0.1:8001) instead of training Model 0 and starting one; "
             "repeat for an ensemble")] = None,
    serve: Annotated[bool, typer.Option(
        help="Start the services; --no-serve only sets up the database and prints the logins")] = True,
) -> None:
    """The whole demo on SQLite: Model 0, model server, API and web app, with one login per role.

    Trains Model 0 (the packaged MiniLM on a seed corpus; cached under the data directory), starts
    the model server, the API and the Streamlit app as child processes, sets up the DynaSent-style
    task `dynasent-r2` with prompts and users, and prints the addresses and logins. Ctrl-C stops
    everything."""
    from dynaloop.demo import DemoError, DemoOptions, DemoSetup, run_demo, set_up_demo
    from dynaloop.model_zero import ModelZeroSpec

    settings = _settings()
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    if serve:
        try:
            spec = ModelZeroSpec(epochs=model_epochs, max_length=model_max_length, per_label=seed_per_label)
        except ValueError as exc:
            raise _fail(str(exc)) from exc
        options = DemoOptions(host=host, port=port, model_port=model_port, ui_port=ui_port, ui=ui,
                              model_endpoints=model_endpoint or [], model=spec, retrain=retrain)
        try:
            run_demo(settings, options, console)
        except DemoError as exc:
            raise _fail(str(exc)) from exc
        return
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
    console.print("set up only (--no-serve); `dynaloop demo` starts the model server, the API and the web app")


# --- jobs ---------------------------------------------------------------------------

job_app = typer.Typer(help="Jobs (train, evaluate, promote) that the API starts in their own process.",
                      no_args_is_help=True)
app.add_typer(job_app, name="job")


@job_app.command("run")
def job_run(job_id: Annotated[int, typer.Argument(help="The job's id (POST /api/v1/tasks/{task}/jobs)")],
            database_url: DatabaseOpt = None) -> None:
    """Run a queued job in this process, writing its progress to the database (the API starts
    this command for every job; the model server admin token comes from the environment)."""
    import signal

    from modelling.jobs import run_job
    from services.db.models import JobStatus
    from services.errors import DomainError

    settings = _settings(database_url)
    url = settings.resolved_database_url
    _ensure_schema(url)

    def _stop(signum: int, frame: object) -> None:
        raise SystemExit(f"stopped by signal {signum}")  # recorded on the job as interrupted

    signal.signal(signal.SIGTERM, _stop)
    token = settings.model_server_admin_token
    try:
        job = run_job(_session_factory(url), job_id, data_dir=settings.data_dir,
                      admin_token=token.get_secret_value() if token else None)
    except DomainError as exc:
        raise _fail(exc.message) from exc
    console.print(f"job {job.id} ({job.kind.value}) {job.status.value}: {job.message}", soft_wrap=True,
                  highlight=False, markup=False)
    if job.status is not JobStatus.succeeded:
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover - console entry point
    logging.basicConfig(level=logging.INFO)
    app()


if __name__ == "__main__":  # pragma: no cover
    main()

