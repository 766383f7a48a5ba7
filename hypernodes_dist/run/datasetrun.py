"""``map(source=..., into=...)``: bind columns, fix the output schema, check the manifest,
hand the parts to the engine, and count what comes back.

The driver never holds the rows: it reads file footers (or slices what is already in its
memory), sends parts to the engine, and receives ``PartReport``s (counts and, with
callbacks, events). The rows computed here to fix the output types are written here as
the first rows of part 0 (the workers start after them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hypernodes_dist.cache.base import Cache
from hypernodes_dist.datasets.commit import COMMIT_SECONDS, check_commit_seconds, kept_runs
from hypernodes_dist.datasets.job import DatasetJob, PartReport, PartTask, collecting
from hypernodes_dist.datasets.manifest import check_manifest, encode, new_manifest
from hypernodes_dist.datasets.result import DatasetResult
from hypernodes_dist.datasets.schema import Head, output_schema
from hypernodes_dist.datasets.source import ListSource, Source, open_source
from hypernodes_dist.datasets.stop import MapStop, stopping
from hypernodes_dist.errors import GraphInputError
from hypernodes_dist.events import Dispatcher
from hypernodes_dist.execution.job import BatchSettings
from hypernodes_dist.inputs import (
    check_inputs,
    expand,
)
from hypernodes_dist.missing import MISSING
from hypernodes_dist.plan import Plan
from hypernodes_dist.run.batchloop import BatchLoop
from hypernodes_dist.run.batchmap import batch_nodes, map_identity, open_loop
from hypernodes_dist.run.maprun import map_settings, prepare_map_cache
from hypernodes_dist.run.onbudget import Ask, Asker
from hypernodes_dist.run.progress import Tally
from hypernodes_dist.run.stops import Kept, is_budget
from hypernodes_dist.sinks.arrow_types import is_pickled
from hypernodes_dist.sinks.parquet import ERROR_COLUMN, ROW_COLUMN, ParquetDataset

if TYPE_CHECKING:
    import pyarrow as pa

    from hypernodes_dist.engines.base import Engine

__all__ = ["run_dataset", "bind_source", "read_columns"]


def bind_source(plan: Plan, source: Source, inputs: Mapping[str, Any],
                columns: Mapping[str, str] | None) -> tuple[dict[str, str], dict[str, Any]]:
    """``(graph input -> source column, broadcast inputs)``; errors name what is missing."""
    columns = dict(columns or {})
    available = set(source.columns)
    bad = [k for k in columns if k not in plan.inputs]
    if bad:
        raise GraphInputError(
            f"columns= maps {', '.join(map(repr, bad))}, which are not inputs of the graph; "
            f"its inputs are {', '.join(plan.inputs) or 'none'}", bad)
    absent = {k: c for k, c in columns.items() if c not in available}
    if absent:
        detail = ", ".join(f"{k!r} -> {c!r}" for k, c in absent.items())
        raise GraphInputError(
            f"columns= names source columns that do not exist ({detail}); the source's "
            f"columns are {', '.join(source.columns)}", list(absent))
    mapping: dict[str, str] = {}
    for name in plan.inputs:
        if name in inputs:
            continue  # given explicitly: broadcast to every row
        if name in columns:
            mapping[name] = columns[name]
        elif name in available:
            mapping[name] = name
    missing = [p for p in plan.required if p not in inputs and p not in mapping]
    if missing:
        raise GraphInputError(
            f"required input(s) {', '.join(map(repr, missing))} found neither in the source's "
            f"columns ({', '.join(source.columns) or 'none'}) nor in inputs; add them to inputs "
            "or map them with columns={input: column}", missing)
    if not mapping:
        raise GraphInputError(
            f"the graph reads no column of the source (graph inputs: "
            f"{', '.join(plan.inputs) or 'none'}; source columns: {', '.join(source.columns)})",
            [])
    check_inputs(plan, {**dict(inputs), **dict.fromkeys(mapping)})
    return mapping, dict(inputs)


def read_columns(plan: Plan, source: Any, inputs: Mapping[str, Any],
                 columns: Mapping[str, str] | None) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """The mapped columns of ``source`` as lists in the driver (a map without ``into=``
    returns every row in memory anyway), and the broadcast inputs."""
    src = open_source(source)
    mapping, broadcast = bind_source(plan, src, inputs, columns)
    needed = list(dict.fromkeys(mapping.values()))
    values: dict[str, list[Any]] = {k: [] for k in mapping}
    for part in src.parts(100_000):
        data = part.read(needed)
        for name, col in mapping.items():
            got = data[col]
            values[name].extend(got if isinstance(got, list) else got.to_pylist())
    return values, broadcast


def _check_keep(source: Source, keep: Sequence[str], outputs: Sequence[str]) -> tuple[str, ...]:
    keep = (keep,) if isinstance(keep, str) else tuple(keep)
    unknown = [k for k in keep if k not in source.columns]
    if unknown:
        raise GraphInputError(
            f"keep= names {', '.join(map(repr, unknown))}, not columns of the source (its "
            f"columns are {', '.join(source.columns)})", unknown)
    clash = [k for k in keep if k in outputs or k in (ROW_COLUMN, ERROR_COLUMN)]
    if clash:
        raise GraphInputError(
            f"keep= column(s) {', '.join(map(repr, clash))} clash with output columns of the "
            "same name; select other outputs or rename the source column", clash)
    return keep


def run_dataset(
    plan: Plan,
    engine: Engine,
    *,
    source: Any = None,
    inputs: Mapping[str, Any] | None = None,
    map_over: str | Iterable[str] | None = None,
    map_mode: str = "zip",
    columns: Mapping[str, str] | None = None,
    keep: Sequence[str] = (),
    into: Any = None,
    overwrite: bool = False,
    session_id: str | None = None,
    select: Iterable[str] | None = None,
    on_error: str = "raise",
    progress: bool = False,
    cache: Cache | None = None,
    callbacks: Sequence[Any] = (),
    commit_seconds: float | None = None,
    budget: Mapping[str, float] | None = None,
    on_budget: Ask | None = None,
    wait: bool = True,
) -> DatasetResult:
    """Run a map whose rows come from ``source`` (or dict inputs) and write them ``into``
    (a finished row is in a file within about ``commit_seconds``)."""
    commit_seconds = check_commit_seconds(
        COMMIT_SECONDS if commit_seconds is None else commit_seconds)
    settings = map_settings(plan, session_id, select, on_error, cache, callbacks, budget,
                            on_budget)
    src, mapping, broadcast = _bind(plan, source, dict(inputs or {}), map_over, map_mode,
                                    columns)
    outputs = settings.select or plan.outputs
    keep_t = _check_keep(src, keep, outputs)
    loop = _open_batches(plan, settings, broadcast, list(mapping), into, engine, callbacks)
    out = _open_into(into, engine)
    prepare_map_cache(plan, cache, engine)
    manifest = new_manifest(plan, src, mapping, keep_t, outputs, broadcast)
    found = check_manifest(out, manifest, overwrite)
    stop = MapStop(settings.run_prefix)
    stop.where = engine.driver_shared(stop.name)
    with stopping(stop) as pressed:  # Ctrl-C stops the map before any row runs (the head's)
        rows_per_part, schema, head = _typed_layout(loop, found, plan, engine, src, mapping,
                                                    keep_t, outputs, broadcast, settings)
        out.clean_temporary()
        manifest.update(rows_per_part=rows_per_part, schema=schema)
        if found is None:
            out.write_manifest(encode(manifest))
        task = PartTask(plan, mapping, keep_t, broadcast, settings, schema, out,
                        commit_seconds, stop)
        collector = DatasetCollector(callbacks, progress, src.n, engine.name, out,
                                     settings.session_id, settings)
        rows = _Rows(engine, lambda: DatasetJob(task, src, rows_per_part, out.committed()),
                     collector, stop)
        pending = _execute(task, head, rows, collector,
                           Asker(settings.budget, on_budget, engine.driver_shared,
                                 collector.budget, stop.stopped), loop, wait, pressed)
    result = collector.result()
    result.pending, result.unfinished = pending, max(0, result.unfinished - pending)
    return result


def _open_batches(plan: Plan, settings: BatchSettings, broadcast: Mapping[str, Any], mapped: list[str],
                  into: Any, engine: Engine, callbacks: Sequence[Any]) -> BatchLoop | None:
    """The map's Batch API loop when a node has ``batch_api=True`` (else None); the batches'
    events reach the callbacks from the start, the head's (run before the bar) included."""
    if not batch_nodes(plan):
        return None
    loop = open_loop(plan, settings, broadcast, mapped, into, map_identity(plan, str(into)),
                     engine.driver_shared)
    if loop is not None:
        loop.on_event = Dispatcher(callbacks)
    return loop


