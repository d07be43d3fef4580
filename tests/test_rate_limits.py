"""Rate limits on the writer and validator endpoints: per token and per address, 429 with
Retry-After, nothing written by a refused request; placeholder secrets refused outside development."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from dynaloop.api.app import create_app
from services.settings import Settings
from tests.conftest import example_yaml, open_round, table_counts


def _client(settings: Settings, **limits: str) -> TestClient:
    return TestClient(create_app(settings.model_copy(update=limits)))


def _round(client: TestClient, researcher: Any, stub_model: Any) -> dict[str, Any]:
    return open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        stub_model.url,
        [f"Prompt {i}: the cafe on the corner serves lunch." for i in range(5)],
    )


@pytest.mark.both_databases
def test_a_token_over_its_limit_gets_429_and_nothing_is_written(
    settings, make_user, researcher, stub_model, reset_stubs
) -> None:
    with _client(settings, rate_limit_per_token="3/minute", rate_limit_per_ip="none") as client:
        round_ = _round(client, researcher, stub_model)
        writer, other = make_user("wanda", "writer"), make_user("walt", "writer")
        assignment = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers)
        assert assignment.status_code == 201
        url = f"/api/v1/assignments/{assignment.json()['id']}/attempts"
        for i in range(2):
            assert (
                client.post(
                    url, json={"text": f"The cafe serves a great lunch {i}."}, headers=writer.headers
                ).status_code
                == 201
            )
        before = table_counts(client.app)
        refused = client.post(url, json={"text": "The cafe serves a great lunch again."}, headers=writer.headers)
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "rate_limited" and "nothing was saved" in error["message"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert table_counts(client.app) == before
        # Another writer's token has its own budget; researcher endpoints are not limited.
        assert (
            client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=other.headers).status_code == 201
        )
        for _ in range(5):
            assert client.get(f"/api/v1/rounds/{round_['id']}/stats", headers=researcher.headers).status_code == 200


def test_an_address_over_its_limit_gets_429_whatever_the_token(
    settings, make_user, researcher, stub_model, reset_stubs
) -> None:
    with _client(settings, rate_limit_per_token="none", rate_limit_per_ip="4/minute") as client:
        round_ = _round(client, researcher, stub_model)
        validators = [make_user(f"val{i}", "validator") for i in range(6)]
        statuses = [
            client.get(f"/api/v1/rounds/{round_['id']}/validation-batch", headers=v.headers).status_code
            for v in validators
        ]
        assert statuses == [200, 200, 200, 200, 429, 429]


def test_unauthenticated_requests_count_against_the_address(settings, researcher, stub_model, reset_stubs) -> None:
    with _client(settings, rate_limit_per_token="none", rate_limit_per_ip="2/minute") as client:
        statuses = [client.post("/api/v1/rounds/1/assignments", json={}).status_code for _ in range(3)]
    assert statuses == [401, 401, 429]


def test_limits_can_be_turned_off(settings, make_user, researcher, stub_model, reset_stubs) -> None:
    with _client(settings, rate_limit_per_token="none", rate_limit_per_ip="none") as client:
        round_ = _round(client, researcher, stub_model)
        validator = make_user("vera", "validator")
        assert all(
            client.get(f"/api/v1/rounds/{round_['id']}/validation-batch", headers=validator.headers).status_code == 200
            for _ in range(30)
        )


def test_a_malformed_limit_is_refused_at_start(settings) -> None:
    with pytest.raises(ValueError, match="rate limit string 'many per minute'"):
        create_app(settings.model_copy(update={"rate_limit_per_token": "many per minute"}))


@pytest.mark.parametrize("environment", ["test", "production"])
@pytest.mark.parametrize("secret", ["dev-secret-change-me", "change-me", "short"])
def test_placeholder_secrets_are_refused_outside_development(environment: str, secret: str) -> None:
    with pytest.raises(ValidationError, match="DYNALOOP_SECRET_KEY"):
        Settings(environment=environment, secret_key=secret)
    assert Settings(environment="development", secret_key=secret).secret_key == secret


def _redis_url() -> str | None:
    """The machine's Redis (docs/deploy.md: the counters of several API replicas), if it answers."""
    import socket

    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5):
            return "redis://127.0.0.1:6379/15"
    except OSError:
        return None


def test_process_counters_are_counted_in_the_request_and_shared_ones_in_a_thread(settings) -> None:
    """memory:// counters are checked on the event loop (no worker-thread hop per request);
    Redis counters, shared by every replica, in a worker thread: two API processes' limiters on
    one Redis refuse the request over the token's limit together."""
    import uuid

    from dynaloop.api.ratelimit import RateLimiter
    from services.errors import RateLimited

    assert RateLimiter(settings.model_copy(update={"rate_limit_storage": "memory://"})).in_process
    url = _redis_url()
    if url is None:
        pytest.skip("no Redis on 127.0.0.1:6379")
    shared = settings.model_copy(update={"rate_limit_storage": url, "rate_limit_per_token": "3/minute"})
    one, other = RateLimiter(shared), RateLimiter(shared)
    assert not one.in_process and not other.in_process
    token_id = uuid.uuid4().int % 2**31  # a fresh key in the shared storage
    one.check_token(token_id)
    other.check_token(token_id)
    one.check_token(token_id)
    with pytest.raises(RateLimited):
        other.check_token(token_id)
