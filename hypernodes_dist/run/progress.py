"""What the driver keeps of a map while it runs: counts, callbacks, the progress bar.

Two streams reach it, in any order and any thread: the exact counts of each finished batch
or written file (``add``: rows, hits, failures, usage, events), and the progress channel's
counts of rows finished where they run and what their calls metered (``receive``:
``{batch offset: (rows done, metered)}``, ``execution/progress.py``), which move the bar
between them. A batch's live counts are replaced by its exact ones when those arrive (late
live counts for it are ignored), so the bar never counts a row or a token twice.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from hypernodes_dist.events import Dispatcher, Event, ProgressEvent
from hypernodes_dist.execution.progress import Updates
from hypernodes_dist.policies.usage import add_usage
from hypernodes_dist.run.stops import Kept, Stop, budget_stop, emit, error_stop, is_budget

if TYPE_CHECKING:
    from hypernodes_dist.engines.base import Engine
    from hypernodes_dist.execution.job import BatchSettings
    from hypernodes_dist.run.batchview import BatchSummary

__all__ = ["Tally", "plain"]

log = logging.getLogger("hypernodes_dist.events")

EVENT_SECONDS = 0.25  # ProgressEvents at most this often (and one at the end)
_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BATCH_USAGE = ("batch_calls", "batch_cost")  # shown in the batches' part of the bar


def plain(x: float) -> str:
    """A number for people: 4 significant digits, no exponent (``199.9k``, ``7.995M``,
    ``0.0421``, ``12``)."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    for scale, suffix in _SUFFIXES:
        if abs(x) >= scale * 0.99995:
            return _sig(x / scale) + suffix
    return _sig(x)


def _saved_text(metered: Mapping[str, float]) -> str:
    """What calls a batch answered saved: the ``cost`` they metered (priced at the batch
    rate, half the online one), else their count at half their online price."""
    if "batch_cost" in metered:
        return f"saved={plain(metered['batch_cost'])}"
    calls = metered.get("batch_calls", 0)
    return f"saved=50% of the online price of {calls:,.0f} calls" if calls else ""


def _sig(x: float) -> str:
    digits = max(0, 3 - math.floor(math.log10(abs(x)))) if x else 0
    text = f"{x:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


