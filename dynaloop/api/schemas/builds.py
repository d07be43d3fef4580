"""Builds of a closed round and their report (rounds.build.pipeline; DynaSent Tables 4/6/7,
Fig. 2 and 6). The report is stored with the build, so these models describe stored JSON:
measures that do not apply to a task's family are left out rather than null."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rounds.build.build_settings import BuildSettings, EffectivePolicy


class PolicyPreview(BaseModel):
    """What one policy would give the round (rounds.build.preview)."""

    name: str
    settings: dict[str, Any] = Field(description="The build options to send for this policy.")
    policy: EffectivePolicy | None
    feasible: bool
    message: str | None = Field(description="Why it cannot build, when it cannot.")
    constraint: str | None = Field(
        description="What refused it: dev_test_size (too few eligible examples per cell or class), "
        "balance_guard (the class-balance guard, max_dev_test_share) or settings (the settings are invalid); "
        "null when it builds.",
    )
    short: list[dict[str, Any]] = Field(description="Cells or classes short of examples: available, needed, short_by.")
    unit: str | None = Field(description="cell or class.")
    dev_per_cell: int | None
    test_per_cell: int | None
    counts: dict[str, int] = Field(description="train, dev, test, excluded.")
    classes: dict[str, dict[str, int]] = Field(description="Class -> train, dev, test.")


class BuildPreviewPublic(BaseModel):
    task: str
    round: int
    requested: PolicyPreview
    relaxations: list[PolicyPreview]


class CountRow(BaseModel):
    dist_train: int | None = Field(
        description="Distributional train (DynaSent Table 4's first column); null when no train example has "
        "responses (imported gold), so none has a distributional label."
    )
    train: int
    dev: int
    test: int


class ReportCounts(BaseModel):
    """DynaSent Table 4/7: examples per split by gold label."""

    labels: list[str]
    rows: dict[str, CountRow] = Field(description="Gold label (or `no majority`, `mixed`, ...) -> counts.")
    total: CountRow
    excluded: dict[str, int] = Field(description="Reason -> examples left out of every split.")


class AssessmentSplit(BaseModel):
    examples: int
    model_macro_f1: float | None
    model_accuracy: float | None


class ReportSplits(BaseModel):
    assessment: dict[str, AssessmentSplit] = Field(description="`dev` and `test`.")
    chance: bool = Field(description="Whether dev and test were built with the round's model at chance.")
    cell_count: int = Field(description="Examples per (gold, predicted) cell in each of dev and test.")
    cell_bound: int
    chance_macro_f1: float | None
    at_chance: bool | None
    notes: list[str]
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
    model_predictions: int | None = Field(
        None,
        description="Examples of the round with a model prediction; 0: no model in the loop (an imported round), "
        "so the cells are per gold class and nothing about a model is measured.",
    )


class AgreementCounts(BaseModel):
    """Examples by the votes their gold label got, out of the task's responses per example."""

    responses: int
    examples_with_responses: int
    examples_with_other_response_counts: int
    by_votes: dict[str, int]
    at_least: dict[str, int]
    no_gold: int


class ReportAgreement(BaseModel):
    """Inter-annotator agreement. Single-label families: the first four (with dev and test
    kappas, and MAD-TSC's before/after consolidation for target-dependent tasks);
    multi-label families: the means over labels."""

    fleiss_kappa: float | None = None
    krippendorff_alpha: float | None = None
    randolph_kappa: float | None = None
    mean_pairwise_cohen_kappa: float | None = None
    fleiss_kappa_dev: float | None = None
    fleiss_kappa_test: float | None = None
    madtsc_kappas: dict[str, float | None] | None = None
    mean_fleiss_kappa: float | None = None
    mean_randolph_kappa: float | None = None
    mean_krippendorff_alpha: float | None = None
    mean_jaccard: float | None = None
    n_raters: int | None = Field(
        None, description="Responses per example every figure reads (the task's k, or the count most examples have)."
    )
    n_examples: int | None = Field(None, description="The examples every figure reads: those with n_raters responses.")
    examples_left_out: int | None = Field(
        None, description="Examples with another number of responses, left out of every figure."
    )


class ReportResponses(BaseModel):
    """Which responses the statistics read: one set per example (docs/round_builder.md "Responses")."""

    per_example: int = Field(description="The task's validations per example (k).")
    counted: int = Field(description="The round's counted responses.")
    used: int = Field(
        description="The responses gold, distributional and model-based labels, agreement and human F1 read."
    )
    examples: int
    set_aside: int = Field(
        description="Responses beyond k in one pass: those of the validators who agree least with the gold."
    )
    examples_with_set_aside: int
    set_aside_per_example: dict[str, int] = Field(description="Responses set aside -> examples.")
    earlier_passes: int = Field(
        description="Responses of re-annotated examples' earlier passes: exported, read by no statistic."
    )
    examples_reannotated: int
    examples_with_fewer: int = Field(description="Examples with fewer than k responses.")
    statement: str


class ReportModelBased(BaseModel):
    """The model-based labels (Dawid-Skene or MACE) beside gold, on the examples with both."""

    method: str
    examples: int
    with_gold: int
    same_as_gold: int
    agreement: float | None
    without_gold: int
    per_label: dict[str, dict[str, int | float | None]] = Field(
        description="Label -> gold, model_based, both, agreement, kappa (Cohen's, of the chosen/not-chosen columns)."
    )


