"""The API's CPU benchmarks that run in process (docs/benchmarks.md, "Where it goes now"):
bench/api_profile.py sends the crowd's whole flow through hand-made ASGI calls, and every request
must be answered as over HTTP; bench/orm_vs_core.py reads the same rows both ways. No timings
here: what is checked is that the figures come from real answers (a broken harness would report
the CPU of 401s and 422s)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from bench import api_profile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ENDPOINTS = {
    "GET /me",
    "POST /assignments",
    "POST /attempts",
    "POST /confirmation",
    "POST /example",
    "GET /validation-batch",
    "POST /validations",
}


@pytest.mark.parametrize("inline_hops", [False, True], ids=["threads", "inline-hops"])
def test_the_mix_runs_through_the_app_in_process_and_every_answer_succeeds(
    tmp_path: Path, inline_hops: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if inline_hops:
        # inline_hops() patches anyio for the rest of the process: undo it after the test.
        import anyio.to_thread
        import starlette.concurrency

        monkeypatch.setattr(anyio.to_thread, "run_sync", anyio.to_thread.run_sync)
        monkeypatch.setattr(starlette.concurrency.anyio.to_thread, "run_sync", anyio.to_thread.run_sync)
    args = argparse.Namespace(
        writers=3,
        validators=2,
        database="sqlite",
        postgres_url="",
        seed=0,
        inline_hops=inline_hops,
        profile_dir=tmp_path / "profiles",
        top=5,
        show_statements=True,
    )
    figures = asyncio.run(api_profile.main(args))

    assert set(figures["endpoints"]) == ENDPOINTS
    for endpoint, row in figures["endpoints"].items():
        assert row["requests"] > 0, endpoint
        assert set(row["statuses"]) <= {"200", "201"}, (endpoint, row["statuses"])
        assert row["cpu_ms_per_request"] > 0, endpoint
    assert figures["endpoints"]["GET /me"]["requests"] == 5  # each writer's and validator's token
    assert figures["endpoints"]["POST /assignments"]["statuses"] == {"201": 3}
    # Every label of the validators' batches (the examples and the task's control items).
    assert figures["endpoints"]["POST /validations"]["requests"] >= 2
    assert figures["mix_requests"] == sum(r["requests"] for e, r in figures["endpoints"].items() if e != "GET /me")
    # A profile of each endpoint's requests, and the SQL of each endpoint's first request.
    assert {p.name.rsplit("-", 1)[0] for p in (tmp_path / "profiles").glob("*.pstats")} == {
        e.replace(" ", "_").replace("/", "") for e in ENDPOINTS
    }
    printed = capsys.readouterr().out
    labels = printed.split("=== POST /validations: the statements of its first request")[1]
    # An example's label or a control item's answer (the first item of a batch may be either).
    assert "UPDATE validation_batch_items" in labels


def test_orm_vs_core_reads_the_same_rows_both_ways() -> None:
    """bench/orm_vs_core.py: each read finds its row through the ORM and through Core (the
    script asserts it on every call), and the figures are there for each read."""
    from bench import orm_vs_core

    args = argparse.Namespace(database="sqlite", postgres_url="", repeat=20)
    rows = orm_vs_core.main(args)
    assert set(rows) == {"token", "assignment", "request"}
    for name, row in rows.items():
        assert row["orm_us"] > 0 and row["core_us"] > 0, name
        assert row["core_over_orm"] == pytest.approx(row["core_us"] / row["orm_us"], rel=0.05), name
