"""The round report's sections as typed models: what a build records (``RoundReport.to_dict()``
is stored in ``round_builds.report``, served by the API and written to report.json).

Layouts follow DynaSent: Table 4/7 (counts per split and label), Table 6/9 (human F1),
Fig. 2a-c (edit distance, length, vocabulary: prompt vs no-prompt), Fig. 6 (per-worker
agreement). The datasheet section collects what a dataset user needs (Gebru et al., 2021).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CountRow:
    """Examples with one gold label (or the total) in each split."""

    dist_train: int | None  # train examples with distributional labels (DynaSent's "Dist train")
    train: int  # majority-label train examples
    dev: int
    test: int


@dataclass
class Counts:
    """DynaSent Table 4/7: examples per gold label and split, and why examples were left out."""

    labels: list[str]
    rows: dict[str, CountRow]  # each gold label, other gold values (e.g. mixed), "no majority"
    total: CountRow
    excluded: dict[str, int]  # reason -> examples

    def to_dict(self) -> dict[str, Any]:
        return {
            "labels": self.labels,
            "rows": {name: asdict(row) for name, row in self.rows.items()},
            "total": asdict(self.total),
            "excluded": self.excluded,
        }


@dataclass
class SplitAssessment:
    """The round's model on one assessment split (dev or test)."""

    examples: int
    model_macro_f1: float | None
    model_accuracy: float | None


@dataclass
class SplitsSummary:
    """How dev and test were formed, and the evidence that the round's model is at chance."""

    assessment: dict[str, SplitAssessment]  # "dev", "test"
    chance: bool
    cell_count: int  # examples per (gold, predicted) cell (per class without chance)
    cell_bound: int
    chance_macro_f1: float | None
    at_chance: bool | None
    notes: list[str]
    # The build's effective policy (rounds.build.pipeline.Policy): name and every setting.
    policy: dict[str, Any] = field(default_factory=dict)
    # Per (gold, predicted) pair (single-label) or gold class: examples in dev and in test.
    cells: list[dict[str, Any]] = field(default_factory=list)
    # Per split (dev, test): a test of independence between the model's prediction and gold.
    independence: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The class-balance guard's share and, per class, eligible examples and their splits.
    balance: dict[str, Any] = field(default_factory=dict)
    # Examples of the round with a model prediction; 0: no model in the loop (e.g. an imported
    # round), so nothing about the model is measured. None: a report from before it was counted.
    model_predictions: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AgreementCounts:
    """How many examples had at least k of their responses agree on the gold label."""

    responses: int  # the task's validations per example ("k of n")
    examples_with_responses: int
    examples_with_other_response_counts: int  # examples with more or fewer than ``responses``
    by_votes: dict[str, int]  # "5 of 5" -> examples whose gold label had exactly that many votes
    at_least: dict[str, int]  # ">=4 of 5" -> examples with at least that many votes for gold
    no_gold: int  # examples with responses but no gold label (no majority)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ResponseSelection:
    """Which responses the build's statistics read: one set per example
    (rounds.build.response_sets; docs/round_builder.md "Responses")."""

    per_example: int  # the task's validations per example (k)
    counted: int  # the round's counted responses
    used: int  # the responses gold, distributional and model-based labels, agreement and human F1 read
    examples: int  # examples with responses
    set_aside: int  # responses beyond k in one pass: those of the validators who agree least with the gold
    examples_with_set_aside: int
    set_aside_per_example: dict[str, int]  # responses set aside -> examples ("1" -> 40)
    earlier_passes: int  # responses of re-annotated examples' earlier passes: exported, read by no statistic
    examples_reannotated: int
    examples_with_fewer: int  # examples with fewer than k responses
    statement: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ModelBasedComparison:
    """The model-based labels (Dawid-Skene or MACE, crowd-kit) beside gold, on the examples that
    have both. Per label: examples whose gold holds it, whose model-based label holds it, both,
    and the agreement (share of examples on which the two agree about the label) with Cohen's
    kappa of the two chosen/not-chosen columns (sklearn)."""

    method: str
    examples: int  # examples with a model-based label
    with_gold: int  # of them, examples with a gold label
    same_as_gold: int  # the model-based label (set) is the gold label (set)
    agreement: float | None  # same_as_gold / with_gold
    without_gold: int  # examples with a model-based label but no gold (no majority, tie)
    per_label: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SingleLabelAgreement:
    """Chance-corrected agreement of the validators on a single-label task."""

    fleiss_kappa: float | None
    krippendorff_alpha: float | None
    randolph_kappa: float | None
    mean_pairwise_cohen_kappa: float | None
    fleiss_kappa_by_split: dict[str, float | None] = field(default_factory=dict)  # dev/test splits with labels
    madtsc_kappas: dict[str, float | None] | None = None  # target-dependent tasks (MAD-TSC) only
    # Every figure reads the same examples: those with n_raters responses (the task's k, or
    # the count most examples have: rounds.build.response_sets.agreement_raters).
    n_raters: int | None = None
    n_examples: int | None = None
    examples_left_out: int | None = None  # examples with another number of responses

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "fleiss_kappa": self.fleiss_kappa,
            "krippendorff_alpha": self.krippendorff_alpha,
            "randolph_kappa": self.randolph_kappa,
            "mean_pairwise_cohen_kappa": self.mean_pairwise_cohen_kappa,
            "n_raters": self.n_raters,
            "n_examples": self.n_examples,
            "examples_left_out": self.examples_left_out,
        }
        data.update({f"fleiss_kappa_{split}": kappa for split, kappa in self.fleiss_kappa_by_split.items()})
        if self.madtsc_kappas is not None:
            data["madtsc_kappas"] = self.madtsc_kappas
        return data


