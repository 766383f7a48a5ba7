"""The budget gate: ``map(budget={quantity: max})`` for a node that meters.

``enter`` refuses the attempt (``BudgetExceededError``) once the map has spent a quantity
the node meters; it comes last, so a call that waited at the other gates finds the budget as
it is when the call would start. With ``map(on_budget=ask)`` the attempt parks instead: it
tells the driver (``Budget.ask_for``) and looks again every ``ASK_POLL`` seconds until the
driver's ``ask`` raised the limit (the call goes on) or stopped the quantity (refused as
without ``on_budget``). ``exit`` adds what the attempt metered to the map's totals (a paid
failed attempt counts too).
"""

from __future__ import annotations

from typing import ClassVar

from hypernodes_dist.policies.budget import ASK_POLL, Budget
from hypernodes_dist.policies.gates.base import Entry
from hypernodes_dist.policies.usage import quantities_of

__all__ = ["BudgetGate"]


class BudgetGate:
    holds: ClassVar[bool] = False
    meters: ClassVar[bool] = True

    def __init__(self, node: str, budget: Budget, checks: bool = True) -> None:
        self.node, self.budget, self.checks = node, budget, checks

    async def enter(self, entry: Entry) -> float:
        if not self.checks:  # an answered batch request is paid already: it goes on
            return 0.0
        budget, waited, asked = self.budget, 0.0, None
        while True:
            found, stopped = budget.over(quantities_of(self.node))
            if found is None:
                return waited
            if stopped or not budget.asks:
                raise budget.refusal(self.node, entry.item, found)
            budget.ask_for(found)  # each look: a lost write is written again
            if asked != found[::2]:  # once per spent limit: the driver asks, the call waits
                asked = found[::2]
                entry.throttle(0.0, f"budget {found.quantity}={found.limit:g} spent: waiting "
                               "for on_budget")
            await entry.sleep(ASK_POLL)
            waited += ASK_POLL

    def exit(self, entry: Entry, error: BaseException | None) -> None:
        metered = entry.metered()
        if metered:
            self.budget.spend(metered)
