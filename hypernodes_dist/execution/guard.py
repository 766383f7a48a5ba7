"""The policy guard: one node call under its retries, back-off, timeout and limits.

Executors wrap the *call* of a node that has a ``Policy`` (``hypernodes_dist.policies``)
in a ``Guard`` (one per node per batch, or per scheduler call):

    for each attempt:  concurrency slot -> rate-limit turn -> the call (under its timeout)
    on an exception:   retried if ``retry_on`` lists it and attempts are left:
                       PolicyEvent(kind="retry"), back-off, next attempt
    otherwise:         the exception, with ``hn_attempts`` (and a note once retried)

The guard is one coroutine for every caller (``syncio``): a blocking caller (a sync node
driven without an event loop) waits with ``time.sleep`` and blocking slot waits, so the
coroutine never suspends; an async caller awaits the same waits. Only the failed node of
the failed item is re-run; a cache hit never calls the function, so it takes no slot and
no rate turn. Retries count against the rate limit (each attempt is a request).

Timeouts: async nodes run under ``asyncio.timeout`` (the coroutine is cancelled). A sync
function cannot be killed from Python: it runs in a helper thread and the caller stops
waiting; the thread runs to its end in the background, keeping its concurrency slot
until then (so "at most N executions overlap" stays true). The error is a
``NodeTimeoutError`` (a ``TimeoutError``) naming the node, the item and the limit.

Timing: ``Attempts`` (optional, given by the caller) receives the start and end of the
successful attempt and the seconds spent waiting (slot, rate limit, back-off), so a
node's ``duration_ms`` is its running time; each wait is a ``PolicyEvent``.

Usage (``policies/usage.py``): a node that may ``meter`` is guarded even without a policy.
One ``Metering`` spans all attempts of an execution (a paid failed attempt counts); the
guard keeps each item's usage (``usage``) and counts ``calls``. Before an attempt starts:
the node's Retry-After hold-off, the map's ``Budget``, then each quantity rate limit
reserves what the call is expected to meter (``Estimate``), corrected by what it metered.
A retried error carrying ``Retry-After`` waits at least that long and holds off every new
call of the node meanwhile (``policies/retryafter.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from hypernodes_dist.errors import BudgetExceededError
from hypernodes_dist.events import PolicyEvent
from hypernodes_dist.execution.invoke import call_node
from hypernodes_dist.execution.syncio import run_sync
from hypernodes_dist.policies.aimd import Backoff, backoff_for, rate_limited
from hypernodes_dist.policies.budget import Budget
from hypernodes_dist.policies.limits import limiter
from hypernodes_dist.policies.retryafter import holdoff_for, retry_after
from hypernodes_dist.policies.spec import NodeTimeoutError, Policy, backoff_delay
from hypernodes_dist.policies.stats import record
from hypernodes_dist.policies.usage import (
    CALL,
    Metering,
    Usage,
    estimate,
    observed,
    quantities_of,
)

__all__ = ["Guard", "Attempts", "WINDOW", "guarded_call", "awaits"]

Report = Callable[[Any], Any]
Call = Callable[[], Awaitable[Any]]

# Metered quantities are paced at this share of their declared rate: a provider counting
# on its own clock in a sliding window sees our start times shifted by network and loop
# jitter, and pacing at exactly its limit keeps every window at the edge (1% of requests
# refused at 100%, measured by ``benchmarks/bench_paid_api.py``).
PACE = 0.98
# A retry told to wait by Retry-After waits up to this share longer, drawn at random: every
# call refused in one burst is told the same time, and would all retry at once again.
RETRY_AFTER_SPREAD = 0.25

# The item window of the running flow (``execution/flow.py``): an item sleeping in back-off
# gives its place back, so the items behind it keep the limits busy.
WINDOW: contextvars.ContextVar[Any] = contextvars.ContextVar("hn_window", default=None)


class Attempts:
    """What the guard measured for one call: the successful attempt's ``start``/``end``
    (``perf_counter``) and ``waited`` seconds (slot, rate limit, back-off)."""

    __slots__ = ("start", "end", "waited", "usage")

    def __init__(self) -> None:
        self.start = self.end = 0.0
        self.waited = 0.0
        self.usage: Usage | None = None  # what the execution metered (metering nodes)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _sleep(seconds: float, blocking: bool, in_slot: bool = False) -> None:
    """Wait ``seconds``; a flowing item not holding a concurrency unit (``in_slot``) gives
    its window place back meanwhile (an item holding one keeps its place: taking the place
    back could wait on an item that waits for that unit)."""
    if blocking:
        time.sleep(seconds)
        return
    window = WINDOW.get()
    if window is None or in_slot:
        await asyncio.sleep(seconds)
        return
    window.release()
    try:
        await asyncio.sleep(seconds)
    finally:
        await window.acquire()


class _Units:
    """A call's concurrency: this process's AIMD gate (``policies/aimd.py``), then the shared
    limit's unit; released the other way round."""

    __slots__ = ("gate", "units", "shared")

    def __init__(self, backoff: Backoff, shared: Any) -> None:
        self.gate, self.units = backoff.slots, backoff.gate  # its waiting calls, its places
        self.shared = shared

    async def acquire(self, blocking: bool) -> float:
        # a free place in the gate is taken at once; a full gate queues (FIFO, no polling)
        waited = 0.0 if self.units.try_take() else await self.gate.acquire(blocking)
        try:
            return waited + await self.shared.acquire(blocking)
        except BaseException:
            self.release_gate()
            raise

    def release_gate(self) -> None:
        if self.gate.waiters:
            self.gate.release()  # straight to the first waiting call
        else:  # a call queueing meanwhile is woken by the gate's own lease thread
            self.units.give()

    def release(self) -> None:
        self.shared.release()
        self.release_gate()


