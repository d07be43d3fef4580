"""Build policies (docs/round_builder.md, "Build policies"): a small round that strict cannot
build is refused with what is short and the relaxations' previews, builds relaxed, and its
report states only what its numbers show; the class-balance guard; no-prompt examples in dev/test."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sklearn.metrics import accuracy_score, f1_score

from rounds.build import splits
from rounds.build.report import render_markdown
from tests.built_round import KEYWORD, LABELS, write_and_label
from tests.conftest import Actor, MakeUser, example_yaml, open_round, table_snapshot
from tests.stub_model_server import ThreadedServer

# Gold label -> the model's prediction for each of its examples (the stub predicts by keyword):
# four examples per class, so the relaxed policy's guard lets one to dev and one to test.
SMALL = {
    "positive": ["positive", "positive", "positive", "neutral"],
    "negative": ["negative", "negative", "neutral", "negative"],
    "neutral": ["neutral", "neutral", "neutral", "positive"],
}
TABLES = ("round_builds", "built_examples", "rounds", "audit_log")


def _small_round(client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer) -> int:
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        stub_model.url,
        [f"Prompt {i}: the cafe serves lunch." for i in range(20)],
        target_label_mode="writer_choice",
    )
    writer = make_user("wendy", "writer")
    validators = [make_user(f"pv{i}", "validator") for i in range(5)]
    plan = []
    for gold, predictions in SMALL.items():
        for i, predicted in enumerate(predictions):
            other = "mixed"
            votes = [gold] * 5 if i % 2 else [gold, gold, gold, gold, other]
            plan.append((gold, f"Note {gold} {i}: a {KEYWORD[predicted]} lunch.", None, votes))
    write_and_label(client, writer, validators, round_["id"], plan)
    assert (
        client.post(
            f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers
        ).status_code
        == 200
    )
    return int(round_["id"])


@pytest.mark.both_databases
def test_small_round_strict_refused_with_relaxations_then_relaxed_report_is_honest(
    app: FastAPI, client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    round_id = _small_round(client, researcher, make_user, stub_model)
    before = table_snapshot(app, *TABLES)
    refused = client.post(f"/api/v1/rounds/{round_id}/build", json={"seed": 1}, headers=researcher.headers)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["message"].startswith("the strict policy cannot be met: cell gold=positive/predicted=negative")
    assert "\n" not in error["message"]
    short = {s["cell"]: s for s in error["details"]["short"]}
    assert short["gold=positive/predicted=negative"] == {
        "cell": "gold=positive/predicted=negative",
        "available": 0,
        "needed": 2,
        "short_by": 2,
    }
    relaxations = {r["name"]: r for r in error["details"]["relaxations"]}
    relaxed = relaxations["relaxed"]
    assert relaxed["feasible"] and relaxed["settings"] == {"policy": "relaxed", "chance": False}
    assert relaxed["counts"] == {"train": 6, "dev": 3, "test": 3, "excluded": 0}
    assert relaxed["classes"] == {c: {"train": 2, "dev": 1, "test": 1} for c in SMALL}
    assert "relaxed (policy=relaxed, chance=false): dev 3 (1 per class), test 3" in error["message"]
    assert table_snapshot(app, *TABLES) == before

    # The preview endpoint says the same and records nothing.
    preview = client.post(f"/api/v1/rounds/{round_id}/build/preview", json={}, headers=researcher.headers)
    assert preview.status_code == 200, preview.text
    assert preview.json()["requested"]["feasible"] is False
    assert {r["name"]: r for r in preview.json()["relaxations"]}["relaxed"] == relaxed
    assert table_snapshot(app, *TABLES) == before

    built = client.post(
        f"/api/v1/rounds/{round_id}/build", json={"seed": 1, **relaxed["settings"]}, headers=researcher.headers
    )
    assert built.status_code == 201, built.text
    report = built.json()["report"]
    s = report["splits"]
    assert s["policy"]["name"] == "relaxed" and s["policy"]["chance"] is False
    assert s["policy"]["max_dev_test_share"] == 0.5
    # The report's numbers are the build's: cells as they are, metrics recomputed from them.
    for name in ("dev", "test"):
        y_true = [c["gold"] for c in s["cells"] for _ in range(c[name])]
        y_pred = [c["predicted"] for c in s["cells"] for _ in range(c[name])]
        assert len(y_true) == s["assessment"][name]["examples"] == 3
        labels = ["positive", "negative", "neutral"]
        assert s["assessment"][name]["model_macro_f1"] == pytest.approx(
            f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0), abs=1e-4
        )
        assert s["assessment"][name]["model_accuracy"] == pytest.approx(accuracy_score(y_true, y_pred), abs=1e-4)
        assert s["independence"][name]["n"] == 3
    counts = report["agreement_counts"]
    assert counts["at_least"][">=4 of 5"] == 12 and counts["at_least"][">=5 of 5"] == 6
    assert counts["by_votes"] == {"5 of 5": 6, "4 of 5": 6}
    assert {c: v["train_all"] for c, v in s["balance"]["classes"].items()} == dict.fromkeys(SMALL, 2)

    assert_markdown_matches(report)
    markdown = render_markdown(report)
    assert "## Dev and test: relaxed policy — model not held at chance" in markdown
    assert "model at chance" not in markdown.lower().replace("not held at chance", "")
    assert "examples per (gold, predicted) cell in each of dev and test" not in markdown
    assert "| >=4 of 5 | 12 |" in markdown
    for cell in s["cells"]:
        assert f"| {cell['gold']} | {cell['predicted']} | {cell['dev']} | {cell['test']} |" in markdown
    assert "the model not held at chance" in report["datasheet"]["dev_test_rule"]
    assert report["datasheet"]["build_policy"].startswith("Dev and test: relaxed policy")


# A closed 12-example round, every gold with at least 4 of 5 votes (so fewer votes free
# nothing): 5 positive, 4 negative, 3 neutral. The relaxed policy's guard (0.5) lets dev+test
# take 1 of neutral's 3, fewer than one each; 0.6 still 1; 0.7 lets them take 2.
LOPSIDED = {
    "positive": ["positive", "positive", "neutral", "negative", "positive"],
    "negative": ["negative", "neutral", "negative", "positive"],
    "neutral": ["neutral", "positive", "neutral"],
}


def _lopsided_round(client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer) -> int:
    plan = [
        (gold, f"Note {gold} {i}: a {KEYWORD[predicted]} lunch.", [gold] * 5 if i % 2 else [gold] * 4 + ["mixed"])
        for gold, predictions in LOPSIDED.items()
        for i, predicted in enumerate(predictions)
    ]
    return _closed_round(client, researcher, make_user, stub_model, plan)


@pytest.mark.both_databases
def test_lopsided_round_refusals_name_the_share_that_builds_and_it_builds(
    app: FastAPI, client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    round_id = _lopsided_round(client, researcher, make_user, stub_model)
    before = table_snapshot(app, *TABLES)
    widened = "relaxed, dev+test up to 0.7 of each class"
    expected: dict[str, Any] = {
        "name": widened,
        "settings": {"policy": "relaxed", "chance": False, "max_dev_test_share": 0.7},
        "feasible": True,
        "constraint": None,
        "unit": "class",
        "dev_per_cell": 1,
        "test_per_cell": 1,
        "counts": {"train": 6, "dev": 3, "test": 3, "excluded": 0},
        "classes": {
            "positive": {"train": 3, "dev": 1, "test": 1},
            "negative": {"train": 2, "dev": 1, "test": 1},
            "neutral": {"train": 1, "dev": 1, "test": 1},
        },
    }
    votes = ["relaxed, 3 of 5 votes", "relaxed, 3 of 5 votes, dev+test up to 0.7 of each class"]
    chance = "model at chance, 3 of 5 votes"
    offered = {
        # Each relaxed option the guard refuses is followed by the first share that builds (0.6
        # does not); the requested policy itself is not listed, but its wider share is.
        "{}": ["relaxed", widened, *votes, chance],
        '{"policy": "relaxed"}': ["strict", widened, *votes, chance],
        '{"policy": "relaxed", "max_dev_test_share": 0.6}': ["strict", "relaxed", widened, *votes, chance],
    }
    for text, names in offered.items():
        body = json.loads(text)
        refused = client.post(f"/api/v1/rounds/{round_id}/build", json=body, headers=researcher.headers)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert [r["name"] for r in error["details"]["relaxations"]] == names
        relaxations = {r["name"]: r for r in error["details"]["relaxations"]}
        assert [r["constraint"] for r in relaxations.values() if not r["feasible"]] == [
            "dev_test_size" if name in ("strict", chance) else "balance_guard"
            for name in names
            if not relaxations[name]["feasible"]
        ]
        # What the guard refused is listed with the constraint that refused it; the widened
        # share that builds follows it, with every count.
        if body == {}:
            assert relaxations["relaxed"]["feasible"] is False
            assert relaxations["relaxed"]["constraint"] == "balance_guard"
        assert {k: relaxations[widened][k] for k in expected} == expected
        assert (
            f"{widened} (policy=relaxed, chance=false, max_dev_test_share=0.7): dev 3 (1 per class), "
            "test 3 (1 per class), train 6; per class train/dev/test: positive 3/1/1, negative 2/1/1, neutral 1/1/1"
        ) in error["message"]
        assert "collect" not in error["message"]
        assert table_snapshot(app, *TABLES) == before

    preview = client.post(
        f"/api/v1/rounds/{round_id}/build/preview", json={"policy": "relaxed"}, headers=researcher.headers
    )
    assert preview.status_code == 200, preview.text
    assert preview.json()["requested"]["constraint"] == "balance_guard"
    assert {r["name"]: r for r in preview.json()["relaxations"]}[widened] == relaxations[widened]
    assert table_snapshot(app, *TABLES) == before

    built = client.post(
        f"/api/v1/rounds/{round_id}/build", json={"seed": 0, **expected["settings"]}, headers=researcher.headers
    )
    assert built.status_code == 201, built.text
    report = built.json()["report"]
    assert report["counts"]["total"] == {"dist_train": 6, "train": 6, "dev": 3, "test": 3}
    assert report["splits"]["policy"]["max_dev_test_share"] == 0.7
    assert {c: v["train_all"] for c, v in report["splits"]["balance"]["classes"].items()} == {
        c: v["train"] for c, v in expected["classes"].items()
    }


def test_build_settings_are_validated_without_touching_the_database(
    app: FastAPI, client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    round_id = _small_round(client, researcher, make_user, stub_model)
    before = table_snapshot(app, *TABLES)
    for body in (
        {"max_per_cell": 0},
        {"policy": "strict", "chance": False},
        {"policy": "lenient"},
        {"dev_test_min_votes": 9},
        {"max_per_cell": 1, "min_per_cell": 2},
        {"max_dev_test_share": 0},
    ):
        response = client.post(f"/api/v1/rounds/{round_id}/build", json=body, headers=researcher.headers)
        assert response.status_code == 422, (body, response.text)
        assert set(response.json()) == {"error"}
    assert table_snapshot(app, *TABLES) == before


def _frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=splits.COLUMNS)


def test_balance_guard_keeps_half_of_each_class_in_train() -> None:
    # A one-sided round: 40 of class a, 8 of class b, all eligible; without the guard dev+test
    # would take all 8 of b.
    rows = [(f"a{i}", "a", 5, f"pa{i}", "prompt", "a") for i in range(40)]
    rows += [(f"b{i}", "b", 5, f"pb{i}", "prompt", "b") for i in range(8)]
    unguarded = splits.build_splits(_frame(rows), ["a", "b"], chance=False)
    unguarded_classes: Any = unguarded.report.balance["classes"]
    assert unguarded_classes["b"]["train_all"] == 0
    assert any("train has no example of b" in note for note in unguarded.report.notes)
    guarded = splits.build_splits(_frame(rows), ["a", "b"], chance=False, max_dev_test_share=0.5)
    classes: Any = guarded.report.balance["classes"]
    assert classes["b"] == {"eligible": 8, "train": 4, "dev": 2, "test": 2, "train_all": 4}
    assert classes["a"]["dev"] == 2 and classes["a"]["test"] == 2
    with pytest.raises(splits.SplitError, match="class-balance guard") as raised:
        splits.build_splits(_frame(rows[:43]), ["a", "b"], chance=False, max_dev_test_share=0.5)
    assert raised.value.details["short"][0] == {"cell": "b", "available": 3, "needed": 4, "short_by": 1}


def test_no_prompt_examples_stand_alone_in_dev_and_test() -> None:
    rows = [(f"e{g}{i}", g, 5, None, "no_prompt", g) for g in "ab" for i in range(6)]
    with pytest.raises(splits.SplitError, match="distinct prompts"):
        splits.build_splits(_frame(rows), ["a", "b"], chance=False)
    result = splits.build_splits(_frame(rows), ["a", "b"], chance=False, no_prompt_eligible=True)
    assert result.assignment.value_counts().to_dict() == {"dev": 6, "test": 6, "train": 0, "excluded": 0}
    assert result.flags["no_prompt"].all() and not result.flags["prompt_shared_with_assessment"].any()
    # Mixed: prompt examples keep the distinct-prompt rule; no-prompt ones stand alone.
    mixed = rows + [(f"p{i}", "a", 5, "shared", "prompt", "a") for i in range(3)]
    result = splits.build_splits(_frame(mixed), ["a", "b"], chance=False, no_prompt_eligible=True)
    shared = result.assignment.loc[[f"p{i}" for i in range(3)]]
    assert int(np.isin(shared.to_numpy(), ["dev", "test"]).sum()) <= 1


def _prepared(rows: list[tuple[Any, ...]]) -> Any:
    """A dynasent-r2 round read and aggregated (rounds.build.pipeline.Prepared) from split rows,
    without a database: what rounds.build.preview works on."""
    from rounds.build.round_data import Prepared, RoundData
    from services.taskdef import example_path, load_task_definition

    frame = _frame(rows)
    data = RoundData(
        load_task_definition(example_path("dynasent-r2")), frame.copy(), pd.DataFrame(), pd.DataFrame(), {}, []
    )
    return Prepared(data, pd.DataFrame(), np.zeros(len(frame), dtype=bool), frame, frame)


def test_a_mixed_round_is_offered_its_no_prompt_examples_in_dev_and_test() -> None:
    """Every prompt example shares one prompt, so dev and test cannot take two of a class from
    them; the round's no-prompt examples, each on its own, can: that option is offered."""
    from rounds.build.build_settings import BuildSettings, resolve_policy
    from rounds.build.preview import relaxations_for

    rows: list[tuple[Any, ...]] = [(f"p{g}{i}", g, 5, "shared", "prompt", g) for g in LABELS for i in range(2)]
    rows += [(f"n{g}{i}", g, 5, None, "no_prompt", g) for g in LABELS for i in range(4)]
    prepared = _prepared(rows)
    config = BuildSettings(policy="relaxed")
    policy = resolve_policy(config, prepared.data.definition, prepared.data.examples)
    assert policy.no_prompt_in_dev_test is False
    options = {o.name: o for o in relaxations_for(prepared, config, policy, refused_by="dev_test_size")}
    assert [name for name, o in options.items() if o.feasible] == ["relaxed, no-prompt examples in dev/test"]
    option = options["relaxed, no-prompt examples in dev/test"]
    assert option.settings == {"policy": "relaxed", "chance": False, "no_prompt_in_dev_test": True}
    assert option.counts["dev"] == option.counts["test"] == 3
    assert options["relaxed, 3 of 5 votes"].constraint == "dev_test_size"
    # A round of prompt examples only is not offered the setting: it would change nothing.
    only_prompts = _prepared([r for r in rows if r[4] == "prompt"])
    assert "relaxed, no-prompt examples in dev/test" not in {
        o.name for o in relaxations_for(only_prompts, config, policy, refused_by="dev_test_size")
    }


