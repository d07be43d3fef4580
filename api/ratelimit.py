"""Rate limits on the writer and validator endpoints, per API token and per client address.

Counting is the `limits` library's moving window (no hand-written bucket maths); its storage is
``memory://`` for one API process or ``redis://`` so that every replica behind the load balancer
shares the counters (docs/deploy.md). A request over a limit gets 429 ``rate_limited`` with
``Retry-After``; nothing is written. The token is keyed by its SHA-256, never stored in plain.
The client address is the socket peer; behind nginx run uvicorn with ``--proxy-headers`` and
``--forwarded-allow-ips`` so that it is the worker's address, not the balancer's.
"""

from __future__ import annotations

import hashlib
import math
import time

from fastapi import Request
from limits import RateLimitItem, parse_many
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from api.state import app_state
from services.errors import RateLimited
from services.settings import Settings


def _parse(value: str) -> list[RateLimitItem]:
    if value.strip().lower() in ("", "none", "off"):
        return []
    return list(parse_many(value))


class RateLimiter:
    def __init__(self, settings: Settings) -> None:
        self.per_token = _parse(settings.rate_limit_per_token)
        self.per_ip = _parse(settings.rate_limit_per_ip)
        self.limiter = MovingWindowRateLimiter(storage_from_string(settings.rate_limit_storage))

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

    def check(self, request: Request) -> None:
        address = request.client.host if request.client else "unknown"
        self._hit(self.per_ip, f"ip:{address}", "address")
        authorization = request.headers.get("authorization", "")
        if authorization:
            digest = hashlib.sha256(authorization.encode()).hexdigest()[:32]
            self._hit(self.per_token, f"token:{digest}", "token")


def rate_limited(request: Request) -> None:
    """FastAPI dependency for the writer and validator routers."""
    app_state(request).rate_limiter.check(request)
