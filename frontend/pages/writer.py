"""The writer's page (DynaSent App. C, Figs. 7 and 8): the goal and the inspirational prompt,
an editor with a visible diff against the prompt, "Check with the model" with the prediction
and a probability bar per label, tries used, the mandatory confirmation when the model is
fooled, the task family's extra fields, "Inspect", "Switch to next prompt" and "Submit".
The onboarding quiz (Table 11) comes first when the task has one.

Everything the page needs lives in the API: a reload asks for the open assignment again and
gets the same one back with its attempts, and the text being edited is kept in the session
(``writer_drafts``) so an unavailable model (503) never costs the writer their text.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import streamlit as st

from frontend import render, state
from frontend.client import Api, ApiError, Assignment, Attempt, Label, QuizResult, Round, Task, TaskDefinition

ASSIGNMENT_KEY = "writer_assignment"
DRAFTS_KEY = "writer_drafts"
QUIZ_PASSED_KEY = "writer_quiz_passed"
QUIZ_RESULT_KEY = "writer_quiz_result"
INSPECT_KEY = "writer_inspect"
NEEDS_TARGET_KEY = "writer_needs_target"
INSTRUCTIONS_SEEN_KEY = "writer_instructions_seen"


# --- round and onboarding -----------------------------------------------------------


def choose_round(client: Api) -> Round | None:
    try:
        rounds = [r for r in client.open_rounds() if r["status"] == "collecting"]
    except ApiError as error:
        state.show_api_error(error)
        return None
    if not rounds:
        st.info("No round is collecting sentences right now. Please check back later.")
        return None
    if len(rounds) == 1:
        return rounds[0]
    by_id = {r["id"]: r for r in rounds}
    chosen = st.selectbox(
        "Task",
        list(by_id),
        key="writer_round_id",
        format_func=lambda rid: f"{by_id[rid]['task']} (round {by_id[rid]['number']})",
    )
    return by_id[chosen]


def _quiz_result(result: QuizResult) -> None:
    left = result.get("attempts_left", 0)
    if result.get("passed"):
        return
    # The API does not say which answers were wrong (flipping them would pass the quiz
    # without reading the guidelines), so neither does the page.
    st.error(f"Not yet: at least one answer is wrong. Read the guidelines again; {left} attempt(s) left.")


def onboarding(client: Api, task: Task) -> bool:
    """True when the writer may write for the task; otherwise shows the quiz."""
    name = task["name"]
    passed: dict[str, bool] = st.session_state.setdefault(QUIZ_PASSED_KEY, {})
    if passed.get(name) or not task["definition"].get("onboarding_quiz"):
        return True
    try:
        quiz = client.quiz(name)
    except ApiError as error:
        state.show_api_error(error)
        return False
    if not quiz["required"] or quiz["passed"]:
        passed[name] = True
        return True
    st.subheader("Before you start: a short quiz")
    last = st.session_state.setdefault(QUIZ_RESULT_KEY, {}).get(name)
    if quiz["attempts_left"] <= 0:
        st.error(
            f"You used all {quiz['attempts_used']} attempts at the quiz, so you are held back from writing "
            "for this task. Contact the researcher if you think this is a mistake."
        )
        return False
    st.markdown(
        "Read the instructions below, then answer **every** question correctly to start writing. "
        f"Attempts left: **{quiz['attempts_left']}**."
    )
    with st.expander("Instructions", expanded=True):
        st.markdown(task["definition"].get("instructions") or "_No instructions._")
    if last:
        _quiz_result(last)
    with st.form(f"writer_quiz_form_{name}"):
        answers = []
        for index, question in enumerate(quiz["questions"]):
            answers.append(
                st.radio(
                    f"{index + 1}. {question['text']}",
                    question["options"],
                    index=None,
                    key=f"writer_quiz_{name}_{index}",
                )
            )
        submitted = st.form_submit_button("Submit answers", type="primary", key="writer_quiz_submit")
    if submitted:
        given = [answer for answer in answers if answer is not None]
        if len(given) < len(answers):
            st.warning("Answer every question first.")
            return False
        try:
            result = client.answer_quiz(name, given)
        except ApiError as error:
            state.show_api_error(error)
            return False
        st.session_state[QUIZ_RESULT_KEY][name] = result
        if result["passed"]:
            passed[name] = True
            state.flash("success", "You passed the quiz. Here is your first prompt.")
        st.rerun()
    return False


# --- the assignment -------------------------------------------------------------------


def _forget_assignment() -> None:
    st.session_state.pop(ASSIGNMENT_KEY, None)
    st.session_state.pop(INSPECT_KEY, None)


def current_assignment(client: Api, round_: Round, task: Task) -> Assignment | None:
    """The writer's open assignment in the round (the API returns the same one on a reload)."""
    held: Assignment | None = st.session_state.get(ASSIGNMENT_KEY)
    if held and held["round_id"] == round_["id"] and held["status"] == "active":
        return held
    definition = task["definition"]
    needs_target: dict[int, bool] = st.session_state.setdefault(NEEDS_TARGET_KEY, {})
    target: Label | None = None
    if round_["target_label_mode"] == "writer_choice" and needs_target.get(round_["id"]):
        target = _choose_target(definition)
        if target is None:
            return None
    try:
        assignment = client.start_assignment(round_["id"], target)
    except ApiError as error:
        if error.status == 422 and round_["target_label_mode"] == "writer_choice" and target is None:
            needs_target[round_["id"]] = True  # no open assignment to resume: the writer picks a target
            st.rerun()
        if error.status == 403 and error.details.get("quiz_required"):
            st.session_state.setdefault(QUIZ_PASSED_KEY, {}).pop(task["name"], None)
        state.show_api_error(error)
        return None
    needs_target.pop(round_["id"], None)
    st.session_state[ASSIGNMENT_KEY] = assignment
    return assignment