def _closed_round(
    client: TestClient,
    researcher: Actor,
    make_user: MakeUser,
    stub_model: ThreadedServer,
    plan: list[tuple[str, str, list[str]]],
    **round_options: Any,
) -> int:
    """A dynasent-r2 round with ``plan``'s (target, text, five labels), closed."""
    prompts = [] if round_options.get("no_prompt_fraction") == 1.0 else [f"Prompt {i}: lunch." for i in range(20)]
    round_ = open_round(
        client,
        researcher,
        example_yaml("dynasent-r2", onboarding_quiz=None),
        stub_model.url,
        prompts,
        target_label_mode="writer_choice",
        **round_options,
    )
    writer = make_user("nora", "writer")
    validators = [make_user(f"nv{i}", "validator") for i in range(5)]
    write_and_label(client, writer, validators, round_["id"], [(t, text, None, votes) for t, text, votes in plan])
    response = client.post(
        f"/api/v1/rounds/{round_['id']}/status", json={"status": "closed"}, headers=researcher.headers
    )
    assert response.status_code == 200, response.text
    return int(round_["id"])


def test_no_prompt_round_builds_with_each_example_on_its_own(
    client: TestClient, researcher: Actor, make_user: MakeUser, stub_model: ThreadedServer
) -> None:
    plan = [
        (gold, f"Post {gold} {i}: a {KEYWORD[predicted]} lunch.", [gold] * 5)
        for gold, predictions in SMALL.items()
        for i, predicted in enumerate(predictions)
    ]
    round_id = _closed_round(client, researcher, make_user, stub_model, plan, no_prompt_fraction=1.0)
    response = client.post(f"/api/v1/rounds/{round_id}/build", json={"policy": "relaxed"}, headers=researcher.headers)
    assert response.status_code == 201, response.text
    report = response.json()["report"]
    assert report["conditions"]["no_prompt"]["examples"] == 12 and "prompt" not in report["conditions"]
    policy = report["splits"]["policy"]
    assert policy["no_prompt_in_dev_test"] is True and policy["chance"] is False
    assert report["counts"]["total"] == {"dist_train": 6, "train": 6, "dev": 3, "test": 3}
    assert "each no-prompt example on its own" in report["datasheet"]["dev_test_rule"]


