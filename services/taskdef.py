"""Task definitions: the YAML file a researcher writes to describe a collection task.

A task names its *family* (one of the five the seed papers require, see docs/design.md "Task
families"), its labels, the labels validators may give, the writer's constraints and extra
fields, how many tries and validations it takes, and its onboarding quiz. The YAML is
validated by pydantic; :func:`load_task_definition` turns every validation problem into one
line that names the field and says how to fix it.

Example::

    >>> definition = parse_task_definition('''
    ... name: tiny-sentiment
    ... title: Tiny ternary sentiment
    ... family: single_label
    ... labels: [positive, negative, neutral]
    ... validation_labels: [positive, negative, neutral, mixed]
    ... ''')
    >>> definition.validations_per_example
    5
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from services.errors import PROBLEM_WORDING, Invalid, validation_problems
from services.structured_input import DEFAULT_MAX_INPUT_DEPTH, DEFAULT_MAX_YAML_NODES, YamlInputError, load_yaml
from services.text import check_text, clean_name

EXAMPLES_DIR = Path(__file__).parent / "task_examples"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
_LABEL_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
MAX_LABEL_NAME_CHARS = 60  # a display name fits on a button
# BCP-47 in the shape the seeds use: language, optional script, region or variant subtags.
_BCP47_RE = re.compile(r"^[A-Za-z]{2,3}(-[A-Za-z]{4})?(-([A-Za-z]{2}|[0-9]{3}))?(-[A-Za-z0-9]{5,8})*$")


class TaskFamily(str, enum.Enum):
    """The five task families of docs/design.md."""

    single_label = "single_label"  # DynaSent ternary sentiment
    binary_variety = "binary_variety"  # BESSTIE sentiment / sarcasm per variety of English
    intended_sarcasm = "intended_sarcasm"  # iSarcasm: intended (writer) vs perceived (validator)
    multi_label = "multi_label"  # EthioEmo multi-label emotion
    target_dependent = "target_dependent"  # MAD-TSC target-dependent sentiment


class WriterFieldName(str, enum.Enum):
    """Extra fields a writer fills in when submitting an example."""

    intended_label = "intended_label"
    explanation = "explanation"
    rephrase = "rephrase"
    category = "category"
    target_span = "target_span"
    variety = "variety"
    domain = "domain"


ISARCASM_CATEGORIES = [
    "sarcasm",
    "irony",
    "satire",
    "understatement",
    "overstatement",
    "rhetorical_question",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TextConstraints(_Strict):
    min_chars: int = Field(1, ge=1, description="Fewest characters a written sentence may have.")
    max_chars: int = Field(1000, ge=1, le=20000, description="Most characters a written sentence may have.")
    min_words: int = Field(1, ge=1, description="Fewest whitespace-separated words.")

    @model_validator(mode="after")
    def _ordered(self) -> TextConstraints:
        if self.min_chars > self.max_chars:
            raise ValueError(
                f"min_chars ({self.min_chars}) is larger than max_chars ({self.max_chars}); "
                "lower min_chars or raise max_chars"
            )
        return self


class WriterField(_Strict):
    name: WriterFieldName
    required: bool = False
    max_chars: int = Field(1000, ge=1, le=20000)
    choices: list[str] | None = Field(
        None, description="Allowed values (category, variety, domain). Defaults per field."
    )
    required_when_intended: str | None = Field(
        None,
        description="Only required when the writer's intended label is this value "
        "(iSarcasm asks for an explanation and a rephrase of sarcastic texts only).",
    )


class TrainingDefaults(_Strict):
    """How `round train` trains this task's models when its options do not say (docs/training.md)."""

    class_weights: Literal["none", "balanced"] | dict[str, float] = Field(
        "none",
        description="Per-class loss weights: none, balanced (inverse to the mix's label mass; BESSTIE §5's "
        "class-weighted cross-entropy) or {label: weight}.",
    )
    epochs: int = Field(
        3,
        ge=1,
        le=1000,
        description="Planned epochs of `round train` when its options name none (the learning-rate schedule "
        "spans them).",
    )
    learning_rate: float = Field(
        2e-5,
        gt=0,
        le=1,
        description="AdamW learning rate of `round train` when its options name none. The shipped examples use "
        '5e-5, which the packaged MiniLM needs on a round-sized mix (docs/benchmarks.md, "Training defaults per '
        'family"); a large base such as RoBERTa-large wants about 2e-5.',
    )
    accelerator: Literal["cpu", "gpu"] = Field(
        "cpu",
        description="Where a train job started through the API runs unless its request says: cpu (any "
        "`dynaloop worker`) or gpu (only a `dynaloop worker --queue gpu`, on a machine with a GPU).",
    )


