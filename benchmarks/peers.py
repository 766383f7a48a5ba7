"""The built-in workloads on hypernodes-dist and on its peers, side by side in one run.

Systems (each row is one system on one workload and item count; ratios are against
hypernodes-dist's local engine and the plain loop measured in the same run):

- the plain Python loop (``hypernodes_bench.workloads``);
- hypernodes-dist: local engine, Dask (processes), Daft (native);
- hypernodes 0.4.8: ``SeqEngine`` and its ``DaskEngine(scheduler="processes")``;
- pipefunc: ``Pipeline.map`` sequential and parallel (on one kept process pool);
- Hamilton (``sf-hamilton``, now a shim over ``apache-hamilton``): one driver built once
  from a temporary module; ``driver.execute`` once per item (sequential), and its dynamic
  execution (``Parallelizable``/``Collect`` over the items) with its
  ``MultiProcessingExecutor``; plus, as an extra row that is *not* per-item, one
  ``execute`` over pandas columns with the trivial nodes rewritten as column operations;
- hypergraph (Gilad Rubin's successor of hypernodes): recorded with the reason it is not
  installable (PyPI's ``hypergraph`` is an unrelated project; its own distribution name,
  ``hypergraph-ai``, is not found by pip);
- raw ``dask.bag`` (processes scheduler, one kept process pool) and raw Daft (one
  ``daft.func`` column per node).

Peers are benchmark-only dependencies, never package dependencies. ``--setup`` creates
``benchmarks/.peers-venv``: a venv layered on this interpreter's site-packages (so our
package, dask and daft are shared) with ``hypernodes==0.4.8`` (``--no-deps``: it declares
no required dependencies), ``pipefunc`` and ``sf-hamilton`` installed into it; it also tries
``hypergraph-ai`` and keeps pip's error when that fails. Without ``--setup``, the script
re-runs itself in that venv when it exists and the peers are not importable here. A peer
that cannot be installed or run is recorded with its exact error instead of a number.

    .venv/bin/python benchmarks/peers.py --setup
    .venv/bin/python benchmarks/peers.py [--items 1000,100000] [--cpu-items 200]

Writes ``benchmarks/results/peers.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import sysconfig
import time
import traceback
import types
import typing
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hypernodes_bench import workloads as W
from hypernodes_bench.runner import machine, make_engine

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
VENV = HERE / ".peers-venv"
PEERS = ["hypernodes==0.4.8", "pipefunc", "sf-hamilton"]
# Gilad Rubin's hypergraph (github.com/gilad-rubin/hypergraph) names its distribution
# ``hypergraph-ai`` in its pyproject.toml; PyPI's ``hypergraph`` (0.5.0, 2019) is an unrelated
# autodiff library (Thomas Oberbichler's HyperGraph), so it is not installed.
HYPERGRAPH = "hypergraph-ai"
HYPERGRAPH_ERROR = VENV / "hypergraph-install-error.txt"  # pip's error, kept by --setup

# workload -> (plain functions with their output names, mapped parameter, broadcast names)
SPECS: dict[str, tuple[list[tuple[Callable[..., Any], str]], str, tuple[str, ...]]] = {
    "trivial": ([(W.inc_fn, "a"), (W.double_fn, "b"), (W.fmt_fn, "c")], "x", ("y",)),
    "cpu": ([(W.crunch1_fn, "p"), (W.crunch2_fn, "q"), (W.crunch3_fn, "r")], "x", ("work",)),
}

Runner = Callable[[dict[str, Any]], list[Any]]


# ------------------------------------------------------------------ set-up


def venv_python() -> Path:
    return VENV / "bin" / "python"


def setup() -> int:
    """Create the peers venv (layered on this interpreter's site-packages) and install peers."""
    if not venv_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        (VENV / ".gitignore").write_text("*\n")
    site = subprocess.run([str(venv_python()), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    base = sysconfig.get_paths()["purelib"]  # addsitedir: its .pth files (editables) count too
    (Path(site) / "_hypernodes_dist_base.pth").write_text(
        f"import site; site.addsitedir({base!r})\n")
    pip = [str(venv_python()), "-m", "pip", "install", "-q"]
    rc = subprocess.run([*pip, "--no-deps", PEERS[0]]).returncode
    rc |= subprocess.run([*pip, *PEERS[1:]]).returncode
    hg = subprocess.run([*pip, HYPERGRAPH], capture_output=True, text=True)
    if hg.returncode == 0:
        HYPERGRAPH_ERROR.unlink(missing_ok=True)
    else:
        err = " ".join(ln.strip() for ln in hg.stderr.splitlines()
                       if ln.startswith("ERROR")) or hg.stderr.strip()
        HYPERGRAPH_ERROR.write_text(f"pip install {HYPERGRAPH}: {err}\n")
        print(f"{HYPERGRAPH}: not installed ({err})")
    print(f"peers venv: {VENV} ({'ok' if rc == 0 else 'some installs failed'})")
    return rc


def _peers_importable() -> bool:
    try:
        import hamilton  # noqa: F401
        import hypernodes  # noqa: F401
        import pipefunc  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------ systems


def _ours(label: str) -> Callable[[str], Runner]:
    def prepare(workload: str) -> Runner:
        w = W.get_workload(workload)
        engine = _engines.setdefault(label, make_engine(label))
        g = w.graph(engine)

        def run(inputs: dict[str, Any]) -> list[Any]:
            return [r[w.output] for r in g.map(inputs, "x", select=[w.output])]

        return run

    return prepare


_engines: dict[str, Any] = {}


def _hypernodes(engine: str) -> Callable[[str], Runner]:
    def prepare(workload: str) -> Runner:
        from hypernodes import Pipeline, node
        from hypernodes.engines import SeqEngine

        fns, mapped, _ = SPECS[workload]
        if engine == "dask-processes":
            from hypernodes.engines import DaskEngine

            eng: Any = DaskEngine(scheduler="processes")
        else:
            eng = SeqEngine()
        pipe = Pipeline(nodes=[node(output_name=out)(fn) for fn, out in fns], engine=eng)
        last = fns[-1][1]

        def run(inputs: dict[str, Any]) -> list[Any]:
            return [r[last] for r in pipe.map(inputs=inputs, map_over=mapped, output_name=last)]

        return run

    return prepare


_POOL: Any = None


def _pool() -> Any:
    """One process pool kept across calls (raw dask.bag and pipefunc would otherwise start a
    new pool per call; the engines compared keep theirs)."""
    global _POOL
    if _POOL is None:
        from concurrent.futures import ProcessPoolExecutor

        _POOL = ProcessPoolExecutor(os.cpu_count() or 1)
    return _POOL


def _pipefunc(parallel: bool) -> Callable[[str], Runner]:
    def prepare(workload: str) -> Runner:
        from pipefunc import Pipeline, pipefunc

        fns, _, broadcast = SPECS[workload]
        funcs = []
        for fn, out in fns:
            ins = [p for p in inspect.signature(fn).parameters if p not in broadcast]
            spec = ", ".join(f"{p}[i]" for p in ins) + f" -> {out}[i]"
            funcs.append(pipefunc(output_name=out, mapspec=spec)(fn))
        pipe = Pipeline(funcs)
        last = fns[-1][1]

        def run(inputs: dict[str, Any]) -> list[Any]:
            kw = {"executor": _pool()} if parallel else {}
            res = pipe.map(inputs, parallel=parallel, storage="dict", show_progress=False, **kw)
            return list(res[last].output)

        return run

    return prepare


def _renamed(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` under the name of its output (Hamilton names a node after its function).
    The code object is renamed too, so the copy pickles by reference to Hamilton's temporary
    module (the fork-started processes of its MultiProcessingExecutor find it there)."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    out = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    out.__annotations__ = dict(fn.__annotations__)
    return out


def _hamilton(mode: str) -> Callable[[str], Runner]:
    def prepare(workload: str) -> Runner:
        from hamilton import ad_hoc_utils

        fns, mapped, broadcast = SPECS[workload]
        nodes = [_renamed(fn, out) for fn, out in fns]
        if mode == "sequential":
            return _hamilton_sequential(ad_hoc_utils.create_temporary_module(*nodes),
                                        mapped, broadcast, fns[-1][1])
        if mode == "parallel":
            return _hamilton_parallel(fns, nodes, mapped, broadcast)
        if workload != "trivial":  # pandas-vectorized: NOT per-item
            raise NotImplementedError(
                f"no column form of the {workload!r} nodes (per-item pure-Python work)")
        return _hamilton_columns()

    return prepare


def _hamilton_sequential(module: Any, mapped: str, broadcast: Any, last: str) -> Runner:
    """One ``execute`` per item."""
    from hamilton import driver

    dr = driver.Builder().with_modules(module).build()

    def run(inputs: dict[str, Any]) -> list[Any]:
        kept = {b: inputs[b] for b in broadcast}
        return [dr.execute([last], inputs={mapped: v, **kept})[last] for v in inputs[mapped]]

    return run


def _hamilton_parallel(fns: Any, nodes: list[Any], mapped: str, broadcast: Any) -> Runner:
    """Dynamic execution on Hamilton's MultiProcessingExecutor: a fan-out node named like the
    mapped parameter, a fan-in node over the last output (typed like them: Hamilton checks
    that edge types match)."""
    from hamilton import ad_hoc_utils, driver
    from hamilton.execution.executors import MultiProcessingExecutor
    from hamilton.htypes import Collect, Parallelizable

    last = fns[-1][1]
    src = (f"def {mapped}({mapped}_all: list) -> Parallelizable[T_in]:\n"
           f"    yield from {mapped}_all\n"
           f"def {last}_all({last}: Collect[T_out]) -> list:\n"
           f"    return list({last})\n")
    ns: dict[str, Any] = {
        "Parallelizable": Parallelizable, "Collect": Collect,
        "T_in": typing.get_type_hints(fns[0][0])[mapped],
        "T_out": typing.get_type_hints(fns[-1][0])["return"]}
    exec(src, ns)
    mod = ad_hoc_utils.create_temporary_module(ns[mapped], ns[f"{last}_all"], *nodes)
    executor = MultiProcessingExecutor(max_tasks=os.cpu_count() or 1)
    dr = (driver.Builder().with_modules(mod)
          .enable_dynamic_execution(allow_experimental_mode=True)
          .with_remote_executor(executor).build())

    def run(inputs: dict[str, Any]) -> list[Any]:
        kept = {b: inputs[b] for b in broadcast}
        res = dr.execute([f"{last}_all"], inputs={f"{mapped}_all": inputs[mapped], **kept})
        return res[f"{last}_all"]

    return run


def _hamilton_columns() -> Runner:
    """The trivial nodes rewritten as pandas column operations (not per item)."""
    import pandas as pd
    from hamilton import ad_hoc_utils, driver

    def a(x: pd.Series) -> pd.Series:
        return x + 1

    def b(a: pd.Series) -> pd.Series:
        return a * 2

    def c(b: pd.Series, y: str) -> pd.Series:
        return b.astype(str) + "-" + y

    for f in (a, b, c):  # this module's string annotations, resolved for Hamilton
        f.__annotations__ = typing.get_type_hints(f, localns={"pd": pd})
    dr = driver.Builder().with_modules(ad_hoc_utils.create_temporary_module(a, b, c)).build()

    def run(inputs: dict[str, Any]) -> list[Any]:
        return dr.execute(["c"], inputs={"x": pd.Series(inputs["x"]),
                                         "y": inputs["y"]})["c"].tolist()

    return run


def _hypergraph(workload: str) -> Runner:
    """Not installable (see HYPERGRAPH): raises the recorded reason, which becomes the row."""
    try:
        import hypergraph  # noqa: F401
    except ImportError as exc:
        reason = (HYPERGRAPH_ERROR.read_text().strip() if HYPERGRAPH_ERROR.exists()
                  else f"{type(exc).__name__}: {exc}")
        raise RuntimeError(
            f"{reason} (PyPI's `hypergraph` 0.5.0 is an unrelated autodiff library)") from None
    raise NotImplementedError(
        "hypergraph is importable but no runner was written: it did not install when this "
        "peer was added")


def _dask_bag(workload: str) -> Runner:
    import dask.bag as db

    fns, mapped, broadcast = SPECS[workload]
    parts = 4 * (os.cpu_count() or 1)

    def run(inputs: dict[str, Any]) -> list[Any]:
        bag = db.from_sequence(inputs[mapped], npartitions=parts)
        for fn, _ in fns:
            kw = {p: inputs[p] for p in inspect.signature(fn).parameters if p in broadcast}
            bag = bag.map(fn, **kw)
        return bag.compute(scheduler="processes", pool=_pool())

    return run


def _daft_raw(workload: str) -> Runner:
    import daft
    from daft import DataType, col

    fns, mapped, broadcast = SPECS[workload]

    def run(inputs: dict[str, Any]) -> list[Any]:
        df = daft.from_pydict({"v0": inputs[mapped]})
        for i, (fn, _) in enumerate(fns):
            kw = {p: inputs[p] for p in inspect.signature(fn).parameters if p in broadcast}

            def one(v: Any, _fn: Callable[..., Any] = fn, _kw: dict = kw) -> Any:
                return _fn(v, **_kw)

            udf = daft.func(one, return_dtype=DataType.python())
            df = df.with_column(f"v{i + 1}", udf(col(f"v{i}")))
        last = f"v{len(fns)}"
        return df.select(last).to_pydict()[last]

    return run


SYSTEMS: dict[str, Callable[[str], Runner]] = {
    "plain loop": lambda w: W.get_workload(w).loop,  # type: ignore[return-value,arg-type]
    "hypernodes-dist local": _ours("local"),
    "hypernodes-dist dask-processes": _ours("dask-processes"),
    "hypernodes-dist daft-native": _ours("daft-native"),
    "hypernodes 0.4.8 seq": _hypernodes("seq"),
    "hypernodes 0.4.8 dask-processes": _hypernodes("dask-processes"),
    "pipefunc sequential": _pipefunc(False),
    "pipefunc parallel": _pipefunc(True),
    "hamilton execute-per-item": _hamilton("sequential"),
    "hamilton Parallelizable multiprocessing": _hamilton("parallel"),
    "hamilton pandas-vectorized (not per-item)": _hamilton("vectorized"),
    "hypergraph": _hypergraph,
    "dask.bag processes (raw)": _dask_bag,
    "daft native UDF-per-node (raw)": _daft_raw,
}


# ------------------------------------------------------------------ measuring


def _inputs(workload: str, n: int) -> dict[str, Any]:
    return W.get_workload(workload).inputs(n)[0]


def measure(systems: list[str], plan: list[tuple[str, int]], repeat: int, budget: float,
            max_seconds: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    expected: dict[tuple[str, int], list[Any]] = {}
    for system in systems:
        runners: dict[str, Runner | str] = {}
        per_item: dict[str, float] = {}
        for workload, n in plan:
            row: dict[str, Any] = {"system": system, "workload": workload, "items": n,
                                   "seconds": None, "error": None}
            rows.append(row)
            if workload not in runners:
                try:
                    runners[workload] = SYSTEMS[system](workload)
                    runners[workload](_inputs(workload, 3))  # type: ignore[operator] # warm-up
                except Exception as exc:  # noqa: BLE001 - recorded instead of a number
                    runners[workload] = f"{type(exc).__name__}: {exc}"
            run = runners[workload]
            if isinstance(run, str):
                row["error"] = run
                continue
            guess = per_item.get(workload, 0.0) * n
            if guess > max_seconds:
                row["error"] = f"skipped: predicted {guess:.0f} s > {max_seconds:g} s"
                continue
            inputs = _inputs(workload, n)
            print(f"[{system}] {workload} n={n} ...", file=sys.stderr, flush=True)
            try:
                best, spent = float("inf"), 0.0
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    out = run(inputs)
                    took = time.perf_counter() - t0
                    best, spent = min(best, took), spent + took
                    if spent > budget:
                        break
                want = expected.setdefault((workload, n), out)
                if list(out) != list(want):
                    raise AssertionError("outputs differ from the plain loop's")
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
                continue
            per_item[workload] = best / n
            row["seconds"] = round(best, 4)
            row["items_per_s"] = round(n / best)
            row["us_per_item"] = round(best / n * 1e6, 2)
    base = {(r["workload"], r["items"]): r["seconds"] for r in rows
            if r["system"] == "hypernodes-dist local" and r["seconds"]}
    loop = {(r["workload"], r["items"]): r["seconds"] for r in rows
            if r["system"] == "plain loop" and r["seconds"]}
    for r in rows:
        key = (r["workload"], r["items"])
        if r["seconds"]:
            r["x_loop"] = round(r["seconds"] / loop[key], 2) if key in loop else None
            r["x_ours_local"] = round(r["seconds"] / base[key], 2) if key in base else None
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | items | system | seconds | items/s | µs/item | x loop | x ours (local) |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["workload"], r["items"])):
        if r["seconds"] is None:
            error = " ".join(str(r["error"]).split()).replace("|", "\\|")
            lines.append(f"| {r['workload']} | {r['items']:,} | {r['system']} | "
                         f"{error} | | | | |")
            continue
        lines.append(
            f"| {r['workload']} | {r['items']:,} | {r['system']} | {r['seconds']} | "
            f"{r['items_per_s']:,} | {r['us_per_item']} | {r.get('x_loop') or '-'} | "
            f"{r.get('x_ours_local') or '-'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="store_true", help="create the peers venv and exit")
    parser.add_argument("--items", default="1000,100000", help="trivial workload item counts")
    parser.add_argument("--cpu-items", type=int, default=200, help="cpu workload items (0: skip)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="comma-separated, from: " + ", ".join(SYSTEMS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=15.0)
    parser.add_argument("--max-seconds", type=float, default=90.0)
    args = parser.parse_args()
    if args.setup:
        return setup()
    if not _peers_importable() and venv_python().exists() and \
            Path(sys.prefix).resolve() != VENV.resolve():
        os.execv(str(venv_python()), [str(venv_python()), *sys.argv])
    plan = [("trivial", int(n)) for n in args.items.split(",")]
    if args.cpu_items:
        plan.append(("cpu", args.cpu_items))
    systems = [s.strip() for s in args.systems.split(",")]
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_before = machine()
    try:
        rows = measure(systems, plan, args.repeat, args.budget, args.max_seconds)
    finally:
        for engine in _engines.values():
            engine.close()
        if _POOL is not None:
            _POOL.shutdown()
    report = {"benchmark": "peers", "started": started, "machine": load_before,
              "load_avg_after": machine()["load_avg"], "cpu_work": W.cpu_work(),
              "versions": _versions(), "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "peers.json").write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(rows))
    print(f"\nload average before/after: {load_before['load_avg']} / "
          f"{report['load_avg_after']} ({os.cpu_count()} cpus)")
    print(f"wrote {RESULTS / 'peers.json'}")
    return 0


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for dist in ("hypernodes-dist", "hypernodes", "pipefunc", "sf-hamilton", "apache-hamilton",
                 HYPERGRAPH, "pandas", "dask", "daft"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = "not installed"
    return found


if __name__ == "__main__":
    sys.exit(main())
