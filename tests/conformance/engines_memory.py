"""The local engine with every limit in this process: the policy and usage behaviours run
against ``policies.memory.MemoryLimits`` (a limits backend registered with ``limits.using``
while the engine runs a map), as httpx's tests run clients over a ``MockTransport``."""

from __future__ import annotations

from typing import Any

from hypernodes_dist import GraphEngine
from hypernodes_dist.policies.limits import using
from hypernodes_dist.policies.memory import MemoryLimits

# the conformance modules whose tests run on this variant too
MODULES = ("test_policies", "test_usage", "test_signals", "test_api_limits")


class MemoryLimitsEngine(GraphEngine):
    """``GraphEngine`` whose maps keep their limits in a ``MemoryLimits`` of their own."""

    def __init__(self) -> None:
        super().__init__()
        self.limits = MemoryLimits()

    def execute_map(self, job: Any, sink: Any) -> None:
        with using(self.limits):
            super().execute_map(job, sink)

    def driver_shared(self, key: str) -> Any:
        """The driver reaches the map's shared values (``on_budget``) in the same backend."""
        return self.limits.shared(key)

    def execute_dataset(self, job: Any, report: Any) -> None:
        with using(self.limits):
            super().execute_dataset(job, report)
