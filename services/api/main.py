"""ASGI entry point: `uvicorn services.api.main:app` (settings from DYNALOOP_* variables)."""

from services.api.app import create_app

app = create_app()
