"""What a user sees of a map's provider batches: the bar's counts (``BatchSummary``: the
batches by state, the lines done, failed, sent again and online) and the events of each
batch's life (``batch_event``: ``BatchSubmittedEvent`` / ``BatchEndedEvent``, which the
trace turns into a span per batch)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hypernodes_dist.batchapi.driver import BatchDriver
from hypernodes_dist.batchapi.store import FileState
from hypernodes_dist.events import BatchEndedEvent, BatchSubmittedEvent, Event

__all__ = ["BatchSummary", "summarize", "batch_event", "shown_state", "STATES"]

# the ledger's state of a file -> what the bar calls it (files never created: not shown)
STATES = {"new": "submitting", "submitted": "running", "done": "done", "failed": "failed",
          "lost": "lost"}
_ORDER = ("submitting", "running", "done", "cancelled", "failed", "lost")


def shown_state(f: FileState) -> str | None:
    """A file's state as the user reads it (``None``: never reached the provider as a batch,
    or refused for the queue limit: its lines go again, the bar says ``held``)."""
    if f.state == "failed" and f.why in ("never created", "queue limit"):
        return None
    if f.state == "new" and f.creating_at is None and f.file_id is None:
        return None
    if f.state == "done" and f.cancelled:
        return "cancelled"
    return STATES.get(f.state, f.state)


@dataclass(frozen=True)
class BatchSummary:
    """The map's batches by state and its lines: ``done`` (answered), ``failed`` (answered
    with an error, or given up), ``again`` (sent again), ``online`` (``online_after``)."""

    states: dict[str, int] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    held: bool = False  # a file waits for the provider's queue limit

    def text(self) -> str:
        """``batches=2 running 3 done, lines=480 done 20 failed`` (+ again, online, held)."""
        states = " ".join(f"{n} {s}" for s, n in self.states.items() if n) or "none"
        lines = " ".join(f"{n:,} {k}" for k, n in self.lines.items()
                         if n or k in ("done", "failed"))
        held = ", held by the provider's queue limit" if self.held else ""
        return f"batches={states}, lines={lines}{held}"


def summarize(drivers: Iterable[BatchDriver]) -> BatchSummary:
    """The summary of a map's drivers (every batch in their ledgers; lines: this run's)."""
    states: dict[str, int] = dict.fromkeys(_ORDER, 0)
    lines = dict.fromkeys(("done", "failed", "again", "online"), 0)
    held = False
    for d in drivers:
        held = held or d.held
        for f in d.files.values():
            shown = shown_state(f)
            if shown is not None:
                states[shown] = states.get(shown, 0) + 1
        c = d.counts
        lines["done"] += c.lines_answered - c.lines_failed
        lines["failed"] += c.lines_failed + c.lines_given_up
        lines["again"] += c.lines_again
        lines["online"] += c.lines_online
    return BatchSummary({s: n for s, n in states.items() if n}, lines, held)


def batch_event(f: FileState, resource: str, node: str, ids: tuple[str, str],
                answered: int = 0, failed: int = 0) -> Event:
    """The event of file ``f``'s batch now: submitted (running) or ended (``ids``: the map's
    session id and run-id prefix)."""
    common: dict[str, Any] = dict(
        session_id=ids[0], run_id=ids[1], node_id=node, file=f.fid, batch_id=f.batch_id or "",
        resource=resource, provider=f.provider, lines=len(f.digests),
        started_at=f.creating_at or time.time())
    if f.state == "submitted":
        return BatchSubmittedEvent(**common)
    state = shown_state(f) or f.state
    return BatchEndedEvent(**common, status=state, answered=answered,
                           failed_lines=failed, ended_at=time.time(),
                           reason=f.why if state in ("failed", "lost") else "")

