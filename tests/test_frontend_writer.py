"""The writer's page with AppTest against the real API (tests/frontend_live.py): the DynaSent
loop (check -> fooled -> confirm -> submit), tries running out, a 503 that keeps the text, the
onboarding quiz, the family fields (iSarcasm, MAD-TSC target span), Inspect, escaping; and the
render helpers."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select
from streamlit.testing.v1 import AppTest

from frontend import render
from frontend.client import ApiError, Assignment
from services.db.models import Assignment as AssignmentRow
from services.db.models import Example as ExampleRow
from tests.frontend_live import (
    HOSTILE,
    HOSTILE_ESCAPED,
    LiveApi,
    PageClient,
    html_of,
    markdown_of,
    signed_in_app,
    texts,
)
from tests.stub_model_server import classify

LABELS = ["positive", "negative", "neutral"]
NAMES = {"positive": "Positive", "negative": "Negative", "neutral": "No sentiment"}  # dynasent-r2's label_names
SOUP = "The soup was fine and the bread was fresh."
SUNDAY = "We went there on a Sunday afternoon."
ATTEMPTS = r"/assignments/\d+/attempts"


def fooling(target: str) -> str:
    """A sentence the stub model labels otherwise than ``target`` (DynaSent single-label)."""
    if target == "positive":
        return "The host did a terrible job of making me feel welcome."
    return "The host did a great job of making me feel unwanted."


def honest(target: str, variant: int) -> str:
    """A sentence the stub model labels ``target``."""
    words = {"positive": ("great", "wonderful"), "negative": ("cold", "rude"), "neutral": ("served", "sliced")}
    return f"The soup was {words[target][variant]} and the bread came with it."


def writer_app(live: LiveApi) -> tuple[AppTest, PageClient]:
    """Walt (a writer) on the Write page; returns the app and the page's client."""
    live.user("walt", "writer")
    client = live.as_user("walt")
    at = signed_in_app(live, "walt", client=client)
    assert not at.exception, at.exception
    return at, client


def held(at: AppTest) -> Assignment:
    """The assignment the page shows."""
    assignment: Assignment = at.session_state["writer_assignment"]
    return assignment


def state(live: LiveApi, assignment_id: int) -> Assignment:
    """The assignment as the API has it now."""
    return live.api("walt").assignment(assignment_id)


def check(at: AppTest, text: str) -> AppTest:
    assignment_id = held(at)["id"]
    at.text_area(key=f"writer_text_{assignment_id}").set_value(text).run()  # the browser reruns on edit
    return at.button(key=f"writer_check_{assignment_id}").click().run()


def goal_line(assignment: Assignment) -> str:
    """The API's goal sentence as the page shows it: the target's display name emphasised."""
    target = " + ".join(assignment["label_names"][label] for label in assignment["target_label"])
    return "**Your goal:** " + assignment["goal"].replace(target, f"***{target}***", 1)


def assignments(live: LiveApi) -> int:
    """How many assignments the database holds."""
    with live.app.state.sessionmaker() as session:
        return int(session.scalar(select(func.count()).select_from(AssignmentRow)) or 0)


def example_of(live: LiveApi, assignment_id: int) -> int:
    """The id of the example submitted for the assignment."""
    with live.app.state.sessionmaker() as session:
        return int(session.scalars(select(ExampleRow.id).where(ExampleRow.assignment_id == assignment_id)).one())


@pytest.fixture
def dynasent(live: LiveApi) -> LiveApi:
    live.task("dynasent-r2", onboarding_quiz=None)
    live.round("dynasent-r2", [SOUP, SUNDAY])
    return live


