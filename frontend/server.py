"""The web app's server: ``dynaloop ui``, or ``streamlit run frontend/server.py``.

Streamlit runs this as an ASGI app (``st.App``): the Streamlit script ``frontend/app.py``,
plus the login and logout pages of ``frontend/web.py`` and the session gate of
``frontend/page_gate.py`` in front of every page load. The API's address comes from ``$DYNALOOP_API_URL`` (default http://127.0.0.1:8000);
``$DYNALOOP_WEB_APP_KEY``, the API's own, lets it name each browser's address to the API.
``$DYNALOOP_MTURK_FRAME_ANCESTORS`` names MTurk's worker hosts, which may frame an MTurk study
session's pages, and ``$DYNALOOP_MTURK_SUBMIT_ORIGINS`` where its assignment is posted back
(``frontend/framing.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_FRONTEND = Path(__file__).resolve().parent
if str(_FRONTEND.parent) not in sys.path:  # `streamlit run frontend/server.py` from a source checkout
    sys.path.insert(0, str(_FRONTEND.parent))

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from streamlit import config  # noqa: E402

from frontend import forwarded, framing, page_gate, sessions, uploads, web, web_backend  # noqa: E402
from frontend.client import WEB_APP_KEY_ENV  # noqa: E402
from frontend.state import api_url  # noqa: E402

# Forwarded headers are read by frontend/forwarded.py, from $DYNALOOP_TRUSTED_PROXIES only;
# uvicorn's own handling (which Streamlit leaves on) would trust any loopback peer's.
os.environ["FORWARDED_ALLOW_IPS"] = ""
# No upload larger than the API takes ($DYNALOOP_MAX_REQUEST_BYTES; Streamlit's default is 200 MB).
config.set_option("server.maxUploadSize", uploads.max_upload_mb())

_web = web.WebSession(
    web_backend.Backend(
        api_url(), web_app_key=os.environ.get(WEB_APP_KEY_ENV) or None, trusted_proxies=forwarded.trusted_from_env()
    ),
    sessions.base_path(config.get_option("server.baseUrlPath")),
    # $DYNALOOP_MTURK_FRAME_ANCESTORS and $DYNALOOP_MTURK_SUBMIT_ORIGINS (a wrong one stops the start).
    framing.Framing.from_env(),
)

app = st.App(
    _FRONTEND / "app.py",
    routes=_web.routes(),
    middleware=[Middleware(page_gate.SessionGate, web=_web)],
)
