"""The reliability suite's figures (worker kills survived, bad inputs tried, cache writes lost),
read from its test modules in this process; summed over pytest-xdist workers by the root
conftest and printed at the end of the run."""

from __future__ import annotations

import sys
from typing import Any

_MODULES = ("test_dask_kills", "test_bad_inputs", "test_concurrent_writers", "test_cache_faults")


def collect() -> dict[str, Any]:
    """This process's figures: only those of the modules it imported."""
    mods = {name: sys.modules.get(f"tests.reliability.{name}") for name in _MODULES}
    found: dict[str, Any] = {}
    if mods["test_dask_kills"] is not None:
        found["kills"] = len(mods["test_dask_kills"].KILLS)
    if mods["test_cache_faults"] is not None:
        found["killed_writers"] = sum(mods["test_cache_faults"].KILLED_WRITERS)
    if mods["test_bad_inputs"] is not None:
        found["tried"] = dict(mods["test_bad_inputs"].TRIED)
    if mods["test_concurrent_writers"] is not None:
        found["lost"] = list(mods["test_concurrent_writers"].LOST)
    return found


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of several processes (xdist workers) added up."""
    total: dict[str, Any] = {}
    for part in parts:
        for key in ("kills", "killed_writers"):
            if key in part:
                total[key] = total.get(key, 0) + part[key]
        if "tried" in part:
            tried = total.setdefault("tried", {})
            for name, n in part["tried"].items():
                tried[name] = tried.get(name, 0) + n
        if "lost" in part:
            total.setdefault("lost", []).extend(part["lost"])
    return total


def lines(figures: dict[str, Any]) -> list[str]:
    """What the end of the run prints (nothing when no reliability module ran)."""
    out = []
    if "kills" in figures:
        out.append(f"worker processes killed and survived: {figures['kills']}")
    if "killed_writers" in figures:
        out.append(f"cache writer processes SIGKILLed mid-write: {figures['killed_writers']}")
    if "tried" in figures:
        out.append("bad-input examples tried: " + (
            ", ".join(f"{k}={v}" for k, v in figures["tried"].items()) or "0"))
    if figures.get("lost"):
        out.append(f"cache writes lost under concurrency: {figures['lost']}")
    return out
