"""The part pipeline every engine runs: compute a part in steps, commit its rows by time.

``run_parts(out, commit_seconds, parts, open_part, report)`` is the whole life of the parts
one worker computes, wherever it runs (the driver for the local and Daft engines, a Dask
task, a Ray task); an engine only supplies ``open_part(part) -> compute(a, b)``, which
returns rows ``a .. b`` of the part as an Arrow table of the output schema and their
``PartReport``:

- **steps**: a part is computed in steps (one executor call, or one Daft query, each);
  ``Steps`` sizes them from the last steps' rates to take about a quarter of
  ``commit_seconds`` (starting small, growing at most ``GROWTH`` times per step), so a
  fast trivial map computes a part in a few large steps and a slow one hands its rows
  over every few seconds. Every row of a step runs to its end, whatever happens: rows
  that did not finish (refused by a budget; failed under ``on_error="raise"``) are left
  out and the others written around them, and the map stops (``stop.MapStop``: no new
  step starts on any worker; the driver raises once all is written);
- **commits**: the commit time is ``commit_seconds`` at most, and below it what a file is
  worth: ``FILE_WORK`` times the measured time of writing one (``PAID_FILE_WORK`` times
  once the rows meter usage: paid rows are worth more than small files), ``MIN_COMMIT``
  at least. Finished steps wait in memory in a ``PartPipeline``; its writer thread
  writes them once the oldest step *started* half of the commit time ago (its rows
  may have finished since then), or when the part's last step is done (a part computed
  within that time is one file, ``part-000042.parquet``; otherwise range files, one per
  run of consecutive rows). So a row that finished more than ``commit_seconds`` ago is
  in a complete file (a step longer than half of it is written as soon as it ends), and
  a file holds at most one part (parts are bounded in rows). The file is written while
  the next step computes (pyarrow's writer releases the GIL); a new part waits until the
  previous part's last file is written, so at most two parts are held at once;
- **reports**: each written file's ``PartReport`` (counts and events of its rows) goes to
  ``report`` as the next step starts (exact counts; the bar moves per row in between,
  through the progress channel: ``execution/progress.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field

import pyarrow as pa

from hypernodes_dist.datasets.parts import Part
from hypernodes_dist.datasets.report import PartReport
from hypernodes_dist.datasets.stop import MapStop
from hypernodes_dist.sinks.base import PartWriter

__all__ = ["run_parts", "PartPipeline", "Steps", "Compute", "COMMIT_SECONDS", "kept_runs"]

COMMIT_SECONDS = 30.0
HOLD = 0.5  # finished rows wait at most this share of the commit time before their write
STEP = 0.25  # a step aims at this share of the commit time
# the commit time, within MIN_COMMIT .. commit_seconds (MIN_COMMIT until a file is
# measured): FILE_WORK times what writing a file costs (files take ~1% of a worker's
# time); for rows that metered usage (paid API calls, worth more than any file) only
# PAID_FILE_WORK times (the writer keeps up: a file is written while the next is held)
FILE_WORK = 100.0
PAID_FILE_WORK = 2.0
MIN_COMMIT = 2.0
FIRST_STEP = 16  # rows of a worker's first step (nothing measured yet)
GROWTH = 8  # a step is at most this many times the previous one

Compute = Callable[[int, int], "tuple[pa.Table, PartReport]"]


def check_commit_seconds(value: object) -> float:
    """``commit_seconds`` as a float; ``ValueError`` for anything but a positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"commit_seconds={value!r}: pass a positive number of seconds (how long a "
            "finished row may wait before it is in a file of into=; default 30)")
    return float(value)


class Steps:
    """Sizes the steps of one worker's parts from the last two steps' times: the next
    aims at ``STEP * commit_seconds`` at the slower of their rates (a step's time taken as
    proportional to its rows: a fixed cost per step only makes small steps look slow, so
    steps grow until it is amortized), at most ``GROWTH`` times the last. A step longer
    than its aim delays its rows' commit (``PartPipeline`` counts from its start), so
    the estimate errs on the slow side."""

    def __init__(self, commit_seconds: float, first: int = FIRST_STEP) -> None:
        self.target = commit_seconds * STEP
        self.first = max(1, first)
        self.points: list[tuple[int, float]] = []  # (rows, seconds) of the last two steps

    def size(self, rest: int, commit: float | None = None) -> int:
        """Rows of the next step (``commit``: the commit time now, if not the one given)."""
        if not self.points:
            return min(rest, self.first)
        target = self.target if commit is None else commit * STEP
        per_row = max(max(t / n for n, t in self.points), 1e-9)
        cap = self.points[-1][0] * GROWTH
        return int(min(rest, max(1, min(target / per_row, cap))))

    def record(self, n: int, seconds: float) -> None:
        """A step of ``n`` rows took ``seconds`` (a part's short last step, much smaller
        than the one before, says little of the rate: not kept)."""
        if n and (not self.points or n * GROWTH >= self.points[-1][0]):
            self.points = [*self.points[-1:], (n, seconds)]


