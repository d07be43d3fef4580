"""The web app on launch day: real browsers arriving through a Prolific writer study link.

Starts `dynaloop demo` (Model 0, model server, API, job worker, web app) on its own ports and
data folder, makes a Prolific writer study link through the API, and for each concurrency
level opens that many headless Chromium sessions (Debian's, through Selenium:
tests/demo_process.headless_chromium), started before the level's clock runs, that arrive
through the link at ``--rate`` per second. Each does what a worker does: the onboarding quiz,
three checks with the model, a confirmation and a submission.

Each step is timed in the browser, from the action to the DOM holding its result (a
MutationObserver: the step's text is on the page, no element of the previous run is left
stale and Streamlit no longer shows its "Running" icon), less the model server's own time for
a check (the attempt's ``latency_ms``, which the API records). Beside it: the web app's
resident memory before and with every session of the level open, the CPU seconds of the web
app, the API, the model server and the browsers, the machine's CPU and load average.

    .venv/bin/python bench/web_app.py --levels 1,2,4 --rate 1 --json bench/results/web_app.json

A level "holds" when the p95 of its steps is under one second (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_model, cpu_seconds, load_average  # noqa: E402
from services.taskdef import example_path, load_task_definition  # noqa: E402
from tests.demo_process import DYNALOOP, READY_LINE, chromium_missing, headless_chromium  # noqa: E402

TASK = "dynasent-r2"
P95_LIMIT_MS = 1000.0
STEP_TIMEOUT_S = 120.0
DEFINITION = load_task_definition(example_path(TASK))
LABEL_NAMES = DEFINITION.display_names
LABELS_BY_NAME = {name: label for label, name in LABEL_NAMES.items()}

# Three sentences per label that Model 0 gets right (plain opinions), so a check of one written
# against a different goal fools it; "{n}" makes each session's text its own (a round takes a
# text once).
PLAIN = {
    "positive": [
        "The pasta at table {n} was wonderful and the staff were lovely.",
        "We loved the dessert at table {n}; the service was warm and quick.",
        "Table {n} had a great evening: tasty food and friendly waiters.",
    ],
    "negative": [
        "The soup at table {n} was cold and the waiter was rude to us.",
        "Table {n} waited an hour for a burnt, greasy burger. Awful.",
        "The fish at table {n} smelled off and the bill was far too high.",
    ],
    "neutral": [
        "Table {n} is next to the window on the second floor.",
        "The restaurant opens at noon; table {n} was booked for one o'clock.",
        "Table {n} ordered two salads and a bottle of water.",
    ],
}

# Resolves when the DOM holds every wanted fragment and Streamlit has finished the run: nothing of
# the previous run left stale, no "Running" icon. arguments[0]: the fragments; arguments[1]: the
# step's start on the page's clock (null: now; 0: the navigation's start, for a page load).
_MARK_JS = """
const want = arguments[0];
const mark = {start: arguments[1] === null ? performance.now() : arguments[1], done: null};
const settled = () => {
  if (mark.done !== null) return;
  const text = document.body ? document.body.textContent : "";
  if (!want.every((fragment) => text.includes(fragment))) return;
  if (document.querySelector('[data-stale="true"], [data-testid="stStatusWidgetRunningIcon"]')) return;
  mark.done = performance.now();
  observer.disconnect();
};
const observer = new MutationObserver(settled);
observer.observe(document.documentElement, {subtree: true, childList: true, characterData: true, attributes: true});
window.__benchMark = mark;
settled();
"""
_WAIT_JS = """
const finish = arguments[arguments.length - 1];
const poll = () => {
  const mark = window.__benchMark;
  if (mark && mark.done !== null) finish([mark.start, mark.done]); else setTimeout(poll, 20);
};
poll();
"""


# --- the pure parts (tests/test_bench_web_app.py) ------------------------------------------


@dataclass
class Step:
    """One step of one session: the time in the browser from the action to its rendered result,
    and the model server's own part of it (a check's attempt ``latency_ms``)."""

    session: int
    name: str
    browser_ms: float
    model_ms: float = 0.0
    text: str | None = None  # the sentence a check sent

    @property
    def web_app_ms(self) -> float:
        """What the worker waited for beside the model: never below zero (the model's latency is
        measured by the API, on another clock)."""
        return max(self.browser_ms - self.model_ms, 0.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``: a value that was
    measured, never one between two of them."""
    if not values:
        raise ValueError("no values")
    if not 0 < q <= 100:
        raise ValueError(f"q must be in (0, 100], not {q}")
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def prolific_query(rng: random.Random) -> str:
    """The query string Prolific appends to a study link: 24-hex ids for the participant,
    the study and the session."""

    def hex24() -> str:
        return "".join(rng.choice("0123456789abcdef") for _ in range(24))

    return f"PROLIFIC_PID={hex24()}&STUDY_ID={hex24()}&SESSION_ID={hex24()}"


