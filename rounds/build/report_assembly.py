"""Assemble a build's :class:`~rounds.build.report_schema.RoundReport` from its statistics.

:func:`assemble_report` takes what :func:`rounds.build.pipeline.build_round` worked out (the
round's data, gold labels and splits, :class:`~rounds.build.round_data.BuildOutcome`), asks
rounds.build.statistics (and rounds.build.multilabel_report for a multi-label round) for each
section in the report's order, and writes the datasheet's sentences from them; plus the raw
values the plots need.
"""

from __future__ import annotations

import datetime as dt

from rounds.build import human, multilabel_report, statistics
from rounds.build.build_settings import BuildSettings
from rounds.build.report import PlotData, splits_heading
from rounds.build.report_schema import (
    Collected,
    Datasheet,
    HumanF1,
    MultiLabelSection,
    ReportAgreement,
    ReportSplits,
    RoundReport,
)
from rounds.build.round_data import BuildOutcome


def assemble_report(outcome: BuildOutcome) -> tuple[RoundReport, PlotData]:
    """The build's report and the raw values behind its plots."""
    definition, settings = outcome.data.definition, outcome.settings
    counts = statistics.split_counts(outcome)
    split_summary = statistics.split_summary(outcome)
    report_agreement = statistics.inter_annotator_agreement(outcome)
    human_f1 = statistics.human_f1(outcome)
    fooling = statistics.fooling(outcome)
    conditions, plot = statistics.condition_summaries(outcome.data, settings.seed)
    workers, rates = statistics.worker_summary(outcome)
    multi_label = multilabel_report.multilabel_section(outcome) if definition.is_multi_label else None
    if rates is not None:
        plot.worker_agreement = [float(r) for r in rates["agreement_rate"].dropna()]
        plot.confusion = statistics.model_vs_majority(outcome)
    report = RoundReport(
        task=definition.name,
        family=definition.family.value,
        round=outcome.round_.number,
        seed=settings.seed,
        built_at=dt.datetime.now(dt.UTC).isoformat(),
        # Every setting, defaults included: validated from its dump, each one is set (and stored).
        config=BuildSettings.model_validate(settings.model_dump()),
        counts=counts,
        splits=split_summary,
        agreement=report_agreement or ReportAgreement(),  # empty: no counted labels
        human_f1=human_f1,
        fooling=fooling,
        conditions=conditions,
        workers=workers,
        intended_vs_perceived=statistics.intended_vs_perceived(outcome),
        datasheet=_datasheet(outcome, split_summary, report_agreement, human_f1, multi_label),
        agreement_counts=statistics.agreement_counts(outcome),
        responses=outcome.data.selection,
        model_based=statistics.model_based_comparison(outcome),
    )
    # Stored only where they apply: a multi-label round's section, the labels' display names.
    if multi_label is not None:
        report.multi_label = multi_label
    names = definition.display_names if definition.label_names else None
    if names:
        report.label_names = dict(names)
    return report, plot


def _datasheet(
    outcome: BuildOutcome,
    split_summary: ReportSplits,
    report_agreement: ReportAgreement | None,
    human_f1: HumanF1,
    multi_label: MultiLabelSection | None = None,
) -> Datasheet:
    definition, round_ = outcome.data.definition, outcome.round_
    macro = {split: table.get(human.MACRO) for split, table in human_f1.items()}
    human_macro = {split: scores.get("f1") if scores is not None else None for split, scores in macro.items()}
    if multi_label is not None:  # per-label macro-F1 of the synthetic annotators (multilabel_report)
        human_macro = {split: scores.macro_f1 for split, scores in multi_label.human_f1.items()}
    return Datasheet(
        title=definition.title,
        task=definition.name,
        family=definition.family.value,
        language=definition.language,
        domain=definition.domain,
        licence=definition.licence or "not set",
        round=round_.number,
        collected=Collected(opened=_iso(round_.opened_at), closed=_iso(round_.closed_at)),
        prompt_sources=_prompt_sources(outcome),
        examples=len(outcome.data.examples),
        validations=outcome.data.selection.counted if outcome.data.selection else len(outcome.data.responses),
        validations_per_example=definition.validations_per_example,
        gold_rule=f"{definition.agreement.gold_min_votes} of {definition.validations_per_example}",
        dev_test_rule=_dev_test_rule(outcome, split_summary),
        build_policy=_build_policy(outcome, split_summary),
        agreement_counts=(lambda c: dict(c.at_least) if c else {})(statistics.agreement_counts(outcome)),
        agreement=report_agreement or ReportAgreement(),
        human_f1_macro=human_macro,
        model_f1_macro={split: assessment.model_macro_f1 for split, assessment in split_summary.assessment.items()},
        responses_used=outcome.data.selection.statement if outcome.data.selection else "",
    )


