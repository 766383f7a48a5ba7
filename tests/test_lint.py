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


@pytest.mark.timeout(900)  # a cold mypy over 150 files took 303 s on a loaded 2-cpu run
def test_mypy_clean():
    mypy = shutil.which("mypy") or str(Path(sys.executable).with_name("mypy"))
    if not Path(mypy).exists():
        pytest.skip("mypy is not installed (it is in the test extra)")
    out = subprocess.run([mypy], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_type_ignore_names_its_code_and_says_why():
    """``# type: ignore[code]  # why`` in the type-checked packages: a bare one fails."""
    import re

    ignore = re.compile(r"#\s*type:\s*ignore(\[[^\]]*\])?(.*)$")
    bare = []
    for package in ("hypernodes_dist", "hypernodes_bench", "engines"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                found = ignore.search(line)
                if found and not (found.group(1) and found.group(2).strip().startswith("#")):
                    bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bare, "a type: ignore without its code or its reason:\n" + "\n".join(bare)
