"""Property tests for the text policy (services/text.py, docs/design.md "Text policy").

``normalize_text`` NFC-normalises, turns CRLF and CR into LF and trims; ``clean_text`` refuses
control characters, bidi embeddings/overrides/isolates, lone surrogates, empty and over- or
under-long text with :class:`services.errors.Invalid` (the API's 422), strips invisible
format characters (zero width space, word joiner, BOM, soft hyphen, joiners that join
nothing) and otherwise returns ``normalize_text`` of its input. Whatever Unicode comes in
(right-to-left text, Ge'ez, emoji sequences, combining marks, odd white space), nothing but
``Invalid`` may come out.
"""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from services.errors import Invalid
from services.text import clean_text, normalize_text

settings.register_profile("text-properties", max_examples=300, deadline=None, derandomize=True)
PROFILE = settings.get_profile("text-properties")

ALLOWED_CONTROL = {"\n", "\t", "\r"}
REFUSED_CONTROL = (
    [chr(c) for c in range(0x20) if chr(c) not in ALLOWED_CONTROL]
    + [chr(c) for c in range(0x7F, 0xA0)]
    + ["\u2028", "\u2029"]
)

# Explicit bidi formatting: embeddings, overrides, isolates and their terminators.
REFUSED_BIDI = [chr(c) for c in range(0x202A, 0x202F)] + [chr(c) for c in range(0x2066, 0x206A)]
# Invisible format characters the policy strips wherever they are.
STRIPPED = ["\u200b", "\u2060", "\ufeff", "\u00ad", "\u2061", "\u206a", "\U000e0041"]

# Pieces of real text in several scripts, and the characters that make text hard.
RTL = ["שלום עולם", "مرحبا بالعالم", "\u200f", "\u200e", "\u202b", "\u202c", "\u2067", "\u2069", "ـ"]
GEEZ = ["ሰላም", "ዓለም", "የአውቶቡሱ ዋጋ እንደገና ጨመረ።", "\u1361", "\u1362", "ፈ", "\u135d"]  # ፡ ። and a combining mark
EMOJI = ["😀", "👩\u200d👩\u200d👧", "👍🏽", "🇪🇹", "❤\ufe0f", "\U0001f3f3\ufe0f\u200d\U0001f308"]
COMBINING = ["e\u0301", "\u0301", "a\u0308\u0304", "\u1100\u1161\u11a8", "\u0915\u094d\u0937", "ạ\u0302", "\u0338"]
SPACE = [" ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u2003", "\u3000", "\u200b", "\ufeff", "\u180e"]
PIECES = RTL + GEEZ + EMOJI + COMBINING + SPACE + ["the", "soup", "", "x"]

# Any Unicode scalar value (no surrogates: UTF-8 cannot encode them), and text built from the
# pieces above, mixed.
ANY_CHAR = st.characters(codec="utf-8")
HARD_TEXT = st.lists(st.one_of(st.sampled_from(PIECES), st.sampled_from(REFUSED_CONTROL), ANY_CHAR), max_size=40).map(
    "".join
)
TEXT = st.one_of(st.text(ANY_CHAR, max_size=60), HARD_TEXT)
# Text without any control character clean_text refuses (so it can only fail on length or words).
CLEAN_CHAR = ANY_CHAR.filter(lambda c: c not in REFUSED_CONTROL and c not in REFUSED_BIDI)
CLEAN_TEXT = st.one_of(
    st.text(CLEAN_CHAR, max_size=60),
    st.lists(st.one_of(st.sampled_from([p for p in PIECES if p not in REFUSED_BIDI]), CLEAN_CHAR), max_size=40).map(
        "".join
    ),
)
LIMITS = st.tuples(st.integers(0, 20), st.integers(0, 80), st.integers(0, 6))


def words(value: str) -> int:
    """Words as clean_text counts them: runs of characters between white space or the Ethiopic
    word space (U+1361)."""
    return len(value.replace("\u1361", " ").split())


