"""Label rules per task family: what a target, a validation and "fooled" mean.

Labels are stored as lists everywhere (one element for single-label families), so a
single-label and a multi-label task share one code path and one column type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from services.errors import Invalid
from services.taskdef import TaskDefinition


def _as_list(value: str | Sequence[str] | None, what: str) -> list[str]:
    if value is None:
        raise Invalid(f"{what} is required")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise Invalid(f"{what} must be a label or a list of labels")
    return list(value)


def check_label_set(
    definition: TaskDefinition,
    value: str | Sequence[str] | None,
    *,
    allowed: list[str],
    what: str,
    empty_is_exclusive: bool = False,
) -> list[str]:
    """Validate a label (or label set for multi-label tasks) against ``allowed``.

    ``empty_is_exclusive`` (a validator's label): an empty set is the task's one exclusive
    label (EthioEmo's neutral, "no emotion"); a writer's target must name its labels."""
    labels = _as_list(value, what)
    unknown = [label for label in labels if label not in allowed]
    if unknown:
        # A display name (label_names) sent instead of its label: say which label it names.
        by_name = {definition.label_name(label).casefold(): label for label in allowed}
        meant = [
            f"{name!r} is what people see for {by_name[name.casefold()]!r}"
            for name in unknown
            if name.casefold() in by_name
        ]
        hint = f" ({'; '.join(meant)}: send the label, not its display name)" if meant else ""
        raise Invalid(
            f"{what} {unknown if len(unknown) > 1 else repr(unknown[0])} is not a label of task "
            f"{definition.name}; use one of {allowed}{hint}",
            allowed=allowed,
        )
    if definition.is_multi_label:
        if not labels:
            # An empty set means "none of the labels": the task's one exclusive label (EthioEmo's
            # neutral) when it has exactly one offered here; otherwise it is ambiguous.
            no_label = [label for label in definition.exclusive_labels if label in allowed]
            if empty_is_exclusive and len(no_label) == 1:
                return no_label
            raise Invalid(
                f"{what} is empty; choose at least one of {allowed}"
                + (
                    " (this task has no exclusive no-emotion label an empty set could mean)"
                    if empty_is_exclusive and not no_label
                    else ""
                )
            )
        if len(set(labels)) != len(labels):
            raise Invalid(f"{what} lists a label twice; list each label once")
        exclusive = [label for label in labels if label in definition.exclusive_labels]
        if exclusive and len(labels) > 1:
            raise Invalid(f"{what}: {exclusive[0]!r} cannot be combined with other labels; choose it alone")
        return sorted(labels, key=allowed.index)
    if len(labels) != 1:
        raise Invalid(f"{what} must be exactly one label for family {definition.family.value}")
    return labels


def check_target_label(definition: TaskDefinition, value: str | Sequence[str] | None) -> list[str]:
    return check_label_set(definition, value, allowed=list(definition.labels), what="target_label")


def check_validation_label(definition: TaskDefinition, value: str | Sequence[str] | None) -> list[str]:
    allowed = definition.effective_validation_labels
    return check_label_set(definition, value, allowed=allowed, what="label", empty_is_exclusive=True)


def is_fooled(definition: TaskDefinition, target: list[str], predicted: list[str]) -> bool:
    """True when the model's prediction misses the writer's target.

    Single-label families: the predicted label differs from the target label. Multi-label
    (docs/design.md "One attempt, end to end"): the predicted label *set* is not exactly the target set.
    """
    if definition.is_multi_label:
        return set(predicted) != set(target)
    return predicted[:1] != target[:1]


def collapse(definition: TaskDefinition, label: list[str]) -> list[str] | None:
    """Map a validation label to the task's label space; None for `unknown` (MAD-TSC)."""
    if definition.unknown_label is not None and label == [definition.unknown_label]:
        return None
    if definition.label_collapse:
        return [definition.label_collapse[label[0]]]
    return label


def gold_label(definition: TaskDefinition, responses: Sequence[list[str]]) -> list[str] | None:
    """The gold label of one example from its counted responses, or None when there is none.

    Single-label families: the label with at least ``gold_min_votes`` votes (DynaSent: 3 of 5).
    Multi-label: every label chosen by at least ``gold_min_votes`` validators (EthioEmo: 2 of 3).
    Target-dependent: 5-point votes collapsed to 3 first; any `unknown` means no gold. The
    round builder applies the full MAD-TSC neighbouring-class rule; this is the live estimate
    used for re-queueing and validator agreement.
    """
    need = definition.agreement.gold_min_votes
    if definition.is_multi_label:
        votes = Counter(label for response in responses for label in set(response))
        return exclusive_gold(definition, [label for label in definition.labels if votes[label] >= need])
    collapsed: list[str] = []
    for response in responses:
        mapped = collapse(definition, response)
        if mapped is None:
            return None
        collapsed.append(mapped[0])
    if not collapsed:
        return None
    (label, count), *rest = Counter(collapsed).most_common()
    if count >= need and (not rest or rest[0][1] < count):
        return [label]
    return None


def exclusive_gold(definition: TaskDefinition, gold: Sequence[str]) -> list[str] | None:
    """A multi-label gold set with the task's exclusive labels kept exclusive.

    An exclusive label (EthioEmo's neutral: "none of the six") is never gold together with
    other labels: when other labels also reach ``gold_min_votes`` they win and the exclusive
    label is dropped (a validator who saw no emotion is outvoted on each emotion others saw).
    Two exclusive labels that both reach it contradict each other: no gold. Empty: None.
    """
    exclusive = [label for label in gold if label in definition.exclusive_labels]
    others = [label for label in gold if label not in definition.exclusive_labels]
    if others:
        return others
    return exclusive if len(exclusive) == 1 else None


def last_pass(passes: Sequence[int], responses: Sequence[list[str]]) -> list[list[str]]:
    """The responses of the example's last annotation pass (``Validation.annotation_pass``).

    EthioEmo §3.3: disagreements are re-annotated by new validators and gold is decided on the
    new labels alone, so the first pass's labels no longer count towards gold once an example
    has a second pass. The live estimate (:func:`gold_label` via
    services.domain.example_status) and the round builder both use this selection.
    """
    if not passes:
        return []
    last = max(passes)
    return [response for p, response in zip(passes, responses, strict=True) if p == last]


def agreement_with(definition: TaskDefinition, response: list[str], gold: list[str]) -> float:
    """How much one response agrees with the gold label: 0/1, or Jaccard for label sets."""
    if definition.is_multi_label:
        union = set(response) | set(gold)
        return len(set(response) & set(gold)) / len(union) if union else 1.0
    mapped = collapse(definition, response)
    return 1.0 if mapped == gold else 0.0
