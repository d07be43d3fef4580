"""The golden path in a real browser: `dynaloop demo` (Model 0, model server, API, Streamlit)
driven by headless Chromium through Selenium.

A writer logs in, passes the onboarding quiz, edits the prompt, checks it with the model
until it is fooled (or the tries run out), confirms and submits; a validator labels a batch;
the researcher's dashboard shows the round's numbers before and after. A screenshot of each
page goes to ``test-artifacts/``.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them). Without them
the test is skipped, except under CI (``CI=true``), where it fails. Selenium is pointed at
/usr/bin/chromedriver, so Selenium Manager never downloads a driver.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from dynaloop.demo import DEMO_TASK
from dynaloop.processes import log_tail
from services.taskdef import example_path, load_task_definition
from tests import demo_process
from tests.demo_process import ROOT, RunningDemo, chromium_missing, headless_chromium, running_demo, tiny_model_cache

pytestmark = [pytest.mark.browser, pytest.mark.integration]


# The demo task's control items (services/task_examples/dynasent-r2.yaml) and their labels.
CONTROL_LABELS = {
    item.text: item.labels[0] for item in load_task_definition(example_path("dynasent-r2")).quality.control_items
}
# The demo task's attention checks for writers (the same YAML): each question and its answer.
_ATTENTION_CHECKS = load_task_definition(example_path("dynasent-r2")).attention_checks
ATTENTION_ANSWERS = {item.question: item.answer for item in (_ATTENTION_CHECKS.items if _ATTENTION_CHECKS else [])}
ARTIFACTS = ROOT / "test-artifacts"
WIDTH, HEIGHT = 1280, 900
WAIT_S = 45.0

# Sentences a person would give the target label, in the ways DynaSent's writers fooled models
# (sarcasm, negation, hedged praise, reported opinions); the test tries them until one fools Model 0.
ATTEMPTS = {
    "negative": [
        "The host did a great job of making me feel unwanted.",
        "I just love waiting an hour for a cold, soggy burger.",
        "What a fantastic way to ruin a birthday dinner.",
        "Five stars for the most creative ways to overcharge a customer.",
        "The waiter was so attentive that he forgot us for forty minutes.",
    ],
    "positive": [
        "The food was not bad at all, honestly better than I hoped.",
        "Not the worst meal I've had; in fact it was one of the best.",
        "I expected to hate it, but the pasta won me over.",
        "No complaints whatsoever, and the staff could not have been nicer.",
        "It was shockingly good for such a plain-looking place.",
    ],
    "neutral": [
        "The menu says it serves the best burger in town.",
        "The sign outside claims they have the friendliest staff in the city.",
        "My friend told me the soup is terrible, so I ordered the salad.",
        "The reviews call it the worst pizza in town; we went on a Monday.",
        "Their website promises an unforgettable, amazing experience.",
    ],
}

T = TypeVar("T")


def _require_browser() -> None:
    missing = chromium_missing()
    if not missing:
        return
    reason = (
        f"the browser test needs {', '.join(missing)}; install Debian's chromium and chromium-driver "
        "(apt-get install chromium chromium-driver), as .ci/run does"
    )
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"CI is set but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _require_browser()
    driver = headless_chromium(WIDTH, HEIGHT)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """Streamlit pages for a test: widgets found by their labels and ARIA attributes, waits
    for the reruns that every interaction causes."""

    def __init__(self, driver: Any, base_url: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver, self.base_url, self.by = driver, base_url, By
        # Sentences checked with the model in this test. Each text is accepted once per round
        # (409 duplicate_text), and a writer who is never fooled submits their last text, so a
        # later writer must not check any of them again: the check would be refused without
        # using a try.
        self.checked_texts: set[str] = set()

    def until(self, condition: Callable[[], T | None], what: str, timeout_s: float = WAIT_S) -> T:
        from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = condition()
                if value:
                    return value
            except (StaleElementReferenceException, WebDriverException):
                pass  # Streamlit replaced the element while we looked at it
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the page says:\n{self.text()[-3000:]}")
            time.sleep(0.2)

    def text(self) -> str:
        try:
            return str(self.driver.find_element(self.by.TAG_NAME, "body").text)
        except Exception:
            return ""

    def idle(self) -> None:
        """Wait until Streamlit has finished running the script (no 'Running...' widget)."""
        time.sleep(0.3)
        self.until(
            lambda: (
                not self.driver.find_elements(
                    self.by.CSS_SELECTOR,
                    "[data-testid='stStatusWidgetRunningIcon'], [data-testid='stStatusWidgetRunningManIcon']",
                )
                or None
            ),
            "the app to finish running",
        )

    def visible(self, css: str) -> Any:
        return next((e for e in self.driver.find_elements(self.by.CSS_SELECTOR, css) if e.is_displayed()), None)

    def field(self, label: str) -> Any:
        return self.until(
            lambda: self.visible(f"input[aria-label='{label}'], textarea[aria-label='{label}']"), f"the field {label!r}"
        )

    def button(self, text: str, *, prefix: bool = False) -> Any:
        test = (
            f"starts-with(normalize-space(), {_xpath_literal(text)})"
            if prefix
            else f"normalize-space()={_xpath_literal(text)}"
        )

        def find() -> Any:
            for element in self.driver.find_elements(self.by.XPATH, f"//button[{test}]"):
                if element.is_displayed() and element.is_enabled():
                    return element
            return None

        return self.until(find, f"the button {text!r}")

    def click(self, text: str, *, prefix: bool = False) -> None:
        self.button(text, prefix=prefix).click()

    def has_text(self, fragment: str) -> bool:
        return fragment in self.text()

    def wait_text(self, *fragments: str, timeout_s: float = WAIT_S) -> str:
        return self.until(
            lambda: next((f for f in fragments if self.has_text(f)), None),
            f"one of {fragments!r} on the page",
            timeout_s,
        )

    def type_into(self, label: str, text: str) -> None:
        from selenium.webdriver.common.keys import Keys

        element = self.field(label)
        element.click()
        element.send_keys(Keys.CONTROL, "a")
        element.send_keys(Keys.DELETE)
        element.send_keys(text)

    def choose(self, group_label: str, option: str, *, prefix: bool = False) -> None:
        """Click ``option`` in the radio group whose ARIA label is (or starts with) ``group_label``."""
        match = (
            f"starts-with(@aria-label, {_xpath_literal(group_label)})"
            if prefix
            else f"@aria-label={_xpath_literal(group_label)}"
        )
        xpath = (
            f"//*[@role='radiogroup'][{match}]//label[@data-testid='stRadioOption']"
            f"[normalize-space()={_xpath_literal(option)}]"
        )
        self.until(lambda: self.driver.find_elements(self.by.XPATH, xpath), f"option {option!r} of {group_label!r}")
        self.driver.find_element(self.by.XPATH, xpath).click()

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def scroll_to_text(self, fragment: str, block: str = "center") -> None:
        elements = self.driver.find_elements(self.by.XPATH, f"//*[contains(text(), {_xpath_literal(fragment)})]")
        if elements:
            self.driver.execute_script(f"arguments[0].scrollIntoView({{block: '{block}'}});", elements[-1])
            time.sleep(0.3)

    # --- app-level steps ---------------------------------------------------------------

    def log_in(self, username: str, password: str) -> None:
        self.field("Username")
        self.type_into("Username", username)
        self.type_into("Password", password)
        self.click("Log in")
        self.wait_text(f"Signed in as {username}")
        self.idle()

    def log_out(self) -> None:
        self.click("Log out")
        self.field("Username")

    def open_page(self, title: str) -> None:
        link = self.until(
            lambda: next(
                (
                    e
                    for e in self.driver.find_elements(self.by.CSS_SELECTOR, "[data-testid='stSidebarNav'] a")
                    if e.text.strip().splitlines()[-1:] == [title]
                ),
                None,
            ),
            f"the navigation link {title!r}",
        )
        link.click()
        self.idle()

    def metrics(self) -> dict[str, str]:
        def read() -> dict[str, str]:
            values = {}
            for metric in self.driver.find_elements(self.by.CSS_SELECTOR, "[data-testid='stMetric']"):
                label = metric.find_element(self.by.CSS_SELECTOR, "[data-testid='stMetricLabel']").text.strip()
                values[label] = metric.find_element(self.by.CSS_SELECTOR, "[data-testid='stMetricValue']").text
            return values

        return self.until(lambda: read() if "Examples" in read() else None, "the round's metrics")


def _xpath_literal(text: str) -> str:
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    return "concat(" + ', "\'", '.join(f"'{part}'" for part in text.split("'")) + ")"


def _number(value: str) -> float:
    found = re.search(r"[\d.,]+", value)
    return float(found.group(0).replace(",", "")) if found else 0.0


@pytest.fixture
def demo(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Iterator[RunningDemo]:
    _require_browser()
    cache = tiny_model_cache(tmp_path_factory.getbasetemp() / "demo-model-cache")
    with running_demo(tmp_path / "data", model_cache=cache, ui=True) as running:
        assert "web app" in running.service_pids(), running.output
        yield running


def _dashboard(page: Page, name: str) -> dict[str, str]:
    page.open_page("Dashboard")
    page.wait_text("Validation coverage")
    values = page.metrics()
    page.screenshot(name)
    return values


def test_writer_validator_and_researcher_in_a_browser(browser: Any, demo: RunningDemo) -> None:
    page = Page(browser, demo.ui_url)
    try:
        # That a restarted demo keeps what the researcher did (issue #28, item 3) is
        # tests/test_demo.py::test_a_restarted_demo_keeps_the_researchers_promotion_and_rounds.
        _golden_path(page, demo)
    except BaseException:
        page.screenshot("failure")
        logs = "".join(
            f"\n===== {log.name}\n{log_tail(log, 80)}\n" for log in sorted((demo.data_dir / "logs").glob("*.log"))
        )
        (ARTIFACTS / "failure.txt").write_text(
            f"===== page\n{page.text()}\n===== dynaloop demo\n{demo.output}{logs}", encoding="utf-8"
        )
        raise


def _pass_the_quiz(page: Page) -> str:
    """Answer the task's onboarding quiz right; returns the goal's target label (from the API's
    goal sentence) once the writing page shows."""
    quiz = load_task_definition(example_path(DEMO_TASK)).onboarding_quiz
    assert quiz is not None
    for number, question in enumerate(quiz.questions, start=1):
        page.choose(f"{number}. ", question.answer, prefix=True)
    page.click("Submit answers")
    page.wait_text("Your goal:")
    page.field("Your sentence")
    page.idle()
    return _goal_target(page)


def _write_until_fooled(page: Page, target: str, tries_allowed: int = 10) -> bool:
    """Check sentences written for ``target`` with the model until it is fooled (True) or the
    tries run out (False)."""
    for attempt in range(1, tries_allowed + 1):
        candidates = ATTEMPTS[target]
        text = candidates[(attempt - 1) % len(candidates)]
        if attempt > len(candidates):
            text = f"{text[:-1]}, really."
        base, again = text, 1
        while text in page.checked_texts:
            again += 1
            text = f"{base[:-1]}, or so I heard ({again})."
        page.checked_texts.add(text)
        page.type_into("Your sentence", text)
        page.click("Check with the model")
        checked = page.wait_text(f"Tries: {attempt} / {tries_allowed}", "each text is accepted once")
        assert checked != "each text is accepted once", f"{text!r} was refused as a repeat: {page.text()[-1500:]}"
        outcome = page.wait_text("You fooled the model!", "Not fooled yet", "You have used all")
        page.idle()
        if outcome == "You fooled the model!":
            return True
        if outcome == "You have used all":
            return False
    return False


def _golden_path(page: Page, demo: RunningDemo) -> None:
    browser = page.driver
    _deep_link_steps(page, demo)
    browser.get(demo.ui_url)
    page.field("Username")
    page.screenshot("01-login")

    # The researcher's dashboard before anyone has written.
    page.log_in("researcher", "researcher-demo-only")
    before = _dashboard(page, "02-researcher-before")
    assert _number(before["Attempts"]) == 0 and _number(before["Examples"]) == 0, before
    _session_steps(page, demo)
    page.log_out()

    # The writer: quiz, then edit the prompt until the model is fooled or the tries run out.
    page.log_in("writer", "writer-demo-only")
    page.wait_text("Before you start: a short quiz")
    page.screenshot("03-writer-quiz")
    target = _pass_the_quiz(page)
    prompt_text = page.field("Your sentence").get_attribute("value")
    assert prompt_text, "the editor starts with the prompt"
    page.screenshot("04-writer-prompt")

    fooled = _write_until_fooled(page, target)
    # Goal, prompt, edited sentence and the model's answer in one picture (the README's).
    page.scroll_to_text("Your goal", block="start")
    page.screenshot("05-writer")
    if fooled:
        page.click("Yes, I confirm that I judge this sentence to be", prefix=True)
        page.wait_text("You confirmed that you judge this sentence")
    page.click("Submit")
    page.wait_text("Submitted!")
    page.idle()
    page.screenshot("06-writer-submitted")
    _writer_answers_no(page)
    page.log_out()

    # A validator labels their batch (the writer's sentence).
    page.log_in("validator1", "validator1-demo-only")
    page.wait_text("Sentence 1 of")
    page.screenshot("07-validator-batch")
    _validator_words_steps(page)
    labelled = 0
    while page.driver.find_elements(page.by.XPATH, "//*[@role='radiogroup'][@aria-label='Label']"):
        page.choose("Label", LABEL_NAMES[target])
        page.click("Save label")
        labelled += 1

        def all_saved(expected: int = labelled) -> bool:
            return page.text().count("Saved:") >= expected

        page.until(all_saved, f"{labelled} saved label(s)")
        page.idle()
    assert labelled >= 1
    page.wait_text("Batch done. Thank you!")
    # The batch may hold the task's control items (gold items, mixed in at a set rate and shown
    # like any sentence): their labels are scored against the known answer, not counted as
    # validations of the round's examples.
    page_text = page.text()
    controls_labelled = sum(1 for text in CONTROL_LABELS if text in page_text)
    page.screenshot("08-validator-done")
    page.log_out()

    # More of the round's work arrives through the API (other writers' and validators' clients).
    api = _Api(demo.api_url)
    seeded = api.seed_round(examples=SEEDED_EXAMPLES)

    # The researcher sees the round move.
    page.log_in("researcher", "researcher-demo-only")
    after = page.until(
        lambda: (lambda m: m if _number(m["Validated"]) > 0 else None)(_dashboard(page, "09-researcher")),
        "the dashboard to count the validations",
    )
    assert _number(after["Examples"]) == 1 + SEEDED_EXAMPLES, after
    assert _number(after["Attempts"]) >= 1 + SEEDED_EXAMPLES and _number(after["Validation coverage"]) > 0, after
    page.scroll_to_text("Attempts", block="start")
    page.screenshot("10-researcher-charts")

    # The API agrees with what the pages showed.
    stats = api.get(f"/rounds/{api.round_id}/stats", "researcher")
    assert stats["examples"]["submitted"] == 1 + SEEDED_EXAMPLES, stats
    assert stats["validations"]["given"] == labelled - controls_labelled + seeded["validations"], stats
    assert stats["attempts"]["fooled"] >= (1 if fooled else 0) + seeded["fooled"], stats
    _study_link_steps(page, demo)
    _mturk_study_steps(page, demo)
    _promote_steps(page, demo)


JOB_WAIT_S = 300.0  # a train, evaluate or promote job: its own process, which loads torch first


def _metric_labels_in_full(page: Page) -> None:
    """No dashboard metric label is cut short ("Confirmation r…") at 1280x900."""
    cut = page.driver.execute_script(
        "return Array.from(document.querySelectorAll(\"[data-testid='stMetricLabel'], "
        "[data-testid='stMetricLabel'] *\")).filter(e => e.scrollWidth > e.clientWidth + 1)"
        ".map(e => e.textContent.trim());"
    )
    assert not cut, f"metric labels cut short: {cut}"


def _selectbox_text(page: Page, label: str) -> str:
    """What the select box labelled ``label`` shows: its text and its inputs' values (the chosen
    option is the value of a search input in some Streamlit versions, text in others)."""
    boxes = page.driver.find_elements(page.by.CSS_SELECTOR, "[data-testid='stSelectbox']")
    box = next(b for b in boxes if b.text.strip().splitlines()[:1] == [label])
    values = [str(i.get_attribute("value") or "") for i in box.find_elements(page.by.TAG_NAME, "input")]
    return " ".join([str(box.text), *values])


def _job_done(page: Page, success: str) -> None:
    outcome = page.wait_text(success, "Log of the failed", timeout_s=JOB_WAIT_S)
    assert outcome == success, page.text()
    page.idle()


def _promote_steps(page: Page, demo: RunningDemo) -> None:
    """The researcher (signed in) trains the next model, evaluates and promotes it on the demo's
    model server in "Models and datasets" without typing any token (the demo registered the
    server with its admin token); the model server then serves it and the page says promoted.
    The round is closed and built through the API first (training needs a built round), and the
    demo's `client` token downloads the built dataset."""
    _metric_labels_in_full(page)  # the dashboard is open
    api = _Api(demo.api_url)
    _close_round_steps(page, demo, api)
    _build_from_the_web_app_steps(page, api)

    client_token = re.search(r"^  client\s+(\S+)$", demo.output, re.MULTILINE)
    assert client_token, demo.output
    export = httpx.get(
        f"{demo.api_url}/api/v1/tasks/{DEMO_TASK}/rounds/1/dataset",
        params={"split": "all", "format": "jsonl"},
        headers={"Authorization": f"Bearer {client_token.group(1)}"},
        timeout=60,
    )
    assert export.status_code == 200 and export.text.count("\n") >= 1, export.text[:500]

    page.open_page("Models and datasets")
    page.wait_text("Train the next model")
    for label, value in (("Epochs", "1"), ("Max tokens", "16")):
        page.type_into(label, value)
    # Enter in a field of the train form does not start a job (enter_to_submit=False); the button does.
    from selenium.webdriver.common.keys import Keys

    trained_before = len(api.get(f"/tasks/{DEMO_TASK}/jobs", "researcher")["data"])
    page.field("Epochs").send_keys(Keys.ENTER)
    page.idle()
    assert len(api.get(f"/tasks/{DEMO_TASK}/jobs", "researcher")["data"]) == trained_before
    page.click("Train")
    _job_done(page, "trained and registered")
    models = api.get(f"/tasks/{DEMO_TASK}/models", "researcher")["data"]
    new = models[-1]
    assert new["status"] == "trained" and new["name"] != models[0]["name"], models
    page.until(lambda: new["name"] in _selectbox_text(page, "Model"), "the new model in the picker")
    page.wait_text("Status: trained")
    page.click("Evaluate")
    # The job's own message, not the word alone: "Status: trained, not evaluated yet" holds "evaluated".
    _job_done(page, f"evaluated {new['name']}")
    page.wait_text("Status: evaluated")
    # No field anywhere on the page asks for a token or a URL.
    fields = page.driver.find_elements(page.by.CSS_SELECTOR, "input[type='text'], input[type='password'], textarea")
    labels = [str(f.get_attribute("aria-label") or "") for f in fields]
    assert not [label for label in labels if "token" in label.lower() or "url" in label.lower()], labels
    page.scroll_to_text("Promote it to")
    page.screenshot("11-researcher-evaluated")
    page.click("Promote")
    # A one-epoch model on a dozen examples may score below the promoted Model 0 or near chance:
    # the page then shows both scores and asks (409 confirm_worse); the researcher promotes anyway.
    asked = page.wait_text("now serves it", "Promote anyway", "Log of the failed", timeout_s=JOB_WAIT_S)
    if asked == "Promote anyway":
        page.click("Promote anyway", prefix=True)
    _job_done(page, "now serves it")
    page.wait_text("Status: promoted, served by the model server at")
    picker = _selectbox_text(page, "Model")
    assert new["name"] in picker and "(evaluated)" not in picker + page.text(), picker
    page.scroll_to_text("Status: promoted")
    page.screenshot("12-researcher-promoted")

    info = httpx.get(f"{demo.model_url}/info", timeout=30).json()
    promoted = next(m for m in api.get(f"/tasks/{DEMO_TASK}/models", "researcher")["data"] if m["id"] == new["id"])
    assert promoted["status"] == "promoted", promoted
    assert (info["model_id"], info["version"]) == (promoted["model_id"], promoted["version"]), info
    # The model server's admin token never reaches the researcher: not in the page, not in the API's answers.
    admin_token = re.search(r"model server admin token .*: (\S+)$", demo.output, re.MULTILINE)
    assert admin_token, demo.output
    jobs = api.get(f"/tasks/{DEMO_TASK}/jobs", "researcher")["data"]
    answers = [api.http.get("/model-servers", headers=api.headers("researcher")).text, page.text()]
    answers += [api.http.get(f"/jobs/{job['id']}", headers=api.headers("researcher")).text for job in jobs]
    assert not [answer for answer in answers if admin_token.group(1) in answer]


