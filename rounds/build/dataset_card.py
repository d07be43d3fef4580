"""A Hugging Face dataset card (``README.md`` with its YAML metadata header) for a round's export,
written beside the exported files by `dynaloop round export` and served by
``GET /api/v1/tasks/{task}/rounds/{n}/dataset/card`` (docs/round_builder.md, "Export").

The header names the licence, language, task category, one ``configs`` entry whose
``data_files`` list the exported split files, and ``dataset_info`` with the declared features
(:func:`rounds.build.export.schema_for`) and each split's row count and file size, so
``datasets.load_dataset(FOLDER)`` loads the folder with the declared types, one schema for every
split, and checks each split's rows. JSON has no type for a null or an empty list, so
``load_dataset("json", data_files=...)`` without features infers each column from the first
rows it reads; the card's loading code passes the declared features instead. The body restates
the build's datasheet field by field, as the build's report holds it, and adds only counts read
from the build itself: the card makes no claim of its own about the data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import yaml
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from rounds.build import export
from services.db.models import BuiltExample, Round, RoundBuild
from services.domain.tasks import definition_of
from services.taskdef import TaskDefinition

CARD_NAME = "README.md"

#: Split names on the Hub: ``dev`` is ``validation`` there; ``all`` is a reserved name in
#: ``datasets`` (every split together) and so is never a configured split, nor is a split of no
#: rows (``datasets`` cannot load one).
HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test", "excluded": "excluded"}

# Licence identifiers the Hub's metadata accepts, for the licences tasks write in prose.
_HUB_LICENCES = {
    "apache-2.0",
    "cc-by-2.0",
    "cc-by-3.0",
    "cc-by-4.0",
    "cc-by-nc-2.0",
    "cc-by-nc-3.0",
    "cc-by-nc-4.0",
    "cc-by-nc-nd-3.0",
    "cc-by-nc-nd-4.0",
    "cc-by-nc-sa-3.0",
    "cc-by-nc-sa-4.0",
    "cc-by-nd-4.0",
    "cc-by-sa-3.0",
    "cc-by-sa-4.0",
    "cc0-1.0",
    "mit",
    "odc-by",
    "odbl",
    "pddl",
}

_DTYPES = {
    pa.int32(): "int32",
    pa.int64(): "int64",
    pa.float64(): "float64",
    pa.string(): "string",
    pa.bool_(): "bool",
}


def feature_yaml(data_type: pa.DataType) -> dict[str, Any]:
    """One column's feature in the card's ``dataset_info`` notation.

    ``datasets`` has this conversion (``Features._to_yaml_list``), but it is a test dependency
    only, not one of the service's; tests/test_export_datasets.py checks that this gives exactly
    what ``datasets`` gives for every export schema."""
    if pa.types.is_struct(data_type):
        return {"struct": _fields_yaml(data_type)}
    if pa.types.is_list(data_type):
        inner = feature_yaml(data_type.value_type)
        return {"list": inner.get("dtype", inner.get("struct", inner))}
    if data_type in _DTYPES:
        return {"dtype": _DTYPES[data_type]}
    raise TypeError(f"no dataset card feature for arrow type {data_type}")


def _fields_yaml(fields: Any) -> list[dict[str, Any]]:
    return [{"name": field.name, **feature_yaml(field.type)} for field in fields]


def hub_licence(licence: str | None) -> dict[str, str]:
    """The card's ``license`` (and ``license_name`` when the Hub has no identifier for it)."""
    if not licence:
        return {"license": "unknown"}
    identifier = "-".join(licence.lower().split())
    if identifier == "cc0":
        identifier = "cc0-1.0"
    if identifier in _HUB_LICENCES:
        return {"license": identifier}
    return {"license": "other", "license_name": licence}


def size_category(examples: int) -> str:
    """The Hub's ``size_categories`` value for a number of examples."""
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if examples < bound:
            return name
    return "1M<n<10M" if examples < 10_000_000 else "n>10M"


def split_counts(session: Session, build_id: int) -> dict[str, int]:
    """Examples per split of a build, as stored."""
    rows = session.execute(
        select(BuiltExample.split, func.count()).where(BuiltExample.build_id == build_id).group_by(BuiltExample.split)
    ).all()
    return {str(split): int(count) for split, count in rows}


