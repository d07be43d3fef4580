"""bench/api_profile.py, the in-process harness of the API's CPU per request (docs/benchmarks.md,
"Where it goes now"): the crowd's whole flow goes through its hand-made ASGI calls and every
request is answered as over HTTP. No timings here: what is checked is that the figures come from
real answers (a broken harness would report the CPU of 401s and 422s)."""

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
    assert "=== POST /validations: the statements of its first request" in printed
    assert "INSERT INTO validations" in printed
