"""Per-node call policies: retries with backoff, timeouts, concurrency and rate limits.

``spec`` parses what ``@node`` declares into a ``Policy``; ``limits`` holds the limit
backends (machine-wide lock files; engine plugins register cluster-wide ones). The guard
that applies a policy around each call is ``hypernodes_dist.execution.guard``.
"""

from hypernodes_dist.policies.limits import limits_dir, register_backend, reset_stats, stats
from hypernodes_dist.policies.spec import (
    Exponential,
    NodeTimeoutError,
    Policy,
    backoff_delay,
    exponential,
    make_policy,
    parse_rate_limit,
)

__all__ = [
    "Policy",
    "NodeTimeoutError",
    "Exponential",
    "exponential",
    "make_policy",
    "parse_rate_limit",
    "backoff_delay",
    "limits_dir",
    "register_backend",
    "stats",
    "reset_stats",
]
