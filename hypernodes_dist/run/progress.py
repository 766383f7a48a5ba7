"""What the driver keeps of a map while it runs: counts, callbacks, the progress bar."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypernodes_dist.events import Dispatcher, Event

__all__ = ["Tally"]


class Tally:
    """Counts of finished items, the events they carry sent to the callbacks, and a tqdm
    bar (``progress``) that moves as batches or parts arrive, in any order."""

    def __init__(self, callbacks: Sequence[Any], progress: bool, total: int | None,
                 desc: str, initial: int = 0) -> None:
        self.callbacks = callbacks
        self.dispatch = Dispatcher(callbacks)
        self.done = self.hits = self.failed = 0
        self.bar = None
        if progress:
            from tqdm.auto import tqdm  # loaded only for maps that show progress

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="item",
                            dynamic_ncols=True)

    def add(self, n: int, hits: int, failed: int, events: list[Event]) -> None:
        """``n`` more items finished (``hits`` cache hits, ``failed`` errors)."""
        self.done += n
        self.hits += hits
        self.failed += failed
        if self.callbacks:
            self.dispatch.all(events)
        if self.bar is not None:
            self.bar.set_postfix(cache_hits=self.hits, errors=self.failed, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
