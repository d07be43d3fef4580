"""What each build policy would give a round, without recording anything (docs/round_builder.md,
"Build policies"): the requested settings, strict, and the relaxations a researcher may choose,
each with its dev/test sizes per cell or class, its train size, or why it cannot be met.

A relaxed candidate that only the class-balance guard refuses is tried again with the guard's
share raised step by step (:data:`GUARD_SHARES`); the first share that builds is offered too.

A build that cannot meet its policy names these in its error; ``dynaloop round build-preview``
and ``POST /api/v1/rounds/{id}/build/preview`` show them before building.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rounds.build import splits
from rounds.build.build_settings import RELAXED_MAX_DEV_TEST_SHARE, BuildSettings, EffectivePolicy, resolve_policy
from rounds.build.prepare import make_splits
from rounds.build.round_data import Prepared
from services.errors import Invalid


@dataclass(frozen=True)
class PolicyPreview:
    """One policy's outcome on a round: its counts when it builds, the shortfall when not."""

    name: str  # "requested", "strict", "relaxed", "relaxed, 3 of 5 votes", ...
    settings: dict[str, Any]  # the build options to send to get it
    policy: dict[str, Any] | None  # the effective policy (None: the settings are invalid)
    feasible: bool
    message: str | None = None  # why not, when not
    # The split constraint that refused it (rounds.build.splits: dev_test_size | balance_guard),
    # "settings" when the settings themselves are refused; None when it builds.
    constraint: str | None = None
    short: list[dict[str, Any]] = field(default_factory=list)
    unit: str | None = None  # cell | class
    dev_per_cell: int | None = None
    test_per_cell: int | None = None
    counts: dict[str, int] = field(default_factory=dict)  # train, dev, test, excluded
    classes: dict[str, dict[str, int]] = field(default_factory=dict)  # class -> train/dev/test

    def summary(self) -> str:
        if not self.feasible:
            return f"{self.name}: cannot build ({self.message})"
        return (
            f"{self.name} ({_settings_text(self.settings)}): {self.counts_text()}; "
            f"per class train/dev/test: {self.classes_text()}"
        )

    def counts_text(self) -> str:
        """``dev 3 (1 per class), test 3 (1 per class), train 6`` (a feasible preview)."""
        return (
            f"dev {self.counts['dev']} ({self.dev_per_cell} per {self.unit}), test {self.counts['test']} "
            f"({self.test_per_cell} per {self.unit}), train {self.counts['train']}"
        )

    def classes_text(self) -> str:
        """``positive 3/1/1, negative 2/1/1``: each class's train/dev/test counts."""
        return ", ".join(f"{c} {v['train']}/{v['dev']}/{v['test']}" for c, v in self.classes.items())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()) or "defaults"


def preview(prepared: Prepared, name: str, build_settings: BuildSettings, settings: dict[str, Any]) -> PolicyPreview:
    """The outcome of ``build_settings`` on the prepared round (``settings``: what to send for it)."""
    try:
        policy = resolve_policy(build_settings, prepared.data.definition, prepared.data.examples)
    except Invalid as exc:
        return PolicyPreview(name, settings, None, False, exc.message, constraint="settings")
    try:
        result = make_splits(prepared, policy, build_settings.seed)
    except splits.SplitError as exc:
        return PolicyPreview(
            name,
            settings,
            policy.model_dump(),
            False,
            exc.message,
            constraint=exc.details.get("constraint"),
            short=list(exc.details.get("short", [])),
        )
    counts = result.assignment.value_counts(sort=False)
    balance = result.report.balance.get("classes", {})
    assert isinstance(balance, dict)
    return PolicyPreview(
        name,
        settings,
        policy.model_dump(),
        True,
        unit=result.report.unit,
        dev_per_cell=result.report.dev_per_cell,
        test_per_cell=result.report.test_per_cell,
        counts={
            "train": int(counts.get("train", 0)),
            "dev": int(counts.get("dev", 0)),
            "test": int(counts.get("test", 0)),
            "excluded": int(counts.get("excluded", 0)) + int(prepared.dropped.sum()),
        },
        classes={
            str(c): {"train": int(v["train_all"]), "dev": int(v["dev"]), "test": int(v["test"])}
            for c, v in balance.items()
        },
    )


def _imported_gold_without_votes(prepared: Prepared) -> bool:
    """Whether some example's gold is a labelled dataset's own label without vote counts."""
    metadata = prepared.data.examples.get("source_metadata")
    if metadata is None:
        return False
    return any(isinstance(m, dict) and m.get("gold") and not m.get("gold_votes") for m in metadata)


