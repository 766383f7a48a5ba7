"""Daft variants of the conformance engine fixture.

Daft fixes its runner once per process, so Daft on Ray runs in a pytest process of its own:
``HYPERNODES_CONFORMANCE_DAFT=ray`` selects the ``daft-ray`` variant instead of the native
ones (``tests/daft/test_ray_conformance.py`` starts that process for the modules in
``RAY_MODULES``), over one local Ray started once for the session.
"""

from __future__ import annotations

import os

from hypernodes_daft import DaftEngine

RAY = os.environ.get("HYPERNODES_CONFORMANCE_DAFT") == "ray"
# the conformance modules whose tests run on Daft on Ray (limits, usage, budgets, signals,
# resources built once per Ray worker and torn down when the engine closes)
RAY_MODULES = ("test_policies", "test_usage", "test_signals", "test_resources", "test_batch_api")


def ray_engine() -> DaftEngine:
    """``DaftEngine(runner="ray")`` over a local Ray of 2 CPUs (started once per process)."""
    import ray  # only in the Daft-on-Ray session

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    return DaftEngine(runner="ray", batch_size=4)


ENGINES = [("daft-ray", ray_engine)] if RAY else [
    ("daft", DaftEngine),
    ("daft-batch7", lambda: DaftEngine(batch_size=7)),
]
