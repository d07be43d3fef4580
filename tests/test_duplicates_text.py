"""The normalization behind the duplicate rules (services.text.normalized_for_duplicates,
docs/design.md "Duplicates"): explicit cases in Amharic, Hindi (with a zero width joiner) and
Persian (with a zero width non-joiner), and properties over any Unicode text."""

from __future__ import annotations

import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from services.text import duplicate_hash, duplicate_key, normalized_for_duplicates

settings.register_profile("duplicates", max_examples=400, deadline=None, derandomize=True)
PROFILE = settings.get_profile("duplicates")

ZWJ, ZWNJ = "\u200d", "\u200c"


def test_case_white_space_and_punctuation_do_not_make_a_new_text() -> None:
    same = ["The movie was great!", "the movie was great", "  THE   movie\twas\ngreat ... ", "The movie, was great?!"]
    assert {normalized_for_duplicates(text) for text in same} == {"the movie was great"}
    assert normalized_for_duplicates("Don't stop") == normalized_for_duplicates("dont stop")
    assert normalized_for_duplicates("Straße") == normalized_for_duplicates("STRASSE")  # full case folding
    assert normalized_for_duplicates("The movie was great") != normalized_for_duplicates("The movie was good")


def test_nfc_makes_composed_and_decomposed_text_equal_but_compatibility_forms_stay() -> None:
    assert normalized_for_duplicates("café") == normalized_for_duplicates("cafe\u0301")
    # Not NFKC: a superscript or a fraction keeps its meaning.
    assert normalized_for_duplicates("x² apples") != normalized_for_duplicates("x2 apples")
    assert normalized_for_duplicates("½ price") != normalized_for_duplicates("12 price")


def test_amharic_keeps_its_letters_and_the_ethiopic_word_space_separates_words() -> None:
    text = "የአውቶቡሱ ዋጋ እንደገና ጨመረ።"
    assert normalized_for_duplicates(text) == "የአውቶቡሱ ዋጋ እንደገና ጨመረ"  # the full stop ። is punctuation
    # ፡ (U+1361) is a word space: written with it or with spaces, the sentence is the same.
    assert normalized_for_duplicates("ሰላም፡ዓለም።") == normalized_for_duplicates("ሰላም ዓለም") == "ሰላም ዓለም"
    assert normalized_for_duplicates("ሰላም ዓለም") != normalized_for_duplicates("ሰላምዓለም")


def test_hindi_keeps_the_zero_width_joiner_and_its_vowel_signs() -> None:
    joined = f"मैं क्{ZWJ}या करूँ।"  # a half form made with ZWJ; ends with a danda
    assert normalized_for_duplicates(joined) == f"मैं क्{ZWJ}या करूँ"
    assert ZWJ in normalized_for_duplicates(joined)
    assert normalized_for_duplicates(joined) != normalized_for_duplicates("मैं क्या करूँ।")
    # Combining marks (anusvara, virama, chandrabindu) stay; only the danda went.
    assert normalized_for_duplicates("मैं") == "मैं"


def test_persian_keeps_the_zero_width_non_joiner() -> None:
    with_zwnj = f"من می{ZWNJ}خواهم بروم."
    assert normalized_for_duplicates(with_zwnj) == f"من می{ZWNJ}خواهم بروم"
    assert normalized_for_duplicates(with_zwnj) != normalized_for_duplicates("من میخواهم بروم.")
    # The Arabic comma and question mark are punctuation; the right-to-left mark is invisible.
    assert normalized_for_duplicates("خوب، نه؟") == normalized_for_duplicates("\u200fخوب نه")


def test_invisible_characters_other_than_joiners_do_not_make_a_new_text() -> None:
    assert normalized_for_duplicates("good\u200b movie\u00ad") == normalized_for_duplicates("good movie")
    assert normalized_for_duplicates("\ufeffgood movie") == "good movie"


def test_the_key_of_a_target_dependent_example_includes_its_target() -> None:
    assert duplicate_key("Apple beats Samsung", "Apple") != duplicate_key("Apple beats Samsung", "Samsung")
    assert duplicate_hash("Apple beats Samsung!", "APPLE") == duplicate_hash("apple beats samsung", "Apple")
    assert duplicate_hash("x") != duplicate_hash("x", "x")
    assert len(duplicate_hash("anything")) == 64


SCRIPTS = st.sampled_from(
    ["ሰላም", "፡", "።", "मैं", "क्", ZWJ, ZWNJ, "می", "خواهم", "،", "؟", "\u200f", "Straße", "É", "e\u0301", "!", "'"]
)
ANY_TEXT = st.lists(st.one_of(SCRIPTS, st.text(max_size=8)), max_size=12).map("".join)


@PROFILE
@given(ANY_TEXT)
def test_normalizing_is_idempotent(text: str) -> None:
    once = normalized_for_duplicates(text)
    assert normalized_for_duplicates(once) == once


@PROFILE
@given(ANY_TEXT)
def test_the_result_has_no_punctuation_no_outer_or_repeated_space_and_is_nfc(text: str) -> None:
    result = normalized_for_duplicates(text)
    assert not any(unicodedata.category(char).startswith("P") for char in result)
    assert result == result.strip() and "  " not in result
    assert not any(char.isspace() and char != " " for char in result)
    assert unicodedata.is_normalized("NFC", result)


@PROFILE
@given(ANY_TEXT, st.sampled_from(["!", "?", "...", " ", "\t", "\n", "\u200b", "\u200f", "።", "।"]))
def test_outer_space_and_trailing_punctuation_or_invisible_characters_never_change_the_result(
    text: str, tail: str
) -> None:
    assert normalized_for_duplicates(f"  {text}{tail}") == normalized_for_duplicates(text)


@PROFILE
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.'!?", max_size=40))
def test_latin_case_never_changes_the_result(text: str) -> None:
    assert normalized_for_duplicates(text.upper()) == normalized_for_duplicates(text.lower())


@PROFILE
@given(ANY_TEXT)
def test_joiners_in_the_text_survive(text: str) -> None:
    joiners = sum(text.count(j) for j in (ZWJ, ZWNJ))
    result = normalized_for_duplicates(text)
    assert sum(result.count(j) for j in (ZWJ, ZWNJ)) == joiners
