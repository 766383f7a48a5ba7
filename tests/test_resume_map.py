"""Resumable maps: a map killed partway and started again with the same cache recomputes
only the items that had not finished (README, "Crash and resume").

A driver process (this module run as ``python -m tests.test_resume_map``) maps a node that
sleeps a little and appends ``<item> <time>`` to a per-process log file when it finishes.
The test kills the driver's whole process group (SIGKILL: the driver and any worker
processes it started) once enough items are logged, runs the same map again on the same
cache (in its own process on engines that start no process, else in a new driver), and
counts executions through the log files:

- every item is executed at least once over the two runs, and at most twice; every result
  of the rerun is correct;
- an item executed twice finished in run 1 no earlier than ``bound`` seconds before the
  kill, where ``bound = FLUSH_SECONDS + 2 x (longest 64-call slice observed) + 0.25 s``
  (a sync call reaches the write buffer when its slice of 64 calls ends; the buffer is
  committed at the first hand-over at least ``FLUSH_SECONDS`` after the previous commit);
  everything that finished earlier is never recomputed.

Ctrl-C (SIGINT -> ``KeyboardInterrupt`` in the driver): the executor's ``finally`` flush
keeps every finished call, so on the local engine nothing is executed twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine, node
from hypernodes_dist.cache.keys import FLUSH_SECONDS
from hypernodes_dist.execution.calls import PERSIST_SLICE

ROOT = Path(__file__).resolve().parent.parent
N = 4000
DELAYS = {"local": 0.001}  # seconds per call; parallel engines sleep longer, so run 1 lasts
DELAY = 0.002  # past KILL_AT_S on 2 cores whatever the engine
ASYNC_DELAY = 0.1  # 100 calls in flight per batch: 20 waves of 0.1 s
KILL_AT_S = 1.5  # run 1 is killed at least this long after its first item finished,
MARGIN_S = 0.5  # and at least this long past the persistence bound measured so far
SLICE = PERSIST_SLICE  # sync calls handed to the write buffer together
IN_PROCESS = {"local", "dask-threads", "daft"}  # their reruns run in the test's process

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and killpg")

# ------------------------------------------------------------------ nodes (imported by workers)

_FDS: dict[tuple[int, str], int] = {}


def _log(log_dir: str, x: int) -> None:
    """Append ``x``, the time and the thread to this process's log (one O_APPEND write)."""
    key = (os.getpid(), log_dir)
    fd = _FDS.get(key)
    if fd is None:
        fd = _FDS[key] = os.open(os.path.join(log_dir, f"{os.getpid()}.log"),
                                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, f"{x} {time.time():.6f} {threading.get_ident()}\n".encode())


@node(output_name="y")
def slow_square(x: int, log_dir: str, delay: float) -> int:
    time.sleep(delay)
    _log(log_dir, x)
    return x * x


@node(output_name="y")
async def slow_square_async(x: int, log_dir: str, delay: float) -> int:
    await asyncio.sleep(delay)
    _log(log_dir, x)
    return x * x


@node(output_name="label")
def label(y: int) -> str:
    return f"y={y}"


def make_engine(name: str):
    if name == "local":
        return GraphEngine()
    if name.startswith("dask-"):
        from hypernodes_dask import DaskEngine

        return DaskEngine(scheduler=name.removeprefix("dask-"))
    if name == "daft":
        from hypernodes_daft import DaftEngine

        return DaftEngine()
    raise ValueError(name)


def drive(argv: list[str]) -> None:
    """The driver: ``ENGINE KIND CACHE LOG_DIR OUT``; writes the labels as JSON to OUT."""
    engine, kind, cache, log_dir, out = argv
    first = slow_square_async if kind == "async" else slow_square
    graph = Graph([first, label], engine=make_engine(engine), cache=DiskCache(cache))
    try:
        delay = ASYNC_DELAY if kind == "async" else DELAYS.get(engine, DELAY)
        res = graph.map({"x": list(range(N)), "log_dir": log_dir, "delay": delay},
                        map_over="x", select=["label"])
        Path(out).write_text(json.dumps([r["label"] for r in res]))
    finally:
        graph.engine.close()


