"""Resources torn down on Ray workers when a ``DaftEngine(runner="ray")`` closes.

Daft runs batches in Ray worker processes the driver cannot call into directly (Daft's own
actors), so each worker process that runs a batch of the job starts one watcher thread
(``watch``): it joins the job's ``Closer`` actor and waits there (a long call, no polling)
for the driver's ``close``. The driver's ``close_workers`` wakes every watcher; each tears
its process's resources down (``release_resources``) and says so; the driver waits for
all of them, at most ``TEARDOWN_SECONDS``. A watcher then waits for the next close (a
later engine of the same job may build resources again).
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

from hypernodes_dist.perprocess import Table
from hypernodes_dist.resources import release_resources

__all__ = ["Closer", "watch", "close_workers", "TEARDOWN_SECONDS"]

TEARDOWN_SECONDS = 30.0
NAMESPACE = "hypernodes"


class Closer:
    """The job's close signal (an async actor): ``epoch`` counts the driver's closes."""

    def __init__(self) -> None:
        self.epoch, self.watchers = 0, 0
        self.done: dict[int, int] = {}
        self.changed = asyncio.Event()

    async def join(self) -> int:
        self.watchers += 1
        return self.epoch

    async def wait(self, seen: int) -> int:
        while self.epoch <= seen:
            self.changed.clear()
            await self.changed.wait()
        return self.epoch

    async def torn_down(self, epoch: int) -> None:
        self.done[epoch] = self.done.get(epoch, 0) + 1
        self.changed.set()

    async def close(self, timeout: float) -> int:
        """Wake every watcher; wait until all tore down (or ``timeout``); how many did."""
        self.epoch += 1
        epoch = self.epoch
        self.changed.set()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self.done.get(epoch, 0) < self.watchers and loop.time() < end:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), end - loop.time())
            except asyncio.TimeoutError:
                break
        return self.done.get(epoch, 0)


def _name(ray: Any) -> str:
    return f"hypernodes-teardown-{ray.get_runtime_context().get_job_id()}"


def closer(ray: Any) -> Any:
    """The job's ``Closer`` (made if missing)."""
    return ray.remote(num_cpus=0)(Closer).options(
        name=_name(ray), namespace=NAMESPACE, get_if_exists=True).remote()


_WATCHING: Table[str, bool] = Table("daft.teardown")  # whether this process's watcher runs


def watch() -> None:
    """In a Ray worker running a batch: start this process's watcher (once)."""
    if "watcher" in _WATCHING:
        return
    with _WATCHING.lock:
        if "watcher" in _WATCHING:
            return
        _WATCHING["watcher"] = True
    ray = sys.modules["ray"]  # a Ray worker: loaded
    actor = closer(ray)
    seen = ray.get(actor.join.remote())
    threading.Thread(target=_watch, args=(ray, actor, seen), daemon=True,
                     name="hn-ray-teardown").start()


def _watch(ray: Any, actor: Any, seen: int) -> None:
    while True:
        try:
            seen = ray.get(actor.wait.remote(seen))
        except Exception:  # noqa: BLE001 -- the job (its actor) is gone: nothing to wait for
            return
        release_resources()
        actor.torn_down.remote(seen)


def close_workers() -> int:
    """In the driver: every watching Ray worker tears its resources down (how many did)."""
    ray = sys.modules["ray"]
    return int(ray.get(closer(ray).close.remote(TEARDOWN_SECONDS)))
