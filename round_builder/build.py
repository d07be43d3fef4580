"""Build a round: read it from the database, aggregate, measure agreement and human F1, make
chance-level splits, and record the build (every example's split and labels) with its report.

DynaSent §3.3-3.5 and §4.4-4.6 in order: gold labels (majority; MAD-TSC consolidation;
EthioEmo per-label 2-of-3), distributional labels for train, a model-based alternative
(Dawid-Skene or MACE) side by side, agreement, the human-performance estimate on dev and test,
then the splits. A build is deterministic for its seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from round_builder import (
    aggregation,
    duplicates,
    multilabel_splits,
    response_sets,
    splits,
)
from round_builder.report import ResponseSelection, write_report
from round_builder.report_assembly import BuildOutcome, assemble_report
from round_builder.table import responses_frame
from services.db.models import (
    Assignment,
    Attempt,
    AttemptStatus,
    BuiltExample,
    Example,
    ExampleStatus,
    Prompt,
    Round,
    RoundBuild,
    RoundStatus,
    User,
    Validation,
    ValidationBatch,
    ValidationBatchItem,
    utcnow,
)
from services.domain import audit
from services.domain.labels import exclusive_gold
from services.domain.tasks import definition_of
from services.errors import Conflict, Invalid
from services.taskdef import TaskDefinition, TaskFamily

# EM iterations for Dawid-Skene: crowd-kit's 100 take ~40 s on a million labels on one core;
# the labels stop changing long before 30 (bench/round_builder.py measures both).
DAWID_SKENE_ITERATIONS = 30


@dataclass
class BuildConfig:
    seed: int = 0
    dev_test_min_votes: int | None = None  # default: the task's agreement.dev_test_min_votes
    chance: bool | None = None  # default: the policy's (strict: the family's; relaxed: no)
    max_per_cell: int | None = None
    model_based: str | None = "dawid_skene"  # dawid_skene | mace | None
    # Build policy (docs/round_builder.md, "Build policies"): strict | relaxed; None: strict
    # unless a setting given relaxes it.
    policy: str | None = None
    min_per_cell: int | None = None  # least per cell/class of each of dev and test (default 1)
    no_prompt_in_dev_test: bool | None = None  # default: yes only when the round has no prompt examples
    max_dev_test_share: float | None = None  # the class-balance guard; default: relaxed 0.5, strict none


POLICIES = ("strict", "relaxed")
# The class-balance guard's default under the relaxed policy: dev+test take at most half of
# each class's eligible examples (docs/round_builder.md, "Class balance guard").
RELAXED_MAX_DEV_TEST_SHARE = 0.5


@dataclass(frozen=True)
class Policy:
    """A build's effective policy: every setting the splits ran with, defaults resolved."""

    name: str  # strict | relaxed
    chance: bool
    dev_test_min_votes: int
    responses: int  # the task's validations per example: the votes are "out of" this
    max_per_cell: int | None
    min_per_cell: int
    no_prompt_in_dev_test: bool
    max_dev_test_share: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def resolve_policy(config: BuildConfig, definition: TaskDefinition, examples: pd.DataFrame) -> Policy:
    """The effective policy of ``config`` for a task and its round's examples. ``strict`` is
    the task's rules (the round's model at chance for single-label families, the task's
    dev/test vote threshold); any setting that loosens them makes the build ``relaxed``, and
    asking for ``strict`` together with such a setting is refused."""
    task_min_votes = definition.agreement.dev_test_min_votes
    family_chance = not definition.is_multi_label
    if config.policy is not None and config.policy not in POLICIES:
        raise Invalid(f"policy must be one of {', '.join(POLICIES)}, not {config.policy!r}")
    loosened: dict[str, Any] = {}  # the settings that loosen the task's rules -> what they say
    if config.chance is False and family_chance:
        loosened["chance"] = "leaving the model's chance constraint off"
    if config.dev_test_min_votes is not None and config.dev_test_min_votes < task_min_votes:
        loosened["dev_test_min_votes"] = (
            f"{config.dev_test_min_votes} dev/test vote(s) (the task asks for {task_min_votes})"
        )
    if config.policy == "strict" and loosened:
        # A plain sentence for the API and the command alike; ``loosened`` names the settings
        # (the command shows them as its options).
        raise Invalid(
            f"the strict policy keeps the task's dev/test rules, and {' and '.join(loosened.values())} "
            f"{'relax' if len(loosened) > 1 else 'relaxes'} them: ask for the relaxed policy instead, or leave "
            f"{'those settings' if len(loosened) > 1 else 'that setting'} out",
            loosened={key: getattr(config, key) for key in loosened},
        )
    name = config.policy or ("relaxed" if loosened else "strict")
    if config.chance is not None and config.chance and definition.is_multi_label:
        raise Invalid("a multi-label task's dev and test cannot hold the model at chance; leave chance unset")
    chance = config.chance if config.chance is not None else (family_chance and name == "strict")
    min_votes = config.dev_test_min_votes or task_min_votes
    if min_votes > definition.validations_per_example:
        raise Invalid(
            f"dev_test_min_votes={min_votes} is more than the task's {definition.validations_per_example} "
            "validations per example"
        )
    min_per_cell = config.min_per_cell or 1
    if config.max_per_cell is not None and config.max_per_cell < min_per_cell:
        raise Invalid(f"max_per_cell={config.max_per_cell} is below min_per_cell={min_per_cell}")
    no_prompt = config.no_prompt_in_dev_test
    if no_prompt is None:
        no_prompt = bool(len(examples)) and bool((examples["condition"] == "no_prompt").all())
    share = config.max_dev_test_share
    if share is None and name == "relaxed":
        share = RELAXED_MAX_DEV_TEST_SHARE
    return Policy(
        name=name,
        chance=bool(chance),
        dev_test_min_votes=int(min_votes),
        responses=definition.validations_per_example,
        max_per_cell=config.max_per_cell,
        min_per_cell=min_per_cell,
        no_prompt_in_dev_test=no_prompt,
        max_dev_test_share=share,
    )


