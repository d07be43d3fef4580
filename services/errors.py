"""Domain errors. Domain functions raise these; the API maps them to HTTP status codes."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """Base class: ``message`` says what went wrong and what to do about it."""

    status_code = 400
    code = "invalid"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class Invalid(DomainError):
    status_code = 422
    code = "invalid"


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


class Conflict(DomainError):
    status_code = 409
    code = "conflict"


class Forbidden(DomainError):
    status_code = 403
    code = "forbidden"


class Unauthorized(DomainError):
    status_code = 401
    code = "unauthorized"


class Gone(DomainError):
    status_code = 410
    code = "gone"


class RateLimited(DomainError):
    """Too many requests from one token or one address; retry after ``retry_after_s``."""

    status_code = 429
    code = "rate_limited"


class ModelUnavailable(DomainError):
    """The model server did not answer; the client should retry after ``retry_after_s``."""

    status_code = 503
    code = "model_unavailable"
