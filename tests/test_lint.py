"""The tree stays ruff-clean and type-checks: the rules of ``[tool.ruff]`` and ``[tool.mypy]``
in pyproject.toml, as ``make lint`` checks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (it is in the test extra)")
    out = subprocess.run(
        [ruff, "check", "hypernodes_dist", "hypernodes_bench", "engines", "tests", "benchmarks", "examples"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_clean():
    mypy = shutil.which("mypy") or str(Path(sys.executable).with_name("mypy"))
    if not Path(mypy).exists():
        pytest.skip("mypy is not installed (it is in the test extra)")
    out = subprocess.run([mypy], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
