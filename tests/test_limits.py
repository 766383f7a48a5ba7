"""Concurrency limits under load: real processes, many waiting calls, no polling."""

from __future__ import annotations

import asyncio
import bisect
import multiprocessing
import threading
import time

import pytest

from hypernodes_dist import policies as pol
from hypernodes_dist.policies.limits import Slots, limiter

N = 16  # units of the limit under test
CALLS = 1_000  # waiting calls per process
PROCESSES = 4


@pytest.fixture
def limits_dir(tmp_path, monkeypatch):
    path = str(tmp_path / "limits")
    monkeypatch.setenv("HYPERNODES_LIMITS_DIR", path)
    yield path
    pol.remove_semaphores(path)


def _hammer(directory: str, running, peak, lock, out) -> None:
    """One process: CALLS async calls at once, each holding a unit for a moment."""
    import os

    os.environ["HYPERNODES_LIMITS_DIR"] = directory
    slots = limiter("slots", "hammered", N)

    async def call() -> None:
        await slots.acquire(blocking=False)
        try:
            with lock:
                running.value += 1
                peak.value = max(peak.value, running.value)
            await asyncio.sleep(0.001)
            with lock:
                running.value -= 1
        finally:
            slots.release()

    async def main() -> None:
        await asyncio.gather(*(call() for _ in range(CALLS)))

    asyncio.run(main())
    out.put((CALLS, slots.backend_ops))


@pytest.mark.slow
def test_limit_holds_across_processes_and_waiters_are_woken(limits_dir):
    ctx = multiprocessing.get_context("spawn")
    running, peak, lock, out = ctx.Value("i", 0, lock=False), ctx.Value("i", 0, lock=False), \
        ctx.Lock(), ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(limits_dir, running, peak, lock, out))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert sum(calls for calls, _ in reports) == PROCESSES * CALLS
    assert 1 <= peak.value <= N and running.value == 0
    # Woken, never polling: per call at most one non-blocking take and one give, plus (for
    # a unit the lease thread fetched) one blocking take and one failed non-blocking try.
    # A poller would make operations grow with the time spent waiting instead.
    assert all(ops <= 4 * calls for calls, ops in reports)
    sem = pol.limits.backend().semaphore("hammered", N)
    assert sem.value() == N  # every unit came back


def test_blocking_and_async_waiters_share_one_limit(limits_dir):
    slots: Slots = limiter("slots", "mixed", 2)
    running, peak = [0], [0]
    guard = threading.Lock()

    def hold() -> None:
        with guard:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.002)
        with guard:
            running[0] -= 1

    def thread_calls() -> None:
        for _ in range(20):
            asyncio.run(_blocking(slots, hold))

    async def async_calls() -> None:
        async def one() -> None:
            await slots.acquire(blocking=False)
            try:
                hold()
                await asyncio.sleep(0)
            finally:
                slots.release()

        await asyncio.gather(*(one() for _ in range(40)))

    threads = [threading.Thread(target=thread_calls) for _ in range(3)]
    for t in threads:
        t.start()
    asyncio.run(async_calls())
    for t in threads:
        t.join(60)
    assert peak[0] <= 2 and running[0] == 0
    deadline = time.monotonic() + 30
    while (slots.leasing or slots.sem.value() != 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slots.sem.value() == 2


async def _blocking(slots: Slots, hold) -> None:
    await slots.acquire(blocking=True)  # never suspends: waits on its own lock
    try:
        hold()
    finally:
        slots.release()


def test_a_cancelled_waiter_gives_its_unit_on(limits_dir):
    slots: Slots = limiter("slots", "cancel", 1)

    async def main() -> None:
        await slots.acquire(blocking=False)
        waiter = asyncio.ensure_future(slots.acquire(blocking=False))
        second = asyncio.ensure_future(slots.acquire(blocking=False))
        await asyncio.sleep(0.01)
        waiter.cancel()
        slots.release()  # skips the cancelled waiter: the second one gets the unit
        assert await asyncio.wait_for(second, 10) >= 0
        slots.release()

    asyncio.run(main())
    deadline = time.monotonic() + 30  # the lease thread hands back what it took meanwhile
    while (slots.leasing or slots.sem.value() != 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slots.sem.value() == 1


class _Remote:
    """A backend semaphore whose every operation would be a network round trip."""

    remote = True

    def __init__(self, n: int) -> None:
        self.units = threading.Semaphore(n)
        self.value = n
        self.callers: set[str] = set()

    def _op(self, delta: int) -> None:
        self.callers.add(threading.current_thread().name)
        self.value += delta

    def try_take(self) -> bool:
        if self.units.acquire(blocking=False):
            self._op(-1)
            return True
        return False

    def take(self, timeout: float) -> bool:
        if self.units.acquire(timeout=timeout):
            self._op(-1)
            return True
        return False

    def give(self) -> None:
        self._op(1)
        self.units.release()


def test_a_remote_backend_is_called_off_the_calls_path_and_gets_its_units_back():
    sem = _Remote(3)
    slots = Slots(sem)
    running, peak = [0], [0]

    async def call() -> None:
        await slots.acquire(blocking=False)
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.001)
        running[0] -= 1
        slots.release()

    async def main() -> None:
        await asyncio.gather(*(call() for _ in range(200)))

    asyncio.run(main())
    assert peak[0] == 3 and running[0] == 0
    assert sem.callers == {"hn-limit-lease"}  # never the event loop's thread
    deadline = time.monotonic() + 30  # idle units go back after LINGER
    while (slots.leasing or sem.value != 3) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sem.value == 3 and slots.free == 0


# ------------------------------------------------------------------ rates: a bounded burst


def test_a_rate_the_calls_never_reach_lets_a_burst_start_at_once():
    from hypernodes_dist.policies.limits import burst_of, rate, using
    from hypernodes_dist.policies.memory import MemoryLimits

    with using(MemoryLimits()):
        loose = rate("bursty", 60_000, 60.0)  # 1,000/s; a burst of 600 may start at once
        waits = [loose.reserve() for _ in range(64)]  # 64 calls released together
    assert burst_of(60_000) == 600
    assert max(waits) == 0.0


def test_a_rate_the_calls_reach_paces_them_and_no_period_holds_more_than_its_count():
    from hypernodes_dist.policies.limits import rate, using
    from hypernodes_dist.policies.memory import MemoryLimits

    count, per = 1_000, 1.0  # a burst of 10, then 991/s
    with using(MemoryLimits()):
        tight = rate("paced", count, per)
        t0 = time.time()
        starts = sorted(t0 + tight.reserve() for _ in range(3 * count))
    assert sum(1 for s in starts if s <= t0 + 0.001) <= 11  # the burst, then spaced
    # every window of one period, wherever it begins, holds at most the count (+1: a start
    # on each of its two edges)
    assert all(bisect.bisect_right(starts, s + per) - i <= count + 1
               for i, s in enumerate(starts))
    assert starts[-1] - t0 >= (3 * count - 10) / count * per * 0.99


def test_small_counts_have_no_burst():
    from hypernodes_dist.policies.limits import paced

    assert paced(5, 1.0) == (5, 1.0) and paced(199, 60.0) == (199, 1.0)
    assert paced(3000, 10.0) == (2971, 30.0)