@dataclass
class RoundData:
    definition: TaskDefinition
    examples: pd.DataFrame  # one row per example
    responses: pd.DataFrame  # the long table of counted responses
    attempts: pd.DataFrame  # one row per scored attempt
    prompts: dict[int, str]
    prompt_sources: list[str]
    # Multi-label: each response's annotation pass (Validation.annotation_pass), aligned with
    # ``responses``.
    passes: np.ndarray | None = None
    # Answers to control items in the round's validation batches (worker_id, correct): never
    # responses, only each validator's gold accuracy in the report (issue 26).
    control_answers: pd.DataFrame | None = None
    # Set by :func:`prepare` (round_builder.response_sets): ``responses`` and ``passes`` become
    # the one response set per example that every statistic reads (its last pass, at most k);
    # ``kept``/``kept_passes`` are every pass's kept responses (recorded and exported), and
    # ``selection`` says what was set aside and why.
    kept: pd.DataFrame | None = None
    kept_passes: np.ndarray | None = None
    selection: ResponseSelection | None = None


def control_answers(session: Session, round_: Round) -> pd.DataFrame:
    """Each answer to a control item in the round's batches: who gave it, and whether it was right."""
    return pd.DataFrame.from_records(
        session.execute(
            select(ValidationBatch.validator_id, ValidationBatchItem.correct)
            .join(ValidationBatch, ValidationBatchItem.batch_id == ValidationBatch.id)
            .where(
                ValidationBatch.round_id == round_.id,
                ValidationBatchItem.control_item_id.is_not(None),
                ValidationBatchItem.answered_at.is_not(None),
            )
            .order_by(ValidationBatchItem.id)
        ).all(),
        columns=["worker_id", "correct"],
    )


def counted_responses(session: Session, round_: Round, *, multi_label: bool) -> pd.DataFrame:
    """The round's counted labels as the long response table (round_builder.table)."""
    return responses_frame(
        session.execute(
            select(Validation.example_id, Validation.validator_id, Validation.label)
            .join(Example, Validation.example_id == Example.id)
            .where(Example.round_id == round_.id, Validation.counted.is_(True))
            .order_by(Validation.id)
        ).all(),
        multi_label=multi_label,
    )