class _Spans:
    """Sorted, merged ``[a, b)`` ranges of items whose exact counts arrived."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, a: int, b: int) -> None:
        i = bisect.bisect_left(self.ends, a)  # first range ending at or after a
        j = bisect.bisect_right(self.starts, b)  # ranges starting at or before b
        if i < j:
            a, b = min(a, self.starts[i]), max(b, self.ends[j - 1])
        self.starts[i:j], self.ends[i:j] = [a], [b]

    def __contains__(self, x: int) -> bool:
        i = bisect.bisect_right(self.starts, x) - 1
        return i >= 0 and x < self.ends[i]


class Tally:
    """Counts of finished items, the events they carry sent to the callbacks, and a tqdm
    bar (``progress``) that moves as rows finish: rows done of the total, this run's rows
    per second and ETA, cache hits, failures (named ``failed_name``), rows an earlier run
    did (``initial``, shown as ``resumed=``), each metered quantity this run so far with
    its projection (``tokens=199.9k (proj. 799.5k)``: so far x rows this run has to do /
    rows it did, shown until every row is done), and what stopped the map, if anything.
    Callbacks defining ``on_progress`` get a ``ProgressEvent`` at most 4 times a second; a
    count held back by that is told when its quarter second ends."""

    def __init__(self, callbacks: Sequence[Any], progress: bool, total: int | None,
                 desc: str, initial: int = 0, unit: str = "item",
                 failed_name: str = "errors", budget: Mapping[str, float] | None = None,
                 kept: Kept = Kept("")) -> None:
        self.callbacks = callbacks
        self.dispatch = Dispatcher(callbacks)
        self.listeners = [cb for cb in callbacks if callable(getattr(cb, "on_progress", None))]
        self.done = self.hits = self.failed = self.refused = 0
        self.total = total
        self.usage: dict[str, dict[str, float]] = {}  # node -> calls and metered quantities
        self.initial, self.unit, self.failed_name = initial, unit, failed_name
        self.budget, self.kept = dict(budget or {}), kept
        # batch offset -> (rows finished, what they metered) from the progress channel
        self.live: dict[int, tuple[int, dict[str, float] | None]] = {}
        self.exact = _Spans()
        self.stopped: Stop | None = None
        self.provider_batches: BatchSummary | None = None  # the map's provider batches (batch_api)
        self._batch_shown = 0.0
        self.budget_hit = False
        self._lock = threading.RLock()
        self._started = time.monotonic()
        self._last_event = 0.0
        self._trailing: threading.Timer | None = None  # the held-back event's, if any
        self._told_final = False
        self._closed = False
        self.bar = None
        if progress:
            from tqdm.auto import tqdm  # loaded only for maps that show progress

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit,
                            dynamic_ncols=True)
            self.bar.set_postfix_str(self._postfix(), refresh=False)

    @property
    def wants_live(self) -> bool:
        """Whether anyone shows progress (a bar, an ``on_progress`` callback)."""
        return self.bar is not None or bool(self.listeners)

    # -- counts --------------------------------------------------------------------------
    def add(self, n: int, hits: int, failed: int, events: list[Event],
            usage: dict[str, dict[str, float]] | None = None, offset: int | None = None,
            refused: int = 0, budget_stop: bool = False) -> None:
        """``n`` more items finished (items ``offset .. offset + n``; ``hits`` cache hits,
        ``failed`` errors, ``refused`` of them by the budget, ``usage``: per node, what
        their calls metered; ``budget_stop``: the budget stopped rows after these)."""
        if self.callbacks:
            self.dispatch.all(events)
        with self._lock:
            self.done += n
            self.hits += hits
            self.failed += failed
            self.refused += refused
            self.budget_hit = self.budget_hit or budget_stop or refused > 0
            for name, used in (usage or {}).items():
                add_usage(self.usage.setdefault(name, {}), used)
            if offset is not None and n:
                self.exact.add(offset, offset + n)
                for key in [k for k in self.live if offset <= k < offset + n]:
                    del self.live[key]
            self._show()

    def receive(self, updates: Updates) -> None:
        """The progress channel: ``{batch offset: (rows finished, metered)}`` (any thread)."""
        with self._lock:
            if self._closed:  # a late message: the map is over
                return
            live, exact = self.live, self.exact
            for offset, (done, metered) in updates.items():
                if offset in exact:
                    continue
                old_done, old_metered = live.get(offset, (0, None))
                live[offset] = (max(done, old_done), metered or old_metered)
            self._show()

    @property
    def live_rows(self) -> int:
        """Rows finished where they run whose batch has not come back yet."""
        return sum(done for done, _ in self.live.values())

    @property
    def position(self) -> int:
        """Rows done: an earlier run's, this run's exact counts, and the live ones (never
        past the total: a live count may still hold a row its exact count already has, e.g.
        a provider batch's round re-running a map's waiting items)."""
        done = self.initial + self.done + self.live_rows
        return done if self.total is None else min(done, self.total)

    # -- display -------------------------------------------------------------------------
    def _metered(self) -> dict[str, float]:
        metered: dict[str, float] = {}
        for usage in self.usage.values():
            add_usage(metered, {q: v for q, v in usage.items() if q != "calls"})
        for _, live in self.live.values():
            add_usage(metered, live or {})
        return metered

    def _scale(self) -> float | None:
        """Rows this run has to do / rows it did (``None``: nothing left, or none done)."""
        todo = None if self.total is None else self.total - self.initial
        done = self.done + self.live_rows
        return todo / done if todo and 0 < done < todo else None

    def _postfix(self) -> str:
        parts = [f"cache_hits={self.hits:,}", f"{self.failed_name}={self.failed:,}"]
        if self.initial:
            parts.append(f"resumed={self.initial:,}")
        scale = self._scale()
        metered = self._metered()
        for quantity, amount in metered.items():
            if quantity not in _BATCH_USAGE:
                proj = f" (proj. {plain(amount * scale)})" if scale else ""
                parts.append(f"{quantity}={plain(amount)}{proj}")
        if self.provider_batches is not None:
            parts.append(self.provider_batches.text())
        saved = _saved_text(metered)
        if saved:
            parts.append(saved)
        if self.stopped is not None:
            parts.append(self.stopped.label)
        return ", ".join(parts)

    def batch_states(self, summary: BatchSummary) -> None:
        """A map's provider batches (by state, lines; ``BatchLoop``): on the bar at most
        4 times a second (and when the map ends), and to ``on_progress``."""
        with self._lock:
            self.provider_batches = summary
            now = time.monotonic()
            if self.bar is not None and now - self._batch_shown >= EVENT_SECONDS:
                self._batch_shown = now
                self.bar.set_postfix_str(self._postfix())
            self._show()

    def _show(self, final: bool = False) -> None:
        """Under the lock: move the bar and send a ``ProgressEvent`` (throttled)."""
        if self.bar is not None:
            position = self.position
            if position > self.bar.n:
                self.bar.set_postfix_str(self._postfix(), refresh=False)
                self.bar.update(position - self.bar.n)
        if not self.listeners:
            return
        now = time.monotonic()
        wait = self._last_event + EVENT_SECONDS - now
        if final or wait <= 0:
            self._tell(now, final)
        elif self._trailing is None:  # held back: told when the interval ends (trailing)
            self._trailing = threading.Timer(wait, self._tell_held)
            self._trailing.daemon = True
            self._trailing.start()

    def _tell_held(self) -> None:
        """The event held back by the throttle (the counts as they are now), unless the
        final one was told meanwhile: a count never waits for the next update."""
        with self._lock:
            self._trailing = None
            if not self._told_final:
                self._tell(time.monotonic(), False)

    def _tell(self, now: float, final: bool) -> None:
        """Under the lock: a ``ProgressEvent`` to every ``on_progress`` callback."""
        self._last_event, self._told_final = now, self._told_final or final
        if final and self._trailing is not None:
            self._trailing.cancel()
            self._trailing = None
        event = self._event(now, final)
        for cb in self.listeners:
            try:
                cb.on_progress(event)
            except Exception:
                log.warning("callback %s.on_progress raised; the run goes on",
                            type(cb).__name__, exc_info=True)

    def _event(self, now: float, final: bool) -> ProgressEvent:
        done = self.position
        elapsed = now - self._started
        rate = (done - self.initial) / elapsed if elapsed > 0 and done > self.initial else None
        eta = (self.total - done) / rate if rate and self.total is not None else None
        metered, scale = self._metered(), self._scale()
        return ProgressEvent(
            done=done, total=self.total, failed=self.failed, cache_hits=self.hits,
            resumed=self.initial, rate=rate, eta=eta, usage=metered,
            projected={q: v * scale for q, v in metered.items()} if scale else {},
            stopped=self.stopped.label if self.stopped else None, final=final,
            batches=dict(self.provider_batches.states) if self.provider_batches else {},
            batch_lines=dict(self.provider_batches.lines) if self.provider_batches else {},
            saved=metered.get("batch_cost"))

    @contextmanager
    def watch(self, engine: Engine, settings: BatchSettings) -> Iterator[None]:
        """Around the engine's run of the map: the engine's progress channel in
        ``settings`` (when anyone shows progress), and at the end, whatever stopped it,
        the channel and the budget closed and the tally closed (``fail``, ``close``)."""
        channel = engine.progress_channel(self.receive) if self.wants_live else None
        settings.progress = channel
        try:
            yield
        except BaseException as exc:
            self.fail(exc)
            raise
        finally:
            settings.progress = None
            if channel is not None:
                channel.close()
            self.close()
            if settings.budget is not None:
                settings.budget.close(engine.driver_shared)

    # -- the end ---------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """The map raised ``exc``: say so (bar, one line) when the tally closes."""
        with self._lock:
            if is_budget(exc) and self.budget:
                self.budget_hit = True
            else:
                self.stopped = error_stop(exc, self.initial + self.done, self.total, self.unit,
                                       self.kept)

    def close(self) -> None:
        """Settle the bar on the exact counts, say what stopped the map, close the bar."""
        with self._lock:
            self._closed = True
            self.live.clear()
            if self.stopped is None and self.budget_hit:
                refused = self.refused or None
                done = self.initial + self.done - (refused or 0)
                self.stopped = budget_stop(self.budget, done, self.total, self.unit, self.kept,
                                        refused)
            if self.bar is not None:
                self.bar.n = self.position
                self.bar.set_postfix_str(self._postfix(), refresh=False)
                self.bar.refresh()
            self._show(final=True)
            if self.bar is not None:
                self.bar.close()
        if self.stopped is not None:
            emit(self.stopped)
