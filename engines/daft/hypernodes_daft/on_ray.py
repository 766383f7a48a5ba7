"""Daft's Ray runner: dataset parts as Ray tasks, and a call on every Ray node.

A dataset map on the Ray runner runs each part as one Ray task: the task reads its rows
from the source and runs them through the core's part pipeline (``PartTask.run``, as a
Dask task does: steps, a file of finished rows every ``commit_seconds`` or at the part's
end), so rows never pass through the driver; the driver keeps a few parts in flight
and receives their reports. ``run_everywhere`` calls a check on every live node (a task
pinned to it), so a cache or ``into`` directory another machine cannot see is named
before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hypernodes_dist.datasets import DatasetJob, Part, PartReport, PartTask
from hypernodes_dist.errors import call_portably

from .teardown import watch

__all__ = ["run_dataset_ray", "run_everywhere"]


def run_everywhere(fn: Callable[..., Any], arg: Any) -> dict[str, Any]:
    """``fn(arg, node id)`` once on every live Ray node, by node address and id."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    call = ray.remote(num_cpus=0)(_call)
    refs = [call.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(fn, arg) for n in nodes]
    return {f"{n['NodeManagerAddress']} (node {n['NodeID'][:12]})": result
            for n, result in zip(nodes, ray.get(refs))}


def _call(fn: Callable[..., Any], arg: Any) -> Any:
    return fn(arg, ray.get_runtime_context().get_node_id())


def run_dataset_ray(job: DatasetJob, report: Callable[[PartReport], None],
                    in_flight: int) -> None:
    """Every pending part as a Ray task, at most ``in_flight`` at once; reports in the
    driver as parts finish. A part's error is raised as its original exception."""
    run = ray.remote(_run_part)
    task = ray.put(job.task)
    parts: Iterator[Part] = job.pending()
    pending: list[Any] = []
    try:
        for part in parts:
            pending.append(run.remote(task, part))
            if len(pending) >= in_flight:
                pending = _report_one(pending, report)
        while pending:
            pending = _report_one(pending, report)
    finally:
        for ref in pending:  # an error: stop the parts still running
            ray.cancel(ref, force=True)


def _report_one(pending: list[Any], report: Callable[[PartReport], None]) -> list[Any]:
    [done], rest = ray.wait(pending, num_returns=1)
    try:
        result = ray.get(done)
    except ray.exceptions.RayTaskError as exc:
        if exc.cause is None:
            raise
        raise exc.cause from None
    report(result)
    return rest


def _run_part(task: PartTask, part: Part) -> PartReport:
    watch()  # this Ray worker tears its resources down when the engine closes
    return call_portably(task.run, part)  # the error crosses a process boundary