def _close_round_steps(page: Page, demo: RunningDemo, api: _Api) -> None:
    """Issue #28, item 2: closing the round asks first and counts its open study links; it
    closes them, and a worker who opens one afterwards is refused (409, no session)."""
    links = api.get(f"/tasks/{DEMO_TASK}/study-links", "researcher")["data"]
    open_links = [link for link in links if link["round_id"] == api.round_id and link["is_open"]]
    assert open_links, links  # the demo's writer and validator links, and the ones made above
    counted = api.get(f"/rounds/{api.round_id}", "researcher")["open_study_links"]
    assert counted == len(open_links), (counted, open_links)
    page.open_page("Tasks and rounds")
    page.click("Stop collecting: validation only")
    page.wait_text("Round 1 is now validating")
    page.idle()
    page.click("Close the round")
    page.wait_text(f"Its {len(open_links)} open study links will be closed with it")
    assert api.get(f"/rounds/{api.round_id}", "researcher")["status"] == "validating"  # nothing closed yet
    page.screenshot("10c-researcher-close-asks-first")
    page.click("Yes, close round 1")
    page.wait_text(f"Round 1 is now closed; {len(open_links)} of its study links were closed with it")
    page.idle()
    assert api.get(f"/rounds/{api.round_id}", "researcher")["status"] == "closed"
    links = api.get(f"/tasks/{DEMO_TASK}/study-links", "researcher")["data"]
    assert not [link for link in links if link["round_id"] == api.round_id and link["is_open"]], links
    late = httpx.get(
        f"{demo.ui_url}{open_links[0]['path']}",
        params={"PROLIFIC_PID": "5f1a2b3c4d5e6f7a8b9c0d99", "STUDY_ID": "60aa11bb22cc33dd44ee55ff", "worker": "late-1"},
        follow_redirects=False,
        timeout=30,
    )
    assert late.status_code == 409 and "dynaloop_session" not in late.cookies, (late.status_code, late.text[:300])


