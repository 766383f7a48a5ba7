"""``map(..., budget={"cost": 20}, on_budget=ask)``: the budget that asks, in the driver.

Once a quantity is spent, calls that would meter it park where they run (the budget gate,
``policies/gates/budget.py``) and say so in the budget's ``answers`` value in the limits
backend (``Budget.ask_for``). ``Asker``, a thread of the driver process while the map runs,
looks at that value every ``ASK_POLL`` seconds and calls ``ask(quantity, spent, limit)``
once per spent limit, one question at a time:

- a number: the quantity's new limit; the parked calls see it and go on (same map, nothing
  restarts, no finished row runs again). A limit not above what is spent by then is spent at
  once, so ``ask`` is asked again with it;
- ``None``: the quantity is stopped, as without ``on_budget`` (``BudgetExceededError``);
- an exception, or anything else: stopped too, and the map raises that error (a
  ``TypeError`` for a bad answer) once everything finished is kept.

When the map is over (or interrupted), every quantity is stopped and the budget's values
are removed: a call the map left behind finds no ledger and does not start.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from hypernodes_dist.policies.budget import ASK_POLL, Budget, Where, valid_limit

__all__ = ["Asker", "Ask"]

Ask = Callable[[str, float, float], Any]


class Asker:
    """The driver's side of ``on_budget``: a context manager around the engine's run."""

    def __init__(self, budget: Budget | None, ask: Ask | None, where: Where | None = None,
                 shown: dict[str, float] | None = None,
                 stopping: Callable[[], bool] | None = None) -> None:
        """``where``: the engine's ``driver_shared``; ``shown``: the limits the progress bar
        and the stop line show, updated with each new limit; ``stopping()``: the map is
        being stopped (a dataset map's ``MapStop``: Ctrl-C) -- waiting calls stop too."""
        self.budget = budget if budget is not None and budget.asks else None
        self.ledger = budget  # opened for every budget (a call that finds none is left behind)
        self.ask, self.where = ask, where
        self.initial = dict(budget.limits) if budget is not None else {}
        self.limits: dict[str, float] = {}  # the limits ask gave
        self.shown = shown if shown is not None else {}
        self.stopping = stopping
        self.stopped: set[str] = set()  # the quantities ask stopped
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> Asker:
        if self.ledger is not None:
            self.ledger.open(self.where)
        if self.budget is not None:
            self.thread = threading.Thread(target=self._watch, name="hn-on-budget", daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join()
        if self.budget is not None:  # calls still waiting (the map was interrupted) stop
            self._write(set(self.initial))

    def raise_error(self) -> None:
        """Raise what ``ask`` raised or the bad answer it gave (after the map)."""
        if self.error is not None:
            raise self.error

    def _watch(self) -> None:
        while not self.done.wait(ASK_POLL):
            try:
                if self.stopping is not None and self.stopping():
                    self._write(set(self.initial))
                    return
                self.answer()
            except Exception as exc:  # the backend failed: stop asking, the map goes on
                self.error = self.error or exc
                return

    def answer(self) -> None:
        """Ask about every quantity calls wait on and write the answers (the driver is the
        only writer of ``answers``: what it wrote is also kept here)."""
        budget = self.budget
        assert budget is not None
        waiting = budget.asking(self.where).get() or {}
        for quantity, most in waiting.items():
            now = self.limits.get(quantity, self.initial.get(quantity, math.inf))
            if quantity in self.stopped or most != now:
                continue  # answered already (a slow call's late question)
            used = budget.spent(self.where).get(quantity, 0.0)
            new = self._ask(quantity, used, now)
            if new is None:
                self.stopped.add(quantity)
            else:
                self.limits[quantity] = self.shown[quantity] = new
            self._write(self.stopped)

    def _write(self, stopped: set[str]) -> None:
        answers = {"limits": dict(self.limits), "stopped": sorted(stopped)}
        self.budget.answers(self.where).update(lambda _old: answers)  # type: ignore[union-attr]  # an Asker runs only for a map with a budget

    def _ask(self, quantity: str, used: float, most: float) -> float | None:
        if self.error is not None:
            return None
        try:
            new = self.ask(quantity, used, most)  # type: ignore[misc]  # an Asker runs only for a map with on_budget
        except BaseException as exc:  # the map raises it at its end
            self.error = exc
            return None
        if new is None or valid_limit(new):
            return None if new is None else float(new)
        self.error = TypeError(
            f"on_budget returned {new!r} for budget {quantity}={most:g} ({used:g} spent): "
            "return a new limit (a number >= 0) to go on, or None to stop")
        return None