def test_happy_path_check_fooled_confirm_submit(dynasent: LiveApi) -> None:
    at, client = writer_app(dynasent)
    assignment = held(at)
    aid, target = assignment["id"], assignment["target_label"][0]
    others = [NAMES[label] for label in LABELS if label != target]
    assert assignment["label_names"] == NAMES
    # The API's own sentence, in display names ...
    assert assignment["goal"].startswith(f"Write a sentence a person would label {NAMES[target]} that fools")
    assert goal_line(assignment) in texts(at.markdown)  # ... is what the page shows
    prompt = assignment["prompt"]
    assert prompt is not None and prompt["text"] in (SOUP, SUNDAY)
    assert prompt["text"] in html_of(at)  # the inspirational prompt
    assert at.text_area(key=f"writer_text_{aid}").value == prompt["text"]  # the editor starts from the prompt
    assert "Tries: **0 / 10**" in texts(at.markdown)

    text = fooling(target)
    predicted = classify(text, LABELS, False)[0]
    check(at, text)
    assert not at.exception, at.exception
    assert f"Model prediction: **{NAMES[predicted]}**" in texts(at.markdown)
    assert [p.text for p in at.progress] == [f"{NAMES[label]}: {90 if label == predicted else 5}%" for label in LABELS]
    assert "<del" in html_of(at) and "<ins" in html_of(at)  # the diff against the prompt
    assert texts(at.success) == [
        f"You fooled the model! It predicted **{NAMES[predicted]}**; your goal is **{NAMES[target]}**."
    ]
    assert "Tries: **1 / 10**" in texts(at.markdown)
    assert not [b for b in at.button if b.key == f"writer_submit_{aid}"]  # no submit before confirming
    sent = client.requests("POST", ATTEMPTS)
    assert sent[0].body["text"] == text and sent[0].key and sent[0].key.startswith("attempt-")

    # A second click on the same text is a retry: same key, same attempt, no new try.
    at.button(key=f"writer_check_{aid}").click().run()
    assert [s.key for s in client.requests("POST", ATTEMPTS)] == [sent[0].key] * 2
    now = state(dynasent, aid)
    assert now["tries_used"] == 1 and len(now["attempts"]) == 1

    attempt_id = now["attempts"][0]["id"]
    assert (
        at.button(key=f"writer_confirm_no_{attempt_id}").label
        == f"No, I judge this sentence to be {' or '.join(others)}."
    )
    assert at.button(key=f"writer_confirm_yes_{attempt_id}").label == (
        f"Yes, I confirm that I judge this sentence to be {NAMES[target]}."
    )
    at.button(key=f"writer_confirm_yes_{attempt_id}").click().run()
    assert state(dynasent, aid)["attempts"][0]["confirmed"] is True
    assert f"You confirmed that you judge this sentence to be **{NAMES[target]}**." in texts(at.info)

    at.button(key=f"writer_submit_{aid}").click().run()
    assert not at.exception, at.exception
    submitted = client.requests("POST", f"/assignments/{aid}/example")
    assert len(submitted) == 1 and submitted[0].body["attempt_id"] == attempt_id
    assert submitted[0].key and submitted[0].key.startswith("example-")
    assert state(dynasent, aid)["status"] == "submitted"
    assert any("Submitted! It fooled the model." in s for s in texts(at.success))
    # ... and the next prompt is there, with its own goal.
    following = held(at)
    assert following["id"] != aid and following["prompt"] is not None
    assert {prompt["text"], following["prompt"]["text"]} == {SOUP, SUNDAY}
    assert goal_line(following) in texts(at.markdown)


def test_checking_an_earlier_text_again_shows_that_attempt(dynasent: LiveApi) -> None:
    """Check A, then B, then A again: the API answers the third check with A's stored attempt (the
    same Idempotency-Key, no try used), and the page shows A's prediction, not B's."""
    at, client = writer_app(dynasent)
    aid, target = held(at)["id"], held(at)["target_label"][0]
    first, second = honest(target, 0), fooling(target)
    check(at, first)
    assert "Not fooled yet" in texts(at.info)[0]
    check(at, second)
    assert "You fooled the model!" in texts(at.success)[0]
    check(at, first)
    assert not at.exception, at.exception
    now = state(dynasent, aid)
    assert now["tries_used"] == 2 and [a["text"] for a in now["attempts"]] == [first, second]
    assert len(client.requests("POST", ATTEMPTS)) == 3
    assert f"Model prediction: **{NAMES[target]}**" in texts(at.markdown)
    assert not any("You fooled the model!" in s for s in texts(at.success))
    assert any("Not fooled yet" in i for i in texts(at.info))
    assert not [b for b in at.button if b.key == f"writer_confirm_yes_{now['attempts'][1]['id']}"]
    assert "Tries: **2 / 10**" in texts(at.markdown)