def load_round(session: Session, round_: Round) -> RoundData:
    definition = definition_of(round_.task)
    multi = definition.is_multi_label
    rows = session.execute(
        select(
            Example.id,
            Example.text,
            Example.prompt_id,
            Example.condition,
            Example.model_prediction,
            Example.target_label,
            Example.writer_id,
            Example.fooled,
            Example.status,
            Example.extras,
            Attempt.edit_distance,
            Attempt.confirmed,
            Example.origin,
            Example.requeue_count,
            Example.source_metadata,
        )
        # Outer join: harvested examples (DynaSent §3.2) have no attempt.
        .outerjoin(Attempt, Example.attempt_id == Attempt.id)
        .where(Example.round_id == round_.id)
        .order_by(Example.id)
    ).all()
    examples = pd.DataFrame.from_records(
        [
            (
                r[0],
                r[1],
                r[2],
                r[3].value,
                r[4],
                r[5],
                r[6],
                bool(r[7]),
                r[8].value,
                r[9],
                r[10],
                r[11],
                r[12].value,
                int(r[13] or 0),
                r[14],
            )
            for r in rows
        ],
        columns=[
            "example_id",
            "text",
            "prompt_id",
            "condition",
            "model_prediction",
            "target_label",
            "writer_id",
            "fooled",
            "status",
            "extras",
            "edit_distance",
            "confirmed",
            "origin",
            "requeue_count",
            "source_metadata",
        ],
    )
    responses = counted_responses(session, round_, multi_label=multi)
    passes = (
        np.asarray(
            session.scalars(
                select(Validation.annotation_pass)
                .join(Example, Validation.example_id == Example.id)
                .where(Example.round_id == round_.id, Validation.counted.is_(True))
                .order_by(Validation.id)
            ).all(),
            dtype=np.int64,
        )
        if multi
        else None
    )
    attempts = pd.DataFrame.from_records(
        session.execute(
            select(Attempt.id, Attempt.fooled, Attempt.confirmed, Assignment.condition)
            .join(Assignment, Attempt.assignment_id == Assignment.id)
            .where(Assignment.round_id == round_.id, Attempt.status == AttemptStatus.scored)
        ).all(),
        columns=["attempt_id", "fooled", "confirmed", "condition"],
    )
    prompts = dict(session.execute(select(Prompt.id, Prompt.text).where(Prompt.round_id == round_.id)).all())
    sources = sorted(
        s
        for s in session.scalars(
            select(Prompt.source).where(Prompt.round_id == round_.id, Prompt.source.is_not(None)).distinct()
        )
        if s
    )
    return RoundData(
        definition, examples, responses, attempts, prompts, sources, passes, control_answers(session, round_)
    )


def _multilabel_gold(data: RoundData) -> pd.DataFrame:
    """EthioEmo §3.3 gold: per label >= gold_min_votes of the last pass's responses, the
    task's exclusive label (neutral) never together with others (labels.exclusive_gold).
    Excluded with a reason: dropped after re-annotation (no_gold_after_reannotation), waiting
    for new validators that never came (awaiting_reannotation), and no gold (no_gold)."""
    definition = data.definition
    need = definition.agreement.gold_min_votes
    # data.responses is each example's last pass already (prepare, response_sets).
    frame = aggregation.multilabel_gold(data.responses, labels=definition.labels, min_votes=need)
    votes = frame[[f"votes_{label}" for label in definition.labels]]
    gold_sets: list[tuple[str, ...] | None] = []
    gold_votes: list[int] = []
    for value, row in zip(frame["label"], votes.to_numpy(), strict=True):
        kept = exclusive_gold(definition, list(value)) if isinstance(value, tuple) else None
        gold_sets.append(tuple(kept) if kept else None)
        # The gold set's weakest label decides whether it is strong enough for dev/test.
        gold_votes.append(min(int(row[definition.labels.index(label)]) for label in kept) if kept else 0)
    frame = frame.assign(gold=pd.Series(gold_sets, index=frame.index, dtype=object), gold_votes=gold_votes)
    examples = data.examples.set_index("example_id")
    frame = frame.reindex(examples.index)
    status = examples["status"].to_numpy()
    has_gold = frame["gold"].notna().to_numpy()
    reason = np.array([None if kept else "no_gold" for kept in has_gold], dtype=object)
    reason[(status == ExampleStatus.validating.value) & (examples["requeue_count"].to_numpy() > 0)] = (
        "awaiting_reannotation"
    )
    reason[status == ExampleStatus.dropped.value] = "no_gold_after_reannotation"
    frame["reason"] = reason
    frame["kept"] = [r is None for r in reason]
    return frame


