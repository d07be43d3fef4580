"""The text policy: how text that people send is checked and normalised, the same wherever it
enters (sentences, extras, prompts, flag reasons, notes, task titles and instructions, display
names, token names). docs/design.md "Text policy" gives the reasons; in short:

=====================================================  ======================================
characters                                             what happens
=====================================================  ======================================
control characters (Cc), U+2028/U+2029, lone           refused (newline, tab and CR allowed
surrogates                                             in free text, never in names)
bidi embeddings, overrides and isolates                refused: they reorder what is shown,
(U+202A-U+202E, U+2066-U+2069)                         so readers and the model see
                                                       different sentences
implicit direction marks LRM, RLM, ALM                 kept: Arabic, Hebrew and Persian text
(U+200E, U+200F, U+061C)                               needs them around numbers and Latin
zero width joiner / non-joiner (U+200D, U+200C)        kept inside a word or emoji sequence;
                                                       stripped where they join nothing
other invisible format characters (Cf with bidi        stripped: invisible, no meaning in
class BN: U+200B, U+2060, U+FEFF, U+00AD, U+2061-4..)  any script
emoji tag sequences (U+1F3F4 + tags + U+E007F)         kept; other tag characters stripped
a variation selector right after another one           stripped
=====================================================  ======================================

Refused text gets a 422 that names the character and its position; stripping happens
silently and the stored (and returned) text is what the model and every reader see.
"""

from __future__ import annotations

import hashlib
import unicodedata

from rapidfuzz.distance import Levenshtein

from services.errors import Invalid

# Newline and tab are allowed in free text; every other control character is refused.
# Carriage returns are allowed too: browsers submit textarea line breaks as CRLF, and
# normalize_text turns CR and CRLF into LF before anything is stored.
_ALLOWED_CONTROL = {"\n", "\t", "\r"}
# unicodedata.bidirectional() of the explicit embedding, override and isolate controls.
_BIDI_CONTROLS = {"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI"}
_JOINERS = {"\u200c", "\u200d"}  # zero width non-joiner, zero width joiner
# Mongolian vowel separator: invisible, but it selects the shape of the next Mongolian letter.
_SHAPING = {"\u180e"}
_BLACK_FLAG = "\U0001f3f4"  # the base of the emoji tag sequences (flags of England, Scotland, Wales)
_CANCEL_TAG = "\U000e007f"
_MAX_TAG_SPEC = 8  # subdivision codes such as "gbsct" have at most 6 letters
# Characters that may not be in a name although the policy accepts them in free text.
_NAME_REFUSED = {"<": "less-than sign", ">": "greater-than sign"}


def _visible(char: str) -> bool:
    """Whether ``char`` shows on screen: not white space, not a format character (Cf)."""
    return not char.isspace() and unicodedata.category(char) != "Cf"


def _invisible_format(char: str) -> bool:
    """A format character that shows nothing and orders nothing (Cf with bidi class BN:
    zero width space, word joiner, BOM, soft hyphen, joiners, tags, invisible operators...)."""
    return unicodedata.category(char) == "Cf" and unicodedata.bidirectional(char) == "BN"


def _is_tag(char: str) -> bool:
    return "\U000e0020" <= char <= "\U000e007e"


def _is_variation_selector(char: str) -> bool:
    return "\ufe00" <= char <= "\ufe0f" or "\U000e0100" <= char <= "\U000e01ef"


def _char_name(char: str) -> str:
    return f"U+{ord(char):04X}" + (f" {unicodedata.name(char)}" if unicodedata.name(char, "") else "")


def _emoji_tag_sequence_end(text: str, start: int) -> int:
    """The end of the tag characters of an emoji tag sequence that begins after
    ``text[start]`` (a black flag), or ``start + 1`` when none follows."""
    end = start + 1
    while end < len(text) and _is_tag(text[end]) and end - start <= _MAX_TAG_SPEC:
        end += 1
    if end > start + 1 and end < len(text) and text[end] == _CANCEL_TAG:
        return end + 1
    return start + 1


