"""The whole API: the backend's routes plus the round builder's, composed here so that
``services`` never imports ``rounds`` (DESIGN.md's dependency direction)."""

from __future__ import annotations

from fastapi import FastAPI

from services.api.app import API_PREFIX
from services.api.app import create_app as create_backend_app
from services.model_client import ModelClient
from services.settings import Settings


def create_app(settings: Settings | None = None, model_client: ModelClient | None = None) -> FastAPI:
    from rounds.api import router as rounds_router

    app = create_backend_app(settings, model_client)
    app.include_router(rounds_router, prefix=API_PREFIX)
    return app
