"""What a build works on, passed between its steps: the round as read from the database
(:class:`RoundData`), the round aggregated and ready to split (:class:`Prepared`), and the
build's outcome that the report's statistics read (:class:`BuildOutcome`).

A leaf of the round builder: it imports only the types of the modules that fill it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rounds.build.build_settings import BuildSettings, EffectivePolicy
from rounds.build.report_schema import ReportDuplicates, ReportResponses
from rounds.build.splits import SplitResult
from services.db.models import Round
from services.taskdef import TaskDefinition


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
    # Set by :func:`rounds.build.prepare.prepare` (rounds.build.response_sets): ``responses`` and ``passes`` become
    # the one response set per example that every statistic reads (its last pass, at most k);
    # ``kept``/``kept_passes`` are every pass's kept responses (recorded and exported), and
    # ``selection`` says what was set aside and why.
    kept: pd.DataFrame | None = None
    kept_passes: np.ndarray | None = None
    selection: ReportResponses | None = None


@dataclass
class Prepared:
    """A round read and aggregated, ready to split: what a build and a preview share."""

    data: RoundData
    gold: pd.DataFrame
    dropped: np.ndarray
    split_input: pd.DataFrame
    eligible: pd.DataFrame
    # What was done with repeated texts (rounds/build/duplicates.py): one copy per text.
    duplicates: ReportDuplicates | None = None


@dataclass
class BuildOutcome:
    """What the report is assembled from: the round's data and how the build split it."""

    round_: Round
    data: RoundData
    settings: BuildSettings
    gold: pd.DataFrame  # per example: gold, gold_votes, kept, reason (rounds.build.prepare.gold_labels)
    split_input: pd.DataFrame  # what splits.build_splits was given (every example)
    result: SplitResult
    assignment: dict[int, str]  # eligible example -> train, dev or test
    dropped: np.ndarray  # per example of split_input: excluded from every split
    chance: bool
    policy: EffectivePolicy
    model_based: dict[int, list[str]] = field(default_factory=dict)  # example -> model-based label (set)
    ids: dict[str, list[int]] = field(init=False)  # train, dev, test -> example ids
    gold_of: dict[int, Any] = field(init=False)  # example -> gold label (str, tuple or None)

    def __post_init__(self) -> None:
        self.ids = {name: [e for e, s in self.assignment.items() if s == name] for name in ("train", "dev", "test")}
        self.gold_of = dict(zip(self.split_input["example_id"], self.split_input["gold"], strict=True))