def candidates(
    prepared: Prepared, build_settings: BuildSettings, policy: EffectivePolicy | None
) -> list[tuple[str, dict[str, Any]]]:
    """The policies worth showing for a round: strict, relaxed (no chance constraint, the
    class-balance guard), relaxed with the votes lowered step by step to the task's gold rule,
    strict's chance constraint with lowered votes, and, in a single-label round that mixes
    prompt and no-prompt examples, relaxed with the no-prompt ones in dev/test."""
    definition = prepared.data.definition
    task_votes = definition.agreement.dev_test_min_votes
    lowest = max(definition.agreement.gold_min_votes, definition.validations_per_example // 2 + 1)
    out: list[tuple[str, dict[str, Any]]] = [("strict", {"policy": "strict"})]
    relaxed: dict[str, Any] = {"policy": "relaxed"}
    if not definition.is_multi_label:
        relaxed["chance"] = False
    out.append(("relaxed", relaxed))
    n = definition.validations_per_example
    for votes in range(task_votes - 1, lowest - 1, -1):
        out.append((f"relaxed, {votes} of {n} votes", {**relaxed, "dev_test_min_votes": votes}))
        if not definition.is_multi_label:
            out.append(
                (
                    f"model at chance, {votes} of {n} votes",
                    {"policy": "relaxed", "chance": True, "dev_test_min_votes": votes},
                )
            )
    if lowest > 1 and _imported_gold_without_votes(prepared):
        # A labelled dataset's own gold counts as 1 vote (docs/round_builder.md, "Imports"):
        # only a threshold of 1 lets it reach dev and test.
        # Named for what it is: the dataset's label, not 1 vote out of the task's responses.
        out.append(("relaxed, imported gold as given (dev/test min votes 1)", {**relaxed, "dev_test_min_votes": 1}))
    if policy is not None and policy.min_per_cell > 1:
        out.append(("relaxed, 1 per cell", {**relaxed, "min_per_cell": 1}))
    no_prompt = prepared.data.examples["condition"] == "no_prompt"
    if (
        not definition.is_multi_label
        and no_prompt.any()
        and not no_prompt.all()
        and not build_settings.no_prompt_in_dev_test
    ):
        # A mixed round keeps its no-prompt examples in train unless asked (docs/round_builder.md,
        # "No-prompt rounds"); multi-label splits do not take the setting.
        out.append(("relaxed, no-prompt examples in dev/test", {**relaxed, "no_prompt_in_dev_test": True}))
    return out


def relaxations_for(
    prepared: Prepared, build_settings: BuildSettings, policy: EffectivePolicy | None, *, refused_by: str | None = None
) -> list[PolicyPreview]:
    """Previews of the candidate policies other than ``policy`` itself (same seed and caps),
    each followed, when the class-balance guard is what refuses it, by the first larger share
    of :data:`GUARD_SHARES` that builds. ``refused_by`` is the constraint that refused
    ``policy`` (a build's refusal): the guard's shares are tried for it as well."""
    keep = {
        "seed": build_settings.seed,
        "model_based": build_settings.model_based,
        "max_per_cell": build_settings.max_per_cell,
    }
    previews = []
    for name, settings in candidates(prepared, build_settings, policy):
        candidate = BuildSettings(**{**keep, **settings})
        try:
            effective: EffectivePolicy | None = resolve_policy(
                candidate, prepared.data.definition, prepared.data.examples
            )
        except Invalid:
            if policy is not None:
                continue
            effective = None
        if policy is not None and effective == policy:
            if refused_by == "balance_guard":
                previews += _larger_share(prepared, name, settings, keep, policy, policy)
            continue
        outcome = preview(prepared, name, candidate, settings)
        previews.append(outcome)
        if outcome.constraint == "balance_guard" and effective is not None:
            previews += _larger_share(prepared, name, settings, keep, effective, policy)
    return previews


# The class-balance guard's shares a relaxed candidate it refuses is tried again with, in
# order (docs/round_builder.md, "Class balance guard"); 1.0 leaves the guard nothing to hold back.
GUARD_SHARES = (0.6, 0.7, 0.8, 1.0)


def _larger_share(
    prepared: Prepared,
    name: str,
    settings: dict[str, Any],
    keep: dict[str, Any],
    refused: EffectivePolicy,
    requested: EffectivePolicy | None,
) -> list[PolicyPreview]:
    """The candidate ``settings`` (refused by the class-balance guard at ``refused``'s share)
    with the first share of :data:`GUARD_SHARES` above it that builds: one preview, or none.
    A share whose effective policy is ``requested`` is not tried again (it was refused), and a
    share refused by another constraint ends the search (a larger share only frees more)."""
    current = refused.max_dev_test_share or 0.0
    for share in GUARD_SHARES:
        if share <= current:
            continue
        widened = {**settings, "max_dev_test_share": share}
        candidate = BuildSettings(**{**keep, **widened})
        try:
            effective = resolve_policy(candidate, prepared.data.definition, prepared.data.examples)
        except Invalid:
            return []
        if effective == requested:
            continue
        label = "no class-balance guard" if share >= 1 else f"dev+test up to {share:g} of each class"
        outcome = preview(prepared, f"{name}, {label}", candidate, widened)
        if outcome.feasible:
            return [outcome]
        if outcome.constraint != "balance_guard":
            return []
    return []


def nothing_builds(number: int) -> str:
    """What a refused build says when no relaxation builds the round: a closed round takes no
    more examples or labels, so the way on is another round."""
    return (
        f"No relaxation builds round {number}, and a closed round takes no more examples or labels: "
        "collect them in the next round, or bring a labelled dataset or crowd responses in as a round "
        "(dynaloop round import; POST /api/v1/tasks/{task}/rounds/{n}/imports)"
    )


__all__ = [
    "GUARD_SHARES",
    "RELAXED_MAX_DEV_TEST_SHARE",
    "PolicyPreview",
    "candidates",
    "nothing_builds",
    "preview",
    "relaxations_for",
]