def _open_into(into: Any, engine: Engine) -> ParquetDataset:
    """The ``into`` directory, created; every worker must see it before anything runs."""
    out = ParquetDataset(into)
    out.create()
    engine.check_output(out)
    return out


def _bind(plan: Plan, source: Any, inputs: dict[str, Any], map_over: Any, map_mode: str,
          columns: Mapping[str, str] | None) -> tuple[Source, dict[str, str], dict[str, Any]]:
    """The rows (a source, or the expanded dict inputs), graph input -> column, broadcast."""
    if source is not None:
        src = open_source(source)
        mapping, broadcast = bind_source(plan, src, inputs, columns)
        return src, mapping, broadcast
    cols, broadcast, n = expand(plan, inputs, map_over, map_mode)
    return ListSource(cols, n), {k: k for k in cols}, broadcast


def _layout(found: tuple[int, pa.Schema] | None, plan: Plan, engine: Engine, src: Source,
            mapping: dict[str, str], keep: tuple[str, ...], outputs: Sequence[str],
            broadcast: dict[str, Any], settings: BatchSettings
            ) -> tuple[int, Any, Head | None]:
    """Rows per part and the output schema: the earlier run's (``found``), or fixed now
    from the first rows (``head``, written as part 0's first rows, never computed again)."""
    if found is not None:  # the same map ran here before: its partitioning and schema hold
        return found[0], found[1], None
    rows_per_part = engine.dataset_part_rows(src.n)
    schema, head = output_schema(plan, src, mapping, keep, outputs, broadcast,
                                 collecting(settings), max_rows=rows_per_part)
    if head is not None and settings.on_error == "raise" and len(head.batch.errors) == head.n:
        raise head.batch.errors[min(head.batch.errors)]  # nothing finished: no types
    return rows_per_part, schema, head


