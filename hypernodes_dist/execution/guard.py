"""The policy guard: one node call under its retries, timeout and gates.

Executors wrap the *call* of a node that has a ``Policy`` (``hypernodes_dist.policies``) or
may meter in a ``Guard`` (one per node per batch, or per scheduler call). The node's gates
(``policies/gates/``, built once per node and process) each hold one concern; an attempt is

    for gate in gates:   enter (may wait; the budget may refuse)
        hold-off (Retry-After) -> concurrency -> calls rate -> quantity rates -> budget
    the call             (under its timeout)
    gates exited         in reverse order, with the attempt's error or None
    on an exception:     retried if ``retry_on`` lists it, attempts are left, the provider
                         did not say ``x-should-retry: false`` and waiting can help
                         (``signals.final``: not exhausted quota, a spent budget, a call
                         larger than a window's limit):
                         PolicyEvent(kind="retry"), back-off (at least the Retry-After),
                         next attempt; otherwise the exception, with ``hn_attempts``
                         (and a note once retried)

The guard is one coroutine for every caller (``syncio``): a blocking caller (a sync node
driven without an event loop) waits with ``time.sleep`` and blocking slot waits, so the
coroutine never suspends; an async caller awaits the same waits. Only the failed node of
the failed item is re-run; a cache hit never calls the function, so it takes no slot and
no rate turn. Retries pass the gates again (each attempt is a request).

Timeouts: async nodes run under ``asyncio.timeout`` (the coroutine is cancelled). A sync
function cannot be killed from Python: it runs in a helper thread and the caller stops
waiting; the thread runs to its end in the background, keeping its concurrency unit
until then (so "at most N executions overlap" stays true): gates that ``hold`` are exited
by that thread. The error is a ``NodeTimeoutError`` (a ``TimeoutError``) naming the node,
the item and the limit.

Timing: ``Attempts`` (optional, given by the caller) receives the start and end of the
successful attempt and the seconds spent waiting (gates, back-off), so a node's
``duration_ms`` is its running time; each wait is a ``PolicyEvent``.

Usage (``policies/usage.py``): one ``Metering`` spans all attempts of an execution (a paid
failed attempt counts); the guard keeps each item's usage (``usage``) and counts ``calls``.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from hypernodes_dist.errors import WaitingForBatch
from hypernodes_dist.events import PolicyEvent
from hypernodes_dist.execution.batchwait import GatesByReach
from hypernodes_dist.execution.invoke import call_node
from hypernodes_dist.execution.syncio import run_sync
from hypernodes_dist.policies.budget import Budget
from hypernodes_dist.policies.gates import Entry, Gate, gates_for
from hypernodes_dist.policies.signals import final, should_retry
from hypernodes_dist.policies.spec import NodeTimeoutError, Policy, backoff_delay
from hypernodes_dist.policies.stats import record
from hypernodes_dist.policies.usage import CALL, Metering, Usage, observed

__all__ = ["Guard", "Attempts", "WINDOW", "guarded_call", "awaits"]

Report = Callable[[Any], Any]
Call = Callable[[], Coroutine[Any, Any, Any]]

# The item window of the running flow (``execution/flow.py``): an item sleeping in back-off
# gives its place back, so the items behind it keep the limits busy.
WINDOW: contextvars.ContextVar[Any] = contextvars.ContextVar("hn_window", default=None)


class Attempts:
    """What the guard measured for one call: the successful attempt's ``start``/``end``
    (``perf_counter``) and ``waited`` seconds (gates, back-off)."""

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


def _always(gates: tuple[Gate, ...]) -> Callable[[], tuple[Gate, ...]]:
    """Every attempt's gates: all of them."""
    return lambda: gates


