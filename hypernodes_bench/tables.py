"""What every benchmark script prints and writes: a plain table of its rows, and its
results file in ``benchmarks/results``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["print_table", "write_results"]


def print_table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> None:
    """``rows`` as right-aligned columns ``cols`` (a missing value prints empty)."""
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols]
    print(" | ".join(c.rjust(w) for c, w in zip(cols, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(r.get(c, "")).rjust(w) for c, w in zip(cols, widths)))


def write_results(folder: Path, name: str, report: dict[str, Any]) -> Path:
    """``report`` as ``folder/<name>.json``; returns the path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path
