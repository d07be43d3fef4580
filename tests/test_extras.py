"""Installs per role (pyproject.toml's extras, services/extras.py): the base install has none of
the model packages, the commands and the API start without them, and an import of a missing
extra's package names the extra.

Every test here also runs in the full install: a subprocess (or ``sys.modules``) hides the extras'
packages, as a base install lacks them. ``.ci/base_install`` runs this file again in a real base
install (``.venv-base``), where nothing needs hiding.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from packaging.requirements import Requirement
from sqlalchemy import func, select

from rounds.build import report as round_report
from services.db.engine import session_scope
from services.db.models import JobStatus, ModelVersion
from services.domain.tasks import get_task
from services.extras import EXTRA_MODULES, MissingExtra, install_hint, needs_extra
from tests.built_round import BuiltRound

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
ROLE_EXTRAS = ("plots", "model-server", "training", "webapp")
#: What no base install may hold (the issue's list): each comes with an extra.
NOT_IN_BASE = {
    "torch",
    "transformers",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "captum",
    "accelerate",
    "streamlit",
    "matplotlib",
}
#: The top-level modules of every role's extra that the base install does not bring by itself:
#: hidden in the subprocesses below. crowd-kit (base) requires transformers, and httpx is a base
#: dependency; transformers is hidden all the same, so that nothing of the base imports it.
EXTRAS_ONLY = sorted(set().union(*EXTRA_MODULES.values()) - {"httpx"})


def requirement_names(requirements: list[str]) -> set[str]:
    return {Requirement(requirement).name.lower() for requirement in requirements}


def module_of(distribution: str) -> str:
    return distribution.replace("-", "_")


#: Put first on ``sys.meta_path``, it finds none of the extras' packages, as in a base install.
HIDE_EXTRAS = f"""
import sys


