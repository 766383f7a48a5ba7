"""The benchmark runner behind ``hypernodes-dist bench``.

Runs workloads (the built-in ``trivial``, ``cpu``, ``async-io`` of
``hypernodes_dist.workloads``, or a user graph given as ``module:attr``) over engines and
item counts, and reports throughput next to the plain Python loop measured right before
each row (under the same machine load). Writes ``<out>/<name>.json``, ``.csv`` and, when
matplotlib is installed, ``.png`` (throughput vs items, one line per engine).

    hypernodes-dist bench --engines local,dask,daft --items 1000,100000
    hypernodes-dist bench --workloads cpu,async-io --items 200,2000 --cache
    hypernodes-dist bench --workloads mymod:graph --inputs mymod:make_inputs --items 1000

A user graph is a ``Graph``, a list of nodes or a ``Workload``; ``--inputs module:function``
is called with the item count and returns ``(inputs, map_over)``; ``--loop module:function``
(optional) takes those inputs and returns the list of ``--select`` outputs of a plain loop.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hypernodes_bench.workloads import WORKLOADS, Workload, get_workload
from hypernodes_dist.engines import get_engine
from hypernodes_dist.engines.local import GraphEngine
from hypernodes_dist.errors import CommandError

__all__ = ["ENGINES", "ALIASES", "BenchConfig", "run_bench", "print_table", "write_results",
           "plot", "add_bench_command", "resolve_workload", "make_engine"]

# ------------------------------------------------------------------ engines


def _local() -> Any:
    return GraphEngine(batch_size=1000)


def _plugin(name: str, **kwargs: Any) -> Callable[[], Any]:
    """An engine plugin found through the ``hypernodes_dist.engines`` entry points."""

    def make() -> Any:
        return get_engine(name)(**kwargs)

    return make


def _dask(**kwargs: Any) -> Callable[[], Any]:
    return _plugin("dask", **kwargs)


def _daft(**kwargs: Any) -> Callable[[], Any]:
    return _plugin("daft", **kwargs)


ENGINES: dict[str, Callable[[], Any]] = {
    "local": _local,
    "dask-threads": _dask(scheduler="threads"),
    "dask-processes": _dask(scheduler="processes"),
    "dask-distributed": _dask(scheduler="distributed",
                              cluster_kwargs={"threads_per_worker": 1, "dashboard_address": None}),
    "daft-native": _daft(runner="native"),
    "daft-ray": _daft(runner="ray"),
}
ALIASES = {"dask": "dask-processes", "daft": "daft-native"}


def make_engine(label: str) -> Any:
    """A ready engine for a label of ``ENGINES`` (or an alias); ImportError if not installed."""
    return ENGINES[ALIASES.get(label, label)]()


def _engine_labels(spec: str) -> list[str]:
    labels = []
    for raw in spec.split(","):
        label = ALIASES.get(raw.strip(), raw.strip())
        if label not in ENGINES:
            raise CommandError(f"unknown engine {raw!r}; choose from "
                               f"{', '.join([*ENGINES, *ALIASES])}")
        labels.append(label)
    return labels


# ------------------------------------------------------------------ workloads


def _import(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise CommandError(f"expected module:attr, got {spec!r}")
    if os.getcwd() not in sys.path:  # user modules next to where the command runs
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise CommandError(f"cannot import {module!r} (from {spec!r}): {exc}; run the command "
                           "where the module is importable (current directory or PYTHONPATH)"
                           ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CommandError(f"{spec!r}: module {module!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def resolve_workload(spec: str, inputs: str | None = None, loop: str | None = None,
                     select: str | None = None) -> Workload:
    """A built-in workload by name, or a user graph ``module:attr`` with its inputs."""
    if ":" not in spec:
        return get_workload(spec)
    from hypernodes_dist.graph import Graph

    obj = _import(spec)
    if isinstance(obj, Workload):
        return obj
    if not isinstance(obj, (Graph, list, tuple)):
        raise CommandError(f"{spec!r} is a {type(obj).__name__}, not a Graph, a Workload or "
                           "a list of nodes")
    nodes = tuple(obj.nodes) if isinstance(obj, Graph) else tuple(obj)
    if inputs is None:
        raise CommandError(f"{spec} needs --inputs module:function "
                           "(called with the item count, returns (inputs, map_over))")
    make_inputs = _import(inputs)
    output = select or Graph(list(nodes)).outputs[-1]

    def inputs_of(n: int) -> tuple[dict[str, Any], list[str]]:
        found, map_over = make_inputs(n)
        return dict(found), [map_over] if isinstance(map_over, str) else list(map_over)

    return Workload(spec, nodes, output, inputs_of, _import(loop) if loop else None, None,
                    "user graph")


# ------------------------------------------------------------------ measuring


@dataclass
class BenchConfig:
    workloads: list[Workload]
    engines: list[str]
    items: list[int]
    repeat: int = 3
    budget_s: float = 20.0  # stop repeating a measurement once this much time went into it
    max_seconds: float = 120.0  # skip a size whose predicted time exceeds this
    cache: bool = False
    log: Callable[[str], None] = field(default=lambda msg: print(msg, file=sys.stderr))


def _best(fn: Callable[[], Any], repeat: int, budget_s: float) -> tuple[float, Any]:
    best, spent, out = float("inf"), 0.0, None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = fn()
        took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent >= budget_s:
            break
    return best, out


def _hits(result: Any) -> int:
    return sum(1 for r in result for h in r.history if h.cached)


def _loop_time(w: Workload, inputs: dict[str, Any], map_over: list[str], n: int,
               cfg: BenchConfig) -> tuple[float | None, list[Any] | None, int]:
    """Seconds of the plain loop for ``n`` items (scaled from a sample for slow loops), its
    outputs (on the items timed) and how many items were timed."""
    if w.loop is None:
        return None, None, 0
    k = n if w.loop_sample is None else min(n, w.loop_sample)
    sample = inputs if k == n else w.sample(inputs, map_over, k)
    t, out = _best(lambda: w.loop(sample), cfg.repeat, cfg.budget_s / 2)  # type: ignore[misc]  # w.loop is not None (checked above; lost in the lambda)
    return t * n / k, out, k


def _check(result: Any, output: str, expected: list[Any] | None) -> None:
    if result.errors:
        raise RuntimeError(f"{len(result.errors)} items failed, first: {result.errors[0].error!r}")
    if expected is not None:
        got = [r[output] for r in result[: len(expected)]]
        if got != expected:
            bad = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
            raise AssertionError(f"item {bad}: got {got[bad]!r}, the loop gives {expected[bad]!r}")


def _row(w: Workload, engine: str, n: int, cache: str, t: float | None, loop: float | None,
         hits: int, startup: float | None, error: str | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": w.name, "engine": engine, "items": n, "cache": cache}
    if t is None:
        row.update(seconds=None, items_per_s=None, us_per_item=None, loop_us_per_item=None,
                   x_loop=None, hits=None)
    else:
        row.update(
            seconds=round(t, 4), items_per_s=round(n / t), us_per_item=round(t / n * 1e6, 2),
            loop_us_per_item=None if loop is None else round(loop / n * 1e6, 2),
            x_loop=None if loop is None else round(t / loop, 3), hits=hits,
        )
    row["startup_s"] = None if startup is None else round(startup, 2)
    row["error"] = error
    return row


def _measure(w: Workload, label: str, engine: Any, n: int, startup: float,
             cfg: BenchConfig) -> list[dict[str, Any]]:
    inputs, map_over = w.inputs(n)
    loop, expected, _ = _loop_time(w, inputs, map_over, n, cfg)
    select = [w.output]
    if not cfg.cache:
        g = w.graph(engine)
        t, res = _best(lambda: g.map(inputs, map_over, select=select), cfg.repeat, cfg.budget_s)
        _check(res, w.output, expected)
        return [_row(w, label, n, "off", t, loop, 0, startup)]
    tmp = Path(tempfile.mkdtemp(prefix="hn-bench-"))
    try:
        from hypernodes_dist.cache.disk import DiskCache

        cache = DiskCache(tmp / "cache")
        g = w.graph(engine, cache=cache)
        t0 = time.perf_counter()
        res = g.map(inputs, map_over, select=select)
        cold = time.perf_counter() - t0
        _check(res, w.output, expected)
        cold_hits = _hits(res)
        warm, res = _best(lambda: g.map(inputs, map_over, select=select), cfg.repeat,
                          cfg.budget_s)
        _check(res, w.output, expected)
        rows = [_row(w, label, n, "cold", cold, loop, cold_hits, startup),
                _row(w, label, n, "warm", warm, loop, _hits(res), startup)]
        cache.close()
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _startup(w: Workload, engine: Any) -> float:
    """Time of a first 3-item map on a fresh engine (clusters and pools start lazily)."""
    inputs, map_over = w.inputs(3)
    t0 = time.perf_counter()
    w.graph(engine).map(inputs, map_over, select=[w.output])
    return time.perf_counter() - t0


def run_bench(cfg: BenchConfig) -> list[dict[str, Any]]:
    """Every (workload, engine, items) row; a failing engine gives rows with ``error``."""
    rows: list[dict[str, Any]] = []
    for label in cfg.engines:
        try:
            engine = make_engine(label)
        except ImportError as exc:
            msg = f"plugin not installed: {exc}"
            cfg.log(f"[{label}] {msg}")
            rows.extend(_row(w, label, n, "off", None, None, 0, None, msg)
                        for w in cfg.workloads for n in cfg.items)
            continue
        try:
            startup: float | None = None
            for w in cfg.workloads:
                per_item: float | None = None
                for n in sorted(cfg.items):
                    if per_item is not None and per_item * n > cfg.max_seconds:
                        msg = (f"skipped: predicted {per_item * n:.0f} s > --max-seconds "
                               f"{cfg.max_seconds:g}")
                        cfg.log(f"[{label}] {w.name} n={n}: {msg}")
                        rows.append(_row(w, label, n, "off", None, None, 0, startup, msg))
                        continue
                    try:
                        if startup is None:
                            startup = _startup(w, engine)
                        cfg.log(f"[{label}] {w.name} n={n} ...")
                        new = _measure(w, label, engine, n, startup, cfg)
                        per_item = max(r["seconds"] for r in new) / n
                    except Exception as exc:  # noqa: BLE001 - recorded in the results
                        msg = f"{type(exc).__name__}: {exc}"
                        cfg.log(f"[{label}] {w.name} n={n} failed: {msg}")
                        new = [_row(w, label, n, "off", None, None, 0, startup, msg)]
                    rows.extend(new)
        finally:
            engine.close()
    return rows


# ------------------------------------------------------------------ reporting

COLUMNS = [("workload", "workload"), ("engine", "engine"), ("items", "items"),
           ("cache", "cache"), ("seconds", "seconds"), ("items_per_s", "items/s"),
           ("us_per_item", "µs/item"), ("loop_us_per_item", "loop µs/item"),
           ("x_loop", "x loop"), ("hits", "hits"), ("startup_s", "startup s")]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    """The rows as an aligned text table (or a Markdown table); errors listed after it."""
    heads = [h for _, h in COLUMNS]
    body = [[_fmt(r.get(k)) for k, _ in COLUMNS] for r in rows]
    lines = []
    if markdown:
        lines.append("| " + " | ".join(heads) + " |")
        lines.append("|" + "|".join("---" if i < 4 else "---:" for i in range(len(heads))) + "|")
        lines.extend("| " + " | ".join(cells) + " |" for cells in body)
    else:
        widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h)
                  for i, h in enumerate(heads)]
        lines.append("  ".join(h.rjust(w) for h, w in zip(heads, widths)))
        lines.append("  ".join("-" * w for w in widths))
        lines.extend("  ".join(c.rjust(w) for c, w in zip(cells, widths)) for cells in body)
    errors = [r for r in rows if r.get("error")]
    if errors:
        lines.append("")
        lines.extend(f"{r['workload']} / {r['engine']} / {r['items']}: {r['error']}"
                     for r in errors)
    return "\n".join(lines)


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    print(format_table(rows))


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "load_avg": _load()}


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def write_results(rows: Sequence[dict[str, Any]], out: Path, name: str,
                  meta: dict[str, Any]) -> list[Path]:
    """``<out>/<name>.json`` (rows + machine + load) and ``<out>/<name>.csv``."""
    out.mkdir(parents=True, exist_ok=True)
    js, cs = out / f"{name}.json", out / f"{name}.csv"
    js.write_text(json.dumps({**meta, "rows": list(rows)}, indent=2) + "\n")
    with cs.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["workload"])
        writer.writeheader()
        writer.writerows(rows)
    return [js, cs]


def plot(rows: Sequence[dict[str, Any]], path: Path) -> str | None:
    """Throughput vs items, one panel per workload, one line per engine (+ the plain loop).
    Returns None on success, or why no plot was written (matplotlib missing, no data)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot written"
    ok = [r for r in rows if r.get("seconds")]
    workloads = list(dict.fromkeys(r["workload"] for r in ok))
    if not workloads:
        return "no successful rows: no plot written"
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.2),
                             squeeze=False)
    for ax, w in zip(axes[0], workloads):
        mine = [r for r in ok if r["workload"] == w]
        for key in dict.fromkeys((r["engine"], r["cache"]) for r in mine):
            pts = sorted((r["items"], r["items_per_s"]) for r in mine
                         if (r["engine"], r["cache"]) == key)
            label = key[0] if key[1] == "off" else f"{key[0]} ({key[1]} cache)"
            ax.plot(*zip(*pts), marker="o", label=label)
        loop: dict[int, float] = {}
        for r in mine:
            if r.get("loop_us_per_item"):
                loop.setdefault(r["items"], 1e6 / r["loop_us_per_item"])
        if loop:
            ax.plot(*zip(*sorted(loop.items())), "k--", marker="x", label="plain loop")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("items")
        ax.set_ylabel("items / s")
        ax.set_title(w)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# ------------------------------------------------------------------ command line


