"""Normalisation and checks for text that people type (sentences, explanations, prompts)."""

from __future__ import annotations

import unicodedata

from rapidfuzz.distance import Levenshtein

from services.errors import Invalid

# Newline and tab are allowed in free text; every other control character is refused.
# Carriage returns are allowed too: browsers submit textarea line breaks as CRLF, and
# normalize_text turns CR and CRLF into LF before anything is stored.
_ALLOWED_CONTROL = {"\n", "\t", "\r"}


def _visible(char: str) -> bool:
    """Whether ``char`` shows on screen: not white space, not a format character (Cf)."""
    return not char.isspace() and unicodedata.category(char) != "Cf"


def normalize_text(value: str) -> str:
    """NFC-normalise, turn CRLF into LF and strip surrounding white space.

    NFC keeps Ge'ez and other scripts intact while making visually identical strings equal
    (important for duplicate prompts and edit distances).
    """
    return unicodedata.normalize("NFC", value.replace("\r\n", "\n").replace("\r", "\n")).strip()


def clean_text(
    value: str,
    *,
    field: str = "text",
    min_chars: int = 1,
    max_chars: int = 1000,
    min_words: int = 1,
) -> str:
    """Return ``value`` normalised, or raise :class:`Invalid` with a message that says what to fix."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Invalid(
            f"{field} is not valid UTF-8 (it contains a lone surrogate at position {exc.start}); "
            "send the text encoded as UTF-8",
            field=field,
        ) from exc
    for position, char in enumerate(value):
        if char in _ALLOWED_CONTROL:
            continue
        category = unicodedata.category(char)
        if category == "Cc" or char in ("\u2028", "\u2029") or category == "Cs":
            raise Invalid(
                f"{field} contains a control character (U+{ord(char):04X}) at position {position}; remove it",
                field=field,
            )
    text = normalize_text(value)
    if not any(_visible(char) for char in text):
        # Zero-width spaces, joiners, bidi marks, soft hyphens: none of them shows.
        invisible = " (it has only invisible characters, such as U+200B zero width space)" if text else ""
        raise Invalid(f"{field} is empty{invisible}; write some text", field=field)
    if len(text) < min_chars:
        raise Invalid(f"{field} has {len(text)} characters; it needs at least {min_chars}", field=field)
    if len(text) > max_chars:
        raise Invalid(f"{field} has {len(text)} characters; the limit is {max_chars}, shorten it", field=field)
    # Ge'ez script separates words with the Ethiopic word space (U+1361), not white space.
    words = len(text.replace("\u1361", " ").split())
    if words < min_words:
        raise Invalid(f"{field} has {words} word(s); it needs at least {min_words}", field=field)
    return text


def normalized_edit_distance(prompt: str, text: str) -> float:
    """Levenshtein distance / max(len(prompt), len(text)), as in DynaSent Fig. 2a (0.0 for two
    empty strings)."""
    longest = max(len(prompt), len(text))
    return Levenshtein.distance(prompt, text) / longest if longest else 0.0
