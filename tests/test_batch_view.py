"""The events and spans of a map's provider batches beyond the plain case (local engine):
a batch failed as a whole is a failed span with the provider's message and its lines go
into a new batch; a ``wait=False`` map announces its running batches, and the rerun that
collects them (found running) ends them; a dataset map reports its batches too."""

from __future__ import annotations

import pyarrow as pa
import pytest

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.events import BatchEndedEvent, BatchSubmittedEvent
from hypernodes_dist.run.batchmap import POLL_ENV
from hypernodes_dist.trace import TraceCollector, summary
from tests.conformance import batch_api_graphs as B
from tests.conformance import batch_view_graphs as V


class Batches:
    """The provider batches' events a map's callbacks received, in order."""

    def __init__(self) -> None:
        self.events: list = []

    def on_batch_submitted(self, event: BatchSubmittedEvent) -> None:
        self.events.append(event)

    def on_batch_ended(self, event: BatchEndedEvent) -> None:
        self.events.append(event)

    def ended(self) -> list[BatchEndedEvent]:
        return [e for e in self.events if isinstance(e, BatchEndedEvent)]


def _inputs(fake, texts):
    return {"text": texts, "base_url": fake.base_url}


def test_a_batch_failed_whole_is_a_failed_span_and_its_lines_go_again(batch_fake, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setenv(POLL_ENV, "0.05")
    batch_fake.configure(fail_batches=1)  # the first batch fails validation as a whole
    seen, trace = Batches(), TraceCollector()
    graph = Graph([B.oa_sync, B.label_retried], cache=DiskCache(tmp_path / "c"),
                  callbacks=[seen, trace])
    res = graph.map(_inputs(batch_fake, [f"whole {i}" for i in range(6)]), map_over="text")
    assert not res.errors
    first, second = seen.ended()
    assert (first.status, first.answered, first.lines) == ("failed", 0, 6)
    assert first.reason and first.batch_id  # the provider's message
    assert (second.status, second.answered, second.failed_lines) == ("done", 6, 0)
    assert summary(trace.trace)["label_retried"].batches == {"done": 1, "failed": 1}
    spans = {r.status: r for r in trace.trace.nodes.values() if r.kind == "batch"}
    assert spans["failed"].error == first.reason and spans["done"].items == 6


def test_wait_false_announces_running_batches_and_the_rerun_ends_them(batch_fake, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv(POLL_ENV, "0.05")
    batch_fake.configure(delay=30.0)  # still running when the first map returns
    texts = [f"later {i}" for i in range(5)]
    first = Batches()
    graph = Graph([B.oa_sync, B.label_sync], cache=DiskCache(tmp_path / "c"),
                  callbacks=[first])
    res = graph.map(_inputs(batch_fake, texts), map_over="text", wait=False)
    assert res.pending == 5
    assert [type(e) for e in first.events] == [BatchSubmittedEvent]
    batch_fake.complete()  # the provider has answered
    again, trace = Batches(), TraceCollector()
    graph = Graph([B.oa_sync, B.label_sync], cache=DiskCache(tmp_path / "c"),
                  callbacks=[again, trace])
    res = graph.map(_inputs(batch_fake, texts), map_over="text")
    assert res.pending == 0 and not res.errors
    found, ended = again.events
    assert isinstance(found, BatchSubmittedEvent)
    assert found.batch_id == first.events[0].batch_id  # found running, announced again
    assert isinstance(ended, BatchEndedEvent) and (ended.status, ended.answered) == ("done", 5)
    span, = [r for r in trace.trace.nodes.values() if r.kind == "batch"]
    # the create's time, as the first run's ledger recorded it
    assert span.status == "done" and abs(span.started_at - first.events[0].started_at) < 1


@pytest.mark.parametrize("nodes", [[B.oa_async, B.label_async], [V.oa_sync, V.untyped]],
                         ids=["typed", "typed-by-its-first-rows"])
def test_a_dataset_map_reports_its_batches(batch_fake, tmp_path, monkeypatch, nodes):
    """``untyped``: the map waits for its first rows' batch to fix the schema (before the
    bar exists): that batch is reported too."""
    monkeypatch.setenv(POLL_ENV, "0.05")
    seen = Batches()
    graph = Graph(nodes, callbacks=[seen])
    res = graph.map(source=pa.table({"text": [f"row {i}" for i in range(7)]}),
                    inputs={"base_url": batch_fake.base_url}, into=tmp_path / "out")
    assert res.rows == 7 and res.usage[nodes[1].name]["batch_calls"] == 7
    ended = seen.ended()
    assert len(ended) == batch_fake.stats()["batches"] >= 1
    assert sum(e.answered for e in ended) == 7 == sum(e.lines for e in ended)
    assert {(e.status, e.resource) for e in ended} == {("done", nodes[0].name)}
