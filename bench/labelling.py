"""Labelling benchmark: does a validation label cost more once the database holds earlier rounds?
(issue 17, point 8: 9-16 ms per label on a first round, 26-34 ms on a second round in the same database)

The database is built with the real API and domain code, in process (FastAPI's TestClient, no
network): a task from the shipped ``dynasent-r2`` YAML (quiz off), round 1 with ``--examples``
harvested examples (rows as ``round harvest --as examples`` writes them), labelled five times each by
``--validators`` validators through ``GET /rounds/{id}/validation-batch`` and
``POST /validation-items/{item_id}/validations``; round 1 is closed and built (``POST /rounds/{id}/build``,
no chance constraint), round 2 is opened with the same number of examples and labelled the same way.

Measured: the latency of each ``POST .../validations`` (the label path: dynaloop/api/routes/validation.py ->
services/domain/validating.py, example_status.py, quality.py), and the SQL statements each one runs.
The peer is round 1 itself in the same run: ``round 2 / round 1`` of the median and p90 per-label
latency and of the statements per label. A label path whose work does not depend on earlier rounds
gives ratios near 1.

Usage:
    python bench/labelling.py [--examples 400] [--validators 8] [--database sqlite|postgresql://...]
        [--profile] [--json bench/results/labelling.json]

``--profile`` prints pyinstrument's profile of the label path (``validating.submit_validation``) in a
third round of database B, after the timed rounds.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from itertools import zip_longest
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import create_engine, event, make_url, text  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

from bench.machine import cpu_model  # noqa: E402
from dynaloop.api.app import create_app  # noqa: E402
from services.db.engine import session_scope  # noqa: E402
from services.db.migrate import upgrade  # noqa: E402
from services.db.models import Condition, Example, ExampleOrigin, ExampleStatus, Round  # noqa: E402
from services.domain import users, validating  # noqa: E402
from services.settings import Settings  # noqa: E402
from services.taskdef import example_path  # noqa: E402

API = "/api/v1"
LABELS = ["positive", "negative", "neutral"]
TASK = "dynasent-r2"


class StatementCounter:
    """Counts the SQL statements an engine runs while ``active``."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        self.active = False
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *_: Any) -> None:
        if self.active:
            self.count += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.count, self.active = 0, True
        try:
            yield
        finally:
            self.active = False


