"""A crowdworker's study session on the Write and Validate pages: how far they are towards the
study's quota, and the way to the completion (``/study/finish``, a server-rendered page of
frontend/study_links.py that hands them back to their platform)."""

from __future__ import annotations

import streamlit as st

from frontend import render, state
from frontend.client import Api, ApiError, StudySession

FINISH_TEXT = "Finish and get your completion code"


def current_session(client: Api, role: str) -> StudySession | None:
    """The user's newest study session for ``role`` that is running, has met its quota or has
    screened the worker out (the quiz failed for good: they still need the platform's
    screened-out completion); None for users who came without a study link (or an API without
    study sessions)."""
    try:
        sessions = state.session_cached(client, "my_study_sessions", client.my_study_sessions)
    except ApiError as error:
        if error.status not in (401, 403, 404):
            render.alert("warning", f"Your study session could not be loaded: {error.message}")
        return None
    mine = [s for s in sessions if s.get("role") == role and s.get("status") in ("active", "completed", "screened_out")]
    if not mine:
        return None
    active = [s for s in mine if s.get("status") == "active"]
    return max(active or mine, key=lambda s: s.get("started_at") or "")


def progress_text(session: StudySession) -> str:
    unit = "examples" if session.get("role") == "writer" else "labels"
    return f"{session['units_done']} of {session['quota']} {unit} for this study"


def show_progress(client: Api, role: str) -> StudySession | None:
    """Near the top of the page: the study's progress and the link to finish (a plain link, so
    the browser leaves the Streamlit page for the server's own)."""
    session = current_session(client, role)
    if session is None:
        return None
    done, quota = int(session.get("units_done") or 0), max(int(session.get("quota") or 0), 1)
    if session.get("status") == "screened_out":
        st.warning(
            "This study has ended for you: you cannot go on with this task (the onboarding quiz was not "
            "passed, or your work no longer qualifies). Follow the link below to return to the platform."
        )
    else:
        st.progress(min(done / quota, 1.0), text=progress_text(session))
    if session.get("status") == "completed":
        st.success("You have reached this study's quota. Thank you! Finish to get your completion code.")
    link = render.escape(f"{state.base_path()}/study/finish")
    render.show_html(f'<p class="dl-study-finish"><a href="{link}" target="_self">{FINISH_TEXT}</a></p>')
    return session