class _Rows:
    """The engine's run of the parts with rows in no file (``job()``); how many rows wait
    for a provider batch (``run_rows`` of the map's ``BatchLoop``; 0 once stopped)."""

    def __init__(self, engine: Engine, job: Callable[[], DatasetJob],
                 collector: DatasetCollector, stop: MapStop) -> None:
        self.engine, self.job, self.collector, self.stop = engine, job, collector, stop

    def __call__(self) -> int:
        self.collector.waiting = 0
        if not self.stop.stopped():
            self.engine.execute_dataset(self.job(), self.collector.accept)
        return 0 if self.stop.stopped() else self.collector.waiting


def _execute(task: PartTask, head: Head | None, rows: _Rows, collector: DatasetCollector,
             asker: Asker, loop: BatchLoop | None, wait: bool, pressed: list[bool]) -> int:
    """The head's rows written first, then the engine runs the parts (``rows``: what no
    file holds yet; with ``batch_api`` nodes, again until none waits, ``loop``); a stop
    (the first error under ``"raise"``, a spent budget, Ctrl-C: ``pressed``) raises here
    once every worker has written the rows it finished. Returns the rows still waiting."""
    pending = 0
    with collector.watch(rows.engine, task.settings):  # a stop raised in here is on the bar
        if head is not None:
            collector.accept(_write_head(task, head))
        with asker:
            if loop is not None:
                loop.on_change = collector.batch_states
            pending = rows() if loop is None else loop.run(rows, wait)
        if pressed:
            raise KeyboardInterrupt
        asker.raise_error()
        if collector.stop is not None and task.settings.on_error == "raise":
            raise collector.stop
    return pending


