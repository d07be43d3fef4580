"""Files come from uploads or one configured data root (issue 12, point 2).

A job's data mix started through the API names an uploaded dataset of its task or a file under
``DYNALOOP_DATA_ROOT``; anything else (an absolute path, ``..``, a symlink out of the root) is
refused with one message that never tells whether the file exists, the job's own process checks
again, and no error quotes a file's text. On SQLite; the refusals that leave nothing and the
uploads a queued job holds run on PostgreSQL too (``both_databases``, tests/conftest.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dynaloop.api.app import create_app
from rounds.models.job_runner import run_job
from rounds.models.jobs import create_job
from services.db.engine import session_scope
from services.db.models import Job, JobKind, JobStatus
from services.domain.tasks import create_task, get_task
from services.domain.users import get_user
from services.settings import Settings
from tests.conftest import Actor, MakeUser, example_yaml, table_counts, table_snapshot

pytestmark = pytest.mark.timeout(300)

API = "/api/v1"
TASK = "dynasent-r2"
SECRET = "hunter2-THE-SECRET-VALUE"
REFUSED = "not an uploaded dataset or a file under the data root"
# No precision check after training (tests/test_jobs.py::TINY_TRAIN says why).
TINY_TRAIN = {
    "check_precision": False,
    "tiny": True,
    "epochs": 1,
    "batch_size": 4,
    "max_length": 16,
    "cpu": True,
    "patience": 0,
}
ROWS = [
    ("The soup was great.", "positive"),
    ("The service was terrible.", "negative"),
    ("We ate at noon.", "neutral"),
    ("Lovely staff and a warm room.", "positive"),
    ("Cold food, rude waiter.", "negative"),
    ("The menu has twelve dishes.", "neutral"),
]


def _csv(rows: list[tuple[str, str]] = ROWS) -> bytes:
    return pd.DataFrame(rows, columns=["text", "label"]).to_csv(index=False).encode("utf-8")


@pytest.fixture
def data_root(settings: Settings, tmp_path: Path) -> Path:
    """The data root (a folder of its own beside the data folder) with one good file, one with
    a secret in a label cell, and, outside it, a file a researcher must never read."""
    root = tmp_path / "data-root"
    (root / "sst").mkdir(parents=True)
    (root / "sst" / "train.csv").write_bytes(_csv())
    (root / "sst" / "secret-label.csv").write_bytes(_csv([*ROWS, ("Fine.", SECRET)]))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "private.csv").write_bytes(_csv([(SECRET, "positive")]))
    (root / "escape.csv").symlink_to(outside / "private.csv")
    return root


@pytest.fixture
def rooted(settings: Settings, data_root: Path, reset_stubs: None) -> FastAPI:
    return create_app(settings.model_copy(update={"data_root": data_root, "max_upload_rows": 50}))


@pytest.fixture
def api(rooted: FastAPI) -> Any:
    with TestClient(rooted) as test_client:
        yield test_client


@pytest.fixture
def task(rooted: FastAPI, researcher: Actor) -> str:
    """The task, owned by the ``researcher`` fixture."""
    with session_scope(rooted.state.sessionmaker) as session:
        create_task(
            session, None, example_yaml(TASK, onboarding_quiz=None), owner=get_user(session, researcher.username)
        )
    return TASK


def _upload(api: TestClient, who: Actor | None, body: bytes, name: str = "reviews", fmt: str = "csv", **query: Any):  # type: ignore[no-untyped-def]
    return api.post(
        f"{API}/tasks/{TASK}/datasets/uploads",
        params={"name": name, "format": fmt, **query},
        content=body,
        headers={**(who.headers if who else {}), "Content-Type": "application/octet-stream"},
    )


def _stored_files(app: FastAPI) -> list[Path]:
    uploads = app.state.settings.data_dir / "uploads"
    return sorted(p for p in uploads.rglob("*") if p.is_file()) if uploads.exists() else []


def _train(api: TestClient, who: Actor, mix: dict[str, Any], **params: Any):  # type: ignore[no-untyped-def]
    return api.post(
        f"{API}/tasks/{TASK}/jobs", json={"kind": "train", "params": {"mix": mix, **params}}, headers=who.headers
    )


# --- naming a server file --------------------------------------------------------------------------


def test_a_job_names_no_file_outside_the_data_root_and_never_learns_whether_it_exists(
    rooted: FastAPI, api: TestClient, task: str, researcher: Actor, data_root: Path, tmp_path: Path
) -> None:
    before, jobs = table_counts(rooted), table_snapshot(rooted, "jobs", "audit_log")
    messages = set()
    for file in [
        "/etc/passwd",  # exists, outside
        "/etc/no-such-file.csv",  # missing, outside
        str(tmp_path / "outside" / "private.csv"),  # exists, outside, a supported type
        str(tmp_path / "outside" / "missing.csv"),
        "../outside/private.csv",  # `..` out of the root
        "sst/../../outside/private.csv",
        "escape.csv",  # a symlink in the root to a file outside it
        "sst/missing.csv",  # inside the root, but missing
        "sst",  # a folder
        str(rooted.state.settings.data_dir / "dynaloop.db"),
    ]:
        for mix in ({"train": [{"file": file}]}, {"train": [{"file": "sst/train.csv"}], "evaluate": [{"file": file}]}):
            response = _train(api, researcher, mix)
            assert response.status_code == 422, (file, response.text)
            message = response.json()["error"]["message"]
            assert REFUSED in message and SECRET not in response.text, message
            assert file not in message, "the answer does not echo the path"
            messages.add(message.replace("evaluate.0", "train.0"))
    assert len(messages) == 1, messages
    assert table_counts(rooted) == before and table_snapshot(rooted, "jobs", "audit_log") == jobs


def test_an_evaluate_jobs_mix_and_a_train_jobs_base_obey_the_same_rule(
    rooted: FastAPI, api: TestClient, task: str, researcher: Actor, tmp_path: Path
) -> None:
    from rounds.models.init_model import init_model_dir
    from rounds.models.registry import register_model

    init_model_dir(tmp_path / "m", labels=["positive", "negative", "neutral"], tiny=True, model_id="m", seed=0)
    with session_scope(rooted.state.sessionmaker) as session:
        model_id = register_model(session, get_task(session, TASK), tmp_path / "m").id
    before = table_counts(rooted)
    for base in ["/etc", "/no/such/folder", "..", "sst/../.."]:
        response = _train(api, researcher, {"train": [{"file": "sst/train.csv"}]}, base=base)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["message"].startswith("params.base: not a folder under the data root")
    (rooted.state.settings.data_root / "bases" / "small").mkdir(parents=True)
    with session_scope(rooted.state.sessionmaker) as session:  # a folder under the root is a base
        job = create_job(
            session,
            None,
            get_task(session, TASK),
            "train",
            {"base": "bases/small", "mix": {"train": [{"file": "sst/train.csv"}]}},
            data_dir=rooted.state.settings.data_dir,
            data_root=rooted.state.settings.data_root,
        )
        assert job.params["base"] == "bases/small"
        session.rollback()
    response = api.post(
        f"{API}/tasks/{TASK}/jobs",
        json={
            "kind": "evaluate",
            "params": {
                "model_id": model_id,
                "mix": {"train": [{"file": "sst/train.csv"}], "dev": {"file": "/etc/passwd"}},
            },
        },
        headers=researcher.headers,
    )
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith(f"params.mix.dev.file: {REFUSED}")
    assert table_counts(rooted) == before


def test_without_a_data_root_no_server_file_at_all(
    app: FastAPI, client: TestClient, researcher: Actor, tmp_path: Path
) -> None:
    """The default: DYNALOOP_DATA_ROOT unset, jobs read uploads only; even a file in the data folder is refused."""
    with session_scope(app.state.sessionmaker) as session:
        create_task(
            session, None, example_yaml(TASK, onboarding_quiz=None), owner=get_user(session, researcher.username)
        )
    (app.state.settings.data_dir / "mine.csv").write_bytes(_csv())
    before = table_counts(app)
    for file in ["mine.csv", str(app.state.settings.data_dir / "mine.csv"), "/etc/passwd"]:
        response = _train(client, researcher, {"train": [{"file": file}]})
        assert response.status_code == 422
        assert REFUSED in response.json()["error"]["message"] and "upload it" in response.json()["error"]["message"]
    assert table_counts(app) == before


def test_the_job_process_checks_the_params_again(rooted: FastAPI, task: str) -> None:
    """Defence in depth: a job row naming a file outside the root (written around create_job)
    fails in its own process with the same refusal, having read nothing."""
    with session_scope(rooted.state.sessionmaker) as session:
        job = Job(
            kind=JobKind.train,
            task_id=get_task(session, TASK).id,
            status=JobStatus.queued,
            progress=0.0,
            message="queued",
            params={**TINY_TRAIN, "mix": {"train": [{"file": "../outside/private.csv"}]}},
            log="",
        )
        session.add(job)
        session.flush()
        job_id = job.id
    settings = rooted.state.settings
    done = run_job(rooted.state.sessionmaker, job_id, data_dir=settings.data_dir, data_root=settings.data_root)
    assert done.status is JobStatus.failed and done.message.startswith(f"mix.train.0.file: {REFUSED}")
    assert SECRET not in done.log


def test_a_bad_label_is_reported_by_row_and_column_never_by_its_text(
    rooted: FastAPI, api: TestClient, task: str, researcher: Actor, caplog: pytest.LogCaptureFixture
) -> None:
    # Through the job: the file is under the root, so the job starts, and fails on the label.
    with session_scope(rooted.state.sessionmaker) as session:
        job = create_job(
            session,
            None,
            get_task(session, TASK),
            "train",
            {**TINY_TRAIN, "mix": {"train": [{"file": "sst/secret-label.csv"}]}},
            data_dir=rooted.state.settings.data_dir,
            data_root=rooted.state.settings.data_root,
        )
        job_id = job.id
    settings = rooted.state.settings
    done = run_job(rooted.state.sessionmaker, job_id, data_dir=settings.data_dir, data_root=settings.data_root)
    assert done.status is JobStatus.failed
    assert done.message.startswith("secret-label.csv: row 7, column `label`: not one of the task's labels"), (
        done.message
    )
    shown = api.get(f"{API}/jobs/{job_id}", headers=researcher.headers).text
    assert SECRET not in shown and SECRET not in done.log and SECRET not in caplog.text
    # Through an upload: refused on arrival, the same way.
    before, files = table_counts(rooted), _stored_files(rooted)
    response = _upload(api, researcher, _csv([*ROWS, ("Fine.", SECRET)]))
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith(
        "reviews: row 7, column `label`: not one of the task's labels"
    )
    assert SECRET not in response.text and SECRET not in caplog.text
    assert table_counts(rooted) == before and _stored_files(rooted) == files


# --- uploads --------------------------------------------------------------------------------------


def test_upload_list_train_and_delete(rooted: FastAPI, api: TestClient, task: str, researcher: Actor) -> None:
    response = _upload(api, researcher, _csv())
    assert response.status_code == 201, response.text
    upload = response.json()
    assert (upload["name"], upload["format"], upload["rows"], upload["uploaded_by"]) == ("reviews", "csv", 6, "rita")
    [stored] = _stored_files(rooted)
    assert stored == rooted.state.settings.data_dir / "uploads" / TASK / f"{upload['sha256']}.csv"
    assert stored.read_bytes() == _csv() and upload["size_bytes"] == len(_csv())
    # The same bytes again: the stored dataset, nothing new.
    before = table_counts(rooted)
    stored.unlink()  # lost from the data folder: the same upload again puts it back
    again = _upload(api, researcher, _csv())
    assert again.status_code == 200 and again.json() == upload
    assert table_counts(rooted) == before and stored.read_bytes() == _csv()
    # The same bytes under another name share the file; JSONL and Parquet arrive too.
    frame = pd.DataFrame(ROWS, columns=["text", "label"])
    parquet = io.BytesIO()
    frame.to_parquet(parquet)
    assert _upload(api, researcher, _csv(), name="copy").status_code == 201
    jsonl = frame.to_json(orient="records", lines=True).encode()
    assert _upload(api, researcher, jsonl, name="reviews.jsonl", fmt="jsonl").status_code == 201
    assert _upload(api, researcher, parquet.getvalue(), name="reviews-pq", fmt="parquet").status_code == 201
    assert len(_stored_files(rooted)) == 3
    listed = api.get(f"{API}/tasks/{TASK}/datasets/uploads", headers=researcher.headers).json()
    assert [row["name"] for row in listed["data"]] == ["copy", "reviews", "reviews-pq", "reviews.jsonl"]

    # A train job names it (and a file under the root); the stored params keep those names.
    mix = {"train": [{"dataset": "reviews"}, {"file": "sst/train.csv"}], "dev": {"dataset": "reviews-pq"}}
    with session_scope(rooted.state.sessionmaker) as session:
        job = create_job(
            session,
            None,
            get_task(session, TASK),
            "train",
            {**TINY_TRAIN, "mix": mix},
            data_dir=rooted.state.settings.data_dir,
            data_root=rooted.state.settings.data_root,
        )
        job_id = job.id
        assert job.params["mix"]["train"][0] == {**job.params["mix"]["train"][0], "dataset": "reviews"}
        assert "/" not in json.dumps(job.params["mix"]["train"][0])
    settings = rooted.state.settings
    done = run_job(rooted.state.sessionmaker, job_id, data_dir=settings.data_dir, data_root=settings.data_root)
    assert done.status is JobStatus.succeeded, done.message + "\n" + done.log
    assert "loaded 12 training rows from 2 source(s); dev reviews-pq has 6 rows" in done.log

    # Deleting: the file goes when no other name of the task has the same bytes.
    response = api.delete(f"{API}/tasks/{TASK}/datasets/uploads/reviews", headers=researcher.headers)
    assert response.status_code == 204, response.text
    assert stored.exists(), "'copy' has the same bytes"
    assert api.delete(f"{API}/tasks/{TASK}/datasets/uploads/copy", headers=researcher.headers).status_code == 204
    assert not stored.exists()
    assert api.delete(f"{API}/tasks/{TASK}/datasets/uploads/copy", headers=researcher.headers).status_code == 404
    response = _train(api, researcher, {"train": [{"dataset": "reviews"}]})
    assert response.status_code == 422
    assert "task 'dynasent-r2' has no uploaded dataset 'reviews'" in response.json()["error"]["message"]


@pytest.mark.both_databases
def test_a_dataset_a_queued_job_reads_is_not_deleted(
    rooted: FastAPI, api: TestClient, task: str, researcher: Actor
) -> None:
    assert _upload(api, researcher, _csv()).status_code == 201
    with session_scope(rooted.state.sessionmaker) as session:
        job = create_job(
            session,
            None,
            get_task(session, TASK),
            "train",
            {**TINY_TRAIN, "mix": {"train": [{"dataset": "reviews"}]}},
            data_dir=rooted.state.settings.data_dir,
        )
        job_id = job.id
    before, files = table_counts(rooted), _stored_files(rooted)
    response = api.delete(f"{API}/tasks/{TASK}/datasets/uploads/reviews", headers=researcher.headers)
    assert response.status_code == 409 and f"job {job_id}" in response.json()["error"]["message"]
    assert table_counts(rooted) == before and _stored_files(rooted) == files


@pytest.mark.both_databases
def test_bad_uploads_are_refused_and_leave_nothing(
    rooted: FastAPI, api: TestClient, task: str, researcher: Actor
) -> None:
    assert _upload(api, researcher, _csv(), name="taken").status_code == 201
    before, files = table_counts(rooted), _stored_files(rooted)
    limit = rooted.state.settings.max_request_bytes
    many = _csv([(f"Row number {i}.", "neutral") for i in range(51)])
    one_of_many = pd.DataFrame({"text": ["x"] * 100_000, "label": ["neutral"] * 100_000})
    bomb = io.BytesIO()
    one_of_many.to_parquet(bomb)  # a few kB that decode to 100,000 rows
    assert len(bomb.getvalue()) < limit
    cases: list[tuple[bytes, dict[str, Any], int, str]] = [
        (b"x" * (limit + 1), {}, 413, "the request body is larger than"),
        (b"", {}, 422, "reviews: the file is empty"),
        (b"text,label\n", {}, 422, "reviews: the file has no rows"),
        (many, {}, 422, "reviews: 51 rows is more than the 50 an upload may have"),
        (bomb.getvalue(), {"fmt": "parquet"}, 422, "reviews: 100,000 rows is more than the 50"),
        (
            f"text,label\nok,positive\n{SECRET},a,b\n".encode(),
            {},
            422,
            "reviews could not be read as csv: row 2 has 3 fields, the header 2",
        ),
        (f"{SECRET}\n".encode(), {"fmt": "jsonl"}, 422, "reviews could not be read as jsonl"),
        (SECRET.encode() * 10, {"fmt": "parquet"}, 422, "reviews could not be read as parquet"),
        (b"\xff\xfe" + SECRET.encode(), {}, 422, "reviews could not be read as csv"),
        (_csv([("ok", "positive"), ("  ", "negative")]), {}, 422, "reviews: row 2, column `text`: no text"),
        (_csv([("ok", "positive"), ("fine", "")]), {}, 422, "reviews: row 2, column `label`: not one of the task's"),
        (_csv(), {"label_column": "stars"}, 422, "reviews: there is no column `stars` (2 columns)"),
        (_csv()[:-5] + b"xx\n", {"name": "taken"}, 409, "already has a dataset named 'taken' with other content"),
        (_csv(), {"fmt": "xlsx"}, 422, "query.format"),
        (_csv(), {"name": "../../etc/passwd"}, 422, "query.name"),
        (_csv(), {"name": "x" * 101}, 422, "query.name"),
    ]
    for body, options, status, message in cases:
        query = {k: v for k, v in options.items() if k not in ("fmt", "name")}
        response = _upload(
            api, researcher, body, name=options.get("name", "reviews"), fmt=options.get("fmt", "csv"), **query
        )
        assert response.status_code == status, (message, response.text)
        error = response.json()["error"]
        assert message in error["message"], (message, error)
        assert SECRET not in response.text
    assert table_counts(rooted) == before and _stored_files(rooted) == files


@pytest.mark.parametrize("role", ["writer", "validator", "client", None])
def test_only_a_tasks_managers_upload_list_and_delete(
    rooted: FastAPI, api: TestClient, task: str, researcher: Actor, make_user: MakeUser, role: str | None
) -> None:
    assert _upload(api, researcher, _csv()).status_code == 201
    who = make_user(f"someone-{role}", role) if role else None
    before, files = table_counts(rooted), _stored_files(rooted)
    headers = who.headers if who else {}
    for response in [
        _upload(api, who, _csv(), name="mine"),
        api.get(f"{API}/tasks/{TASK}/datasets/uploads", headers=headers),
        api.delete(f"{API}/tasks/{TASK}/datasets/uploads/reviews", headers=headers),
    ]:
        assert response.status_code == (401 if who is None else 403), response.text
        assert response.json()["error"]["code"] == ("unauthorized" if who is None else "forbidden")
    assert table_counts(rooted) == before and _stored_files(rooted) == files


@pytest.mark.both_databases
def test_a_job_a_worker_runs_reads_the_upload_and_the_data_root(
    rooted: FastAPI, api: TestClient, task: str, researcher: Actor, tmp_path: Path
) -> None:
    """A real `dynaloop worker` (with the API's data root, DYNALOOP_DATA_ROOT) runs the real
    `dynaloop job run` process, which checks the sources again: a file under the root and an
    upload both load."""
    import time

    from tests.conftest import worker_process

    assert _upload(api, researcher, _csv()).status_code == 201
    response = _train(api, researcher, {"train": [{"dataset": "reviews"}, {"file": "sst/train.csv"}]}, **TINY_TRAIN)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    with worker_process(rooted, "cpu", "uploads-worker", tmp_path / "worker.log"):
        deadline = time.monotonic() + 240
        while True:
            body = api.get(f"{API}/jobs/{job_id}", headers=researcher.headers).json()
            if body["status"] in ("succeeded", "failed") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert body["status"] == "succeeded", body["message"] + "\n" + body["log"]
    assert "loaded 12 training rows from 2 source(s)" in body["log"]
    assert body["params"]["mix"]["train"][1]["file"] == "sst/train.csv"


def test_a_data_root_holding_the_data_folder_is_refused(tmp_path: Path) -> None:
    """Every researcher may read the data root; the data folder holds the database and every task's uploads."""
    with pytest.raises(ValueError, match=r"DYNALOOP_DATA_ROOT .* contains DYNALOOP_DATA_DIR"):
        Settings(data_dir=tmp_path / "data", data_root=tmp_path)
    with pytest.raises(ValueError, match="contains DYNALOOP_DATA_DIR"):
        Settings(data_dir=tmp_path, data_root=tmp_path)
    assert Settings(data_dir=tmp_path / "data", data_root=tmp_path / "corpora").data_root == tmp_path / "corpora"


# --- a hostile file decodes within bounds (issue 26, point 8) ---------------------------------------

# What these tests allow one upload to decode to (DYNALOOP_MAX_UPLOAD_DECODED_BYTES), and the peak
# memory growth docs/security.md "Uploaded files decode within bounds" documents for one upload:
# four times that bound and 64 MiB. Before the bound, the 904-byte file took the API from
# 654 to 2,299 MiB.
DECODED_BOUND = 8 * 1024 * 1024
MEMORY_BOUND = 4 * DECODED_BOUND + 64 * 1024 * 1024
HOSTILE_CHARS = 4 * 1024 * 1024


@pytest.fixture
def bounded(settings: Settings, data_root: Path, reset_stubs: None) -> FastAPI:
    """An app with the production request limit (5 MiB) and a small bound on decoded bytes."""
    return create_app(
        settings.model_copy(
            update={
                "data_root": data_root,
                "max_upload_rows": 1000,
                "max_request_bytes": 5 * 1024 * 1024,
                "max_upload_decoded_bytes": DECODED_BOUND,
            }
        )
    )


@pytest.fixture
def bounded_api(bounded: FastAPI) -> Any:
    with TestClient(bounded) as test_client:
        yield test_client


class PeakMemory:
    """The process's peak resident memory above what it held on entry, sampled every
    millisecond by a thread while the block runs (psutil)."""

    def __enter__(self) -> PeakMemory:
        import gc
        import threading

        import psutil

        gc.collect()
        self._process = psutil.Process()
        self.start = self._process.memory_info().rss
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.start


def _parquet(table: Any, **options: Any) -> bytes:
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(table, out, **options)
    return out.getvalue()


def _dictionary_column(rows: int, chars: int) -> Any:
    """``rows`` cells that all point at one string of ``chars`` characters (built as a
    dictionary, so the test itself never holds ``rows`` copies)."""
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * chars]))


