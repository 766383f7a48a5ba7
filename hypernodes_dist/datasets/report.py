"""``PartReport``: what the driver hears of a part's written rows -- counts, never rows."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypernodes_dist.events import Event

__all__ = ["PartReport"]


@dataclass
class PartReport:
    """Rows ``offset .. offset + n`` of part ``index`` (one file, one step, or a whole
    part's files summed): how many failed, ran or were cache hits, and their events."""

    index: int
    offset: int
    n: int
    failed: int = 0
    executed: int = 0
    hits: int = 0
    events: list[Event] = field(default_factory=list)
    worker: str = ""

    def add(self, other: PartReport) -> None:
        """Count ``other``'s rows in (its rows follow this report's)."""
        self.n += other.n
        self.failed += other.failed
        self.executed += other.executed
        self.hits += other.hits
        self.events.extend(other.events)
        self.worker = self.worker or other.worker
