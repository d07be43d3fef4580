"""The model server: batching (pure collection, concurrency, failure, deadline) and its HTTP
contract over real HTTP with a tiny random-initialised BERT (and MiniLM where a test needs it)."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_server.app import create_model_app, in_a_thread_that_ends
from model_server.batching import Batcher, DeadlineExceeded, ServerStopping, collect
from model_server.config import ServerConfig
from model_server.directory import ModelMetadata
from rounds.models.init_model import init_model_dir
from tests.conftest import HEALTH_POLL_TIMEOUT_S, free_port, serve_model
from tests.stub_model_server import ThreadedServer

LABELS = ["positive", "negative", "neutral"]
EMOTIONS = ["anger", "joy", "sadness", "neutral"]


# --- collection is a pure function over a plain queue -----------------------------------


def test_collect_takes_what_is_queued_up_to_the_limit() -> None:
    source: queue.Queue[int] = queue.Queue()
    for i in range(5):
        source.put(i)
    assert collect(source, max_batch_size=3, max_wait_s=0) == [0, 1, 2]
    assert collect(source, max_batch_size=3, max_wait_s=0) == [3, 4]
    assert collect(source, max_batch_size=3, max_wait_s=0, poll_s=0.01) == []


def test_collect_waits_for_late_items_only_up_to_max_wait() -> None:
    source: queue.Queue[int] = queue.Queue()
    source.put(1)
    threading.Timer(0.02, source.put, args=(2,)).start()
    started = time.monotonic()
    assert collect(source, max_batch_size=4, max_wait_s=0.2) == [1, 2]
    assert time.monotonic() - started < 0.2 + 0.1
    source.put(3)
    started = time.monotonic()
    assert collect(source, max_batch_size=4, max_wait_s=0.05) == [3]
    assert 0.04 <= time.monotonic() - started < 0.5


def test_linger_collects_returning_callers_only_while_they_keep_coming() -> None:
    from model_server.batching import linger

    source: queue.Queue[int] = queue.Queue()
    batch = [0]
    threading.Timer(0.01, source.put, args=(1,)).start()
    threading.Timer(0.03, source.put, args=(2,)).start()
    started = time.monotonic()
    linger(source, batch, target=5, gap_s=0.1, until=started + 5)
    assert batch == [0, 1, 2]  # then nothing came within the gap: stop
    assert time.monotonic() - started < 0.03 + 0.1 + 0.1
    started = time.monotonic()
    linger(source, batch, target=3, gap_s=1.0, until=started + 5)  # already at the target
    assert time.monotonic() - started < 0.05
    linger(source, batch, target=9, gap_s=1.0, until=time.monotonic() - 1)  # past the deadline
    assert batch == [0, 1, 2] and time.monotonic() - started < 0.05


def test_a_lone_caller_never_lingers_but_returning_callers_are_batched_together() -> None:
    sizes: list[int] = []

    def forward(items: Any) -> list[Any]:
        sizes.append(len(items))
        time.sleep(0.02)
        return list(items)

    async def lone(batcher: Batcher) -> float:
        worst = 0.0
        for i in range(3):
            started = time.monotonic()
            assert await batcher.submit([i]) == [i]
            worst = max(worst, time.monotonic() - started)
        return worst

    async def closed_loop(batcher: Batcher, clients: int, rounds: int) -> None:
        async def client(k: int) -> None:
            for r in range(rounds):
                await batcher.submit([k * 100 + r])

        await asyncio.gather(*(client(k) for k in range(clients)))

    # A linger gap far beyond any scheduling delay of a loaded machine: a lone caller that
    # lingered would wait 5 s more than its 0.02 s forward, so the bound below cannot be met
    # by lingering however slow the machine, nor missed by a slow machine that does not linger.
    patient = Batcher(forward, max_batch_size=8, linger_gap_s=5.0, linger_max_s=10.0).start()
    try:
        assert _run(lone(patient)) < 2.5
    finally:
        patient.stop()
    batcher = Batcher(forward, max_batch_size=8, linger_gap_s=0.5, linger_max_s=1.0).start()
    try:
        sizes.clear()
        _run(closed_loop(batcher, 6, 4))
        assert max(sizes) == 6 and sizes.count(6) >= 3  # the 6 callers stay in one batch
    finally:
        batcher.stop()


# --- the batcher ------------------------------------------------------------------------


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_every_caller_gets_its_own_answer_under_concurrency() -> None:
    batches: list[int] = []

    def forward(items: list[int]) -> list[int]:
        batches.append(len(items))
        time.sleep(0.005)
        return [item * 10 for item in items]

    batcher = Batcher(forward, max_batch_size=8).start()

    async def main() -> list[list[int]]:
        return await asyncio.gather(*(batcher.submit([i, i + 1000]) for i in range(60)))

    try:
        results = _run(main())
    finally:
        batcher.stop()
    assert results == [[i * 10, (i + 1000) * 10] for i in range(60)]
    assert max(batches) <= 8 and sum(batches) == 120
    assert max(batches) > 1, "concurrent callers should share batches"


def test_a_failing_batch_answers_every_caller_with_the_error() -> None:
    def forward(items: list[str]) -> list[str]:
        if "boom" in items:
            raise RuntimeError("batch exploded")
        return items

    gate = threading.Event()
    calls = []

    def gated(items: list[str]) -> list[str]:
        calls.append(list(items))
        gate.wait(2)
        return forward(items)

    batcher = Batcher(gated, max_batch_size=16).start()

    async def main() -> list[Any]:
        first = asyncio.ensure_future(batcher.submit(["warm-up"]))
        await asyncio.sleep(0.05)  # the worker is now busy: the next three queue together
        rest = [asyncio.ensure_future(batcher.submit([text])) for text in ("a", "boom", "c")]
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)

    try:
        results = _run(main())
    finally:
        batcher.stop()
    assert results[0] == ["warm-up"]
    assert calls[1] == ["a", "boom", "c"]
    assert all(isinstance(r, RuntimeError) and "batch exploded" in str(r) for r in results[1:])


def test_requests_past_their_deadline_get_an_error_not_a_hang() -> None:
    release = threading.Event()

    def slow(items: list[int]) -> list[int]:
        release.wait(2)
        return items

    batcher = Batcher(slow, max_batch_size=1, request_timeout_s=0.2).start()

    async def main() -> list[Any]:
        return await asyncio.gather(*(batcher.submit([i]) for i in range(3)), return_exceptions=True)

    started = time.monotonic()
    try:
        results = _run(main())
        release.set()
    finally:
        batcher.stop()
    assert time.monotonic() - started < 1.5
    assert all(isinstance(r, DeadlineExceeded) for r in results), results


def test_stop_answers_whoever_is_still_queued() -> None:
    gate = threading.Event()
    batcher = Batcher(lambda items: (gate.wait(1), items)[1], max_batch_size=1).start()

    async def main() -> list[Any]:
        tasks = [asyncio.ensure_future(batcher.submit([i])) for i in range(3)]
        await asyncio.sleep(0.05)
        await asyncio.to_thread(batcher.stop, 0.01)
        gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = _run(main())
    assert any(isinstance(r, ServerStopping) for r in results), results


# --- the HTTP contract ------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    dirs = {
        "tiny": root / "tiny",
        "tiny_b": root / "tiny_b",
        "pair": root / "pair",
        "multi": root / "multi",
    }
    init_model_dir(dirs["tiny"], labels=LABELS, tiny=True, model_id="tiny-a", seed=1)
    init_model_dir(dirs["tiny_b"], labels=LABELS, tiny=True, model_id="tiny-b", seed=2)
    init_model_dir(
        dirs["pair"],
        labels=["negative", "neutral", "positive"],
        input_format="text_pair",
        tiny=True,
        model_id="tiny-pair",
    )
    init_model_dir(
        dirs["multi"], labels=EMOTIONS, family="multi_label", tiny=True, model_id="tiny-multi", max_length=16
    )
    return dirs


@pytest.fixture
def server(model_dirs: dict[str, Path]) -> Any:
    running = serve_model(ServerConfig(model_dir=model_dirs["tiny"], admin_token="admin-secret-123"))
    yield running
    running.stop()


def test_predict_info_and_metrics(server: ThreadedServer) -> None:
    info = httpx.get(f"{server.url}/info").json()
    assert info["model_id"] == "tiny-a" and info["labels"] == LABELS and info["backend"] == "transformers"
    response = httpx.post(f"{server.url}/predict", json={"texts": ["I loved it", "It was bad", "ሰላም ለዓለም"]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == {"id": "tiny-a", "version": "0", "precision": "auto"}
    assert {prediction["precision"] for prediction in body["predictions"]} == {"fp32"}  # auto, with no check: fp32
    assert len(body["predictions"]) == 3
    for prediction in body["predictions"]:
        assert set(prediction["probabilities"]) == set(LABELS)
        assert abs(sum(prediction["probabilities"].values()) - 1) < 1e-5
        assert prediction["labels"] == [prediction["label"]]
        assert prediction["label"] == max(prediction["probabilities"], key=prediction["probabilities"].get)
        assert prediction["truncated"] is False
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'dynaloop_model_requests_total{endpoint="predict",outcome="ok"} 1.0' in metrics
    assert "dynaloop_model_texts_total 3.0" in metrics
    assert "dynaloop_model_batch_size_count" in metrics and "dynaloop_model_queue_wait_seconds_bucket" in metrics


def test_predictions_do_not_depend_on_batch_company(server: ThreadedServer) -> None:
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(24)]
    alone = [httpx.post(f"{server.url}/predict", json={"texts": [t]}).json()["predictions"][0] for t in texts]
    with ThreadPoolExecutor(max_workers=12) as pool:
        together = list(
            pool.map(lambda t: httpx.post(f"{server.url}/predict", json={"texts": [t]}).json()["predictions"][0], texts)
        )
    for a, b in zip(alone, together, strict=True):
        assert a["label"] == b["label"]
        for label in LABELS:
            assert abs(a["probabilities"][label] - b["probabilities"][label]) < 1e-4


def test_split_by_length_covers_every_item_once_and_splits_only_where_padding_costs() -> None:
    from model_server.backends.transformers_backend import split_by_length

    lengths = sorted([11, 13, 14, 15, 17, 19, 20, 22, 23, 25, 27, 28, 30, 33, 36, 120, 124, 128])
    spans = split_by_length(lengths, max_size=8, split_cost=32)
    assert spans[0][0] == 0 and spans[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # contiguous, in order
    assert all(0 < end - start <= 8 for start, end in spans)
    assert any(start == 15 for start, _ in spans)  # the three long ones are not padded with the short
    assert split_by_length([20] * 10, max_size=64) == [(0, 10)]  # nothing to gain: one pass
    assert split_by_length([], max_size=4) == []


def _span_cost(lengths: list[int], spans: list[tuple[int, int]], split_cost: float) -> float:
    return sum((end - start) * lengths[end - 1] + split_cost for start, end in spans)


def _best_cost(lengths: list[int], max_size: int, split_cost: float) -> float:
    """Every way to cut sorted ``lengths`` into contiguous micro-batches, the cheapest (brute force)."""
    n = len(lengths)
    best = float("inf")
    for mask in range(1 << max(0, n - 1)):
        cuts = [0] + [i + 1 for i in range(n - 1) if mask >> i & 1] + [n]
        spans = list(itertools.pairwise(cuts))
        if all(end - start <= max_size for start, end in spans):
            best = min(best, _span_cost(lengths, spans, split_cost))
    return best


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 128), min_size=1, max_size=10).map(sorted),
    max_size=st.integers(1, 12),
    split_cost=st.sampled_from([0.0, 8.0, 96.0, 16384.0]),
)
def test_split_by_length_is_optimal_with_and_without_the_one_batch_shortcut(
    lengths: list[int], max_size: int, split_cost: float
) -> None:
    """The shortcut (one micro-batch when its padding is below one split's cost: the GPU's usual
    case) never gives a costlier cut than the dynamic programme's optimum."""
    from model_server.backends.transformers_backend import split_by_length

    spans = split_by_length(lengths, max_size=max_size, split_cost=split_cost)
    assert [i for start, end in spans for i in range(start, end)] == list(range(len(lengths)))
    assert _span_cost(lengths, spans, split_cost) == pytest.approx(_best_cost(lengths, max_size, split_cost))