class AgreementSettings(_Strict):
    gold_min_votes: int = Field(3, ge=1, description="Votes a label needs to become gold (DynaSent: 3 of 5).")
    dev_test_min_votes: int = Field(4, ge=1, description="Votes the gold label needs for dev/test (DynaSent: 4 of 5).")
    unqualify_disagreement_rate: float = Field(
        0.8,
        gt=0,
        le=1,
        description="A validator who disagrees with the majority more often than this is "
        "unqualified (DynaSent §3.3: 80%).",
    )
    min_labels_for_quality: int = Field(
        10, ge=1, description="Labels a validator needs before their agreement rate is judged."
    )
    requeue_disagreements: int = Field(
        0,
        ge=0,
        le=3,
        description="How many times an example without a gold label is sent to new validators "
        "again before it is dropped (EthioEmo: once).",
    )


# ISO 4217 alphabetic codes are three upper-case letters; the digits after the decimal point
# of the major unit (the "minor unit" column of ISO 4217) for the codes whose minor unit is not 2.
_CURRENCY_RE = re.compile(r"^[A-Z]{3}$")
CURRENCY_MINOR_DIGITS = {"BHD": 3, "CLP": 0, "ISK": 0, "JOD": 3, "JPY": 0, "KRW": 0, "KWD": 3, "OMR": 3, "TND": 3}
MAX_PAY_MINOR = 1_000_000  # one amount of the pay policy, in minor units (10,000.00 in a 2-digit currency)


def currency_digits(currency: str) -> int:
    """Digits of the minor unit of ``currency`` (2 unless listed in CURRENCY_MINOR_DIGITS)."""
    return CURRENCY_MINOR_DIGITS.get(currency, 2)


_Amount = Annotated[int, Field(ge=0, le=MAX_PAY_MINOR, strict=True)]


class BasePay(_Strict):
    writer: _Amount = Field(0, description="Minor units paid for each completed writer session.")
    validator: _Amount = Field(0, description="Minor units paid for each completed validator session.")


class ValidatorBonus(_Strict):
    per_batch: _Amount = Field(description="Minor units per whole validation batch that agrees with the majority.")
    min_agreement: float = Field(
        gt=0,
        le=1,
        description="Share of a batch's labels that must equal the example's majority label (0 < x <= 1).",
    )


class PayPolicy(_Strict):
    """What workers are paid (docs/round_builder.md, "Pay and the ledger"); amounts are integers
    in minor units of ``currency`` (pence for GBP, cents for USD)."""

    currency: str = Field(description="ISO 4217 code in capitals, e.g. GBP or USD.")
    base_pay: BasePay = BasePay()
    writer_bonus_per_example: _Amount = Field(
        0, description="Per example that fooled the model and whose majority label is the writer's target."
    )
    validator_bonus: ValidatorBonus | None = None
    min_hourly_minor: _Amount | None = Field(
        None,
        description="The researcher's own floor on effective hourly pay, in minor units per hour: the crowd "
        "report warns about workers below it (and below the platform's published minimum, where it has one; "
        "MTurk publishes none). Pays nothing by itself.",
    )

    @field_validator("currency")
    @classmethod
    def _currency_code(cls, value: str) -> str:
        if not _CURRENCY_RE.match(value):
            raise ValueError(
                f"{value!r} is not an ISO 4217 currency code; write three capital letters, e.g. GBP or USD"
            )
        return value


