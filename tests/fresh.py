"""Processes that share nothing with the test process but what they are handed: Dask's worker
processes, other machines writing one store, other processes of one machine holding one limit.

They start from a fork server that imported the project once: each is a fresh interpreter, as
a spawned process is (it shares no state with the test, imports the main module by its path,
unpickles what it runs), without importing the project again (~1 CPU s each; a run starts
~150). ``start()`` starts the fork server when a test process starts (``tests/conftest.py``):
its processes keep the environment it started with, and a test's monkeypatched variables
must not be frozen into every later test's processes.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver

FRESH = multiprocessing.get_context("forkserver")
PRELOAD = ["hypernodes_dist", "hypernodes_dask", "distributed", "pyarrow.dataset"]

# the loopback S3 server's (moto's) made-up credentials, in every test process's environment
# before its fork server starts, so that the S3 tests' processes have them too
S3_ENV = {"AWS_ACCESS_KEY_ID": "hn-test", "AWS_SECRET_ACCESS_KEY": "hn-test",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

# Dask's process pools and LocalClusters started by the test processes use it too
DASK_CONFIG = {"multiprocessing.context": "forkserver",
               "distributed.worker.multiprocessing-method": "forkserver"}


def start() -> None:
    """Start this process's fork server now, with the environment the process has now."""
    FRESH.set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()