def test_confirming_no_with_the_judged_label(dynasent: LiveApi) -> None:
    at, _ = writer_app(dynasent)
    aid, target = held(at)["id"], held(at)["target_label"][0]
    check(at, fooling(target))
    attempt_id = state(dynasent, aid)["attempts"][0]["id"]
    judged = next(label for label in LABELS if label != target)
    at.selectbox(key=f"writer_judged_{attempt_id}").set_value(judged)
    assert at.selectbox(key=f"writer_judged_{attempt_id}").options == [
        NAMES[label] for label in LABELS if label != target
    ]
    assert "You fooled the model!" in texts(at.success)[0]
    at.button(key=f"writer_confirm_no_{attempt_id}").click().run()
    stored = state(dynasent, aid)["attempts"][0]
    assert (stored["confirmed"], stored["judged_label"]) == (False, [judged])
    # The page follows the answer: the writer's judgement, no "You fooled the model!" any more.
    assert not any("fooled the model!" in message for message in texts(at.success)), texts(at.success)
    (judgement,) = texts(at.info)
    assert judgement.startswith(f"You judged this sentence **{NAMES[judged]}**, not **{NAMES[target]}**.")
    assert "did not fool the model" in judgement
    assert not [b for b in at.button if b.key.startswith("writer_confirm_")]
    assert at.button(key=f"writer_submit_{aid}")  # a "no" can still be submitted
    at.run()  # a rerun (or reload) draws the same judgement from the API's answer
    assert texts(at.info) == [judgement] and not texts(at.success)


def test_confirming_no_without_a_label(dynasent: LiveApi) -> None:
    at, _ = writer_app(dynasent)
    aid, target = held(at)["id"], held(at)["target_label"][0]
    check(at, fooling(target))
    attempt_id = state(dynasent, aid)["attempts"][0]["id"]
    at.button(key=f"writer_confirm_no_{attempt_id}").click().run()
    assert texts(at.info)[0].startswith(f"You judged this sentence not **{NAMES[target]}**.")
    assert not texts(at.success)


def test_not_fooled_until_the_tries_run_out(live: LiveApi) -> None:
    live.task("dynasent-r2", onboarding_quiz=None, tries_per_assignment=2)
    live.round("dynasent-r2", [SOUP])
    at, client = writer_app(live)
    aid, target = held(at)["id"], held(at)["target_label"][0]
    check(at, honest(target, 0))  # the model is right
    assert f"Model prediction: **{NAMES[target]}**" in texts(at.markdown)
    assert any(i.startswith("Not fooled yet") and "(1 tries left)" in i for i in texts(at.info))
    assert not [b for b in at.button if b.key == f"writer_submit_{aid}"]
    check(at, honest(target, 1))
    assert "Tries: **2 / 2**" in texts(at.markdown)
    assert at.button(key=f"writer_check_{aid}").disabled
    assert "You have used all 2 tries. Submit your last sentence or switch to the next prompt." in texts(at.warning)
    at.button(key=f"writer_submit_{aid}").click().run()
    last = state(live, aid)["attempts"][-1]
    assert last["text"] == honest(target, 1)
    assert client.requests("POST", f"/assignments/{aid}/example")[0].body["attempt_id"] == last["id"]
    assert state(live, aid)["status"] == "submitted"


def test_model_unavailable_keeps_the_text_and_uses_no_try(dynasent: LiveApi) -> None:
    at, client = writer_app(dynasent)
    aid, target = held(at)["id"], held(at)["target_label"][0]
    dynasent.stubs.mode("fail")
    check(at, fooling(target))
    assert not at.exception, at.exception
    assert "The model is not answering; try again in 5 s. Your text is kept and no try was used." in texts(at.warning)
    assert at.text_area(key=f"writer_text_{aid}").value == fooling(target)
    assert state(dynasent, aid)["tries_used"] == 0
    # A rerun (or a page switch and back) keeps the text too.
    at.run()
    assert at.text_area(key=f"writer_text_{aid}").value == fooling(target)
    assert any("did not reach the model" in w for w in texts(at.warning))

    dynasent.stubs.mode("normal")
    at.button(key=f"writer_check_{aid}").click().run()
    assert f"Model prediction: **{NAMES[classify(fooling(target), LABELS, False)[0]]}**" in texts(at.markdown)
    keys = {sent.key for sent in client.requests("POST", ATTEMPTS)}
    now = state(dynasent, aid)
    assert len(keys) == 1 and len(now["attempts"]) == 1  # the retry scored the saved attempt
    assert now["tries_used"] == 1 and now["attempts"][0]["status"] == "scored"


