"""What the driver keeps of a map while it runs: counts, callbacks, the progress bar."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypernodes_dist.events import Dispatcher, Event
from hypernodes_dist.policies.usage import add_usage

__all__ = ["Tally"]


class Tally:
    """Counts of finished items, the events they carry sent to the callbacks, and a tqdm
    bar (``progress``) that moves as batches or parts arrive, in any order: items done of
    the total, items per second, elapsed and ETA, cache hits and failures (named
    ``failed_name``), and with ``initial`` the items an earlier run had done already
    (``resumed=``: the rate and ETA count only this run's). It sums what the nodes metered
    (``usage``, per node) and shows each quantity's total so far with its projection to the
    end of the map (``cost=0.42→1.2``: so far, times items in all / items done)."""

    def __init__(self, callbacks: Sequence[Any], progress: bool, total: int | None,
                 desc: str, initial: int = 0, unit: str = "item",
                 failed_name: str = "errors") -> None:
        self.callbacks = callbacks
        self.dispatch = Dispatcher(callbacks)
        self.done = self.hits = self.failed = 0
        self.total = total
        self.usage: dict[str, dict[str, float]] = {}  # node -> calls and metered quantities
        self.initial = initial
        self.failed_name = failed_name
        self.bar = None
        if progress:
            from tqdm.auto import tqdm  # loaded only for maps that show progress

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit,
                            dynamic_ncols=True)
            self.bar.set_postfix(self._postfix(), refresh=False)

    def _postfix(self) -> dict[str, Any]:
        post: dict[str, Any] = {"cache_hits": self.hits, self.failed_name: self.failed}
        if self.initial:
            post["resumed"] = self.initial
        metered: dict[str, float] = {}
        for usage in self.usage.values():
            add_usage(metered, {q: v for q, v in usage.items() if q != "calls"})
        scale = self.total / self.done if self.total and 0 < self.done < self.total else None
        for quantity, amount in metered.items():
            post[quantity] = f"{amount:.4g}" + (f"→{amount * scale:.4g}" if scale else "")
        return post

    def add(self, n: int, hits: int, failed: int, events: list[Event],
            usage: dict[str, dict[str, float]] | None = None) -> None:
        """``n`` more items finished (``hits`` cache hits, ``failed`` errors, ``usage``:
        per node, what their calls metered)."""
        self.done += n
        self.hits += hits
        self.failed += failed
        for name, used in (usage or {}).items():
            add_usage(self.usage.setdefault(name, {}), used)
        if self.callbacks:
            self.dispatch.all(events)
        if self.bar is not None:
            self.bar.set_postfix(self._postfix(), refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
