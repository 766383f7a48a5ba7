"""What a user sees of a map's provider batches, on every engine: one trace span per batch
with its lines (``BatchSubmittedEvent`` / ``BatchEndedEvent`` to the map's callbacks), the
batches by state and the lines on the bar and in ``ProgressEvent``, and the cost saved."""

from __future__ import annotations

import pytest

from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.events import BatchEndedEvent, BatchSubmittedEvent
from hypernodes_dist.run.batchmap import POLL_ENV
from hypernodes_dist.trace import TraceCollector, summary, timeline

from . import batch_view_graphs as V

# 6 for gpt-4o-mini (one a 400), 4 for gpt-4o ("!"): two files, two batches
TEXTS = [f"mini {i}" for i in range(5)] + ["mini bad [[status:400]]"] + [
    f"big {i}!" for i in range(4)]


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setenv(POLL_ENV, "0.05")


class Seen:
    """Records the provider batches' events and the last ``ProgressEvent``."""

    def __init__(self) -> None:
        self.batches: list = []
        self.progress = None

    def on_batch_submitted(self, event: BatchSubmittedEvent) -> None:
        self.batches.append(event)

    def on_batch_ended(self, event: BatchEndedEvent) -> None:
        self.batches.append(event)

    def on_progress(self, event) -> None:
        self.progress = event


def test_each_batch_is_a_span_with_its_lines_and_the_bar_shows_them(engine, batch_fake,
                                                                   tmp_path, capsys):
    seen, collector = Seen(), TraceCollector()
    graph = Graph([V.oa_sync, V.two_models], engine=engine, cache=DiskCache(tmp_path / "c"),
                  callbacks=[collector, seen])
    res = graph.map({"text": TEXTS, "base_url": batch_fake.base_url}, map_over="text",
                    on_error="collect", progress=True)
    assert len(res.errors) == 1 and res.pending == 0

    started = [e for e in seen.batches if isinstance(e, BatchSubmittedEvent)]
    ended = [e for e in seen.batches if isinstance(e, BatchEndedEvent)]
    assert len(started) == len(ended) == 2 == batch_fake.stats()["batches"]
    assert {e.batch_id for e in started} == {e.batch_id for e in ended}
    assert sorted(e.lines for e in ended) == [4, 6]
    assert sorted((e.answered, e.failed_lines) for e in ended) == [(4, 0), (5, 1)]
    assert all(e.status == "done" and e.provider == "openai" and e.resource == "oa_sync"
               and e.node_id == "two_models" and e.ended_at >= e.started_at > 0
               for e in ended)

    trace = collector.trace
    spans = [r for r in trace.nodes.values() if r.kind == "batch"]
    assert sorted((s.items, s.failed, s.status) for s in spans) == [(4, 0, "done"),
                                                                    (5, 1, "done")]
    maps = [r.id for r in trace.nodes.values() if r.kind == "map"]
    assert len(maps) == 1 and sorted(e.dst for e in trace.edges if e.kind == "batch") == sorted(
        s.id for s in spans) and all(e.src == maps[0] for e in trace.edges if e.kind == "batch")
    stats = summary(trace)["two_models"]
    assert stats.batches == {"done": 2} and stats.batch_lines == 9
    lane = [s for s in timeline(trace).spans if s.node_id == "two_models batch"]
    assert len(lane) == 2 and {s.worker for s in lane} == {"openai batches"}

    used = res.usage["two_models"]
    saved = used["batch_cost"]  # the cost the batch-answered calls metered, at half price
    assert used["batch_calls"] == 9 and saved == pytest.approx(used["cost"])
    final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "batches=2 done, lines=9 done 1 failed" in final
    assert "saved=" in final and "batch_calls" not in final
    event = seen.progress
    assert event.final and event.batches == {"done": 2}
    assert (event.batch_lines["done"], event.batch_lines["failed"]) == (9, 1)
    assert event.saved == pytest.approx(saved)
