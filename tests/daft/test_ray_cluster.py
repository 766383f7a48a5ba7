"""Daft on Ray across two nodes: a 2-node Ray cluster on 127.0.0.1 started by the test
(``ray start --head`` and a second ``ray start --address``, each with its own
``--temp-dir`` and limits directory, so the nodes share no machine files): a node's
``concurrency`` and a map's ``budget`` hold across both nodes (the job's limits actor).
Counted by the server: its peak of requests in flight, the requests it answered."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from hypernodes_bench.llm_server import LLMServer
from tests.daft.ray_env import RAY_ENV

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                       reason="ray is not installed (pip install 'daft[ray]')"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(args: list[str], root: str) -> subprocess.Popen[bytes]:
    """``ray start ... --block`` in a session of its own (killing it kills that node's Ray
    processes), its own temp dir and limits directory; no autoscaler monitor and no log
    monitor (nothing here reads them: two Python processes fewer per node)."""
    os.makedirs(f"{root}/limits")
    env = dict(os.environ, HYPERNODES_LIMITS_DIR=f"{root}/limits", **RAY_ENV,
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [RAY, "start", *args, "--num-cpus=2", f"--temp-dir={root}/ray", "--block",
         "--object-store-memory=100000000", "--disable-usage-stats", "--no-monitor",
         "--include-log-monitor=false"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every node's session (its Ray processes): the nodes are thrown away with their
    temp dirs, and a SIGTERM'd ``ray start --block`` shuts its node down gracefully, which
    took 10 s."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def _wait_port(port: int, proc: subprocess.Popen[bytes], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, "ray start --head ended"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError("the Ray head did not start")


@pytest.fixture(scope="module")
def two_nodes(request):
    roots = [tempfile.mkdtemp(prefix="hnray"), tempfile.mkdtemp(prefix="hnray")]
    port = _free_port()
    procs = [_node(["--head", f"--port={port}", "--include-dashboard=false"], roots[0])]

    def stop() -> None:
        _stop(procs[::-1])
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)

    request.addfinalizer(stop)
    _wait_port(port, procs[0])
    procs.append(_node([f"--address=127.0.0.1:{port}"], roots[1]))
    return f"127.0.0.1:{port}"


def test_concurrency_and_budget_hold_across_two_ray_nodes(two_nodes, tmp_path):
    env = dict(os.environ, **RAY_ENV, HYPERNODES_LIMITS_DIR=str(tmp_path / "driver-limits"))
    with LLMServer(latency=(0.05, 0.1)) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.daft.ray_cluster_job", two_nodes, server.base_url],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["nodes"] == 2 and out["rows"] == 64  # calls ran on both nodes
    assert out["requests"] == 64 and out["max_in_flight"] <= 4  # concurrency=4, cluster-wide
    # budget cost=20: a call in flight when it is reached finishes (at most concurrency=4 more)
    assert 20 <= out["paid_requests"] <= 24 and out["paid_rows"] == out["paid_requests"]