def _prompt_sources(outcome: BuildOutcome) -> list[str]:
    """Where the round's prompts came from; a round with no prompt says so (an import, a
    no-prompt round) rather than speaking of prompts it never had."""
    if outcome.data.prompt_sources:
        return list(outcome.data.prompt_sources)
    if outcome.data.prompts:
        return ["prompts imported without a source"]
    imported = int((outcome.data.examples["origin"] == "imported").sum())
    if imported == len(outcome.data.examples):
        return ["none: the round's examples were imported, not written to prompts"]
    return ["none: the round has no prompts"]


def _dev_test_rule(outcome: BuildOutcome, split_summary: ReportSplits) -> str:
    policy = outcome.policy
    imported = statistics.imported_gold_examples(outcome)
    from_here = len(outcome.data.examples) - imported
    if imported and not from_here:
        votes = (
            f"gold as imported (the dataset's own label) with at least {policy.dev_test_min_votes} vote(s): "
            "the dataset's vote counts where it gave them, else 1 vote each"
        )
    else:
        votes = f"gold with at least {policy.dev_test_min_votes} of {policy.responses} votes"
        if imported:
            votes += f" ({imported} imported gold label(s): the dataset's vote counts, else 1 vote each)"
    if outcome.data.definition.is_multi_label:
        return (
            f"every gold label with at least {policy.dev_test_min_votes} votes; one example per prompt; "
            "stratified per label (iterative stratification); examples without gold excluded"
        )
    examples = outcome.data.examples
    no_prompts = not examples["prompt_id"].notna().any()
    if no_prompts and bool((examples["origin"] == "imported").all()):
        where = "imported examples, each on its own (they have no prompts)"
    elif policy.no_prompt_in_dev_test:
        where = "prompt and no-prompt examples, each no-prompt example on its own"
    elif no_prompts:
        where = "prompt condition, each example on its own (the round has no prompts)"
    else:
        where = "prompt condition; unique prompts"
    if not split_summary.model_predictions:
        balance = "balanced over gold classes; no model in the loop (no example has a model prediction)"
    elif policy.chance and split_summary.at_chance:
        balance = "the round's model at chance (equal (gold, predicted) cells)"
    elif policy.chance:
        balance = "equal (gold, predicted) cells asked for; the model's numbers on dev/test are not at chance"
    else:
        balance = "balanced over gold classes; the model not held at chance"
    guard = (
        f"; at most {policy.max_dev_test_share:g} of each class's eligible examples in dev+test"
        if policy.max_dev_test_share is not None
        else ""
    )
    return f"{votes}; {where}; {balance}{guard}"


def _build_policy(outcome: BuildOutcome, split_summary: ReportSplits) -> str:
    heading = splits_heading(split_summary.to_dict())
    if not split_summary.model_predictions:
        imported = bool((outcome.data.examples["origin"] == "imported").all())
        why = "the examples were imported, " if imported else ""
        return f"{heading}. No model measured: {why}no example carries a model prediction."
    assessment = split_summary.assessment
    measured = "; ".join(
        f"model on {name}: macro-F1 {_fmt_or_none(a.model_macro_f1)}, accuracy {_fmt_or_none(a.model_accuracy)}"
        for name, a in assessment.items()
    )
    return f"{heading}. {measured}."


def _fmt_or_none(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.4f}"


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None
