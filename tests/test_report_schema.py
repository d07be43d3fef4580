"""The round report has one schema (rounds/build/report_schema.py): the pydantic models the round
builder fills are the API's response models and what the report files are written from, and a
report stored by an older build (without the fields added since) still loads and is served as
it was stored. report.json's byte-for-byte round trip is checked where a build writes it
(tests/test_round_build.py::test_cli_build_writes_report_and_plots_and_exports)."""

from __future__ import annotations

import ast
import copy
import inspect
import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlalchemy import select

from dynaloop.api.schemas import builds as api_builds
from rounds.build import report_schema
from rounds.build.report import report_json
from rounds.build.report_schema import ReportAgreement, RoundReport
from services.db.models import RoundBuild
from tests.built_round import BuiltRound

ROOT = Path(__file__).resolve().parents[1]


def _report_models() -> dict[str, type[BaseModel]]:
    return {
        name: value
        for name, value in vars(report_schema).items()
        if inspect.isclass(value) and issubclass(value, BaseModel) and value.__module__ == report_schema.__name__
    }


def test_the_api_answers_with_the_builders_report_model() -> None:
    assert api_builds.BuildPublic.model_fields["report"].annotation is RoundReport
    assert issubclass(api_builds.RoundReportPublic, RoundReport)
    assert list(api_builds.RoundReportPublic.model_fields) == ["build_id", *RoundReport.model_fields]
    # The API module defines no second copy of any section of the report.
    defined_there = {
        name
        for name, value in vars(api_builds).items()
        if inspect.isclass(value) and value.__module__ == api_builds.__name__
    }
    assert not defined_there & set(_report_models()), "a report model is defined twice"


def test_the_schema_is_a_leaf_of_the_round_builder() -> None:
    """It imports the standard library, pydantic and the build settings' leaf module only (and
    nothing of dynaloop), so every step of the builder and the API can import it."""
    tree = ast.parse((ROOT / "rounds" / "build" / "report_schema.py").read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0] if isinstance(node, ast.Import) else (node.module or "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= {"__future__", "typing", "pydantic", "rounds.build.build_settings"}, imported


def test_an_empty_section_dumps_empty_and_set_fields_dump_in_order() -> None:
    assert ReportAgreement().to_dict() == {}
    agreement = ReportAgreement(fleiss_kappa_test=0.5, n_raters=3, fleiss_kappa=None)
    assert list(agreement.to_dict()) == ["fleiss_kappa", "n_raters", "fleiss_kappa_test"]


def _as_an_older_build_stored_it(report: dict[str, Any]) -> dict[str, Any]:
    """A report without the fields that builds of earlier versions did not write."""
    old = copy.deepcopy(report)
    for key in ("responses", "duplicates", "model_based", "agreement_counts", "label_names"):
        old.pop(key, None)
    for key in ("policy", "cells", "independence", "balance", "model_predictions"):
        old["splits"].pop(key, None)
    for key in ("n_raters", "n_examples", "examples_left_out"):
        old["agreement"].pop(key, None)
        old["datasheet"]["agreement"].pop(key, None)
    old["fooling"].pop("examples_with_model_prediction", None)
    for key in ("build_policy", "agreement_counts", "responses_used"):
        old["datasheet"].pop(key, None)
    return old


def test_a_report_stored_by_an_older_build_loads_and_is_served_as_stored(built: BuiltRound, client: TestClient) -> None:
    build_id = built["build"]["build_id"]
    session_maker = client.app.state.sessionmaker
    with session_maker() as session:
        build = session.scalars(select(RoundBuild).where(RoundBuild.id == build_id)).one()
        stored = build.report
        # The builder's model holds what it stored: read back, it dumps the same JSON text.
        assert report_json(RoundReport.model_validate(stored).to_dict()) == report_json(stored)
        old = _as_an_older_build_stored_it(stored)
        assert old != stored
        loaded = RoundReport.model_validate(old)
        assert loaded.responses is None and loaded.splits.policy is None
        assert report_json(loaded.to_dict()) == report_json(old), "absent fields stay absent, in order"
        build.report = old
        session.commit()
    served = client.get("/api/v1/tasks/dynasent-r2/rounds/1/report", headers=built["researcher"].headers)
    assert served.status_code == 200, served.text
    assert json.dumps(served.json()) == json.dumps({"build_id": build_id, **old})
