"""The API's routers, one entity each, and what each adds to every one of its operations:
error statuses beyond the common ones (documented in OpenAPI), and the rate limit on the
crowdworkers' routers (dynaloop/api/ratelimit.py). ``dynaloop.api.app`` mounts them all under ``/api/v1``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from fastapi import APIRouter, Depends, FastAPI
from starlette.routing import BaseRoute

from dynaloop.api.deps import address_rate_limited, token_rate_limited
from dynaloop.api.routes import (
    assignments,
    attention_checks,
    auth,
    builds,
    control_items,
    dataset_uploads,
    datasets,
    examples,
    jobs,
    ledger,
    members,
    model_servers,
    models,
    onboarding,
    pay_policy,
    payouts,
    round_imports,
    rounds,
    study,
    tasks,
    tokens,
    users,
    validation,
    worker_quality,
)
from dynaloop.api.schemas.errors import error_responses

# Error statuses any /api/v1 operation can answer.
COMMON_ERRORS = (401, 403, 404, 409, 413, 422, 503)


@dataclass(frozen=True)
class Included:
    router: APIRouter
    extra_errors: tuple[int, ...] = ()
    rate_limited: bool = False
    # Without a token (a worker arriving from a crowd platform): the address's budget only.
    address_limited: bool = False


ROUTERS = (
    # The crowd's routers first: a request is matched against the routers in this order, and the
    # crowd's requests are most of the load (no path of theirs is matched by an earlier route
    # either way: tests/test_openapi.py checks that the routers' order decides no request's route).
    Included(assignments.router, (410, 429), rate_limited=True),
    Included(validation.router, (429,), rate_limited=True),
    # The full record of an example is a researcher's, but it was served with the validators'
    # routes and has always been limited with them; it stays so.
    Included(examples.router, (429,), rate_limited=True),
    # Issue 26: writers' attention checks, limited like the assignments they sit between.
    Included(attention_checks.router, (429,), rate_limited=True),
    Included(auth.router),
    Included(users.router),
    Included(tokens.router),
    Included(tasks.router),
    Included(members.router),
    Included(rounds.router),
    # One request imports a whole file: the bulk path, not under the crowd's per-token limits.
    Included(round_imports.router),
    Included(worker_quality.router),
    Included(control_items.router),
    Included(onboarding.router),
    Included(builds.router),
    Included(datasets.router),
    Included(dataset_uploads.router),
    Included(jobs.router),
    Included(ledger.router),
    Included(payouts.router),
    Included(pay_policy.router),
    Included(models.router),
    Included(model_servers.router),
    Included(study.router),
    Included(study.public_router, (429,), address_limited=True),
    Included(study.worker_router, (429,), rate_limited=True),
)


def include_routers(app: FastAPI | APIRouter, prefix: str = "") -> None:
    """Include every router of the API in ``app`` under ``prefix``, with its errors and limits.

    Each router is included in the app itself, not through one router that holds them all:
    FastAPI matches a request against every included router in turn, and a level of nesting
    more doubled that work (about 0.2 ms of CPU per request; docs/benchmarks.md, "API CPU").

    The inclusions are made once per process and every app takes the same route objects
    (:func:`api_routes`): FastAPI resolves an included router's operations (their dependencies,
    response models and the errors added here) per inclusion, on first use, which cost about
    0.6 s of CPU for each app that answered a request. One process makes one app in production,
    but the test suite makes one per test (docs/testing.md, "What a test costs"). Nothing here
    differs between apps: the errors, the rate limits' dependencies and the prefix are the same,
    and the limits' counters are read from the app's state at request time. Two things an app
    then cannot have: ``app.dependency_overrides`` on these routes (the inclusion belongs to no
    app; this project uses none), and a router's own startup handlers or lifespan, which would
    stay with the shared inclusion rather than run with the app (the API's routers have none)."""
    app.routes.extend(api_routes(prefix))  # FastAPI.routes is its router's list of routes


@cache
def api_routes(prefix: str) -> tuple[BaseRoute, ...]:
    """The API's routes under ``prefix``, each router included as described in
    :func:`include_routers`, made once per process and prefix."""
    holder = APIRouter()
    for included in ROUTERS:
        holder.include_router(
            included.router,
            prefix=prefix,
            responses=error_responses(*COMMON_ERRORS, *included.extra_errors),
            # The address's budget first (unauthenticated requests count too), then, once the
            # token is authenticated, that token's.
            dependencies=[Depends(address_rate_limited), Depends(token_rate_limited)]
            if included.rate_limited
            else [Depends(address_rate_limited)]
            if included.address_limited
            else None,
        )
    return tuple(holder.routes)