def sentences_against(target: str, session: int) -> list[str]:
    """Three sentences of a label other than ``target`` (negative for a positive goal, else
    positive), each its session's own: Model 0 predicts their label, so a check fools it."""
    other = "negative" if target == "positive" else "positive"
    return [text.format(n=session) for text in PLAIN[other]]


def attach_model_time(steps: list[Step], latency_by_text: dict[str, float]) -> None:
    """Give each check the model time of the attempt that sent its sentence (each session's
    sentences are its own, :func:`sentences_against`). A check whose attempt has no latency
    keeps 0: all of its time counts as the web app's."""
    for step in steps:
        if step.text is not None and step.text in latency_by_text:
            step.model_ms = latency_by_text[step.text]


def summarize(steps: Iterable[Step]) -> dict[str, Any]:
    """p50 and p95 of the web app's part per step name, and over the interactions: every step
    but ``open`` (the study link's page load, reported on its own), in ms."""
    by_name: dict[str, list[float]] = {}
    every: list[float] = []
    for step in steps:
        by_name.setdefault(step.name, []).append(step.web_app_ms)
        if step.name != "open":
            every.append(step.web_app_ms)
    if not every:
        return {"steps": 0}
    return {
        "steps": len(every),
        "p50_ms": round(percentile(every, 50), 1),
        "p95_ms": round(percentile(every, 95), 1),
        "max_ms": round(max(every), 1),
        "by_step": {
            name: {
                "n": len(values),
                "p50_ms": round(percentile(values, 50), 1),
                "p95_ms": round(percentile(values, 95), 1),
            }
            for name, values in by_name.items()
        },
    }


def sessions_held(p95_by_level: dict[int, float], limit_ms: float = P95_LIMIT_MS) -> int:
    """The most concurrent sessions measured with p95 under ``limit_ms`` such that every smaller
    level measured also held (0 when even the smallest did not)."""
    held = 0
    for level in sorted(p95_by_level):
        if p95_by_level[level] >= limit_ms:
            break
        held = level
    return held


# --- the demo --------------------------------------------------------------------------------


