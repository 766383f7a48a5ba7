"""One run of a graph in this process: ``run()``/``arun()`` and the runs behind ``iter()``.

``LocalRun`` owns a ``RunState`` and drives the ``Scheduler`` over it; an interrupted run
keeps its state, so ``resume`` continues the same run (same ``run_id``) without re-running
completed nodes. ``run()``/``arun()`` call ``execute()``; ``iter()`` (``GraphRun``) calls its
parts: ``begin()`` once, ``advance()`` after each answer, ``finish()`` once. With a
checkpointer, the run saves a checkpoint at every step boundary after the first, at a pause,
on completion and on failure (durability is part of the run, not a callback).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from hypernodes_dist.cache.base import Cache
from hypernodes_dist.cache.keys import Keys
from hypernodes_dist.engines.base import Engine
from hypernodes_dist.events import Dispatcher, Event, RunEndEvent, RunStartEvent, StateSnapshotEvent
from hypernodes_dist.execution.runstate import RunContext, RunState
from hypernodes_dist.execution.scheduler import Scheduler
from hypernodes_dist.plan import Plan
from hypernodes_dist.results import GraphResult
from hypernodes_dist.run.checkpoint import Checkpoint, capture, new_checkpoint_id, refetch

__all__ = ["Interrupt", "LocalRun", "RunnableGraph", "responses_for"]


class RunnableGraph(Protocol):
    """What a run reads of its graph (``Graph`` is one): the plan, where and how it runs,
    and ``run`` to continue from a checkpoint (``GraphResult.resume``)."""

    plan: Plan
    engine: Engine
    cache: Cache | None
    callbacks: list[Any]
    checkpointer: Any
    handlers: dict[str, Callable[[Any], Any]]

    def run(self, inputs: Mapping[str, Any] | None = ..., *args: Any, **kwargs: Any) -> GraphResult:
        ...


@dataclass(frozen=True)
class Interrupt:
    """A pending interrupt: its ``name``, the ``value`` it surfaces and where the answer goes."""

    name: str
    value: Any
    response_param: str


def responses_for(graph: RunnableGraph, given: Mapping[str, Any]) -> dict[str, Any]:
    """``{response_param: value}`` -> ``{interrupt name: value}``; unknown names are errors."""
    by_param = {n.response_param: n.name for n in graph.plan.interrupts}
    unknown = [k for k in given if k not in by_param]
    if unknown:
        known = ", ".join(by_param) or "none"
        raise ValueError(
            f"{', '.join(map(repr, unknown))} answer(s) no interrupt; response parameters: {known}"
        )
    return {by_param[k]: v for k, v in given.items()}


class LocalRun:
    """A run of ``graph`` over ``state``; ``execute()`` runs it until it stops."""

    def __init__(
        self,
        graph: RunnableGraph,
        state: RunState,
        *,
        session_id: str,
        run_id: str,
        handlers: Mapping[str, Callable[[Any], Any]] | None = None,
        select: tuple[str, ...] | None = None,
        on_error: str = "raise",
        sink: Callable[[Event], Any] | None = None,
    ) -> None:
        self.graph = graph
        self.state = state
        self.session_id = session_id
        self.run_id = run_id
        self.handlers = {**graph.handlers, **(handlers or {})}
        self.select = select
        self.on_error = on_error
        self.sink = sink
        self._dispatch = Dispatcher(graph.callbacks)
        self.error: BaseException | None = None
        self.status: str | None = None  # None until the run first stops
        self.ctx: RunContext | None = None
        self._t0 = 0.0

    def emit(self, event: Event) -> Any:
        if self.graph.callbacks:
            self._dispatch(event)
        if self.sink is not None:
            return self.sink(event)
        return None

    def _emitter(self) -> Callable[[Event], Any] | None:
        return self.emit if (self.graph.callbacks or self.sink is not None) else None

    # ------------------------------------------------------------------ the three phases
    def begin(self) -> None:
        """Set up the run's context and announce it (``RunStartEvent``, ``StateSnapshotEvent``)."""
        graph, state = self.graph, self.state
        emit = self._emitter()
        engine = graph.engine
        self.ctx = RunContext(
            self.session_id,
            self.run_id,
            emit=emit,
            keys=Keys(graph.plan, graph.cache) if graph.cache is not None else None,
            handlers=self.handlers,
            parallel=engine.parallel_nodes,
            max_workers=engine.max_workers,
            state_events=emit is not None,
            on_step=self._on_step if graph.checkpointer is not None else None,
        )
        self._t0 = time.perf_counter()
        if emit:
            emit(RunStartEvent(session_id=self.session_id, run_id=self.run_id,
                               inputs=dict(state.values), graph_id=graph.plan.graph_hash,
                               step_index=state.step_index))
            emit(StateSnapshotEvent(session_id=self.session_id, run_id=self.run_id,
                                    state=dict(state.values), step_index=state.step_index))

    async def advance(self) -> str:
        """Run until nothing can run, ``END``, a pause or a failure; return the status.

        A failure is re-raised with ``on_error="raise"``; either way it is checkpointed.
        """
        state, ctx = self.state, self.ctx
        assert ctx is not None, "begin() first"
        state.pending_interrupt = None
        ctx.pause_checkpoint_id = new_checkpoint_id() if self.graph.plan.interrupts else None
        self.status = None
        try:
            await Scheduler(self.graph.plan, state, ctx).run()
        except Exception as exc:
            self.error, self.status = exc, "error"
            self._persist()
            if self.on_error == "raise":
                raise
            return "error"
        self.status = "interrupted" if state.pending_interrupt else "complete"
        self._persist()
        return self.status

    def finish(self, status: str | None = None) -> GraphResult:
        """Announce the end (``RunEndEvent``) and return the result."""
        status = status or self.status or "complete"
        self._end(self._emitter(), status, self.error)
        return self.result(status)

    async def execute(self) -> GraphResult:
        self.begin()
        try:
            status = await self.advance()
        except Exception as exc:
            self._end(self._emitter(), "error", exc)
            raise
        return self.finish(status)

    def _end(self, emit: Any, status: str, error: BaseException | None) -> None:
        if emit:
            emit(RunEndEvent(session_id=self.session_id, run_id=self.run_id, status=status,
                             outputs=self.state.outputs(), error=error,
                             step_index=self.state.step_index,
                             duration_ms=(time.perf_counter() - self._t0) * 1e3))

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self) -> Checkpoint:
        """The run as it stands, with only the values needed to resume."""
        status = self.status or "running"
        paused = status == "interrupted" and self.ctx is not None
        return capture(
            self.state, session_id=self.session_id, run_id=self.run_id,
            graph_hash=self.graph.plan.graph_hash, plan=self.graph.plan, status=status,
            checkpoint_id=self.ctx.pause_checkpoint_id if paused else None,  # type: ignore[union-attr]  # paused means self.ctx is not None
        )

    def _persist(self) -> None:
        if self.graph.checkpointer is not None:
            self.graph.checkpointer.save_checkpoint(self.checkpoint())

    def _on_step(self) -> None:
        self._persist()

    # ------------------------------------------------------------------ results
    def pending(self) -> Interrupt | None:
        name = self.state.pending_interrupt
        if name is None:
            return None
        node = self.graph.plan.interrupt(name)
        value = self.state.values.get(node.input_param) if name in self.graph.plan.by_name \
            else self.state.pending_value  # paused inside a nested graph
        return Interrupt(name, value, node.response_param)

    def result(self, status: str) -> GraphResult:
        state = self.state
        if state.dropped and self.graph.cache is not None:
            refetch(self.graph.plan, state, self.graph.cache, self.select)
        outputs = state.outputs()
        if self.select is not None:
            outputs = {k: outputs[k] for k in self.select if k in outputs}
        interrupt = self.pending() if status == "interrupted" else None
        return GraphResult(
            outputs,
            session_id=self.session_id,
            run_id=self.run_id,
            status=status,  # type: ignore[arg-type]  # status is one of GraphResult's literals
            history=list(state.history),
            error=self.error,
            interrupt=interrupt,
            checkpoint=self.checkpoint() if interrupt else None,
            resume=self._resume if interrupt else None,
        )

    def _resume(self, response: dict[str, Any]) -> GraphResult:
        return self.graph.run(response, checkpoint=self.checkpoint(),
                              session_id=self.session_id, handlers=self.handlers,
                              select=self.select, on_error=self.on_error)
