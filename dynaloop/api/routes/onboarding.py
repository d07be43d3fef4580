"""The onboarding quiz a writer passes before writing for a task (DynaSent Table 11)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from dynaloop.api.deps import SessionDep, allowed_writer
from dynaloop.api.routing import OneHopRoute
from dynaloop.api.schemas.onboarding import QuizAnswers, QuizPublic, QuizResultPublic
from services.authorization import OnboardingPolicy, authorize
from services.db.models import User
from services.domain import quality, tasks

router = APIRouter(tags=["onboarding"], route_class=OneHopRoute)
Writer = Annotated[User, allowed_writer(OnboardingPolicy.take)]


@router.get("/tasks/{task_name}/quiz", response_model=QuizPublic)
def get_quiz(task_name: str, session: SessionDep, writer: Writer) -> QuizPublic:
    """The onboarding quiz (without answers) and how many attempts are left."""
    task = tasks.get_task(session, task_name)
    authorize(writer, OnboardingPolicy.take(task))
    return QuizPublic.model_validate(quality.quiz_status(session, task, writer))


@router.post("/tasks/{task_name}/quiz/attempts", response_model=QuizResultPublic)
def answer_quiz(task_name: str, body: QuizAnswers, session: SessionDep, writer: Writer) -> QuizResultPublic:
    """Answer every question; all must be right, within the task's attempts (DynaSent: 5)."""
    task = tasks.get_task(session, task_name)
    authorize(writer, OnboardingPolicy.take(task))
    return QuizResultPublic.model_validate(quality.answer_quiz(session, task, writer, body.answers))
