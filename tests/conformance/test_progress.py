"""Progress on every engine: while rows run, the counts come from where they run (not only
when a batch or a file is done), so ``on_progress`` callbacks (and the bar, fed by the
same counts) hear at least once a second; a budget stop says so in one warning line."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from hypernodes_bench.llm_server import label_of
from hypernodes_dist import DiskCache, Graph
from hypernodes_dist.errors import MapStoppedWarning
from hypernodes_dist.events import ProgressEvent

from . import progress_graphs as P
from . import usage_graphs as U

TEXTS = [f"row {i}" for i in range(60)]


@pytest.fixture(scope="module")
def slow_server(llm_servers):
    """Answers after 40-60 ms."""
    return llm_servers(latency=(0.04, 0.06))


class Heard:
    """The ``ProgressEvent``s of one map, with when they arrived."""

    def __init__(self) -> None:
        self.events: list[tuple[float, ProgressEvent]] = []

    def on_progress(self, event: ProgressEvent) -> None:
        self.events.append((time.monotonic(), event))

    def check(self, n: int) -> None:
        """Heard about 4 times a second from the first row done to the end: every gap
        under a second but one (a loaded 2-core test machine stalls a process now and
        then), and that one under 3 s; moving by rows (not only by batch or file), ending
        with every row done."""
        times = [t for t, _ in self.events]
        done = [e.done for _, e in self.events]
        assert done == sorted(done) and self.events[-1][1].final and done[-1] == n
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        assert gaps[-1] < 3.0 and gaps[-2] < 1.0, list(zip(times, done))
        assert gaps[len(gaps) // 2] < 0.5, list(zip(times, done))
        assert len(set(done)) >= 5, done


def _warm(g: Graph, **kwargs) -> None:
    """The same rows once first: every worker process started (a pool starts processes
    as partitions need them), modules imported; what is measured is a running map, not
    an engine starting."""
    g.map(map_over="text", **kwargs)


def test_progress_events_arrive_while_rows_run(engine, slow_server):
    _warm(Graph([U.llm, P.ask], engine=engine),
          inputs={"text": TEXTS, "base_url": slow_server.base_url})
    heard = Heard()
    g = Graph([U.llm, P.ask], engine=engine, callbacks=[heard])
    res = g.map({"text": TEXTS, "base_url": slow_server.base_url}, map_over="text")
    assert [r["label"] for r in res] == [label_of(t) for t in TEXTS]
    heard.check(len(TEXTS))
    last = heard.events[-1][1]
    assert last.usage["tokens"] == res.usage["ask"]["tokens"] and last.projected == {}


def test_progress_of_a_dataset_map_moves_before_its_files_are_written(engine, slow_server,
                                                                     tmp_path):
    _warm(Graph([P.ask_sync], engine=engine),
          inputs={"text": TEXTS[:30], "base_url": slow_server.base_url},
          into=tmp_path / "warm")
    heard = Heard()
    g = Graph([P.ask_sync], engine=engine, callbacks=[heard])
    res = g.map(source=pa.table({"text": TEXTS[:30]}), into=tmp_path / "out",
                inputs={"base_url": slow_server.base_url})
    assert res.rows == 30
    heard.check(30)
    # what the rows metered moves with them (one file, written at the end: the channel)
    early = [e for _, e in heard.events if 0 < e.done < 30 and e.usage.get("tokens")]
    assert early and all(e.projected["tokens"] > e.usage["tokens"] for e in early)
    assert heard.events[-1][1].usage["tokens"] == res.usage["ask_sync"]["tokens"]


def test_a_budget_stop_warns_in_one_line(engine, logs, tmp_path):
    xs = list(range(30))
    g = Graph([U.paid], engine=engine, cache=DiskCache(tmp_path / "c"))
    with pytest.warns(MapStoppedWarning) as caught:
        res = g.map({"x": xs, "log_dir": logs}, map_over="x", budget={"cost": 6},
                    on_error="collect")
    [warning] = [w for w in caught if w.category is MapStoppedWarning]  # one line, once
    refused = len(res.errors)
    text = str(warning.message)
    assert "\n" not in text and text.startswith("budget {'cost': 6} reached after ")
    assert f"{30 - refused:,} of 30 items: {refused:,} items not run" in text
    assert "rerun the same map with a larger budget" in text
    with pytest.warns(MapStoppedWarning, match=r"of 30 rows: \d+ rows not written"):
        g.map({"x": xs, "log_dir": logs}, map_over="x", budget={"cost": 1},
              into=tmp_path / "out", on_error="collect")
