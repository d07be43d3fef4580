"""Accounts, roles, password login and API tokens (hashed at rest)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.conftest import MakeUser, table_counts


@pytest.mark.both_databases
def test_admin_creates_users_and_tokens_are_stored_hashed(
    client: TestClient, app: FastAPI, make_user: MakeUser
) -> None:
    admin = make_user("ada", "admin")
    response = client.post(
        "/api/v1/users",
        json={"username": "wren", "roles": ["writer"], "password": "s3cret-passphrase"},
        headers=admin.headers,
    )
    assert response.status_code == 201 and response.json()["roles"] == ["writer"]
    token = client.post("/api/v1/users/wren/tokens", json={"name": "laptop"}, headers=admin.headers).json()
    assert token["token"].startswith("dl_") and token["prefix"] == token["token"][:10]
    with app.state.engine.connect() as connection:
        stored = [row[0] for row in connection.execute(text("SELECT token_hash FROM api_tokens"))]
        hashes = [row[0] for row in connection.execute(text("SELECT password_hash FROM users WHERE username='wren'"))]
    assert token["token"] not in stored and all(len(h) == 64 for h in stored)
    assert hashes[0].startswith("pbkdf2_sha256$") and "s3cret-passphrase" not in hashes[0]
    me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {token['token']}"}).json()
    assert me["username"] == "wren"


def test_password_login_and_wrong_password(client: TestClient, make_user: MakeUser) -> None:
    admin = make_user("ada", "admin")
    client.post(
        "/api/v1/users",
        json={"username": "val", "roles": ["validator"], "password": "correct-horse"},
        headers=admin.headers,
    )
    ok = client.post("/api/v1/auth/login", json={"username": "val", "password": "correct-horse"})
    assert ok.status_code == 200 and ok.json()["user"]["roles"] == ["validator"]
    me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {ok.json()['token']}"})
    assert me.status_code == 200
    for password in ["wrong-horse", "correct-hors"]:
        bad = client.post("/api/v1/auth/login", json={"username": "val", "password": password})
        assert bad.status_code == 401 and bad.json()["error"]["message"] == "wrong username or password"
    unknown = client.post("/api/v1/auth/login", json={"username": "nobody", "password": "whatever1"})
    assert unknown.status_code == 401


def test_only_admins_manage_users_and_others_tokens(client: TestClient, app: FastAPI, make_user: MakeUser) -> None:
    researcher = make_user("rosa", "researcher")
    writer = make_user("wim", "writer")
    before = table_counts(app)
    response = client.post("/api/v1/users", json={"username": "x", "roles": ["admin"]}, headers=researcher.headers)
    assert response.status_code == 403 and "admin role" in response.json()["error"]["message"]
    response = client.post("/api/v1/users/rosa/tokens", json={}, headers=writer.headers)
    assert response.status_code == 403 and "only an admin" in response.json()["error"]["message"]
    assert table_counts(app) == before
    own = client.post("/api/v1/users/wim/tokens", json={"name": "second"}, headers=writer.headers)
    assert own.status_code == 201


def test_user_input_is_checked(client: TestClient, app: FastAPI, make_user: MakeUser) -> None:
    admin = make_user("ada", "admin")
    before = table_counts(app)
    cases = [
        ({"username": "bad name", "roles": ["writer"]}, "username 'bad name' is not valid"),
        ({"username": "ok", "roles": ["overlord"]}, "unknown role(s) ['overlord']"),
        ({"username": "ok", "roles": []}, "roles"),
        ({"username": "ada", "roles": ["writer"]}, "already exists"),
        ({"username": "ok", "roles": ["writer"], "password": "short"}, "password"),
    ]
    for body, message in cases:
        response = client.post("/api/v1/users", json=body, headers=admin.headers)
        assert response.status_code in (409, 422), response.text
        assert message in response.json()["error"]["message"]
    assert table_counts(app) == before


def test_health_reports_schema(client: TestClient) -> None:
    response = client.get("/health")
    assert response.status_code == 200 and response.json()["status"] == "ok"
