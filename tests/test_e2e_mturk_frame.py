"""Mechanical Turk inside its frame, in a real browser: MTurk shows an ExternalQuestion (our study
link) in an iframe on its worker site, another site than ours.

A fake MTurk worker site runs on ``http://localhost:PORT`` (a real HTTP server in this process);
the demo's web app runs on ``http://127.0.0.1:PORT``: a different site, so the frame is
cross-site as on MTurk. The demo is told that the fake site is MTurk's
(``DYNALOOP_MTURK_FRAME_ANCESTORS`` and ``DYNALOOP_MTURK_SUBMIT_ORIGINS``). Inside the fake
site's iframe a worker previews the HIT, accepts it, passes the quiz, writes to the quota and
submits the HIT, whose form posts to the fake site's ``/mturk/externalSubmit``, where the test
reads the assignment id and the completion code. The login page and the app's start page (not
an MTurk session's) refuse to load in the same frame.

Only a fake MTurk page is used: nothing here reaches MTurk (docs/crowdsourcing.md says what was
never run against the real site). Reuses tests/test_e2e_browser.py's Chromium, page helpers and
API client; skipped without Chromium except under CI (``CI=true``), where it fails.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from dynaloop.demo import DEMO_TASK
from tests.conftest import free_port
from tests.demo_process import RunningDemo, running_demo, tiny_model_cache
from tests.stub_model_server import ThreadedServer
from tests.test_e2e_browser import (  # noqa: F401 (browser: the shared Chromium fixture)
    Page,
    _Api,
    _pass_the_quiz,
    _require_browser,
    _write_until_fooled,
    browser,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration]

HIT_ID = "3HITFRAME000000000000000000001"
ASSIGNMENT_ID = "3ASSIGNFRAME000000000000000001"
WORKER_ID = "A1FRAMEWORKER01"
FRAME_ID = "hit-frame"


class FakeMTurk:
    """MTurk's worker site as the test needs it: a HIT page that frames an ExternalQuestion
    address (``/hit?src=...``), and ``/mturk/externalSubmit``, which records what it is posted."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.origin = f"http://localhost:{port}"
        self.submitted: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadedServer(
            Starlette(
                routes=[
                    Route("/hit", self.hit, methods=["GET"]),
                    Route("/mturk/externalSubmit", self.external_submit, methods=["POST"]),
                ]
            ),
            port,
        )

    def hit_url(self, src: str) -> str:
        return f"{self.origin}/hit?{urlencode({'src': src})}"

    async def hit(self, request: Request) -> HTMLResponse:
        src = html.escape(request.query_params.get("src", ""))
        return HTMLResponse(
            "<!doctype html><html><head><title>Fake MTurk worker site</title></head><body>"
            "<p id='mturk-banner'>Fake Mechanical Turk: HIT</p>"
            # data-loaded: the frame's load event, which fires for the browser's error page too.
            f"<iframe id='{FRAME_ID}' src='{src}' onload=\"this.dataset.loaded='1'\" "
            "style='width:100%;height:820px;border:1px solid #999'></iframe>"
            "</body></html>"
        )

    async def external_submit(self, request: Request) -> Response:
        form = await request.form()
        with self.lock:
            self.submitted.append({name: str(value) for name, value in form.items()})
        return HTMLResponse("<!doctype html><p id='submitted'>Fake MTurk: the HIT was submitted.</p>")


@pytest.fixture
def fake_mturk() -> Iterator[FakeMTurk]:
    fake = FakeMTurk(free_port())
    fake.server.start()
    yield fake
    fake.server.stop()


@pytest.fixture
def framed_demo(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, fake_mturk: FakeMTurk
) -> Iterator[RunningDemo]:
    """The demo (with the browser test's tiny Model 0), told that the fake site is MTurk's."""
    _require_browser()
    cache = tiny_model_cache(tmp_path_factory.getbasetemp() / "demo-model-cache")
    env = {"DYNALOOP_MTURK_FRAME_ANCESTORS": fake_mturk.origin, "DYNALOOP_MTURK_SUBMIT_ORIGINS": fake_mturk.origin}
    with running_demo(tmp_path / "data", model_cache=cache, ui=True, env=env) as running:
        assert "web app" in running.service_pids(), running.output
        yield running


def _open_in_frame(page: Page, fake: FakeMTurk, src: str) -> None:
    """Load the fake HIT page around ``src`` and switch the driver into its frame."""
    driver = page.driver
    driver.switch_to.default_content()
    driver.get(fake.hit_url(src))
    frame = page.until(lambda: driver.find_element(page.by.ID, FRAME_ID), "the HIT's frame")
    driver.switch_to.frame(frame)


def _frame_refused(page: Page, fake: FakeMTurk, src: str) -> None:
    """``src`` does not load inside the fake MTurk page's frame: the browser shows its own error
    page there, not ours (no element of the app)."""
    driver = page.driver
    _open_in_frame(page, fake, src)
    driver.switch_to.default_content()
    # The frame has loaded: the browser's error page (chrome-error://) instead of the app's.
    page.until(
        lambda: driver.find_element(page.by.ID, FRAME_ID).get_attribute("data-loaded") == "1",
        f"the frame of {src} to load",
    )
    driver.switch_to.frame(driver.find_element(page.by.ID, FRAME_ID))
    text = page.text()
    assert not driver.find_elements(page.by.CSS_SELECTOR, "input#username, [data-testid='stApp']"), text
    assert "dynaloop" not in text, text
    driver.switch_to.default_content()
    page.screenshot(f"mturk-frame-0-refused{urlsplit(src).path.replace('/', '-')}")


