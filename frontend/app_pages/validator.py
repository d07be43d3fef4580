"""The validator's page (DynaSent App. B, Fig. 4): the instructions, then a batch of up to
the task's ``validation_batch_size`` sentences written by others, one card each, labelled with
the task's validation labels. The options show the labels' display names and send the labels;
the instructions (frontend/instructions.py) name the batch's own size and the same display names.

Each card is sent to the API as soon as the validator saves it, under the item's opaque id and
with an idempotency key of its own, so nothing is lost: a reload asks the API for the batch
again, and the API returns the same batch (the items not yet labelled) while it is live; a new
one comes once every item is labelled. Some items may be the task's control items: the page
cannot tell them apart, and neither can the validator.

Keyboard use: Tab moves between cards' controls; inside a label group the arrow keys pick a
label (radio buttons), Space ticks the flag box or toggles an emotion (multi-label pills),
and Enter on "Save label" (or in the reason field) saves the card.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict

import streamlit as st

from frontend import instructions, render, state, study
from frontend.client import Api, ApiError, BatchItem, Label, TaskDefinition
from frontend.open_rounds import choose_open_round

BATCH_KEY = "validator_batch"
SHOWN_AT_KEY = "validator_shown_at"


class SavedCard(TypedDict):
    label: list[str]
    flagged: bool
    note: str | None  # why the card closed without a label of this validator's


class HeldBatch(TypedDict):
    """The batch being labelled (kept in the session): the API's batch and the cards done."""

    round_id: int
    labels: list[str]
    names: dict[str, str]  # label -> display name
    multi_label: bool
    items: list[BatchItem]
    done: dict[str, SavedCard]  # item id -> what was saved


def current_batch(client: Api, round_id: int) -> HeldBatch | None:
    """The batch being labelled, kept in the session; fetched from the API when there is none
    (first visit, a reload, or "Next batch")."""
    held: HeldBatch | None = st.session_state.get(BATCH_KEY)
    if held is not None and held["round_id"] == round_id:
        return held
    try:
        answer = client.validation_batch(round_id)
    except ApiError as error:
        state.show_api_error(error)
        return None
    batch: HeldBatch = {
        "round_id": round_id,
        "labels": answer["validation_labels"],
        "names": answer.get("label_names") or {},
        "multi_label": answer["multi_label"],
        "items": answer["data"],
        "done": {},
    }
    st.session_state[BATCH_KEY] = batch
    return batch


def _sentence(item: BatchItem, lang: str | None) -> None:
    span = item.get("target_span")
    if span:
        render.show_html(render.highlight_html(item["text"], int(span["start"]), int(span["end"]), lang=lang))
        st.caption("Rate the sentiment towards the highlighted target only.")
    else:
        render.show_text(item["text"], lang=lang)


def _save(client: Api, batch: HeldBatch, item_id: str, label: Label, flagged: bool, reason: str) -> None:
    shown_at = st.session_state.get(SHOWN_AT_KEY, {}).get(item_id)
    seconds = time.time() - shown_at if shown_at else None
    try:
        saved = client.validate(item_id, label, flagged=flagged, flag_reason=reason or None, seconds_taken=seconds)
    except ApiError as error:
        if error.status == 409:
            # Labels cannot change, a full example takes no more, an expired batch takes none:
            # the card is finished.
            batch["done"][item_id] = {"label": [], "flagged": False, "note": error.message}
            st.rerun()
        state.show_api_error(error)
        return
    batch["done"][item_id] = {"label": saved["label"], "flagged": saved["flagged"], "note": None}
    st.rerun()


