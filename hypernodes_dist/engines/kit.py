"""Helpers engine plugins share, so each rule lives once: how many items per partition,
which node or input stops a map from being sent to other processes, and whether every
worker sees the cache and the ``into`` directory."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import cloudpickle

from hypernodes_dist.cache.base import Cache, CacheNotVisibleError
from hypernodes_dist.errors import UnpicklableError
from hypernodes_dist.plan import Plan

__all__ = ["partition_size", "flow_tasks", "FLOW_TASKS_PER_CPU", "FLOW_ITEMS_PER_CPU",
           "unpicklable", "check_picklable", "cache_problem", "check_cache_seen",
           "check_output_seen", "RemoteWorkers", "RunEverywhere"]

FLOW_TASKS_PER_CPU = 4
FLOW_ITEMS_PER_CPU = 1_000
MAX_FLOW_TASKS = 64


def partition_size(n: int, workers: int, tasks_per_worker: int = 4,
                   max_size: int = 10_000, flows: bool = False) -> int:
    """Items per partition (task, UDF call) for ``n`` items on ``workers`` parallel workers:
    about ``tasks_per_worker`` partitions per worker balance uneven items, capped at ``max_size``.

    ``flows`` (a plan whose items flow: ``Plan.flows``, async calls or waiting policies):
    one partition per worker. Such a partition keeps all its items in flight, so one per
    worker already fills the limits; and each partition ends with a tail (its slowest
    item, e.g. one sleeping in a retry back-off) during which its worker, which runs one
    partition at a time, sits idle, so fewer partitions waste less.
    """
    if flows:
        tasks_per_worker = 1
    return max(1, min(max_size, math.ceil(n / (max(1, workers) * max(1, tasks_per_worker)))))


def flow_tasks(cpus: int, size: int | None = None) -> int:
    """Partitions of a plan whose items flow that one process runs at once (threads, or
    coroutines of one loop) on ``cpus`` CPUs, for partitions of ``size`` items.

    Their items mostly wait (calls, back-offs), so a process runs several: while one
    partition ends with its tail (its slowest item, e.g. one sleeping in a retry
    back-off), the others keep the limits busy. At least ``FLOW_TASKS_PER_CPU`` per CPU,
    and with small partitions enough of them to keep ``FLOW_ITEMS_PER_CPU`` items in
    flight per CPU (at most ``MAX_FLOW_TASKS``): the tails then overlap whatever the
    partition size.
    """
    cpus = max(1, cpus)
    wanted = math.ceil(FLOW_ITEMS_PER_CPU * cpus / size) if size else 0
    return min(MAX_FLOW_TASKS, max(FLOW_TASKS_PER_CPU * cpus, wanted))


def unpicklable(plan: Plan, broadcast: Mapping[str, Any], where: str) -> UnpicklableError | None:
    """The ``UnpicklableError`` naming the node or broadcast input of a map that cannot be
    pickled for ``where`` (e.g. "Dask worker processes"); ``None`` when all of them pickle."""
    for node in plan.nodes:
        try:
            cloudpickle.dumps(node)
        except Exception as exc:
            return _node_error(node, where, exc)
    for name, value in broadcast.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            return UnpicklableError(
                f"input {name!r} cannot be sent to {where}: it does not pickle "
                f"({type(exc).__name__}: {exc}); pass something that pickles (a path, a URL, "
                "settings) and open the resource inside the node")
    return None


def _node_error(node: Any, where: str, exc: Exception) -> UnpicklableError:
    """The error for a node that does not pickle: the global or captured value at fault,
    and the way out (a ``@resource``, built in each worker, never shipped)."""
    culprit = unshippable_global(node.code)
    fix = ("make it a @resource instead (a function that builds it, put in the graph's node "
           "list; the node takes it by a parameter of the same name): it is then built once "
           "in each worker process and never shipped")
    if culprit is not None:
        name, value = culprit
        return UnpicklableError(
            f"node {node.name!r} reads {name!r} ({type(value).__name__}), which cannot be sent "
            f"to {where} ({type(exc).__name__}: {exc}); {fix}")
    return UnpicklableError(
        f"node {node.name!r} cannot be sent to {where}: it does not pickle "
        f"({type(exc).__name__}: {exc}); define it at module level, and if it holds a client, "
        f"connection or model, {fix}")


def unshippable_global(func: Any) -> tuple[str, Any] | None:
    """The first global or captured value ``func`` reads that does not pickle, if any."""
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    seen: dict[str, Any] = {}
    globs = getattr(func, "__globals__", {})
    for name in _names(code):
        if name in globs:
            seen[name] = globs[name]
    for name, cell in zip(code.co_freevars, getattr(func, "__closure__", None) or ()):
        try:
            seen[name] = cell.cell_contents
        except ValueError:
            continue
    for name, value in seen.items():
        try:
            cloudpickle.dumps(value)
        except Exception:
            return name, value
    return None


def _names(code: Any) -> list[str]:
    """Global names a code object (and the code nested in it) reads."""
    names = list(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names.extend(_names(const))
    return names


def check_picklable(value: Any, what: str, where: str) -> None:
    """Raise ``UnpicklableError`` when ``value`` (described by ``what``, e.g. "input 'x'
    (item 3)") cannot be pickled for ``where``."""
    try:
        cloudpickle.dumps(value)
    except Exception as exc:
        raise UnpicklableError(
            f"{what} cannot be sent to {where}: it does not pickle ({type(exc).__name__}: {exc})"
        ) from exc


# ------------------------------------------------------------------ what workers see

# ``run_everywhere(fn, arg) -> {worker name: fn(arg, worker)}``: a plugin's way to call
# ``fn`` once on every worker of its cluster (Dask's ``client.run``, a Ray task per node).
RunEverywhere = Callable[[Callable[..., Any], Any], Mapping[str, Any]]


class RemoteWorkers(NamedTuple):
    """Workers that may run on other machines (``Engine.workers_elsewhere``)."""

    run_everywhere: RunEverywhere  # fn(arg, worker) once on each, by worker name
    called: str  # what one is called in messages, e.g. "Dask worker"


def cache_problem(cache: Cache, worker: str | None = None) -> str | None:
    """Runs on one worker: why it cannot see ``cache`` (``None``: it can)."""
    try:
        cache.check_visible(worker)
    except CacheNotVisibleError as exc:
        return str(exc)
    return None


def check_cache_seen(cache: Cache, run_everywhere: RunEverywhere, what: str) -> None:
    """Raise ``CacheNotVisibleError`` naming the workers (``what``, e.g. "Dask worker")
    that cannot see ``cache`` (``Cache.check_visible`` run on each of them)."""
    problems = {w: msg for w, msg in run_everywhere(cache_problem, cache).items() if msg}
    if problems:
        workers = ", ".join(sorted(problems))
        raise CacheNotVisibleError(f"{len(problems)} {what}(s) cannot see the cache "
                                   f"({workers}): {next(iter(problems.values()))}")


def check_output_seen(out: Any, run_everywhere: RunEverywhere, what: str) -> None:
    """Raise ``ValueError`` naming the workers that cannot see the ``into`` directory
    ``out`` (a ``sinks.parquet.ParquetDataset``) before anything runs: they write the
    output files themselves. Object stores are reachable from every worker."""
    if out.remote:
        return
    marker = out.marker()
    try:
        seen = run_everywhere(_sees, (out, marker))
    finally:
        out.drop(marker)
    blind = sorted(w for w, ok in seen.items() if not ok)
    if blind:
        raise ValueError(
            f"into={out.location!r} is not visible from {what}(s) {', '.join(blind)} "
            "(another machine): the workers write the output files themselves. Use a "
            "directory every worker sees (a shared filesystem) or an object-store URI such "
            "as s3://bucket/prefix")


def _sees(target: tuple[Any, str], worker: str | None = None) -> bool:
    out, marker = target
    return bool(out.sees(marker))

