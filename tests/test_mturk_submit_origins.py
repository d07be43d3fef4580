"""An admin's ``DYNALOOP_MTURK_SUBMIT_ORIGINS`` (services/settings.py): where an MTurk study
session may post its assignment back. Here MTurk is played by ``http://localhost:8123`` (as in
tests/test_e2e_mturk_frame.py): a link opened with that ``turkSubmitTo`` works and its
completion form posts there; MTurk's own hosts, no longer named, are refused and nothing is
written."""

from __future__ import annotations

from typing import Any

import pytest

from services.settings import Settings
from tests.conftest import Actor, example_yaml, open_round, table_counts
from tests.test_study_links import API, MTURK, PROMPTS, TASK, bearer, make_link, open_link

FAKE_MTURK = "http://localhost:8123"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"mturk_submit_origins": f"{FAKE_MTURK}, http://127.0.0.1:8123"})


@pytest.fixture
def round_(client: Any, researcher: Actor, stub_model: Any) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml(TASK, onboarding_quiz=None), stub_model.url, PROMPTS)


def test_the_admins_submit_origin_is_where_the_assignment_goes(
    app: Any, client: Any, researcher: Actor, round_: dict[str, Any]
) -> None:
    link = make_link(client, researcher, round_["id"], platform="mturk", completion_code="TURKDONE")
    before = table_counts(app)
    for submit_to in ("https://workersandbox.mturk.com", "https://www.mturk.com", "http://localhost:8124"):
        refused = open_link(client, link, {**MTURK, "turkSubmitTo": submit_to})
        assert refused.status_code == 422, refused.text
        assert "turkSubmitTo" in refused.json()["error"]["message"]
    assert table_counts(app) == before

    started = open_link(client, link, {**MTURK, "turkSubmitTo": f"{FAKE_MTURK}/"})
    assert started.status_code == 201, started.text
    token = started.json()["token"]
    session_id = started.json()["session"]["id"]
    done = client.post(f"{API}/study-sessions/{session_id}/finish", json={"reason": "stop"}, headers=bearer(token))
    assert done.status_code == 200, done.text
    assert done.json()["form"] == {
        "action": f"{FAKE_MTURK}/mturk/externalSubmit",
        "fields": {"assignmentId": MTURK["assignmentId"], "completion_code": "stopped"},
    }
