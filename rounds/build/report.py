"""The round report for people: Markdown from the report dict (the stored JSON of
:class:`rounds.build.report_schema.RoundReport`, ``RoundReport.to_dict()``), the report files
(report.json, report.md) and PNG plots from the build's plot data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.extras import install_hint, missing_modules

# ---------------------------------------------------------------------------- rendering


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


def _label_cell(label: Any, names: Mapping[str, str]) -> Any:
    """A label for people: its display name with the label itself, e.g. ``No sentiment (`neutral`)``."""
    shown = names.get(str(label))
    if shown is None or shown == label:
        return label
    cell = shown.replace("|", "\\|")  # a display name is researcher text: keep the table's columns
    return f"{cell} (`{label}`)"


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as markdown, for people."""
    out: list[str] = [f"# Round {report['round']} of {report['task']}", ""]
    names: Mapping[str, str] = report.get("label_names") or {}
    out.append(
        f"Built {report.get('built_at', '')} with seed {report.get('seed')}; family "
        f"`{report.get('family')}`. Plots, where written, are next to this file."
    )
    out += _counts_markdown(report, names)
    out += _duplicates_markdown(report.get("duplicates"))
    splits = report.get("splits", {})
    if splits:
        out += ["", *splits_markdown(splits)]
    if report.get("multi_label"):
        out += _multilabel_markdown(report["multi_label"])
    selection = report.get("responses")
    if selection:
        out += ["", "## Responses used", "", selection["statement"]]
    agreement_counts = report.get("agreement_counts")
    if agreement_counts:
        out += ["", *agreement_counts_markdown(agreement_counts)]
    out += _agreement_markdown(report.get("agreement", {}))
    model_based = report.get("model_based")
    if model_based:
        out += ["", *model_based_markdown(model_based, names)]
    out += _human_f1_markdown(report.get("human_f1", {}), names)
    out += _fooling_markdown(report.get("fooling", {}))
    out += _conditions_markdown(report.get("conditions", {}))
    out += _workers_markdown(report.get("workers", {}))
    extra = report.get("intended_vs_perceived")
    if extra:
        out += ["", *intended_vs_perceived_markdown(extra)]
    out += _datasheet_markdown(report.get("datasheet", {}))
    return "\n".join(out).rstrip() + "\n"


def _counts_markdown(report: Mapping[str, Any], names: Mapping[str, str]) -> list[str]:
    """The counts per label and split (DynaSent Table 4/7 layout), then what was excluded."""
    counts = report.get("counts", {})
    if not counts:
        return []
    out = ["", "## Counts (DynaSent Table 4/7 layout)", ""]
    rows = [
        [_label_cell(name, names), *(row.get(column) for column in ("dist_train", "train", "dev", "test"))]
        for name, row in counts["rows"].items()
    ]
    total = counts.get("total", {})
    # Multi-label rows are per label: an example counts once for each of its gold labels, so
    # the last row (examples, each once) is not the sum of the rows above it.
    multi = report.get("family") == "multi_label"
    rows.append(
        [
            "**examples** (each once)" if multi else "**total**",
            *(total.get(column) for column in ("dist_train", "train", "dev", "test")),
        ]
    )
    train = "Train (per gold label)" if multi else "Majority train"
    out.append(_table(["label", "Dist train", train, "Dev", "Test"], rows))
    if multi:
        out += [
            "",
            "Each label's row counts the examples whose gold holds the label, so an example with two "
            "gold labels is in two rows; the last row counts examples, each once.",
        ]
    if all(row.get("dist_train") is None for row in [*counts["rows"].values(), total]):
        out += ["", "Dist train: none (no train example has responses, so none has a distributional label)."]
    if counts.get("excluded"):
        out += ["", "Excluded: " + ", ".join(f"{k} {v:,}" for k, v in counts["excluded"].items()) + "."]
    return out


def _duplicates_markdown(duplicates: Mapping[str, Any] | None) -> list[str]:
    if not duplicates:
        return []
    return [
        "",
        f"Duplicates merged: {duplicates['merged']:,} (repeats of a kept text); "
        f"texts with conflicting gold: {duplicates['conflicting_gold_texts']:,} "
        f"({duplicates['conflicting_gold_examples']:,} examples, all excluded); "
        f"in an earlier round of the task: {duplicates['in_an_earlier_round']:,}. "
        f"Rule: {duplicates['rule']}.",
    ]


