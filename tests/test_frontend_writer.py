"""The writer's page with AppTest and the fake API: the DynaSent loop (check -> fooled ->
confirm -> submit), tries running out, a 503 that keeps the text, the onboarding quiz, the
family fields (iSarcasm, MAD-TSC target span), Inspect, escaping; and the render helpers."""

from __future__ import annotations

from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from frontend import render
from frontend.client import ApiError
from tests.frontend_fakes import HOSTILE, HOSTILE_ESCAPED, FakeApiClient, html_of, markdown_of, signed_in_app, texts

SOUP = "The soup was fine and the bread was fresh."
FOOLING = "The host did a great job of making me feel unwanted."  # the fake model says positive


def _writer_app(fake: FakeApiClient) -> AppTest:
    fake.add_user("walt", "writer")
    at = signed_in_app(fake, "walt")
    assert not at.exception, at.exception
    return at


def _assignment(fake: FakeApiClient) -> dict[str, Any]:
    return next(a for a in reversed(list(fake.assignments.values())) if a["status"] == "active")


def _check(at: AppTest, fake: FakeApiClient, text: str) -> AppTest:
    assignment_id = _assignment(fake)["id"]
    at.text_area(key=f"writer_text_{assignment_id}").set_value(text).run()  # the browser reruns on edit
    return at.button(key=f"writer_check_{assignment_id}").click().run()


@pytest.fixture
def dynasent() -> FakeApiClient:
    fake = FakeApiClient()
    fake.add_task("dynasent-r2", onboarding_quiz=None)
    fake.add_round("dynasent-r2", [SOUP, "We went there on a Sunday afternoon."], targets=[["negative"], ["neutral"]])
    return fake


def test_happy_path_check_fooled_confirm_submit(dynasent: FakeApiClient) -> None:
    at = _writer_app(dynasent)
    assignment = _assignment(dynasent)
    aid = assignment["id"]
    assert "Your goal: enter a ***negative*** statement that fools the model into predicting positive or neutral." \
        in texts(at.markdown)
    assert SOUP in html_of(at)  # the inspirational prompt
    assert at.text_area(key=f"writer_text_{aid}").value == SOUP  # the editor starts from the prompt
    assert "Tries: **0 / 10**" in texts(at.markdown)

    _check(at, dynasent, FOOLING)
    assert not at.exception, at.exception
    assert "Model prediction: **positive**" in texts(at.markdown)
    assert [p.text for p in at.progress] == ["positive: 90%", "negative: 5%", "neutral: 5%"]
    assert "<del" in html_of(at) and "<ins" in html_of(at)  # the diff against the prompt
    assert texts(at.success) == ["You fooled the model! It predicted **positive**, but a person would say this "
                                  "sentence is **negative**."]
    assert "Tries: **1 / 10**" in texts(at.markdown)
    assert not [b for b in at.button if b.key == f"writer_submit_{aid}"]  # no submit before confirming
    attempt_call = dynasent.calls_of("attempt")[0]
    assert attempt_call["text"] == FOOLING and attempt_call["idempotency_key"].startswith("attempt-")

    # A second click on the same text is a retry: same key, same attempt, no new try.
    at.button(key=f"writer_check_{aid}").click().run()
    assert dynasent.assignments[aid]["tries_used"] == 1 and len(dynasent.attempts) == 1

    attempt_id = next(iter(dynasent.attempts))
    at.button(key=f"writer_confirm_yes_{attempt_id}").click().run()
    assert dynasent.attempts[attempt_id]["confirmed"] is True
    assert "You confirmed that you judge this sentence to be **negative**." in texts(at.info)

    at.button(key=f"writer_submit_{aid}").click().run()
    assert not at.exception, at.exception
    submitted = dynasent.calls_of("submit_example")[0]
    assert submitted["attempt_id"] == attempt_id and submitted["idempotency_key"].startswith("example-")
    assert dynasent.assignments[aid]["status"] == "submitted"
    assert any("Submitted! It fooled the model." in s for s in texts(at.success))
    # ... and the next prompt is there.
    assert _assignment(dynasent)["id"] != aid
    assert "Your goal: enter a ***neutral*** statement that fools the model into predicting positive or negative." \
        in texts(at.markdown)


def test_confirming_no_with_the_judged_label(dynasent: FakeApiClient) -> None:
    at = _writer_app(dynasent)
    _check(at, dynasent, FOOLING)
    attempt_id = next(iter(dynasent.attempts))
    assert at.button(key=f"writer_confirm_no_{attempt_id}").label == \
        "No, I judge this sentence to be positive or neutral."
    at.selectbox(key=f"writer_judged_{attempt_id}").set_value("positive")
    at.button(key=f"writer_confirm_no_{attempt_id}").click().run()
    assert (dynasent.attempts[attempt_id]["confirmed"], dynasent.attempts[attempt_id]["judged_label"]) == \
        (False, ["positive"])
    assert "You said you judge this sentence otherwise (positive)." in texts(at.info)
    assert at.button(key=f"writer_submit_{_assignment(dynasent)['id']}")  # a "no" can still be submitted


