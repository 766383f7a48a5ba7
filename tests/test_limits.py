"""Concurrency limits under load: real processes, many waiting calls, no polling."""

from __future__ import annotations

import asyncio
import bisect
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from hypernodes_dist import Graph, node, resource
from hypernodes_dist import policies as pol
from hypernodes_dist.policies.aimd import backoff_for
from hypernodes_dist.policies.gates.concurrency import ConcurrencyGate
from hypernodes_dist.policies.limits import Slots, limiter
from tests.fresh import FRESH

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
    ctx = FRESH
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
        # a call starts its wait after the clock read of its own reserve(), not at t0 (the
        # 3,000 reserves of a loaded machine take a while: t0 + wait put later calls early)
        starts = sorted(time.time() + tight.reserve() for _ in range(3 * count))
    assert sum(1 for s in starts if s <= t0 + 0.001) <= 11  # the burst, then spaced
    # every window of one period, wherever it begins, holds at most the count (+1: a start
    # on each of its two edges)
    assert all(bisect.bisect_right(starts, s + per) - i <= count + 1
               for i, s in enumerate(starts))
    assert starts[-1] - t0 >= (3 * count - 10) / count * per * 0.99


def test_a_limit_the_calls_never_reach_is_reserved_in_blocks_not_call_by_call():
    """Calls below the rate (one a millisecond against 10,000/s) and their token amounts
    take their start times from blocks: a handful of backend reservations, no waits."""
    from hypernodes_dist.policies.limits import quantity, rate, using
    from hypernodes_dist.policies.memory import MemoryLimits

    with using(MemoryLimits()) as where:
        calls = rate("never-binding", 600_000, 60.0)
        tokens = quantity("never-binding:tokens", 60_000_000, 60.0)
        waits = []
        for i in range(300):
            waits += [calls.reserve(), tokens.reserve(30.0)]
            tokens.correct(float(i % 7 - 3))  # what the call metered: 27-33 tokens
            time.sleep(0.001)
    backend_ops = sum(made.ops for made in where.made)
    assert max(waits) == 0.0
    assert backend_ops <= 60, backend_ops  # 900 without blocks (a reserve per call, two
    # per token amount); a loaded machine's slow loop makes blocks smaller, not per call


def test_token_amounts_a_limit_reaches_are_paced_and_no_period_holds_more_than_its_count():
    """Amounts reserved in blocks and corrected by what each call metered: every window
    of one period holds at most the count (+ a call's amount on its edges), the calls are
    paced at the rate (not slower: corrections given back are used again)."""
    from hypernodes_dist.policies.limits import quantity, using
    from hypernodes_dist.policies.memory import MemoryLimits

    count, per = 10_000, 1.0  # tokens; a burst of 100, then 9,901/s
    with using(MemoryLimits()):
        tokens = quantity("paced:tokens", count, per)
        t0 = time.time()
        starts, used = [], []
        for i in range(300):  # 30,000 tokens expected, 30,000 metered
            starts.append(time.time() + tokens.reserve(100.0))
            used.append(100.0 + (i % 5 - 2) * 20)  # 60-140 metered
            tokens.correct(used[-1] - 100.0)
    order = sorted(range(len(starts)), key=starts.__getitem__)
    at = [starts[i] for i in order]
    amounts = [used[i] for i in order]
    for i, s in enumerate(at):
        j = bisect.bisect_right(at, s + per)
        assert sum(amounts[i:j]) <= count + 2 * 140, (i, sum(amounts[i:j]))
    assert at[-1] - t0 >= (sum(used) - count - 200) / count * per * 0.99
    assert at[-1] - t0 <= (sum(used) - 100) / count * per + 1.0  # paced, not slower


def test_small_counts_have_no_burst():
    from hypernodes_dist.policies.limits import paced

    assert paced(5, 1.0) == (5, 1.0) and paced(199, 60.0) == (199, 1.0)
    assert paced(3000, 10.0) == (2971, 30.0)


@node(output_name="y", concurrency=8)
async def _cut_node(x: int) -> int:
    return x


def _behind_a_cut(directory: str, running, peak, lock, ready, go, out) -> None:
    """One process: 12 calls of ``_cut_node`` at once through its guard (the API's width
    was lowered before the process started), each holding its unit for 0.1 s."""
    import os

    os.environ["HYPERNODES_LIMITS_DIR"] = directory
    from hypernodes_dist.execution.guard import Guard

    guard = Guard(_cut_node)

    async def call() -> None:
        with lock:
            running.value += 1
            peak.value = max(peak.value, running.value)
        await asyncio.sleep(0.1)
        with lock:
            running.value -= 1

    async def main() -> None:
        ready.put(os.getpid())
        go.wait(60)
        await asyncio.gather(*(guard.run(call, i) for i in range(12)))

    asyncio.run(main())
    out.put(guard.gates[1].places.width)


def test_a_lowered_width_holds_in_total_across_processes(limits_dir):
    """"Concurrency lowered to 4 of 8" means 4 calls at once in all processes together:
    three processes of 12 waiting calls each never run more than 4 (not 4 each)."""
    assert backoff_for("_cut_node", 8).refused()  # a 429 seen here: 8 -> 4
    ctx = FRESH
    running, peak = ctx.Value("i", 0, lock=False), ctx.Value("i", 0, lock=False)
    lock, ready, go, out = ctx.Lock(), ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_behind_a_cut,
                         args=(limits_dir, running, peak, lock, ready, go, out))
             for _ in range(3)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    go.set()
    widths = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert widths == [4, 4, 4] and running.value == 0
    assert peak.value == 4  # the width binds in total, and is used
    sem = pol.limits.backend().semaphore("_cut_node", 8)
    assert sem.value() == 4  # 4 withheld
    gate = ConcurrencyGate("_cut_node", 8)
    gate.backoff.state.remove()  # the back-off forgotten (as FORGET seconds after it)
    gate.backoff.read_at = float("-inf")
    gate.backoff.refresh()
    assert gate.backoff.allowed == 8 and sem.value() == 8  # the units came back


