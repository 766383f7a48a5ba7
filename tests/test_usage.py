"""``meter``, budgets, quantity rate limits and Retry-After: the parts a user touches directly
(validation, errors, what is read from real client errors), on the local engine."""

from __future__ import annotations

import asyncio
import email.utils
import re
import subprocess
import sys
import time

import httpx
import openai
import pytest

import hypernodes_dist
from hypernodes_bench.llm_server import LLMServer
from hypernodes_dist import Graph, meter, node
from hypernodes_dist.errors import BudgetExceededError
from hypernodes_dist.policies import aimd, remove_semaphores
from hypernodes_dist.policies.aimd import RECOVER, backoff_for, rate_limited
from hypernodes_dist.policies.gates.concurrency import ConcurrencyGate
from hypernodes_dist.policies.retryafter import retry_after
from hypernodes_dist.policies.usage import may_meter

from .conformance import usage_graphs as U


def test_meter_outside_a_node_call_raises_runtime_error():
    with pytest.raises(RuntimeError, match="outside a node call"):
        meter(tokens=3)


@pytest.mark.parametrize("bad", [{"tokens": -1}, {"tokens": float("nan")}, {"cost": "1"},
                                 {"calls": 1}, {"_x": 1}, {"ok": True}])
def test_meter_rejects_what_is_not_a_quantity(bad):
    @node(output_name="y")
    def f(x: int) -> int:
        meter(**bad)
        return x

    res = Graph([f]).map({"x": [1]}, map_over="x", on_error="collect")
    assert isinstance(res[0].error, ValueError) and "meter(" in str(res[0].error)


def _helper(n: int) -> None:
    meter(tokens=n)


def test_nodes_that_meter_are_found_through_helpers_closures_and_modules():
    def direct(x):
        meter(a=1)

    def through_helper(x):
        _helper(x)

    def through_module(x):
        hypernodes_dist.meter(a=1)

    alias = meter

    def through_closure(x):
        alias(a=1)

    def plain(x):
        return x + 1

    assert all(map(may_meter, [direct, through_helper, through_module, through_closure]))
    assert not may_meter(plain)


def test_run_reports_usage_on_events_and_history():
    ends = []

    class CB:
        def on_node_end(self, event):
            ends.append((event.node_id, event.usage))

    @node(output_name="y")
    def f(x: int) -> int:
        _helper(x)
        meter(cost=0.5)
        return x

    res = Graph([f], callbacks=[CB()]).run({"x": 7})
    assert res.history[0].usage == {"tokens": 7, "cost": 0.5}
    assert ends == [("f", {"tokens": 7, "cost": 0.5})]


class _Lib:
    """A 'library' reaching ``meter`` in a way code inspection cannot see."""

    def __init__(self) -> None:
        self.fn = getattr(hypernodes_dist, "me" + "ter")


def test_metering_that_cannot_be_seen_still_counts_in_totals_and_budgets():
    lib = _Lib()

    @node(output_name="y")
    def hidden(x: int) -> int:
        lib.fn(cost=1.0)
        return x

    g = Graph([hidden])
    first = g.map({"x": list(range(10))}, map_over="x")
    assert first.usage["hidden"] == {"calls": 10, "cost": 10.0}
    again = g.map({"x": list(range(10))}, map_over="x", budget={"cost": 4}, on_error="collect")
    assert sum(r.status == "complete" for r in again) == 4  # metered per call from now on
    assert [r.history[0].usage for r in again if r.status == "complete"] == [{"cost": 1.0}] * 4


@pytest.mark.parametrize("budget, match", [
    ({}, "budget="), ({"cost": -1}, ">= 0"), ({"calls": 3}, "not a metered quantity"),
    ([("cost", 1)], "budget="), ({"cost": float("inf")}, ">= 0")])
def test_bad_budgets_fail_before_anything_runs(budget, match):
    @node(output_name="y")
    def f(x: int) -> int:
        raise AssertionError("must not run")

    with pytest.raises(ValueError, match=match):
        Graph([f]).map({"x": [1]}, map_over="x", budget=budget)


@pytest.mark.parametrize("limit, match", [({}, "limits nothing"), ({"tokens": "lots"}, "cannot read"),
                                          ({1: "5/s"}, "quantity names")])
def test_bad_rate_limit_dicts_fail_when_decorated(limit, match):
    with pytest.raises(ValueError, match=match):
        node(output_name="y", rate_limit=limit)(lambda x: x)


def test_budget_exceeded_error_pickles_with_its_fields():
    import pickle

    err = pickle.loads(pickle.dumps(BudgetExceededError("spent", "cost", 5.0, 5.0, "f")))
    assert (str(err), err.quantity, err.spent, err.limit, err.node) == ("spent", "cost", 5.0,
                                                                       5.0, "f")
    assert isinstance(err, RuntimeError)


# ------------------------------------------------------------------ Retry-After, real clients


@pytest.fixture(scope="module")
def one_per_second():
    # no x-ratelimit-* headers: calls are not paced by limits learned from them, 429s come
    with LLMServer(latency=(0.001, 0.002), rpm=1, window_seconds=1.0, headers=False) as server:
        yield server


