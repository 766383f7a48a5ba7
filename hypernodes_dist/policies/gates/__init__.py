"""A node's policy as a list of gates (``base.Gate``), one module per concern.

``gates_for(policy, budget)`` builds the gates in force for a node, in the order an attempt
passes them: the Retry-After hold-off (every guarded node), the concurrency places and
units, the calls rate, each quantity rate, the map's budget (nodes that meter, last). The
gates of a policy are built once per process and limits backend; a node with no limit pays
for none. A new concern is a module here and a line in ``_build``.
"""

from __future__ import annotations

from hypernodes_dist.perprocess import Memo
from hypernodes_dist.policies.budget import Budget
from hypernodes_dist.policies.gates.base import Entry, Gate, Host
from hypernodes_dist.policies.gates.budget import BudgetGate
from hypernodes_dist.policies.gates.concurrency import ConcurrencyGate
from hypernodes_dist.policies.gates.holdoff import RETRY_AFTER_SPREAD, HoldOffGate
from hypernodes_dist.policies.gates.learned import LearnedGate
from hypernodes_dist.policies.gates.quantity import PACE, QuantityGate
from hypernodes_dist.policies.gates.rate import RateGate
from hypernodes_dist.policies.limits import backend
from hypernodes_dist.policies.spec import Policy

__all__ = ["Gate", "Entry", "Host", "gates_for", "PACE", "RETRY_AFTER_SPREAD"]

_BUILT: Memo[tuple[Gate, ...]] = Memo("policies.gates")  # a forked child's start anew


def gates_for(policy: Policy, budget: Budget | None = None,
              checks: bool = True) -> tuple[Gate, ...]:
    """The gates of ``policy`` in this process, then the ``budget``'s (a metering node's;
    ``checks=False``: it only counts what calls metered, e.g. a ``batch_api`` node, whose
    requests the budget checked when they went into a batch)."""
    where = backend()
    found = _BUILT.get((where.name, where.directory, policy), lambda: _build(policy))
    return found if budget is None else (*found, BudgetGate(policy.node, budget, checks))


def _build(p: Policy) -> tuple[Gate, ...]:
    """Hold-offs, concurrency units, rate turns, quantities: the node's, then each of its
    resources' (``p.shared``, in key order); learned limits; the hold-offs again."""
    owners = (p, *p.shared)
    most = p.max_retry_after
    gates: list[Gate] = [HoldOffGate(o.node, most) for o in owners]
    api = p.shared[0].node if p.shared else None  # the node's back-off is its API's
    gates += [ConcurrencyGate(o.node, o.concurrency, api if o is p else None)
              for o in owners if o.concurrency]
    gates += [RateGate(o.node, *o.rate, o.rate_text) for o in owners if o.rate]
    gates += [QuantityGate(p.node, q, o.node) for o in owners for q in o.quantities]
    gates += [LearnedGate(p.node, s.node) for s in p.shared if not s.declares]
    if len(gates) > 1:  # something may wait: a hold-off that began meanwhile holds it too
        gates += [HoldOffGate(o.node, most, recheck=True) for o in owners]
    return tuple(gates)

