"""The Streamlit page tests' API: the real app (``dynaloop.api.app.create_app``) on a SQLite database,
served over HTTP, with keyword stub model servers (tests/stub_model_server.py, plus ``/inspect``).

``live`` (a fixture) empties the database of the module's app for each test and sets up state
through the API (an admin client) or the domain functions: users, tasks from the shipped
example YAML, rounds with prompts, examples written and labelled as a writer and validators
would. The pages get a :class:`PageClient`: the real :class:`~frontend.client.ApiClient` that
records what it sends and can fail once on demand (:meth:`PageClient.fail_next`).

The module is a pytest plugin (listed in tests/conftest.py's ``pytest_plugins``): its three
fixtures, ``live``, ``live_server`` (one per test module) and ``stub_models``, are there for every test.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import httpx
import pytest
import yaml
from fastapi import FastAPI, HTTPException
from sqlalchemy import select

from dynaloop.api.app import create_app
from frontend.client import ApiClient, ApiError, Round, Task
from services.db.engine import session_scope
from services.db.migrate import upgrade
from services.db.models import Example, TaskRole, User, ValidationBatch, ValidationBatchItem
from services.domain import members, tasks, users
from services.settings import Settings
from tests.conftest import empty_tables, example_yaml, free_port, register_model_server
from tests.stub_model_server import NEGATIVE_WORDS, POSITIVE_WORDS, ThreadedServer, create_stub_app

if TYPE_CHECKING:
    # Imported where an AppTest is made: the plugin loads for every test, also in a base install
    # without the webapp extra (.ci/base_install).
    from streamlit.testing.v1 import AppTest

APP_FILE = Path(__file__).resolve().parents[1] / "frontend" / "app.py"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Where the collected tests imported Streamlit's AppTest: its scan of the installed
    packages for Streamlit components, which AppTest runs again for every app it makes, is
    done once per process. The scan reads the metadata of every installed distribution (about
    175 here): 0.69 s of each AppTest's first run, a fifth of the page tests' time
    (test_frontend_researcher.py: 20.6 of 97.7 s under cProfile). The packages installed do
    not change while the tests run."""
    if "streamlit.testing.v1" not in sys.modules:
        return
    from streamlit.components.v2 import manifest_scanner

    scan = manifest_scanner.scan_component_manifests
    if not hasattr(scan, "cache_info"):
        manifest_scanner.scan_component_manifests = functools.cache(scan)


