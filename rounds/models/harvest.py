"""Round-1 harvesting: natural sentences that may fool the model (DynaSent §3.2).

DynaSent's first round was not written by crowdworkers: it was sampled from the Yelp Academic
Dataset with Model 0's help. Half of the sample came from two groups, "those that occurred in
1-star reviews but were predicted by Model 0 to be Positive, and those that occurred in 5-star
reviews but were predicted by Model 0 to be Negative"; the other half at random. Validators
then label every sentence, exactly as they label written examples.

:func:`harvest` does that for any corpus with a text and a rating column (CSV, TSV, JSONL or
Parquet):

1. :func:`read_corpus` reads and checks the file; :func:`split_sentences` cuts each text into
   sentences with pysbd (rule-based, no model or data download; the task's language where
   pysbd has rules for it, English otherwise) and :func:`corpus_sentences` keeps those within
   the length limits, once each (and none already in the round);
2. the model predicts the sentences of low- and high-rated texts (others are not needed to
   form the two pools), :func:`sample_sentences` draws the sample, and the randomly drawn rest
   is predicted too, so every harvested sentence carries the model's prediction;
3. the sample becomes either examples to validate (``origin = harvested``, no writer, the
   model's prediction and id recorded, so the round builder can make chance-level dev/test
   splits, each sentence standing alone as its own "prompt") or a prompt set for writers
   (the prompt import path, rating and pool kept as prompt metadata).

The database is touched in two short transactions (read, then write): no lock is held while
the model predicts.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from model_server.directory import ModelMetadata, ModelMetadataError
from rounds.models.registry import check_compatible, jsonable
from services.db.models import (
    Condition,
    Example,
    ExampleOrigin,
    ExampleStatus,
    Prompt,
    Round,
    RoundStatus,
    User,
)
from services.domain import audit, duplicates
from services.domain import round_lifecycle as round_domain
from services.domain.round_lifecycle import text_hash
from services.domain.tasks import definition_of, get_task
from services.errors import Conflict, Invalid
from services.extras import needs_extra
from services.taskdef import TaskDefinition, TaskFamily
from services.text import normalize_text

with needs_extra("training"):
    import pysbd

logger = logging.getLogger(__name__)

__all__ = [
    "POOLS",
    "HarvestError",
    "HarvestReport",
    "SampleDraw",
    "corpus_sentences",
    "harvest",
    "read_corpus",
    "sample_sentences",
    "split_sentences",
]

POOL_LOW = "low_rating_predicted_positive"
POOL_HIGH = "high_rating_predicted_negative"
POOL_RANDOM = "random"
POOLS = (POOL_LOW, POOL_HIGH, POOL_RANDOM)
CORPUS_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
}

# Probabilities (len(texts), len(labels)) in the order of the model's labels.
Predictor = Callable[[Sequence[str]], np.ndarray]


class HarvestError(Invalid):
    """A corpus or setting that cannot be harvested; the message says what to fix."""

    code = "harvest_invalid"


# --- reading and splitting -------------------------------------------------------------


def read_corpus(
    path: Path | str, *, text_column: str = "text", rating_column: str = "rating", id_column: str | None = None
) -> pd.DataFrame:
    """The corpus as ``document_id, text, rating`` (rating numeric). Rows without text are
    dropped; a missing or non-numeric rating is an error that names the rows."""
    path = Path(path)
    file_format = CORPUS_FORMATS.get(path.suffix.lower())
    if file_format is None:
        raise HarvestError(f"cannot tell the format of {path.name}; name it .csv, .tsv, .jsonl or .parquet")
    if not path.is_file():
        raise HarvestError(f"no corpus file {path}")
    try:
        if file_format == "parquet":
            frame = pd.read_parquet(path)
        elif file_format == "jsonl":
            frame = pd.read_json(path, lines=True, dtype=False)
        else:
            frame = pd.read_csv(
                path, sep="\t" if file_format == "tsv" else ",", dtype=object, keep_default_na=False, na_values=[""]
            )
    except pd.errors.EmptyDataError as exc:
        raise HarvestError(f"the corpus {path.name} is empty; it needs a header row and at least one text") from exc
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise HarvestError(f"cannot read {path.name} as {file_format}: {str(exc)[:300]}") from exc
    if frame.empty:
        raise HarvestError(f"the corpus {path.name} has no rows; give a file with texts and ratings")
    columns = [str(c) for c in frame.columns]
    for option, column in (
        ("--text-column", text_column),
        ("--rating-column", rating_column),
        ("--id-column", id_column),
    ):
        if column is not None and column not in frame.columns:
            raise HarvestError(
                f"the corpus {path.name} has no column {column!r} (columns: {columns}); "
                f"name the right one with {option}"
            )
    row_number = np.arange(1, len(frame) + 1)
    texts = frame[text_column]
    has_text = texts.map(lambda v: isinstance(v, str) and bool(v.strip())).to_numpy(dtype=bool)
    ratings = pd.to_numeric(frame[rating_column], errors="coerce").to_numpy(dtype=float)
    bad = np.flatnonzero(has_text & ~np.isfinite(ratings))
    if len(bad):
        shown = ", ".join(f"row {row_number[i]} ({frame[rating_column].iat[i]!r})" for i in bad[:5])
        raise HarvestError(
            f"{len(bad)} row(s) of {path.name} have no numeric {rating_column!r}: {shown}"
            f"{' ...' if len(bad) > 5 else ''}; fix or remove them"
        )
    ids = frame[id_column].astype(str).to_numpy() if id_column else row_number.astype(str)
    out = pd.DataFrame({"document_id": ids, "text": texts.to_numpy(), "rating": ratings})[has_text]
    if out.empty:
        raise HarvestError(f"the corpus {path.name} has {len(frame)} row(s) but none with text in {text_column!r}")
    return out.reset_index(drop=True)


def segmenter_language(language: str | None) -> str:
    """pysbd's language for a BCP-47 tag: its primary subtag where pysbd has rules, else English."""
    primary = (language or "en").split("-")[0].lower()
    return primary if primary in pysbd.languages.LANGUAGE_CODES else "en"


