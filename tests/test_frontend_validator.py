"""The validator's page with AppTest against the real API (tests/frontend_live.py): a batch
labelled card by card, the label shapes of each family (single, multi-label, 5-point + unknown
with the target highlighted), flags, progress that survives a reload, and escaping."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import delete
from streamlit.testing.v1 import AppTest

from frontend.client import Round
from services.db.engine import session_scope
from services.db.models import ValidationClaim
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

SENTENCES = [
    "The menu says it serves the best burger in town.",
    "The soup arrived after forty minutes and nobody said a word about it.",
    "The restaurant is open from noon until ten every day.",
]
VALIDATIONS = r"/validation-items/[A-Za-z0-9_-]+/validations"


def validator_app(live: LiveApi, client: PageClient | None = None) -> AppTest:
    """Vera on the Validate page (she may be a writer too)."""
    LIVE.append(live)
    if "vera" not in live.tokens:
        live.user("vera", "validator")
    at = signed_in_app(live, "vera", page="app_pages/validator.py", client=client)
    assert not at.exception, at.exception
    return at


def instructions_of(at: AppTest) -> str:
    """The text of the page's Instructions expander, as a reader sees it."""
    expander = next(e for e in at.expander if e.label == "Instructions")
    return "\n".join(texts(expander.markdown))


LIVE: list[LiveApi] = []  # the test's LiveApi, for save() and key()


def key(example_id: int) -> str:
    """The opaque item id under which Vera's batch shows ``example_id`` (the page's widget keys
    and the API's path use it)."""
    return LIVE[-1].item_key("vera", example_id)


def save(at: AppTest, example_id: int, label: str | list[str], *, flag: bool = False, reason: str = "") -> AppTest:
    item = key(example_id)
    widget = (
        at.pills(key=f"validator_label_{item}") if isinstance(label, list) else at.radio(key=f"validator_label_{item}")
    )
    widget.set_value(label)
    if flag:
        at.checkbox(key=f"validator_flag_{item}").check()
    if reason:
        at.text_input(key=f"validator_reason_{item}").set_value(reason)
    return at.button(key=f"validator_save_{item}").click().run()


def round_of(live: LiveApi, example: str, **overrides: object) -> Round:
    """A collecting round of a shipped task (its quiz passed by the writers), without prompts."""
    live.task(example, **overrides)
    return live.round(example)


@pytest.fixture
def dynasent(live: LiveApi) -> tuple[LiveApi, list[int]]:
    round_ = round_of(live, "dynasent-r2")
    ids = [live.example(round_, text) for text in SENTENCES]
    live.user("vera", "validator", "writer")
    live.example(round_, "A sentence vera wrote herself.", writer="vera")
    return live, ids


def test_batch_is_labelled_card_by_card(dynasent: tuple[LiveApi, list[int]]) -> None:
    live, ids = dynasent
    client = live.as_user("vera")
    at = validator_app(live, client)
    assert [t.value for t in at.title] == ["Validate"]
    assert [p.text for p in at.progress] == ["0 of 3 labelled"]
    page = html_of(at)
    assert all(text in page for text in SENTENCES) and "vera wrote herself" not in page  # never her own
    assert [c for c in texts(at.caption) if c.startswith("Sentence ")] == [
        "Sentence 1 of 3",
        "Sentence 2 of 3",
        "Sentence 3 of 3",
    ]
    radio = at.radio(key=f"validator_label_{key(ids[0])}")
    # The options show the task's display names (label_names) and send the labels.
    assert radio.options == ["Positive", "Negative", "No sentiment", "Mixed sentiment"] and radio.value is None

    save(at, ids[0], "neutral")
    assert not at.exception, at.exception
    assert [p.text for p in at.progress] == ["1 of 3 labelled"]
    assert "Saved: **No sentiment**" in texts(at.success)
    assert not [r for r in at.radio if r.key == f"validator_label_{ids[0]}"]  # the card is done
    sent = client.requests("POST", VALIDATIONS)[0]
    assert sent.path == f"/validation-items/{key(ids[0])}/validations"
    assert sent.body["label"] == "neutral" and sent.body["flagged"] is False and "flag_reason" not in sent.body
    assert sent.key and sent.key.startswith("validation-") and sent.body["seconds_taken"] is not None
    assert live.labels_of(ids[0]) == {"vera": ["neutral"]}

    save(at, ids[1], "negative")
    save(at, ids[2], "neutral")
    assert [p.text for p in at.progress] == ["3 of 3 labelled"]
    assert "Batch done. Thank you!" in texts(at.success)
    # All labelled: the next batch is empty (the own example is never offered).
    at.button(key="validator_next_batch").click().run()
    assert any(i.startswith("Nothing to label in this round right now") for i in texts(at.info))


def test_validators_read_the_validator_title_not_the_writers_title(live: LiveApi) -> None:
    round_ = round_of(live, "dynasent-r2")
    live.example(round_, SENTENCES[0])
    at = validator_app(live)
    captions = texts(at.caption)
    assert "DynaSent Round 2: label the sentiment of review sentences" in captions, captions
    assert not any("write sentences that fool" in c for c in captions), captions


