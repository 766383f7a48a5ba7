"""The reactive scheduler: the reference semantics of one run.

A node runs when all its inputs are available and, if it is a branch/gate target, when it
has a pending activation (one activation, one run). A node that is not a target runs again
whenever an input it consumes has been written since its last run. Ready nodes run in
*waves*: the ready nodes none of whose ancestors is ready, in plan order (concurrently with
``parallel``, sharing one ``step_index``). A gate that can ``END`` is left out of a wave
while other nodes are ready, so every node reading the current values has run when it ends
the run (outputs at ``END`` agree with each other). A consumer whose produced input is
absent but has a default waits until nothing else can run, then uses the default. ``END``
stops the run; an interrupt with no response pauses it with its state intact.

The scheduler is one coroutine for sync and async callers: with sync nodes and no
parallelism it never suspends, so ``run()`` drives it without an event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from hypernodes_dist.cache.keys import scope_token
from hypernodes_dist.errors import GateDecisionError, MaxIterationsError, NestedPause, annotate
from hypernodes_dist.events import (
    GateDecisionEvent,
    InterruptEvent,
    NodeEndEvent,
    NodeErrorEvent,
    NodeSkippedEvent,
    NodeStartEvent,
    ResumeEvent,
    StateDeltaEvent,
    StreamingChunkEvent,
    StreamingEndEvent,
    StreamingStartEvent,
)
from hypernodes_dist.execution.cacheview import CacheView
from hypernodes_dist.execution.context import PARENT, Parent, worker_id
from hypernodes_dist.execution.guard import Attempts, guarded_call
from hypernodes_dist.execution.invoke import call_node, split_outputs
from hypernodes_dist.execution.runstate import RunContext, RunState
from hypernodes_dist.execution.statesync import delta_ops
from hypernodes_dist.execution.syncio import run_sync
from hypernodes_dist.missing import MISSING
from hypernodes_dist.nodes import END, BranchNode, GateNode, HyperNode, InterruptNode
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.usage import Metering
from hypernodes_dist.results import NodeExecution

__all__ = ["Scheduler", "decision_target", "validate_response"]


class Scheduler:
    """Runs one ``RunState`` of one ``Plan`` until it completes, ends, or is interrupted."""

    def __init__(self, plan: Plan, state: RunState, ctx: RunContext) -> None:
        self.plan = plan
        self.state = state
        self.ctx = ctx
        self._token = (
            scope_token(ctx.keys.scope, ctx.session_id, ctx.run_id) if ctx.keys else None
        )
        self._pool: ThreadPoolExecutor | None = None
        self._started = False
        self.view = CacheView(ctx.keys.cache if ctx.keys else None, ctx.writes, ctx.running)

    # ------------------------------------------------------------------ the loop
    async def run(self) -> None:
        """Execute waves until nothing is ready, ``END``, or a pending interrupt."""
        state = self.state
        try:
            while not state.ended and state.pending_interrupt is None:
                wave = self._wave()
                if not wave:
                    return
                if self.ctx.parallel and len(wave) > 1:
                    self._boundary()
                    await self._run_parallel(wave)
                    continue
                for node in wave:
                    self._boundary()
                    await self._execute(node, state.step_index, 0)
                    state.step_index += 1
                    if state.ended or state.pending_interrupt is not None:
                        return
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)

    def _boundary(self) -> None:
        """A step boundary before more work: ``on_step`` (checkpointing), not before the first."""
        if self.ctx.on_step is not None:
            if self._started:
                self.ctx.on_step()
            self._started = True

    def _wave(self) -> list[HyperNode]:
        ready = [i for i, n in enumerate(self.plan.nodes) if self._ready(n, deferred=False)]
        if not ready:
            ready = [i for i, n in enumerate(self.plan.nodes) if self._ready(n, deferred=True)]
        enders = self.plan.enders
        if enders and len(ready) > 1:  # a gate that can END decides on settled values
            others = [i for i in ready if not enders >> i & 1]
            ready = others or ready
        mask = 0
        for i in ready:
            mask |= 1 << i
        ancestors = self.plan.ancestors
        return [self.plan.nodes[i] for i in ready if not ancestors[i] & mask]

    def _ready(self, node: HyperNode, deferred: bool) -> bool:
        state = self.state
        name = node.name
        if name in self.plan.gated:
            if state.activations.get(name, 0) <= 0:
                return False
        elif name in state.counts and self._versions(node) == state.seen.get(name):
            return False
        values = state.values
        producers = self.plan.producers
        for p in node.params:
            if p in values:
                continue
            if p in producers and not (deferred and p in node.defaults):
                return False
            if p not in producers and p not in node.defaults:
                return False
        return True

    def _versions(self, node: HyperNode) -> tuple[int, ...]:
        versions = self.state.versions
        return tuple(versions.get(p, 0) for p in node.params)

    def _kwargs(self, node: HyperNode) -> dict[str, Any]:
        values = self.state.values
        return {p: values[p] if p in values else node.defaults[p] for p in node.params}

    async def _run_parallel(self, wave: list[HyperNode]) -> None:
        step = self.state.step_index
        results = await asyncio.gather(
            *(self._execute(n, step, i) for i, n in enumerate(wave)), return_exceptions=True
        )
        self.state.step_index += 1
        for r in results:
            if isinstance(r, BaseException):
                raise r

    # ------------------------------------------------------------------ one node
    async def _execute(self, node: HyperNode, step: int, parallel_index: int) -> None:
        state, name = self.state, node.name
        if node.kind == "interrupt":
            await self._interrupt(node, step)
            return
        iteration = state.counts.get(name, 0)
        if iteration >= self.plan.max_iterations:
            loop = self.plan.topology.cycle_of(name)
            raise MaxIterationsError(
                f"node {name!r} ran {iteration} times, the graph's max_iterations; the loop "
                f"through {', '.join(loop)} does not end",
                loop,
            )
        kwargs = self._kwargs(node)
        gated = name in self.plan.gated
        state.inflight[name] = (state.seen.get(name), iteration, gated)
        state.seen[name] = self._versions(node)
        state.counts[name] = iteration + 1
        if gated:
            state.activations[name] -= 1
        started = time.time()
        t0 = time.perf_counter()
        timing = Attempts()
        try:
            key = self._key(node)
            value = MISSING if key is None else await self._cached(name, key)
            cached = value is not MISSING
            if not cached:  # a cache hit does not start: it reports only its end
                self._emit_start(node, step, kwargs, iteration, parallel_index)
                value = await self._compute(node, kwargs, step, key, timing)
            outputs = self._apply(node, value, key, step)
        except NestedPause as pause:  # an interrupt inside a nested graph: pause this run too
            state.rollback(name)
            self._pause(node, step, pause)
            return
        except BaseException as exc:
            state.rollback(name)
            if isinstance(exc, Exception):
                annotate(exc, name, self.ctx.item_index)
                self._emit_error(node, step, exc, t0, started, iteration)
            raise
        del state.inflight[name]
        if timing.start:  # the successful attempt: waits not counted
            started, t0 = started + (timing.start - t0), timing.start
        duration = (time.perf_counter() - t0) * 1000
        usage = timing.usage or {}
        state.history.append(
            NodeExecution(name, step, iteration, parallel_index, key or "", outputs, cached,
                          duration, started, worker_id(), usage)
        )
        if self.ctx.emit is not None:
            self.ctx.emit(NodeEndEvent(
                **self._base(node, step), outputs=outputs, duration_ms=duration, cached=cached,
                iteration=iteration, parallel_index=parallel_index, started_at=started,
                worker=worker_id(), usage=dict(usage),
            ))

    async def _cached(self, name: str, key: str) -> Any:
        """The cached value of ``key`` (``MISSING``: compute it): in the cache, among the
        batch's unflushed writes, or computed right now by another item of the batch (its
        ``MISSING`` when that call failed: compute it here)."""
        value = self.view.get(name, key)
        if value is MISSING:
            value = await self.view.in_flight(key)
        return value

    async def _compute(self, node: HyperNode, kwargs: dict[str, Any], step: int,
                       key: str | None, timing: Attempts) -> Any:
        view = self.view
        if key is None or not view.begin(key):
            value = await self._call(node, kwargs, step, timing)
        else:  # identical items of one batch in flight together: the others wait for this one
            value = MISSING
            try:
                value = await self._call(node, kwargs, step, timing)
            finally:
                view.end(key, value)
        if key is not None:
            view.write(node.name, key, value)
        return value

    def _key(self, node: HyperNode) -> str | None:
        keys = self.ctx.keys
        if keys is None or not keys.cacheable(node):
            return None
        state = self.state
        ids = []
        for p in node.params:
            if p in state.values:
                ident = state.ids.get(p)
                if ident is None:
                    ident = state.ids[p] = keys.input_id(node, p, state.values[p])
                ids.append(ident)
            else:
                ids.append(keys.default_id(node, p))
        return keys.key(node, ids, self._token)

    async def _call(self, node: HyperNode, kwargs: dict[str, Any], step: int,
                    timing: Attempts) -> Any:
        emit = self.ctx.emit
        on_chunk = None
        if node.streaming and emit is not None:
            output = node.outputs[0] if node.outputs else ""
            emit(StreamingStartEvent(**self._base(node, step), output_name=output))

            def on_chunk(chunk: Any, index: int) -> Any:
                return emit(StreamingChunkEvent(
                    **self._base(node, step), output_name=output, chunk=chunk, chunk_index=index,
                ))

        nested = PARENT.set(self._parent()) if node.nests else None
        metering = Metering()  # what the call meters (a guard meters its own attempts)
        try:
            if node.guarded:  # retries, timeout, limits, usage: policies/
                value = await guarded_call(node, kwargs, on_chunk, self.ctx, self._base(node, step),
                                           timing)
            else:
                with metering:
                    if self.ctx.parallel and not node.is_async:
                        value = await self._in_thread(node, kwargs, on_chunk)
                    else:
                        value = await call_node(node, kwargs, on_chunk)
        finally:
            if nested is not None:
                PARENT.reset(nested)
            if metering.usage:
                timing.usage = metering.usage
        if node.streaming and emit is not None:
            emit(StreamingEndEvent(
                **self._base(node, step), output_name=node.outputs[0] if node.outputs else "",
                final_value=value,
            ))
        return value

    def _parent(self) -> Parent:
        """What a nested graph called by this run shares with it (``context.Parent``)."""
        ctx = self.ctx
        return Parent(ctx.emit, ctx.session_id, ctx.run_id,
                      ctx.keys.cache if ctx.keys is not None else None,
                      self.state.responses, ctx.handlers)

    async def _in_thread(self, node: HyperNode, kwargs: dict[str, Any], on_chunk: Any) -> Any:
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.ctx.max_workers, thread_name_prefix="hn-node")
        relay = None
        if on_chunk is not None:
            def relay(chunk: Any, index: int) -> None:
                loop.call_soon_threadsafe(on_chunk, chunk, index)

        def work() -> Any:
            return run_sync(call_node(node, kwargs, relay), needs_loop=False)

        return await loop.run_in_executor(self._pool, contextvars.copy_context().run, work)

    def _apply(self, node: HyperNode, value: Any, key: str | None, step: int) -> dict[str, Any]:
        """Write a node's result into the state: outputs, or a branch/gate decision."""
        if node.kind in ("branch", "gate"):
            self._decide(node, value, step)
            return {}
        state, keys = self.state, self.ctx.keys
        values = split_outputs(node, value)
        outputs = dict(zip(node.outputs, values))
        ops = delta_ops(state.values, outputs) if self.ctx.state_events else None
        for out, v in outputs.items():
            state.write(out, v, keys.output_id(key, out) if key is not None and keys else None)
        if ops:
            self._emit_delta(node, step, ops)
        return outputs

    def _emit_delta(self, node: HyperNode, step: int, ops: list[dict[str, Any]]) -> None:
        if self.ctx.emit is not None:
            self.ctx.emit(StateDeltaEvent(**self._base(node, step), operations=ops))

    def _decide(self, node: HyperNode, value: Any, step: int) -> None:
        chosen = decision_target(node, value)
        activated = () if chosen is END else (chosen,)
        for target in activated:
            self.state.activations[target] = self.state.activations.get(target, 0) + 1
        if chosen is END:
            self.state.ended = True
        emit = self.ctx.emit
        if emit is None:
            return
        emit(GateDecisionEvent(
            **self._base(node, step), gate_id=node.name, decision=value, activated_targets=activated,
        ))
        for target in node.targets:
            if target not in activated:
                emit(NodeSkippedEvent(
                    **self._base(self.plan.by_name[target], step),
                    reason=f"{node.kind} {node.name!r} chose {chosen!r}", skipped_by=node.name,
                ))

    async def _interrupt(self, node: HyperNode, step: int) -> None:
        state, name = self.state, node.name
        asks = cast(InterruptNode, node)
        value = state.values[asks.input_param]
        response = state.responses.pop(name, MISSING)
        emit = self.ctx.emit
        if response is not MISSING and emit is not None:
            emit(ResumeEvent(**self._base(node, step), interrupt_name=name, response_value=response))
        if response is MISSING and name in self.ctx.handlers:
            response = self.ctx.handlers[name](value)
            if inspect.isawaitable(response):
                response = await response
        if response is MISSING:
            state.pending_interrupt = name
            if emit is not None:
                emit(InterruptEvent(**self._base(node, step), interrupt_name=name, value=value,
                                    checkpoint_id=self.ctx.pause_checkpoint_id))
            return
        response = validate_response(node, response)
        state.seen[name] = self._versions(node)
        state.counts[name] = state.counts.get(name, 0) + 1
        if name in self.plan.gated:
            state.activations[name] -= 1
        outputs = {asks.response_param: response}
        ops = delta_ops(state.values, outputs) if self.ctx.state_events else None
        state.write(asks.response_param, response, None)
        if ops:
            self._emit_delta(node, step, ops)
        state.history.append(NodeExecution(name, step, state.counts[name] - 1, 0, "", outputs))
        if emit is not None:
            emit(NodeEndEvent(**self._base(node, step), outputs=outputs,
                              iteration=state.counts[name] - 1))

    def _pause(self, node: HyperNode, step: int, pause: NestedPause) -> None:
        """Pause at ``pause.name``; the nested node runs again (answered) on resume."""
        self.state.pending_interrupt = pause.name
        self.state.pending_value = pause.value
        if self.ctx.emit is not None:
            self.ctx.emit(InterruptEvent(**self._base(node, step), interrupt_name=pause.name,
                                         value=pause.value,
                                         checkpoint_id=self.ctx.pause_checkpoint_id))

    # ------------------------------------------------------------------ events
    def _base(self, node: HyperNode, step: int) -> dict[str, Any]:
        ctx = self.ctx
        return {
            "session_id": ctx.session_id,
            "run_id": ctx.run_id,
            "node_id": node.name,
            "step_index": step,
            "tags": node.tags,
            "parent_run_id": ctx.parent_run_id,
            "item_index": ctx.item_index,
        }

    def _emit_start(self, node: HyperNode, step: int, kwargs: dict[str, Any], iteration: int,
                    parallel_index: int) -> None:
        if self.ctx.emit is not None:
            self.ctx.emit(NodeStartEvent(
                **self._base(node, step), inputs=kwargs, node_type=node.kind,
                iteration=iteration, parallel_index=parallel_index,
            ))

    def _emit_error(self, node: HyperNode, step: int, exc: BaseException, t0: float,
                    started: float, iteration: int) -> None:
        if self.ctx.emit is not None:
            self.ctx.emit(NodeErrorEvent(
                **self._base(node, step), error=exc, iteration=iteration, started_at=started,
                duration_ms=(time.perf_counter() - t0) * 1000, worker=worker_id(),
            ))