def _hostile_files() -> list[tuple[str, bytes, str, int, str]]:
    """(case, body, format, status, message) of files built to take the API's memory."""
    import pyarrow as pa

    labels = pa.array(["positive"] * 250)
    # The reproduction: 250 rows of one dictionary-encoded 4 MB string, under 1 KiB.
    bomb = _parquet(pa.table({"text": _dictionary_column(250, HOSTILE_CHARS), "label": labels}), compression="zstd")
    assert len(bomb) < 2048
    # Cells under every cell limit (a 15,000-character note), 1,000 of them: 15 MB decoded.
    notes = pa.table(
        {
            "text": pa.array(["Fine."] * 1000),
            "label": pa.array(["neutral"] * 1000),
            "note": _dictionary_column(1000, 15_000),
        }
    )
    # The same inside list cells: 50 rows of 1,000 references each to one 15,000-character string.
    offsets = pa.array([i * 1000 for i in range(51)], pa.int32())
    nested = pa.table(
        {
            "text": pa.array(["Fine."] * 50),
            "label": pa.array(["neutral"] * 50),
            "tags": pa.ListArray.from_arrays(offsets, _dictionary_column(50_000, 15_000)),
        }
    )
    huge_cell = "x" * HOSTILE_CHARS
    return [
        (
            "parquet dictionary bomb",
            bomb,
            "parquet",
            422,
            "reviews: row 1, column `text`: a cell of 4,194,304 characters",
        ),
        ("parquet repeated note", _parquet(notes), "parquet", 413, "reviews decodes to more than 8,388,608 bytes"),
        ("parquet nested lists", _parquet(nested), "parquet", 413, "reviews decodes to more than 8,388,608 bytes"),
        (
            "parquet plain pages",  # no dictionary: the footer's declared sizes refuse it undecoded
            _parquet(pa.table({"text": pa.array(["y" * 40_000] * 250), "label": labels}), use_dictionary=False),
            "parquet",
            413,
            "reviews decodes to more than 8,388,608 bytes",
        ),
        (
            "csv 4 MB cell",
            f"text,label\n{huge_cell},positive\n".encode(),
            "csv",
            422,
            "reviews could not be read as csv (row 1: field larger than field limit",
        ),
        (
            "csv long cell",
            f"text,label\n{'z' * 5000},positive\n".encode(),
            "csv",
            422,
            "reviews: row 1, column `text`: a cell of 5,000 characters is longer than the 500 allowed "
            "(the task's constraints.max_chars)",
        ),
        (
            "csv 1,001 columns",  # refused at the header, before a row is read
            (",".join(f"c{i}" for i in range(1001)) + "\n" + "," * 1000 + "\n").encode(),
            "csv",
            413,
            "reviews has 1,001 columns; a file may have at most 1,000",
        ),
        (
            "jsonl 4 MB line",
            json.dumps({"text": huge_cell, "label": "positive"}).encode() + b"\n",
            "jsonl",
            413,
            "reviews: line 1 is longer than",
        ),
        (
            "jsonl long cell",
            json.dumps({"text": "Fine.", "label": "positive", "note": "n" * 30_000}).encode() + b"\n",
            "jsonl",
            422,
            "reviews: row 1, column `note`: a cell of 30,000 characters is longer than the 20,000 allowed",
        ),
    ]


