"""The database checked against the rules every write path is meant to keep.

``dynaloop check`` runs :func:`check_database`; the fault and load tests run it at their end.
Each rule is one read-only query that returns the offending rows, so a violation names the
rows to look at. Rules (the ones a corrupted benchmark would come from first):

* ``overcounted``: an example has more counted labels than it asks for;
* ``self_validation``: a validator labelled their own example;
* ``duplicate_validation``: two labels by one validator on one example;
* ``validation_count``: an example's ``validation_count`` differs from its counted labels;
* ``tries_used``: an assignment's ``tries_used`` differs from its attempts that used a try,
  or exceeds ``tries_allowed``;
* ``example_without_attempt``: a written example whose assignment or attempt is missing, or
  whose attempt belongs to another assignment, or whose text differs from the attempt's;
* ``unconfirmed_example``: a fooling example submitted without the writer's confirmation;
* ``unscored_example``: an example made from an attempt the model never scored;
* ``assignment_status``: an assignment with an example that is not marked submitted;
* ``validated_short``: an example marked validated with fewer counted labels than asked
  (labels withdrawn from unqualified validators after a round closed are reported too: the
  report says how many, a researcher decides);
* ``orphan_*``: rows pointing at rows that are gone (SQLite enforces foreign keys only when
  asked, and rows written by hand or by other tools bypass the application).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.orm import Session, aliased

from services.db.models import (
    Assignment,
    AssignmentStatus,
    Attempt,
    AttemptStatus,
    BuiltExample,
    Example,
    ExampleOrigin,
    ExampleStatus,
    Prompt,
    Round,
    Validation,
    ValidationClaim,
)

MAX_LISTED = 20  # offending ids listed per rule (the count is always complete)

# A rule's query: the offending rows, with as many columns as the rule names.
RuleQuery: TypeAlias = Select[*tuple[Any, ...]]


@dataclass
class Violation:
    rule: str
    description: str
    count: int
    rows: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "description": self.description, "count": self.count, "rows": self.rows}


@dataclass
class CheckReport:
    rules_checked: list[str]
    violations: list[Violation]
    counts: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rules_checked": self.rules_checked,
            "counts": self.counts,
            "violations": [v.to_dict() for v in self.violations],
        }


def _counted_labels() -> Select[int, int]:
    return (
        select(Validation.example_id, func.count().label("n"))
        .where(Validation.counted.is_(True))
        .group_by(Validation.example_id)
    )


def _overcounted() -> RuleQuery:
    counted = _counted_labels().subquery()
    return (
        select(Example.id.label("example_id"), counted.c.n.label("counted"), Example.validations_needed.label("needed"))
        .join(counted, counted.c.example_id == Example.id)
        .where(counted.c.n > Example.validations_needed)
    )


def _validation_count() -> RuleQuery:
    counted = _counted_labels().subquery()
    actual = func.coalesce(counted.c.n, 0)
    return (
        select(Example.id.label("example_id"), Example.validation_count.label("stored"), actual.label("actual"))
        .outerjoin(counted, counted.c.example_id == Example.id)
        .where(Example.validation_count != actual)
    )


def _validated_short() -> RuleQuery:
    counted = _counted_labels().subquery()
    actual = func.coalesce(counted.c.n, 0)
    return (
        select(Example.id.label("example_id"), actual.label("counted"), Example.validations_needed.label("needed"))
        .outerjoin(counted, counted.c.example_id == Example.id)
        .where(Example.status == ExampleStatus.validated, actual < Example.validations_needed)
    )


def _self_validation() -> RuleQuery:
    return (
        select(Validation.id.label("validation_id"), Validation.example_id, Validation.validator_id)
        .join(Example, Example.id == Validation.example_id)
        .where(Example.writer_id.is_not(None), Example.writer_id == Validation.validator_id)
    )


def _duplicate_validation() -> RuleQuery:
    return (
        select(Validation.example_id, Validation.validator_id, func.count().label("labels"))
        .group_by(Validation.example_id, Validation.validator_id)
        .having(func.count() > 1)
    )


def _tries_used() -> RuleQuery:
    tries = (
        select(Attempt.assignment_id, func.count().label("n"))
        .where(Attempt.counts_as_try.is_(True))
        .group_by(Attempt.assignment_id)
        .subquery()
    )
    actual = func.coalesce(tries.c.n, 0)
    return (
        select(
            Assignment.id.label("assignment_id"),
            Assignment.tries_used.label("stored"),
            actual.label("actual"),
            Assignment.tries_allowed.label("allowed"),
        )
        .outerjoin(tries, tries.c.assignment_id == Assignment.id)
        .where(or_(Assignment.tries_used != actual, Assignment.tries_used > Assignment.tries_allowed))
    )


def _example_without_attempt() -> RuleQuery:
    return (
        select(Example.id.label("example_id"), Example.assignment_id, Example.attempt_id)
        .outerjoin(Attempt, Attempt.id == Example.attempt_id)
        .outerjoin(Assignment, Assignment.id == Example.assignment_id)
        .where(
            Example.origin == ExampleOrigin.written,
            or_(
                Attempt.id.is_(None),
                Assignment.id.is_(None),
                Attempt.assignment_id != Example.assignment_id,
                Attempt.text != Example.text,
            ),
        )
    )


def _unconfirmed_example() -> RuleQuery:
    return (
        select(Example.id.label("example_id"), Example.attempt_id)
        .join(Attempt, Attempt.id == Example.attempt_id)
        .where(Attempt.fooled.is_(True), Attempt.confirmed.is_(None))
    )


def _unscored_example() -> RuleQuery:
    return (
        select(Example.id.label("example_id"), Example.attempt_id, Attempt.status)
        .join(Attempt, Attempt.id == Example.attempt_id)
        .where(or_(Attempt.status != AttemptStatus.scored, Attempt.counts_as_try.is_(False)))
    )


def _assignment_status() -> RuleQuery:
    return (
        select(Assignment.id.label("assignment_id"), Assignment.status, Example.id.label("example_id"))
        .join(Example, Example.assignment_id == Assignment.id)
        .where(Assignment.status != AssignmentStatus.submitted)
    )


def _orphans(child: Any, column: Any, parent: Any, parent_key: Any) -> Callable[[], RuleQuery]:
    def query() -> RuleQuery:
        target = aliased(parent)
        key = getattr(target, parent_key.key)
        return (
            select(child.id.label("id"), column.label("points_to"))
            .outerjoin(target, key == column)
            .where(and_(column.is_not(None), key.is_(None)))
        )

    return query


RULES: dict[str, tuple[str, Callable[[], RuleQuery]]] = {
    "overcounted": ("an example has more counted labels than it asks for", _overcounted),
    "self_validation": ("a validator labelled their own example", _self_validation),
    "duplicate_validation": ("one validator labelled one example more than once", _duplicate_validation),
    "validation_count": ("validation_count differs from the example's counted labels", _validation_count),
    "tries_used": ("tries_used differs from the attempts that used a try, or exceeds tries_allowed", _tries_used),
    "example_without_attempt": (
        "a written example lacks its assignment or attempt, or they disagree",
        _example_without_attempt,
    ),
    "unconfirmed_example": ("a fooling example was submitted without the writer's confirmation", _unconfirmed_example),
    "unscored_example": ("an example was made from an attempt the model never scored", _unscored_example),
    "assignment_status": ("an assignment with an example is not marked submitted", _assignment_status),
    "validated_short": ("an example marked validated has fewer counted labels than asked", _validated_short),
    "orphan_validations": (
        "validations of examples that do not exist",
        _orphans(Validation, Validation.example_id, Example, Example.id),
    ),
    "orphan_attempts": (
        "attempts of assignments that do not exist",
        _orphans(Attempt, Attempt.assignment_id, Assignment, Assignment.id),
    ),
    "orphan_examples": ("examples of rounds that do not exist", _orphans(Example, Example.round_id, Round, Round.id)),
    "orphan_assignments": (
        "assignments of rounds that do not exist",
        _orphans(Assignment, Assignment.round_id, Round, Round.id),
    ),
    "orphan_prompts": ("prompts of rounds that do not exist", _orphans(Prompt, Prompt.round_id, Round, Round.id)),
    "orphan_claims": (
        "validation claims on examples that do not exist",
        _orphans(ValidationClaim, ValidationClaim.example_id, Example, Example.id),
    ),
    "orphan_built_examples": (
        "built rows of examples that do not exist",
        _orphans(BuiltExample, BuiltExample.example_id, Example, Example.id),
    ),
}


def _jsonable(value: Any) -> Any:
    return value.value if hasattr(value, "value") else value


def check_database(session: Session, rules: list[str] | None = None) -> CheckReport:
    """Run every rule (or ``rules``) and return what each found. Read-only."""
    chosen = rules or list(RULES)
    unknown = [rule for rule in chosen if rule not in RULES]
    if unknown:
        raise ValueError(f"unknown rule(s) {unknown}; the rules are {sorted(RULES)}")
    violations = []
    for rule in chosen:
        description, build = RULES[rule]
        query = build()
        count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
        if count:
            rows = [
                {key: _jsonable(value) for key, value in row._mapping.items()}
                for row in session.execute(query.limit(MAX_LISTED))
            ]
            violations.append(Violation(rule, description, int(count), rows))
    counts = {
        name: int(session.scalar(select(func.count()).select_from(model)) or 0)
        for name, model in (
            ("examples", Example),
            ("validations", Validation),
            ("attempts", Attempt),
            ("assignments", Assignment),
        )
    }
    return CheckReport(rules_checked=chosen, violations=violations, counts=counts)
