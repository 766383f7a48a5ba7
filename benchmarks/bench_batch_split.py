"""Where a batch graph.map's CPU goes: the node once, the record pass's client, ours.

``graph.map(source=, into=)`` with ``@node(batch_api=True)`` (``bench_batch_api.py``'s graph
part, local engine) against the fake provider, run twice, each in a fresh process:

- the **plain run**: nothing instrumented; its process CPU (user + system, every thread,
  from the map's start to its end; the fake provider runs in its own process) is the
  ``total``;
- the **timed run**: the node's code and our recording code timed in their thread
  (``time.thread_time``) per pass (a node's calls do not interleave: a recorded or
  replayed call never awaits the network). A ``thread_time`` is a system call (0.5-2 us
  here), some 16 a row: the timed run's own total is higher than the plain run's by
  their cost (``instrument`` in the results, within the runs' noise). The clock reads inside a timed interval are
  taken out by calibration: at the start of the timed run, 20,000 calls of a timed no-op
  measure what one timed call adds inside its own interval (``inside``) and around it
  (``outside``); those times the number of timed calls in each pass are subtracted.

The columns, in CPU seconds for the run and per 1M rows:

- (a) the node's code with its client once: the timed run's replay pass, less our
  recording code in it (and the instrument's calibrated cost); where the fast answer
  (``batchapi/fastreplies.py``) builds a known call's value from its answer, that build
  (the SDK's ``construct_type`` and post-parser) is in (a), the SDK's request and
  response not run;
- (b) what the batch path adds of the client: the timed run's record pass, less our
  recording code in it (the node's own code; openai turning the params into the body,
  where our fast path of a known ``create``, ``batchapi/fastcalls.py``, does not take it);
- (c) ours: the plain run's total less (a) and (b): executor, resources, our recording
  code, driver, rounds, Parquet;
- of (c): our recording code: the timed run's ``FastCreate.found`` / ``answer_of`` (the body
  read from the kwargs, its canonical JSON, digest, answer lookup, the log append),
  ``_BuildLookup.__call__`` (a call looked up as the client builds it, the bare request of
  an answered call), the replayed response and the HTTP-layer transport, both passes,
  less the instrument's calibrated cost inside them;
- total: the plain run's process CPU.

Each part's run-to-run noise is that of two runs (the plain run's total, the timed run's
(a)): ``--pairs N`` makes N plain and N timed runs, alternating, and reports each part's
median (and each pair's value).

    .venv/bin/python benchmarks/bench_batch_split.py --rows 20000 [--pairs 3]
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import resource
import subprocess
import sys
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
                         "ours replay": 0.0, "calls record": 0, "calls replay": 0,
                         "nodes record": 0, "nodes replay": 0}
# our recording code's thread CPU so far (outermost calls), nesting depth, timed calls (all
# outermost on the fast path: the transport's lookup is timed inside its callers)
OURS: list[Any] = [0.0, 0, 0]
_clock = time.thread_time


def _node(func: Any) -> Any:
    """The node's code (async), its thread CPU and that of our recording code in it added
    to ``ACC["node <pass>"]`` / ``ACC["ours <pass>"]`` (record: it raised)."""
    @functools.wraps(func)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        ours, calls, phase = OURS[0], OURS[2], "record"
        t = _clock()
        try:
            value = await func(*args, **kwargs)
            phase = "replay"
            return value
        finally:
            ACC[f"node {phase}"] += _clock() - t
            ACC[f"ours {phase}"] += OURS[0] - ours
            ACC[f"calls {phase}"] += OURS[2] - calls
            ACC[f"nodes {phase}"] += 1
    return timed


def _ours(func: Any) -> Any:
    """One of our recording functions (sync or async), its thread CPU added to ``OURS``
    unless it runs inside another such (the transport's lookup)."""
    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            OURS[1] += 1
            OURS[2] += 1
            t = _clock()
            try:
                return await func(*args, **kwargs)
            finally:
                OURS[1] -= 1
                if not OURS[1]:
                    OURS[0] += _clock() - t
        return timed_async

    @functools.wraps(func)
    def timed(*args: Any, **kwargs: Any) -> Any:
        OURS[1] += 1
        OURS[2] += 1
        t = _clock()
        try:
            return func(*args, **kwargs)
        finally:
            OURS[1] -= 1
            if not OURS[1]:
                OURS[0] += _clock() - t
    return timed


def calibrate(n: int = 20_000) -> tuple[float, float]:
    """What one timed call adds inside its own interval and around it (seconds)."""
    def noop() -> None:
        pass

    timed = _ours(noop)
    best = (float("inf"), 0.0)
    for _ in range(3):  # the least disturbed of three
        t0 = _clock()
        for _ in range(n):
            noop()
        plain = _clock() - t0
        before = OURS[0]
        t0 = _clock()
        for _ in range(n):
            timed()
        full = _clock() - t0 - plain
        inside = OURS[0] - before
        if full < best[0] + best[1]:
            best = (full - inside, inside)
    OURS[0], OURS[2] = 0.0, 0
    return best[1] / n, best[0] / n


def _instrument() -> None:
    bench.classify = _node(bench.classify)
    transport = recording.RecordingTransport
    transport.handle_async_request = _ours(transport.handle_async_request)  # the HTTP layer
    transport._response = _ours(transport._response)  # the replayed response
    build = getattr(recording, "_BuildLookup", None)  # a tree that looks calls up as built
    if build is not None:  # its lookup and an answered call's bare request
        build.__call__ = _ours(build.__call__)
    else:  # a tree without it: the transport's lookup, wherever it runs
        transport.lookup = _ours(transport.lookup)
    fast = getattr(fastcalls, "FastCreate", None) if fastcalls else None
    if fast is not None:  # a tree whose known create methods take the body from the kwargs
        fast.found = _ours(fast.found)
        name = "answer_of" if hasattr(fast, "answer_of") else "passing"  # its lookup
        setattr(fast, name, _ours(getattr(fast, name)))


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def run_once(rows: int, timed: bool) -> dict[str, Any]:
    """One run in this process (``timed``: instrumented, calibrated first)."""
    inside = outside = 0.0
    if timed:
        inside, outside = calibrate()
        _instrument()
    with tempfile.TemporaryDirectory() as tmp, BatchServer(delay=1.0, headers=False) as server:
        work = Path(tmp)
        bench.write_source(work / "g.parquet", rows)
        (work / "out").mkdir()
        c0, w0 = _cpu(), time.perf_counter()
        got = bench.part_graph(work / "g.parquet", work / "out", server.base_url, online=False)
        total, wall = _cpu() - c0, time.perf_counter() - w0
    total -= got.get("check_cpu_s", 0.0)  # the bench's own check of the labels written
    return {"cpu_s": total, "wall_s": wall, "map": got, "acc": dict(ACC),
            "inside_us": inside * 1e6, "outside_us": outside * 1e6}


def _child(rows: int, mode: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        subprocess.run([sys.executable, __file__, "--rows", str(rows), "--mode", mode,
                        "--out", str(out)], check=True)
        return json.loads(out.read_text())


def split(rows: int, plain: dict[str, Any], timed: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows from the two runs (module docstring)."""
    acc, inside, outside = timed["acc"], timed["inside_us"] / 1e6, timed["outside_us"] / 1e6

    def client(phase: str) -> float:  # the node's pass less ours and the instrument's cost
        return (acc[f"node {phase}"] - acc[f"ours {phase}"]
                - acc[f"calls {phase}"] * outside - acc[f"nodes {phase}"] * inside)

    a, b, total = client("replay"), client("record"), plain["cpu_s"]
    ours = (acc["ours record"] + acc["ours replay"]
            - (acc["calls record"] + acc["calls replay"]) * inside)
    per = 1e6 / rows
    parts = [("(a) node once (replay pass, as online)", a), ("(b) record pass's client", b),
             ("(c) ours: total - (a) - (b)", total - a - b),
             ("   of (c): our recording code", ours), ("(b) + (c): our own time", total - a),
             ("total (plain run)", total),
             ("instrument: timed run's total - plain run's", timed["cpu_s"] - total)]
    return [{"part": k, "cpu_s": round(v, 2), "s_per_1M": round(v * per),
             "share": f"{100 * v / total:.0f}%"} for k, v in parts]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def report_of(rows: int, runs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The results of ``runs`` (plain, timed) pairs: each part's median over them, and
    each pair's value (``each_s_per_1M``)."""
    splits = [split(rows, plain, timed) for plain, timed in runs]
    table = []
    for i, first in enumerate(splits[0]):
        cpu = _median([sp[i]["cpu_s"] for sp in splits])
        table.append({"part": first["part"], "cpu_s": round(cpu, 2),
                      "s_per_1M": round(cpu * 1e6 / rows),
                      "share": f"{100 * cpu / _median([r[0]['cpu_s'] for r in runs]):.0f}%",
                      "each_s_per_1M": " / ".join(str(sp[i]["s_per_1M"]) for sp in splits)})
    plain, timed = runs[-1]
    acc = timed["acc"]
    clocks = 2 * (acc["calls record"] + acc["calls replay"] + acc["nodes record"]
                  + acc["nodes replay"])
    return {"rows": rows, "pairs": len(runs), "wall_s": round(plain["wall_s"], 1),
            "cpu_s": round(_median([r[0]["cpu_s"] for r in runs]), 2), "map": plain["map"],
            "split": table,
            "timed_run": {"cpu_s": round(timed["cpu_s"], 2), "map": timed["map"],
                          "thread_time_calls_per_row": round(clocks / rows, 1),
                          "inside_us": round(timed["inside_us"], 2),
                          "outside_us": round(timed["outside_us"], 2), "acc": acc}}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--pairs", type=int, default=1,
                   help="plain and timed runs, alternating: each part's median is reported")
    p.add_argument("--name", default="batch_split", help="results/<name>.json")
    p.add_argument("--mode", choices=["plain", "timed"], help="one run, in this process")
    p.add_argument("--out", help="--mode's results file")
    args = p.parse_args()
    if args.mode:
        Path(args.out).write_text(json.dumps(run_once(args.rows, args.mode == "timed")))
        return
    load = os.getloadavg()[0]
    runs = [(_child(args.rows, "plain"), _child(args.rows, "timed"))
            for _ in range(args.pairs)]
    report = {**report_of(args.rows, runs), "fast_path": fastcalls is not None,
              "machine": machine(load)}
    cols = ["part", "cpu_s", "s_per_1M", "share"] + (["each_s_per_1M"] if args.pairs > 1 else [])
    print_table(report["split"], cols)
    print(f"plain run: {report['cpu_s']} CPU s for {args.rows:,} rows (median of {args.pairs}), "
          f"wall {report['wall_s']} s; timed run: {report['timed_run']['cpu_s']} CPU s, "
          f"{report['timed_run']['thread_time_calls_per_row']} clock reads a row")
    print(f"wrote {write_results(RESULTS, args.name, report)}")


if __name__ == "__main__":
    main()
