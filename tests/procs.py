"""Real ``dask scheduler`` / ``dask worker`` processes for tests: started on 127.0.0.1 by the
test itself, each in its own session, and always cleaned up (terminate, then kill)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def spawn(module: str, args: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args], stdout=out, stderr=out,
            env={**os.environ, **(env or {})}, start_new_session=True, cwd=cwd,
        )


def wait_for_address(scheduler_file: Path, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the dask scheduler exited"
        try:
            return json.loads(scheduler_file.read_text())["address"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    raise TimeoutError("the dask scheduler did not write its scheduler file")


def stop(procs: list[subprocess.Popen]) -> None:
    """Terminate the given processes (whole process groups: nannies and their workers), the
    dask schedulers last: a worker whose scheduler closes under it while it closes hangs
    until it is killed (15 s each)."""
    schedulers = [p for p in procs if "distributed.cli.dask_scheduler" in p.args]
    _stop([p for p in procs if p not in schedulers])
    _stop(schedulers)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, 15)
            except OSError:
                p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, 9)
            except OSError:
                p.kill()
            p.wait()


@contextmanager
def dask_cluster(tmp_path: Path, workers: int = 2, nthreads: int = 1
                 ) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """A ``dask scheduler`` and ``workers`` named ``w0``, ``w1``... (no nanny) on 127.0.0.1:
    ``(address, worker processes)``; everything stopped on exit."""
    sched_file = tmp_path / "scheduler.json"
    log = tmp_path / "cluster.log"
    procs: list[subprocess.Popen] = []
    try:
        sched = spawn("distributed.cli.dask_scheduler", ["--host", "127.0.0.1", "--port", "0",
                      "--no-dashboard", "--scheduler-file", str(sched_file)], log)
        procs.append(sched)
        address = wait_for_address(sched_file, sched)
        procs.extend(
            spawn("distributed.cli.dask_worker", ["--scheduler-file", str(sched_file),
                  "--host", "127.0.0.1", "--nthreads", str(nthreads), "--no-nanny",
                  "--no-dashboard", "--memory-limit", "0", "--name", f"w{i}"], log)
            for i in range(workers))
        yield address, procs[1:]
    finally:
        stop(procs)  # only the processes this started