def test_not_fooled_until_the_tries_run_out(dynasent: FakeApiClient) -> None:
    fake = FakeApiClient()
    fake.add_task("dynasent-r2", onboarding_quiz=None, tries_per_assignment=2)
    fake.add_round("dynasent-r2", [SOUP], targets=[["negative"]])
    at = _writer_app(fake)
    aid = _assignment(fake)["id"]
    _check(at, fake, "The soup was cold and the bread was stale.")  # negative: the model is right
    assert "Model prediction: **negative**" in texts(at.markdown)
    assert any(i.startswith("Not fooled yet") and "(1 tries left)" in i for i in texts(at.info))
    assert not [b for b in at.button if b.key == f"writer_submit_{aid}"]
    _check(at, fake, "The soup was cold and the waiter was rude.")
    assert "Tries: **2 / 2**" in texts(at.markdown)
    assert at.button(key=f"writer_check_{aid}").disabled
    assert "You have used all 2 tries. Submit your last sentence or switch to the next prompt." in texts(at.warning)
    at.button(key=f"writer_submit_{aid}").click().run()
    assert fake.calls_of("submit_example")[0]["attempt_id"] == max(fake.attempts)
    assert fake.assignments[aid]["status"] == "submitted"


def test_model_unavailable_keeps_the_text_and_uses_no_try(dynasent: FakeApiClient) -> None:
    at = _writer_app(dynasent)
    aid = _assignment(dynasent)["id"]
    dynasent.model_down = True
    _check(at, dynasent, FOOLING)
    assert not at.exception, at.exception
    assert "The model is not answering; try again in 5 s. Your text is kept and no try was used." \
        in texts(at.warning)
    assert at.text_area(key=f"writer_text_{aid}").value == FOOLING
    assert dynasent.assignments[aid]["tries_used"] == 0
    # A rerun (or a page switch and back) keeps the text too.
    at.run()
    assert at.text_area(key=f"writer_text_{aid}").value == FOOLING
    assert any("did not reach the model" in w for w in texts(at.warning))

    dynasent.model_down = False
    at.button(key=f"writer_check_{aid}").click().run()
    assert "Model prediction: **positive**" in texts(at.markdown)
    keys = {call["idempotency_key"] for call in dynasent.calls_of("attempt")}
    assert len(keys) == 1 and len(dynasent.attempts) == 1  # the retry scored the saved attempt
    assert dynasent.assignments[aid]["tries_used"] == 1


def test_other_errors_show_the_api_message(dynasent: FakeApiClient) -> None:
    at = _writer_app(dynasent)
    dynasent.fail_next("attempt", ApiError(422, "invalid", "text has 2 characters; it needs at least 10"))
    _check(at, dynasent, "hi")
    assert "text has 2 characters; it needs at least 10" in texts(at.error)


def test_switch_to_next_prompt(dynasent: FakeApiClient) -> None:
    at = _writer_app(dynasent)
    first = _assignment(dynasent)["id"]
    at.button(key=f"writer_skip_{first}").click().run()
    assert dynasent.assignments[first]["status"] == "skipped"
    assert _assignment(dynasent)["id"] != first
    assert "Switched to the next prompt." in texts(at.info)
    at.button(key=f"writer_skip_{_assignment(dynasent)['id']}").click().run()
    assert any("you have seen all 2 prompts" in e for e in texts(at.error))


def _quiz_fake(max_attempts: int = 5) -> tuple[FakeApiClient, list[str]]:
    fake = FakeApiClient()
    task = fake.add_task("dynasent-r2")
    quiz = task["definition"]["onboarding_quiz"]
    quiz["max_attempts"] = max_attempts
    fake.add_round("dynasent-r2", [SOUP], targets=[["negative"]])
    return fake, [q["answer"] for q in quiz["questions"]]


def _answer_quiz(at: AppTest, answers: list[str]) -> AppTest:
    for index, answer in enumerate(answers):
        at.radio(key=f"writer_quiz_dynasent-r2_{index}").set_value(answer)
    return at.button(key="writer_quiz_submit").click().run()


