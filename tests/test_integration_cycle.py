"""One full collection cycle over real HTTP between real processes, for three task families.

The stub model servers (``python -m tests.stub_model_server``) and the API (``dynaloop api``)
run as subprocesses on free loopback ports; users are created with the ``dynaloop`` CLI and
everything else goes through the REST API with httpx:

1. DynaSent (single-label, the shipped YAML with its onboarding quiz): quiz failed once then
   passed, CSV prompts with metadata, two attempts (the second fools the model), confirmation,
   submission, five validators, the researcher's full record and the round statistics.
2. EthioEmo (multi-label, Ge'ez script): target label sets, three validators with label sets,
   the 2-of-3 gold rule, and re-queueing of a disagreement once before it is dropped.
3. MAD-TSC (target-dependent): attempts carry a target span, the model receives the target
   text, the example keeps the span with its text, validators use the 5-point scale + unknown.

Runs on SQLite always and on PostgreSQL when DYNALOOP_TEST_POSTGRES_URL is set.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from rapidfuzz.distance import Levenshtein

from services.taskdef import example_path
from tests.conftest import BACKENDS, Actor, example_yaml, free_port, fresh_postgres_database, wait_until_healthy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO_ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 30.0
CLI_TIMEOUT_S = 60.0
SINGLE_LABELS = "positive,negative,neutral"
EMOTIONS = "anger,disgust,fear,joy,sadness,surprise,neutral"
VALIDATORS = [f"val{i}" for i in range(1, 7)]


# --- processes ----------------------------------------------------------------------------


def _dynaloop_command() -> list[str]:
    """The `dynaloop` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("dynaloop")
    if script.exists():
        return [str(script)]
    found = shutil.which("dynaloop")
    if found:
        return [found]
    return [sys.executable, "-c", "from dynaloop.cli import app; app()"]


def _child_env(data_dir: Path) -> dict[str, str]:
    """The environment of every child: no DYNALOOP_* settings leak in from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNALOOP_")}
    env.update({"DYNALOOP_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1", "COLUMNS": "200", "NO_COLOR": "1"})
    return env


class Process:
    """A child process in its own process group, with its output in a log file."""

    def __init__(self, name: str, argv: list[str], *, cwd: Path, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]

    def wait_ready(self, url: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Poll ``url`` until it answers 200; fail with the log if the process dies or is slow."""
        last = wait_until_healthy(url, timeout_s, running=lambda: self.popen.poll() is None)
        if last is None:
            return
        if self.popen.poll() is not None:
            pytest.fail(f"{self.name} exited with {self.popen.returncode} before answering {url}:\n{self.log_tail()}")
        pytest.fail(f"{self.name} did not answer {url} within {timeout_s:.0f} s ({last}):\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after 10 s; never waits unboundedly."""
        try:
            if self.popen.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self.popen.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._signal(signal.SIGKILL)
                    self.popen.wait(timeout=5)
        finally:
            self._log.close()

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)  # the group this process leads (start_new_session)


