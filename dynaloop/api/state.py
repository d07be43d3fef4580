"""What ``dynaloop.api.app.create_app`` keeps on ``app.state``, typed.

Starlette's ``State`` answers ``Any`` for every attribute; :class:`AppState` names the ones
the app keeps, with their types, and :func:`app_state` finds it from a request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Engine, orm
from sqlalchemy.orm import Session
from starlette.datastructures import State
from starlette.requests import HTTPConnection

from services.domain.in_flight import AttemptsInFlight
from services.model_client import ModelClient
from services.settings import Settings

if TYPE_CHECKING:  # dynaloop.api.ratelimit finds its limiter through app_state
    from dynaloop.api.metrics import ApiMetrics
    from dynaloop.api.ratelimit import RateLimiter


class AppState(State):
    """The app's settings and the resources it made from them; still read as attributes of
    ``app.state`` (``app.state.sessionmaker``), as Starlette's ``State`` is."""

    settings: Settings
    engine: Engine
    sessionmaker: orm.sessionmaker[Session]
    model_client: ModelClient
    rate_limiter: RateLimiter
    attempts_in_flight: AttemptsInFlight
    metrics: ApiMetrics  # set by create_app once the state exists (dynaloop/api/metrics.py)

    def __init__(
        self,
        *,
        settings: Settings,
        engine: Engine,
        sessionmaker: orm.sessionmaker[Session],
        model_client: ModelClient,
        rate_limiter: RateLimiter,
        attempts_in_flight: AttemptsInFlight,
    ) -> None:
        super().__init__(
            {
                "settings": settings,
                "engine": engine,
                "sessionmaker": sessionmaker,
                "model_client": model_client,
                "rate_limiter": rate_limiter,
                "attempts_in_flight": attempts_in_flight,
            }
        )


def app_state(connection: HTTPConnection) -> AppState:
    """The state of the app that answers ``connection`` (a request), made by ``create_app``."""
    state = connection.app.state
    assert isinstance(state, AppState), "the app was not made by dynaloop.api.app.create_app"
    return state