def decision_target(node: HyperNode, value: Any) -> str:
    """The target a branch/gate decision activates (``END`` for a gate that ends the run);
    ``GateDecisionError`` when the value is not a valid decision of that node."""
    if node.kind == "branch":
        if not isinstance(value, bool) and type(value).__name__ != "bool_":
            raise GateDecisionError(
                f"branch {node.name!r} must return a bool, got {type(value).__name__}: {value!r}"
            )
        branch = cast(BranchNode, node)
        return branch.when_true if value else branch.when_false
    choices = cast(GateNode, node).choices
    if value in choices:
        return END if value == END else value
    allowed = ", ".join(repr(c) for c in choices)
    if value is END or value == END:
        raise GateDecisionError(
            f"gate {node.name!r} returned END, which is not one of its declared targets "
            f"({allowed}); add END to its Literal[...] (or to gate(targets=[...])) to let it "
            "end the run"
        )
    raise GateDecisionError(
        f"gate {node.name!r} returned {value!r}, which is not one of its targets ({allowed})"
    )


def validate_response(node: HyperNode, response: Any) -> Any:
    expected = getattr(node, "response_type", None)
    if expected is None or not isinstance(expected, type) or isinstance(response, expected):
        return response
    if isinstance(response, dict):
        try:
            return expected(**response)
        except TypeError:
            pass
    raise TypeError(
        f"interrupt {node.name!r} expects a response of type {expected.__name__} for "
        f"{cast(InterruptNode, node).response_param!r}, got {type(response).__name__}: "
        f"{response!r}"
    )
