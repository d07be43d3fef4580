"""Tasks and rounds (researcher): create a task from its YAML, open the next round, move a
round on (collecting -> validating -> closed; closing asks first, with the round's open study
links counted), import prompts (JSONL or CSV, with the import
report), and put registered model servers in the loop (chosen by name among those an admin
registered), with what the model registry knows about the model they serve.

Everything goes through the REST API (``frontend.client``); text that people typed (task
titles, prompts, notes) is shown with ``st.text``, in dataframes, or escaped.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pandas as pd
import streamlit as st

from frontend import render, state, uploads
from frontend.client import Api, ApiError, ModelServer, Round, Task
from frontend.researcher import SELECT_TASK_KEY, choose_task

NEXT_STATUS = {
    "collecting": ("validating", "Stop collecting: validation only"),
    "validating": ("closed", "Close the round"),
}
STRATEGIES = ["unused_first", "least_used", "least_fooled"]
TARGET_MODES = ["balanced", "writer_choice"]
PREVIEW_ROWS = 5
ROUND_WIDGET = "researcher_rounds_round"
SELECT_ROUND_KEY = "researcher_rounds_select_round"  # a round to select on the next run


def create_task_form(client: Api) -> None:
    with st.expander("Create a task from its YAML file", expanded=False):
        st.caption(
            'The YAML format is in docs/api.md, "Create a task from its YAML"; '
            "`dynaloop task show-example dynasent-r2` prints an example."
        )
        upload = st.file_uploader(
            f"Task YAML file (at most {uploads.limit_text()})",
            type=["yaml", "yml"],
            key="researcher_task_file",
            max_upload_size=uploads.max_upload_mb(),
        )
        pasted = st.text_area("... or paste the YAML", height=200, key="researcher_task_yaml")
        if not st.button("Create task", type="primary", key="researcher_create_task"):
            return
        if upload is not None:
            try:
                yaml_text = upload.getvalue().decode("utf-8")
            except UnicodeDecodeError:
                st.error("The file is not UTF-8 text; save it as UTF-8.")
                return
        else:
            yaml_text = pasted
        if not yaml_text.strip():
            st.warning("Choose a YAML file or paste the task's YAML.")
            return
        if problem := uploads.too_large(yaml_text.encode("utf-8")):
            st.error(problem)
            return
        try:
            task = client.create_task(yaml_text)
        except ApiError as error:
            state.show_api_error(error)
            return
        st.session_state[SELECT_TASK_KEY] = task["name"]
        state.flash("success", f"Created task {render.escape_markdown(task['name'])}.")
        st.rerun()


def show_task(task: Task) -> None:
    definition = task.get("definition") or {}
    st.text(f"{task['title']}")
    cols = st.columns(3)
    cols[0].text(f"family: {task['family']}")
    cols[1].text(f"language: {definition.get('language', '?')}")
    cols[2].text("labels: " + ", ".join(definition.get("labels") or []))


def rounds_table(rounds: list[Round]) -> None:
    if not rounds:
        st.info("This task has no round yet: open the first one below.")
        return
    frame = pd.DataFrame(
        [
            {
                "round": r["number"],
                "id": r["id"],
                "status": r["status"],
                "model servers": ", ".join(r.get("model_servers") or []) or "none",
                "prompt strategy": r.get("prompt_strategy"),
                "no-prompt share": r.get("no_prompt_fraction"),
                "target labels": r.get("target_label_mode"),
                "opened": r.get("opened_at"),
                "closed": r.get("closed_at"),
                "open study links": r.get("open_study_links"),
            }
            for r in rounds
        ]
    )
    st.dataframe(frame, hide_index=True, key="researcher_rounds_table")


def registered_servers(client: Api) -> list[ModelServer]:
    """The model servers an admin registered (the only ones a round can use)."""
    try:
        return client.model_servers()
    except ApiError as error:
        state.show_api_error(error)
        return []


def _server_label(servers: dict[str, ModelServer]) -> Any:
    return lambda name: f"{name} ({servers[name]['url']})" if name in servers else name


def open_round_form(client: Api, task: Task, rounds: list[Round], servers: list[ModelServer]) -> None:
    still_open = [r for r in rounds if r["status"] in ("collecting", "validating")]
    with st.expander("Open the next round", expanded=not rounds):
        if still_open:
            st.info(f"Round {still_open[0]['number']} is still {still_open[0]['status']}; close it first.")
            return
        if not servers:
            st.caption("No model server is registered yet: an admin registers them (`dynaloop model servers register`)")
        by_name = {s["name"]: s for s in servers}
        with st.form("researcher_open_round_form"):
            chosen = st.multiselect(
                "Model server(s) in the loop (registered by an admin; several: one is picked per attempt)",
                list(by_name),
                key="researcher_open_servers",
                format_func=_server_label(by_name),
            )
            strategy = st.selectbox(
                "Prompt order",
                STRATEGIES,
                key="researcher_open_strategy",
                help="unused first: each prompt once, as DynaSent intended",
            )
            no_prompt = st.number_input(
                "Share of assignments without a prompt", 0.0, 1.0, 0.0, 0.05, key="researcher_open_no_prompt"
            )
            mode = st.selectbox(
                "Target labels",
                TARGET_MODES,
                key="researcher_open_mode",
                help="balanced: the API spreads targets evenly; writer_choice: writers pick",
            )
            notes = st.text_area("Notes (optional)", max_chars=5000, key="researcher_open_notes")
            submitted = st.form_submit_button("Open round", type="primary", key="researcher_open_submit")
        if not submitted:
            return
        try:
            round_ = client.open_round(
                task["name"],
                model_servers=list(chosen),
                prompt_strategy=strategy,
                no_prompt_fraction=float(no_prompt),
                target_label_mode=mode,
                notes=notes.strip() or None,
            )
        except ApiError as error:
            state.show_api_error(error)
            return
        st.session_state[SELECT_ROUND_KEY] = round_["number"]
        state.flash("success", f"Opened round {round_['number']}.")
        st.rerun()


def _links(count: int) -> str:
    return f"{count} open study link{'' if count == 1 else 's'}"


def close_consequences(round_: Round) -> str:
    """What closing the round does, with its open study links counted (the API's count)."""
    text = (
        f"Close round {round_['number']}? It cannot be reopened: writers and validators can no longer work "
        "in it, and its open assignments expire. "
    )
    count = round_.get("open_study_links")
    if count is None:
        return text + "The API did not say whether it has open study links; any it has are closed with it."
    if count == 0:
        return text + "It has no open study links."
    return text + (
        f"Its {_links(count)} will be closed with it: a crowdworker who opens one is told the round is closed. "
        "Workers already in a study session can only finish it: they get the completion code only if they met "
        "the quota (or, validators, if the link completes those who run out of work); otherwise the link's "
        "partial code, or none."
    )


def confirm_close_key(round_: Round) -> str:
    return f"researcher_confirm_close_{round_['id']}"


def confirm_close(client: Api, round_: Round) -> None:
    """The close, once the researcher has read what it does and confirmed it."""
    st.warning(close_consequences(round_))
    yes, no = st.columns(2)
    if no.button("Cancel", key=f"researcher_status_{round_['id']}_closed_cancel"):
        st.session_state.pop(confirm_close_key(round_), None)
        st.rerun()
    if not yes.button(
        f"Yes, close round {round_['number']}", type="primary", key=f"researcher_status_{round_['id']}_closed_confirm"
    ):
        return
    st.session_state.pop(confirm_close_key(round_), None)
    try:
        closed = client.set_round_status(round_["id"], "closed")
    except ApiError as error:
        state.show_api_error(error)
        return
    links = closed.get("study_links_closed")
    closed_links = f"; {links} of its study links {'was' if links == 1 else 'were'} closed with it" if links else ""
    state.flash("success", f"Round {round_['number']} is now closed{closed_links}.")
    st.rerun()


def status_controls(client: Api, round_: Round) -> None:
    st.text(f"Status: {round_['status']}")
    step = NEXT_STATUS.get(round_["status"])
    if step is None:
        st.caption(
            "A closed round is built on the Models and datasets page."
            if round_["status"] == "closed"
            else "This round is built."
        )
        return
    target, label = step
    if target == "closed" and st.session_state.get(confirm_close_key(round_)):
        confirm_close(client, round_)
        return
    if st.button(label, key=f"researcher_status_{round_['id']}_{target}"):
        if target == "closed":  # asked first: closing cannot be undone
            st.session_state[confirm_close_key(round_)] = True
            st.rerun()
        try:
            client.set_round_status(round_["id"], target)
        except ApiError as error:
            state.show_api_error(error)
            return
        state.flash("success", f"Round {round_['number']} is now {target}.")
        st.rerun()


def preview_prompts(content: bytes, file_format: str) -> pd.DataFrame | None:
    """The first rows of a prompt file as the API will read them (None if unreadable); the
    API checks every row on import."""
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    rows: list[dict[str, Any]] = []
    if file_format == "csv":
        for row in csv.DictReader(io.StringIO(text)):
            rows.append(dict(row))
            if len(rows) >= PREVIEW_ROWS:
                break
    else:
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                return None
            rows.append(value if isinstance(value, dict) else {"text": value})
            if len(rows) >= PREVIEW_ROWS:
                break
    # Everything as text: a dataframe cell shows it literally, never as Markdown or HTML.
    return pd.DataFrame(rows).astype(str) if rows else None


def import_prompts_form(client: Api, round_: Round) -> None:
    st.subheader("Prompts")
    upload = st.file_uploader(
        "Prompt file (JSONL with a `text` field per line, or CSV with a `text` column; "
        f"at most {uploads.limit_text()})",
        type=["jsonl", "ndjson", "csv"],
        key=f"researcher_prompts_file_{round_['id']}",
        max_upload_size=uploads.max_upload_mb(),
    )
    pasted = st.text_area("... or paste JSONL / CSV", height=120, key=f"researcher_prompts_text_{round_['id']}")
    if upload is not None:
        content, name = upload.getvalue(), upload.name
        file_format = "csv" if name.lower().endswith(".csv") else "jsonl"
    else:
        content, name = pasted.encode("utf-8"), "pasted"
        file_format = st.radio(
            "Format of the pasted text",
            ["jsonl", "csv"],
            horizontal=True,
            key=f"researcher_prompts_format_{round_['id']}",
        )
    if content.strip():
        preview = preview_prompts(content, file_format)
        if preview is None:
            st.caption("No preview: the file is not readable as " + file_format.upper() + "; the import will say why.")
        else:
            st.caption(f"First rows of {name}:")
            st.dataframe(preview, hide_index=True, key=f"researcher_prompts_preview_{round_['id']}")
    if not st.button("Import prompts", key=f"researcher_prompts_import_{round_['id']}"):
        return
    if not content.strip():
        st.warning("Choose a prompt file or paste prompts first.")
        return
    if problem := uploads.too_large(content):
        st.error(problem)
        return
    try:
        report = client.import_prompts(
            round_["id"], content, filename=name if upload is not None else f"pasted.{file_format}", format=file_format
        )
    except ApiError as error:
        state.show_api_error(error)
        return
    st.success(f"Imported {report['imported']:,} of {report['rows']:,} rows into round {round_['number']}.")
    cols = st.columns(4)
    cols[0].metric("Rows in the file", report["rows"])
    cols[1].metric("Imported", report["imported"])
    cols[2].metric("Repeated in the file", report["duplicates_in_file"])
    cols[3].metric("Already in the round", report["already_present"])


def model_in_the_loop(client: Api, task: Task, round_: Round, servers: list[ModelServer]) -> None:
    st.subheader("Model in the loop")
    by_name = {s["name"]: s for s in servers}
    in_loop = list(round_.get("model_servers") or [])
    endpoints = [by_name[name]["url"] for name in in_loop if name in by_name]
    if in_loop:
        st.code("\n".join(map(_server_label(by_name), in_loop)), language=None)
    else:
        st.warning("No model server is in the loop: writers get a 503 until you set one.")
    try:
        models = client.models(task["name"])
    except ApiError as error:
        state.show_api_error(error)
        models = []
    serving = [m for m in models if m.get("endpoint") in endpoints and m.get("status") == "promoted"]
    if serving:
        st.caption("What the registry knows about the model promoted to these endpoints:")
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "name": m["name"],
                        "model id": m["model_id"],
                        "version": m["version"],
                        "endpoint": m["endpoint"],
                        "labels": ", ".join(map(str, m.get("labels") or [])),
                        "trained for round": m.get("trained_for_round"),
                        "base model": m.get("base_model"),
                        "promoted": m.get("promoted_at"),
                        "attempts scored": m.get("attempts"),
                        "macro-F1": ", ".join(
                            f"{k} {100 * v:.1f}"
                            for k, v in (m.get("macro_f1") or {}).items()
                            if isinstance(v, int | float)
                        ),
                    }
                    for m in serving
                ]
            ),
            hide_index=True,
            key=f"researcher_loop_models_{round_['id']}",
        )
    elif endpoints:
        st.caption(
            "No registered model is promoted to these servers (promote one on the Models and datasets page "
            "to see its details here)."
        )
    if round_["status"] not in ("collecting", "validating"):
        return
    with st.form(f"researcher_model_form_{round_['id']}"):
        new = st.multiselect(
            "Model servers (registered by an admin; several: one is picked per attempt)",
            sorted(set(by_name) | set(in_loop)),
            default=in_loop,
            key=f"researcher_model_servers_{round_['id']}",
            format_func=_server_label(by_name),
        )
        saved = st.form_submit_button("Set the model in the loop", key=f"researcher_model_save_{round_['id']}")
    if not saved:
        return
    try:
        client.set_model(round_["id"], list(new))
    except ApiError as error:
        state.show_api_error(error)
        return
    state.flash("success", f"Round {round_['number']} now uses {len(new)} model server(s).")
    st.rerun()


