"""Items flow: no batch barrier holds an item back behind another one that waits.

Each test makes one item wait for something a batch barrier would never let happen
(other items' downstream nodes, the next batch's calls, another batch's delivery): a
barrier turns the wait into a ``TimeoutError`` after a few seconds instead of a hang.
"""

from __future__ import annotations

import asyncio

import pytest

from hypernodes_dist import Graph, GraphEngine, node
from hypernodes_dist.events import NodeEndEvent

WAIT = 10.0  # seconds a waiting item gives the others before the test fails


def _signals():
    return {"after": 0, "started": set(), "event": None}


def test_a_retrying_item_holds_back_no_other_items_downstream_node():
    seen = _signals()
    n = 6

    @node(output_name="y", retries=2, backoff=0.01, retry_on=ConnectionError)
    async def api(x: int) -> int:
        if x == 0:
            if seen["event"] is None:
                seen["event"] = asyncio.Event()
                raise ConnectionError("first attempt fails")
            await asyncio.wait_for(seen["event"].wait(), WAIT)  # the others' `after` ran
        return x * 10

    @node(output_name="z")
    def after(y: int) -> int:
        seen["after"] += 1
        if seen["after"] == n - 1 and seen["event"] is not None:
            seen["event"].set()
        return y + 1

    res = Graph([api, after]).map({"x": list(range(n))}, map_over="x")
    assert [r["z"] for r in res] == [x * 10 + 1 for x in range(n)]  # still in item order
    assert [r.history[0].node_id for r in res] == ["api"] * n


def test_the_local_engine_keeps_the_next_batch_in_flight():
    started: set[int] = set()
    next_batch = asyncio.Event()

    @node(output_name="y")
    async def slow(x: int) -> int:
        started.add(x)
        if x == 2:
            next_batch.set()
        if x == 0:  # the first batch cannot finish before the second one has started
            await asyncio.wait_for(next_batch.wait(), WAIT)
        return x

    res = Graph([slow], engine=GraphEngine(batch_size=2)).map({"x": [0, 1, 2, 3]}, map_over="x")
    assert [r["y"] for r in res] == [0, 1, 2, 3] and started == {0, 1, 2, 3}


def test_a_waiting_item_holds_back_no_other_batchs_delivery():
    delivered = asyncio.Event()

    class Delivery:
        def on_node_end(self, event: NodeEndEvent) -> None:
            if event.item_index == 3:
                delivered.set()

    @node(output_name="y")
    async def call(x: int) -> int:
        if x == 0:  # item 3's batch reaches the callbacks while item 0 still waits
            await asyncio.wait_for(delivered.wait(), WAIT)
        return x

    g = Graph([call], engine=GraphEngine(batch_size=2), callbacks=[Delivery()])
    assert [r["y"] for r in g.map({"x": [0, 1, 2, 3]}, map_over="x")] == [0, 1, 2, 3]


def test_the_first_error_stops_the_flow_and_is_raised():
    ran: list[int] = []

    @node(output_name="y")
    async def fails_on_three(x: int) -> int:
        await asyncio.sleep(0.001 * x)
        ran.append(x)
        if x == 3:
            raise ValueError("bad item 3")
        return x

    with pytest.raises(ValueError, match="bad item 3") as info:
        Graph([fails_on_three], engine=GraphEngine(batch_size=4)).map(
            {"x": list(range(40))}, map_over="x")
    assert any("item 3" in note for note in info.value.__notes__)
    assert len(ran) < 40  # the rest was cancelled


def test_waits_are_reported_apart_from_running_time():
    calls: list[int] = []

    @node(output_name="y", retries=1, backoff=0.3, concurrency=1)
    async def api(x: int) -> int:
        calls.append(x)
        if len(calls) % 2:
            raise ConnectionError("once")
        return x

    class Seen:
        def __init__(self) -> None:
            self.ends, self.retries = [], []

        def on_node_end(self, event: NodeEndEvent) -> None:
            self.ends.append(event)

        def on_policy(self, event) -> None:
            self.retries.append(event)

    for how in ("map", "run"):
        seen = Seen()
        g = Graph([api], callbacks=[seen])
        g.map({"x": [1]}, map_over="x") if how == "map" else g.run({"x": 1})
        [end], [retry] = seen.ends, seen.retries
        assert (retry.kind, retry.wait) == ("retry", 0.3)  # the wait, in its own event
        # the successful attempt started after the back-off: its start and duration are
        # its own, not the item's (which began before the first attempt failed)
        assert end.started_at >= retry.timestamp + 0.3 - 0.01
        assert end.started_at + end.duration_ms / 1e3 <= end.timestamp + 0.01


@pytest.mark.parametrize("engine", [GraphEngine(), GraphEngine(batch_size=3)])
def test_items_that_never_wait_and_items_that_wait_under_timeouts_share_a_flow(engine):
    """Items that end without waiting run inline; one that waits goes on in its own task,
    its timeout scopes (the node's ``timeout=``, its own ``asyncio.timeout``) with it: the
    slow item times out alone, every other item ends, in item order."""
    release = asyncio.Event()

    @node(output_name="y", timeout=0.5)
    async def api(x: int) -> int:  # items 0-4 end without waiting: inline
        if x == 5:
            await asyncio.sleep(WAIT)  # timed out by the node's timeout
        if x == 7:
            async with asyncio.timeout(WAIT):  # its own scope, around a wait that ends
                await asyncio.sleep(0.05)
            release.set()
        if x in (6, 9):
            await asyncio.wait_for(release.wait(), WAIT)  # waits for item 7
        return x * 10

    res = Graph([api], engine=engine).map({"x": list(range(12))}, map_over="x",
                                          on_error="collect")
    assert [(i, type(r.error).__name__) for i, r in enumerate(res) if r.error] == [
        (5, "NodeTimeoutError")]
    assert [r["y"] for r in res if r.status == "complete"] == [
        x * 10 for x in range(12) if x != 5]
