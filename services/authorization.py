"""Who may do what: the one place that decides access to the API's objects.

Every route asks :func:`authorize` with a policy built for its action and the object it acts
on, in the style of Argilla's ``authorize(user, DatasetPolicy.get(dataset))``::

    round_ = rounds.get_round(session, round_id)
    authorize(user, RoundPolicy.manage(round_))

A :class:`Policy` has two parts, checked in this order:

1. **The roles** the action needs (any one of them; an admin passes every role check, as
   :meth:`User.has_role` says). A policy built without its object, ``RoundPolicy.manage()``,
   is this part alone. The API checks it as a dependency (``api.deps.allowed``) before it
   looks the object up or reads the body, so a caller without the role gets 403 whatever id
   or body they sent, and never learns whether the object exists.
2. **A rule about the object**, once it is loaded: a writer's own assignment, a validator
   who did not write the example, a token's owner. Where another user's object must stay
   hidden, the rule answers 404 with the same message as a missing one.

A refusal raises :class:`~services.errors.Forbidden` (403) or :class:`~services.errors.NotFound`
(404), with a message that says what is needed.

Not decided here: who a token belongs to (authentication, ``api/deps.py``), and a worker's
standing on a task (qualified, onboarding quiz passed), which the work itself earns and loses
and which is checked with it (``services/domain/quality.py``).

**Task ownership** (the next step: a researcher manages only the tasks they created, admins
all). Every researcher action on a task, its rounds, workers, examples, builds, jobs and models
goes through :meth:`TaskPolicy.manage`, so the change is that method's rule::

    @staticmethod
    def manage(task: Task | None = None) -> Policy:
        return _needs(Role.researcher, None if task is None else _created_by_caller(task))

with ``_created_by_caller(task)`` refusing unless ``user.has_role(Role.admin) or
task.created_by_id == user.id`` (a 404 "no task ..." if other researchers' tasks should stay
hidden, else a 403). :meth:`TaskPolicy.read` and :meth:`DatasetPolicy.read` then decide
whether other researchers still see those tasks and pull their datasets; the lists of tasks and
of open rounds already keep only what :meth:`TaskPolicy.read` and :meth:`RoundPolicy.read`
allow (:func:`allows`), and a task's quiz answers are shown where :meth:`TaskPolicy.manage` allows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.db.models import ApiToken, Assignment, Attempt, Example, Job, Role, Round, Task, User
from services.errors import Forbidden, NotFound

Rule = Callable[[User], None]
"""A check of one user against one loaded object; raises Forbidden or NotFound to refuse."""


@dataclass(frozen=True)
class Policy:
    """What one action needs: one of ``roles`` (none: any signed-in user), then ``rule``."""

    roles: tuple[Role, ...] = ()
    needs: str = ""  # the refusal, without the caller's roles: "this needs the researcher role"
    rule: Rule | None = None


def authorize(user: User, policy: Policy) -> None:
    """Refuse (403 or 404) unless ``policy`` allows ``user``."""
    if policy.roles and not any(user.has_role(role) for role in policy.roles):
        raise Forbidden(f"{policy.needs}; your roles: {', '.join(user.roles) or 'none'}")
    if policy.rule is not None:
        policy.rule(user)


def allows(user: User, policy: Policy) -> bool:
    """Whether ``policy`` allows ``user``: for what a response shows, not for refusing."""
    try:
        authorize(user, policy)
    except (Forbidden, NotFound):
        return False
    return True


def _needs(role: Role, rule: Rule | None = None) -> Policy:
    return Policy((role,), f"this needs the {role.value} role", rule)


SIGNED_IN = Policy()


# --- rules about one object ----------------------------------------------------------------


def _self_or_admin(owner: User) -> Rule:
    def check(user: User) -> None:
        if owner.id != user.id and not user.has_role(Role.admin):
            raise Forbidden("only an admin can create tokens for another user")

    return check


def _own_token_or_admin(token: ApiToken) -> Rule:
    def check(user: User) -> None:
        if token.user_id != user.id and not user.has_role(Role.admin):
            raise NotFound(f"no token {token.id}")

    return check


def _own_assignment(assignment: Assignment) -> Rule:
    def check(user: User) -> None:
        if assignment.writer_id != user.id:
            raise NotFound(f"no assignment {assignment.id} of yours")

    return check


def _own_attempt(attempt: Attempt) -> Rule:
    def check(user: User) -> None:
        if attempt.assignment.writer_id != user.id:
            raise NotFound(f"no attempt {attempt.id} of yours")

    return check


def _written_by_someone_else(example: Example) -> Rule:
    def check(user: User) -> None:
        if example.writer_id is not None and example.writer_id == user.id:
            raise Forbidden("you wrote this example; validators never label their own examples")

    return check


# --- users and tokens --------------------------------------------------------------------------


class UserPolicy:
    @staticmethod
    def manage() -> Policy:
        """Create users and list them."""
        return _needs(Role.admin)

    @staticmethod
    def me() -> Policy:
        return SIGNED_IN


class TokenPolicy:
    @staticmethod
    def issue(owner: User | None = None) -> Policy:
        """Create an API token for ``owner``: yourself, or anyone if you are an admin."""
        return Policy(rule=None if owner is None else _self_or_admin(owner))

    @staticmethod
    def revoke(token: ApiToken | None = None) -> Policy:
        """Revoke your own token, or anyone's if you are an admin. Another user's token is
        reported as missing: nobody learns which token ids exist."""
        return Policy(rule=None if token is None else _own_token_or_admin(token))


# --- tasks, rounds and the researcher's work on them -------------------------------------------


class TaskPolicy:
    @staticmethod
    def create() -> Policy:
        return _needs(Role.researcher)

    @staticmethod
    def read(task: Task | None = None) -> Policy:
        """See a task's definition and rounds (quiz answers only where :meth:`manage` allows)."""
        return SIGNED_IN

    @staticmethod
    def manage(task: Task | None = None) -> Policy:
        """Everything a researcher does with a task: open and steer its rounds, import
        prompts, watch statistics, judge and (un)qualify its workers, read full example
        records, build rounds, run jobs, list models. Task ownership changes this rule."""
        return _needs(Role.researcher)


