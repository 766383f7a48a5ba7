"""``Graph``: a validated set of nodes, wired by parameter names, with run/map/iter."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from hypernodes_dist.cache.base import Cache
from hypernodes_dist.engines import resolve
from hypernodes_dist.engines.base import Engine
from hypernodes_dist.execution.runstate import RunState
from hypernodes_dist.execution.syncio import on_process_loop, run_sync
from hypernodes_dist.inputs import (
    check_inputs,
    check_on_error,
    check_select,
    new_run_id,
    new_session_id,
)
from hypernodes_dist.nodes import HyperNode
from hypernodes_dist.plan import Plan, compile_plan
from hypernodes_dist.resources import Resource
from hypernodes_dist.resources.bind import bind_resources, split_resources
from hypernodes_dist.results import GraphResult
from hypernodes_dist.run.checkpoint import Checkpoint, restore
from hypernodes_dist.run.graphrun import GraphRun
from hypernodes_dist.run.maprun import reject_interrupts, run_map
from hypernodes_dist.run.nested import graph_node
from hypernodes_dist.run.runner import LocalRun, responses_for
from hypernodes_dist.visualize import visualize

__all__ = ["Graph"]


class Graph:
    """Nodes wired by parameter names; invalid graphs raise ``ValueError`` subclasses here."""

    def __init__(
        self,
        nodes: Sequence[HyperNode | Resource],
        engine: Engine | str | None = None,
        cache: Cache | None = None,
        callbacks: Sequence[Any] | None = None,
        checkpointer: Any = None,
        *,
        max_iterations: int = 1000,
        name: str | None = None,
    ) -> None:
        plain, resources = split_resources(nodes)
        self.nodes: tuple[HyperNode, ...] = tuple(plain)
        self.resources: tuple[Resource, ...] = tuple(resources.values())
        self.plan: Plan = compile_plan(bind_resources(plain, resources), max_iterations,
                                       tuple(resources))
        self.engine: Engine = resolve(engine)
        self.cache = cache
        self.callbacks: list[Any] = list(callbacks or [])
        self.checkpointer = checkpointer
        self.name = name or "graph"
        self.handlers: dict[str, Callable[[Any], Any]] = {}

    # ------------------------------------------------------------------ structure
    @property
    def inputs(self) -> tuple[str, ...]:
        """Parameters no node produces (required and optional)."""
        return self.plan.inputs

    @property
    def required_inputs(self) -> tuple[str, ...]:
        """Inputs some node needs without a default."""
        return self.plan.required

    @property
    def outputs(self) -> tuple[str, ...]:
        """Every name some node produces, in execution order."""
        return self.plan.outputs

    @property
    def graph_hash(self) -> str:
        return self.plan.graph_hash

    def __repr__(self) -> str:
        return f"Graph({[n.name for n in self.plan.nodes]}, engine={self.engine!r})"

    def visualize(self, path: Any = None, format: str | None = None, direction: str = "TD") -> Any:
        """The static graph as Mermaid text (default), DOT, or SVG/PNG via Graphviz when
        available; written to ``path`` when given (see ``hypernodes_dist.visualize``)."""
        return visualize(self, path, format, direction)

    # ------------------------------------------------------------------ interrupts
    def on_interrupt(self, name: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
        """Register a handler (sync or async) answering the interrupt called ``name``."""
        known = {n.name for n in self.plan.interrupts}
        if name not in known:
            raise ValueError(
                f"no interrupt named {name!r}; interrupts: {', '.join(sorted(known)) or 'none'}"
            )

        def register(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
            self.handlers[name] = fn
            return fn

        return register

    # ------------------------------------------------------------------ run
    def run(
        self,
        inputs: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        checkpoint: Checkpoint | None = None,
        resume: bool = False,
        handlers: Mapping[str, Callable[[Any], Any]] | None = None,
        select: Iterable[str] | None = None,
        on_error: str = "raise",
    ) -> GraphResult:
        """Run the graph once and return its ``GraphResult`` (sync and async nodes alike)."""
        return run_sync(
            self.arun(inputs, session_id, checkpoint, resume, handlers, select, on_error),
            needs_loop=self._needs_loop,
        )

    @property
    def _needs_loop(self) -> bool:
        """Whether a run may suspend (async nodes, parallel waves, interrupt handlers)."""
        return self.plan.is_async or self.engine.parallel_nodes or bool(self.plan.interrupts)

    async def arun(
        self,
        inputs: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        checkpoint: Checkpoint | None = None,
        resume: bool = False,
        handlers: Mapping[str, Callable[[Any], Any]] | None = None,
        select: Iterable[str] | None = None,
        on_error: str = "raise",
    ) -> GraphResult:
        """The async twin of ``run``. Its async calls run on the process loop (one loop per
        process, ``execution.syncio``), whichever loop awaits it."""
        run = self._prepare(inputs, session_id, checkpoint, resume, handlers, select, on_error)
        if self._needs_loop:
            return await on_process_loop(run.execute())
        return await run.execute()

    # ------------------------------------------------------------------ iter
    def iter(
        self,
        inputs: Mapping[str, Any] | None = None,
        checkpoint: Checkpoint | None = None,
        resume: bool = False,
        session_id: str | None = None,
        *,
        handlers: Mapping[str, Callable[[Any], Any]] | None = None,
        select: Iterable[str] | None = None,
    ) -> GraphRun:
        """Interactive run: ``async with graph.iter(...) as run: async for event in run: ...``"""
        if not getattr(self.engine, "supports_iter", False):
            raise TypeError(
                f"{type(self.engine).__name__} (engine {getattr(self.engine, 'name', '?')!r}) "
                "cannot stream events: iter() runs on GraphEngine only; use run() or map() here"
            )
        run = self._prepare(inputs, session_id, checkpoint, resume, handlers, select, "raise")
        return GraphRun(run)

    def _prepare(
        self,
        inputs: Mapping[str, Any] | None,
        session_id: str | None,
        checkpoint: Checkpoint | None,
        resume: bool,
        handlers: Mapping[str, Callable[[Any], Any]] | None,
        select: Iterable[str] | None,
        on_error: str,
        sink: Callable[[Any], Any] | None = None,
    ) -> LocalRun:
        """A ``LocalRun``: fresh, or continuing ``checkpoint`` / the session's latest one."""
        inputs = dict(inputs or {})
        select_t = check_select(self.plan, select)
        check_on_error(on_error)
        if checkpoint is None and resume:
            checkpoint = self._latest_checkpoint(session_id)
            if checkpoint is not None and checkpoint.status == "complete":
                checkpoint = None  # the session's last run finished: a fresh run
        if checkpoint is not None:
            state, session, run_id = self._continue(checkpoint, inputs)
        else:
            responses = {n.response_param for n in self.plan.interrupts}
            check_inputs(self.plan, inputs, allowed=responses)
            answers = responses_for(self, {k: v for k, v in inputs.items() if k in responses})
            state = RunState.start({k: v for k, v in inputs.items() if k not in responses})
            state.responses.update(answers)
            session, run_id = session_id or new_session_id(), new_run_id()
        return LocalRun(self, state, session_id=session, run_id=run_id, handlers=handlers,
                        select=select_t, on_error=on_error, sink=sink)

    def _continue(
        self, checkpoint: Checkpoint, inputs: dict[str, Any]
    ) -> tuple[RunState, str, str]:
        if checkpoint.graph_hash != self.plan.graph_hash:
            raise ValueError(
                f"checkpoint {checkpoint.checkpoint_id} was taken from a different graph (the "
                "graph changed since: nodes, wiring or targets differ); it cannot be resumed"
            )
        state = restore(checkpoint)
        state.responses.update(responses_for(self, inputs))
        return state, checkpoint.session_id, checkpoint.run_id

    def _latest_checkpoint(self, session_id: str | None) -> Checkpoint | None:
        if session_id is None:
            raise ValueError("resume=True needs the session_id whose latest checkpoint to load")
        if self.checkpointer is None:
            raise ValueError("resume=True needs a checkpointer: Graph(..., checkpointer=...)")
        return self.checkpointer.load_latest(session_id)

    # ------------------------------------------------------------------ nesting
    def as_node(
        self,
        name: str | None = None,
        map_over: str | Sequence[str] | None = None,
        map_mode: str = "zip",
        inputs: Mapping[str, str] | None = None,
        outputs: Mapping[str, str] | None = None,
    ) -> HyperNode:
        """This graph as a node of another graph.

        ``inputs``/``outputs`` rename as ``{outer: inner}`` (``outputs`` also limits what the
        node exposes; default: every inner output). With ``map_over`` (inner input names),
        the inner graph runs once per element and each output becomes a list in element
        order (an empty list in gives empty lists out). Inner failures fail the outer item,
        so they follow the outer ``on_error``.
        """
        return graph_node(self, name, map_over, map_mode, inputs, outputs)

    # ------------------------------------------------------------------ map
    def map(
        self,
        inputs: Mapping[str, Any] | None = None,
        map_over: str | Iterable[str] | None = None,
        map_mode: str = "zip",
        session_id: str | None = None,
        select: Iterable[str] | None = None,
        on_error: str = "raise",
        progress: bool = False,
        *,
        source: Any = None,
        columns: Mapping[str, str] | None = None,
        keep: Sequence[str] = (),
        into: Any = None,
        overwrite: bool = False,
        commit_seconds: float | None = None,
        budget: Mapping[str, float] | None = None,
        on_budget: Callable[[str, float, float], float | None] | None = None,
        wait: bool = True,
    ) -> Any:
        """Run the graph once per item (each its own run, all sharing one session); a graph
        with an ``InterruptNode`` raises ``TypeError``. The README details each argument. Args:
            inputs: ``{name: value}``; names in ``map_over`` hold one value per item, the
                others are broadcast. map_over: the name(s) to map over (not with source).
            map_mode: ``"zip"`` or ``"product"``. session_id: every item's session.
            select: outputs to return. progress: show a progress bar.
            on_error: ``"raise"`` (the first failure, noted with node and item) or
                ``"collect"`` (failed items come back with ``status == "error"``).
            source: rows are items (Parquet path/URI, Arrow, pandas, Dask or Daft frame).
            columns: ``{graph input: source column}``. keep: source columns to copy.
            into: write Parquet files there (a rerun computes what has no file yet).
            overwrite: replace another map's files. commit_seconds: at most this long a
                finished row waits for its file. budget: ``{quantity: max}`` metered by
                this map (0: no metered call starts). on_budget: ``ask(quantity, spent,
                limit)`` in the driver when spent: a new limit, or ``None`` to stop.
            wait: with ``batch_api`` nodes, ``False`` returns once every request is
                submitted (``.pending`` rows wait; rerun the same map to collect).

        Returns a ``MapResult`` (a ``GraphResult`` per item, in item order), or with
        ``into`` a ``DatasetResult``.
        """
        reject_interrupts(self.plan)  # also for dataset maps (source=, into=)
        _check_map_form(source, map_over, map_mode, columns, keep, into, overwrite,
                        commit_seconds)
        common: dict[str, Any] = dict(
            session_id=session_id, select=select, on_error=on_error, progress=progress,
            cache=self.cache, callbacks=self.callbacks, budget=budget,
            on_budget=on_budget, wait=wait)
        if into is not None or source is not None:
            # pyarrow (and pandas/dask/daft for their sources) load only for dataset maps
            from hypernodes_dist.run.datasetrun import read_columns, run_dataset
            if into is not None:
                return run_dataset(
                    self.plan, self.engine, source=source, inputs=inputs, map_over=map_over,
                    map_mode=map_mode, columns=columns, keep=keep, into=into,
                    overwrite=overwrite, commit_seconds=commit_seconds, **common)
            mapped, broadcast = read_columns(self.plan, source, inputs or {}, columns)
            inputs, map_over = {**broadcast, **mapped}, list(mapped)
        return run_map(self.plan, self.engine, inputs, map_over,  # type: ignore[arg-type]  # None reaches run_map, which names what to pass
                       map_mode=map_mode, **common)


def _check_map_form(source: Any, map_over: Any, map_mode: str, columns: Any, keep: Any,
                    into: Any, overwrite: bool, commit_seconds: float | None) -> None:
    """``ValueError`` for keywords of ``map`` that do not go together."""
    if source is not None and (map_over is not None or map_mode != "zip"):
        raise ValueError(
            "map() takes map_over/map_mode or source=, not both: with a source every row "
            "is one item (rename columns with columns={input: column})")
    if source is None and map_over is None:
        raise ValueError("map() needs map_over (the inputs to map over) or source=")
    if into is None and keep:
        raise ValueError("keep= copies source columns into the rows written with "
                         "into=; without into= the results are a MapResult")
    if into is None and source is None and (columns is not None or overwrite):
        raise ValueError("columns=, keep= and overwrite= apply to source= / into= maps")
    if into is None and commit_seconds is not None:
        raise ValueError("commit_seconds= applies to maps that write into= a directory")
