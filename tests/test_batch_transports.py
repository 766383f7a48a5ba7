"""The Batch API transports with the real ``openai`` (sync and async) and ``anthropic``
clients against the loopback fake provider (``hypernodes_bench.batch_server``)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import httpx
import openai
import pytest

from hypernodes_bench.batch_answers import request_key
from hypernodes_bench.batch_server import DEFAULTS, BatchServer
from hypernodes_dist.batchapi import (
    AnthropicBatches,
    BatchNotFoundError,
    OpenAIBatches,
    QueueLimitError,
    UnsupportedClientError,
    transport_for,
)
from hypernodes_dist.batchapi.packing import Packer
from hypernodes_dist.batchapi.store import RequestLog
from hypernodes_dist.batchapi.transport import (
    CANCELLED,
    CLIENT_ERROR,
    ENDED,
    EXPIRED,
    FAILED,
    RATE_LIMITED,
    RUNNING,
    SERVER_ERROR,
    SUCCEEDED,
    BatchFile,
    BatchInfo,
    BatchTransport,
    FileLimits,
    LineResult,
)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server():
    with BatchServer() as s:
        yield s


@pytest.fixture
def fake(server):
    """The module's server, its knobs back to the defaults after the test."""
    yield server
    server.configure(**DEFAULTS)