@pytest.mark.parametrize(
    ("kind", "status"),
    [("empty", 409), ("one_class", 422), ("no_majority", 422)],
)
def test_odd_rounds_are_refused_in_one_line_and_change_nothing(
    app: FastAPI,
    client: TestClient,
    researcher: Actor,
    make_user: MakeUser,
    stub_model: ThreadedServer,
    kind: str,
    status: int,
) -> None:
    plans: dict[str, list[tuple[str, str, list[str]]]] = {
        "empty": [],
        "one_class": [("positive", f"Note {i}: a great lunch.", ["positive"] * 5) for i in range(6)],
        "no_majority": [
            ("neutral", f"Note {i}: a plain lunch.", ["positive", "negative", "neutral", "mixed", "positive"][::-1])
            for i in range(6)
        ],
    }
    round_id = _closed_round(client, researcher, make_user, stub_model, plans[kind])
    before = table_snapshot(app, *TABLES)
    for body in ({}, {"policy": "relaxed"}, {"chance": False, "max_dev_test_share": 1.0}):
        for path in ("build", "build/preview"):
            response = client.post(f"/api/v1/rounds/{round_id}/{path}", json=body, headers=researcher.headers)
            if path == "build/preview" and kind != "empty":
                assert response.status_code == 200, response.text
                assert not any(r["feasible"] for r in [response.json()["requested"], *response.json()["relaxations"]])
                continue
            assert response.status_code == status, (kind, body, response.text)
            message = response.json()["error"]["message"]
            assert message and "\n" not in message and "Traceback" not in message
            if status == 422:
                # Nothing builds and the round is closed: the way on is another round, not "collect more".
                assert not any(r["feasible"] for r in response.json()["error"]["details"]["relaxations"])
                assert message.endswith(
                    "No relaxation builds round 1, and a closed round takes no more examples or labels: collect "
                    "them in the next round, or bring a labelled dataset or crowd responses in as a round "
                    "(dynaloop round import; POST /api/v1/tasks/{task}/rounds/{n}/imports)"
                ), message
    assert table_snapshot(app, *TABLES) == before


