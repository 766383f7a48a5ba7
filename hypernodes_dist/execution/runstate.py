"""The state of one run (what a checkpoint keeps) and its per-run settings."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypernodes_dist.cache.keys import Keys, WriteBuffer
from hypernodes_dist.events import Event
from hypernodes_dist.results import NodeExecution

__all__ = ["RunState", "RunContext"]


@dataclass
class RunState:
    """Everything needed to continue a run; checkpoints serialise it."""

    values: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    seen: dict[str, tuple[int, ...]] = field(default_factory=dict)
    activations: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    produced: dict[str, None] = field(default_factory=dict)
    responses: dict[str, Any] = field(default_factory=dict)
    history: list[NodeExecution] = field(default_factory=list)
    step_index: int = 0
    ended: bool = False
    pending_interrupt: str | None = None
    pending_value: Any = None  # the value of an interrupt that paused inside a nested graph
    # node -> (seen, count, consumed an activation) before its current, unfinished execution
    inflight: dict[str, tuple[tuple[int, ...] | None, int, bool]] = field(default_factory=dict)
    # produced names a checkpoint did not keep -> (cache key, producer) to refetch them
    dropped: dict[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def start(cls, inputs: dict[str, Any]) -> RunState:
        return cls(values=dict(inputs), versions=dict.fromkeys(inputs, 1))

    def write(self, name: str, value: Any, identity: str | None) -> None:
        self.values[name] = value
        self.versions[name] = self.versions.get(name, 0) + 1
        self.produced[name] = None
        if self.dropped:
            self.dropped.pop(name, None)
        if identity is None:
            self.ids.pop(name, None)
        else:
            self.ids[name] = identity

    def outputs(self) -> dict[str, Any]:
        values = self.values
        return {k: values[k] for k in self.produced if k in values}

    def settled(self) -> tuple[dict[str, tuple[int, ...]], dict[str, int], dict[str, int]]:
        """``(seen, counts, activations)`` as if the unfinished executions never started."""
        seen, counts, acts = dict(self.seen), dict(self.counts), dict(self.activations)
        for name, (was_seen, count, activated) in self.inflight.items():
            _undo(seen, counts, acts, name, was_seen, count, activated)
        return seen, counts, acts

    def rollback(self, name: str) -> None:
        """Forget the unfinished execution of ``name`` (it failed or was cancelled)."""
        undo = self.inflight.pop(name, None)
        if undo is not None:
            _undo(self.seen, self.counts, self.activations, name, *undo)


def _undo(seen: dict[str, tuple[int, ...]], counts: dict[str, int], acts: dict[str, int],
          name: str, was_seen: tuple[int, ...] | None, count: int, activated: bool) -> None:
    if was_seen is None:
        seen.pop(name, None)
    else:
        seen[name] = was_seen
    if count:
        counts[name] = count
    else:
        counts.pop(name, None)
    if activated:
        acts[name] = acts.get(name, 0) + 1


@dataclass
class RunContext:
    """Per-run settings: ids, event sink, cache, interrupt handlers, parallelism."""

    session_id: str
    run_id: str
    emit: Callable[[Event], Any] | None = None
    keys: Keys | None = None
    writes: WriteBuffer | None = None  # batched cache writes (map); None: write at once
    handlers: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    parallel: bool = False
    max_workers: int = 4
    item_index: int | None = None
    # cache keys being computed by the items of one async batch (duplicates wait for them;
    # the key's future is made once an item waits: None until then)
    running: dict[str, asyncio.Future[Any] | None] | None = None
    parent_run_id: str | None = None
    # run()/iter() only: StateDeltaEvents after each write, a hook at every step boundary
    # (checkpointing), and the id the checkpoint of a pause will have (InterruptEvent).
    state_events: bool = False
    on_step: Callable[[], Any] | None = None
    pause_checkpoint_id: str | None = None
    budget: Any = None  # map items: the map's ``Budget`` (``policies/budget.py``)