@pytest.mark.parametrize("kind", ["multi", "pair"])
def test_length_bucketed_batches_score_like_one_at_a_time(model_dirs: dict[str, Path], kind: str) -> None:
    from model_server.backends import ClassifyInput, load_backend

    backend = load_backend(model_dirs[kind], "transformers", "cpu")
    texts = [("word " * n).strip() + f" {n}" for n in (1, 90, 3, 40, 7, 200, 2, 15, 60, 5)]
    targets = [f"target {i}" for i in range(len(texts))] if kind == "pair" else [None] * len(texts)
    inputs = [ClassifyInput(text, target) for text, target in zip(texts, targets, strict=True)]
    together = backend.predict(inputs)
    for item, batched in zip(inputs, together, strict=True):
        alone = backend.predict([item])[0]
        assert batched.labels == alone.labels and batched.truncated == alone.truncated
        for label, p in alone.probabilities.items():
            assert abs(batched.probabilities[label] - p) < 1e-5
    full = [len(backend.tokenizer(item.text, item.target)["input_ids"]) for item in inputs]
    assert [o.truncated for o in together] == [n > backend.max_length for n in full]
    assert any(o.truncated for o in together) and not all(o.truncated for o in together)


def test_bad_input_gets_clear_422s(server: ThreadedServer) -> None:
    cases = [
        ({"texts": []}, "texts"),
        ({"texts": ["  "]}, "texts[0] is empty"),
        ({"texts": ["a"] * 65}, "send at most 64"),
        ({"texts": ["a", "b"], "targets": ["x"]}, "send one per text"),
        ({"texts": ["x" * 20_001]}, "the limit is 20000"),
        ({"text": "wrong field"}, "texts"),
    ]
    for body, fragment in cases:
        response = httpx.post(f"{server.url}/predict", json=body)
        assert response.status_code == 422, response.text
        assert fragment in response.json()["error"]["message"]


