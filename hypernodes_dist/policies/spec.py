"""What a node's policy keywords mean: validation, the ``Policy`` value, backoff delays.

``@node(retries=2, backoff="exponential", retry_on=ConnectionError, timeout=30,
concurrency=4, rate_limit="100/minute")`` builds a ``Policy``. ``rate_limit`` may also be a
dict ``{quantity: "N/window"}``: ``"calls"`` limits call starts, any other quantity what calls
``meter`` (``policies.usage``) (``node.policy``; ``None``
when no keyword that acts is set, and then executors call the function exactly as
before). Bad values fail when the node is decorated, naming the node and what to write.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from hypernodes_dist.policies.signals import MAX_RETRY_AFTER

__all__ = [
    "Policy",
    "NodeTimeoutError",
    "Exponential",
    "exponential",
    "make_policy",
    "parse_rate_limit",
    "parse_rate_limits",
    "parse_retry_on",
    "QuantityRate",
    "backoff_delay",
    "check_concurrency",
    "check_max_retry_after",
    "resource_limits",
]


class NodeTimeoutError(TimeoutError):
    """A node call exceeded its ``timeout``; names the node, the item and the limit."""

    def __init__(self, message: str, node: str = "", item: int | None = None,
                 limit: float = 0.0) -> None:
        super().__init__(message)
        self.node, self.item, self.limit = node, item, limit

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.node, self.item, self.limit), self.__dict__)


@dataclass(frozen=True)
class Exponential:
    """``backoff="exponential"``: ``base * 2**(attempt-1)`` seconds, capped, with jitter.

    Jitter draws the wait uniformly from ``[d/2, d]`` so the workers of a cluster that fail
    together do not retry together.
    """

    base: float = 0.5
    cap: float = 30.0
    jitter: bool = True

    def __call__(self, attempt: int) -> float:
        d = min(self.cap, self.base * 2 ** (attempt - 1))
        return random.uniform(d / 2, d) if self.jitter else d


def exponential(base: float = 0.5, cap: float = 30.0, jitter: bool = True) -> Exponential:
    """A tuned exponential backoff: ``@node(retries=5, backoff=exponential(base=1))``."""
    if base < 0 or cap < 0:
        raise ValueError("exponential backoff: base and cap must be >= 0 seconds")
    return Exponential(float(base), float(cap), jitter)


@dataclass(frozen=True)
class QuantityRate:
    """``rate_limit={quantity: "count/per"}`` for a metered quantity (not ``"calls"``)."""

    quantity: str
    count: float
    per: float

    @property
    def text(self) -> str:
        return f"{self.quantity}: {self.count:g}/{self.per:g}s"


@dataclass(frozen=True)
class Policy:
    """What a node's keywords ask for; picklable (it travels with the plan)."""

    node: str
    retries: int = 0
    backoff: Any = None  # None | seconds | Exponential | callable(attempt) -> seconds
    timeout: float | None = None
    concurrency: int | None = None
    rate: tuple[float, float] | None = None  # (count, per seconds)
    retry_on: tuple[type[BaseException], ...] = (Exception,)  # the errors worth retrying
    quantities: tuple[QuantityRate, ...] = ()  # rate limits on metered quantities
    max_retry_after: float = MAX_RETRY_AFTER  # a longer Retry-After is ignored (not clamped)
    # the limits of the resources the node receives (``@resource(concurrency=, rate_limit=)``),
    # each a Policy named by its resource's key: shared by every node receiving it
    shared: tuple[Policy, ...] = ()

    def retryable(self, exc: BaseException) -> bool:
        """Whether a failed attempt with ``exc`` may be retried (attempts left aside)."""
        return isinstance(exc, self.retry_on)

    @property
    def waits(self) -> bool:
        """Whether a call may wait (back-off, a limit, a timeout), not just re-run."""
        return bool(self.backoff or self.timeout or self.concurrency or self.rate
                    or self.quantities or self.shared)

    @property
    def meters(self) -> bool:
        """Whether a rate limit (its own or a resource's) is on a metered quantity."""
        return bool(self.quantities) or any(s.quantities for s in self.shared)

    @property
    def declares(self) -> bool:
        """Whether any limit is declared (a resource declaring none learns its provider's)."""
        return bool(self.concurrency or self.rate or self.quantities)

    @property
    def rate_text(self) -> str:
        assert self.rate is not None
        count, per = self.rate
        return f"{count:g}/{per:g}s"


_UNITS = {
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-zA-Z]+)\s*$")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_rate_limit(value: Any, node: str = "?") -> tuple[float, float]:
    """``"100/minute"``, ``"5/s"``, ``"30/10s"`` or ``(count, seconds)`` -> ``(count, seconds)``."""
    hint = ('use "100/minute", "10/s", "30/10s" (units s, m/min/minute, h/hour, d/day) '
            "or a (count, seconds) tuple")
    if isinstance(value, str):
        m = _RATE.match(value)
        unit = _UNITS.get(m.group(3).lower()) if m else None
        if m is None or unit is None:
            raise ValueError(f"node {node!r}: cannot read rate_limit={value!r}; {hint}")
        count, per = float(m.group(1)), float(m.group(2) or 1) * unit
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(map(_number, value)):
        count, per = float(value[0]), float(value[1])
    else:
        raise ValueError(f"node {node!r}: rate_limit must be a string or a (count, seconds) "
                         f"tuple, got {value!r}; {hint}")
    if count <= 0 or per <= 0:
        raise ValueError(f"node {node!r}: rate_limit={value!r} needs a positive count and period")
    return count, per


