"""Streaming nodes: generators, async generators, streaming=True objects; chunk events,
joined values, back-pressure in iter(), concurrent streams interleaved but identifiable."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator

import pytest

from hypernodes_dist import DiskCache, Graph, GraphEngine, node
from hypernodes_dist.events import (
    NodeEndEvent,
    StreamingChunkEvent,
    StreamingEndEvent,
    StreamingStartEvent,
)

from .conformance import edge_graphs as E


class Recorder:
    def __init__(self) -> None:
        self.events: list = []

    def on_event(self, event) -> None:
        self.events.append(event)


def chunks_of(events, node_id=None):
    return [e for e in events if isinstance(e, StreamingChunkEvent)
            and (node_id is None or e.node_id == node_id)]


@node(output_name="text", tags=["response"])
def words(topic: str):
    yield from ("hello ", "about ", topic)


def test_sync_generator_chunks_and_joined_str():
    rec = Recorder()
    r = Graph([words], callbacks=[rec]).run({"topic": "AI"})
    assert r["text"] == "hello about AI"
    chunks = chunks_of(rec.events)
    assert [(c.chunk, c.chunk_index) for c in chunks] == [("hello ", 0), ("about ", 1), ("AI", 2)]
    assert all(c.node_id == "words" and c.output_name == "text" and c.tags == ("response",)
               for c in chunks)
    start = next(e for e in rec.events if isinstance(e, StreamingStartEvent))
    end = next(e for e in rec.events if isinstance(e, StreamingEndEvent))
    assert start.output_name == "text" and end.final_value == "hello about AI"
    assert end.tags == ("response",) and end.step_index == chunks[0].step_index == 0
    order = [type(e).__name__ for e in rec.events if "Stream" in type(e).__name__
             or type(e).__name__ in ("NodeStartEvent", "NodeEndEvent")]
    assert order == ["NodeStartEvent", "StreamingStartEvent"] + ["StreamingChunkEvent"] * 3 + [
        "StreamingEndEvent", "NodeEndEvent"]


@pytest.mark.parametrize(
    "chunks, joined",
    [
        ([b"ab", b"cd"], b"abcd"),
        ([{"a": 1}, {"b": 2}, {"a": 3}], {"a": 3, "b": 2}),
        ([1, 2, 3], [1, 2, 3]),
        ([], []),  # nothing streamed: the empty value of its kind (README)
    ],
)
def test_async_generator_joins(chunks, joined):
    @node(output_name="out")
    async def agen(n: int):
        for c in chunks:
            await asyncio.sleep(0)
            yield c

    rec = Recorder()
    r = Graph([agen], callbacks=[rec]).run({"n": 1})
    assert r["out"] == joined
    assert [c.chunk for c in chunks_of(rec.events)] == chunks


def test_streaming_true_on_a_custom_stream_object():
    class Stream:
        def __init__(self, parts):
            self.parts = parts

        def __iter__(self):
            return iter(self.parts)

    @node(output_name="reply", streaming=True)
    def call_llm(prompt: str) -> Stream:
        return Stream([prompt, "!", "?"])

    rec = Recorder()
    r = Graph([call_llm], callbacks=[rec]).run({"prompt": "hi"})
    assert r["reply"] == "hi!?"
    assert [c.chunk for c in chunks_of(rec.events)] == ["hi", "!", "?"]


def test_streaming_true_on_an_async_iterable_object():
    class AStream:
        def __aiter__(self):
            async def gen():
                for p in ("a", "b"):
                    yield p
            return gen()

    @node(output_name="reply", streaming=True)
    async def call_llm(prompt: str):
        return AStream()

    assert Graph([call_llm]).run({"prompt": "x"})["reply"] == "ab"


def test_iter_consumer_sees_each_chunk_before_the_next_is_produced():
    produced: list[int] = []

    @node(output_name="nums")
    async def count(n: int):
        for i in range(n):
            produced.append(i)
            yield i

    async def go():
        seen = []
        async with Graph([count]).iter(inputs={"n": 4}) as run:
            async for e in run:
                if isinstance(e, StreamingChunkEvent):
                    # back-pressure: the generator has not run ahead of the consumer
                    seen.append((e.chunk, list(produced)))
        return seen, run.result

    seen, result = asyncio.run(go())
    assert [s[0] for s in seen] == [0, 1, 2, 3]
    for chunk, produced_so_far in seen:
        assert produced_so_far[-1] <= chunk + 1
    assert result["nums"] == [0, 1, 2, 3]


def test_sync_generator_streams_chunk_by_chunk_in_iter():
    produced: list[str] = []

    @node(output_name="text")
    def gen(n: int):
        for i in range(n):
            produced.append(str(i))
            yield str(i)

    async def go():
        lags = []
        async with Graph([gen]).iter(inputs={"n": 3}) as run:
            async for e in run:
                if isinstance(e, StreamingChunkEvent):
                    lags.append(len(produced) - e.chunk_index)
        return lags, run.result["text"]

    lags, text = asyncio.run(go())
    assert text == "012" and max(lags) <= 2


def _parallel_streams(sync: bool):
    if sync:
        both_started = threading.Barrier(2, timeout=60)  # each goes on once both have yielded

        @node(output_name="web_results", tags=["retrieval", "web"])
        def search_web(query: str):
            for i in range(4):
                if i == 1:
                    both_started.wait()
                yield f"w{i}"

        @node(output_name="db_results", tags=["retrieval", "db"])
        def search_db(query: str):
            for i in range(4):
                if i == 1:
                    both_started.wait()
                yield f"d{i}"
    else:
        @node(output_name="web_results", tags=["retrieval", "web"])
        async def search_web(query: str):
            for i in range(4):
                await asyncio.sleep(0.01)
                yield f"w{i}"

        @node(output_name="db_results", tags=["retrieval", "db"])
        async def search_db(query: str):
            for i in range(4):
                await asyncio.sleep(0.01)
                yield f"d{i}"

    @node(output_name="merged")
    def merge(web_results: str, db_results: str) -> str:
        return web_results + "|" + db_results

    return Graph([search_web, search_db, merge],
                 engine=GraphEngine(parallel_nodes=True, max_workers=2))


@pytest.mark.parametrize("sync", [False, True], ids=["async-gen", "sync-gen-threads"])
def test_two_streaming_nodes_in_parallel_interleave_but_are_identifiable(sync):
    g = _parallel_streams(sync)

    async def go():
        events = []
        async with g.iter(inputs={"query": "q"}) as run:
            async for e in run:
                events.append(e)
        return events, run.result

    events, result = asyncio.run(go())
    assert result["merged"] == "w0w1w2w3|d0d1d2d3"
    chunks = chunks_of(events)
    buffers = defaultdict(list)
    for c in chunks:
        buffers[(c.node_id, c.output_name)].append((c.chunk_index, c.chunk, c.tags))
    assert buffers[("search_web", "web_results")] == [
        (i, f"w{i}", ("retrieval", "web")) for i in range(4)]
    assert buffers[("search_db", "db_results")] == [
        (i, f"d{i}", ("retrieval", "db")) for i in range(4)]
    # interleaved: each stream's first chunk arrives before the other's last one
    ids = [c.node_id for c in chunks]
    assert ids.index("search_db") < len(ids) - 1 - ids[::-1].index("search_web")
    assert ids.index("search_web") < len(ids) - 1 - ids[::-1].index("search_db")
    # same step, distinct parallel indexes
    ends = {e.node_id: e for e in events if isinstance(e, NodeEndEvent)}
    assert ends["search_web"].step_index == ends["search_db"].step_index
    assert {ends["search_web"].parallel_index, ends["search_db"].parallel_index} == {0, 1}


def test_cache_hit_on_a_streaming_node_emits_no_chunks(tmp_path):
    rec = Recorder()
    g = Graph([words], cache=DiskCache(str(tmp_path / "c")), callbacks=[rec])
    g.run({"topic": "x"})
    rec.events.clear()
    assert g.run({"topic": "x"})["text"] == "hello about x"
    assert chunks_of(rec.events) == []
    ends = [e for e in rec.events if isinstance(e, NodeEndEvent)]
    assert ends[0].cached is True


# ------------------------------------------------------------------ empty streams


def test_empty_streams_are_empty_of_their_kind():
    res = Graph(E.STREAMS).run({"k": 0})
    assert res["numbers"] == [] and res["text"] == "" and res["sizes"] == (0, 0)

    @node(output_name="chunks")
    def typed(k: int) -> Iterator[bytes]:
        yield from (b"x" for _ in range(k))

    @node(output_name="parts")
    async def merged(k: int) -> AsyncIterator[dict]:
        for i in range(k):
            yield {i: i}

    out = Graph([typed, merged]).run({"k": 0})
    assert out["chunks"] == b"" and out["parts"] == {}
    assert Graph([typed, merged]).map({"k": [0, 1]}, map_over="k").column("parts") == [{}, {0: 0}]