def _policy(value: str, multiline: bool) -> str:
    # The text policy of services/text.py, without trimming: Markdown keeps its last newline.
    try:
        return check_text(value, field="the text", multiline=multiline, trim=False)
    except Invalid as exc:
        raise ValueError(exc.message) from exc


def _free_text(value: str | None) -> str | None:
    return _policy(value, multiline=True) if value is not None else None


def _line(value: str | None) -> str | None:
    return _policy(value, multiline=False) if value is not None else None


def _lines(values: list[str]) -> list[str]:
    return [_policy(value, multiline=False) for value in values]


def _display_name(value: str) -> str:
    # A label's display name is a name (services/text.py: one line, no < or >) that fits on a button.
    try:
        return clean_name(value, field="the display name", max_chars=MAX_LABEL_NAME_CHARS)
    except Invalid as exc:
        raise ValueError(exc.message) from exc


class QuizQuestion(_Strict):
    text: str = Field(min_length=1)
    options: list[str] = Field(min_length=2)
    answer: str
    explanation: str | None = None

    _text_policy = field_validator("text", "explanation")(_free_text)
    _options_policy = field_validator("options")(_lines)
    _answer_policy = field_validator("answer")(_line)

    @model_validator(mode="after")
    def _answer_is_option(self) -> QuizQuestion:
        if self.answer not in self.options:
            raise ValueError(
                f"answer {self.answer!r} is not one of the options {self.options}; make answer one of the options"
            )
        return self


class OnboardingQuiz(_Strict):
    max_attempts: int = Field(5, ge=1, le=20, description="DynaSent: 5 attempts, then held back.")
    questions: list[QuizQuestion] = Field(min_length=1)


class ControlItemSpec(_Strict):
    """A control (gold) item: a text with its known label(s), mixed into validation batches."""

    text: str = Field(min_length=1, max_length=5000, description="The sentence validators label.")
    labels: list[str] = Field(
        min_length=1,
        description="The validation label(s) accepted as right. Single-label tasks: any one of them; "
        "multi-label tasks: exactly this set.",
    )
    target_span: list[int] | None = Field(
        None,
        min_length=2,
        max_length=2,
        description="Target-dependent tasks: [start, end] character offsets of the target in the text "
        "(required there, as on every example of such a task).",
    )

    _text_policy = field_validator("text")(_free_text)


class QualityControl(_Strict):
    """Control (gold) items in validation batches and the gold accuracy a validator must keep
    (docs/crowdsourcing.md "Control items")."""

    control_rate: float = Field(
        0.1,
        ge=0,
        le=0.5,
        description="Share of a validation batch's items that are control items (0: none). A batch of 9 "
        "examples at 0.1 gets one control item, sometimes two.",
    )
    gold_accuracy_threshold: float = Field(
        0.7,
        ge=0,
        le=1,
        description="A validator whose share of right control answers falls below this, once they gave "
        "min_control_answers, is unqualified on the task and their labels are re-queued.",
    )
    min_control_answers: int = Field(5, ge=1, le=1000, description="Control answers before gold accuracy is judged.")
    control_items: list[ControlItemSpec] = Field(
        default_factory=list, description="Control items of the task (more can be added through the API)."
    )


class AttentionCheckItem(_Strict):
    """One attention check: an instructional manipulation check whose question itself tells the
    writer which option to choose (e.g. "For this question, choose 'Strongly disagree'")."""

    question: str = Field(
        min_length=1,
        max_length=1000,
        description="The question, which must itself name the expected answer (its option's text): "
        "an instruction above the question does not count (Prolific's attention-check policy).",
    )
    options: list[str] = Field(min_length=2, max_length=10, description="The options the writer chooses from.")
    answer: str = Field(description="The option the question tells the writer to choose.")

    _question_policy = field_validator("question")(_free_text)
    _options_policy = field_validator("options")(_lines)
    _answer_policy = field_validator("answer")(_line)

    @model_validator(mode="after")
    def _fair(self) -> AttentionCheckItem:
        if len(set(self.options)) != len(self.options):
            raise ValueError(f"the options {self.options} repeat an option; make every option different")
        if self.answer not in self.options:
            raise ValueError(
                f"answer {self.answer!r} is not one of the options {self.options}; make answer one of the options"
            )
        if self.answer.casefold() not in self.question.casefold():
            raise ValueError(
                f"the question {self.question!r} does not name its answer {self.answer!r}: a fair attention "
                "check tells the participant in the question itself which option to choose, e.g. "
                f"\"For this question, choose '{self.answer}'\""
            )
        return self


