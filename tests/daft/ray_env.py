"""The environment of the Ray processes the tests start (a local Ray, a 2-node cluster)."""

from __future__ import annotations

# No usage stats and no auth; workers at the tests' niceness (Ray's default 15 starves them on
# a loaded machine).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_worker_niceness": "0",
           # nothing here reads metrics, task events or event stats, and no test runs near
           # the memory limit (the monitor reads every worker's memory 4 times a second)
           "RAY_enable_metrics_collection": "0", "RAY_task_events_report_interval_ms": "0",
           "RAY_event_stats": "0", "RAY_memory_monitor_refresh_ms": "0",
           # idle workers stay (Ray stops those beyond the CPUs after 1 s, then starts new
           # ones, each a Python process importing ray, daft and our code)
           "RAY_idle_worker_killing_time_threshold_ms": "600000"}