def test_onboarding_quiz_fail_then_pass() -> None:
    fake, answers = _quiz_fake()
    at = _writer_app(fake)
    assert "Before you start: a short quiz" in texts(at.subheader)
    assert len(at.radio) == 8 and not fake.assignments
    wrong = list(answers)
    wrong[1] = "True" if answers[1] == "False" else "False"
    _answer_quiz(at, wrong)
    assert "Not yet: 7 answers right; question(s) 2 were wrong. 4 attempt(s) left." in texts(at.error)
    assert any("Attempts left: **4**" in m for m in texts(at.markdown))
    _answer_quiz(at, answers)
    assert "You passed the quiz. Here is your first prompt." in texts(at.success)
    assert fake.assignments and SOUP in html_of(at)


def test_onboarding_quiz_unanswered_and_attempt_limit() -> None:
    fake, answers = _quiz_fake(max_attempts=2)
    at = _writer_app(fake)
    at.button(key="writer_quiz_submit").click().run()
    assert "Answer every question first." in texts(at.warning)
    assert not fake.calls_of("answer_quiz")
    questions = fake.task_records["dynasent-r2"]["definition"]["onboarding_quiz"]["questions"]
    wrong = [next(o for o in q["options"] if o != q["answer"]) for q in questions]
    _answer_quiz(at, wrong)
    _answer_quiz(at, wrong)
    assert any("you are held back from writing" in e for e in texts(at.error))
    assert not at.radio and not fake.assignments
    assert len(fake.calls_of("answer_quiz")) == 2


def test_intended_sarcasm_fields() -> None:
    fake = FakeApiClient()
    fake.add_task("isarcasm", onboarding_quiz=None)
    fake.add_round("isarcasm", target_label_mode="writer_choice", no_prompt=True)
    at = _writer_app(fake)
    assert not fake.assignments
    assert at.button(key="writer_start").disabled
    at.radio(key="writer_target_choice").set_value("sarcastic").run()
    at.button(key="writer_start").click().run()
    aid = _assignment(fake)["id"]
    assert "No prompt this time: write your sentence from scratch." in texts(at.info)
    assert "Your goal: enter a post you intend to be ***sarcastic*** that fools the model into predicting not " \
           "sarcastic." in texts(at.markdown)
    _check(at, fake, "Oh wonderful, another Monday meeting that could have been an email. Living the dream.")
    attempt_id = max(fake.attempts)
    at.button(key=f"writer_confirm_yes_{attempt_id}").click().run()
    assert at.selectbox(key=f"writer_extra_intended_label_{aid}").value == "sarcastic"
    assert at.selectbox(key=f"writer_extra_category_{aid}").options == [
        "sarcasm", "irony", "satire", "understatement", "overstatement", "rhetorical question"]
    assert at.button(key=f"writer_submit_{aid}").disabled  # explanation and rephrase are required
    assert "Fill in: explanation, rephrase" in texts(at.caption)
    at.text_area(key=f"writer_extra_explanation_{aid}").set_value("Nobody enjoys pointless meetings.")
    at.text_area(key=f"writer_extra_rephrase_{aid}").set_value("Another pointless meeting; I wish it were an email.")
    at.selectbox(key=f"writer_extra_category_{aid}").set_value("sarcasm")
    at.run()
    at.button(key=f"writer_submit_{aid}").click().run()
    assert not at.exception, at.exception
    assert fake.calls_of("submit_example")[0]["extras"] == {
        "intended_label": "sarcastic", "explanation": "Nobody enjoys pointless meetings.",
        "rephrase": "Another pointless meeting; I wish it were an email.", "category": "sarcasm"}


def test_intended_not_sarcastic_needs_no_explanation() -> None:
    fake = FakeApiClient()
    fake.add_task("isarcasm", onboarding_quiz=None)
    fake.add_round("isarcasm", target_label_mode="writer_choice", no_prompt=True)
    at = _writer_app(fake)
    at.radio(key="writer_target_choice").set_value("not_sarcastic").run()
    at.button(key="writer_start").click().run()
    aid = _assignment(fake)["id"]
    _check(at, fake, "I am sarcastic about nothing today, the meeting was simply useful.")  # model: sarcastic
    at.button(key=f"writer_confirm_yes_{max(fake.attempts)}").click().run()
    assert not at.button(key=f"writer_submit_{aid}").disabled
    at.button(key=f"writer_submit_{aid}").click().run()
    assert fake.calls_of("submit_example")[0]["extras"] == {"intended_label": "not_sarcastic"}


