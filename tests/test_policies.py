"""Unit tests of node call policies: validation, backoff, the guard, limits, events, run()."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from types import SimpleNamespace

import pytest

from hypernodes_dist import Graph, GraphEngine, node
from hypernodes_dist import policies as pol
from hypernodes_dist.events import PolicyEvent, StreamingChunkEvent, hook_name
from hypernodes_dist.policies import (
    NodeTimeoutError,
    Policy,
    limits,
    machine,
    make_policy,
    parse_rate_limit,
)


@pytest.fixture(autouse=True)
def own_limits_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HYPERNODES_LIMITS_DIR", str(tmp_path / "limits"))
    yield
    pol.remove_semaphores(str(tmp_path / "limits"))


class Seen:
    def __init__(self) -> None:
        self.events = []

    def on_policy(self, event) -> None:
        self.events.append(event)

    def on_streaming_chunk(self, event) -> None:
        self.events.append(event)


# --------------------------------------------------------------------------- validation


def test_no_keyword_means_no_policy():
    @node(output_name="y")
    def plain(x):
        return x

    assert plain.policy is None
    assert make_policy("n") is None
    assert make_policy("n", backoff=1.0) is None  # backoff alone does nothing


def test_keywords_build_a_picklable_policy():
    @node(output_name="y", retries=2, backoff="exponential", timeout=3, concurrency=4,
          rate_limit="100/minute")
    def api(x):
        return x

    p = api.policy
    assert isinstance(p, Policy)
    assert (p.retries, p.timeout, p.concurrency, p.rate) == (2, 3.0, 4, (100.0, 60.0))
    assert isinstance(p.backoff, pol.Exponential)
    assert pickle.loads(pickle.dumps(p)) == p


@pytest.mark.parametrize("text,expected", [
    ("100/minute", (100.0, 60.0)), ("10/s", (10.0, 1.0)), ("5 / second", (5.0, 1.0)),
    ("30/10s", (30.0, 10.0)), ("2/hour", (2.0, 3600.0)), ("1000/day", (1000.0, 86400.0)),
    ("2.5/min", (2.5, 60.0)), ((3, 2), (3.0, 2.0)), ([1, 0.5], (1.0, 0.5)),
])
def test_rate_limit_forms(text, expected):
    assert parse_rate_limit(text) == expected


@pytest.mark.parametrize("kwargs,match", [
    ({"retries": -1}, "retries must be an int >= 0"),
    ({"retries": 1, "retry_on": "ConnectionError"}, "retry_on must be an exception class"),
    ({"retries": 1, "retry_on": (ValueError, 3)}, "retry_on must be an exception class"),
    ({"retries": 1, "retry_on": ()}, "retry_on must be an exception class"),
    ({"retries": 1.5}, "retries must be an int"),
    ({"retries": True}, "retries must be an int"),
    ({"timeout": 0}, "timeout must be positive"),
    ({"timeout": "5"}, "timeout must be positive"),
    ({"concurrency": 0}, "concurrency must be an int >= 1"),
    ({"concurrency": 2.0}, "concurrency must be an int"),
    ({"backoff": "linear", "retries": 1}, "backoff must be None, 'exponential'"),
    ({"backoff": -1, "retries": 1}, "backoff must be"),
    ({"rate_limit": "100 per minute"}, "cannot read rate_limit"),
    ({"rate_limit": "10/fortnight"}, "cannot read rate_limit"),
    ({"rate_limit": 10}, "rate_limit must be a string or a"),
    ({"rate_limit": "0/s"}, "positive count"),
    ({"rate_limit": (5, 0)}, "positive count"),
])
def test_invalid_keywords_fail_at_decoration_naming_the_node(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        node(lambda x: x, output_name="y", name="api", **kwargs)
    assert "'api'" in str(info.value)


def test_backoff_delays():
    assert pol.backoff_delay(None, 3) == 0.0
    assert pol.backoff_delay(0.25, 3) == 0.25
    assert pol.backoff_delay(lambda a: a * 0.1, 3) == pytest.approx(0.3)
    exp = pol.exponential(base=1.0, cap=5.0, jitter=False)
    assert [exp(a) for a in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    jittered = pol.Exponential(base=1.0)
    assert all(1.0 <= jittered(2) <= 2.0 for _ in range(50))
    with pytest.raises(ValueError, match=">= 0"):
        pol.backoff_delay(lambda a: -1, 1)


# --------------------------------------------------------------------------- hot path


def test_nodes_without_policy_are_never_wrapped(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a Guard was built for a node without a policy")

    monkeypatch.setattr("hypernodes_dist.execution.calls.Guard", boom)
    monkeypatch.setattr("hypernodes_dist.execution.scheduler.guarded_call", boom)

    @node(output_name="y")
    def plain(x):
        return x + 1

    @node(output_name="z")
    async def aplain(y):
        return y * 2

    g = Graph([plain, aplain])
    assert [r["z"] for r in g.map({"x": [1, 2]}, map_over="x")] == [4, 6]
    assert g.run({"x": 1})["z"] == 4


# --------------------------------------------------------------------------- retries


def flaky_factory(failures: int, exc=ConnectionError):
    calls: dict = {}

    def flaky(x):
        calls[x] = calls.get(x, 0) + 1
        if calls[x] <= failures:
            raise exc(f"call {calls[x]} for {x}")
        return x * 10

    return flaky, calls


@pytest.mark.parametrize("engine", [GraphEngine(), GraphEngine(parallel_nodes=True)],
                         ids=["sequential", "parallel"])
def test_run_retries_in_the_scheduler(engine):
    fn, calls = flaky_factory(2)
    seen = Seen()
    g = Graph([node(fn, output_name="y", retries=2, backoff=0.001)], engine=engine,
              callbacks=[seen])
    result = g.run({"x": 3})
    assert result["y"] == 30 and calls == {3: 3}
    kinds = [(e.kind, e.attempt, e.run_id == result.run_id) for e in seen.events]
    assert kinds == [("retry", 1, True), ("retry", 2, True)]
    assert all(isinstance(e, PolicyEvent) and e.wait == 0.001 for e in seen.events)


def test_async_run_retries():
    calls = []

    @node(output_name="y", retries=1)
    async def aflaky(x):
        calls.append(x)
        await asyncio.sleep(0)
        if len(calls) == 1:
            raise ConnectionError("first")
        return x

    assert Graph([aflaky]).run({"x": 2})["y"] == 2 and calls == [2, 2]


def test_exhausted_retries_raise_the_last_error_with_attempts():
    fn, calls = flaky_factory(10, ValueError)
    g = Graph([node(fn, output_name="y", name="api", retries=2)])
    with pytest.raises(ValueError, match="call 3 for 7") as info:
        g.run({"x": 7})
    assert info.value.hn_attempts == 3
    assert any("3 attempts (retries=2)" in n for n in info.value.__notes__)
    assert any("failed in node 'api'" in n for n in info.value.__notes__)
    restored = pickle.loads(pickle.dumps(info.value))  # the count survives a process hop
    assert restored.hn_attempts == 3
    with pytest.raises(ValueError) as info:
        Graph([node(fn, output_name="y", name="api2", timeout=5)]).run({"x": 8})
    assert info.value.hn_attempts == 1  # no retries: no note, but the count is there
    assert not any("attempts" in n for n in info.value.__notes__)


def test_retry_on_fails_other_errors_at_once():
    fn, calls = flaky_factory(1, ValueError)
    g = Graph([node(fn, output_name="y", name="api", retries=3, retry_on=ConnectionError)])
    with pytest.raises(ValueError, match="call 1 for 5") as info:
        g.run({"x": 5})
    assert info.value.hn_attempts == 1 and calls == {5: 1}
    assert not any("attempts" in n for n in info.value.__notes__)
    fn, calls = flaky_factory(1, ConnectionResetError)  # a subclass of a listed error
    g = Graph([node(fn, output_name="y", name="api", retries=3,
                    retry_on=(ConnectionError, TimeoutError))])
    assert g.run({"x": 5})["y"] == 50 and calls == {5: 2}
    assert node(fn, output_name="y", retry_on=KeyError).policy is None  # nothing to retry


def test_only_the_failed_node_of_the_failed_item_reruns():
    upstream = []

    @node(output_name="a")
    def up(x):
        upstream.append(x)
        return x

    fn, calls = flaky_factory(1)
    flaky = node(lambda a: fn(a), output_name="y", name="flaky", retries=1)
    res = Graph([up, flaky]).map({"x": [1, 2, 3]}, map_over="x")
    assert [r["y"] for r in res] == [10, 20, 30]
    assert upstream == [1, 2, 3] and calls == {1: 2, 2: 2, 3: 2}


def test_streaming_node_retry_restarts_the_stream():
    state = {"n": 0}

    @node(output_name="text", retries=1)
    def words(x):
        state["n"] += 1
        yield "a"
        if state["n"] == 1:
            raise ConnectionError("stream broke")
        yield "b"

    seen = Seen()
    assert Graph([words], callbacks=[seen]).run({"x": 0})["text"] == "ab"
    chunks = [e.chunk_index for e in seen.events if isinstance(e, StreamingChunkEvent)]
    assert chunks == [0, 0, 1]  # the retried stream emits again from chunk 0


# --------------------------------------------------------------------------- timeouts


def test_sync_timeout_abandons_the_thread_and_names_node_item_limit():
    release, finished = threading.Event(), threading.Event()

    @node(output_name="y", timeout=0.05)
    def stuck(x):
        release.wait(60)  # held until the map has returned
        finished.set()
        return x

    try:
        res = Graph([stuck]).map({"x": [9]}, map_over="x", on_error="collect")
        assert not finished.is_set()  # the map never waited: the call is still running
    finally:
        release.set()
    err = res[0].error
    assert isinstance(err, NodeTimeoutError)
    assert "node 'stuck' (item 0) timed out after 0.05 s (timeout=0.05)" == str(err)
    assert (err.node, err.item, err.limit) == ("stuck", 0, 0.05)
    assert finished.wait(10)  # the abandoned thread ran on to the end
    assert pickle.loads(pickle.dumps(err)).item == 0


def test_timeouts_are_retried():
    calls = []

    @node(output_name="y", timeout=0.05, retries=1)
    async def slow_first(x):
        calls.append(x)
        if len(calls) == 1:
            await asyncio.sleep(1)
        return x

    seen = Seen()
    assert Graph([slow_first], callbacks=[seen]).run({"x": 1})["y"] == 1
    assert [e.kind for e in seen.events] == ["timeout", "retry"]
    assert "timed out" in seen.events[1].reason


def test_a_nodes_own_timeout_error_is_not_a_policy_timeout():
    @node(output_name="y", timeout=5)
    async def raises(x):
        raise TimeoutError("the provider said so")

    with pytest.raises(TimeoutError, match="the provider said so") as info:
        Graph([raises]).run({"x": 1})
    assert not isinstance(info.value, NodeTimeoutError)


def _wait_until(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.005)


def test_an_abandoned_thread_keeps_its_concurrency_slot():
    pol.reset_stats()
    calls = []

    @node(output_name="y", timeout=0.05, concurrency=1, name="slot_keeper")
    def slow(x):
        calls.append(f"start {x}")
        if x == 0:  # runs on past its timeout, then gives item 1 time to start (it must not)
            _wait_until(lambda: pol.stats().get(("slot_keeper", "timeout")))
            time.sleep(0.1)
        calls.append(f"end {x}")
        return x

    res = Graph([slow]).map({"x": [0, 1]}, map_over="x", on_error="collect")
    assert [r.status for r in res] == ["error", "complete"]
    assert calls == ["start 0", "end 0", "start 1", "end 1"]  # item 1 waited for the slot


# --------------------------------------------------------------------------- limits


def test_file_rate_reservations_are_evenly_spaced(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "time", SimpleNamespace(time=lambda: 1000.0))  # frozen clock
    rate = machine.FileRate(str(tmp_path), "k", 10, 1.0)
    starts = [rate.reserve() - 1000.0 for _ in range(4)]
    assert starts == pytest.approx([0.0, 0.1, 0.2, 0.3])
    other = machine.FileRate(str(tmp_path), "k", 10, 1.0)  # another process sees the same
    assert other.reserve(3) - 1000.0 == pytest.approx(0.4)  # a block of 3 starts
    assert rate.reserve() - 1000.0 == pytest.approx(0.7)


def test_kernel_semaphore_is_shared_by_every_opener(tmp_path):
    a = machine.KernelSemaphore(str(tmp_path), "k", 2)
    b = machine.KernelSemaphore(str(tmp_path), "k", 2)  # another process opens the same
    assert a.try_take() and b.try_take()
    assert not a.try_take() and not b.try_take() and a.value() == 0
    b.give()
    assert a.try_take()
    a.give()
    a.give()
    assert b.value() == 2
    assert pol.remove_semaphores(str(tmp_path)) == 1


def test_concurrency_limit_holds_for_async_nodes():
    running, peak = [0], [0]

    @node(output_name="y", concurrency=3)
    async def limited(x):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.01)
        running[0] -= 1
        return x

    seen = Seen()
    res = Graph([limited], callbacks=[seen]).map({"x": list(range(20))}, map_over="x")
    assert [r["y"] for r in res] == list(range(20)) and peak[0] == 3
    assert any(e.kind == "throttle" and e.reason == "concurrency=3" for e in seen.events)


def test_rate_limit_in_run_and_stats():
    pol.reset_stats()

    @node(output_name="y", rate_limit="5/s")  # slow enough that every run after the first waits
    def rated(x):
        return x

    g = Graph([rated])
    t0 = time.perf_counter()
    for x in range(4):
        g.run({"x": x})
    assert time.perf_counter() - t0 >= 3 / 5
    assert pol.stats()[("rated", "throttle")] >= 3


def test_a_registered_backend_replaces_the_machine_backend(monkeypatch):
    used = []

    class Rate:
        interval = 0.001

        def reserve(self, k):
            used.append(("rate", k))
            return time.time()

    class Backend:  # a directory of its own: a rerun in this process gets fresh limiters
        name, directory = "fake", f"here-{time.monotonic_ns()}"

        def semaphore(self, key, n):
            raise AssertionError("no concurrency here")

        def rate(self, key, count, per):
            return Rate()

    fake = Backend()
    monkeypatch.setattr(limits, "_PROBES", [lambda: fake])

    @node(output_name="y", rate_limit="1/day", name="fake_backend_node")
    def rated(x):
        return x

    assert Graph([rated]).run({"x": 1})["y"] == 1
    assert used == [("rate", 1)]


def test_policy_event_hook_name():
    assert hook_name(PolicyEvent) == "on_policy"
