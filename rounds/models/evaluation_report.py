"""The evaluation's files: evaluation.md (the DynaSent Table 5b layout, per variety, the
cross-variety matrix), evaluation.json, predictions.parquet (per example) and PNG plots
(confusion matrices, BESSTIE Fig. 5)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from sklearn.metrics import ConfusionMatrixDisplay

from rounds.models.evaluate import CrossVarietyMatrix, Evaluation
from rounds.models.metrics import SetMetrics
from services.extras import needs_extra

with needs_extra("training"):
    from matplotlib.figure import Figure


def plot_confusion(metrics: SetMetrics, path: Path | str) -> Path:
    """A PNG of the set's confusion matrix (gold rows, predicted columns); for multi-label sets
    one 2x2 matrix per label."""
    path = Path(path)
    if metrics.multi_label:
        n = len(metrics.labels)
        figure = Figure(figsize=(2.4 * n, 2.8), layout="constrained")
        axes = figure.subplots(1, n, squeeze=False)[0]
        for ax, label, matrix in zip(axes, metrics.labels, metrics.confusion, strict=True):
            ConfusionMatrixDisplay(np.array(matrix), display_labels=["no", "yes"]).plot(
                ax=ax, colorbar=False, cmap="Blues", values_format="d"
            )
            ax.set_title(label)
    else:
        size = max(4.0, 0.9 * len(metrics.labels) + 2.5)
        figure = Figure(figsize=(size + 1, size), layout="constrained")
        ax = figure.subplots()
        ConfusionMatrixDisplay(np.array(metrics.confusion), display_labels=metrics.labels).plot(
            ax=ax, cmap="Blues", values_format="d", xticks_rotation=30
        )
        ax.set_xlabel("predicted")
        ax.set_ylabel("gold")
    figure.suptitle(f"{metrics.name}: macro-F1 {metrics.macro_f1:.3f} (n = {metrics.rows})")
    figure.savefig(path, dpi=100)
    return path


def plot_cross_variety(matrix: CrossVarietyMatrix, path: Path | str, *, title: str = "Cross-variety macro-F1") -> Path:
    """A heatmap PNG of the matrix, each cell annotated with its macro-F1 (BESSTIE Fig. 5)."""
    path = Path(path)
    rows, columns = matrix.macro_f1.shape
    figure = Figure(figsize=(1.3 * columns + 2.5, 1.0 * rows + 1.8), layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(matrix.macro_f1, cmap="Blues", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(columns), labels=matrix.test_varieties)
    ax.set_yticks(range(rows), labels=matrix.train_varieties)
    ax.set_xlabel("tested on")
    ax.set_ylabel("trained on")
    for r in range(rows):
        for c in range(columns):
            value = matrix.macro_f1[r, c]
            ax.text(
                c,
                r,
                "–" if math.isnan(value) else f"{value:.2f}",
                ha="center",
                va="center",
                color="white" if value > 0.6 else "black",
            )
    figure.colorbar(image, ax=ax, label="macro-F1")
    ax.set_title(title)
    figure.savefig(path, dpi=100)
    return path


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "set"


def _percent(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(" --- " for _ in header) + "|",
        *["| " + " | ".join(row) + " |" for row in rows],
    ]


def precision_summary(precision: dict[str, Any]) -> str:
    """``fp32``, or for auto the precision of each batch size (``auto: 1→int8, 64→bf16``)."""
    used = precision.get("by_batch_size") or {}
    if precision.get("mode") == "auto" and used:
        return "auto: " + ", ".join(f"{size}→{chosen}" for size, chosen in used.items())
    return str(precision.get("mode"))


def baseline_verdict(evaluation: Evaluation) -> str | None:
    """One plain sentence on the sets where the model does not beat the linear baseline; None
    without a baseline."""
    if evaluation.baseline is None:
        return None
    behind = evaluation.behind_baseline()
    if not behind:
        return "The model beats the linear baseline on every set."
    where = "; ".join(f"{name} ({_percent(model)} vs {_percent(other)})" for name, model, other in behind)
    every = " every set" if len(behind) == len(evaluation.sets) else ""
    return (
        f"The model does not beat the linear baseline on{every} {len(behind)} of {len(evaluation.sets)} set(s), "
        f"macro-F1 model vs baseline: {where}. A class-balanced n-gram model does as well or better there; "
        "serve it (`dynaloop round train --kind linear`) or improve the model before promoting it."
    )


def baseline_markdown(evaluation: Evaluation) -> list[str]:
    """The baseline's section of evaluation.md: what it is, what it was trained on, its F1 per
    class beside the model's, and the verdict (or why there is no baseline)."""
    baseline = evaluation.baseline
    if baseline is None:
        note = evaluation.baseline_note or "not computed"
        return ["## Baseline", "", f"No linear baseline: {note}.", ""]
    labels = evaluation.labels
    rows = []
    for m in evaluation.sets:
        b = baseline.evaluation[m.name]
        rows.append([m.name, "model", *[_percent(m.f1[label]) for label in labels], _percent(m.macro_f1)])
        rows.append([m.name, "baseline", *[_percent(b.f1[label]) for label in labels], _percent(b.macro_f1)])
    verdict = baseline_verdict(evaluation) or ""
    return [
        "## Baseline: class-balanced character and word n-gram linear model",
        "",
        f"**{verdict}**" if evaluation.behind_baseline() else verdict,
        "",
        "TF-IDF over character (2-5) and word (1-2) n-grams under a class-balanced logistic regression "
        f"(the linear model kind, docs/training.md), trained on {baseline.trained_on}: "
        f"{sum(int(entry.get('rows', 0)) for entry in baseline.train_sets):,} rows; its model directory is "
        f"`{baseline.model_dir}`.",
        "",
        *_markdown_table(["Set", "", *labels, "Macro-F1"], rows),
        "",
    ]