HOSTILE = "<script>alert(1)</script> **bold** [link](http://x) <img src=x onerror=alert(2)>"
HOSTILE_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt; **bold** [link](http://x) &lt;img src=x onerror=alert(2)&gt;"


class Sent(NamedTuple):
    method: str
    path: str
    body: Any  # the JSON body
    key: str | None  # the Idempotency-Key
    params: dict[str, Any]  # the query string


class PageClient(ApiClient):
    """The real client, remembering every request it sends; :meth:`fail_next` makes the next
    call of one method raise an error instead of reaching the API."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[Sent] = []

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        params = {k: v for k, v in (kwargs.get("params") or {}).items() if v is not None}
        self.sent.append(Sent(method, path, kwargs.get("json_body"), kwargs.get("key"), params))
        return super()._request(method, path, **kwargs)

    def fail_next(self, method: str, error: ApiError) -> None:
        def fail(*args: Any, **kwargs: Any) -> Any:
            del self.__dict__[method]  # once; then the real method again
            raise error

        setattr(self, method, fail)

    def requests(self, method: str, path: str) -> list[Sent]:
        """What was sent with ``method`` to paths matching the regular expression ``path``."""
        return [s for s in self.sent if s.method == method and re.fullmatch(path, s.path)]


def stub_app(labels: list[str], multi_label: bool) -> FastAPI:
    """The keyword stub model plus ``POST /inspect``: keyword scores, honouring the stub's mode."""
    app = create_stub_app(labels, multi_label)

    @app.post("/inspect")
    def inspect(body: dict[str, Any]) -> dict[str, Any]:
        if app.state.stub["mode"] == "fail":
            raise HTTPException(500, "stub model failure")
        words = re.findall(r"\w+|[^\w\s]", str(body["text"]).lower())
        scores = [0.6 if w in POSITIVE_WORDS else -0.6 if w in NEGATIVE_WORDS else 0.05 for w in words]
        tokens = [{"token": w, "score": s} for w, s in zip(words, scores, strict=True)]
        return {"tokens": [{"token": "[CLS]", "score": 0.0}, *tokens, {"token": "[SEP]", "score": 0.0}]}

    return app


class StubModels:
    """One stub model server per label set, started on first use."""

    def __init__(self) -> None:
        self.servers: dict[tuple[tuple[str, ...], bool], ThreadedServer] = {}

    def url(self, labels: list[str], multi_label: bool = False) -> str:
        key = (tuple(labels), multi_label)
        if key not in self.servers:
            self.servers[key] = ThreadedServer(stub_app(labels, multi_label), free_port()).start()
        return self.servers[key].url

    def mode(self, mode: str) -> None:
        """normal, fail, ... (tests/stub_model_server.py) for every stub."""
        for server in self.servers.values():
            # A generous timeout, as in tests/conftest.py's ``reset_stubs``: on a loaded machine
            # httpx's default of 5 s timed out there, though the stub answers.
            httpx.post(f"{server.url}/admin/mode", json={"mode": mode}, timeout=60).raise_for_status()


@pytest.fixture(scope="session")
def stub_models() -> Iterator[StubModels]:
    stubs = StubModels()
    yield stubs
    for server in stubs.servers.values():
        server.stop()


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory, stub_models: StubModels) -> Iterator[tuple[Any, str]]:
    """One app per test module on its own SQLite database, served over HTTP: (app, its URL).
    Rate limits are off, since a module's tests send many requests from one address."""
    folder = tmp_path_factory.mktemp("frontend")
    url = f"sqlite:///{folder / 'dynaloop.db'}"
    upgrade(url)
    settings = Settings(
        database_url=url,
        environment="test",
        secret_key="test-suite-secret-key-0123456789",
        data_dir=folder / "data",
        model_retries=0,
        model_timeout_s=5.0,
        retry_after_s=5,
        rate_limit_per_token="none",
        rate_limit_per_ip="none",
    )
    app = create_app(settings)
    server = ThreadedServer(app, free_port()).start()
    yield app, server.url
    server.stop()
    app.state.model_client.close()
    app.state.engine.dispose()


