"""Who may show a page of the web app in a frame.

MTurk shows a study link in a frame on its worker site (an ExternalQuestion). Pages are
unframeable (``X-Frame-Options: DENY`` and ``frame-ancestors 'none'``) except those of an MTurk
study session, which MTurk's worker hosts only may frame (:class:`Framing`,
``$DYNALOOP_MTURK_FRAME_ANCESTORS``; docs/crowdsourcing.md, "Inside MTurk's frame").
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.responses import Response

__all__ = ["Framing", "deny_framing", "parse_origins", "set_frame_policy"]

MTURK_SUBMIT_ORIGINS_ENV = "DYNALOOP_MTURK_SUBMIT_ORIGINS"
DEFAULT_MTURK_SUBMIT_ORIGINS = ("https://www.mturk.com", "https://workersandbox.mturk.com")
# The hosts of MTurk's worker site that show an ExternalQuestion in their frame: the worker site
# and its sandbox (the addresses MTurk's requester docs give for previewing HITs), and
# www.mturk.com, the older worker site that MTurk's docs still name as turkSubmitTo.
MTURK_FRAME_ANCESTORS_ENV = "DYNALOOP_MTURK_FRAME_ANCESTORS"
DEFAULT_MTURK_FRAME_ANCESTORS = ("https://worker.mturk.com", "https://workersandbox.mturk.com", "https://www.mturk.com")

MAX_ORIGINS = 10
MAX_ORIGIN_CHARS = 200
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
    """The web app's copy of services/origins.py ``parse_origins`` (tests/test_web_study.py
    checks that both answer alike): origins written ``scheme://host[:port]``, https only (plain
    http only on a loopback host, which browsers treat as secure), at most :data:`MAX_ORIGINS`;
    a :class:`ValueError` names ``setting`` and the entry that is wrong."""
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


@dataclass(frozen=True)
class Framing:
    """Who may frame the pages of an MTurk study session, and where its assignment is posted
    back. ``mturk_frame_ancestors``: MTurk's worker hosts (``$DYNALOOP_MTURK_FRAME_ANCESTORS``;
    empty: not even MTurk may frame them, and workers must open the task in its own tab);
    ``mturk_submit_origins``: ``$DYNALOOP_MTURK_SUBMIT_ORIGINS``, the API's setting of the same
    name. A test names its own fake MTurk origin (http on localhost) in both."""

    mturk_frame_ancestors: tuple[str, ...] = DEFAULT_MTURK_FRAME_ANCESTORS
    mturk_submit_origins: tuple[str, ...] = DEFAULT_MTURK_SUBMIT_ORIGINS

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Framing:
        env = os.environ if environ is None else environ
        ancestors = env.get(MTURK_FRAME_ANCESTORS_ENV)
        submit = env.get(MTURK_SUBMIT_ORIGINS_ENV)
        submit_origins = (
            DEFAULT_MTURK_SUBMIT_ORIGINS if submit is None else parse_origins(submit, MTURK_SUBMIT_ORIGINS_ENV)
        )
        if not submit_origins:
            raise ValueError(f"{MTURK_SUBMIT_ORIGINS_ENV} is empty; name MTurk's hosts (the default)")
        return cls(
            DEFAULT_MTURK_FRAME_ANCESTORS if ancestors is None else parse_origins(ancestors, MTURK_FRAME_ANCESTORS_ENV),
            submit_origins,
        )

    def ancestors(self, mturk: bool) -> tuple[str, ...]:
        """Who may frame a page: MTurk's worker hosts for an MTurk study session's, no one else."""
        return self.mturk_frame_ancestors if mturk else ()

    def frame(self, response: Response, mturk: bool) -> Response:
        """``response`` framed by MTurk's worker hosts only when it belongs to an MTurk study
        session (``mturk``), unframeable otherwise (:func:`set_frame_policy`)."""
        set_frame_policy(response.headers, self.ancestors(mturk))
        return response


_FRAME_ANCESTORS_RE = re.compile(r";?\s*frame-ancestors[^;]*")


def _with_frame_ancestors(csp: str, sources: str) -> str:
    return f"{_FRAME_ANCESTORS_RE.sub('', csp).strip().rstrip(';')}; frame-ancestors {sources}".lstrip("; ")


def set_frame_policy(headers: MutableHeaders, ancestors: tuple[str, ...] = ()) -> None:
    """Who may show this answer in a frame.

    No one (``ancestors`` empty): ``X-Frame-Options: DENY`` for old browsers and
    ``frame-ancestors 'none'``, which every browser with CSP level 2 obeys over the other.

    MTurk's worker hosts (``ancestors``) only: ``frame-ancestors`` lists them, and there is no
    ``X-Frame-Options`` (it cannot name a host, and ``DENY`` would block MTurk in the browsers
    that do not know frame-ancestors). A browser too old for CSP's frame-ancestors (Internet
    Explorer) lets any site frame these pages; they are a study session's own, with nothing to
    trick the worker into but their own task."""
    if not ancestors:
        headers["X-Frame-Options"] = "DENY"
        sources = "'none'"
    else:
        if "X-Frame-Options" in headers:
            del headers["X-Frame-Options"]
        sources = " ".join(ancestors)
    headers["Content-Security-Policy"] = _with_frame_ancestors(headers.get("Content-Security-Policy", ""), sources)


def deny_framing(response: Response) -> Response:
    set_frame_policy(response.headers)
    return response