class Guard:
    """Applies one node's policy to its calls. ``report(event)`` receives each
    ``PolicyEvent`` (the caller fills in the run ids). ``values``: the inputs of its calls (a
    batch's broadcast values, a call's kwargs): a node receiving resources takes the limits
    of the APIs they are built for (``resources/bind.py``, ``ApiLimits``)."""

    def __init__(self, node: Any, report: Report | None = None,
                 budget: Budget | None = None, values: Mapping[str, Any] | None = None) -> None:
        self.node = node
        limits_for = getattr(node, "limits_for", None)  # a node receiving resources: by API
        self.policy: Policy = (limits_for(values) if limits_for is not None and values is not None
                               else node.policy or Policy(node.name))
        self.report = report
        self.meters = bool(node.meters)
        batch_api = getattr(node, "batch_api", False)
        self.gates: tuple[Gate, ...] = gates_for(self.policy, budget if self.meters else None,
                                                 checks=not batch_api)
        # the gates an attempt takes (a batch_api node's: its budget's only while no call
        # of it can go online)
        self.gates_now: Callable[[], tuple[Gate, ...]] = (
            GatesByReach(self.gates) if batch_api else _always(self.gates))
        self.gauges = any(g.meters for g in self.gates)  # some gate reads what a call metered
        self.usage: dict[int | None, Usage] = {}  # item -> what its execution metered
        self.calls = 0  # executions started (not attempts)
        self.on_usage: Callable[[Usage], object] | None = None  # each execution's, as it ends

    # -- the gates' host ---------------------------------------------------------------------
    def event(self, kind: str, item: int | None, attempt: int, wait: float, reason: str) -> None:
        record(self.policy.node, kind)
        if self.report is not None:
            self.report(PolicyEvent(node_id=self.policy.node, tags=self.node.tags,
                                    item_index=item, kind=kind, attempt=attempt, wait=wait,
                                    reason=reason))

    pause = staticmethod(_sleep)

    def _timeout_error(self, item: int | None) -> NodeTimeoutError:
        p = self.policy
        where = f"node {p.node!r}" if item is None else f"node {p.node!r} (item {item})"
        return NodeTimeoutError(f"{where} timed out after {p.timeout:g} s (timeout={p.timeout:g})",
                                p.node, item, p.timeout or 0.0)

    def _retry(self, entry: Entry, exc: Exception) -> float:
        """The back-off before the next attempt; raises ``exc`` when it is not retried."""
        p, attempt = self.policy, entry.attempt
        if (attempt > p.retries or not p.retryable(exc) or final(exc)
                or should_retry(exc) is False):  # the provider's x-should-retry: false
            exc.hn_attempts = attempt  # type: ignore[attr-defined]  # hn_* annotations go on any exception instance
            if attempt > 1:
                try:
                    exc.add_note(f"hypernodes retries: gave up after {attempt} attempts "
                                 f"(retries={p.retries}); this is the last attempt's error")
                except AttributeError:
                    pass
            raise exc
        wait = max(backoff_delay(p.backoff, attempt), entry.told)
        self.event("retry", entry.item, attempt, wait, _describe(exc))
        return wait

    # -- one guarded call ------------------------------------------------------------------
    async def run(self, call: Call, item: int | None = None, blocking: bool = False,
                  failed: Exception | None = None, timing: Attempts | None = None) -> Any:
        """Attempts of ``call()`` until one succeeds or the error is final.

        ``blocking``: the caller has no event loop (waits block, nothing suspends);
        ``failed``: the error of a first attempt the caller already made (only for nodes
        whose gates hold nothing: the caller's plain first call passed no gate).
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

    async def ungated(self, node: Any, kwargs: dict[str, Any], item: int) -> tuple[Any, float]:
        """``timed_call``'s ``run`` of a call with no gate to pass now and no timeout (a
        ``batch_api`` node's recorded or answered call): ``run`` and its first attempt in
        one frame; a failed call is retried as ``run`` retries it."""
        self.calls += 1
        metering = Metering() if self.meters else None
        if metering is not None:
            token = CALL.set(metering.usage)
        timing = None
        try:
            start = time.perf_counter()
            try:
                return await call_node(node, kwargs, None), start
            except WaitingForBatch as exc:  # recorded: final (``_retry`` raises it at once)
                exc.hn_attempts = 1  # type: ignore[attr-defined]  # as ``_retry`` marks it
                raise
            except Exception as exc:  # retried (its Entry takes no gate)
                entry = Entry(self, item, 1, False)
                entry.error = exc
            timing = Attempts()
            value = await self._retrying(lambda: call_node(node, kwargs, None), item, False,
                                         entry, timing)
            return value, timing.start
        finally:
            if metering is not None:
                CALL.reset(token)
                self._metered(item, metering.usage, timing)

    def _metered(self, item: int | None, usage: Usage, timing: Attempts | None) -> None:
        if timing is not None:
            timing.usage = usage
        if usage:
            self.usage[item] = usage
            observed(self.policy.node, usage)
            if self.on_usage is not None:
                self.on_usage(usage)

    async def _attempts(self, call: Call, item: int | None, blocking: bool,
                        failed: Exception | None, timing: Attempts) -> Any:
        entry = None
        if failed is not None:  # the caller's first attempt: its error passes the gates' exits
            entry = Entry(self, item, 1, blocking)
            entry.gates = self.gates
            self._exit(entry, len(self.gates), failed)
        elif self.policy.timeout is None and not self.gates_now():
            try:  # no gate to pass (a batch_api node's recorded or answered call): the call
                timing.start = time.perf_counter()
                value = await call()
                timing.end = time.perf_counter()
                return value
            except Exception as exc:  # retried below (its Entry takes no gate)
                entry = Entry(self, item, 1, blocking)
                entry.error = exc
        return await self._retrying(call, item, blocking, entry, timing)

    async def _retrying(self, call: Call, item: int | None, blocking: bool,
                        entry: Entry | None, timing: Attempts) -> Any:
        """Attempts after ``entry``'s failed one (None: from the first) until one succeeds
        or the error is final."""
        while True:
            if entry is not None:
                wait = self._retry(entry, entry.error)  # type: ignore[arg-type]  # an entry made here or kept after a failure has its error
                if wait > 0:
                    timing.waited += wait
                    await _sleep(wait, blocking)
            entry = Entry(self, item, 1 if entry is None else entry.attempt + 1, blocking)
            try:
                return await self._attempt(call, entry, timing)
            except Exception:
                pass  # entry.error holds it

    async def _attempt(self, call: Call, entry: Entry, timing: Attempts) -> Any:
        """The gates entered in order (``gates_now()``: a ``batch_api`` node's attempt that
        cannot go online takes its budget's only), the call, the gates exited the other way
        round."""
        gates, entered = self.gates_now(), 0
        entry.gates = gates
        try:
            for gate in gates:
                waited = await gate.enter(entry)
                entered += 1
                if waited:
                    timing.waited += waited
            if self.gauges:
                entry.before = dict(CALL.get() or {})
            timing.start = time.perf_counter()
            value = await (call() if self.policy.timeout is None else self._call(call, entry))
            timing.end = time.perf_counter()
            return value
        except BaseException as exc:
            entry.error = exc
            raise
        finally:
            self._exit(entry, entered, entry.error)

    def _exit(self, entry: Entry, entered: int, error: BaseException | None) -> None:
        """The first ``entered`` gates exited, last first (those that hold: by the thread of
        a sync call under a timeout, when ``handed`` to it)."""
        entry.error = error
        gates, handed = entry.gates, entry.handed
        if entered == len(gates) and not handed:  # the usual case
            for gate in reversed(gates):
                gate.exit(entry, error)
            return
        for i in range(entered - 1, -1, -1):
            gate = gates[i]
            if not (handed and gate.holds):
                gate.exit(entry, error)

    def _call(self, call: Call, entry: Entry) -> Awaitable[Any]:
        """The call under the node's timeout."""
        if entry.blocking or not awaits(self.node):  # sync: a thread, abandoned on timeout
            return self._in_thread(call, entry)
        return self._under_timeout(call, entry)

    async def _under_timeout(self, call: Call, entry: Entry) -> Any:
        timeout = self.policy.timeout
        try:
            async with asyncio.timeout(timeout) as scope:
                return await call()
        except TimeoutError:
            if not scope.expired():
                raise  # the node's own TimeoutError
            err = self._timeout_error(entry.item)
            entry.event("timeout", timeout or 0.0, str(err))
            raise err from None

    async def _in_thread(self, call: Call, entry: Entry) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()
        holding = tuple(g for g in entry.gates if g.holds)
        entry.handed = bool(holding)  # the thread exits them

        def work() -> None:
            error = None
            try:
                box["value"] = run_sync(call(), needs_loop=False)
            except BaseException as exc:  # handed to the caller
                box["error"] = error = exc
            finally:
                for gate in reversed(holding):
                    gate.exit(entry, error)
                done.set()

        ctx = contextvars.copy_context()
        threading.Thread(target=ctx.run, args=(work,), daemon=True,
                         name=f"hn-timeout-{self.policy.node}").start()
        if not done.wait(self.policy.timeout):
            err = self._timeout_error(entry.item)
            entry.event("timeout", self.policy.timeout or 0.0, str(err))
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

        def slow(item: int, args: tuple[Any, ...], failed: Exception | None) -> Any:
            timing = Attempts()
            value = call(lambda: fn(*args), item, failed, timing)
            if starts is not None:
                starts[item] = timing.start
            return value

        if not (self.policy.timeout or len(self.gates) > 1 or self.meters):
            holdoff = self.gates[0].holdoff  # type: ignore[attr-defined]  # the only gate

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
    if guard.policy.timeout is None and not guard.gates_now():
        return await guard.ungated(node, kwargs, item)
    timing = Attempts()
    value = await guard.run(lambda: call_node(node, kwargs, None), item, timing=timing)
    return value, timing.start


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
        guard = Guard(node, _reporter(emit, base, None), ctx.budget, kwargs)
        return await guard.run(lambda: call_node(node, kwargs, on_chunk), item,
                               blocking=not awaits(node), timing=timing)
    loop = asyncio.get_running_loop()  # parallel waves: keep the loop free, like _in_thread
    relay = None
    if on_chunk is not None:
        def relay(chunk: Any, index: int) -> None:
            loop.call_soon_threadsafe(on_chunk, chunk, index)

    guard = Guard(node, _reporter(emit, base, loop), ctx.budget, kwargs)
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
