"""Local engine overhead: map of the 3-node trivial graph vs the plain Python loop.

x -> x+1 -> *2 -> f"{b}-{y}" over N items (the ``trivial`` graph of
``hypernodes_bench.workloads``; ``inc``/``double``/``fmt`` are re-exported for other
scripts). Prints a table and writes benchmarks/results/local.json. Run: ``.venv/bin/python benchmarks/bench_local.py [N ...]``.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

from hypernodes_bench.workloads import double, fmt, inc, trivial_loop
from hypernodes_dist import Graph, GraphEngine

RESULTS = Path(__file__).parent / "results"


def plain_loop(xs: list[int], y: str) -> list[str]:
    return trivial_loop({"x": xs, "y": y})


def best_of(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(sizes: list[int]) -> list[dict]:
    rows = []
    for n in sizes:
        xs = list(range(n))
        loop_s = best_of(lambda xs=xs: plain_loop(xs, "y"))
        for label, engine in [
            ("local batch=100", GraphEngine()),
            ("local batch=1000", GraphEngine(batch_size=1000)),
        ]:
            g = Graph([inc, double, fmt], engine=engine)
            res = g.map({"x": xs, "y": "y"}, map_over="x")
            assert res[n - 1]["c"] == plain_loop([xs[-1]], "y")[0]
            t = best_of(lambda g=g, xs=xs: g.map({"x": xs, "y": "y"}, map_over="x"))
            rows.append({
                "engine": label, "items": n, "seconds": round(t, 4),
                "items_per_s": round(n / t), "us_per_item": round(t / n * 1e6, 2),
                "loop_us_per_item": round(loop_s / n * 1e6, 3), "ratio_to_loop": round(t / loop_s, 1),
            })
    return rows


def print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    print(" | ".join(f"{c:>16}" for c in cols))
    for r in rows:
        print(" | ".join(f"{str(r[c]):>16}" for c in cols))


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[1:]] or [1_000, 100_000]
    rows = main(sizes)
    print_table(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"benchmark": "local", "python": platform.python_version(), "rows": rows}
    (RESULTS / "local.json").write_text(json.dumps(out, indent=2))
