"""A rate limit that never binds, without HTTP: what declaring it costs the guard.

4,000 rows of an async node sleeping 10-30 ms (64 at once, ``concurrency=64``), metering 25
tokens a call, on the local engine: ``free`` (no rate limit), ``loose`` (``rate_limit`` on
calls and tokens far above what the node reaches: ``bench_paid_api.LOOSE``) and ``calls_only``
(the calls limit alone); four alternating rounds, the best wall time of each, this process's
CPU time per row of that round, and the peak of calls in flight. What ``bench_paid_api.py
nonbinding`` measures with the real ``openai`` client, without its noise.

Run: ``.venv/bin/python benchmarks/bench_nonbinding_rate.py`` (``results/nonbinding_rate.json``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from hypernodes_bench.tables import machine
from hypernodes_dist import Graph, meter, node

RESULTS = Path(__file__).parent / "results"
CALLS, TOKENS = "600000/minute", "60000000/minute"
FLIGHT = [0, 0]  # running, peak


async def _body(x: int) -> int:
    FLIGHT[0] += 1
    FLIGHT[1] = max(FLIGHT[1], FLIGHT[0])
    await asyncio.sleep(0.010 + 0.020 * ((x * 7919) % 100) / 100)
    FLIGHT[0] -= 1
    meter(tokens=25)
    return x


@node(output_name="y", concurrency=64)
async def free(x: int) -> int:
    return await _body(x)


@node(output_name="y", concurrency=64, rate_limit={"calls": CALLS, "tokens": TOKENS})
async def loose(x: int) -> int:
    return await _body(x)


@node(output_name="y", concurrency=64, rate_limit=CALLS)
async def calls_only(x: int) -> int:
    return await _body(x)


def main(rows: int = 4000, rounds: int = 4) -> dict[str, object]:
    load_before = os.getloadavg()[0]
    graphs = {n.name: Graph([n]) for n in (free, loose, calls_only)}
    xs = list(range(rows))
    for g in graphs.values():
        g.map({"x": xs[:200]}, map_over="x")
    best: dict[str, dict[str, float]] = {}
    for r in range(rounds):
        for name in (list(graphs) if r % 2 == 0 else list(reversed(list(graphs)))):
            FLIGHT[1] = 0
            t0, c0 = time.perf_counter(), time.process_time()
            graphs[name].map({"x": xs}, map_over="x")
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if name not in best or wall < best[name]["seconds"]:
                best[name] = {"seconds": round(wall, 3),
                              "cpu_us_per_row": round(1e6 * cpu / rows, 1), "peak": FLIGHT[1]}
    base = best["free"]["seconds"]
    out = [{"node": k, **v, "vs_free": round(v["seconds"] / base, 3)} for k, v in best.items()]
    for row in out:
        print(row)
    return {"machine": machine(load_before), "rows": rows, "rounds": rounds, "results": out}


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "nonbinding_rate"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(main(), indent=2) + "\n")