def _choose_target(definition: TaskDefinition) -> Label | None:
    labels = definition["labels"]
    st.markdown("In this round **you choose** the label your sentence should have.")
    chosen: Label | None
    if definition.get("family") == "multi_label":
        chosen = st.multiselect(
            "Target labels (every one your text should express)",
            labels,
            format_func=render.label_name,
            key="writer_target_choice",
        )
    else:
        chosen = st.radio(
            "Target label",
            labels,
            index=None,
            horizontal=True,
            format_func=render.label_name,
            key="writer_target_choice",
        )
    if st.button("Start writing", type="primary", disabled=not chosen, key="writer_start"):
        return chosen
    return None


def _refresh(client: Api, assignment_id: int) -> Assignment:
    assignment = client.assignment(assignment_id)
    st.session_state[ASSIGNMENT_KEY] = assignment
    return assignment


# --- pieces of the writing view --------------------------------------------------------


def _prompt(assignment: Assignment, target: list[str], lang: str | None) -> None:
    prompt = assignment.get("prompt")
    if not prompt:
        st.info("No prompt this time: write your sentence from scratch.")
        return
    st.markdown(
        f"**Inspirational prompt** (you can use this as a starting point, but it might not be "
        f"{render.labels_text(target)}):"
    )
    render.show_text(prompt["text"], lang=lang)
    metadata = prompt.get("metadata") or {}
    if metadata:
        shown = " · ".join(f"{render.escape(str(k))}: {render.escape(str(v))}" for k, v in metadata.items())
        render.show_html(f'<div dir="auto" style="font-size: 0.85rem; color: #555;">{shown}</div>')


def _editor(assignment: Assignment, max_chars: int | None) -> str:
    """The text area, prefilled with the prompt; its text survives reruns, errors and page switches."""
    assignment_id = assignment["id"]
    key = f"writer_text_{assignment_id}"
    drafts: dict[int, str] = st.session_state.setdefault(DRAFTS_KEY, {})
    if key not in st.session_state:
        attempts = assignment.get("attempts") or []
        last_text = attempts[-1]["text"] if attempts else None
        prompt = assignment.get("prompt")
        st.session_state[key] = drafts.get(assignment_id) or last_text or (prompt["text"] if prompt else "")
    text = st.text_area(
        "Your sentence",
        key=key,
        height=130,
        max_chars=max_chars,
        help="Edit the prompt (or write from scratch), then check it with the model.",
    )
    drafts[assignment_id] = text
    return text


