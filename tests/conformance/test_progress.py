"""Progress on every engine: while rows run, the counts come from where they run (not only
when a batch or a file is done), so ``on_progress`` callbacks (and the bar, fed by the
same counts) hear rows done while others still run; a budget stop says so in one warning
line. No clock: the last row waits until the callback has heard half the rows done."""

from __future__ import annotations

import pathlib

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
    """The ``ProgressEvent``s of one map of ``n`` rows; once one says half of them are
    done, it creates the file ``until`` that the held (last) row waits for. (Not ``n - 1``:
    events are throttled, the one saying so could be skipped while the held row runs.)"""

    def __init__(self, n: int, until: pathlib.Path) -> None:
        self.n, self.until = n, until
        self.events: list[ProgressEvent] = []
        self.released_at: int | None = None  # how many events had arrived then

    def on_progress(self, event: ProgressEvent) -> None:
        self.events.append(event)
        if self.released_at is None and event.done >= self.n // 2:
            self.released_at = len(self.events)
            self.until.touch()

    def check(self) -> None:
        """Half the rows were heard done while the held row had not finished (before the
        final event); the counts moved by rows (not only by batch or file), up to all: a
        count under half (the first row's, told at once), one of half or more while the
        held row waits, then all. (How many counts in between depends on how fast the rows
        run: events come at most 4 times a second.)"""
        done = [e.done for e in self.events]
        assert done == sorted(done) and self.events[-1].final and done[-1] == self.n
        assert self.released_at is not None and not self.events[self.released_at - 1].final
        assert self.n // 2 <= done[self.released_at - 1] < self.n, done
        assert 0 < done[0] < self.n // 2, done


def test_progress_events_arrive_while_rows_run(engine, slow_server, tmp_path):
    heard = Heard(len(TEXTS), tmp_path / "heard")
    g = Graph([P.llm, P.ask], engine=engine, callbacks=[heard])
    res = g.map({"text": TEXTS, "base_url": slow_server.base_url, "held": TEXTS[-1],
                 "until": str(heard.until)}, map_over="text")
    assert [r["label"] for r in res] == [label_of(t) for t in TEXTS]
    heard.check()
    last = heard.events[-1]
    assert last.usage["tokens"] == res.usage["ask"]["tokens"] and last.projected == {}


def test_progress_of_a_dataset_map_moves_before_its_files_are_written(engine, slow_server,
                                                                     tmp_path):
    texts = TEXTS[:30]
    heard = Heard(len(texts), tmp_path / "heard")
    g = Graph([P.ask_sync], engine=engine, callbacks=[heard])
    res = g.map(source=pa.table({"text": texts}), into=tmp_path / "out",
                inputs={"base_url": slow_server.base_url, "held": texts[-1],
                        "until": str(heard.until)})
    assert res.rows == 30
    heard.check()
    # what the rows metered moves with them (one file, written at the end: the channel)
    early = [e for e in heard.events if 0 < e.done < 30 and e.usage.get("tokens")]
    assert early and all(e.projected["tokens"] > e.usage["tokens"] for e in early)
    assert heard.events[-1].usage["tokens"] == res.usage["ask_sync"]["tokens"]


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