def test_without_a_validator_title_validators_read_the_domain(live: LiveApi) -> None:
    round_ = round_of(live, "dynasent-r2", validator_title=None)
    live.example(round_, SENTENCES[0])
    at = validator_app(live)
    captions = texts(at.caption)
    assert "Label sentences from reviews" in captions, captions
    assert not any("write sentences that fool" in c for c in captions), captions


def test_a_label_is_needed_and_api_errors_are_shown(dynasent: tuple[LiveApi, list[int]]) -> None:
    live, ids = dynasent
    client = live.as_user("vera")
    at = validator_app(live, client)
    at.button(key=f"validator_save_{key(ids[0])}").click().run()
    assert "Choose a label first." in texts(at.warning)
    assert not client.requests("POST", VALIDATIONS)
    # Meanwhile a researcher unqualifies Vera: the API refuses her label and says why.
    live.admin.unqualify("dynasent-r2", "vera", "agrees with nobody")
    save(at, ids[0], "positive")
    refusal = texts(at.error)
    assert len(refusal) == 1 and "you are no longer qualified for task 'dynasent-r2'" in refusal[0], refusal
    assert [p.text for p in at.progress] == ["0 of 3 labelled"]
    assert live.labels_of(ids[0]) == {}


def test_an_example_that_filled_up_meanwhile_closes_its_card(dynasent: tuple[LiveApi, list[int]]) -> None:
    live, ids = dynasent
    at = validator_app(live)
    # Vera's hold on the example lapses (her batch is still hers), and five other validators
    # are served it and give its last labels meanwhile.
    with session_scope(live.app.state.sessionmaker) as session:
        session.execute(delete(ValidationClaim))
    for number in range(5):
        live.user(f"other{number}", "validator")
        live.label_as(f"other{number}", ids[1], "negative")
    save(at, ids[1], "positive")
    assert any("already has all its labels" in i for i in texts(at.info))
    assert [p.text for p in at.progress] == ["1 of 3 labelled"]
    assert "vera" not in live.labels_of(ids[1])


def test_flag_with_reason(dynasent: tuple[LiveApi, list[int]]) -> None:
    live, ids = dynasent
    client = live.as_user("vera")
    at = validator_app(live, client)
    save(at, ids[0], "mixed", reason="Reads like an advert")
    assert "Tick the flag box to send a reason, or clear the reason." in texts(at.warning)
    assert not client.requests("POST", VALIDATIONS)
    at.checkbox(key=f"validator_flag_{key(ids[0])}").check()
    at.button(key=f"validator_save_{key(ids[0])}").click().run()
    stored = live.admin.example(ids[0])["validations"]
    assert [(v["validator"], v["label"], v["flagged"], v["flag_reason"]) for v in stored] == [
        ("vera", ["mixed"], True, "Reads like an advert")
    ]
    assert "Saved: **Mixed sentiment** (flagged)" in texts(at.success)


def test_reload_keeps_progress(dynasent: tuple[LiveApi, list[int]]) -> None:
    live, ids = dynasent
    client = live.as_user("vera")
    at = validator_app(live, client)
    save(at, ids[0], "positive")
    save(at, ids[1], "negative")
    # A reload is a new browser session: the page asks the API again, which returns the
    # example this validator still holds; the two labels are already stored.
    reloaded = validator_app(live, client)
    assert [p.text for p in reloaded.progress] == ["0 of 1 labelled"]
    page = html_of(reloaded)
    assert SENTENCES[2] in page and SENTENCES[0] not in page and SENTENCES[1] not in page
    save(reloaded, ids[2], "neutral")
    assert [live.labels_of(i)["vera"] for i in ids] == [["positive"], ["negative"], ["neutral"]]
    assert len(client.requests("POST", VALIDATIONS)) == 3  # nothing was sent twice


def test_multi_label_cards(live: LiveApi) -> None:
    round_ = round_of(live, "ethioemo-amharic")
    example = live.example(round_, "የአውቶቡሱ ዋጋ እንደገና ጨመረ፤ ይህ ዘረፋ ነው፣ በጣም ያስጠላል!")
    client = live.client(live.user("vera", "validator"))
    at = validator_app(live, client)
    assert 'lang="am"' in html_of(at) and 'dir="auto"' in html_of(at)
    pills = at.pills(key=f"validator_label_{key(example)}")
    assert [re.sub(r"\\(.)", r"\1", option) for option in pills.options] == [  # shown as written
        "Anger (ቁጣ)",
        "Disgust (መጸየፍ)",
        "Fear (ፍርሃት)",
        "Joy (ደስታ)",
        "Sadness (ሀዘን)",
        "Surprise (መገረም)",
        "No emotion",
    ]
    assert "(**No emotion** only on its own)" in instructions_of(at)
    save(at, example, ["neutral", "anger"])
    assert "No emotion cannot be combined with other labels; choose it alone." in texts(at.warning)
    assert not client.requests("POST", VALIDATIONS)
    save(at, example, ["disgust", "anger"])
    assert client.requests("POST", VALIDATIONS)[0].body["label"] == ["disgust", "anger"]
    assert live.labels_of(example) == {"vera": ["anger", "disgust"]}
    assert "Saved: **Anger (ቁጣ), Disgust (መጸየፍ)**" in texts(at.success)