def _ints(spec: str) -> list[int]:
    try:
        values = [int(s.replace("_", "")) for s in spec.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {spec!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"item counts must be >= 1, got {spec!r}")
    return values


def add_bench_command(subparsers: argparse._SubParsersAction) -> None:
    """Registers ``bench`` on the ``hypernodes-dist`` parser (see ``cli._COMMANDS``)."""
    p = subparsers.add_parser(
        "bench", help="benchmark workloads over engines and item counts",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="engines: " + ", ".join(ENGINES) + "; aliases: "
               + ", ".join(f"{a}={b}" for a, b in ALIASES.items())
               + "\nworkloads: " + "; ".join(f"{w.name}: {w.description}"
                                             for w in WORKLOADS.values()),
    )
    p.add_argument("--workloads", "-w", default="trivial",
                   help="comma-separated built-in names or module:attr (default: trivial)")
    p.add_argument("--engines", "-e", default="local,dask,daft",
                   help="comma-separated engines (default: local,dask,daft)")
    p.add_argument("--items", "-n", type=_ints, default=[1_000, 100_000],
                   help="comma-separated item counts (default: 1000,100000)")
    p.add_argument("--inputs", help="module:function(n) -> (inputs, map_over), for a user graph")
    p.add_argument("--loop", help="module:function(inputs) -> list, the plain loop of a user graph")
    p.add_argument("--select", help="output of a user graph to return (default: its last)")
    p.add_argument("--cache", action="store_true",
                   help="also measure a cold and a warm map on a fresh DiskCache")
    p.add_argument("--repeat", type=int, default=3, help="best of this many runs (default 3)")
    p.add_argument("--budget", type=float, default=20.0,
                   help="seconds after which a measurement stops repeating (default 20)")
    p.add_argument("--max-seconds", type=float, default=120.0,
                   help="skip sizes predicted to take longer than this (default 120)")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"),
                   help="directory for the JSON/CSV/PNG results (default benchmarks/results)")
    p.add_argument("--name", default="bench", help="file name stem of the results (default bench)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG plot")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.set_defaults(func=bench_main)


