"""Resources and nodes for the real-cluster resource tests (importable by worker processes).

``tracked`` holds a ``threading.Lock`` (it cannot be pickled: a resource is never shipped)
and records each build and teardown as a file ``<event>-<pid>-<n>`` in ``log_dir``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path

from hypernodes_dist import node, resource


class Handle:
    """What a real client looks like to pickle: it holds a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.calls = 0


def _record(log_dir: str, event: str) -> None:
    Path(log_dir, f"{event}-{os.getpid()}-{uuid.uuid4().hex[:8]}").touch()


@resource
def tracked(log_dir: str):
    _record(log_dir, "build")
    handle = Handle()
    yield handle
    _record(log_dir, "teardown")


@node(output_name="seen")
async def use_tracked(x: int, tracked) -> tuple[int, int]:
    await asyncio.sleep(0.001)
    with tracked.lock:
        tracked.calls += 1
    return x * 2, tracked.pid


def events(log_dir: Path) -> dict[str, dict[int, int]]:
    """``{"build": {pid: count}, "teardown": {pid: count}}`` from the log directory."""
    out: dict[str, dict[int, int]] = {"build": {}, "teardown": {}}
    for f in log_dir.iterdir():
        kind, pid, _ = f.name.split("-")
        out[kind][int(pid)] = out[kind].get(int(pid), 0) + 1
    return out
