"""The API's route class: a plain ``def`` endpoint's work runs in one worker-thread hop, not two.

FastAPI runs a plain ``def`` endpoint in its worker-thread pool (the endpoints do blocking
database work and must not run it on the event loop, dynaloop/api/deps.py), and then validates
the endpoint's answer against its response model in the pool too: a second round trip between
the event loop and a thread for every request, about 0.15 ms of CPU here on its own and more
under load, when the threads wait for the GIL (docs/benchmarks.md, "API CPU per request").

An endpoint whose return annotation is a pydantic model builds that model itself
(``AttemptPublic.of(attempt)``), in the worker thread, from objects it has loaded there; checking
an instance of the model is a type check and reads nothing from the database. So :class:`OneHopRoute`
hands FastAPI such an endpoint as an ``async def`` that awaits the endpoint in the pool: the
work stays in a worker thread, the check runs on the event loop. Endpoints that return
anything else (a response, a list, ORM objects) are left as they are.

FastAPI reads the endpoint's parameters, name and docstring through ``functools.wraps``, so the
OpenAPI document and the dependencies do not change (tests/test_openapi.py)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool


class OneHopRoute(APIRoute):
    """An APIRoute whose plain ``def`` endpoint answering a pydantic model costs one worker-thread hop."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, in_one_hop(endpoint), **kwargs)


def answers_a_model(endpoint: Callable[..., Any]) -> bool:
    """Whether ``endpoint`` is annotated to return an instance of one pydantic model."""
    try:
        answer = typing.get_type_hints(endpoint).get("return")
    except (NameError, TypeError):  # an annotation that does not resolve: leave the endpoint as it is
        return False
    return inspect.isclass(answer) and issubclass(answer, BaseModel)


def in_one_hop(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """``endpoint``, or for a plain ``def`` one that answers a pydantic model, an ``async def``
    that runs it in the worker-thread pool (see the module's docstring)."""
    if inspect.iscoroutinefunction(endpoint) or not answers_a_model(endpoint):
        return endpoint

    @functools.wraps(endpoint)
    async def in_a_worker_thread(**values: Any) -> Any:
        return await run_in_threadpool(endpoint, **values)

    return in_a_worker_thread


def original_endpoint(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """The function a route was declared with (the one :func:`in_one_hop` wraps, if it did)."""
    return getattr(endpoint, "__wrapped__", endpoint)
