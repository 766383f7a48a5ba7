"""Usage: what node calls say they cost (``meter``), per execution and summed.

``meter(tokens=812, cost=0.0001)`` inside a node call adds to that execution's usage. The
guard (``execution/guard.py``) opens one ``Metering`` per execution (all its attempts: a
failed attempt that was paid for counts) for every node that may meter: one whose code names
``meter`` (``may_meter``: its function, and the functions it calls, three levels deep) or
that has a ``rate_limit`` on a metered quantity. A node that meters without being seen to
(``meter`` reached through a library, say) still counts: its usage goes to the node's
total for that batch (``NODE``), and the node is guarded from its next batch on.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any, NamedTuple

from hypernodes_dist.perprocess import Table

__all__ = ["meter", "count_batch_call", "Usage", "Metering", "NODE", "CALL", "NodeTotal", "may_meter", "add_usage",
           "estimate", "observed", "quantities_of", "node_total", "seen_metering"]

Usage = dict[str, float]

# The execution being metered (one per guarded call), and the fallback of a node's batch.
CALL: ContextVar[Usage | None] = ContextVar("hn_usage_call", default=None)
NODE: ContextVar[NodeTotal | None] = ContextVar("hn_usage_node", default=None)
_SEEN: Table[str, bool] = Table("policies.usage.seen")  # nodes found metering unguarded


def _running_usage() -> Usage:
    """The usage ``meter`` adds to: the running call's, else its node's unguarded total."""
    usage = CALL.get()
    if usage is None:
        total = NODE.get()
        if total is None:
            raise RuntimeError(
                "meter() was called outside a node call: call it inside the function of a "
                "node that a run(), map() or iter() is executing")
        _SEEN[total.name] = True
        usage = total.usage
    return usage


def count_batch_call(cost: float | None) -> None:
    """``meter(batch_calls=1, batch_cost=cost)`` (``cost`` None: none) without ``meter``'s
    checks: the engine's own count of a call a batch answered (``cost``: what its call
    metered, checked when it was)."""
    usage = _running_usage()
    usage["batch_calls"] = usage.get("batch_calls", 0) + 1
    if cost is not None:
        usage["batch_cost"] = usage.get("batch_cost", 0) + cost


def meter(**quantities: float) -> None:
    """Add ``quantities`` (non-negative numbers) to the usage of the running node call.

    Usage shows on ``NodeEndEvent.usage``, map items' ``history``, ``trace.summary`` and
    ``MapResult.usage``/``DatasetResult.usage``; ``rate_limit={"tokens": "N/minute"}`` and
    ``map(budget={"cost": 5.0})`` count it. Raises ``RuntimeError`` outside a node call."""
    usage = _running_usage()
    for name, amount in quantities.items():
        if name == "calls" or name.startswith("_"):
            raise ValueError(f"meter({name}=...): 'calls' is counted by the engine and names "
                             "starting with '_' are reserved; pick another quantity name")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not (
                amount >= 0 and math.isfinite(amount)):
            raise ValueError(f"meter({name}={amount!r}): quantities are non-negative finite "
                             "numbers (e.g. tokens=r.usage.total_tokens)")
        usage[name] = usage.get(name, 0) + amount


class Metering:
    """One execution's usage: ``with Metering() as usage:`` makes ``meter`` add to ``usage``."""

    __slots__ = ("usage", "_token")

    def __init__(self, usage: Usage | None = None) -> None:
        self.usage: Usage = {} if usage is None else usage

    def __enter__(self) -> Usage:
        self._token = CALL.set(self.usage)
        return self.usage

    def __exit__(self, *exc: object) -> None:
        CALL.reset(self._token)


class NodeTotal(NamedTuple):
    """What the calls of node ``name`` in one batch metered outside a guarded call."""

    name: str
    usage: Usage


def node_total(name: str) -> NodeTotal:
    """A fresh fallback total for the calls of node ``name`` in one batch (see ``NODE``)."""
    return NodeTotal(name, {})


def add_usage(into: dict[str, float], usage: Mapping[str, float]) -> dict[str, float]:
    """``into`` += ``usage``, quantity by quantity; returns ``into``."""
    for name, amount in usage.items():
        into[name] = into.get(name, 0) + amount
    return into


def seen_metering(name: str) -> bool:
    """Whether node ``name`` was found metering outside a guarded call (in this process)."""
    return name in _SEEN


# ------------------------------------------------------------------ static detection


def may_meter(func: Any, depth: int = 3) -> bool:
    """Whether ``func``'s code (or that of the functions it names, ``depth`` levels deep)
    names ``meter``."""
    return _names_meter(func, depth, set())


def _function_of(func: Any) -> types.FunctionType | None:
    while isinstance(func, functools.partial):
        func = func.func
    func = inspect.unwrap(func) if callable(func) else func
    if isinstance(func, types.MethodType):
        func = func.__func__
    if not isinstance(func, types.FunctionType):
        call = vars(type(func)).get("__call__")
        func = call if isinstance(call, types.FunctionType) else None
    return func


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _names_meter(func: Any, depth: int, active: set[int]) -> bool:
    fn = _function_of(func)
    if fn is None or id(fn) in active or "site-packages" in fn.__code__.co_filename:
        return False
    active.add(id(fn))
    cells = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
    names = {n for code in _codes(fn.__code__) for n in code.co_names}
    found = [fn.__globals__.get(n) for n in names] + cells
    for obj in found:
        if obj is meter or (isinstance(obj, types.ModuleType) and "meter" in names
                            and getattr(obj, "meter", None) is meter):
            return True
    return depth > 0 and any(_names_meter(obj, depth - 1, active) for obj in found
                             if isinstance(obj, types.FunctionType))


def _filled(cell: Any) -> bool:
    try:
        return cell.cell_contents is not _filled
    except ValueError:
        return False


# what this process's calls metered, by node and quantity (a forked child estimates anew,
# as a spawned one)
_ESTIMATES: Table[str, dict[str, Estimate]] = Table("policies.usage.estimates")
_QUANTITIES: Table[str, frozenset[str]] = Table("policies.usage.quantities")  # by node


def estimate(node: str, quantity: str) -> float:
    """What one call of ``node`` is expected to meter of ``quantity`` (this process)."""
    found = _ESTIMATES.get(node)
    of = None if found is None else found.get(quantity)
    return 0.0 if of is None else of.expected()


def observed(node: str, usage: Mapping[str, float]) -> None:
    """Learn from what one execution of ``node`` metered."""
    found = _ESTIMATES.get(node)
    if found is None:
        found = _ESTIMATES[node] = {}
    for quantity, amount in usage.items():
        of = found.get(quantity)
        if of is None:
            of = found[quantity] = Estimate()
            _QUANTITIES[node] = _QUANTITIES.get(node, frozenset()) | {quantity}
        of.observe(amount)


def quantities_of(node: str) -> frozenset[str] | None:
    """The quantities ``node``'s calls metered in this process (``None``: none metered yet)."""
    return _QUANTITIES.get(node)


class Estimate:
    """What one call of a node is expected to meter of one quantity in this process: the
    mean of its last calls (0 before the first), for rate limits that reserve at the start
    and correct by the amount metered at the end."""

    __slots__ = ("mean", "seen")

    def __init__(self) -> None:
        self.mean, self.seen = 0.0, 0

    def expected(self) -> float:
        return self.mean

    def observe(self, amount: float) -> None:
        self.seen += 1
        weight = max(1.0 / self.seen, 0.05)  # the running mean of about the last 20 calls
        self.mean += (amount - self.mean) * weight
