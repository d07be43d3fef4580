"""Rendering helpers: text that people typed is always shown exactly as typed.

Sentences, prompts and explanations come from writers; the pages show them through
:func:`show_text` and the other ``*_html`` helpers here, which HTML-escape every piece of
user text and render it with ``st.html`` (raw HTML, never the Markdown parser). So a
sentence such as ``<script>alert(1)</script>``, ``**bold**`` or ``[link](http://x)`` shows
up literally instead of running, turning bold or becoming a link. Every block of user text
carries ``dir="auto"`` (Arabic or Hebrew sentences run right to left, inside an otherwise
left-to-right page) and the task's ``lang`` (so Ge'ez and other scripts get the right fonts
and line breaking).

Only researcher-written task text (instructions, labels, quiz questions) goes through
``st.markdown``: it is meant to be Markdown, and Streamlit escapes raw HTML in it.
"""

from __future__ import annotations

import difflib
import html
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import streamlit as st

_TEXT_STYLE = "white-space: pre-wrap; overflow-wrap: anywhere; font-size: 1.05rem; line-height: 1.6;"
_SPECIAL_TOKENS = {"[CLS]", "[SEP]", "[PAD]", "[MASK]", "<s>", "</s>", "<pad>", "<mask>", "<|endoftext|>"}


def escape(text: str) -> str:
    """HTML-escape user text (quotes too, so it is safe inside attributes)."""
    return html.escape(text, quote=True)


# Every ASCII punctuation character may be backslash-escaped in CommonMark; escaping them
# all keeps emphasis, links, headings, HTML, LaTeX ($) and Streamlit's :colour[...] directives
# from being interpreted.
_MARKDOWN_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")


def escape_markdown(text: str) -> str:
    """Text to show literally inside ``st.markdown`` / ``st.error`` and friends (for short
    messages such as the API's errors, which may quote what the user sent)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text).replace("\n", "  \n")


def alert(kind: str, message: str) -> None:
    """``st.error`` / ``st.warning`` / ``st.info`` / ``st.success`` with ``message`` shown literally."""
    getattr(st, kind)(escape_markdown(message))


def _lang_attr(lang: str | None) -> str:
    return f' lang="{escape(lang)}"' if lang else ""


def text_html(text: str, *, lang: str | None = None, css_class: str = "dl-text") -> str:
    """One block of user text, escaped, with ``dir="auto"`` and the task's language."""
    return f'<div class="{css_class}" dir="auto"{_lang_attr(lang)} style="{_TEXT_STYLE}">{escape(text)}</div>'


def show_html(markup: str) -> None:
    """Render markup built by this module (every piece of user text in it is escaped)."""
    st.html(markup)


# A fixed script, no user text in it: the page's scroll containers (the document and Streamlit's
# main area, whichever scrolls) back to the top.
SCROLL_TO_TOP_SCRIPT = (
    "<script>for (const element of [document.scrollingElement, "
    '...document.querySelectorAll(\'[data-testid="stMain"], [data-testid="stAppViewContainer"]\')]) '
    "{ if (element) element.scrollTop = 0; }</script>"
)


def scroll_to_top() -> None:
    """Scroll the page back to the top (say, when the page below was replaced by another one)."""
    st.html(SCROLL_TO_TOP_SCRIPT, unsafe_allow_javascript=True)


def show_text(text: str, *, lang: str | None = None) -> None:
    """Show user text exactly as typed."""
    show_html(text_html(text, lang=lang))


def label_name(label: str, names: Mapping[str, str] | None = None) -> str:
    """What people see for ``label``: its display name from the task (``names``, the API's
    ``label_names``), else ``weakly_negative`` -> ``weakly negative``."""
    if names and label in names:
        return names[label]
    return label.replace("_", " ")


def labels_text(labels: Sequence[str], joiner: str = " + ", names: Mapping[str, str] | None = None) -> str:
    return joiner.join(label_name(label, names) for label in labels)


# --- text the server will store ------------------------------------------------------


def normalize_text(text: str) -> str:
    """What the API stores for a text: NFC, CRLF -> LF, surrounding white space trimmed.
    Target offsets are computed on this form so that they match the server's."""
    return unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n")).strip()


def find_spans(text: str, words: str) -> list[tuple[int, int]]:
    """Every ``[start, end)`` where ``words`` occurs in ``text`` (exact case first, then
    ignoring case). Offsets count code points of the NFC form, as the API does."""
    needle = normalize_text(words)
    if not needle:
        return []
    text = normalize_text(text)
    exact = [(m.start(), m.end()) for m in re.finditer(re.escape(needle), text)]
    if exact:
        return exact
    return [(m.start(), m.end()) for m in re.finditer(re.escape(needle), text, flags=re.IGNORECASE)]


