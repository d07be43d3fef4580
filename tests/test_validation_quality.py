"""Validator batches, label counting, re-queueing, agreement rates, unqualification, the quiz."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from services.db.models import Example, Task, TaskWorker, Validation
from tests.conftest import Actor, MakeUser, example_yaml, label_example, open_round, served_examples_of, table_counts
from tests.stub_model_server import ThreadedServer

PROMPTS = [f"Prompt number {i} about a small cafe downtown." for i in range(12)]


def write_example(client: Any, writer: Actor, round_id: int, text: str) -> dict[str, Any]:
    """One assignment -> one attempt -> (confirm if fooled) -> submit."""
    assignment = client.post(f"/api/v1/rounds/{round_id}/assignments", json={}, headers=writer.headers).json()
    attempt = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts", json={"text": text}, headers=writer.headers
    ).json()
    if attempt["fooled"]:
        client.post(f"/api/v1/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers)
    response = client.post(
        f"/api/v1/assignments/{assignment['id']}/example", json={"attempt_id": attempt["id"]}, headers=writer.headers
    )
    assert response.status_code == 201, response.text
    return response.json()


@pytest.fixture
def dynasent(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)


def label(client: Any, validator: Actor, example_id: int, value: Any) -> Any:
    return label_example(client, validator, example_id, value)


def batch_examples(app: FastAPI, batch: dict[str, Any]) -> list[int]:
    """The example ids behind a served batch's items, in the order shown (these tasks have no
    control items)."""
    found = served_examples_of(app, batch)
    assert None not in found, "this test's task has no control items"
    return [example_id for example_id in found if example_id is not None]


@pytest.mark.both_databases
def test_batch_selects_fooling_examples_first_and_never_own_or_labelled(
    client: TestClient, app: FastAPI, dynasent: dict[str, Any], make_user: MakeUser, validators: list[Actor]
) -> None:
    writer = make_user("wendy", "writer", "validator")
    plain = write_example(client, writer, dynasent["id"], "An ordinary sentence about lunch today.")
    fooling = write_example(client, writer, dynasent["id"], "A great and wonderful terrible day there.")
    other_writer = make_user("will", "writer")
    third = write_example(client, other_writer, dynasent["id"], "Another ordinary sentence about dinner.")
    batch = client.get(f"/api/v1/rounds/{dynasent['id']}/validation-batch", headers=validators[0].headers).json()
    ids = batch_examples(app, batch)
    assert set(ids) == {plain["id"], fooling["id"], third["id"]}
    assert batch["validation_labels"] == ["positive", "negative", "neutral", "mixed"]
    # Validators never see the writer's target or the model's prediction before labelling, nor
    # the example's id: each item is shown under an opaque id of this serving.
    assert set(batch["data"][0]) == {"item_id", "text", "target_span"}
    # Wendy validates too, but never her own examples.
    own = client.get(f"/api/v1/rounds/{dynasent['id']}/validation-batch", headers=writer.headers).json()
    assert batch_examples(app, own) == [third["id"]]
    # After labelling, an example leaves the validator's batch; a reload returns the held rest.
    assert label(client, validators[0], ids[0], "positive").status_code == 201
    again = client.get(f"/api/v1/rounds/{dynasent['id']}/validation-batch", headers=validators[0].headers).json()
    assert batch_examples(app, again) == ids[1:]
    assert [item["item_id"] for item in again["data"]] == [item["item_id"] for item in batch["data"]][1:]


@pytest.mark.both_databases
def test_claims_spread_examples_across_concurrent_validators(
    client: TestClient,
    app: FastAPI,
    dynasent: dict[str, Any],
    writer: Actor,
    validators: list[Actor],
    make_user: MakeUser,
) -> None:
    example = write_example(client, writer, dynasent["id"], "A plain remark about the weather here.")
    holders = []
    for validator in validators[:5]:
        batch = client.get(f"/api/v1/rounds/{dynasent['id']}/validation-batch", headers=validator.headers).json()
        holders.append(batch_examples(app, batch))
    assert holders == [[example["id"]]] * 5
    # Five validators hold the five slots: a sixth gets nothing until a claim is used or expires.
    sixth = client.get(f"/api/v1/rounds/{dynasent['id']}/validation-batch", headers=validators[5].headers).json()
    assert sixth["data"] == []


@pytest.mark.both_databases
def test_five_labels_validate_an_example_and_the_record_shows_them(
    client: TestClient, dynasent: dict[str, Any], writer: Actor, validators: list[Actor], researcher: Actor
) -> None:
    example = write_example(client, writer, dynasent["id"], "A plain remark about the weather here.")
    for validator, value in zip(validators[:5], ["neutral", "neutral", "neutral", "positive", "mixed"], strict=True):
        assert label(client, validator, example["id"], value).status_code == 201
    # A sixth validator is never served the full example, so a label for it is refused.
    response = label(client, validators[5], example["id"], "neutral")
    assert response.status_code == 409 and "not in a validation batch" in response.json()["error"]["message"]
    record = client.get(f"/api/v1/examples/{example['id']}", headers=researcher.headers).json()
    assert record["status"] == "validated" and record["validation_count"] == 5
    assert sorted(v["label"][0] for v in record["validations"]) == [
        "mixed",
        "neutral",
        "neutral",
        "neutral",
        "positive",
    ]
    assert all(v["counted"] for v in record["validations"])


@pytest.mark.both_databases
def test_unqualify_excludes_labels_requeues_and_requalify_restores(
    client: TestClient,
    app: FastAPI,
    dynasent: dict[str, Any],
    writer: Actor,
    validators: list[Actor],
    researcher: Actor,
) -> None:
    example = write_example(client, writer, dynasent["id"], "A plain remark about the weather here.")
    for validator in validators[:5]:
        assert label(client, validator, example["id"], "neutral").status_code == 201
    bad = validators[0]
    response = client.post(
        f"/api/v1/tasks/dynasent-r2/workers/{bad.username}/unqualify",
        json={"reason": "spot check failed"},
        headers=researcher.headers,
    )
    assert response.status_code == 200 and response.json()["labels_excluded"] == 1
    record = client.get(f"/api/v1/examples/{example['id']}", headers=researcher.headers).json()
    assert record["status"] == "validating" and record["validation_count"] == 4
    assert [v["counted"] for v in record["validations"]] == [False, True, True, True, True]
    # The unqualified validator is stopped; the example is back in the queue for others.
    stopped = client.get(f"/api/v1/rounds/{dynasent['id']}/validation-batch", headers=bad.headers)
    assert stopped.status_code == 403 and "no longer qualified" in stopped.json()["error"]["message"]
    batch = client.get(f"/api/v1/rounds/{dynasent['id']}/validation-batch", headers=validators[5].headers).json()
    assert batch_examples(app, batch) == [example["id"]]
    assert label(client, validators[5], example["id"], "neutral").status_code == 201
    # Requalifying finds the example full again: the old label stays excluded (never > 5 counted).
    response = client.post(f"/api/v1/tasks/dynasent-r2/workers/{bad.username}/requalify", headers=researcher.headers)
    assert response.json() == {"username": bad.username, "qualified": True, "labels_restored": 0}
    with app.state.sessionmaker() as session:
        row = session.get(Example, example["id"])
        counted = session.scalars(
            select(Validation).where(Validation.example_id == example["id"], Validation.counted.is_(True))
        ).all()
        assert row.validation_count == len(counted) == 5 and row.status.value == "validated"


def test_agreement_rates_and_automatic_unqualification(
    client: TestClient, app: FastAPI, researcher: Actor, writer: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    # Batches of 2 and judgement after 2 labels, so the 80% rule triggers quickly.
    yaml_text = example_yaml(
        "dynasent-r2",
        onboarding_quiz=None,
        validation_batch_size=2,
        agreement={
            "gold_min_votes": 3,
            "dev_test_min_votes": 4,
            "unqualify_disagreement_rate": 0.8,
            "min_labels_for_quality": 2,
        },
    )
    round_ = open_round(client, researcher, yaml_text, stub_model.url, PROMPTS)
    crowd = [make_user(f"v{i}", "validator") for i in range(5)]
    examples = [write_example(client, writer, round_["id"], f"A plain remark number {i} about rain.") for i in range(2)]
    for example in examples:
        for validator in crowd[:4]:
            assert label(client, validator, example["id"], "neutral").status_code == 201
    contrarian = crowd[4]
    assert label(client, contrarian, examples[0]["id"], "positive").status_code == 201
    assert label(client, contrarian, examples[1]["id"], "negative").status_code == 201
    # Two labels = one batch window: the contrarian disagreed 100% > 80% and is unqualified.
    rates = {
        r["username"]: r
        for r in client.get(f"/api/v1/rounds/{round_['id']}/worker-agreement", headers=researcher.headers).json()
    }
    assert rates["v0"]["agreement_rate"] == 1.0 and rates["v0"]["qualified"]
    assert rates["v4"]["agreement_rate"] == 0.0 and not rates["v4"]["qualified"]
    with app.state.sessionmaker() as session:
        worker = session.scalars(select(TaskWorker).where(TaskWorker.unqualified_reason.is_not(None))).one()
        assert "100%" in worker.unqualified_reason
        for example in examples:
            assert session.get(Example, example["id"]).validation_count == 4


def test_quiz_feedback_never_says_which_answers_were_wrong(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    """Told which questions were wrong, a writer flips those answers and passes on the next
    try without reading the guidelines. Two failed tries, one wrong answer each in different
    questions, get the same answer but for the attempt counts."""
    open_round(client, researcher, example_yaml("dynasent-r2"), stub_model.url, PROMPTS)
    from services.taskdef import example_path, load_task_definition

    questions = load_task_definition(example_path("dynasent-r2")).onboarding_quiz.questions
    right = [q.answer for q in questions]
    answers = []
    for spoiled in (0, len(right) - 1):
        wrong = list(right)
        wrong[spoiled] = next(option for option in questions[spoiled].options if option != right[spoiled])
        answers.append(wrong)
    writer = make_user("quinn", "writer")
    results = [
        client.post("/api/v1/tasks/dynasent-r2/quiz/attempts", json={"answers": a}, headers=writer.headers).json()
        for a in answers
    ]
    assert results == [
        {"passed": False, "attempts_used": 1, "attempts_left": 4},
        {"passed": False, "attempts_used": 2, "attempts_left": 3},
    ]


def test_onboarding_quiz_gates_writing_and_holds_back_after_five_failures(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    round_ = open_round(client, researcher, example_yaml("dynasent-r2"), stub_model.url, PROMPTS)
    newcomer = make_user("nora", "writer")
    response = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=newcomer.headers)
    assert response.status_code == 403 and "onboarding quiz" in response.json()["error"]["message"]
    quiz = client.get("/api/v1/tasks/dynasent-r2/quiz", headers=newcomer.headers).json()
    assert quiz["attempts_left"] == 5 and all("answer" not in q for q in quiz["questions"])
    wrong = [q["options"][0] for q in quiz["questions"]]
    from services.taskdef import example_path, load_task_definition

    right = [q.answer for q in load_task_definition(example_path("dynasent-r2")).onboarding_quiz.questions]
    assert wrong != right
    for used in range(1, 6):
        result = client.post(
            "/api/v1/tasks/dynasent-r2/quiz/attempts", json={"answers": wrong}, headers=newcomer.headers
        ).json()
        assert result["passed"] is False and result["attempts_used"] == used
    response = client.post("/api/v1/tasks/dynasent-r2/quiz/attempts", json={"answers": right}, headers=newcomer.headers)
    assert response.status_code == 403 and "held back" in response.json()["error"]["message"]
    response = client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=newcomer.headers)
    assert response.status_code == 403 and "held back" in response.json()["error"]["message"]
    # Someone else passes on the first try and may write.
    keen = make_user("kim", "writer")
    result = client.post(
        "/api/v1/tasks/dynasent-r2/quiz/attempts", json={"answers": right}, headers=keen.headers
    ).json()
    assert result == {
        "passed": True,
        "attempts_used": 1,
        "attempts_left": 4,
    }
    assert client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=keen.headers).status_code == 201


def test_quiz_answers_are_hidden_from_writers(
    client: TestClient, researcher: Actor, writer: Actor, stub_model: ThreadedServer
) -> None:
    open_round(client, researcher, example_yaml("dynasent-r2"), stub_model.url, PROMPTS)
    as_writer = client.get("/api/v1/tasks/dynasent-r2", headers=writer.headers).json()
    assert all("answer" not in q for q in as_writer["definition"]["onboarding_quiz"]["questions"])
    as_researcher = client.get("/api/v1/tasks/dynasent-r2", headers=researcher.headers).json()
    assert all("answer" in q for q in as_researcher["definition"]["onboarding_quiz"]["questions"])


def test_skip_ends_assignment_and_next_prompt_is_new(
    client: TestClient, dynasent: dict[str, Any], writer: Actor, app: FastAPI
) -> None:
    first = client.post(f"/api/v1/rounds/{dynasent['id']}/assignments", json={}, headers=writer.headers).json()
    skipped = client.post(f"/api/v1/assignments/{first['id']}/skip", headers=writer.headers).json()
    assert skipped["status"] == "skipped"
    second = client.post(f"/api/v1/rounds/{dynasent['id']}/assignments", json={}, headers=writer.headers)
    assert second.status_code == 201
    assert second.json()["prompt"]["id"] != first["prompt"]["id"]
    before = table_counts(app)
    response = client.post(
        f"/api/v1/assignments/{first['id']}/attempts", json={"text": "Some words here now."}, headers=writer.headers
    )
    assert response.status_code == 409 and "skipped" in response.json()["error"]["message"]
    assert table_counts(app) == before


@pytest.mark.both_databases
def test_unused_first_gives_each_prompt_once_before_reuse(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    round_ = open_round(
        client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS[:4]
    )
    seen = []
    for i in range(4):
        writer = make_user(f"w{i}", "writer")
        seen.append(
            client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()["prompt"][
                "id"
            ]
        )
    assert len(set(seen)) == 4
    stats = client.get(f"/api/v1/rounds/{round_['id']}/stats", headers=researcher.headers).json()
    assert stats["prompts"] == {"total": 4, "used": 4} and stats["assignments"]["active"] == 4


def test_balanced_targets_and_writer_choice(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    round_ = open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)
    targets = []
    for i in range(6):
        writer = make_user(f"b{i}", "writer")
        targets.append(
            client.post(f"/api/v1/rounds/{round_['id']}/assignments", json={}, headers=writer.headers).json()[
                "target_label"
            ][0]
        )
    assert sorted(targets) == ["negative", "negative", "neutral", "neutral", "positive", "positive"]
    chooser = make_user("chooser", "writer")
    response = client.post(
        f"/api/v1/rounds/{round_['id']}/assignments", json={"target_label": "negative"}, headers=chooser.headers
    )
    assert response.status_code == 422 and "assigns target labels" in response.json()["error"]["message"]


def test_no_prompt_condition(client: TestClient, researcher: Actor, writer: Actor, stub_model: ThreadedServer) -> None:
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        stub_model.url,
        None,
        no_prompt_fraction=1.0,
        target_label_mode="writer_choice",
    )
    assignment = client.post(
        f"/api/v1/rounds/{round_['id']}/assignments", json={"target_label": "positive"}, headers=writer.headers
    ).json()
    assert assignment["condition"] == "no_prompt" and assignment["prompt"] is None
    assert "Edit the prompt" not in assignment["goal"]
    attempt = client.post(
        f"/api/v1/assignments/{assignment['id']}/attempts",
        json={"text": "The food was bland and overpriced."},
        headers=writer.headers,
    ).json()
    assert attempt["edit_distance"] is None and attempt["fooled"] is True
    client.post(
        f"/api/v1/attempts/{attempt['id']}/confirmation",
        json={"agrees": False, "judged_label": "negative"},
        headers=writer.headers,
    )
    example = client.post(
        f"/api/v1/assignments/{assignment['id']}/example", json={"attempt_id": attempt["id"]}, headers=writer.headers
    ).json()
    assert example["condition"] == "no_prompt"


def test_unqualifying_in_a_closed_round_requeues_nothing(
    client: TestClient,
    app: FastAPI,
    dynasent: dict[str, Any],
    writer: Actor,
    validators: list[Actor],
    researcher: Actor,
) -> None:
    example = write_example(client, writer, dynasent["id"], "A plain remark about the weather here.")
    for validator in validators[:5]:
        assert label(client, validator, example["id"], "neutral").status_code == 201
    assert (
        client.post(
            f"/api/v1/rounds/{dynasent['id']}/status", json={"status": "closed"}, headers=researcher.headers
        ).status_code
        == 200
    )
    response = client.post(
        f"/api/v1/tasks/dynasent-r2/workers/{validators[0].username}/unqualify",
        json={"reason": "late audit"},
        headers=researcher.headers,
    )
    assert response.json()["labels_excluded"] == 1
    record = client.get(f"/api/v1/examples/{example['id']}", headers=researcher.headers).json()
    assert record["status"] == "validated" and record["validation_count"] == 4


def test_batch_is_selected_fooling_first_but_position_does_not_tell_who_fooled(
    client: TestClient,
    app: FastAPI,
    researcher: Actor,
    make_user: MakeUser,
    validators: list[Actor],
    stub_model: ThreadedServer,
) -> None:
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        stub_model.url,
        PROMPTS,
        target_label_mode="writer_choice",
    )
    writer = make_user("wes", "writer")

    def write(target: str, text: str) -> dict[str, Any]:
        assignment = client.post(
            f"/api/v1/rounds/{round_['id']}/assignments", json={"target_label": target}, headers=writer.headers
        ).json()
        attempt = client.post(
            f"/api/v1/assignments/{assignment['id']}/attempts", json={"text": text}, headers=writer.headers
        ).json()
        if attempt["fooled"]:
            client.post(f"/api/v1/attempts/{attempt['id']}/confirmation", json={"agrees": True}, headers=writer.headers)
        return client.post(
            f"/api/v1/assignments/{assignment['id']}/example",
            json={"attempt_id": attempt["id"]},
            headers=writer.headers,
        ).json()

    plain = write("neutral", "An ordinary sentence about lunch today.")
    fooling = write("negative", "A great and wonderful day there.")
    assert fooling["fooled"] and not plain["fooled"] and plain["id"] < fooling["id"]
    url = f"/api/v1/rounds/{round_['id']}/validation-batch"
    shown = {}
    # Twenty labels per example, so that nineteen validators can each hold both examples (each
    # batch is shuffled with its own seed: all nineteen in one order has a chance of 2 in 2**19).
    with app.state.sessionmaker() as session:
        session.execute(update(Example).values(validations_needed=20))
        session.commit()
    for index in range(19):
        validator = make_user(f"order{index}", "validator")
        first = client.get(url, headers=validator.headers).json()
        again = client.get(url, headers=validator.headers).json()
        assert first == again  # a reload keeps the items, their ids and their order
        ids = batch_examples(app, first)
        assert set(ids) == {plain["id"], fooling["id"]}
        shown[validator.username] = ids.index(fooling["id"])
    # The fooling example comes first for some validators and second for others.
    assert set(shown.values()) == {0, 1}, shown
    # With room for one example only, the fooling one is selected.
    with app.state.sessionmaker() as session:
        session.execute(
            update(Task).values(
                definition={**session.scalars(select(Task)).one().definition, "validation_batch_size": 1}
            )
        )
        session.commit()
    newcomer = make_user("nia", "validator")
    batch = client.get(url, headers=newcomer.headers).json()
    assert batch_examples(app, batch) == [fooling["id"]]
