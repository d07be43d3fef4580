"""How large a file the web app takes: no larger than the API does.

The API refuses a request body above ``$DYNALOOP_MAX_REQUEST_BYTES`` (5 MiB by default,
services/settings.py) with 413, and a file upload is sent as one body. The web app reads the
same variable (give both processes the same value), so Streamlit's own uploader refuses a
larger file before it is sent (``server.maxUploadSize``, set by ``frontend/server.py``, and
each uploader's ``max_upload_size``), and the uploader's text says the limit instead of
Streamlit's default 200 MB.
"""

from __future__ import annotations

import os

MAX_REQUEST_BYTES_ENV = "DYNALOOP_MAX_REQUEST_BYTES"
DEFAULT_MAX_REQUEST_BYTES = 5 * 1024 * 1024  # the API's default
_MIB = 1024 * 1024


def max_upload_bytes() -> int:
    """The largest file a page sends to the API: ``$DYNALOOP_MAX_REQUEST_BYTES``, or the API's
    default when it is unset or not a whole number of bytes the API would take (at least 1024)."""
    try:
        value = int(os.environ.get(MAX_REQUEST_BYTES_ENV, "").strip())
    except ValueError:
        return DEFAULT_MAX_REQUEST_BYTES
    return value if value >= 1024 else DEFAULT_MAX_REQUEST_BYTES


def max_upload_mb() -> int:
    """The same in whole MiB, at least 1: the unit of Streamlit's ``server.maxUploadSize`` and
    ``max_upload_size`` (a limit below a MiB is checked by :func:`too_large` alone)."""
    return max(1, max_upload_bytes() // _MIB)


def limit_text() -> str:
    """The limit for people: "5 MiB", "1.5 MiB", "512 KiB"."""
    size = max_upload_bytes()
    if size >= _MIB:
        return f"{size / _MIB:.1f}".removesuffix(".0") + " MiB"
    return f"{size / 1024:.1f}".removesuffix(".0") + " KiB"


def too_large(content: bytes) -> str | None:
    """Why ``content`` cannot be sent (the API would refuse it), or None."""
    if len(content) <= max_upload_bytes():
        return None
    return f"The file is {len(content):,} bytes; the API takes at most {limit_text()} ({max_upload_bytes():,} bytes)."
