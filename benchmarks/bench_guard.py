"""The guard's own cost per call: a trivial sync node under each policy.

Each node's calls go through ``Guard.positional`` as the columnar executor drives them (one
sync call per item, no event loop): ``limited`` (``concurrency=4``: the hold-off check, the
AIMD place and the machine semaphore per call), ``paced`` (a ``rate_limit`` it never
reaches: a rate turn per call), ``retried`` (``retries=2``: the first attempt is a plain
call). Measured in this thread's CPU time (other processes competing for the cores do not
count), best of ``--rounds``; ``plain`` is the function called directly.

Run: ``.venv/bin/python benchmarks/bench_guard.py [--calls 20000] [--rounds 15]``; prints a
table and writes ``benchmarks/results/guard.json`` (``--name`` another file). To compare two
trees, run it with each first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from hypernodes_bench.tables import machine
from hypernodes_dist import node
from hypernodes_dist.execution.guard import Guard

RESULTS = Path(__file__).parent / "results"


def _inc(x: int) -> int:
    return x + 1


limited = node(output_name="y", concurrency=4, name="limited")(_inc)
paced = node(output_name="y", rate_limit="10000000/second", name="paced")(_inc)
retried = node(output_name="y", retries=2, name="retried")(_inc)


def _per_call(fn: Any, calls: int) -> float:
    t0 = time.thread_time()
    for i in range(calls):
        fn(i)
    return time.thread_time() - t0


def main(calls: int, rounds: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    best = {"plain": min(_per_call(_inc, calls) for _ in range(rounds))}
    for n in (limited, paced, retried):
        best[n.name] = min(_per_call(Guard(n).positional(_inc, range(calls)), calls)
                           for _ in range(rounds))
    rows = [{"node": name, "us_per_call": round(1e6 * s / calls, 2)} for name, s in best.items()]
    for row in rows:
        print(f"{row['node']:>8}  {row['us_per_call']:7.2f} us/call (thread CPU, best of {rounds})")
    return {"machine": machine(load_before), "calls": calls, "rounds": rounds, "rows": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--name", default="guard")
    args = parser.parse_args()
    result = main(args.calls, args.rounds)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