@pytest.mark.parametrize("case", [case for case, *_ in _hostile_files()])
def test_a_hostile_file_is_refused_undecoded_and_the_api_stays_within_its_memory_bound(
    bounded: FastAPI, bounded_api: TestClient, task: str, researcher: Actor, case: str
) -> None:
    _, body, fmt, status, message = next(f for f in _hostile_files() if f[0] == case)
    before, files = table_snapshot(bounded, "dataset_uploads", "audit_log"), _stored_files(bounded)
    with PeakMemory() as memory:
        response = _upload(bounded_api, researcher, body, fmt=fmt)
    assert memory.growth < MEMORY_BOUND, f"{case}: the upload took {memory.growth / 2**20:.0f} MiB"
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == ("too_large" if status == 413 else "invalid")
    assert message in error["message"], error
    assert "xxxxxxxx" not in response.text  # no cell's text in the answer
    assert table_snapshot(bounded, "dataset_uploads", "audit_log") == before and _stored_files(bounded) == files


@pytest.mark.parametrize(
    ("fmt", "body", "where"),
    [
        ("csv", b"text,label\nFine.,positive\nbad\x00cell,negative\n", "row 2, column `text`"),
        ("csv", b"text,label\nFine.,posi\x00tive\n", "row 1, column `label`"),
        ("tsv", b"text\tlabel\nan \x1b[31mescape\tpositive\n", "row 1, column `text`"),
        (
            "jsonl",
            b'{"text": "Fine.", "label": "positive"}\n{"text": "a\\u0000b", "label": "neutral"}\n',
            "row 2, column `text`",
        ),
    ],
)
def test_a_control_character_in_a_cell_is_refused_with_its_row_and_column(
    rooted: FastAPI, api: TestClient, task: str, researcher: Actor, fmt: str, body: bytes, where: str
) -> None:
    before, files = table_snapshot(rooted, "dataset_uploads", "audit_log"), _stored_files(rooted)
    response = _upload(api, researcher, body, fmt=fmt)
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert f"reviews: {where}: the cell contains a control character" in message, message
    assert table_snapshot(rooted, "dataset_uploads", "audit_log") == before and _stored_files(rooted) == files


