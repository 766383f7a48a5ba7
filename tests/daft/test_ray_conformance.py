"""The conformance suite's limit, usage, budget and signal modules on Daft on Ray, and the
Ray runner's own maps (``tests/daft/ray_smoke.py``).

Daft fixes its runner once per process and this session runs Daft natively, so the
``daft-ray`` variant (``tests/conformance/engines_daft.py``) runs in a pytest process of
its own over one local Ray for all its tests: one Ray start for all of them."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.conformance.engines_daft import RAY_MODULES
from tests.daft.ray_env import RAY_ENV

pytestmark = [
    pytest.mark.slow,  # about 100 s: started first under xdist
    pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                       reason="ray is not installed (pip install 'daft[ray]')"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = "ray_smoke"  # a module of Ray-runner maps, run in the same Ray session


@pytest.mark.timeout(900)  # a whole pytest run on Ray in a subprocess (147 s loaded)
def test_conformance_limits_usage_budgets_and_signals_on_daft_ray():
    env = dict(os.environ, HYPERNODES_CONFORMANCE_DAFT="ray", **RAY_ENV)
    modules = [f"tests/conformance/{m}.py" for m in RAY_MODULES]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rp", "-p", "no:cacheprovider", "-p",
         "no:xdist", "--reruns", "1",  # as make test: a flaky test again, not the whole run
         "-k", f"daft-ray or {SMOKE}", *modules, f"tests/daft/{SMOKE}.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = proc.stdout[-4000:]
    failures = proc.stdout.partition("= FAILURES =")[2].partition("short test summary")[0]
    assert proc.returncode == 0, failures[-6000:] + tail
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= 27, tail  # every module ran on Daft on Ray
    assert "failed" not in tail.splitlines()[-1], tail
    ran = re.findall(rf"PASSED tests/daft/{SMOKE}\.py::(\w+)", proc.stdout)
    assert len(ran) == 3, tail  # the Ray runner's own maps
