"""What `dynaloop round train` and `dynaloop round evaluate` print while their use cases run
(:class:`rounds.models.usecases.TrainingListener`, :class:`~rounds.models.usecases.EvaluationListener`).
Imported by those commands only, so the other commands start without the model libraries."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from dynaloop.commands.common import console, err
from rounds.models.usecases import EvaluationListener, TrainingListener

if TYPE_CHECKING:
    from rounds.models.datasets import LabelledSet
    from rounds.models.evaluate import Evaluation
    from rounds.models.train import TrainResult


def show_training_log() -> None:
    """Per-epoch lines of `rounds.models.train` on stderr when nothing else shows INFO logs."""
    train_logger = logging.getLogger("rounds.models.train")
    if not logging.getLogger().handlers and not train_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        train_logger.addHandler(handler)
        train_logger.setLevel(logging.INFO)


class PrintedTraining(TrainingListener):
    def __init__(self, out: Path) -> None:
        self.out = out

    def data_loaded(self, train_sets: Sequence[LabelledSet], dev: LabelledSet | None) -> None:
        if os.environ.get("RANK", "0") != "0":  # once under `accelerate launch` / torchrun
            return
        for labelled in train_sets:
            console.print(
                f"train: {labelled.name} — {len(labelled):,} rows, weight {labelled.weight}, ×{labelled.upsample}",
                soft_wrap=True,
            )
        if dev is not None:
            console.print(f"dev: {dev.name} — {len(dev):,} rows", soft_wrap=True)

    def trained(self, result: TrainResult) -> None:
        best = result.best_dev_macro_f1
        console.print(
            f"trained {result.metadata.model_id} version {result.metadata.version}: {result.epochs_run} "
            f"epoch(s), best epoch {result.best_epoch}"
            + ("" if best is None else f", dev macro-F1 {best:.4f}")
            + f", {result.examples_per_second:.1f} examples/s; wrote {self.out}",
            soft_wrap=True,
        )
        per_class = result.best_dev_f1_per_class
        if per_class:
            console.print(
                "dev F1 per class (best epoch): " + ", ".join(f"{label} {f1:.4f}" for label, f1 in per_class.items()),
                soft_wrap=True,
                highlight=False,
                markup=False,
            )
        if result.low_f1_warning:
            err.print(f"warning: {result.low_f1_warning}", soft_wrap=True, highlight=False, markup=False)
        if result.unknown_token_warning:
            err.print(f"warning: {result.unknown_token_warning}", soft_wrap=True, highlight=False, markup=False)


class PrintedEvaluation(EvaluationListener):
    def __init__(self, out: Path) -> None:
        self.out = out

    def skipped(self, name: str) -> None:
        err.print(f"[yellow]skipped {name}: it has no labelled examples[/yellow]")

    def training_baseline(self, trained_on: str) -> None:
        console.print(f"training the linear baseline on {trained_on}", soft_wrap=True, highlight=False, markup=False)

    def written(self, evaluation: Evaluation, files: Sequence[Path]) -> None:
        from rounds.models.evaluation_report import baseline_verdict

        table = evaluation_table(evaluation)
        needed = Measurement.get(console, console.options.update(width=10_000), table).maximum
        # Rich squeezes a table into the console's width (80 columns when it cannot tell) and
        # cuts set names, labels and numbers to "…"; a table wider than that is printed in full
        # by a console as wide as the table, on the same output, and the terminal wraps it.
        wide = (
            console
            if needed <= console.width
            else Console(
                file=console.file,
                width=needed,
                force_terminal=console.is_terminal,
                no_color=console.no_color,
            )
        )
        wide.print(table)
        for warning in evaluation.warnings:
            err.print(f"warning: {warning}", soft_wrap=True, highlight=False, markup=False)
        verdict = baseline_verdict(evaluation)
        if verdict is None:
            console.print(f"no linear baseline: {evaluation.baseline_note}", soft_wrap=True, markup=False)
        elif evaluation.behind_baseline():
            err.print(f"warning: {verdict}", soft_wrap=True, highlight=False, markup=False)
        else:
            console.print(verdict, soft_wrap=True, markup=False)
        console.print(f"wrote {len(files)} files to {self.out}", soft_wrap=True)


def evaluation_table(evaluation: Evaluation) -> Table:
    """The evaluation as evaluation.md's first table: F1 per class in percent, macro-F1, micro-F1
    and Jaccard (multi-label) or the positive class's F1 (binary), the human estimate, solved."""
    columns = ["n", *evaluation.labels, "macro-F1"]
    if evaluation.multi_label:
        columns += ["micro-F1", "Jaccard"]
    if evaluation.positive_label:
        columns.append(f"F1 {evaluation.positive_label}")
    if evaluation.baseline is not None:
        columns.append("baseline macro-F1")
    columns += ["human F1", "solved"]
    table = Table(title=f"{evaluation.model_id}: F1 (%)")
    table.add_column("set", no_wrap=True)
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    for metrics in evaluation.sets:
        extra = []
        if evaluation.multi_label:
            extra += [_percent(metrics.micro_f1), _percent(metrics.jaccard)]
        if evaluation.positive_label:
            extra.append(_percent(metrics.positive_f1))
        if evaluation.baseline is not None:
            extra.append(_percent(evaluation.baseline.evaluation[metrics.name].macro_f1))
        table.add_row(
            metrics.name,
            str(metrics.rows),
            *[_percent(metrics.f1[label]) for label in evaluation.labels],
            _percent(metrics.macro_f1),
            *extra,
            _percent(metrics.human_f1),
            "–" if metrics.solved is None else ("yes" if metrics.solved else "no"),
        )
    return table


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"
