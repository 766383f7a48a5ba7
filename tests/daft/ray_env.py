"""The environment of the Ray processes the tests start (a local Ray, a 2-node cluster)."""

from __future__ import annotations

# No usage stats and no auth; workers at the tests' niceness (Ray's default 15 starves them on
# a loaded machine).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_worker_niceness": "0"}