def test_target_dependent_five_point_scale_and_unknown(live: LiveApi) -> None:
    round_ = round_of(live, "mad-tsc")
    text = "Pedro Sánchez once again announced a housing plan that nobody in Madrid asked for."
    first = live.example(round_, text, target_span=[0, 13])
    second = live.example(round_, "Angela Merkel met the ministers in Brussels on Tuesday.", target_span=[0, 13])
    at = validator_app(live)
    assert ">Pedro Sánchez</mark> once again" in html_of(at)
    assert "Rate the sentiment towards the highlighted target only." in texts(at.caption)
    radio = at.radio(key=f"validator_label_{key(first)}")
    assert radio.options == ["Negative", "Weakly negative", "Neutral", "Weakly positive", "Positive", "Unknown"]
    save(at, first, "weakly_negative")
    save(at, second, "unknown")
    assert [live.labels_of(i)["vera"] for i in (first, second)] == [["weakly_negative"], ["unknown"]]
    assert "Saved: **Weakly negative**" in texts(at.success)


def test_right_to_left_text_gets_auto_direction(live: LiveApi) -> None:
    round_ = round_of(live, "dynasent-r2", language="ar")
    live.example(round_, "الخدمة كانت بطيئة لكن الطعام لذيذ")
    at = validator_app(live)
    assert '<div class="dl-text" dir="auto" lang="ar"' in html_of(at)
    assert "الخدمة كانت بطيئة لكن الطعام لذيذ" in html_of(at)


def test_hostile_text_is_shown_literally_on_the_validator_page(live: LiveApi) -> None:
    round_ = round_of(live, "mad-tsc")
    live.example(round_, "Alice: " + HOSTILE, target_span=[0, 5])
    live.example(round_, "<b>Bob</b> " + HOSTILE, target_span=[3, 6])
    at = validator_app(live)
    page = html_of(at)
    assert page.count(HOSTILE_ESCAPED) == 2 and "&lt;b&gt;<mark" in page
    assert "<script>" not in page and "<img" not in page and "<b>Bob" not in page
    assert "alert(" not in markdown_of(at)


def test_validator_only_sees_rounds_that_take_labels(live: LiveApi) -> None:
    live.task("dynasent-r2")
    live.round("dynasent-r2", status="closed")
    at = validator_app(live)
    assert "No round needs labels right now. Please check back later." in texts(at.info)


def test_instructions_name_the_batch_served_and_the_buttons_words(dynasent: tuple[LiveApi, list[int]]) -> None:
    live, ids = dynasent
    at = validator_app(live)
    words = instructions_of(at)
    radio = at.radio(key=f"validator_label_{key(ids[0])}")
    # The batch served has 3 sentences (the task's batch size is 10): the instructions say 3.
    assert "This batch has **3 sentences**" in words and "10 sentences" not in words
    assert [c for c in texts(at.caption) if c.startswith("Sentence ")][-1] == "Sentence 3 of 3"
    # The labels in the instructions are the radio's options, in the same order and words.
    listed = "choose one label: " + ", ".join(f"**{o}**" for o in radio.options[:-1]) + f" or **{radio.options[-1]}**"
    assert listed in words, words
    assert "**No sentiment**" in words and "neutral" not in words.split("The sentences come from")[0]
    # The button named is the button on every card; the task's own text (what labels mean) follows.
    assert "press **Save label**" in words and at.button(key=f"validator_save_{key(ids[0])}").label == "Save label"
    assert "**No sentiment**: The sentence **does not convey anything**" in words


def test_instructions_follow_the_tasks_batch_size(live: LiveApi) -> None:
    round_ = round_of(live, "dynasent-r2", validation_batch_size=2)
    for text in SENTENCES:
        live.example(round_, text)
    at = validator_app(live)
    assert [p.text for p in at.progress] == ["0 of 2 labelled"]
    assert "This batch has **2 sentences**" in instructions_of(at)


def test_display_names_are_shown_literally(live: LiveApi) -> None:
    # A display name is researcher text: Markdown in it is shown as typed on the options.
    round_ = round_of(
        live, "dynasent-r2", label_names={"neutral": "*No* [sentiment](http://x)", "mixed": "Mixed sentiment"}
    )
    example = live.example(round_, SENTENCES[0])
    at = validator_app(live)
    radio = at.radio(key=f"validator_label_{key(example)}")
    assert radio.options[2] == r"\*No\* \[sentiment\]\(http\:\/\/x\)"
    assert "**\\*No\\* \\[sentiment" in at.expander[0].markdown[0].value
