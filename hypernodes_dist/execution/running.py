"""A map's batches running in this process, and the map's stop.

An engine's scheduler may raise at a map's first failed batch while other batches of the
map still run in this process (Dask's threaded ``get_async`` raises at once and leaves the
partitions in its pool running; so may any runner whose tasks are threads). Their calls
would end, be paid and be written to the cache after ``map()`` raised, so an immediate
rerun would not find them and would pay for them again. So every batch runs inside
``batch_of(map)`` (``execution/batch.py``) and the driver runs the engine inside
``stopping(map)`` (``run/maprun.py``): when the engine raises, the map is stopped here
and ``map()`` raises once none of its batches runs in this process (their calls in flight
end, are kept and their cache writes flushed when their batch ends). A batch whose items
flow (``execution/flow.py``) checks the stop before each node call: it starts no further
one, and one starting later runs nothing; a batch of sync nodes (columnar or per item)
does not check it and runs to its end. Batches in other processes are their engine's to
wait for (``hypernodes_dask.local``: the process pool; ``hypernodes_dask.shipping``: a
cluster's workers).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from hypernodes_dist.perprocess import PROCESS

__all__ = ["Halt", "batch_of", "stopping"]

KEEP_STOPPED = 1024  # stopped maps remembered (a batch of one starting late runs nothing)


class Halt:
    """One map's batches running in this process (``running``) and whether the map has
    stopped (``stopped``: its items start no further node call)."""

    __slots__ = ("running", "stopped")

    def __init__(self, stopped: bool) -> None:
        self.running = 0
        self.stopped = stopped


class _Maps:
    """This process's maps with batches running, by run-id prefix, and the maps stopped."""

    def __init__(self) -> None:
        self.forget()
        PROCESS.register("execution.running", self.forget)

    def forget(self) -> None:
        self.changed = threading.Condition()
        self.running: dict[str, Halt] = {}
        self.stopped: OrderedDict[str, None] = OrderedDict()


_MAPS = _Maps()


@contextmanager
def batch_of(prefix: str) -> Iterator[Halt]:
    """Around one batch of the map ``prefix`` (until its cache writes are flushed)."""
    maps = _MAPS
    with maps.changed:
        halt = maps.running.get(prefix)
        if halt is None:
            halt = maps.running[prefix] = Halt(prefix in maps.stopped)
        halt.running += 1
    try:
        yield halt
    finally:
        with maps.changed:
            halt.running -= 1
            if not halt.running and maps.running.get(prefix) is halt:
                del maps.running[prefix]
                maps.changed.notify_all()


@contextmanager
def stopping(prefix: str) -> Iterator[None]:
    """The driver, around the engine's run of the map ``prefix``: when it raises, the map
    stops here and the error goes on once no batch of the map runs in this process."""
    try:
        yield
    except BaseException:
        stop(prefix)
        raise


def stop(prefix: str) -> None:
    """Stop the map ``prefix`` in this process and wait until none of its batches runs."""
    maps = _MAPS
    with maps.changed:
        maps.stopped[prefix] = None
        while len(maps.stopped) > KEEP_STOPPED:
            maps.stopped.popitem(last=False)
        halt = maps.running.get(prefix)
        if halt is not None:
            halt.stopped = True
        while prefix in maps.running:
            maps.changed.wait()
