"""Concurrency and rate limits as this process sees them, over a shared backend.

A limit lives in a *backend* shared by many processes (``backend.LimitsBackend``;
``machine.MachineLimits``: every process of one machine; ``hypernodes_dask`` registers one
for a ``distributed`` cluster; ``memory.MemoryLimits``: this process, for tests).
This module keeps, per process and limit, the units the process holds and the calls
waiting for one:

- ``Slots.acquire`` takes a unit from the backend without blocking when no call of this
  process is waiting; otherwise the call joins a FIFO of waiters and sleeps on its own
  primitive (an ``asyncio`` future of its loop, or a lock for a blocking caller);
- ``Slots.release`` hands the unit straight to the first waiter (no backend call, no
  wake-up of anyone else) or, with nobody waiting, gives it back to the backend;
- while calls wait, one lease thread per limit sleeps in the backend's blocking ``take``
  (the kernel, or the scheduler) and passes each unit it gets to a waiter.

So a call costs O(1) work whatever the number of waiters: at most one non-blocking
backend operation each way, nothing when a unit passes from call to call inside the
process, and no waiter ever polls. ``Rate`` hands out start times reserved from the
backend in blocks sized to the demand it sees.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, overload

from hypernodes_dist.perprocess import Memo
from hypernodes_dist.policies.backend import (
    LimitsBackend,
    RateStore,
    RemoteSemaphore,
    Semaphore,
    SharedValue,
)
from hypernodes_dist.policies.machine import MachineLimits, limits_dir

__all__ = ["Slots", "Rate", "register_backend", "using", "backend", "limiter", "slots", "rate",
           "amounts", "quantity", "shared", "settle", "paced", "burst_of", "MAX_RATE_BLOCK"]

MAX_RATE_BLOCK = 64  # start times one rate reservation may take at most
# A rate limit lets this share of its count start at once after a pause (a token bucket's
# capacity), its steady pace lowered by as much: a limit the calls never reach costs
# nothing however bunched they come (no waits, no events), and no window of the period
# holds more than the count. 1%: 64 calls at once pass a limit of 6,400 per period or more.
BURST_SHARE = 0.01
LINGER = 0.05  # seconds a remote backend's idle unit stays with the process


class _Waiter:
    __slots__ = ("fut", "loop", "lock", "granted", "cancelled", "error")

    def __init__(self, blocking: bool) -> None:
        self.granted = self.cancelled = False
        self.error: BaseException | None = None
        if blocking:
            self.fut, self.loop = None, None
            self.lock = threading.Lock()
            self.lock.acquire()
        else:
            self.loop = asyncio.get_running_loop()
            self.fut = self.loop.create_future()

    def grant(self) -> bool:
        """Give this waiter the unit (caller holds the ``Slots`` lock); False if it left."""
        if self.cancelled:
            return False
        if self.fut is None:
            self.lock.release()
        elif asyncio._get_running_loop() is self.loop:
            if self.fut.done():  # cancelled; its task has not run its handler yet
                return False
            self.fut.set_result(None)
        else:
            assert self.loop is not None  # no loop: the branch above took it
            try:
                self.loop.call_soon_threadsafe(_resolve, self.fut)
            except RuntimeError:  # its loop is closed: nobody waits there any more
                return False
        self.granted = True
        return True

    def fail(self, error: BaseException) -> None:
        """Wake this waiter with ``error`` instead of a unit (caller holds the lock)."""
        self.error = error
        if self.fut is None:
            self.lock.release()
        else:
            assert self.loop is not None
            try:
                self.loop.call_soon_threadsafe(_resolve, self.fut, error)
            except RuntimeError:
                pass


def _resolve(fut: asyncio.Future[None], error: BaseException | None = None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


class Slots:
    """The units of one concurrency limit held by this process, and its waiting calls.

    A ``remote`` backend (each operation a network round trip, e.g. a cluster scheduler)
    is only ever called from the lease thread, never from a call's path: a unit nobody
    waits for stays with the process for ``LINGER`` seconds (the next call takes it at no
    cost) before the lease thread returns it; its blocking ``take(timeout)`` gives up
    after ``LINGER`` so the thread can return idle units (one round trip per ``LINGER``
    per process while calls wait, whatever their number).
    """

    def __init__(self, semaphore: Semaphore | RemoteSemaphore) -> None:
        self.sem: Any = semaphore  # a RemoteSemaphore when ``remote``
        self.remote = bool(getattr(semaphore, "remote", False))
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.waiters: deque[_Waiter] = deque()
        self.leasing = False
        self.free = 0  # remote only: units held, unused
        self.idle_since: float | None = None
        self.backend_ops = 0  # operations on the shared backend (diagnostics, tests)

    async def acquire(self, blocking: bool) -> float:
        """Take a unit; returns the seconds waited. ``blocking``: wait without a loop."""
        with self.lock:
            if self.free:
                self.free -= 1
                return 0.0
            if not self.waiters and not self.remote:
                self.backend_ops += 1
                if self.sem.try_take():
                    return 0.0
            waiter = _Waiter(blocking)
            self.waiters.append(waiter)
            start = self._wake()
        if start:
            threading.Thread(target=self._lease, daemon=True, name="hn-limit-lease").start()
        t0 = time.perf_counter()
        if waiter.fut is None:
            waiter.lock.acquire()
            if waiter.error is not None:
                raise waiter.error
        else:
            try:
                await waiter.fut
            except BaseException:
                self._leave(waiter)
                raise
        return time.perf_counter() - t0

    def _wake(self) -> bool:
        """(Lock held.) Tell the lease thread; True when one must be started."""
        if self.leasing:
            self.changed.notify()
            return False
        self.leasing = True
        return True

    def _leave(self, waiter: _Waiter) -> None:
        with self.lock:
            granted = waiter.granted
            waiter.cancelled = not granted
        if granted:
            self.release()

    def release(self) -> None:
        """Return a unit: to the first waiting call, else to the backend."""
        with self.lock:
            if self._grant():
                return
            if not self.remote:
                self.backend_ops += 1
                self.sem.give()
                return
            self.free += 1
            start = self._wake()
        if start:
            threading.Thread(target=self._lease, daemon=True, name="hn-limit-lease").start()

    def _grant(self) -> bool:
        """(Lock held.) Give a unit to the first waiting call, if any."""
        waiters = self.waiters
        while waiters:
            if waiters.popleft().grant():
                return True
        return False

    def _lease(self) -> None:
        """The lease thread (``_leasing``); if the backend fails it, the calls waiting then
        get its error (never left waiting for a thread that is gone) and the next waiting
        call starts a new one."""
        try:
            self._leasing()
        except BaseException as exc:
            with self.lock:
                self.leasing, self.idle_since = False, None
                waiters, self.waiters = self.waiters, deque()
                for waiter in waiters:
                    if not waiter.cancelled:
                        waiter.fail(exc)

    def _leasing(self) -> None:
        """While calls wait: take units from the backend (sleeping there) and pass them on;
        remote backends: give back the units left idle for ``LINGER`` seconds."""
        sem = self.sem
        while True:
            with self.lock:
                idle = 0
                if not self.waiters:
                    if not self.free:
                        self.leasing, self.idle_since = False, None
                        return
                    now = time.monotonic()
                    self.idle_since = self.idle_since or now
                    if now - self.idle_since < LINGER:
                        self.changed.wait(LINGER - (now - self.idle_since))
                        continue
                    idle, self.free, self.idle_since = self.free, 0, None
            if idle:
                for _ in range(idle):
                    self.backend_ops += 1
                    sem.give()
                continue
            self.backend_ops += 1
            if self.remote:  # its units may all be idle here: look again every LINGER
                if not sem.take(LINGER):
                    continue
            else:
                sem.take()
            self._hand_over()
            while True:  # a block: whatever else is free now, for the calls still waiting
                with self.lock:
                    if not self.waiters:
                        break
                self.backend_ops += 1
                if not sem.try_take():
                    break
                self._hand_over()

    def settle(self) -> None:
        """Give the idle units back now (``LINGER`` cut short: the process has no more work)."""
        with self.lock:
            idle, self.free, self.idle_since = self.free, 0, None
        for _ in range(idle):
            self.backend_ops += 1
            self.sem.give()

    def _hand_over(self) -> None:
        with self.lock:
            if self._grant():
                return
            if self.remote:
                self.free += 1
                return
            self.backend_ops += 1
            self.sem.give()


class Rate:
    """Start times of one rate limit (or amounts of a metered quantity), reserved from the
    backend in blocks.

    The backend keeps the nominal schedule: start times ``interval`` apart (one per call, or
    per unit of an amount), shared by every process. A call may start up to ``tolerance``
    seconds before its nominal time (a bounded burst, ``burst_of``): a rate the calls never
    reach delays none of them, however bunched they arrive; one they reach paces them
    ``interval`` apart. A block of ``block`` calls' worth costs one backend reservation;
    the process hands its start times out in order. ``block`` doubles while calls use a
    block up before its last start time has come (demand above the rate) or within a
    quarter of ``stale`` (demand below the rate: a never-binding limit costs one
    reservation per ``MAX_RATE_BLOCK`` calls, not one per call), halves when a block lasted
    over half of ``stale`` and falls back to 1 when start times go unused. A reserved start that has passed by more than ``stale`` (the tolerance, at
    least one interval) is dropped with the rest of its block; one passed by less is used
    late, as the burst the limit allows: a loaded process that wakes a few milliseconds
    late no longer throws away the rest of its block (up to ``MAX_RATE_BLOCK`` start times
    of the schedule every process shares). Whatever block size, no call starts more than
    ``tolerance`` before its nominal time nor uses one more than ``stale`` old.

    Amounts (``reserve(k)``, ``correct(delta)``: a quantity's expected amount, then what the
    call really metered) move the same cursor by ``k`` intervals; a block of amounts holds
    ``spare`` calls more, for the corrections; the rest of a block too small for the next
    amount goes back to the backend when it is still ahead, and a correction stays in the
    block when it fits (else it goes to the backend, as it would without blocks).
    """

    def __init__(self, rate: RateStore, tolerance: float = 0.0, spare: float = 0.0) -> None:
        self.rate = rate
        self.interval: float = rate.interval
        self.tolerance = tolerance
        self.stale = max(self.interval, tolerance)
        self.lock = threading.Lock()
        self.next = 0.0  # the block's next free start time (wall clock)
        self.left = 0.0  # what the block holds from ``next`` on (starts or amounts)
        self.base = 0.0  # the block's first start time (give-backs stay in the block)
        self.filled = -math.inf  # when the block was reserved
        self.block = 1
        self.spare = spare

    def reserve(self, k: float = 1) -> float:
        """Seconds this call (``k``: its amount) must wait for its start time."""
        with self.lock:
            now = time.time()
            if self.left and self.next < now - self.stale:
                self.left, self.block = 0.0, 1  # unused starts: demand is below the rate
            if self.left < k or not self.left:
                self._refill(k, now)
            start = self.next
            self.next += k * self.interval
            self.left -= k
        return max(0.0, start - self.tolerance - now)

    def _refill(self, k: float, now: float) -> None:
        """(Lock held.) A new block of ``block`` calls of ``k`` from the backend."""
        used = now - self.filled  # how long the last block lasted
        if self.next > now or used < self.stale / 4:  # demand above the rate, or blocks
            self.block = min(MAX_RATE_BLOCK, self.block * 2)  # twice as large still last
        elif used > self.stale / 2:  # less than half the horizon (none goes stale)
            self.block = max(1, self.block // 2)
        if self.left * self.interval > 1e-6 and self.next + self.left * self.interval > now:
            self.rate.reserve(-self.left)  # a rest too small for ``k``, still ahead: back
        size = (self.block + self.spare) * k
        self.base = self.next = self.rate.reserve(size)
        self.left, self.filled = size, now

    def correct(self, delta: float) -> None:
        """A call took ``delta`` more (less, when negative) than it reserved."""
        if not delta:
            return
        with self.lock:
            fresh = self.next >= time.time() - self.stale  # a stale block is not charged
            if fresh and (0 < delta <= self.left or (
                    delta < 0 and self.next + delta * self.interval >= self.base)):
                self.next += delta * self.interval
                self.left -= delta
                return
        self.rate.reserve(delta)


def burst_of(count: float) -> float:
    """Starts (or amounts) a burst of ``count``-per-period limit may take at once after a
    pause: ``BURST_SHARE`` of the count, none below ``1 / BURST_SHARE``."""
    return max(1.0, math.floor(count * BURST_SHARE))


def paced(count: float, per: float) -> tuple[float, float]:
    """``(steady count, burst)`` of a limit of ``count`` per ``per`` seconds: the steady
    rate gives way to the burst, so no window of ``per`` seconds holds more than ``count``
    (GCRA: at most ``per / interval + burst`` starts in any ``per`` seconds)."""
    burst = burst_of(count)
    return count - (burst - 1), burst


# ------------------------------------------------------------------ backends


Probe = Callable[[], LimitsBackend | None]
_PROBES: list[Probe] = []
# a forked child holds no units and no waiters: it starts with fresh limiters
_LIMITERS: Memo[Any] = Memo("policies.limits")
_MACHINE: Memo[MachineLimits] = Memo("policies.machine")  # by its directory


def register_backend(probe: Probe) -> None:
    """Register ``probe() -> LimitsBackend | None`` (``backend.py``): the first backend a
    probe returns is the one limits use where the code runs; none: ``MachineLimits``."""
    if probe not in _PROBES:
        _PROBES.append(probe)


@contextmanager
def using(found: LimitsBackend) -> Iterator[LimitsBackend]:
    """Limits use ``found`` in this process meanwhile (ahead of every registered probe):
    ``with using(MemoryLimits()):`` (tests)."""
    def probe() -> LimitsBackend:
        return found

    _PROBES.insert(0, probe)
    try:
        yield found
    finally:
        _PROBES.remove(probe)


def backend() -> LimitsBackend:
    """The backend limits use where this code runs."""
    for probe in _PROBES:
        found = probe()
        if found is not None:
            return found
    return _MACHINE.get(limits_dir(), MachineLimits)


def _limiter(kind: str, key: str, spec: tuple[Any, ...], make: Callable[[LimitsBackend], Any]
             ) -> Any:
    """This process's limiter of ``kind`` for ``key``, made once per backend."""
    where = backend()
    return _LIMITERS.get((where.name, where.directory, kind, key, *spec), lambda: make(where))


