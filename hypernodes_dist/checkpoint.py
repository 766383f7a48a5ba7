"""``Checkpoint``: a frozen run that ``run(checkpoint=...)`` continues (same ``run_id``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .results import NodeExecution
from .scheduler import RunState

__all__ = ["Checkpoint", "capture", "restore"]


@dataclass
class Checkpoint:
    """Ids, history, the values needed to resume, and the scheduler's counters."""

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


def capture(state: RunState, *, session_id: str, run_id: str, graph_hash: str,
            keep: set[str] | None = None) -> Checkpoint:
    """Snapshot ``state``; ``keep`` limits the saved values to those needed to resume."""
    values = state.values if keep is None else {k: v for k, v in state.values.items() if k in keep}
    return Checkpoint(
        checkpoint_id=f"ckpt_{uuid.uuid4().hex[:16]}",
        session_id=session_id,
        run_id=run_id,
        history=list(state.history),
        state=dict(values),
        step_index=state.step_index,
        pending_interrupt=state.pending_interrupt,
        graph_hash=graph_hash,
        scheduler={
            "versions": dict(state.versions),
            "ids": {k: v for k, v in state.ids.items() if k in values},
            "seen": dict(state.seen),
            "activations": dict(state.activations),
            "counts": dict(state.counts),
            "produced": list(state.produced),
            "ended": state.ended,
        },
    )


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
        history=list(ckpt.history),
        step_index=ckpt.step_index,
        ended=bool(s.get("ended", False)),
        pending_interrupt=ckpt.pending_interrupt,
    )
