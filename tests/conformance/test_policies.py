"""Node call policies on every engine: retries, timeouts, concurrency and rate limits.

Attempts, intervals and start times are recorded in files (worker processes share no
memory with the driver). The rate-limit test is the one place a test asserts time bounds
(lower ones): the limit itself is the behaviour. A timed-out call is held until the map has
returned, so "the map did not wait for it" is a fact, not a wall-clock guess.
"""

from __future__ import annotations

import time

import pytest

from hypernodes_dist import Graph
from hypernodes_dist.policies import NodeTimeoutError

from . import policy_graphs as P


class Policies:
    def __init__(self) -> None:
        self.events = []
        self.errors = []

    def on_policy(self, event) -> None:
        self.events.append(event)

    def on_node_error(self, event) -> None:
        self.errors.append(event)


@pytest.mark.parametrize("flaky", [P.pol_flaky, P.pol_aflaky], ids=["sync", "async"])
def test_two_failures_then_success_with_retries_2(engine, logs, flaky):
    seen = Policies()
    xs = list(range(9))
    res = Graph([flaky, P.pol_after], engine=engine, callbacks=[seen]).map(
        {"x": xs, "log_dir": logs}, map_over="x"
    )
    assert [r["z"] for r in res] == [x * 10 + 1 for x in xs]
    tag = "flaky" if flaky is P.pol_flaky else "aflaky"
    assert [P.attempts(logs, tag, x) for x in xs] == [3] * len(xs)  # only the failed node re-ran
    retries = [e for e in seen.events if e.kind == "retry"]
    assert sorted((e.item_index, e.attempt) for e in retries) == [
        (x, a) for x in xs for a in (1, 2)
    ]
    assert all(e.node_id == flaky.name and "FlakyError" in e.reason and e.run_id for e in retries)


def test_retries_in_the_per_item_scheduler(engine, logs):
    g = Graph([P.pol_route, P.pol_flaky, P.pol_skip, P.pol_after], engine=engine)
    res = g.map({"x": [0, 1, 2], "log_dir": logs}, map_over="x")
    assert [r["z"] for r in res] == [1, 11, 21]
    assert [P.attempts(logs, "flaky", x) for x in range(3)] == [3, 3, 3]


def test_retries_exhausted_report_the_last_error_and_attempts(engine, logs):
    g = Graph([P.pol_always_fails], engine=engine)
    with pytest.raises(ValueError, match="attempt 2 failed") as info:
        g.map({"x": [4], "log_dir": logs}, map_over="x")
    err = info.value
    assert err.hn_attempts == 2
    assert any("2 attempts" in n for n in err.__notes__)
    assert any("pol_always_fails" in n and "item 0" in n for n in err.__notes__)
    assert P.attempts(logs, "fails", 4) == 2

    seen = Policies()
    res = Graph([P.pol_always_fails], engine=engine, callbacks=[seen]).map(
        {"x": [5, 6], "log_dir": logs}, map_over="x", on_error="collect"
    )
    assert [r.status for r in res] == ["error", "error"]
    assert all("attempt 2 failed" in str(r.error) and r.error.hn_attempts == 2 for r in res)
    assert [P.attempts(logs, "fails", x) for x in (5, 6)] == [2, 2]
    assert sorted(e.attempts for e in seen.errors) == [2, 2]


def test_retry_on_retries_only_the_listed_errors(engine, logs):
    seen = Policies()
    res = Graph([P.pol_selective, P.pol_after], engine=engine, callbacks=[seen]).map(
        {"x": [0, 1, 2, 3], "log_dir": logs}, map_over="x", on_error="collect"
    )
    assert [r.status for r in res] == ["complete", "error", "complete", "error"]
    assert [res[0]["z"], res[2]["z"]] == [1, 21]
    assert [P.attempts(logs, "selective", x) for x in range(4)] == [2, 1, 2, 1]
    for r in (res[1], res[3]):  # a permanent error fails at once, with no retry note
        assert isinstance(r.error, ValueError) and r.error.hn_attempts == 1
        assert not any("retries" in note for note in r.error.__notes__)
    assert sorted(e.item_index for e in seen.events if e.kind == "retry") == [0, 2]
    assert sorted(e.attempts for e in seen.errors) == [1, 1]


