"""Where a batch graph.map's CPU goes: the node once, the record pass's client, ours.

``graph.map(source=, into=)`` with ``@node(batch_api=True)`` (``bench_batch_api.py``'s graph
part, local engine) against the fake provider; the node's code and our recording code
are timed in their thread (``time.thread_time``) per pass (a node's calls do not interleave:
a recorded or replayed call never awaits the network):

- (a) the node's code with its client as the online path runs it once: the replay pass
  (openai builds the request, parses the response), less our code;
- (b) what the batch path adds of the client: the record pass, less our code (the node's
  own code; openai turning the params into the body, where our fast path of a known
  ``create`` (``batchapi/fastcalls.py``) does not take the call);
- (c) ours: the process's CPU less (a) and (b): executor, resources, our recording code
  (the body read from the kwargs or from the options as the client builds the request,
  digest, answer lookup, log append, the replayed response and its bare request: timed
  as ours), driver, rounds, Parquet.

    .venv/bin/python benchmarks/bench_batch_split.py --rows 20000
"""

from __future__ import annotations

import argparse
import functools
import inspect
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

try:
    from hypernodes_dist.batchapi import fastcalls
except ImportError:  # a tree before the fast path (main, for before/after)
    fastcalls = None

RESULTS = Path(__file__).parent / "results"
ACC: dict[str, float] = {"node record": 0.0, "node replay": 0.0, "ours record": 0.0,
                         "ours replay": 0.0}
OURS = {"cpu": 0.0, "depth": 0}  # our recording code's thread CPU so far (outermost calls)


def _node(func: Any) -> Any:
    """The node's code (async), its thread CPU and that of our recording code in it added
    to ``ACC["node <pass>"]`` / ``ACC["ours <pass>"]`` (record: it raised)."""
    @functools.wraps(func)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        t, ours, phase = time.thread_time(), OURS["cpu"], "record"
        try:
            value = await func(*args, **kwargs)
            phase = "replay"
            return value
        finally:
            ACC[f"node {phase}"] += time.thread_time() - t
            ACC[f"ours {phase}"] += OURS["cpu"] - ours
    return timed


def _ours(func: Any) -> Any:
    """One of our recording functions (sync or async), its thread CPU added to ``OURS``
    unless it runs inside another such (the transport's lookup)."""
    def enter() -> float:
        OURS["depth"] += 1
        return time.thread_time()

    def leave(t: float) -> None:
        OURS["depth"] -= 1
        if not OURS["depth"]:
            OURS["cpu"] += time.thread_time() - t

    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            t = enter()
            try:
                return await func(*args, **kwargs)
            finally:
                leave(t)
        return timed_async

    @functools.wraps(func)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t = enter()
        try:
            return func(*args, **kwargs)
        finally:
            leave(t)
    return timed


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def run(rows: int) -> dict[str, Any]:
    bench.classify = _node(bench.classify)
    transport = recording.RecordingTransport
    transport.handle_async_request = _ours(transport.handle_async_request)
    transport.lookup = _ours(transport.lookup)
    transport._response = _ours(transport._response)  # the replayed response
    build = getattr(recording, "_BuildLookup", None)  # a tree that looks calls up as built
    if build is not None:
        build.batchable = _ours(build.batchable)
        build.bare = _ours(build.bare)  # an answered call's bare request
    fast = getattr(fastcalls, "FastCreate", None) if fastcalls else None
    if fast is not None:  # a tree whose known create methods take the body from the kwargs
        fast.found = _ours(fast.found)
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
             ("   of (c): our recording code", ACC["ours record"] + ACC["ours replay"])]
    return {"rows": rows, "wall_s": round(wall, 1), "cpu_s": round(total, 2), "map": got,
            "split": [{"part": k, "cpu_s": round(v, 2), "s_per_1M": round(v * per),
                       "share": f"{100 * v / total:.0f}%"} for k, v in parts]}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--name", default="batch_split", help="results/<name>.json")
    args = p.parse_args()
    load = os.getloadavg()[0]
    report = {**run(args.rows), "fast_path": fastcalls is not None, "machine": machine(load)}
    print_table(report["split"], ["part", "cpu_s", "s_per_1M", "share"])
    print(f"total {report['cpu_s']} CPU s for {args.rows:,} rows; wall {report['wall_s']} s")
    print(f"wrote {write_results(RESULTS, args.name, report)}")


if __name__ == "__main__":
    main()