def _build_from_the_web_app_steps(page: Page, api: _Api) -> None:
    """Issue #28, item 1: the closed round (13 examples) is too small for the strict policy; the
    refusal on "Models and datasets" offers the options that build, with their counts (the same
    the API previews), and the round is built with the first one from the page."""
    page.open_page("Models and datasets")
    page.wait_text("Build a round")
    page.click("Build round 1")
    page.wait_text("Options that build this round")
    page.idle()
    preview = api.post(f"/rounds/{api.round_id}/build/preview", "researcher", {"seed": 0})
    options = [option for option in preview["relaxations"] if option["feasible"]]
    assert options, preview
    first = options[0]
    assert first["name"] in page.text(), (first["name"], page.text()[-2000:])
    page.screenshot("10d-researcher-build-options")
    page.click(f"Build round 1: {first['name']}")
    page.wait_text("Built round 1 (build")
    page.idle()
    built = api.get(f"/tasks/{DEMO_TASK}/rounds", "researcher")["data"]
    assert [(r["number"], r["status"]) for r in built] == [(1, "built")], built
    counts = {split: first["counts"][split] for split in ("train", "dev", "test")}
    flash = re.search(r"train ([\d,]+), dev ([\d,]+), test ([\d,]+)", page.text())
    assert flash, page.text()[-2000:]
    assert {"train": int(flash[1]), "dev": int(flash[2]), "test": int(flash[3])} == counts, (flash[0], first)


