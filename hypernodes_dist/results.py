"""Result types: ``NodeExecution``, ``GraphResult`` (one run) and ``MapResult`` (one map),
``ErrorList`` (a map's failed items, readable as a table too) and ``Failure`` (one of them)."""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterator, KeysView, ValuesView
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from hypernodes_dist.errors import BudgetExceededError

if TYPE_CHECKING:
    import pandas
    import pyarrow

__all__ = ["NodeExecution", "GraphResult", "MapResult", "ErrorList", "Failure", "Status"]

Status = Literal["complete", "interrupted", "error", "pending"]  # pending: waits for a batch


@dataclass
class NodeExecution:
    """One execution of one node in a run (a cycle runs a node several times)."""

    node_id: str
    step_index: int
    iteration: int = 0
    parallel_index: int = 0
    inputs_hash: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)
    cached: bool = False
    duration_ms: float = 0.0
    started_at: float = 0.0
    worker: str = ""
    usage: dict[str, float] = field(default_factory=dict)  # what the execution metered


class RowSource(Protocol):
    """Where a map item's result lives until it is read (a ``BatchResult``)."""

    offset: int  # the position of its first item in the map

    def row(self, i: int) -> dict[str, Any]: ...
    def history_of(self, i: int) -> list[NodeExecution]: ...
    def run_id_of(self, i: int) -> str: ...


class GraphResult:
    """The result of one run: dict-like over its outputs, plus ids, status and history."""

    # Class-level defaults: a map item sets 3 attributes, not 11 (a map builds 10^6 of these).
    status: Status = "complete"
    error: BaseException | None = None
    checkpoint: Any = None
    interrupt: Any = None
    _outputs: dict[str, Any] | None = None
    _src: RowSource | None = None
    _i: int = 0
    _run_id: str | None = None
    _history: list[NodeExecution] | None = None
    _resume: Callable[[dict[str, Any]], GraphResult] | None = None

    def __init__(
        self,
        outputs: dict[str, Any] | None = None,
        *,
        session_id: str,
        run_id: str | None = None,
        status: Status = "complete",
        history: list[NodeExecution] | None = None,
        error: BaseException | None = None,
        checkpoint: Any = None,
        interrupt: Any = None,
        resume: Callable[[dict[str, Any]], GraphResult] | None = None,
    ) -> None:
        self._outputs = outputs
        self.session_id = session_id
        self._run_id = run_id
        self.status = status
        self.error = error
        self.checkpoint = checkpoint
        self.interrupt = interrupt
        self._history = history
        self._resume = resume

    @classmethod
    def from_row(
        cls, src: RowSource, i: int, session_id: str, error: BaseException | None = None
    ) -> GraphResult:
        """A map item's result that reads its outputs and history from ``src`` when asked."""
        r = cls.__new__(cls)
        r._src = src
        r._i = i
        r.session_id = session_id
        if error is not None:
            r.status = "error"
            r.error = error
        return r

    # -- lazily materialised parts (a map builds 10^6 of these) --------------------------
    @property
    def outputs(self) -> dict[str, Any]:
        if self._outputs is None:
            self._outputs = self._src.row(self._i) if self._src is not None else {}
        return self._outputs

    @property
    def run_id(self) -> str:
        if self._run_id is None:
            self._run_id = self._src.run_id_of(self._i) if self._src is not None else ""
        return self._run_id

    @property
    def history(self) -> list[NodeExecution]:
        if self._history is None:
            self._history = self._src.history_of(self._i) if self._src is not None else []
        return self._history

    @property
    def row(self) -> int | None:
        """A map item's 0-based position in the map (``None`` for a ``run()``)."""
        return self._src.offset + self._i if self._src is not None else None

    @property
    def node(self) -> str | None:
        """The node whose failure failed this run or item (``None`` when it did not fail)."""
        if self.error is None:
            return None
        return failed_node(self.error)

    # -- dict-like interface ---------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        try:
            return self.outputs[key]
        except KeyError:
            raise KeyError(self._missing_message(key)) from None

    def _missing_message(self, key: str) -> str:
        if self.status == "error":
            return f"{key!r} (the run failed: {type(self.error).__name__}: {self.error})"
        have = ", ".join(sorted(self.outputs)) or "none"
        return f"{key!r} is not an output of this run (outputs: {have})"

    def __contains__(self, key: object) -> bool:
        return key in self.outputs

    def __iter__(self) -> Iterator[str]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    def keys(self) -> KeysView[str]:
        return self.outputs.keys()

    def values(self) -> ValuesView[Any]:
        return self.outputs.values()

    def items(self) -> ItemsView[str, Any]:
        return self.outputs.items()

    def get(self, key: str, default: Any = None) -> Any:
        return self.outputs.get(key, default)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GraphResult):
            return self.outputs == other.outputs and self.status == other.status
        if isinstance(other, dict):
            return self.outputs == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # unhashable (compares by value); mypy wants a method

    # -- convenience -------------------------------------------------------------------------
    @property
    def interrupted(self) -> bool:
        return self.status == "interrupted"

    def resume(self, response: dict[str, Any]) -> GraphResult:
        """Continue an interrupted run with ``{response_param: value}``."""
        if self._resume is None or self.status != "interrupted":
            raise RuntimeError(f"this run is {self.status!r}; only an interrupted run can resume")
        return self._resume(response)

    def __repr__(self) -> str:
        extra = f", error={self.error!r}" if self.error is not None else ""
        return f"GraphResult(status={self.status!r}, outputs={self.outputs!r}{extra})"