def test_retry_after_is_read_from_real_openai_and_httpx_errors(one_per_second):
    messages = [{"role": "user", "content": "hi"}]
    client = openai.OpenAI(base_url=one_per_second.base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=messages)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="m", messages=messages)
    assert 0 < retry_after(caught.value) <= 1.0
    with httpx.Client(base_url=one_per_second.base_url) as web:
        r = web.post("/chat/completions", json={"model": "m", "messages": messages})
        with pytest.raises(httpx.HTTPStatusError) as caught_httpx:
            r.raise_for_status()
    assert 0 < retry_after(caught_httpx.value) <= 1.0


class _Response:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = httpx.Headers(headers)


class _HTTPError(Exception):
    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("429")
        self.response = _Response(headers)


def test_retry_after_forms():
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= retry_after(_HTTPError({"Retry-After": later})) <= 30
    assert retry_after(_HTTPError({"retry-after": "7"})) == 7.0
    assert retry_after(_HTTPError({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    assert retry_after(_HTTPError({"retry-after": "soon"})) is None
    assert retry_after(_HTTPError({})) is None
    err = TimeoutError()
    err.retry_after = 2  # type: ignore[attr-defined]
    assert retry_after(err) == 2.0
    assert retry_after(ValueError()) is None


# ------------------------------------------------------------------ AIMD concurrency


@pytest.fixture
def own_limits(tmp_path, monkeypatch):
    path = str(tmp_path / "limits")
    monkeypatch.setenv("HYPERNODES_LIMITS_DIR", path)
    yield path
    remove_semaphores(path)


def test_rate_limit_errors_halve_a_nodes_concurrency_and_successes_restore_it(own_limits):
    backoff = backoff_for("aimd-node", 8)
    assert backoff.refused() and backoff.allowed == 4  # 8 -> 4 calls at once here
    assert not backoff.refused() and backoff.allowed == 4  # one cut per COOL seconds
    for _ in range(RECOVER):
        backoff.succeeded()
    assert backoff.allowed == 5  # one more after RECOVER successes in a row
    gate = ConcurrencyGate("aimd-node", 8)  # a gate of the node sizes its places by it
    places = gate.places
    assert [places.try_take() for _ in range(6)] == [True] * 5 + [False]  # the places hold
    for _ in range(5):
        places.give()


def test_a_cut_made_by_another_process_lowers_this_ones(own_limits, monkeypatch):
    monkeypatch.setattr(aimd, "COOL", 600.0)  # "one cut per COOL" whatever the load
    backoff = backoff_for("aimd-shared", 8)
    assert backoff.allowed == 8
    code = ("from hypernodes_dist.policies.aimd import backoff_for\n"
            "b = backoff_for('aimd-shared', 8); assert b.refused() and b.allowed == 4")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    backoff.read_at = float("-inf")  # as REFRESH seconds later
    backoff.refresh()
    assert backoff.allowed == 4  # one back-off for every process of the machine
    assert not backoff.refused() and backoff.allowed == 4  # one cut per COOL, whoever sees it


def _refused() -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    return httpx.HTTPStatusError("429 Too Many Requests", request=request,
                                 response=httpx.Response(429, request=request))


def test_a_lowered_concurrency_binds_calls_already_waiting(own_limits):
    """After "lowered to 4 of 8", no call starts while 4 or more run until RECOVER calls
    succeeded: a finished call does not hand its place to a waiting one past the width."""
    running, starts, lowered, failed, ok = [0], [], [], [], [0]

    class CB:
        def on_policy(self, event):
            if "concurrency lowered" in event.reason:
                lowered.append(event.reason)

    @node(output_name="y", concurrency=8)
    async def call(x: int) -> int:
        running[0] += 1
        starts.append((bool(failed) and ok[0] < RECOVER, running[0]))
        try:
            await asyncio.sleep(0.01 if x == 0 else 0.05)
            if x == 0:
                raise _refused()
            ok[0] += bool(failed)
            return x
        finally:
            running[0] -= 1
            failed.append(x) if x == 0 else None  # its guard cuts the width as it ends

    res = Graph([call], callbacks=[CB()]).map({"x": list(range(40))}, map_over="x",
                                              on_error="collect")
    assert [r.status for r in res][1:] == ["complete"] * 39
    assert lowered == ["rate limited: concurrency lowered to 4 of 8 in total"]
    after = [n for cut, n in starts if cut]
    assert len(after) >= 8 and max(after) <= 4, str(starts)


def test_a_429_lowers_the_concurrency_of_the_node(one_per_second, own_limits):
    seen = []

    class CB:
        def on_policy(self, event):
            seen.append(event)

    texts = [f"t{i}" for i in range(6)]
    g = Graph([U.llm, U.told_to_wait], callbacks=[CB()])
    res = g.map({"text": texts, "base_url": one_per_second.base_url}, map_over="text",
                on_error="collect")
    assert [r.status for r in res] == ["complete"] * 6
    lowered = [e for e in seen if "concurrency lowered" in e.reason]
    assert lowered and re.search(r"lowered to [123] of 4", lowered[0].reason)
    assert rate_limited(openai.RateLimitError.__new__(openai.RateLimitError))
