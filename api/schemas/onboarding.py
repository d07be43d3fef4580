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
    passed: bool
    correct: int
    wrong_questions: list[int] = Field(description="1-based numbers of the questions answered wrongly.")
    attempts_used: int
    attempts_left: int