def _run_cli(args: list[str], *, env: dict[str, str], cwd: Path) -> str:
    result = subprocess.run(
        [*_dynaloop_command(), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"dynaloop {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _create_users(
    specs: list[tuple[str, list[str]]], database_url: str, *, env: dict[str, str], cwd: Path
) -> dict[str, str]:
    """Create users with the CLI, all at once; returns username -> token (the last stdout line)."""
    running = []
    for username, args in specs:
        argv = [*_dynaloop_command(), "user", *args, "--database-url", database_url]
        running.append(
            (
                username,
                args,
                subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    stdin=subprocess.DEVNULL,
                ),
            )
        )
    tokens: dict[str, str] = {}
    failures = []
    for username, args, popen in running:
        try:
            out, errors = popen.communicate(timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            popen.kill()
            out, errors = popen.communicate(timeout=5)
            failures.append(f"{username}: timed out")
            continue
        if popen.returncode != 0:
            failures.append(f"{username} ({' '.join(args)}): rc {popen.returncode}\n{out}\n{errors}")
            continue
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        assert lines and f"{username!r} created" in out, out
        tokens[username] = lines[-1]
    assert not failures, "\n".join(failures)
    assert all(token.startswith("dl_") and " " not in token for token in tokens.values()), tokens
    return tokens


@dataclass
class Deployment:
    backend: str
    api: httpx.Client
    stubs: dict[str, str]  # name -> base URL
    researcher: Actor
    writer: Actor
    validators: list[Actor]


@pytest.fixture(scope="module", params=BACKENDS)
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A fresh database, users made with the CLI, three stub model servers and the API, each a
    real process on its own port; everything is stopped at teardown, whatever happened."""
    backend = request.param
    workdir = tmp_path_factory.mktemp(f"cycle-{backend}")
    env = _child_env(workdir / "data")
    with ExitStack() as stack:
        if backend == "sqlite":
            database_url = f"sqlite:///{workdir / 'dynaloop.db'}"
        else:
            database_url = stack.enter_context(fresh_postgres_database())

        processes: list[Process] = []

        def stop_all() -> None:
            for process in reversed(processes):
                process.stop()

        stack.callback(stop_all)
        # The stubs start while the schema and the users are made.
        stub_specs = {
            "sentiment": ["--labels", SINGLE_LABELS],
            "emotion": ["--labels", EMOTIONS, "--multi-label"],
            "targeted": ["--labels", "negative,neutral,positive"],
        }
        stubs: dict[str, str] = {}
        for name, args in stub_specs.items():
            port = free_port()
            processes.append(
                Process(
                    f"stub-{name}",
                    [sys.executable, "-m", "tests.stub_model_server", "--port", str(port), *args],
                    cwd=REPO_ROOT,
                    env=env,
                    log_dir=workdir,
                )
            )
            stubs[name] = f"http://127.0.0.1:{port}"

        out = _run_cli(["db", "upgrade", "--database-url", database_url], env=env, cwd=workdir)
        assert "schema at revision" in out, out
        tokens = _create_users(
            [("rita", ["create-admin", "rita"]), ("walt", ["create", "walt", "--role", "writer"])]
            + [(name, ["create", name, "--role", "validator"]) for name in VALIDATORS],
            database_url,
            env=env,
            cwd=workdir,
        )

        api_port = free_port()
        api = Process(
            "api",
            [
                *_dynaloop_command(),
                "api",
                "--port",
                str(api_port),
                "--database-url",
                database_url,
                "--log-level",
                "warning",
            ],
            cwd=workdir,
            env=env,
            log_dir=workdir,
        )
        processes.append(api)
        for process, url in zip(
            processes, [*(f"{u}/info" for u in stubs.values()), f"http://127.0.0.1:{api_port}/health"], strict=True
        ):
            process.wait_ready(url)
        for name, url in stubs.items():
            info = httpx.get(f"{url}/info", timeout=5).json()
            assert info["family"] == ("multi_label" if name == "emotion" else "single_label"), info

        client = stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=30.0))
        health = client.get("/health").json()
        assert health["status"] == "ok", health
        researcher = Actor("rita", tokens["rita"])
        me = client.get("/api/v1/me", headers=researcher.headers).json()
        assert me["username"] == "rita" and set(me["roles"]) == {"admin", "researcher"}, me
        yield Deployment(
            backend=backend,
            api=client,
            stubs=stubs,
            researcher=researcher,
            writer=Actor("walt", tokens["walt"]),
            validators=[Actor(name, tokens[name]) for name in VALIDATORS],
        )


# --- helpers ------------------------------------------------------------------------------


def call(
    client: httpx.Client,
    method: str,
    path: str,
    actor: Actor,
    expect: int,
    *,
    json_body: Any = None,
    content: bytes | None = None,
    content_type: str | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """One API request; asserts the status code and returns the JSON body."""
    all_headers = {**actor.headers, **(headers or {})}
    if content_type:
        all_headers["Content-Type"] = content_type
    response = client.request(method, f"/api/v1{path}", json=json_body, content=content, headers=all_headers)
    assert response.status_code == expect, f"{method} {path}: {response.status_code} {response.text}"
    return response.json()


def create_task(d: Deployment, yaml_text: str) -> dict[str, Any]:
    return call(
        d.api, "POST", "/tasks", d.researcher, 201, content=yaml_text.encode("utf-8"), content_type="application/yaml"
    )


def open_round(d: Deployment, task: str, endpoint: str, **options: Any) -> dict[str, Any]:
    # The model server is registered by an admin (rita is one) and named in the round.
    server = call(
        d.api, "POST", "/model-servers", d.researcher, 201, json_body={"name": f"{task}-model", "url": endpoint}
    )
    assert server["url"] == endpoint and server["has_admin_token"] is False
    round_ = call(
        d.api,
        "POST",
        f"/tasks/{task}/rounds",
        d.researcher,
        201,
        json_body={"model_servers": [server["name"]], **options},
    )
    assert round_["number"] == 1 and round_["status"] == "collecting"
    assert round_["model_servers"] == [server["name"]]
    return round_


def attempt(
    d: Deployment, assignment_id: int, text: str, key: str, expect: int = 201, target_span: list[int] | None = None
) -> Any:
    body: dict[str, Any] = {"text": text}
    if target_span is not None:
        body["target_span"] = target_span
    return call(
        d.api,
        "POST",
        f"/assignments/{assignment_id}/attempts",
        d.writer,
        expect,
        json_body=body,
        headers={"Idempotency-Key": key},
    )


def expected_distance(prompt: str, text: str) -> float:
    """DynaSent Fig. 2a: Levenshtein distance / max(len(prompt), len(text))."""
    return Levenshtein.distance(prompt, text) / max(len(prompt), len(text))


def validate(d: Deployment, validator: Actor, example_id: int, label: str | list[str], key: str) -> Any:
    return call(
        d.api,
        "POST",
        f"/examples/{example_id}/validations",
        validator,
        201,
        json_body={"label": label, "seconds_taken": 4.5},
        headers={"Idempotency-Key": key},
    )


# --- cycle 1: DynaSent --------------------------------------------------------------------

DYNASENT_PROMPTS = [
    {
        "text": "The soup was fine and the bread was fresh.",
        "id": "y1",
        "source": "yelp",
        "stars": "3",
        "business": "Cafe Roma",
    },
    {
        "text": "We went there on a Sunday afternoon.",
        "id": "y2",
        "source": "yelp",
        "stars": "4",
        "business": "Diner, Inc.",
    },
    {
        "text": "The staff were friendly and quick.",
        "id": "y3",
        "source": "yelp",
        "stars": "5",
        "business": 'Noodle "Bar"',
    },
]
# For each target: a sentence the stub labels with the target (does not fool it), and one it
# labels otherwise (fools it) although a person would give it the target.
DYNASENT_EDITS = {
    "positive": ("It was great, we will come back.", "Not bad at all, honestly."),
    "negative": ("But the room was dirty.", "What a great way to waste an evening."),
    "neutral": ("We paid at the counter.", "The menu lists a dish called Great Noodles."),
}
DYNASENT_STUB_SAYS = {"positive": "negative", "negative": "positive", "neutral": "positive"}


def _prompts_csv(rows: list[dict[str, str]]) -> bytes:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["text", "id", "source", "stars", "business"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    writer.writerow({**rows[0], "id": "y1-again"})  # repeated in the file: skipped, counted
    return buffer.getvalue().encode("utf-8")


def test_dynasent_cycle(deployment: Deployment) -> None:
    d = deployment
    # The shipped YAML with its quiz; without its control items, attention checks and pay (this
    # cycle labels its one example by id and counts every batch item; those parts have tests of
    # their own: test_validation_integrity, test_attention_checks, test_paid_round).
    shipped = example_yaml("dynasent-r2")
    quiz = yaml.safe_load(shipped)["onboarding_quiz"]
    task = create_task(d, shipped)
    assert task["name"] == "dynasent-r2" and task["family"] == "single_label"
    round_ = open_round(d, "dynasent-r2", d.stubs["sentiment"])
    rid = round_["id"]

    report = call(
        d.api,
        "POST",
        f"/rounds/{rid}/prompts",
        d.researcher,
        200,
        content=_prompts_csv(DYNASENT_PROMPTS),
        content_type="text/csv",
    )
    assert report == {"rows": 4, "imported": 3, "duplicates_in_file": 1, "already_present": 0}

    # Onboarding: no assignment before the quiz; one failed attempt; then all answers right.
    refused = call(d.api, "POST", f"/rounds/{rid}/assignments", d.writer, 403, json_body={})
    assert refused["error"]["code"] == "forbidden" and refused["error"]["details"] == {"quiz_required": True}
    shown = call(d.api, "GET", "/tasks/dynasent-r2/quiz", d.writer, 200)
    assert shown["required"] is True and shown["passed"] is False
    assert (shown["attempts_used"], shown["attempts_left"]) == (0, 5)
    assert [q["text"] for q in shown["questions"]] == [q["text"] for q in quiz["questions"]]
    assert all(set(q) == {"text", "options"} for q in shown["questions"])  # no answers leak
    right = [q["answer"] for q in quiz["questions"]]
    assert len(right) == 8
    wrong = list(right)
    wrong[3] = next(option for option in quiz["questions"][3]["options"] if option != right[3])
    failed = call(d.api, "POST", "/tasks/dynasent-r2/quiz/attempts", d.writer, 200, json_body={"answers": wrong})
    assert failed == {"passed": False, "attempts_used": 1, "attempts_left": 4}
    call(d.api, "POST", f"/rounds/{rid}/assignments", d.writer, 403, json_body={})
    passed = call(d.api, "POST", "/tasks/dynasent-r2/quiz/attempts", d.writer, 200, json_body={"answers": right})
    assert passed == {"passed": True, "attempts_used": 2, "attempts_left": 3}

    # The writer's assignment: a prompt with its CSV metadata and a target label.
    assignment = call(d.api, "POST", f"/rounds/{rid}/assignments", d.writer, 201, json_body={})
    prompt = assignment["prompt"]["text"]
    row = next(r for r in DYNASENT_PROMPTS if r["text"] == prompt)
    assert assignment["prompt"]["metadata"] == {"stars": row["stars"], "business": row["business"]}
    assert assignment["condition"] == "prompt" and assignment["tries_allowed"] == 10
    (target,) = assignment["target_label"]
    assert target in {"positive", "negative", "neutral"}
    plain_edit, fooling_edit = DYNASENT_EDITS[target]

    text1 = f"{prompt} {plain_edit}"
    first = attempt(d, assignment["id"], text1, "dyn-1")
    assert first["status"] == "scored" and first["prediction"] == [target] and first["fooled"] is False
    assert first["counts_as_try"] is True and first["model_id"] == "stub-model"
    assert first["edit_distance"] == pytest.approx(expected_distance(prompt, text1), abs=1e-9)
    text2 = f"{prompt} {fooling_edit}"
    second = attempt(d, assignment["id"], text2, "dyn-2")
    assert second["prediction"] == [DYNASENT_STUB_SAYS[target]] and second["fooled"] is True
    assert second["edit_distance"] == pytest.approx(expected_distance(prompt, text2), abs=1e-9)
    assert set(second["probabilities"]) == {"positive", "negative", "neutral"}
    state = call(d.api, "GET", f"/assignments/{assignment['id']}", d.writer, 200)
    assert state["tries_used"] == 2 and [a["id"] for a in state["attempts"]] == [first["id"], second["id"]]

    confirmed = call(d.api, "POST", f"/attempts/{second['id']}/confirmation", d.writer, 200, json_body={"agrees": True})
    assert confirmed["confirmed"] is True
    example = call(
        d.api,
        "POST",
        f"/assignments/{assignment['id']}/example",
        d.writer,
        201,
        json_body={"attempt_id": second["id"]},
        headers={"Idempotency-Key": "dyn-submit"},
    )
    assert example["text"] == text2 and example["fooled"] is True and example["status"] == "validating"
    assert example["target_label"] == [target] and example["extras"] == {}
    eid = example["id"]

    # Collection ends; validation goes on.
    assert (
        call(d.api, "POST", f"/rounds/{rid}/status", d.researcher, 200, json_body={"status": "validating"})["status"]
        == "validating"
    )
    call(d.api, "POST", f"/rounds/{rid}/assignments", d.writer, 409, json_body={})

    # Five validators each fetch a batch (the one example) and label it: four agree with the
    # writer, one says mixed.
    labels = [target, target, "mixed", target, target]
    for validator in d.validators[:5]:
        batch = call(d.api, "GET", f"/rounds/{rid}/validation-batch", validator, 200)
        assert batch["validation_labels"] == ["positive", "negative", "neutral", "mixed"]
        assert batch["multi_label"] is False
        assert [(item["text"], item["target_span"]) for item in batch["data"]] == [(text2, None)]
        assert set(batch["data"][0]) == {"item_id", "text", "target_span"}  # no example id
    for number, (validator, label) in enumerate(zip(d.validators[:5], labels, strict=True)):
        stored = validate(d, validator, eid, label, f"dyn-v{number}")
        assert stored["label"] == [label] and stored["counted"] is True
    # A retried request (same key, same label) is answered from the first and adds nothing.
    replay = d.api.post(
        f"/api/v1/examples/{eid}/validations",
        json={"label": target, "seconds_taken": 4.5},
        headers={**d.validators[0].headers, "Idempotency-Key": "dyn-v0"},
    )
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true", replay.text
    # The sixth validator finds nothing left to label; the writer may not read the record.
    empty = call(d.api, "GET", f"/rounds/{rid}/validation-batch", d.validators[5], 200)
    assert empty["count"] == 0 and empty["data"] == []
    call(d.api, "GET", f"/examples/{eid}", d.writer, 403)

    record = call(d.api, "GET", f"/examples/{eid}", d.researcher, 200)
    assert record["status"] == "validated"
    assert (record["validation_count"], record["validations_needed"]) == (5, 5)
    assert record["text"] == text2 and record["target_label"] == [target] and record["writer"] == "walt"
    assert record["prompt"]["text"] == prompt and record["prompt"]["source"] == "yelp"
    assert record["prompt"]["metadata"] == {"stars": row["stars"], "business": row["business"]}
    assert record["model_prediction"] == [DYNASENT_STUB_SAYS[target]] and record["fooled"] is True
    assert record["submitted_attempt_id"] == second["id"]
    attempts = record["attempts"]
    assert [a["text"] for a in attempts] == [text1, text2]
    assert [a["prediction"] for a in attempts] == [[target], [DYNASENT_STUB_SAYS[target]]]
    assert [a["fooled"] for a in attempts] == [False, True]
    assert [a["confirmed"] for a in attempts] == [None, True]
    assert [a["status"] for a in attempts] == ["scored", "scored"]
    for a, text in zip(attempts, [text1, text2], strict=True):
        assert a["edit_distance"] == pytest.approx(expected_distance(prompt, text), abs=1e-9)
        assert 0 < a["edit_distance"] < 1
        assert a["model_id"] == "stub-model" and a["model_version"] == "1" and a["latency_ms"] > 0
    assert attempts[0]["seconds_since_start"] <= attempts[1]["seconds_since_start"]
    assert sorted((v["validator"], v["label"][0]) for v in record["validations"]) == sorted(
        zip(VALIDATORS[:5], labels, strict=True)
    )
    assert all(v["counted"] and v["seconds_taken"] == 4.5 for v in record["validations"])

    stats = call(d.api, "GET", f"/rounds/{rid}/stats", d.researcher, 200)
    assert stats["round"] == 1 and stats["status"] == "validating"
    assert stats["assignments"] == {"active": 0, "submitted": 1, "skipped": 0, "expired": 0}
    assert stats["attempts"] == {"scored": 2, "fooled": 1, "model_unavailable": 0, "fooling_rate": 0.5}
    assert stats["confirmations"] == {"yes": 1, "no": 0, "rate": 1.0}
    assert stats["examples"] == {
        "submitted": 1,
        "fooled": 1,
        "prompt": 1,
        "no_prompt": 0,
        "validating": 0,
        "validated": 1,
        "dropped": 0,
        "by_target_label": {target: 1},
        "awaiting_reannotation": 0,
        "awaiting_reannotation_no_new_validator": 0,
    }
    assert stats["validations"] == {"given": 5, "counted": 5, "needed": 5, "coverage": 1.0}
    assert stats["prompts"] == {"total": 3, "used": 1}


# --- cycle 2: EthioEmo (multi-label, Ge'ez script) ----------------------------------------

AMHARIC_PROMPTS = ["ደመወዛችንን እስካሁን አልከፈሉንም።", "ዛሬ ዝናብ ዘነበ፤ መንገዱ ጭር ብሏል።"]
# Target anger+disgust: first the emotion words the stub knows (not fooled), then Amharic only.
ANGER_PLAIN = "ይህ ሙስና በጣም ያናድዳል anger disgust"
ANGER_FOOLING = "ይህ ሙስና በጣም ያናድዳል፤ ያስጠላል! ደመወዛችንን እስካሁን አልከፈሉንም።"
SADNESS_FOOLING = "በወንድሜ ሞት በጣም አዝኛለሁ፤ ልቤ ተሰብሯል።"


def test_ethioemo_multi_label_cycle(deployment: Deployment) -> None:
    d = deployment
    task = create_task(d, example_yaml("ethioemo-amharic", onboarding_quiz=None))
    assert task["title"] == "EthioEmo Amharic: multi-label emotion / የስሜት መለያ (አማርኛ)"
    round_ = open_round(d, "ethioemo-amharic", d.stubs["emotion"], target_label_mode="writer_choice")
    rid = round_["id"]
    lines = "\n".join(
        json.dumps({"text": t, "id": f"am{i}", "source": "twitter"}, ensure_ascii=False)
        for i, t in enumerate(AMHARIC_PROMPTS)
    )
    report = call(
        d.api,
        "POST",
        f"/rounds/{rid}/prompts",
        d.researcher,
        200,
        content=lines.encode("utf-8"),
        content_type="application/x-ndjson",
    )
    assert report["imported"] == 2

    # Example A: target set anger + disgust, two attempts.
    call(d.api, "POST", f"/rounds/{rid}/assignments", d.writer, 422, json_body={"target_label": ["neutral", "joy"]})
    first = call(
        d.api, "POST", f"/rounds/{rid}/assignments", d.writer, 201, json_body={"target_label": ["disgust", "anger"]}
    )
    assert first["target_label"] == ["anger", "disgust"]
    assert first["prompt"]["text"] in AMHARIC_PROMPTS
    plain = attempt(d, first["id"], ANGER_PLAIN, "am-1")
    assert plain["prediction"] == ["anger", "disgust"] and plain["fooled"] is False
    fooling = attempt(d, first["id"], ANGER_FOOLING, "am-2")
    assert fooling["prediction"] == ["neutral"] and fooling["fooled"] is True
    assert fooling["text"].encode("utf-8") == ANGER_FOOLING.encode("utf-8")
    assert fooling["edit_distance"] == pytest.approx(
        expected_distance(first["prompt"]["text"], ANGER_FOOLING), abs=1e-9
    )
    call(d.api, "POST", f"/attempts/{fooling['id']}/confirmation", d.writer, 200, json_body={"agrees": True})
    example_a = call(
        d.api, "POST", f"/assignments/{first['id']}/example", d.writer, 201, json_body={"attempt_id": fooling["id"]}
    )
    assert example_a["text"].encode("utf-8") == ANGER_FOOLING.encode("utf-8")

    # Example B: target sadness, fooled at the first try.
    second = call(d.api, "POST", f"/rounds/{rid}/assignments", d.writer, 201, json_body={"target_label": ["sadness"]})
    assert {first["prompt"]["text"], second["prompt"]["text"]} == set(AMHARIC_PROMPTS)
    sad = attempt(d, second["id"], SADNESS_FOOLING, "am-3")
    assert sad["prediction"] == ["neutral"] and sad["fooled"] is True
    call(d.api, "POST", f"/attempts/{sad['id']}/confirmation", d.writer, 200, json_body={"agrees": True})
    example_b = call(
        d.api, "POST", f"/assignments/{second['id']}/example", d.writer, 201, json_body={"attempt_id": sad["id"]}
    )
    a_id, b_id = example_a["id"], example_b["id"]

    # Three validators label both examples with label sets. A: anger is chosen by 2 of 3 (gold);
    # B: no label chosen twice, so it goes back to the queue once.
    v1, v2, v3, v4, v5, v6 = d.validators
    for validator in (v1, v2, v3):
        batch = call(d.api, "GET", f"/rounds/{rid}/validation-batch", validator, 200)
        assert batch["multi_label"] is True
        assert batch["validation_labels"] == EMOTIONS.split(",")
        texts = sorted(item["text"].encode("utf-8") for item in batch["data"])
        assert texts == sorted([ANGER_FOOLING.encode("utf-8"), SADNESS_FOOLING.encode("utf-8")])
    refused = call(d.api, "POST", f"/examples/{a_id}/validations", v1, 422, json_body={"label": ["neutral", "anger"]})
    assert "neutral" in refused["error"]["message"]
    stored = validate(d, v1, a_id, ["disgust", "anger"], "a-1")
    assert stored["label"] == ["anger", "disgust"]
    validate(d, v2, a_id, ["anger"], "a-2")
    validate(d, v3, a_id, ["sadness"], "a-3")
    validate(d, v1, b_id, ["joy"], "b-1")
    validate(d, v2, b_id, ["fear"], "b-2")
    validate(d, v3, b_id, ["surprise"], "b-3")

    record_a = call(d.api, "GET", f"/examples/{a_id}", d.researcher, 200)
    assert record_a["status"] == "validated"
    assert (record_a["validation_count"], record_a["validations_needed"]) == (3, 3)
    assert record_a["text"].encode("utf-8") == ANGER_FOOLING.encode("utf-8")
    assert record_a["target_label"] == ["anger", "disgust"]
    assert [a["text"] for a in record_a["attempts"]] == [ANGER_PLAIN, ANGER_FOOLING]
    assert [a["prediction"] for a in record_a["attempts"]] == [["anger", "disgust"], ["neutral"]]
    assert sorted((v["validator"], v["label"]) for v in record_a["validations"]) == [
        ("val1", ["anger", "disgust"]),
        ("val2", ["anger"]),
        ("val3", ["sadness"]),
    ]

    record_b = call(d.api, "GET", f"/examples/{b_id}", d.researcher, 200)
    assert record_b["status"] == "validating"
    assert (record_b["validation_count"], record_b["validations_needed"]) == (3, 6)

    # The earlier validators get nothing more; three new ones get B only and disagree again.
    for validator in (v1, v2, v3):
        assert call(d.api, "GET", f"/rounds/{rid}/validation-batch", validator, 200)["count"] == 0
    for validator in (v4, v5, v6):
        batch = call(d.api, "GET", f"/rounds/{rid}/validation-batch", validator, 200)
        assert [item["text"] for item in batch["data"]] == [SADNESS_FOOLING]
    validate(d, v4, b_id, ["anger"], "b-4")
    validate(d, v5, b_id, ["sadness"], "b-5")
    validate(d, v6, b_id, ["neutral"], "b-6")
    record_b = call(d.api, "GET", f"/examples/{b_id}", d.researcher, 200)
    assert record_b["status"] == "dropped"
    assert (record_b["validation_count"], record_b["validations_needed"]) == (6, 6)
    assert sorted(v["validator"] for v in record_b["validations"]) == VALIDATORS
    assert call(d.api, "GET", f"/rounds/{rid}/validation-batch", v6, 200)["count"] == 0

    stats = call(d.api, "GET", f"/rounds/{rid}/stats", d.researcher, 200)
    assert stats["assignments"]["submitted"] == 2 and stats["assignments"]["active"] == 0
    assert stats["attempts"] == {"scored": 3, "fooled": 2, "model_unavailable": 0, "fooling_rate": 2 / 3}
    assert stats["confirmations"] == {"yes": 2, "no": 0, "rate": 1.0}
    assert stats["examples"] == {
        "submitted": 2,
        "fooled": 2,
        "prompt": 2,
        "no_prompt": 0,
        "validating": 0,
        "validated": 1,
        "dropped": 1,
        "by_target_label": {"anger+disgust": 1, "sadness": 1},
        "awaiting_reannotation": 0,
        "awaiting_reannotation_no_new_validator": 0,
    }
    assert stats["validations"] == {"given": 9, "counted": 9, "needed": 9, "coverage": 1.0}
    assert stats["prompts"] == {"total": 2, "used": 2}


# --- cycle 3: MAD-TSC (target-dependent) ---------------------------------------------------

MADTSC_PROMPT = "Angela Merkel met the French president in Brussels on Tuesday to discuss the budget."
MADTSC_PLAIN = "Angela Merkel gave a terrible speech in Brussels on Tuesday about the budget."
MADTSC_FOOLING = "Once again, Angela Merkel left Brussels on Tuesday without the budget deal she had promised."
TARGET = "Angela Merkel"


def test_mad_tsc_target_dependent_cycle(deployment: Deployment) -> None:
    d = deployment
    shipped = example_path("mad-tsc").read_text(encoding="utf-8")
    quiz = yaml.safe_load(shipped)["onboarding_quiz"]
    create_task(d, shipped)
    round_ = open_round(d, "mad-tsc", d.stubs["targeted"], target_label_mode="writer_choice")
    rid = round_["id"]
    line = json.dumps({"text": MADTSC_PROMPT, "id": "vox-1", "source": "voxeurop", "target": TARGET})
    call(
        d.api,
        "POST",
        f"/rounds/{rid}/prompts",
        d.researcher,
        200,
        content=line.encode("utf-8"),
        content_type="application/x-ndjson",
    )
    passed = call(
        d.api,
        "POST",
        "/tasks/mad-tsc/quiz/attempts",
        d.writer,
        200,
        json_body={"answers": [q["answer"] for q in quiz["questions"]]},
    )
    assert passed["passed"] is True and passed["attempts_used"] == 1

    assignment = call(
        d.api, "POST", f"/rounds/{rid}/assignments", d.writer, 201, json_body={"target_label": "negative"}
    )
    assert assignment["prompt"]["metadata"] == {"target": TARGET}
    # No span, or a span outside the text: refused before the model is asked.
    attempt(d, assignment["id"], MADTSC_PLAIN, "tsc-0", expect=422)
    attempt(d, assignment["id"], MADTSC_PLAIN, "tsc-00", expect=422, target_span=[70, 500])

    plain_span = [MADTSC_PLAIN.index(TARGET), MADTSC_PLAIN.index(TARGET) + len(TARGET)]
    plain = attempt(d, assignment["id"], MADTSC_PLAIN, "tsc-1", target_span=plain_span)
    assert plain["target_span"] == [0, 13] and plain["prediction"] == ["negative"] and plain["fooled"] is False
    span = [MADTSC_FOOLING.index(TARGET), MADTSC_FOOLING.index(TARGET) + len(TARGET)]
    assert span == [12, 25]
    fooling = attempt(d, assignment["id"], MADTSC_FOOLING, "tsc-2", target_span=span)
    assert fooling["target_span"] == span and fooling["prediction"] == ["neutral"] and fooling["fooled"] is True

    # The model received the sentence pair: each attempt's target text, and nothing for the refused ones.
    calls = httpx.get(f"{d.stubs['targeted']}/admin/calls", timeout=5).json()
    assert calls == {"calls": 2, "targets": [[TARGET], [TARGET]]}

    call(d.api, "POST", f"/attempts/{fooling['id']}/confirmation", d.writer, 200, json_body={"agrees": True})
    example = call(
        d.api,
        "POST",
        f"/assignments/{assignment['id']}/example",
        d.writer,
        201,
        json_body={"attempt_id": fooling["id"], "extras": {"target_span": span}},
    )
    expected_extras = {"target_span": {"start": 12, "end": 25, "text": TARGET}}
    assert example["extras"] == expected_extras
    eid = example["id"]

    v1, v2, v3 = d.validators[:3]
    for validator in (v1, v2, v3):
        batch = call(d.api, "GET", f"/rounds/{rid}/validation-batch", validator, 200)
        assert batch["validation_labels"] == [
            "negative",
            "weakly_negative",
            "neutral",
            "weakly_positive",
            "positive",
            "unknown",
        ]
        assert [(item["text"], item["target_span"]) for item in batch["data"]] == [
            (MADTSC_FOOLING, expected_extras["target_span"])
        ]
    refused = call(d.api, "POST", f"/examples/{eid}/validations", v1, 422, json_body={"label": "mixed"})
    assert "weakly_negative" in refused["error"]["message"]
    validate(d, v1, eid, "weakly_negative", "t-1")
    validate(d, v2, eid, "negative", "t-2")
    validate(d, v3, eid, "unknown", "t-3")

    record = call(d.api, "GET", f"/examples/{eid}", d.researcher, 200)
    # All three labels are in; MAD-TSC re-queues nothing (the round builder drops `unknown` items).
    assert record["status"] == "validated"
    assert (record["validation_count"], record["validations_needed"]) == (3, 3)
    assert record["extras"] == expected_extras
    assert record["prompt"]["metadata"] == {"target": TARGET}
    assert [a["target_span"] for a in record["attempts"]] == [plain_span, span]
    assert [a["prediction"] for a in record["attempts"]] == [["negative"], ["neutral"]]
    assert [a["text"] for a in record["attempts"]] == [MADTSC_PLAIN, MADTSC_FOOLING]
    assert sorted((v["validator"], v["label"]) for v in record["validations"]) == [
        ("val1", ["weakly_negative"]),
        ("val2", ["negative"]),
        ("val3", ["unknown"]),
    ]

    stats = call(d.api, "GET", f"/rounds/{rid}/stats", d.researcher, 200)
    assert stats["attempts"] == {"scored": 2, "fooled": 1, "model_unavailable": 0, "fooling_rate": 0.5}
    assert stats["examples"]["validated"] == 1 and stats["examples"]["by_target_label"] == {"negative": 1}
    assert stats["validations"] == {"given": 3, "counted": 3, "needed": 3, "coverage": 1.0}