def slots(key: str, n: int) -> Slots:
    """This process's side of limit ``key`` of ``n`` units (``concurrency=n``)."""
    return _limiter("slots", key, (n,), lambda b: Slots(b.semaphore(key, n)))


def rate(key: str, count: float, per: float) -> Rate:
    """This process's start times of ``count`` calls per ``per`` seconds (a bounded burst,
    ``paced``)."""
    def make(where: LimitsBackend) -> Rate:
        steady, burst = paced(count, per)
        store = where.rate(key, steady, per)
        return Rate(store, (burst - 1) * store.interval)

    return _limiter("rate", key, (count, per), make)


def quantity(key: str, count: float, per: float) -> Rate:
    """This process's reservations of a metered quantity, ``count`` per ``per`` seconds (a
    bounded burst, ``paced``), in blocks with a call's worth spare for the corrections."""
    def make(where: LimitsBackend) -> Rate:
        steady, burst = paced(count, per)
        store = where.rate(key, steady, per)
        return Rate(store, (burst - 1) * store.interval, spare=1.0)

    return _limiter("quantity", key, (count, per), make)


def amounts(key: str, count: float, per: float) -> RateStore:
    """The backend's reservation of ``count`` units of a quantity per ``per`` seconds."""
    return _limiter("amounts", key, (count, per), lambda b: b.rate(key, count, per))