def test_other_errors_show_the_api_message(dynasent: LiveApi) -> None:
    at, _ = writer_app(dynasent)
    with pytest.raises(ApiError) as refused:  # what the API says to a too short text
        dynasent.api("walt").attempt(held(at)["id"], "hi")
    check(at, "hi")
    assert refused.value.status == 422 and refused.value.message in texts(at.error)


def test_switch_to_next_prompt(dynasent: LiveApi) -> None:
    at, _ = writer_app(dynasent)
    first = held(at)["id"]
    at.button(key=f"writer_skip_{first}").click().run()
    assert state(dynasent, first)["status"] == "skipped"
    assert held(at)["id"] != first
    assert "Switched to the next prompt." in texts(at.info)
    at.button(key=f"writer_skip_{held(at)['id']}").click().run()
    assert any("you have seen all 2 prompts" in e for e in texts(at.error))


def quiz_task(live: LiveApi, max_attempts: int = 5) -> list[str]:
    """DynaSent's task with its quiz (at most ``max_attempts``); returns the right answers."""
    from services.taskdef import example_path, load_task_definition

    quiz = load_task_definition(example_path("dynasent-r2")).onboarding_quiz
    assert quiz is not None
    live.task("dynasent-r2", onboarding_quiz={**quiz.model_dump(mode="json"), "max_attempts": max_attempts})
    live.round("dynasent-r2", [SOUP])
    return [question.answer for question in quiz.questions]


def answer_quiz(at: AppTest, answers: list[str]) -> AppTest:
    for index, answer in enumerate(answers):
        at.radio(key=f"writer_quiz_dynasent-r2_{index}").set_value(answer)
    return at.button(key="writer_quiz_submit").click().run()


def test_onboarding_quiz_fail_then_pass(live: LiveApi) -> None:
    answers = quiz_task(live)
    at, _ = writer_app(live)
    assert "Before you start: a short quiz" in texts(at.subheader)
    assert len(at.radio) == 8 and assignments(live) == 0
    wrong = list(answers)
    wrong[1] = "True" if answers[1] == "False" else "False"
    answer_quiz(at, wrong)
    # Which answer was wrong is never said (it would let the writer flip it and pass).
    assert "Not yet: at least one answer is wrong. Read the guidelines again; 4 attempt(s) left." in texts(at.error)
    assert any("Attempts left: **4**" in m for m in texts(at.markdown))
    answer_quiz(at, answers)
    assert "You passed the quiz. Here is your first prompt." in texts(at.success)
    assert assignments(live) == 1 and SOUP in html_of(at)


def test_passing_the_quiz_scrolls_back_to_the_top_once(live: LiveApi) -> None:
    """Submit answers sits at the bottom of the quiz; the goal that replaces it is at the top."""
    answers = quiz_task(live)
    at, _ = writer_app(live)
    assert render.SCROLL_TO_TOP_SCRIPT not in html_of(at)
    answer_quiz(at, answers)
    assert "You passed the quiz. Here is your first prompt." in texts(at.success)
    assert render.SCROLL_TO_TOP_SCRIPT in html_of(at)
    at.run()
    assert render.SCROLL_TO_TOP_SCRIPT not in html_of(at)  # not on every rerun of the writing page