def test_target_span_picker() -> None:
    fake = FakeApiClient()
    fake.add_task("mad-tsc", onboarding_quiz=None)
    prompt = "Pedro Sánchez announced the new housing plan in a press conference in Madrid."
    fake.add_round("mad-tsc", [{"text": prompt, "metadata": {"target": "Pedro Sánchez", "outlet": "El País"}}],
                   targets=[["negative"]])
    at = _writer_app(fake)
    aid = _assignment(fake)["id"]
    assert at.text_input(key=f"writer_target_words_{aid}").value == "Pedro Sánchez"
    assert "<mark" in html_of(at) and ">Pedro Sánchez</mark>" in html_of(at)
    assert "outlet: El País" in html_of(at)
    at.text_input(key=f"writer_target_words_{aid}").set_value("Angela Merkel").run()
    assert any("not in your sentence" in e for e in texts(at.error))
    assert at.button(key=f"writer_check_{aid}").disabled

    at.text_input(key=f"writer_target_words_{aid}").set_value("Pedro Sánchez").run()
    # Typed with a combining accent (NFD): offsets still count the stored NFC text.
    _check(at, fake, "Pedro Sa\u0301nchez once again announced a housing plan that nobody in Madrid asked for.")
    call = fake.calls_of("attempt")[0]
    assert call["target_span"] == [0, 13] and call["text"].startswith("Pedro Sánchez")
    assert "Model prediction: **neutral**" in texts(at.markdown)


def test_target_span_picker_with_repeated_words() -> None:
    fake = FakeApiClient()
    fake.add_task("mad-tsc", onboarding_quiz=None)
    fake.add_round("mad-tsc", ["Merkel met Merkel's old rival in Brussels on a rainy Tuesday morning."],
                   targets=[["negative"]])
    at = _writer_app(fake)
    aid = _assignment(fake)["id"]
    assert any("Type the target words" in w for w in texts(at.warning))
    at.text_input(key=f"writer_target_words_{aid}").set_value("Merkel").run()
    at.selectbox(key=f"writer_target_occurrence_{aid}").set_value(1)
    _check(at, fake, "Merkel met Merkel's old rival in Brussels on a rainy Tuesday morning.")
    assert fake.calls_of("attempt")[0]["target_span"] == [11, 17]


def test_inspect_shades_tokens(dynasent: FakeApiClient) -> None:
    at = _writer_app(dynasent)
    aid = _assignment(dynasent)["id"]
    at.text_area(key=f"writer_text_{aid}").set_value("A great <b>meal</b>, but cold.")
    at.button(key=f"writer_inspect_{aid}").click().run()
    shading = [h for h in texts(at.get("html")) if "dl-inspect" in h][0]
    assert 'title="+0.600" style="background: rgba(22, 163, 74, 0.75)' in shading  # great: towards
    assert 'title="-0.600" style="background: rgba(220, 38, 38, 0.75)' in shading  # cold: away
    assert "&lt;" in shading and "<b>meal" not in shading and "[CLS]" not in shading
    assert dynasent.assignments[aid]["tries_used"] == 0  # Inspect uses no try
    dynasent.model_down = True
    at.button(key=f"writer_inspect_{aid}").click().run()
    assert any(w.startswith("Inspect is not available right now") for w in texts(at.warning))


def test_hostile_text_is_shown_literally_on_the_writer_page() -> None:
    fake = FakeApiClient()
    fake.add_task("dynasent-r2", onboarding_quiz=None)
    fake.add_round("dynasent-r2", [{"text": HOSTILE + " great", "metadata": {"note": "<i>x</i>"}}],
                   targets=[["negative"]])
    at = _writer_app(fake)
    _check(at, fake, HOSTILE + " great food")
    page_html = html_of(at)
    assert HOSTILE_ESCAPED in page_html and "&lt;i&gt;x&lt;/i&gt;" in page_html
    assert "<script>" not in page_html and "<img" not in page_html
    assert "Model prediction: **positive**" in texts(at.markdown)
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
    tokens = [{"token": "<s>", "score": 0.0}, {"token": "Ġ<b>", "score": 0.5}, {"token": "Ġno", "score": -0.25},
              {"token": "pe", "score": 0.1}, {"token": "</s>", "score": 0.0}]
    shaded = render.attributions_html(tokens, label="weakly_positive")
    assert ">&lt;b&gt;</span>" in shaded and ">no</span><span" in shaded  # BPE pieces join into words
    assert "weakly positive" in shaded and "<s>" not in shaded
    wordpiece = render.attributions_html([{"token": "un", "score": 0.2}, {"token": "##kind", "score": 0.4}],
                                         label="negative")
    assert ">un</span><span" in wordpiece and ">kind</span>" in wordpiece


def test_goal_sentences_per_family() -> None:
    labels = ["positive", "negative", "neutral"]
    assert render.goal_markdown("single_label", labels, ["negative"]) == (
        "Your goal: enter a ***negative*** statement that fools the model into predicting positive or neutral.")
    assert "exactly ***anger + disgust***" in render.goal_markdown(
        "multi_label", ["anger", "disgust", "joy"], ["anger", "disgust"])
    assert "towards the target you mark in it" in render.goal_markdown("target_dependent", labels, ["positive"])
