"""Helpers engine plugins share, so each rule lives once: how many items per partition."""

from __future__ import annotations

import math

__all__ = ["partition_size", "flow_tasks", "FLOW_TASKS_PER_CPU"]

FLOW_TASKS_PER_CPU = 4


def partition_size(n: int, workers: int, tasks_per_worker: int = 4,
                   max_size: int = 10_000, flows: bool = False) -> int:
    """Items per partition (task, UDF call) for ``n`` items on ``workers`` parallel workers:
    about ``tasks_per_worker`` partitions per worker balance uneven items, capped at ``max_size``.

    ``flows`` (a plan whose items flow: ``Plan.flows``, async calls or waiting policies):
    one partition per worker. Such a partition keeps all its items in flight, so one per
    worker already fills the limits; and each partition ends with a tail (its slowest
    item, e.g. one sleeping in a retry back-off) during which its worker, which runs one
    partition at a time, sits idle, so fewer partitions waste less.
    """
    if flows:
        tasks_per_worker = 1
    return max(1, min(max_size, math.ceil(n / (max(1, workers) * max(1, tasks_per_worker)))))


def flow_tasks(cpus: int) -> int:
    """Partitions of a plan whose items flow that one process runs at once (threads, or
    coroutines of one loop). Their items mostly wait (calls, back-offs), so a process
    runs several: while one partition ends with its tail (its slowest item), the others
    keep the limits busy, whatever the partition size."""
    return FLOW_TASKS_PER_CPU * max(1, cpus)
