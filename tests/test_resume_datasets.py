"""Dataset maps resume after a crash: a map into ``into=`` killed with SIGKILL and started
again recomputes no row of any output file that existed when it was killed.

A driver process (this module run as ``python -m tests.test_resume_datasets``) maps a
Parquet source through a node that sleeps a little and logs each row it computes (one log
file per process). The test SIGKILLs the driver's process group once an output file
exists, notes the rows the output files hold, reruns the same map (in its own process on
engines that start no process, else in a new driver), and checks from the logs that
the rerun computed none of them, and that the final dataset holds every row once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conformance.dataset_graphs import logged, logged_square

ROOT = Path(__file__).resolve().parent.parent
N = 3000
DELAY = 0.0005
IN_PROCESS = {"local", "dask-threads", "daft"}  # their reruns run in the test's process

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and killpg")


def make_engine(name: str):
    from hypernodes_dist import GraphEngine

    if name == "local":
        return GraphEngine()
    if name.startswith("dask-"):
        from hypernodes_dask import DaskEngine

        return DaskEngine(scheduler=name.removeprefix("dask-"), num_workers=2)
    from hypernodes_daft import DaftEngine

    return DaftEngine(batch_size=300)


def run(engine: str, source: str, into: str, log_dir: str) -> int:
    """The map; its rows."""
    from hypernodes_dist import Graph

    graph = Graph([logged_square], engine=make_engine(engine))
    try:
        return graph.map(source=source, inputs={"log_dir": log_dir, "delay": DELAY},
                         into=into).rows
    finally:
        graph.engine.close()


def drive(argv: list[str]) -> None:
    """The driver: ``ENGINE SOURCE INTO LOG_DIR``."""
    print(f"rows={run(*argv)}")


def _start(engine: str, tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.test_resume_datasets", engine, str(tmp / "src.parquet"),
         str(tmp / "out"), str(tmp / "logs")],
        cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _rerun(engine: str, tmp: Path) -> int:
    """The same map to its end, its rows: in this process on engines that start no process
    (a child would import them again, ~1 CPU s), else in a new driver as run 1."""
    if engine in IN_PROCESS:
        return run(engine, str(tmp / "src.parquet"), str(tmp / "out"), str(tmp / "logs"))
    rerun = _start(engine, tmp)
    out = rerun.communicate(timeout=120)[0].decode(errors="replace")
    assert rerun.returncode == 0, out[-3000:]
    found = re.search(r"^rows=(\d+)$", out, re.M)
    assert found, out[-3000:]
    return int(found.group(1))


def _files(out: Path) -> list[Path]:
    return sorted(out.glob("part-*.parquet")) if out.exists() else []


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine", ["local", "dask-threads", "dask-processes",
                                    "dask-distributed", "daft"])
def test_sigkill_then_rerun_recomputes_no_finished_file(tmp_path, engine):
    pq.write_table(pa.table({"x": list(range(N))}), tmp_path / "src.parquet",
                   row_group_size=300)
    (tmp_path / "logs").mkdir()
    proc = _start(engine, tmp_path)
    try:
        deadline = time.monotonic() + 90
        while not _files(tmp_path / "out"):
            if proc.poll() is not None:
                pytest.fail(f"run 1 ended first:\n{proc.stdout.read().decode()[-3000:]}")
            assert time.monotonic() < deadline, "run 1 wrote no output file in 90 s"
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finished = _files(tmp_path / "out")
    done_rows = {r for f in finished for r in pq.read_table(f).column("_hn_row").to_pylist()}
    assert 0 < len(done_rows) < N
    run1 = logged(tmp_path / "logs")
    for f in (tmp_path / "logs").glob("*.log"):
        f.rename(f.with_suffix(".run1"))

    assert _rerun(engine, tmp_path) == N
    run2 = logged(tmp_path / "logs")
    assert not done_rows & set(run2), "the rerun recomputed rows of finished output files"
    assert set(run1) | set(run2) == set(range(N))
    table = pq.read_table(tmp_path / "out", columns=["_hn_row", "y"]).sort_by("_hn_row")
    assert table.column("_hn_row").to_pylist() == list(range(N))
    assert table.column("y").to_pylist() == [x * x for x in range(N)]
    print(f"\n{engine}: {len(finished)} files ({len(done_rows)} rows) kept, "
          f"{len(run2)} rows computed by the rerun")


if __name__ == "__main__":  # nodes must come from importable modules, not __main__
    from tests.test_resume_datasets import drive as _drive

    _drive(sys.argv[1:])