class Guard:
    """Applies one node's policy to its calls. ``report(event)`` receives each
    ``PolicyEvent`` (the caller fills in the run ids)."""

    def __init__(self, node: Any, report: Report | None = None,
                 budget: Budget | None = None) -> None:
        self.node = node
        self.policy: Policy = node.policy or Policy(node.name)
        self.report = report
        p = self.policy
        self.aimd = backoff_for(p.node, p.concurrency) if p.concurrency else None
        self.slots = _Units(self.aimd, limiter("slots", p.node, p.concurrency)
                            ) if self.aimd is not None else None
        self.rate = limiter("rate", p.node, *p.rate) if p.rate else None
        self.amounts = [(q, limiter("amounts", f"{p.node}:{q.quantity}", q.count * PACE, q.per))
                        for q in p.quantities]
        self.meters = bool(node.meters)
        self.budget = budget if self.meters else None
        self.holdoff = holdoff_for(p.node)
        self.usage: dict[int | None, Usage] = {}  # item -> what its execution metered
        self.calls = 0  # executions started (not attempts)

    # -- events ------------------------------------------------------------------------
    def _event(self, kind: str, item: int | None, attempt: int, wait: float, reason: str) -> None:
        record(self.policy.node, kind)
        if self.report is not None:
            self.report(PolicyEvent(node_id=self.policy.node, tags=self.node.tags,
                                    item_index=item, kind=kind, attempt=attempt, wait=wait,
                                    reason=reason))

    def _timeout_error(self, item: int | None) -> NodeTimeoutError:
        p = self.policy
        where = f"node {p.node!r}" if item is None else f"node {p.node!r} (item {item})"
        return NodeTimeoutError(f"{where} timed out after {p.timeout:g} s (timeout={p.timeout:g})",
                                p.node, item, p.timeout or 0.0)

    def _retry(self, exc: Exception, item: int | None, attempt: int) -> float:
        """The back-off before the next attempt; raises ``exc`` when it is not retried."""
        p = self.policy
        if attempt > p.retries or not p.retryable(exc) or isinstance(exc, BudgetExceededError):
            if not isinstance(exc, BudgetExceededError):
                self._told_to_wait(exc, item, attempt)  # a final 429 still holds the others off
            exc.hn_attempts = attempt  # type: ignore[attr-defined]
            if attempt > 1:
                try:
                    exc.add_note(f"hypernodes retries: gave up after {attempt} attempts "
                                 f"(retries={p.retries}); this is the last attempt's error")
                except AttributeError:
                    pass
            raise exc
        wait = backoff_delay(p.backoff, attempt)
        told = self._told_to_wait(exc, item, attempt)
        self._event("retry", item, attempt, max(wait, told), _describe(exc))
        return max(wait, told)

    def _told_to_wait(self, exc: BaseException, item: int | None, attempt: int) -> float:
        """The provider's Retry-After in ``exc`` (0.0: none), now a hold-off of the node; a
        rate-limit error also halves the node's concurrency here for a while (``aimd``)."""
        told = retry_after(exc)
        if told:  # at least that long; spread so the calls told the same do not collide again
            told *= 1 + random.random() * RETRY_AFTER_SPREAD
        if self.aimd is not None and (told or rate_limited(exc)):
            if self.aimd.refused():
                self._event("throttle", item, attempt, 0.0,
                            f"rate limited: concurrency lowered to {self.aimd.allowed} of "
                            f"{self.policy.concurrency} in this process")
        if not told:
            return 0.0
        self.holdoff.extend(told)
        self._event("hold_off", item, attempt, told,
                    f"Retry-After {told:g} s: no new call of {self.policy.node!r} meanwhile")
        return told

    # -- one guarded call ------------------------------------------------------------------
    async def run(self, call: Call, item: int | None = None, blocking: bool = False,
                  failed: Exception | None = None, timing: Attempts | None = None) -> Any:
        """Attempts of ``call()`` until one succeeds or the error is final.

        ``blocking``: the caller has no event loop (waits block, nothing suspends);
        ``failed``: the error of a first attempt the caller already made.
        """
        timing = timing or Attempts()
        self.calls += 1
        if not self.meters:
            return await self._attempts(call, item, blocking, failed, timing)
        metering = Metering()
        try:
            with metering:
                return await self._attempts(call, item, blocking, failed, timing)
        finally:
            self._metered(item, metering.usage, timing)

    def _metered(self, item: int | None, usage: Usage, timing: Attempts) -> None:
        timing.usage = usage
        if usage:
            self.usage[item] = usage
            observed(self.policy.node, usage)

    async def _attempts(self, call: Call, item: int | None, blocking: bool,
                        failed: Exception | None, timing: Attempts) -> Any:
        attempt, error = (1, failed) if failed is not None else (0, None)
        while True:
            if error is not None:
                wait = self._retry(error, item, attempt)
                if wait > 0:
                    timing.waited += wait
                    await _sleep(wait, blocking)
            attempt += 1
            try:
                return await self._attempt(call, item, attempt, blocking, timing)
            except Exception as exc:
                error = exc

    async def _attempt(self, call: Call, item: int | None, attempt: int, blocking: bool,
                       timing: Attempts) -> Any:
        """Hold-off -> concurrency slot -> rate-limit turns -> budget -> the call."""
        if self.holdoff.until() > time.time():
            await self._hold_off(item, attempt, blocking, timing)
        p, slots = self.policy, self.slots
        if slots is not None:
            waited = await slots.acquire(blocking)
            if waited > 0:
                timing.waited += waited
                self._event("throttle", item, attempt, waited, f"concurrency={p.concurrency}")
        held = slots
        try:
            if self.rate is not None:
                wait = self.rate.reserve()
                if wait > 0:
                    timing.waited += wait
                    self._event("throttle", item, attempt, wait, f"rate_limit={p.rate_text}")
                    await _sleep(wait, blocking, in_slot=True)
            reserved = (await self._reserve_amounts(item, attempt, blocking, timing)
                        if self.amounts else None)
            before = dict(_current_usage()) if reserved or self.budget is not None else None
            try:
                if self.budget is not None:  # last: a call that waited may find it spent
                    self.budget.check(p.node, quantities_of(p.node), item)
                timing.start = time.perf_counter()
                if p.timeout is None:
                    value = await call()
                elif blocking or not awaits(self.node):  # sync: a thread, abandoned on timeout
                    held = None  # the helper thread releases the slot when the call really ends
                    value = self._in_thread(call, item, attempt, slots)
                else:
                    value = await self._under_timeout(call, item, attempt)
                timing.end = time.perf_counter()
                if self.aimd is not None:
                    self.aimd.succeeded()
                return value
            finally:  # still holding the slot: the next call sees what this one spent
                if before is not None:
                    self._settle(reserved, before)
        finally:
            if held is not None:
                held.release()

    async def _hold_off(self, item: int | None, attempt: int, blocking: bool,
                        timing: Attempts) -> None:
        """Wait out the node's Retry-After hold-off."""
        while True:
            wait = self.holdoff.until() - time.time()
            if wait <= 0:
                break
            timing.waited += wait
            self._event("throttle", item, attempt, wait, "Retry-After hold-off")
            await _sleep(wait, blocking)

    async def _reserve_amounts(self, item: int | None, attempt: int, blocking: bool,
                               timing: Attempts) -> list[tuple[Any, float, str]]:
        """Reserve what this attempt is expected to meter of each limited quantity:
        ``[(rate, expected, quantity)]`` for ``_settle``."""
        reserved = []
        for q, rate in self.amounts:
            expected = estimate(self.policy.node, q.quantity)
            wait = rate.reserve(expected) - time.time()
            reserved.append((rate, expected, q.quantity))
            if wait > 0:
                timing.waited += wait
                self._event("throttle", item, attempt, wait, f"rate_limit {q.text}")
                await _sleep(wait, blocking, in_slot=True)
        return reserved

    def _settle(self, reserved: list[tuple[Any, float, str]] | None, before: Usage) -> None:
        """What this attempt metered (the usage now, less ``before``): each quantity rate
        gives back (or takes) the difference from what it reserved; the budget spends it."""
        usage = _current_usage()
        metered = {q: v - before.get(q, 0.0) for q, v in usage.items() if v != before.get(q)}
        for rate, expected, quantity in reserved or ():
            delta = metered.get(quantity, 0.0) - expected
            if delta:
                rate.reserve(delta)
        if metered and self.budget is not None:
            self.budget.spend(metered)

    async def _under_timeout(self, call: Call, item: int | None, attempt: int) -> Any:
        timeout = self.policy.timeout
        try:
            async with asyncio.timeout(timeout) as scope:
                return await call()
        except TimeoutError:
            if not scope.expired():
                raise  # the node's own TimeoutError
            err = self._timeout_error(item)
            self._event("timeout", item, attempt, timeout or 0.0, str(err))
            raise err from None

    def _in_thread(self, call: Call, item: int | None, attempt: int, slots: Any) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = run_sync(call(), needs_loop=False)
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            finally:
                if slots is not None:
                    slots.release()
                done.set()

        ctx = contextvars.copy_context()
        threading.Thread(target=ctx.run, args=(work,), daemon=True,
                         name=f"hn-timeout-{self.policy.node}").start()
        if not done.wait(self.policy.timeout):
            err = self._timeout_error(item)
            self._event("timeout", item, attempt, self.policy.timeout or 0.0, str(err))
            raise err
        if "error" in box:
            raise box["error"]
        return box["value"]

    # -- entry points ------------------------------------------------------------------------
    def call(self, thunk: Callable[[], Any], item: int | None = None,
             failed: Exception | None = None, timing: Attempts | None = None) -> Any:
        """``thunk()`` (one sync call of the node) under the policy; waits block."""
        async def once() -> Any:
            return thunk()

        return run_sync(self.run(once, item, True, failed, timing), needs_loop=False)

    def positional(self, fn: Callable[..., Any], items: Any,
                   starts: dict[int, float] | None = None) -> Callable[..., Any]:
        """``fn`` (positional arguments, one call per item in ``items`` order) guarded.
        ``starts``: receives ``{item: start}`` of the items whose successful attempt did
        not start at once (they waited or retried), for their timings."""
        nxt = iter(items).__next__
        call = self.call
        p = self.policy

        def slow(item: int, args: tuple[Any, ...], failed: Exception | None) -> Any:
            timing = Attempts()
            value = call(lambda: fn(*args), item, failed, timing)
            if starts is not None:
                starts[item] = timing.start
            return value

        plain = not (p.timeout or self.slots or self.rate or self.amounts or self.meters)
        if plain:
            holdoff = self.holdoff

            def retried(*args: Any) -> Any:  # retries only: the first attempt is a plain call
                item = nxt()
                if holdoff.until() > time.time():  # a Retry-After: through the guard
                    return slow(item, args, None)
                try:
                    return fn(*args)
                except Exception as exc:
                    return slow(item, args, exc)

            return retried

        def guarded(*args: Any) -> Any:
            return slow(nxt(), args, None)

        return guarded