def _gold(data: RoundData) -> pd.DataFrame:
    """Per example: gold (str, tuple or None), gold_votes, kept (False: drop), reason."""
    definition, responses = data.definition, data.responses
    index = pd.Index(data.examples["example_id"], name="example_id")
    if definition.family is TaskFamily.target_dependent:
        frame = aggregation.consolidate_target_sentiment(
            responses,
            collapse=definition.label_collapse or {},
            unknown_label=definition.unknown_label,
            order=definition.effective_validation_labels,
            min_responses=1,
        )
        frame = frame.rename(columns={"label": "gold", "votes": "gold_votes"})
    elif definition.is_multi_label:
        frame = _multilabel_gold(data)
    else:
        frame = aggregation.majority_labels(
            responses, labels=definition.effective_validation_labels, min_votes=definition.agreement.gold_min_votes
        )
        frame = frame.rename(columns={"label": "gold", "votes": "gold_votes"}).assign(kept=True, reason=None)
    frame = frame.reindex(index)
    frame["kept"] = frame["kept"].fillna(False).astype(bool) if "kept" in frame else False
    frame.loc[frame["n_responses"].isna(), "reason"] = "no_counted_labels"
    # Imported gold (modelling/round_imports.py, docs/round_builder.md "Imports"): a labelled
    # dataset's own label, taken as is for an example nobody labelled here, with the dataset's
    # vote counts where it had them (else 1 vote: the dataset's label); the datasheet says so.
    imported: dict[int, dict[str, Any]] = {
        int(e): meta
        for e, meta in zip(data.examples["example_id"], data.examples["source_metadata"], strict=True)
        if isinstance(meta, dict) and meta.get("gold")
    }
    answered = set(frame.index[frame["n_responses"].notna()])
    fill = [e for e in imported if e not in answered]
    if fill:
        values = [tuple(imported[e]["gold"]) if definition.is_multi_label else imported[e]["gold"][0] for e in fill]
        frame["gold"] = frame["gold"].astype(object)
        frame.loc[fill, "gold"] = pd.Series(values, index=fill, dtype=object)
        frame.loc[fill, "gold_votes"] = [imported[e].get("gold_votes") or 1 for e in fill]
        frame.loc[fill, "n_responses"] = [imported[e].get("responses") or 1 for e in fill]
        frame.loc[fill, "kept"] = True
        frame.loc[fill, "reason"] = None
    return frame


