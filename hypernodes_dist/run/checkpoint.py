"""``Checkpoint``: a frozen run that ``run(checkpoint=...)`` continues (same ``run_id``).

**Minimal state.** A checkpoint keeps only the values a node that can still run may read
(``needed_values``). The nodes that can still run are derived from the plan and the
scheduler's counters:

* seeds: the pending interrupt; every branch/gate target with a pending activation; every
  other node that never ran or whose inputs were written since its last run;
* plus everything reachable from a seed (``plan.topology.successors``: data and activation
  edges), since a node that runs may write new inputs for, or activate, its successors.

Any other node is dead: none of its inputs can be written again and it cannot be activated,
so the scheduler never asks for its inputs again. The values kept are the parameters of the
live nodes; the rest (a 100 GB intermediate already compressed into an index, the inputs of
a branch not taken, earlier iterations of a cycle) is dropped, versions and counters stay,
so the restored scheduler stays consistent. The history keeps each execution's record, but
only output values that are still in the kept state. A dropped output that a cacheable node
produced is remembered by its cache key: ``refetch`` brings it back from the cache for the
result of the resumed run.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from hypernodes_dist.cache.base import Cache
from hypernodes_dist.execution.invoke import split_outputs
from hypernodes_dist.execution.runstate import RunState
from hypernodes_dist.results import NodeExecution

if TYPE_CHECKING:
    from hypernodes_dist.plan import Plan

__all__ = ["Checkpoint", "capture", "restore", "live_nodes", "needed_values", "refetch",
           "new_checkpoint_id"]


@dataclass
class Checkpoint:
    """Ids, history, the values needed to resume, and the scheduler's counters.

    ``status`` is the run's status when the checkpoint was taken: ``"running"`` (a step
    boundary), ``"interrupted"``, ``"complete"`` or ``"error"``.
    """

    checkpoint_id: str
    session_id: str
    run_id: str
    history: list[NodeExecution]
    state: dict[str, Any]
    step_index: int
    pending_interrupt: str | None
    graph_hash: str
    scheduler: dict[str, Any] = field(default_factory=dict)
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    status: str = "running"

    def __repr__(self) -> str:
        return (
            f"Checkpoint({self.checkpoint_id!r}, session_id={self.session_id!r}, "
            f"run_id={self.run_id!r}, status={self.status!r}, step_index={self.step_index}, "
            f"pending_interrupt={self.pending_interrupt!r}, state={sorted(self.state)})"
        )


def new_checkpoint_id() -> str:
    return f"ckpt_{uuid.uuid4().hex[:16]}"


def live_nodes(plan: Plan, state: RunState) -> set[str]:
    """Names of the nodes that may still run from ``state`` (see the module docstring)."""
    if state.ended:
        return set()
    seen, counts, activations = state.settled()
    versions = state.versions
    seeds: list[str] = []
    for n in plan.nodes:
        name = n.name
        if name == state.pending_interrupt:
            seeds.append(name)
        elif name in plan.gated:
            if activations.get(name, 0) > 0:
                seeds.append(name)
        elif name not in counts or tuple(versions.get(p, 0) for p in n.params) != seen.get(name):
            seeds.append(name)
    successors = plan.topology.successors
    live: set[str] = set()
    while seeds:
        name = seeds.pop()
        if name not in live:
            live.add(name)
            seeds.extend(successors.get(name, ()))
    return live


def needed_values(plan: Plan, state: RunState) -> set[str]:
    """The names in ``state.values`` some node that can still run may read."""
    values = state.values
    by_name = plan.by_name
    return {p for name in live_nodes(plan, state) for p in by_name[name].params if p in values}


def capture(
    state: RunState,
    *,
    session_id: str,
    run_id: str,
    graph_hash: str,
    plan: Plan | None = None,
    keep: set[str] | None = None,
    status: str = "running",
    checkpoint_id: str | None = None,
) -> Checkpoint:
    """Snapshot ``state``. With ``plan`` (or an explicit ``keep``) only the values needed to
    resume are saved; executions still in flight are recorded as not started."""
    if keep is None and plan is not None:
        keep = needed_values(plan, state)
    if keep is None:
        values = dict(state.values)
        history = list(state.history)
        dropped = dict(state.dropped)
    else:
        values = {k: v for k, v in state.values.items() if k in keep}
        history = [_strip(h, values) for h in state.history]
        dropped = _dropped(state, values)
    seen, counts, activations = state.settled()
    return Checkpoint(
        checkpoint_id=checkpoint_id or new_checkpoint_id(),
        session_id=session_id,
        run_id=run_id,
        history=history,
        state=values,
        step_index=state.step_index,
        pending_interrupt=state.pending_interrupt,
        graph_hash=graph_hash,
        status=status,
        scheduler={
            "versions": dict(state.versions),
            "ids": {k: v for k, v in state.ids.items() if k in values},
            "seen": dict(seen),
            "activations": activations,
            "counts": counts,
            "produced": list(state.produced),
            "ended": state.ended,
            "responses": dict(state.responses),
            "dropped": dropped,
        },
    )


def _strip(h: NodeExecution, kept: dict[str, Any]) -> NodeExecution:
    """``h`` with only the output values that are the kept (latest) values."""
    outs = {k: v for k, v in h.outputs.items() if k in kept and kept[k] is v}
    return h if len(outs) == len(h.outputs) else dataclasses.replace(h, outputs=outs)


def _dropped(state: RunState, kept: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Produced names not kept -> (cache key, producer) of their latest write, when keyed."""
    missing = [k for k in state.produced if k not in kept]
    out = {k: v for k, v in state.dropped.items() if k not in kept}
    todo = {k for k in missing if k not in out}
    for h in reversed(state.history):
        if not todo:
            break
        for name in todo & h.outputs.keys():
            todo.discard(name)
            if h.inputs_hash:
                out[name] = (h.inputs_hash, h.node_id)
    return out


def restore(ckpt: Checkpoint) -> RunState:
    """The ``RunState`` a checkpoint was taken from (minus values it did not keep)."""
    s = ckpt.scheduler
    return RunState(
        values=dict(ckpt.state),
        versions=dict(s.get("versions", {})),
        ids=dict(s.get("ids", {})),
        seen={k: tuple(v) for k, v in s.get("seen", {}).items()},
        activations=dict(s.get("activations", {})),
        counts=dict(s.get("counts", {})),
        produced=dict.fromkeys(s.get("produced", ())),
        responses=dict(s.get("responses", {})),
        history=list(ckpt.history),
        step_index=ckpt.step_index,
        ended=bool(s.get("ended", False)),
        pending_interrupt=ckpt.pending_interrupt,
        dropped={k: tuple(v) for k, v in s.get("dropped", {}).items()},
    )


def refetch(plan: Plan, state: RunState, cache: Cache | None,
            names: Iterable[str] | None = None) -> None:
    """Bring dropped outputs back into ``state.values`` from ``cache`` (misses stay absent)."""
    if cache is None or not state.dropped:
        return
    wanted = [n for n in (state.dropped if names is None else names) if n in state.dropped]
    keys = {state.dropped[n][0] for n in wanted}
    if not keys:
        return
    try:
        hits = cache.get_many(list(keys))
    except Exception:  # a cache that cannot answer is a miss
        return
    for name in wanted:
        key, producer = state.dropped[name]
        if key not in hits:
            continue
        node = plan.by_name.get(producer)
        if node is None or name not in node.outputs:
            continue
        state.values[name] = split_outputs(node, hits[key])[node.outputs.index(name)]
        del state.dropped[name]
