"""The guard's own cost: a trivial sync node, with and without a policy, on the local engine.

Each round maps ``--items`` items through ``plain`` (no policy: never guarded), ``limited``
(``concurrency=4``: hold-off check, the AIMD place and the machine semaphore per call) and
``paced`` (``rate_limit`` far above what the node reaches: a rate turn per call), in
alternating order; the best round of each is kept. Reported: microseconds per call, and the
guard's overhead per call (the node's time less ``plain``'s).

Run: ``.venv/bin/python benchmarks/bench_guard.py [--items 20000] [--rounds 7]``.
Prints a table and writes ``benchmarks/results/guard.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from hypernodes_bench.tables import machine
from hypernodes_dist import Graph, node

RESULTS = Path(__file__).parent / "results"


@node(output_name="y")
def plain(x: int) -> int:
    return x + 1


@node(output_name="y", concurrency=4)
def limited(x: int) -> int:
    return x + 1


@node(output_name="y", rate_limit="10000000/second")
def paced(x: int) -> int:
    return x + 1


def _seconds(graph: Graph, items: list[int]) -> float:
    t0 = time.perf_counter()
    graph.map({"x": items}, map_over="x")
    return time.perf_counter() - t0


def main(items: int, rounds: int) -> dict[str, object]:
    load_before = os.getloadavg()[0]
    graphs = {n.name: Graph([n]) for n in (plain, limited, paced)}
    xs = list(range(items))
    for g in graphs.values():  # warm up: imports, semaphores, rate files
        _seconds(g, xs[:1000])
    best = {name: float("inf") for name in graphs}
    for r in range(rounds):
        order = list(graphs) if r % 2 == 0 else list(reversed(graphs))
        for name in order:
            best[name] = min(best[name], _seconds(graphs[name], xs))
    us = {name: 1e6 * s / items for name, s in best.items()}
    rows = [{"node": name, "us_per_call": round(v, 2),
             "guard_us_per_call": round(v - us["plain"], 2)} for name, v in us.items()]
    for row in rows:
        print(f"{row['node']:>8}  {row['us_per_call']:8.2f} us/call  "
              f"guard {row['guard_us_per_call']:+7.2f} us/call")
    return {"machine": machine(load_before), "items": items, "rounds": rounds, "rows": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="guard.json")
    args = parser.parse_args()
    result = main(args.items, args.rounds)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(result, indent=2) + "\n")
