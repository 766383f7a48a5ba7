"""The provider's signals and the budget that asks, on every engine, with the real ``openai``
client against the loopback server (its markers fail a message as a provider does; it
counts the 200 answers per message, so a row paid twice shows)."""

from __future__ import annotations

import signal
import threading
import time

import pyarrow as pa
import pytest

from hypernodes_bench.llm_server import label_of
from hypernodes_dist import Graph

from . import signal_graphs as S
from . import usage_graphs as U
from .test_usage import Ends


@pytest.fixture(scope="module")
def server(llm_servers):
    return llm_servers(latency=(0.002, 0.006))


def _map(engine, server, nodes, texts, seen=None, **kw):
    g = Graph([S.llm, *nodes], engine=engine, callbacks=[seen] if seen else [])
    return g.map({"text": texts, "base_url": server.base_url}, map_over="text",
                 on_error="collect", **kw)


def test_a_garbage_or_too_long_retry_after_is_ignored_not_clamped(engine, server):
    server.reset()
    waits = ["abc", "inf", "1e1000", "99999999999999999999", "-5", "120"]  # 120 > 60 allowed
    texts = [f"g{i} [[status:429:1 retry-after={w}]]" for i, w in enumerate(waits)]
    seen = Ends()
    res = _map(engine, server, [S.rate_retried], texts, seen)
    assert [r.error for r in res.errors] == []
    assert [r["label"] for r in res] == [label_of(t) for t in texts]
    assert [e for e in seen.policy if e.kind == "hold_off"] == []  # the back-off applied
    assert len([e for e in seen.policy if e.kind == "retry"]) == len(texts)
    assert server.stats()["requests"] == 2 * len(texts)


def test_x_should_retry_false_is_not_retried_and_true_does_not_make_a_400_retryable(
        engine, server):
    server.reset()
    res = _map(engine, server, [S.any_retried], ["n [[status:503:1 should-retry=false]]",
                                                 "r [[status:503:1]]"])
    assert [r.status for r in res] == ["error", "complete"]
    assert "503" in str(res[0].error)
    res = _map(engine, server, [S.rate_retried], ["b [[status:400:1 should-retry=true]]"])
    assert res[0].status == "error" and "400" in str(res[0].error)
    # one request each, and one retry of the plain 503
    assert server.stats()["requests"] == 4


def test_insufficient_quota_fails_at_once_without_hold_off_or_back_off(engine, server):
    server.reset()
    quota = "q [[status:429 code=insufficient_quota retry-after=30]]"
    texts = [quota] + [f"ok {i}" for i in range(8)]
    seen = Ends()
    res = _map(engine, server, [S.rate_retried], texts, seen)
    assert [r.status for r in res] == ["error"] + ["complete"] * 8
    assert "insufficient_quota" in str(res[0].error)
    assert server.stats()["requests"] == len(texts)  # not retried
    kinds = {e.kind for e in seen.policy}
    assert not kinds & {"hold_off", "retry"}
    assert not [e for e in seen.policy if "concurrency lowered" in e.reason]


def test_a_call_larger_than_a_whole_window_fails_at_once_naming_the_limit(engine, server):
    server.reset()
    texts = [f"big {i} " + "word " * 30 for i in range(12)]  # 35+ tokens a call, 20/s allowed
    res = _map(engine, server, [S.window_limited], texts)
    ran = server.stats()["requests"]
    assert ran <= 4  # the first call of each worker process: nothing known before it
    refused = [r for r in res if r.status == "error"]
    assert len(refused) == len(texts) - ran
    assert all("rate_limit tokens=20 per 1s" in str(r.error) for r in refused)


# ------------------------------------------------------------------ on_budget


class Asker:
    """``ask(quantity, spent, limit)``: 10 more, ``times`` times, then stop."""

    def __init__(self, times: int, more: float = 10) -> None:
        self.times, self.more = times, more
        self.asked: list[tuple[str, float, float]] = []

    def __call__(self, quantity: str, spent: float, limit: float) -> float | None:
        self.asked.append((quantity, spent, limit))
        return limit + self.more if len(self.asked) <= self.times else None