def _agreement_markdown(agreement: Mapping[str, Any]) -> list[str]:
    if not agreement:
        return []
    out = ["", "## Agreement", ""]
    if agreement.get("n_raters"):
        out += [_agreement_examples(agreement), ""]
    measures = [[k, v] for k, v in agreement.items() if not isinstance(v, dict) and k not in _AGREEMENT_EXAMPLES]
    out.append(_table(["measure", "value"], measures))
    for name, values in agreement.items():
        if isinstance(values, dict):
            out += ["", f"{name}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in values.items())]
    return out


def _human_f1_markdown(human: Mapping[str, Any], names: Mapping[str, str]) -> list[str]:
    if not human:
        return []
    out = ["", "## Human performance estimate (DynaSent §3.5, Table 6/9 layout)", ""]
    for split_name, table in human.items():
        rows = [
            [_label_cell(label, names), v.get("precision"), v.get("recall"), v.get("f1")] for label, v in table.items()
        ]
        out += [f"### {split_name}", "", _table(["label", "precision", "recall", "F1"], rows), ""]
    return out


def _fooling_markdown(fooling: Mapping[str, Any]) -> list[str]:
    if fooling and fooling.get("examples_with_model_prediction") == 0:
        return [
            "",
            "## Fooling the model",
            "",
            f"No model in the loop: none of the {fooling.get('examples', 0):,} examples was checked against a "
            "model (none has a model prediction), so nothing was fooled and no fooling rate is measured.",
        ]
    if fooling:
        return ["", "## Fooling the model", "", _table(["", "value"], list(fooling.items()))]
    return []


def _conditions_markdown(conditions: Mapping[str, Any]) -> list[str]:
    if not conditions:
        return []
    written = set(conditions) & {"prompt", "no_prompt"}
    heading = "Prompt vs no-prompt (DynaSent Fig. 2)" if written else "Texts (imported: no writing condition)"
    keys = sorted({k for c in conditions.values() for k in c})
    return [
        "",
        f"## {heading}",
        "",
        _table(["", *conditions], [[k, *(c.get(k) for c in conditions.values())] for k in keys]),
    ]


def _workers_markdown(workers: Mapping[str, Any]) -> list[str]:
    if not workers:
        return []
    out = [
        "",
        "## Workers",
        "",
        _table(["", "value"], [[k, v] for k, v in workers.items() if not isinstance(v, list | dict)]),
    ]
    gold_rows = workers.get("gold_accuracy")
    if gold_rows:
        out += [
            "",
            "### Gold accuracy beside agreement with the majority",
            "",
            _table(
                ["validator", "labels", "agreement with the majority", "control answers", "gold accuracy"],
                [
                    [r["validator"], r["labels"], r["agreement_rate"], r["control_answers"], r["gold_accuracy"]]
                    for r in gold_rows
                ],
            ),
        ]
    return out


def _datasheet_markdown(datasheet: Mapping[str, Any]) -> list[str]:
    if not datasheet:
        return []
    out = ["", "## Datasheet", ""]
    for key, value in datasheet.items():
        shown = json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value
        out.append(f"- **{key.replace('_', ' ')}**: {shown}")
    return out


def _multilabel_markdown(section: Mapping[str, Any]) -> list[str]:
    """The multi-label section: gold rule, re-annotation, per-label counts, agreement, human
    and model F1 on dev and test (no chance-level claim: multi-label splits make none)."""
    out = ["", "## Multi-label round (per-label gold, EthioEmo §3.3)", "", f"Gold rule: {section['gold_rule']}."]
    if section.get("exclusive_labels"):
        out.append(f"Exclusive labels (never gold or predicted with others): {', '.join(section['exclusive_labels'])}.")
    re = section.get("reannotation", {})
    out += ["", "Re-annotation: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in re.items()) + "."]
    counts = section.get("label_counts", {})
    out += [
        "",
        "### Examples per label and split",
        "",
        _table(["label", "train", "dev", "test"], [[k, v["train"], v["dev"], v["test"]] for k, v in counts.items()]),
    ]
    agreement = section.get("agreement", {})
    if agreement.get("per_label"):
        out += [
            "",
            f"### Agreement per label (the responses gold was decided on, {agreement.get('n_raters')} responses "
            f"each, {agreement.get('n_examples')} examples)",
            "",
            _table(
                ["label", "prevalence", "Fleiss kappa", "Randolph kappa", "Krippendorff alpha"],
                [
                    [k, v["prevalence"], v["fleiss"], v["randolph"], v["alpha"]]
                    for k, v in agreement["per_label"].items()
                ],
            ),
            "",
            f"Mean pairwise Jaccard of label sets: {_fmt(agreement.get('mean_jaccard'))}.",
        ]
        if agreement.get("examples_left_out"):
            out += ["", _agreement_examples(agreement)]
    human = section.get("human_f1", {})
    model = section.get("model", {})
    if human or model:
        out += ["", "### Human estimate and model on dev and test", ""]
        rows = []
        for split in ("dev", "test"):
            h, m = human.get(split, {}), model.get(split, {})
            rows.append([split, h.get("micro_f1"), h.get("macro_f1"), m.get("micro_f1"), m.get("macro_f1"), m.get("n")])
        out.append(
            _table(["split", "human micro-F1", "human macro-F1", "model micro-F1", "model macro-F1", "model n"], rows)
        )
        for split, h in human.items():
            if h.get("per_label"):
                out += [
                    "",
                    f"Human F1 per label on {split}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in h["per_label"].items()),
                ]
    out += [f"\nNote: {note}" for note in section.get("notes", [])]
    return out


_AGREEMENT_EXAMPLES = ("n_raters", "n_examples", "examples_left_out")


def _agreement_examples(agreement: Mapping[str, Any]) -> str:
    """Which examples every agreement figure reads, and which it leaves out."""
    k, left_out = agreement.get("n_raters"), agreement.get("examples_left_out") or 0
    line = f"Every agreement figure reads the same {agreement.get('n_examples')} examples, {k} responses each"
    if left_out:
        line += f"; {left_out} example(s) with another number of responses are left out (the figures need {k} each)"
    return line + "."


def model_based_markdown(section: Mapping[str, Any], names: Mapping[str, str] | None = None) -> list[str]:
    """The model-based labels beside gold: overall and per label."""
    method = {"dawid_skene": "Dawid-Skene", "mace": "MACE"}.get(section.get("method", ""), section.get("method"))
    out = [
        f"## Model-based labels ({method}) beside gold",
        "",
        f"{section['examples']} examples have a model-based label; of the {section['with_gold']} that also have "
        f"gold, {section['same_as_gold']} have the same label (agreement {_fmt(section.get('agreement'))}); "
        f"{section['without_gold']} have a model-based label but no gold.",
    ]
    per_label = section.get("per_label", {})
    if per_label:
        out += [
            "",
            _table(
                ["label", "gold", "model-based", "both", "agreement", "Cohen kappa"],
                [
                    [_label_cell(k, names or {}), v["gold"], v["model_based"], v["both"], v["agreement"], v["kappa"]]
                    for k, v in per_label.items()
                ],
            ),
        ]
    return out


def splits_heading(splits: Mapping[str, Any]) -> str:
    """The dev/test section's heading: what the build is, by its own numbers."""
    policy = splits.get("policy", {}).get("name")
    named = f"{policy} policy" if policy else "policy not recorded"
    if splits.get("model_predictions") == 0:
        return f"Dev and test: {named} — no model in the loop (no example has a model prediction)"
    if splits.get("chance") and splits.get("at_chance"):
        return f"Dev and test: model at chance ({named})"
    if splits.get("chance"):
        return f"Dev and test: {named} — chance constraint asked for, but the model is not at chance"
    return f"Dev and test: {named} — model not held at chance"


def equal_cells(splits: Mapping[str, Any]) -> bool:
    """Whether every (gold, predicted) cell holds ``cell_count`` examples in dev and in test."""
    cells = splits.get("cells", [])
    return (
        bool(splits.get("chance"))
        and bool(cells)
        and all(c.get("dev") == splits.get("cell_count") and c.get("test") == splits.get("cell_count") for c in cells)
    )


def splits_markdown(splits: Mapping[str, Any]) -> list[str]:
    """The dev/test section: heading, the policy's settings and the measured facts."""
    out = [f"## {splits_heading(splits)}", ""]
    policy = splits.get("policy", {})
    if policy:
        settings = ", ".join(
            f"{k.replace('_', ' ')} {str(v).lower() if isinstance(v, bool) or v is None else v}"
            for k, v in policy.items()
            if k != "name"
        )
        out += [f"Policy: **{policy.get('name')}** ({settings}).", ""]
    out.append(
        _table(
            ["split", "examples", "model macro-F1", "model accuracy"],
            [
                [name, s.get("examples"), s.get("model_macro_f1"), s.get("model_accuracy")]
                for name, s in splits.get("assessment", {}).items()
            ],
        )
    )
    if equal_cells(splits):
        out += [
            "",
            f"{splits['cell_count']} examples per (gold, predicted) cell in each of dev and test "
            f"(upper bound {splits.get('cell_bound')}).",
        ]
    cells = splits.get("cells", [])
    if cells:
        single = "predicted" in cells[0]
        header = ["gold ↓", "predicted →", "dev", "test"] if single else ["gold class", "dev", "test"]
        rows = [
            [c["gold"], c["predicted"], c["dev"], c["test"]] if single else [c["gold"], c["dev"], c["test"]]
            for c in cells
        ]
        out += [
            "",
            "Examples per " + ("(gold, predicted) cell:" if single else "gold class:"),
            "",
            _table(header, rows),
        ]
    independence = splits.get("independence", {})
    if independence:
        out += ["", "Independence of the model's prediction and gold (a small p: they are not independent):", ""]
        rows = [
            [name, t.get("test"), t.get("n"), t.get("statistic"), t.get("p_value"), t.get("note") or ""]
            for name, t in independence.items()
        ]
        out.append(_table(["split", "test", "n", "statistic", "p", "note"], rows))
    balance = splits.get("balance", {})
    if balance.get("classes"):
        share = balance.get("max_dev_test_share")
        out += [
            "",
            "Class balance: "
            + (
                f"dev+test take at most {share:g} of each class's eligible examples."
                if share is not None
                else "no class-balance guard in this policy."
            ),
            "",
            _table(
                ["class", "eligible", "train (all of the class)", "dev", "test"],
                [
                    [k, v.get("eligible"), v.get("train_all"), v.get("dev"), v.get("test")]
                    for k, v in balance["classes"].items()
                ],
            ),
        ]
    notes = splits.get("notes", [])
    if notes:
        out += ["", *(f"- note: {note}" for note in notes)]
    return out


def agreement_counts_markdown(counts: Mapping[str, Any]) -> list[str]:
    out = ["## Agreement on gold (votes for the gold label out of the responses)", ""]
    rows = [[k, v] for k, v in counts.get("at_least", {}).items()]
    rows += [[k, v] for k, v in counts.get("by_votes", {}).items()]
    rows += [["no gold label", counts.get("no_gold")]]
    out.append(_table(["examples with", "count"], rows))
    other = counts.get("examples_with_other_response_counts")
    if other:
        out += ["", f"{other} examples had a number of responses other than {counts.get('responses')}."]
    return out


def intended_vs_perceived_markdown(extra: Mapping[str, Any]) -> list[str]:
    """iSarcasm Table 5 with its axes named: intended labels down, perceived labels across."""
    confusion = extra.get("confusion", {})
    perceived = list(confusion)
    intended = list(dict.fromkeys(k for column in confusion.values() for k in column))
    out = ["## Intended vs perceived (iSarcasm)", ""]
    if perceived:
        rows = [[label, *(confusion[p].get(label, 0) for p in perceived)] for label in intended]
        out += [_table(["intended ↓ / perceived →", *perceived], rows), ""]
    out.append(
        _table(
            ["", "value"],
            [[k, extra.get(k)] for k in ("precision", "recall", "f1", "n_examples", "n_without_perceived")],
        )
    )
    return out


#: What report.md says in place of the figures where the `plots` extra (matplotlib) is not installed.
PLOTS_NOT_DRAWN = (
    f"\n## Figures\n\nNot drawn: matplotlib is not installed here (the `plots` extra: `{install_hint('plots')}`).\n"
)


def write_plots(data: PlotData, out_dir: Path) -> list[Path]:
    """PNG plots people would rather look at than read; returns the files written.

    Needs the `plots` extra (matplotlib); :func:`write_report` checks for it first."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

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


def report_json(report: Mapping[str, Any]) -> str:
    """report.json's text: the report dict (``RoundReport.to_dict()``) as indented JSON."""
    return json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n"


def write_report(report: Mapping[str, Any], data: PlotData | None, out_dir: Path) -> list[Path]:
    """report.json, report.md and the plots into ``out_dir``; without the `plots` extra, report.md
    says the figures were not drawn."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(report_json(report), encoding="utf-8")
    draw = data is not None and not missing_modules("plots")
    markdown = render_markdown(report)
    if data is not None and not draw:
        markdown += PLOTS_NOT_DRAWN
    (out_dir / "report.md").write_text(markdown, encoding="utf-8")
    written = [out_dir / "report.json", out_dir / "report.md"]
    if data is not None and draw:
        written += write_plots(data, out_dir)
    return written