def _strip_invisible(text: str) -> str:
    """Drop the invisible format characters the policy strips (see the module docstring)."""
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == _BLACK_FLAG:
            end = _emoji_tag_sequence_end(text, index)
            out.append(text[index:end])
            index = end
            continue
        following = text[index + 1] if index + 1 < len(text) else ""
        if _invisible_format(char):
            if char in _SHAPING:
                out.append(char)
            elif char in _JOINERS:
                before = out[-1][-1] if out else ""
                # Inside a word or emoji sequence: visible on both sides. Between two ASCII
                # characters a joiner changes nothing (no script written in ASCII joins).
                joins = before and _visible(before) and following and _visible(following)
                if joins and not (before.isascii() and following.isascii()):
                    out.append(char)
        elif _is_variation_selector(char) and out and _is_variation_selector(out[-1][-1]):
            pass
        else:
            out.append(char)
        index += 1
    return "".join(out)


def check_text(value: str, *, field: str = "text", multiline: bool = True, trim: bool = True) -> str:
    """Apply the text policy to ``value``: refuse what must be refused (with :class:`Invalid`
    naming the character and its position), then NFC-normalise, turn CRLF and CR into LF,
    strip the invisible format characters and (``trim``) surrounding white space.
    ``multiline`` allows newline, tab and CR."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Invalid(
            f"{field} is not valid UTF-8 (it contains a lone surrogate at position {exc.start}); "
            "send the text encoded as UTF-8",
            field=field,
        ) from exc
    if value.isascii() and value.isprintable():
        # No control or format character in it: nothing to refuse or strip (a prompt file's
        # common case, so imports of many rows stay fast).
        return value.strip() if trim else value
    invisible = False
    for position, char in enumerate(value):
        if multiline and char in _ALLOWED_CONTROL:
            continue
        category = unicodedata.category(char)
        invisible = invisible or category == "Cf" or _is_variation_selector(char)
        if category == "Cc" or category in ("Zl", "Zp"):
            kind, why = "a control character", ""
            if not multiline and char in _ALLOWED_CONTROL:
                kind, why = "a line break or tab", f"{field} is one line; "
            raise Invalid(
                f"{field} contains {kind} (U+{ord(char):04X}) at position {position}; {why}remove it", field=field
            )
        if category == "Cf" and unicodedata.bidirectional(char) in _BIDI_CONTROLS:
            raise Invalid(
                f"{field} contains a bidirectional control character ({_char_name(char)}) at position "
                f"{position}; it changes the order in which the text is shown, remove it",
                field=field,
            )
    text = unicodedata.normalize("NFC", value.replace("\r\n", "\n").replace("\r", "\n"))
    if invisible:
        # NFC again: a stripped character may have kept a combining mark from its base letter.
        text = unicodedata.normalize("NFC", _strip_invisible(text))
    return text.strip() if trim else text


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
    """Return free text (a sentence, an explanation, a prompt, a note) under the text policy,
    or raise :class:`Invalid` with a message that says what to fix."""
    text = check_text(value, field=field, multiline=True)
    _require_visible(value, text, field)
    if len(text) < min_chars:
        raise Invalid(f"{field} has {len(text)} characters; it needs at least {min_chars}", field=field)
    if len(text) > max_chars:
        raise Invalid(f"{field} has {len(text)} characters; the limit is {max_chars}, shorten it", field=field)
    # Ge'ez script separates words with the Ethiopic word space (U+1361), not white space.
    words = len(text.replace("\u1361", " ").split())
    if words < min_words:
        raise Invalid(f"{field} has {words} word(s); it needs at least {min_words}", field=field)
    return text


def clean_name(value: str, *, field: str, max_chars: int = 100) -> str:
    """Return a one-line name (a display name, a token name) under the text policy, or raise
    :class:`Invalid`. Names are printable text on one line; ``<`` and ``>`` are refused too, so
    that a name is never markup wherever a client shows it."""
    text = check_text(value, field=field, multiline=False)
    for position, char in enumerate(value):
        if char in _NAME_REFUSED:
            raise Invalid(
                f"{field} contains a {_NAME_REFUSED[char]} ({char}) at position {position}; names cannot "
                "contain < or >, remove it",
                field=field,
            )
    _require_visible(value, text, field)
    if len(text) > max_chars:
        raise Invalid(f"{field} has {len(text)} characters; the limit is {max_chars}, shorten it", field=field)
    return text


def _require_visible(value: str, text: str, field: str) -> None:
    if not any(_visible(char) for char in text):
        # Zero-width spaces, joiners, bidi marks, soft hyphens: none of them shows.
        invisible = " (it has only invisible characters, such as U+200B zero width space)" if value.strip() else ""
        raise Invalid(f"{field} is empty{invisible}; write some text", field=field)


def normalized_edit_distance(prompt: str, text: str) -> float:
    """Levenshtein distance / max(len(prompt), len(text)), as in DynaSent Fig. 2a (0.0 for two
    empty strings)."""
    longest = max(len(prompt), len(text))
    return Levenshtein.distance(prompt, text) / longest if longest else 0.0


# --- duplicates ------------------------------------------------------------------------

# The Ethiopic word space separates words the way a space does in Latin script (clean_text
# counts words by it too): for duplicates it is white space, not punctuation to delete.
_WORD_SPACES = {"\u1361"}


def normalized_for_duplicates(text: str) -> str:
    """The form in which two texts are the same text for the duplicate rules (a writer's
    submission, an import's repeated rows, the round builder's splits; docs/design.md
    "Duplicates"). In order:

    1. Unicode NFC (CR and CRLF as LF). Not NFKC: compatibility folding rewrites characters
       that carry meaning (``x²`` becomes ``x2``, ``½`` becomes ``1⁄2``, the Arabic ligature
       U+FDFA becomes a whole phrase, circled and superscript digits become plain digits), and
       NFC is what the text policy stores, so Ge'ez, Devanagari and Arabic-script text compares
       as it was written.
    2. Invisible format characters (Unicode category Cf: bidi marks, zero width space, soft
       hyphen...) removed, except the zero width joiner and non-joiner (U+200D, U+200C): they
       are part of how Devanagari conjuncts and Persian words are spelled (``می‌خواهم`` is not
       ``میخواهم``), so texts that differ by one are different texts.
    3. Case folded (:meth:`str.casefold`, full Unicode case folding: ``Straße`` and
       ``STRASSE`` are the same), then NFC again (folding can decompose).
    4. Punctuation (every character of Unicode category P*, in any script: ``!?.,'"``, the
       Devanagari danda, the Ethiopic full stop, the Arabic comma...) removed, so ``Don't!``
       and ``dont`` are the same. Symbols (emoji, currency) and combining marks (vowel signs,
       harakat) are kept.
    5. White space (and the Ethiopic word space U+1361) collapsed to one space and stripped at
       both ends.

    Letters of every script are otherwise unchanged. The function is idempotent."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    kept = "".join(char for char in text if char in _JOINERS or unicodedata.category(char) != "Cf")
    folded = unicodedata.normalize("NFC", kept.casefold())
    words = "".join(
        " " if char in _WORD_SPACES else "" if unicodedata.category(char).startswith("P") else char for char in folded
    )
    # NFC once more: a removed character may have stood between a letter and its combining mark.
    return unicodedata.normalize("NFC", " ".join(words.split()))


def duplicate_key(text: str, target: str | None = None) -> str:
    """What decides that two examples are the same: the normalized text and, for a
    target-dependent task, the normalized target (one sentence with two targets is two
    examples). A unit separator (U+001F) joins the two; the text policy refuses it in text."""
    key = normalized_for_duplicates(text)
    return key if target is None else f"{key}\x1f{normalized_for_duplicates(target)}"


def duplicate_hash(text: str, target: str | None = None) -> str:
    """The SHA-256 (hex) of :func:`duplicate_key`: what ``examples.normalized_hash`` stores
    and what the task's claimed texts (``example_texts``) are keyed by."""
    return key_hash(duplicate_key(text, target))


def key_hash(key: str) -> str:
    """The SHA-256 (hex) of a :func:`duplicate_key`."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()