def gold_source(data: RoundData, gold: pd.DataFrame) -> dict[str, Any] | None:
    """Where the build's gold labels came from, when any came from an import (None otherwise)."""
    metas = dict(zip(data.examples["example_id"].astype(int), data.examples["source_metadata"], strict=True))
    imports = {
        (meta["import"]["kind"], meta["import"]["name"], meta["import"]["sha256"], meta["import"].get("source"))
        for meta in metas.values()
        if isinstance(meta, dict) and isinstance(meta.get("import"), dict)
    }
    if not imports:
        return None
    has_gold = gold["gold"].map(lambda g: isinstance(g, str | tuple))
    answered = set(data.responses["example_id"].astype(int)) if not data.responses.empty else set()
    from_import = sum(
        1
        for e, meta in metas.items()
        if isinstance(meta, dict) and meta.get("gold") and e not in answered and bool(has_gold.get(e, False))
    )
    with_votes = sum(
        1 for meta in metas.values() if isinstance(meta, dict) and meta.get("gold") and meta.get("gold_votes")
    )
    kept_splits = sum(1 for meta in metas.values() if isinstance(meta, dict) and meta.get("split"))
    return {
        "imported_gold": from_import,
        "imported_gold_with_votes": with_votes,
        "imported_with_original_split": kept_splits,
        "from_responses": int(has_gold.sum()) - from_import,
        "imports": [
            {"kind": kind, "name": name, "sha256": sha256, **({"source": source} if source else {})}
            for kind, name, sha256, source in sorted(imports, key=str)
        ],
        "statement": (
            f"{from_import} gold label(s) were taken from the imported dataset as is, not from validation "
            "in dynaloop; "
            + (
                f"{with_votes} carry the dataset's own vote counts, the rest count as 1 vote"
                if from_import
                else "every gold label was computed here from the imported responses"
            )
            + "."
        ),
    }


def _distributional(data: RoundData) -> dict[int, dict[str, float]]:
    definition = data.definition
    if data.responses.empty:
        return {}
    if definition.is_multi_label:
        # Share of validators who chose each label (EthioEmo's labels are not exclusive).
        frame = aggregation.multilabel_gold(data.responses, labels=definition.labels, min_votes=1)
        shares = frame[[f"votes_{label}" for label in definition.labels]].div(frame["n_responses"], axis=0).round(4)
        shares.columns = list(definition.labels)
        return _label_shares(shares)
    frame = aggregation.distributional_labels(data.responses, **aggregation.distribution_settings(definition))
    return _label_shares(frame.dropna(how="all").round(4))


def _label_shares(frame: pd.DataFrame) -> dict[int, dict[str, float]]:
    """Per example (the frame's index) its row as label -> share (the columns are the labels)."""
    return {
        int(e): {str(label): float(share) for label, share in row.items()}
        for e, row in zip(frame.index, frame.to_dict("records"), strict=True)
    }


def _model_based(data: RoundData, method: str | None) -> dict[int, list[str]]:
    """Per example with responses, its model-based label (a list of one label, or a label set):
    crowd-kit's Dawid-Skene or MACE on the responses gold reads; multi-label per label, with
    the task's exclusive labels kept exclusive as in gold. No label (a tie): left out."""
    definition = data.definition
    if method is None or data.responses.empty:
        return {}
    if method not in ("dawid_skene", "mace"):
        raise ValueError(f"unknown model-based aggregation {method!r}; use dawid_skene, mace or null")
    if definition.is_multi_label:
        sets = aggregation.multilabel_model_labels(
            data.responses,
            labels=definition.labels,
            method="mace" if method == "mace" else "dawid_skene",
            n_iter=DAWID_SKENE_ITERATIONS if method == "dawid_skene" else 50,
        )["label"]
        chosen = {
            int(e): exclusive_gold(definition, list(v))
            for e, v in zip(sets.index, sets, strict=True)
            if isinstance(v, tuple)
        }
        return {e: value for e, value in chosen.items() if value}
    labels = definition.effective_validation_labels
    if method == "dawid_skene":
        frame = aggregation.dawid_skene_labels(data.responses, labels=labels, n_iter=DAWID_SKENE_ITERATIONS)
    elif method == "mace":
        frame = aggregation.mace_labels(data.responses, labels=labels)
    else:
        raise ValueError(f"unknown model-based aggregation {method!r}; use dawid_skene, mace or null")
    return {int(e): [label] for e, label in zip(frame.index, frame["label"], strict=True) if isinstance(label, str)}


def _split_input(data: RoundData, gold: pd.DataFrame) -> pd.DataFrame:
    definition = data.definition
    examples = data.examples.set_index("example_id")

    def prediction(value: Any) -> Any:
        if not value:
            return None
        return tuple(value) if definition.is_multi_label else value[0]

    # dtype=object: pandas would otherwise store missing gold labels as NaN in a str column.
    return pd.DataFrame(
        {
            "example_id": examples.index,
            "gold": pd.Series([g if isinstance(g, str | tuple) else None for g in gold["gold"]], dtype=object),
            "gold_votes": gold["gold_votes"].fillna(0).astype(int).to_numpy(),
            "prompt_id": examples["prompt_id"].to_numpy(),
            "condition": examples["condition"].to_numpy(),
            "model_prediction": [prediction(v) for v in examples["model_prediction"]],
        }
    )


