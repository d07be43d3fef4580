"""`dynaloop round`: build, export, harvest, train and evaluate (docs/round_builder.md,
docs/training.md, docs/evaluation.md, docs/models.md). Each command calls one use case of
``rounds.build.usecases`` or ``rounds.models.usecases`` (harvest: ``rounds.models.harvest.harvest``)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.table import Table

from dynaloop.commands.common import (
    DatabaseOpt,
    PrecisionOpt,
    console,
    ensure_schema,
    err,
    fail,
    problems,
    session_factory,
    settings_for,
)
from dynaloop.commands.settings_options import options_from
from rounds.build.build_settings import BuildSettings

if TYPE_CHECKING:
    from rounds.models.round_imports import ImportedRound, ImportOptions
    from rounds.models.usecases import TrainedModel
    from services.settings import Settings

app = typer.Typer(help="Build and export rounds.", no_args_is_help=True)

TaskOpt = Annotated[str, typer.Option(help="Task name")]
RoundOpt = Annotated[int, typer.Option("--round", help="Round number")]


def option_flags(settings: dict[str, Any]) -> str:
    """A preview's build settings (``{"policy": "relaxed", "chance": False}``) as this command's
    options (``--policy relaxed --no-chance``)."""
    flags = []
    for key, value in settings.items():
        name = key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        elif value is None:
            flags.append(f"--{name} none")  # model_based only: the others' None is their default
        else:
            flags.append(f"--{name} {shlex.quote(str(value))}")
    return " ".join(flags)


def refusal(exc: Any) -> str:
    """A refused build's message in this command's words: settings the strict policy refuses are
    named as the options that set them (``--no-chance``), not as the API's JSON fields."""
    loosened = exc.details.get("loosened")
    if not loosened:
        return str(exc.message)
    flags = option_flags(loosened)
    verb = "relaxes" if len(loosened) == 1 else "relax"
    return (
        f"--policy strict keeps the task's dev/test rules, and {flags} {verb} them: "
        f"use --policy relaxed instead, or leave {flags} out"
    )


def build_command(task: str, number: int, options: BuildSettings, settings: dict[str, Any]) -> str:
    """The `dynaloop round build` line that builds with a preview's ``settings`` and the
    settings they keep from ``options`` (seed, caps, model-based labels)."""
    kept = options.model_dump(include={"seed", "max_per_cell", "model_based"}, exclude_defaults=True)
    return f"dynaloop round build --task {shlex.quote(task)} --round {number} " + option_flags({**kept, **settings})


