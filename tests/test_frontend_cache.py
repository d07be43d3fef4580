"""What the web app keeps between reruns (issue #28, launch day): the open rounds and the user's
study sessions for 30 s per browser session (``state.session_cached``), dropped after the
user's own writes and after any API error; one connection pool for every client of the
process (``client.SharedTransport``). Against the real API over HTTP (tests/frontend_live.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from frontend import state
from frontend.client import ApiClient, ApiError, SharedTransport
from services.db.models import Attempt as AttemptRow
from tests.frontend_live import LiveApi, PageClient, signed_in_app, texts

OPEN_ROUNDS = "/rounds/open"
STUDY_SESSIONS = "/me/study-sessions"


@pytest.fixture
def dynasent(live: LiveApi) -> LiveApi:
    live.task("dynasent-r2", onboarding_quiz=None)
    live.round("dynasent-r2", ["The soup was fine and the bread was fresh."])
    return live


def asked(client: PageClient, path: str) -> int:
    return len(client.requests("GET", path))


def attempts(live: LiveApi) -> int:
    with live.app.state.sessionmaker() as session:
        return int(session.scalar(select(func.count()).select_from(AttemptRow)) or 0)


def test_reruns_ask_once_and_a_write_asks_again_for_the_study_sessions_only(dynasent: LiveApi) -> None:
    dynasent.user("walt", "writer")
    client = dynasent.as_user("walt")
    at = signed_in_app(dynasent, "walt", client=client)
    assert not at.exception, at.exception
    # The first run started an assignment (a write), so the study sessions are asked again once.
    at.run()
    assert (asked(client, OPEN_ROUNDS), asked(client, STUDY_SESSIONS)) == (1, 2)
    for _ in range(3):  # each click or edit in the browser is a rerun
        at.run()
    assert (asked(client, OPEN_ROUNDS), asked(client, STUDY_SESSIONS)) == (1, 2)
    assert "Your goal:" in " ".join(texts(at.markdown))

    assignment_id = at.session_state["writer_assignment"]["id"]
    at.text_area(key=f"writer_text_{assignment_id}").set_value("The soup was great and the bread was fresh.").run()
    assert (asked(client, OPEN_ROUNDS), asked(client, STUDY_SESSIONS)) == (1, 2)
    at.button(key=f"writer_check_{assignment_id}").click().run()
    assert not at.exception, at.exception
    assert "Tries: **1 / 10**" in texts(at.markdown)
    # The check (a write) may have changed what the user's study session counts: asked again.
    # The open rounds do not change with the user's writes: still the first answer.
    assert (asked(client, OPEN_ROUNDS), asked(client, STUDY_SESSIONS)) == (1, 3)
    at.run()
    assert (asked(client, OPEN_ROUNDS), asked(client, STUDY_SESSIONS)) == (1, 3)


def test_an_answer_older_than_the_ttl_is_fetched_again(dynasent: LiveApi) -> None:
    dynasent.user("walt", "writer")
    client = dynasent.as_user("walt")
    at = signed_in_app(dynasent, "walt", client=client)
    cache = at.session_state["_session_cache"]
    for key, (fetched_at, *rest) in list(cache.items()):
        cache[key] = (fetched_at - state.SESSION_CACHE_TTL_S - 1, *rest)
    at.session_state["_session_cache"] = cache
    before = (asked(client, OPEN_ROUNDS), asked(client, STUDY_SESSIONS))
    at.run()
    assert (asked(client, OPEN_ROUNDS), asked(client, STUDY_SESSIONS)) == (before[0] + 1, before[1] + 1)


def test_a_round_closed_meanwhile_is_refused_then_gone_from_the_page(dynasent: LiveApi) -> None:
    """The cached list still shows the round; the API refuses the check (nothing stored), and the
    error drops the cache: the next run shows that no round is collecting."""
    dynasent.user("walt", "writer")
    client = dynasent.as_user("walt")
    at = signed_in_app(dynasent, "walt", client=client)
    assignment_id = at.session_state["writer_assignment"]["id"]
    round_id = at.session_state["writer_assignment"]["round_id"]
    dynasent.admin.set_round_status(round_id, "validating")
    at.run()
    assert asked(client, OPEN_ROUNDS) == 1  # within 30 s: the page still holds the round
    before = attempts(dynasent)

    at.text_area(key=f"writer_text_{assignment_id}").set_value("The soup was great and the bread was fresh.").run()
    at.button(key=f"writer_check_{assignment_id}").click().run()
    assert not at.exception, at.exception
    assert client.requests("POST", rf"/assignments/{assignment_id}/attempts")
    assert attempts(dynasent) == before  # refused: nothing stored
    at.run()
    assert asked(client, OPEN_ROUNDS) == 2
    assert "No round is collecting sentences right now. Please check back later." in texts(at.info)


def test_an_answer_is_not_served_to_another_token(dynasent: LiveApi) -> None:
    dynasent.user("walt", "writer")
    dynasent.user("wanda", "writer")
    client = dynasent.as_user("walt")
    at = signed_in_app(dynasent, "walt", client=client)
    at.run()
    before = (asked(client, OPEN_ROUNDS), asked(client, STUDY_SESSIONS))
    at.session_state["token"] = dynasent.tokens["wanda"][1]  # get_client gives the client this token
    at.run()
    assert (asked(client, OPEN_ROUNDS), asked(client, STUDY_SESSIONS)) == (before[0] + 1, before[1] + 1)


def test_the_client_counts_its_writes_and_errors(dynasent: LiveApi) -> None:
    dynasent.user("walt", "writer")
    with ApiClient(dynasent.url, dynasent.tokens["walt"][1]) as client:
        client.me()
        round_id = client.open_rounds()[0]["id"]
        assert (client.writes, client.errors) == (0, 0)
        client.start_assignment(round_id)  # a POST
        assert (client.writes, client.errors) == (1, 0)
        with pytest.raises(ApiError):
            client.assignment(10**9)  # a GET that fails
        assert (client.writes, client.errors) == (1, 1)


def test_clients_share_one_pool_that_outlives_each_of_them(dynasent: LiveApi) -> None:
    dynasent.user("walt", "writer")
    token = dynasent.tokens["walt"][1]
    first = ApiClient(dynasent.url, token, transport=SharedTransport())
    assert first.me()["username"] == "walt"
    first.close()
    pool = SharedTransport.pool()
    with ApiClient(dynasent.url, token, transport=SharedTransport()) as second:
        assert second.me()["username"] == "walt"  # the first client's close left the pool open
    assert SharedTransport.pool() is pool
    with ApiClient(dynasent.url, None, transport=SharedTransport()) as anonymous, pytest.raises(ApiError) as refused:
        anonymous.me()  # the pool carries no one's credentials: each request its own headers
    assert refused.value.status == 401
