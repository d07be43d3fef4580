"""Who may do what: the one place that decides access to the API's objects.

Every route asks :func:`authorize` with a policy built for its action and the object it acts
on, in the style of Argilla's ``authorize(user, DatasetPolicy.get(dataset))``::

    round_ = rounds.get_round(session, round_id)
    authorize(user, RoundPolicy.manage(round_))

A :class:`Policy` has two parts, checked in this order:

1. **The roles** the action needs (any one of them; an admin passes every role check, as
   :meth:`User.has_role` says). A policy built without its object, ``RoundPolicy.manage()``,
   is this part alone. The API checks it as a dependency (``dynaloop.api.deps.allowed``) before it
   looks the object up or reads the body, so a caller without the role gets 403 whatever id
   or body they sent, and never learns whether the object exists.
2. **A rule about the object**, once it is loaded: a writer's own assignment, a validator
   who did not write the example, a token's owner. Where another user's object must stay
   hidden, the rule answers 404 with the same message as a missing one.

A refusal raises :class:`~services.errors.Forbidden` (403) or :class:`~services.errors.NotFound`
(404), with a message that says what is needed.

Not decided here: who a token belongs to (authentication, ``dynaloop/api/deps.py``), and a worker's
standing on a task (qualified, onboarding quiz passed), which the work itself earns and loses
and which is checked with it (``services/domain/quality.py``).

**Task ownership.** Several research groups share one deployment, so a task belongs to its
researchers: its *owners* (the creator, and whoever an owner makes one) and *members*
(``task_members``, :class:`~services.db.models.TaskMember`). Admins act on every task.

* :meth:`TaskPolicy.manage`: every researcher action on a task, its rounds, prompts, model,
  statistics, examples, workers, builds, jobs and models, needs the researcher role and a
  place on the task (owner or member). :meth:`TaskPolicy.manage_members`: adding, re-roling
  and removing researchers needs an owner.
* Another group's task stays hidden: a researcher who is not on it gets the 404 of a missing
  task, round, example or job, in the same words (``services.errors.missing_task`` and its
  siblings), so task names, round ids and job ids of other groups do not leak. Where the
  caller can see the task anyway (they are also a writer, validator or client), the refusal is
  a 403 that says who can add them.
* :meth:`TaskPolicy.read` (a task's definition, its rounds, the open rounds): writers and
  validators read every task, since they work on any task they qualify for (the quiz's answers
  only where :meth:`TaskPolicy.manage` allows); REST clients read every task, to find the
  datasets they pull; researchers read the tasks they are on, admins all. A user with none of
  those roles sees no task.
* **Link-made workers** (``User.made_by_link``: the account was created by a study link,
  ``services/domain/study.py``) are workers of their links' tasks only: they read, write in,
  validate in and take the quiz of a task only where one of their study sessions gives them
  that task and role (:func:`study_scope`); any other task, round or example is reported as
  missing, in the words of a missing one, and ``GET /rounds/open`` lists only their tasks'
  rounds. Accounts an admin made keep the reach of their roles.
* :meth:`DatasetPolicy.read` (a built round's splits and report): REST clients pull every
  task's datasets (that is what the role is for); researchers only their own tasks'.

The rule needs the task's members: ``Task.members`` loads them when a rule first reads them
(crowdworkers' rules, decided by role, never do), and lists of tasks load them for the whole
list (``GET /tasks`` does not ask once per task).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
    StudySession,
    Task,
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


def _own_attention_check(check: AttentionCheckAnswer) -> Rule:
    def check_owner(user: User) -> None:
        if check.writer_id != user.id:
            raise missing_attention_check(check.id)

    return check_owner


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


# Who reads every task's definition and rounds: the crowd works on any task, REST clients pull
# any task's datasets (an admin passes each of these role checks).
_SEES_EVERY_TASK = (Role.writer, Role.validator, Role.client)


def _sees_every_task(user: User) -> bool:
    return not user.made_by_link and any(user.has_role(role) for role in _SEES_EVERY_TASK)


def study_scope(user: User) -> set[tuple[int, Role]]:
    """The (task id, role) pairs a link-made worker works in: one per study session, the task
    and role of its link. Empty for accounts an admin made (they are not scoped)."""
    if not user.made_by_link:
        return set()
    return {(study.link.task_id, Role(study.link.role.value)) for study in user.study_sessions}


def _link_made_sees(user: User, task: Task, role: Role | None = None) -> bool:
    """Whether a link-made worker may see ``task`` (in ``role``, or in any role when None)."""
    return any(task_id == task.id and (role is None or held is role) for task_id, held in study_scope(user))


def _crowd_scope(task: Task, role: Role, hidden: Callable[[], NotFound]) -> Rule:
    """Writers and validators: every task, unless made by a study link; then only the tasks and
    roles of their study sessions (else ``hidden``, the 404 of a missing object)."""

    def check(user: User) -> None:
        if user.made_by_link and not user.has_role(Role.admin) and not _link_made_sees(user, task, role):
            raise hidden()

    return check


def _both(first: Rule, second: Rule) -> Rule:
    def check(user: User) -> None:
        first(user)
        second(user)

    return check


def _reads_task(task: Task, hidden: Callable[[], NotFound]) -> Rule:
    """Writers, validators, clients and admins; researchers only on the task (else ``hidden``)."""

    def check(user: User) -> None:
        if _sees_every_task(user) or (user.made_by_link and _link_made_sees(user, task)):
            return
        if not (user.has_role(Role.researcher) and task.member_role(user) is not None):
            raise hidden()

    return check


def _on_task(
    task: Task, hidden: Callable[[], NotFound], *, owners_only: bool = False, or_role: Role | None = None
) -> Rule:
    """Admins, the task's owners and (unless ``owners_only``) members, and holders of ``or_role``.
    Anyone else who cannot see the task gets ``hidden`` (the 404 of a missing object)."""

    def check(user: User) -> None:
        if user.has_role(Role.admin) or (or_role is not None and user.has_role(or_role)):
            return
        place = task.member_role(user)
        if place is TaskRole.owner or (place is TaskRole.member and not owners_only):
            return
        if place is None and not (_sees_every_task(user) or (user.made_by_link and _link_made_sees(user, task))):
            raise hidden()
        if place is None:
            raise Forbidden(
                f"you are not a researcher of task {task.name!r}; one of its owners can add you "
                f"(PUT /api/v1/tasks/{task.name}/members/{user.username})"
            )
        raise Forbidden(f"only the owners of task {task.name!r} add and remove its researchers; you are a member")

    return check


def _task_hidden(task: Task) -> Callable[[], NotFound]:
    return lambda: missing_task(task.name)


def _round_hidden(round_: Round) -> Callable[[], NotFound]:
    return lambda: missing_round(round_.id)


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
        """Create a task; its creator becomes its owner."""
        return _needs(Role.researcher)

    @staticmethod
    def read(task: Task | None = None) -> Policy:
        """See a task's definition and rounds (quiz answers only where :meth:`manage` allows):
        writers, validators, clients and admins every task, researchers the tasks they are on,
        link-made workers the tasks of their study sessions."""
        return Policy(rule=None if task is None else _reads_task(task, _task_hidden(task)))

    @staticmethod
    def manage(task: Task | None = None) -> Policy:
        """Everything a researcher does with a task: open and steer its rounds, import
        prompts, watch statistics, judge and (un)qualify its workers, read full example
        records, build rounds, run jobs, list models, list its researchers. Its owners and
        members (and admins); other researchers are told there is no such task."""
        return _needs(Role.researcher, None if task is None else _on_task(task, _task_hidden(task)))

    @staticmethod
    def manage_members(task: Task | None = None) -> Policy:
        """Add a researcher to a task, change their role on it, take them off: its owners
        (and admins); members are refused, other researchers told there is no such task."""
        return _needs(Role.researcher, None if task is None else _on_task(task, _task_hidden(task), owners_only=True))


class RoundPolicy:
    @staticmethod
    def read(round_: Round | None = None) -> Policy:
        """A round, like its task (:meth:`TaskPolicy.read`); hidden as a missing round."""
        return Policy(rule=None if round_ is None else _reads_task(round_.task, _round_hidden(round_)))

    @staticmethod
    def manage(round_: Round | None = None) -> Policy:
        """Change a round (status, model, prompts), watch it, build it: managing its task
        (:meth:`TaskPolicy.manage`); hidden as a missing round."""
        if round_ is None:
            return TaskPolicy.manage()
        return _needs(Role.researcher, _on_task(round_.task, _round_hidden(round_)))

    @staticmethod
    def write(round_: Round | None = None) -> Policy:
        """Take an assignment in the round: writers; a link-made writer only in the tasks of
        their writer study sessions (another task's round: as missing)."""
        if round_ is None:
            return _needs(Role.writer)
        return _needs(Role.writer, _crowd_scope(round_.task, Role.writer, _round_hidden(round_)))

    @staticmethod
    def validate(round_: Round | None = None) -> Policy:
        """Get a batch of the round's examples to label: validators; a link-made validator only
        in the tasks of their validator study sessions (another task's round: as missing)."""
        if round_ is None:
            return _needs(Role.validator)
        return _needs(Role.validator, _crowd_scope(round_.task, Role.validator, _round_hidden(round_)))


class OnboardingPolicy:
    @staticmethod
    def take(task: Task | None = None) -> Policy:
        """See and answer a task's onboarding quiz: writers; a link-made worker only on the
        tasks of their study sessions (another task: as missing)."""
        if task is None:
            return _needs(Role.writer)
        return _needs(Role.writer, _reads_task(task, _task_hidden(task)))


class WorkerPolicy:
    @staticmethod
    def judge(task: Task | None = None) -> Policy:
        """See validators' agreement with the majority, unqualify and requalify a task's workers."""
        return TaskPolicy.manage(task)


# --- the writer's and the validator's work -----------------------------------------------------


class LedgerPolicy:
    @staticmethod
    def correct(entry: LedgerEntry | None = None) -> Policy:
        """Add a correction to a ledger row: managing the row's task (:meth:`TaskPolicy.manage`);
        another group's row is reported as missing, with the words of a missing row."""
        if entry is None:
            return TaskPolicy.manage()
        return _needs(Role.researcher, _on_task(entry.task, lambda: missing_ledger_entry(entry.id)))


class PayoutBatchPolicy:
    @staticmethod
    def manage(batch: PayoutBatch | None = None) -> Policy:
        """Read a payout batch and its file, mark it paid, cancel it, reconcile it: managing the
        batch's task (:meth:`TaskPolicy.manage`); another group's batch is reported as missing,
        with the words of a missing batch."""
        if batch is None:
            return TaskPolicy.manage()
        return _needs(Role.researcher, _on_task(batch.task, lambda: missing_payout_batch(batch.id)))


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


class AttentionCheckPolicy:
    @staticmethod
    def answer(check: AttentionCheckAnswer | None = None) -> Policy:
        """Read and answer an attention check (services/domain/attention.py): only the writer it
        was served to. Another writer's check is reported as missing: nobody learns it exists."""
        return _needs(Role.writer, None if check is None else _own_attention_check(check))


class ExamplePolicy:
    @staticmethod
    def read(example: Example | None = None) -> Policy:
        """The full record of an example (attempts, writer, every label): its task's managers
        (:meth:`TaskPolicy.manage`); hidden as a missing example."""
        if example is None:
            return TaskPolicy.manage()
        return _needs(Role.researcher, _on_task(example.round.task, lambda: missing_example(example.id)))

    @staticmethod
    def validate(example: Example | None = None) -> Policy:
        """Label an example: validators, never its writer; a link-made validator only in the
        tasks of their validator study sessions (another task's example: as missing)."""
        if example is None:
            return _needs(Role.validator)
        in_scope = _crowd_scope(example.round.task, Role.validator, lambda: missing_example(example.id))
        return _needs(Role.validator, _both(in_scope, _written_by_someone_else(example)))


# --- what a round becomes: builds, datasets, jobs, models --------------------------------------


class BuildPolicy:
    @staticmethod
    def create(round_: Round | None = None) -> Policy:
        """Build a closed round (aggregation, agreement, splits)."""
        return RoundPolicy.manage(round_)


class DatasetPolicy:
    @staticmethod
    def read(task: Task | None = None) -> Policy:
        """Pull a built round's splits and its report: REST clients every task's, researchers
        the tasks they are on (others are told there is no such task), admins all."""
        rule = None if task is None else _on_task(task, _task_hidden(task), or_role=Role.client)
        return Policy((Role.client, Role.researcher), "reading datasets needs the client or researcher role", rule)


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
        """A job of a task you manage (:meth:`TaskPolicy.manage`); hidden as a missing job."""
        if job is None:
            return TaskPolicy.manage()
        return _needs(Role.researcher, _on_task(job.task, lambda: missing_job(job.id)))

    @staticmethod
    def cancel(job: Job | None = None) -> Policy:
        """Whoever may see a job may cancel it (the task's researchers and admins)."""
        return JobPolicy.view(job)


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


# --- crowd platforms: study links and the workers' sessions -------------------------------------


def _own_study_session(study: StudySession) -> Rule:
    def check(user: User) -> None:
        if study.user_id != user.id:
            raise NotFound(f"no study session {study.id} of yours")

    return check


class StudyLinkPolicy:
    @staticmethod
    def manage(link: StudyLink | None = None) -> Policy:
        """Create, list, close study links and see their sessions: managing the link's task
        (:meth:`TaskPolicy.manage`); another group's link is hidden as a missing one."""
        if link is None:
            return TaskPolicy.manage()
        return _needs(Role.researcher, _on_task(link.task, lambda: NotFound(f"no study link {link.id}")))


class StudySessionPolicy:
    @staticmethod
    def own(study: StudySession | None = None) -> Policy:
        """See and finish a study session: only its worker; anyone else's is reported as missing."""
        return Policy(rule=None if study is None else _own_study_session(study))