@dataclass
class Prepared:
    """A round read and aggregated, ready to split: what a build and a preview share."""

    data: RoundData
    gold: pd.DataFrame
    dropped: np.ndarray
    split_input: pd.DataFrame
    eligible: pd.DataFrame
    # What was done with repeated texts (round_builder/duplicates.py): one copy per text.
    duplicates: duplicates.DuplicateSummary | None = None


def prepare(session: Session, round_: Round) -> Prepared:
    """Read ``round_`` (closed or built), aggregate its labels; refuse one with no examples."""
    if round_.status not in (RoundStatus.closed, RoundStatus.built):
        raise Conflict(
            f"round {round_.number} is {round_.status.value}; close it before building "
            f'(POST /api/v1/rounds/{round_.id}/status {{"status": "closed"}})'
        )
    data = load_round(session, round_)
    definition = data.definition
    if data.examples.empty:
        raise Conflict(f"round {round_.number} has no examples to build")

    # One response set per example for every statistic: its last pass, and where a pass has
    # more than the task's validations, the top-ranked validators' (response_sets).
    sets = response_sets.select_responses(definition, data.responses, data.passes)
    data.responses, data.passes = sets.used, sets.used_passes
    data.kept, data.kept_passes, data.selection = sets.kept, sets.kept_passes, sets.selection

    gold = _gold(data)
    dropped = (data.examples["status"].to_numpy() == ExampleStatus.dropped.value) | ~gold["kept"].to_numpy()
    # One copy of each normalized text: repeats are excluded before the splits see them.
    hashes = duplicates.hashes_of(data.examples)
    earlier = duplicates.earlier_round_hashes(session, round_, hashes)
    summary = duplicates.collapse(data.examples["example_id"].to_numpy(), hashes, gold, dropped, earlier)
    split_input = _split_input(data, gold)
    return Prepared(data, gold, dropped, split_input, split_input.loc[~dropped], summary)


def make_splits(prepared: Prepared, policy: Policy, seed: int) -> splits.SplitResult:
    """The dev/test/train assignment of the eligible examples under ``policy``."""
    definition = prepared.data.definition
    if definition.is_multi_label:
        # Per-label iterative stratification; examples without gold never reach it (excluded).
        try:
            return multilabel_splits.build_multilabel_splits(
                prepared.eligible,
                list(definition.labels),
                min_votes=policy.dev_test_min_votes,
                seed=seed,
                max_per_label=policy.max_per_cell,
            )
        except ValueError as exc:
            raise Invalid(str(exc)) from exc
    return splits.build_splits(
        prepared.eligible,
        list(prepared.data.definition.labels),
        min_votes=policy.dev_test_min_votes,
        seed=seed,
        dev_size=policy.max_per_cell,
        test_size=policy.max_per_cell,
        min_size=policy.min_per_cell,
        chance=policy.chance,
        no_prompt_eligible=policy.no_prompt_in_dev_test,
        max_dev_test_share=policy.max_dev_test_share,
    )


def nothing_builds(number: int) -> str:
    """What a refused build says when no relaxation builds the round: a closed round takes no
    more examples or labels, so the way on is another round."""
    return (
        f"No relaxation builds round {number}, and a closed round takes no more examples or labels: "
        "collect them in the next round, or bring a labelled dataset or crowd responses in as a round "
        "(dynaloop round import; POST /api/v1/tasks/{task}/rounds/{n}/imports)"
    )