def chat(text: str, model: str = "gpt-4o-mini") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def message(text: str, model: str = "claude-haiku") -> dict[str, Any]:
    return {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": text}]}


@asynccontextmanager
async def openai_transport(server: BatchServer, kind: str, map_id: str = "map-1",
                           **kw: Any) -> AsyncIterator[OpenAIBatches]:
    cls = openai.AsyncOpenAI if kind == "async" else openai.OpenAI
    client = cls(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        yield OpenAIBatches(client, map_id, **kw)
    finally:
        closed = client.close()
        if asyncio.iscoroutine(closed):
            await closed


@asynccontextmanager
async def anthropic_transport(server: BatchServer, kind: str,
                              map_id: str = "map-1") -> AsyncIterator[AnthropicBatches]:
    cls = anthropic.AsyncAnthropic if kind == "async" else anthropic.Anthropic
    client = cls(base_url=server.anthropic_base_url, api_key="x", max_retries=0)
    try:
        yield AnthropicBatches(client, map_id)
    finally:
        closed = client.close()
        if asyncio.iscoroutine(closed):
            await closed


async def until_over(t: BatchTransport, info: BatchInfo) -> BatchInfo:
    while info.state == RUNNING:
        await asyncio.sleep(0.02)
        info = await t.status(info.id)
    return info


async def in_progress(t: BatchTransport, info: BatchInfo) -> BatchInfo:
    """The batch once past validation."""
    while info.provider_status == "validating":
        await asyncio.sleep(0.02)
        info = await t.status(info.id)
    return info


async def submit(t: BatchTransport, requests: list[tuple[str, dict[str, Any]]]
                 ) -> list[tuple[BatchFile, BatchInfo]]:
    out = []
    for file in t.pack(t.line(endpoint, body) for endpoint, body in requests):
        out.append((file, await t.create(file, await t.upload(file))))
    return out


async def round_trip(t: BatchTransport, requests: list[tuple[str, dict[str, Any]]]
                     ) -> tuple[dict[str, LineResult], list[BatchInfo]]:
    """Submit, wait, download every line: (results by custom_id, the batches as ended)."""
    results, infos = {}, []
    for _file, info in await submit(t, requests):
        info = await until_over(t, info)
        infos.append(info)
        if info.state == ENDED:
            results.update({r.custom_id: r async for r in t.results(info)})
    return results, infos


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def both(fn: Callable[..., Any]) -> Callable[..., Any]:
    return pytest.mark.parametrize("kind", ["sync", "async"])(fn)


@both
def test_openai_batch_answers_equal_the_online_answers(fake, kind):
    fake.reset()
    requests = [(CHAT, chat(f"review {i} was great")) for i in range(5)]
    requests += [("/v1/embeddings", {"model": "emb", "input": ["a b", "c"],
                                    "encoding_format": "float"}),
                 ("/v1/responses", {"model": "gpt-4o-mini", "input": "is it good"})]

    async def main():
        async with openai_transport(fake, kind) as t:
            results, infos = await round_trip(t, requests)
            assert [i.provider_status for i in infos] == ["completed"] * 3  # one per endpoint
            client = t.client
            for endpoint, body in requests:
                got = results[t.line(endpoint, body).custom_id]
                assert (got.kind, got.status) == (SUCCEEDED, 200)
                resource = {CHAT: client.chat.completions, "/v1/embeddings": client.embeddings,
                            "/v1/responses": client.responses}[endpoint]
                online = await t.call(resource.create, **body)
                # a 2xx body is kept as the JSON bytes the provider sent (read: decoded)
                assert isinstance(got.raw, bytes)
                assert online.to_dict() == got.body  # field for field
    run(main())
    counts, stats = fake.counts(), fake.stats()
    assert all(counts[request_key(e, b)] == [2, 2] for e, b in requests)  # batch + online
    assert stats["cost_batch"] == pytest.approx(stats["cost_online"] / 2)


@both
def test_anthropic_batch_answers_equal_the_online_answers(fake, kind):
    fake.reset()
    requests = [("/v1/messages", message(f"review {i}", model=f"claude-{i % 2}"))
                for i in range(4)]

    async def main():
        async with anthropic_transport(fake, kind) as t:
            results, infos = await round_trip(t, requests)
            assert len(infos) == 1 and infos[0].succeeded == 4  # models may mix in a batch
            for endpoint, body in requests:
                got = results[t.line(endpoint, body).custom_id]
                online = await t.call(t.client.messages.create, **body)
                assert got.kind == SUCCEEDED
                assert online.to_dict() == got.body  # field for field
    run(main())
    assert all(v == [2, 2] for v in fake.counts().values())


@both
def test_refused_lines_come_back_with_their_status_and_body(fake, kind):
    requests = [(CHAT, chat(f"fine {kind}")), (CHAT, chat(f"bad {kind} [[status:400]]")),
                (CHAT, chat(f"busy {kind} [[status:429:1]]")),
                (CHAT, chat(f"boom {kind} [[status:500:1]]"))]

    async def main():
        async with openai_transport(fake, kind) as t:
            results, _ = await round_trip(t, requests)
            got = [results[t.line(e, b).custom_id] for e, b in requests]
            assert [(r.kind, r.status, r.retry) for r in got] == [
                (SUCCEEDED, 200, False), (CLIENT_ERROR, 400, False),
                (RATE_LIMITED, 429, True), (SERVER_ERROR, 500, True)]
            assert got[1].body["error"]["type"] == "invalid_request_error"
            assert "status 400" in got[1].message
            again, _ = await round_trip(t, requests[2:])  # the transient ones, resubmitted
            assert {r.kind for r in again.values()} == {SUCCEEDED}
    run(main())


@both
def test_anthropic_errored_lines(fake, kind):
    requests = [("/v1/messages", message(f"bad {kind} [[status:400]]")),
                ("/v1/messages", message(f"busy {kind} [[status:529:1]]"))]

    async def main():
        async with anthropic_transport(fake, kind) as t:
            results, _ = await round_trip(t, requests)
            bad, busy = (results[t.line(e, b).custom_id] for e, b in requests)
            assert (bad.kind, bad.status) == (CLIENT_ERROR, 400)
            assert bad.body["error"]["type"] == "invalid_request_error"
            assert (busy.kind, busy.status, busy.retry) == (SERVER_ERROR, 529, True)
    run(main())


@both
def test_expired_and_cancelled_lines_are_reported_then_answered_when_resubmitted(fake, kind):
    requests = [(CHAT, chat(f"late {kind} [[expire:1]]")),
                (CHAT, chat(f"stop {kind} [[cancel:1]]")), (CHAT, chat("ok"))]

    async def main():
        async with openai_transport(fake, kind) as t:
            results, infos = await round_trip(t, requests)
            assert infos[0].provider_status == "expired"  # OpenAI: partial results
            kinds = [results[t.line(e, b).custom_id].kind for e, b in requests]
            assert kinds == [EXPIRED, CANCELLED, SUCCEEDED]
            again, _ = await round_trip(t, requests[:2])
            assert {r.kind for r in again.values()} == {SUCCEEDED}
        async with anthropic_transport(fake, kind) as t:
            reqs = [("/v1/messages", message(b["messages"][0]["content"])) for _, b in requests]
            results, _ = await round_trip(t, reqs)
            kinds = [results[t.line(e, b).custom_id].kind for e, b in reqs]
            assert kinds == [EXPIRED, CANCELLED, SUCCEEDED]
    run(main())


@both
def test_a_cancelled_batch_and_an_expired_batch(fake, kind):
    fake.configure(delay=60)
    requests = [(CHAT, chat(f"slow {i}")) for i in range(4)]

    async def main():
        async with openai_transport(fake, kind) as t:
            [(_, info)] = await submit(t, requests)
            assert (await in_progress(t, info)).provider_status == "in_progress"
            cancelling = await t.cancel(info.id)
            assert cancelling.state == RUNNING or cancelling.provider_status == "cancelled"
            info = await until_over(t, cancelling)
            assert info.provider_status == "cancelled"
            results = [r async for r in t.results(info)]
            assert {r.kind for r in results} == {CANCELLED} and len(results) == 4
            assert (await t.cancel(info.id)).provider_status == "cancelled"  # already over
            fake.configure(delay=0.4, expire_after=0.2)
            results, [info] = await round_trip(t, [(CHAT, chat(f"later {i}")) for i in range(8)])
            assert info.provider_status == "expired"
            kinds = [r.kind for r in results.values()]
            assert sorted(kinds) == [EXPIRED] * 4 + [SUCCEEDED] * 4  # ran half its lines
    run(main())


@both
def test_whole_batch_failures_carry_the_providers_message(fake, kind):
    async def main():
        fake.configure(fail_batches=1)
        async with openai_transport(fake, kind) as t:
            results, [info] = await round_trip(t, [(CHAT, chat("x"))])
            assert info.state == FAILED and not info.queue_limited and results == {}
            assert "failed validation" in info.message
        fake.configure(max_lines=2)  # the provider's line limit, below the transport's
        async with openai_transport(fake, kind) as t:
            _, [info] = await round_trip(t, [(CHAT, chat(f"y {i}")) for i in range(3)])
            assert info.state == FAILED
            assert info.errors[0].code == "too_many_requests"
            assert "more than the 2" in info.message
            mixed = [t.line(CHAT, chat(f"z {kind}", model=m)) for m in ("m1", "m2")]
            [one] = t.pack(mixed[:1])
            two = BatchFile(tuple(mixed), CHAT, "m1", sum(len(x.data) for x in mixed), "mixed")
            info = await until_over(t, await t.create(two, await t.upload(two)))
            assert [e.code for e in info.errors] == ["mismatched_model"]
            assert info.errors[0].line == 2 and "one model per batch file" in info.message
            fake.configure(max_bytes=len(one.data()) - 1)
            info = await until_over(t, await t.create(one, await t.upload(one)))
            assert [e.code for e in info.errors] == ["file_too_large"]
        fake.configure(anthropic_max_requests=1)
        async with anthropic_transport(fake, kind) as t:
            [file] = t.pack(t.line("/v1/messages", message(f"r{i}")) for i in range(2))
            with pytest.raises(anthropic.BadRequestError, match="at most 1 requests"):
                await t.create(file, await t.upload(file))
    run(main())


@both
def test_the_queue_limit_is_reported_apart_from_other_failures(fake, kind):
    fake.configure(delay=60, queue_tokens=40)
    requests = [(CHAT, chat(f"queued {i} " + "word " * 10)) for i in range(3)]

    async def main():
        async with openai_transport(fake, kind) as t:
            [(_, first)] = await submit(t, requests[:2])  # 2 x 17 tokens: enqueued
            first = await in_progress(t, first)
            assert first.provider_status == "in_progress"
            [(_, second)] = await submit(t, requests[2:])
            second = await until_over(t, second)
            assert second.state == FAILED and second.queue_limited
            assert "Enqueued token limit" in second.message
            fake.configure(queue_refuse=True)  # a gateway refuses at create
            [file] = t.pack([t.line(*requests[2])])
            with pytest.raises(QueueLimitError, match="429"):
                await t.create(file, await t.upload(file))
            await until_over(t, await t.cancel(first.id))
    run(main())
    assert fake.stats()["queue_refused"] >= 1


@both
def test_listing_finds_the_maps_batches_after_a_crash(fake, kind):
    """A batch created but never recorded (the driver died) is found by the map's id."""
    async def main():
        async with openai_transport(fake, kind, map_id=f"map-crash-{kind}") as t:
            created = [info.id for _, info in await submit(t, [(CHAT, chat("a")),
                                                               (CHAT, chat("b", model="m2"))])]
        async with openai_transport(fake, kind, map_id="another-map") as other:
            await submit(other, [(CHAT, chat("c"))])
        async with openai_transport(fake, kind, map_id=f"map-crash-{kind}") as rerun:  # a new process
            found = await rerun.list_batches()
            assert sorted(i.id for i in found) == sorted(created)
            assert all(i.metadata["hn_map"] == f"map-crash-{kind}" for i in found)
            assert await rerun.list_batches(since=time.time() + 60) == []
    run(main())


@both
def test_anthropic_listing_recognizes_the_maps_batches_by_custom_id(fake, kind):
    fake.configure(delay=60)

    async def main():
        async with anthropic_transport(fake, kind, map_id=f"an-crash-{kind}") as t:
            [(_, mine)] = await submit(t, [("/v1/messages", message("a")),
                                           ("/v1/messages", message("b"))])
        async with anthropic_transport(fake, kind, map_id=f"an-other-{kind}") as other:
            [(_, theirs)] = await submit(other, [("/v1/messages", message("c"))])
        async with anthropic_transport(fake, kind, map_id=f"an-crash-{kind}") as rerun:
            running = {i.id: i for i in await rerun.list_batches(since=mine.created_at)}
            assert mine.id in running and not running[mine.id].confirmed  # not readable yet
            assert running[mine.id].total == 2
            await until_over(rerun, await rerun.cancel(mine.id))  # ended: results to read
            await until_over(rerun, await rerun.cancel(theirs.id))
            ended = await rerun.list_batches(since=mine.created_at)
            assert [(i.id, i.confirmed) for i in ended] == [(mine.id, True)]
    run(main())


@both
def test_files_are_deleted_after_download_and_unknown_batches_raise(fake, kind):
    async def main():
        async with openai_transport(fake, kind) as t:
            _, [info] = await round_trip(t, [(CHAT, chat("delete me"))])
            await t.delete_files(info)
            for file_id in (info.input_file_id, info.output_file_id):
                with pytest.raises(openai.NotFoundError):
                    await t.call(t.client.files.retrieve, file_id)
            await t.delete_files(info)  # twice is fine
            with pytest.raises(BatchNotFoundError, match="batch_nope"):
                await t.status("batch_nope")
        async with anthropic_transport(fake, kind) as t:
            _, [info] = await round_trip(t, [("/v1/messages", message("delete me"))])
            await t.delete_files(info)
            with pytest.raises(BatchNotFoundError, match=info.id):
                await t.status(info.id)
    run(main())


def test_packing_respects_the_providers_limits():
    t = OpenAIBatches(object(), "map-pack", limits=FileLimits(3, 10_000, True, max_inputs=4))
    lines = [t.line(CHAT, chat(f"r{i}", model=f"m{i % 2}")) for i in range(8)]
    lines += [t.line(CHAT, chat("r0", model="m0"))]  # the same request again: one line
    lines += [t.line("/v1/embeddings", {"model": "e", "input": ["a", "b", "c"]}),
              t.line("embeddings", {"model": "e", "input": ["d", "e"]})]
    files = list(t.pack(lines))
    for f in files:
        assert len(f.lines) <= 3 and f.size <= 10_000
        assert len({line.model for line in f.lines}) == 1 == len({ln.endpoint for ln in f.lines})
        assert len(set(f.custom_ids)) == len(f.custom_ids)
    assert sum(len(f.lines) for f in files) == 10
    assert [len(f.lines) for f in files if f.endpoint == "/v1/embeddings"] == [1, 1]  # 5 > 4
    small = OpenAIBatches(object(), "map-pack", limits=FileLimits(100, 300, True))
    sized = list(small.pack(small.line(CHAT, chat("w " * 30 + str(i))) for i in range(5)))
    assert len(sized) > 1 and all(f.size <= 300 for f in sized)
    with pytest.raises(ValueError, match="more than a batch file may hold"):
        list(small.pack([small.line(CHAT, chat("w " * 200))]))
    a = AnthropicBatches(object(), "map-pack")
    mixed = list(a.pack(a.line("/v1/messages", message("x", model=m)) for m in "abc"))
    assert len(mixed) == 1 and mixed[0].model is None


def test_custom_ids_are_valid_and_name_the_request():
    t, a = OpenAIBatches(object(), "m"), AnthropicBatches(object(), "m")
    body = {"model": "x", "messages": [{"role": "user", "content": "hé"}], "temperature": 0}
    same = {"temperature": 0, "messages": [{"content": "hé", "role": "user"}], "model": "x"}
    assert t.line(CHAT, body).custom_id == t.line("chat.completions", same).custom_id
    assert t.line(CHAT, body).custom_id != t.line(CHAT, {**body, "temperature": 1}).custom_id
    assert t.line(CHAT, body).custom_id != OpenAIBatches(object(), "m2").line(CHAT, body).custom_id
    for cid in (t.line(CHAT, body).custom_id, a.line("/v1/messages", body).custom_id):
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", cid)
    with pytest.raises(ValueError, match="batch_api=False"):
        t.line("/v1/images/generations", body)
    with pytest.raises(ValueError, match="/v1/messages"):
        a.line(CHAT, body)
    for transport, endpoint in ((t, CHAT), (a, "/v1/messages")):
        with pytest.raises(ValueError, match="stream=True"):
            transport.line(endpoint, {**body, "stream": True})


@pytest.mark.parametrize("good", [openai.OpenAI, openai.AsyncOpenAI, anthropic.Anthropic,
                                  anthropic.AsyncAnthropic])
def test_transport_for_picks_the_clients_provider(good):
    client = good(api_key="x", base_url="http://127.0.0.1:9")
    t = transport_for(client, "map")
    assert isinstance(t, BatchTransport)
    assert t.provider == ("openai" if good.__module__.startswith("openai") else "anthropic")


def test_an_unsupported_client_names_the_supported_ones_and_the_protocol():
    with pytest.raises(UnsupportedClientError) as err:
        transport_for(httpx.Client(), "map", where="node 'classify', resource 'llm'")
    text = str(err.value)
    for name in ("node 'classify'", "httpx.Client", "openai.AsyncOpenAI", "anthropic.Anthropic",
                 "hypernodes_dist.batchapi.transport.BatchTransport"):
        assert name in text


@both
def test_a_batch_cancelled_while_validating_ran_no_line(fake, kind):
    fake.configure(validate_delay=30)

    async def main():
        async with openai_transport(fake, kind) as t:
            [(_, info)] = await submit(t, [(CHAT, chat(f"never {kind}"))])
            assert info.provider_status == "validating"
            info = await until_over(t, await t.cancel(info.id))
            assert (info.provider_status, info.succeeded) == ("cancelled", 0)
            assert [r async for r in t.results(info)] == []  # missing lines: not run
    run(main())
    assert request_key(CHAT, chat(f"never {kind}")) not in fake.counts()


def test_the_online_endpoints_keep_a_rate_limit_the_batch_path_does_not(fake):
    fake.configure(rpm=2)
    client = openai.OpenAI(base_url=fake.base_url, api_key="x", max_retries=0)
    for i in range(2):
        client.chat.completions.create(**chat(f"online {i}"))
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(**chat("online 2"))
    assert float(err.value.response.headers["retry-after"]) > 0
    assert err.value.response.headers["x-ratelimit-limit-requests"] == "2"
    assert fake.counts()[request_key(CHAT, chat("online 2"))] == [1, 0]  # not answered

    async def main():
        async with openai_transport(fake, "sync") as t:
            results, _ = await round_trip(t, [(CHAT, chat(f"batched {i}")) for i in range(5)])
            assert {r.kind for r in results.values()} == {SUCCEEDED}
    run(main())
    client.close()


def test_embeddings_answer_base64_when_asked_as_the_openai_client_does(fake):
    client = openai.OpenAI(base_url=fake.base_url, api_key="x", max_retries=0)
    decoded = client.embeddings.create(model="emb", input="a b").data[0].embedding  # base64
    floats = client.embeddings.create(model="emb", input="a b", encoding_format="float")
    assert decoded == pytest.approx(floats.data[0].embedding) and len(decoded) == 8
    client.close()


def test_result_lines_keep_their_body_bytes_and_any_other_shape_is_parsed_whole():
    """A succeeded line in the provider's documented shape keeps its body as the bytes it
    came with (written to the answer file as they are); a file in another shape (a key after
    the body, another order) is parsed, and both read the same."""
    from hypernodes_dist.batchapi import anthropic_batches as ab
    from hypernodes_dist.batchapi import openai_batches as ob
    from hypernodes_dist.batchapi.transport import read_results

    body = {"id": "c", "choices": [{"message": {"content": 'a "}, \\"error\\": null}'}}]}
    line = {"id": "r", "custom_id": "t_1", "response": {
        "status_code": 200, "request_id": "q", "body": body}, "error": None}
    spaced, compact = json.dumps(line).encode(), json.dumps(line, separators=(",", ":")).encode()
    after = json.dumps({"id": "r", "custom_id": "t_2", "response": {
        "status_code": 200, "body": body, "request_id": "q"}, "error": None}).encode()
    extra = json.dumps({"id": "r", "custom_id": "t_3", "response": {
        "status_code": 200, "request_id": "q", "body": body, "x": {"y": 1}}, "error": None})
    for lines in ([spaced, compact], [after, spaced], [extra.encode(), spaced]):
        got = list(read_results(b"\n".join(lines) + b"\n", ob._fast_result, ob._line_result))
        assert [r.body for r in got] == [body, body]
        assert [r.kind for r in got] == [SUCCEEDED, SUCCEEDED]
        assert all(json.loads(r.raw) == body for r in got)  # the body's bytes, either way
    message = {"id": "m", "content": [{"type": "text", "text": "}}"}]}
    line = json.dumps({"custom_id": "t_4", "result": {"type": "succeeded", "message": message}})
    [got] = read_results(line.encode(), ab._fast_result, ab._line_result)
    assert got.raw is not None and got.body == message and got.status == 200


def test_a_results_file_read_at_once_writes_the_answers_line_by_line_writes(tmp_path):
    """An OpenAI results file whose every line succeeded in the documented shape is read
    at once (``read_at_once``) into the answer store's layout: the same answer file, byte for
    byte, as each line read and written alone; a file with any other line (an error, a
    blank line, ``\\r\\n``) is read line by line."""
    from hypernodes_dist.batchapi import openai_batches as ob
    from hypernodes_dist.batchapi.recording import Answer
    from hypernodes_dist.batchapi.store import AnswerStore
    from hypernodes_dist.batchapi.transport import read_at_once, read_results

    def line(i: int, status: int = 200, sep: tuple[str, str] = (", ", ": "), **extra: Any) -> bytes:
        body = {"id": f"c{i}", "choices": [{"message": {"content": f'é "}}, \\"error\\": null}} {i}'}}]}
        return json.dumps({"id": f"r{i}", "custom_id": f"tag_{i:032x}", "response": {
            "status_code": status, "request_id": None if i % 2 else f"q{i}", "body": body, **extra},
            "error": None}, separators=sep).encode()

    def written(data: bytes, name: str) -> bytes:
        store = AnswerStore(tmp_path)
        with store.writer(name) as out:
            block = read_at_once(data, ob._fast_result, ob._line_result, ob._AT_ONCE)
            if block is not None:
                out.add_lines(block)
            else:
                for r in read_results(data, ob._fast_result, ob._line_result):
                    out.add(r.custom_id.split("_", 1)[1], Answer(int(r.status or 200),
                                                                 r.body if r.raw is None else r.raw))
        return (tmp_path / "answers" / f"{name}.jsonl").read_bytes()

    good = [line(i) for i in range(5)] + [line(5, 201, (",", ":"))]
    for data in (b"\n".join(good) + b"\n", b"\n".join(good)):
        block = read_at_once(data, ob._fast_result, ob._line_result, ob._AT_ONCE)
        assert block is not None and block.digests == [f"{i:032x}" for i in range(6)]
        assert block.statuses == [200] * 5 + [201]
        store = AnswerStore(tmp_path)
        assert written(data, "once") == block.data == b"".join(
            b'{"d":"%s","s":%d,"b":%s}\n' % (d.encode(), s, r.raw) for d, s, r in zip(
                block.digests, block.statuses,
                read_results(data, ob._fast_result, ob._line_result)))
        assert store.get(f"{5:032x}") == Answer(201, json.loads(good[5])["response"]["body"])
    for bad in ([line(9, 400)], [b""], [b" "]):
        data = b"\n".join(good[:2] + bad + good[2:]) + b"\n"
        assert read_at_once(data, ob._fast_result, ob._line_result, ob._AT_ONCE) is None
    assert read_at_once(b"\r\n".join(good), ob._fast_result, ob._line_result, ob._AT_ONCE) is None


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_files_packed_from_the_logs_bytes_equal_those_packed_line_by_line(tmp_path, provider):
    """The driver submits from the request log a block at a time: each block's lines made
    from the logged bytes (``raw_lines``) and packed whole are, file for file, the lines a
    body at a time (``line``) packed one by one: same bytes, custom_ids and file tags, cut
    alike where a file fills (lines, bytes, embedding inputs, one model a file)."""
    log = RequestLog(tmp_path)
    if provider == "openai":
        t: Any = OpenAIBatches(object(), "map-raw", limits=FileLimits(4, 2_000, True, 5))
        requests = [(CHAT, chat(f"r{i} \u00e9 " + "w " * (i % 7), model=f"m{i // 5 % 2}"))
                    for i in range(23)]
        requests += [("/v1/embeddings", {"model": "e", "input": ["a"] * (1 + i % 3)})
                     for i in range(6)]
    else:
        t = AnthropicBatches(object(), "map-raw", limits=FileLimits(4, 1_500, False))
        requests = [("/v1/messages", message(f"r{i} " + "w " * (i % 9), model=f"c{i % 2}"))
                    for i in range(23)]
    with log.round():
        for endpoint, body in requests:
            log.record(endpoint, body, "llm")
    blocks = list(log.blocks("llm"))
    packer, raw = Packer(t.limits), []
    for block in blocks:
        made = t.raw_lines(block.endpoint, block.model, block.digests, block.bodies,
                           block.inputs)
        assert made is not None
        raw += packer.add_block(made)
    raw += packer.close()
    by_line = list(t.pack(t.line(e, b) for e, b in requests))
    assert len(by_line) > 3
    assert [(f.tag, f.custom_ids, f.data(), f.count, f.size, f.endpoint, f.model)
            for f in raw] == [(f.tag, f.custom_ids, f.data(), f.count, f.size, f.endpoint,
                               f.model) for f in by_line]
    # a body with a "stream" key anywhere is read and lined one by one (``line`` refuses it)
    assert t.raw_lines(blocks[0].endpoint, "m", ["0" * 32], [b'{"stream":false}'], [1]) is None
