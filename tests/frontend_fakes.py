"""An in-memory stand-in for ``frontend.client.ApiClient`` for the Streamlit page tests.

``FakeApiClient`` has the same method names and returns the same shapes as the real client
(docs/api.md), keeps the server's state in dictionaries, and follows the API's rules that
the pages depend on: tries and the 503 that uses none, idempotency keys, confirmation
before submission, the quiz's attempt limit, claimed validation batches that come back on a
reload, one label per validator and example. Tests put it in ``st.session_state["client"]``
and can make any method fail with :meth:`FakeApiClient.fail_next`.

Task definitions are the shipped example YAML files, so the pages see real definitions.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamlit.testing.v1 import AppTest

from frontend.client import ApiError, idempotency_key
from services.taskdef import example_path, parse_task_definition

APP_FILE = Path(__file__).resolve().parents[1] / "frontend" / "app.py"
HOSTILE = "<script>alert(1)</script> **bold** [link](http://x) <img src=x onerror=alert(2)>"
HOSTILE_ESCAPED = ("&lt;script&gt;alert(1)&lt;/script&gt; **bold** [link](http://x) "
                   "&lt;img src=x onerror=alert(2)&gt;")

POSITIVE_WORDS = {"great", "love", "loved", "best", "wonderful", "excellent", "amazing", "delicious"}
NEGATIVE_WORDS = {"bad", "terrible", "worst", "rude", "awful", "cold", "dirty", "horrible"}
NOW = "2026-01-01T00:00:00Z"


def keyword_model(text: str, labels: list[str], multi_label: bool) -> list[str]:
    """The stub model server's rules (tests/stub_model_server.py)."""
    words = {w.strip(".,!?;:'\"").lower() for w in text.split()}
    if multi_label:
        return [label for label in labels if label in words] or (["neutral"] if "neutral" in labels else labels[:1])
    if "positive" in labels and words & POSITIVE_WORDS:
        return ["positive"]
    if "negative" in labels and words & NEGATIVE_WORDS:
        return ["negative"]
    if "neutral" in labels:
        return ["neutral"]
    for label in labels:
        if label in words:
            return [label]
    return [labels[-1]]


def _error(status: int, code: str, message: str, **details: Any) -> ApiError:
    retry = details.get("retry_after_s")
    return ApiError(status, code, message, float(retry) if retry is not None else None, details)


