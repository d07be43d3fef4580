"""What a browser sends the web app's own routes: a bounded form, from the app's own origin, and
the browser's address.

Requests are bounded (a form body of at most :data:`MAX_FORM_BYTES`, fields no longer than the
API accepts) and a POST must come from the app's own origin (``Origin`` or ``Referer``).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request

from frontend import forwarded

__all__ = ["FormError", "browser_address", "read_form", "same_origin"]

MAX_FORM_BYTES = 8 * 1024
MAX_USERNAME = 64  # dynaloop/api/schemas/auth.py LoginRequest
MAX_PASSWORD = 200


class FormError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form of at most :data:`MAX_FORM_BYTES` (read no further), one value a field."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise FormError(415, "send the form as application/x-www-form-urlencoded")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
        raise FormError(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_FORM_BYTES:
            raise FormError(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=10)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormError(400, "the form could not be read") from exc
    return {name: values[0] for name, values in fields.items() if values}


def same_origin(request: Request) -> bool:
    """Did the browser send this POST from a page of this app? ``Origin`` (or, without it,
    ``Referer``) must name this host; neither header, or ``Origin: null``, is refused."""
    source = request.headers.get("origin") or request.headers.get("referer")
    host = request.headers.get("host")
    if not source or not host or source == "null":
        return False
    return urlsplit(source).netloc.lower() == host.lower()


def browser_address(request: Request, trusted: tuple[forwarded.IPNetwork, ...] = ()) -> str | None:
    """The browser's address: the socket peer, or, when the peer is one of the ``trusted``
    proxies (``$DYNALOOP_TRUSTED_PROXIES``), the address the proxy forwarded
    (frontend/forwarded.py)."""
    peer = request.client.host if request.client else None
    return forwarded.client_address(peer, request.headers.items(), trusted)
