"""The `dynaloop` command: tasks, users, prompts, database and the demo set-up."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

from api.app import create_app
from dynaloop.cli import app as cli
from services.db.migrate import current_revision, head_revision
from services.settings import Settings

runner = CliRunner()


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(cli, list(args), env=env, catch_exceptions=False)


def test_list_examples_names_all_five_families() -> None:
    result = run("task", "list-examples")
    assert result.exit_code == 0
    for name in ["dynasent-r2", "besstie-en-in-sarcasm", "isarcasm", "ethioemo-amharic", "mad-tsc"]:
        assert name in result.output
    for family in ["single_label", "binary_variety", "intended_sarcasm", "multi_label", "target_dependent"]:
        assert family in result.output


def test_validate_reports_field_and_fix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x-task\ntitle: T\nfamily: single_label\nlabels: [pos, neg]\n"
        "constraints: {min_chars: 50, max_chars: 10}\n",
        encoding="utf-8",
    )
    result = run("task", "validate", str(bad))
    assert result.exit_code == 1
    assert "constraints: min_chars (50) is larger than max_chars (10)" in result.output
    good = run("task", "validate", str(Path("services/task_examples/mad-tsc.yaml")))
    assert good.exit_code == 0 and "valid target_dependent task 'mad-tsc'" in good.output


def test_admin_token_from_cli_works_against_the_api(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert run("db", "upgrade", "--database-url", url).exit_code == 0
    assert current_revision(url) == head_revision()
    result = run("user", "create-admin", "boss", "--database-url", url)
    assert result.exit_code == 0
    token = result.output.strip().splitlines()[-1]
    assert token.startswith("dl_")
    duplicate = run("user", "create-admin", "boss", "--database-url", url)
    assert duplicate.exit_code == 1 and "already exists" in duplicate.output
    assert run("task", "create", "dynasent-r2", "--database-url", url).exit_code == 0
    with TestClient(
        create_app(Settings(database_url=url, environment="test", secret_key="a-real-secret-for-this-test"))
    ) as client:
        me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).json()
        assert me["username"] == "boss" and me["roles"] == ["researcher", "admin"]
        tasks = client.get("/api/v1/tasks", headers={"Authorization": f"Bearer {token}"}).json()
        assert [t["name"] for t in tasks["data"]] == ["dynasent-r2"]
        response = client.post(
            "/api/v1/tasks/dynasent-r2/rounds", json={}, headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 201
    prompts = tmp_path / "prompts.csv"
    prompts.write_text("text,stars\nThe pie was good.,4\nThe pie was good.,4\nService was slow.,2\n", encoding="utf-8")
    result = run("prompts", "import", "--task", "dynasent-r2", str(prompts), "--database-url", url)
    assert result.exit_code == 0, result.output
    assert "imported 2 of 3 rows (1 repeated in the file, 0 already present)" in result.output
    bad = tmp_path / "prompts.txt"
    bad.write_text("x", encoding="utf-8")
    result = run("prompts", "import", "--task", "dynasent-r2", str(bad), "--database-url", url)
    assert result.exit_code == 1 and "name it .jsonl or .csv" in result.output


def test_commands_refuse_an_unmigrated_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    result = run("task", "create", "dynasent-r2", "--database-url", url)
    assert result.exit_code == 1 and "dynaloop db upgrade" in result.output


def test_demo_setup_is_idempotent(tmp_path: Path) -> None:
    first = run("demo", "--no-serve", "--data-dir", str(tmp_path))
    assert first.exit_code == 0, first.output
    assert "40 prompts" in first.output and "validator5" in first.output
    second = run("demo", "--no-serve", "--data-dir", str(tmp_path), "--model-endpoint", "http://127.0.0.1:9")
    assert second.exit_code == 0 and "40 prompts" in second.output
    # A writer and a validator study link, printed with an example worker id; the same ones again.
    shown = r"^  (writer|validator) +(http://127\.0\.0\.1:8501/study/\S+\?worker=demo-1)$"
    links = re.findall(shown, first.output, re.M)
    assert [role for role, _ in links] == ["writer", "validator"], first.output
    assert all(url in second.output for _, url in links)
    assert "http://127.0.0.1:9" in second.output


def test_production_refuses_placeholder_secret() -> None:
    result = runner.invoke(cli, ["db", "current"], env={"DYNALOOP_ENVIRONMENT": "production"})
    assert result.exit_code == 2 and "DYNALOOP_SECRET_KEY" in result.output
