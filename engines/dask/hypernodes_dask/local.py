"""A task graph on Dask's local schedulers (threads, processes, sync): each finished output
key's result is handed to the driver as it completes (``get_async`` runs its callbacks in
the calling thread), and a worker process that dies is reported with the keys it ran."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

__all__ = ["compute_local"]


def compute_local(engine: Any, dsk: dict[Any, Any], keys: list[Any],
                  deliver: Callable[[Any], None], *, flows: bool = False,
                  threads: int | None = None,
                  died: Callable[[list[Any]], Exception]) -> None:
    """Compute ``keys`` of ``dsk`` on ``engine``'s local scheduler, ``deliver(result)`` for
    each as it finishes (``flows``: the process pool for plans whose items flow;
    ``threads``: the threaded scheduler's thread count). A worker process that dies raises
    ``died(the keys it was running)`` (the pool is replaced for the next call)."""
    import dask.local
    import dask.multiprocessing
    import dask.threaded
    from dask.callbacks import Callback

    outputs = frozenset(keys)
    running: set[Any] = set()

    def pretask(key: Any, _dsk: Any, _state: Any) -> None:
        running.add(key)

    def posttask(key: Any, result: Any, _dsk: Any, _state: Any, _worker: Any) -> None:
        running.discard(key)
        if key in outputs:
            deliver(result)

    callbacks = [*Callback.active, (None, None, pretask, posttask, None)]
    processes = engine.processes
    pool = _Kept(processes.pool(flows)) if processes is not None else None
    try:
        if pool is not None:
            dask.multiprocessing.get(dsk, keys, pool=pool,
                                     optimize_graph=False, chunksize=1, callbacks=callbacks)
        elif engine.scheduler == "threads":
            dask.threaded.get(dsk, keys, num_workers=threads, callbacks=callbacks)
        else:
            dask.local.get_sync(dsk, keys, callbacks=callbacks)
    except BrokenProcessPool as exc:  # a worker died: say which keys it was running
        if processes is not None:
            processes.broken(flows)
        raise died(sorted(running, key=repr)) from exc
    except Exception:
        if pool is not None:  # the partitions still running finish first (no work, no
            pool.settle()     # cache write goes on after the map raised)
        raise


class _Kept:
    """A process pool that keeps what was submitted to it: ``get_async`` raises at the
    first failed partition while the others still run in the pool; ``settle`` waits for
    them (it submits only as many as there are processes)."""

    def __init__(self, pool: ProcessPoolExecutor) -> None:
        self._pool = pool
        self._futures: list[Future[Any]] = []
        self._max_workers: int = pool._max_workers  # type: ignore[attr-defined]  # get_async reads it

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = self._pool.submit(fn, *args, **kwargs)
        self._futures.append(future)
        return future

    def settle(self) -> None:
        wait(self._futures)
