"""Real processes for the reliability suite: a ``dask scheduler`` and ``dask worker`` processes
on 127.0.0.1, started by the test and always cleaned up (terminate, then kill)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.procs import spawn, stop, wait_for_address


@dataclass
class RealCluster:
    """A scheduler and workers started as subprocesses (each in its own session)."""

    address: str
    scheduler_file: Path
    log: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator:
    """``start_cluster(workers=2, nanny=True, allowed_failures=1)`` -> ``RealCluster``.

    Workers run one thread each with a nanny (a SIGKILLed worker is restarted, as in any
    real deployment) unless ``nanny=False``. ``allowed_failures`` is the scheduler's
    ``distributed.scheduler.allowed-failures`` (how many worker deaths a task may cause
    before it fails with ``KilledWorker``).
    """
    started: list[subprocess.Popen] = []

    def start(workers: int = 2, nanny: bool = True, allowed_failures: int = 1) -> RealCluster:
        sched_file = tmp_path / f"scheduler-{len(started)}.json"
        log = tmp_path / "cluster.log"
        env = {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(allowed_failures),
               "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
        sched = spawn("distributed.cli.dask_scheduler",
                      ["--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                       "--scheduler-file", str(sched_file)], log, env)
        started.append(sched)
        address = wait_for_address(sched_file, sched)
        cluster = RealCluster(address, sched_file, log, [sched])
        for i in range(workers):
            args = ["--scheduler-file", str(sched_file), "--host", "127.0.0.1",
                    "--nthreads", "1", "--no-dashboard", "--memory-limit", "0",
                    "--name", f"w{i}", "--nanny" if nanny else "--no-nanny"]
            w = spawn("distributed.cli.dask_worker", args, log, env)
            started.append(w)
            cluster.procs.append(w)
        return cluster

    try:
        yield start
    finally:
        stop(started)