def file_name(task_name: str, number: int, split: str, file_format: str) -> str:
    """An exported split's file name (the same from the CLI and the API)."""
    return f"{task_name}-r{number}-{split}.{file_format}"


def _labels_for_people(definition: TaskDefinition) -> str:
    """The task's labels as the data has them, each with the name annotators saw when it differs,
    e.g. ```neutral` (shown as "No sentiment")``."""
    shown = []
    for label in definition.labels:
        name = definition.label_name(label)
        shown.append(f"`{label}`" + (f" (shown as {json.dumps(name, ensure_ascii=False)})" if name != label else ""))
    return ", ".join(shown)


def render(
    definition: TaskDefinition,
    round_number: int,
    build_id: int,
    report: Mapping[str, Any],
    counts: Mapping[str, int],
    file_format: str,
    splits: Sequence[str],
    sizes: Mapping[str, int],
) -> str:
    """The card's text for the files of ``splits`` in ``file_format``, whose sizes in bytes are
    ``sizes`` (``datasets`` reads a split's entry only with its ``num_bytes``)."""
    schema = export.schema_for(definition)
    rows = {split: sum(counts.values()) if split == "all" else counts.get(split, 0) for split in splits}
    # ``datasets`` refuses a configured split without rows, and ``all`` is no split name there.
    configured = [split for split in splits if split in HUB_SPLITS and rows[split] > 0]
    files = {split: file_name(definition.name, round_number, split, file_format) for split in splits}
    header = _yaml_header(definition, schema, file_format, rows, configured, files, counts, sizes)
    lines = [
        "---",
        yaml.safe_dump(header, sort_keys=False, allow_unicode=True, width=1000).rstrip("\n"),
        "---",
        "",
        f"# {definition.title}: round {round_number}",
        "",
        f"Exported by dynaloop from build {build_id} of round {round_number} of task `{definition.name}` "
        f"(family `{definition.family.value}`, labels {_labels_for_people(definition)}).",
        "",
        *_files_section(splits, configured, files, rows),
        "",
        *_loading_section(file_format, splits, configured, files),
    ]
    if file_format == "csv":
        lines += ["", _csv_note(schema)]
    lines += ["", *_columns_section(schema)]
    lines += _datasheet_section(report.get("datasheet") or {})
    return "\n".join(lines).rstrip() + "\n"


def _yaml_header(
    definition: TaskDefinition,
    schema: pa.Schema,
    file_format: str,
    rows: Mapping[str, int],
    configured: Sequence[str],
    files: Mapping[str, str],
    counts: Mapping[str, int],
    sizes: Mapping[str, int],
) -> dict[str, Any]:
    """The Hub's YAML header: licence, language, task, size, the configs' files and the features."""
    return {
        **hub_licence(definition.licence),
        "language": [definition.language.split("-")[0].lower()],
        "task_categories": ["text-classification"],
        "task_ids": ["multi-label-classification" if definition.is_multi_label else "multi-class-classification"],
        "size_categories": [size_category(sum(rows[split] for split in configured))],
        "pretty_name": definition.title,
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": HUB_SPLITS[split], "path": files[split]} for split in configured],
            }
        ],
        "dataset_info": {
            "features": _fields_yaml(schema if file_format != "csv" else export.csv_schema(schema)),
            "splits": [
                {"name": HUB_SPLITS[split], "num_bytes": sizes[split], "num_examples": counts.get(split, 0)}
                for split in configured
            ],
        },
    }


def _files_section(
    splits: Sequence[str], configured: Sequence[str], files: Mapping[str, str], rows: Mapping[str, int]
) -> list[str]:
    """Each split's file and examples, and why a file is not in the configs."""
    lines = [
        "## Files",
        "",
        "| split | file | examples |",
        "|---|---|---|",
        *(f"| {HUB_SPLITS.get(split, split)} | `{files[split]}` | {rows[split]} |" for split in splits),
    ]
    if len(configured) < len(splits):
        lines += [
            "",
            "Not in the configs above: "
            + "; ".join(
                f"`{files[split]}` ("
                + (
                    "every split together: `all` is a split name `datasets` reserves"
                    if split == "all"
                    else "no rows: `datasets` cannot load an empty split"
                )
                + ")"
                for split in splits
                if split not in configured
            )
            + ".",
        ]
    return lines


