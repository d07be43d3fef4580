"""The round report's one schema: the pydantic models the round builder fills, the API serves
(dynaloop/api/schemas/builds.py answers with them as they are) and the report files are
written from. ``RoundReport.to_dict()`` is the stored JSON: what ``round_builds.report`` holds,
report.json says and the API returns.

Layouts follow DynaSent: Table 4/7 (counts per split and label), Table 6/9 (human F1),
Fig. 2a-c (edit distance, length, vocabulary: prompt vs no-prompt), Fig. 6 (per-worker
agreement). The datasheet section collects what a dataset user needs (Gebru et al., 2021).

**Stored JSON, old and new.** A measure that does not apply to a task's family is left out
rather than null, and a field added after a report was stored is absent from it: a field is
dumped only when it was set (``exclude_unset``), by the builder or by the stored JSON it was
read from, so a report read back dumps the keys it was stored with. The fields follow
report.json's order. Fields that reports of older builds lack are optional, although the
builder always sets them.

A leaf of the round builder: it imports only :mod:`rounds.build.build_settings` (itself a leaf),
for the build's settings and effective policy the report records.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rounds.build.build_settings import BuildSettings, EffectivePolicy

# Precision, recall and F1 of one class (or ``macro avg``), fractions in [0, 1]: keys
# ``precision``, ``recall`` and ``f1`` in that order.
ClassScores = dict[str, float | None]
# Human performance estimate (DynaSent §3.5): split -> class (then "macro avg") -> scores.
HumanF1 = dict[str, dict[str, ClassScores]]


class ReportModel(BaseModel):
    """A model of the stored report (a section or the whole): dumped as JSON with the fields set."""

    def to_dict(self) -> dict[str, Any]:
        """The stored JSON: the fields set (by the builder, or by the JSON read back), in order."""
        return self.model_dump(mode="json", exclude_unset=True)


class CountRow(ReportModel):
    # Examples with one gold label (or the total) in each split.
    dist_train: int | None = Field(
        description="Distributional train (DynaSent Table 4's first column); null when no train example has "
        "responses (imported gold), so none has a distributional label."
    )
    train: int  # majority-label train examples
    dev: int
    test: int


class ReportCounts(ReportModel):
    """DynaSent Table 4/7: examples per split by gold label."""

    labels: list[str]
    # Each gold label, other gold values (e.g. mixed), "no majority".
    rows: dict[str, CountRow] = Field(description="Gold label (or `no majority`, `mixed`, ...) -> counts.")
    total: CountRow
    excluded: dict[str, int] = Field(description="Reason -> examples left out of every split.")


class AssessmentSplit(ReportModel):
    # The round's model on one assessment split (dev or test).
    examples: int
    model_macro_f1: float | None
    model_accuracy: float | None


class ReportSplits(ReportModel):
    # How dev and test were formed, and the evidence that the round's model is at chance.
    assessment: dict[str, AssessmentSplit] = Field(description="`dev` and `test`.")
    chance: bool = Field(description="Whether dev and test were built with the round's model at chance.")
    # Per class without chance.
    cell_count: int = Field(description="Examples per (gold, predicted) cell in each of dev and test.")
    cell_bound: int
    chance_macro_f1: float | None
    at_chance: bool | None
    notes: list[str]
    # The build's effective policy: name and every setting.
    policy: EffectivePolicy | None = None
    cells: list[dict[str, Any]] = Field(
        default_factory=list, description="Per (gold, predicted) cell or gold class: dev and test examples."
    )
    independence: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="dev/test -> test of independence of prediction and gold: test, n, statistic, p_value, dof, note.",
    )
    balance: dict[str, Any] = Field(
        default_factory=dict, description="The class-balance guard's share; per class eligible/train/dev/test."
    )
    # None: a report from before it was counted.
    model_predictions: int | None = Field(
        None,
        description="Examples of the round with a model prediction; 0: no model in the loop (an imported round), "
        "so the cells are per gold class and nothing about a model is measured.",
    )


class AgreementCounts(ReportModel):
    """Examples by the votes their gold label got, out of the task's responses per example."""

    responses: int  # the task's validations per example ("k of n")
    examples_with_responses: int
    examples_with_other_response_counts: int  # examples with more or fewer than ``responses``
    by_votes: dict[str, int]  # "5 of 5" -> examples whose gold label had exactly that many votes
    at_least: dict[str, int]  # ">=4 of 5" -> examples with at least that many votes for gold
    no_gold: int  # examples with responses but no gold label (no majority)