def test_long_input_is_truncated_and_says_so(model_dirs: dict[str, Path]) -> None:
    running = serve_model(ServerConfig(model_dir=model_dirs["multi"]))
    try:
        body = httpx.post(f"{running.url}/predict", json={"texts": ["joy " * 40, "short"]}).json()
    finally:
        running.stop()
    first, second = body["predictions"]
    assert first["truncated"] is True and second["truncated"] is False
    # Multi-label: sigmoid scores (they need not sum to 1) and a non-empty label set.
    assert first["labels"] and set(first["labels"]) <= set(EMOTIONS)
    assert all(0 < p < 1 for p in first["probabilities"].values())


def test_sentence_pair_model_needs_targets(model_dirs: dict[str, Path]) -> None:
    running = serve_model(ServerConfig(model_dir=model_dirs["pair"]))
    try:
        missing = httpx.post(f"{running.url}/predict", json={"texts": ["Merkel spoke in Paris."]})
        assert missing.status_code == 422 and "(text, target) pairs" in missing.json()["error"]["message"]
        ok = httpx.post(
            f"{running.url}/predict", json={"texts": ["Merkel spoke in Paris."] * 2, "targets": ["Merkel", "Paris"]}
        )
        assert ok.status_code == 200
        a, b = ok.json()["predictions"]
        # The target is part of the input: the same sentence with another target is scored anew.
        assert a["probabilities"] != b["probabilities"]
    finally:
        running.stop()


