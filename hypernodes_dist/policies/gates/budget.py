"""The budget gate: ``map(budget={quantity: max})`` for a node that meters.

``enter`` refuses the attempt (``BudgetExceededError``) once the map has spent a quantity
the node meters; it comes last, so a call that waited at the other gates finds the budget as
it is when the call would start. ``exit`` adds what the attempt metered to the map's totals
(a paid failed attempt counts too).
"""

from __future__ import annotations

from typing import ClassVar

from hypernodes_dist.policies.budget import Budget
from hypernodes_dist.policies.gates.base import Entry
from hypernodes_dist.policies.usage import quantities_of

__all__ = ["BudgetGate"]


class BudgetGate:
    holds: ClassVar[bool] = False
    meters: ClassVar[bool] = True

    def __init__(self, node: str, budget: Budget) -> None:
        self.node, self.budget = node, budget

    async def enter(self, entry: Entry) -> float:
        self.budget.check(self.node, quantities_of(self.node), entry.item)
        return 0.0

    def exit(self, entry: Entry, error: BaseException | None) -> None:
        metered = entry.metered()
        if metered:
            self.budget.spend(metered)
