"""The provider's signals read from errors (``policies/signals.py``): Retry-After garbage and
``max_retry_after`` ignored (never clamped), ``x-should-retry``, ``insufficient_quota`` --
from the real ``openai`` and ``httpx`` clients' errors against the loopback server, and the
build-time checks (``concurrency=0``, 0 calls, ``max_retry_after``, ``budget=``)."""

from __future__ import annotations

import email.utils
import pickle
import time

import httpx
import openai
import pytest

from hypernodes_dist import Graph, meter, node
from hypernodes_dist.errors import WindowLimitError
from hypernodes_dist.policies.budget import check_budget
from hypernodes_dist.policies.signals import quota_exhausted, retry_after, should_retry


class _Response:
    def __init__(self, headers: dict[str, str], status: int = 429, content: bytes = b"") -> None:
        self.headers = httpx.Headers(headers)
        self.status_code = status
        self.content = content


class _HTTPError(Exception):
    def __init__(self, headers: dict[str, str], status: int = 429, content: bytes = b"") -> None:
        super().__init__(str(status))
        self.response = _Response(headers, status, content)


@pytest.mark.parametrize("garbage", ["abc", "inf", "-inf", "nan", "1e1000", "1e3", "-5", "",
                                     "99999999999999999999", "0x10", "5 s", "Tue, 99 Foo 2024"])
def test_a_retry_after_that_is_not_a_number_or_a_date_is_ignored(garbage):
    assert retry_after(_HTTPError({"retry-after": garbage})) is None
    assert retry_after(_HTTPError({"retry-after-ms": garbage})) is None
    err = TimeoutError()
    err.retry_after = garbage  # type: ignore[attr-defined]
    assert retry_after(err) is None


def test_a_retry_after_longer_than_the_most_is_ignored_not_clamped():
    assert retry_after(_HTTPError({"retry-after": "3600"})) == 3600.0
    assert retry_after(_HTTPError({"retry-after": "3601"})) is None
    assert retry_after(_HTTPError({"retry-after": "20"}), most=10) is None
    assert retry_after(_HTTPError({"retry-after": "10"}), most=10) == 10.0
    later = email.utils.formatdate(time.time() + 7200, usegmt=True)
    assert retry_after(_HTTPError({"retry-after": later})) is None
    err = TimeoutError()
    err.retry_after = float("inf")  # type: ignore[attr-defined]
    assert retry_after(err) is None


def test_valid_retry_after_forms():
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= retry_after(_HTTPError({"Retry-After": soon})) <= 30
    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    assert retry_after(_HTTPError({"retry-after": past})) == 0.0
    assert retry_after(_HTTPError({"retry-after": " 7 "})) == 7.0
    assert retry_after(_HTTPError({"retry-after": "0.5"})) == 0.5
    assert retry_after(_HTTPError({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    # a garbage retry-after-ms falls back to retry-after, as openai-python reads them
    assert retry_after(_HTTPError({"retry-after-ms": "abc", "retry-after": "9"})) == 9.0
    assert retry_after(_HTTPError({})) is None and retry_after(ValueError()) is None


def test_x_should_retry():
    assert should_retry(_HTTPError({"x-should-retry": "false"})) is False
    assert should_retry(_HTTPError({"X-Should-Retry": "True"})) is True
    assert should_retry(_HTTPError({"x-should-retry": "maybe"})) is None
    assert should_retry(_HTTPError({})) is None and should_retry(ValueError()) is None


def test_insufficient_quota_is_told_from_a_rate_limit():
    quota = b'{"error": {"message": "x", "type": "insufficient_quota", "code": null}}'
    assert quota_exhausted(_HTTPError({}, 429, quota))
    rate = b'{"error": {"message": "insufficient_quota?", "code": "rate_limit_exceeded"}}'
    assert not quota_exhausted(_HTTPError({}, 429, rate))
    assert not quota_exhausted(_HTTPError({}, 500, quota))
    assert not quota_exhausted(ValueError("insufficient_quota"))


def _fail(server, text: str) -> Exception:
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    return caught.value


def _fail_httpx(server, text: str) -> Exception:
    with httpx.Client(base_url=server.base_url) as web:
        r = web.post("/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": text}]})
        with pytest.raises(httpx.HTTPStatusError) as caught:
            r.raise_for_status()
    return caught.value