class ReportAgreement(ReportModel):
    """Inter-annotator agreement. Single-label families: the first four (with dev and test
    kappas, and MAD-TSC's before/after consolidation for target-dependent tasks);
    multi-label families: the means over labels."""

    # Single-label tasks (rounds.build.statistics.inter_annotator_agreement).
    fleiss_kappa: float | None = None
    krippendorff_alpha: float | None = None
    randolph_kappa: float | None = None
    mean_pairwise_cohen_kappa: float | None = None
    # Multi-label tasks: per-label measures averaged (EthioEmo).
    mean_fleiss_kappa: float | None = None
    mean_randolph_kappa: float | None = None
    mean_krippendorff_alpha: float | None = None
    mean_jaccard: float | None = None
    # Every figure reads the same examples: those with n_raters responses (the task's k, or
    # the count most examples have: rounds.build.response_sets.agreement_raters).
    n_raters: int | None = Field(
        None, description="Responses per example every figure reads (the task's k, or the count most examples have)."
    )
    n_examples: int | None = Field(None, description="The examples every figure reads: those with n_raters responses.")
    examples_left_out: int | None = Field(
        None, description="Examples with another number of responses, left out of every figure."
    )
    # Single-label: Fleiss' kappa on each of dev and test that has labels; MAD-TSC's kappas for
    # target-dependent tasks only.
    fleiss_kappa_dev: float | None = None
    fleiss_kappa_test: float | None = None
    madtsc_kappas: dict[str, float | None] | None = None


class ReportResponses(ReportModel):
    """Which responses the statistics read: one set per example (docs/round_builder.md "Responses")."""

    per_example: int = Field(description="The task's validations per example (k).")
    counted: int = Field(description="The round's counted responses.")
    used: int = Field(
        description="The responses gold, distributional and model-based labels, agreement and human F1 read."
    )
    examples: int  # examples with responses
    set_aside: int = Field(
        description="Responses beyond k in one pass: those of the validators who agree least with the gold."
    )
    examples_with_set_aside: int
    set_aside_per_example: dict[str, int] = Field(description="Responses set aside -> examples.")  # "1" -> 40
    earlier_passes: int = Field(
        description="Responses of re-annotated examples' earlier passes: exported, read by no statistic."
    )
    examples_reannotated: int
    examples_with_fewer: int = Field(description="Examples with fewer than k responses.")
    statement: str


class ReportModelBased(ReportModel):
    """The model-based labels (Dawid-Skene or MACE) beside gold, on the examples with both."""

    # crowd-kit's; per label: examples whose gold holds it, whose model-based label holds it,
    # both, and the agreement with Cohen's kappa (sklearn) of the two chosen/not-chosen columns.
    method: str
    examples: int  # examples with a model-based label
    with_gold: int  # of them, examples with a gold label
    same_as_gold: int  # the model-based label (set) is the gold label (set)
    agreement: float | None  # same_as_gold / with_gold
    without_gold: int  # examples with a model-based label but no gold (no majority, tie)
    per_label: dict[str, dict[str, int | float | None]] = Field(
        description="Label -> gold, model_based, both, agreement, kappa (Cohen's, of the chosen/not-chosen columns)."
    )


class ReportFooling(ReportModel):
    # How often writers fooled the model, by attempt and by example.
    attempts: int
    fooled_attempts: int
    attempt_fooling_rate: float | None
    examples: int
    harvested_examples: int
    fooled_examples: int
    confirmed: int
    validated_fooling: int = Field(description="Fooling examples whose gold label is the writer's target.")
    validated_fooling_rate: float | None = Field(description="null when no example was checked against a model.")
    examples_with_model_prediction: int | None = Field(
        None, description="Examples checked against a model; 0: no model in the loop, nothing could be fooled."
    )


class ConditionSummary(ReportModel):
    """Prompt vs no-prompt examples (DynaSent Fig. 2a-c)."""

    # Edit distance, length and vocabulary of one writing condition.
    examples: int
    edit_distance_mean: float | None
    edit_distance_median: float | None
    length_words_mean: float | None
    vocabulary: int
    types_per_token: float | None


class ReportWorkerGold(ReportModel):
    """One validator's gold accuracy beside their agreement with the majority."""

    # Issue 26: the report names nobody (the Crowd page of the web app shows who is who to the
    # researchers).
    validator: str = Field(description="v1, v2, ... in the order of their accounts (the report names nobody).")
    labels: int  # counted labels in the round
    agreement_rate: float | None  # single-label tasks
    control_answers: int
    gold_accuracy: float | None


class ReportWorkers(ReportModel):
    writers: int
    validators: int
    # Validators' agreement with the majority (single-label tasks; DynaSent Fig. 6).
    never_disagreed: int | None = Field(None, description="Single-label families only.")
    mean_agreement_rate: float | None = Field(None, description="Single-label families only.")
    labels_per_validator_median: float | None = Field(None, description="Single-label families only.")
    # Only for rounds whose batches held control items (their answers are never responses).
    mean_gold_accuracy: float | None = Field(
        None, description="Rounds whose batches held control items only: the validators' mean gold accuracy."
    )
    gold_accuracy: list[ReportWorkerGold] | None = Field(
        None, description="Rounds whose batches held control items only: each validator's gold accuracy."
    )


class IntendedVsPerceived(ReportModel):
    """iSarcasm §5.2: the writers' intended labels against the validators' perceived ones."""

    confusion: dict[str, dict[str, int]] = Field(
        description="Perceived label -> intended label -> examples (iSarcasm Table 5)."
    )
    precision: float | None
    recall: float | None
    f1: float | None
    n_examples: int
    n_without_perceived: int


class MultiLabelHuman(ReportModel):
    micro_f1: float | None
    macro_f1: float | None
    per_label: dict[str, float | None]
    n_examples: int
    n_annotators: int