async def timed_call(node: Any, kwargs: dict[str, Any], guard: Guard | None,
                     item: int) -> tuple[Any, float]:
    """``(value, start)`` of one call of ``node`` in a map batch, under its ``guard``: the
    start is the successful attempt's (waits for slots, rates and back-offs are not
    running time)."""
    if guard is None:
        start = time.perf_counter()
        return await call_node(node, kwargs, None), start
    timing = Attempts()
    value = await guard.run(lambda: call_node(node, kwargs, None), item, timing=timing)
    return value, timing.start


def _current_usage() -> Usage:
    return CALL.get() or {}


def awaits(node: Any) -> bool:
    """Whether calling ``node`` may suspend (async functions, async/lazy streams)."""
    return bool(node.is_async or (node.streaming and not node.is_generator))


async def guarded_call(node: Any, kwargs: dict[str, Any], on_chunk: Any, ctx: Any,
                       base: dict[str, Any], timing: Attempts | None = None) -> Any:
    """The scheduler's call of a guarded node (``run``/``iter``/per-item ``map``).

    ``ctx`` is the run's ``RunContext``; ``base`` the event fields of this execution.
    """
    emit = ctx.emit
    item = ctx.item_index
    if awaits(node) or not ctx.parallel:  # a sync graph without a loop: blocking waits
        guard = Guard(node, _reporter(emit, base, None), ctx.budget)
        return await guard.run(lambda: call_node(node, kwargs, on_chunk), item,
                               blocking=not awaits(node), timing=timing)
    loop = asyncio.get_running_loop()  # parallel waves: keep the loop free, like _in_thread
    relay = None
    if on_chunk is not None:
        def relay(chunk: Any, index: int) -> None:
            loop.call_soon_threadsafe(on_chunk, chunk, index)

    guard = Guard(node, _reporter(emit, base, loop), ctx.budget)
    return await asyncio.to_thread(
        guard.call, lambda: run_sync(call_node(node, kwargs, relay), needs_loop=False), item,
        None, timing,
    )


def _reporter(emit: Any, base: dict[str, Any], loop: Any) -> Report | None:
    if emit is None:
        return None

    def report(event: Any) -> None:
        for k, v in base.items():
            setattr(event, k, v)
        if loop is None:
            emit(event)
        else:
            loop.call_soon_threadsafe(emit, event)

    return report