class RoundPolicy:
    @staticmethod
    def read(round_: Round | None = None) -> Policy:
        return TaskPolicy.read(round_.task if round_ is not None else None)

    @staticmethod
    def manage(round_: Round | None = None) -> Policy:
        """Change a round (status, model, prompts), watch it, build it: managing its task."""
        return TaskPolicy.manage(round_.task if round_ is not None else None)

    @staticmethod
    def write(round_: Round | None = None) -> Policy:
        """Take an assignment in the round."""
        return _needs(Role.writer)

    @staticmethod
    def validate(round_: Round | None = None) -> Policy:
        """Get a batch of the round's examples to label."""
        return _needs(Role.validator)


class OnboardingPolicy:
    @staticmethod
    def take(task: Task | None = None) -> Policy:
        """See and answer a task's onboarding quiz."""
        return _needs(Role.writer)


class WorkerPolicy:
    @staticmethod
    def judge(task: Task | None = None) -> Policy:
        """See validators' agreement with the majority, unqualify and requalify a task's workers."""
        return TaskPolicy.manage(task)


# --- the writer's and the validator's work -----------------------------------------------------


class AssignmentPolicy:
    @staticmethod
    def use(assignment: Assignment | None = None) -> Policy:
        """Read, attempt, submit, skip or inspect in an assignment: only its writer. Another
        writer's assignment is reported as missing: writers never see each other's work."""
        return _needs(Role.writer, None if assignment is None else _own_assignment(assignment))


class AttemptPolicy:
    @staticmethod
    def use(attempt: Attempt | None = None) -> Policy:
        """Confirm an attempt: only the writer of its assignment (others': as missing)."""
        return _needs(Role.writer, None if attempt is None else _own_attempt(attempt))


class ExamplePolicy:
    @staticmethod
    def read(example: Example | None = None) -> Policy:
        """The full record of an example (attempts, writer, every label): its task's managers."""
        return RoundPolicy.manage(example.round if example is not None else None)

    @staticmethod
    def validate(example: Example | None = None) -> Policy:
        """Label an example: validators, never its writer."""
        return _needs(Role.validator, None if example is None else _written_by_someone_else(example))


# --- what a round becomes: builds, datasets, jobs, models --------------------------------------


class BuildPolicy:
    @staticmethod
    def create(round_: Round | None = None) -> Policy:
        """Build a closed round (aggregation, agreement, splits)."""
        return RoundPolicy.manage(round_)


class DatasetPolicy:
    @staticmethod
    def read(task: Task | None = None) -> Policy:
        """Pull a built round's splits and its report: REST clients and researchers."""
        return Policy((Role.client, Role.researcher), "reading datasets needs the client or researcher role")


class JobPolicy:
    @staticmethod
    def start(task: Task | None = None) -> Policy:
        """Start a train, evaluate or promote job for a task."""
        return TaskPolicy.manage(task)

    @staticmethod
    def list(task: Task | None = None) -> Policy:
        return TaskPolicy.manage(task)

    @staticmethod
    def view(job: Job | None = None) -> Policy:
        return TaskPolicy.manage(job.task if job is not None else None)


class ModelPolicy:
    @staticmethod
    def list(task: Task | None = None) -> Policy:
        """The task's model registry."""
        return TaskPolicy.manage(task)


# --- the registry of model servers -------------------------------------------------------------


class ModelServerPolicy:
    @staticmethod
    def manage() -> Policy:
        """Register, change and remove model servers: where the API and its jobs may send
        requests and admin tokens. Only admins."""
        return _needs(Role.admin)

    @staticmethod
    def list() -> Policy:
        """See the registered servers (names, URLs; never their admin tokens), to choose one
        for a round or a promotion: researchers (and admins)."""
        return _needs(Role.researcher)
