"""Pieces the researcher pages share: choosing a task and a round (remembered across the
pages), and numbers formatted for ``st.metric``."""

from __future__ import annotations

import streamlit as st

from frontend import state
from frontend.client import Api, ApiError, Round, Task

TASK_KEY = "researcher_task"  # the task last chosen on any researcher page (not a widget key)
SELECT_TASK_KEY = "researcher_select_task"  # a task to select on the next run (e.g. one just created)
ROUND_KEY = "researcher_round"  # likewise the round number, per task: {task: number}


def choose_task(client: Api, key: str) -> Task | None:
    """A task selector; None (after showing why) when there is no task or the API fails."""
    try:
        tasks = client.tasks()
    except ApiError as error:
        state.show_api_error(error)
        return None
    if not tasks:
        return None
    names = [task["name"] for task in tasks]
    pending = st.session_state.pop(SELECT_TASK_KEY, None)
    if pending in names:
        st.session_state[key] = pending
    if st.session_state.get(key) not in names:
        remembered = st.session_state.get(TASK_KEY)
        st.session_state[key] = remembered if remembered in names else names[0]
    # Task names are identifiers (lower case, digits, dashes): safe as option labels.
    name = st.selectbox("Task", names, key=key)
    st.session_state[TASK_KEY] = name
    return next(task for task in tasks if task["name"] == name)


def choose_round(client: Api, task: Task, key: str, statuses: tuple[str, ...] | None = None) -> Round | None:
    """A round selector (newest first), optionally limited to some statuses."""
    try:
        rounds = client.rounds(task["name"])
    except ApiError as error:
        state.show_api_error(error)
        return None
    if statuses is not None:
        rounds = [r for r in rounds if r["status"] in statuses]
    if not rounds:
        return None
    by_number = {r["number"]: r for r in rounds}
    numbers = sorted(by_number, reverse=True)
    if st.session_state.get(key) not in numbers:
        remembered = st.session_state.setdefault(ROUND_KEY, {}).get(task["name"])
        st.session_state[key] = remembered if remembered in numbers else numbers[0]
    number = st.selectbox("Round", numbers, key=key, format_func=lambda n: f"round {n} ({by_number[n]['status']})")
    st.session_state.setdefault(ROUND_KEY, {})
    st.session_state[ROUND_KEY][task["name"]] = number
    return by_number[number]


def percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def money(minor: int | None, currency: str | None) -> str:
    """An amount in minor units as people read it: ``150`` GBP -> ``"GBP 1.50"`` (two decimals,
    integer arithmetic only); ``"–"`` for None."""
    if minor is None:
        return "–"
    sign = "-" if minor < 0 else ""
    units, cents = divmod(abs(int(minor)), 100)
    return f"{currency or ''} {sign}{units:,}.{cents:02d}".strip()
