"""Where a batch graph.map's CPU goes: the node once, the record pass's client, ours.

``graph.map(source=, into=)`` with ``@node(batch_api=True)`` (``bench_batch_api.py``'s graph
part, local engine) against the fake provider; the node's code and the recording transport
are timed in their thread (``time.thread_time``) per pass:

- (a) the node's code with its client as the online path runs it once: the replay pass
  (openai builds the request, parses the response), less our transport;
- (b) what the batch path adds of the client: the record pass (openai builds a request
  our transport then stops), less our transport;
- (c) ours: the process's CPU less (a) and (b): executor, resources, recording transport
  (digest, answer lookup, log append, the replayed response), driver, rounds, Parquet.

    .venv/bin/python benchmarks/bench_batch_split.py --rows 20000
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_batch_api as bench

from hypernodes_bench.batch_server import BatchServer
from hypernodes_bench.tables import machine, print_table, write_results
from hypernodes_dist.batchapi import recording

RESULTS = Path(__file__).parent / "results"
ACC: dict[str, float] = {"node record": 0.0, "node replay": 0.0, "ours record": 0.0,
                         "ours replay": 0.0}


def _timed(func: Any, key: str) -> Any:
    """``func`` (async) with its thread CPU added to ``ACC[key + pass]``."""
    @functools.wraps(func)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        t, phase = time.thread_time(), "record"
        try:
            value = await func(*args, **kwargs)
            phase = "replay"
            return value
        finally:
            ACC[f"{key} {phase}"] += time.thread_time() - t
    return timed


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def run(rows: int) -> dict[str, Any]:
    bench.classify = _timed(bench.classify, "node")
    transport = recording.RecordingTransport
    transport.handle_async_request = _timed(transport.handle_async_request, "ours")
    with tempfile.TemporaryDirectory() as tmp, BatchServer(delay=1.0, headers=False) as server:
        work = Path(tmp)
        bench.write_source(work / "g.parquet", rows)
        (work / "out").mkdir()
        c0, w0 = _cpu(), time.perf_counter()
        got = bench.part_graph(work / "g.parquet", work / "out", server.base_url, online=False)
        total, wall = _cpu() - c0, time.perf_counter() - w0
    a = ACC["node replay"] - ACC["ours replay"]
    b = ACC["node record"] - ACC["ours record"]
    per = 1e6 / rows
    parts = [("(a) node once (replay pass, as online)", a), ("(b) record pass's client", b),
             ("(c) ours", total - a - b),
             ("   of (c): recording transport", ACC["ours record"] + ACC["ours replay"])]
    return {"rows": rows, "wall_s": round(wall, 1), "cpu_s": round(total, 2), "map": got,
            "split": [{"part": k, "cpu_s": round(v, 2), "s_per_1M": round(v * per),
                       "share": f"{100 * v / total:.0f}%"} for k, v in parts]}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--name", default="batch_split", help="results/<name>.json")
    args = p.parse_args()
    load = os.getloadavg()[0]
    report = {**run(args.rows), "machine": machine(load)}
    print_table(report["split"], ["part", "cpu_s", "s_per_1M", "share"])
    print(f"total {report['cpu_s']} CPU s for {args.rows:,} rows; wall {report['wall_s']} s")
    print(f"wrote {write_results(RESULTS, args.name, report)}")


if __name__ == "__main__":
    main()
