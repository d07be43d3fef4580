"""What `dynaloop round train` and `dynaloop round evaluate` print while their use cases run
(:class:`modelling.usecases.TrainingListener`, :class:`~modelling.usecases.EvaluationListener`).
Imported by those commands only, so the other commands start without the model libraries."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from dynaloop.commands.common import console, err
from modelling.usecases import EvaluationListener, TrainingListener

if TYPE_CHECKING:
    from modelling.datasets import LabelledSet
    from modelling.evaluate import Evaluation
    from modelling.train import TrainResult


def show_training_log() -> None:
    """Per-epoch lines of `modelling.train` on stderr when nothing else shows INFO logs."""
    train_logger = logging.getLogger("modelling.train")
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
            collapsed = [label for label, f1 in per_class.items() if f1 == 0]
            console.print(
                "dev F1 per class (best epoch): " + ", ".join(f"{label} {f1:.4f}" for label, f1 in per_class.items()),
                soft_wrap=True,
                highlight=False,
                markup=False,
            )
            if collapsed:
                err.print(
                    f"warning: dev F1 is 0 for {', '.join(collapsed)}: the model never gets "
                    f"{'this class' if len(collapsed) == 1 else 'these classes'} right (try --class-weights balanced)",
                    soft_wrap=True,
                    highlight=False,
                    markup=False,
                )
        if result.unknown_token_warning:
            err.print(f"warning: {result.unknown_token_warning}", soft_wrap=True, highlight=False, markup=False)


class PrintedEvaluation(EvaluationListener):
    def __init__(self, out: Path) -> None:
        self.out = out

    def skipped(self, name: str) -> None:
        err.print(f"[yellow]skipped {name}: it has no labelled examples[/yellow]")

    def written(self, evaluation: Evaluation, files: Sequence[Path]) -> None:
        table = Table(title=f"{evaluation.model_id}: F1 (%)")
        table.add_column("set", no_wrap=True)
        for column in ["n", *evaluation.labels, "macro-F1", "human F1", "solved"]:
            table.add_column(column, justify="right")
        for metrics in evaluation.sets:
            table.add_row(
                metrics.name,
                str(metrics.rows),
                *[f"{100 * metrics.f1[label]:.1f}" for label in evaluation.labels],
                f"{100 * metrics.macro_f1:.1f}",
                "–" if metrics.human_f1 is None else f"{100 * metrics.human_f1:.1f}",
                "–" if metrics.solved is None else ("yes" if metrics.solved else "no"),
            )
        console.print(table)
        for warning in evaluation.warnings:
            err.print(f"warning: {warning}", soft_wrap=True, highlight=False, markup=False)
        console.print(f"wrote {len(files)} files to {self.out}", soft_wrap=True)