def _target_span(assignment: Assignment, text: str, lang: str | None) -> list[int] | None:
    """The target span picker: the writer types the target words, the page finds their offsets."""
    assignment_id = assignment["id"]
    key = f"writer_target_words_{assignment_id}"
    if key not in st.session_state:
        prompt = assignment.get("prompt")
        metadata = (prompt["metadata"] if prompt else None) or {}
        st.session_state[key] = str(metadata.get("target") or "")
    words = st.text_input(
        "Target: the words naming the person (or thing) your sentence is about, exactly as they appear in it", key=key
    )
    if not words.strip():
        st.warning("Type the target words so the model knows whom the sentence is about.")
        return None
    normalized = render.normalize_text(text)
    spans = render.find_spans(normalized, words)
    if not spans:
        st.error(
            "The target words are not in your sentence. Type them exactly as they appear in the text "
            "(same spelling and spacing), or change the sentence."
        )
        return None
    choice = 0
    if len(spans) > 1:
        choice = st.selectbox(
            f"The target occurs {len(spans)} times; which one do you mean?",
            range(len(spans)),
            key=f"writer_target_occurrence_{assignment_id}",
            format_func=lambda i: f"occurrence {i + 1} (characters {spans[i][0]}-{spans[i][1]})",
        )
    start, end = spans[choice]
    st.caption(f"Target: characters {start}-{end} of your sentence, highlighted:")
    render.show_html(render.highlight_html(normalized, start, end, lang=lang))
    return [start, end]


def _prediction(attempt: Attempt, labels: list[str], lang: str | None) -> None:
    predicted = attempt.get("prediction") or []
    st.markdown(f"Model prediction: **{render.labels_text(predicted) or 'no label'}**")
    st.caption("for the sentence you checked:")
    render.show_text(attempt["text"], lang=lang)
    probabilities = attempt.get("probabilities") or {}
    for label in labels:
        if label in probabilities:
            value = min(max(float(probabilities[label]), 0.0), 1.0)
            st.progress(value, text=f"{render.label_name(label)}: {value:.0%}")


def _confirmation(client: Api, assignment: Assignment, attempt: Attempt, definition: TaskDefinition) -> None:
    target = assignment["target_label"]
    others = [label for label in definition["labels"] if label not in target]
    wanted, predicted = render.labels_text(target), render.labels_text(attempt.get("prediction") or [])
    st.success(
        f"You fooled the model! It predicted **{predicted}**, but a person would say this sentence is **{wanted}**."
    )
    if attempt.get("confirmed") is not None:
        if attempt["confirmed"]:
            st.info(f"You confirmed that you judge this sentence to be **{wanted}**.")
        else:
            judged = render.labels_text(attempt.get("judged_label") or []) or "something else"
            st.info(f"You said you judge this sentence otherwise ({judged}).")
        return
    st.markdown(
        f"You are **required** to confirm that you judge this sentence to be **{wanted}** before you can submit."
    )
    attempt_id = attempt["id"]
    if st.button(
        f"Yes, I confirm that I judge this sentence to be {wanted}.",
        type="primary",
        key=f"writer_confirm_yes_{attempt_id}",
    ):
        _confirm(client, assignment, attempt_id, True, None)
    multi = definition.get("family") == "multi_label"
    if multi:
        judged_choice: Any = st.multiselect(
            "If not: which labels would you give it? (optional)",
            definition["labels"],
            format_func=render.label_name,
            key=f"writer_judged_{attempt_id}",
        )
    else:
        judged_choice = st.selectbox(
            "If not: which label would you give it? (optional)",
            others,
            index=None,
            format_func=render.label_name,
            key=f"writer_judged_{attempt_id}",
        )
    no_text = "other emotions" if multi else " or ".join(render.label_name(label) for label in others)
    if st.button(f"No, I judge this sentence to be {no_text}.", key=f"writer_confirm_no_{attempt_id}"):
        _confirm(client, assignment, attempt_id, False, judged_choice or None)


def _confirm(client: Api, assignment: Assignment, attempt_id: int, agrees: bool, judged: Label | None) -> None:
    try:
        client.confirm(attempt_id, agrees, judged)
        _refresh(client, assignment["id"])
    except ApiError as error:
        state.show_api_error(error)
        return
    st.rerun()


