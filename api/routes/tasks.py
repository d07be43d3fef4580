"""Tasks, rounds, prompt sets, statistics and worker quality (researcher endpoints)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, status
from pydantic import ValidationError

from api.deps import CurrentResearcher, CurrentUser, CurrentWriter, IdPath, SessionDep, SettingsDep
from api.schemas import (
    PromptImportPublic,
    QuizAnswers,
    RoundCreate,
    RoundModelUpdate,
    RoundPublic,
    RoundsPublic,
    RoundStatusUpdate,
    TaskCreate,
    TaskPublic,
    TasksPublic,
    UnqualifyRequest,
    WorkerAgreementPublic,
)
from services.db.models import Role
from services.domain import quality, rounds, tasks, users
from services.errors import Invalid

router = APIRouter()

_YAML_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/yaml": {"schema": {"type": "string"}, "example": "name: my-task\n..."},
            "application/json": {"schema": TaskCreate.model_json_schema()},
        },
    }
}
_PROMPT_BODY = {
    "requestBody": {
        "required": True,
        "description": "JSONL (one object per line with `text`, optional `id`, `source` and metadata "
        "fields) or CSV with a header row that has a `text` column.",
        "content": {
            "application/x-ndjson": {"schema": {"type": "string"}},
            "text/csv": {"schema": {"type": "string"}},
        },
    }
}


async def _body_text(request: Request) -> bytes:
    return await request.body()


# The body is read by an async dependency so that the endpoints themselves are plain `def`:
# FastAPI runs those in its thread pool. An `async def` endpoint would run its (blocking)
# database work on the event loop and, on SQLite, stall every other request, even deadlock
# with one whose rollback waits for the loop.
RawBody = Annotated[bytes, Depends(_body_text)]


@router.post("/tasks", response_model=TaskPublic, status_code=status.HTTP_201_CREATED, tags=["tasks"],
             openapi_extra=_YAML_BODY)
def create_task(request: Request, session: SessionDep, researcher: CurrentResearcher, raw: RawBody) -> TaskPublic:
    """Create a task from its YAML file (raw `application/yaml`, or JSON `{"definition_yaml": ...}`)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type == "application/json":
        try:
            yaml_text = TaskCreate.model_validate_json(raw).definition_yaml
        except ValidationError as exc:
            raise Invalid(f"body must be {{\"definition_yaml\": \"...\"}}: {exc.errors()[0]['msg']}") from exc
    else:
        try:
            yaml_text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Invalid("the task YAML is not UTF-8; save it as UTF-8") from exc
    task = tasks.create_task(session, researcher, yaml_text)
    session.commit()
    return TaskPublic.of(task, with_answers=True)


@router.get("/tasks", response_model=TasksPublic, tags=["tasks"])
def list_tasks(session: SessionDep, user: CurrentUser) -> TasksPublic:
    rows = [TaskPublic.of(t, with_answers=user.has_role(Role.researcher)) for t in tasks.list_tasks(session)]
    return TasksPublic(data=rows, count=len(rows))


@router.get("/tasks/{task_name}", response_model=TaskPublic, tags=["tasks"])
def get_task(task_name: str, session: SessionDep, user: CurrentUser) -> TaskPublic:
    return TaskPublic.of(tasks.get_task(session, task_name), with_answers=user.has_role(Role.researcher))


@router.get("/tasks/{task_name}/rounds", response_model=RoundsPublic, tags=["rounds"])
def list_rounds(task_name: str, session: SessionDep, user: CurrentUser) -> RoundsPublic:
    task = tasks.get_task(session, task_name)
    rows = [RoundPublic.of(r) for r in task.rounds]
    return RoundsPublic(data=rows, count=len(rows))


@router.post("/tasks/{task_name}/rounds", response_model=RoundPublic, status_code=status.HTTP_201_CREATED,
             tags=["rounds"])
def create_round(task_name: str, body: RoundCreate, session: SessionDep,
                 researcher: CurrentResearcher) -> RoundPublic:
    """Open the task's next round (the previous one must be closed)."""
    task = tasks.get_task(session, task_name)
    round_ = rounds.create_round(
        session, researcher, task, model_endpoints=body.model_endpoints, prompt_strategy=body.prompt_strategy,
        no_prompt_fraction=body.no_prompt_fraction, target_label_mode=body.target_label_mode, notes=body.notes,
    )
    session.commit()
    return RoundPublic.of(round_)


@router.get("/rounds/open", response_model=RoundsPublic, tags=["rounds"])
def open_rounds(session: SessionDep, user: CurrentUser) -> RoundsPublic:
    """Rounds that are collecting (writers) or validating (validators)."""
    rows = [RoundPublic.of(r) for r in rounds.open_rounds(session)]
    return RoundsPublic(data=rows, count=len(rows))


@router.get("/rounds/{round_id}", response_model=RoundPublic, tags=["rounds"])
def get_round(round_id: IdPath, session: SessionDep, user: CurrentUser) -> RoundPublic:
    return RoundPublic.of(rounds.get_round(session, round_id))


@router.post("/rounds/{round_id}/status", response_model=RoundPublic, tags=["rounds"])
def set_round_status(round_id: IdPath, body: RoundStatusUpdate, session: SessionDep,
                     researcher: CurrentResearcher) -> RoundPublic:
    """Move a round forward: collecting -> validating -> closed."""
    round_ = rounds.set_status(session, researcher, rounds.get_round(session, round_id), body.status)
    session.commit()
    return RoundPublic.of(round_)


