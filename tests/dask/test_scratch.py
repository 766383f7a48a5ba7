"""Dask's payload folders (``hypernodes-dask-<pid>-*`` in the temp directory) on
``scheduler="processes"``: gone after a normal exit, even without ``close()``; left by a
SIGKILLed run and removed by the next start; a live run's folder is never touched.

Each run is a real Python process with its own ``TMPDIR`` (the test's directory)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hypernodes_dist.engines.scratch import Scratch, remove_stale

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and flock")

ROOT = str(Path(__file__).resolve().parents[2])

RUN = textwrap.dedent("""
    import sys, time
    from hypernodes_dist import Graph, node
    from hypernodes_dask import DaskEngine

    @node(output_name="y")
    def slow(x: int) -> int:
        time.sleep(float(sys.argv[1]))
        return x + 1

    if __name__ == "__main__":
        engine = DaskEngine(scheduler="processes", num_workers=2, partition_size=1)
        res = Graph([slow], engine=engine).map({"x": list(range(4))}, map_over="x")
        print("done", [r["y"] for r in res], flush=True)
""")


def _start(tmp: Path, script: Path, sleep: float) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": ROOT}
    return subprocess.Popen([sys.executable, str(script), str(sleep)], env=env, cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _folders(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("hypernodes-dask-*"))


def _wait_for_folder(tmp: Path, proc: subprocess.Popen, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [f for f in _folders(tmp) if f.name.startswith(f"hypernodes-dask-{proc.pid}-")]
        if found and list(found[0].glob("payload-*")):
            return found[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise TimeoutError("the run made no payload folder")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "run.py"
    path.write_text(RUN)
    return path


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_killed_run_folder_is_removed_by_the_next_start_which_leaves_none(tmp_path: Path,
                                                                         script: Path) -> None:
    """The next start removes the killed run's folder, not the live run's, and its own
    normal exit (no ``close()``) leaves no folder: one run of each kind."""
    killed = _start(tmp_path, script, 30.0)
    try:
        left = _wait_for_folder(tmp_path, killed)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    assert left.exists() and list(left.glob("payload-*"))  # what a killed run leaves behind
    live = _start(tmp_path, script, 30.0)  # a run in progress while the next one starts
    try:
        mine = _wait_for_folder(tmp_path, live)
        nxt = _start(tmp_path, script, 0.0)
        out, err = nxt.communicate(timeout=150)
        assert nxt.returncode == 0, err
        assert "done [1, 2, 3, 4]" in out
        assert not left.exists()  # the killed run's folder is gone
        assert mine.exists() and list(mine.glob("payload-*"))  # the live run's is untouched
        assert _folders(tmp_path) == [mine]  # the next run's own went at its normal exit
    finally:
        os.killpg(live.pid, signal.SIGKILL)
        live.wait()


def test_scratch_rules_in_process(tmp_path: Path) -> None:
    """A folder with a held lock stays; one whose lock is free, or without a lock and with a
    dead pid, goes; folders of other prefixes or without a pid are never looked at."""
    mine = Scratch("hn-test", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone_pid = int(dead.stdout)
    no_lock = tmp_path / f"hn-test-{gone_pid}-abc"
    no_lock.mkdir()
    free_lock = tmp_path / f"hn-test-{os.getpid()}-free"
    free_lock.mkdir()
    (free_lock / ".lock").write_text("")
    alive_no_lock = tmp_path / f"hn-test-{os.getpid()}-young"  # being made right now
    alive_no_lock.mkdir()
    other = tmp_path / "hn-testing-1-x"
    other.mkdir()
    legacy = tmp_path / "hn-test-abcdef"
    legacy.mkdir()
    removed = remove_stale("hn-test", str(tmp_path))
    assert sorted(removed) == sorted([str(no_lock), str(free_lock)])
    assert Path(mine.path).exists() and alive_no_lock.exists() and other.exists()
    assert legacy.exists()
    mine.close()
    assert not Path(mine.path).exists()
    mine.close()  # idempotent
