"""The `dynaloop` command: tasks, users, prompts, database and the demo set-up."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

from dynaloop.api.app import create_app
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
    # The demo's model server belongs to the demo's task: its researcher may promote to it.
    from sqlalchemy import create_engine, text

    [database] = list(tmp_path.glob("*.db"))
    engine = create_engine(f"sqlite:///{database}")
    with engine.connect() as connection:
        grants = connection.execute(
            text(
                "SELECT s.url, t.name FROM model_server_grants g JOIN model_servers s ON s.id = g.server_id "
                "JOIN tasks t ON t.id = g.task_id"
            )
        ).all()
    engine.dispose()
    assert ("http://127.0.0.1:9", "dynasent-r2") in [tuple(row) for row in grants], grants


def test_production_refuses_placeholder_secret() -> None:
    result = runner.invoke(cli, ["db", "current"], env={"DYNALOOP_ENVIRONMENT": "production"})
    assert result.exit_code == 2 and "DYNALOOP_SECRET_KEY" in result.output


def test_a_token_is_listed_and_revoked_from_the_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert run("db", "upgrade", "--database-url", url).exit_code == 0
    token = run("user", "create-admin", "boss", "--database-url", url).output.strip().splitlines()[-1]
    lost = run("user", "token", "boss", "--name", "laptop", "--database-url", url).output.strip()
    settings = Settings(database_url=url, environment="test", secret_key="a-real-secret-for-this-test")
    with TestClient(create_app(settings)) as client:
        assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {lost}"}).status_code == 200
        listed = run("user", "tokens", "boss", "--database-url", url, env={"COLUMNS": "200"})
        assert listed.exit_code == 0 and "laptop" in listed.output and lost not in listed.output
        laptop_id = next(line.split()[1] for line in listed.output.splitlines() if "laptop" in line)
        revoked = run("user", "revoke-token", laptop_id, "--database-url", url)
        assert revoked.exit_code == 0 and "is revoked" in revoked.output
        assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {lost}"}).status_code == 401
        assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    again = run("user", "revoke-token", laptop_id, "--database-url", url)
    assert again.exit_code == 0  # revoking twice changes nothing
    listed = run("user", "tokens", "boss", "--database-url", url, env={"COLUMNS": "200"})
    assert "revoked" in next(line for line in listed.output.splitlines() if "laptop" in line)
    missing = run("user", "revoke-token", "9999", "--database-url", url)
    assert missing.exit_code == 1 and "no token 9999" in missing.output
    nobody = run("user", "tokens", "nobody", "--database-url", url)
    assert nobody.exit_code == 1


def test_model_init_takes_a_task_of_the_database_and_says_what_a_multi_label_head_leaves_out(tmp_path: Path) -> None:
    """`model init --task NAME` finds a task created in the database (not only a file or an
    example), and `--multi-label` names its exclusive labels or says it has none (issue 29, item 8)."""
    import json

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert run("db", "upgrade", "--database-url", url).exit_code == 0
    yaml_text = Path("services/task_examples/ethioemo-amharic.yaml").read_text(encoding="utf-8")
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml_text.replace("name: ethioemo-amharic", "name: my-emotions", 1), encoding="utf-8")
    assert run("task", "create", str(mine), "--database-url", url).exit_code == 0
    result = run(
        "model", "init", "--task", "my-emotions", "--tiny", "--out", str(tmp_path / "m0"), "--database-url", url
    )
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "m0" / "dynaloop_model.json").read_text(encoding="utf-8"))
    assert written["task"] == "my-emotions" and written["family"] == "multi_label"
    assert written["exclusive_labels"] == ["neutral"] and "exclusive labels ['neutral']" in result.output
    missing = run("model", "init", "--task", "nobody", "--tiny", "--out", str(tmp_path / "m1"), "--database-url", url)
    assert missing.exit_code == 1
    said = " ".join(missing.output.split())
    assert "nobody is neither a file, an example task (no example task 'nobody'" in said
    assert f"nor a task in the database {url}" in said

    plain = run(
        "model", "init", "--labels", "joy,anger,neutral", "--multi-label", "--tiny", "--out", str(tmp_path / "m2")
    )
    assert plain.exit_code == 0, plain.output
    assert "note: no exclusive labels: every label may be predicted together with others" in " ".join(
        plain.output.split()
    )
    named = run(
        "model", "init", "--labels", "joy,anger,neutral", "--multi-label", "--exclusive-labels", "neutral", "--tiny",
        "--out", str(tmp_path / "m3"),
    )  # fmt: skip
    assert named.exit_code == 0 and "note:" not in named.output
    assert json.loads((tmp_path / "m3" / "dynaloop_model.json").read_text(encoding="utf-8"))["exclusive_labels"] == [
        "neutral"
    ]
    wrong = run("model", "init", "--labels", "joy,anger", "--multi-label", "--exclusive-labels", "calm", "--tiny",
                "--out", str(tmp_path / "m4"))  # fmt: skip
    assert wrong.exit_code == 1 and "--exclusive-labels ['calm'] are not among the labels" in wrong.output
