"""The pseudonym key (DYNALOOP_SECRET_KEY): refused in production when it is a placeholder,
warned about loudly in development, and never the placeholder in the demo."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from dynaloop.api.app import create_app
from dynaloop.cli import app as cli
from dynaloop.demo import SECRET_KEY_FILE, with_demo_secret
from services.settings import DEFAULT_SECRET, Settings

runner = CliRunner()


def _settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'secrets.db'}", **values)


@pytest.mark.parametrize("secret", [DEFAULT_SECRET, "change-me", "short-but-real"])
def test_production_refuses_a_placeholder_or_short_secret(tmp_path: Path, secret: str) -> None:
    with pytest.raises(ValidationError, match="DYNALOOP_SECRET_KEY"):
        _settings(tmp_path, environment="production", secret_key=secret)


def test_the_api_command_refuses_to_start_in_production_with_the_default_secret(tmp_path: Path) -> None:
    # The command sets DYNALOOP_FREEZE_GC_AT_STARTUP for its server; listed here (None: unset while
    # it runs), the runner puts the variable back as it was, so no later test's Settings read it.
    env = {
        "DYNALOOP_ENVIRONMENT": "production",
        "DYNALOOP_DATA_DIR": str(tmp_path),
        "DYNALOOP_FREEZE_GC_AT_STARTUP": None,
    }
    result = runner.invoke(cli, ["api"], env=env)
    assert result.exit_code == 2 and "DYNALOOP_SECRET_KEY" in result.output
    assert not (tmp_path / "dynaloop.db").exists()  # refused before touching the database


def test_the_api_warns_loudly_in_development_with_the_default_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="dynaloop.api.app"):
        create_app(_settings(tmp_path))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("DYNALOOP_SECRET_KEY is a placeholder" in w and "recomputed" in w for w in warnings), warnings
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dynaloop.api.app"):
        create_app(_settings(tmp_path, secret_key="a-long-random-value-for-this-test"))
    assert not [r for r in caplog.records if "DYNALOOP_SECRET_KEY" in r.getMessage()]


def test_the_demo_makes_its_own_random_secret_and_keeps_it(tmp_path: Path) -> None:
    first = with_demo_secret(_settings(tmp_path / "one"))
    assert first.secret_key != DEFAULT_SECRET and len(first.secret_key) >= 32
    assert first.placeholder_secret_warning is None
    key_file = tmp_path / "one" / SECRET_KEY_FILE
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600  # its owner's only
    # The next run of the same demo keeps it (pseudonyms stay the same); another demo gets its own.
    assert with_demo_secret(_settings(tmp_path / "one")).secret_key == first.secret_key
    assert with_demo_secret(_settings(tmp_path / "two")).secret_key != first.secret_key


def test_the_demo_keeps_a_secret_set_in_the_environment(tmp_path: Path) -> None:
    chosen = "an-operator-chosen-secret-value"
    assert with_demo_secret(_settings(tmp_path, secret_key=chosen)).secret_key == chosen
    assert not (tmp_path / SECRET_KEY_FILE).exists()
