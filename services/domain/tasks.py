"""Tasks: created from validated YAML, read back as TaskDefinition."""

from __future__ import annotations

import functools
import json
import logging
import re
import unicodedata
from collections import Counter
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from services.db.models import Task, User
from services.domain import audit, members, pay_policies
from services.errors import Conflict, Invalid, missing_task
from services.structured_input import DEFAULT_MAX_INPUT_DEPTH, DEFAULT_MAX_YAML_NODES
from services.taskdef import TaskDefinition, TaskDefinitionError, parse_task_definition

logger = logging.getLogger(__name__)

# Words with a character outside Basic Latin / Latin-1 / Latin Extended (Ge'ez, Arabic, Devanagari,
# ... but also curly quotes, dashes and emoji: _script_letters keeps the words with a letter).
_NON_LATIN_WORD = re.compile(r"\S*[^\x00-\u024f\s]\S*")


def _script_letters(word: str) -> list[str]:
    """The scripts of ``word``'s letters outside the Latin ranges, by their Unicode names' first word
    (ETHIOPIC SYLLABLE HA -> Ethiopic): unicodedata knows every script, a table here would not."""
    return [
        unicodedata.name(char, "UNKNOWN").split()[0].title()
        for char in word
        if ord(char) > 0x24F and unicodedata.category(char).startswith("L")
    ]


def create_task(
    session: Session,
    actor: User | None,
    yaml_text: str,
    *,
    owner: User | None = None,
    max_depth: int = DEFAULT_MAX_INPUT_DEPTH,
    max_nodes: int = DEFAULT_MAX_YAML_NODES,
) -> Task:
    """Create a task from its YAML; ``owner`` (default: ``actor``, the researcher who creates
    it) becomes its first owner. With neither (the CLI without ``--owner``), only admins
    manage the task until someone is added (``members.set_member``)."""
    try:
        definition = parse_task_definition(yaml_text, max_depth=max_depth, max_nodes=max_nodes)
    except TaskDefinitionError as exc:
        raise Invalid(str(exc), problems=exc.problems) from exc
    if session.scalar(select(Task.id).where(Task.name == definition.name)) is not None:
        raise Conflict(f"task {definition.name!r} already exists; change `name` in the YAML to create another")
    task = Task(
        name=definition.name,
        title=definition.title,
        family=definition.family.value,
        definition=definition.model_dump(mode="json"),
        definition_yaml=yaml_text,
        created_by_id=actor.id if actor else None,
    )
    session.add(task)
    session.flush()
    audit.record(session, actor, "task.create", "task", task.id, name=task.name)
    if definition.pay is not None:
        # The YAML's pay block is the policy's version 1 (services/domain/pay_policies.py).
        pay_policies.set_pay_policy(
            session, actor, task, definition.pay, note="the task YAML's pay block", effective_from=task.created_at
        )
    owner = owner or actor
    if owner is not None:
        members.add_creator(session, actor, task, owner)
    return task


def get_task(session: Session, name: str) -> Task:
    task = session.scalar(select(Task).where(Task.name == name))
    if task is None:
        raise missing_task(name)
    return task


def list_tasks(session: Session) -> list[Task]:
    return list(session.scalars(select(Task).options(selectinload(Task.members)).order_by(Task.id)))


_DEFINITION_ON_TASK = "_dynaloop_parsed_definition"


def definition_of(task: Task) -> TaskDefinition:
    """The task's definition, validated. Parsed once per distinct stored definition: validating
    it checks every free-text field and cost ~5 ms, twice per label (docs/benchmarks.md,
    "Labelling"). TaskDefinition is frozen, so one instance can be shared.

    A request asks several times for the same loaded task's definition; the answer is kept on
    the task object with the stored value it was made from (the JSON text that keys the
    process-wide cache costs a serialisation per call), and made again if that value is
    replaced (a refresh or a reload gives a new one)."""
    stored = task.definition
    kept = task.__dict__.get(_DEFINITION_ON_TASK)
    if kept is not None and kept[0] is stored:
        return kept[1]
    definition = _parsed_definition(json.dumps(stored, sort_keys=True, ensure_ascii=False))
    task.__dict__[_DEFINITION_ON_TASK] = (stored, definition)
    return definition


@functools.lru_cache(maxsize=256)
def _parsed_definition(definition_json: str) -> TaskDefinition:
    return TaskDefinition.model_validate(json.loads(definition_json))


def task_texts(definition: TaskDefinition) -> list[str]:
    """The texts a task's YAML carries: titles, description, writer and validator instructions
    (with their examples), the onboarding quiz's questions, options and explanations."""
    texts = [
        definition.title,
        definition.validator_title or "",
        definition.description,
        definition.instructions,
        definition.validator_instructions,
    ]
    if definition.onboarding_quiz is not None:
        for question in definition.onboarding_quiz.questions:
            texts += [question.text, *question.options, question.explanation or ""]
    return [text for text in texts if text and text.strip()]


def _language_texts(definition: TaskDefinition) -> tuple[list[str], str]:
    """The YAML's texts in the task's own script, and what they are (for the warning): for a task
    not in English, its words with letters outside the Latin script when it has any (its English
    glosses would hide an unreadable script), named by their script; else all its text."""
    texts = task_texts(definition)
    everything = f"the task YAML's text (language {definition.language})"
    if definition.language.split("-")[0].lower() == "en":
        return texts, everything
    scripts: Counter[str] = Counter()
    kept = []
    for text in texts:
        words = [word for word in _NON_LATIN_WORD.findall(text) if _script_letters(word)]
        for word in words:
            scripts.update(_script_letters(word))
        if words:
            kept.append(" ".join(words))
    if not kept:
        return texts, everything
    # Named by what was measured: the task's language tag says nothing of which script this is.
    named = " and ".join(name for name, _ in scripts.most_common(3))
    script = f"script{'s' if len(scripts) > 1 else ''}"
    return kept, f"the task YAML's words in the {named} {script} (the task's language: {definition.language})"


@functools.lru_cache(maxsize=1)
def _default_tokenizer() -> Any:
    from model_server.directory.tokenizer_coverage import default_backbone, load_tokenizer

    return load_tokenizer(default_backbone())


def tokenizer_coverage_warnings(definition: TaskDefinition, *, max_unknown_token_share: float) -> list[str]:
    """Task creation's check (docs/training.md, "Tokenizer coverage"): the share of the task
    YAML's own-language text that the default backbone's tokenizer (the packaged MiniLM) maps to
    its unknown token. A warning above ``max_unknown_token_share``; a note when the YAML has no
    text to check or the backbone cannot be loaded; nothing when the text is covered."""
    from model_server.directory.tokenizer_coverage import token_coverage

    texts, what = _language_texts(definition)
    if not texts:
        return ["tokenizer coverage not checked: the task YAML has no instructions, examples or quiz text"]
    try:
        tokenizer = _default_tokenizer()
    except (ImportError, OSError, ValueError) as exc:
        logger.warning("tokenizer coverage not checked: %s", exc)
        return [f"tokenizer coverage not checked: the default backbone's tokenizer cannot be loaded ({exc})"]
    coverage = token_coverage(tokenizer, texts)
    if coverage.exceeds(max_unknown_token_share):
        return [coverage.message(f"{what}, with the default MiniLM backbone,")]
    return []
