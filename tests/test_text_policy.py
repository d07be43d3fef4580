"""One text policy wherever text enters (issue 12, point 10; services/text.py, docs/design.md
"Text policy"): display names and token names are printable one-line text without markup;
bidi embeddings, overrides and isolates are refused in sentences, prompts, their metadata,
flag reasons, notes and task titles; invisible format characters are stripped; real text in
Hindi (with ZWJ and ZWNJ), Persian (ZWNJ), Amharic (Ge'ez), Arabic (RLM) and emoji ZWJ
sequences is stored exactly as typed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select
from typer.testing import CliRunner

from services.db.models import ApiToken, Prompt, User
from tests.conftest import Actor, MakeUser, example_yaml, open_round
from tests.stub_model_server import ThreadedServer
from tests.test_bad_input import (
    PROMPTS,
    assert_error,
    post_attempt,
    start,
    task_yaml,
    unchanged,
    write_example,
)

API = "/api/v1"
RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: "evil\u202etxt.exe" shows as "evilexe.txt"

# Real text that the policy must keep byte for byte.
HINDI = "मैं क्\u200dषमा चाहता हूँ, यह खाना अच्छा था"  # ZWJ: the half form of क in क्‍ष
HINDI_ZWNJ = "यह क्\u200cष नहीं, खाना ठीक था"  # ZWNJ: the explicit virama form
PERSIAN = "من می\u200cخواهم این غذا را دوباره بخورم"  # ZWNJ inside می‌خواهم
AMHARIC = "ዛሬ ምግቡ በጣም ጥሩ ነበር።"
ARABIC_RLM = "\u200fقال لي: the food was fine, 100%\u200f"
SCOTLAND = "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"  # an emoji tag sequence
EMOJI_ZWJ = f"I am a 👩\u200d💻 who loved this ❤\ufe0f\u200d🔥 place {SCOTLAND}"
REAL_TEXTS = [
    pytest.param(HINDI, id="hindi-zwj"),
    pytest.param(HINDI_ZWNJ, id="hindi-zwnj"),
    pytest.param(PERSIAN, id="persian-zwnj"),
    pytest.param(AMHARIC, id="amharic-geez"),
    pytest.param(ARABIC_RLM, id="arabic-rlm"),
    pytest.param(EMOJI_ZWJ, id="emoji-zwj-and-tag-sequence"),
]


@pytest.fixture
def dynasent(client: TestClient, researcher: Actor, stub_model: ThreadedServer) -> dict[str, Any]:
    return open_round(client, researcher, example_yaml("dynasent-r2", onboarding_quiz=None), stub_model.url, PROMPTS)


def users_named(app: Any) -> dict[str, str | None]:
    with app.state.sessionmaker() as session:
        return dict(session.execute(select(User.username, User.display_name)).all())


# --- display names and token names -------------------------------------------------------

NAME_ATTACKS = [
    pytest.param("Ana\x00", ["control character", "U+0000", "position 3"], id="nul"),
    pytest.param(f"Ana {RLO}moc.evil", ["bidirectional control", "U+202E", "RIGHT-TO-LEFT OVERRIDE"], id="rlo"),
    pytest.param("Ana\u2066Lima\u2069", ["bidirectional control", "U+2066"], id="isolate"),
    pytest.param("Ana\x1b[31mRed", ["control character", "U+001B"], id="escape"),
    pytest.param("Ana\nAdmin: yes", ["line break", "U+000A", "one line"], id="newline"),
    pytest.param("<script>alert(1)</script>", ["less-than sign", "cannot contain < or >"], id="script-tag"),
    pytest.param("Ana<img src=x onerror=alert(1)>", ["less-than sign"], id="img-tag"),
    pytest.param("\u200b\u200b\ufeff", ["empty", "invisible"], id="only-invisible"),
    pytest.param("   ", ["empty"], id="blank"),
]


@pytest.mark.parametrize(("name", "fragments"), NAME_ATTACKS)
def test_display_name_attacks_are_refused(
    client: TestClient, app: FastAPI, make_user: MakeUser, name: str, fragments: list[str]
) -> None:
    admin = make_user("ada", "admin")
    with unchanged(app):
        response = client.post(
            f"{API}/users",
            json={"username": "mallory", "roles": ["writer"], "display_name": name},
            headers=admin.headers,
        )
        error = assert_error(response, 422, "invalid", "display_name", *fragments)
    assert error["details"] == {"field": "display_name"}
    assert "mallory" not in users_named(app)


@pytest.mark.parametrize(("name", "fragments"), NAME_ATTACKS)
def test_token_name_attacks_are_refused(
    client: TestClient, app: FastAPI, make_user: MakeUser, name: str, fragments: list[str]
) -> None:
    admin = make_user("ada", "admin")
    if name.strip() == "":
        fragments = ["name"]  # the schema's min_length, or the policy's "empty"
    with unchanged(app):
        response = client.post(f"{API}/users/ada/tokens", json={"name": name}, headers=admin.headers)
        assert_error(response, 422, "invalid", "name", *fragments)


@pytest.mark.both_databases
@pytest.mark.parametrize(
    "name",
    [
        HINDI[:20],
        "मेहदी\u200cज़ादा",
        "مهدی\u200cزاده",
        "አበበ በቀለ",
        "\u200fسارا\u200f",
        "Ana 👩\u200d💻 Lima",
        "O'Brien & Søn",
    ],
)
def test_real_names_are_kept_as_typed(client: TestClient, app: FastAPI, make_user: MakeUser, name: str) -> None:
    admin = make_user("ada", "admin")
    response = client.post(
        f"{API}/users", json={"username": "worker1", "roles": ["writer"], "display_name": name}, headers=admin.headers
    )
    assert response.status_code == 201, response.text
    assert response.json()["display_name"].encode() == name.encode()
    assert users_named(app)["worker1"] == name
    response = client.post(f"{API}/users/worker1/tokens", json={"name": name}, headers=admin.headers)
    assert response.status_code == 201, response.text
    with app.state.sessionmaker() as session:
        assert session.scalar(select(ApiToken.name).where(ApiToken.id == response.json()["id"])) == name


def test_names_are_trimmed_and_invisible_characters_stripped(
    client: TestClient, app: FastAPI, make_user: MakeUser
) -> None:
    admin = make_user("ada", "admin")
    response = client.post(
        f"{API}/users",
        json={"username": "worker1", "roles": ["writer"], "display_name": "  \ufeffAna\u200b Lima\u2060 "},
        headers=admin.headers,
    )
    assert response.status_code == 201, response.text
    assert users_named(app)["worker1"] == "Ana Lima"


def test_cli_refuses_a_display_name_with_a_bidi_override(tmp_path: Any) -> None:
    from dynaloop.cli import app as cli

    env = {"DYNALOOP_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    result = CliRunner().invoke(cli, ["db", "upgrade"], env=env)
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(
        cli, ["user", "create", "mallory", "--role", "writer", "--display-name", f"Ana{RLO}"], env=env
    )
    assert result.exit_code != 0
    assert "U+202E" in result.output and "display_name" in result.output
    result = CliRunner().invoke(
        cli, ["user", "create", "anita", "--role", "writer", "--display-name", "अनीता\u200d"], env=env
    )
    assert result.exit_code == 0, result.output


# --- sentences, prompts and their metadata, flags, notes, task titles ------------------------


@pytest.mark.both_databases
@pytest.mark.parametrize("text", REAL_TEXTS)
def test_real_script_sentences_pass_unchanged(
    client: TestClient, app: FastAPI, writer: Actor, dynasent: dict[str, Any], text: str
) -> None:
    example = write_example(client, writer, dynasent["id"], text=text)
    assert example["text"].encode("utf-8") == text.encode("utf-8")


def test_bidi_override_in_a_sentence_is_refused(
    client: TestClient, app: FastAPI, writer: Actor, dynasent: dict[str, Any]
) -> None:
    assignment = start(client, writer, dynasent["id"])
    with unchanged(app):
        response = post_attempt(client, writer, assignment["id"], f"The food was {RLO}doog yllaer today", key="k1")
        error = assert_error(response, 422, "invalid", "text", "U+202E", "position 13", "order in which", "remove it")
    assert error["details"] == {"field": "text"}


def test_invisible_characters_in_a_sentence_are_stripped_before_the_model_sees_it(
    client: TestClient, app: FastAPI, writer: Actor, dynasent: dict[str, Any]
) -> None:
    """A zero width space inside a word changes what the model reads but not what a validator
    sees: the writer could fool the model with text that looks the same."""
    assignment = start(client, writer, dynasent["id"])
    response = post_attempt(client, writer, assignment["id"], "The food was re\u200bally g\u2060o\u00adod to\ufeffday")
    assert response.status_code == 201, response.text
    assert response.json()["text"] == "The food was really good today"


def test_prompt_file_text_and_metadata_follow_the_policy(
    client: TestClient, app: FastAPI, researcher: Actor, dynasent: dict[str, Any]
) -> None:
    lines = [
        json.dumps({"text": "A fine prompt about soup."}),
        json.dumps({"text": f"A prompt {RLO}with an override."}),
        json.dumps({"text": "A prompt with bad metadata.", "target": {"name": f"x{RLO}y"}}),
        json.dumps({"text": "A prompt with a bad source.", "source": "yelp\x00"}),
    ]
    url = f"{API}/rounds/{dynasent['id']}/prompts"
    headers = {**researcher.headers, "Content-Type": "application/x-ndjson"}
    with unchanged(app):
        response = client.post(url, content="\n".join(lines).encode(), headers=headers)
        error = assert_error(response, 422, "invalid", "3 row(s)")
    assert [problem.split(" contains ")[0] for problem in error["details"]["errors"]] == [
        "line 2: text",
        "line 3: target.name",
        "line 4: source",
    ]
    good = [
        json.dumps({"text": "A prompt with a zero\u200b width space.", "note": "tab\u200bbed", "source": "yelp"}),
        json.dumps({"text": PERSIAN, "meta": [HINDI, {"k": EMOJI_ZWJ}]}),
    ]
    response = client.post(url, content="\n".join(good).encode(), headers=headers)
    assert response.status_code == 200, response.text
    with app.state.sessionmaker() as session:
        stored = {p.text: p.meta for p in session.scalars(select(Prompt)) if p.text not in PROMPTS}
    assert stored == {
        "A prompt with a zero width space.": {"note": "tabbed"},
        PERSIAN: {"meta": [HINDI, {"k": EMOJI_ZWJ}]},
    }


def test_flag_reason_notes_and_unqualify_reason_follow_the_policy(
    client: TestClient,
    app: FastAPI,
    make_user: MakeUser,
    researcher: Actor,
    validators: list[Actor],
    dynasent: dict[str, Any],
) -> None:
    example = write_example(client, make_user("wendy", "writer"), dynasent["id"])
    with unchanged(app):
        response = client.post(
            f"{API}/examples/{example['id']}/validations",
            json={"label": "neutral", "flagged": True, "flag_reason": f"spam {RLO}maps"},
            headers=validators[0].headers,
        )
        assert_error(response, 422, "invalid", "flag_reason", "U+202E")
    with unchanged(app):
        response = client.post(
            f"{API}/tasks/dynasent-r2/workers/wendy/unqualify",
            json={"reason": f"copied {RLO}text"},
            headers=researcher.headers,
        )
        assert_error(response, 422, "invalid", "reason", "U+202E")
    client.post(
        f"{API}/tasks", content=task_yaml("dynasent-r2", name="second-task").encode(), headers=researcher.headers
    )
    with unchanged(app):
        response = client.post(
            f"{API}/tasks/second-task/rounds",
            json={"model_servers": [], "notes": f"round {RLO}one"},
            headers=researcher.headers,
        )
        assert_error(response, 422, "invalid", "notes", "U+202E")


def test_task_title_with_a_bidi_override_is_refused(client: TestClient, app: FastAPI, researcher: Actor) -> None:
    text = example_yaml("dynasent-r2", onboarding_quiz=None, title=f"Sentiment {RLO}yrtnuoc")
    with unchanged(app):
        response = client.post(
            f"{API}/tasks", content=text.encode(), headers={**researcher.headers, "Content-Type": "application/yaml"}
        )
        assert_error(response, 422, "invalid", "title", "U+202E")