@dataclass
class MultiLabelAgreementSummary:
    """Agreement of the validators on a multi-label task: per-label measures averaged (EthioEmo)."""

    mean_fleiss_kappa: float | None
    mean_randolph_kappa: float | None
    mean_krippendorff_alpha: float | None
    mean_jaccard: float | None
    # Every figure reads the same examples: those with n_raters responses (the task's k, or
    # the count most examples have: rounds.build.response_sets.agreement_raters).
    n_raters: int | None = None
    n_examples: int | None = None
    examples_left_out: int | None = None  # examples with another number of responses

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Agreement = SingleLabelAgreement | MultiLabelAgreementSummary


@dataclass
class MultiLabelSection:
    """A multi-label round (EthioEmo's protocol; rounds.build.multilabel_report): its gold
    rule, re-annotation outcome, per-label counts per split, per-label agreement of the first
    pass, the human estimate and the model on dev and test. No chance-level claim is made."""

    gold_rule: str
    exclusive_labels: list[str]
    # label -> split (train, dev, test) -> examples whose gold holds the label
    label_counts: dict[str, dict[str, int]]
    # examples: re-queued for new validators, resolved by them, dropped, still waiting
    reannotation: dict[str, int]
    # The responses gold was decided on, examples with k of them: n_raters, n_examples,
    # examples_left_out, mean_jaccard and per label prevalence, fleiss, randolph, krippendorff alpha.
    agreement: dict[str, Any]
    # split -> micro_f1, macro_f1, per_label (label -> f1), n_examples, n_annotators
    human_f1: dict[str, dict[str, Any]]
    # split -> n, micro_f1, macro_f1, accuracy (exact set) of the round's model
    model: dict[str, dict[str, float | None]]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ClassScores:
    """Precision, recall and F1 of one class (or ``macro avg``), fractions in [0, 1]."""

    precision: float | None
    recall: float | None
    f1: float | None


# Human performance estimate (DynaSent §3.5): split -> class (then "macro avg") -> scores.
HumanF1 = dict[str, dict[str, ClassScores]]


@dataclass
class Fooling:
    """How often writers fooled the model, by attempt and by example."""

    attempts: int
    fooled_attempts: int
    attempt_fooling_rate: float | None
    examples: int
    harvested_examples: int
    fooled_examples: int
    confirmed: int
    validated_fooling: int  # fooled, and the validators' gold is the writer's target
    validated_fooling_rate: float | None  # None: no example was written against a model
    # Examples checked against a model (with its prediction); 0: nothing could fool one.
    examples_with_model_prediction: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ConditionSummary:
    """Edit distance, length and vocabulary of one writing condition (DynaSent Fig. 2a-c)."""

    examples: int
    edit_distance_mean: float | None
    edit_distance_median: float | None
    length_words_mean: float | None
    vocabulary: int
    types_per_token: float | None


@dataclass
class WorkerAgreementSummary:
    """Validators' agreement with the majority (single-label tasks; DynaSent Fig. 6)."""

    never_disagreed: int
    mean_agreement_rate: float | None
    labels_per_validator_median: float | None


@dataclass
class WorkerGold:
    """One validator's gold accuracy on the round's control items beside their agreement with
    the majority (issue 26). ``validator`` is v1, v2, ... in the order of their accounts: the
    report names nobody (the Crowd page of the web app shows who is who to the researchers)."""

    validator: str
    labels: int  # counted labels in the round
    agreement_rate: float | None  # single-label tasks
    control_answers: int
    gold_accuracy: float | None


