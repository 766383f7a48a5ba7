"""Kill tests of a whole Batch API job (issue 32): the job's process group is SIGKILLed
right after an upload, right after a batch is created, while polling and while
downloading; the rerun (a child on Dask processes, the test's own process on the local
engine) completes, and over both runs every distinct request reached the provider exactly
once (the fake's counts).

The moment is the fake provider's: its ``hang`` knob makes the request at that point do
its work (the file stored, the batch created, the status or results read) and never
answer, and counts it in ``stats()["hung"]``; the test kills the job's process group
then, so the job dies exactly there, whatever the machine's load."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hypernodes_bench.batch_server import BatchServer
from hypernodes_bench.llm_server import label_of
from hypernodes_dist.run.batchmap import POLL_ENV
from tests.batch_job_child import run as run_job

ROOT = Path(__file__).resolve().parents[1]
ROWS = 10
POINTS = [("openai", "upload"), ("openai", "create"), ("openai", "status"),
          ("openai", "results"), ("anthropic", "create"), ("anthropic", "status"),
          ("anthropic", "results")]


def _job(fake: BatchServer, provider: str, engine: str, into: Path) -> list[str]:
    # run as a module from the root: tests/ first on sys.path would shadow dask by tests/dask
    return [sys.executable, "-m", "tests.batch_job_child", provider, engine, fake.base_url,
            fake.anthropic_base_url, str(into), str(ROWS)]


def _env() -> dict[str, str]:
    return {**os.environ, POLL_ENV: "0.05"}


def _kill_when_hung(fake: BatchServer, job: subprocess.Popen) -> None:
    """SIGKILL the job's process group once a request of it hangs at the fake."""
    while not fake.stats()["hung"]:
        if job.poll() is not None:
            raise AssertionError(f"the job ended ({job.returncode}) before it reached the "
                                 f"point:\n{job.stderr.read() if job.stderr else ''}")
        threading.Event().wait(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    assert job.wait(timeout=60) == -signal.SIGKILL


def _rerun(fake: BatchServer, provider: str, engine: str, into: Path) -> dict:
    """The job again to its end: in this process on the local engine (which never ran it; a
    child would import the provider's client again, ~1-2 CPU s), in a child on Dask
    processes (whose worker pool is spawned from the job's main module)."""
    if engine == "local":
        with pytest.MonkeyPatch.context() as env:
            env.setenv(POLL_ENV, "0.05")
            return run_job(provider, engine, fake.base_url, fake.anthropic_base_url,
                           str(into), str(ROWS))
    rerun = subprocess.run(_job(fake, provider, engine, into), env=_env(), text=True,
                           capture_output=True, cwd=ROOT, timeout=300, start_new_session=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    return json.loads(rerun.stdout.strip().splitlines()[-1])


def _kill_then_rerun(fake: BatchServer, tmp_path: Path, provider: str, kill_at: str,
                     engine: str = "local") -> None:
    fake.configure(hang=kill_at, delay=3600 if kill_at == "status" else 0)
    into = tmp_path / "out"
    job = subprocess.Popen(_job(fake, provider, engine, into), env=_env(), text=True, cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)   # its own process group
    try:
        _kill_when_hung(fake, job)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    fake.configure(hang=None, delay=0)
    fake.complete()   # a batch left running (killed while polling) answers now
    got = _rerun(fake, provider, engine, into)
    assert (got["rows"], got["pending"], got["failed"]) == (ROWS, 0, 0)
    assert got["labels"] == [label_of(f"job row {i}") for i in range(ROWS)]
    counts = fake.counts()   # over both runs
    assert len(counts) == ROWS and all(c == [1, 1] for c in counts.values()), counts
    assert fake.stats()["online_requests"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(("provider", "kill_at"), POINTS, ids=[f"{p}-{k}" for p, k in POINTS])
def test_sigkill_of_the_job_then_a_rerun_sends_each_request_once(batch_fake, tmp_path,
                                                                 provider, kill_at):
    _kill_then_rerun(batch_fake, tmp_path, provider, kill_at)


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["create", "results"])
def test_sigkill_of_a_job_on_worker_processes(batch_fake, tmp_path, kill_at):
    """Dask processes: the group holds the driver and its worker processes."""
    _kill_then_rerun(batch_fake, tmp_path, "openai", kill_at, engine="dask-processes")
