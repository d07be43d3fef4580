"""Uploads in the web app are no larger than the API takes (issue #28, point 6): the limit is the
API's ``$DYNALOOP_MAX_REQUEST_BYTES`` (frontend/uploads.py), Streamlit's uploader is set to it
(``server.maxUploadSize`` by frontend/server.py, ``max_upload_size`` per uploader) and says it,
and a larger pasted text is refused on the page without a request. The pages run in AppTest
against the real API (tests/frontend_live.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select
from streamlit.testing.v1 import AppTest

from frontend import uploads
from services.db.models import Prompt, Task
from tests.frontend_live import LiveApi, PageClient, texts

ROOT = Path(__file__).resolve().parents[1]
ROUNDS_PAGE = ROOT / "frontend" / "app_pages" / "researcher_rounds.py"
TASK = "dynasent-r2"


def rounds_page(client: PageClient) -> AppTest:
    at = AppTest.from_file(str(ROUNDS_PAGE), default_timeout=60)
    at.session_state["client"] = client
    at.session_state["token"] = client.token
    at.session_state["user"] = {"username": "rita", "roles": ["researcher"]}
    at.session_state["roles"] = ["researcher"]
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def uploaders(at: AppTest) -> dict[str, int]:
    """Each file uploader's label and the most megabytes (MiB) the browser lets it send."""
    return {element.proto.label: element.proto.max_upload_size_mb for element in at.get("file_uploader")}


def test_the_limit_is_the_apis_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(uploads.MAX_REQUEST_BYTES_ENV, raising=False)
    assert uploads.max_upload_bytes() == 5 * 1024 * 1024 and uploads.max_upload_mb() == 5
    assert uploads.limit_text() == "5 MiB"
    for value, expected, mb, text in [
        ("1572864", 1572864, 1, "1.5 MiB"),
        (" 4096 ", 4096, 1, "4 KiB"),
        ("10485760", 10485760, 10, "10 MiB"),
        ("5MiB", 5 * 1024 * 1024, 5, "5 MiB"),  # not a number of bytes: the API's default
        ("12", 5 * 1024 * 1024, 5, "5 MiB"),  # below the API's own minimum (1024)
    ]:
        monkeypatch.setenv(uploads.MAX_REQUEST_BYTES_ENV, value)
        assert (uploads.max_upload_bytes(), uploads.max_upload_mb(), uploads.limit_text()) == (expected, mb, text)
    monkeypatch.setenv(uploads.MAX_REQUEST_BYTES_ENV, "4096")
    assert uploads.too_large(b"x" * 4096) is None
    assert uploads.too_large(b"x" * 4097) == "The file is 4,097 bytes; the API takes at most 4 KiB (4,096 bytes)."


def test_the_web_apps_server_takes_no_larger_upload_than_the_api() -> None:
    """frontend/server.py sets Streamlit's server.maxUploadSize (200 MB by default) from the API's
    variable; Streamlit's upload route refuses larger files with it."""
    script = "import frontend.server; from streamlit import config; print(config.get_option('server.maxUploadSize'))"
    for env, expected in [({}, "5"), ({uploads.MAX_REQUEST_BYTES_ENV: str(12 * 1024 * 1024)}, "12")]:
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1] == expected, done.stdout


def test_the_uploaders_say_the_limit_and_keep_to_it(live: LiveApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(uploads.MAX_REQUEST_BYTES_ENV, raising=False)
    client = live.client(live.user("rita", "researcher"))
    live.task(TASK, onboarding_quiz=None)
    live.round(TASK, ["already there"])
    assert uploaders(rounds_page(client)) == {
        "Task YAML file (at most 5 MiB)": 5,
        "Prompt file (JSONL with a `text` field per line, or CSV with a `text` column; at most 5 MiB)": 5,
    }
    monkeypatch.setenv(uploads.MAX_REQUEST_BYTES_ENV, str(3 * 1024 * 1024))
    assert set(uploaders(rounds_page(client)).values()) == {3}


def test_a_paste_larger_than_the_api_takes_is_refused_on_the_page(
    live: LiveApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(uploads.MAX_REQUEST_BYTES_ENV, "4096")
    client = live.client(live.user("rita", "researcher"))
    live.task(TASK, onboarding_quiz=None)
    round_ = live.round(TASK, ["already there"])

    def counts() -> tuple[int, int]:
        with live.app.state.sessionmaker() as session:
            return session.scalar(select(func.count()).select_from(Prompt)) or 0, session.scalar(
                select(func.count()).select_from(Task)
            ) or 0

    before = counts()
    at = rounds_page(client)
    prompts = "\n".join(json.dumps({"text": f"Prompt number {i} about a long lunch."}) for i in range(120))
    assert 4096 < len(prompts.encode()) < 5 * 1024 * 1024  # the API's own limit would take it
    at.text_area(key=f"researcher_prompts_text_{round_['id']}").input(prompts)
    at = at.button(key=f"researcher_prompts_import_{round_['id']}").click().run()
    assert f"The file is {len(prompts.encode()):,} bytes; the API takes at most 4 KiB (4,096 bytes)." in texts(at.error)
    big_yaml = (ROOT / "services" / "task_examples" / "dynasent-r2.yaml").read_text(encoding="utf-8")
    assert len(big_yaml.encode()) > 4096
    at.text_area(key="researcher_task_yaml").input(big_yaml.replace("name: dynasent-r2", "name: bigger-task", 1))
    at = at.button(key="researcher_create_task").click().run()
    assert any(e.startswith("The file is ") and "at most 4 KiB" in e for e in texts(at.error)), texts(at.error)
    assert not client.requests("POST", f"/rounds/{round_['id']}/prompts") and not client.requests("POST", "/tasks")
    assert counts() == before

    small = "\n".join(prompts.splitlines()[:3])
    at.text_area(key=f"researcher_prompts_text_{round_['id']}").input(small)
    at = at.button(key=f"researcher_prompts_import_{round_['id']}").click().run()
    assert any("Imported 3 of 3 rows" in s for s in texts(at.success)), texts(at.success)
    assert counts() == (before[0] + 3, before[1])