class FakeApiClient:
    """The dynaloop API in memory (see the module docstring)."""

    def __init__(self) -> None:
        self.token: str | None = None
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.model_down = False
        self.predict: Callable[[str, list[str], bool], list[str]] = keyword_model
        self._failures: dict[str, list[ApiError]] = {}
        self._ids = itertools.count(1)
        self.users: dict[str, dict[str, Any]] = {}
        self.tokens: dict[str, str] = {}
        self.task_records: dict[str, dict[str, Any]] = {}
        self.round_records: dict[int, dict[str, Any]] = {}
        self.prompts: dict[int, list[dict[str, Any]]] = {}
        self.assignments: dict[int, dict[str, Any]] = {}
        self.attempts: dict[int, dict[str, Any]] = {}
        self.examples: dict[int, dict[str, Any]] = {}
        self.quiz_state: dict[tuple[str, str], dict[str, Any]] = {}
        self.claims: dict[tuple[str, int], list[int]] = {}

    # --- set-up -----------------------------------------------------------------------

    def add_user(self, username: str, *roles: str, password: str | None = None,
                 display_name: str | None = None) -> str:
        token = f"dl_{username}_token"
        self.users[username] = {"id": len(self.users) + 1, "username": username, "display_name": display_name,
                                "roles": list(roles), "is_active": True, "password": password}
        self.tokens[token] = username
        return token

    def add_task(self, example: str, **overrides: Any) -> dict[str, Any]:
        """A task from a shipped example YAML, with top-level keys replaced (None drops one)."""
        import yaml

        data = yaml.safe_load(example_path(example).read_text(encoding="utf-8"))
        for key, value in overrides.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        definition = parse_task_definition(yaml.safe_dump(data, allow_unicode=True)).model_dump(mode="json")
        record = {"id": len(self.task_records) + 1, "name": definition["name"], "title": definition["title"],
                  "family": definition["family"], "definition": definition, "created_at": NOW}
        self.task_records[record["name"]] = record
        return record

    def add_round(self, task: str, prompts: list[str] | list[dict[str, Any]] = (), *,
                  target_label_mode: str = "balanced", no_prompt: bool = False, status: str = "collecting",
                  targets: list[list[str]] | None = None) -> dict[str, Any]:
        """Open a round; ``targets`` fixes the target label of successive assignments."""
        round_id = len(self.round_records) + 1
        record = {"id": round_id, "task": task, "number": 1, "status": status,
                  "model_endpoints": ["http://model"], "prompt_strategy": "unused_first",
                  "no_prompt_fraction": 1.0 if no_prompt else 0.0, "target_label_mode": target_label_mode,
                  "opened_at": NOW, "validating_at": None, "closed_at": None, "_targets": list(targets or [])}
        self.round_records[round_id] = record
        self.prompts[round_id] = [
            {"id": next(self._ids), "text": p, "metadata": {}} if isinstance(p, str)
            else {"id": next(self._ids), "text": p["text"], "metadata": dict(p.get("metadata") or {})}
            for p in prompts
        ]
        return self._public_round(record)

    def add_example(self, round_id: int, text: str, *, writer: str = "someone-else",
                    target_span: tuple[int, int] | None = None) -> int:
        example_id = next(self._ids)
        span = None
        if target_span is not None:
            span = {"start": target_span[0], "end": target_span[1], "text": text[target_span[0]:target_span[1]]}
        definition = self._definition(self.round_records[round_id]["task"])
        self.examples[example_id] = {"id": example_id, "round_id": round_id, "text": text, "writer": writer,
                                     "target_span": span, "labels": {},
                                     "needed": definition["validations_per_example"], "extras": {}}
        return example_id

    def fail_next(self, method: str, error: ApiError) -> None:
        """Make the next call of ``method`` raise ``error`` (and do nothing else)."""
        self._failures.setdefault(method, []).append(error)

    def calls_of(self, method: str) -> list[dict[str, Any]]:
        return [kwargs for name, kwargs in self.calls if name == method]

    # --- plumbing ---------------------------------------------------------------------

    def _enter(self, method: str, **kwargs: Any) -> None:
        self.calls.append((method, kwargs))
        if self._failures.get(method):
            raise self._failures[method].pop(0)

    def _user(self, *roles: str) -> dict[str, Any]:
        username = self.tokens.get(self.token or "")
        if username is None:
            raise _error(401, "unauthorized", "the API token is unknown or revoked; log in again or ask an admin")
        user = self.users[username]
        if roles and "admin" not in user["roles"] and not set(roles) & set(user["roles"]):
            raise _error(403, "forbidden", f"this needs the {' or '.join(roles)} role; your roles: "
                         + ", ".join(user["roles"]))
        return user

    @staticmethod
    def _public_user(user: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in user.items() if k != "password"}

    @staticmethod
    def _public_round(record: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in record.items() if not k.startswith("_")}

    def _definition(self, task: str) -> dict[str, Any]:
        return self.task_records[task]["definition"]

    def _public_task(self, record: dict[str, Any]) -> dict[str, Any]:
        definition = dict(record["definition"])
        quiz = definition.get("onboarding_quiz")
        if quiz:
            definition["onboarding_quiz"] = {**quiz, "questions": [
                {k: v for k, v in q.items() if k not in ("answer", "explanation")} for q in quiz["questions"]]}
        return {**record, "definition": definition}

    def _round(self, round_id: int) -> dict[str, Any]:
        if round_id not in self.round_records:
            raise _error(404, "not_found", f"no round {round_id}")
        return self.round_records[round_id]

    def _own_assignment(self, user: dict[str, Any], assignment_id: int) -> dict[str, Any]:
        assignment = self.assignments.get(assignment_id)
        if assignment is None or assignment["_writer"] != user["username"]:
            raise _error(404, "not_found", f"no assignment {assignment_id} of yours")
        return assignment

    def _public_assignment(self, assignment: dict[str, Any]) -> dict[str, Any]:
        public = {k: v for k, v in assignment.items() if not k.startswith("_")}
        public["attempts"] = [dict(self.attempts[i]) for i in assignment["_attempts"]]
        return public

    # --- sign-in ----------------------------------------------------------------------

    def login(self, username: str, password: str) -> dict[str, Any]:
        self._enter("login", username=username)
        user = self.users.get(username)
        if user is None or user["password"] is None or user["password"] != password:
            raise _error(401, "unauthorized", "wrong username or password")
        token = next(t for t, name in self.tokens.items() if name == username)
        self.token = token
        return {"token": token, "user": self._public_user(user)}

    def me(self) -> dict[str, Any]:
        self._enter("me")
        return self._public_user(self._user())

    # --- tasks and rounds -------------------------------------------------------------

    def tasks(self) -> list[dict[str, Any]]:
        self._enter("tasks")
        self._user()
        return [self._public_task(r) for r in self.task_records.values()]

    def task(self, name: str) -> dict[str, Any]:
        self._enter("task", name=name)
        self._user()
        if name not in self.task_records:
            raise _error(404, "not_found", f"no task {name!r}")
        return self._public_task(self.task_records[name])

    def rounds(self, task: str) -> list[dict[str, Any]]:
        self._enter("rounds", task=task)
        self._user()
        return [self._public_round(r) for r in self.round_records.values() if r["task"] == task]

    def open_rounds(self) -> list[dict[str, Any]]:
        self._enter("open_rounds")
        self._user()
        return [self._public_round(r) for r in self.round_records.values()
                if r["status"] in ("collecting", "validating")]

    def round(self, round_id: int) -> dict[str, Any]:
        self._enter("round", round_id=round_id)
        self._user()
        return self._public_round(self._round(round_id))

    # --- quiz -------------------------------------------------------------------------

    def quiz(self, task: str) -> dict[str, Any]:
        self._enter("quiz", task=task)
        user = self._user("writer")
        quiz = self._definition(task).get("onboarding_quiz")
        if not quiz:
            return {"required": False, "passed": True, "attempts_used": 0, "attempts_left": 0, "questions": []}
        progress = self.quiz_state.setdefault((user["username"], task), {"attempts_used": 0, "passed": False})
        return {"required": True, "passed": progress["passed"], "attempts_used": progress["attempts_used"],
                "attempts_left": max(0, quiz["max_attempts"] - progress["attempts_used"]),
                "questions": [{"text": q["text"], "options": q["options"]} for q in quiz["questions"]]}

    def answer_quiz(self, task: str, answers: list[str]) -> dict[str, Any]:
        self._enter("answer_quiz", task=task, answers=list(answers))
        user = self._user("writer")
        quiz = self._definition(task)["onboarding_quiz"]
        if len(answers) != len(quiz["questions"]):
            raise _error(422, "invalid", f"the quiz has {len(quiz['questions'])} questions; send exactly that many "
                         f"answers (got {len(answers)})")
        progress = self.quiz_state.setdefault((user["username"], task), {"attempts_used": 0, "passed": False})
        if not progress["passed"] and progress["attempts_used"] >= quiz["max_attempts"]:
            raise _error(403, "forbidden", f"you used all {quiz['max_attempts']} attempts at the onboarding quiz of "
                         f"task {task!r}; you are held back from writing for this task")
        wrong = [i + 1 for i, (a, q) in enumerate(zip(answers, quiz["questions"], strict=True)) if a != q["answer"]]
        if not progress["passed"]:
            progress["attempts_used"] += 1
            progress["passed"] = not wrong
        return {"passed": progress["passed"], "correct": len(answers) - len(wrong), "wrong_questions": wrong,
                "attempts_used": progress["attempts_used"],
                "attempts_left": max(0, quiz["max_attempts"] - progress["attempts_used"])}

    # --- writer -----------------------------------------------------------------------

    def start_assignment(self, round_id: int, target_label: str | list[str] | None = None) -> dict[str, Any]:
        self._enter("start_assignment", round_id=round_id, target_label=target_label)
        user = self._user("writer")
        round_ = self._round(round_id)
        task = round_["task"]
        definition = self._definition(task)
        if round_["status"] != "collecting":
            raise _error(409, "conflict", f"round 1 of task {task!r} is {round_['status']}, not collecting")
        quiz = definition.get("onboarding_quiz")
        if quiz and not self.quiz_state.get((user["username"], task), {}).get("passed"):
            raise _error(403, "forbidden", f"take the onboarding quiz of task {task!r} first", quiz_required=True)
        for assignment in self.assignments.values():
            if (assignment["round_id"] == round_id and assignment["_writer"] == user["username"]
                    and assignment["status"] == "active"):
                return self._public_assignment(assignment)
        if round_["target_label_mode"] == "writer_choice":
            if target_label is None:
                raise _error(422, "invalid", "this round lets writers choose the target label; send target_label, "
                             f"one of {definition['labels']}")
            target = [target_label] if isinstance(target_label, str) else list(target_label)
        elif round_["_targets"]:
            target = list(round_["_targets"].pop(0))
        else:
            target = [definition["labels"][0]]
        prompt = None
        if not round_["no_prompt_fraction"]:
            seen = {a["_prompt_id"] for a in self.assignments.values() if a["_writer"] == user["username"]}
            fresh = [p for p in self.prompts[round_id] if p["id"] not in seen]
            if not fresh:
                raise _error(409, "conflict", f"you have seen all {len(self.prompts[round_id])} prompts of round 1; "
                             "thank you!")
            prompt = dict(fresh[0])
        assignment_id = next(self._ids)
        assignment = {"id": assignment_id, "round_id": round_id, "task": task,
                      "condition": "prompt" if prompt else "no_prompt", "prompt": prompt, "target_label": target,
                      "goal": "(the API's goal sentence)", "tries_used": 0,
                      "tries_allowed": definition["tries_per_assignment"], "status": "active",
                      "started_at": NOW, "expires_at": "2026-01-01T01:00:00Z",
                      "_writer": user["username"], "_attempts": [], "_keys": {},
                      "_prompt_id": prompt["id"] if prompt else None}
        self.assignments[assignment_id] = assignment
        return self._public_assignment(assignment)

    def assignment(self, assignment_id: int) -> dict[str, Any]:
        self._enter("assignment", assignment_id=assignment_id)
        return self._public_assignment(self._own_assignment(self._user("writer"), assignment_id))

    def _score(self, attempt: dict[str, Any], assignment: dict[str, Any]) -> None:
        definition = self._definition(assignment["task"])
        labels = definition["labels"]
        predicted = self.predict(attempt["text"], labels, definition["family"] == "multi_label")
        attempt.update(status="scored", prediction=predicted, counts_as_try=True,
                       probabilities={label: 0.9 / len(predicted) if label in predicted
                                      else round(0.1 / max(1, len(labels) - len(predicted)), 4) for label in labels},
                       fooled=sorted(predicted) != sorted(assignment["target_label"]),
                       model_id="fake-model", model_version="1")
        assignment["tries_used"] += 1

    def attempt(self, assignment_id: int, text: str, *, target_span: list[int] | None = None,
                idempotency_key: str | None = None) -> dict[str, Any]:
        key = idempotency_key or _derived("attempt", assignment_id, text, target_span)
        self._enter("attempt", assignment_id=assignment_id, text=text, target_span=target_span, idempotency_key=key)
        assignment = self._own_assignment(self._user("writer"), assignment_id)
        definition = self._definition(assignment["task"])
        if assignment["status"] != "active":
            raise _error(409, "conflict", f"assignment {assignment_id} is {assignment['status']}; request a new one")
        if definition["family"] == "target_dependent":
            if target_span is None:
                raise _error(422, "invalid", "target_span is required: give [start, end] character offsets of the "
                             "target in the text")
            if not 0 <= target_span[0] < target_span[1] <= len(text):
                raise _error(422, "invalid", f"target_span {target_span} is outside the text (0..{len(text)})")
        attempt = self.attempts.get(assignment["_keys"].get(key, -1))
        if attempt is not None and attempt["text"] != text:
            raise _error(409, "conflict", "this Idempotency-Key was already used for a different text; use a new key")
        if attempt is not None and attempt["status"] == "scored":
            return dict(attempt)
        if attempt is None:
            if assignment["tries_used"] >= assignment["tries_allowed"]:
                raise _error(409, "conflict", f"all {assignment['tries_allowed']} tries of this assignment are used; "
                             "submit one of your attempts or switch to the next prompt")
            attempt = {"id": next(self._ids), "assignment_id": assignment_id, "text": text, "status": "pending",
                       "prediction": None, "probabilities": None, "model_id": None, "model_version": None,
                       "latency_ms": 3.0, "input_truncated": False, "edit_distance": 0.3,
                       "seconds_since_start": 4.0, "fooled": None, "counts_as_try": False, "confirmed": None,
                       "judged_label": None, "target_span": list(target_span) if target_span else None,
                       "created_at": NOW}
            self.attempts[attempt["id"]] = attempt
            assignment["_attempts"].append(attempt["id"])
            assignment["_keys"][key] = attempt["id"]
        if self.model_down:
            attempt["status"] = "model_unavailable"
            raise _error(503, "model_unavailable", "the model is unavailable (model server at http://model answered "
                         "HTTP 500); your text is saved and no try was used. Retry in 5 s with the same "
                         "Idempotency-Key", attempt_id=attempt["id"], retry_after_s=5)
        self._score(attempt, assignment)
        return dict(attempt)

    def confirm(self, attempt_id: int, agrees: bool, judged_label: str | list[str] | None = None, *,
                idempotency_key: str | None = None) -> dict[str, Any]:
        key = idempotency_key or _derived("confirmation", attempt_id, agrees, judged_label)
        self._enter("confirm", attempt_id=attempt_id, agrees=agrees, judged_label=judged_label, idempotency_key=key)
        user = self._user("writer")
        attempt = self.attempts.get(attempt_id)
        if attempt is None:
            raise _error(404, "not_found", f"no attempt {attempt_id} of yours")
        self._own_assignment(user, attempt["assignment_id"])
        if not attempt["fooled"]:
            raise _error(409, "conflict", f"attempt {attempt_id} did not fool the model; only fooling attempts are "
                         "confirmed")
        judged = [judged_label] if isinstance(judged_label, str) else judged_label
        if attempt["confirmed"] is not None and (attempt["confirmed"], attempt["judged_label"]) != (agrees, judged):
            raise _error(409, "conflict", f"attempt {attempt_id} was already confirmed as "
                         + ("yes" if attempt["confirmed"] else "no"))
        attempt.update(confirmed=agrees, judged_label=judged)
        return dict(attempt)

    def submit_example(self, assignment_id: int, attempt_id: int, extras: dict[str, Any] | None = None, *,
                       idempotency_key: str | None = None) -> dict[str, Any]:
        key = idempotency_key or _derived("example", assignment_id, attempt_id)
        extras = dict(extras or {})
        self._enter("submit_example", assignment_id=assignment_id, attempt_id=attempt_id, extras=extras,
                    idempotency_key=key)
        user = self._user("writer")
        assignment = self._own_assignment(user, assignment_id)
        attempt = self.attempts.get(attempt_id)
        if attempt is None or attempt["assignment_id"] != assignment_id or attempt["status"] != "scored":
            raise _error(404, "not_found", f"no scored attempt {attempt_id} in assignment {assignment_id}")
        for example in self.examples.values():
            if example.get("assignment_id") == assignment_id:
                if example["attempt_id"] == attempt_id:
                    return self._public_example(example)
                raise _error(409, "conflict", f"assignment {assignment_id} was already submitted with attempt "
                             f"{example['attempt_id']}")
        if attempt["fooled"] and attempt["confirmed"] is None:
            raise _error(409, "conflict", f"attempt {attempt_id} fooled the model; confirm first")
        definition = self._definition(assignment["task"])
        fields = {f["name"]: f for f in definition.get("writer_fields") or []}
        unknown = sorted(set(extras) - set(fields))
        if unknown:
            raise _error(422, "invalid", f"extra field(s) {unknown} are not part of task {assignment['task']!r}")
        intended = extras.get("intended_label")
        for name, field in fields.items():
            needed = field["required"] or (field["required_when_intended"] is not None
                                           and field["required_when_intended"] == intended)
            if needed and name != "target_span" and not extras.get(name):
                raise _error(422, "invalid", f"{name} is required"
                             + (f" when the intended label is {intended!r}" if intended else "") + "; fill it in")
        if attempt["target_span"]:
            start, end = attempt["target_span"]
            extras["target_span"] = {"start": start, "end": end, "text": attempt["text"][start:end]}
        example_id = self.add_example(assignment["round_id"], attempt["text"], writer=user["username"])
        example = self.examples[example_id]
        example.update(assignment_id=assignment_id, attempt_id=attempt_id, extras=extras,
                       target_span=extras.get("target_span"), fooled=bool(attempt["fooled"]),
                       target_label=assignment["target_label"])
        assignment["status"] = "submitted"
        return self._public_example(example)

    def _public_example(self, example: dict[str, Any]) -> dict[str, Any]:
        return {"id": example["id"], "round_id": example["round_id"], "assignment_id": example.get("assignment_id"),
                "attempt_id": example.get("attempt_id"), "text": example["text"],
                "target_label": example.get("target_label", []), "condition": "prompt",
                "fooled": example.get("fooled", False), "extras": example["extras"], "status": "validating",
                "created_at": NOW}

    def skip(self, assignment_id: int) -> dict[str, Any]:
        self._enter("skip", assignment_id=assignment_id)
        assignment = self._own_assignment(self._user("writer"), assignment_id)
        if assignment["status"] == "active":
            assignment["status"] = "skipped"
        return self._public_assignment(assignment)

    def inspect(self, assignment_id: int, text: str, *, label: str | None = None,
                target_span: list[int] | None = None) -> dict[str, Any]:
        self._enter("inspect", assignment_id=assignment_id, text=text, label=label, target_span=target_span)
        assignment = self._own_assignment(self._user("writer"), assignment_id)
        if self.model_down:
            raise _error(503, "model_unavailable", "token attributions are unavailable (the model server is down)",
                         retry_after_s=5)
        tokens = [{"token": "[CLS]", "score": 0.0}]
        for word in re.findall(r"\w+|[^\w\s]", text.lower()):
            score = 0.6 if word in POSITIVE_WORDS else -0.6 if word in NEGATIVE_WORDS else 0.05
            tokens.append({"token": word, "score": score})
        tokens.append({"token": "[SEP]", "score": 0.0})
        return {"label": label or assignment["target_label"][0], "tokens": tokens}

    # --- validator --------------------------------------------------------------------

    def validation_batch(self, round_id: int, size: int | None = None) -> dict[str, Any]:
        self._enter("validation_batch", round_id=round_id, size=size)
        user = self._user("validator")
        round_ = self._round(round_id)
        definition = self._definition(round_["task"])
        name = user["username"]
        limit = size or definition["validation_batch_size"]
        held = [i for i in self.claims.get((name, round_id), []) if name not in self.examples[i]["labels"]]
        for example in self.examples.values():
            if len(held) >= limit:
                break
            if (example["round_id"] == round_id and example["writer"] != name and name not in example["labels"]
                    and len(example["labels"]) < example["needed"] and example["id"] not in held):
                held.append(example["id"])
        self.claims[(name, round_id)] = held
        data = [{"example_id": i, "text": self.examples[i]["text"], "target_span": self.examples[i]["target_span"]}
                for i in held]
        return {"round_id": round_id, "task": round_["task"],
                "validation_labels": definition["validation_labels"] or definition["labels"],
                "multi_label": definition["family"] == "multi_label", "data": data, "count": len(data)}

    def validate(self, example_id: int, label: str | list[str], *, flagged: bool = False,
                 flag_reason: str | None = None, seconds_taken: float | None = None,
                 idempotency_key: str | None = None) -> dict[str, Any]:
        key = idempotency_key or _derived("validation", example_id, label, flagged, flag_reason)
        self._enter("validate", example_id=example_id, label=label, flagged=flagged, flag_reason=flag_reason,
                    seconds_taken=seconds_taken, idempotency_key=key)
        user = self._user("validator")
        example = self.examples.get(example_id)
        if example is None:
            raise _error(404, "not_found", f"no example {example_id}")
        if example["writer"] == user["username"]:
            raise _error(403, "forbidden", "you wrote this example; validators never label their own examples")
        definition = self._definition(self.round_records[example["round_id"]]["task"])
        allowed = definition["validation_labels"] or definition["labels"]
        labels = [label] if isinstance(label, str) else list(label)
        for one in labels:
            if one not in allowed:
                raise _error(422, "invalid", f"label {one!r} is not a label of task {definition['name']}; use one "
                             f"of {allowed}", allowed=allowed)
        if flag_reason and not flagged:
            raise _error(422, "invalid", "flag_reason is only given with flagged: true")
        stored = example["labels"].get(user["username"])
        if stored is not None:
            if stored["label"] == sorted(labels, key={n: i for i, n in enumerate(allowed)}.get):
                return {k: v for k, v in stored.items() if k not in ("flag_reason", "seconds_taken")}
            raise _error(409, "conflict", f"you already labelled example {example_id} as {stored['label']}; labels "
                         "cannot be changed")
        if len(example["labels"]) >= example["needed"]:
            raise _error(409, "conflict", f"example {example_id} already has all its labels; fetch a new batch")
        order = {name: i for i, name in enumerate(allowed)}
        validation = {"id": next(self._ids), "example_id": example_id, "label": sorted(labels, key=order.get),
                      "flagged": flagged, "counted": True, "created_at": NOW,
                      "flag_reason": flag_reason, "seconds_taken": seconds_taken}
        example["labels"][user["username"]] = validation
        return {k: v for k, v in validation.items() if k not in ("flag_reason", "seconds_taken")}


    # --- researcher pages: tasks, rounds, prompts, build, jobs, models, plot data ------------
    # (added by the researcher pages' helper; their state is created on first use, in
    # ``self.research``: jobs, models, builds and what tests set for stats and plots)

    @property
    def research(self) -> dict[str, Any]:
        if not hasattr(self, "_research"):
            self._research: dict[str, Any] = {
                "jobs": {}, "models": {}, "builds": {}, "stats": {}, "agreement": {}, "plot_data": {},
                # What each job reports on its successive GET /jobs/{id}; the last step finishes it.
                "job_steps": [("running", 0.25, "training: step 1 of 4"), ("running", 0.75, "training: step 3 of 4")],
                "next_job_failure": None,  # a message: the next job started fails with it
            }
        return self._research

    def _task_record(self, task: str) -> dict[str, Any]:
        if task not in self.task_records:
            raise _error(404, "not_found", f"no task {task!r}")
        return self.task_records[task]

    def add_model(self, task: str, model_id: str = "model-1", version: str = "abc123", *, status: str = "trained",
                  endpoint: str | None = None, trained_for_round: int | None = 2,
                  macro_f1: dict[str, float] | None = None) -> dict[str, Any]:
        """A registry row, as GET /tasks/{task}/models returns it."""
        models = self.research["models"]
        record = {"id": len(models) + 1, "task": task, "name": f"{model_id}@{version}", "model_id": model_id,
                  "version": version, "status": status, "trained_for_round": trained_for_round,
                  "base_model": "/models/minilm", "directory": f"/data/models/{model_id}", "endpoint": endpoint,
                  "labels": list(self._definition(task)["labels"]), "attempts": 0, "best_dev_macro_f1": 0.61,
                  "macro_f1": dict(macro_f1 or {}), "solved": {}, "hyperparameters": {"epochs": 3},
                  "created_at": NOW, "evaluated_at": None, "promoted_at": NOW if status == "promoted" else None,
                  "retired_at": None}
        models[record["id"]] = record
        return record

    def create_task(self, definition_yaml: str) -> dict[str, Any]:
        from services.taskdef import TaskDefinitionError

        self._enter("create_task", definition_yaml=definition_yaml)
        self._user("researcher")
        try:
            definition = parse_task_definition(definition_yaml).model_dump(mode="json")
        except TaskDefinitionError as exc:
            raise _error(422, "invalid", str(exc), problems=exc.problems) from exc
        if definition["name"] in self.task_records:
            raise _error(409, "conflict", f"task {definition['name']!r} already exists; change `name` in the YAML to "
                         "create another")
        record = {"id": len(self.task_records) + 1, "name": definition["name"], "title": definition["title"],
                  "family": definition["family"], "definition": definition, "created_at": NOW}
        self.task_records[record["name"]] = record
        return dict(record)

    def open_round(self, task: str, *, model_endpoints: list[str] | None = None, prompt_strategy: str | None = None,
                   no_prompt_fraction: float | None = None, target_label_mode: str | None = None,
                   notes: str | None = None) -> dict[str, Any]:
        self._enter("open_round", task=task, model_endpoints=model_endpoints, prompt_strategy=prompt_strategy,
                    no_prompt_fraction=no_prompt_fraction, target_label_mode=target_label_mode, notes=notes)
        self._user("researcher")
        self._task_record(task)
        rounds = [r for r in self.round_records.values() if r["task"] == task]
        still_open = [r for r in rounds if r["status"] in ("collecting", "validating")]
        if still_open:
            raise _error(409, "conflict", f"round {still_open[0]['number']} of task {task!r} is still "
                         f"{still_open[0]['status']}; close it before opening the next")
        self._check_endpoints(model_endpoints or [])
        public = self.add_round(task, target_label_mode=target_label_mode or "balanced")
        record = self.round_records[public["id"]]
        record.update(number=len(rounds) + 1, model_endpoints=list(model_endpoints or []),
                      prompt_strategy=prompt_strategy or "unused_first",
                      no_prompt_fraction=float(no_prompt_fraction or 0.0), _notes=notes)
        return self._public_round(record)

    @staticmethod
    def _check_endpoints(endpoints: list[str]) -> None:
        for endpoint in endpoints:
            if not endpoint.startswith(("http://", "https://")):
                raise _error(422, "invalid", f"model endpoint {endpoint!r} is not an http(s) URL; give e.g. "
                             "http://127.0.0.1:8001")

    def set_model(self, round_id: int, model_endpoints: list[str]) -> dict[str, Any]:
        self._enter("set_model", round_id=round_id, model_endpoints=list(model_endpoints))
        self._user("researcher")
        record = self._round(round_id)
        self._check_endpoints(model_endpoints)
        record["model_endpoints"] = list(model_endpoints)
        return self._public_round(record)

    def import_prompts(self, round_id: int, content: bytes, filename: str = "prompts.jsonl", *,
                       format: str | None = None) -> dict[str, Any]:
        import csv
        import io
        import json

        self._enter("import_prompts", round_id=round_id, content=content, filename=filename, format=format)
        self._user("researcher")
        self._round(round_id)
        fmt = format or ("csv" if filename.lower().endswith(".csv") else "jsonl")
        text = content.decode("utf-8-sig")
        rows: list[dict[str, Any]] = []
        if fmt == "csv":
            reader = csv.DictReader(io.StringIO(text))
            if "text" not in (reader.fieldnames or []):
                raise _error(422, "invalid", "the CSV has no `text` column; add a header row with `text`")
            rows = [dict(row) for row in reader]
        else:
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise _error(422, "invalid", f"line {number}: not valid JSON ({exc.msg}); nothing was "
                                 "imported") from exc
                rows.append(value if isinstance(value, dict) else {"text": value})
        for number, row in enumerate(rows, start=1):
            if not isinstance(row.get("text"), str) or not row["text"].strip():
                raise _error(422, "invalid", f"row {number}: `text` is missing or empty; nothing was imported")
        present = {p["text"] for p in self.prompts.setdefault(round_id, [])}
        seen: set[str] = set()
        report = {"rows": len(rows), "imported": 0, "duplicates_in_file": 0, "already_present": 0}
        for row in rows:
            if row["text"] in seen:
                report["duplicates_in_file"] += 1
            elif row["text"] in present:
                report["already_present"] += 1
            else:
                self.prompts[round_id].append({"id": next(self._ids), "text": row["text"],
                                               "metadata": {k: v for k, v in row.items() if k != "text"}})
                report["imported"] += 1
            seen.add(row["text"])
        return report

    def set_round_status(self, round_id: int, status: str) -> dict[str, Any]:
        self._enter("set_round_status", round_id=round_id, status=status)
        self._user("researcher")
        record = self._round(round_id)
        allowed = {"collecting": {"validating", "closed"}, "validating": {"closed"}}.get(record["status"], set())
        if status not in allowed:
            raise _error(409, "conflict", f"round {record['number']} is {record['status']}; it cannot become {status}")
        record["status"] = status
        record[f"{'closed' if status == 'closed' else 'validating'}_at"] = NOW
        return self._public_round(record)

    def round_stats(self, round_id: int) -> dict[str, Any]:
        self._enter("round_stats", round_id=round_id)
        self._user("researcher")
        record = self._round(round_id)
        if round_id in self.research["stats"]:
            return dict(self.research["stats"][round_id])
        examples = [e for e in self.examples.values() if e["round_id"] == round_id]
        attempts = [a for a in self.attempts.values() if a["status"] == "scored"
                    and self.assignments[a["assignment_id"]]["round_id"] == round_id]
        fooled = sum(1 for a in attempts if a["fooled"])
        confirmed = [a["confirmed"] for a in attempts if a["fooled"] and a["confirmed"] is not None]
        counted = sum(len(e["labels"]) for e in examples)
        needed = sum(e["needed"] for e in examples)
        validated = sum(1 for e in examples if len(e["labels"]) >= e["needed"])
        return {"round": record["number"], "status": record["status"],
                "attempts": {"scored": len(attempts), "fooled": fooled, "model_unavailable": 0,
                             "fooling_rate": fooled / len(attempts) if attempts else None},
                "confirmations": {"yes": confirmed.count(True), "no": confirmed.count(False),
                                  "rate": confirmed.count(True) / len(confirmed) if confirmed else None},
                "examples": {"submitted": len(examples), "fooled": sum(1 for e in examples if e.get("fooled")),
                             "prompt": len(examples), "no_prompt": 0, "validating": len(examples) - validated,
                             "validated": validated, "dropped": 0, "by_target_label": {}},
                "validations": {"given": counted, "counted": counted, "needed": needed,
                                "coverage": counted / needed if needed else None},
                "prompts": {"total": len(self.prompts.get(round_id, [])), "used": 0}}

    def worker_agreement(self, round_id: int) -> list[dict[str, Any]]:
        self._enter("worker_agreement", round_id=round_id)
        self._user("researcher")
        self._round(round_id)
        return [dict(row) for row in self.research["agreement"].get(round_id, [])]

    def plot_data(self, round_id: int, limit: int | None = None) -> dict[str, Any]:
        self._enter("plot_data", round_id=round_id, limit=limit)
        self._user("researcher")
        record = self._round(round_id)
        if round_id in self.research["plot_data"]:
            return dict(self.research["plot_data"][round_id])
        definition = self._definition(record["task"])
        rows = []
        for example in (e for e in self.examples.values() if e["round_id"] == round_id):
            votes = [v["label"][0] for v in example["labels"].values()]
            top = max(set(votes), key=votes.count) if votes else None
            validated = len(votes) >= example["needed"]
            target = example.get("target_label") or []
            prediction = self.attempts[example["attempt_id"]]["prediction"] if example.get("attempt_id") else None
            rows.append({"example_id": example["id"], "condition": "prompt", "origin": "written",
                         "edit_distance": 0.3, "chars": len(example["text"]), "words": len(example["text"].split()),
                         "target": "+".join(target) or None, "prediction": "+".join(prediction or []) or None,
                         "majority": top if validated and votes.count(top) * 2 > len(votes) else None,
                         "validated": validated, "fooled": bool(example.get("fooled")),
                         "validations": len(votes)})
        return {"round_id": round_id, "round": record["number"], "task": record["task"],
                "labels": list(definition["labels"]),
                "validation_labels": list(definition["validation_labels"] or definition["labels"]),
                "multi_label": definition["family"] == "multi_label", "total_examples": len(rows),
                "truncated": False, "examples": rows,
                "worker_agreement": [dict(r) for r in self.research["agreement"].get(round_id, [])]}

    def build_round(self, round_id: int, **options: Any) -> dict[str, Any]:
        self._enter("build_round", round_id=round_id, **options)
        self._user("researcher")
        record = self._round(round_id)
        if record["status"] not in ("closed", "built"):
            raise _error(409, "conflict", f"round {record['number']} is {record['status']}; close it before building")
        record["status"] = "built"
        build_id = len(self.research["builds"]) + 1
        report = {"counts": {"total": {"train": 12, "dev": 9, "test": 9, "dist_train": 12}}}
        self.research["builds"][round_id] = {"build_id": build_id, "report": report}
        return {"build_id": build_id, "round": record["number"], "task": record["task"], "report": report}

    def _built_round(self, task: str, number: int) -> dict[str, Any]:
        self._task_record(task)
        for record in self.round_records.values():
            if record["task"] == task and record["number"] == number:
                if record["status"] != "built":
                    raise _error(409, "conflict", f"round {number} of {task!r} has not been built; build it first")
                return record
        raise _error(404, "not_found", f"task {task!r} has no round {number}")

    def report(self, task: str, number: int, format: str = "json") -> dict[str, Any] | str:
        self._enter("report", task=task, number=number, format=format)
        self._user("researcher")
        record = self._built_round(task, number)
        report = self.research["builds"].get(record["id"], {}).get("report", {})
        if format == "markdown":
            return f"# {task}, round {number}\n\n| split | examples |\n| --- | --- |\n| train | 12 |\n"
        return dict(report)

    def download_dataset(self, task: str, number: int, split: str = "train", format: str = "jsonl") -> bytes:
        self._enter("download_dataset", task=task, number=number, split=split, format=format)
        self._user("researcher", "client")
        self._built_round(task, number)
        if format == "csv":
            return b"id,text,split\n1,A sentence.," + split.encode() + b"\n"
        return b'{"id": 1, "text": "A sentence.", "split": "' + split.encode() + b'"}\n'

    # jobs: each GET advances the job one step of research["job_steps"], then finishes it.

    def start_job(self, task: str, kind: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._enter("start_job", task=task, kind=kind, params=dict(params or {}))
        user = self._user("researcher")
        self._task_record(task)
        params = dict(params or {})
        if kind not in ("train", "evaluate", "promote"):
            raise _error(422, "invalid", "body.kind: Input should be 'train', 'evaluate' or 'promote'")
        jobs = self.research["jobs"]
        if kind == "train":
            for other in jobs.values():
                if other["task"] == task and other["kind"] == "train" and other["status"] in ("queued", "running"):
                    raise _error(409, "conflict", f"train job {other['id']} of task {task!r} is still "
                                 f"{other['status']}; wait for it to finish", job_id=other["id"])
        else:
            model = self.research["models"].get(params.get("model_id"))
            if model is None or model["task"] != task:
                raise _error(422, "invalid", f"params.model_id: task {task!r} has no model {params.get('model_id')}")
            if kind == "promote" and model["status"] == "trained" and not params.get("force"):
                raise _error(409, "conflict", f"model {model['name']} was never evaluated, so nobody knows whether it "
                             "beats the one in the loop; run an evaluate job first, or set force to promote it anyway")
        params.pop("admin_token", None)  # the API never stores it
        job = {"id": len(jobs) + 1, "kind": kind, "task": task, "status": "queued", "progress": 0.0,
               "message": "queued", "params": params, "result": None, "log": "", "created_by": user["username"],
               "created_at": NOW, "started_at": None, "finished_at": None,
               "_steps": list(self.research["job_steps"]), "_failure": self.research["next_job_failure"]}
        self.research["next_job_failure"] = None
        jobs[job["id"]] = job
        return self._public_job(job)

    @staticmethod
    def _public_job(job: dict[str, Any], with_log: bool = True) -> dict[str, Any]:
        public = {k: v for k, v in job.items() if not k.startswith("_")}
        if not with_log:
            public["log"] = None
        return public

    def _finish_job(self, job: dict[str, Any]) -> None:
        job.update(finished_at=NOW)
        if job["_failure"]:
            job.update(status="failed", message=job["_failure"], log=job["log"] + "\nTraceback: " + job["_failure"])
            return
        params = job["params"]
        if job["kind"] == "train":
            model = self.add_model(job["task"], f"{job['task']}-for-round-{params.get('round', 2)}",
                                   f"v{job['id']}", trained_for_round=params.get("round"))
            message = f"trained and registered {model['name']} (registry id {model['id']})"
        elif job["kind"] == "evaluate":
            model = self.research["models"][params["model_id"]]
            model.update(status="evaluated" if model["status"] == "trained" else model["status"],
                         macro_f1={"round 1 dev": 0.52, "round 1 test": 0.49}, evaluated_at=NOW)
            message = f"evaluated {model['name']}: macro-F1 (%) round 1 dev 52.0, round 1 test 49.0"
        else:
            model = self.research["models"][params["model_id"]]
            for other in self.research["models"].values():
                if other["task"] == job["task"] and other["status"] == "promoted":
                    other["status"] = "retired"
            model.update(status="promoted", endpoint=params["endpoint"], promoted_at=NOW)
            message = f"promoted {model['name']}: {params['endpoint']} now serves it"
        job.update(status="succeeded", progress=1.0, message=message, result={"model": dict(model)},
                   log=job["log"] + "\n" + message)

    def job(self, job_id: int) -> dict[str, Any]:
        self._enter("job", job_id=job_id)
        self._user("researcher")
        job = self.research["jobs"].get(job_id)
        if job is None:
            raise _error(404, "not_found", f"there is no job {job_id}")
        if job["status"] in ("queued", "running"):
            if job["_steps"]:
                status, progress, message = job["_steps"].pop(0)
                job.update(status=status, progress=progress, message=message, started_at=NOW,
                           log=(job["log"] + "\n" + message).strip())
            else:
                self._finish_job(job)
        return self._public_job(job)

    def jobs(self, task: str, *, kind: str | None = None, status: str | None = None,
             limit: int | None = None) -> list[dict[str, Any]]:
        self._enter("jobs", task=task, kind=kind, status=status, limit=limit)
        self._user("researcher")
        self._task_record(task)
        found = [j for j in sorted(self.research["jobs"].values(), key=lambda j: -j["id"]) if j["task"] == task
                 and (kind is None or j["kind"] == kind) and (status is None or j["status"] == status)]
        return [self._public_job(j, with_log=False) for j in found[:limit or 50]]

    def models(self, task: str) -> list[dict[str, Any]]:
        self._enter("models", task=task)
        self._user("researcher")
        self._task_record(task)
        return [{k: v for k, v in m.items() if k != "task"} for m in self.research["models"].values()
                if m["task"] == task]

def _derived(kind: str, *parts: Any) -> str:
    return idempotency_key(kind, *parts)


# --- AppTest helpers ------------------------------------------------------------------


def signed_in_app(fake: FakeApiClient, username: str, page: str | None = None, timeout: float = 10) -> AppTest:
    """The app with ``fake`` as its API client and ``username`` signed in, after one run
    (and on ``page``, e.g. ``"pages/validator.py"``, when given)."""
    at = AppTest.from_file(str(APP_FILE), default_timeout=timeout)
    token = next(t for t, name in fake.tokens.items() if name == username)
    user = FakeApiClient._public_user(fake.users[username])
    at.session_state["client"] = fake
    at.session_state["token"] = token
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
    return "\n".join(str(block.value) for block in at.get("html"))


def markdown_of(at: AppTest) -> str:
    """Everything the page passed through the Markdown renderer (markdown, captions, alerts,
    widget labels), joined: user text must never be in it unescaped."""
    parts: list[str] = []
    for kind in ("markdown", "caption", "error", "warning", "info", "success", "title", "subheader"):
        parts.extend(str(element.value) for element in at.get(kind))
    for kind in ("radio", "button", "text_area", "text_input", "checkbox", "selectbox", "pills", "multiselect"):
        parts.extend(str(getattr(widget, "label", "")) for widget in at.get(kind))
        for widget in at.get(kind):
            parts.extend(str(option) for option in getattr(widget, "options", []) or [])
    return "\n".join(parts)