@dataclass
class Workers:
    writers: int
    validators: int
    agreement: WorkerAgreementSummary | None = None
    # Only for rounds whose batches held control items (their answers are never responses).
    gold: list[WorkerGold] | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"writers": self.writers, "validators": self.validators}
        if self.agreement is not None:
            data.update(asdict(self.agreement))
        if self.gold is not None:
            rates = [row.gold_accuracy for row in self.gold if row.gold_accuracy is not None]
            data["mean_gold_accuracy"] = round(sum(rates) / len(rates), 4) if rates else None
            data["gold_accuracy"] = [asdict(row) for row in self.gold]
        return data


@dataclass
class IntendedVsPerceived:
    """iSarcasm §5.2: the writers' intended labels against the validators' perceived ones."""

    confusion: dict[Any, dict[Any, int]]  # perceived -> intended -> examples (iSarcasm Table 5)
    precision: float | None
    recall: float | None
    f1: float | None
    n_examples: int
    n_without_perceived: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CollectionPeriod:
    opened: str | None  # ISO 8601
    closed: str | None


@dataclass
class Datasheet:
    """What a dataset user needs to know about the round (Gebru et al., 2021)."""

    title: str
    task: str
    family: str
    language: str
    domain: str | None
    licence: str
    round: int
    collected: CollectionPeriod
    prompt_sources: list[str]
    examples: int
    validations: int
    validations_per_example: int
    gold_rule: str
    dev_test_rule: str
    agreement: Agreement | None
    human_f1_macro: dict[str, float | None]
    model_f1_macro: dict[str, float | None]
    build_policy: str = ""  # what the build's policy is and what its numbers show
    agreement_counts: dict[str, int] = field(default_factory=dict)  # ">=k of n" -> examples
    responses_used: str = ""  # ResponseSelection.statement: which responses the statistics read

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "task": self.task,
            "family": self.family,
            "language": self.language,
            "domain": self.domain,
            "licence": self.licence,
            "round": self.round,
            "collected": asdict(self.collected),
            "prompt_sources": self.prompt_sources,
            "examples": self.examples,
            "validations": self.validations,
            "validations_per_example": self.validations_per_example,
            "gold_rule": self.gold_rule,
            "dev_test_rule": self.dev_test_rule,
            "agreement": _agreement_dict(self.agreement),
            "human_f1_macro": self.human_f1_macro,
            "model_f1_macro": self.model_f1_macro,
            "build_policy": self.build_policy,
            "agreement_counts": self.agreement_counts,
            "responses_used": self.responses_used,
        }


@dataclass
class RoundReport:
    """Everything a build reports about its round; :meth:`to_dict` is the stored JSON."""

    task: str
    family: str
    round: int
    seed: int
    built_at: str  # ISO 8601
    config: dict[str, Any]  # the build's settings (rounds.build.pipeline.BuildConfig)
    counts: Counts
    splits: SplitsSummary
    agreement: Agreement | None  # None: no counted labels
    human_f1: HumanF1  # empty for multi-label tasks and rounds without labels
    fooling: Fooling
    conditions: dict[str, ConditionSummary]  # "prompt", "no_prompt"
    workers: Workers
    intended_vs_perceived: IntendedVsPerceived | None  # intended-sarcasm tasks (iSarcasm)
    datasheet: Datasheet
    agreement_counts: AgreementCounts | None = None  # None: no counted labels
    multi_label: MultiLabelSection | None = None  # multi-label tasks only
    responses: ResponseSelection | None = None  # which responses the statistics read
    model_based: ModelBasedComparison | None = None  # None: no model-based labels asked for or computed
    # What people saw for each label (the task's label_names), for the markdown; None: the task
    # names none. The report's data keeps the labels themselves.
    label_names: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "family": self.family,
            "round": self.round,
            "seed": self.seed,
            "built_at": self.built_at,
            "config": self.config,
            "counts": self.counts.to_dict(),
            "splits": self.splits.to_dict(),
            "agreement": _agreement_dict(self.agreement),
            "human_f1": {
                split: {name: asdict(scores) for name, scores in table.items()}
                for split, table in self.human_f1.items()
            },
            "fooling": self.fooling.to_dict(),
            "conditions": {name: asdict(summary) for name, summary in self.conditions.items()},
            "workers": self.workers.to_dict(),
            "intended_vs_perceived": self.intended_vs_perceived.to_dict() if self.intended_vs_perceived else None,
            "datasheet": self.datasheet.to_dict(),
            "agreement_counts": self.agreement_counts.to_dict() if self.agreement_counts else None,
            "responses": self.responses.to_dict() if self.responses else None,
            "model_based": self.model_based.to_dict() if self.model_based else None,
        } | (
            ({"multi_label": self.multi_label.to_dict()} if self.multi_label is not None else {})
            | ({"label_names": dict(self.label_names)} if self.label_names else {})
        )


def _agreement_dict(agreement: Agreement | None) -> dict[str, Any]:
    return agreement.to_dict() if agreement is not None else {}
