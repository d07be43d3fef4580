"""The validator's page with AppTest and the fake API: a batch labelled card by card, the
label shapes of each family (single, multi-label, 5-point + unknown with the target
highlighted), flags, progress that survives a reload, and escaping."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from frontend.client import ApiError
from tests.frontend_fakes import HOSTILE, HOSTILE_ESCAPED, FakeApiClient, html_of, markdown_of, signed_in_app, texts

SENTENCES = ["The menu says it serves the best burger in town.",
             "The soup arrived after forty minutes and nobody said a word about it.",
             "The restaurant is open from noon until ten every day."]


def _validator_app(fake: FakeApiClient, username: str = "vera") -> AppTest:
    if username not in fake.users:
        fake.add_user(username, "validator")
    at = signed_in_app(fake, username)
    assert not at.exception, at.exception
    return at


def _save(at: AppTest, example_id: int, label: str | list[str], *, flag: bool = False, reason: str = "") -> AppTest:
    widget = at.pills(key=f"validator_label_{example_id}") if isinstance(label, list) else \
        at.radio(key=f"validator_label_{example_id}")
    widget.set_value(label)
    if flag:
        at.checkbox(key=f"validator_flag_{example_id}").check()
    if reason:
        at.text_input(key=f"validator_reason_{example_id}").set_value(reason)
    return at.button(key=f"validator_save_{example_id}").click().run()


@pytest.fixture
def dynasent() -> tuple[FakeApiClient, list[int]]:
    fake = FakeApiClient()
    fake.add_task("dynasent-r2")
    round_ = fake.add_round("dynasent-r2")
    ids = [fake.add_example(round_["id"], text) for text in SENTENCES]
    fake.add_example(round_["id"], "A sentence vera wrote herself.", writer="vera")
    return fake, ids


def test_batch_is_labelled_card_by_card(dynasent: tuple[FakeApiClient, list[int]]) -> None:
    fake, ids = dynasent
    at = _validator_app(fake)
    assert [t.value for t in at.title] == ["Validate"]
    assert [p.text for p in at.progress] == ["0 of 3 labelled"]
    page = html_of(at)
    assert all(text in page for text in SENTENCES) and "vera wrote herself" not in page  # never her own
    assert [c for c in texts(at.caption) if c.startswith("Sentence ")] == ["Sentence 1 of 3", "Sentence 2 of 3",
                                                                            "Sentence 3 of 3"]
    radio = at.radio(key=f"validator_label_{ids[0]}")
    assert radio.options == ["positive", "negative", "neutral", "mixed"] and radio.value is None

    _save(at, ids[0], "neutral")
    assert not at.exception, at.exception
    assert [p.text for p in at.progress] == ["1 of 3 labelled"]
    assert "Saved: **neutral**" in texts(at.success)
    assert not [r for r in at.radio if r.key == f"validator_label_{ids[0]}"]  # the card is done
    call = fake.calls_of("validate")[0]
    assert call["label"] == "neutral" and call["flagged"] is False and call["flag_reason"] is None
    assert call["idempotency_key"].startswith("validation-") and call["seconds_taken"] is not None
    assert fake.examples[ids[0]]["labels"]["vera"]["label"] == ["neutral"]

    _save(at, ids[1], "negative")
    _save(at, ids[2], "neutral")
    assert [p.text for p in at.progress] == ["3 of 3 labelled"]
    assert "Batch done. Thank you!" in texts(at.success)
    # All labelled: the next batch is empty (the own example is never offered).
    at.button(key="validator_next_batch").click().run()
    assert any(i.startswith("Nothing to label in this round right now") for i in texts(at.info))


def test_a_label_is_needed_and_api_errors_are_shown(dynasent: tuple[FakeApiClient, list[int]]) -> None:
    fake, ids = dynasent
    at = _validator_app(fake)
    at.button(key=f"validator_save_{ids[0]}").click().run()
    assert "Choose a label first." in texts(at.warning)
    assert not fake.calls_of("validate")
    fake.fail_next("validate", ApiError(403, "forbidden", "you are no longer qualified for task 'dynasent-r2'"))
    _save(at, ids[0], "positive")
    assert "you are no longer qualified for task 'dynasent-r2'" in texts(at.error)
    assert [p.text for p in at.progress] == ["0 of 3 labelled"]


def test_an_example_that_filled_up_meanwhile_closes_its_card(dynasent: tuple[FakeApiClient, list[int]]) -> None:
    fake, ids = dynasent
    at = _validator_app(fake)
    fake.examples[ids[1]]["needed"] = 0  # other validators gave its last labels meanwhile
    _save(at, ids[1], "positive")
    assert any("already has all its labels" in i for i in texts(at.info))
    assert [p.text for p in at.progress] == ["1 of 3 labelled"]


def test_flag_with_reason(dynasent: tuple[FakeApiClient, list[int]]) -> None:
    fake, ids = dynasent
    at = _validator_app(fake)
    _save(at, ids[0], "mixed", reason="Reads like an advert")
    assert "Tick the flag box to send a reason, or clear the reason." in texts(at.warning)
    assert not fake.calls_of("validate")
    at.checkbox(key=f"validator_flag_{ids[0]}").check()
    at.button(key=f"validator_save_{ids[0]}").click().run()
    stored = fake.examples[ids[0]]["labels"]["vera"]
    assert (stored["label"], stored["flagged"], stored["flag_reason"]) == (["mixed"], True, "Reads like an advert")
    assert "Saved: **mixed** (flagged)" in texts(at.success)


def test_reload_keeps_progress(dynasent: tuple[FakeApiClient, list[int]]) -> None:
    fake, ids = dynasent
    at = _validator_app(fake)
    _save(at, ids[0], "positive")
    _save(at, ids[1], "negative")
    # A reload is a new browser session: the page asks the API again, which returns the
    # example this validator still holds; the two labels are already stored.
    reloaded = _validator_app(fake)
    assert [p.text for p in reloaded.progress] == ["0 of 1 labelled"]
    page = html_of(reloaded)
    assert SENTENCES[2] in page and SENTENCES[0] not in page and SENTENCES[1] not in page
    _save(reloaded, ids[2], "neutral")
    assert [fake.examples[i]["labels"]["vera"]["label"] for i in ids] == [["positive"], ["negative"], ["neutral"]]
    assert len(fake.calls_of("validate")) == 3  # nothing was sent twice


def test_multi_label_cards() -> None:
    fake = FakeApiClient()
    fake.add_task("ethioemo-amharic")
    round_ = fake.add_round("ethioemo-amharic")
    example = fake.add_example(round_["id"], "የአውቶቡሱ ዋጋ እንደገና ጨመረ፤ ይህ ዘረፋ ነው፣ በጣም ያስጠላል!")
    at = _validator_app(fake)
    assert 'lang="am"' in html_of(at) and 'dir="auto"' in html_of(at)
    pills = at.pills(key=f"validator_label_{example}")
    assert pills.options == ["anger", "disgust", "fear", "joy", "sadness", "surprise", "neutral"]
    _save(at, example, ["neutral", "anger"])
    assert "neutral cannot be combined with other labels; choose it alone." in texts(at.warning)
    assert not fake.calls_of("validate")
    _save(at, example, ["disgust", "anger"])
    assert fake.calls_of("validate")[0]["label"] == ["disgust", "anger"]
    assert fake.examples[example]["labels"]["vera"]["label"] == ["anger", "disgust"]
    assert "Saved: **anger, disgust**" in texts(at.success)


def test_target_dependent_five_point_scale_and_unknown() -> None:
    fake = FakeApiClient()
    fake.add_task("mad-tsc")
    round_ = fake.add_round("mad-tsc")
    text = "Pedro Sánchez once again announced a housing plan that nobody in Madrid asked for."
    first = fake.add_example(round_["id"], text, target_span=(0, 13))
    second = fake.add_example(round_["id"], "Angela Merkel met the ministers in Brussels on Tuesday.",
                              target_span=(0, 13))
    at = _validator_app(fake)
    assert ">Pedro Sánchez</mark> once again" in html_of(at)
    assert "Rate the sentiment towards the highlighted target only." in texts(at.caption)
    radio = at.radio(key=f"validator_label_{first}")
    assert radio.options == ["negative", "weakly negative", "neutral", "weakly positive", "positive", "unknown"]
    _save(at, first, "weakly_negative")
    _save(at, second, "unknown")
    assert [fake.examples[i]["labels"]["vera"]["label"] for i in (first, second)] == [["weakly_negative"],
                                                                                       ["unknown"]]
    assert "Saved: **weakly negative**" in texts(at.success)


def test_right_to_left_text_gets_auto_direction() -> None:
    fake = FakeApiClient()
    fake.add_task("dynasent-r2", language="ar")
    round_ = fake.add_round("dynasent-r2")
    fake.add_example(round_["id"], "الخدمة كانت بطيئة لكن الطعام لذيذ")
    at = _validator_app(fake)
    assert '<div class="dl-text" dir="auto" lang="ar"' in html_of(at)
    assert "الخدمة كانت بطيئة لكن الطعام لذيذ" in html_of(at)


def test_hostile_text_is_shown_literally_on_the_validator_page() -> None:
    fake = FakeApiClient()
    fake.add_task("mad-tsc")
    round_ = fake.add_round("mad-tsc")
    fake.add_example(round_["id"], HOSTILE)
    fake.add_example(round_["id"], "<b>Bob</b> " + HOSTILE, target_span=(3, 6))
    at = _validator_app(fake)
    page = html_of(at)
    assert page.count(HOSTILE_ESCAPED) == 2 and "&lt;b&gt;<mark" in page
    assert "<script>" not in page and "<img" not in page and "<b>Bob" not in page
    assert "alert(" not in markdown_of(at)


def test_validator_only_sees_rounds_that_take_labels() -> None:
    fake = FakeApiClient()
    fake.add_task("dynasent-r2")
    fake.add_round("dynasent-r2", status="closed")
    at = _validator_app(fake)
    assert "No round needs labels right now. Please check back later." in texts(at.info)