@router.put("/rounds/{round_id}/model", response_model=RoundPublic, tags=["rounds"])
def set_round_model(round_id: IdPath, body: RoundModelUpdate, session: SessionDep,
                    researcher: CurrentResearcher) -> RoundPublic:
    """Set the model server(s) in the loop; with several, one is picked per attempt."""
    round_ = rounds.set_model_endpoints(session, researcher, rounds.get_round(session, round_id),
                                        body.model_endpoints)
    session.commit()
    return RoundPublic.of(round_)


@router.post("/rounds/{round_id}/prompts", response_model=PromptImportPublic, tags=["rounds"],
             openapi_extra=_PROMPT_BODY)
def import_prompts(round_id: IdPath, request: Request, session: SessionDep, settings: SettingsDep,
                   researcher: CurrentResearcher, content: RawBody,
                   format: str | None = Query(None, description="jsonl or csv; default from Content-Type")
                   ) -> PromptImportPublic:
    """Import prompts into the round's prompt set. One bad row and nothing is imported."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    file_format = format or {"text/csv": "csv", "application/x-ndjson": "jsonl", "application/jsonl": "jsonl",
                             "application/json": "jsonl"}.get(content_type)
    if file_format is None:
        raise Invalid("say what the file is: Content-Type text/csv or application/x-ndjson, or ?format=csv|jsonl")
    report = rounds.import_prompts(session, researcher, rounds.get_round(session, round_id), content,
                                   file_format, max_rows=settings.max_prompt_import_rows)
    session.commit()
    return PromptImportPublic(rows=report.rows, imported=report.imported,
                              duplicates_in_file=report.duplicates_in_file, already_present=report.already_present)


@router.get("/rounds/{round_id}/stats", tags=["rounds"])
def round_stats(round_id: IdPath, session: SessionDep, researcher: CurrentResearcher) -> dict[str, Any]:
    """Live statistics: assignments, attempts and fooling rate, confirmations, examples, coverage."""
    return rounds.round_stats(session, rounds.get_round(session, round_id))


@router.get("/rounds/{round_id}/worker-agreement", response_model=list[WorkerAgreementPublic],
            tags=["worker quality"])
def worker_agreement(round_id: IdPath, session: SessionDep, researcher: CurrentResearcher
                     ) -> list[WorkerAgreementPublic]:
    """Each validator's rate of agreement with the majority in this round (DynaSent Fig. 6)."""
    round_ = rounds.get_round(session, round_id)
    return [WorkerAgreementPublic(username=r.username, labels=r.labels, judged=r.judged,
                                  agreement_rate=r.agreement_rate, qualified=r.qualified)
            for r in quality.validator_agreement(session, round_.task, round_)]


@router.post("/tasks/{task_name}/worker-quality/apply", response_model=list[WorkerAgreementPublic],
             tags=["worker quality"])
def apply_worker_quality(task_name: str, session: SessionDep, researcher: CurrentResearcher
                         ) -> list[WorkerAgreementPublic]:
    """Unqualify every validator above the task's disagreement threshold; returns them."""
    task = tasks.get_task(session, task_name)
    rows = quality.apply_agreement_threshold(session, researcher, task)
    session.commit()
    return [WorkerAgreementPublic(username=r.username, labels=r.labels, judged=r.judged,
                                  agreement_rate=r.agreement_rate, qualified=r.qualified) for r in rows]


@router.post("/tasks/{task_name}/workers/{username}/unqualify", tags=["worker quality"])
def unqualify(task_name: str, username: str, body: UnqualifyRequest, session: SessionDep,
              researcher: CurrentResearcher) -> dict[str, Any]:
    """Stop a worker: their labels are kept but excluded, their examples re-queued."""
    task = tasks.get_task(session, task_name)
    excluded = quality.unqualify(session, researcher, task, users.get_user(session, username), body.reason)
    session.commit()
    return {"username": username, "qualified": False, "labels_excluded": excluded}


@router.post("/tasks/{task_name}/workers/{username}/requalify", tags=["worker quality"])
def requalify(task_name: str, username: str, session: SessionDep, researcher: CurrentResearcher) -> dict[str, Any]:
    task = tasks.get_task(session, task_name)
    restored = quality.requalify(session, researcher, task, users.get_user(session, username))
    session.commit()
    return {"username": username, "qualified": True, "labels_restored": restored}


@router.get("/tasks/{task_name}/quiz", tags=["onboarding"])
def get_quiz(task_name: str, session: SessionDep, writer: CurrentWriter) -> dict[str, Any]:
    """The onboarding quiz (without answers) and how many attempts are left."""
    result = quality.quiz_status(session, tasks.get_task(session, task_name), writer)
    session.commit()
    return result


@router.post("/tasks/{task_name}/quiz/attempts", tags=["onboarding"])
def answer_quiz(task_name: str, body: QuizAnswers, session: SessionDep, writer: CurrentWriter) -> dict[str, Any]:
    """Answer every question; all must be right, within the task's attempts (DynaSent: 5)."""
    result = quality.answer_quiz(session, tasks.get_task(session, task_name), writer, body.answers)
    session.commit()
    return result
