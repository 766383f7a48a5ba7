"""The call guard: applies a node's ``Policy`` (retries, backoff, timeout, concurrency and
rate limits) around each call of it; see ``hypernodes_dist.policies``.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, NamedTuple

from hypernodes_dist.events import PolicyEvent
from hypernodes_dist.execution.invoke import call_node
from hypernodes_dist.execution.syncio import run_sync
from hypernodes_dist.policies.limits import limiter, record
from hypernodes_dist.policies.spec import NodeTimeoutError, Policy, backoff_delay

__all__ = ["Guard", "guarded_call", "awaits"]

Report = Callable[[Any], Any]


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_POLL_MIN, _POLL_MAX = 0.001, 0.025


class _Sleep(NamedTuple):
    """Effect: wait ``seconds`` (``time.sleep`` / ``asyncio.sleep``)."""

    seconds: float


class _Block(NamedTuple):
    """Effect: call ``fn()``, which blocks (in place / in a worker thread); its value is sent back."""

    fn: Callable[[], Any]


class _Invoke(NamedTuple):
    """Effect: one attempt of the node call, holding ``token`` (a concurrency slot or None,
    released by the driver when the call really ends); its value or error is sent back."""

    token: Any
    attempt: int


Steps = Generator["_Sleep | _Block | _Invoke", Any, Any]


def _acquire(slots: Any) -> Steps:
    """A concurrency slot: ``(token, seconds waited)``; blocks, or polls with backoff."""
    token = slots.try_acquire()
    if token is not None:
        return token, 0.0
    t0 = time.perf_counter()
    if getattr(slots, "acquire", None) is not None:
        return (yield _Block(slots.acquire)), time.perf_counter() - t0
    poll = _POLL_MIN
    while True:
        yield _Sleep(poll * random.uniform(0.5, 1.0))
        token = slots.try_acquire()
        if token is not None:
            return token, time.perf_counter() - t0
        poll = min(_POLL_MAX, poll * 2)


# ============================================================================ the guard


class Guard:
    """Applies one node's policy to its calls (one per node per batch, or per scheduler call).

    ``report(event)`` receives each ``PolicyEvent`` (the caller fills in the run ids).
    """

    def __init__(self, node: Any, report: Report | None = None) -> None:
        self.node = node
        self.policy: Policy = node.policy
        self.report = report
        p = self.policy
        self.slots = limiter("slots", p.node, p.concurrency) if p.concurrency else None
        self.rate = limiter("rate", p.node, *p.rate) if p.rate else None

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

    def _give_up(self, exc: BaseException, attempt: int) -> BaseException:
        exc.hn_attempts = attempt  # type: ignore[attr-defined]
        if self.policy.retries:
            try:
                exc.add_note(f"hypernodes retries: gave up after {attempt} attempts "
                             f"(retries={self.policy.retries}); this is the last attempt's error")
            except AttributeError:
                pass
        return exc

    def _retry(self, exc: Exception, item: int | None, attempt: int) -> float:
        if attempt > self.policy.retries:
            raise self._give_up(exc, attempt)
        wait = backoff_delay(self.policy.backoff, attempt)
        self._event("retry", item, attempt, wait, _describe(exc))
        return wait

    # -- one guarded call, as effects (the sync and async drivers below perform them) -----
    def _steps(self, item: int | None, failed: Exception | None) -> Steps:
        """Attempts until one succeeds or retries run out (``failed``: a first attempt's
        error, already made by the caller)."""
        attempt, error = (1, failed) if failed is not None else (0, None)
        while True:
            if error is not None:
                wait = self._retry(error, item, attempt)  # raises once out of attempts
                if wait > 0:
                    yield _Sleep(wait)
            attempt += 1
            try:
                return (yield from self._attempt(item, attempt))
            except Exception as exc:
                error = exc

    def _attempt(self, item: int | None, attempt: int) -> Steps:
        """Concurrency slot -> rate-limit reservation -> the call."""
        p, slots, token = self.policy, self.slots, None
        if slots is not None:
            token, waited = yield from _acquire(slots)
            if waited > 0:
                self._event("throttle", item, attempt, waited, f"concurrency={p.concurrency}")
        try:
            if self.rate is not None:
                wait = self.rate.reserve()
                if wait > 0:
                    self._event("throttle", item, attempt, wait, f"rate_limit={p.rate_text}")
                    yield _Sleep(wait)
            held, token = token, None  # from here on the driver releases it
            return (yield _Invoke(held, attempt))
        finally:
            if token is not None:
                slots.release(token)  # type: ignore[union-attr]

    def _release(self, token: Any) -> None:
        if token is not None:
            self.slots.release(token)  # type: ignore[union-attr]

    # -- drivers: one loop, effects performed blocking (sync) or awaited (async) -------------
    async def _drive(self, steps: Steps, perform: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run ``steps`` to its result, performing each effect with ``perform``."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as done:
                return done.value
            reply, error = None, None
            try:
                reply = await perform(effect)
            except Exception as exc:
                error = exc

    def call(self, thunk: Callable[[], Any], item: int | None = None,
             failed: Exception | None = None) -> Any:
        """Run ``thunk()`` (one call of the node) under the policy; blocking waits.

        ``failed``: the error of a first attempt the caller already made.
        """
        async def perform(effect: Any) -> Any:  # never suspends: driven without a loop
            if type(effect) is _Sleep:
                return time.sleep(effect.seconds)
            if type(effect) is _Block:
                return effect.fn()
            return self._invoke(thunk, item, effect)

        return run_sync(self._drive(self._steps(item, failed), perform), needs_loop=False)

    def _invoke(self, thunk: Callable[[], Any], item: int | None, effect: _Invoke) -> Any:
        if self.policy.timeout is None:
            try:
                return thunk()
            finally:
                self._release(effect.token)
        return self._in_thread(thunk, item, effect.attempt, effect.token)

    def positional(self, fn: Callable[..., Any], items: Any) -> Callable[..., Any]:
        """``fn`` (positional arguments, one call per item in ``items`` order) guarded."""
        nxt = iter(items).__next__
        call = self.call
        p = self.policy
        if p.timeout is None and self.slots is None and self.rate is None:
            def retried(*args: Any) -> Any:  # retries only: the first attempt is a plain call
                item = nxt()
                try:
                    return fn(*args)
                except Exception as exc:
                    return call(lambda: fn(*args), item, exc)

            return retried

        def guarded(*args: Any) -> Any:
            return call(lambda: fn(*args), nxt())

        return guarded

    def _in_thread(self, thunk: Callable[[], Any], item: int | None, attempt: int,
                   token: Any) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = thunk()
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            finally:
                self._release(token)
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

    async def acall(self, athunk: Callable[[], Awaitable[Any]], item: int | None = None) -> Any:
        """Await ``athunk()`` (one call of the node) under the policy."""
        async def perform(effect: Any) -> Any:
            if type(effect) is _Sleep:
                return await asyncio.sleep(effect.seconds)
            if type(effect) is _Block:
                return await asyncio.to_thread(effect.fn)
            return await self._ainvoke(athunk, item, effect)

        return await self._drive(self._steps(item, None), perform)

    async def _ainvoke(self, athunk: Callable[[], Awaitable[Any]], item: int | None,
                       effect: _Invoke) -> Any:
        timeout = self.policy.timeout
        try:
            if timeout is None:
                return await athunk()
            try:
                async with asyncio.timeout(timeout) as scope:
                    return await athunk()
            except TimeoutError:
                if not scope.expired():
                    raise  # the node's own TimeoutError
                err = self._timeout_error(item)
                self._event("timeout", item, effect.attempt, timeout, str(err))
                raise err from None
        finally:
            self._release(effect.token)


def awaits(node: Any) -> bool:
    """Whether calling ``node`` may suspend (async functions, async/lazy streams)."""
    return bool(node.is_async or (node.streaming and not node.is_generator))


async def guarded_call(node: Any, kwargs: dict[str, Any], on_chunk: Any, ctx: Any,
                       base: dict[str, Any]) -> Any:
    """The scheduler's call of a policy node (``run``/``iter``/per-item ``map``).

    ``ctx`` is the run's ``RunContext``; ``base`` the event fields of this execution.
    """
    emit = ctx.emit
    item = ctx.item_index
    if awaits(node):
        report = _reporter(emit, base, None)
        return await Guard(node, report).acall(lambda: call_node(node, kwargs, on_chunk), item)
    if not ctx.parallel:  # sync graph driven without a loop: blocking waits, no suspension
        guard = Guard(node, _reporter(emit, base, None))
        return guard.call(lambda: run_sync(call_node(node, kwargs, on_chunk), needs_loop=False),
                          item)
    loop = asyncio.get_running_loop()  # parallel waves: keep the loop free, like _in_thread
    relay = None
    if on_chunk is not None:
        def relay(chunk: Any, index: int) -> None:
            loop.call_soon_threadsafe(on_chunk, chunk, index)

    guard = Guard(node, _reporter(emit, base, loop))
    return await asyncio.to_thread(
        guard.call, lambda: run_sync(call_node(node, kwargs, relay), needs_loop=False), item
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
