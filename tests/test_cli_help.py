"""The `dynaloop` command's help and the README's list of its commands (issue #28, point 6).

``--help`` is click's plain help (``rich_markup_mode=None`` in dynaloop/cli.py): at 80 columns
the rich panels cut long option names (``--max-dev-test-sh…``); the plain help never does. The
README's command list names every command the CLI has, and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from dynaloop.cli import app as cli_app

ROOT = Path(__file__).resolve().parents[1]


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the CLI that runs (not a group), with its path (``("round", "build")``)."""
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield path, command
        return
    for name, sub in subcommands.items():
        yield from commands(sub, (*path, name))


ROOT_COMMAND = typer.main.get_command(cli_app)
LEAVES = dict(commands(ROOT_COMMAND))


@pytest.mark.parametrize("path", sorted(LEAVES), ids=" ".join)
def test_help_at_80_columns_names_every_option_in_full(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli_app, [*path, "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output and "╭" not in result.output, result.output  # no rich panel, nothing cut
    words = set(re.findall(r"--[A-Za-z0-9][A-Za-z0-9-]*", result.output))
    missing = {opt for param in LEAVES[path].params for opt in param.opts if opt.startswith("--")} - words
    assert not missing, f"`dynaloop {' '.join(path)} --help` cuts or leaves out {sorted(missing)}:\n{result.output}"
    assert max(len(line) for line in result.output.splitlines()) <= 80, result.output


def readme_commands() -> set[tuple[str, ...]]:
    """The commands the README's list names: each `dynaloop ...` line of the block under "The
    `dynaloop` command", read word by word down the CLI's groups; `a|b` names both."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## The `dynaloop` command", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    named: set[tuple[str, ...]] = set()

    def expand(command: Any, path: tuple[str, ...], words: list[str]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is None or not words:
            named.add(path)  # a group listed without a subcommand stays a group: not in LEAVES
            return
        for name in words[0].split("|"):
            if name in subcommands:
                expand(subcommands[name], (*path, name), words[1:])
            else:
                named.add((*path, name))  # not a command of the CLI

    for line in block.splitlines():
        if line.startswith("dynaloop "):
            expand(ROOT_COMMAND, (), line.split()[1:])
    return named


def test_the_readme_lists_every_command_and_no_other() -> None:
    listed = readme_commands()
    missing = sorted(" ".join(path) for path in set(LEAVES) - listed)
    unknown = sorted(" ".join(path) for path in listed - set(LEAVES))
    assert not missing, f"README.md's command list lacks: {missing}"
    assert not unknown, f"README.md's command list names what the CLI does not have: {unknown}"
