"""The onboarding quiz (DynaSent Table 11)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class QuizAnswers(BaseModel):
    model_config = ConfigDict(extra="forbid")
    answers: list[str] = Field(max_length=200)


class QuizQuestionPublic(BaseModel):
    """A question without its answer."""

    text: str
    options: list[str]


class QuizPublic(BaseModel):
    required: bool = Field(description="False when the task has no quiz.")
    passed: bool
    attempts_used: int
    attempts_left: int
    questions: list[QuizQuestionPublic]


class QuizResultPublic(BaseModel):
    """Passed or not, and the attempts left. Which answers (or how many) were wrong is never
    said: a writer told that could flip those answers and pass without reading the guidelines.
    The number right is kept for researchers (``quiz_attempts.correct``)."""

    passed: bool
    attempts_used: int
    attempts_left: int
