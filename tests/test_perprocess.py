"""One per-process registry object: every registry of this process's state registers in
``PROCESS``, and a forked child starts with all of them empty, as a spawned process does."""

from __future__ import annotations

import json
import os
import sys

import pytest

import hypernodes_dist.engines.channels as channels
import hypernodes_dist.execution.batching as batching
import hypernodes_dist.execution.progress as progress
import hypernodes_dist.policies.learned as learned
import hypernodes_dist.policies.retryafter as retryafter
import hypernodes_dist.policies.stats  # noqa: F401 -- read from sys.modules below
import hypernodes_dist.policies.usage as usage
from hypernodes_dist.execution.context import worker_id
from hypernodes_dist.perprocess import PROCESS, Memo, Table

stats = sys.modules["hypernodes_dist.policies.stats"]  # (the package exports a stats())

CORE = {"policies.limits", "policies.machine", "policies.gates", "policies.learned",
        "policies.aimd", "policies.retryafter", "policies.usage.seen",
        "policies.usage.estimates", "policies.usage.quantities", "policies.stats",
        "resources", "execution.syncio", "execution.batching", "execution.context.worker",
        "execution.progress.local", "execution.progress.tickers", "engines.channels.sender",
        "execution.batchwait.stores", "execution.batchwait.copies",
        "execution.batchwait.supported"}


def test_every_per_process_registry_is_in_process() -> None:
    import hypernodes_dist.execution.batch  # noqa: F401 -- loads the executor's registries
    import hypernodes_dist.resources  # noqa: F401

    assert CORE <= set(PROCESS.names())


def test_engine_registries_are_in_process() -> None:
    pytest.importorskip("hypernodes_dask")
    pytest.importorskip("hypernodes_daft")
    import hypernodes_daft.datasets  # noqa: F401
    import hypernodes_daft.limits  # noqa: F401
    import hypernodes_daft.teardown  # noqa: F401
    import hypernodes_daft.udf  # noqa: F401
    import hypernodes_dask.compile  # noqa: F401
    import hypernodes_dask.progress  # noqa: F401
    import hypernodes_dask.shipping  # noqa: F401

    assert {"daft.udf.mailbox", "daft.udf.cancelled", "daft.datasets.mail", "daft.limits",
            "daft.teardown", "dask.compile.flowing", "dask.progress.receivers",
            "dask.progress.subscribed", "dask.shipping.loaded"} <= set(PROCESS.names())


def _filled() -> dict[str, int]:
    """How much each registry the parent filled holds here."""
    return {
        "estimates": len(usage._ESTIMATES), "quantities": len(usage._QUANTITIES),
        "stats": len(stats._STATS), "learned": len(learned._LEARNED.values),
        "holdoffs": len(retryafter._HOLDOFFS.values), "tickers": len(progress._TICKERS.values),
        "local": len(progress._LOCAL), "sender": len(channels._SENDER.values),
        "filled": len(_MEMO.values), "table": len(_TABLE),
    }


_MEMO: Memo[str] = Memo("tests.perprocess.memo")
_TABLE: Table[str, int] = Table("tests.perprocess.table")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_starts_with_every_registry_empty_and_its_locks_free() -> None:
    usage.observed("n", {"tokens": 3.0})
    stats.record("n", "retry")
    learned.learned_for("llm")
    retryafter.holdoff_for("n")
    channel = progress.LocalChannel(lambda updates: None)
    progress.ticker(channel)
    channels._sender()
    _MEMO.get("k", lambda: "v")
    _TABLE["k"] = 1
    parent_id = worker_id()
    assert all(_filled().values()), _filled()
    read, write = os.pipe()
    with _TABLE.lock:  # held while forking: the child's copy would be held by no thread
        pid = os.fork()
    if pid == 0:  # the child: report and leave at once
        try:
            got = {**_filled(), "lock_free": _TABLE.lock.acquire(timeout=5),
                   "batching_lock_free": batching._lock.acquire(timeout=5),
                   "new_id": worker_id() != parent_id}
            os.write(write, json.dumps(got).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
    assert all(_filled().values())  # the parent keeps its own
    channel.close()
    assert child == {**{k: 0 for k in _filled()}, "lock_free": True,
                     "batching_lock_free": True, "new_id": True}, child