@pytest.mark.parametrize("fail", [_fail, _fail_httpx], ids=["openai", "httpx"])
def test_signals_of_the_real_clients_errors(llm_server, fail):
    quota = fail(llm_server, "q [[status:429 code=insufficient_quota retry-after=30]]")
    assert quota_exhausted(quota) and retry_after(quota) == 30.0
    limited = fail(llm_server, "r [[status:429 retry-after=2]]")
    assert not quota_exhausted(limited) and retry_after(limited) == 2.0
    garbage = fail(llm_server, "g [[status:429 retry-after=99999999999999999999]]")
    assert retry_after(garbage) is None
    told = fail(llm_server, "s [[status:503 should-retry=false]]")
    assert should_retry(told) is False
    told = fail(llm_server, "t [[status:400 should-retry=true]]")
    assert should_retry(told) is True


def test_limits_that_start_nothing_fail_when_the_node_is_built():
    async def f(x: int) -> int:
        return x

    with pytest.raises(ValueError, match=r"node 'f': concurrency must be an int >= 1"):
        node(output_name="y", concurrency=0)(f)
    with pytest.raises(ValueError, match="positive count"):
        node(output_name="y", rate_limit="0/second")(f)
    with pytest.raises(ValueError, match="positive count"):
        node(output_name="y", rate_limit={"calls": "0/minute"})(f)
    with pytest.raises(ValueError, match="max_retry_after must be positive seconds"):
        node(output_name="y", retries=2, max_retry_after=0)(f)
    with pytest.raises(ValueError, match="max_retry_after"):
        node(output_name="y", retries=2, max_retry_after="1h")(f)
    assert node(output_name="y", retries=1, max_retry_after=60)(f).policy.max_retry_after == 60


def test_budget_limits():
    assert check_budget({"cost": 0}, "k").limits == (("cost", 0.0),)  # starts no metered call
    assert check_budget({"cost": 5}, "k", on_budget=lambda q, s, m: None).asks
    for bad in ({"cost": -1}, {"cost": float("inf")}, {"cost": True}, {}):
        with pytest.raises(ValueError, match="budget"):
            check_budget(bad, "k")
    with pytest.raises(ValueError, match="on_budget= needs a budget"):
        check_budget(None, "k", on_budget=lambda q, s, m: None)
    with pytest.raises(ValueError, match="on_budget=3"):
        check_budget({"cost": 1}, "k", on_budget=3)


@node(output_name="y")
def _dollar(x: int) -> int:
    meter(cost=1.0)
    return x


def test_a_limit_not_above_what_is_spent_is_asked_again():
    asked: list[float] = []

    def ask(quantity: str, spent: float, limit: float) -> float | None:
        asked.append(limit)
        return [2.0, 5.0, None][len(asked) - 1]  # 2 is spent already: asked again

    res = Graph([_dollar]).map({"x": list(range(10))}, map_over="x", budget={"cost": 3},
                               on_budget=ask, on_error="collect")
    assert asked == [3.0, 2.0, 5.0]
    assert sum(r.status == "complete" for r in res) == 5 and res.usage["_dollar"]["cost"] == 5


def test_a_bad_answer_of_on_budget_stops_the_map_with_a_type_error():
    with pytest.raises(TypeError, match="on_budget returned 'lots' for budget cost=3"):
        Graph([_dollar]).map({"x": list(range(10))}, map_over="x", budget={"cost": 3},
                             on_budget=lambda q, s, m: "lots", on_error="collect")


def test_window_limit_error_keeps_its_attributes_across_processes():
    err = WindowLimitError("node 'f' did not start", "f", "tokens", 35.0, 20.0, 1.0)
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, ValueError) and str(back) == str(err)
    assert (back.node, back.quantity, back.amount, back.limit, back.per) == (
        "f", "tokens", 35.0, 20.0, 1.0)