def test_inspect_returns_one_score_per_token(server: ThreadedServer) -> None:
    # The first /inspect imports captum and runs integrated gradients: seconds on a loaded machine.
    response = httpx.post(
        f"{server.url}/inspect", json={"text": "The pasta was wonderful", "label": "positive"}, timeout=60
    )
    assert response.status_code == 200, response.text
    tokens = response.json()["tokens"]
    assert [t["token"] for t in tokens] == ["[CLS]", "the", "pasta", "was", "wonderful", "[SEP]"]
    assert all(isinstance(t["score"], float) for t in tokens)
    assert any(abs(t["score"]) > 0 for t in tokens)
    bad = httpx.post(f"{server.url}/inspect", json={"text": "x", "label": "sarcastic"}, timeout=60)
    assert bad.status_code == 422 and "unknown label" in bad.json()["error"]["message"]


def test_attributions_computed_at_once_are_bounded(server: ThreadedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each attribution runs in a thread of its own; a burst of /inspect requests does not start
    a thread each: at most MAX_CONCURRENT_INSPECTIONS compute at once, the others wait and are answered."""
    from model_server.app import MAX_CONCURRENT_INSPECTIONS

    host = server.config.app.state.host
    lock = threading.Lock()
    running = most = 0

    def slow_inspect(item: Any, label: str) -> list[Any]:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.5)
        with lock:
            running -= 1
        return []

    monkeypatch.setattr(host.backend, "inspect", slow_inspect)
    body = {"text": "The pasta was wonderful", "label": "positive"}
    with ThreadPoolExecutor(3 * MAX_CONCURRENT_INSPECTIONS) as pool:
        answers = list(
            pool.map(
                lambda _: httpx.post(f"{server.url}/inspect", json=body, timeout=60),
                range(3 * MAX_CONCURRENT_INSPECTIONS),
            )
        )
    assert [a.status_code for a in answers] == [200] * (3 * MAX_CONCURRENT_INSPECTIONS)
    assert most == MAX_CONCURRENT_INSPECTIONS


def test_reload_switches_atomically_and_keeps_serving(
    server: ThreadedServer, model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = server.url
    from model_server.host import ModelHost

    reloaded_in: list[threading.Thread] = []
    original_reload = ModelHost.reload

    def reload(self: ModelHost, *args: Any) -> Any:
        reloaded_in.append(threading.current_thread())
        return original_reload(self, *args)

    monkeypatch.setattr(ModelHost, "reload", reload)
    auth = {"Authorization": "Bearer admin-secret-123"}
    assert httpx.post(f"{url}/admin/reload", json={"model_dir": str(model_dirs["tiny_b"])}).status_code == 401
    stop = threading.Event()
    seen: list[tuple[int, str]] = []

    def hammer() -> None:
        while not stop.is_set():
            response = httpx.post(f"{url}/predict", json={"texts": ["in flight during the reload"]})
            seen.append((response.status_code, response.json().get("model", {}).get("id", "")))

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    response = httpx.post(
        f"{url}/admin/reload", json={"model_dir": str(model_dirs["tiny_b"])}, headers=auth, timeout=60
    )
    time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join()
    assert response.status_code == 200 and response.json()["model_id"] == "tiny-b"
    assert {status for status, _ in seen} == {200}, "no request may fail during a reload"
    ids = [model_id for _, model_id in seen]
    assert ids[0] == "tiny-a" and ids[-1] == "tiny-b"
    switch = ids.index("tiny-b")
    assert set(ids[switch:]) == {"tiny-b"}, "after the switch every answer comes from the new model"
    assert httpx.get(f"{url}/info").json()["model_id"] == "tiny-b"
    # The reload ran torch in a thread of its own, which has ended (in_a_thread_that_ends), not in
    # a thread of the event loop's executor, which lives on.
    (thread,) = reloaded_in
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_failed_reload_leaves_the_old_model_serving(
    server: ThreadedServer, tmp_path: Path, model_dirs: dict[str, Path]
) -> None:
    auth = {"Authorization": "Bearer admin-secret-123"}
    broken = tmp_path / "broken"
    broken.mkdir()
    ModelMetadata(model_id="broken", labels=LABELS).save(broken)  # metadata but no weights
    for target, fragment in [(tmp_path / "missing", "has no dynaloop_model.json"), (broken, "cannot load")]:
        response = httpx.post(f"{server.url}/admin/reload", json={"model_dir": str(target)}, headers=auth)
        assert response.status_code == 422, response.text
        message = response.json()["error"]["message"]
        assert fragment in message and "tiny-a is still serving" in message
    assert httpx.post(f"{server.url}/predict", json={"texts": ["still here"]}).json()["model"]["id"] == "tiny-a"
    wrong_head = tmp_path / "wrong_head"
    init_model_dir(wrong_head, labels=["a", "b"], tiny=True)
    ModelMetadata(model_id="x", labels=LABELS).save(wrong_head)
    response = httpx.post(f"{server.url}/admin/reload", json={"model_dir": str(wrong_head)}, headers=auth)
    assert response.status_code == 422 and "head has 2 outputs" in response.json()["error"]["message"]


def test_reload_is_disabled_without_an_admin_token(model_dirs: dict[str, Path]) -> None:
    running = serve_model(ServerConfig(model_dir=model_dirs["tiny"]))
    try:
        response = httpx.post(
            f"{running.url}/admin/reload",
            json={"model_dir": str(model_dirs["tiny_b"])},
            headers={"Authorization": "Bearer anything"},
        )
        assert response.status_code == 403 and "--admin-token" in response.json()["error"]["message"]
    finally:
        running.stop()


def test_health_is_not_ready_until_the_model_loads_and_says_why_it_failed(tmp_path: Path) -> None:
    running = ThreadedServer(create_model_app(ServerConfig(model_dir=tmp_path / "nothing")), free_port())
    running.config.lifespan = "on"
    running.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            response = httpx.get(f"{running.url}/health", timeout=HEALTH_POLL_TIMEOUT_S)
            assert response.status_code == 503
            if response.json()["error"]["code"] == "model_failed":
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "has no dynaloop_model.json" in response.json()["error"]["message"]
        predict = httpx.post(f"{running.url}/predict", json={"texts": ["hello"]})
        assert predict.status_code == 503
    finally:
        running.stop()


def test_overloaded_server_answers_503_not_a_hang(model_dirs: dict[str, Path]) -> None:
    running = serve_model(ServerConfig(model_dir=model_dirs["tiny"], request_timeout_s=0.3, max_batch_size=1))
    host = running.config.app.state.host
    original = host.backend.predict

    def slow_predict(inputs: Any) -> Any:
        time.sleep(0.5)
        return original(inputs)

    host.backend.predict = slow_predict
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            responses = list(
                pool.map(
                    lambda i: httpx.post(f"{running.url}/predict", json={"texts": [f"t{i}"]}, timeout=10), range(4)
                )
            )
    finally:
        running.stop()
    assert all(r.status_code == 503 for r in responses), [r.text for r in responses]
    assert all(r.json()["error"]["code"] == "overloaded" and r.headers["Retry-After"] == "1" for r in responses)


def _has_cuda_and_vllm() -> bool:
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _has_cuda_and_vllm(), reason="vLLM backends need a CUDA GPU and `pip install dynaloop[vllm]`")
def test_vllm_classifier_matches_transformers(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    from model_server.backends import ClassifyInput, load_backend

    directory = tmp_path / "minilm"
    init_model_dir(directory, labels=LABELS, model_id="minilm")
    texts = [ClassifyInput("The service was excellent."), ClassifyInput("Cold food and a rude waiter.")]
    reference = load_backend(directory, "transformers", "cuda").predict(texts)
    served = load_backend(directory, "vllm-classify").predict(texts)
    for a, b in zip(reference, served, strict=True):
        assert a.labels == b.labels
        for label in LABELS:
            assert abs(a.probabilities[label] - b.probabilities[label]) < 1e-2


def test_vllm_backends_refuse_clearly_without_a_gpu(model_dirs: dict[str, Path]) -> None:
    if _has_cuda_and_vllm():
        pytest.skip("this machine has a GPU and vLLM")
    from model_server.backends import load_backend
    from model_server.directory import ModelMetadataError

    for kind in ("vllm-classify", "vllm-generate"):
        with pytest.raises(ModelMetadataError) as error:
            load_backend(model_dirs["tiny"], kind)
        assert "dynaloop[vllm]" in str(error.value) or "CUDA GPU" in str(error.value)


def test_torch_work_of_a_request_runs_in_a_thread_that_ends() -> None:
    """A reload or an attribution computes with torch in a thread that ends with it: while a
    second thread that ran torch's OpenMP lives, the batcher's forward passes run slower
    (docs/benchmarks.md). Its answer, its error and the request's context reach the caller."""
    from services.observability import request_id

    ran_in: list[threading.Thread] = []

    def double(value: int) -> tuple[int, str | None]:
        ran_in.append(threading.current_thread())
        return value * 2, request_id.get()

    def fail() -> None:
        raise ValueError("the model directory is broken")

    async def main() -> None:
        request_id.set("rid-7")
        assert await in_a_thread_that_ends(double, 21) == (42, "rid-7")
        with pytest.raises(ValueError, match="broken"):
            await in_a_thread_that_ends(fail)

    asyncio.run(main())
    (thread,) = ran_in
    thread.join(timeout=5)
    assert thread is not threading.main_thread() and not thread.is_alive()