@dataclass
class Demo:
    process: subprocess.Popen[str]
    api: str
    ui: str
    data_dir: Path
    lines: list[str] = field(default_factory=list)

    def pids(self) -> dict[str, int]:
        found = {}
        for line in self.lines:
            match = re.match(r"^(model server|API|web app)\s+http\S+.*\(pid (\d+),", line)
            if match:
                found[match.group(1)] = int(match.group(2))
        return found

    def tokens(self) -> dict[str, str]:
        return dict(re.findall(r"^  (\w+)\s+(dl_\S+)$", "".join(self.lines), re.M))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_demo(data_dir: Path, ports: tuple[int, int, int], extra: list[str], timeout_s: float = 900.0) -> Demo:
    api_port, model_port, ui_port = ports
    command = [
        *DYNALOOP,
        "demo",
        "--data-dir",
        str(data_dir),
        "--port",
        str(api_port),
        "--model-port",
        str(model_port),
        "--ui-port",
        str(ui_port),
        *extra,
    ]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "200",
            # Every browser here comes from 127.0.0.1, where a real study's workers each have an
            # address of their own: the API's cap on new workers per address (5 an hour) would
            # refuse all but the first few sessions.
            "DYNALOOP_STUDY_NEW_WORKERS_PER_ADDRESS_PER_HOUR": "100000",
        },
    )
    demo = Demo(process, f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{ui_port}", data_dir)
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            demo.lines.append(line)
            if READY_LINE in line:
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(timeout_s) or process.poll() is not None:
        demo.stop()
        raise SystemExit(f"dynaloop demo did not start:\n{''.join(demo.lines)[-3000:]}")
    return demo


def make_study_link(demo: Demo, round_id: int, workers: int, name: str) -> str:
    """A Prolific writer link (quota: one example) for ``workers`` workers; returns its path."""
    researcher = demo.tokens()["researcher"]
    response = httpx.post(
        f"{demo.api}/api/v1/tasks/{TASK}/study-links",
        headers={"Authorization": f"Bearer {researcher}"},
        json={
            "name": name,
            "round_id": round_id,
            "role": "writer",
            "platform": "prolific",
            "quota": 1,
            "max_workers": workers,
            "completion_code": "BENCH001",
        },
        timeout=30,
    )
    response.raise_for_status()
    return str(response.json()["path"])


def model_latencies(data_dir: Path, texts: Iterable[str]) -> dict[str, float]:
    """The ``latency_ms`` the API recorded for the attempt that sent each of ``texts`` (the
    model server's own time, as the API saw it), from the demo's database."""
    connection = sqlite3.connect(data_dir / "dynaloop.db")
    try:
        found: dict[str, float] = {}
        for text in texts:
            row = connection.execute(
                "SELECT latency_ms FROM attempts WHERE text = ? AND latency_ms IS NOT NULL ORDER BY id DESC LIMIT 1",
                (text,),
            ).fetchone()
            if row is not None:
                found[text] = float(row[0])
        return found
    finally:
        connection.close()


# --- one worker in one browser -----------------------------------------------------------------


def _literal(text: str) -> str:
    if "'" not in text:
        return f"'{text}'"
    return "concat(" + ', "\'", '.join(f"'{part}'" for part in text.split("'")) + ")"


class Worker:
    def __init__(self, driver: Any, session: int) -> None:
        from selenium.webdriver.common.by import By

        self.driver, self.session, self.by = driver, session, By
        self.steps: list[Step] = []

    def _until(self, find: Any, what: str, timeout_s: float = STEP_TIMEOUT_S) -> Any:
        from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                found = find()
                if found:
                    return found
            except (StaleElementReferenceException, WebDriverException):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"session {self.session}: no {what}; the page says:\n{self.text()[-1500:]}")

    def text(self) -> str:
        try:
            return str(self.driver.find_element(self.by.TAG_NAME, "body").text)
        except Exception:
            return ""

    def button(self, text: str, *, prefix: bool = False) -> Any:
        test = f"starts-with(normalize-space(), {_literal(text)})" if prefix else f"normalize-space()={_literal(text)}"

        def find() -> Any:
            for element in self.driver.find_elements(self.by.XPATH, f"//button[{test}]"):
                if element.is_displayed() and element.is_enabled():
                    return element
            return None

        return self._until(find, f"button {text!r}")

    def timed(
        self, name: str, want: list[str], action: Any, start: float | None = None, text: str | None = None
    ) -> None:
        """Run ``action`` and record the time until the page holds ``want`` and has settled."""
        self.driver.execute_script(_MARK_JS, want, start)
        action()
        self.driver.set_script_timeout(STEP_TIMEOUT_S)
        try:
            began, done = self.driver.execute_async_script(_WAIT_JS)
        except Exception as error:
            raise TimeoutError(
                f"session {self.session}, {name}: {want} not on the page within {STEP_TIMEOUT_S:.0f} s "
                f"({type(error).__name__}); the page says:\n{self.text()[-1500:]}"
            ) from None
        self.steps.append(Step(self.session, name, float(done) - float(began), text=text))

    def open_link(self, url: str) -> None:
        self.driver.get(url)  # returns once the page has loaded: the app then connects and renders
        self.timed("open", ["Before you start: a short quiz", "0 of 1 examples for this study"], lambda: None, 0.0)

    def quiz(self) -> str:
        assert DEFINITION.onboarding_quiz is not None
        for number, question in enumerate(DEFINITION.onboarding_quiz.questions, start=1):
            xpath = (
                f"//*[@role='radiogroup'][starts-with(@aria-label, '{number}. ')]"
                f"//label[@data-testid='stRadioOption'][normalize-space()={_literal(question.answer)}]"
            )
            self._until(lambda xpath=xpath: self.driver.find_elements(self.by.XPATH, xpath), f"quiz option {number}")
            self.driver.find_element(self.by.XPATH, xpath).click()
        self.timed("quiz", ["Your goal:", "Tries: 0 /"], self.button("Submit answers").click)
        goal = re.search(r"Your goal: Write a sentence a person would label (.+?) that fools", self.text())
        if goal is None or goal.group(1) not in LABELS_BY_NAME:
            raise RuntimeError(f"session {self.session}: no goal on the page:\n{self.text()[-1500:]}")
        return LABELS_BY_NAME[goal.group(1)]

    def type_sentence(self, text: str) -> None:
        from selenium.webdriver.common.keys import Keys

        field = self._until(
            lambda: next(
                (e for e in self.driver.find_elements(self.by.CSS_SELECTOR, "textarea[aria-label='Your sentence']")),
                None,
            ),
            "sentence field",
        )
        field.click()
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.DELETE)
        field.send_keys(text)

    def write(self, target: str, tries_allowed: int) -> None:
        texts = sentences_against(target, self.session)
        fooled = False
        for attempt in range(1, tries_allowed + 1):
            text = texts[attempt - 1] if attempt <= len(texts) else f"{texts[0][:-1]}, {attempt}."
            self.type_sentence(text)
            self.timed(
                f"check {attempt}" if attempt <= 3 else "check more",
                [f"Tries: {attempt} / {tries_allowed}"],
                self.button("Check with the model").click,
                text=text,
            )
            fooled = "You fooled the model!" in self.text()
            if attempt >= 3 and fooled:
                break
        if fooled:
            others = [label for label in ("positive", "negative", "neutral") if label != target]
            no = f"No, I judge this sentence to be {' or '.join(LABEL_NAMES[label] for label in others)}."
            self.timed("confirm", ["You judged this sentence"], self.button(no).click)
        self.timed("submit", ["Submitted!", "1 of 1 examples for this study"], self.button("Submit").click)