class AttentionChecks(_Strict):
    """Attention checks served to writers between assignments (docs/crowdsourcing.md
    "Attention checks"). Answers never pay and never enter the dataset."""

    every_n_assignments: int = Field(
        5,
        ge=1,
        le=1000,
        description="A check after every this many finished (submitted, skipped or expired) assignments.",
    )
    fails_to_screen_out: int = Field(
        2,
        ge=2,
        le=100,
        description="Failed checks after which the writer is unqualified on the task (their study session "
        "is screened out). At least 2: Prolific lets a participant of a study of 5 minutes or longer be "
        "rejected only after failing two checks.",
    )
    items: list[AttentionCheckItem] = Field(
        min_length=1, description="The checks, served in turn (the first after the first N assignments)."
    )


class TaskDefinition(_Strict):
    """A whole task, as written in its YAML file."""

    name: str = Field(description="Identifier used in URLs: lower case, digits and dashes.")
    title: str = Field(min_length=1, max_length=200)
    validator_title: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="What validators read as the task's title (the title speaks to writers); absent: "
        "'Label sentences from <domain>'.",
    )
    family: TaskFamily
    description: str = ""
    labels: list[str] = Field(min_length=2, description="Labels writers target and models predict.")
    validation_labels: list[str] | None = Field(
        None,
        description="Labels validators choose from; defaults to `labels`. May add e.g. "
        "`mixed`, `discard` or `unknown`.",
    )
    label_names: dict[str, Annotated[str, AfterValidator(_display_name)]] = Field(
        default_factory=dict,
        description="What people see for a label: {label: display name}, e.g. {neutral: No sentiment}. "
        "Labels not listed are shown as written. The API accepts and stores only the labels themselves.",
    )
    label_collapse: dict[str, str] | None = Field(
        None,
        description="target_dependent: maps each validation label (5-point) to a task label (3-point), MAD-TSC §3.4.",
    )
    unknown_label: str | None = Field(None, description="Validation label meaning 'cannot tell' (MAD-TSC `unknown`).")
    exclusive_labels: list[str] = Field(
        default_factory=list,
        description="multi_label: labels that cannot be combined with others (e.g. neutral).",
    )
    language: Annotated[str, Field(description="BCP-47 tag, e.g. en, en-IN, am, om.")] = "en"
    domain: str | None = None
    licence: str | None = Field(None, description="Licence of the collected data (datasheet).")
    constraints: TextConstraints = TextConstraints()
    tries_per_assignment: int = Field(10, ge=1, le=100)
    validations_per_example: int = Field(5, ge=1, le=25)
    validation_batch_size: int = Field(10, ge=1, le=100)
    assignment_timeout_minutes: int = Field(60, ge=1, le=24 * 60)
    agreement: AgreementSettings = AgreementSettings()
    writer_fields: list[WriterField] = Field(default_factory=list)
    instructions: str = Field("", description="Writer instructions, markdown.")
    validator_instructions: str = Field("", description="Validator instructions, markdown.")
    onboarding_quiz: OnboardingQuiz | None = None
    positive_label: str | None = Field(
        None,
        description="Two-label tasks: the class whose F1 evaluation reports as the positive class "
        "(e.g. `irony`, `sarcastic`). Default: a label named positive/sarcastic/..., else the label that "
        "is not the other's not_/non_ form, else the second label.",
    )
    training: TrainingDefaults = TrainingDefaults()
    pay: PayPolicy | None = Field(
        None, description="Base pay and bonuses for crowdworkers (the ledger); absent: no pay policy."
    )
    near_duplicate_similarity: float | None = Field(
        None,
        ge=0.5,
        le=1.0,
        description="Refuse a writer's text whose similarity (rapidfuzz ratio of the normalized texts, 0-1) to "
        "an example of the task is at least this, e.g. 0.9; absent: only exact duplicates (after "
        'normalization) are refused (docs/design.md "Duplicates").',
    )

    # Issue 26, validation integrity: control items and gold accuracy.
    quality: QualityControl = QualityControl()

    # Issue 26, writer attention checks (services/domain/attention.py); absent: no checks.
    attention_checks: AttentionChecks | None = None

    model_config = ConfigDict(extra="forbid", frozen=True)

    _text_policy = field_validator("description", "instructions", "validator_instructions")(_free_text)
    _line_policy = field_validator("title", "validator_title", "domain", "licence")(_line)

    @field_validator("name")
    @classmethod
    def _name_shape(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(
                f"{value!r} is not a valid task name; use 2-63 lower-case letters, digits "
                "and dashes, starting with a letter or digit (e.g. dynasent-r2)"
            )
        return value

    @field_validator("language")
    @classmethod
    def _language_tag(cls, value: str) -> str:
        if not _BCP47_RE.match(value):
            raise ValueError(f"{value!r} is not a BCP-47 language tag; write e.g. en, en-IN, am or om")
        return value

    @field_validator("labels", "validation_labels", "exclusive_labels")
    @classmethod
    def _label_shape(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        for label in value:
            if not _LABEL_RE.match(label):
                raise ValueError(
                    f"label {label!r} is not valid; use lower-case letters, digits and "
                    "underscores, starting with a letter (e.g. weakly_positive)"
                )
        duplicates = sorted({label for label in value if value.count(label) > 1})
        if duplicates:
            raise ValueError(f"labels {duplicates} appear more than once; list each once")
        return value

    @model_validator(mode="after")
    def _family_rules(self) -> TaskDefinition:
        family = self.family
        vlabels = self.effective_validation_labels
        field_names = {f.name for f in self.writer_fields}
        agreement = self.agreement
        if agreement.gold_min_votes > self.validations_per_example:
            raise ValueError(
                f"agreement.gold_min_votes ({agreement.gold_min_votes}) exceeds "
                f"validations_per_example ({self.validations_per_example}); lower it"
            )
        if agreement.dev_test_min_votes > self.validations_per_example:
            raise ValueError(
                f"agreement.dev_test_min_votes ({agreement.dev_test_min_votes}) exceeds "
                f"validations_per_example ({self.validations_per_example}); lower it"
            )
        if family in (TaskFamily.binary_variety, TaskFamily.intended_sarcasm) and len(self.labels) != 2:
            raise ValueError(
                f"family {family.value} needs exactly 2 labels, got {len(self.labels)}; "
                "list the two classes, e.g. [sarcastic, not_sarcastic]"
            )
        if family is TaskFamily.target_dependent:
            if WriterFieldName.target_span not in field_names:
                raise ValueError(
                    "family target_dependent needs a writer field `target_span`; add "
                    "`- {name: target_span, required: true}` to writer_fields"
                )
            if not self.label_collapse:
                raise ValueError(
                    "family target_dependent needs `label_collapse` mapping every 5-point "
                    "validation label to one of `labels`"
                )
        if self.label_collapse:
            for vlabel, label in self.label_collapse.items():
                if vlabel not in vlabels:
                    raise ValueError(f"label_collapse key {vlabel!r} is not a validation label; use one of {vlabels}")
                if label not in self.labels:
                    raise ValueError(
                        f"label_collapse maps {vlabel!r} to {label!r}, which is not in labels {self.labels}"
                    )
            missing = [v for v in vlabels if v not in self.label_collapse and v != self.unknown_label]
            if missing:
                raise ValueError(
                    f"label_collapse has no entry for validation labels {missing}; map each one "
                    "or name it as unknown_label"
                )
        else:
            # Without a collapse map every task label must be a validation label.
            missing = [label for label in self.labels if label not in vlabels]
            if missing:
                raise ValueError(f"validation_labels must include every label; add {missing} to validation_labels")
        self._check_label_names(vlabels)
        if self.unknown_label is not None and self.unknown_label not in vlabels:
            raise ValueError(
                f"unknown_label {self.unknown_label!r} is not a validation label; add it to validation_labels"
            )
        if self.exclusive_labels:
            if family is not TaskFamily.multi_label:
                raise ValueError("exclusive_labels only applies to family multi_label; remove it")
            unknown = [label for label in self.exclusive_labels if label not in self.labels]
            if unknown:
                raise ValueError(f"exclusive_labels {unknown} are not in labels {self.labels}")
        for writer_field in self.writer_fields:
            if writer_field.name is WriterFieldName.intended_label and family is not TaskFamily.intended_sarcasm:
                raise ValueError("writer field intended_label belongs to family intended_sarcasm; remove it")
            if (
                writer_field.required_when_intended is not None
                and writer_field.required_when_intended not in self.labels
            ):
                raise ValueError(
                    f"writer field {writer_field.name.value}: required_when_intended "
                    f"{writer_field.required_when_intended!r} is not in labels {self.labels}"
                )
        if family is TaskFamily.intended_sarcasm and WriterFieldName.intended_label not in field_names:
            raise ValueError(
                "family intended_sarcasm needs a writer field `intended_label`; add "
                "`- {name: intended_label, required: true}` to writer_fields"
            )
        if len(field_names) != len(self.writer_fields):
            raise ValueError("writer_fields lists a field more than once; list each field once")
        if self.positive_label is not None:
            if family is TaskFamily.multi_label or len(self.labels) != 2:
                raise ValueError(
                    f"positive_label applies to tasks with exactly two labels; {self.name!r} has "
                    f"{len(self.labels)}{' (multi-label)' if family is TaskFamily.multi_label else ''}: remove it"
                )
            if self.positive_label not in self.labels:
                raise ValueError(f"positive_label {self.positive_label!r} is not one of labels {self.labels}")
        weights = self.training.class_weights
        if isinstance(weights, dict):
            unknown = sorted(set(weights) - set(self.labels))
            if unknown:
                raise ValueError(f"training.class_weights names {unknown}, which are not in labels {self.labels}")
            if any(not w > 0 for w in weights.values()):
                raise ValueError("training.class_weights must all be positive")
        return self

    @model_validator(mode="after")
    def _control_item_labels(self) -> TaskDefinition:
        vlabels = self.effective_validation_labels
        for index, item in enumerate(self.quality.control_items):
            unknown = [label for label in item.labels if label not in vlabels]
            if unknown:
                raise ValueError(
                    f"quality.control_items[{index}] has labels {unknown}, which are not validation labels; "
                    f"use labels from {vlabels}"
                )
        return self

    def _check_label_names(self, vlabels: list[str]) -> None:
        every = self.all_labels
        unknown = [label for label in self.label_names if label not in every]
        if unknown:
            raise ValueError(f"label_names names {unknown}, which are not labels of the task; use labels from {every}")
        seen: dict[str, str] = {}
        for label in every:
            name = self.label_name(label)
            key = name.casefold()
            if key in seen:
                raise ValueError(
                    f"labels {seen[key]!r} and {label!r} would both be shown as {name!r}; give each label its own "
                    "display name in label_names"
                )
            seen[key] = label
            other = next((o for o in every if o != label and o.casefold() == key), None)
            if other is not None:
                raise ValueError(
                    f"label {label!r} has the display name {name!r}, which is the label {other!r}; a label's "
                    "display name may not be another label"
                )

    @property
    def all_labels(self) -> list[str]:
        """The task's labels, then the validation labels that are not task labels."""
        return list(self.labels) + [label for label in self.effective_validation_labels if label not in self.labels]

    def label_name(self, label: str) -> str:
        """What people see for ``label`` (its display name; the label itself when it has none)."""
        return self.label_names.get(label, label)

    @property
    def display_names(self) -> dict[str, str]:
        """Every label of the task (validation labels included) with its display name."""
        return {label: self.label_name(label) for label in self.all_labels}

    @property
    def effective_validation_labels(self) -> list[str]:
        return list(self.validation_labels or self.labels)

    @property
    def is_multi_label(self) -> bool:
        return self.family is TaskFamily.multi_label

    def writer_field(self, name: WriterFieldName) -> WriterField | None:
        for writer_field in self.writer_fields:
            if writer_field.name is name:
                return writer_field
        return None

    def field_choices(self, writer_field: WriterField) -> list[str] | None:
        """Allowed values of a writer field, with the family's defaults."""
        if writer_field.choices is not None:
            return list(writer_field.choices)
        if writer_field.name is WriterFieldName.intended_label:
            return list(self.labels)
        if writer_field.name is WriterFieldName.category and self.family is TaskFamily.intended_sarcasm:
            return list(ISARCASM_CATEGORIES)
        return None


class TaskDefinitionError(ValueError):
    """A task YAML that cannot be used; ``problems`` has one line per field."""

    def __init__(self, problems: list[str], source: str = "task definition") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source} is not valid:\n" + "\n".join(f"  - {p}" for p in problems))


# A task file's problems say what to add or check: its author edits YAML by hand.
TASK_FILE_WORDING = {
    **PROBLEM_WORDING,
    "missing": "is required; add it",
    "extra_forbidden": "is not a known field; remove it or check its spelling",
}


def _explain(error: Mapping[str, Any]) -> str:
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    kind, value = error.get("type"), error.get("input")
    if kind == "enum":
        return f"{message} (got {value!r})"
    if kind == "string_type" and isinstance(value, (bool, int, float)):
        # YAML turns unquoted True/False/yes/no/on/off and numbers into non-strings, e.g.
        # the True/False options of the DynaSent onboarding quiz (Table 11).
        return (
            f"{message}, got {value!r}: YAML reads unquoted yes/no/true/false/"
            'on/off and numbers as non-text; put the value in quotes, e.g. "True"'
        )
    return message


def parse_task_definition(
    text: str,
    source: str = "task definition",
    *,
    max_depth: int = DEFAULT_MAX_INPUT_DEPTH,
    max_nodes: int = DEFAULT_MAX_YAML_NODES,
) -> TaskDefinition:
    """Parse and validate task YAML text; raise :class:`TaskDefinitionError` with field-level fixes.

    The YAML is read by :func:`services.structured_input.load_yaml`: at most ``max_depth``
    levels and ``max_nodes`` values, no aliases, no key given twice."""
    try:
        data = load_yaml(text, max_depth=max_depth, max_nodes=max_nodes)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        # The loader's own refusals (depth, size, aliases, duplicate keys) are not syntax errors.
        kind = "YAML" if isinstance(exc, YamlInputError) else "YAML syntax error"
        raise TaskDefinitionError([f"{kind}{where}: {getattr(exc, 'problem', exc)}"], source) from exc
    if not isinstance(data, dict):
        raise TaskDefinitionError(
            ["the file must be a YAML mapping with name, title, family and labels at the top"], source
        )
    try:
        return TaskDefinition.model_validate(data)
    except ValidationError as exc:
        raise TaskDefinitionError(
            validation_problems(exc.errors(), wording=TASK_FILE_WORDING, explain=_explain), source
        ) from exc


def load_task_definition(path: Path | str) -> TaskDefinition:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskDefinitionError(["the file is not UTF-8 text; save it as UTF-8"], str(path)) from exc
    return parse_task_definition(text, source=str(path))


def example_paths() -> list[Path]:
    """The example task files that ship with dynaloop, one per seed paper."""
    return sorted(EXAMPLES_DIR.glob("*.yaml"))


def example_path(name: str) -> Path:
    for path in example_paths():
        if path.stem == name:
            return path
    known = ", ".join(p.stem for p in example_paths())
    raise KeyError(f"no example task {name!r}; known examples: {known}")