def test_flipping_one_answer_per_try_never_passes(live: LiveApi) -> None:
    """No flip-to-pass: the page says the same words whichever answers were wrong, so a writer who
    flips one answer per try (first question first) has nothing to aim by. With the last answer
    wrong, they use up all five attempts and are held back; told which one was wrong, they would
    have passed on the second."""
    answers = quiz_task(live)
    at, client = writer_app(live)
    options = [question["options"] for question in live.api("walt").quiz("dynasent-r2")["questions"]]

    def other(index: int, answer: str) -> str:
        return next(option for option in options[index] if option != answer)

    given = list(answers)
    last = len(given) - 1
    given[last] = other(last, answers[last])
    errors = []
    for flipped in range(-1, 4):  # the answers as they are, then one flip per try
        if flipped >= 0:
            given[flipped] = other(flipped, given[flipped])
        answer_quiz(at, given)
        errors.append([e for e in texts(at.error) if e.startswith("Not yet") or "held back" in e])
    assert [e[0] for e in errors[:4]] == [
        f"Not yet: at least one answer is wrong. Read the guidelines again; {left} attempt(s) left."
        for left in (4, 3, 2, 1)
    ]
    assert any("you are held back from writing" in e for e in errors[4]), errors[4]
    assert not at.radio and assignments(live) == 0
    assert len(client.requests("POST", r"/tasks/dynasent-r2/quiz/attempts")) == 5
    quiz = live.api("walt").quiz("dynasent-r2")
    assert not quiz["passed"] and quiz["attempts_used"] == 5 and quiz["attempts_left"] == 0


def test_onboarding_quiz_unanswered_and_attempt_limit(live: LiveApi) -> None:
    answers = quiz_task(live, max_attempts=2)
    at, client = writer_app(live)
    at.button(key="writer_quiz_submit").click().run()
    assert "Answer every question first." in texts(at.warning)
    quiz_attempts = r"/tasks/dynasent-r2/quiz/attempts"
    assert not client.requests("POST", quiz_attempts)
    options = [question["options"] for question in live.api("walt").quiz("dynasent-r2")["questions"]]
    wrong = [next(o for o in choices if o != answer) for choices, answer in zip(options, answers, strict=True)]
    answer_quiz(at, wrong)
    answer_quiz(at, wrong)
    assert any("you are held back from writing" in e for e in texts(at.error))
    assert not at.radio and assignments(live) == 0
    assert len(client.requests("POST", quiz_attempts)) == 2


def sarcasm_app(live: LiveApi, target: str) -> tuple[AppTest, PageClient]:
    """iSarcasm, writers choose the target, no prompts; the writer has chosen ``target``."""
    live.task("isarcasm", onboarding_quiz=None)
    live.round("isarcasm", target_label_mode="writer_choice")
    at, client = writer_app(live)
    assert assignments(live) == 0
    assert at.button(key="writer_start").disabled
    at.radio(key="writer_target_choice").set_value(target).run()
    at.button(key="writer_start").click().run()
    return at, client


def test_intended_sarcasm_fields(live: LiveApi) -> None:
    at, client = sarcasm_app(live, "sarcastic")
    aid = held(at)["id"]
    assert "No prompt this time: write your sentence from scratch." in texts(at.info)
    assert (
        "**Your goal:** Write a sentence a person would label ***Sarcastic*** that fools the model into predicting "
        "Not sarcastic." in texts(at.markdown)
    )
    check(at, "Oh wonderful, another Monday meeting that could have been an email. Living the dream.")
    attempt_id = state(live, aid)["attempts"][-1]["id"]
    at.button(key=f"writer_confirm_yes_{attempt_id}").click().run()
    assert at.selectbox(key=f"writer_extra_intended_label_{aid}").value == "sarcastic"
    assert at.selectbox(key=f"writer_extra_category_{aid}").options == [
        "sarcasm",
        "irony",
        "satire",
        "understatement",
        "overstatement",
        "rhetorical question",
    ]
    assert at.button(key=f"writer_submit_{aid}").disabled  # explanation and rephrase are required
    assert "Fill in: explanation, rephrase" in texts(at.caption)
    at.text_area(key=f"writer_extra_explanation_{aid}").set_value("Nobody enjoys pointless meetings.")
    at.text_area(key=f"writer_extra_rephrase_{aid}").set_value("Another pointless meeting; I wish it were an email.")
    at.selectbox(key=f"writer_extra_category_{aid}").set_value("sarcasm")
    at.run()
    at.button(key=f"writer_submit_{aid}").click().run()
    assert not at.exception, at.exception
    extras = {
        "intended_label": "sarcastic",
        "explanation": "Nobody enjoys pointless meetings.",
        "rephrase": "Another pointless meeting; I wish it were an email.",
        "category": "sarcasm",
    }
    assert client.requests("POST", f"/assignments/{aid}/example")[0].body["extras"] == extras
    assert live.admin.example(example_of(live, aid))["extras"] == extras  # stored as sent


