"""Resources torn down on Ray workers when a ``DaftEngine(runner="ray")`` closes.

Daft runs batches in Ray worker processes the driver cannot call into directly (Daft's own
actors), so each worker process that runs a batch of the job starts one watcher thread
(``watch``): it joins the job's ``Closer`` actor and waits there (a long call, no polling)
for the driver's ``close``. The driver's ``close_workers`` wakes every watcher; each tears
its process's resources down (``release_resources``) and says so; the driver waits for
those whose process still lives, at most ``TEARDOWN_SECONDS``. A watcher then waits for the
next close (a later engine of the same job may build resources again).

A watcher joins with its process's node and pid. A worker process can end before the close
(Ray stops idle workers beyond the node's CPUs after a second, and kills workers for
memory): its resources ended with it, and it will never answer. So the driver first asks
each live node which of its watchers' processes still run (a task pinned to the node) and
waits for those only: a close does not wait out the timeout for a process that is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from typing import Any

from hypernodes_dist.engines.scratch import pid_alive
from hypernodes_dist.perprocess import Table
from hypernodes_dist.resources import release_resources

__all__ = ["Closer", "start", "watch", "close_workers", "TEARDOWN_SECONDS"]

log = logging.getLogger("hypernodes_daft")

TEARDOWN_SECONDS = 30.0
NAMESPACE = "hypernodes"
Watcher = tuple[str, int]  # the Ray node id and pid of a watching worker process


class Closer:
    """The job's close signal (an async actor): ``epoch`` counts the driver's closes."""

    def __init__(self) -> None:
        self.epoch = 0
        self.watchers: set[Watcher] = set()
        self.done: dict[int, set[Watcher]] = {}
        self.changed = asyncio.Event()

    async def join(self, watcher: Watcher) -> int:
        self.watchers.add(watcher)
        return self.epoch

    async def watching(self) -> list[Watcher]:
        return sorted(self.watchers)

    async def wait(self, seen: int) -> int:
        while self.epoch <= seen:
            self.changed.clear()
            await self.changed.wait()
        return self.epoch

    async def torn_down(self, epoch: int, watcher: Watcher) -> None:
        self.done.setdefault(epoch, set()).add(watcher)
        self.changed.set()

    async def close(self, timeout: float, gone: list[Watcher]) -> int:
        """Forget the watchers ``gone`` (their process ended); wake every other; wait until
        they tore down (or ``timeout``); how many did."""
        self.watchers.difference_update(gone)
        self.epoch += 1
        epoch = self.epoch
        done = self.done.setdefault(epoch, set())
        self.changed.set()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not self.watchers <= done and loop.time() < end:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), end - loop.time())
            except asyncio.TimeoutError:
                break
        return len(done & self.watchers)


def _name(ray: Any) -> str:
    return f"hypernodes-teardown-{ray.get_runtime_context().get_job_id()}"


def closer(ray: Any) -> Any:
    """The job's ``Closer`` (made if missing)."""
    return ray.remote(num_cpus=0)(Closer).options(
        name=_name(ray), namespace=NAMESPACE, get_if_exists=True).remote()


_DRIVER: Table[str, Any] = Table("daft.teardown.driver")  # the driver's Closer, by job


def start() -> None:
    """In the driver, once Ray is up: the job's ``Closer``, made here so that the driver
    owns it. (An actor ends with the process that made it: made by the first Ray worker to
    run a batch, it ended when Ray stopped that worker, and every watcher's wait with it.)"""
    ray = sys.modules["ray"]
    name = _name(ray)
    if name not in _DRIVER:
        _DRIVER[name] = closer(ray)


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
    me = (ray.get_runtime_context().get_node_id(), os.getpid())
    seen = ray.get(actor.join.remote(me))
    threading.Thread(target=_watch, args=(ray, actor, seen, me), daemon=True,
                     name="hn-ray-teardown").start()


def _watch(ray: Any, actor: Any, seen: int, me: Watcher) -> None:
    while True:
        try:
            seen = ray.get(actor.wait.remote(seen))
        except Exception:  # noqa: BLE001 -- the job (its actor) is gone: nothing to wait for
            return
        release_resources()
        actor.torn_down.remote(seen, me)


def close_workers() -> int:
    """In the driver: every watching Ray worker still running tears its resources down
    (how many did); one that ended before is not waited for (said in the log)."""
    ray = sys.modules["ray"]
    actor = closer(ray)
    try:
        watchers = ray.get(actor.watching.remote())
    except ray.exceptions.RayActorError:  # its process ended: so did the watchers' waits
        log.warning("DaftEngine.close: the job's teardown actor had ended; the Ray workers "
                    "keep their resources until they end")
        return 0
    live = set(_running(ray, watchers))
    gone = [w for w in watchers if w not in live]
    if gone:
        log.info("DaftEngine.close: %d of the %d Ray worker processes that ran this job's "
                 "batches had ended (their resources ended with them); waiting for the "
                 "other %d to tear theirs down", len(gone), len(watchers), len(live))
    return int(ray.get(actor.close.remote(TEARDOWN_SECONDS, gone)))


def _running(ray: Any, watchers: list[Watcher]) -> list[Watcher]:
    """The ``watchers`` whose process still runs: asked on each of their live nodes."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    by_node: dict[str, list[int]] = {}
    for node, pid in watchers:
        if node in nodes:
            by_node.setdefault(node, []).append(pid)
    ask = ray.remote(num_cpus=0)(running_pids)
    refs = {node: ask.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node, soft=False)).remote(pids) for node, pids in by_node.items()}
    return [(node, pid) for node, ref in refs.items() for pid in ray.get(ref)]


def running_pids(pids: list[int]) -> list[int]:
    """Those of ``pids`` that run on this machine (not ended, not a zombie)."""
    return [pid for pid in pids if _runs(pid)]


def _runs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): whether a signal could reach it
        return pid_alive(pid)