# --- one vocabulary (issue #18, point 3) ------------------------------------------------------

LABEL_NAMES = load_task_definition(example_path(DEMO_TASK)).display_names  # label -> what people see
LABELS_BY_NAME = {name: label for label, name in LABEL_NAMES.items()}


def _goal_target(page: Page) -> str:
    """The label of the writer's goal, read from the goal sentence the page shows (display names)."""
    goal = re.search(r"Your goal: Write a sentence a person would label (.+?) that fools", page.text())
    assert goal and goal.group(1) in LABELS_BY_NAME, page.text()
    return LABELS_BY_NAME[goal.group(1)]


def _writer_answers_no(page: Page) -> None:
    """On a next prompt, the writer fools the model and answers "No, I judge it otherwise": the page
    then shows the writer's judgement, not the green "You fooled the model!" banner. Nothing is
    submitted (the round's counts below stay as they were); the assignment stays open."""
    tries_allowed = load_task_definition(example_path(DEMO_TASK)).tries_per_assignment
    for _prompt in range(3):  # a prompt whose tries all fail to fool the model is switched
        page.wait_text("Your goal:")
        page.field("Your sentence")
        page.idle()
        if _prompt == 0:
            _writer_page_above_the_fold(page)
        target = _goal_target(page)
        outcome = ""
        for attempt in range(1, tries_allowed + 1):
            candidates = ATTEMPTS[target]
            text = candidates[(attempt - 1) % len(candidates)]
            page.type_into("Your sentence", text if attempt <= len(candidates) else f"{text[:-1]}, truly.")
            page.click("Check with the model")
            page.wait_text(f"Tries: {attempt} / {tries_allowed}")
            outcome = page.wait_text("You fooled the model!", "Not fooled yet", "You have used all")
            page.idle()
            if outcome != "Not fooled yet":
                break
        if outcome == "You fooled the model!":
            break
        page.click("Switch to next prompt")
        page.wait_text("Switched to the next prompt.")
    else:
        raise AssertionError("Model 0 was not fooled on three prompts; the 'No' confirmation was not reached")
    others = [label for label in ("positive", "negative", "neutral") if label != target]
    no_button = f"No, I judge this sentence to be {' or '.join(LABEL_NAMES[label] for label in others)}."
    yes_button = f"Yes, I confirm that I judge this sentence to be {LABEL_NAMES[target]}."
    assert page.button(yes_button) and page.button(no_button)  # the buttons speak in display names
    page.click(no_button)
    judgement = page.wait_text("You judged this sentence")
    page.idle()
    assert judgement and "You fooled the model!" not in page.text(), page.text()
    assert f"You judged this sentence not {LABEL_NAMES[target]}." in page.text(), page.text()
    assert "did not fool the model" in page.text()
    page.scroll_to_text("You judged this sentence")
    page.screenshot("06b-writer-answered-no")


