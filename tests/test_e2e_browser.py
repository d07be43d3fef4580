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
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from dynaloop.demo import DEMO_TASK
from dynaloop.processes import log_tail
from services.taskdef import example_path, load_task_definition
from tests.demo_process import ROOT, RunningDemo, running_demo, tiny_model_cache

pytestmark = [pytest.mark.browser, pytest.mark.integration]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
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
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.is_file()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install -e '.[test]')")
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
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WIDTH},{HEIGHT}",
        "--disable-extensions",
        "--no-first-run",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    # The viewport itself 1280x900 (the window size includes the browser's own frame).
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
    )
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


def _golden_path(page: Page, demo: RunningDemo) -> None:
    browser = page.driver
    browser.get(demo.ui_url)
    page.field("Username")
    page.screenshot("01-login")

    # The researcher's dashboard before anyone has written.
    page.log_in("researcher", "researcher-demo-only")
    before = _dashboard(page, "02-researcher-before")
    assert _number(before["Attempts"]) == 0 and _number(before["Examples"]) == 0, before
    page.log_out()

    # The writer: quiz, then edit the prompt until the model is fooled or the tries run out.
    page.log_in("writer", "writer-demo-only")
    page.wait_text("Before you start: a short quiz")
    page.screenshot("03-writer-quiz")
    quiz = load_task_definition(example_path(DEMO_TASK)).onboarding_quiz
    assert quiz is not None
    for number, question in enumerate(quiz.questions, start=1):
        page.choose(f"{number}. ", question.answer, prefix=True)
    page.click("Submit answers")
    page.wait_text("Your goal:")
    page.field("Your sentence")
    page.idle()
    goal = re.search(r"Your goal: Write a (\w+) sentence", page.text())  # the API's goal sentence
    assert goal, page.text()
    target = goal.group(1)
    prompt_text = page.field("Your sentence").get_attribute("value")
    assert prompt_text, "the editor starts with the prompt"
    page.screenshot("04-writer-prompt")

    fooled = False
    tries_allowed = 10
    for attempt in range(1, tries_allowed + 1):
        candidates = ATTEMPTS[target]
        text = candidates[(attempt - 1) % len(candidates)]
        if attempt > len(candidates):
            text = f"{text[:-1]}, really."
        page.type_into("Your sentence", text)
        page.click("Check with the model")
        page.wait_text(f"Tries: {attempt} / {tries_allowed}")
        outcome = page.wait_text("You fooled the model!", "Not fooled yet", "You have used all")
        page.idle()
        if outcome == "You fooled the model!":
            fooled = True
            break
        if outcome == "You have used all":
            break
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
    page.log_out()

    # A validator labels their batch (the writer's sentence).
    page.log_in("validator1", "validator1-demo-only")
    page.wait_text("Sentence 1 of")
    page.screenshot("07-validator-batch")
    labelled = 0
    while page.driver.find_elements(page.by.XPATH, "//*[@role='radiogroup'][@aria-label='Label']"):
        page.choose("Label", target)
        page.click("Save label")
        labelled += 1

        def all_saved(expected: int = labelled) -> bool:
            return page.text().count("Saved:") >= expected

        page.until(all_saved, f"{labelled} saved label(s)")
        page.idle()
    assert labelled >= 1
    page.wait_text("Batch done. Thank you!")
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
    assert stats["validations"]["given"] == labelled + seeded["validations"], stats
    assert stats["attempts"]["fooled"] >= (1 if fooled else 0) + seeded["fooled"], stats


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

    def seed_round(self, examples: int) -> dict[str, int]:
        """``examples`` more examples by the writer (two tries each at most, a fooling one
        confirmed), each labelled by all five validators, mostly as the writer's target."""
        fooled = validations = 0
        for index in range(examples):
            assignment = self.post(f"/rounds/{self.round_id}/assignments", "writer", {})
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
                # Every fourth label disagrees, so agreement is high but not perfect.
                label = target if (example["id"] + validator) % 4 else "mixed"
                self.post(f"/examples/{example['id']}/validations", f"validator{validator}", {"label": label})
                validations += 1
        return {"fooled": fooled, "validations": validations}


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception), ("false", pytest.skip.Exception)]
)
def test_a_missing_browser_skips_except_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="chromium-driver"):
        _require_browser()
