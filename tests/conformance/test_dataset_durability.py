"""Dataset maps commit by time (``commit_seconds``) and pay each row once, on every engine.

- In process, on every engine variant of the ``engine`` fixture: a map into ``into=``
  runs each row's nodes once (the rows computed to fix the output types included), and a
  fast map writes no more files than it has parts (plus the type-fixing rows' file).
- With a real SIGKILL (a driver subprocess, ``durability_job.py``, its whole
  process group killed; Dask workers and Daft threads die with it): every row that
  finished more than ``commit_seconds`` (plus a scheduling allowance) before the kill is
  in a complete Parquet file of ``into=``, no row ran twice, and the rerun (in this
  process on the engines that start no process) computes exactly the rows not in a
  file, each once. Executions are counted from one file per
  execution that the node writes (``dataset_graphs.timed_square``, ``timed_call``):
  fast rows at ``commit_seconds=0.5`` on every engine, concurrent slow calls at
  ``commit_seconds=2`` on local, Dask processes and Daft.
- A stop under ``on_error="raise"`` (a budget, a Ctrl-C in the driver) writes every row
  that was paid (the real ``openai`` client against the loopback server): the server's
  request counts prove no row is paid twice by the rerun. The Ctrl-C (SIGINT to this
  process) comes from inside the map (``ctrl_c_graphs``): once a chosen row is paid, or as
  the map starts (before its first row); the rerun runs in the same process.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hypernodes_bench.llm_server import label_of
from hypernodes_dist import Graph
from hypernodes_dist.errors import BudgetExceededError

from . import ctrl_c_graphs as C
from . import dataset_graphs as D
from . import usage_graphs as U
from .durability_job import Killed, one_part, run
from .engines import all_engines

ROOT = Path(__file__).resolve().parents[2]
ALLOWANCE = 1.0  # seconds a loaded 2-core machine may add (a write, a slow thread switch)
IN_PROCESS = {"local", "dask-threads", "daft", "daft-batch7"}  # their reruns: no process
KILLED = ["local", "dask-threads", "dask-processes", "dask-distributed", "daft", "daft-batch7",
          "dask-processes-one-part"]


def _engines() -> dict:
    """The fixture's engine variants, plus one whose single part is committed by time
    inside a Dask worker process (the fixture's Dask variants have 7-row parts)."""
    found = dict(all_engines())
    if "dask-processes" in found:
        found["dask-processes-one-part"] = one_part
    return found

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and killpg")


def _part_files(out: Path) -> list[Path]:
    return sorted(out.glob("part-*.parquet")) if out.exists() else []


def _rows(out: Path) -> set[int]:
    return {r for f in _part_files(out) for r in pq.read_table(f).column("_hn_row").to_pylist()}


def test_each_row_runs_once_and_fast_maps_write_one_file_per_part(engine, tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "out"
    logs.mkdir()
    n = 120
    res = Graph([D.timed_square], engine=engine).map(
        source=pa.table({"x": list(range(n))}), inputs={"log_dir": str(logs)}, into=out)
    assert res.rows == n and res.failed == 0
    rows = sorted(x for x, _ in D.executions(logs))
    assert rows == list(range(n)), "every row's node ran exactly once"
    table = res.to_arrow().sort_by("_hn_row")
    assert table.column("y").to_pylist() == [x * x for x in range(n)]
    per_part = json.loads((out / "_hn_manifest.json").read_text())["rows_per_part"]
    files = _part_files(out)
    # commit_seconds (30) never splits a fast part; part 0 may start with the rows that
    # fixed the output type, written by the driver as their own file
    assert len(files) <= math.ceil(n / per_part) + 1, [f.name for f in files]


# ------------------------------------------------------------------ a stop under "raise"


@pytest.fixture(scope="module")
def server(llm_servers):
    return llm_servers(latency=(0.005, 0.015))


def _paid_map(engine, server, out: Path, n: int, **kw):
    return Graph([U.llm, U.paid_label], engine=engine).map(
        source=pa.table({"text": [f"row {i}" for i in range(n)]}),
        inputs={"base_url": server.base_url}, into=out, **kw)


def _paid_once(engine, server, out: Path, n: int, paid: int) -> None:
    """Every row paid in the stopped map is in a file; the rerun pays exactly the rest."""
    written = _committed(out)
    assert written == paid, f"{paid} rows paid, {written} written: paid rows thrown away"
    assert sorted(_rows(out)) == sorted(set(_rows(out))), "a row written twice"
    res = _paid_map(engine, server, out, n)
    assert res.rows == n and res.failed == 0
    assert server.stats()["requests"] == n, "a row was paid twice"
    assert res.usage["paid_label"]["calls"] == n - paid
    labels = res.to_arrow().sort_by("_hn_row").column("label").to_pylist()
    assert labels == [label_of(f"row {i}") for i in range(n)]


def test_a_budget_stop_under_raise_writes_every_paid_row(engine, server, tmp_path):
    server.reset()
    out, n = tmp_path / "out", 120
    with pytest.raises(BudgetExceededError, match="budget cost=40"):
        _paid_map(engine, server, out, n, budget={"cost": 40})
    paid = server.stats()["requests"]
    assert 40 <= paid < n
    _paid_once(engine, server, out, n, paid)


def _interrupted_then_rerun(engine, server, out: Path, n: int, nodes: list, **inputs) -> None:
    """The map raises ``KeyboardInterrupt`` (a Ctrl-C its nodes send to this process),
    every paid row is written, and a rerun in this same process pays exactly the rest."""
    source = pa.table({"text": [f"row {i}" for i in range(n)]})
    graph = Graph(nodes, engine=engine)
    inputs = dict(inputs, base_url=server.base_url, driver_pid=os.getpid())
    with pytest.raises(KeyboardInterrupt):
        graph.map(source=source, inputs=inputs, into=out)
    paid = server.stats()["requests"]
    assert paid < n, "the Ctrl-C stopped nothing"
    written = _committed(out)
    assert written == paid, f"{paid} rows paid, {written} written: paid rows thrown away"
    res = graph.map(source=source, inputs=inputs, into=out)
    assert res.rows == n and res.failed == 0
    assert server.stats()["requests"] == n, "a row was paid twice"
    labels = res.to_arrow().sort_by("_hn_row").column("label").to_pylist()
    assert labels == [label_of(f"row {i}") for i in range(n)]


@pytest.mark.timeout(300)
def test_ctrl_c_under_raise_writes_every_paid_row_then_raises(engine, server, tmp_path):
    """Ctrl-C once row 30 is paid (SIGINT to this process, as a terminal sends): the calls
    in flight finish, every finished row is written, then KeyboardInterrupt; the rerun in
    the same process pays each remaining row once."""
    server.reset()
    _interrupted_then_rerun(engine, server, tmp_path / "out", 400, [U.llm, C.paid_then_ctrl_c],
                            ctrl_c_at="row 30", flag=str(tmp_path / "pressed"))


@pytest.mark.timeout(300)
def test_ctrl_c_before_the_first_row_then_a_rerun_in_the_same_process(engine, server,
                                                                      tmp_path):
    """Ctrl-C as the map starts (its resource being built, before the first row is paid,
    while the driver runs the first rows to fix the output type): those rows finish and
    are written, no part starts, KeyboardInterrupt; the next map in this process neither
    waits for ever nor pays a row twice."""
    server.reset()
    _interrupted_then_rerun(engine, server, tmp_path / "out", 120,
                            [C.llm_pressing, C.paid_untyped], flag=str(tmp_path / "pressed"))


# ------------------------------------------------------------------ SIGKILL


FAST = Killed(400, 0.01, 0.5)
PAID = Killed(3000, 0.06, 2.0, calls=True)  # ~6 s of work; a file every ~1 s at most
CASES = [(e, FAST) for e in KILLED] + [
    (e, PAID) for e in ("local", "dask-processes-one-part", "daft")]


def _start(engine_id: str, tmp: Path, logs: Path, case: Killed) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.conformance.durability_job", engine_id,
         str(tmp / "src.parquet"), str(tmp / "out"), str(logs), json.dumps(asdict(case))],
        cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _rerun(engine_id: str, tmp: Path, logs: Path, case: Killed) -> int:
    """The map again to its end, its rows: in this process on engines that start no process
    (a child would import them again, ~1 CPU s), else in a child as run 1."""
    if engine_id in IN_PROCESS:
        return run(engine_id, str(tmp / "src.parquet"), str(tmp / "out"), str(logs), case)
    rerun = _start(engine_id, tmp, logs, case)
    text = rerun.communicate(timeout=120)[0].decode(errors="replace")
    assert rerun.returncode == 0, text[-3000:]
    found = re.search(r"^rows=(\d+)$", text, re.M)
    assert found, text[-3000:]
    return int(found.group(1))


def _committed(out: Path, seen: dict | None = None) -> int:
    """Rows in ``out``'s part files; ``seen`` keeps each file's count (a file appears
    complete, by rename: the kill's poll reads each file's footer once, not 50 times a
    second)."""
    seen = {} if seen is None else seen
    total = 0
    for f in _part_files(out):
        try:
            st = f.stat()
        except FileNotFoundError:  # replaced meanwhile: counted at the next look
            continue
        key = (f.name, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in seen:
            seen[key] = pq.read_metadata(f).num_rows
        total += seen[key]
    return total


def _kill_midway(proc: subprocess.Popen, out: Path, n: int) -> float:
    """SIGKILL ``proc``'s process group once 3/5 of the rows are in files; the time."""
    deadline = time.monotonic() + 90
    seen: dict = {}
    while _committed(out, seen) < n * 3 // 5:
        if proc.poll() is not None:
            pytest.fail(f"run 1 ended before the kill:\n{proc.stdout.read().decode()[-3000:]}")
        assert time.monotonic() < deadline, "run 1 put not 3/5 of its rows in files in 90 s"
        time.sleep(0.02)
    killed_at = time.time()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return killed_at


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("engine_id", "case"), [c for c in CASES if c[0] in _engines()],
                         ids=[f"{e}-commit{c.commit:g}" for e, c in CASES if e in _engines()])
def test_sigkill_loses_at_most_the_last_commit_seconds_and_rerun_computes_the_rest(
        engine_id, case, tmp_path):
    n = case.n
    pq.write_table(pa.table({"x": list(range(n))}), tmp_path / "src.parquet",
                   row_group_size=100)
    logs, run1, out = tmp_path / "logs", tmp_path / "run1", tmp_path / "out"
    logs.mkdir()
    proc = _start(engine_id, tmp_path, logs, case)
    try:
        killed_at = _kill_midway(proc, out, n)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    kept = _rows(out)
    logs.rename(run1)  # the rerun logs afresh (same log_dir: the same map)
    logs.mkdir()
    first = D.executions(run1)
    rows1 = [x for x, _ in first]
    assert len(rows1) == len(set(rows1)), "a row ran twice in one map"
    assert kept <= set(rows1)
    bound = case.commit + ALLOWANCE
    old = {x for x, t in first if t < killed_at - bound}
    lost = sorted(old - kept)
    assert not lost, f"rows finished more than {bound}s before the kill are in no file: {lost[:20]}"
    assert _rerun(engine_id, tmp_path, logs, case) == n
    rows2 = sorted(x for x, _ in D.executions(logs))
    assert rows2 == sorted(set(range(n)) - kept), "the rerun computes exactly the missing rows"
    table = pq.read_table(out, columns=["_hn_row", "y"]).sort_by("_hn_row")
    assert table.column("_hn_row").to_pylist() == list(range(n))
    assert table.column("y").to_pylist() == [x * x for x in range(n)]
    names = [f.name for f in _part_files(out)]
    assert all(re.fullmatch(r"part-\d{6}(-\d{9}-\d{9})?\.parquet", n) for n in names)
    print(f"\n{engine_id} commit_seconds={case.commit:g}: {len(kept)} rows in files at the kill "
          f"({len(old)} finished over {bound}s before it), {len(set(rows1) - kept)} finished "
          f"rows lost, {len(names)} files in the end")