def _extras(definition: TaskDefinition, assignment: Assignment, attempt: Attempt) -> tuple[dict[str, Any], list[str]]:
    """The task's extra writer fields (``writer_fields``); returns them and what is missing."""
    extras: dict[str, Any] = {}
    missing: list[str] = []
    fields = [f for f in definition.get("writer_fields") or [] if f["name"] != "target_span"]
    if not fields:
        return extras, missing
    assignment_id = assignment["id"]
    st.markdown("**About your sentence**")
    intended = None
    for field in fields:
        name = field["name"]
        key = f"writer_extra_{name}_{assignment_id}"
        choices = field.get("choices")
        if name == "intended_label":
            choices = choices or definition["labels"]
            default = assignment["target_label"][0]
            judged = attempt.get("judged_label")
            if attempt.get("confirmed") is False and judged:
                default = judged[0]
            intended = st.selectbox(
                "Intended label: what did you mean your post to be?",
                choices,
                index=choices.index(default) if default in choices else 0,
                format_func=render.label_name,
                key=key,
            )
            extras[name] = intended
            continue
        required = bool(field.get("required")) or (
            field.get("required_when_intended") is not None and field["required_when_intended"] == intended
        )
        suffix = " (required)" if required else " (optional)"
        if choices:
            value = st.selectbox(
                f"{name.capitalize()}{suffix}", choices, index=None, format_func=render.label_name, key=key
            )
        elif name == "explanation":
            why = f"why is it {render.label_name(intended)}?" if intended else "what did you mean?"
            value = st.text_area(f"Explanation: {why}{suffix}", max_chars=field.get("max_chars"), key=key)
        elif name == "rephrase":
            value = st.text_area(
                f"Rephrase: say the same thing without sarcasm{suffix}", max_chars=field.get("max_chars"), key=key
            )
        else:
            value = st.text_input(f"{name.capitalize()}{suffix}", max_chars=field.get("max_chars"), key=key)
        if isinstance(value, str):
            value = value.strip()
        if value:
            extras[name] = value
        elif required:
            missing.append(name)
    return extras, missing


def _inspect_view(assignment_id: int, text: str, lang: str | None) -> None:
    held = st.session_state.get(INSPECT_KEY)
    if not held or held["assignment_id"] != assignment_id or held["text"] != text:
        return
    result = held["result"]
    st.markdown("**Inspect**: which words drive the model's prediction")
    render.show_html(render.attributions_html(result.get("tokens") or [], label=result.get("label", ""), lang=lang))


# --- the page -------------------------------------------------------------------------


