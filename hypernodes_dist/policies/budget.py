"""``map(budget={quantity: max})``: a map stops starting metered calls once it spent that.

The totals a map has metered live in the limits backend (``limits.shared``:
every process of the machine, or the cluster on ``distributed``), under the map's run id,
so every worker sees what the others spent. The guard asks ``check`` before a metered call
starts and ``spend``s what the call metered when it ends: a call in flight when the budget
is reached finishes and is kept, so the overshoot is at most the calls in flight.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from hypernodes_dist.errors import BudgetExceededError
from hypernodes_dist.policies.backend import SharedValue
from hypernodes_dist.policies.limits import shared

__all__ = ["Budget", "Spent", "check_budget", "valid_limit", "ASK_POLL"]


# The driver's way to a value its engine's workers share (``Engine.driver_shared``), or None.
Where = Callable[[str], Any]
ASK_POLL = 0.05  # seconds a call parked on a spent budget waits between looks at the answer


class Spent(NamedTuple):
    """A spent quantity: what the map metered of it and its limit now."""

    quantity: str
    used: float
    limit: float


@dataclass(frozen=True)
class Budget:
    """The limits of one map (picklable: it travels with the batch settings).

    ``asks``: ``map(on_budget=ask)`` -- a spent quantity parks its calls until the driver's
    ``ask`` answers, instead of refusing them at once. Each shared value has one writer:
    ``asking`` (the spent limits calls wait on) is written by the workers, ``answers`` (the
    limits ``ask`` raised, the quantities it stopped) by the driver alone.
    """

    limits: tuple[tuple[str, float], ...]
    key: str  # the map's run-id prefix: one ledger per map call
    asks: bool = False

    def _value(self, suffix: str, where: Where | None) -> SharedValue:
        key = f"budget-{self.key}{suffix}"
        found = where(key) if where is not None else None
        return found if found is not None else shared(key)

    def _ledger(self, where: Where | None = None) -> SharedValue:
        return self._value("", where)

    def answers(self, where: Where | None = None) -> SharedValue:
        """The driver's answers (``{"limits": {q: n}, "stopped": [q]}``); ``where``: the
        driver's way to the workers' values (``Engine.driver_shared``)."""
        return self._value("-answers", where)

    def asking(self, where: Where | None = None) -> SharedValue:
        """The spent limits calls wait on (``{q: n}``), written by the workers."""
        return self._value("-asking", where)

    def spent(self, where: Where | None = None) -> dict[str, float]:
        """What the map has metered so far, every process together."""
        return dict(self._ledger(where).get() or {})

    def over(self, meters: frozenset[str] | None) -> tuple[Spent | None, bool]:
        """``(the first spent quantity this node meters or None, whether the driver stopped
        it)``; ``meters`` ``None``: not known yet, any quantity counts."""
        relevant = [(q, m) for q, m in self.limits if meters is None or q in meters]
        if not relevant:
            return None, False
        found = self._ledger().get()
        if found is None:  # opened by the driver: gone once the map is over (a late call)
            return Spent(relevant[0][0], 0.0, relevant[0][1]), True
        spent = dict(found or {})
        answers: dict[str, Any] | None = None
        for quantity, most in relevant:
            used = spent.get(quantity, 0.0)
            if used < most:
                continue
            if not self.asks:
                return Spent(quantity, used, most), True
            if answers is None:  # read only once a first limit is spent: limits only rise
                answers = self.answers().get() or {}
            if quantity in answers.get("stopped", ()):
                return Spent(quantity, used, most), True
            now = float(answers.get("limits", {}).get(quantity, most))
            if used >= now:
                return Spent(quantity, used, now), False
        return None, False

    def check(self, node: str, meters: frozenset[str] | None, item: int | None) -> None:
        """Raise ``BudgetExceededError`` when a quantity this node meters (``None``: not
        known yet, any) has reached its limit (with ``asks``: once the driver stopped it)."""
        found, stopped = self.over(meters)
        if found is not None and (stopped or not self.asks):
            raise self.refusal(node, item, found)

    def refusal(self, node: str, item: int | None, found: Spent) -> BudgetExceededError:
        where = f"node {node!r}" if item is None else f"node {node!r} (item {item})"
        return BudgetExceededError(
            f"{where} did not start: the map's budget {found.quantity}={found.limit:g} is "
            f"spent ({found.used:g} metered). Finished items are kept; rerun with a larger "
            "budget (with a cache or into=, finished items are not paid again)",
            found.quantity, found.used, found.limit, node)

    def open(self, where: Where | None = None) -> None:
        """Start the ledger (the driver, before the map runs): a call that finds no ledger
        is one the map left behind (stopped, interrupted, still running on a cluster), and
        is refused."""
        self._ledger(where).update(lambda old: old or {})

    def ask_for(self, found: Spent) -> None:
        """Tell the driver a call waits on ``found`` (idempotent: one write per limit)."""
        quantity, most = found.quantity, found.limit
        value = self.asking()
        if (value.get() or {}).get(quantity) != most:
            value.update(lambda old: {**(old or {}), quantity: most})

    def spend(self, usage: Mapping[str, float]) -> None:
        """Add what one call metered to the map's totals."""
        amounts = {q: usage[q] for q, _ in self.limits if usage.get(q)}
        if amounts:
            self._ledger().update(lambda old: _added(old, amounts))

    def close(self, where: Where | None = None) -> None:
        """Forget the map's totals (the driver, once the map is over)."""
        self._ledger(where).remove()
        if self.asks:
            self.answers(where).remove()
            self.asking(where).remove()


def _added(old: Any, amounts: Mapping[str, float]) -> dict[str, float]:
    totals = dict(old or {})
    for quantity, amount in amounts.items():
        totals[quantity] = totals.get(quantity, 0.0) + amount
    return totals


def check_budget(budget: Any, key: str, on_budget: Any = None) -> Budget | None:
    """A validated ``Budget`` from ``map(budget=..., on_budget=...)`` (``None`` when not
    given). A limit of 0 starts no metered call (with ``on_budget``: asks first)."""
    if on_budget is not None and not callable(on_budget):
        raise ValueError(f"on_budget={on_budget!r}: give a function ask(quantity, spent, "
                         "limit) returning a new limit to go on, or None to stop")
    if budget is None:
        if on_budget is not None:
            raise ValueError('on_budget= needs a budget to ask about, e.g. budget={"cost": '
                             "20.0}, on_budget=ask")
        return None
    hint = 'give a dict of quantity -> number >= 0, e.g. budget={"cost": 20.0}'
    if not isinstance(budget, Mapping) or not budget:
        raise ValueError(f"budget={budget!r}: {hint}")
    limits = []
    for quantity, most in budget.items():
        if not isinstance(quantity, str) or quantity == "calls" or quantity.startswith("_"):
            raise ValueError(f"budget: {quantity!r} is not a metered quantity (what nodes pass "
                             f"to meter(); 'calls' is not budgeted); {hint}")
        if not valid_limit(most):
            raise ValueError(f"budget[{quantity!r}]={most!r}: {hint}")
        limits.append((quantity, float(most)))
    return Budget(tuple(limits), key, on_budget is not None)


def valid_limit(most: Any) -> bool:
    """A budget limit: a finite number >= 0 (not a bool)."""
    return not isinstance(most, bool) and isinstance(most, (int, float)) and (
        most >= 0 and math.isfinite(most))