def card(client: Api, batch: HeldBatch, index: int, item: BatchItem, definition: TaskDefinition) -> None:
    item_id = item["item_id"]
    labels = batch["labels"]
    names = batch["names"]

    def shown(label: str) -> str:
        # Radio and pill options are Markdown: the display name is shown as written.
        return render.escape_markdown(render.label_name(label, names))

    lang = definition.get("language")
    with st.container(border=True):
        st.caption(f"Sentence {index} of {len(batch['items'])}")
        _sentence(item, lang)
        done = batch["done"].get(item_id)
        if done is not None:
            note = done.get("note")
            if note:
                render.alert("info", note)
            else:
                flag = " (flagged)" if done["flagged"] else ""
                saved_text = render.escape_markdown(render.labels_text(done["label"], ", ", names))
                st.success(f"Saved: **{saved_text}**{flag}")
            return
        st.session_state.setdefault(SHOWN_AT_KEY, {}).setdefault(item_id, time.time())
        with st.form(f"validator_form_{item_id}", border=False):
            if batch["multi_label"]:
                choice: Any = st.pills(
                    "Choose every label that applies",
                    labels,
                    selection_mode="multi",
                    format_func=shown,
                    key=f"validator_label_{item_id}",
                )
            else:
                choice = st.radio(
                    "Label",
                    labels,
                    index=None,
                    horizontal=True,
                    format_func=shown,
                    key=f"validator_label_{item_id}",
                )
            flagged = st.checkbox(
                "Flag this sentence (spam, an advert, personal data, not a real sentence, ...)",
                key=f"validator_flag_{item_id}",
            )
            reason = st.text_input("Reason for the flag (optional)", max_chars=1000, key=f"validator_reason_{item_id}")
            saved = st.form_submit_button(instructions.SAVE_LABEL, type="primary", key=f"validator_save_{item_id}")
        if not saved:
            return
        reason = (reason or "").strip()
        chosen = list(choice or []) if batch["multi_label"] else [choice] if choice else []
        exclusive = [label for label in definition.get("exclusive_labels") or [] if label in chosen]
        if not chosen:
            st.warning("Choose a label first.")
        elif exclusive and len(chosen) > 1:
            st.warning(f"{shown(exclusive[0])} cannot be combined with other labels; choose it alone.")
        elif reason and not flagged:
            st.warning("Tick the flag box to send a reason, or clear the reason.")
        else:
            _save(client, batch, item_id, chosen if batch["multi_label"] else chosen[0], flagged, reason)


def validator_title(definition: TaskDefinition) -> str:
    """The task's title for validators: the task's ``title`` speaks to writers ("write sentences
    that fool the model"), so validators get its ``validator_title``, else what they label."""
    title = definition.get("validator_title")
    if title:
        return title
    domain = definition.get("domain")
    return f"Label sentences from {domain}" if domain else "Label sentences written by other people"


def main() -> None:
    client = state.require_role("validator")
    st.title("Validate")
    state.show_flash()
    session = study.show_progress(client, "validator")
    round_ = choose_open_round(
        client,
        ("collecting", "validating"),
        key="validator_round_id",
        none_open="No round needs labels right now. Please check back later.",
        study_round=session["round_id"] if session else None,
    )
    if round_ is None:
        return
    try:
        task = state.task_definition(client, round_["task"])
    except ApiError as error:
        state.show_api_error(error)
        return
    definition = task["definition"]
    st.caption(validator_title(definition))
    first_visit = BATCH_KEY not in st.session_state
    batch = current_batch(client, round_["id"])
    if batch is None:
        return
    items = batch["items"]
    with st.expander("Instructions", expanded=first_visit):
        steps = (
            instructions.validator_steps(
                batch["labels"],
                batch["names"],
                len(items),
                multi_label=batch["multi_label"],
                exclusive=definition.get("exclusive_labels") or [],
            )
            if items
            else ""
        )
        st.markdown(
            instructions.with_task_text(steps, definition.get("validator_instructions")) or "Label each sentence."
        )
    if not items:
        st.info(
            "Nothing to label in this round right now: every sentence has its labels or is held by other "
            "validators. Please check again later."
        )
        if session is not None and session.get("status") == "active":
            st.info(
                "For your study: if there is still nothing after checking again, finish the study with "
                '"No more examples to label" on the Finish page; what you labelled counts.'
            )
        if st.button("Check again", key="validator_check_again"):
            st.session_state.pop(BATCH_KEY, None)
            st.rerun()
        return
    labelled = len(batch["done"])
    st.progress(labelled / len(items), text=f"{labelled} of {len(items)} labelled")
    for index, item in enumerate(items, start=1):
        card(client, batch, index, item, definition)
    if labelled == len(items):
        st.success("Batch done. Thank you!")
        if st.button("Next batch", type="primary", key="validator_next_batch"):
            st.session_state.pop(BATCH_KEY, None)
            st.session_state.pop(SHOWN_AT_KEY, None)
            st.rerun()


main()