def failed_node(error: BaseException) -> str | None:
    """The node an error failed in (``hn_node``, or the node a budget stopped)."""
    node = getattr(error, "hn_node", None)
    if not node and isinstance(error, BudgetExceededError):
        node = error.node
    return node or None


def error_summary(error: BaseException) -> str:
    """``Type: message``: an error as the ``error`` column of an errors table shows it."""
    return f"{type(error).__name__}: {error}"


class Failure(NamedTuple):
    """One failed row of a dataset map (``DatasetResult.failures``): its position, the node
    it failed in and the error's text (``Type: message``)."""

    row: int
    node: str | None
    error: str


class ErrorList(list):
    """A map's failed items (``GraphResult``s with ``.row``, ``.node``, ``.error``), also
    readable as the table ``DatasetResult.errors`` is: ``num_rows``, ``column(name)``,
    ``to_pylist()``, ``to_pandas()``, ``to_arrow()`` (``_hn_row``, ``node``, ``error``)."""

    def to_arrow(self) -> pyarrow.Table:
        """``_hn_row`` (int64), ``node`` and ``error`` (``Type: message``) of each item."""
        import pyarrow as pa

        return pa.table({
            "_hn_row": pa.array([r.row for r in self], pa.int64()),
            "node": pa.array([r.node for r in self], pa.string()),
            "error": pa.array([error_summary(r.error) for r in self], pa.string()),
        })

    @property
    def num_rows(self) -> int:
        return len(self)

    def column(self, name: str) -> pyarrow.ChunkedArray:
        return self.to_arrow().column(name)

    def to_pylist(self) -> list[dict[str, Any]]:
        return self.to_arrow().to_pylist()

    def to_pandas(self) -> pandas.DataFrame:
        return self.to_arrow().to_pandas()


class MapResult(list):
    """The results of one ``map``: a list of ``GraphResult`` in item order, with the counts
    ``DatasetResult`` has (``rows``, ``failed``, ``unfinished``, ``resumed``, ``pending``)."""

    def __init__(
        self,
        results: list[GraphResult] | None = None,
        *,
        columns: Callable[[], dict[str, list[Any]]] | None = None,
        session_id: str = "",
        usage: dict[str, dict[str, float]] | None = None,
        resumed: int = 0,
    ) -> None:
        super().__init__(results or [])
        self._columns = columns
        self.session_id = session_id
        self.usage: dict[str, dict[str, float]] = usage or {}
        """Per node: ``calls`` (executions that ran, cache hits excluded; a batch node's
        function calls) and the sum of every quantity its calls ``meter``-ed."""
        self.resumed: int = resumed
        """Items an earlier run had finished: every node of theirs was a cache hit."""
        self.pending: int = 0
        """Items still waiting for a provider batch (``batch_api``): 0 until then."""

    @property
    def errors(self) -> ErrorList:
        """The failed items, budget-refused ones included (``status == "error"``)."""
        return ErrorList(r for r in self if r.status == "error")

    @property
    def failures(self) -> ErrorList:
        """The failed items, as ``DatasetResult.failures``: each with ``.row``, ``.node``,
        ``.error`` (here the exception itself)."""
        return self.errors

    @property
    def unfinished(self) -> int:
        """Items a ``budget`` refused (``BudgetExceededError``): a rerun finishes them."""
        return sum(1 for r in self if isinstance(r.error, BudgetExceededError))

    @property
    def failed(self) -> int:
        """Items that ran and failed (not counting the ``unfinished`` ones)."""
        return sum(1 for r in self if r.status == "error") - self.unfinished

    @property
    def rows(self) -> int:
        """Items that ran to an end, succeeded or failed:
        ``rows + unfinished + pending == len(self)``."""
        return len(self) - self.unfinished - self.pending

    def column(self, name: str) -> list[Any]:
        """Every item's value of output ``name`` (``None`` where an item has none)."""
        return self._table()[name]

    def _table(self) -> dict[str, list[Any]]:
        if self._columns is not None:
            return self._columns()
        names: dict[str, None] = {}
        for r in self:
            names.update(dict.fromkeys(r.outputs))
        return {n: [r.outputs.get(n) for r in self] for n in names}

    def to_arrow(self) -> pyarrow.Table:
        """The outputs as a ``pyarrow.Table`` (one row per item; failed items are null)."""
        import pyarrow as pa

        arrays = {}
        for name, values in self._table().items():
            try:
                arrays[name] = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                arrays[name] = pa.array([None if v is None else repr(v) for v in values])
        return pa.table(arrays) if arrays else pa.table({})

    def to_pandas(self) -> pandas.DataFrame:
        """The outputs as a ``pandas.DataFrame`` (Python objects kept as they are)."""
        import pandas as pd

        return pd.DataFrame(self._table())