def main() -> None:
    client = state.require_role("researcher")
    st.title("Tasks and rounds")
    state.show_flash()
    create_task_form(client)
    task = choose_task(client, "researcher_rounds_task")
    if task is None:
        st.info("No task yet: create one from its YAML file above.")
        return
    show_task(task)
    try:
        rounds = client.rounds(task["name"])
    except ApiError as error:
        state.show_api_error(error)
        return
    rounds_table(rounds)
    servers = registered_servers(client)
    open_round_form(client, task, rounds, servers)
    if not rounds:
        return
    by_number = {r["number"]: r for r in rounds}
    pending = st.session_state.pop(SELECT_ROUND_KEY, None)  # a round just opened
    if pending in by_number:
        st.session_state[ROUND_WIDGET] = pending
    elif st.session_state.get(ROUND_WIDGET) not in by_number:
        st.session_state[ROUND_WIDGET] = max(by_number)
    number = st.selectbox(
        "Round",
        sorted(by_number, reverse=True),
        key=ROUND_WIDGET,
        format_func=lambda n: f"round {n} ({by_number[n]['status']})",
    )
    round_ = by_number[number]
    status_controls(client, round_)
    if round_["status"] in ("collecting", "validating"):
        import_prompts_form(client, round_)
    model_in_the_loop(client, task, round_, servers)


main()