def _writer_page_above_the_fold(page: Page) -> None:
    """Scrolled to the top, a laptop's window (1280x900) shows one heading, the goal, the prompt,
    the editor and the Check button; the instructions come below them."""
    page.driver.execute_script(
        "for (const e of document.querySelectorAll('*')) { if (e.scrollTop) e.scrollTop = 0; } window.scrollTo(0, 0);"
    )
    time.sleep(0.3)
    bottom = page.driver.execute_script("return window.innerHeight;")
    xpaths = {
        "the goal": "//p[starts-with(normalize-space(), 'Your goal:')]",
        "the prompt": "//p[starts-with(normalize-space(), 'Inspirational prompt')]",
        "the editor": "//textarea[@aria-label='Your sentence']",
        "the Check button": "//button[normalize-space()='Check with the model']",
    }
    for what, xpath in xpaths.items():
        elements = page.driver.find_elements(page.by.XPATH, xpath)
        assert elements, f"{what} is not on the page"
        rect = page.driver.execute_script(
            "const r = arguments[0].getBoundingClientRect(); return [r.top, r.bottom];", elements[-1]
        )
        assert rect[0] >= 0 and rect[1] <= bottom, f"{what} is not above the fold: {rect} of {bottom}"
    headings = [e.text for e in page.driver.find_elements(page.by.CSS_SELECTOR, "h1, h2, h3") if e.is_displayed()]
    assert headings.count("Write") == 1 and "Find examples that fool the model" not in headings, headings
    page.screenshot("05b-writer-top")