@contextmanager
def new_postgres_database(server_url: str) -> Iterator[str]:
    """A new database on that PostgreSQL server, dropped afterwards."""
    server = make_url(server_url)
    name = f"dynaloop_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def add_harvested_examples(app: Any, round_id: int, n: int, offset: int) -> None:
    """``n`` examples as ``round harvest --as examples`` writes them (rounds/models/harvest.py
    ``_write_examples``): no writer, the model's prediction recorded, validating."""
    with session_scope(app.state.sessionmaker) as session:
        round_ = session.get(Round, round_id)
        assert round_ is not None
        for i in range(offset, offset + n):
            session.add(
                Example(
                    round_id=round_id,
                    origin=ExampleOrigin.harvested,
                    source_metadata={"corpus": "bench", "document_id": str(i), "sentence_index": 0},
                    condition=Condition.prompt,
                    prompt_id=None,
                    text=f"Sentence {i}: the soup at the place on the corner was {LABELS[i % 3]}.",
                    target_label=[],
                    model_prediction=[LABELS[(i // 3) % 3]],
                    model_id="bench-model",
                    fooled=False,
                    extras={},
                    status=ExampleStatus.validating,
                    validation_count=0,
                    validations_needed=5,
                    requeue_count=0,
                )
            )


def label_round(
    client: TestClient, counter: StatementCounter, round_id: int, tokens: list[str]
) -> Iterator[tuple[float, int]]:
    """Every validator takes batches and labels them until the round has no open example; each
    label is the example's intended label, except that validators take turns disagreeing (nobody
    crosses the task's disagreement limit). Yields each label's milliseconds and SQL statements."""
    busy = True
    while busy:
        busy = False
        for position, token in enumerate(tokens):
            headers = {"Authorization": f"Bearer {token}"}
            batch = client.get(f"{API}/rounds/{round_id}/validation-batch", headers=headers)
            assert batch.status_code == 200, batch.text
            for index, item in enumerate(batch.json()["data"]):
                busy = True
                intended = next(label for label in LABELS if f"was {label}." in item["text"])
                label = intended if (index + position) % 5 else "mixed"
                with counter.counting():
                    started = time.perf_counter()
                    response = client.post(
                        f"{API}/validation-items/{item['item_id']}/validations", json={"label": label}, headers=headers
                    )
                    elapsed = (time.perf_counter() - started) * 1000
                assert response.status_code == 201, response.text
                yield elapsed, counter.count


def summary(timings: list[tuple[float, int]]) -> dict[str, Any]:
    ordered = sorted(ms for ms, _ in timings)
    statements = [count for _, count in timings]
    return {
        "labels": len(timings),
        "median_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
        "statements_per_label": dict(sorted(Counter(statements).items())),
        "mean_statements_per_label": round(statistics.fmean(statements), 2),
    }


class Database:
    """One dynaloop database with its app, a researcher, validators and the task."""

    def __init__(self, stack: ExitStack, url: str, n_validators: int) -> None:
        upgrade(url)
        data_dir = stack.enter_context(tempfile.TemporaryDirectory())
        settings = Settings(
            database_url=url,
            environment="test",
            secret_key="bench-labelling-secret-key-0123456789",
            data_dir=Path(data_dir),
            rate_limit_per_token="none",
            rate_limit_per_ip="none",
        )
        self.app = create_app(settings)
        stack.callback(self.app.state.engine.dispose)
        self.counter = StatementCounter(self.app.state.engine)
        self.client = stack.enter_context(TestClient(self.app))
        with session_scope(self.app.state.sessionmaker) as session:
            researcher = users.create_user(session, None, "rita", ["researcher"])
            self.headers = {"Authorization": f"Bearer {users.issue_token(session, None, researcher)[1]}"}
            self.tokens = []
            for i in range(n_validators):
                user = users.create_user(session, None, f"val{i}", ["validator"])
                self.tokens.append(users.issue_token(session, None, user)[1])
        data = yaml.safe_load(example_path(TASK).read_text(encoding="utf-8"))
        data.pop("onboarding_quiz", None)
        response = self.client.post(
            f"{API}/tasks",
            content=yaml.safe_dump(data).encode(),
            headers={**self.headers, "Content-Type": "application/yaml"},
        )
        assert response.status_code == 201, response.text

    def open_round(self, n_examples: int, offset: int) -> int:
        response = self.client.post(f"{API}/tasks/{TASK}/rounds", json={"model_servers": []}, headers=self.headers)
        assert response.status_code == 201, response.text
        round_id: int = response.json()["id"]
        add_harvested_examples(self.app, round_id, n_examples, offset)
        return round_id

    def close_and_build(self, round_id: int) -> None:
        for status in ("validating", "closed"):
            response = self.client.post(
                f"{API}/rounds/{round_id}/status", json={"status": status}, headers=self.headers
            )
            assert response.status_code == 200, response.text
        response = self.client.post(f"{API}/rounds/{round_id}/build", json={"chance": False}, headers=self.headers)
        assert response.status_code == 201, response.text

    def labels(self, round_id: int) -> Iterator[tuple[float, int]]:
        return label_round(self.client, self.counter, round_id, self.tokens)


def run(urls: tuple[str, str], n_examples: int, n_first: int, n_validators: int, profile: bool) -> dict[str, Any]:
    """Database B gets round 1 (labelled, closed, built) and then round 2; database A gets only a
    round 1. A's round 1 and B's round 2 are then labelled in turns, one label each, so that both
    see the same machine at the same moment (a shared machine's speed drifts over minutes)."""
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        alone, grown = (Database(stack, url, n_validators) for url in urls)
        first = grown.open_round(n_first, offset=0)
        timings = list(grown.labels(first))
        results["b_round_1_before"] = summary(timings)
        print(f"database B, round 1 (labelled first): {results['b_round_1_before']}", flush=True)
        grown.close_and_build(first)
        second = grown.open_round(n_examples, offset=n_first)
        only = alone.open_round(n_examples, offset=n_first)
        profiler = None
        if profile:
            from pyinstrument import Profiler

            profiler = Profiler(async_mode="disabled")
        peer: list[tuple[float, int]] = []
        measured: list[tuple[float, int]] = []
        for round_1_label, round_2_label in zip_longest(alone.labels(only), grown.labels(second)):
            if round_1_label is not None:
                peer.append(round_1_label)
            if round_2_label is not None:
                measured.append(round_2_label)
        results["a_round_1_alone"] = summary(peer)
        results["b_round_2_after_built_round_1"] = summary(measured)
        print(f"database A, round 1 alone (interleaved): {results['a_round_1_alone']}")
        print(f"database B, round 2 (interleaved): {results['b_round_2_after_built_round_1']}")
        if profiler is not None:
            # Profiled apart from the timed labels: a third round in database B. The request
            # handlers run in the server's worker threads, so the domain call is profiled there.
            grown.close_and_build(second)
            third = grown.open_round(n_examples // 4, offset=n_first + n_examples)
            original = validating.submit_validation

            def profiled(*args: Any, **kwargs: Any) -> Any:
                profiler.start()
                try:
                    return original(*args, **kwargs)
                finally:
                    profiler.stop()

            validating.submit_validation = profiled
            try:
                for _ in grown.labels(third):
                    pass
            finally:
                validating.submit_validation = original
            print(profiler.output_text(unicode=True, color=False))
    a, b = results["a_round_1_alone"], results["b_round_2_after_built_round_1"]
    results["ratio_round2_over_round1"] = {
        "median": round(b["median_ms"] / a["median_ms"], 3),
        "p90": round(b["p90_ms"] / a["p90_ms"], 3),
        "mean": round(b["mean_ms"] / a["mean_ms"], 3),
        "statements": round(b["mean_statements_per_label"] / a["mean_statements_per_label"], 3),
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=400, help="examples per round (5 labels each)")
    parser.add_argument(
        "--first-round-examples",
        type=int,
        default=None,
        help="examples of database B's first round (the history round 2 is labelled on top of); default --examples",
    )
    parser.add_argument("--validators", type=int, default=8)
    parser.add_argument("--database", default="sqlite", help="sqlite (a fresh file) or a PostgreSQL URL")
    parser.add_argument("--profile", action="store_true", help="pyinstrument profile of round 2's labels")
    parser.add_argument("--json", type=Path, default=Path("bench/results/labelling.json"))
    args = parser.parse_args()
    cpu = cpu_model()
    print(f"CPU: {cpu['model']} ({cpu['cpus']} cpus; flags {', '.join(cpu['flags']) or 'none of interest'})")
    print(f"Python {platform.python_version()}, database {args.database.split('://')[0]}")
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        if args.database == "sqlite":
            urls = (f"sqlite:///{folder}/a.db", f"sqlite:///{folder}/b.db")
        else:
            urls = (
                stack.enter_context(new_postgres_database(args.database)),
                stack.enter_context(new_postgres_database(args.database)),
            )
        first = args.first_round_examples or args.examples
        results = run(urls, args.examples, first, args.validators, args.profile)
    results["cpu"] = cpu
    results["database"] = args.database.split("://")[0]
    results["examples_per_round"] = args.examples
    results["first_round_examples_in_b"] = args.first_round_examples or args.examples
    results["validators"] = args.validators
    print(f"round 2 / round 1: {results['ratio_round2_over_round1']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