def print_options(task: str, number: int, options: BuildSettings, previews: list[dict[str, Any]]) -> int:
    """Each preview that builds, with its counts and the command that builds it (on stderr, one
    line each, however wide the terminal); how many there were."""
    from rounds.build.preview import PolicyPreview

    feasible = [p for p in previews if p.get("feasible")]
    if feasible:
        err.print(f"Options that build round {number} of {task}:", soft_wrap=True, highlight=False, markup=False)
    for option in feasible:
        preview = PolicyPreview(**option)
        err.print(
            f"  {preview.name} ({option_flags(preview.settings)}): {preview.counts_text()}; "
            f"per class train/dev/test: {preview.classes_text()}",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
        err.print(
            f"    {build_command(task, number, options, preview.settings)}",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    return len(feasible)


@app.command("build")
@options_from(BuildSettings, "options", "build settings")
def round_build(
    task: TaskOpt,
    number: RoundOpt,
    out: Annotated[Path | None, typer.Option(help="Folder for report.md, report.json and plots")] = None,
    *,
    options: BuildSettings,
    database_url: DatabaseOpt = None,
) -> None:
    """Aggregate labels, compute agreement and human F1, build chance-level splits, write the report.
    A policy the round cannot meet is refused with every option that builds it."""
    from rounds.build.usecases import build, default_build_dir
    from services.db.engine import session_scope
    from services.domain import round_lifecycle, tasks
    from services.errors import DomainError

    settings = settings_for(database_url)
    url = settings.resolved_database_url
    ensure_schema(url)
    folder = out or default_build_dir(settings.data_dir, task, number, options.seed)
    try:
        with session_scope(session_factory(url)) as session:
            round_ = round_lifecycle.get_round_by_number(session, tasks.get_task(session, task), number)
            built = build(session, None, round_, options, out_dir=folder)
    except DomainError as exc:
        # Every option that builds, with the command for it, then the one-line error.
        print_options(task, number, options, exc.details.get("relaxations", []))
        raise fail(refusal(exc)) from exc
    report = built.report
    total = report["counts"]["total"]
    console.print(
        f"build {built.build_id}: train {total['train']:,}, dev {total['dev']:,}, test {total['test']:,}; "
        f"report in {folder}",
        soft_wrap=True,
    )
    for name, values in report["splits"]["assessment"].items():
        score = values.get("model_macro_f1")
        if score is None:
            # No number to print: the split's examples carry no model prediction (an imported round),
            # or the split is empty.
            why = "its examples have no model prediction" if values.get("examples") else "the split is empty"
            console.print(f"  model macro-F1 on {name}: none ({why})", soft_wrap=True)
        else:
            console.print(f"  model macro-F1 on {name}: {score:.4f}")
    console.print(f"  {report['datasheet'].get('build_policy', '')}", soft_wrap=True)
    if built.ledger is not None:
        if built.ledger.get("error"):
            err.print(f"[yellow]warning:[/yellow] {built.ledger['error']}", soft_wrap=True, highlight=False)
        else:
            console.print(
                f"  ledger: {built.ledger['entries_added']} rows added "
                f"({built.ledger['amount_added_minor']} minor units {built.ledger['currency']})",
                soft_wrap=True,
            )


@app.command("build-preview")
@options_from(BuildSettings, "options", "build settings")
def round_build_preview(
    task: TaskOpt,
    number: RoundOpt,
    *,
    options: BuildSettings,
    database_url: DatabaseOpt = None,
) -> None:
    """What these build settings and every other policy would give a closed round (dev, test and
    train counts, per class), or what refuses them, with the command that builds each option.
    Records nothing."""
    from rounds.build.preview import PolicyPreview, nothing_builds
    from rounds.build.usecases import preview_build
    from services.db.engine import session_scope
    from services.domain import round_lifecycle, tasks
    from services.errors import DomainError

    url = settings_for(database_url).resolved_database_url
    ensure_schema(url)
    try:
        with session_scope(session_factory(url)) as session:
            round_ = round_lifecycle.get_round_by_number(session, tasks.get_task(session, task), number)
            previewed = preview_build(session, round_, options)
            session.rollback()  # a preview records nothing
    except DomainError as exc:
        raise fail(refusal(exc)) from exc
    for option in [previewed.requested, *previewed.relaxations]:
        preview = PolicyPreview(**option)
        if preview.feasible:
            text = (
                f"{preview.name}: builds: {preview.counts_text()}; per class train/dev/test: {preview.classes_text()}"
            )
        else:
            text = f"{preview.name}: cannot build ({preview.constraint}): {preview.message}"
        console.print(text, soft_wrap=True, highlight=False, markup=False)
    if not print_options(task, number, options, [previewed.requested, *previewed.relaxations]):
        raise fail(nothing_builds(number))


@app.command("export")
def round_export(
    task: TaskOpt,
    number: RoundOpt,
    out: Annotated[Path, typer.Option(help="Folder to write the files to")],
    format: Annotated[str, typer.Option(help="jsonl, csv or parquet")] = "parquet",
    splits: Annotated[str, typer.Option(help="Comma-separated splits")] = "train,dev,test",
    database_url: DatabaseOpt = None,
) -> None:
    """Write the newest build's splits to files (one per split) and their dataset card (README.md)."""
    from rounds.build.usecases import ExportedFile, ExportOptions, export_files
    from services.errors import DomainError

    settings = settings_for(database_url)
    if warning := settings.placeholder_secret_warning:
        err.print(f"[bold red]WARNING:[/bold red] {warning}", soft_wrap=True)
    url = settings.resolved_database_url
    ensure_schema(url)
    options = ExportOptions(format=format, splits=[s.strip() for s in splits.split(",") if s.strip()])

    def wrote(file: ExportedFile) -> None:
        console.print(f"wrote {file.path} ({file.size:,} bytes)", soft_wrap=True)

    try:
        export_files(session_factory(url), task, number, out, options, secret=settings.secret_key, on_file=wrote)
    except DomainError as exc:
        raise fail(exc.message) from exc


@app.command("harvest")
def round_harvest(
    task: TaskOpt,
    number: Annotated[int, typer.Option("--round", help="Round number (collecting or validating)")],
    corpus: Annotated[Path, typer.Option(help="CSV, TSV, JSONL or Parquet file with a text and a rating column")],
    model: Annotated[Path, typer.Option(help="The harvesting model's directory (Model 0)")],
    n: Annotated[int, typer.Option("--n", help="How many sentences to harvest")],
    seed: int = 0,
    as_: Annotated[
        str, typer.Option("--as", help="examples (validated directly) or prompts (for writers)")
    ] = "examples",
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
    precision: PrecisionOpt = "fp32",
    split_sentences: Annotated[
        bool,
        typer.Option(
            "--split-sentences/--no-split-sentences",
            help="Cut each text into sentences (a corpus of documents, e.g. reviews; the default), or "
            "keep each row whole (a file that is already one sentence or example per row)",
        ),
    ] = True,
    database_url: DatabaseOpt = None,
) -> None:
    """Harvest corpus sentences the model likely gets wrong (DynaSent §3.2): half from low-rated
    texts it calls positive and high-rated texts it calls negative, half at random."""
    from rounds.models.errors import EvaluationError
    from rounds.models.harvest import harvest
    from services.errors import DomainError

    mode: Literal["examples", "prompts"]
    if as_ == "examples":
        mode = "examples"
    elif as_ == "prompts":
        mode = "prompts"
    else:
        raise fail(f"--as takes examples or prompts, not {as_!r}")
    url = settings_for(database_url).resolved_database_url
    ensure_schema(url)
    try:
        report = harvest(
            session_factory(url),
            task,
            number,
            corpus,
            model,
            n,
            mode=mode,
            text_column=text_column,
            rating_column=rating_column,
            id_column=id_column,
            seed=seed,
            low_rating=low_rating,
            high_rating=high_rating,
            positive_label=positive_label,
            negative_label=negative_label,
            min_chars=min_chars,
            max_chars=max_chars,
            batch_size=batch_size,
            precision=precision,
            split_sentences=split_sentences,
        )
    except DomainError as exc:
        raise fail(exc.message) from exc
    except (EvaluationError, OSError) as exc:
        raise fail(str(exc)) from exc
    table = Table("pool", "available", "wanted", "selected")
    for pool, counts in report.pools.items():
        table.add_row(pool, f"{counts['available']:,}", f"{counts['wanted']:,}", f"{counts['selected']:,}")
    console.print(
        f"{report.corpus}: {report.documents:,} texts, {report.sentences:,} sentences; model "
        f"{report.model_id} version {report.model_version} at {report.precision}",
        soft_wrap=True,
    )
    console.print(table)
    left_out = {k: v for k, v in report.skipped.items() if v}
    if left_out:
        console.print("left out: " + ", ".join(f"{k} {v:,}" for k, v in left_out.items()), soft_wrap=True)
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}", soft_wrap=True, highlight=False)
    console.print(
        f"wrote {report.written:,} {report.mode} to {task} round {number}"
        + (f" ({report.already_present:,} already there)" if report.already_present else "")
    )


# --- import ---------------------------------------------------------------------------------


@app.command("import")
def round_import(
    task: TaskOpt,
    number: Annotated[int, typer.Option("--round", help="Round number: the task's next round, or an empty one")],
    kind: Annotated[str, typer.Option(help="labelled (examples with gold) or responses (example, worker, label)")],
    file: Annotated[
        Path | None,
        typer.Option(help="CSV, TSV, JSONL, Parquet, or a directory written by datasets' save_to_disk"),
    ] = None,
    dataset: Annotated[str | None, typer.Option(help="An uploaded dataset of the task instead of a file")] = None,
    text_column: str = "text",
    label_column: str = "label",
    label_separator: Annotated[str | None, typer.Option(help="Multi-label CSV/TSV: labels joined by this")] = None,
    id_column: Annotated[
        str | None, typer.Option(help="The example's id, exported as source_id (default: a column `id`)")
    ] = None,
    worker_column: str = "worker",
    annotator_columns: Annotated[
        str | None,
        typer.Option(help="responses, wide format: the annotators' columns, comma-separated (patterns: 'ann_*')"),
    ] = None,
    seconds_column: str | None = None,
    target_start_column: str = "target_start",
    target_end_column: str = "target_end",
    target_column: Annotated[str | None, typer.Option(help="The target's text, checked at its offsets")] = None,
    votes_column: Annotated[str | None, typer.Option(help="labelled: votes for the gold in the dataset")] = None,
    responses_column: Annotated[str | None, typer.Option(help="labelled: annotators per row in the dataset")] = None,
    split_column: Annotated[str | None, typer.Option(help="labelled: the dataset's own split")] = None,
    label_map: Annotated[
        str | None, typer.Option(help='JSON: file label -> task label(s), e.g. \'{"0": "not_irony"}\'')
    ] = None,
    source: Annotated[str | None, typer.Option(help="What the data is, for the report (e.g. a citation)")] = None,
    max_rows: int = 1_000_000,
    database_url: DatabaseOpt = None,
) -> None:
    """Import a labelled dataset or earlier crowd responses as a round, in one transaction
    (docs/round_builder.md "Imports"); the round is closed, ready for `dynaloop round build`."""
    import json

    from pydantic import ValidationError

    from rounds.models.round_imports import ImportOptions

    settings = settings_for(database_url)
    url = settings.resolved_database_url
    ensure_schema(url)
    try:
        mapping = json.loads(label_map) if label_map else {}
    except json.JSONDecodeError as exc:
        raise fail(f"--label-map is not JSON: {exc.msg}") from exc
    try:
        options = ImportOptions.model_validate(
            {
                "kind": kind,
                "label_map": mapping,
                "file": file,
                "dataset": dataset,
                "text_column": text_column,
                "label_column": label_column,
                "label_separator": label_separator,
                "id_column": id_column,
                "worker_column": worker_column,
                "annotator_columns": [c.strip() for c in annotator_columns.split(",")] if annotator_columns else None,
                "seconds_column": seconds_column,
                "target_start_column": target_start_column,
                "target_end_column": target_end_column,
                "target_column": target_column,
                "votes_column": votes_column,
                "responses_column": responses_column,
                "split_column": split_column,
                "source": source,
            }
        )
    except ValidationError as exc:
        raise fail(f"invalid import settings: {problems(exc)}") from exc
    imported = _run_import(settings, task, number, options, max_rows)
    _print_import(imported)


def _run_import(settings: Settings, task: str, number: int, options: ImportOptions, max_rows: int) -> ImportedRound:
    """Import the round in one transaction, as an operator with a shell: any path is read."""
    from rounds.models.round_imports import import_round
    from services.db.engine import session_scope
    from services.domain import tasks
    from services.errors import DomainError

    url = settings.resolved_database_url
    try:
        with session_scope(session_factory(url)) as session:
            imported = import_round(
                session,
                None,
                tasks.get_task(session, task),
                number,
                options,
                secret=settings.secret_key,
                data_dir=settings.data_dir,
                data_root=settings.data_root,
                any_path=True,  # an operator with a shell reads any path
                max_rows=max_rows,
                max_decoded_bytes=settings.max_upload_decoded_bytes,
                max_cell_chars=settings.max_upload_cell_chars,
            )
    except DomainError as exc:
        raise fail(exc.message) from exc
    return imported


def _print_import(imported: ImportedRound) -> None:
    """What the import wrote, and its notes."""
    console.print(
        f"imported {imported.examples:,} examples"
        + (f" and {imported.validations:,} responses of {imported.workers:,} workers" if imported.validations else "")
        + f" into {imported.task} round {imported.round} (closed; build it with `dynaloop round build`)",
        soft_wrap=True,
    )
    for note in imported.notes:
        console.print(f"note: {note}", soft_wrap=True, highlight=False, markup=False)


# --- train ----------------------------------------------------------------------------------


# The options of `dynaloop round train` (TrainOptions in rounds/models/usecases.py says what each does).
TrainMixOpt = Annotated[
    Path,
    typer.Option(
        help="Data mix YAML: train sources (weights, upsampling) and the dev set. Run from a shell, the "
        "command reads any file the mix names (relative paths: to the mix file); jobs started through "
        "the API read only uploaded datasets and files under DYNALOOP_DATA_ROOT"
    ),
]
BaseCheckpointOpt = Annotated[
    Path | None,
    typer.Option(help="Backbone checkpoint folder (never a dynaloop-trained model); default: packaged MiniLM"),
]
EpochsOpt = Annotated[
    int | None, typer.Option(help="Planned epochs; default: the task YAML's training.epochs (3 when it has none)")
]
LearningRateOpt = Annotated[
    float | None,
    typer.Option(help="AdamW learning rate; default: the task YAML's training.learning_rate (2e-5 when it has none)"),
]
ClassWeightsOpt = Annotated[
    str | None,
    typer.Option(help="none or balanced (from the mix's label mass); default: the task YAML's training.class_weights"),
]
AllowUnknownTokensOpt = Annotated[
    bool,
    typer.Option(
        help="Train even when more than DYNALOOP_MAX_UNKNOWN_TOKEN_SHARE of the mix's tokens are the "
        "backbone tokenizer's unknown token (e.g. MiniLM on Ge'ez script)"
    ),
]
PatienceOpt = Annotated[
    int, typer.Option(help="Early stopping: epochs without a better dev macro-F1 (0: never stop early)")
]
CheckpointEveryOpt = Annotated[str, typer.Option(help="Resumable checkpoint every N optimizer steps, or 'epoch'")]
ModelKindOpt = Annotated[
    str,
    typer.Option(
        help="encoder: fine-tune --base; linear: a class-balanced char+word n-gram TF-IDF + logistic "
        "regression (scikit-learn) that reads any script and trains in seconds on a CPU (e.g. Ge'ez script "
        "the encoder's tokenizer cannot read, or Model 0 without a GPU)"
    ),
]
CheckPrecisionOpt = Annotated[
    bool,
    typer.Option(
        help="Score the dev set at bf16 and int8 against fp32 afterwards and record it in the model directory "
        "(the model server's --precision auto uses only what it admits)"
    ),
]


@app.command("train")
def round_train(
    task: TaskOpt,
    mix: TrainMixOpt,
    out: Annotated[Path, typer.Option(help="New folder for the model directory")],
    number: Annotated[
        int | None, typer.Option("--round", help="The round this model will serve (the next round to collect)")
    ] = None,
    base: BaseCheckpointOpt = None,
    epochs: EpochsOpt = None,
    batch_size: int = 32,
    learning_rate: LearningRateOpt = None,
    max_length: int = 128,
    seed: int = 0,
    class_weights: ClassWeightsOpt = None,
    allow_unknown_tokens: AllowUnknownTokensOpt = False,
    patience: PatienceOpt = 2,
    gradient_accumulation_steps: int = 1,
    checkpoint_every: CheckpointEveryOpt = "epoch",
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its newest checkpoint")] = False,
    cpu: Annotated[bool, typer.Option(help="Train on the CPU even when a GPU is present")] = False,
    model_id: Annotated[
        str | None, typer.Option(help="Name in dynaloop_model.json; default from task and round")
    ] = None,
    tiny: Annotated[bool, typer.Option(help="Tests: a tiny random BERT as the base, not --base")] = False,
    kind: ModelKindOpt = "encoder",
    check_precision: CheckPrecisionOpt = True,
    database_url: DatabaseOpt = None,
) -> None:
    """Retrain from scratch on the mix: base checkpoint, fresh head, all rounds' data (DynaSent §5.3)."""
    from pydantic import ValidationError

    from dynaloop.commands.progress import PrintedTraining, show_training_log
    from rounds.models.datasets import DataError, DataFiles, DataMix
    from rounds.models.train import TrainingError
    from rounds.models.usecases import TrainOptions, train_and_register
    from services.errors import DomainError

    every = _checked_train_flags(class_weights, tiny, base, kind, resume, checkpoint_every)
    settings = settings_for(database_url)
    url = settings.resolved_database_url
    ensure_schema(url)
    try:
        options = TrainOptions.model_validate(
            {
                "mix": DataMix.load(mix),
                "round": number,
                "base": None if base is None else str(base),
                "epochs": epochs,
                "batch_size": batch_size,
                "learning_rate": learning_rate,
                "max_length": max_length,
                "seed": seed,
                "class_weights": class_weights,
                "allow_unknown_tokens": allow_unknown_tokens,
                "patience": patience,
                "gradient_accumulation_steps": gradient_accumulation_steps,
                "checkpoint_every": every,
                "resume": resume,
                "cpu": cpu,
                "model_id": model_id,
                "tiny": tiny,
                "kind": kind,
                "check_precision": check_precision,
            }
        )
    except ValidationError as exc:
        raise fail(f"invalid training settings: {problems(exc)}") from exc
    except DataError as exc:
        raise fail(str(exc)) from exc
    show_training_log()
    try:
        trained = train_and_register(
            session_factory(url),
            task,
            options,
            out,
            data_files=DataFiles.of(settings.data_dir, settings.data_root, any_path=True),
            listener=PrintedTraining(out),
            progress_bar=True,
        )
    except DomainError as exc:
        raise fail(exc.message) from exc
    except ValidationError as exc:
        raise fail(f"invalid training settings: {problems(exc)}") from exc
    except (DataError, TrainingError, OSError) as exc:
        raise fail(str(exc)) from exc
    _print_trained(trained)


def _checked_train_flags(
    class_weights: str | None, tiny: bool, base: Path | None, kind: str, resume: bool, checkpoint_every: str
) -> int | str:
    """Refuse flags that do not go together; ``--checkpoint-every`` as a number of steps or "epoch"."""
    if class_weights not in (None, "none", "balanced"):
        raise fail(f"--class-weights takes none or balanced, not {class_weights!r}")
    if tiny and base is not None:
        raise fail("give --base or --tiny, not both")
    if kind not in ("encoder", "linear"):
        raise fail(f"--kind takes encoder or linear, not {kind!r}")
    if kind == "linear" and (tiny or base is not None or resume):
        raise fail("--kind linear trains no backbone: leave out --base, --tiny and --resume")
    if checkpoint_every == "epoch":
        return checkpoint_every
    try:
        return int(checkpoint_every)
    except ValueError as exc:
        raise fail(f"--checkpoint-every takes a number of steps or 'epoch', not {checkpoint_every!r}") from exc


def _print_trained(trained: TrainedModel) -> None:
    """The precision check's agreement and the registered version of a training run."""
    if trained.precision_check is not None:
        check = trained.precision_check
        console.print(
            f"precision check on {check.data} ({check.texts:,} texts): "
            + "; ".join(
                f"{precision} agrees with fp32 on {100 * result.agreement:.2f}%"
                + ("" if check.admits(precision) is None else " (auto refuses it)")
                for precision, result in check.results.items()
                if precision != "fp32"
            )
            + "".join(f"; {precision} not checked: {why}" for precision, why in check.unavailable.items()),
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    if trained.model is not None:  # only the main process of `accelerate launch` registers the model
        console.print(f"registered model version {trained.model.id} ({trained.model.status})")
        if trained.same_weights_as is not None:
            console.print(
                f"registered as {trained.model.name}: the same weights as {trained.same_weights_as}, registered "
                "before (its dynaloop_model.json says so: same_weights_as)",
                soft_wrap=True,
                markup=False,
            )


# --- evaluate -------------------------------------------------------------------------------


def _round_numbers(value: str) -> list[int] | None:
    """`--rounds`: 'all' (None: every built round), 'none' ([]), or numbers such as 1,2."""
    if value.strip().lower() == "all":
        return None
    if value.strip().lower() == "none":
        return []
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError as exc:
        raise fail(f"--rounds takes 'all', 'none' or round numbers such as 1,2; not {value!r}") from exc


@app.command("evaluate")
def round_evaluate(
    task: TaskOpt,
    model: Annotated[Path, typer.Option(help="Model directory (with dynaloop_model.json)")],
    out: Annotated[Path, typer.Option(help="Folder for evaluation.md, evaluation.json, predictions.parquet and plots")],
    mix: Annotated[
        Path | None,
        typer.Option(
            help="Data mix YAML: its dev and evaluate sources are evaluated too (any file it names: the API's "
            "jobs read only uploads and files under DYNALOOP_DATA_ROOT)"
        ),
    ] = None,
    rounds: Annotated[
        str, typer.Option(help="Built rounds whose dev/test splits to evaluate: all, none, or e.g. 1,2")
    ] = "all",
    positive_label: Annotated[
        str | None,
        typer.Option(
            help="Binary tasks: the class whose F1 is reported (default: positive/sarcastic, else the second label)"
        ),
    ] = None,
    batch_size: int = 64,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, ...; default: cuda if present")] = None,
    precision: PrecisionOpt = "fp32",
    record: Annotated[bool, typer.Option(help="Store the results in the model registry (trained -> evaluated)")] = True,
    baseline: Annotated[
        bool,
        typer.Option(
            help="Also train the linear model kind on the model's training mix and report it beside the model"
        ),
    ] = True,
    database_url: DatabaseOpt = None,
) -> None:
    """Evaluate a model on every built round's dev/test split and the mix's sets (DynaSent Table 5b),
    beside a linear baseline trained on the same mix."""
    from pydantic import ValidationError

    from dynaloop.commands.progress import PrintedEvaluation
    from model_server.directory import ModelMetadataError
    from rounds.models.datasets import DataError, DataFiles, DataMix
    from rounds.models.errors import EvaluationError
    from rounds.models.train import TrainingError
    from rounds.models.usecases import EvaluateOptions, evaluate_and_record
    from services.errors import DomainError

    try:
        options = EvaluateOptions.model_validate(
            {
                "mix": DataMix.load(mix) if mix is not None else None,
                "rounds": _round_numbers(rounds),
                "positive_label": positive_label,
                "batch_size": batch_size,
                "device": device,
                "precision": precision,
                "record": record,
                "baseline": baseline,
            }
        )
    except ValidationError as exc:
        raise fail(f"invalid evaluation settings: {problems(exc)}") from exc
    except DataError as exc:
        raise fail(str(exc)) from exc
    settings = settings_for(database_url)
    url = settings.resolved_database_url
    ensure_schema(url)
    try:
        evaluated = evaluate_and_record(
            session_factory(url),
            task,
            model,
            options,
            out,
            data_files=DataFiles.of(settings.data_dir, settings.data_root, any_path=True),
            listener=PrintedEvaluation(out),
            progress_bar=True,
        )
    except DomainError as exc:
        raise fail(exc.message) from exc
    except (DataError, EvaluationError, ModelMetadataError, TrainingError) as exc:
        raise fail(str(exc)) from exc
    if evaluated.model is not None:
        console.print(f"registry: {evaluated.model.name} is {evaluated.model.status}")
