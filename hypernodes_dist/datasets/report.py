"""``PartReport``: what the driver hears of a part's written rows -- counts, never rows."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypernodes_dist.events import Event
from hypernodes_dist.policies.usage import add_usage

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
    usage: dict[str, dict[str, float]] = field(default_factory=dict)  # per node: calls, metered
    # rows (source positions) that did not finish -- refused by the map's budget, or failed
    # under on_error="raise" -- are not written (a rerun computes them); ``stop`` is the
    # error of the first of them, at ``stopped_at``: it stops the map
    skipped: list[int] = field(default_factory=list)
    stopped_at: int | None = None
    stop: BaseException | None = None
    waiting: int = 0  # rows waiting for a provider batch (in ``skipped``, not a stop)

    def add(self, other: PartReport) -> None:
        """Count ``other``'s rows in (its rows follow this report's)."""
        self.n += other.n
        self.failed += other.failed
        self.executed += other.executed
        self.hits += other.hits
        self.waiting += other.waiting
        self.events.extend(other.events)
        self.skipped.extend(other.skipped)
        if other.stopped_at is not None and (self.stopped_at is None
                                             or other.stopped_at < self.stopped_at):
            self.stopped_at, self.stop = other.stopped_at, other.stop
        for name, used in other.usage.items():
            add_usage(self.usage.setdefault(name, {}), used)
        self.worker = self.worker or other.worker
