"""ASGI entry point: `uvicorn dynaloop.api.main:app` (the same app `dynaloop api` serves through
`dynaloop.api.app:create_app`)."""

from dynaloop.api.app import create_app

app = create_app()