def write(client: Api, task: Task, assignment: Assignment) -> None:
    definition = task["definition"]
    lang = definition.get("language")
    labels = definition["labels"]
    target = assignment["target_label"]
    assignment_id = assignment["id"]
    constraints = definition.get("constraints") or {}
    needs_span = task["family"] == "target_dependent" or any(
        f["name"] == "target_span" for f in definition.get("writer_fields") or []
    )

    st.subheader("Find examples that fool the model")
    seen: set[str] = st.session_state.setdefault(INSTRUCTIONS_SEEN_KEY, set())
    with st.expander("Instructions", expanded=task["name"] not in seen):  # open on the first prompt
        st.markdown(definition.get("instructions") or "_No instructions._")
    seen.add(task["name"])
    # The API's own goal sentence (plain text), escaped, with the target label in bold italics.
    st.markdown("**Your goal:** " + render.emphasize_markdown(assignment["goal"], " + ".join(target)))
    _prompt(assignment, target, lang)

    text = _editor(assignment, constraints.get("max_chars"))
    normalized = render.normalize_text(text)
    prompt = assignment.get("prompt")
    if prompt and normalized != render.normalize_text(prompt["text"]):
        st.caption("Your changes to the prompt:")
        render.show_html(render.diff_html(prompt["text"], normalized, lang=lang))
    span = _target_span(assignment, text, lang) if needs_span else None

    tries_used, tries_allowed = assignment["tries_used"], assignment["tries_allowed"]
    out_of_tries = tries_used >= tries_allowed
    cannot_check = out_of_tries or not normalized or (needs_span and span is None)
    columns = st.columns([2, 1, 2, 2])
    check = columns[0].button(
        "Check with the model", type="primary", disabled=cannot_check, key=f"writer_check_{assignment_id}"
    )
    inspect = columns[1].button(
        "Inspect",
        disabled=not normalized or (needs_span and span is None),
        key=f"writer_inspect_{assignment_id}",
        help="Which words push the model towards your goal label? Uses no try.",
    )
    skip = columns[2].button("Switch to next prompt", key=f"writer_skip_{assignment_id}")
    columns[3].markdown(f"Tries: **{tries_used} / {tries_allowed}**")

    if skip:
        try:
            client.skip(assignment_id)
        except ApiError as error:
            state.show_api_error(error)
        else:
            _forget_assignment()
            state.flash("info", "Switched to the next prompt.")
            st.rerun()
    if check:
        try:
            client.attempt(assignment_id, normalized, target_span=span)
            _refresh(client, assignment_id)
        except ApiError as error:
            if error.status == 503:
                wait = int(error.retry_after) if error.retry_after else 5
                st.warning(f"The model is not answering; try again in {wait} s. Your text is kept and no try was used.")
                with suppress(ApiError):
                    _refresh(client, assignment_id)  # the API kept the attempt, unscored
            elif error.status == 410:
                _forget_assignment()
                state.flash("warning", "This assignment expired; here is a new prompt.")
                st.rerun()
            else:
                state.show_api_error(error)
        else:
            st.rerun()  # draw the page again from the new state (tries, prediction, confirmation)
    if inspect:
        try:
            result = client.inspect(assignment_id, normalized, target_span=span)
        except ApiError as error:
            render.alert("warning", f"Inspect is not available right now: {error.message}")
        else:
            st.session_state[INSPECT_KEY] = {"assignment_id": assignment_id, "text": normalized, "result": result}
    _inspect_view(assignment_id, normalized, lang)

    attempts = assignment.get("attempts") or []
    if attempts and attempts[-1]["status"] == "model_unavailable" and not check:
        st.warning("Your last check did not reach the model. Check again: your text is kept and no try was used.")
    scored = [a for a in attempts if a["status"] == "scored"]
    if not scored:
        return
    latest = scored[-1]
    st.divider()
    _prediction(latest, labels, lang)
    if latest.get("fooled"):
        _confirmation(client, assignment, latest, definition)
    elif out_of_tries:
        st.warning(f"You have used all {tries_allowed} tries. Submit your last sentence or switch to the next prompt.")
    else:
        st.info(
            f"Not fooled yet: the model predicted your goal label. Edit your sentence and check again "
            f"({tries_allowed - tries_used} tries left)."
        )
    # DynaSent: submit once the model is fooled and the writer has confirmed, or when the
    # tries have run out (then the last sentence is submitted as a non-fooling example).
    can_submit = latest.get("confirmed") is not None if latest.get("fooled") else out_of_tries
    if not can_submit:
        return
    extras, missing = _extras(definition, assignment, latest)
    if missing:
        st.caption("Fill in: " + ", ".join(missing))
    if st.button("Submit", type="primary", disabled=bool(missing), key=f"writer_submit_{assignment_id}"):
        try:
            example = client.submit_example(assignment_id, latest["id"], extras)
        except ApiError as error:
            state.show_api_error(error)
            return
        _forget_assignment()
        st.session_state.get(DRAFTS_KEY, {}).pop(assignment_id, None)
        fooled = "It fooled the model. " if example.get("fooled") else ""
        state.flash("success", f"Submitted! {fooled}Other people will now label it. Here is your next prompt.")
        st.rerun()


def main() -> None:
    client = state.require_role("writer")
    st.title("Write")
    state.show_flash()
    round_ = choose_round(client)
    if round_ is None:
        return
    try:
        task = state.task_definition(client, round_["task"])
    except ApiError as error:
        state.show_api_error(error)
        return
    st.caption(task["title"])
    if not onboarding(client, task):
        return
    assignment = current_assignment(client, round_, task)
    if assignment is None:
        return
    write(client, task, assignment)


main()