def parse_rate_limits(value: Any, node: str = "?"
                      ) -> tuple[tuple[float, float] | None, tuple[QuantityRate, ...]]:
    """``rate_limit`` -> ``(calls rate or None, quantity rates)``: a string or tuple limits
    calls; a dict maps ``"calls"`` or a metered quantity to one of those."""
    if not isinstance(value, dict):
        return parse_rate_limit(value, node), ()
    if not value:
        raise ValueError(f"node {node!r}: rate_limit={{}} limits nothing; give "
                         '{"calls": "500/minute", "tokens": "200000/minute"} or leave it out')
    calls, quantities = None, []
    for quantity, spec in value.items():
        if not isinstance(quantity, str) or not quantity.isidentifier():
            raise ValueError(f"node {node!r}: rate_limit keys are quantity names ('calls' or "
                             f"what the node meters, e.g. 'tokens'), got {quantity!r}")
        count, per = parse_rate_limit(spec, node)
        if quantity == "calls":
            calls = (count, per)
        else:
            quantities.append(QuantityRate(quantity, count, per))
    return calls, tuple(quantities)


def parse_retry_on(value: Any, node: str = "?") -> tuple[type[BaseException], ...]:
    """``retry_on``: an exception class or a tuple of them -> a tuple of classes."""
    classes = value if isinstance(value, tuple) else (value,)
    if not classes or not all(isinstance(c, type) and issubclass(c, Exception) for c in classes):
        raise ValueError(
            f"node {node!r}: retry_on must be an exception class or a tuple of them (e.g. "
            f"retry_on=(ConnectionError, TimeoutError)), got {value!r}"
        )
    return classes


def check_concurrency(value: Any, where: str) -> int | None:
    """``concurrency=``: ``None`` or an int >= 1 (0 would start nothing: an error here);
    ``where`` names the owner ("node 'x'", "resource 'llm'")."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{where}: concurrency must be an int >= 1 (or None for no limit), "
                         f"got {value!r}")
    return value


def check_max_retry_after(value: Any, node: str) -> float:
    """``max_retry_after=``: positive seconds (a longer Retry-After is ignored)."""
    if not _number(value) or not value > 0:
        raise ValueError(f"node {node!r}: max_retry_after must be positive seconds (a longer "
                         f"Retry-After is ignored), got {value!r}")
    return float(value)


def make_policy(node: str, retries: Any = 0, backoff: Any = None, timeout: Any = None,
                concurrency: Any = None, rate_limit: Any = None,
                retry_on: Any = Exception, max_retry_after: Any = MAX_RETRY_AFTER
                ) -> Policy | None:
    """Validate a node's policy keywords; ``None`` when none is set (no wrapper at all)."""
    retry_classes = parse_retry_on(retry_on, node)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"node {node!r}: retries must be an int >= 0, got {retries!r}")
    if backoff is not None and not callable(backoff):
        if backoff == "exponential":
            backoff = Exponential()
        elif not _number(backoff) or backoff < 0:
            raise ValueError(
                f"node {node!r}: backoff must be None, 'exponential', seconds >= 0 or a "
                f"callable(attempt) -> seconds, got {backoff!r}"
            )
    if timeout is not None and (not _number(timeout) or timeout <= 0):
        raise ValueError(f"node {node!r}: timeout must be positive seconds, got {timeout!r}")
    check_concurrency(concurrency, f"node {node!r}")
    most = check_max_retry_after(max_retry_after, node)
    rate, quantities = parse_rate_limits(rate_limit, node) if rate_limit is not None else (None, ())
    if not retries and timeout is None and concurrency is None and rate is None and not quantities:
        return None
    return Policy(node, retries, backoff, float(timeout) if timeout is not None else None,
                  concurrency, rate, retry_classes, quantities, max_retry_after=most)


def resource_limits(name: str, concurrency: Any = None, rate_limit: Any = None
                    ) -> Policy | None:
    """``@resource(concurrency=, rate_limit=)`` validated as a node's keywords (the same
    function, so the same rules), errors naming the resource; ``None``: none declared."""
    try:
        return make_policy(name, concurrency=concurrency, rate_limit=rate_limit)
    except ValueError as exc:
        raise ValueError(str(exc).replace(f"node {name!r}", f"resource {name!r}", 1)) from None


def backoff_delay(backoff: Any, attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
    if backoff is None:
        return 0.0
    if _number(backoff):
        return float(backoff)
    wait = float(backoff(attempt))
    if wait < 0:
        raise ValueError(f"backoff({attempt}) returned {wait} seconds; it must be >= 0")
    return wait
