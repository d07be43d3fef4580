"""ASGI entry point: `uvicorn api.main:app` (the same app `dynaloop api` serves through
`api.app:create_app`)."""

from api.app import create_app

app = create_app()