def test_a_control_character_in_a_parquet_cell_is_refused_too(
    rooted: FastAPI, api: TestClient, task: str, researcher: Actor
) -> None:
    import pyarrow as pa

    body = _parquet(pa.table({"text": ["Fine.", "bell\x07"], "label": ["positive", "neutral"]}))
    response = _upload(api, researcher, body, fmt="parquet")
    assert response.status_code == 422, response.text
    assert "row 2, column `text`: the cell contains a control character (U+0007)" in response.json()["error"]["message"]


def test_a_file_within_the_bounds_is_accepted_in_every_format(
    bounded: FastAPI, bounded_api: TestClient, task: str, researcher: Actor
) -> None:
    """Line breaks and tabs in a cell, non-Latin text with joiners, list cells: all still read."""
    import pyarrow as pa

    rows = [("Line one\nline two\tand a tab.", "positive"), ("می\u200cخواهم بروم.", "neutral"), ("ሰላም።", "negative")]
    frame = pd.DataFrame(rows, columns=["text", "label"])
    bodies = {
        "csv": _csv(rows),
        "tsv": frame.to_csv(index=False, sep="\t").encode(),
        "jsonl": frame.to_json(orient="records", lines=True, force_ascii=False).encode(),
        "parquet": _parquet(pa.Table.from_pandas(frame).append_column("tags", pa.array([["a"], [], None]))),
    }
    for fmt, body in bodies.items():
        response = _upload(bounded_api, researcher, body, name=f"ok-{fmt}", fmt=fmt)
        assert response.status_code == 201, (fmt, response.text)
        assert response.json()["rows"] == 3