def run_level(
    demo: Demo, round_id: int, sessions: int, rate: float, rng: random.Random, pids: dict[str, int], first_session: int
) -> dict[str, Any]:
    """``sessions`` browsers arriving at ``rate`` per second, each doing a worker's path once;
    their sessions are numbered from ``first_session`` (a number in each sentence they check)."""
    path = make_study_link(demo, round_id, sessions, f"bench {sessions} sessions {time.time():.0f}")
    tries_allowed = DEFINITION.tries_per_assignment
    drivers: list[Any] = []
    try:
        for _ in range(sessions):  # started before the clock: a worker's browser is already open
            drivers.append(headless_chromium())
        workers = [Worker(driver, first_session + n) for n, driver in enumerate(drivers)]
        queries = {worker.session: prolific_query(rng) for worker in workers}
        errors: list[str] = []
        time.sleep(2.0)
        rss_before = psutil.Process(pids["web app"]).memory_info().rss
        processes = {
            "web app": pids["web app"],
            "API": pids["API"],
            "model server": pids["model server"],
        }
        cpu_before = {name: cpu_seconds(pid) or 0.0 for name, pid in processes.items()}
        browser_pids = [driver.service.process.pid for driver in drivers]
        browsers_before = sum(cpu_seconds(pid) or 0.0 for pid in browser_pids)
        load_before = load_average()
        started = time.monotonic()

        def work(worker: Worker) -> None:
            try:
                worker.open_link(f"{demo.ui}{path}?{queries[worker.session]}")
                target = worker.quiz()
                worker.write(target, tries_allowed)
            except Exception as error:  # reported with the level, not raised from a thread
                errors.append(f"session {worker.session}: {type(error).__name__}: {str(error)[:800]}")

        threads = []
        for worker in workers:
            arrive = started + (worker.session - first_session) / rate
            time.sleep(max(arrive - time.monotonic(), 0.0))
            thread = threading.Thread(target=work, args=(worker,))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        wall = time.monotonic() - started
        cpu = {name: round((cpu_seconds(pid) or 0.0) - cpu_before[name], 2) for name, pid in processes.items()}
        cpu["browsers"] = round(sum(cpu_seconds(pid) or 0.0 for pid in browser_pids) - browsers_before, 2)
        rss_open = psutil.Process(pids["web app"]).memory_info().rss
        load_after = load_average()
    finally:
        for driver in drivers:
            driver.quit()
    steps = [step for worker in workers for step in worker.steps]
    attach_model_time(steps, model_latencies(demo.data_dir, [s.text for s in steps if s.text is not None]))
    summary = summarize(steps)
    return {
        "sessions": sessions,
        "rate_per_s": rate,
        "wall_s": round(wall, 1),
        "completed": sum(1 for worker in workers if any(step.name == "submit" for step in worker.steps)),
        "errors": errors,
        **summary,
        "model_ms_p50": round(percentile([s.model_ms for s in steps if s.name.startswith("check")] or [0.0], 50), 1),
        "web_app_rss_mib": {"before": round(rss_before / 2**20, 1), "all_open": round(rss_open / 2**20, 1)},
        "rss_per_session_mib": round((rss_open - rss_before) / 2**20 / sessions, 2),
        "cpu_s": cpu,
        "web_app_cpu_s_per_session": round(cpu["web app"] / sessions, 3),
        "load_average": {"before": load_before, "after": load_after},
        "steps_raw": [asdict(step) | {"web_app_ms": round(step.web_app_ms, 1)} for step in steps],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,2,4", help="concurrent sessions per level, comma-separated")
    parser.add_argument("--rate", type=float, default=1.0, help="arrivals per second within a level")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/bench-demo"), help="the demo's data folder")
    parser.add_argument("--ports", default="19000,19001,19501", help="API, model server and web app ports")
    parser.add_argument(
        "--seed", type=int, default=None, help="for the Prolific ids (default: new ones each run; a worker joins once)"
    )
    parser.add_argument(
        "--no-warmup", dest="warmup", action="store_false", help="skip the one unmeasured session before the levels"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("demo_args", nargs="*", help="more `dynaloop demo` options, after --")
    args = parser.parse_args()
    missing = chromium_missing()
    if missing:
        raise SystemExit(f"needs {', '.join(missing)} (apt-get install chromium chromium-driver)")
    levels = [int(level) for level in args.levels.split(",")]
    ports = tuple(int(port) for port in args.ports.split(","))
    assert len(ports) == 3
    rng = random.Random(args.seed)
    demo = start_demo(args.data_dir, (ports[0], ports[1], ports[2]), args.demo_args)
    try:
        pids = demo.pids()
        round_id = int(re.search(r"\(id (\d+)\)", "".join(demo.lines)).group(1))  # type: ignore[union-attr]
        # Session numbers go into the sentences, which a round takes once: this run's own.
        session = int(time.time()) % 100_000 * 100
        if args.warmup:  # the first session loads the pages' modules into the web app: not measured
            run_level(demo, round_id, 1, args.rate, rng, pids, session)
            session += 1
        results = []
        for level in levels:
            result = run_level(demo, round_id, level, args.rate, rng, pids, session)
            session += level
            results.append(result)
            print(
                f"{level} sessions at {args.rate:g}/s: interactions p50 {result.get('p50_ms')} ms, "
                f"p95 {result.get('p95_ms')} ms, open p95 {result.get('by_step', {}).get('open', {}).get('p95_ms')} ms "
                f"(web app's part; model p50 {result['model_ms_p50']} ms subtracted), completed "
                f"{result['completed']}/{level}, web app {result['web_app_rss_mib']} MiB "
                f"({result['rss_per_session_mib']} MiB/session), CPU s {result['cpu_s']}, "
                f"load average {result['load_average']}",
                flush=True,
            )
            for error in result["errors"]:
                print("  " + error.splitlines()[0], flush=True)
    finally:
        demo.stop()
    held = sessions_held({r["sessions"]: r["p95_ms"] for r in results if r.get("steps") and not r["errors"]})
    out = {
        "command": "python bench/web_app.py " + " ".join(sys.argv[1:]),
        "sessions_per_process_p95_under_1s": held,
        "machine": {**cpu_model(), "python": platform.python_version()},
        "levels": results,
    }
    print(f"one web-app process held {held} concurrent session(s) with p95 < 1 s; machine {out['machine']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