class BaseInstall:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {EXTRAS_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, BaseInstall())
"""


def run_without_extras(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where every extra's package is missing, as in a base install."""
    return subprocess.run(
        [sys.executable, "-c", HIDE_EXTRAS + textwrap.dedent(code), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


# --- pyproject.toml ---------------------------------------------------------------------------


def test_the_base_install_has_no_model_web_app_or_plot_package() -> None:
    base = requirement_names(PROJECT["dependencies"])
    assert not base & NOT_IN_BASE, sorted(base & NOT_IN_BASE)
    extras = PROJECT["optional-dependencies"]
    for extra in ROLE_EXTRAS:
        assert extra in extras, f"pyproject.toml has no {extra!r} extra"
    # Everything the base lacks comes with an extra of the role that needs it.
    roles = set().union(*(requirement_names(extras[extra]) for extra in ROLE_EXTRAS))
    assert roles >= NOT_IN_BASE


def test_extras_py_lists_the_modules_of_each_extra_in_pyproject() -> None:
    extras = PROJECT["optional-dependencies"]
    assert set(EXTRA_MODULES) == set(ROLE_EXTRAS)
    for extra, modules in EXTRA_MODULES.items():
        assert {module_of(name) for name in requirement_names(extras[extra])} == modules, extra


def test_all_installs_every_role_and_test_installs_all() -> None:
    extras = PROJECT["optional-dependencies"]
    (everything,) = extras["all"]
    assert Requirement(everything).name == "dynaloop"
    assert Requirement(everything).extras >= set(ROLE_EXTRAS)
    assert "vllm" not in Requirement(everything).extras  # CUDA only
    selves = [Requirement(r) for r in extras["test"] if Requirement(r).name == "dynaloop"]
    assert len(selves) == 1 and {"all", "test-base"} <= selves[0].extras
    # The base install's own test run needs no model package either.
    assert not requirement_names(extras["test-base"]) & NOT_IN_BASE


# --- a missing extra is named ---------------------------------------------------------------


def test_an_import_of_a_missing_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtra) as caught, needs_extra("training"):
        import torch  # noqa: F401
    assert caught.value.extra == "training" and caught.value.module == "torch"
    assert str(caught.value) == (
        "torch is not installed: it comes with dynaloop's 'training' extra "
        "(pip install 'dynaloop[training]', or 'dynaloop[all]' for every role)"
    )
    assert install_hint("webapp") == "pip install 'dynaloop[webapp]'"
    # A module the extra does not list keeps its own error (a typo, a broken install).
    with pytest.raises(ModuleNotFoundError) as other, needs_extra("training"):
        import dynaloop_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert not isinstance(other.value, MissingExtra)


@pytest.mark.parametrize(
    ("module", "extra", "missing"),
    [
        ("rounds.models.train", "training", "torch"),
        ("rounds.models.inference", "training", "torch"),
        ("rounds.models.init_model", "training", "torch"),
        # Its first import of the extra is rounds.models.evaluate's of rounds.models.inference.
        ("rounds.models.evaluation_report", "training", "torch"),
        ("rounds.models.harvest", "training", "pysbd"),
    ],
)
def test_modules_that_need_an_extra_name_it(module: str, extra: str, missing: str) -> None:
    result = run_without_extras(f"import {module}")
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line == (
        f"services.extras.MissingExtra: {missing} is not installed: it comes with dynaloop's {extra!r} extra "
        f"(pip install 'dynaloop[{extra}]', or 'dynaloop[all]' for every role)"
    )


@pytest.mark.parametrize(
    ("argv", "extras"),
    [
        (["model-server", "--model", "."], "'model-server' extra"),
        (["ui"], "'webapp' extra"),
        (["demo"], "(the 'training' extra)"),
        (["worker", "--queue", "gpu"], "'training' extra"),
    ],
)
def test_commands_that_need_an_extra_stop_with_its_name(argv: list[str], extras: str) -> None:
    result = run_without_extras("from dynaloop.cli import app\napp(sys.argv[1:])", *argv)
    assert result.returncode == 1, result.stderr
    assert "error: not installed here:" in result.stderr and extras in result.stderr
    assert "Install with `pip install 'dynaloop[" in result.stderr
    assert "Traceback" not in result.stderr


# --- the base install starts --------------------------------------------------------------------


def test_the_cli_the_api_and_the_round_builder_import_without_any_extra() -> None:
    """`dynaloop --help`, the API's app with every route, the job worker and the round builder's use
    cases load on the base install; none of them imports an extra's package at import time."""
    result = run_without_extras(
        """
        import json
        from typer.testing import CliRunner

        from dynaloop.api.app import create_app
        from dynaloop.cli import app
        import rounds.models.jobs, rounds.models.worker, rounds.models.usecases
        import rounds.build.usecases, rounds.build.report

        runner = CliRunner()
        outputs = {
            " ".join(argv): runner.invoke(app, argv).exit_code
            for argv in (["--help"], ["api", "--help"], ["db", "upgrade", "--help"], ["round", "build", "--help"],
                         ["worker", "--help"], ["round", "export", "--help"])
        }
        paths = sorted(create_app().openapi()["paths"])
        print(json.dumps({"exit_codes": outputs, "paths": len(paths)}))
        """
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(answer["exit_codes"].values()) == {0}, answer
    assert answer["paths"] > 50


def test_a_job_on_a_worker_without_the_training_extra_fails_naming_it(
    app: FastAPI, built: BuiltRound, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A train job on a base install fails with a message that names the extra, at the first import
    of a training package; nothing is trained or registered."""
    from rounds.models.job_runner import run_job
    from rounds.models.jobs import create_job

    # The train use case's first import of the extra (rounds/models/usecases.py): missing, as in a base
    # install (a None entry makes `import accelerate` fail with ModuleNotFoundError).
    monkeypatch.setitem(sys.modules, "accelerate", None)
    data_dir = app.state.settings.data_dir
    with session_scope(app.state.sessionmaker) as session:
        task = get_task(session, "dynasent-r2")
        job_id = create_job(session, None, task, "train", {"tiny": True}, data_dir=data_dir).id
    job = run_job(app.state.sessionmaker, job_id, data_dir=data_dir)
    with session_scope(app.state.sessionmaker) as session:
        assert session.scalar(select(func.count()).select_from(ModelVersion)) == 0
    assert job.status is JobStatus.failed
    assert job.message == (
        "this worker cannot run the job: accelerate is not installed: it comes with dynaloop's 'training' extra "
        "(pip install 'dynaloop[training]', or 'dynaloop[all]' for every role)"
    )


def test_without_the_plots_extra_the_report_says_its_figures_were_not_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(round_report, "missing_modules", lambda extra: ["matplotlib"] if extra == "plots" else [])
    monkeypatch.setattr(round_report, "render_markdown", lambda report: f"# Round {report['round']}\n")
    data: Any = object()  # never read: no figure is drawn
    written = round_report.write_report({"round": 1}, data, tmp_path)
    assert sorted(path.name for path in written) == ["report.json", "report.md"]
    markdown = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert markdown == (
        "# Round 1\n\n## Figures\n\nNot drawn: matplotlib is not installed here (the `plots` extra: "
        "`pip install 'dynaloop[plots]'`).\n"
    )
    assert not list(tmp_path.glob("*.png"))