@dataclass
class _Held:
    """Rows of one part computed but not in a file yet: ``(first row, rows, report)`` per
    hand-over (consecutive ones are written as one file)."""

    part: Part
    steps: list[tuple[int, pa.Table, PartReport]] = field(default_factory=list)
    since: float | None = None  # when the oldest held rows may have finished
    ended: bool = False  # every row of the part has been handed over


class PartPipeline:
    """Holds finished steps of parts and writes them, by time or at a part's end, from a
    writer thread; a write error is raised in the computing thread at its next call."""

    def __init__(self, out: PartWriter, commit_seconds: float) -> None:
        self.out = out
        self.bound = commit_seconds
        self.commit = min(MIN_COMMIT, commit_seconds)  # the commit time now
        self.paid = False  # rows metered usage (paid calls)
        self._cond = threading.Condition()
        self._held: dict[int, _Held] = {}
        self._written: list[PartReport] = []
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="hn-commit", daemon=True)
        self._thread.start()

    def begin(self, part: Part) -> None:
        """Part ``part`` starts: waits until the previous part's last file is written."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None
                                or not any(h.ended for h in self._held.values()))
            self._raise()
            self._held[part.index] = _Held(part)

    def add(self, part: Part, start: int, table: pa.Table, report: PartReport,
            since: float | None = None) -> None:
        """The part's rows ``start .. start + len(table)``, finished (``since``: the
        ``time.monotonic()`` they may have finished from, e.g. their step's start)."""
        with self._cond:
            self._raise()
            held = self._held[part.index]
            held.steps.append((start, table, report))
            if held.since is None:
                held.since = time.monotonic() if since is None else since
            self._cond.notify_all()

    def end(self, part: Part) -> None:
        """Every row of ``part`` has been added: its rest is written now."""
        with self._cond:
            held = self._held.get(part.index)
            if held is not None:
                held.ended = True
            self._cond.notify_all()

    def take(self) -> list[PartReport]:
        """Reports of the files written since the last call."""
        with self._cond:
            self._raise()
            out, self._written = self._written, []
            return out

    def close(self, raise_errors: bool = True) -> list[PartReport]:
        """Write what is held, stop the writer thread; the reports not taken yet."""
        with self._cond:
            self._closing = True
            for held in self._held.values():
                held.ended = True
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            if raise_errors:
                self._raise()
            out, self._written = self._written, []
            return out

    @property
    def hold(self) -> float:
        return self.commit * HOLD

    def _measured(self, seconds: float, files: int) -> None:
        """A write of ``files`` files took ``seconds``: the commit time that makes files
        cost about 1/FILE_WORK of the work they hold (1/PAID_FILE_WORK for paid rows),
        within MIN_COMMIT .. the bound."""
        if files:
            per_file = (PAID_FILE_WORK if self.paid else FILE_WORK) * seconds / files
            self.commit = min(self.bound, max(min(MIN_COMMIT, self.bound), per_file))

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _due(self, now: float) -> _Held | None:
        for held in self._held.values():  # in part order
            if held.ended or (held.since is not None and now - held.since >= self.hold):
                return held
        return None

    def _next(self) -> tuple[Part, list[tuple[int, pa.Table, PartReport]], bool] | None:
        """Under the lock: the next rows to write (``None``: stop)."""
        while True:
            if self._error is not None:
                return None
            held = self._due(time.monotonic())
            if held is not None:
                steps, held.steps, held.since = held.steps, [], None
                if held.ended:
                    del self._held[held.part.index]
                    self._cond.notify_all()
                if steps:
                    return held.part, steps, held.ended
                continue
            if self._closing and not self._held:
                return None
            waits = [h.since + self.hold - time.monotonic()
                     for h in self._held.values() if h.since is not None]
            self._cond.wait(max(0.0, min(waits)) if waits else None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                work = self._next()
            if work is None:
                return
            t0 = time.perf_counter()
            try:
                report, files = _write(self.out, *work)
            except BaseException as exc:  # noqa: BLE001 -- raised in the computing thread
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self._measured(time.perf_counter() - t0, files)
                self._written.append(report)
                self._cond.notify_all()


def _write(out: PartWriter, part: Part, steps: list[tuple[int, pa.Table, PartReport]],
           ended: bool) -> tuple[PartReport, int]:
    """Each run of consecutive rows in ``steps`` as one file; their reports summed, and
    the number of files."""
    runs: list[tuple[int, list[pa.Table]]] = []
    stop = -1
    for start, table, _ in steps:
        if not table.num_rows:
            continue
        if start == stop:
            runs[-1][1].append(table)
        else:
            runs.append((start, [table]))
        stop = start + table.num_rows
    for start, tables in runs:
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        end = start + table.num_rows
        whole = start == 0 and end == part.n and ended
        out.write_part(part.index, table, None if whole else (start, end))
    first = steps[0]
    total = PartReport(part.index, part.offset + first[0], 0, worker=first[2].worker)
    for _, _, r in steps:
        total.add(r)
    return total, len(runs)


def kept_runs(n: int, done: PartReport, offset: int) -> list[tuple[int, int]]:
    """The runs ``(x, y)`` of rows ``0 .. n`` (source positions from ``offset``) that
    are not in ``done.skipped``; ``done`` then counts only them."""
    gaps = sorted(p - offset for p in done.skipped)
    done.n, done.skipped = n - len(gaps), []
    x, runs = 0, []
    for g in [*gaps, n]:
        if g > x:
            runs.append((x, g))
        x = g + 1
    return runs


def _hand_over(pipe: PartPipeline, part: Part, a: int, table: pa.Table, done: PartReport,
               since: float) -> None:
    """Rows ``a ..`` of ``part`` (``table``) to ``pipe``, without the rows ``done``
    says are not finished (refused by a budget, failed under ``"raise"``): every other
    row is written, around them (a rerun computes only those)."""
    if not done.skipped:
        pipe.add(part, a, table, done, since)
        return
    runs = kept_runs(table.num_rows, done, part.offset + a)
    for k, (x, y) in enumerate(runs or [(0, 0)]):
        report = done if k == 0 else PartReport(part.index, part.offset + a + x, 0)
        pipe.add(part, a + x, table.slice(x, y - x), report, since)


def run_part(pipe: PartPipeline, part: Part, compute: Compute, steps: Steps,
             report: Callable[[PartReport], None], stop: MapStop | None = None) -> None:
    """The rows of ``part`` not in files yet (``part.todo()``) in steps, handed to
    ``pipe``; a step that stops the map (its report's ``stop``) sets ``stop``, and no
    step starts once ``stop`` is set."""
    pipe.begin(part)
    try:
        for lo, hi in part.todo():
            a = lo
            while a < hi:
                if stop is not None and stop.stopped():
                    return
                b = a + steps.size(hi - a, pipe.commit)
                t0, since = time.perf_counter(), time.monotonic()
                table, done = compute(a, b)
                steps.record(b - a, time.perf_counter() - t0)
                pipe.paid = pipe.paid or any(len(u) > 1 for u in done.usage.values())
                _hand_over(pipe, part, a, table, done, since)
                for r in pipe.take():
                    report(r)
                if done.stop is not None and stop is not None:
                    stop.set()
                a = b
    finally:
        pipe.end(part)


def run_parts(out: PartWriter, commit_seconds: float, parts: Iterable[Part],
              open_part: Callable[[Part], Compute], report: Callable[[PartReport], None],
              first_step: int = FIRST_STEP, stop: MapStop | None = None) -> None:
    """Every part of ``parts`` through one pipeline (see the module docstring), until
    ``stop`` is set. On an error, the rows finished before it are still written (a
    rerun skips them)."""
    pipe = PartPipeline(out, commit_seconds)
    steps = Steps(commit_seconds, first_step)
    try:
        for part in parts:
            if stop is not None and stop.stopped():
                break
            run_part(pipe, part, open_part(part), steps, report, stop)
    except BaseException:
        with suppress(BaseException):
            pipe.close(raise_errors=False)
        raise
    for r in pipe.close():
        report(r)
