"""Builds of a closed round and their report (round_builder.build; DynaSent Tables 4/6/7,
Fig. 2 and 6). The report is stored with the build, so these models describe stored JSON:
measures that do not apply to a task's family are left out rather than null."""

from __future__ import annotations

from pydantic import BaseModel, Field


class BuildSettings(BaseModel):
    """The settings the build ran with, as requested (null: the default)."""

    seed: int
    dev_test_min_votes: int | None
    chance: bool | None
    max_per_cell: int | None
    model_based: str | None


class CountRow(BaseModel):
    dist_train: int = Field(description="Distributional train (DynaSent Table 4's first column).")
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


class ReportFooling(BaseModel):
    attempts: int
    fooled_attempts: int
    attempt_fooling_rate: float | None
    examples: int
    harvested_examples: int
    fooled_examples: int
    confirmed: int
    validated_fooling: int = Field(description="Fooling examples whose gold label is the writer's target.")
    validated_fooling_rate: float | None


class ConditionSummary(BaseModel):
    """Prompt vs no-prompt examples (DynaSent Fig. 2a-c)."""

    examples: int
    edit_distance_mean: float | None
    edit_distance_median: float | None
    length_words_mean: float | None
    vocabulary: int
    types_per_token: float | None


class ReportWorkers(BaseModel):
    writers: int
    validators: int
    never_disagreed: int | None = Field(None, description="Single-label families only.")
    mean_agreement_rate: float | None = Field(None, description="Single-label families only.")
    labels_per_validator_median: float | None = Field(None, description="Single-label families only.")


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
    gold_source: GoldSource | None = Field(
        None, description="Only for rounds with imported examples: where the gold labels came from."
    )


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
    files: list[str] | None = Field(
        None,
        description="Files written with the report (builds run with an "
        "output folder, `dynaloop round build`); absent otherwise.",
    )


class BuildPublic(BaseModel):
    build_id: int
    round: int = Field(description="The round's number in its task.")
    task: str
    report: RoundReport


class _BuildId(BaseModel):
    build_id: int


class RoundReportPublic(RoundReport, _BuildId):
    """The newest build's report with its build's id (first, as it always was)."""