def _loading_section(
    file_format: str, splits: Sequence[str], configured: Sequence[str], files: Mapping[str, str]
) -> list[str]:
    """How to load the folder, or the files by name with the declared features."""
    loader = {"parquet": "parquet", "jsonl": "json", "csv": "csv"}[file_format]
    # The splits the configs name, or (none to name) the first file as it is.
    data_files = (
        "{" + ", ".join(f'"{HUB_SPLITS[split]}": "{files[split]}"' for split in configured) + "}"
        if configured
        else f'"{files[splits[0]]}"'
    )
    return [
        "## Loading",
        "",
        "```python",
        "from datasets import load_dataset, load_dataset_builder",
        "",
        "rounds = load_dataset(FOLDER)  # the folder of this card: its configs and features",
        "# the files by name, with the features declared above (one schema for every split)",
        "features = load_dataset_builder(FOLDER).info.features",
        f"rounds = load_dataset({loader!r}, data_files={data_files}, features=features)",
        "```",
        "",
        "`num_bytes` above is the size of each split's file. Without `features=`, `datasets` infers each "
        "column's type from the first rows it reads"
        + (
            ", and a JSON null or empty list has no type: a column empty there (`flags` in `train`, `gold_label` "
            "in `excluded`) would not match another split's."
            if file_format == "jsonl"
            else "."
        ),
    ]


def _csv_note(schema: pa.Schema) -> str:
    """Which CSV columns hold JSON text, and how to read them."""
    return (
        "In the CSV files the columns "
        + ", ".join(f"`{f.name}`" for f in schema if export.json_in_csv(f))
        + " (lists, structs, and numbers or booleans that may be null) hold the JSON text of their value, "
        "and an empty cell is null; `json.loads` such a cell to get the value the Parquet and JSONL files hold. "
        "Load the folder, or pass the features above as `features=`: without them pandas guesses each "
        "column's type."
    )


def _columns_section(schema: pa.Schema) -> list[str]:
    return [
        "## Columns",
        "",
        "| column | type |",
        "|---|---|",
        *(f"| `{field.name}` | `{field.type}` |" for field in schema),
        "",
        "`distributional_label` has one share per label; `responses` lists every counted validation with a "
        "pseudonymous worker id; `extras` (when the task has writer fields) holds the writer's fields.",
    ]


def _datasheet_section(datasheet: Mapping[str, Any]) -> list[str]:
    """The build report's datasheet, as it states it."""
    if not datasheet:
        return []
    lines = ["", "## Datasheet", "", "As the build's report states it:", ""]
    for key, value in datasheet.items():
        shown = json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value
        lines.append(f"- **{key.replace('_', ' ')}**: {shown}")
    return lines


def card_for_build(
    session: Session,
    build: RoundBuild,
    file_format: str,
    splits: Sequence[str],
    sizes: Mapping[str, int],
    *,
    counts: Mapping[str, int] | None = None,
) -> str:
    """The card of ``build``'s export in ``file_format`` for ``splits``, whose files have
    ``sizes`` bytes (:func:`export_sizes` when they were not written); ``counts``: the build's
    examples per split when the caller has read them (:func:`split_counts`)."""
    round_ = session.get(Round, build.round_id)
    assert round_ is not None  # a build's round is never deleted while it has builds
    return render(
        definition_of(round_.task),
        round_.number,
        build.id,
        build.report or {},
        split_counts(session, build.id) if counts is None else counts,
        file_format,
        splits,
        sizes,
    )


def export_sizes(
    factory: sessionmaker[Session], build_id: int, file_format: str, splits: Sequence[str], secret: str
) -> dict[str, int]:
    """The size in bytes of each split's file, counted by encoding it (streamed, as a download
    is) without keeping it: what `dynaloop round export` would write."""
    return {
        split: sum(len(part) for part in export.stream(factory, build_id, split, file_format, secret))
        for split in splits
    }