def evaluation_markdown(evaluation: Evaluation, cross_variety: CrossVarietyMatrix | None = None) -> str:
    """evaluation.md: the Table 5b-style table (F1 in percent, one decimal, as in the paper),
    the per-variety breakdown and, when given, the cross-variety matrix."""
    labels = evaluation.labels
    origin = [f"model directory `{evaluation.model_dir}`"] if evaluation.model_dir else []
    origin += [f"version {evaluation.model_version}"] if evaluation.model_version else []
    origin += [f"precision {precision_summary(evaluation.precision)}"] if evaluation.precision else []
    about = ", ".join([*origin, f"evaluated {evaluation.evaluated_at}"])
    lines = [
        f"# Evaluation of {evaluation.model_id or evaluation.model_dir or 'a model'}",
        "",
        f"{about[0].upper()}{about[1:]}. F1 scores in percent.",
        "",
    ]
    for warning in evaluation.warnings:
        lines += [f"**Warning:** {warning}", ""]
    if evaluation.multi_label:
        lines += [
            f"Multi-label: a label is predicted when its probability is at least {evaluation.threshold}. "
            "Jaccard: the mean over examples of |gold ∩ predicted| / |gold ∪ predicted| (1 when both are empty).",
            "",
        ]
    if evaluation.positive_label:
        lines += [f"Positive class: `{evaluation.positive_label}`.", ""]
    baseline = evaluation.baseline
    header = ["Set", "n", *labels, "Macro-F1"]
    if evaluation.multi_label:
        header += ["Micro-F1", "Jaccard"]
    if evaluation.positive_label:
        header.append(f"F1 {evaluation.positive_label}")
    if baseline is not None:
        header += ["Baseline macro-F1", "Beats baseline"]
    header += ["Human F1", "Solved"]
    rows = []
    for m in evaluation.sets:
        row = [m.name, str(m.rows), *[_percent(m.f1[label]) for label in labels], _percent(m.macro_f1)]
        if evaluation.multi_label:
            row += [_percent(m.micro_f1), _percent(m.jaccard)]
        if evaluation.positive_label:
            row.append(_percent(m.positive_f1))
        if baseline is not None:
            other = baseline.evaluation[m.name].macro_f1
            row += [_percent(other), "yes" if m.macro_f1 > other else "**no**"]
        row += [_percent(m.human_f1), "–" if m.solved is None else ("yes" if m.solved else "no")]
        rows.append(row)
    lines += ["## F1 per set (DynaSent Table 5b)", "", *_markdown_table(header, rows), ""]
    lines += ["Solved: the model's macro-F1 reaches the round's human F1 estimate (DynaSent §3.5).", ""]
    lines += baseline_markdown(evaluation)

    # The paper's own orientation: classes as rows, sets as columns.
    paper_rows = [[label, *[_percent(m.f1[label]) for m in evaluation.sets]] for label in labels]
    paper_rows.append(["Macro avg", *[_percent(m.macro_f1) for m in evaluation.sets]])
    lines += [
        "### As laid out in the paper",
        "",
        *_markdown_table(["", *[m.name for m in evaluation.sets]], paper_rows),
        "",
    ]

    variety_rows = [
        [m.name, variety, str(part.rows), *[_percent(part.f1[label]) for label in labels], _percent(part.macro_f1)]
        for m in evaluation.sets
        for variety, part in m.by_variety.items()
    ]
    if variety_rows:
        lines += [
            "## Per variety",
            "",
            *_markdown_table(["Set", "Variety", "n", *labels, "Macro-F1"], variety_rows),
            "",
        ]
    if cross_variety is not None:
        matrix_rows = [
            [train, *[_percent(v) for v in cross_variety.macro_f1[r]]]
            for r, train in enumerate(cross_variety.train_varieties)
        ]
        lines += [
            "## Cross-variety macro-F1 (BESSTIE Fig. 5)",
            "",
            "Rows: the variety a model was trained on; columns: the variety it is tested on.",
            "",
            *_markdown_table(["trained on \\ tested on", *cross_variety.test_varieties], matrix_rows),
            "",
            "![cross-variety](cross-variety.png)",
            "",
        ]
    return "\n".join(lines)