def test_intended_not_sarcastic_needs_no_explanation(live: LiveApi) -> None:
    at, client = sarcasm_app(live, "not_sarcastic")
    aid = held(at)["id"]
    check(at, "I am sarcastic about nothing today, the meeting was simply useful.")  # model: sarcastic
    at.button(key=f"writer_confirm_yes_{state(live, aid)['attempts'][-1]['id']}").click().run()
    assert not at.button(key=f"writer_submit_{aid}").disabled
    at.button(key=f"writer_submit_{aid}").click().run()
    assert client.requests("POST", f"/assignments/{aid}/example")[0].body["extras"] == {
        "intended_label": "not_sarcastic"
    }
    assert state(live, aid)["status"] == "submitted"


def test_target_span_picker(live: LiveApi) -> None:
    live.task("mad-tsc", onboarding_quiz=None)
    prompt = "Pedro Sánchez announced the new housing plan in a press conference in Madrid."
    live.round("mad-tsc", [{"text": prompt, "target": "Pedro Sánchez", "outlet": "El País"}])
    at, client = writer_app(live)
    aid = held(at)["id"]
    assert at.text_input(key=f"writer_target_words_{aid}").value == "Pedro Sánchez"
    assert "<mark" in html_of(at) and ">Pedro Sánchez</mark>" in html_of(at)
    assert "outlet: El País" in html_of(at)
    at.text_input(key=f"writer_target_words_{aid}").set_value("Angela Merkel").run()
    assert any("not in your sentence" in e for e in texts(at.error))
    assert at.button(key=f"writer_check_{aid}").disabled

    at.text_input(key=f"writer_target_words_{aid}").set_value("Pedro Sánchez").run()
    # Typed with a combining accent (NFD): offsets still count the stored NFC text.
    check(at, "Pedro Sa\u0301nchez once again announced a housing plan that nobody in Madrid asked for.")
    sent = client.requests("POST", ATTEMPTS)[0].body
    assert sent["target_span"] == [0, 13] and sent["text"].startswith("Pedro Sánchez")
    assert "Model prediction: **Neutral**" in texts(at.markdown)
    assert state(live, aid)["attempts"][0]["target_span"] == [0, 13]  # the API took the span


def test_target_span_picker_with_repeated_words(live: LiveApi) -> None:
    live.task("mad-tsc", onboarding_quiz=None)
    live.round("mad-tsc", ["Merkel met Merkel's old rival in Brussels on a rainy Tuesday morning."])
    at, client = writer_app(live)
    aid = held(at)["id"]
    assert any("Type the target words" in w for w in texts(at.warning))
    at.text_input(key=f"writer_target_words_{aid}").set_value("Merkel").run()
    at.selectbox(key=f"writer_target_occurrence_{aid}").set_value(1)
    check(at, "Merkel met Merkel's old rival in Brussels on a rainy Tuesday morning.")
    assert client.requests("POST", ATTEMPTS)[0].body["target_span"] == [11, 17]
    assert state(live, aid)["attempts"][0]["target_span"] == [11, 17]


def test_inspect_shades_tokens(dynasent: LiveApi) -> None:
    at, _ = writer_app(dynasent)
    aid = held(at)["id"]
    at.text_area(key=f"writer_text_{aid}").set_value("A great <b>meal</b>, but cold.")
    at.button(key=f"writer_inspect_{aid}").click().run()
    shading = next(h for h in texts(at.get("html")) if "dl-inspect" in h)
    assert 'title="+0.600" style="background: rgba(22, 163, 74, 0.75)' in shading  # great: towards
    assert 'title="-0.600" style="background: rgba(220, 38, 38, 0.75)' in shading  # cold: away
    assert "&lt;" in shading and "<b>meal" not in shading and "[CLS]" not in shading
    assert state(dynasent, aid)["tries_used"] == 0  # Inspect uses no try
    dynasent.stubs.mode("fail")
    at.button(key=f"writer_inspect_{aid}").click().run()
    assert any(w.startswith("Inspect is not available right now") for w in texts(at.warning))


