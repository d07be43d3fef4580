"""Web origins an admin names in a setting (``DYNALOOP_MTURK_SUBMIT_ORIGINS``): MTurk's hosts a
study session may post its assignment back to.

frontend/framing.py keeps a copy of :func:`parse_origins` (the web app imports nothing of the
project); tests/test_web_study.py checks that both answer alike.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

MAX_ORIGINS = 10
MAX_ORIGIN_CHARS = 200
# Plain http is accepted for these hosts only: browsers treat them as secure contexts, so a test
# (or a developer's machine) can play MTurk's part on another port without TLS.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# A host name (letters, digits, hyphens, dots: no wildcard, no CSP syntax) or an IPv6 address.
_HOST_RE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*|[0-9a-f:.]+")


def _loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_origins(value: str | Iterable[str], setting: str) -> tuple[str, ...]:
    """``https://a.example, https://b.example:8443`` (commas or spaces between, or a list) as
    origins written ``scheme://host[:port]``; a :class:`ValueError` names ``setting`` and the
    entry that is wrong. Each must be https (http only on a loopback host), with no path,
    query, fragment or user name, and there are at most :data:`MAX_ORIGINS`."""
    items = value.replace(",", " ").split() if isinstance(value, str) else [item.strip() for item in value]
    origins: list[str] = []
    for item in items:
        if not item:
            continue
        problem = None
        try:
            parts = urlsplit(item)
            port = parts.port
        except ValueError:
            parts, port, problem = None, None, "is not an address"
        if parts is not None:
            host = (parts.hostname or "").lower()
            if len(item) > MAX_ORIGIN_CHARS or any(ord(c) < 33 or ord(c) == 127 or c in "\\<>\"'" for c in item):
                problem = "is not an address"
            elif parts.scheme not in ("https", "http") or not _HOST_RE.fullmatch(host):
                problem = "is not an http(s) origin with a host name or address"
            elif parts.scheme == "http" and not _loopback(host):
                problem = "is not https (plain http only on localhost, 127.0.0.1 or ::1)"
            elif parts.username is not None or parts.password is not None:
                problem = "names a user"
            elif parts.path not in ("", "/") or parts.query or parts.fragment or item.endswith(("?", "#")):
                problem = "has a path, query or fragment: give scheme://host[:port] only"
        if problem is not None:
            raise ValueError(
                f"{setting}: {item[:80]!r} {problem}; give origins such as https://worker.mturk.com, "
                "separated by commas or spaces"
            )
        assert parts is not None
        netloc = host if port is None else f"{host}:{port}"
        if ":" in host:  # IPv6
            netloc = f"[{host}]" if port is None else f"[{host}]:{port}"
        origin = f"{parts.scheme}://{netloc}"
        if origin not in origins:
            origins.append(origin)
    if len(origins) > MAX_ORIGINS:
        raise ValueError(f"{setting}: at most {MAX_ORIGINS} origins")
    return tuple(origins)
