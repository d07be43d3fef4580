"""The errors that stop a training run (rounds.models.train, linear) or a prediction or an evaluation
(rounds.models.inference, metrics, evaluate, evaluation_sets); the message says what to fix. Here, apart
from the code that raises them, so that the job runner (rounds.models.jobs) reads them without the
`training` extra's packages."""

from __future__ import annotations


class EvaluationError(ValueError):
    """Something that stops an evaluation; the message says what to fix."""


class TrainingError(ValueError):
    """Something that stops a training run before it starts; the message says what to fix."""