def test_hostile_text_is_shown_literally_on_the_writer_page(live: LiveApi) -> None:
    live.task("dynasent-r2", onboarding_quiz=None)
    live.round("dynasent-r2", [{"text": HOSTILE + " great", "note": "<i>x</i>"}])
    at, _ = writer_app(live)
    check(at, HOSTILE + " great food")
    page_html = html_of(at)
    assert HOSTILE_ESCAPED in page_html and "&lt;i&gt;x&lt;/i&gt;" in page_html
    assert "<script>" not in page_html and "<img" not in page_html
    assert "Model prediction: **Positive**" in texts(at.markdown)
    assert "alert(" not in markdown_of(at)


# --- render helpers -------------------------------------------------------------------


def test_text_html_escapes_and_sets_direction_and_language() -> None:
    markup = render.text_html(HOSTILE, lang="am")
    assert HOSTILE_ESCAPED in markup and 'dir="auto"' in markup and 'lang="am"' in markup
    rtl = render.text_html("الخدمة كانت ممتازة", lang="ar")
    assert 'dir="auto"' in rtl and "الخدمة كانت ممتازة" in rtl
    assert render.escape('"><x') == "&quot;&gt;&lt;x"


def test_escape_markdown_keeps_text_literal() -> None:
    assert render.escape_markdown("**bold** [link](http://x)") == r"\*\*bold\*\* \[link\]\(http\:\/\/x\)"
    assert render.escape_markdown("<script>") == r"\<script\>"
    assert render.escape_markdown(":red[x] $x$") == r"\:red\[x\] \$x\$"
    assert render.escape_markdown("ዛሬ በጣም") == "ዛሬ በጣም"


def test_diff_html_marks_deleted_and_inserted_words_escaped() -> None:
    markup = render.diff_html("The team did a great job.", "The host did a <great> job!")
    assert '<del style="background: #fde2e2; color: #9b1c1c;">team </del>' in markup
    assert '<ins style="background: #dcfce7; color: #14532d;">host </ins>' in markup
    phrase = render.diff_html("The soup tasted like it had been reheated.", "The host did a great job.")
    assert phrase.count("<del") == 1 and phrase.count("<ins") == 1  # one phrase out, one phrase in
    assert "&lt;" in markup and "&gt;" in markup and "<great" not in markup and "great>" not in markup
    assert render.diff_html("same", "same").count("<del") == 0


def test_find_spans_counts_nfc_code_points() -> None:
    assert render.find_spans("Pedro Sánchez met Sánchez", "Sánchez") == [(6, 13), (18, 25)]
    assert render.find_spans("Pedro Sa\u0301nchez left.", "Pedro Sánchez") == [(0, 13)]
    assert render.find_spans("pedro sánchez left.", "Pedro Sánchez") == [(0, 13)]  # case-insensitive fallback
    assert render.find_spans("  ጠቅላይ ሚኒስትሩ ዛሬ", "ሚኒስትሩ") == [(5, 10)]  # surrounding space trimmed
    assert render.find_spans("Pedro left.", "Merkel") == [] and render.find_spans("x", "  ") == []


def test_highlight_and_attributions_escape_every_piece() -> None:
    markup = render.highlight_html("<b>Bob</b> & co", 3, 6)
    assert "&lt;b&gt;<mark" in markup and ">Bob</mark>&lt;/b&gt; &amp; co" in markup
    tokens: list[dict[str, Any]] = [
        {"token": "<s>", "score": 0.0},
        {"token": "Ġ<b>", "score": 0.5},
        {"token": "Ġno", "score": -0.25},
        {"token": "pe", "score": 0.1},
        {"token": "</s>", "score": 0.0},
    ]
    shaded = render.attributions_html(tokens, label="weakly_positive")
    assert ">&lt;b&gt;</span>" in shaded and ">no</span><span" in shaded  # BPE pieces join into words
    assert "weakly positive" in shaded and "<s>" not in shaded
    wordpiece = render.attributions_html(
        [{"token": "un", "score": 0.2}, {"token": "##kind", "score": 0.4}], label="negative"
    )
    assert ">un</span><span" in wordpiece and ">kind</span>" in wordpiece