#: Per-example predictions, beside evaluation.json (rounds.models.evaluate.prediction_schema).
PREDICTIONS = "predictions.parquet"


def write_evaluation(
    evaluation: Evaluation, out_dir: Path | str, *, cross_variety: CrossVarietyMatrix | None = None
) -> list[Path]:
    """Write evaluation.md, evaluation.json, predictions.parquet (one row per example of every
    set), one confusion-matrix PNG per set and, when given, cross-variety.png into ``out_dir``;
    returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    images: dict[str, str] = {}
    for metrics in evaluation.sets:
        stem = f"confusion-{_slug(metrics.name)}"
        name, copy = f"{stem}.png", 2
        while name in images.values():
            name, copy = f"{stem}-{copy}.png", copy + 1
        images[metrics.name] = name
        written.append(plot_confusion(metrics, out_dir / name))
    if cross_variety is not None:
        written.append(plot_cross_variety(cross_variety, out_dir / "cross-variety.png"))
    markdown = evaluation_markdown(evaluation, cross_variety)
    markdown += (
        "\n## Confusion matrices\n\n" + "\n".join(f"![{name}]({image})" for name, image in images.items()) + "\n"
    )
    (out_dir / "evaluation.md").write_text(markdown, encoding="utf-8")
    data = {**evaluation.to_dict(), "confusion_images": images}
    if evaluation.evaluated_sets:
        pq.write_table(evaluation.predictions(), out_dir / PREDICTIONS, compression="zstd")
        data["predictions_file"] = PREDICTIONS
        written.append(out_dir / PREDICTIONS)
    if cross_variety is not None:
        data["cross_variety"] = cross_variety.to_dict()
    (out_dir / "evaluation.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return [out_dir / "evaluation.md", out_dir / "evaluation.json", *written]
