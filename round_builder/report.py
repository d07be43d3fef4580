"""The round report: markdown and JSON from the build's report dict, PNG plots from its data.

Layouts follow DynaSent: Table 4/7 (counts per split and label), Table 6/9 (human F1),
Fig. 2a-c (edit distance, length, vocabulary: prompt vs no-prompt), Fig. 6 (per-worker
agreement). The datasheet section collects what a dataset user needs (Gebru et al., 2021).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402


@dataclass
class PlotData:
    """Raw values behind the plots (the report dict keeps only their summaries)."""

    edit_distance: Mapping[str, Sequence[float]] = field(default_factory=dict)  # condition -> values
    length_words: Mapping[str, Sequence[int]] = field(default_factory=dict)
    vocabulary_growth: Mapping[str, Sequence[tuple[int, int]]] = field(default_factory=dict)  # (tokens, types)
    worker_agreement: Sequence[float] = ()
    confusion: Mapping[str, Any] = field(default_factory=dict)  # {"labels": [...], "matrix": [[...]]}


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as markdown, for people."""
    out: list[str] = [f"# Round {report['round']} of {report['task']}", ""]
    out.append(f"Built {report.get('built_at', '')} with seed {report.get('seed')}; family "
               f"`{report.get('family')}`. Plots, where written, are next to this file.")
    counts = report.get("counts", {})
    if counts:
        out += ["", "## Counts (DynaSent Table 4/7 layout)", ""]
        rows = [[name, *(row.get(column) for column in ("dist_train", "train", "dev", "test"))]
                for name, row in counts["rows"].items()]
        total = counts.get("total", {})
        rows.append(["**total**", *(total.get(column) for column in ("dist_train", "train", "dev", "test"))])
        out.append(_table(["label", "Dist train", "Majority train", "Dev", "Test"], rows))
        if counts.get("excluded"):
            out += ["", "Excluded: " + ", ".join(f"{k} {v:,}" for k, v in counts["excluded"].items()) + "."]
    splits = report.get("splits", {})
    if splits:
        out += ["", "## Model at chance on dev and test", ""]
        out.append(_table(["split", "examples", "model macro-F1", "model accuracy"], [
            [name, s.get("examples"), s.get("model_macro_f1"), s.get("model_accuracy")]
            for name, s in splits.get("assessment", {}).items()]))
        if splits.get("cell_count") is not None:
            out += ["", f"{splits['cell_count']} examples per (gold, predicted) cell in each of dev and test "
                    f"(upper bound {splits.get('cell_bound')})."]
    agreement = report.get("agreement", {})
    if agreement:
        out += ["", "## Agreement", ""]
        out.append(_table(["measure", "value"], [[k, v] for k, v in agreement.items() if not isinstance(v, dict)]))
        for name, values in agreement.items():
            if isinstance(values, dict):
                out += ["", f"{name}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in values.items())]
    human = report.get("human_f1", {})
    if human:
        out += ["", "## Human performance estimate (DynaSent §3.5, Table 6/9 layout)", ""]
        for split_name, table in human.items():
            rows = [[label, v.get("precision"), v.get("recall"), v.get("f1")] for label, v in table.items()]
            out += [f"### {split_name}", "", _table(["label", "precision", "recall", "F1"], rows), ""]
    fooling = report.get("fooling", {})
    if fooling:
        out += ["", "## Fooling the model", "", _table(["", "value"], list(fooling.items()))]
    conditions = report.get("conditions", {})
    if conditions:
        out += ["", "## Prompt vs no-prompt (DynaSent Fig. 2)", ""]
        keys = sorted({k for c in conditions.values() for k in c})
        out.append(_table(["", *conditions], [[k, *(c.get(k) for c in conditions.values())] for k in keys]))
    workers = report.get("workers", {})
    if workers:
        out += ["", "## Workers", "", _table(["", "value"], [[k, v] for k, v in workers.items()
                                                              if not isinstance(v, list | dict)])]
    extra = report.get("intended_vs_perceived")
    if extra:
        out += ["", "## Intended vs perceived (iSarcasm)", "", "```json", json.dumps(extra, indent=2), "```"]
    datasheet = report.get("datasheet", {})
    if datasheet:
        out += ["", "## Datasheet", ""]
        out += [f"- **{key.replace('_', ' ')}**: {json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value}"
                for key, value in datasheet.items()]
    return "\n".join(out).rstrip() + "\n"


def write_plots(data: PlotData, out_dir: Path) -> list[Path]:
    """PNG plots people would rather look at than read; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    if any(len(v) for v in data.edit_distance.values()):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for condition, values in data.edit_distance.items():
            if len(values):
                ax.hist(values, bins=20, range=(0, 1), alpha=0.6, label=f"{condition} (n={len(values)})")
        ax.set_xlabel("normalised edit distance to the prompt")
        ax.set_ylabel("examples")
        ax.set_title("Edit distance (DynaSent Fig. 2a)")
        ax.legend()
        save(fig, "edit_distance.png")
    if any(len(v) for v in data.length_words.values()):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        top = max((max(v) for v in data.length_words.values() if len(v)), default=1)
        for condition, values in data.length_words.items():
            if len(values):
                ax.hist(values, bins=min(30, top), range=(0, top), alpha=0.6, label=f"{condition} (n={len(values)})")
        ax.set_xlabel("length in words")
        ax.set_ylabel("examples")
        ax.set_title("Length (DynaSent Fig. 2b)")
        ax.legend()
        save(fig, "length.png")
    if any(len(v) for v in data.vocabulary_growth.values()):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for condition, points in data.vocabulary_growth.items():
            if len(points):
                tokens, types = zip(*points, strict=True)
                ax.plot(tokens, types, label=condition)
        ax.set_xlabel("tokens")
        ax.set_ylabel("distinct words")
        ax.set_title("Vocabulary (DynaSent Fig. 2c)")
        ax.legend()
        save(fig, "vocabulary.png")
    if len(data.worker_agreement):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.hist(list(data.worker_agreement), bins=20, range=(0, 1))
        ax.set_xlabel("rate of agreement with the majority")
        ax.set_ylabel("validators")
        ax.set_title("Per-worker agreement (DynaSent Fig. 6)")
        save(fig, "worker_agreement.png")
    if data.confusion.get("matrix"):
        labels = data.confusion["labels"]
        matrix = data.confusion["matrix"]
        fig, ax = plt.subplots(figsize=(4.5, 4))
        ax.imshow(matrix, cmap="Blues")
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
        ax.set_yticks(range(len(data.confusion.get("rows", labels))), data.confusion.get("rows", labels))
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                ax.text(j, i, str(value), ha="center", va="center")
        ax.set_xlabel("model prediction")
        ax.set_ylabel("majority label")
        ax.set_title("Model vs majority")
        save(fig, "model_vs_majority.png")
    return written


def write_report(report: Mapping[str, Any], data: PlotData | None, out_dir: Path) -> list[Path]:
    """report.json, report.md and the plots into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n",
                                         encoding="utf-8")
    (out_dir / "report.md").write_text(render_markdown(report), encoding="utf-8")
    written = [out_dir / "report.json", out_dir / "report.md"]
    if data is not None:
        written += write_plots(data, out_dir)
    return written
