"""Limits that belong to the API, in one process: a resource's limits validated as a
node's; the provider's rate-limit headers read from the real clients' responses; the
loopback server limiting each API key with a continuously refilled bucket."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hypernodes_bench.batch_server import BatchServer
from hypernodes_bench.llm_server import LLMServer
from hypernodes_dist import Graph, meter, node, resource
from hypernodes_dist.policies.learned import learned_for, period_of, read_headers, watch


@pytest.mark.parametrize("kwargs,needle", [
    ({"concurrency": 0}, "concurrency must be an int >= 1"),
    ({"concurrency": 2.5}, "concurrency must be an int >= 1"),
    ({"rate_limit": "lots"}, "cannot read rate_limit='lots'"),
    ({"rate_limit": {}}, "limits nothing"),
    ({"rate_limit": {"calls": "0/minute"}}, "positive count"),
])
def test_resource_limits_are_validated_as_a_nodes_naming_the_resource(kwargs, needle):
    with pytest.raises(ValueError, match="resource 'api'") as info:
        resource(name="api", **kwargs)(lambda: None)
    assert needle in str(info.value)


def test_resource_limits_declared():
    api = resource(name="api", concurrency=4,
                   rate_limit={"calls": "500/minute", "tokens": "9000/minute"})(lambda: None)
    assert api.limits.concurrency == 4 and api.limits.rate == (500.0, 60.0)
    assert [q.quantity for q in api.limits.quantities] == ["tokens"]
    assert resource(name="api")(lambda: None).limits is None  # none declared: learned


def test_headers_of_openai_and_anthropic_are_read():
    openai_headers = {"x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "499",
                      "x-ratelimit-reset-requests": "120ms", "x-ratelimit-limit-tokens": "30000",
                      "x-ratelimit-remaining-tokens": "29000",
                      "x-ratelimit-reset-tokens": "6m0s"}
    assert read_headers(openai_headers) == {"requests": [500.0, 499.0, 0.12],
                                            "tokens": [30000.0, 29000.0, 360.0]}
    anthropic = read_headers({"anthropic-ratelimit-requests-limit": "50",
                              "anthropic-ratelimit-requests-remaining": "49",
                              "anthropic-ratelimit-requests-reset": "2000-01-01T00:00:00Z"})
    assert anthropic == {"requests": [50.0, 49.0, 0.0]}  # a reset in the past: now
    assert read_headers({"x-ratelimit-limit-requests": "many"}) == {}


def test_a_hooked_client_learns_from_successful_and_refused_responses():
    with LLMServer(latency=(0.001, 0.002), rpm=600, bucket=True, remaining=1) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        key = f"test:{uuid.uuid4().hex}"
        watch(client, key)
        watch(client, key)  # once per client
        assert len(client._client.event_hooks["response"]) == 1

        async def ask_twice() -> None:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}])
            state = learned_for(key).state
            assert state["requests"][:2] == [600.0, 0.0]  # the limit, none remaining
            learned_for(key).state = None
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}])
            assert learned_for(key).state["requests"][0] == 600.0  # a 429's headers too

        asyncio.run(ask_twice())
        sync_key = f"test:{uuid.uuid4().hex}"
        with httpx.Client(base_url=server.base_url, headers={"Authorization": "Bearer s"}) as c:
            watch(c, sync_key)
            c.post("/chat/completions", json={"model": "m", "messages": []})
        assert learned_for(sync_key).state["requests"][0] == 600.0


def test_the_server_limits_each_api_key_with_its_own_bucket():
    with LLMServer(latency=(0.001, 0.002), rpm=60, bucket=True, remaining=2) as server:
        for key in ("a", "b"):
            with httpx.Client(base_url=server.base_url,
                              headers={"Authorization": f"Bearer {key}"}) as c:
                codes = [c.post("/chat/completions", json={"model": "m", "messages": []})
                         .status_code for _ in range(3)]
            assert codes == [200, 200, 429]
        keys = server.keys()
        assert keys["a"]["ok"] == keys["b"]["ok"] == 2 and keys["a"]["rate_limited"] == 1


def test_a_learned_period_is_read_from_the_refill_and_never_over_a_minute():
    """Issue 33: a reset that is a window's end (6 s after 1 request of 50) read as a 300 s
    period paced the calls to a crawl; a limit is never paced slower than per minute, a reset
    read to the ms errs slow by a ms, and a zero reset keeps the period known before."""
    assert period_of(50, 49, 6.0) == 60.0  # not 300
    assert period_of(20000, 19988, 6.0) == 60.0  # not 10,000
    assert period_of(500, 499, 0.12) == 60.0  # OpenAI: 1 of 500/minute back in 120 ms
    assert period_of(120, 110, 0.083) == 1.0  # 10 of 120/second
    assert period_of(6000, 5993, 0.0) == 60.0 and period_of(6000, 5993, 0.0, 1.0) == 1.0


@resource
def headed_llm(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)


async def _classify(text: str, headed_llm: openai.AsyncOpenAI) -> str:
    r = await headed_llm.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": text}], max_tokens=5)
    meter(tokens=r.usage.total_tokens)
    return r.choices[0].message.content


@pytest.mark.timeout(120)  # issue 33 waited forever after a few requests: fail instead
def test_a_dataset_map_paced_by_a_batch_servers_headers_completes(tmp_path):
    """Issue 33 as the user ran it: ``graph.map(source=parquet, into=)``, an async node
    with an AsyncOpenAI resource declaring no limit, against BatchServer's online endpoint
    with 60 requests and 6,000 tokens per 1 s window and its x-ratelimit-* headers."""
    rows = 300
    src = tmp_path / "src.parquet"
    pq.write_table(pa.table({"id": list(range(rows)),
                             "text": [f"review {i}: value" for i in range(rows)]}), src)
    paid = node(output_name="label", retries=8, retry_on=openai.RateLimitError)(_classify)
    with BatchServer(rpm=60, tpm=6000, window_seconds=1.0) as server:
        Graph([headed_llm, paid]).map({"base_url": server.base_url}, source=str(src),
                                      columns={"text": "text"}, keep=["id"],
                                      into=str(tmp_path / "out"))
        stats = server.stats()
    out = pq.read_table(tmp_path / "out", columns=["id", "label"]).to_pydict()
    assert sorted(out["id"]) == list(range(rows)) and all(out["label"]), stats
    assert stats["online_ok"] == rows, stats
    assert stats["online_rate_limited"] <= 0.02 * rows, stats  # the window's 60 held
