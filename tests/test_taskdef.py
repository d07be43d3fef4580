"""Task definition YAML: the shipped examples and the errors researchers get for bad files.

No database, no network: this only exercises :mod:`services.taskdef`.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from services.taskdef import (
    EXAMPLES_DIR,
    ISARCASM_CATEGORIES,
    TaskDefinition,
    TaskDefinitionError,
    TaskFamily,
    WriterFieldName,
    example_path,
    example_paths,
    load_task_definition,
    parse_task_definition,
)

EXPECTED_EXAMPLES = {
    "dynasent-r2": TaskFamily.single_label,
    "besstie-en-in-sarcasm": TaskFamily.binary_variety,
    "isarcasm": TaskFamily.intended_sarcasm,
    "ethioemo-amharic": TaskFamily.multi_label,
    "mad-tsc": TaskFamily.target_dependent,
}

# Ethiopic (Ge'ez) Unicode blocks: Ethiopic, Ethiopic Supplement, Ethiopic Extended(-A).
GEEZ = re.compile(r"[\u1200-\u139F\u2D80-\u2DDF\uAB00-\uAB2F]")


def load(name: str) -> TaskDefinition:
    return load_task_definition(example_path(name))


# --------------------------------------------------------------------------------------
# Shipped examples: every one loads
# --------------------------------------------------------------------------------------


def test_one_example_per_seed_paper_ships() -> None:
    stems = {path.stem for path in example_paths()}
    assert stems == set(EXPECTED_EXAMPLES)
    assert all(path.parent == EXAMPLES_DIR for path in example_paths())


@pytest.mark.parametrize("name", sorted(EXPECTED_EXAMPLES))
def test_example_loads_with_its_family_and_name(name: str) -> None:
    definition = load(name)
    assert definition.name == name, "the task name must match the file name"
    assert definition.family is EXPECTED_EXAMPLES[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_EXAMPLES))
def test_example_is_written_for_a_real_round(name: str) -> None:
    path = example_path(name)
    text = path.read_text(encoding="utf-8")
    header = text.splitlines()[0]
    assert header.startswith("# "), "each example starts with a comment header"
    # The header cites the paper sections its settings come from.
    comment = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert re.search(r"§\d", comment), "the header cites paper sections"
    assert "shared/seeds/" in comment, "the header names the seed paper file"

    definition = load_task_definition(path)
    assert len(definition.instructions) > 400, "writer instructions are real markdown"
    assert len(definition.validator_instructions) > 300
    assert "#" in definition.instructions or "**" in definition.instructions  # markdown
    assert definition.onboarding_quiz is not None
    assert len(definition.onboarding_quiz.questions) >= 3
    assert definition.onboarding_quiz.max_attempts == 5
    for question in definition.onboarding_quiz.questions:
        assert all(isinstance(option, str) for option in question.options)
        assert len(set(question.options)) == len(question.options), question.text
    constraints = definition.constraints
    # Bounded above; minimums may be 1 (tweet tasks must accept their papers' short posts).
    assert 1 <= constraints.min_chars < constraints.max_chars <= 1000
    assert constraints.min_words >= 1
    # Every task label can be given by validators (directly or through the collapse map).
    reachable = (
        set(definition.label_collapse.values())
        if definition.label_collapse
        else set(definition.effective_validation_labels)
    )
    assert set(definition.labels) <= reachable
    agreement = definition.agreement
    assert agreement.gold_min_votes <= agreement.dev_test_min_votes <= definition.validations_per_example
    assert definition.tries_per_assignment == 10
    assert definition.validation_batch_size == 10


@pytest.mark.parametrize("name", sorted(EXPECTED_EXAMPLES))
def test_example_round_trips_through_yaml(name: str, tmp_path: Path) -> None:
    definition = load(name)
    dumped = yaml.safe_dump(definition.model_dump(mode="json"), allow_unicode=True, sort_keys=False)
    out = tmp_path / f"{name}.yaml"
    out.write_text(dumped, encoding="utf-8")
    assert load_task_definition(out) == definition


def test_example_path_names_the_known_examples_when_asked_for_another() -> None:
    with pytest.raises(KeyError) as info:
        example_path("dynasent-r3")
    message = str(info.value)
    assert "dynasent-r3" in message
    for name in EXPECTED_EXAMPLES:
        assert name in message


# --------------------------------------------------------------------------------------
# Shipped examples: family-specific content
# --------------------------------------------------------------------------------------


DYNASENT_TABLE_11 = [
    ("You are asked to write down one sentence at each round.", ["False", "True"], "True"),
    (
        "You will not know whether you fool the model after you submit your sentence.",
        ["False", "True"],
        "False",
    ),
    ("You may need to wait after you submit your result.", ["False", "True"], "True"),
    (
        "The goal is to find an example that the model gets right but that another person would get wrong.",
        ["False", "True"],
        "False",
    ),
    ("You will be modifying a provided prompt to generate your own sentence.", ["False", "True"], "True"),
    (
        'Here is an example where a powerful model predicts positive sentiment: "The '
        'restaurant is near my place, but the food there is not good at all."',
        ["False", "True"],
        "False",
    ),
    (
        "Suppose the goal is to write a positive sentence that fools the model into predicting "
        'another label. The sentence provided is "That was awful!", and the model predicts '
        "negative. Does this sentence meet the goal of the task?",
        ["Yes", "No"],
        "No",
    ),
    (
        "Suppose the goal is to write a negative sentence that fools the model into predicting "
        'another label. The sentence provided is "They did a great job of making me feel '
        'unwanted", and the model predicts positive. Does this sentence meet the goal of the task?',
        ["Yes", "No"],
        "Yes",
    ),
]


def test_dynasent_settings_follow_the_paper() -> None:
    d = load("dynasent-r2")
    assert d.labels == ["positive", "negative", "neutral"]
    assert d.validation_labels == ["positive", "negative", "neutral", "mixed"]
    assert d.tries_per_assignment == 10
    assert d.validations_per_example == 5
    assert (d.agreement.gold_min_votes, d.agreement.dev_test_min_votes) == (3, 4)
    assert d.agreement.unqualify_disagreement_rate == pytest.approx(0.8)
    assert d.domain == "reviews"
    assert d.licence == "CC BY 4.0"
    assert d.language == "en"
    assert d.writer_fields == []


def test_dynasent_quiz_reproduces_table_11() -> None:
    quiz = load("dynasent-r2").onboarding_quiz
    assert quiz is not None
    assert quiz.max_attempts == 5
    got = [(q.text, q.options, q.answer) for q in quiz.questions]
    assert got == DYNASENT_TABLE_11


def test_dynasent_instructions_carry_figure_8_and_the_validation_glosses() -> None:
    d = load("dynasent-r2")
    assert "find examples that fool an AI model into making the" in d.instructions
    assert "The host did a great job of making me feel unwanted." in d.instructions
    # Numbers and the order of steps are generated by the pages (frontend/instructions.py),
    # so the task text names neither.
    assert "10 tries" not in d.instructions and "hit the **Submit** button" not in d.instructions
    assert d.display_names == {
        "positive": "Positive",
        "negative": "Negative",
        "neutral": "No sentiment",
        "mixed": "Mixed sentiment",
    }
    for gloss in ("**Positive**", "**Negative**", "**No sentiment**", "**Mixed sentiment**"):
        assert gloss in d.validator_instructions
    assert "The book is 972 pages long." in d.validator_instructions
    assert "10 sentences" not in d.validator_instructions


def test_besstie_is_a_binary_en_in_task_with_discard() -> None:
    d = load("besstie-en-in-sarcasm")
    assert d.language == "en-IN"
    assert d.labels == ["sarcastic", "not_sarcastic"]
    assert d.effective_validation_labels == ["sarcastic", "not_sarcastic", "discard"]
    assert d.validations_per_example == 3  # three annotators per variety (§4.2)
    assert d.agreement.gold_min_votes == 2
    variety = d.writer_field(WriterFieldName.variety)
    domain = d.writer_field(WriterFieldName.domain)
    assert variety is not None and domain is not None
    assert variety.required and domain.required
    assert d.field_choices(variety) == ["en-AU", "en-IN", "en-UK"]
    assert set(d.field_choices(domain)) == {"google-reviews", "reddit"}
    assert d.writer_field(WriterFieldName.intended_label) is None
    assert "discard" in d.validator_instructions
    assert "computer-generated" in d.validator_instructions


def test_isarcasm_writer_fields_follow_the_survey() -> None:
    d = load("isarcasm")
    assert d.labels == ["sarcastic", "not_sarcastic"]
    intended = d.writer_field(WriterFieldName.intended_label)
    explanation = d.writer_field(WriterFieldName.explanation)
    rephrase = d.writer_field(WriterFieldName.rephrase)
    category = d.writer_field(WriterFieldName.category)
    assert intended is not None and intended.required
    assert d.field_choices(intended) == ["sarcastic", "not_sarcastic"]
    for field in (explanation, rephrase):
        assert field is not None
        # Only sarcastic texts need an explanation and a rephrase (iSarcasm §4.1).
        assert field.required is False
        assert field.required_when_intended == "sarcastic"
    assert category is not None and not category.required
    assert d.field_choices(category) == ISARCASM_CATEGORIES
    # "At least 5 words" (§4.1) is asked of writers, not enforced: the public tweets include
    # shorter ones, and stored tweets run past 280 characters.
    assert "at least 5 words" in d.instructions
    assert d.constraints.min_words == 1 and d.constraints.min_chars == 1
    assert d.constraints.max_chars == 500
    assert d.validations_per_example == 3
    assert d.positive_label == "sarcastic"


# Short posts as people write them (ours, in the style of real tweets and Reddit comments), and
# a 400-character stored reply: the tweet tasks must accept them all.
SHORT_POSTS = [
    "Wow. Just wow.",
    "fuming 😤",
    "ok sure",
    "Love Mondays #not",
    "@user thanks!!",
    "great",
    "@user @user @user " + "yeah because that always works out so well for everyone involved &amp; " * 5,
]


@pytest.mark.parametrize("name", ["isarcasm", "besstie-en-in-sarcasm"])
def test_tweet_tasks_accept_short_real_looking_posts(name: str) -> None:
    from services.errors import Invalid
    from services.text import clean_text

    constraints = load(name).constraints
    for post in SHORT_POSTS:
        assert (
            clean_text(
                post,
                min_chars=constraints.min_chars,
                max_chars=constraints.max_chars,
                min_words=constraints.min_words,
            )
            == post.strip()
        )
    with pytest.raises(Invalid, match="the limit is"):  # still bounded
        clean_text("a " * 400, max_chars=constraints.max_chars)


@pytest.mark.parametrize("name", sorted(EXPECTED_EXAMPLES))
def test_examples_name_their_positive_class_and_training_defaults(name: str) -> None:
    d = load(name)
    text = example_path(name).read_text(encoding="utf-8")
    if len(d.labels) == 2 and not d.is_multi_label:
        assert d.positive_label in d.labels, "a binary example names its positive class"
    else:
        assert d.positive_label is None
    assert "# Training:" in text, "the YAML says which training setting it uses and why"
    # Every example trains with a class-weighted loss at 5e-5 for 4 epochs (docs/training.md,
    # "The task's defaults"): with the papers' unweighted 2e-5 the packaged MiniLM collapsed
    # minority classes on data shaped like the seeds' (docs/benchmarks.md).
    assert d.training.class_weights == "balanced"
    assert (d.training.epochs, d.training.learning_rate) == (4, 5e-5)


def test_positive_label_and_class_weights_are_checked() -> None:
    base = "name: toy\ntitle: t\nfamily: single_label\n"
    irony = parse_task_definition(base + "labels: [non_irony, irony]\npositive_label: irony\n")
    assert irony.positive_label == "irony"
    with pytest.raises(TaskDefinitionError, match="positive_label 'ironic' is not one of labels"):
        parse_task_definition(base + "labels: [non_irony, irony]\npositive_label: ironic\n")
    with pytest.raises(TaskDefinitionError, match="exactly two labels"):
        parse_task_definition(base + "labels: [a, b, c]\npositive_label: a\n")
    weighted = parse_task_definition(base + "labels: [a, b]\ntraining: {class_weights: {a: 1.0, b: 3.0}}\n")
    assert weighted.training.class_weights == {"a": 1.0, "b": 3.0}
    with pytest.raises(TaskDefinitionError, match="not in labels"):
        parse_task_definition(base + "labels: [a, b]\ntraining: {class_weights: {c: 2.0}}\n")
    with pytest.raises(TaskDefinitionError, match="class_weights"):
        parse_task_definition(base + "labels: [a, b]\ntraining: {class_weights: heavy}\n")


def test_isarcasm_quiz_category_options_are_the_writer_choices() -> None:
    d = load("isarcasm")
    quiz = d.onboarding_quiz
    assert quiz is not None
    category_questions = [q for q in quiz.questions if "which kind of ironic speech" in q.text]
    assert len(category_questions) >= 3
    for question in category_questions:
        assert question.options == ISARCASM_CATEGORIES
    answers = {q.answer for q in category_questions}
    assert {"overstatement", "rhetorical_question", "irony"} <= answers


def test_ethioemo_is_multi_label_amharic() -> None:
    d = load("ethioemo-amharic")
    assert d.language == "am"
    assert d.is_multi_label
    assert d.labels == ["anger", "disgust", "fear", "joy", "sadness", "surprise", "neutral"]
    assert d.exclusive_labels == ["neutral"]
    assert d.validations_per_example == 3
    assert (d.agreement.gold_min_votes, d.agreement.dev_test_min_votes) == (2, 2)
    assert d.agreement.requeue_disagreements == 1
    assert (d.constraints.min_chars, d.constraints.max_chars) == (15, 280)  # §3.2


def test_ethioemo_carries_geez_text_in_instructions_and_quiz() -> None:
    d = load("ethioemo-amharic")
    assert "በጽሑፉ ውስጥ የተገለጹትን ስሜቶች በሙሉ ይምረጡ።" in d.validator_instructions
    assert "ዛሬ በጣም ደስ ብሎኛል።" in d.instructions
    assert GEEZ.search(d.title)
    quiz = d.onboarding_quiz
    assert quiz is not None
    geez_questions = [q for q in quiz.questions if GEEZ.search(q.text)]
    assert geez_questions, "at least one quiz question is in Ge'ez script"
    first = quiz.questions[0]
    assert first.answer == "ደስታ (joy)"
    assert first.answer in first.options
    # English stays alongside.
    assert "Choose every emotion the text expresses" in d.validator_instructions


def test_ethioemo_geez_text_survives_a_round_trip(tmp_path: Path) -> None:
    path = example_path("ethioemo-amharic")
    raw = path.read_bytes()
    # Stored as UTF-8 characters, not as YAML \u escapes.
    assert "ደስታ".encode() in raw
    assert b"\\u12" not in raw
    d = load_task_definition(path)
    # JSON (what the API sends) and YAML (what a researcher edits) both keep the script.
    assert TaskDefinition.model_validate_json(d.model_dump_json()) == d
    dumped = yaml.safe_dump(d.model_dump(mode="json"), allow_unicode=True)
    copy_path = tmp_path / "copy.yaml"
    copy_path.write_bytes(dumped.encode("utf-8"))
    again = load_task_definition(copy_path)
    assert again.onboarding_quiz == d.onboarding_quiz
    assert again.validator_instructions == d.validator_instructions
    assert GEEZ.findall(again.instructions) == GEEZ.findall(d.instructions)


def test_mad_tsc_collapses_five_points_to_three() -> None:
    d = load("mad-tsc")
    assert d.labels == ["negative", "neutral", "positive"]
    assert d.effective_validation_labels == [
        "negative",
        "weakly_negative",
        "neutral",
        "weakly_positive",
        "positive",
        "unknown",
    ]
    assert d.unknown_label == "unknown"
    collapse = d.label_collapse
    assert collapse is not None
    assert set(collapse.values()) == {"negative", "neutral", "positive"}
    assert collapse["weakly_negative"] == "negative"
    assert collapse["weakly_positive"] == "positive"
    # Every 5-point label is mapped; `unknown` is not (such items are dropped, §3.4).
    assert set(collapse) == set(d.effective_validation_labels) - {"unknown"}
    assert d.validations_per_example == 3  # "labeled by three annotators" (§3.3)
    span = d.writer_field(WriterFieldName.target_span)
    assert span is not None and span.required
    assert "journalist" in d.validator_instructions
    assert "unknown" in d.validator_instructions


# --------------------------------------------------------------------------------------
# Bad YAML: each error names the field and says how to fix it
# --------------------------------------------------------------------------------------


BASES: dict[str, dict[str, object]] = {
    "single_label": {
        "name": "tiny-sentiment",
        "title": "Tiny sentiment",
        "family": "single_label",
        "labels": ["positive", "negative", "neutral"],
        "validation_labels": ["positive", "negative", "neutral", "mixed"],
        "onboarding_quiz": {"questions": [{"text": "Is this a test?", "options": ["True", "False"], "answer": "True"}]},
    },
    "binary_variety": {
        "name": "tiny-sarcasm",
        "title": "Tiny sarcasm",
        "family": "binary_variety",
        "language": "en-AU",
        "labels": ["sarcastic", "not_sarcastic"],
        "validation_labels": ["sarcastic", "not_sarcastic", "discard"],
    },
    "intended_sarcasm": {
        "name": "tiny-isarcasm",
        "title": "Tiny iSarcasm",
        "family": "intended_sarcasm",
        "labels": ["sarcastic", "not_sarcastic"],
        "writer_fields": [
            {"name": "intended_label", "required": True},
            {"name": "explanation", "required_when_intended": "sarcastic"},
        ],
    },
    "multi_label": {
        "name": "tiny-emotion",
        "title": "Tiny emotion",
        "family": "multi_label",
        "language": "am",
        "labels": ["anger", "joy", "neutral"],
        "exclusive_labels": ["neutral"],
        "validations_per_example": 3,
        "agreement": {"gold_min_votes": 2, "dev_test_min_votes": 2},
    },
    "target_dependent": {
        "name": "tiny-tsc",
        "title": "Tiny TSC",
        "family": "target_dependent",
        "labels": ["negative", "neutral", "positive"],
        "validation_labels": ["negative", "weakly_negative", "neutral", "weakly_positive", "positive", "unknown"],
        "unknown_label": "unknown",
        "label_collapse": {
            "negative": "negative",
            "weakly_negative": "negative",
            "neutral": "neutral",
            "weakly_positive": "positive",
            "positive": "positive",
        },
        "writer_fields": [{"name": "target_span", "required": True}],
        "validations_per_example": 3,
        "agreement": {"gold_min_votes": 2, "dev_test_min_votes": 2},
    },
}


@pytest.mark.parametrize("family", sorted(BASES))
def test_base_definitions_are_valid(family: str) -> None:
    """The bad cases below break exactly one thing in these."""
    definition = parse_task_definition(yaml.safe_dump(BASES[family]))
    assert definition.family.value == family


def _without(key: str):
    def mutate(data: dict) -> None:
        del data[key]

    return mutate


def _set(**values):
    def mutate(data: dict) -> None:
        data.update(copy.deepcopy(values))

    return mutate


def _drop_writer_field(name: str):
    def mutate(data: dict) -> None:
        data["writer_fields"] = [f for f in data["writer_fields"] if f["name"] != name]

    return mutate


# (case id, base family, mutation, problems expected -- each a regex that must match one
# problem line from its start; together they must account for every line).
BAD_CASES = [
    ("missing-labels", "single_label", _without("labels"), [r"labels: is required; add it$"]),
    ("missing-title", "single_label", _without("title"), [r"title: is required; add it$"]),
    (
        "validator-title-on-two-lines",
        "single_label",
        _set(validator_title="Label the\nreviews"),
        [r"validator_title: the text contains a line break or tab \(U\+000A\) at position 9; the text is one line"],
    ),
    (
        "validator-title-too-long",
        "single_label",
        _set(validator_title="x" * 201),
        [r"validator_title: String should have at most 200 characters$"],
    ),
    (
        "unknown-family",
        "single_label",
        _set(family="sentiment"),
        [
            r"family: Input should be 'single_label', 'binary_variety', 'intended_sarcasm', "
            r"'multi_label' or 'target_dependent' \(got 'sentiment'\)$"
        ],
    ),
    (
        "duplicate-labels",
        "single_label",
        _set(labels=["positive", "negative", "positive"]),
        [r"labels: labels \['positive'\] appear more than once; list each once$"],
    ),
    (
        "duplicate-validation-labels",
        "single_label",
        _set(validation_labels=["positive", "negative", "neutral", "mixed", "mixed"]),
        [r"validation_labels: labels \['mixed'\] appear more than once; list each once$"],
    ),
    (
        "label-shape",
        "single_label",
        _set(labels=["Positive", "negative"]),
        [r"labels: label 'Positive' is not valid; use lower-case letters, digits and underscores"],
    ),
    (
        "min-chars-above-max-chars",
        "single_label",
        _set(constraints={"min_chars": 500, "max_chars": 100}),
        [
            r"constraints: min_chars \(500\) is larger than max_chars \(100\); "
            r"lower min_chars or raise max_chars$"
        ],
    ),
    (
        "gold-votes-above-validations",
        "single_label",
        _set(validations_per_example=3, agreement={"gold_min_votes": 4, "dev_test_min_votes": 3}),
        [r"agreement\.gold_min_votes \(4\) exceeds validations_per_example \(3\); lower it$"],
    ),
    (
        "dev-test-votes-above-validations",
        "multi_label",
        _set(agreement={"gold_min_votes": 2, "dev_test_min_votes": 4}),
        [r"agreement\.dev_test_min_votes \(4\) exceeds validations_per_example \(3\); lower it$"],
    ),
    (
        "quiz-answer-not-an-option",
        "single_label",
        _set(onboarding_quiz={"questions": [{"text": "Q?", "options": ["True", "False"], "answer": "Maybe"}]}),
        [
            r"onboarding_quiz\.questions\.0: answer 'Maybe' is not one of the options "
            r"\['True', 'False'\]; make answer one of the options$"
        ],
    ),
    (
        "quiz-unquoted-booleans",
        "single_label",
        _set(onboarding_quiz={"questions": [{"text": "Q?", "options": ["Yes", False], "answer": "Yes"}]}),
        [
            r"onboarding_quiz\.questions\.0\.options\.1: Input should be a valid string, got False: "
            r".*put the value in quotes"
        ],
    ),
    (
        "target-dependent-without-target-span",
        "target_dependent",
        _drop_writer_field("target_span"),
        [
            r"family target_dependent needs a writer field `target_span`; add "
            r"`- \{name: target_span, required: true\}` to writer_fields$"
        ],
    ),
    (
        "target-dependent-without-collapse",
        "target_dependent",
        _without("label_collapse"),
        [r"family target_dependent needs `label_collapse` mapping every 5-point validation label"],
    ),
    (
        "collapse-misses-a-validation-label",
        "target_dependent",
        _set(
            label_collapse={
                "negative": "negative",
                "neutral": "neutral",
                "positive": "positive",
                "weakly_positive": "positive",
            }
        ),
        [
            r"label_collapse has no entry for validation labels \['weakly_negative'\]; map each one "
            r"or name it as unknown_label$"
        ],
    ),
    (
        "collapse-to-unknown-task-label",
        "target_dependent",
        _set(
            label_collapse={
                "negative": "negative",
                "weakly_negative": "negative",
                "neutral": "neutral",
                "weakly_positive": "positive",
                "positive": "very_positive",
            }
        ),
        [r"label_collapse maps 'positive' to 'very_positive', which is not in labels"],
    ),
    (
        "binary-family-with-three-labels",
        "binary_variety",
        _set(labels=["sarcastic", "not_sarcastic", "unsure"]),
        [r"family binary_variety needs exactly 2 labels, got 3; list the two classes"],
    ),
    (
        "intended-sarcasm-without-intended-label",
        "intended_sarcasm",
        _drop_writer_field("intended_label"),
        [
            r"family intended_sarcasm needs a writer field `intended_label`; add "
            r"`- \{name: intended_label, required: true\}` to writer_fields$"
        ],
    ),
    (
        "required-when-intended-not-a-label",
        "intended_sarcasm",
        _set(
            writer_fields=[
                {"name": "intended_label", "required": True},
                {"name": "rephrase", "required_when_intended": "ironic"},
            ]
        ),
        [r"writer field rephrase: required_when_intended 'ironic' is not in labels"],
    ),
    (
        "exclusive-labels-outside-multi-label",
        "single_label",
        _set(exclusive_labels=["neutral"]),
        [r"exclusive_labels only applies to family multi_label; remove it$"],
    ),
    (
        "exclusive-label-not-a-label",
        "multi_label",
        _set(exclusive_labels=["none"]),
        [r"exclusive_labels \['none'\] are not in labels"],
    ),
    (
        "misspelled-top-level-key",
        "single_label",
        _set(validatons_per_example=3),
        [r"validatons_per_example: is not a known field; remove it or check its spelling$"],
    ),
    (
        "misspelled-nested-key",
        "single_label",
        _set(agreement={"gold_min_vote": 3}),
        [r"agreement\.gold_min_vote: is not a known field; remove it or check its spelling$"],
    ),
    (
        "unknown-writer-field",
        "target_dependent",
        _set(writer_fields=[{"name": "target_spam", "required": True}]),
        [r"writer_fields\.0\.name: Input should be .*'target_span'.* \(got 'target_spam'\)$"],
    ),
    (
        "bad-bcp47-word",
        "single_label",
        _set(language="english"),
        [r"language: 'english' is not a BCP-47 language tag; write e\.g\. en, en-IN, am or om$"],
    ),
    (
        "bad-bcp47-underscore",
        "binary_variety",
        _set(language="en_IN"),
        [r"language: 'en_IN' is not a BCP-47 language tag; write e\.g\. en, en-IN, am or om$"],
    ),
    (
        "label-names-unknown-label",
        "single_label",
        _set(label_names={"neutral": "No sentiment", "neutrl": "Typo"}),
        [r"label_names names \['neutrl'\], which are not labels of the task; use labels from \['positive', "],
    ),
    (
        "label-names-duplicate-display-name",
        "single_label",
        _set(label_names={"neutral": "No sentiment", "mixed": "no SENTIMENT"}),
        [r"labels 'neutral' and 'mixed' would both be shown as 'no SENTIMENT'; give each label its own"],
    ),
    (
        "label-names-name-of-another-label",
        "single_label",
        _set(label_names={"positive": "Negative"}),
        [r"label 'positive' has the display name 'Negative', which is the label 'negative'"],
    ),
    (
        "label-names-swapped",
        "single_label",
        _set(label_names={"positive": "negative", "negative": "positive"}),
        [r"label 'positive' has the display name 'negative', which is the label 'negative'"],
    ),
    (
        "label-names-empty",
        "single_label",
        _set(label_names={"neutral": "  "}),
        [r"label_names\.neutral: the display name is empty; write some text$"],
    ),
    (
        "label-names-too-long",
        "single_label",
        _set(label_names={"neutral": "x" * 61}),
        [r"label_names\.neutral: the display name has 61 characters; the limit is 60, shorten it$"],
    ),
    (
        "label-names-bidi-control",
        "single_label",
        _set(label_names={"neutral": "No \u202esentiment"}),
        [r"label_names\.neutral: .*bidirectional control character \(U\+202E RIGHT-TO-LEFT OVERRIDE\) at position 3"],
    ),
    (
        "label-names-two-lines",
        "single_label",
        _set(label_names={"neutral": "No\nsentiment"}),
        [r"label_names\.neutral: .*contains a line break or tab \(U\+000A\)"],
    ),
    (
        "label-names-markup",
        "single_label",
        _set(label_names={"neutral": "<b>None</b>"}),
        [r"label_names\.neutral: .*names cannot contain < or >"],
    ),
    (
        "label-names-not-text",
        "single_label",
        _set(label_names={"neutral": 3}),
        [r"label_names\.neutral: Input should be a valid string"],
    ),
    (
        "bad-task-name",
        "single_label",
        _set(name="My Task"),
        [r"name: 'My Task' is not a valid task name; use 2-63 lower-case letters"],
    ),
    (
        "several-problems-at-once",
        "multi_label",
        lambda data: (data.pop("title"), data.update(language="amharic", tries_per_assignment=0)),
        [
            r"title: is required; add it$",
            r"language: 'amharic' is not a BCP-47 language tag",
            r"tries_per_assignment: Input should be greater than or equal to 1$",
        ],
    ),
]


@pytest.mark.parametrize(
    ("family", "mutate", "expected"),
    [case[1:] for case in BAD_CASES],
    ids=[case[0] for case in BAD_CASES],
)
def test_bad_definition_names_the_field_and_the_fix(family, mutate, expected) -> None:
    data = copy.deepcopy(BASES[family])
    mutate(data)
    text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
    with pytest.raises(TaskDefinitionError) as info:
        parse_task_definition(text, source="bad.yaml")
    problems = info.value.problems
    assert len(problems) == len(expected), problems
    for pattern in expected:
        assert any(re.match(pattern, problem) for problem in problems), (pattern, problems)
    # The exception text lists the same lines under the file name.
    message = str(info.value)
    assert message.startswith("bad.yaml is not valid:")
    for problem in problems:
        assert f"  - {problem}" in message


# Raw-text cases: things that never get as far as a dict.
SYNTAX_CASES = [
    (
        "mapping-value-in-scalar",
        "name: broken\ntitle: Broken\nfamily: single_label\nlabels: positive: negative\n",
        r"YAML syntax error at line 4, column 17: mapping values are not allowed here$",
    ),
    (
        "bad-indentation",
        "name: broken\ntitle: Broken\nfamily: single_label\nlabels:\n  - positive\n - negative\n",
        r"YAML syntax error at line 6, column 2: ",
    ),
    (
        "unterminated-quote",
        'name: broken\ntitle: "Broken\nfamily: single_label\n',
        r"YAML syntax error at line 4, column 1: found unexpected end of stream$",
    ),
    (
        "list-document",
        "- name: dynasent-r2\n- family: single_label\n",
        r"the file must be a YAML mapping with name, title, family and labels at the top$",
    ),
    (
        "scalar-document",
        "dynasent-r2\n",
        r"the file must be a YAML mapping with name, title, family and labels at the top$",
    ),
    (
        "empty-document",
        "# nothing here yet\n",
        r"the file must be a YAML mapping with name, title, family and labels at the top$",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in SYNTAX_CASES], ids=[c[0] for c in SYNTAX_CASES])
def test_unparseable_text_says_where_and_what(text: str, expected: str) -> None:
    with pytest.raises(TaskDefinitionError) as info:
        parse_task_definition(text)
    assert len(info.value.problems) == 1
    assert re.match(expected, info.value.problems[0]), info.value.problems


def test_yaml_syntax_error_from_a_file_names_the_file_and_line(tmp_path: Path) -> None:
    good = example_path("dynasent-r2").read_text(encoding="utf-8").splitlines()
    target = next(i for i, line in enumerate(good) if line.startswith("labels:"))
    good[target] = "labels: [positive, negative, neutral"  # missing bracket
    path = tmp_path / "dynasent-broken.yaml"
    path.write_text("\n".join(good) + "\n", encoding="utf-8")
    with pytest.raises(TaskDefinitionError) as info:
        load_task_definition(path)
    assert info.value.source == str(path)
    (problem,) = info.value.problems
    match = re.match(r"YAML syntax error at line (\d+), column \d+: ", problem)
    assert match, problem
    # PyYAML notices the missing bracket where the next key starts: one line on.
    assert int(match.group(1)) == target + 2
    assert str(path) in str(info.value)


def test_non_utf8_file_is_rejected_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    text = "name: cafe-task\ntitle: Caf\u00e9 reviews\nfamily: single_label\nlabels: [positive, negative]\n"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(TaskDefinitionError) as info:
        load_task_definition(path)
    assert info.value.problems == ["the file is not UTF-8 text; save it as UTF-8"]
    assert info.value.source == str(path)
    # The same text saved as UTF-8 is fine.
    path.write_bytes(text.encode("utf-8"))
    assert load_task_definition(path).title == "Caf\u00e9 reviews"


def test_utf16_file_is_rejected_as_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "utf16.yaml"
    path.write_bytes(yaml.safe_dump(BASES["multi_label"]).encode("utf-16"))
    with pytest.raises(TaskDefinitionError) as info:
        load_task_definition(path)
    assert info.value.problems == ["the file is not UTF-8 text; save it as UTF-8"]


def test_valid_definition_is_not_reported_as_an_error() -> None:
    """Guard against a validator that rejects everything: the fixes above do work."""
    data = copy.deepcopy(BASES["single_label"])
    data["constraints"] = {"min_chars": 100, "max_chars": 500}
    data["language"] = "en-GB"
    data["onboarding_quiz"]["questions"][0]["options"] = ["Yes", "No"]
    data["onboarding_quiz"]["questions"][0]["answer"] = "Yes"
    definition = parse_task_definition(yaml.safe_dump(data))
    assert definition.constraints.min_chars == 100
    assert definition.language == "en-GB"
    assert definition.validations_per_example == 5  # DynaSent default


def test_label_names_default_to_the_labels_and_are_cleaned() -> None:
    data = copy.deepcopy(BASES["single_label"])
    plain = parse_task_definition(yaml.safe_dump(data))
    assert plain.label_names == {} and plain.display_names == {
        "positive": "positive",
        "negative": "negative",
        "neutral": "neutral",
        "mixed": "mixed",
    }
    data["label_names"] = {"neutral": "  No sentiment\u200b ", "mixed": "Mixed sentiment"}
    named = parse_task_definition(yaml.safe_dump(data, allow_unicode=True))
    # Trimmed, invisible characters stripped (the text policy); validation labels may be named.
    assert named.label_names == {"neutral": "No sentiment", "mixed": "Mixed sentiment"}
    assert named.label_name("neutral") == "No sentiment" and named.label_name("positive") == "positive"
    assert named.all_labels == ["positive", "negative", "neutral", "mixed"]


@pytest.mark.parametrize("name", sorted(EXPECTED_EXAMPLES))
def test_examples_name_every_label_for_people(name: str) -> None:
    definition = load(name)
    assert set(definition.label_names) == set(definition.all_labels)