def test_the_goal_is_the_apis_sentence_escaped_with_the_target_emphasised() -> None:
    goal = "Write a negative sentence that fools the model into predicting positive or neutral."
    assert render.emphasize_markdown(goal, "negative") == (
        r"Write a ***negative*** sentence that fools the model into predicting positive or neutral\."
    )
    # Only a whole word, the first one: not "negative" inside "weakly_negative".
    assert (
        render.emphasize_markdown("Write a weakly_negative, not a negative, one.", "negative")
        == r"Write a weakly\_negative\, not a ***negative***\, one\."
    )
    assert (
        render.emphasize_markdown("exactly anger + disgust.", "anger + disgust") == r"exactly ***anger \+ disgust***\."
    )
    # Text from the API is never Markdown or HTML; a phrase that is not there changes nothing.
    assert render.emphasize_markdown("<b>**x**</b> [a](b)", "positive") == r"\<b\>\*\*x\*\*\<\/b\> \[a\]\(b\)"
    assert render.emphasize_markdown("a *b* c", "*b*") == r"a ***\*b\**** c"


def test_instructions_come_from_the_task_and_sit_below_the_editor(live: LiveApi) -> None:
    live.task("dynasent-r2", onboarding_quiz=None, tries_per_assignment=3)
    live.round("dynasent-r2", [SOUP])
    at, _ = writer_app(live)
    aid = held(at)["id"]
    assert [t.value for t in at.title] == ["Write"] and not at.subheader  # one heading
    expander = next(e for e in at.expander if e.label == "Instructions")
    words = "\n".join(texts(expander.markdown))
    # The numbers and labels are the task's; the steps are the page's, in its order.
    assert "one of your **3 tries** for this prompt" in words and "10 tries" not in words
    assert "The labels are **Positive**, **Negative** and **No sentiment**." in words
    steps = [words.index(f"**{button}**") for button in ("Check with the model", "Yes, I confirm ...", "Submit")]
    assert steps == sorted(steps), words
    assert "hit the **Submit** button" not in words  # the old "submit, then confirm" order is gone
    assert "Tries: **0 / 3**" in texts(at.markdown)
    for button in ("Check with the model", "Inspect", "Switch to next prompt"):
        assert button in words and any(b.label == button for b in at.button)
    # The task's own text follows as an extra paragraph.
    assert "The **inspirational prompt** is a sentence from a restaurant or business review." in words
    # Goal, prompt and editor come before the instructions on the page.
    order = [type(node).__name__ for node in at.main]
    assert order.index("TextArea") < order.index("Expander"), order
    assert at.text_area(key=f"writer_text_{aid}").label == "Your sentence"


def test_an_attention_check_is_shown_between_prompts_and_answered(live: LiveApi) -> None:
    question = "For this question, choose 'Strongly disagree'."
    checks = {
        "every_n_assignments": 1,
        "fails_to_screen_out": 2,
        "items": [{"question": question, "options": ["Agree", "Strongly disagree"], "answer": "Strongly disagree"}],
    }
    live.task("dynasent-r2", onboarding_quiz=None, attention_checks=checks)
    live.round("dynasent-r2", [SOUP, SUNDAY])
    at, client = writer_app(live)
    at.button(key=f"writer_skip_{held(at)['id']}").click().run()
    assert not at.exception, at.exception
    # The next prompt waits for the check: an ordinary question with radio options.
    assert "Before your next prompt: one question" in texts(at.subheader)
    check = live.api("walt").pending_attention_checks()[0]
    radio = at.radio(key=f"writer_attention_{check['id']}")
    assert radio.label == question and list(radio.options) == ["Agree", "Strongly disagree"]
    at.button(key="writer_attention_submit").click().run()
    assert "Choose one of the options first." in texts(at.warning)
    assert not client.requests("POST", r"/attention-checks/\d+/answer")
    at.radio(key=f"writer_attention_{check['id']}").set_value("Strongly disagree")
    at.button(key="writer_attention_submit").click().run()
    assert not at.exception, at.exception
    assert "Thank you. Here is your next prompt." in texts(at.success)
    assert [request.body for request in client.requests("POST", r"/attention-checks/\d+/answer")] == [
        {"answer": "Strongly disagree"}
    ]
    assert live.api("walt").pending_attention_checks() == []
    assert held(at)["status"] == "active" and assignments(live) == 2
