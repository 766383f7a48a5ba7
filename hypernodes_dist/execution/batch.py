"""The shared plan executor: runs one batch of map items and returns a ``BatchResult``.

Every engine calls ``execute_batch`` — the local engine in the driver, a Dask task on a
worker, a Daft UDF on a partition — so all engines share one semantics and one cache-key
scheme. Three strategies, chosen by the plan:

- *item flow* (``flow.py``; acyclic plans with async nodes or waiting policies): each
  item walks the plan on its own, so an item that waits holds back no other;
- *columnar* (``columnar.py``; other acyclic plans, branches and gates decided per item):
  node by node over the whole batch, one C-level ``map`` per sync node; chained cache
  keys, so a warm batch fetches only its outputs;
- *per item* (here): the reactive ``Scheduler`` runs each item (cycles, interrupts, a
  gate that can ``END`` beside nodes unrelated to it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hypernodes_dist.cache.keys import Keys, WriteBuffer, batch_writes
from hypernodes_dist.errors import portable
from hypernodes_dist.events import RunEndEvent, RunStartEvent
from hypernodes_dist.execution.columnar import Columnar
from hypernodes_dist.execution.context import worker_id
from hypernodes_dist.execution.flow import ItemFlow
from hypernodes_dist.execution.job import BatchResult, BatchSettings, Chunk, Paused
from hypernodes_dist.execution.progress import ticker
from hypernodes_dist.execution.runstate import RunContext, RunState
from hypernodes_dist.execution.scheduler import Scheduler
from hypernodes_dist.execution.syncio import run_sync
from hypernodes_dist.missing import MISSING
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.usage import add_usage

__all__ = ["execute_batch", "run_batch"]

def execute_batch(
    plan: Plan, chunk: Chunk, settings: BatchSettings, writes: WriteBuffer | None = None
) -> BatchResult:
    """Run every item of ``chunk`` through ``plan``; see the module docstring.

    ``writes``: a cache write buffer shared by consecutive batches of one caller, who
    flushes it at the end (fewer, larger transactions); by default each batch has its own.
    """
    return run_sync(run_batch(plan, chunk, settings, writes),
                    needs_loop=plan.is_async or plan.flows)


async def run_batch(
    plan: Plan, chunk: Chunk, settings: BatchSettings, writes: WriteBuffer | None = None
) -> BatchResult:
    """``execute_batch`` as a coroutine, for callers already inside an event loop."""
    with batch_writes(settings.cache, writes) as buffer:
        if plan.flows:
            result = await ItemFlow(plan, chunk, settings, buffer).run()
        elif plan.columnar:
            result = await Columnar(plan, chunk, settings, buffer).run()
        else:
            result = await _per_item(plan, chunk, settings, buffer)
    result.worker = worker_id()
    result.run_prefix = settings.run_prefix
    if settings.progress is not None:
        ticker(settings.progress).tick(chunk.offset, chunk.n)
    return result


# ============================================================================ per item


async def _per_item(
    plan: Plan, chunk: Chunk, settings: BatchSettings, writes: WriteBuffer | None
) -> BatchResult:
    keys = Keys(plan, settings.cache) if settings.cache is not None else None
    wanted = settings.select or plan.outputs
    result = BatchResult(chunk.offset, chunk.n, {k: [MISSING] * chunk.n for k in wanted})
    result.histories = [[] for _ in range(chunk.n)]
    running: dict[str, Any] | None = {} if keys is not None and plan.is_async else None
    ticks = ticker(settings.progress) if settings.progress is not None else None
    finished, metered = 0, {}

    async def one(i: int) -> None:
        nonlocal finished
        index = chunk.offset + i
        run_id = settings.run_id(index)
        emit = result.events.append if settings.want_events else None
        state = RunState.start(chunk.item(i))
        if settings.responses:
            state.responses.update(settings.responses)
        ctx = RunContext(settings.session_id, run_id, emit=emit, keys=keys, writes=writes,
                         item_index=index, running=running, handlers=settings.handlers or {},
                         budget=settings.budget)
        t0 = time.perf_counter()
        if emit:
            emit(RunStartEvent(session_id=settings.session_id, run_id=run_id, item_index=index,
                               inputs=dict(state.values), graph_id=plan.graph_hash))
        error = None
        try:
            await Scheduler(plan, state, ctx).run()
        except Exception as exc:
            error = _fail(exc, settings)
            result.errors[i] = error
        if state.pending_interrupt is not None:  # a nested graph's run (map rejects these)
            pending = state.pending_interrupt
            result.paused[i] = Paused(pending, state.pending_value if pending not in plan.by_name
                                else state.values.get(plan.by_name[pending].params[0]))
        for k, col in result.outputs.items():
            col[i] = state.values.get(k, MISSING) if k in state.produced else MISSING
        if settings.select is not None:  # history carries the outputs the map returns
            for execution in state.history:
                execution.outputs = {k: v for k, v in execution.outputs.items() if k in wanted}
        result.histories[i] = state.history  # type: ignore[index]
        result.executed += sum(1 for h in state.history if not h.cached)
        result.hits += sum(1 for h in state.history if h.cached)
        if emit:
            emit(RunEndEvent(session_id=settings.session_id, run_id=run_id, item_index=index,
                             status="error" if error else "interrupted" if state.pending_interrupt else "complete",
                             error=error,
                             outputs=state.outputs(), duration_ms=(time.perf_counter() - t0) * 1e3))
        finished += 1
        if ticks is not None:
            for execution in state.history:
                add_usage(metered, execution.usage or {})
            ticks.tick(chunk.offset, finished, metered)

    if plan.is_async:
        sem = asyncio.Semaphore(settings.concurrency or chunk.n)

        async def bounded(i: int) -> None:
            async with sem:
                await one(i)

        await asyncio.gather(*(bounded(i) for i in range(chunk.n)))
    else:
        for i in range(chunk.n):
            await one(i)
    return result


def _fail(exc: BaseException, settings: BatchSettings) -> BaseException:
    if settings.on_error == "raise":
        raise exc
    return portable(exc)


# ============================================================================ columnar
