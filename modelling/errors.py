"""The error that stops a prediction or an evaluation (modelling.inference, metrics, evaluate,
evaluation_sets); the message says what to fix."""

from __future__ import annotations


class EvaluationError(ValueError):
    """Something that stops an evaluation; the message says what to fix."""
