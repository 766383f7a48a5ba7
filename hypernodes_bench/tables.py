"""What every benchmark script prints and writes: a plain table of its rows, and its
results file in ``benchmarks/results``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["print_table", "write_results", "engines_cli", "machine"]


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


def engines_cli(doc: str, main: Callable[[int, list[str]], dict[str, Any]],
                columns: Sequence[str], folder: Path, name: str, rows: int,
                engines: Sequence[str], choices: Sequence[str]) -> None:
    """The command line of a benchmark over engines: ``--rows``, ``--engines``, ``--name``;
    runs ``main(rows, engines)``, prints its ``rows`` as a table and writes the results."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--engines", default=",".join(engines),
                        help=f"comma-separated, from: {', '.join(choices)}")
    parser.add_argument("--name", default=name, help="results/<name>.json")
    args = parser.parse_args()
    report = main(args.rows, [e for e in args.engines.split(",") if e])
    print()
    print_table(report["rows"], columns)
    print(f"\nwrote {write_results(folder, args.name, report)}")


def machine(load_before: float, **extra: Any) -> dict[str, Any]:
    """What a results file says of the machine: Python, platform, cpus, ``extra`` (e.g. a
    client's version) and the 1-minute load average before and after the run (other
    processes compete for the cores: read ratios with it in mind)."""
    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "cpus": os.cpu_count(), **extra,
            "loadavg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
