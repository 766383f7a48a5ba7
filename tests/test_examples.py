"""The README's runnable examples run as users run them (a subprocess, no network)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_budget_demo_stops_then_a_rerun_pays_only_for_the_rest(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "budget.py"), "--rows", "150",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=240,
                         check=True).stdout
    first = re.search(r"first map:\s+(\d+) rows written, (\d+) left .*\((\d+) calls\)", out)
    second = re.search(r"second map: (\d+) rows in all, 0 left; .*\((\d+) calls\)", out)
    assert first and second, out
    written, left, calls = map(int, first.groups())
    assert written + left == 150 and 0 < left and calls >= written
    assert int(second.group(1)) == 150 and int(second.group(2)) == 150 - calls  # no row twice


def test_the_enrich_demo_runs_again_and_resumes_on_a_new_port(tmp_path):
    """``make demo`` twice: each run's local API takes a new port; the endpoint is
    ``not_in_key``, so the second run finds every row written and computes nothing."""
    cmd = [sys.executable, str(ROOT / "examples" / "enrich.py"), "--rows", "200", "--out",
           str(tmp_path / "out"), "--cache", str(tmp_path / "cache"), "--no-progress"]
    runs = [subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
        assert re.search(r"rows=200 ok=\d+ failed=\d+", run.stdout), run.stdout
    assert re.search(r"node executions=0 .*\n.*requests at the API: 0\n", runs[1].stdout), (
        runs[1].stdout)


def test_the_batch_api_demo_submits_returns_then_collects_each_request_once(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "batch_api.py"), "--rows",
                          "200", "--delay", "0.5", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=240, check=True).stdout
    assert re.search(r"first map:\s+0 rows written, 200 waiting for a batch", out), out
    assert re.search(r"second map: 200 rows in all, 0 waiting, 0 failed; 200 calls answered "
                     r"by a batch", out), out
    assert re.search(r"at the provider: 200 distinct requests, each received 1 time\(s\); "
                     r"1 batch\(es\), 0 online requests", out), out
    batch, online = map(float, re.search(r"cost: ([\d.]+) \$ by batch; the same tokens "
                                         r"online: ([\d.]+) \$", out).groups())
    assert batch == pytest.approx(online / 2, rel=0.01)
