"""`dynaloop model`: classifier directories and the task's model registry (docs/models.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.table import Table

from dynaloop.commands.common import (
    DatabaseOpt,
    TaskOpt,
    console,
    domain_session,
    ensure_schema,
    fail,
    problems,
    redact,
    session_factory,
    settings_for,
)
from dynaloop.commands.model_servers import app as servers_app

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from rounds.models.promotion import Promotion
    from rounds.models.replicas import ReplicaView
    from services.db.models import ModelVersion
    from services.taskdef import TaskDefinition

app = typer.Typer(help="Classifier directories for the model server.", no_args_is_help=True)
app.add_typer(servers_app, name="servers")


def _task_definition(source: str, database_url: str | None) -> TaskDefinition:
    """The definition of ``source``: a task YAML file, an example task, or a task of the database
    (``--database-url``; default: DYNALOOP_DATABASE_URL or the data folder's SQLite file)."""
    from services.taskdef import TaskDefinitionError, example_path, parse_task_definition

    try:
        path = Path(source) if Path(source).exists() else example_path(source)
    except KeyError as exc:
        path, examples = None, exc.args[0]
    if path is not None:
        try:
            return parse_task_definition(path.read_text(encoding="utf-8"), source=source)
        except TaskDefinitionError as exc:
            raise fail(str(exc)) from exc
    from sqlalchemy import select
    from sqlalchemy.engine import make_url

    from services.db.migrate import current_revision, head_revision
    from services.db.models import Task
    from services.domain.tasks import definition_of

    url = settings_for(database_url).resolved_database_url
    parsed = make_url(url)
    # A SQLite file that does not exist is no database to look in (and is not created here).
    exists = not parsed.drivername.startswith("sqlite") or (parsed.database and Path(parsed.database).exists())
    if exists and current_revision(url) == head_revision():
        with session_factory(url)() as session:
            row = session.scalar(select(Task).where(Task.name == source))
            if row is not None:
                return definition_of(row)
    raise fail(f"{source} is neither a file, an example task ({examples}) nor a task in the database {redact(url)}")


@app.command("init")
def model_init(
    out: Annotated[Path, typer.Option("--out", help="Folder to write the model directory to")],
    task: Annotated[
        str | None,
        typer.Option(help="Take labels and family from a task: a YAML file, an example task or a task in the database"),
    ] = None,
    labels: Annotated[str | None, typer.Option(help="Comma-separated labels (instead of --task)")] = None,
    multi_label: Annotated[bool, typer.Option(help="With --labels: a multi-label head")] = False,
    exclusive_labels: Annotated[
        str | None,
        typer.Option(
            help="With --labels --multi-label: comma-separated labels never predicted with others (e.g. neutral); "
            "default: none"
        ),
    ] = None,
    pair: Annotated[bool, typer.Option(help="With --labels: (sentence, target) input")] = False,
    model_id: Annotated[str, typer.Option(help="Name reported by /info")] = "model-0",
    base: Annotated[Path | None, typer.Option(help="Local Hugging Face checkpoint; default: packaged MiniLM")] = None,
    tiny: Annotated[bool, typer.Option(help="A tiny random BERT for tests, not MiniLM")] = False,
    seed: int = 0,
    overwrite: bool = False,
    database_url: DatabaseOpt = None,
) -> None:
    """Build an (untrained) classifier directory with dynaloop_model.json, offline."""
    from rounds.models.init_model import init_model_dir

    family: Literal["single_label", "multi_label"] = "multi_label" if multi_label else "single_label"
    input_format: Literal["text", "text_pair"] = "text_pair" if pair else "text"
    task_name = None
    exclusive: list[str] = []
    notes: list[str] = []
    if task is not None:
        from services.taskdef import TaskFamily

        if exclusive_labels is not None:
            raise fail("--exclusive-labels goes with --labels; with --task the task's own exclusive labels are used")
        definition = _task_definition(task, database_url)
        label_list = list(definition.labels)
        family = "multi_label" if definition.is_multi_label else "single_label"
        input_format = "text_pair" if definition.family is TaskFamily.target_dependent else "text"
        task_name = definition.name
        exclusive = list(definition.exclusive_labels)
    elif labels:
        label_list = [label.strip() for label in labels.split(",") if label.strip()]
        exclusive = [label.strip() for label in (exclusive_labels or "").split(",") if label.strip()]
        if exclusive and not multi_label:
            raise fail("--exclusive-labels applies to a multi-label head; add --multi-label")
        unknown = [label for label in exclusive if label not in label_list]
        if unknown:
            raise fail(f"--exclusive-labels {unknown} are not among the labels {label_list}")
        if multi_label and not exclusive:
            notes.append(
                "no exclusive labels: every label may be predicted together with others; name the one that "
                "stands alone (e.g. neutral) with --exclusive-labels"
            )
    else:
        raise fail("give --task or --labels")
    try:
        metadata = init_model_dir(
            out,
            labels=label_list,
            family=family,
            input_format=input_format,
            model_id=model_id,
            base=base,
            tiny=tiny,
            seed=seed,
            task=task_name,
            exclusive_labels=exclusive,
            overwrite=overwrite,
        )
    except (FileExistsError, FileNotFoundError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    shown = f", exclusive labels {metadata.exclusive_labels}" if metadata.exclusive_labels else ""
    console.print(
        f"wrote {out} ({metadata.family}, {metadata.input_format}, labels {metadata.labels}{shown}, "
        f"base {metadata.base_model})",
        soft_wrap=True,
    )
    for note in notes:
        console.print(f"note: {note}", soft_wrap=True, highlight=False, markup=False)


def _model_row(model: ModelVersion, attempts: int | None = None) -> list[str]:
    when = model.promoted_at or model.evaluated_at or model.created_at
    return [
        str(model.id),
        model.name,
        model.status.value,
        "" if model.trained_for_round is None else str(model.trained_for_round),
        model.endpoint or "",
        when.strftime("%Y-%m-%d %H:%M"),
        "" if attempts is None else f"{attempts:,}",
        model.directory,
    ]


@app.command("list")
def model_list(task: TaskOpt, database_url: DatabaseOpt = None) -> None:
    """The task's registered model versions, their status and the attempts each one scored."""
    from rounds.models.registry import attempt_counts, list_models
    from services.domain.tasks import get_task
    from services.errors import DomainError

    url = settings_for(database_url).resolved_database_url
    ensure_schema(url)
    try:
        with session_factory(url)() as session:
            task_row = get_task(session, task)
            models = list_models(session, task_row)
            counts = attempt_counts(session, task_row)
    except DomainError as exc:
        raise fail(exc.message) from exc
    if not models:
        console.print(
            f"task {task!r} has no registered models; add one with `dynaloop model register --task {task} --dir DIR`"
        )
        return
    table = Table()
    for column in ("id", "name", "status", "for round", "endpoint", "since", "attempts", "directory"):
        table.add_column(column, no_wrap=column != "directory")
    for model in models:
        table.add_row(*_model_row(model, counts.get(model.id, 0)))
    console.print(table)


@app.command("register")
def model_register(
    task: TaskOpt,
    directory: Annotated[Path, typer.Option("--dir", help="Model directory with dynaloop_model.json")],
    evaluation: Annotated[
        Path | None, typer.Option(help="JSON file of evaluation results: recorded too (trained -> evaluated)")
    ] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """Record a model directory in the task's registry (again: no change)."""
    import json

    from rounds.models.registry import record_evaluation, register_model
    from services.domain.tasks import get_task

    metrics = None
    if evaluation is not None:
        try:
            metrics = json.loads(evaluation.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise fail(f"no evaluation file {evaluation}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise fail(f"{evaluation} is not a JSON file: {exc}") from exc
    with domain_session(database_url) as session:
        task_row = get_task(session, task)
        model = register_model(session, task_row, directory)
        if metrics is not None:
            model = record_evaluation(session, task_row, directory, metrics)
        summary = f"{model.name} (id {model.id}) is {model.status.value}"
    console.print(f"registered {summary}", soft_wrap=True)


@app.command("promote")
def model_promote(
    task: TaskOpt,
    version: Annotated[str, typer.Option("--version", help="Registry id, name (model_id@version) or model_id")],
    server: Annotated[
        str | None,
        typer.Option(
            help="A registered model server (`dynaloop model servers list`), e.g. model-0, to hot-swap. Without "
            "--server and --endpoint: the promotion is recorded and the replicas that follow the task "
            "(`dynaloop model-server --follow-task`) load it; this waits until every live one serves it"
        ),
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(
            help="Instead of --server: the running model server's URL, e.g. http://127.0.0.1:8001. You run "
            "this on the API's machine, so you are an admin: a URL that is not registered yet is registered "
            "(named after its host and port) with --admin-token"
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="DYNALOOP_MODEL_SERVER_ADMIN_TOKEN",
            help="The model server's admin token; default: the one registered with the server",
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Promote a model that was never evaluated")] = False,
    confirm_worse: Annotated[
        bool,
        typer.Option(
            help="Promote a model that scores below the promoted one on a round's dev split, or within 0.05 of "
            "chance (refused without it, with both scores)"
        ),
    ] = False,
    keep_round_servers: Annotated[
        bool, typer.Option(help="Do not put the server in the task's open rounds' loop")
    ] = False,
    backend: Annotated[str | None, typer.Option(help="Model server backend for the new model; default: same")] = None,
    timeout_s: Annotated[
        float, typer.Option(help="How long the server (or the following replicas) may take to load the model")
    ] = 300.0,
    database_url: DatabaseOpt = None,
) -> None:
    """Hot-swap a model server to a registered model, then mark it promoted (the previous one retired); or,
    without a server, promote it to the replicas that follow the task and wait until they serve it."""
    from pydantic import ValidationError

    from rounds.models.promotion import PromotionIncomplete
    from rounds.models.usecases import PromoteOptions, promote_model
    from services.errors import DomainError

    if server is not None and endpoint is not None:
        raise fail("give one model server: --server NAME (registered) or --endpoint URL, not both")
    url = settings_for(database_url).resolved_database_url
    ensure_schema(url)
    factory = session_factory(url)
    if endpoint is not None:
        server = _server_at(factory, endpoint, admin_token)
    try:
        options = PromoteOptions(
            server=server,
            force=force,
            confirm_worse=confirm_worse,
            keep_round_servers=keep_round_servers,
            backend=backend,
            timeout_s=timeout_s,
        )
    except ValidationError as exc:
        raise fail(f"invalid promotion settings: {problems(exc)}") from exc
    if server is None:
        console.print(f"promoting {version} to the replicas that follow task {task!r} (up to {timeout_s:g} s)")
    try:
        result = promote_model(factory, task, version, options, operator_admin_token=admin_token)
    except PromotionIncomplete as exc:
        _print_replicas(exc.promotion.replicas)
        raise fail(exc.message) from exc
    except DomainError as exc:
        raise fail(exc.message) from exc
    _print_promotion(result)


def _server_at(factory: sessionmaker[Session], endpoint: str, admin_token: str | None) -> str:
    """The name of the model server registered at ``endpoint``, registering it (named after its
    host and port) where none is."""
    from services.db.engine import session_scope
    from services.domain import model_servers
    from services.errors import DomainError

    try:
        with session_scope(factory) as session:
            found = model_servers.find_by_url(session, endpoint)
            if found is None:
                taken = [s.name for s in model_servers.list_servers(session)]
                name = model_servers.name_for_url(model_servers.check_url(endpoint), taken)
                found = model_servers.register(session, None, name, endpoint, admin_token=admin_token)
                console.print(f"registered model server {found.name} at {found.url}", soft_wrap=True)
            return found.name
    except DomainError as exc:
        raise fail(exc.message) from exc


def _print_promotion(result: Promotion) -> None:
    """What a promotion did: the server that serves the model, or the rollout to the replicas
    that follow the task; the models retired and the rounds updated."""
    if result.server is not None:
        console.print(
            f"promoted {result.model.name}: model server {result.server} ({result.endpoint}) now serves it",
            soft_wrap=True,
        )
    else:
        assert result.rollout is not None
        console.print(f"promoted {result.model.name}: {result.rollout.describe()}", soft_wrap=True)
        _print_replicas(result.replicas)
    for old in result.retired:
        console.print(f"retired {old.name}")
    if result.rounds_updated:
        console.print(f"round(s) {', '.join(map(str, result.rounds_updated))} now use model server {result.server}")


def _print_replicas(replicas: list[ReplicaView]) -> None:
    if not replicas:
        return
    table = Table()
    for column in ("replica", "url", "serves", "precision", "state", "live", "last report (UTC)", "message"):
        table.add_column(column, no_wrap=column not in ("message", "url"))
    for view in replicas:
        table.add_row(
            view.name,
            view.url or "",
            view.serving or "",
            view.precision or "",
            view.state,
            "yes" if view.live else "no",
            view.heartbeat_at.strftime("%Y-%m-%d %H:%M:%S"),
            view.message,
        )
    console.print(table)


@app.command("replicas")
def model_replicas(task: TaskOpt, database_url: DatabaseOpt = None) -> None:
    """The model-server replicas that follow the task (`dynaloop model-server --follow-task`): what each
    serves, its state, and whether it is live (reported within the last seconds)."""
    from rounds.models.replicas import LIVE_WITHIN_S, list_replicas
    from services.domain.tasks import get_task
    from services.errors import DomainError

    url = settings_for(database_url).resolved_database_url
    ensure_schema(url)
    try:
        with session_factory(url)() as session:
            replicas = list_replicas(session, get_task(session, task))
    except DomainError as exc:
        raise fail(exc.message) from exc
    if not replicas:
        console.print(
            f"no model-server replica follows task {task!r}; start one with "
            f"`dynaloop model-server --follow-task {task}`",
            soft_wrap=True,
        )
        return
    _print_replicas(replicas)
    live = sum(view.live for view in replicas)
    console.print(f"{live} of {len(replicas)} live (reported within {LIVE_WITHIN_S:g} s)", highlight=False)


@app.command("retire")
def model_retire(
    task: TaskOpt,
    version: Annotated[str, typer.Option("--version", help="Registry id, name or model_id")],
    database_url: DatabaseOpt = None,
) -> None:
    """Mark a model version retired (a model server keeps serving it until another is promoted)."""
    from rounds.models.registry import retire
    from services.domain.tasks import get_task

    with domain_session(database_url) as session:
        model = retire(session, get_task(session, task), version)
        name, endpoint = model.name, model.endpoint
    console.print(
        f"retired {name}" + (f"; {endpoint} still serves it until another model is promoted there" if endpoint else ""),
        soft_wrap=True,
    )


@app.command("check-precision")
def model_check_precision(
    model: Annotated[Path, typer.Option("--model", help="Model directory (with dynaloop_model.json)")],
    data: Annotated[
        Path,
        typer.Option(
            "--data",
            help="Real text of the task: a .txt file (one text per line) or a CSV, TSV, JSONL or Parquet file with a "
            "text column (and, optionally, gold labels: macro-F1 is reported too)",
        ),
    ],
    text_column: str = "text",
    label_column: Annotated[str, typer.Option(help="Gold labels (multi-label: joined with |); optional")] = "label",
    target_column: Annotated[str | None, typer.Option(help="Targets, for sentence-pair models")] = None,
    max_texts: Annotated[int, typer.Option(help="Check at most this many texts (a seeded sample)")] = 2000,
    batch_size: int = 64,
    record: Annotated[
        bool,
        typer.Option(
            help="Write the result to the model directory (dynaloop_precision.json), where --precision auto reads it"
        ),
    ] = True,
) -> None:
    """Score real text at fp32, bf16 and int8: agreement with fp32, probability change and macro-F1.
    auto never uses a precision that changed more than 1% of the predictions (docs/models.md)."""
    from model_server.directory import ModelMetadataError
    from rounds.models.datasets import DataError
    from rounds.models.errors import EvaluationError
    from rounds.models.precision_check import check_precisions, read_check_texts

    if not model.is_dir():
        raise fail(f"{model} is not a folder with dynaloop_model.json")
    try:
        texts = read_check_texts(
            data,
            text_column=text_column,
            label_column=label_column,
            target_column=target_column,
            max_texts=max_texts,
        )
        check = check_precisions(model, texts, batch_size=batch_size)
    except (DataError, EvaluationError, ModelMetadataError, UnicodeDecodeError) as exc:
        raise fail(str(exc)) from exc
    table = Table("precision", "agreement with fp32", "changed", "max |Δp|", "macro-F1", "Δ points", "texts/s", "auto")
    for precision, result in check.results.items():
        table.add_row(
            precision,
            f"{100 * result.agreement:.2f}%",
            f"{result.changed:,}",
            f"{result.max_probability_difference:.4f}",
            "–" if result.macro_f1 is None else f"{100 * result.macro_f1:.1f}",
            "–" if result.macro_f1_vs_fp32_points is None else f"{result.macro_f1_vs_fp32_points:+.2f}",
            "–" if result.sentences_per_second is None else f"{result.sentences_per_second:.0f}",
            "may use" if check.admits(precision) is None else "refused",
        )
    console.print(f"{check.texts:,} texts of {check.data}; CPU: {check.cpu}", soft_wrap=True, highlight=False)
    console.print(table)
    for precision, reason in check.unavailable.items():
        console.print(f"{precision}: not checked ({reason})", soft_wrap=True, highlight=False)
    if record:
        path = check.save(model)
        console.print(f"written to {path}", soft_wrap=True, highlight=False)