def _validator_words_steps(page: Page) -> None:
    """The validator's radio options and instructions use the same words (the task's display
    names) and the instructions give the size of the batch actually served."""
    served = re.search(r"Sentence 1 of (\d+)", page.text())
    assert served, page.text()
    size = int(served.group(1))
    definition = load_task_definition(example_path(DEMO_TASK))
    names = [LABEL_NAMES[label] for label in definition.effective_validation_labels]
    options = [
        element.text.strip()
        for element in page.driver.find_elements(
            page.by.XPATH, "(//*[@role='radiogroup'][@aria-label='Label'])[1]//label[@data-testid='stRadioOption']"
        )
    ]
    assert options == names, options
    words = page.text()
    sentences = "sentence" if size == 1 else "sentences"
    assert f"This batch has {size} {sentences} written by other people." in words, words
    assert f"choose one label: {', '.join(names[:-1])} or {names[-1]}, then press Save label." in words, words
    if size != definition.validation_batch_size:
        assert f"{definition.validation_batch_size} sentences" not in words


# Each role's first page (frontend/app.py) and a user who has that role.
FIRST_PAGES = [
    ("write", "Write", "writer"),
    ("validate", "Validate", "validator1"),
    ("rounds", "Tasks and rounds", "researcher"),
]


def _no_page_not_found(page: Page, url_path: str, title: str) -> None:
    """The page at ``/url_path`` shows its own title and no "Page not found" dialog (Streamlit's
    answer to an address its navigation does not serve, shown over its default page)."""
    page.until(
        lambda: page.driver.current_url.split("?")[0].rstrip("/").endswith(f"/{url_path}"), f"the address /{url_path}"
    )
    page.until(
        lambda: title in [h.text for h in page.driver.find_elements(page.by.TAG_NAME, "h1")], f"the title {title!r}"
    )
    page.idle()
    time.sleep(1.0)  # the dialog comes after the page has run
    dialogs = [d.text for d in page.driver.find_elements(page.by.CSS_SELECTOR, "[role='dialog']") if d.is_displayed()]
    assert "Page not found" not in page.text() and not dialogs, (url_path, dialogs)


def _deep_link_steps(page: Page, demo: RunningDemo) -> None:
    """Issue #28, point 5, first thing in the web app's process (whose first Streamlit session
    once ran in old-style `pages/` mode): a deep link to each role's first page, signed out,
    leads through ``/login?next=`` to that page, and opened again signed in it shows the page,
    never a "Page not found" dialog over it."""
    browser = page.driver
    for url_path, title, username in FIRST_PAGES:
        browser.get(f"{demo.ui_url}/{url_path}")
        page.field("Username")
        assert f"/login?next=/{url_path}" in browser.current_url, browser.current_url
        page.log_in(username, f"{username}-demo-only")
        _no_page_not_found(page, url_path, title)
        browser.get(f"{demo.ui_url}/{url_path}")
        page.wait_text(f"Signed in as {username}")
        _no_page_not_found(page, url_path, title)
        browser.get(f"{demo.ui_url}/")  # the start page moves on to the first page
        page.wait_text(f"Signed in as {username}")
        _no_page_not_found(page, url_path, title)
        page.log_out()


