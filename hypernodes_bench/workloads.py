"""Built-in benchmark workloads: importable graphs, each with its plain-Python equivalent.

Used by ``hypernodes-dist bench``, ``benchmarks/*.py`` and ``benchmarks/peers.py``. The
nodes live at module level in an installed module, so Dask/Daft worker processes import
them by reference (nothing is pickled by value).

- ``trivial``: ``x -> x+1 -> *2 -> f"{b}-{y}"``: three nodes doing almost nothing; measures
  the per-item overhead of an engine against the plain loop calling the same functions;
- ``cpu``: three nodes of ~1 ms of pure-Python work each (holds the GIL); measures the
  parallel speed-up of process-based engines;
- ``async-io``: two ``async`` nodes each awaiting 1 ms (an API call); measures how well an
  engine overlaps I/O. Its plain equivalent awaits every call one after another.

Every ``Workload`` knows how to build its inputs for ``n`` items, the mapped parameters,
the output to select, and its plain loop (``loop(inputs) -> list`` of that output).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypernodes_dist.errors import CommandError
from hypernodes_dist.graph import Graph
from hypernodes_dist.nodes import HyperNode, node

__all__ = [
    "Workload", "WORKLOADS", "get_workload",
    "inc_fn", "double_fn", "fmt_fn", "crunch1_fn", "crunch2_fn", "crunch3_fn", "fetch_fn",
    "enrich_fn", "inc", "double", "fmt", "TRIVIAL", "trivial_inputs", "trivial_loop",
    "burn", "calibrate", "cpu_work", "crunch1", "crunch2", "crunch3", "CPU", "cpu_inputs",
    "cpu_loop", "fetch", "enrich", "ASYNC_IO", "SLEEP", "async_inputs", "async_loop",
]

# ------------------------------------------------------------------ trivial


# Plain functions first (importable by reference: peers and raw dask/daft use them too),
# then the nodes wrapping them under the same names as the parameters they feed.


def inc_fn(x: int) -> int:
    return x + 1


def double_fn(a: int) -> int:
    return a * 2


def fmt_fn(b: int, y: str) -> str:
    return f"{b}-{y}"


inc = node(inc_fn, output_name="a", name="inc")
double = node(double_fn, output_name="b", name="double")
fmt = node(fmt_fn, output_name="c", name="fmt")


TRIVIAL: tuple[HyperNode, ...] = (inc, double, fmt)


def trivial_inputs(n: int) -> tuple[dict[str, Any], list[str]]:
    return {"x": list(range(n)), "y": "y"}, ["x"]


def trivial_loop(inputs: dict[str, Any]) -> list[str]:
    """The same three functions called in a plain ``for`` loop."""
    f_inc, f_double, f_fmt, y = inc_fn, double_fn, fmt_fn, inputs["y"]
    out = []
    for x in inputs["x"]:
        out.append(f_fmt(f_double(f_inc(x)), y))
    return out


# ------------------------------------------------------------------ cpu


def burn(seed: int, work: int) -> int:
    """Pure-Python work: ``work`` iterations of integer arithmetic (holds the GIL)."""
    acc = seed
    for i in range(work):
        acc = (acc * 31 + i) % 1_000_003
    return acc


def calibrate(target_s: float = 1e-3) -> int:
    """Iterations of ``burn`` taking about ``target_s`` on this machine (fastest of 5 tries:
    the least disturbed by other processes)."""
    work = 10_000
    for _ in range(3):
        took = []
        for _ in range(5):
            t0 = time.perf_counter()
            burn(1, work)
            took.append(time.perf_counter() - t0)
        work = max(1, int(work * target_s / min(took)))
    return work


@cache
def cpu_work() -> int:
    """``calibrate()`` once per process: the ``work`` input of the ``cpu`` workload."""
    return calibrate()


def crunch1_fn(x: int, work: int) -> int:
    return burn(x, work)


def crunch2_fn(p: int, work: int) -> int:
    return burn(p, work)


def crunch3_fn(q: int, work: int) -> int:
    return burn(q, work)


crunch1 = node(crunch1_fn, output_name="p", name="crunch1")
crunch2 = node(crunch2_fn, output_name="q", name="crunch2")
crunch3 = node(crunch3_fn, output_name="r", name="crunch3")


CPU: tuple[HyperNode, ...] = (crunch1, crunch2, crunch3)


def cpu_inputs(n: int, work: int | None = None) -> tuple[dict[str, Any], list[str]]:
    return {"x": list(range(n)), "work": cpu_work() if work is None else work}, ["x"]


def cpu_loop(inputs: dict[str, Any]) -> list[int]:
    w = inputs["work"]
    return [crunch3_fn(crunch2_fn(crunch1_fn(x, w), w), w) for x in inputs["x"]]


# ------------------------------------------------------------------ async I/O

SLEEP = 0.001  # seconds each async call awaits


async def fetch_fn(x: int) -> int:
    await asyncio.sleep(SLEEP)
    return x * 3


async def enrich_fn(page: int) -> str:
    await asyncio.sleep(SLEEP)
    return f"p{page}"


fetch = node(fetch_fn, output_name="page", name="fetch")
enrich = node(enrich_fn, output_name="label", name="enrich")


ASYNC_IO: tuple[HyperNode, ...] = (fetch, enrich)


def async_inputs(n: int) -> tuple[dict[str, Any], list[str]]:
    return {"x": list(range(n))}, ["x"]


def async_loop(inputs: dict[str, Any]) -> list[str]:
    """Every call awaited one after another (what a plain script does)."""
    f_fetch, f_enrich = fetch_fn, enrich_fn

    async def run() -> list[str]:
        return [await f_enrich(await f_fetch(x)) for x in inputs["x"]]

    return asyncio.run(run())


# ------------------------------------------------------------------ registry


@dataclass(frozen=True)
class Workload:
    """A graph to benchmark, its inputs for ``n`` items and its plain-Python equivalent.

    ``loop_sample``: when set, the loop is timed on that many items and its time scaled to
    ``n`` (for loops that take ~1 ms or more per item); ``None`` times it on all ``n``.
    """

    name: str
    nodes: tuple[HyperNode, ...]
    output: str
    inputs: Callable[[int], tuple[dict[str, Any], list[str]]]
    loop: Callable[[dict[str, Any]], list[Any]] | None = None
    loop_sample: int | None = None
    description: str = ""

    def graph(self, engine: Any = None, cache: Any = None, **kwargs: Any) -> Graph:
        return Graph(list(self.nodes), engine=engine, cache=cache, **kwargs)

    def sample(self, inputs: dict[str, Any], map_over: Sequence[str], k: int) -> dict[str, Any]:
        """The first ``k`` items of ``inputs`` (mapped lists cut, broadcast values kept)."""
        return {name: (v[:k] if name in map_over else v) for name, v in inputs.items()}


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload("trivial", TRIVIAL, "c", trivial_inputs, trivial_loop, None,
                 'x -> x+1 -> *2 -> f"{b}-{y}": per-item overhead'),
        Workload("cpu", CPU, "r", cpu_inputs, cpu_loop, 200,
                 "3 nodes x ~1 ms pure-Python work: parallel speed-up"),
        Workload("async-io", ASYNC_IO, "label", async_inputs, async_loop, 200,
                 "2 async nodes x 1 ms sleep: I/O overlap (loop awaits serially)"),
    ]
}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise CommandError(
            f"unknown workload {name!r}; built-in: {', '.join(WORKLOADS)} (or module:attr)"
        ) from None