def test_intended_vs_perceived_table_names_its_axes() -> None:
    import json
    from pathlib import Path

    report = json.loads((Path(__file__).parent / "data" / "round_reports" / "isarcasm.json").read_text("utf-8"))
    markdown = render_markdown(report)
    assert "| intended ↓ / perceived → | sarcastic | not_sarcastic |" in markdown
    confusion = report["intended_vs_perceived"]["confusion"]
    for intended in ("sarcastic", "not_sarcastic"):
        row = f"| {intended} | " + " | ".join(str(confusion[p][intended]) for p in confusion) + " |"
        assert row in markdown


def test_cli_build_refuses_bad_settings_and_prints_the_relaxations(
    client: TestClient,
    researcher: Actor,
    make_user: MakeUser,
    stub_model: ThreadedServer,
    database_url: str,
    tmp_path: Any,
) -> None:
    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    _small_round(client, researcher, make_user, stub_model)
    runner = CliRunner()
    base = ["round", "build", "--task", "dynasent-r2", "--round", "1", "--database-url", database_url]
    result = runner.invoke(cli, [*base, "--max-per-cell", "0", "--out", str(tmp_path / "a")])
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit)
    assert "invalid build settings" in result.output and "max_per_cell" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(cli, [*base, "--out", str(tmp_path / "b")])
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit)
    assert "the strict policy cannot be met: cell gold=positive/predicted=negative" in result.output
    assert (
        "relaxed (--policy relaxed --no-chance): dev 3 (1 per class), test 3 (1 per class), train 6; "
        "per class train/dev/test: positive 2/1/1, negative 2/1/1, neutral 2/1/1"
    ) in result.output
    assert "dynaloop round build --task dynasent-r2 --round 1 --policy relaxed --no-chance\n" in result.output
    result = runner.invoke(cli, [*base, "--policy", "relaxed", "--no-chance", "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "c" / "report.md").read_text(encoding="utf-8")
    assert "## Dev and test: relaxed policy — model not held at chance" in markdown


def assert_markdown_matches(report: dict[str, Any]) -> None:
    """Each statement report.md makes about dev and test is what report.json's numbers show."""
    markdown = render_markdown(report)
    s = report["splits"]
    at_chance_claimed = "model at chance (" in markdown
    assert at_chance_claimed == bool(s["chance"] and s["at_chance"])
    if at_chance_claimed:
        k = len(report["counts"]["labels"])
        for name in ("dev", "test"):
            assert s["assessment"][name]["model_macro_f1"] == pytest.approx(1 / k, abs=1e-4)
            assert s["assessment"][name]["model_accuracy"] == pytest.approx(1 / k, abs=1e-4)
    if "examples per (gold, predicted) cell in each of dev and test" in markdown:
        assert s["cells"] and all(c["dev"] == c["test"] == s["cell_count"] for c in s["cells"])
    heading = f"## Dev and test: {'model at chance' if at_chance_claimed else ''}"
    assert heading in markdown or "not held at chance" in markdown or "not at chance" in markdown
    assert f"Policy: **{s['policy']['name']}**" in markdown
    for name, a in s["assessment"].items():
        row = f"| {name} | {a['examples']:,} | "
        assert row in markdown
    for name in ("dev", "test"):
        assert sum(c[name] for c in s["cells"]) == s["assessment"][name]["examples"]
        assert report["counts"]["total"][name] == s["assessment"][name]["examples"]
    for key, value in (report.get("agreement_counts") or {}).get("at_least", {}).items():
        assert f"| {key} | {value:,} |" in markdown
    for cls, counts in s["balance"].get("classes", {}).items():
        assert counts["dev"] + counts["test"] <= counts["eligible"]
        share = s["balance"].get("max_dev_test_share")
        if share is not None:
            assert counts["dev"] + counts["test"] <= share * counts["eligible"] + 1e-9
        if counts["train_all"] == 0:
            assert any(cls in note and "train has no example" in note for note in s["notes"])


@pytest.mark.parametrize("name", ["dynasent-r2", "ethioemo-amharic", "isarcasm", "mad-tsc"])
def test_stored_reports_markdown_matches_their_numbers(name: str) -> None:
    import json
    from pathlib import Path

    report = json.loads((Path(__file__).parent / "data" / "round_reports" / f"{name}.json").read_text("utf-8"))
    assert_markdown_matches(report)


def test_cli_prints_the_exact_options_that_build_a_lopsided_round_and_they_build(
    app: FastAPI,
    client: TestClient,
    researcher: Actor,
    make_user: MakeUser,
    stub_model: ThreadedServer,
    database_url: str,
    tmp_path: Any,
) -> None:
    """`round build --policy relaxed` and `round build-preview` on a round only a wider
    class-balance guard builds: both print that option's command, which builds when pasted."""
    import shlex

    from typer.testing import CliRunner

    from dynaloop.cli import app as cli

    _lopsided_round(client, researcher, make_user, stub_model)
    before = table_snapshot(app, *TABLES)
    runner = CliRunner()
    where = ["--task", "dynasent-r2", "--round", "1", "--database-url", database_url]
    command = "dynaloop round build --task dynasent-r2 --round 1 --policy relaxed --no-chance --max-dev-test-share 0.7"
    counts = (
        "dev 3 (1 per class), test 3 (1 per class), train 6; "
        "per class train/dev/test: positive 3/1/1, negative 2/1/1, neutral 1/1/1"
    )

    refused = runner.invoke(cli, ["round", "build", *where, "--policy", "relaxed", "--out", str(tmp_path / "a")])
    assert refused.exit_code == 1 and isinstance(refused.exception, SystemExit), refused.output
    lines = refused.output.splitlines()
    assert "Options that build round 1 of dynasent-r2:" in lines
    assert (
        "  relaxed, dev+test up to 0.7 of each class (--policy relaxed --no-chance --max-dev-test-share 0.7): " + counts
    ) in lines
    assert f"    {command}" in lines
    assert lines[-1].startswith("error: the relaxed policy cannot be met: the class-balance guard lets dev+test")
    assert table_snapshot(app, *TABLES) == before

    previewed = runner.invoke(cli, ["round", "build-preview", *where, "--policy", "relaxed"])
    assert previewed.exit_code == 0, previewed.output
    lines = previewed.output.splitlines()
    assert lines[0].startswith("requested: cannot build (balance_guard): the class-balance guard lets dev+test")
    assert "strict: cannot build (dev_test_size): cell gold=neutral/predicted=negative has 0 eligible" in "\n".join(
        lines
    )
    assert f"relaxed, dev+test up to 0.7 of each class: builds: {counts}" in lines
    commands = [line.strip() for line in lines if line.startswith("    dynaloop round build ")]
    assert commands[0] == command and len(commands) == 2  # also with 3 of 5 votes
    assert table_snapshot(app, *TABLES) == before

    # Pasted as printed, the command builds the round with the counts it promised.
    pasted = shlex.split(commands[0])[1:]
    built = runner.invoke(cli, [*pasted, "--database-url", database_url, "--out", str(tmp_path / "b")])
    assert built.exit_code == 0, built.output
    assert built.output.startswith("build 1: train 6, dev 3, test 3;"), built.output
    report = json.loads((tmp_path / "b" / "report.json").read_text(encoding="utf-8"))
    assert report["splits"]["policy"]["max_dev_test_share"] == 0.7