def test_a_file_just_under_the_decoded_bound_is_accepted_within_the_memory_bound(
    bounded: FastAPI, bounded_api: TestClient, task: str, researcher: Actor
) -> None:
    """The documented bound holds for what is accepted too: 1,000 distinct 7,500-character
    notes (7.5 MB decoded, under the 8 MiB bound) in a compressed Parquet file."""
    import pyarrow as pa

    notes = [(f"note {i:04d} " * 750)[:7500] for i in range(1000)]
    body = _parquet(
        pa.table({"text": ["Fine."] * 1000, "label": ["neutral"] * 1000, "note": notes}), compression="zstd"
    )
    del notes
    assert len(body) < 5 * 1024 * 1024
    with PeakMemory() as memory:
        response = _upload(bounded_api, researcher, body, fmt="parquet")
    assert response.status_code == 201, response.text
    assert memory.growth < MEMORY_BOUND, f"the upload took {memory.growth / 2**20:.0f} MiB"
    # One 18,000-character note repeated 1,000 times: 18 MB decoded from a few kB.
    over = _parquet(
        pa.table({"text": ["Fine."] * 1000, "label": ["neutral"] * 1000, "note": ["n" * 18_000] * 1000}),
        compression="zstd",
    )
    response = _upload(bounded_api, researcher, over, name="over", fmt="parquet")
    assert response.status_code == 413, response.text