class LiveApi:
    """The module's app for one test, and the ways to set up its state (``admin`` is a client
    of the set-up user ``root``, an admin)."""

    def __init__(self, app: Any, url: str, stubs: StubModels) -> None:
        self.app, self.url, self.stubs = app, url, stubs
        self.tokens: dict[str, tuple[int, str]] = {}  # username -> (token id, token)
        self.researchers: list[str] = []  # they own the tasks set up here (task ownership)
        self.quiz_answers: dict[str, list[str]] = {}  # task -> the right answers
        self._clients: dict[str, ApiClient] = {}  # for set-up, one per user
        self._page_clients: list[PageClient] = []
        self.user("root", "admin")
        self.admin = self.api("root")

    def user(self, username: str, *roles: str, password: str | None = None) -> str:
        """A user with a fresh API token (returned)."""
        with session_scope(self.app.state.sessionmaker) as session:
            user = users.create_user(session, None, username, list(roles), password=password)
            if "researcher" in roles:
                self.researchers.append(username)
            token, plain = users.issue_token(session, None, user)
            self.tokens[username] = (token.id, plain)
        return plain

    def client(self, token: str | None = None) -> PageClient:
        """A new client for a page (closed after the test)."""
        client = PageClient(self.url, token, timeout=30)
        self._page_clients.append(client)
        return client

    def as_user(self, username: str) -> PageClient:
        """A new client with ``username``'s token."""
        return self.client(self.tokens[username][1])

    def api(self, username: str) -> ApiClient:
        """``username``'s client for setting up state (one per user, kept open)."""
        if username not in self._clients:
            self._clients[username] = ApiClient(self.url, self.tokens[username][1], timeout=30)
        return self._clients[username]

    def revoke(self, username: str) -> None:
        with session_scope(self.app.state.sessionmaker) as session:
            token = users.get_token(session, self.tokens[username][0])
            users.revoke_token(session, users.get_user(session, "root"), token)

    def model_server(self, url: str, *, tasks: Sequence[str] = ()) -> str:
        """Register ``url`` as a model server (as an admin does), grant it to ``tasks``, and
        return its name."""
        return register_model_server(self.app, url, tasks=tasks)

    def task(self, example: str, **overrides: Any) -> Task:
        """A shipped example task, with top-level YAML keys replaced (None drops one), created by
        the admin and owned by the researchers made so far (task ownership)."""
        text = example_yaml(example, **overrides)
        quiz = yaml.safe_load(text).get("onboarding_quiz")
        task = self.admin.create_task(text)
        with session_scope(self.app.state.sessionmaker) as session:
            created = tasks.get_task(session, task["name"])
            for username in self.researchers:
                members.set_member(session, None, created, username, TaskRole.owner)
        self.quiz_answers[task["name"]] = [q["answer"] for q in quiz["questions"]] if quiz else []
        return task

    def round(
        self,
        task: str,
        prompts: Sequence[str | dict[str, Any]] = (),
        *,
        target_label_mode: str = "balanced",
        status: str = "collecting",
    ) -> Round:
        """Open the task's next round with its stub model and ``prompts`` (dicts: text and
        metadata); without prompts every assignment is written from scratch."""
        definition = self.admin.task(task)["definition"]
        endpoint = self.stubs.url(definition["labels"], definition["family"] == "multi_label")
        round_ = self.admin.open_round(
            task,
            model_servers=[self.model_server(endpoint)],
            target_label_mode=target_label_mode,
            no_prompt_fraction=0.0 if prompts else 1.0,
        )
        if prompts:
            rows = [{"text": p} if isinstance(p, str) else p for p in prompts]
            self.admin.import_prompts(round_["id"], "\n".join(json.dumps(r) for r in rows).encode())
        if status != "collecting":
            round_ = self.admin.set_round_status(round_["id"], status)
        return round_

    def writer(self, username: str, task: str) -> ApiClient:
        """``username``'s client, the user made a writer (with the task's quiz passed) if new."""
        if username not in self.tokens:
            self.user(username, "writer")
        client = self.api(username)
        if self.quiz_answers.get(task) and not client.quiz(task)["passed"]:
            client.answer_quiz(task, self.quiz_answers[task])
        return client

    def example(
        self,
        round_: Round,
        text: str,
        *,
        writer: str = "wendy",
        target: str | None = None,
        target_span: list[int] | None = None,
    ) -> int:
        """An example written through the API: one attempt, confirmed if it fooled the model."""
        client = self.writer(writer, round_["task"])
        if target is None and round_["target_label_mode"] == "writer_choice":
            target = self.admin.task(round_["task"])["definition"]["labels"][0]
        assignment = client.start_assignment(round_["id"], target)
        attempt = client.attempt(assignment["id"], text, target_span=target_span)
        if attempt["fooled"]:
            client.confirm(attempt["id"], True)
        return client.submit_example(assignment["id"], attempt["id"])["id"]

    def close(self) -> None:
        for client in [*self._clients.values(), *self._page_clients]:
            client.close()

    def item_key(self, username: str, example_id: int) -> str:
        """The id under which ``example_id`` was last served to ``username`` (validators see only
        these opaque ids; the test reads which example each stands for from the database)."""
        with session_scope(self.app.state.sessionmaker) as session:
            key = session.scalar(
                select(ValidationBatchItem.item_key)
                .join(ValidationBatch, ValidationBatchItem.batch_id == ValidationBatch.id)
                .join(User, ValidationBatch.validator_id == User.id)
                .where(User.username == username, ValidationBatchItem.example_id == example_id)
                .order_by(ValidationBatchItem.id.desc())
                .limit(1)
            )
        assert key is not None, f"example {example_id} was never served to {username}"
        return key

    def label_as(self, username: str, example_id: int, label: str | list[str]) -> None:
        """``username`` labels ``example_id`` as a validator does: their batch first, then the
        example's item in it."""
        with session_scope(self.app.state.sessionmaker) as session:
            round_id = session.scalars(select(Example.round_id).where(Example.id == example_id)).one()
        self.api(username).validation_batch(round_id)
        self.api(username).validate(self.item_key(username, example_id), label)

    def label_all(self, username: str, round_id: int, labels: dict[int, str | list[str]]) -> None:
        """``username`` labels every batch served in the round, each example with ``labels``
        (examples by id, in id order within a batch), until none is left."""
        client = self.api(username)
        while True:
            batch = client.validation_batch(round_id)
            if not batch["data"]:
                return
            with session_scope(self.app.state.sessionmaker) as session:
                behind = dict(
                    session.execute(
                        select(ValidationBatchItem.item_key, ValidationBatchItem.example_id).where(
                            ValidationBatchItem.item_key.in_([item["item_id"] for item in batch["data"]])
                        )
                    ).all()
                )
            for key, example_id in sorted(behind.items(), key=lambda pair: pair[1] or 0):
                assert example_id is not None, "label_all is for tasks without control items"
                client.validate(key, labels[example_id])

    def labels_of(self, example_id: int) -> dict[str, list[str]]:
        """The labels the example has, by validator."""
        return {v["validator"]: v["label"] for v in self.admin.example(example_id)["validations"]}