@functools.lru_cache(maxsize=8)
def _segmenter(language: str) -> pysbd.Segmenter:
    return pysbd.Segmenter(language=language, clean=False)


# pysbd keeps "it!!! The food" together; three or more ! or ? end a sentence in reviews.
_EMPHATIC_END = re.compile(r"(?<=[!?][!?][!?])\s+(?=\S)")


def split_sentences(text: str, language: str = "en") -> list[str]:
    """Sentences of ``text``: line breaks end a sentence, pysbd splits the lines.

    >>> split_sentences("Dr. Smith was late. The food was cold!!! Never again.")
    ['Dr. Smith was late.', 'The food was cold!!!', 'Never again.']
    """
    segmenter = _segmenter(segmenter_language(language))
    sentences: list[str] = []
    for line in normalize_text(text).split("\n"):
        line = " ".join(line.split())
        if not line:
            continue
        for segment in segmenter.segment(line):
            sentences.extend(part.strip() for part in _EMPHATIC_END.split(segment) if part.strip())
    return sentences


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u2028\u2029]")


def corpus_sentences(
    corpus: pd.DataFrame,
    *,
    language: str = "en",
    min_chars: int = 1,
    max_chars: int = 1000,
    min_words: int = 1,
    exclude_hashes: frozenset[str] | set[str] = frozenset(),
    split: bool = True,
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Every usable sentence once: ``document_id, sentence_index, text, rating, text_hash``
    (the first occurrence of a repeated sentence is kept), and counts of what was left out.

    With ``split`` each text is a document cut into sentences (:func:`split_sentences`); the
    count ``split_rows`` says how many texts became more than one sentence. Without it each row
    is one sentence, kept whole (whitespace runs and line breaks become one space): a file that
    is already one sentence or example per row must not be cut again."""
    rows: list[tuple[str, int, str, float, str]] = []
    skipped = {
        "too_short": 0,
        "too_long": 0,
        "too_few_words": 0,
        "control_characters": 0,
        "duplicates": 0,
        "already_in_round": 0,
    }
    seen: set[str] = set()
    total = 0
    split_rows = 0
    for document_id, text, rating in corpus[["document_id", "text", "rating"]].itertuples(index=False):
        if split:
            parts = split_sentences(text, language)
            split_rows += len(parts) > 1
        else:
            whole = " ".join(normalize_text(text).split())
            parts = [whole] if whole else []
        for index, sentence in enumerate(parts):
            total += 1
            if len(sentence) < min_chars:
                skipped["too_short"] += 1
            elif len(sentence) > max_chars:
                skipped["too_long"] += 1
            elif len(sentence.split()) < min_words:
                skipped["too_few_words"] += 1
            elif _CONTROL.search(sentence):
                skipped["control_characters"] += 1
            else:
                digest = text_hash(sentence)
                if digest in seen:
                    skipped["duplicates"] += 1
                    continue
                seen.add(digest)
                if digest in exclude_hashes:
                    skipped["already_in_round"] += 1
                else:
                    rows.append((str(document_id), index, sentence, float(rating), digest))
    frame = pd.DataFrame.from_records(rows, columns=["document_id", "sentence_index", "text", "rating", "text_hash"])
    return frame, {"sentences": total, "split_rows": split_rows, **skipped}


# --- sampling --------------------------------------------------------------------------


@dataclass
class SampleDraw:
    """Which sentences were drawn from which pool."""

    indices: dict[str, np.ndarray]  # pool -> positions in the input, sorted
    available: dict[str, int]
    wanted: dict[str, int]
    notes: list[str] = field(default_factory=list)

    @property
    def selected(self) -> dict[str, int]:
        return {pool: len(self.indices[pool]) for pool in POOLS}


def sample_sentences(
    ratings: Sequence[float] | np.ndarray,
    predicted: Sequence[str | None] | np.ndarray,
    n: int,
    *,
    low_rating: float = 1,
    high_rating: float = 5,
    positive_label: str = "positive",
    negative_label: str = "negative",
    seed: int = 0,
) -> SampleDraw:
    """Draw ``n`` sentences, DynaSent §3.2: half from low-rated texts the model calls positive
    and high-rated texts it calls negative (split evenly between the two), the rest at random
    from all other sentences. A pool that is short is made up from the other disagreement
    pool, then from the random rest (and the other way round); each shortfall is noted.

    ``predicted`` holds each sentence's predicted label, or None where the model was not asked
    (a sentence whose text is neither low- nor high-rated belongs to the random pool anyway).

    >>> draw = sample_sentences([1, 1, 5, 5, 3, 3], ["positive", "negative", "negative", "positive",
    ...                          None, None], 4, seed=0)
    >>> draw.selected
    {'low_rating_predicted_positive': 1, 'high_rating_predicted_negative': 1, 'random': 2}
    """
    if n < 1:
        raise HarvestError(f"the sample size must be at least 1, got {n}")
    if high_rating <= low_rating:
        raise HarvestError(f"the high rating ({high_rating}) must be above the low rating ({low_rating})")
    ratings = np.asarray(ratings, dtype=float)
    predicted = np.asarray(predicted, dtype=object)
    if len(ratings) != len(predicted):
        raise ValueError("ratings and predicted differ in length")
    rng = np.random.default_rng(seed)
    masks = {
        POOL_LOW: (ratings <= low_rating) & (predicted == positive_label),
        POOL_HIGH: (ratings >= high_rating) & (predicted == negative_label),
    }
    masks[POOL_RANDOM] = ~(masks[POOL_LOW] | masks[POOL_HIGH])
    available = {pool: int(mask.sum()) for pool, mask in masks.items()}
    notes: list[str] = []
    total = len(ratings)
    if total < n:
        notes.append(f"only {total} sentences are available; all of them are taken instead of {n}")
        n = total
    half = n // 2
    wanted = {POOL_LOW: (half + 1) // 2, POOL_HIGH: half // 2, POOL_RANDOM: n - half}
    take = {pool: min(wanted[pool], available[pool]) for pool in POOLS}
    describe = {
        POOL_LOW: f"texts rated {low_rating:g} or lower that the model calls {positive_label}",
        POOL_HIGH: f"texts rated {high_rating:g} or higher that the model calls {negative_label}",
        POOL_RANDOM: "the other sentences",
    }
    for pool in POOLS:
        if take[pool] < wanted[pool]:
            notes.append(
                f"pool {pool} is short: {available[pool]} sentences from {describe[pool]}, {wanted[pool]} wanted"
            )
    # Fill shortfalls: a disagreement pool from the other one first, then from the rest.
    for pool, donors in (
        (POOL_LOW, (POOL_HIGH, POOL_RANDOM)),
        (POOL_HIGH, (POOL_LOW, POOL_RANDOM)),
        (POOL_RANDOM, (POOL_LOW, POOL_HIGH)),
    ):
        missing = wanted[pool] - min(wanted[pool], available[pool])
        for donor in donors:
            if missing <= 0:
                break
            extra = min(missing, available[donor] - take[donor])
            if extra > 0:
                take[donor] += extra
                missing -= extra
                notes.append(f"{extra} sentence(s) from pool {donor} stand in for pool {pool}")
    indices = {}
    for pool in POOLS:
        candidates = np.flatnonzero(masks[pool])
        chosen = rng.choice(candidates, size=take[pool], replace=False) if take[pool] else candidates[:0]
        indices[pool] = np.sort(chosen)
    return SampleDraw(indices=indices, available=available, wanted=wanted, notes=notes)


# --- the whole harvest -----------------------------------------------------------------


@dataclass
class HarvestReport:
    task: str
    round: int
    mode: str  # examples | prompts
    corpus: str
    model_id: str
    model_version: str
    precision: str  # what the harvesting model ran at (fp32, bf16, int8, auto)
    documents: int
    sentences: int
    skipped: dict[str, int]
    pools: dict[str, dict[str, int]]  # pool -> available, wanted, selected
    written: int
    already_present: int
    notes: list[str]
    split_sentences: bool = True  # documents cut into sentences, or one sentence per row kept whole
    split_rows: int = 0  # rows cut into more than one sentence (0 without splitting)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _model_predictor(model_dir: Path, batch_size: int, precision: str = "fp32") -> Predictor:
    """Load the model once, at ``precision``; predict with rounds.models.inference."""
    from rounds.models.inference import LoadedClassifier

    try:
        classifier = LoadedClassifier.load(model_dir, precision=precision, batch_size=batch_size)
    except (ValueError, OSError) as exc:  # EvaluationError and ModelMetadataError are ValueErrors
        raise HarvestError(f"cannot load the harvesting model from {model_dir}: {exc}") from exc

    def predict(texts: Sequence[str]) -> np.ndarray:
        return classifier.predict(list(texts), batch_size=batch_size)

    return predict


def _check_task(definition: TaskDefinition, positive_label: str, negative_label: str) -> None:
    # Harvesting draws its pools from a rating that disagrees with ONE predicted label of a plain
    # sentence. A multi-label model predicts a set (no "predicted positive" to disagree with a
    # 1-star rating) and a target-dependent model needs a target span in each sentence, which a
    # rated corpus does not give: both are refused, and the message names the way that fits.
    if definition.is_multi_label:
        raise HarvestError(
            f"task {definition.name!r} is {definition.family.value}: harvesting (DynaSent §3.2) draws sentences "
            "whose rating disagrees with the model's one predicted label, and a multi-label model predicts a "
            "set; use a single-label task, or bring labelled texts in with `dynaloop round import`"
        )
    if definition.family is TaskFamily.target_dependent:
        raise HarvestError(
            f"task {definition.name!r} is {definition.family.value}: its examples need a target span, which "
            "a rated corpus does not give; harvest into a single-label task, or bring texts with their "
            "targets in with `dynaloop round import`"
        )
    for option, label in (("--positive-label", positive_label), ("--negative-label", negative_label)):
        if label not in definition.labels:
            raise HarvestError(
                f"label {label!r} is not a label of task {definition.name!r} "
                f"({list(definition.labels)}); name the label that matches the rating with {option}"
            )


def _round_hashes(session: Session, round_: Round, mode: str) -> set[str]:
    if mode == "prompts":
        return set(session.scalars(select(Prompt.text_hash).where(Prompt.round_id == round_.id)))
    return {text_hash(t) for t in session.scalars(select(Example.text).where(Example.round_id == round_.id))}


def _labels_of(probabilities: np.ndarray, labels: list[str], count: int) -> list[str]:
    probabilities = np.asarray(probabilities, dtype=float)
    if probabilities.shape != (count, len(labels)):
        raise HarvestError(
            f"the model returned probabilities of shape {probabilities.shape}; expected ({count}, {len(labels)})"
        )
    return [labels[i] for i in probabilities.argmax(axis=1)]


def _load_model(definition: TaskDefinition, model_dir: Path) -> ModelMetadata:
    """The harvesting model's metadata, checked against the task's labels."""
    try:
        metadata = ModelMetadata.load(model_dir)
    except ModelMetadataError as exc:
        raise HarvestError(str(exc)) from exc
    check_compatible(definition, metadata, f"the harvesting model {metadata.model_id} in {model_dir}")
    return metadata


def _char_limits(definition: TaskDefinition, min_chars: int | None, max_chars: int | None) -> tuple[int, int]:
    """The sentence lengths to keep: those given, else the task's writer constraints."""
    constraints = definition.constraints
    min_chars = constraints.min_chars if min_chars is None else min_chars
    max_chars = constraints.max_chars if max_chars is None else max_chars
    if min_chars < 1 or max_chars < min_chars:
        raise HarvestError(
            f"--min-chars {min_chars} and --max-chars {max_chars} leave no room; give 1 <= min-chars <= max-chars"
        )
    return min_chars, max_chars


def _usable_sentences(
    corpus: pd.DataFrame,
    corpus_name: str,
    definition: TaskDefinition,
    min_chars: int,
    max_chars: int,
    exclude: set[str],
    split_sentences: bool,
) -> tuple[pd.DataFrame, dict[str, int], int]:
    """The corpus's usable sentences (:func:`corpus_sentences`), the counts of what was left
    out, and how many rows were cut into more than one sentence; :class:`HarvestError` when
    none is usable."""
    sentences, skipped = corpus_sentences(
        corpus,
        language=definition.language,
        min_chars=min_chars,
        max_chars=max_chars,
        min_words=definition.constraints.min_words,
        exclude_hashes=exclude,
        split=split_sentences,
    )
    split_rows = skipped.pop("split_rows")
    if sentences.empty:
        raise HarvestError(
            f"none of the {skipped['sentences']} sentences of {corpus_name} is usable "
            f"(left out: { {k: v for k, v in skipped.items() if v and k != 'sentences'} }); "
            "check --min-chars/--max-chars and the text column"
        )
    return sentences, skipped, split_rows


def _predict_and_draw(
    sentences: pd.DataFrame,
    predict: Predictor,
    labels: list[str],
    n: int,
    *,
    low_rating: float,
    high_rating: float,
    positive_label: str,
    negative_label: str,
    seed: int,
) -> tuple[SampleDraw, np.ndarray, dict[int, np.ndarray]]:
    """The model's predictions on the sentences that may fall in a pool, and the draw of ``n``
    sentences from the pools (:func:`sample_sentences`): the draw, each sentence's predicted
    label (None where it was not predicted) and the probabilities of those predicted."""
    texts = sentences["text"].tolist()
    ratings = sentences["rating"].to_numpy(dtype=float)
    probabilities: dict[int, np.ndarray] = {}
    predicted = np.full(len(sentences), None, dtype=object)

    def run(positions: np.ndarray) -> None:
        positions = np.asarray([p for p in positions if p not in probabilities], dtype=np.int64)
        if not len(positions):
            return
        probs = np.asarray(predict([texts[p] for p in positions]), dtype=float)
        for position, label, row in zip(positions, _labels_of(probs, labels, len(positions)), probs, strict=True):
            predicted[position] = label
            probabilities[int(position)] = row

    # Only low- and high-rated texts can fall in the two disagreement pools.
    run(np.flatnonzero((ratings <= low_rating) | (ratings >= high_rating)))
    draw = sample_sentences(
        ratings,
        predicted,
        n,
        low_rating=low_rating,
        high_rating=high_rating,
        positive_label=positive_label,
        negative_label=negative_label,
        seed=seed,
    )
    run(draw.indices[POOL_RANDOM])
    return draw, predicted, probabilities


def _harvest_records(
    sentences: pd.DataFrame,
    corpus_name: str,
    labels: list[str],
    draw: SampleDraw,
    predicted: np.ndarray,
    probabilities: dict[int, np.ndarray],
) -> list[dict[str, Any]]:
    """The drawn sentences in corpus order, each with its pool, the model's prediction and
    probabilities, and where in the corpus it came from."""
    texts = sentences["text"].tolist()
    chosen = [(pool, int(p)) for pool in POOLS for p in draw.indices[pool]]
    chosen.sort(key=lambda item: item[1])  # corpus order
    records = []
    for pool, position in chosen:
        row = sentences.iloc[position]
        records.append(
            {
                "text": texts[position],
                "text_hash": row["text_hash"],
                "pool": pool,
                "prediction": predicted[position],
                "probabilities": {
                    label: round(float(p), 6) for label, p in zip(labels, probabilities[position], strict=True)
                },
                "source": {
                    "corpus": corpus_name,
                    "document_id": row["document_id"],
                    "sentence_index": int(row["sentence_index"]),
                    "rating": jsonable(row["rating"]),
                },
            }
        )
    return records


def _harvest_report(
    task_name: str,
    round_number: int,
    mode: str,
    corpus_name: str,
    metadata: ModelMetadata,
    precision: str,
    corpus: pd.DataFrame,
    skipped: dict[str, int],
    draw: SampleDraw,
    *,
    written: int,
    present: int,
    split_sentences: bool,
    split_rows: int,
) -> HarvestReport:
    """What the harvest read, drew and wrote, with a note where rows were cut into sentences."""
    report = HarvestReport(
        task=task_name,
        round=round_number,
        mode=mode,
        corpus=corpus_name,
        model_id=metadata.model_id,
        model_version=metadata.version,
        precision=precision,
        documents=len(corpus),
        sentences=skipped["sentences"],
        skipped={k: v for k, v in skipped.items() if k != "sentences"},
        pools={
            pool: {"available": draw.available[pool], "wanted": draw.wanted[pool], "selected": draw.selected[pool]}
            for pool in POOLS
        },
        written=written,
        already_present=present,
        notes=draw.notes,
        split_sentences=split_sentences,
        split_rows=split_rows,
    )
    if split_sentences and split_rows:
        report.notes.append(
            f"{split_rows} of {len(corpus)} rows were cut into more than one sentence; if the file "
            "holds one sentence or example per row, harvest with --no-split-sentences"
        )
    return report


def harvest(
    factory: sessionmaker[Session],
    task_name: str,
    round_number: int,
    corpus_path: Path | str,
    model_dir: Path | str,
    n: int,
    *,
    mode: Literal["examples", "prompts"] = "examples",
    text_column: str = "text",
    rating_column: str = "rating",
    id_column: str | None = None,
    seed: int = 0,
    low_rating: float = 1,
    high_rating: float = 5,
    positive_label: str = "positive",
    negative_label: str = "negative",
    min_chars: int | None = None,
    max_chars: int | None = None,
    batch_size: int = 64,
    precision: str = "fp32",
    predictor: Predictor | None = None,
    actor_id: int | None = None,
    corpus_name: str | None = None,
    split_sentences: bool = True,
) -> HarvestReport:
    """Harvest ``n`` sentences from ``corpus_path`` into round ``round_number`` of the task
    (see the module docstring). ``predictor`` replaces the model's forward pass (tests); the
    model directory still names the labels and the model id recorded on every sentence.
    ``min_chars``/``max_chars`` default to the task's writer constraints. ``split_sentences``:
    the corpus holds documents to cut into sentences (DynaSent's reviews; the default), or, when
    false, one sentence or example per row, kept whole."""
    if mode not in ("examples", "prompts"):
        raise HarvestError(f"unknown harvest mode {mode!r}; use examples or prompts")
    corpus_path, model_dir = Path(corpus_path), Path(model_dir)
    corpus_name = corpus_name or corpus_path.name
    with factory.begin() as session:
        task = get_task(session, task_name)
        definition = definition_of(task)
        round_ = round_domain.get_round_by_number(session, task, round_number)
        _check_writable(round_, mode)
        exclude = _round_hashes(session, round_, mode)
    _check_task(definition, positive_label, negative_label)
    metadata = _load_model(definition, model_dir)
    min_chars, max_chars = _char_limits(definition, min_chars, max_chars)

    corpus = read_corpus(corpus_path, text_column=text_column, rating_column=rating_column, id_column=id_column)
    sentences, skipped, split_rows = _usable_sentences(
        corpus, corpus_name, definition, min_chars, max_chars, exclude, split_sentences
    )
    predict = predictor or _model_predictor(model_dir, batch_size, precision)
    labels = list(metadata.labels)
    draw, predicted, probabilities = _predict_and_draw(
        sentences,
        predict,
        labels,
        n,
        low_rating=low_rating,
        high_rating=high_rating,
        positive_label=positive_label,
        negative_label=negative_label,
        seed=seed,
    )
    records = _harvest_records(sentences, corpus_name, labels, draw, predicted, probabilities)

    with factory.begin() as session:
        actor = session.get(User, actor_id) if actor_id is not None else None
        round_ = round_domain.get_round(session, round_.id)
        _check_writable(round_, mode)
        if mode == "examples":
            written, present = _write_examples(session, round_, definition, records, metadata, precision)
        else:
            written, present = _write_prompts(session, actor, round_, records, metadata, precision)
        report = _harvest_report(
            task_name,
            round_number,
            mode,
            corpus_name,
            metadata,
            precision,
            corpus,
            skipped,
            draw,
            written=written,
            present=present,
            split_sentences=split_sentences,
            split_rows=split_rows,
        )
        audit.record(
            session,
            actor,
            "round.harvest",
            "round",
            round_.id,
            **jsonable({k: v for k, v in report.to_dict().items() if k not in ("task", "round")}),
        )
    logger.info("harvested %d sentences into %s round %d as %s", written, task_name, round_number, mode)
    return report


def _check_writable(round_: Round, mode: str) -> None:
    if mode == "examples" and round_.status not in (RoundStatus.collecting, RoundStatus.validating):
        raise Conflict(
            f"round {round_.number} is {round_.status.value}; harvested examples need a round that is "
            "collecting or validating, so validators can label them"
        )
    if mode == "prompts" and round_.status not in (RoundStatus.collecting, RoundStatus.validating):
        raise Conflict(f"round {round_.number} is {round_.status.value}; prompts can no longer be added")


def _write_examples(
    session: Session,
    round_: Round,
    definition: TaskDefinition,
    records: list[dict[str, Any]],
    metadata: ModelMetadata,
    precision: str,
) -> tuple[int, int]:
    present = _round_hashes(session, round_, "examples")  # again: the round may have grown meanwhile
    new = [r for r in records if r["text_hash"] not in present]
    examples = [
        Example(
            round_id=round_.id,
            origin=ExampleOrigin.harvested,
            source_metadata={
                **r["source"],
                "pool": r["pool"],
                "model_id": metadata.model_id,
                "model_version": metadata.version,
                "model_precision": precision,
                "model_probabilities": r["probabilities"],
            },
            # The prompt condition lets a harvested sentence reach dev/test (DynaSent's Round 1
            # dev/test are harvested); with no prompt id each sentence stands alone.
            condition=Condition.prompt,
            prompt_id=None,
            text=r["text"],
            target_label=[],
            model_prediction=[r["prediction"]],
            model_id=metadata.model_id,
            fooled=False,  # nobody aimed at a label; validators decide what it is
            extras={},
            status=ExampleStatus.validating,
            validation_count=0,
            validations_needed=definition.validations_per_example,
            requeue_count=0,
        )
        for r in new
    ]
    session.add_all(examples)
    session.flush()
    # Their normalized texts, so a writer cannot submit a harvested sentence again
    # (services/domain/duplicates.py); a sentence already in an earlier round is still written.
    duplicates.record_texts(session, round_.task, examples)
    return len(new), len(records) - len(new)


def _write_prompts(
    session: Session,
    actor: User | None,
    round_: Round,
    records: list[dict[str, Any]],
    metadata: ModelMetadata,
    precision: str,
) -> tuple[int, int]:
    lines = []
    for r in records:
        source = r["source"]
        lines.append(
            json.dumps(
                {
                    "text": r["text"],
                    "id": f"{source['document_id']}:{source['sentence_index']}",
                    "source": source["corpus"],
                    "rating": source["rating"],
                    "document_id": source["document_id"],
                    "sentence_index": source["sentence_index"],
                    "pool": r["pool"],
                    "model_prediction": r["prediction"],
                    "model_id": metadata.model_id,
                    "model_version": metadata.version,
                    "model_precision": precision,
                },
                ensure_ascii=False,
            )
        )
    report = round_domain.import_prompts(
        session, actor, round_, "\n".join(lines).encode("utf-8"), "jsonl", max_rows=max(len(lines), 1)
    )
    return report.imported, report.already_present + report.duplicates_in_file
