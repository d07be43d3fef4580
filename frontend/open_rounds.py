"""The round a writer or a validator works in, on the Write and Validate pages."""

from __future__ import annotations

import streamlit as st

from frontend import state
from frontend.client import Api, ApiError, Round


def choose_open_round(
    client: Api, statuses: tuple[str, ...], *, key: str, none_open: str, study_round: int | None = None
) -> Round | None:
    """The open round (in one of ``statuses``) to work in: the study session's round
    (``study_round``) when the user came from a study link, the only one, or the one chosen in a
    selector under ``key``; None, with ``none_open`` shown, when there is none."""
    try:
        rounds = [
            r
            for r in state.session_cached(client, "open_rounds", client.open_rounds, after_writes=False)
            if r["status"] in statuses
        ]
    except ApiError as error:
        state.show_api_error(error)
        return None
    if not rounds:
        st.info(none_open)
        return None
    if study_round is not None and any(r["id"] == study_round for r in rounds):
        rounds = [r for r in rounds if r["id"] == study_round]
    if len(rounds) == 1:
        return rounds[0]
    by_id = {r["id"]: r for r in rounds}
    chosen = st.selectbox(
        "Task",
        list(by_id),
        key=key,
        format_func=lambda rid: f"{by_id[rid]['task']} (round {by_id[rid]['number']})",
    )
    return by_id[chosen]