def test_waits_are_reported_apart_from_running_time(engine, logs):
    class Seen(Policies):
        def __init__(self) -> None:
            super().__init__()
            self.ends = {}

        def on_node_end(self, event) -> None:
            self.ends[event.item_index] = event

    seen = Seen()
    res = Graph([P.pol_backoff], engine=engine, callbacks=[seen]).map(
        {"x": [0, 1, 2], "log_dir": logs}, map_over="x")
    assert [r["y"] for r in res] == [0, 1, 2]
    retries = {e.item_index: e for e in seen.events if e.kind == "retry"}
    assert sorted(retries) == [0, 1, 2] and {e.wait for e in retries.values()} == {0.2}
    for i, end in seen.ends.items():  # the successful attempt began after the back-off:
        assert end.started_at >= retries[i].timestamp + 0.2 - 0.01  # duration_ms is its own
        assert end.started_at + end.duration_ms / 1e3 <= end.timestamp + 0.01


@pytest.mark.parametrize("sleepy", [P.pol_sleepy, P.pol_asleepy], ids=["sync", "async"])
def test_timeout_fires_and_names_node_item_and_limit(engine, logs, sleepy):
    seen = Policies()
    try:
        res = Graph([sleepy], engine=engine, callbacks=[seen]).map(
            {"x": [0, 1, 2], "log_dir": logs}, map_over="x", on_error="collect"
        )
        assert not P.finished(logs)  # the map never waited for the held call
    finally:
        P.release(logs)
    assert [r.status for r in res] == ["complete", "error", "complete"]
    assert res[0]["y"] == 0 and res[2]["y"] == 2
    err = res[1].error
    assert isinstance(err, TimeoutError) and isinstance(err, NodeTimeoutError)
    assert sleepy.name in str(err) and "item 1" in str(err) and "timeout=0.2" in str(err)
    assert [(e.kind, e.item_index, e.wait) for e in seen.events] == [("timeout", 1, 0.2)]


@pytest.mark.parametrize("limited,bound,n", [(P.pol_conc2, 2, 12), (P.pol_conc1, 1, 14)],
                         ids=["async-2", "sync-1"])
def test_concurrency_caps_overlapping_calls(engine, logs, limited, bound, n):
    res = Graph([limited], engine=engine).map({"x": list(range(n)), "log_dir": logs}, map_over="x")
    assert [r["y"] for r in res] == list(range(n))
    calls, peak = P.max_overlap(logs)
    assert calls == n
    assert 1 <= peak <= bound


def test_rate_limit_spaces_calls(engine, logs):
    n = 4
    seen = Policies()
    t0 = time.time()
    res = Graph([P.pol_rated], engine=engine, callbacks=[seen]).map(
        {"x": list(range(n)), "log_dir": logs}, map_over="x"
    )
    assert [r["y"] for r in res] == list(range(n))
    # N calls at most R per second, evenly spaced: call k starts no sooner than k/R seconds
    # after the map began (however late a loaded machine runs any of them). Lower bounds on
    # purpose: the limit is the behaviour under test. 1 ms: the clock's drift over a sleep.
    starts = sorted(float(s) for s in (open(f"{logs}/starts.log").read().split()))
    assert len(starts) == n
    assert all(start - t0 >= k / P.RATE - 0.001 for k, start in enumerate(starts))
    assert any(e.kind == "throttle" and "rate_limit" in e.reason for e in seen.events)


def test_limits_backend_is_cluster_wide_on_distributed(engine):
    res = Graph([P.pol_backend], engine=engine).map({"x": [0, 1]}, map_over="x")
    distributed = getattr(engine, "scheduler", None) == "distributed"
    registered = getattr(engine, "limits", None)  # the in-process test backend
    ray = getattr(engine, "runner", None) == "ray"  # Daft on Ray: the job's limits actor
    expected = ("distributed" if distributed else "ray" if ray else
                registered.name if registered else "machine")
    assert {r["backend"] for r in res} == {expected}


def test_limits_live_in_the_registered_backend(engine, logs):
    """A registered backend holds the node's limits: its semaphore and rate are used."""
    registered = getattr(engine, "limits", None)
    if registered is None:
        pytest.skip("the engine keeps its limits in the machine or cluster backend")
    for limited in (P.pol_conc1, P.pol_rated):
        Graph([limited], engine=engine).map({"x": list(range(4)), "log_dir": logs}, map_over="x")
    kinds = {type(m).__name__: m.ops for m in registered.made if hasattr(m, "ops")}
    assert kinds.get("MemorySemaphore", 0) >= 4 and kinds.get("MemoryRate", 0) >= 1
