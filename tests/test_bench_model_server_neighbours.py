"""bench/model_server_neighbours.py's arithmetic: its table pairs each round's fixed and auto
phases and takes the median of their ratios; its neighbours are programs that run. (The servers
and the neighbours' effect are what the benchmark measures, not this test.)"""

from __future__ import annotations

from typing import Any

from bench import model_server_neighbours as bench


def _phase(round_: int, neighbour: str, clients: int, server: str, seq_per_s: float) -> dict[str, Any]:
    return {
        "round": round_,
        "neighbour": neighbour,
        "clients": clients,
        "server": server,
        "seq_per_s": seq_per_s,
        "p99_ms": 10.0 * round_,
        "forward_threads": 1.0 if server == "auto" else 2.0,
        "team_changes": round_,
        "cpu": {"other_cores": 0.5 * round_},
    }


def test_the_table_pairs_each_rounds_phases_and_takes_the_median_ratio() -> None:
    phases = []
    # Round 1: auto 2x fixed; round 2: auto 4x; round 3: auto 3x (the median). Fixed comes first
    # in some rounds and second in others: pairing goes by round, not by position.
    for round_, fixed, auto in [(1, 10.0, 20.0), (2, 5.0, 20.0), (3, 10.0, 30.0)]:
        for clients in bench.CLIENTS:
            pair = [
                _phase(round_, "one core", clients, "fixed", fixed),
                _phase(round_, "one core", clients, "auto", auto),
            ]
            phases += pair if round_ % 2 else pair[::-1]
    result = bench.report(phases, rounds=3, neighbours=["one core"])
    assert [row["clients"] for row in result["table"]] == list(bench.CLIENTS)
    row = result["table"][0]
    assert row["auto_over_fixed_per_round"] == [2.0, 4.0, 3.0]
    assert row["auto_over_fixed"] == 3.0
    assert row["fixed_seq_per_s"] == 10.0 and row["auto_seq_per_s"] == 20.0
    assert row["auto_forward_threads"] == [1.0, 1.0, 1.0] and row["auto_team_changes"] == [1, 2, 3]


def test_every_neighbour_is_a_python_program_and_none_is_no_process() -> None:
    assert bench.NEIGHBOURS["none"] is None
    for name, code in bench.NEIGHBOURS.items():
        if code is not None:
            compile(code, name, "exec")
    assert set(bench.SERVER_NEIGHBOURS) <= set(bench.NEIGHBOURS)
