"""Per-process counts of what policies did: retries, throttling waits, timeouts."""

from __future__ import annotations

from hypernodes_dist.perprocess import Table

__all__ = ["record", "stats", "reset_stats"]

_STATS: Table[tuple[str, str], int] = Table("policies.stats")  # a forked child counts anew


def record(node: str, kind: str) -> None:
    """Count one ``kind`` (``"retry"``, ``"throttle"``, ``"timeout"``) for ``node``."""
    with _STATS.lock:
        _STATS[(node, kind)] = _STATS.get((node, kind), 0) + 1


def stats() -> dict[tuple[str, str], int]:
    """Per-process counts ``{(node, kind): n}`` of retries, throttling waits and timeouts."""
    with _STATS.lock:
        return dict(_STATS)


def reset_stats() -> None:
    with _STATS.lock:
        _STATS.clear()
