"""The dependency direction between the top-level packages (docs/design.md "Dependency direction").

Two checks:

* import-linter's contracts in ``pyproject.toml`` (``[tool.importlinter]``), one test per contract, so a
  failure names the broken rule and import-linter's report shows the chain of imports that breaks it;
* plain AST scans for the two rules the deployment relies on, with the file and line of each offending
  import: the model server is deployed alone (it may import only ``model_server.directory``, the format of the
  directories it loads), and the front end reaches the project only over HTTP.

import-linter comes with the ``test`` extra; without it its tests are skipped, except under CI
(``CI=true``), where they fail.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# The project's importable top-level packages: the installed ones plus the tests and benchmarks.
INSTALLED_PACKAGES = sorted(name.rstrip("*") for name in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
PROJECT_PACKAGES = frozenset([*INSTALLED_PACKAGES, "tests", "bench"])
CONTRACTS = PYPROJECT["tool"]["importlinter"]["contracts"]


@dataclass(frozen=True)
class ProjectImport:
    """One import of another top-level package of the project, where it is written."""

    path: Path
    line: int
    module: str

    @property
    def package(self) -> str:
        return self.module.split(".")[0]

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.module}"


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Absolute imports of a module, at any depth (inside functions too), and
    ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.

    Relative imports are left out: they cannot leave their own top-level package.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
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


def project_imports(root: Path, package: str, project: frozenset[str] = PROJECT_PACKAGES) -> list[ProjectImport]:
    """Every import in ``root/package`` of another top-level package in ``project``."""
    imports = []
    for path in sorted((root / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, module in _imported_modules(tree):
            top = module.split(".")[0]
            if top in project and top != package:
                imports.append(ProjectImport(path.relative_to(root), line, module))
    return imports


def test_model_server_imports_nothing_of_the_project_outside_itself() -> None:
    offending = project_imports(ROOT, "model_server")
    assert not offending, (
        "model_server runs as its own process and is deployed without the rest of dynaloop: of the project it "
        "may import only itself (its directory format is model_server.directory). Move what it needs into "
        "model_server. Offending imports:\n  " + "\n  ".join(map(str, offending))
    )


def test_the_directory_format_imports_nothing_of_the_rest_of_the_model_server() -> None:
    """The trainer and the round builder import ``model_server.directory`` alone: it must not pull in the
    server (its routes, backends, torch)."""
    offending = [
        found
        for found in project_imports(ROOT, "model_server/directory", frozenset([*PROJECT_PACKAGES, "model_server"]))
        if not found.module.startswith("model_server.directory")
    ]
    assert not offending, "model_server.directory imports:\n  " + "\n  ".join(map(str, offending))


def test_the_contracts_name_every_module_of_the_model_server_but_its_directory_format() -> None:
    """The contracts that let the rest import ``model_server.directory`` list the server's other modules
    one by one; a new module of the server must be added there, or the rest could import it."""
    modules = sorted(
        f"model_server.{path.stem if path.is_file() else path.name}"
        for path in (ROOT / "model_server").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    )
    server_parts = {name for name in modules if name != "model_server.directory"}
    for contract_id in ("servers-by-http", "model-directory"):
        (contract,) = [contract for contract in CONTRACTS if contract["id"] == contract_id]
        listed = {name for name in contract["forbidden_modules"] if name.startswith("model_server.")}
        assert listed == server_parts, f"{contract_id}: list exactly {sorted(server_parts)} in pyproject.toml"


def test_frontend_imports_nothing_of_the_project() -> None:
    offending = project_imports(ROOT, "frontend")
    assert not offending, (
        "frontend talks to the API over HTTP only (frontend/client.py) and is deployed without the rest of "
        "dynaloop: it may import nothing of the project. Offending imports:\n  " + "\n  ".join(map(str, offending))
    )


def test_the_scan_finds_every_kind_of_project_import(tmp_path: Path) -> None:
    package = tmp_path / "model_server"
    package.mkdir()
    (package / "__init__.py").write_text("from . import app\nfrom .app import serve\n", encoding="utf-8")
    (package / "app.py").write_text(
        "import json\n"
        "import frontend.client\n"
        "from services.settings import Settings\n"
        "import importlib\n"
        "def serve():\n"
        "    import dynaloop.api.app\n"
        "    return importlib.import_module('rounds.build.pipeline')\n",
        encoding="utf-8",
    )

    found = [str(item) for item in project_imports(tmp_path, "model_server")]

    assert found == [
        "model_server/app.py:2 imports frontend.client",
        "model_server/app.py:3 imports services.settings",
        "model_server/app.py:6 imports dynaloop.api.app",
        "model_server/app.py:7 imports rounds.build.pipeline",
    ]


def _require_import_linter() -> None:
    try:
        import importlinter  # noqa: F401
    except ImportError:
        reason = "import-linter is not installed (pip install -e '.[test]')"
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)


def _lint_imports(root: Path, *contract_ids: str) -> subprocess.CompletedProcess[str]:
    """Run import-linter in its own process (it configures logging and sys.path) from ``root``."""
    script = (
        "import sys\nfrom importlinter.cli import lint_imports\n"
        f"sys.exit(lint_imports(no_cache=True, no_logo=True, limit_to_contracts={contract_ids!r}))\n"
    )
    # The packages under ``root`` must win over any installed copy of the project.
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("contract", CONTRACTS, ids=[contract["id"] for contract in CONTRACTS])
def test_import_contract_holds(contract: dict[str, object]) -> None:
    _require_import_linter()

    result = _lint_imports(ROOT, str(contract["id"]))

    assert result.returncode == 0, (
        f"the import contract {contract['name']!r} (pyproject.toml, [tool.importlinter]) is broken:\n"
        f"{result.stdout}{result.stderr}"
    )


def test_a_broken_contract_fails(tmp_path: Path) -> None:
    """The contracts test really fails: a copy of the project where the model-directory format imports the
    API."""
    _require_import_linter()
    for package in INSTALLED_PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    directory_module = tmp_path / "model_server" / "directory" / "__init__.py"
    directory_module.write_text(
        directory_module.read_text(encoding="utf-8") + "\nimport dynaloop.api.app\n", encoding="utf-8"
    )

    result = _lint_imports(tmp_path, "model-directory", "layers")

    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "model_server.directory imports nothing of the project (not even the rest of the model server) BROKEN"
        in result.stdout
    )
    assert "model_server.directory -> dynaloop.api.app" in result.stdout


# Circles of imports between the modules of one package (issue #30, "A real import circle"): none.
CIRCLE_PACKAGES = ["dynaloop", "services", "rounds", "model_server", "frontend"]


def import_circles(package: str) -> list[list[str]]:
    """The circles of imports between the modules of ``package``: each a group of modules that
    import one another, directly or not. Every import counts, inside functions and under
    ``TYPE_CHECKING`` too (grimp, import-linter's graph, finds them all); a package's
    ``__init__`` importing its modules does not (that is re-export, not a module's own need)."""
    import grimp

    graph = grimp.build_graph(package, cache_dir=None)
    for module in [m for m in graph.modules if graph.find_children(m)]:
        for imported in graph.find_modules_directly_imported_by(module):
            graph.remove_import(importer=module, imported=imported)
    circles: list[list[str]] = []
    seen: set[str] = set()
    for module in sorted(graph.modules):
        if module in seen:
            continue
        circle = graph.find_upstream_modules(module) & graph.find_downstream_modules(module)
        if circle:
            circles.append(sorted(circle | {module}))
            seen |= circle | {module}
    return circles


@pytest.mark.parametrize("package", CIRCLE_PACKAGES)
def test_no_circle_of_imports_between_the_modules_of_a_package(package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _require_import_linter()
    monkeypatch.syspath_prepend(str(ROOT))  # this checkout's packages, not an installed copy

    circles = import_circles(package)

    assert not circles, f"{package} has circles of imports: " + "; ".join(" <-> ".join(c) for c in circles)


def test_a_circle_hidden_in_a_function_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An import inside a function, or under TYPE_CHECKING, still closes a circle; an
    ``__init__`` that re-exports its modules does not."""
    _require_import_linter()
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("from circled import first, second, third\n", encoding="utf-8")
    (package / "first.py").write_text("from circled import second\n", encoding="utf-8")
    (package / "second.py").write_text("def late():\n    from circled import first\n", encoding="utf-8")
    (package / "third.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import circled.first\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    assert import_circles("circled") == [["circled.first", "circled.second"]]


# No function of the product code runs over a hundred lines (issue "no function in product code over 100
# lines"): counted from its ``def`` line to its last line, decorators left out. Tests, benchmarks and
# migrations are not product code.
LONGEST_FUNCTION = 100
PRODUCT_CODE = ["dynaloop", "services", "rounds", "model_server", "frontend", "docker"]


@dataclass(frozen=True)
class LongFunction:
    """A function over ``LONGEST_FUNCTION`` lines, where it is written."""

    path: Path
    line: int
    name: str
    lines: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} ({self.lines} lines)"


def long_functions(root: Path, folders: list[str] = PRODUCT_CODE, limit: int = LONGEST_FUNCTION) -> list[LongFunction]:
    """Every function (methods and nested functions too) in ``root/folder/**.py`` longer than ``limit`` lines."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > limit:
                        found.append(LongFunction(path.relative_to(root), node.lineno, node.name, lines))
    return found


def test_no_function_of_the_product_code_is_over_a_hundred_lines() -> None:
    offending = long_functions(ROOT)
    assert not offending, (
        f"functions over {LONGEST_FUNCTION} lines (from the def line to the last, decorators left out); cut "
        "them at their natural seams, one named step per phase:\n  " + "\n  ".join(map(str, offending))
    )


def test_the_length_scan_counts_from_the_def_line_and_finds_nested_functions(tmp_path: Path) -> None:
    """Decorators do not count; methods and nested functions are scanned too."""
    package = tmp_path / "services"
    package.mkdir()
    (package / "steps.py").write_text(
        "import functools\n"
        "@functools.cache\n"  # 2
        "@functools.wraps(print)\n"
        "def decorated():\n"  # 4: four lines from here, six with its decorators
        "    a = 1\n"
        "    b = 2\n"
        "    return a + b\n"
        "class Steps:\n"
        "    def method(self):\n"  # 9: five lines
        "        def inner():\n"  # 10: two lines
        "            return 1\n"
        "        a = inner()\n"
        "        return a\n",
        encoding="utf-8",
    )

    found = [str(item) for item in long_functions(tmp_path, ["services"], limit=4)]

    assert found == ["services/steps.py:9 method (5 lines)"]