@PROFILE
@given(TEXT)
@example("  a\r\nb\rc  ")
@example("e\u0301\u0301 ")
@example("\u1100\u1161\u11a8")
def test_normalize_is_idempotent_nfc_lf_only_and_trimmed(value: str) -> None:
    normal = normalize_text(value)
    assert normalize_text(normal) == normal
    assert unicodedata.is_normalized("NFC", normal)
    assert "\r" not in normal
    assert normal == normal.strip()


@PROFILE
@given(st.text(ANY_CHAR.filter(lambda c: c != "\r")), st.text(ANY_CHAR.filter(lambda c: c != "\r")))
def test_crlf_and_a_lone_cr_become_one_lf(before: str, after: str) -> None:
    expected = normalize_text(before + "\n" + after)
    assert normalize_text(before + "\r\n" + after) == expected
    assert normalize_text(before + "\r" + after) == expected


@PROFILE
@given(TEXT, LIMITS, st.sampled_from(["text", "explanation", "line 3: text"]))
@example("ሰላም፡ዓለም፡እንዴት ነሽ", (1, 280, 2), "text")
@example("\u200b\u200b\u200b\u200b \ufeff\u2060", (1, 100, 1), "text")
@example("e\u0301" * 10, (10, 10, 1), "text")
def test_clean_text_returns_the_normalised_text_or_raises_invalid(
    value: str, limits: tuple[int, int, int], field: str
) -> None:
    min_chars, max_chars, min_words = limits
    try:
        cleaned = clean_text(value, field=field, min_chars=min_chars, max_chars=max_chars, min_words=min_words)
    except Invalid as exc:  # the documented error; anything else fails the test
        # PT017 asks for pytest.raises, but being refused is only one of the two outcomes allowed here.
        assert exc.status_code == 422 and exc.code == "invalid"  # noqa: PT017
        assert exc.message.startswith(field) and exc.details == {"field": field}  # noqa: PT017
        return
    if not any(unicodedata.category(c) == "Cf" or "\ufe00" <= c <= "\ufe0f" for c in value):
        assert cleaned == normalize_text(value)
    assert not any(c in REFUSED_BIDI or c in STRIPPED for c in cleaned)
    assert cleaned and not any(c in REFUSED_CONTROL or c == "\r" for c in cleaned)
    assert not any(unicodedata.category(c) == "Cs" for c in cleaned)
    assert min_chars <= len(cleaned) <= max_chars
    assert words(cleaned) >= min_words
    assert clean_text(cleaned, field=field, min_chars=min_chars, max_chars=max_chars, min_words=min_words) == cleaned


@PROFILE
@given(CLEAN_TEXT, st.sampled_from(REFUSED_CONTROL), CLEAN_TEXT)
def test_a_control_character_is_refused_with_its_code_point_and_position(before: str, control: str, after: str) -> None:
    with pytest.raises(Invalid) as refused:
        clean_text(before + control + after, field="text", max_chars=10_000)
    message = refused.value.message
    first = next(i for i, c in enumerate(before + control) if c in REFUSED_CONTROL)
    assert f"control character (U+{ord((before + control)[first]):04X}) at position {first}" in message
    assert message.endswith("remove it")


@PROFILE
@given(st.text(ANY_CHAR, max_size=10), st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]))
def test_a_lone_surrogate_is_refused(before: str, surrogate: str) -> None:
    with pytest.raises(Invalid, match=r"lone surrogate|control character"):
        clean_text(before + surrogate + " some words here", max_chars=10_000)


@PROFILE
@given(
    st.integers(1, 60),
    st.sampled_from([" ", "\t", "\n", "\r\n", "\u00a0", "\u2003", "\u3000"]),
    st.sampled_from(["e\u0301", "a\u0308", "\u1100\u1161"]),
)
def test_length_limits_count_the_normalised_text(n: int, pad: str, decomposed: str) -> None:
    """``n`` decomposed characters (2n code points), padded with white space: the limits
    apply to the n characters that are stored, not to what was sent."""
    value = pad + " ".join([decomposed] * n) + pad
    stored = 2 * n - 1
    assert len(value) > stored
    assert clean_text(value, min_chars=stored, max_chars=stored) == normalize_text(value)
    with pytest.raises(Invalid, match=f"has {stored} characters; the limit is {stored - 1}, shorten it"):
        clean_text(value, max_chars=stored - 1)
    with pytest.raises(Invalid, match=f"has {stored} characters; it needs at least {stored + 1}"):
        clean_text(value, min_chars=stored + 1, max_chars=10_000)


