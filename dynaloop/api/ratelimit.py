"""Rate limits on the writer and validator endpoints, per API token and per client address,
and the login throttle (per username and per address, with growing back-off).

Counting is the `limits` library's moving window (no hand-written bucket maths); its storage is
``memory://`` for one API process or ``redis://`` so that every replica behind the load balancer
shares the counters (docs/deploy.md); the login throttle keeps its counters in the same storage.
A request over a limit gets 429 ``rate_limited`` with ``Retry-After``; nothing is written. The
token's budget is keyed by the id of the token that authenticated the request (however its
``Authorization`` header was spelled), never by the token itself. The client address is the
socket peer, or, when the peer is one of ``DYNALOOP_TRUSTED_PROXIES`` (nginx), the address the
proxy forwarded (services/forwarded.py); run uvicorn without its own proxy-header handling
(``--no-proxy-headers``), so that the socket peer reaches this check unchanged.

The web app calls the API from its own server for every browser, so without more every web-app
user would share one address: one person's hundred wrong passwords would lock every web login,
and a busy round would exhaust the per-address budget. The web app therefore names the browser's
address in ``X-Dynaloop-Client-Address`` and proves it is the web app with the key both share
(``DYNALOOP_WEB_APP_KEY``, in ``X-Dynaloop-Web-App-Key``); without the right key the header is
the client's own claim and is ignored (:func:`client_address`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import math
import time
from collections.abc import Callable

from anyio import CapacityLimiter, to_thread
from fastapi import Request
from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage, Storage, storage_from_string
from limits.strategies import MovingWindowRateLimiter

from services import forwarded
from services.errors import RateLimited
from services.settings import Settings


def _parse(value: str) -> list[RateLimitItem]:
    if value.strip().lower() in ("", "none", "off"):
        return []
    return list(parse_many(value))


logger = logging.getLogger(__name__)

CLIENT_ADDRESS_HEADER = "X-Dynaloop-Client-Address"
WEB_APP_KEY_HEADER = "X-Dynaloop-Web-App-Key"


def client_address(request: Request, settings: Settings) -> str:
    """The address a request counts against: the browser's address that the web app names in
    ``X-Dynaloop-Client-Address`` when the request carries the web app's key; else the client's
    address, read from the forwarded headers when the socket peer is a trusted proxy
    (``DYNALOOP_TRUSTED_PROXIES``, services/forwarded.py), else the socket peer itself."""
    socket_peer = request.client.host if request.client else None
    peer = forwarded.client_address(socket_peer, request.headers.items(), settings.trusted_proxy_networks) or "unknown"
    named = request.headers.get(CLIENT_ADDRESS_HEADER)
    if named is None:
        return peer
    expected = settings.web_app_key
    given = request.headers.get(WEB_APP_KEY_HEADER, "")
    if expected is None or not hmac.compare_digest(given.encode(), expected.encode()):
        if given:
            logger.warning(
                "a request from %s carried a wrong %s (or the API has no DYNALOOP_WEB_APP_KEY): counted "
                "against its own address; the web app and the API must share the same key",
                peer,
                WEB_APP_KEY_HEADER,
            )
        return peer
    try:
        return str(ipaddress.ip_address(named.strip()))
    except ValueError:
        return peer


class RateLimiter:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.per_token = _parse(settings.rate_limit_per_token)
        self.per_ip = _parse(settings.rate_limit_per_ip)
        storage = storage_from_string(settings.rate_limit_storage)
        if not isinstance(storage, Storage):
            raise ValueError(
                f"DYNALOOP_RATE_LIMIT_STORAGE {settings.rate_limit_storage!r} is an async storage; "
                "use memory:// or redis://host:6379"
            )
        self.storage = storage
        # The process's own counters (memory://) are counted on the event loop: a check is a few
        # microseconds under a lock and never waits, while a hop to a worker thread and back
        # cost about 0.13 ms of CPU per request (docs/benchmarks.md, "API CPU"). A shared storage
        # (Redis) is a network round trip, counted in a worker thread.
        self.in_process = isinstance(storage, MemoryStorage)
        self.limiter = MovingWindowRateLimiter(self.storage)
        self.login = LoginThrottle(settings, self.storage)

    def _hit(self, items: list[RateLimitItem], key: str, who: str) -> None:
        for item in items:
            if not self.limiter.hit(item, "dynaloop", key):
                reset = self.limiter.get_window_stats(item, "dynaloop", key).reset_time
                retry_after = max(1, math.ceil(reset - time.time()))
                raise RateLimited(
                    f"too many requests from this {who} (limit {item}); wait {retry_after} s and "
                    "retry: nothing was saved",
                    retry_after_s=retry_after,
                )

    def check_address(self, request: Request) -> None:
        self._hit(self.per_ip, f"ip:{client_address(request, self.settings)}", "address")

    def check_token(self, token_id: int) -> None:
        self._hit(self.per_token, f"token:{token_id}", "token")


class LoginThrottle:
    """Failed logins per username and per client address, and the lock-outs they earn.

    After ``login_max_failures_per_user`` failures for one username (or
    ``login_max_failures_per_address`` from one address) within ``login_failure_window_s`` of the
    first, that username (address) is locked for ``login_lockout_s``; each further failure
    doubles the lock, up to ``login_lockout_max_s``. A locked login is refused before its
    password is checked. A success clears the username's failures, not the address's.

    Passwords are checked in a pool of ``login_password_workers`` threads of its own: PBKDF2
    costs tens of milliseconds of CPU, and a flood of logins must queue among themselves, not
    take the CPU and the handler threads from every other request (bench/login_flood.py).
    Beyond ``login_max_waiting`` logins waiting their turn, a login is refused at once (429).

    The counters are plain expiring counters of the rate limiter's `limits` storage
    (``incr``/``get``/``get_expiry``/``clear``: memory or Redis, shared by the replicas). The
    `limits` strategies count requests in a window of fixed length and have no back-off whose
    length grows with the count, so the lock's length is computed here.
    """

    def __init__(self, settings: Settings, storage: Storage) -> None:
        self.storage = storage
        self.hashing = CapacityLimiter(settings.login_password_workers)
        self.max_pending = settings.login_password_workers + settings.login_max_waiting
        self.pending = 0  # logins being checked or waiting for a thread; changed only on the event loop
        self.window_s = settings.login_failure_window_s
        self.first_lock_s = settings.login_lockout_s
        self.max_lock_s = settings.login_lockout_max_s
        self.max_failures = {
            "username": settings.login_max_failures_per_user,
            "address": settings.login_max_failures_per_address,
        }

    @staticmethod
    def _subjects(username: str, address: str) -> dict[str, str]:
        # A digest keeps any username (spaces, any length) a plain storage key.
        return {
            "username": hashlib.sha256(username.encode("utf-8", "surrogatepass")).hexdigest()[:32],
            "address": address,
        }

    def check(self, username: str, address: str) -> None:
        """Refuse (429 with Retry-After) a login whose username or address is locked."""
        for kind, subject in self._subjects(username, address).items():
            lock = f"login-lock/{kind}/{subject}"
            if self.storage.get(lock) > 0:
                retry_after = max(1, math.ceil(self.storage.get_expiry(lock) - time.time()))
                raise RateLimited(
                    f"too many failed logins for this {kind}; wait {retry_after} s and retry "
                    "(the password was not checked)",
                    retry_after_s=retry_after,
                )

    async def check_password(self, username: str, address: str, matches: Callable[[], bool]) -> bool:
        """``matches()`` (the password check) in the login pool, unless the username or the address
        is locked, with its failure or success counted."""
        if self.pending >= self.max_pending:
            raise RateLimited(
                f"{self.pending} logins are being checked or waiting; wait 1 s and retry", retry_after_s=1
            )
        self.pending += 1
        try:
            return await to_thread.run_sync(self._check_password, username, address, matches, limiter=self.hashing)
        finally:
            self.pending -= 1

    def _check_password(self, username: str, address: str, matches: Callable[[], bool]) -> bool:
        # Checked again now that this login has its turn: logins queued behind the one whose
        # failure locked the username are refused too, not checked.
        self.check(username, address)
        if matches():
            self.succeeded(username)
            return True
        self.failed(username, address)
        return False

    def failed(self, username: str, address: str) -> None:
        for kind, subject in self._subjects(username, address).items():
            failures = self.storage.incr(f"login-failures/{kind}/{subject}", self.window_s)
            over = failures - self.max_failures[kind]
            if over >= 0:
                lock_s = min(self.max_lock_s, self.first_lock_s * 2 ** min(over, 32))
                lock = f"login-lock/{kind}/{subject}"
                self.storage.clear(lock)
                self.storage.incr(lock, lock_s)

    def succeeded(self, username: str) -> None:
        subject = self._subjects(username, "")["username"]
        self.storage.clear(f"login-failures/username/{subject}")
        self.storage.clear(f"login-lock/username/{subject}")