@pytest.fixture
def live(live_server: tuple[Any, str], stub_models: StubModels) -> Iterator[LiveApi]:
    """The module's app with every table emptied, and stub models that answer normally."""
    app, url = live_server
    empty_tables(app.state.settings.database_url)
    stub_models.mode("normal")
    api = LiveApi(app, url, stub_models)
    yield api
    api.close()


# --- AppTest helpers ------------------------------------------------------------------


def signed_in_app(
    live: LiveApi, username: str, page: str | None = None, client: PageClient | None = None, timeout: float = 30
) -> AppTest:
    """The app with ``username`` signed in (using ``client``, default a new one), after one run
    (and on ``page``, e.g. ``"app_pages/validator.py"``, when given)."""
    client = client or live.as_user(username)
    from streamlit.testing.v1 import AppTest

    user = live.api(username).me()
    at = AppTest.from_file(str(APP_FILE), default_timeout=timeout)
    at.session_state["client"] = client
    at.session_state["token"] = live.tokens[username][1]
    at.session_state["user"] = user
    at.session_state["roles"] = list(user["roles"])
    at.run()
    if page is not None:
        at.switch_page(page).run()
    return at


def texts(elements: Any) -> list[str]:
    """The values of alerts / markdown elements as a reader sees them (backslash escapes of
    ``render.escape_markdown`` removed)."""
    return [re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", str(element.value)) for element in elements]


def html_of(at: AppTest) -> str:
    """Every ``st.html`` block of the page (where user text is rendered), joined."""
    return "\n".join(str(getattr(block, "value", "")) for block in at.get("html"))


def markdown_of(at: AppTest) -> str:
    """Everything the page passed through the Markdown renderer (markdown, captions, alerts,
    widget labels), joined: user text must never be in it unescaped."""
    parts: list[str] = []
    for kind in ("markdown", "caption", "error", "warning", "info", "success", "title", "subheader"):
        parts.extend(str(getattr(element, "value", "")) for element in at.get(kind))
    for kind in ("radio", "button", "text_area", "text_input", "checkbox", "selectbox", "pills", "multiselect"):
        parts.extend(str(getattr(widget, "label", "")) for widget in at.get(kind))
        for widget in at.get(kind):
            parts.extend(str(option) for option in getattr(widget, "options", []) or [])
    return "\n".join(parts)