class _Failing:
    """A backend semaphore of one unit whose blocking take fails once (a semaphore removed
    under the process, a scheduler gone)."""

    def __init__(self) -> None:
        self.units = threading.Semaphore(1)
        self.failed = False

    def try_take(self) -> bool:
        return self.units.acquire(blocking=False)

    def take(self) -> None:
        if not self.failed:
            self.failed = True
            raise OSError("hypernodes concurrency limit: semop failed: Identifier removed")
        self.units.acquire()

    def give(self) -> None:
        self.units.release()


def test_a_failing_backend_fails_the_waiting_calls_instead_of_leaving_them_waiting():
    slots = Slots(_Failing())

    async def main() -> None:
        await slots.acquire(blocking=False)  # the one unit
        waiting = asyncio.ensure_future(slots.acquire(blocking=False))
        with pytest.raises(OSError, match="Identifier removed"):
            await asyncio.wait_for(waiting, 10)
        slots.release()
        await asyncio.wait_for(slots.acquire(blocking=False), 10)  # the limit works again
        again = asyncio.ensure_future(slots.acquire(blocking=False))  # a new lease thread
        await asyncio.sleep(0.01)
        slots.release()
        await asyncio.wait_for(again, 10)
        slots.release()

    asyncio.run(main())


# ------------------------------------------------------------------ hand-offs under stress


class _Refused(Exception):
    status_code = 429  # a rate-limit error: the API's width is cut, the call retried


_STRESS = {"running": 0, "peak": 0, "calls": 0, "boom": False}
_STRESS_LOCK = threading.Lock()


@resource(concurrency=3)
def _tiny_api() -> str:
    return "api"


@contextmanager
def _running(x: int, node: str) -> Iterator[None]:
    """Counts the calls running (a cancelled one too); some are refused for their rate,
    and one call stops the map when ``boom`` is set."""
    with _STRESS_LOCK:
        _STRESS["running"] += 1
        _STRESS["calls"] += 1
        _STRESS["peak"] = max(_STRESS["peak"], _STRESS["running"])
        refused = x % 7 == 3 and _STRESS["calls"] % 5 == 0
    try:
        if refused:
            raise _Refused("429")
        yield
        if _STRESS["boom"] and node == "second" and x == 41:
            raise ValueError(f"boom at {x}")  # the map stops: its waiting calls are cancelled
    finally:
        with _STRESS_LOCK:
            _STRESS["running"] -= 1


@node(output_name="a", concurrency=2, retries=50, retry_on=_Refused, timeout=5)
async def _stress_first(x: int, _tiny_api: str) -> int:
    with _running(x, "first"):
        await asyncio.sleep(0.001 * (x % 3))
    return x


@node(output_name="b", concurrency=2, retries=50, retry_on=_Refused)
def _stress_second(a: int, _tiny_api: str) -> int:
    with _running(a, "second"):
        time.sleep(0.0005 * (a % 2))
    return a


def test_many_calls_cancelled_at_tiny_limits_are_all_woken(limits_dir):
    """Two nodes on one resource (3 units), 2 each, async and sync calls from the loop and
    from threads, rate-limit errors cutting the width, maps stopped by an error (their
    waiting calls cancelled): every map ends, no unit is lost, the limits hold."""
    from hypernodes_dask import DaskEngine

    graph = Graph([_tiny_api, _stress_first, _stress_second])
    engines = [None, DaskEngine(scheduler="threads", num_workers=3, partition_size=9)]
    failures: list[BaseException] = []

    def maps() -> None:
        for round_ in range(24):
            _STRESS["boom"] = round_ % 3 == 0
            engine = engines[round_ % 2]
            g = graph if engine is None else Graph(
                [_tiny_api, _stress_first, _stress_second], engine=engine)
            try:
                res = g.map({"x": list(range(60))}, map_over="x")
                assert [r["b"] for r in res] == list(range(60))
            except ValueError as exc:
                if "boom" not in str(exc):
                    failures.append(exc)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

    worker = threading.Thread(target=maps, daemon=True)
    worker.start()
    worker.join(300)
    assert not worker.is_alive(), "a map never ended: a waiting call was never woken"
    engines[1].close()
    assert not failures, failures
    assert _STRESS["running"] == 0 and 1 <= _STRESS["peak"] <= 3
    assert _STRESS["calls"] >= 16 * 2 * 60  # the 16 maps that ran to the end, both nodes
    key = _tiny_api_key(graph)
    sem = pol.limits.backend().semaphore(key, 3)
    withheld = pol.limits.shared(f"withheld-3-{key}")  # by the API's back-off, if still cut

    def lost() -> int:
        return 3 - sem.value() - int((withheld.get() or {}).get("held", 0))

    deadline = time.monotonic() + 60  # calls a stopped map left running end meanwhile
    while lost() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lost() == 0, _STRESS  # every unit of the resource came back


def _tiny_api_key(graph: Graph) -> str:
    from hypernodes_dist.resources.bind import limits_key, resource_identities

    return limits_key(_tiny_api, resource_identities({"_tiny_api": _tiny_api})["_tiny_api"])
