"""Cluster-wide node limits on ``distributed``: the policy backend for tasks on Dask workers.

The core enforces ``concurrency`` and ``rate_limit`` with lock files, which every process of
one machine shares. Inside a ``distributed`` worker this backend replaces them, so a limit
holds across all workers of the cluster, on any number of machines:

- ``concurrency=N``: a ``distributed.Semaphore(max_leases=N)`` named after the node (leases
  live on the scheduler; a dead worker's leases expire after
  ``distributed.scheduler.locks.lease-timeout``);
- ``rate_limit``: the same reservation scheme as the file backend (each call reserves the
  next start time, spaced ``per/count`` seconds), its state in the scheduler's metadata
  store (``Client.get_metadata``/``set_metadata``) updated under a ``distributed.Lock``.
  Start times are the workers' wall-clock times, so the machines' clocks must agree (NTP)
  to within the spacing you need.

Each acquisition is one or a few scheduler round-trips (~1 ms): fine for API calls, the
case these limits exist for. Registered with the core by importing ``hypernodes_dask``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from hypernodes_dist.policies import register_backend

__all__ = ["DistributedLimits", "probe"]


class _Slots:
    def __init__(self, key: str, n: int) -> None:
        from distributed import Semaphore

        self.sem = Semaphore(max_leases=n, name=f"hypernodes-concurrency-{n}-{key}")

    def try_acquire(self) -> bool | None:
        return True if self.sem.acquire(timeout=0) else None

    def acquire(self) -> bool:
        self.sem.acquire()
        return True

    def release(self, token: Any) -> None:
        self.sem.release()


class _Rate:
    def __init__(self, key: str, count: float, per: float) -> None:
        from distributed import Lock, get_client

        name = f"hypernodes-rate-{count:g}-{per:g}-{key}"
        self.interval = per / count
        self.lock = Lock(name)
        self.client = get_client()
        self.path = ["hypernodes-rate", name]

    def reserve(self) -> float:
        with self.lock:
            tat = float(self.client.get_metadata(self.path, default=0.0))
            now = time.time()
            start = max(tat, now)
            self.client.set_metadata(self.path, start + self.interval)
        return start - now


class DistributedLimits:
    """Limits kept by the scheduler of the cluster this worker belongs to."""

    name = "distributed"

    def __init__(self, scheduler: str) -> None:
        self.directory = scheduler  # part of the core's limiter cache key: one per cluster

    def slots(self, key: str, n: int) -> _Slots:
        return _Slots(key, n)

    def rate(self, key: str, count: float, per: float) -> _Rate:
        return _Rate(key, count, per)


def probe() -> DistributedLimits | None:
    """The backend when running inside a ``distributed`` worker, else ``None``."""
    if "distributed" not in sys.modules:
        return None
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        return None
    return DistributedLimits(worker.scheduler.address)


register_backend(probe)