def _paid_once(server, res, n: int) -> int:
    """Every paid row answered once (nothing restarted); the number paid."""
    answered = server.answered()
    assert set(answered.values()) <= {1}, "a row was paid twice"
    paid = len(answered)
    assert sum(r.status == "complete" for r in res) == paid
    assert res.usage["paid_label"]["cost"] == paid
    return paid


def test_on_budget_continues_the_same_map_and_none_stops_it(engine, server):
    server.reset()
    texts = [f"row {i}" for i in range(40)]
    ask = Asker(times=2)
    res = _map(engine, server, [U.paid_label], texts, budget={"cost": 10}, on_budget=ask)
    assert [(q, limit) for q, _, limit in ask.asked] == [("cost", 10), ("cost", 20),
                                                         ("cost", 30)]
    assert all(spent >= limit for _, spent, limit in ask.asked)
    paid = _paid_once(server, res, len(texts))
    assert 30 <= paid < len(texts)
    assert all(type(r.error).__name__ == "BudgetExceededError" for r in res.errors)
    assert len(res.errors) == len(texts) - paid


def test_on_budget_raised_enough_finishes_every_row_paid_once(engine, server):
    server.reset()
    texts = [f"all {i}" for i in range(24)]
    ask = Asker(times=100, more=8)
    res = _map(engine, server, [U.paid_label], texts, budget={"cost": 0}, on_budget=ask)
    assert res.errors == [] and ask.asked[0][1:] == (0.0, 0.0)  # asked before any call
    assert _paid_once(server, res, len(texts)) == len(texts)


def test_a_budget_of_zero_starts_no_metered_call(engine, server):
    server.reset()
    res = _map(engine, server, [U.paid_label], ["a", "b", "c"], budget={"cost": 0})
    assert [type(r.error).__name__ for r in res] == ["BudgetExceededError"] * 3
    assert server.stats()["requests"] == 0


def test_on_budget_into_a_dataset_continues_the_same_map(engine, server, tmp_path):
    server.reset()
    n = 30
    ask = Asker(times=100)
    res = Graph([U.llm, U.paid_label], engine=engine).map(
        source=pa.table({"text": [f"ds {i}" for i in range(n)]}),
        inputs={"base_url": server.base_url}, into=tmp_path / "out", budget={"cost": 10},
        on_budget=ask)
    assert res.rows == n and res.failed == 0 and len(ask.asked) >= 2
    assert set(server.answered().values()) == {1} and len(server.answered()) == n


def test_an_error_in_on_budget_stops_the_map_and_is_raised(engine, server):
    server.reset()

    def ask(quantity: str, spent: float, limit: float) -> float:
        raise KeyError("no approver")

    with pytest.raises(KeyError, match="no approver"):
        _map(engine, server, [U.paid_label], [f"e {i}" for i in range(12)],
             budget={"cost": 4}, on_budget=ask)
    assert set(server.answered().values()) == {1}


def test_ctrl_c_while_calls_wait_on_the_budget_stops_them(engine, server, tmp_path):
    """The person asked presses Ctrl-C instead of answering at once: the calls waiting on
    the budget do not start, every paid row is written, then KeyboardInterrupt."""
    server.reset()
    n = 40

    pressed: list[bool] = []

    def ask(quantity: str, spent: float, limit: float) -> float | None:
        if pressed:
            return None
        pressed.append(True)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        time.sleep(0.3)  # the answer usually comes after the Ctrl-C (the test holds anyway)
        return limit + 4

    with pytest.raises(KeyboardInterrupt):
        Graph([U.llm, U.paid_label], engine=engine).map(
            source=pa.table({"text": [f"cc {i}" for i in range(n)]}),
            inputs={"base_url": server.base_url}, into=tmp_path / "out", budget={"cost": 8},
            on_budget=ask)
    answered = server.answered()
    assert set(answered.values()) == {1} and 8 <= len(answered) < n