@PROFILE
@given(
    st.lists(st.sampled_from(RTL[:2] + GEEZ[:3] + EMOJI + ["the soup", "ሰላም ዓለም"]), min_size=1, max_size=8),
    st.sampled_from([" ", "\n", "\u1361", " \u200f"]),
)
def test_real_text_in_any_script_is_kept_as_typed(pieces: list[str], separator: str) -> None:
    value = separator.join(pieces)
    if not unicodedata.is_normalized("NFC", value):
        value = unicodedata.normalize("NFC", value)
    cleaned = clean_text(f"  {value}\r\n", max_chars=10_000)
    assert cleaned == value.strip()


@PROFILE
@given(st.lists(st.sampled_from(["ሰላም", "ዓለም", "እንዴት", "ነሽ"]), min_size=2, max_size=6))
def test_geez_words_separated_by_the_ethiopic_wordspace_count_as_words(parts: list[str]) -> None:
    value = "\u1361".join(parts) + "\u1362"
    assert clean_text(value, min_words=len(parts)) == value
    with pytest.raises(Invalid, match=f"has {len(parts)} word"):
        clean_text(value, min_words=len(parts) + 1)


INVISIBLE = [
    " ",
    "\t",
    "\n",
    "\u00a0",
    "\u2003",
    "\u3000",
    "\u200b",
    "\u200c",
    "\u200d",
    "\u2060",
    "\ufeff",
    "\u00ad",
    "\u200e",
    "\u200f",
    "\u180e",
]


@PROFILE
@given(st.lists(st.sampled_from(INVISIBLE), min_size=1, max_size=30).map("".join))
def test_text_with_nothing_visible_is_refused_as_empty(value: str) -> None:
    """Zero-width spaces, joiners, bidi marks and soft hyphens render as nothing: such a text
    is as empty as one of spaces, whatever its length."""
    with pytest.raises(Invalid, match="text is empty"):
        clean_text(value, min_chars=1, max_chars=1000, min_words=1)


@PROFILE
@given(CLEAN_TEXT, st.sampled_from(REFUSED_BIDI), CLEAN_TEXT)
def test_a_bidi_control_is_refused_with_its_code_point_and_position(before: str, control: str, after: str) -> None:
    """Embeddings, overrides and isolates reorder what is shown (U+202E shows "txet" for
    "text"): the sentence a validator reads would not be the one the model scored."""
    with pytest.raises(Invalid) as refused:
        clean_text(before + control + after, field="text", max_chars=10_000)
    position = len(before)
    assert f"bidirectional control character (U+{ord(control):04X} " in refused.value.message
    assert f"at position {position};" in refused.value.message


REAL_PIECES = ["שלום עולם", "مرحبا بالعالم", "ሰላም", "የአውቶቡሱ ዋጋ እንደገና ጨመረ።", "the soup", "👍🏽", "🇪🇹", "e\u0301"]


@PROFILE
@given(
    st.lists(st.tuples(st.sampled_from(REAL_PIECES), st.lists(st.sampled_from(STRIPPED), max_size=3)), min_size=1),
    st.sampled_from([" ", "\n"]),
)
def test_invisible_characters_are_stripped_and_nothing_else_changes(
    pieces: list[tuple[str, list[str]]], separator: str
) -> None:
    """Zero width spaces, word joiners, BOMs, soft hyphens, stray tag characters anywhere in
    real text: the stored text is the text without them, as it looks on screen."""
    with_invisible = separator.join(piece + "".join(invisible) for piece, invisible in pieces)
    without = separator.join(piece for piece, _ in pieces)
    assert clean_text(with_invisible, max_chars=10_000) == normalize_text(without)


@PROFILE
@given(TEXT)
def test_the_policy_is_idempotent(value: str) -> None:
    try:
        cleaned = clean_text(value, max_chars=10_000)
    except Invalid:
        return
    assert clean_text(cleaned, max_chars=10_000) == cleaned