class ReportFooling(BaseModel):
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


class ConditionSummary(BaseModel):
    """Prompt vs no-prompt examples (DynaSent Fig. 2a-c)."""

    examples: int
    edit_distance_mean: float | None
    edit_distance_median: float | None
    length_words_mean: float | None
    vocabulary: int
    types_per_token: float | None


class ReportWorkerGold(BaseModel):
    """One validator's gold accuracy beside their agreement with the majority."""

    validator: str = Field(description="v1, v2, ... in the order of their accounts (the report names nobody).")
    labels: int
    agreement_rate: float | None
    control_answers: int
    gold_accuracy: float | None


class ReportWorkers(BaseModel):
    writers: int
    validators: int
    never_disagreed: int | None = Field(None, description="Single-label families only.")
    mean_agreement_rate: float | None = Field(None, description="Single-label families only.")
    labels_per_validator_median: float | None = Field(None, description="Single-label families only.")
    mean_gold_accuracy: float | None = Field(
        None, description="Rounds whose batches held control items only: the validators' mean gold accuracy."
    )
    gold_accuracy: list[ReportWorkerGold] | None = Field(
        None, description="Rounds whose batches held control items only: each validator's gold accuracy."
    )


class IntendedVsPerceived(BaseModel):
    """iSarcasm §5.2: the writers' intended labels against the validators' perceived ones."""

    confusion: dict[str, dict[str, int]] = Field(
        description="Perceived label -> intended label -> examples (iSarcasm Table 5)."
    )
    precision: float | None
    recall: float | None
    f1: float | None
    n_examples: int
    n_without_perceived: int


class MultiLabelHuman(BaseModel):
    micro_f1: float | None
    macro_f1: float | None
    per_label: dict[str, float | None]
    n_examples: int
    n_annotators: int


class MultiLabelSection(BaseModel):
    """A multi-label round (EthioEmo §3.3; docs/round_builder.md "Multi-label rounds")."""

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
    model: dict[str, dict[str, int | float | None]] = Field(description="Split -> n, micro_f1, macro_f1, accuracy.")
    notes: list[str]


class Collected(BaseModel):
    opened: str | None
    closed: str | None


class ImportedFile(BaseModel):
    kind: str = Field(description="labelled or responses.")
    name: str
    sha256: str
    source: str | None = None


class GoldSource(BaseModel):
    """Where a round's gold labels came from when it has imported examples (docs/round_builder.md
    "Imports"): taken from an imported dataset as is, or computed here from imported responses."""

    imported_gold: int
    imported_gold_with_votes: int
    imported_with_original_split: int
    from_responses: int
    imports: list[ImportedFile]
    statement: str


class Datasheet(BaseModel):
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
    agreement: ReportAgreement
    human_f1_macro: dict[str, float | None]
    model_f1_macro: dict[str, float | None]
    build_policy: str | None = None
    agreement_counts: dict[str, int] | None = None
    gold_source: GoldSource | None = Field(
        None, description="Only for rounds with imported examples: where the gold labels came from."
    )
    responses_used: str | None = Field(None, description="Which responses the statistics read, and what was set aside.")


class ReportDuplicates(BaseModel):
    """What the build did with repeated texts (docs/round_builder.md "Duplicates")."""

    merged: int = Field(description="Copies excluded because another copy of their normalized text was kept.")
    conflicting_gold_texts: int = Field(description="Texts whose copies had different gold labels (all excluded).")
    conflicting_gold_examples: int
    in_an_earlier_round: int = Field(description="Copies of a text that an earlier round of the task holds.")
    rule: str


class RoundReport(BaseModel):
    """A build's report."""

    task: str
    family: str
    round: int
    seed: int
    built_at: str = Field(description="ISO 8601 time.")
    config: BuildSettings
    counts: ReportCounts
    splits: ReportSplits
    agreement: ReportAgreement
    human_f1: dict[str, dict[str, dict[str, float | None]]] = Field(
        description="Human performance estimate (DynaSent §3.5, Table 6/9): split -> class or average -> measure."
    )
    fooling: ReportFooling
    conditions: dict[str, ConditionSummary] = Field(description="`prompt` and `no_prompt`.")
    workers: ReportWorkers
    intended_vs_perceived: IntendedVsPerceived | None
    datasheet: Datasheet
    agreement_counts: AgreementCounts | None = None
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
    files: list[str] | None = Field(
        None,
        description="Files written with the report (builds run with an "
        "output folder, `dynaloop round build`); absent otherwise.",
    )
    duplicates: ReportDuplicates | None = Field(
        None, description="Repeated texts: one copy per text reaches the splits. Absent in builds made before it."
    )


class BuildLedger(BaseModel):
    """The pay ledger computed after the build (docs/round_builder.md, "Pay and the ledger")."""

    currency: str | None = None
    entries_added: int | None = None
    amount_added_minor: int | None = None
    already_paid: int | None = None
    error: str | None = Field(None, description="Why the ledger was not computed; the build stands.")


class BuildPublic(BaseModel):
    build_id: int
    round: int = Field(description="The round's number in its task.")
    task: str
    report: RoundReport
    ledger: BuildLedger | None = Field(
        None, description="Present when the task has a pay policy: what computing its ledger added."
    )


class _BuildId(BaseModel):
    build_id: int


class RoundReportPublic(RoundReport, _BuildId):
    """The newest build's report with its build's id (first, as it always was)."""
