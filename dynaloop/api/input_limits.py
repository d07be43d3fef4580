"""Refuse JSON request bodies nested deeper than ``DYNALOOP_MAX_INPUT_DEPTH`` before FastAPI
parses them.

FastAPI reads a JSON body with ``json.loads``, which recurses once per level: a body nested a
few thousand levels deep raises ``RecursionError``, which FastAPI turns into a bare 400, and one
just under Python's recursion limit gets through to the handlers (and to ``json.dumps`` when
it is stored). This middleware scans the body without recursion
(:func:`services.structured_input.check_json_depth`) and answers 422 in the documented error
shape naming the limit. It runs inside :class:`dynaloop.api.app.BodySizeLimit`, so the body it holds
is never larger than ``DYNALOOP_MAX_REQUEST_BYTES``.
"""

from __future__ import annotations

import functools
from email.message import Message as MimeMessage

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.structured_input import TooDeep, check_json_depth

_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def parsed_as_json(content_type: str | None) -> bool:
    """Whether FastAPI parses a body with this Content-Type as JSON: no Content-Type at all,
    ``application/json`` or ``application/*+json`` (fastapi.routing reads the body the same way)."""
    if not content_type:
        return True
    if len(content_type) <= 100:
        # Clients send the same few values; parsing the header as MIME costs every request.
        return _parsed_as_json(content_type)
    return _parsed_as_json.__wrapped__(content_type)


@functools.lru_cache(maxsize=64)
def _parsed_as_json(content_type: str) -> bool:
    message = MimeMessage()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


class JsonDepthLimit:
    """ASGI middleware: 422 for a JSON body nested deeper than ``max_depth``."""

    def __init__(self, app: ASGIApp, max_depth: int) -> None:
        self.app = app
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        content_type = next(
            (value.decode("latin-1") for name, value in scope["headers"] if name == b"content-type"), None
        )
        if not parsed_as_json(content_type):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away: let the app see the disconnect as it would have.
                await self.app(scope, _replay([], message, receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            check_json_depth(body, self.max_depth)
        except TooDeep as exc:
            response = JSONResponse(
                status_code=422,
                content={
                    "error": {
                        "code": exc.code,
                        "message": exc.message,
                        "details": {**exc.details, "problems": [exc.message]},
                    }
                },
            )
            await response(scope, receive, send)
            return
        await self.app(scope, _replay([body], None, receive), send)


def _replay(bodies: list[bytes], pending: Message | None, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then the client's own messages."""
    queue: list[Message] = [{"type": "http.request", "body": b, "more_body": False} for b in bodies]
    if pending is not None:
        queue.append(pending)

    async def replayed() -> Message:
        if queue:
            return queue.pop(0)
        return await receive()

    return replayed
