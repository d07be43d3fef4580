"""The one shape of every error answer, and the OpenAPI entries that document it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from dynaloop.api.schemas.common import ANSWER_CONFIG


class ErrorBody(BaseModel):
    model_config = ANSWER_CONFIG

    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    error: ErrorBody


_ERROR_DESCRIPTIONS = {
    401: "No token, or an unknown, revoked or expired one (at login: a wrong username or password).",
    403: "Your roles or status do not allow this (wrong role, quiz not passed, unqualified, your own example).",
    404: "No such task, round, example, user, job, or no such assignment or attempt of yours.",
    409: "The current state forbids it (duplicate, round not collecting, tries used up, ...).",
    410: "The assignment expired; request a new one.",
    413: "The request body is over the size limit.",
    422: "Bad input: `details.problems` lists each problem with what to fix.",
    429: "Too many requests from this token or address; see `Retry-After`.",
    503: "The database (or, where the operation uses it, the model server) is unavailable or busy, or the "
    "server is answering its most requests at once (`overloaded`); nothing was saved, retry after "
    "`Retry-After` seconds.",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the error statuses an operation can answer; every error
    has the `{"error": {"code", "message", "details"}}` shape of :class:`ErrorResponse`."""
    return {code: {"model": ErrorResponse, "description": _ERROR_DESCRIPTIONS[code]} for code in codes}
