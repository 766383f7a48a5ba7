"""Per-process counts of what policies did: retries, throttling waits, timeouts."""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["record", "stats", "reset_stats"]

_STATS: Counter[tuple[str, str]] = Counter()
_LOCK = threading.Lock()


def record(node: str, kind: str) -> None:
    """Count one ``kind`` (``"retry"``, ``"throttle"``, ``"timeout"``) for ``node``."""
    with _LOCK:
        _STATS[(node, kind)] += 1


def stats() -> dict[tuple[str, str], int]:
    """Per-process counts ``{(node, kind): n}`` of retries, throttling waits and timeouts."""
    with _LOCK:
        return dict(_STATS)


def reset_stats() -> None:
    with _LOCK:
        _STATS.clear()
