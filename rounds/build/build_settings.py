"""A build's settings: what a researcher asks for (:class:`BuildSettings`, the one model behind
the API's build body, the build's recorded ``config`` and `dynaloop round build`'s options) and
the effective policy they resolve to for a round (:class:`EffectivePolicy`,
:func:`resolve_policy`; docs/round_builder.md, "Build policies").

A leaf of the round builder: it imports no other module of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from services.errors import Invalid
from services.taskdef import TaskDefinition

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Flag:
    """A setting as `dynaloop round build` and `round build-preview` show it: the option's help
    (the field's description is the API's, written for a JSON body) and, for a setting whose
    default is not null, the word that stands for null on the command line."""

    help: str
    null: str | None = None


class BuildSettings(BaseModel):
    """The settings of a build as requested (null: the default), what `dynaloop round build` and
    ``POST /rounds/{id}/build`` take (docs/round_builder.md, "Build policies"); the effective
    ones are the report's ``splits.policy``."""

    model_config = ConfigDict(extra="forbid")

    seed: Annotated[int, Flag("Seed of the splits and of the synthetic annotators")] = Field(0, ge=0, le=2**31 - 1)
    dev_test_min_votes: Annotated[int | None, Flag("Votes for gold a dev/test example needs; default: the task's")] = (
        Field(None, ge=1, le=100, description="Default: the task's agreement setting; lower is relaxed.")
    )
    chance: Annotated[bool | None, Flag("Require the model at chance on dev/test")] = Field(
        None,
        description="Require the round's model at chance on dev/test "
        "(default: strict yes for single-label families; relaxed and multi-label no). false is relaxed.",
    )
    max_per_cell: Annotated[int | None, Flag("Cap dev and test per cell or class")] = Field(
        None, ge=1, le=1_000_000, description="Cap dev and test at this many per (gold, predicted) cell or class."
    )
    model_based: Annotated[Literal["dawid_skene", "mace"] | None, Flag("dawid_skene, mace or none", null="none")] = (
        Field("dawid_skene", description="dawid_skene, mace or null.")
    )
    policy: Annotated[Literal["strict", "relaxed"] | None, Flag("strict or relaxed (docs/round_builder.md)")] = Field(
        None,
        description="strict: the task's dev/test rules (model at chance for single-label families); "
        "relaxed: no chance constraint unless asked, the class-balance guard. Default: strict, or "
        "relaxed when a setting below loosens the task's rules.",
    )
    min_per_cell: Annotated[int | None, Flag("Least per cell or class in each of dev and test")] = Field(
        None, ge=1, le=1_000_000, description="Least per cell or class in each of dev and test (default 1)."
    )
    no_prompt_in_dev_test: Annotated[bool | None, Flag("No-prompt examples in dev/test")] = Field(
        None,
        description="Let no-prompt examples into dev/test, each on its own "
        "(default: only when the round has no prompt examples).",
    )
    max_dev_test_share: Annotated[
        float | None, Flag("Class-balance guard: dev+test take at most this share of each class")
    ] = Field(
        None,
        gt=0,
        le=1,
        description="Class-balance guard: dev+test take at most this share of each class's eligible "
        "examples (default: relaxed 0.5, strict none).",
    )


POLICIES = ("strict", "relaxed")
# The class-balance guard's default under the relaxed policy: dev+test take at most half of
# each class's eligible examples (docs/round_builder.md, "Class balance guard").
RELAXED_MAX_DEV_TEST_SHARE = 0.5


class EffectivePolicy(BaseModel):
    """A build's policy with every default resolved (docs/round_builder.md, "Build policies")."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="strict or relaxed.")
    chance: bool
    dev_test_min_votes: int
    responses: int = Field(description="The task's validations per example (votes are out of this).")
    max_per_cell: int | None
    min_per_cell: int
    no_prompt_in_dev_test: bool
    max_dev_test_share: float | None


def resolve_policy(settings: BuildSettings, definition: TaskDefinition, examples: pd.DataFrame) -> EffectivePolicy:
    """The effective policy of ``settings`` for a task and its round's examples. ``strict`` is
    the task's rules (the round's model at chance for single-label families, the task's
    dev/test vote threshold); any setting that loosens them makes the build ``relaxed``, and
    asking for ``strict`` together with such a setting is refused."""
    task_min_votes = definition.agreement.dev_test_min_votes
    family_chance = not definition.is_multi_label
    if settings.policy is not None and settings.policy not in POLICIES:
        raise Invalid(f"policy must be one of {', '.join(POLICIES)}, not {settings.policy!r}")
    loosened: dict[str, Any] = {}  # the settings that loosen the task's rules -> what they say
    if settings.chance is False and family_chance:
        loosened["chance"] = "leaving the model's chance constraint off"
    if settings.dev_test_min_votes is not None and settings.dev_test_min_votes < task_min_votes:
        loosened["dev_test_min_votes"] = (
            f"{settings.dev_test_min_votes} dev/test vote(s) (the task asks for {task_min_votes})"
        )
    if settings.policy == "strict" and loosened:
        # A plain sentence for the API and the command alike; ``loosened`` names the settings
        # (the command shows them as its options).
        raise Invalid(
            f"the strict policy keeps the task's dev/test rules, and {' and '.join(loosened.values())} "
            f"{'relax' if len(loosened) > 1 else 'relaxes'} them: ask for the relaxed policy instead, or leave "
            f"{'those settings' if len(loosened) > 1 else 'that setting'} out",
            loosened={key: getattr(settings, key) for key in loosened},
        )
    name = settings.policy or ("relaxed" if loosened else "strict")
    if settings.chance is not None and settings.chance and definition.is_multi_label:
        raise Invalid("a multi-label task's dev and test cannot hold the model at chance; leave chance unset")
    chance = settings.chance if settings.chance is not None else (family_chance and name == "strict")
    min_votes = settings.dev_test_min_votes or task_min_votes
    if min_votes > definition.validations_per_example:
        raise Invalid(
            f"dev_test_min_votes={min_votes} is more than the task's {definition.validations_per_example} "
            "validations per example"
        )
    min_per_cell = settings.min_per_cell or 1
    if settings.max_per_cell is not None and settings.max_per_cell < min_per_cell:
        raise Invalid(f"max_per_cell={settings.max_per_cell} is below min_per_cell={min_per_cell}")
    no_prompt = settings.no_prompt_in_dev_test
    if no_prompt is None:
        no_prompt = bool(len(examples)) and bool((examples["condition"] == "no_prompt").all())
    share = settings.max_dev_test_share
    if share is None and name == "relaxed":
        share = RELAXED_MAX_DEV_TEST_SHARE
    return EffectivePolicy(
        name=name,
        chance=bool(chance),
        dev_test_min_votes=int(min_votes),
        responses=definition.validations_per_example,
        max_per_cell=settings.max_per_cell,
        min_per_cell=min_per_cell,
        no_prompt_in_dev_test=no_prompt,
        max_dev_test_share=share,
    )
