"""Study links, study sessions and the platform's completion (services/domain/study.py)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from dynaloop.api.schemas.common import ANSWER_CONFIG
from services.db.models import Platform, StudyLink, StudyRole, StudySession, StudySessionStatus
from services.domain import study as study_domain
from services.taskdef import MAX_PAY_MINOR

OutOfWork = Literal["complete", "partial", "return"]
Code = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class StudyLinkCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200, description="What the researcher calls the link.")
    round_id: int = Field(ge=1, le=2**31 - 1, description="The round of the task the workers work in.")
    role: StudyRole
    platform: Platform
    quota: int = Field(ge=1, le=10_000, description="Examples per writer, or labels per validator.")
    max_workers: int | None = Field(
        None, ge=1, le=1_000_000, description="Most sessions the link starts; required on prolific and mturk links."
    )
    id_parameter: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")] | None = (
        Field(None, description="generic only (required there): the query parameter with the worker's id.")
    )
    opens_at: dt.datetime | None = Field(None, description="With a time zone; none: open now.")
    closes_at: dt.datetime | None = Field(None, description="With a time zone; none: until closed by hand.")
    completion_code: Code | None = Field(None, description="None: 8 random letters and digits.")
    screened_out_code: Code | None = Field(None, description="The platform's code for workers screened out.")
    partial_code: Code | None = Field(
        None, description="The platform's code for a stopped (partial) session; none: stopped workers return it."
    )
    partial_pay_minor: int | None = Field(
        None, ge=0, le=MAX_PAY_MINOR, description="Pay of a partial session (minor units); needs partial_code."
    )
    other_role_allowed: bool = Field(
        False, description="Take workers who came through a link of the other role (writers who also validate)."
    )
    when_out_of_work: OutOfWork = Field(
        "complete",
        description="Validators whose round has no more work: complete (with 1+ label), partial, or return.",
    )
    currency: str | None = Field(
        None,
        pattern=r"^[A-Z]{3}$",
        description="The ISO 4217 currency the platform's study pays in (Prolific: GBP or USD; MTurk: USD); "
        "none: the task's pay policy's. A payout batch in another currency is refused.",
    )


class StudyLinkPublic(BaseModel):
    id: int
    slug: str
    name: str
    task: str
    round_id: int
    role: StudyRole
    platform: Platform
    quota: int
    max_workers: int | None
    id_parameter: str | None
    completion_code: str
    screened_out_code: str | None
    partial_code: str | None
    partial_pay_minor: int | None
    other_role_allowed: bool
    when_out_of_work: OutOfWork
    currency: str | None = Field(description="The currency the study pays in; null: the task's pay policy's.")
    opens_at: dt.datetime | None
    closes_at: dt.datetime | None
    closed_at: dt.datetime | None
    created_at: dt.datetime
    path: str = Field(description="Where workers open the link in the web app: /study/<slug>.")
    query_template: str = Field(description="The query the platform appends to the web app's URL + path.")
    is_open: bool

    @classmethod
    def of(cls, link: StudyLink) -> StudyLinkPublic:
        return cls(
            id=link.id,
            slug=link.slug,
            name=link.name,
            task=link.task.name,
            round_id=link.round_id,
            role=link.role,
            platform=link.platform,
            quota=link.quota,
            max_workers=link.max_workers,
            id_parameter=link.id_parameter,
            completion_code=link.completion_code,
            screened_out_code=link.screened_out_code,
            partial_code=link.partial_code,
            partial_pay_minor=link.partial_pay_minor,
            other_role_allowed=link.other_role_allowed,
            when_out_of_work=link.when_out_of_work,  # type: ignore[arg-type]
            currency=link.currency,
            opens_at=link.opens_at,
            closes_at=link.closes_at,
            closed_at=link.closed_at,
            created_at=link.created_at,
            path=f"/study/{link.slug}",
            query_template=study_domain.query_template(link),
            is_open=study_domain.closed_reason(link) is None,
        )


class StudyLinksPublic(BaseModel):
    data: list[StudyLinkPublic]
    count: int


class LinkSessionPublic(BaseModel):
    """A session as the researcher sees it."""

    id: int
    user_id: int
    username: str
    status: StudySessionStatus
    units_done: int
    started_at: dt.datetime
    last_seen_at: dt.datetime
    ended_at: dt.datetime | None
    platform_worker_id: str | None

    @classmethod
    def of(cls, study: StudySession) -> LinkSessionPublic:
        return cls(
            id=study.id,
            user_id=study.user_id,
            username=study.user.username,
            status=study.status,
            units_done=study.units_done,
            started_at=study.started_at,
            last_seen_at=study.last_seen_at,
            ended_at=study.ended_at,
            platform_worker_id=study.platform_worker_id,
        )


class LinkSessionsPublic(BaseModel):
    data: list[LinkSessionPublic]
    count: int


class CompletionForm(BaseModel):
    action: str
    fields: dict[str, str]


class Completion(BaseModel):
    status: StudySessionStatus
    code: str | None
    redirect_url: str | None = Field(description="Prolific: where to send the worker.")
    form: CompletionForm | None = Field(description="MTurk: the form the worker's browser posts back.")
    message: str

    @classmethod
    def of(cls, completion: dict[str, Any]) -> Completion:
        return cls.model_validate(completion)


class StudySessionPublic(BaseModel):
    """A session as its worker sees it."""

    id: int
    link_id: int
    task: str
    round_id: int
    role: StudyRole
    platform: Platform
    quota: int
    units_done: int
    status: StudySessionStatus
    started_at: dt.datetime
    ended_at: dt.datetime | None
    completion: Completion | None

    @classmethod
    def of(cls, study: StudySession) -> StudySessionPublic:
        link = study.link
        completion = study_domain.completion_of(study)
        return cls(
            id=study.id,
            link_id=link.id,
            task=link.task.name,
            round_id=link.round_id,
            role=link.role,
            platform=link.platform,
            quota=link.quota,
            units_done=study.units_done,
            status=study.status,
            started_at=study.started_at,
            ended_at=study.ended_at,
            completion=None if completion is None else Completion.of(completion),
        )


class StudySessionsPublic(BaseModel):
    data: list[StudySessionPublic]
    count: int


class StudyStart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    params: dict[
        Annotated[str, StringConstraints(min_length=1, max_length=64)],
        Annotated[str, StringConstraints(max_length=study_domain.MAX_PARAM_CHARS)],
    ] = Field(
        default_factory=dict,
        max_length=study_domain.MAX_PARAMS,
        description="The query parameters the platform appended to the link (at most 20, values of at most 200 "
        "characters).",
    )


class StudyLinkSummary(BaseModel):
    name: str
    role: StudyRole
    platform: Platform
    quota: int


class StudyTaskSummary(BaseModel):
    name: str
    title: str
    description: str


class StudyStarted(BaseModel):
    model_config = ANSWER_CONFIG

    preview: bool
    link: StudyLinkSummary
    task: StudyTaskSummary
    token: str | None = Field(
        None,
        description="The session's API token (not in a preview): 24 hours from the first open; a re-open "
        "revokes the previous one and answers a new one with the same expiry.",
    )
    expires_at: dt.datetime | None = None
    session: StudySessionPublic | None = None


class StudyFinish(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: Literal["quota", "stop", "out_of_work"] = Field(
        description="quota: met; stop: now (partial); out_of_work: a validator whose round has no more work."
    )