def _session_steps(page: Page, demo: RunningDemo) -> None:
    """Issue #18, point 2, with the researcher signed in: a reload and a deep link keep the
    session (an httpOnly cookie that the page's scripts cannot read); a page of another role
    says so; logging out revokes the login's token; a signed-out deep link leads through the
    login page back to that page."""
    browser = page.driver
    cookie = browser.get_cookie("dynaloop_session")
    assert cookie is not None and cookie["httpOnly"] and cookie.get("sameSite") == "Lax", cookie
    assert browser.execute_script("return document.cookie").find("dynaloop_session") == -1

    browser.refresh()
    page.wait_text("Signed in as researcher")
    page.idle()
    browser.get(f"{demo.ui_url}/dashboard")
    page.wait_text("Validation coverage")
    page.wait_text("Signed in as researcher")
    page.idle()
    page.screenshot("02a-deep-link-dashboard")

    browser.get(f"{demo.ui_url}/write")
    page.wait_text("needs the writer role")
    page.screenshot("02b-page-of-another-role")

    browser.get(f"{demo.ui_url}/dashboard")
    page.wait_text("Signed in as researcher")
    page.idle()
    page.log_out()
    assert browser.get_cookie("dynaloop_session") is None
    token = cookie["value"].split(".", 1)[1]
    me = httpx.get(f"{demo.api_url}/api/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert me.status_code == 401, me.text  # logging out revoked the login's token

    browser.get(f"{demo.ui_url}/dashboard")
    page.field("Username")
    assert "/login?next=/dashboard" in browser.current_url, browser.current_url
    page.log_in("researcher", "researcher-demo-only")
    page.wait_text("Validation coverage")
    assert browser.current_url.rstrip("/").endswith("/dashboard"), browser.current_url


def _study_link_steps(page: Page, demo: RunningDemo) -> None:
    """Issue #13: a new worker opens a Prolific-style study link (made by the researcher through
    the API), is signed in without a password, passes the quiz, writes to the quota (one example)
    and is sent to Prolific's completion page (no internet here: the 303's Location and the
    address the browser goes to are checked, not the page it would load). Ends with the
    researcher signed in again."""
    api = _Api(demo.api_url)
    body = {
        "name": "browser",
        "round_id": api.round_id,
        "role": "writer",
        "platform": "prolific",
        "quota": 1,
        "max_workers": 10,
    }
    link = api.post(f"/tasks/{DEMO_TASK}/study-links", "researcher", {**body, "completion_code": "BROWSER1"})
    completion = "https://app.prolific.com/submissions/complete?cc=BROWSER1"
    browser = page.driver
    ids = "PROLIFIC_PID=5f1a2b3c4d5e6f7a8b9c0d1e&STUDY_ID=60aa11bb22cc33dd44ee55ff&SESSION_ID=6123456789abcdef01234567"
    browser.get(f"{demo.ui_url}{link['path']}?{ids}")
    page.wait_text("Before you start: a short quiz")
    page.wait_text("0 of 1 examples for this study")
    target = _pass_the_quiz(page)
    if _write_until_fooled(page, target):
        page.click("Yes, I confirm that I judge this sentence to be", prefix=True)
        page.wait_text("You confirmed that you judge this sentence")
    page.idle()
    page.click("Submit")
    page.wait_text("Submitted!")
    page.wait_text("1 of 1 examples for this study")
    page.wait_text("reached this study's quota")
    page.idle()
    page.screenshot("10a-study-quota-met")
    cookie = browser.get_cookie("dynaloop_session")
    assert cookie is not None and cookie["httpOnly"], cookie
    finish = httpx.get(
        f"{demo.ui_url}/study/finish", cookies={"dynaloop_session": cookie["value"]}, follow_redirects=False, timeout=30
    )
    assert finish.status_code == 303 and finish.headers["location"] == completion, (finish.status_code, finish.text)
    browser.find_element(page.by.LINK_TEXT, "Finish and get your completion code").click()
    page.until(lambda: browser.current_url.startswith(completion), f"the browser to go to {completion}")
    browser.get(demo.ui_url)
    page.wait_text("Signed in as prolific-")
    page.idle()
    page.log_out()
    page.log_in("researcher", "researcher-demo-only")


def _mturk_study_steps(page: Page, demo: RunningDemo) -> None:
    """Issue #13: an MTurk-style link, previewed (read-only, no session), then accepted; the
    worker stops early and gets the form that posts back to MTurk's sandbox (not submitted: no
    internet here). Ends with the researcher signed in again."""
    api = _Api(demo.api_url)
    body = {
        "name": "browser mturk",
        "round_id": api.round_id,
        "role": "writer",
        "platform": "mturk",
        "quota": 2,
        "max_workers": 10,
    }
    link = api.post(f"/tasks/{DEMO_TASK}/study-links", "researcher", {**body, "completion_code": "TURK0001"})
    browser = page.driver
    url = f"{demo.ui_url}{link['path']}?hitId=3HITHITHIT0001ABCDEFGHIJKLMNOP&assignmentId="
    browser.get(f"{url}ASSIGNMENT_ID_NOT_AVAILABLE")
    page.wait_text("Accept the HIT to start")
    assert not browser.find_elements(page.by.TAG_NAME, "form")
    page.screenshot("10b-mturk-preview")
    browser.get(
        f"{url}3ASSIGN00000000000000000000001&workerId=A1B2C3D4E5F6G7&turkSubmitTo=https://workersandbox.mturk.com"
    )
    page.wait_text("0 of 2 examples for this study")
    page.idle()
    browser.find_element(page.by.LINK_TEXT, "Finish and get your completion code").click()
    page.wait_text("You have not reached the quota yet")
    page.click("Stop now")
    page.wait_text("Submit the HIT to Mechanical Turk")
    form = browser.find_element(page.by.TAG_NAME, "form")
    assert form.get_attribute("action") == "https://workersandbox.mturk.com/mturk/externalSubmit"
    fields = {e.get_attribute("name"): e.get_attribute("value") for e in form.find_elements(page.by.TAG_NAME, "input")}
    # A stop is not a completion: the form posts the status back, never the completion code.
    assert fields == {"assignmentId": "3ASSIGN00000000000000000000001", "completion_code": "stopped"}, fields
    page.screenshot("10c-mturk-submit")
    browser.get(demo.ui_url)
    page.wait_text("Signed in as mturk-")
    page.idle()
    page.log_out()
    page.log_in("researcher", "researcher-demo-only")


SEEDED_EXAMPLES = 12


class _Api:
    """The demo's API as the demo users (password login)."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.Client(base_url=f"{base_url}/api/v1", timeout=60)
        self.tokens: dict[str, str] = {}
        self.round_id = self.get("/rounds/open", "researcher")["data"][0]["id"]

    def headers(self, username: str) -> dict[str, str]:
        if username not in self.tokens:
            answer = self.http.post("/auth/login", json={"username": username, "password": f"{username}-demo-only"})
            assert answer.status_code == 200, answer.text
            self.tokens[username] = answer.json()["token"]
        return {"Authorization": f"Bearer {self.tokens[username]}"}

    def get(self, path: str, username: str) -> Any:
        answer = self.http.get(path, headers=self.headers(username))
        assert answer.status_code == 200, answer.text
        return answer.json()

    def post(self, path: str, username: str, body: dict[str, Any]) -> Any:
        answer = self.http.post(path, headers=self.headers(username), json=body)
        assert answer.status_code in (200, 201), f"{path}: {answer.text}"
        return answer.json()

    def new_assignment(self, username: str) -> Any:
        """A new assignment for the writer; an attention check that is due first (the demo task
        has them, every few assignments) is answered as a careful writer would."""
        for _ in range(3):
            answer = self.http.post(f"/rounds/{self.round_id}/assignments", headers=self.headers(username), json={})
            if answer.status_code in (200, 201):
                return answer.json()
            assert answer.status_code == 409, answer.text
            assert answer.json()["error"]["code"] == "attention_check_pending", answer.text
            for check in self.get("/attention-checks/pending", username)["data"]:
                self.post(
                    f"/attention-checks/{check['id']}/answer",
                    username,
                    {"answer": ATTENTION_ANSWERS[check["question"]]},
                )
        raise AssertionError("no assignment after answering the attention checks")

    def seed_round(self, examples: int) -> dict[str, int]:
        """``examples`` more examples by the writer (two tries each at most, a fooling one
        confirmed), each labelled by all five validators, mostly as the writer's target."""
        fooled = validations = 0
        for index in range(examples):
            assignment = self.new_assignment("writer")
            target = assignment["target_label"][0]
            for attempt_number in range(2):
                text = ATTEMPTS[target][(index + attempt_number) % len(ATTEMPTS[target])]
                attempt = self.post(
                    f"/assignments/{assignment['id']}/attempts", "writer", {"text": f"{text[:-1]} (visit {index + 1})."}
                )
                if attempt["fooled"]:
                    fooled += 1
                    self.post(f"/attempts/{attempt['id']}/confirmation", "writer", {"agrees": True})
                    break
            example = self.post(f"/assignments/{assignment['id']}/example", "writer", {"attempt_id": attempt["id"]})
            for validator in range(1, 6):
                # Every fourth label disagrees, so agreement is high but not perfect. Labels go to
                # the items of the validator's batch: this example, the task's control items
                # (answered right, from the shipped YAML), which look just like it, and any
                # example the validator has not labelled yet (the one written in the browser,
                # labelled neutral); each label of an example is counted.
                label = target if (example["id"] + validator) % 4 else "mixed"
                name = f"validator{validator}"
                batch = self.get(f"/rounds/{example['round_id']}/validation-batch", name)
                for item in batch["data"]:
                    if item["text"] in CONTROL_LABELS:
                        answer = CONTROL_LABELS[item["text"]]
                    else:
                        answer = label if item["text"] == example["text"] else "neutral"
                        validations += 1
                    self.post(f"/validation-items/{item['item_id']}/validations", name, {"label": answer})
        return {"fooled": fooled, "validations": validations}


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception), ("false", pytest.skip.Exception)]
)
def test_a_missing_browser_skips_except_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setattr(demo_process, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="chromium-driver"):
        _require_browser()
