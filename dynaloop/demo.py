"""The demo set-up: a DynaSent-style task on SQLite with prompts and one user per role.

Idempotent: running it again keeps the data and issues fresh tokens for the demo users.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select

from services.db.engine import make_engine, make_sessionmaker, session_scope
from services.db.migrate import upgrade
from services.db.models import Round, RoundStatus, Task, User
from services.domain import rounds, tasks, users
from services.security import hash_password
from services.settings import Settings
from services.taskdef import example_path

DEMO_TASK = "dynasent-r2"
DEMO_PROMPTS = Path(__file__).parent / "demo_prompts.jsonl"
# Demo accounts: (role, username, roles). Their password is "<username>-demo" -- a demo only.
DEMO_USERS = [
    ("admin", "admin", ["admin", "researcher"]),
    ("researcher", "researcher", ["researcher"]),
    ("writer", "writer", ["writer"]),
    *[("validator", f"validator{i}", ["validator"]) for i in range(1, 6)],
]


@dataclass
class DemoLogin:
    role: str
    username: str
    password: str
    token: str


@dataclass
class DemoSetup:
    database_url: str
    task: str
    round_id: int
    round_number: int
    prompts: int
    model_endpoints: list[str]
    logins: list[DemoLogin] = field(default_factory=list)


def set_up_demo(settings: Settings, model_endpoints: list[str]) -> DemoSetup:
    url = settings.resolved_database_url
    upgrade(url)
    engine = make_engine(url)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            task = session.scalar(select(Task).where(Task.name == DEMO_TASK))
            if task is None:
                task = tasks.create_task(session, None, example_path(DEMO_TASK).read_text(encoding="utf-8"))
            round_ = session.scalar(select(Round).where(
                Round.task_id == task.id, Round.status.in_([RoundStatus.collecting, RoundStatus.validating])))
            if round_ is None:
                round_ = rounds.create_round(session, None, task, model_endpoints=model_endpoints)
            elif model_endpoints:
                rounds.set_model_endpoints(session, None, round_, model_endpoints)
            rounds.import_prompts(session, None, round_, DEMO_PROMPTS.read_bytes(), "jsonl")
            logins = []
            for role, username, roles in DEMO_USERS:
                password = f"{username}-demo"
                user = session.scalar(select(User).where(User.username == username))
                if user is None:
                    user = users.create_user(session, None, username, roles, password=password)
                else:
                    user.password_hash = hash_password(password)
                _, token = users.issue_token(session, None, user, name="demo", expires_in_days=30)
                logins.append(DemoLogin(role, username, password, token))
            prompt_count = len(list(session.scalars(select(rounds.Prompt.id).where(rounds.Prompt.round_id == round_.id))))
            return DemoSetup(url, task.name, round_.id, round_.number, prompt_count,
                             list(round_.model_endpoints), logins)
    finally:
        engine.dispose()
