"""Helpers engine plugins share, so each rule lives once: how many items per partition."""

from __future__ import annotations

import math

__all__ = ["partition_size"]


def partition_size(n: int, workers: int, tasks_per_worker: int = 4,
                   max_size: int = 10_000) -> int:
    """Items per partition (task, UDF call) for ``n`` items on ``workers`` parallel workers:
    about ``tasks_per_worker`` partitions per worker balance uneven items, capped at ``max_size``."""
    return max(1, min(max_size, math.ceil(n / (max(1, workers) * max(1, tasks_per_worker)))))