def highlight_html(text: str, start: int, end: int, *, lang: str | None = None) -> str:
    """The text with ``[start, end)`` (the target) highlighted; every piece escaped."""
    start = max(0, min(start, len(text)))
    end = max(start, min(end, len(text)))
    marked = (
        f'{escape(text[:start])}<mark style="background: #ffe08a; padding: 0 2px; font-weight: 600;">'
        f"{escape(text[start:end])}</mark>{escape(text[end:])}"
    )
    return f'<div class="dl-text" dir="auto"{_lang_attr(lang)} style="{_TEXT_STYLE}">{marked}</div>'


# --- the writer's edit against the prompt ---------------------------------------------

# A word with the white space after it: a run of changed words becomes one struck-through
# phrase followed by one inserted phrase, instead of alternating word by word.
_WORD_RE = re.compile(r"\S+\s*|\s+")


def diff_html(prompt: str, text: str, *, lang: str | None = None) -> str:
    """A word-level diff of the writer's text against the prompt: deletions struck through in
    red, insertions underlined in green. Both sides are escaped."""
    old, new = _WORD_RE.findall(prompt), _WORD_RE.findall(text)
    parts: list[str] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            parts.append(escape("".join(old[a0:a1])))
            continue
        if op in ("delete", "replace"):
            parts.append(f'<del style="background: #fde2e2; color: #9b1c1c;">{escape("".join(old[a0:a1]))}</del>')
        if op in ("insert", "replace"):
            parts.append(f'<ins style="background: #dcfce7; color: #14532d;">{escape("".join(new[b0:b1]))}</ins>')
    return f'<div class="dl-diff" dir="auto"{_lang_attr(lang)} style="{_TEXT_STYLE}">{"".join(parts)}</div>'


# --- token attributions ("Inspect") ----------------------------------------------------


def _words_of_tokens(tokens: Iterable[Mapping[str, Any]]) -> list[tuple[str, float, bool]]:
    """(piece, score, space_before) per token, special tokens left out. Handles WordPiece
    (``##ing``), byte-level BPE (``Ġword``) and SentencePiece (``▁word``) pieces."""
    items = [(str(t.get("token", "")), float(t.get("score") or 0.0)) for t in tokens]
    items = [(tok, score) for tok, score in items if tok not in _SPECIAL_TOKENS]
    marked = any(tok.startswith(("Ġ", "▁")) for tok, _ in items)
    pieces: list[tuple[str, float, bool]] = []
    for index, (tok, score) in enumerate(items):
        if tok.startswith("##"):
            pieces.append((tok[2:], score, False))
        elif marked:
            space = tok.startswith(("Ġ", "▁"))
            pieces.append((tok.lstrip("Ġ▁").replace("Ċ", "\n"), score, space and index > 0))
        else:
            pieces.append((tok, score, index > 0))
    return pieces


def attributions_html(tokens: Sequence[Mapping[str, Any]], *, label: str, lang: str | None = None) -> str:
    """Tokens shaded by how much they push the model towards ``label`` (green) or away from
    it (red); the exact score is in each token's tooltip. Every token is escaped."""
    pieces = _words_of_tokens(tokens)
    largest = max((abs(score) for _, score, _ in pieces), default=0.0) or 1.0
    spans: list[str] = []
    for piece, score, space in pieces:
        alpha = round(min(1.0, abs(score) / largest) * 0.75, 3)
        colour = f"rgba(22, 163, 74, {alpha})" if score >= 0 else f"rgba(220, 38, 38, {alpha})"
        spans.append(
            (" " if space else "") + f'<span title="{score:+.3f}" style="background: {colour}; border-radius: 3px; '
            f'padding: 1px 1px;">{escape(piece)}</span>'
        )
    legend = (
        f'<div style="font-size: 0.8rem; color: #555;">green: pushes the model towards '
        f"<b>{escape(label_name(label))}</b>; red: pushes it away. Hover a word for its score.</div>"
    )
    return f'<div class="dl-inspect" dir="auto"{_lang_attr(lang)} style="{_TEXT_STYLE}">{"".join(spans)}</div>' + legend


# --- text from the API with one phrase emphasised --------------------------------------


def emphasize_markdown(text: str, phrase: str) -> str:
    """``text`` escaped for Markdown (:func:`escape_markdown`), with the first whole-word
    occurrence of ``phrase`` in bold italics, e.g. the target label in the API's goal sentence.
    Both are escaped before they are matched, so nothing in either is ever interpreted."""
    escaped, needle = escape_markdown(text), escape_markdown(phrase)
    if not needle:
        return escaped
    # Not part of a longer word: "negative" is not emphasised inside "weakly_negative".
    match = re.search(rf"(?<![\w\\]){re.escape(needle)}(?!\w)", escaped)
    if match is None:
        return escaped
    return f"{escaped[: match.start()]}***{needle}***{escaped[match.end() :]}"
