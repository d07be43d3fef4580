"""ASGI entry point of the backend alone: `uvicorn services.api.main:app`. The full API with
the round builder's endpoints is `dynaloop.app:create_app` (what `dynaloop api` serves)."""

from services.api.app import create_app

app = create_app()
