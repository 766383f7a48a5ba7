"""``map(budget={quantity: max})``: a map stops starting metered calls once it spent that.

The totals a map has metered live in the limits backend (``limits.shared``:
every process of the machine, or the cluster on ``distributed``), under the map's run id,
so every worker sees what the others spent. The guard asks ``check`` before a metered call
starts and ``spend``s what the call metered when it ends: a call in flight when the budget
is reached finishes and is kept, so the overshoot is at most the calls in flight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hypernodes_dist.errors import BudgetExceededError
from hypernodes_dist.policies.backend import SharedValue
from hypernodes_dist.policies.limits import shared

__all__ = ["Budget", "check_budget"]


@dataclass(frozen=True)
class Budget:
    """The limits of one map (picklable: it travels with the batch settings)."""

    limits: tuple[tuple[str, float], ...]
    key: str  # the map's run-id prefix: one ledger per map call

    def _ledger(self) -> SharedValue:
        return shared(f"budget-{self.key}")

    def spent(self) -> dict[str, float]:
        """What the map has metered so far, every process together."""
        return dict(self._ledger().get() or {})

    def check(self, node: str, meters: frozenset[str] | None, item: int | None) -> None:
        """Raise ``BudgetExceededError`` when a quantity this node meters (``None``: not
        known yet, any) has reached its limit."""
        relevant = [(q, m) for q, m in self.limits if meters is None or q in meters]
        if not relevant:
            return
        spent = self.spent()
        for quantity, most in relevant:
            used = spent.get(quantity, 0.0)
            if used >= most:
                where = f"node {node!r}" if item is None else f"node {node!r} (item {item})"
                raise BudgetExceededError(
                    f"{where} did not start: the map's budget {quantity}={most:g} is spent "
                    f"({used:g} metered). Finished items are kept; rerun with a larger budget "
                    "(with a cache or into=, finished items are not paid again)",
                    quantity, used, most, node)

    def spend(self, usage: Mapping[str, float]) -> None:
        """Add what one call metered to the map's totals."""
        amounts = {q: usage[q] for q, _ in self.limits if usage.get(q)}
        if amounts:
            self._ledger().update(lambda old: _added(old, amounts))

    def close(self) -> None:
        """Forget the map's totals (the driver, once the map is over)."""
        self._ledger().remove()


def _added(old: Any, amounts: Mapping[str, float]) -> dict[str, float]:
    totals = dict(old or {})
    for quantity, amount in amounts.items():
        totals[quantity] = totals.get(quantity, 0.0) + amount
    return totals


def check_budget(budget: Any, key: str) -> Budget | None:
    """A validated ``Budget`` from ``map(budget=...)`` (``None`` when not given)."""
    if budget is None:
        return None
    hint = 'give a dict of quantity -> positive number, e.g. budget={"cost": 20.0}'
    if not isinstance(budget, Mapping) or not budget:
        raise ValueError(f"budget={budget!r}: {hint}")
    limits = []
    for quantity, most in budget.items():
        if not isinstance(quantity, str) or quantity == "calls" or quantity.startswith("_"):
            raise ValueError(f"budget: {quantity!r} is not a metered quantity (what nodes pass "
                             f"to meter(); 'calls' is not budgeted); {hint}")
        if isinstance(most, bool) or not isinstance(most, (int, float)) or not (
                most > 0 and math.isfinite(most)):
            raise ValueError(f"budget[{quantity!r}]={most!r}: {hint}")
        limits.append((quantity, float(most)))
    return Budget(tuple(limits), key)