def build_round(
    session: Session, actor: User | None, round_: Round, config: BuildConfig, out_dir: Path | None = None
) -> RoundBuild:
    """Build ``round_`` (it must be closed, or built before) and record the build. A policy the
    round cannot meet is refused with what is short and the relaxations' previews."""
    from round_builder.preview import relaxations_for

    prepared = prepare(session, round_)
    data, gold, dropped, split_input = prepared.data, prepared.gold, prepared.dropped, prepared.split_input
    policy = resolve_policy(config, data.definition, data.examples)
    chance = policy.chance
    try:
        result = make_splits(prepared, policy, config.seed)
    except splits.SplitError as exc:
        options = relaxations_for(prepared, config, policy, refused_by=exc.details.get("constraint"))
        offered = "; ".join(o.summary() for o in options if o.feasible)
        raise splits.SplitError(
            f"the {policy.name} policy cannot be met: {exc.message}. "
            + (f"Relaxations that build: {offered}" if offered else nothing_builds(round_.number)),
            **exc.details,
            policy=policy.to_dict(),
            relaxations=[o.to_dict() for o in options],
        ) from None
    assignment = {int(e): str(split) for e, split in zip(result.assignment.index, result.assignment, strict=True)}
    flags = result.flags
    distributional = _distributional(data)
    model_based = _model_based(data, config.model_based)

    # Every pass's kept responses are recorded (and exported); the statistics read data.responses.
    kept = data.kept if data.kept is not None else data.responses
    responses_by_example: dict[int, list[list[Any]]] = {}
    for example_id, worker, label in kept.itertuples(index=False):
        responses_by_example.setdefault(int(example_id), []).append(
            [int(worker), list(label) if isinstance(label, tuple) else [str(label)]]
        )

    build = RoundBuild(
        round_id=round_.id,
        seed=config.seed,
        config={**config.__dict__, "effective": policy.to_dict()},
        created_by_id=actor.id if actor else None,
        report={},
    )
    session.add(build)
    session.flush()
    rows = []
    reasons = gold["reason"].to_dict()
    gold_votes = split_input["gold_votes"].to_numpy()
    for position, example_id in enumerate(split_input["example_id"]):
        example_id = int(example_id)
        if dropped[position]:
            split_name = "excluded"
            example_flags = [str(reasons.get(example_id) or "dropped_in_validation")]
        else:
            split_name = assignment[example_id]
            row_flags = flags.loc[example_id]
            example_flags = [name for name in ("no_prompt", "prompt_shared_with_assessment") if bool(row_flags[name])]
        gold_value = split_input["gold"].iat[position]
        rows.append(
            {
                "build_id": build.id,
                "example_id": example_id,
                "split": split_name,
                "gold_label": (
                    list(gold_value)
                    if isinstance(gold_value, tuple)
                    else [gold_value]
                    if isinstance(gold_value, str)
                    else None
                ),
                "gold_votes": int(gold_votes[position]) or None,
                "responses": len(responses_by_example.get(example_id, [])),
                "response_labels": responses_by_example.get(example_id, []),
                "distributional_label": distributional.get(example_id),
                "model_based_label": model_based.get(example_id),
                "flags": example_flags,
            }
        )
    for start in range(0, len(rows), 5000):
        session.execute(insert(BuiltExample), rows[start : start + 5000])

    assembled, plot = assemble_report(
        BuildOutcome(round_, data, config, gold, split_input, result, assignment, dropped, chance, policy, model_based)
    )
    report = assembled.to_dict()
    if prepared.duplicates is not None:
        report["duplicates"] = prepared.duplicates.to_dict()
    source = gold_source(data, gold)
    if source is not None:
        report["datasheet"]["gold_source"] = source
        if source["imported_gold"]:
            sheet = report["datasheet"]
            sheet["gold_rule"] = (
                f"{sheet['gold_rule']} for gold computed here; {source['imported_gold']} gold label(s) "
                "taken from the imported dataset"
            )
    build.report = report
    round_.status = RoundStatus.built
    round_.built_at = utcnow()
    audit.record(session, actor, "round.build", "round", round_.id, build_id=build.id, seed=config.seed)
    session.flush()
    if out_dir is not None:
        written = write_report(report, plot, out_dir)
        build.report = {**report, "files": [p.name for p in written]}
    return build