def bench_main(args: argparse.Namespace) -> int:
    engines = _engine_labels(args.engines)
    workloads = [resolve_workload(s.strip(), args.inputs, args.loop, args.select)
                 for s in args.workloads.split(",") if s.strip()]
    if any(":" in s for s in args.workloads.split(",")):  # worker processes import user modules
        paths = [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    cfg = BenchConfig(workloads, engines, args.items, repeat=args.repeat, budget_s=args.budget,
                      max_seconds=args.max_seconds, cache=args.cache)
    meta: dict[str, Any] = {
        "benchmark": "hypernodes-dist bench",
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:], "machine": machine(),
    }
    rows = run_bench(cfg)
    meta["load_avg_after"] = _load()
    print(format_table(rows, markdown=args.markdown))
    out = Path(args.out)
    written = write_results(rows, out, args.name, meta)
    if not args.no_plot:
        png = out / f"{args.name}.png"
        why = plot(rows, png)
        if why:
            print(f"note: {why}")
        else:
            written.append(png)
    load = meta["machine"]["load_avg"]
    print(f"\nload average before/after: {load} / {meta['load_avg_after']} "
          f"({os.cpu_count()} cpus)")
    print("wrote " + ", ".join(str(p) for p in written))
    return 1 if rows and all(r.get("error") for r in rows) else 0
