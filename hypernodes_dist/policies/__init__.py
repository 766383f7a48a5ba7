"""Per-node call policies: retries with backoff, timeouts, concurrency and rate limits.

``spec`` parses what ``@node`` declares into a ``Policy``; ``gates`` turns it into the
gates an attempt passes (one module per concern); ``limits`` keeps this
process's side of each limit (units held, calls waiting) over a shared backend
(``backend.LimitsBackend``):
``machine`` (every process of one machine: kernel semaphores and a locked rate file) or
one an engine plugin registers (``hypernodes_dask``: a ``distributed`` cluster);
``stats`` counts what policies did. The guard that applies a policy around each call is
``hypernodes_dist.execution.guard``.
"""

from hypernodes_dist.policies.backend import LimitsBackend, RateStore, Semaphore, SharedValue
from hypernodes_dist.policies.limits import backend, limiter, register_backend, using
from hypernodes_dist.policies.machine import limits_dir, remove_semaphores
from hypernodes_dist.policies.spec import (
    Exponential,
    NodeTimeoutError,
    Policy,
    backoff_delay,
    exponential,
    make_policy,
    parse_rate_limit,
    parse_retry_on,
)
from hypernodes_dist.policies.stats import record, reset_stats, stats

__all__ = [
    "Policy",
    "NodeTimeoutError",
    "Exponential",
    "exponential",
    "make_policy",
    "parse_rate_limit",
    "parse_retry_on",
    "backoff_delay",
    "limits_dir",
    "remove_semaphores",
    "register_backend",
    "using",
    "LimitsBackend",
    "Semaphore",
    "RateStore",
    "SharedValue",
    "backend",
    "limiter",
    "record",
    "stats",
    "reset_stats",
]