def shared(key: str) -> SharedValue:
    """The backend's shared value ``key`` (a backend without ``shared``: this machine's)."""
    return _limiter("shared", key, (), lambda b: _shared_of(b, key))


def _shared_of(where: LimitsBackend, key: str) -> SharedValue:
    make = getattr(where, "shared", None)  # optional for backends registered before it was
    return make(key) if make is not None else MachineLimits().shared(key)


_KINDS: dict[str, Callable[..., Any]] = {"slots": slots, "rate": rate, "amounts": amounts,
                                         "quantity": quantity, "shared": shared}


@overload
def limiter(kind: Literal["slots"], key: str, n: int, /) -> Slots: ...
@overload
def limiter(kind: Literal["rate"], key: str, count: float, per: float, /) -> Rate: ...
@overload
def limiter(kind: Literal["amounts"], key: str, count: float, per: float, /) -> RateStore: ...
@overload
def limiter(kind: Literal["quantity"], key: str, count: float, per: float, /) -> Rate: ...
@overload
def limiter(kind: Literal["shared"], key: str, /) -> SharedValue: ...
def limiter(kind: str, key: str, /, *spec: Any) -> Slots | Rate | RateStore | SharedValue:
    """``slots``, ``rate``, ``amounts``, ``quantity`` or ``shared`` by name (``kind``)."""
    return _KINDS[kind](key, *spec)


def settle() -> None:
    """Give every limit's idle units back to its backend now (a worker with no more work)."""
    for found in list(_LIMITERS.values.values()):
        if isinstance(found, Slots):
            found.settle()

