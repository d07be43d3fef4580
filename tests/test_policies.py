"""The policies of services/authorization.py, one user and one object at a time (no database:
the objects are built in memory). The HTTP side, every route against every role, is
tests/test_authorization.py."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from services import authorization
from services.authorization import (
    AssignmentPolicy,
    AttemptPolicy,
    AttentionCheckPolicy,
    BuildPolicy,
    DatasetPolicy,
    ExamplePolicy,
    JobPolicy,
    LedgerPolicy,
    ModelPolicy,
    ModelServerPolicy,
    OnboardingPolicy,
    PayoutBatchPolicy,
    Policy,
    RoundPolicy,
    StudyLinkPolicy,
    StudySessionPolicy,
    TaskPolicy,
    TokenPolicy,
    UserPolicy,
    WorkerPolicy,
    allows,
    authorize,
    study_scope,
)
from services.db.models import (
    ApiToken,
    Assignment,
    Attempt,
    AttentionCheckAnswer,
    Example,
    Job,
    LedgerEntry,
    PayoutBatch,
    Role,
    Round,
    StudyLink,
    StudyRole,
    StudySession,
    Task,
    TaskMember,
    TaskRole,
    User,
)
from services.errors import (
    Forbidden,
    NotFound,
    missing_attention_check,
    missing_example,
    missing_job,
    missing_ledger_entry,
    missing_payout_batch,
    missing_round,
    missing_task,
)


def user(user_id: int, *roles: str) -> User:
    return User(id=user_id, username=f"user{user_id}", roles=list(roles))


# Rita created the task and owns it; Mia is a member; Oscar is a researcher of another group.
TASK = Task(
    id=1,
    name="dynasent-r2",
    created_by_id=10,
    members=[TaskMember(user_id=10, role=TaskRole.owner), TaskMember(user_id=11, role=TaskRole.member)],
)
ROUND = Round(id=2, number=1, task=TASK)
WENDYS_ASSIGNMENT = Assignment(id=5, writer_id=20, round=ROUND)
WENDYS_ATTEMPT = Attempt(id=7, assignment=WENDYS_ASSIGNMENT)
WENDYS_EXAMPLE = Example(id=3, writer_id=20, round=ROUND)
HARVESTED_EXAMPLE = Example(id=4, writer_id=None, round=ROUND)
JOB = Job(id=9, task=TASK)
LINK = StudyLink(id=6, task=TASK, round=ROUND)
ENTRY = LedgerEntry(id=8, task=TASK)
BATCH = PayoutBatch(id=15, task=TASK, link=LINK)
WENDYS_STUDY = StudySession(id=12, link=LINK, user_id=20)
WENDYS_CHECK = AttentionCheckAnswer(id=14, task_id=1, writer_id=20, slot=1)
WENDY = user(20, "writer", "validator")
WALT = user(21, "writer")
VERA = user(30, "validator")
RITA = user(10, "researcher")
MIA = user(11, "researcher")
OSCAR = user(12, "researcher")
HANK = user(13, "researcher", "writer")  # not on the task, but sees it as a writer
CORA = user(40, "client")
ADA = user(50, "admin")
NOBODY = user(60)


def refusal(who: User, policy: Policy) -> tuple[type[Exception], str] | None:
    try:
        authorize(who, policy)
    except (Forbidden, NotFound) as exc:
        return type(exc), exc.message
    return None


# --- the role half: the same words as before the policies ----------------------------------


def test_a_missing_role_is_403_naming_the_role_and_the_callers_roles() -> None:
    assert refusal(WALT, TaskPolicy.manage(TASK)) == (Forbidden, "this needs the researcher role; your roles: writer")
    assert refusal(NOBODY, RoundPolicy.write()) == (Forbidden, "this needs the writer role; your roles: none")
    assert refusal(RITA, RoundPolicy.validate(ROUND)) == (
        Forbidden,
        "this needs the validator role; your roles: researcher",
    )
    assert refusal(VERA, UserPolicy.manage()) == (Forbidden, "this needs the admin role; your roles: validator")
    assert refusal(WENDY, DatasetPolicy.read(TASK)) == (
        Forbidden,
        "reading datasets needs the client or researcher role; your roles: writer, validator",
    )


def test_an_admin_passes_every_role_check() -> None:
    for policy in (
        TaskPolicy.create(),
        TaskPolicy.manage(TASK),
        RoundPolicy.write(ROUND),
        RoundPolicy.validate(),
        OnboardingPolicy.take(TASK),
        DatasetPolicy.read(TASK),
        UserPolicy.manage(),
        JobPolicy.view(JOB),
    ):
        assert refusal(ADA, policy) is None, policy


def test_workers_clients_admins_and_the_tasks_researchers_read_a_task_and_its_rounds() -> None:
    for who in (WALT, VERA, CORA, ADA, RITA, MIA, HANK):
        assert allows(who, TaskPolicy.read(TASK)) and allows(who, RoundPolicy.read(ROUND)), who.username
    assert all(allows(who, UserPolicy.me()) for who in (WALT, OSCAR, NOBODY))


def test_another_groups_task_and_round_read_as_missing() -> None:
    """Oscar (and a user with no role) learns nothing: the words of a missing task or round."""
    for who in (OSCAR, NOBODY):
        assert refusal(who, TaskPolicy.read(TASK)) == (NotFound, missing_task("dynasent-r2").message)
        assert refusal(who, RoundPolicy.read(ROUND)) == (NotFound, missing_round(2).message)


def test_clients_read_every_tasks_datasets_researchers_their_own() -> None:
    for who in (CORA, RITA, MIA, ADA):
        assert refusal(who, DatasetPolicy.read(TASK)) is None, who.username
    assert refusal(OSCAR, DatasetPolicy.read(TASK)) == (NotFound, missing_task("dynasent-r2").message)
    assert not allows(VERA, DatasetPolicy.read(TASK)) and not allows(HANK, DatasetPolicy.read(TASK))


# --- the object half -------------------------------------------------------------------------


def test_another_writers_assignment_and_attempt_are_reported_missing() -> None:
    assert refusal(WENDY, AssignmentPolicy.use(WENDYS_ASSIGNMENT)) is None
    assert refusal(WALT, AssignmentPolicy.use(WENDYS_ASSIGNMENT)) == (NotFound, "no assignment 5 of yours")
    assert refusal(WENDY, AttemptPolicy.use(WENDYS_ATTEMPT)) is None
    assert refusal(WALT, AttemptPolicy.use(WENDYS_ATTEMPT)) == (NotFound, "no attempt 7 of yours")
    # Even an admin does not write into another writer's assignment.
    assert refusal(ADA, AssignmentPolicy.use(WENDYS_ASSIGNMENT)) == (NotFound, "no assignment 5 of yours")


def test_the_role_comes_before_the_object() -> None:
    assert refusal(VERA, AssignmentPolicy.use(WENDYS_ASSIGNMENT)) == (
        Forbidden,
        "this needs the writer role; your roles: validator",
    )


def test_a_validator_never_labels_their_own_example() -> None:
    assert refusal(WENDY, ExamplePolicy.validate(WENDYS_EXAMPLE)) == (
        Forbidden,
        "you wrote this example; validators never label their own examples",
    )
    assert refusal(VERA, ExamplePolicy.validate(WENDYS_EXAMPLE)) is None
    assert refusal(WENDY, ExamplePolicy.validate(HARVESTED_EXAMPLE)) is None  # nobody wrote it


def test_another_writers_attention_check_is_reported_missing() -> None:
    assert refusal(WENDY, AttentionCheckPolicy.answer(WENDYS_CHECK)) is None
    assert refusal(WALT, AttentionCheckPolicy.answer(WENDYS_CHECK)) == (NotFound, missing_attention_check(14).message)
    # Not even an admin answers a writer's check for them; a validator lacks the role.
    assert refusal(ADA, AttentionCheckPolicy.answer(WENDYS_CHECK)) == (NotFound, missing_attention_check(14).message)
    assert refusal(VERA, AttentionCheckPolicy.answer(WENDYS_CHECK)) == (
        Forbidden,
        "this needs the writer role; your roles: validator",
    )


def test_tokens_for_yourself_or_as_an_admin() -> None:
    assert refusal(WALT, TokenPolicy.issue(WALT)) is None
    assert refusal(WALT, TokenPolicy.issue(WENDY)) == (Forbidden, "only an admin can create tokens for another user")
    assert refusal(ADA, TokenPolicy.issue(WENDY)) is None
    wendys_token = ApiToken(id=12, user_id=WENDY.id)
    assert refusal(WENDY, TokenPolicy.revoke(wendys_token)) is None
    assert refusal(WALT, TokenPolicy.revoke(wendys_token)) == (NotFound, "no token 12")
    assert refusal(ADA, TokenPolicy.revoke(wendys_token)) is None


# --- the shape of the module -----------------------------------------------------------------

POLICY_CLASSES = [
    AssignmentPolicy,
    AttemptPolicy,
    AttentionCheckPolicy,
    BuildPolicy,
    DatasetPolicy,
    ExamplePolicy,
    JobPolicy,
    LedgerPolicy,
    ModelPolicy,
    ModelServerPolicy,
    OnboardingPolicy,
    PayoutBatchPolicy,
    RoundPolicy,
    StudyLinkPolicy,
    StudySessionPolicy,
    TaskPolicy,
    TokenPolicy,
    UserPolicy,
    WorkerPolicy,
]
SAMPLES: dict[str, Any] = {
    "Task": TASK,
    "Round": ROUND,
    "Assignment": WENDYS_ASSIGNMENT,
    "Attempt": WENDYS_ATTEMPT,
    "Example": WENDYS_EXAMPLE,
    "Job": JOB,
    "User": WENDY,
    "ApiToken": ApiToken(id=1, user_id=20),
    "StudyLink": LINK,
    "StudySession": WENDYS_STUDY,
    "AttentionCheckAnswer": WENDYS_CHECK,
    "LedgerEntry": ENTRY,
    "PayoutBatch": BATCH,
}


def _actions() -> list[tuple[str, Callable[..., Policy], Any]]:
    """Every policy method, with a sample of the object it takes (None for those that take none)."""
    found = []
    for cls in POLICY_CLASSES:
        for name, method in vars(cls).items():
            if not isinstance(method, staticmethod):
                continue
            parameters = list(inspect.signature(method.__func__).parameters.values())
            sample = None
            if parameters:
                (parameter,) = parameters
                assert parameter.default is None, f"{cls.__name__}.{name}: the object must be optional"
                sample = SAMPLES[str(parameter.annotation).split(" | ")[0]]
            found.append((f"{cls.__name__}.{name}", getattr(cls, name), sample))
    return found


def test_every_policy_module_class_is_tested() -> None:
    classes = {
        name
        for name, value in vars(authorization).items()
        if name.endswith("Policy") and name != "Policy" and isinstance(value, type)
    }
    assert classes == {cls.__name__ for cls in POLICY_CLASSES}


@pytest.mark.parametrize(("name", "action", "sample"), _actions(), ids=[a[0] for a in _actions()])
def test_without_its_object_a_policy_is_its_role_half(name: str, action: Callable[..., Policy], sample: Any) -> None:
    """`dynaloop.api.deps.allowed` checks the policy built without its object before the route looks
    the object up: it must ask for the same roles as the full policy."""
    without = action()
    assert without.rule is None, name
    if sample is not None:
        full = action(sample)
        assert (full.roles, full.needs) == (without.roles, without.needs), name


# Every researcher action on a task's things, and the 404 it answers to another group's researcher.
MANAGED = [
    ("TaskPolicy.manage", TaskPolicy.manage(TASK), missing_task("dynasent-r2")),
    ("RoundPolicy.manage", RoundPolicy.manage(ROUND), missing_round(2)),
    ("WorkerPolicy.judge", WorkerPolicy.judge(TASK), missing_task("dynasent-r2")),
    ("BuildPolicy.create", BuildPolicy.create(ROUND), missing_round(2)),
    ("ExamplePolicy.read", ExamplePolicy.read(WENDYS_EXAMPLE), missing_example(3)),
    ("JobPolicy.start", JobPolicy.start(TASK), missing_task("dynasent-r2")),
    ("JobPolicy.list", JobPolicy.list(TASK), missing_task("dynasent-r2")),
    ("JobPolicy.view", JobPolicy.view(JOB), missing_job(9)),
    ("ModelPolicy.list", ModelPolicy.list(TASK), missing_task("dynasent-r2")),
    ("StudyLinkPolicy.manage", StudyLinkPolicy.manage(LINK), NotFound("no study link 6")),
    ("LedgerPolicy.correct", LedgerPolicy.correct(ENTRY), missing_ledger_entry(8)),
    ("PayoutBatchPolicy.manage", PayoutBatchPolicy.manage(BATCH), missing_payout_batch(15)),
]


def test_a_study_session_is_its_workers_alone() -> None:
    """Whatever their roles (a worker from a platform has only the link's), the worker sees and
    finishes their own session; anyone else, an admin or the task's researcher included, is
    told it does not exist."""
    assert refusal(WENDY, StudySessionPolicy.own(WENDYS_STUDY)) is None
    assert refusal(user(20), StudySessionPolicy.own(WENDYS_STUDY)) is None  # no roles left: still theirs
    for who in (WALT, VERA, RITA, ADA, NOBODY):
        found = refusal(who, StudySessionPolicy.own(WENDYS_STUDY))
        assert found is not None and found[0] is NotFound and "12" in found[1], who.username


@pytest.mark.parametrize(("name", "policy", "missing"), MANAGED, ids=[m[0] for m in MANAGED])
def test_only_the_tasks_owners_members_and_admins_manage_it(name: str, policy: Policy, missing: NotFound) -> None:
    for who in (RITA, MIA, ADA):
        assert refusal(who, policy) is None, who.username
    # Another group's researcher: exactly what a missing object says.
    assert refusal(OSCAR, policy) == (NotFound, missing.message)
    # One who sees the task anyway (as a writer) is told who can add them.
    assert refusal(HANK, policy) == (
        Forbidden,
        "you are not a researcher of task 'dynasent-r2'; one of its owners can add you "
        "(PUT /api/v1/tasks/dynasent-r2/members/user13)",
    )
    # Writers, validators and clients lack the role: 403 before the task is looked at.
    for who in (WALT, VERA, CORA):
        assert refusal(who, policy) == (Forbidden, f"this needs the researcher role; your roles: {who.roles[0]}")


def test_only_owners_and_admins_change_who_is_on_a_task() -> None:
    assert refusal(RITA, TaskPolicy.manage_members(TASK)) is None
    assert refusal(ADA, TaskPolicy.manage_members(TASK)) is None
    assert refusal(MIA, TaskPolicy.manage_members(TASK)) == (
        Forbidden,
        "only the owners of task 'dynasent-r2' add and remove its researchers; you are a member",
    )
    assert refusal(OSCAR, TaskPolicy.manage_members(TASK)) == (NotFound, missing_task("dynasent-r2").message)
    assert refusal(WALT, TaskPolicy.manage_members(TASK)) == (
        Forbidden,
        "this needs the researcher role; your roles: writer",
    )


def test_a_member_without_the_researcher_role_manages_nothing() -> None:
    """A place on the task is not enough: an owner whose researcher role was taken away is
    refused by the role half, like any writer."""
    former = user(10, "writer")  # Rita's id: still an owner row
    assert refusal(former, TaskPolicy.manage(TASK)) == (Forbidden, "this needs the researcher role; your roles: writer")
    assert refusal(user(11), TaskPolicy.read(TASK)) == (NotFound, missing_task("dynasent-r2").message)


def test_only_admins_say_where_the_api_sends_requests() -> None:
    """Model servers: admins register them (the only addresses the API and its jobs call, and
    where admin tokens go); researchers may see them to choose one; crowdworkers and clients
    may do neither."""
    assert refusal(ADA, ModelServerPolicy.manage()) is None
    for who in (RITA, WALT, VERA, CORA, NOBODY):
        assert refusal(who, ModelServerPolicy.manage()) == (
            Forbidden,
            f"this needs the admin role; your roles: {', '.join(who.roles) or 'none'}",
        )
    for who in (RITA, ADA):
        assert refusal(who, ModelServerPolicy.list()) is None
    for who in (WALT, VERA, CORA):
        assert refusal(who, ModelServerPolicy.list()) == (
            Forbidden,
            f"this needs the researcher role; your roles: {who.roles[0]}",
        )


# --- link-made workers: their links' tasks and roles only (issue 26, item 2) --------------------

OTHER_TASK = Task(id=2, name="group-b-task", created_by_id=12, members=[TaskMember(user_id=12, role=TaskRole.owner)])
OTHER_ROUND = Round(id=3, number=1, task=OTHER_TASK)
OTHER_EXAMPLE = Example(id=33, writer_id=99, round=OTHER_ROUND)
A_EXAMPLE = Example(id=34, writer_id=99, round=ROUND)


def link_made(user_id: int, *sessions: tuple[int, StudyRole]) -> User:
    """A worker a study link made, with a study session on a link of each (task id, role)."""
    worker = User(id=user_id, username=f"prolific-{user_id}", roles=sorted({r.value for _, r in sessions}))
    worker.made_by_link = True
    worker.study_sessions = [
        StudySession(id=100 + i, user_id=user_id, link=StudyLink(id=200 + i, task_id=task_id, role=role))
        for i, (task_id, role) in enumerate(sessions)
    ]
    return worker


def test_a_link_made_worker_reaches_only_the_tasks_and_roles_of_its_links() -> None:
    validator = link_made(70, (TASK.id, StudyRole.validator))
    assert study_scope(validator) == {(TASK.id, Role.validator)}
    for policy in (
        TaskPolicy.read(TASK),
        RoundPolicy.read(ROUND),
        RoundPolicy.validate(ROUND),
        ExamplePolicy.validate(A_EXAMPLE),
    ):
        assert refusal(validator, policy) is None
    # Another group's task, round and example: the words of a missing one.
    assert refusal(validator, TaskPolicy.read(OTHER_TASK)) == (NotFound, missing_task("group-b-task").message)
    assert refusal(validator, RoundPolicy.read(OTHER_ROUND)) == (NotFound, missing_round(3).message)
    assert refusal(validator, RoundPolicy.validate(OTHER_ROUND)) == (NotFound, missing_round(3).message)
    assert refusal(validator, ExamplePolicy.validate(OTHER_EXAMPLE)) == (NotFound, missing_example(33).message)
    # A researcher-only action on their own task: the role half refuses, as for anyone.
    assert refusal(validator, TaskPolicy.manage(TASK))[0] is Forbidden  # type: ignore[index]

    writer = link_made(71, (TASK.id, StudyRole.writer))
    assert refusal(writer, RoundPolicy.write(ROUND)) is None
    assert refusal(writer, OnboardingPolicy.take(TASK)) is None
    assert refusal(writer, RoundPolicy.write(OTHER_ROUND)) == (NotFound, missing_round(3).message)
    assert refusal(writer, OnboardingPolicy.take(OTHER_TASK)) == (NotFound, missing_task("group-b-task").message)

    # A worker with the validator role from a link, writing through another: each task its role.
    both = link_made(72, (TASK.id, StudyRole.writer), (OTHER_TASK.id, StudyRole.validator))
    assert both.roles == ["validator", "writer"]
    assert refusal(both, RoundPolicy.write(ROUND)) is None
    assert refusal(both, RoundPolicy.validate(OTHER_ROUND)) is None
    assert refusal(both, RoundPolicy.validate(ROUND)) == (NotFound, missing_round(2).message)
    assert refusal(both, RoundPolicy.write(OTHER_ROUND)) == (NotFound, missing_round(3).message)


def test_accounts_an_admin_made_keep_the_reach_of_their_roles() -> None:
    assert study_scope(WENDY) == set()
    for policy in (RoundPolicy.write(OTHER_ROUND), RoundPolicy.validate(OTHER_ROUND), TaskPolicy.read(OTHER_TASK)):
        assert refusal(WENDY, policy) is None
