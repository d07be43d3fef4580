"""The front end talks to the API over HTTP only (docs/frontend.md): no module under frontend/
imports another package of the project, so the app can run on a machine without the backend.
It describes the API's answers in its own client module (frontend/client.py) instead."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRONTEND = ROOT / "frontend"
# The project's packages as the brief of issue #11 names them; the test also finds any other.
KNOWN_PACKAGES = {
    "api",
    "services",
    "round_builder",
    "modelling",
    "model_server",
    "model_directory",
    "dynaloop",
    "migrations",
}


def project_packages() -> set[str]:
    """Every top-level package of the project: those pyproject.toml ships and every folder of
    the checkout with an ``__init__.py`` (tests included), except ``frontend`` itself."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = {pattern.rstrip("*").rstrip(".") for pattern in patterns}
    folders = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    return (shipped | folders) - {"frontend"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, and of ``importlib.import_module`` /
    ``__import__`` calls with a literal name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if name in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value))
    return found


def test_the_project_packages_are_found() -> None:
    assert project_packages() >= KNOWN_PACKAGES


def test_frontend_imports_nothing_of_the_project_outside_frontend() -> None:
    packages = project_packages()
    files = sorted(FRONTEND.rglob("*.py"))
    assert len(files) > 5, files
    offending = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in files
        for line, module in imported_modules(path)
        if module.split(".")[0] in packages
    ]
    assert not offending, "frontend/ must reach the backend over HTTP only:\n" + "\n".join(offending)


def test_the_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, services.taskdef\nfrom api import schemas\nfrom . import render\n"
        "def f():\n    from modelling.jobs import run_job\n"
        "importlib.import_module('round_builder')\n__import__('dynaloop.cli')\n",
        encoding="utf-8",
    )
    modules = sorted(module for _, module in imported_modules(sample))
    assert modules == ["api", "dynaloop.cli", "modelling.jobs", "os", "round_builder", "services.taskdef"]