class MultiLabelSection(ReportModel):
    """A multi-label round (EthioEmo §3.3; docs/round_builder.md "Multi-label rounds")."""

    # rounds.build.multilabel_report: its gold rule, re-annotation outcome, per-label counts per
    # split, per-label agreement, the human estimate and the model on dev and test. No
    # chance-level claim is made.
    gold_rule: str
    exclusive_labels: list[str] = Field(description="Labels never gold or predicted with others (neutral).")
    label_counts: dict[str, dict[str, int]] = Field(
        description="Label -> train/dev/test -> examples whose gold holds it."
    )
    reannotation: dict[str, int] = Field(
        description="requeued, resolved_by_new_validators, dropped_after_reannotation, awaiting_reannotation."
    )
    agreement: dict[str, object] = Field(
        description="The responses gold was decided on, examples with k of them: n_raters, n_examples, "
        "examples_left_out, mean_jaccard, per_label (prevalence, fleiss, randolph, alpha)."
    )
    human_f1: dict[str, MultiLabelHuman] = Field(description="Split -> synthetic annotators' F1 (DynaSent §3.5).")
    # The round's model on each split.
    model: dict[str, dict[str, int | float | None]] = Field(description="Split -> n, micro_f1, macro_f1, accuracy.")
    notes: list[str]


class Collected(ReportModel):
    opened: str | None  # ISO 8601
    closed: str | None


class ImportedFile(ReportModel):
    kind: str = Field(description="labelled or responses.")
    name: str
    sha256: str
    source: str | None = None  # absent when the import named none


class GoldSource(ReportModel):
    """Where a round's gold labels came from when it has imported examples (docs/round_builder.md
    "Imports"): taken from an imported dataset as is, or computed here from imported responses."""

    imported_gold: int
    imported_gold_with_votes: int
    imported_with_original_split: int
    from_responses: int
    imports: list[ImportedFile]
    statement: str


class Datasheet(ReportModel):
    """What a dataset user needs to know (Gebru et al., 2021)."""

    title: str
    task: str
    family: str
    language: str
    domain: str | None
    licence: str
    round: int
    collected: Collected
    prompt_sources: list[str]
    examples: int
    validations: int
    validations_per_example: int
    gold_rule: str
    dev_test_rule: str
    agreement: ReportAgreement  # empty: no counted labels
    human_f1_macro: dict[str, float | None]
    model_f1_macro: dict[str, float | None]
    build_policy: str | None = None  # what the build's policy is and what its numbers show
    agreement_counts: dict[str, int] | None = None  # ">=k of n" -> examples
    # ReportResponses.statement.
    responses_used: str | None = Field(None, description="Which responses the statistics read, and what was set aside.")
    gold_source: GoldSource | None = Field(
        None, description="Only for rounds with imported examples: where the gold labels came from."
    )


class ReportDuplicates(ReportModel):
    """What the build did with repeated texts (docs/round_builder.md "Duplicates")."""

    merged: int = Field(description="Copies excluded because another copy of their normalized text was kept.")
    conflicting_gold_texts: int = Field(description="Texts whose copies had different gold labels (all excluded).")
    conflicting_gold_examples: int
    in_an_earlier_round: int = Field(description="Copies of a text that an earlier round of the task holds.")
    rule: str


class RoundReport(ReportModel):
    """A build's report."""

    task: str
    family: str
    round: int
    seed: int
    built_at: str = Field(description="ISO 8601 time.")
    config: BuildSettings  # every setting, defaults included
    counts: ReportCounts
    splits: ReportSplits
    agreement: ReportAgreement  # empty: no counted labels
    # Empty for multi-label tasks and rounds without labels.
    human_f1: HumanF1 = Field(
        description="Human performance estimate (DynaSent §3.5, Table 6/9): split -> class or average -> measure."
    )
    fooling: ReportFooling
    conditions: dict[str, ConditionSummary] = Field(description="`prompt` and `no_prompt`.")
    workers: ReportWorkers
    intended_vs_perceived: IntendedVsPerceived | None  # intended-sarcasm tasks (iSarcasm)
    datasheet: Datasheet
    agreement_counts: AgreementCounts | None = None  # None: no counted labels
    responses: ReportResponses | None = Field(
        None, description="Which responses the statistics read. Absent in builds made before it."
    )
    model_based: ReportModelBased | None = Field(
        None, description="The model-based labels beside gold; null when none were asked for or computed."
    )
    multi_label: MultiLabelSection | None = Field(None, description="Multi-label tasks only; absent otherwise.")
    label_names: dict[str, str] | None = Field(
        None,
        description="Each label with the name annotators saw (the task's `label_names`), for people reading the "
        "report; the report's other fields use the labels themselves. Absent when the task names none.",
    )
    duplicates: ReportDuplicates | None = Field(
        None, description="Repeated texts: one copy per text reaches the splits. Absent in builds made before it."
    )
    files: list[str] | None = Field(
        None,
        description="Files written with the report (builds run with an "
        "output folder, `dynaloop round build`); absent otherwise.",
    )