# ------------------------------------------------------------------ harness


def _logged(log_dir: Path, suffix: str = ".log") -> dict[str, list[tuple[int, float]]]:
    """``process:thread -> [(item, finished at)]`` from the log files."""
    runs: dict[str, list[tuple[int, float]]] = {}
    for f in log_dir.glob(f"*{suffix}"):
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:  # a line torn by the kill is not a finished call
                runs.setdefault(f"{f.stem}:{parts[2]}", []).append((int(parts[0]), float(parts[1])))
    return runs


def _first_logged(log_dir: Path) -> float | None:
    times = [t for rows in _logged(log_dir).values() for _, t in rows]
    return min(times) if times else None


def _count(log_dir: Path) -> int:
    total = 0
    for f in log_dir.glob("*.log"):
        try:
            total += f.read_bytes().count(b"\n")
        except FileNotFoundError:
            pass
    return total


def _start(engine: str, kind: str, tmp: Path, out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.test_resume_map", engine, kind, str(tmp / "cache"),
         str(tmp / "logs"), str(out)],
        cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


def _wait_until_under_way(proc: subprocess.Popen, logs: Path, timeout: float = 90) -> None:
    """Returns once run 1 has been finishing items for ``KILL_AT_S`` and for at least the
    persistence bound (measured live on this machine) plus ``MARGIN_S``: the kill then
    always leaves items older than the bound, whatever the machine's load."""
    deadline = time.monotonic() + timeout
    started = None
    wait_s = KILL_AT_S
    next_check = 0.0
    while started is None or time.time() < started + wait_s:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            pytest.fail(f"run 1 ended (rc={proc.returncode}) before the signal:\n{out[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"run 1 did not get under way in {timeout} s")
        if started is None and _count(logs):
            started = _first_logged(logs)
        if started is not None and time.monotonic() >= next_check:
            next_check = time.monotonic() + 0.1
            wait_s = max(KILL_AT_S, _bound(_logged(logs)) + MARGIN_S)
        time.sleep(0.005)


def _bound(run1: dict[str, list[tuple[int, float]]]) -> float:
    """How long before the kill a finished call may still be unpersisted (module doc)."""
    return FLUSH_SECONDS + 2 * _slice_seconds(run1) + 0.25


def _slice_seconds(run1: dict[str, list[tuple[int, float]]]) -> float:
    """The longest time any worker thread took for ``SLICE`` consecutive calls in run 1."""
    longest = 0.0
    for rows in run1.values():
        ts = sorted(t for _, t in rows)
        for i in range(len(ts)):
            j = min(i + SLICE, len(ts) - 1)
            longest = max(longest, ts[j] - ts[i])
    return longest


def _rerun(engine: str, kind: str, tmp: Path) -> None:
    """The same map to its end: in this process on engines that start no process (a child
    would import them again, ~1 CPU s), else in a child as run 1."""
    if engine in IN_PROCESS:
        drive([engine, kind, str(tmp / "cache"), str(tmp / "logs"), str(tmp / "run2.json")])
        return
    rerun = _start(engine, kind, tmp, tmp / "run2.json")
    try:
        rerun_out = rerun.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if rerun.poll() is None:
            os.killpg(rerun.pid, signal.SIGKILL)
            rerun.wait()
    assert rerun.returncode == 0, rerun_out[-3000:]


def _interrupt_and_resume(tmp: Path, engine: str, kind: str, sig: int) -> dict:
    """Run 1 for ``KILL_AT_S``, deliver ``sig``, rerun to completion, count executions."""
    logs = tmp / "logs"
    logs.mkdir()
    proc = _start(engine, kind, tmp, tmp / "run1.json")
    try:
        _wait_until_under_way(proc, logs)
        killed_at = time.time()
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and every worker it started
        else:
            os.kill(proc.pid, sig)  # Ctrl-C reaches the driver
        rc = proc.wait(timeout=60)
        output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert rc != 0, f"run 1 finished before the signal:\n{output[-2000:]}"
    assert not (tmp / "run1.json").exists()
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in output, output[-2000:]
    for f in logs.glob("*.log"):  # run 1's executions; the rerun writes fresh files
        f.rename(f.with_suffix(".run1"))

    _rerun(engine, kind, tmp)
    assert json.loads((tmp / "run2.json").read_text()) == [f"y={x * x}" for x in range(N)]

    run1 = _logged(logs, ".run1")
    run2 = _logged(logs, ".log")
    first = {x: t for rows in run1.values() for x, t in rows}
    counts = Counter(x for rows in [*run1.values(), *run2.values()] for x, _ in rows)
    assert set(counts) == set(range(N)), "some items never ran"
    assert max(counts.values()) <= 2, counts.most_common(3)
    twice = sorted(x for x, c in counts.items() if c == 2)
    assert set(twice) <= set(first)  # only a run-1 execution can be repeated
    bound = _bound(run1)
    late = [x for x in twice if first[x] < killed_at - bound]
    assert not late, (f"{len(late)} items finished more than {bound:.2f} s before the kill "
                      f"were recomputed, e.g. {late[:5]}")
    persisted_window = sum(1 for t in first.values() if t < killed_at - bound)
    return {"run1": len(first), "twice": len(twice), "bound_s": round(bound, 3),
            "older_than_bound": persisted_window}


def _report(name: str, stats: dict) -> None:
    print(f"\n{name}: {stats}")


# ------------------------------------------------------------------ tests


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine", ["local", "dask-threads", "dask-processes", "daft"])
def test_sigkill_driver_then_rerun_recomputes_only_unfinished_items(tmp_path, engine):
    if engine.startswith("dask"):
        pytest.importorskip("hypernodes_dask")
    if engine == "daft":
        pytest.importorskip("hypernodes_daft")
    stats = _interrupt_and_resume(tmp_path, engine, "sync", signal.SIGKILL)
    _report(engine, stats)
    assert stats["older_than_bound"] > 0  # the kill came late enough to prove something


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_ctrl_c_keeps_every_finished_item_local(tmp_path, kind):
    stats = _interrupt_and_resume(tmp_path, "local", kind, signal.SIGINT)
    _report(f"local {kind} SIGINT", stats)
    assert stats["twice"] == 0, stats


def test_in_process_rerun_after_an_error_reuses_finished_items(tmp_path):
    """Fast, no subprocess: an item failing midway (on_error='raise') keeps what finished."""
    logs = tmp_path / "logs"
    logs.mkdir()

    @node(output_name="z")
    def fragile(y: int, fail_at: int) -> int:
        if y == fail_at * fail_at and fail_at >= 0:
            raise RuntimeError("boom")
        return y + 1

    cache = DiskCache(tmp_path / "cache")
    inputs = {"x": list(range(300)), "log_dir": str(logs), "delay": 0.0}
    g = Graph([slow_square, fragile], cache=cache)
    with pytest.raises(RuntimeError, match="boom"):
        g.map({**inputs, "fail_at": 250}, map_over="x")
    assert sum(len(r) for r in _logged(logs).values()) >= 250
    res = g.map({**inputs, "fail_at": -1}, map_over="x")
    assert [r["z"] for r in res] == [x * x + 1 for x in range(300)]
    counts = Counter(x for rows in _logged(logs).values() for x, _ in rows)
    assert max(counts.values()) == 1  # slow_square never ran twice for any item


if __name__ == "__main__":  # the nodes must come from the importable module, not __main__
    from tests.test_resume_map import drive as _drive

    _drive(sys.argv[1:])