def test_an_mturk_worker_previews_accepts_works_and_submits_inside_mturks_frame(
    browser: Any,  # noqa: F811 (the fixture imported above)
    framed_demo: RunningDemo,
    fake_mturk: FakeMTurk,
) -> None:
    page = Page(browser, framed_demo.ui_url)
    try:
        _mturk_in_its_frame(page, framed_demo, fake_mturk)
    except BaseException:
        browser.switch_to.default_content()
        page.screenshot("mturk-frame-failure")
        raise


def _mturk_in_its_frame(page: Page, demo: RunningDemo, fake: FakeMTurk) -> None:
    driver = page.driver
    api = _Api(demo.api_url)
    link = api.post(
        f"/tasks/{DEMO_TASK}/study-links",
        "researcher",
        {
            "name": "framed mturk",
            "round_id": api.round_id,
            "role": "writer",
            "platform": "mturk",
            "quota": 1,
            "max_workers": 5,
            "completion_code": "FRAMED01",
        },
    )
    study_url = f"{demo.ui_url}{link['path']}"

    # Pages that are not an MTurk session's refuse the frame, even MTurk's.
    _frame_refused(page, fake, f"{demo.ui_url}/login")
    _frame_refused(page, fake, f"{demo.ui_url}/")

    # The preview: the task, read-only, inside the frame.
    _open_in_frame(
        page, fake, f"{study_url}?{urlencode({'assignmentId': 'ASSIGNMENT_ID_NOT_AVAILABLE', 'hitId': HIT_ID})}"
    )
    page.wait_text("Accept the HIT to start")
    assert not driver.find_elements(page.by.TAG_NAME, "form")
    driver.switch_to.default_content()
    page.screenshot("mturk-frame-1-preview")

    # Accepted: MTurk opens the same address with the assignment, the worker and where to submit.
    accepted = {
        "assignmentId": ASSIGNMENT_ID,
        "hitId": HIT_ID,
        "workerId": WORKER_ID,
        "turkSubmitTo": fake.origin,
    }
    _open_in_frame(page, fake, f"{study_url}?{urlencode(accepted)}")
    page.wait_text("Before you start: a short quiz")
    page.wait_text("0 of 1 examples for this study")
    # The study session's cookie, as the browser keeps it: partitioned under the fake MTurk site.
    cookies = driver.execute_cdp_cmd("Network.getAllCookies", {})["cookies"]
    session_cookie = next(c for c in cookies if c["name"] == "dynaloop_session" and c["value"].startswith("mturk."))
    assert session_cookie["httpOnly"] and session_cookie["secure"] and session_cookie["sameSite"] == "None"
    partition = session_cookie.get("partitionKey")
    assert partition, session_cookie
    assert "localhost" in str(partition), session_cookie

    target = _pass_the_quiz(page)
    if _write_until_fooled(page, target):
        page.click("Yes, I confirm that I judge this sentence to be", prefix=True)
        page.wait_text("You confirmed that you judge this sentence")
    page.idle()
    page.click("Submit")
    page.wait_text("Submitted!")
    page.wait_text("1 of 1 examples for this study")
    page.idle()
    driver.switch_to.default_content()
    page.screenshot("mturk-frame-2-quota-met")
    driver.switch_to.frame(driver.find_element(page.by.ID, FRAME_ID))

    # To the completion, still inside the frame: the Finish page, then the form that posts to MTurk.
    driver.find_element(page.by.LINK_TEXT, "Finish and get your completion code").click()
    page.wait_text("Submit the HIT", "Finish and get your completion code")
    if not driver.find_elements(page.by.XPATH, "//button[normalize-space()='Submit the HIT']"):
        page.click("Finish and get your completion code")
    page.wait_text("Submit the HIT to Mechanical Turk")
    form = driver.find_element(page.by.TAG_NAME, "form")
    assert form.get_attribute("action") == f"{fake.origin}/mturk/externalSubmit"
    driver.switch_to.default_content()
    page.screenshot("mturk-frame-3-submit")
    driver.switch_to.frame(driver.find_element(page.by.ID, FRAME_ID))
    page.click("Submit the HIT")
    # The post takes the frame to the fake MTurk site (another site: Chromium moves the frame to
    # another process, and the driver must find it again).
    driver.switch_to.default_content()
    page.until(lambda: fake.submitted, "the HIT's post to reach the fake MTurk site")
    assert fake.submitted == [{"assignmentId": ASSIGNMENT_ID, "completion_code": "FRAMED01"}], fake.submitted
    driver.switch_to.frame(driver.find_element(page.by.ID, FRAME_ID))
    page.wait_text("Fake MTurk: the HIT was submitted.")
    driver.switch_to.default_content()
    page.screenshot("mturk-frame-4-submitted")

    sessions = api.get(f"/study-links/{link['id']}/sessions", "researcher")
    assert sessions["count"] == 1 and sessions["data"][0]["status"] == "completed", sessions