def _typed_layout(loop: BatchLoop | None, found: tuple[int, pa.Schema] | None, plan: Plan,
                  engine: Engine, src: Source, mapping: dict[str, str], keep: tuple[str, ...],
                  outputs: Sequence[str], broadcast: dict[str, Any], settings: BatchSettings
                  ) -> tuple[int, Any, Head | None]:
    """``_layout``; with ``batch_api`` nodes whose outputs' types only the first rows can
    tell and whose first rows wait, the first rows' batch is waited for first."""
    layout = _layout(found, plan, engine, src, mapping, keep, outputs, broadcast, settings)
    if loop is None or not _untyped(layout[1], layout[2], outputs):
        return layout

    def head_rows() -> int:
        nonlocal layout
        layout = _layout(found, plan, engine, src, mapping, keep, outputs, broadcast,
                         settings)
        head = layout[2]
        return len(head.batch.waiting) if head and _untyped(layout[1], head, outputs) else 0

    loop.run(head_rows, wait=True)
    return layout


def _untyped(schema: pa.Schema, head: Head | None, outputs: Sequence[str]) -> bool:
    """Whether some output's type is unknown because every first row of it waits."""
    if head is None or not head.batch.waiting:
        return False
    return any(is_pickled(schema.field(o)) and all(
        v is MISSING for v in head.batch.outputs.get(o, ())) for o in outputs)


def _write_head(task: PartTask, head: Head) -> PartReport:
    """The rows computed to fix the types: the first file(s) of part 0 (rows ``0 .. n``
    but the ones that stop the map: failed under ``"raise"``, refused by the budget)."""
    table, report = task.head_table(head)
    if report.stop is not None and task.stop is not None:
        task.stop.set()
    for x, y in kept_runs(head.n, report, 0):
        task.out.write_part(0, table.slice(x, y - x), (x, y))
    return report


class DatasetCollector(Tally):
    """Driver side of a dataset map (a ``ResultSink``): progress, callbacks and counts --
    never rows. On a rerun the bar starts at the rows already in files."""

    def __init__(self, callbacks: Sequence[Any], progress: bool, total: int | None,
                 engine: str, out: ParquetDataset, session_id: str = "",
                 settings: BatchSettings | None = None):
        resumed = sum(rows for rows, _ in out.counts()) if out.finished() else 0
        budget = settings.budget if settings is not None else None
        super().__init__(callbacks, progress, total, f"map [{engine}] -> parquet", resumed,
                         unit="row", failed_name="failed",
                         budget=dict(budget.limits) if budget is not None else None,
                         kept=Kept("into", out.location))
        self.out, self.session_id, self.resumed = out, session_id, resumed
        self.stop: BaseException | None = None  # the error that stopped the map (first row)
        self.stop_at = 0
        self.waiting = 0  # rows waiting for a provider batch, this round

    def accept(self, report: PartReport) -> None:
        self.waiting += report.waiting
        self.add(report.n, report.hits, report.failed, report.events, report.usage,
                 report.offset, budget_stop=is_budget(report.stop))
        report.events = []
        at = report.stopped_at
        if report.stop is not None and at is not None and (self.stop is None
                                                           or at < self.stop_at):
            self.stop, self.stop_at = report.stop, at

    def result(self) -> DatasetResult:
        return DatasetResult(self.out, self.session_id, self.usage, self.total,
                             self.resumed)
