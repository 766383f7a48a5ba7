"""The ``BatchTransport`` protocol: what the driver needs from a provider's Batch API.

One transport per provider (``openai_batches.py``, ``anthropic_batches.py``), built around
the user's client object (sync or async: every operation is a coroutine; a sync client's
calls run in a worker thread so the event loop never blocks, see ``clientcalls.py``).
Run one from sync code with ``hypernodes_dist.execution.syncio.run_sync``.

The driver's cycle, each provider call recorded in the ledger before and after:

    lines = [t.line(endpoint, body) for ...]          # custom_id = map tag + request hash
    for file in t.pack(lines):                         # within the provider's file limits
        file_id = await t.upload(file)                 # "" where requests go inline
        info = await t.create(file, file_id)           # QueueLimitError: wait, submit later
    info = await t.status(info.id)                     # BatchNotFoundError: 404
    async for r in t.results(info): ...                # one LineResult per custom_id
    await t.delete_files(info)                         # after download
    await t.list_batches(since)                        # the map's batches, after a crash

Optional: ``results_at_once(info)``, ``results`` with a file whose every line succeeded in
the documented shape given as one ``AnsweredLines`` (``read_at_once``: the answer file's
lines made by one regex pass, not line by line); the driver reads through it where the
transport has it. A transport wrapping another (one timing or failing its calls) forwards it,
or leaves it out to be read line by line.

Optional: ``raw_lines(endpoint, model, digests, bodies, inputs)``, the ``line`` of each of
requests of one endpoint and model given as their bodies' canonical JSON bytes (what the
request log holds of them), nothing parsed, as one ``LineBlock``; or None where a body must
be read (``line`` then). The driver submits from the request log a block of lines at a time
through it where the transport has it, packed by ``packing.Packer`` within ``limits``.

A ``custom_id`` of the file that ``results`` does not return (a provider leaving out lines
it did not run) is to be treated as ``cancelled``: submitted again.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

__all__ = ["BatchTransport", "Line", "LineBlock", "BatchFile", "FileLimits", "BatchInfo",
           "BatchError", "LineResult", "SUCCEEDED", "CLIENT_ERROR", "RATE_LIMITED", "SERVER_ERROR",
           "EXPIRED", "CANCELLED", "RETRYABLE", "RUNNING", "ENDED", "FAILED",
           "BatchNotFoundError", "QueueLimitError", "UnsupportedClientError", "kind_of_status",
           "refuse_streaming", "read_results", "AnsweredLines", "read_at_once"]

# what happened to one line
SUCCEEDED = "succeeded"        # 2xx: ``body`` is the online response body
CLIENT_ERROR = "client_error"  # 4xx but 408/409/429: the item fails as online
RATE_LIMITED = "rate_limited"  # 429: submitted again
SERVER_ERROR = "server_error"  # 5xx, 408, 409, an unknown line error: submitted again
EXPIRED = "expired"            # not run before the batch's window closed: submitted again
CANCELLED = "cancelled"        # not run, the batch was cancelled: submitted again
RETRYABLE = frozenset({RATE_LIMITED, SERVER_ERROR, EXPIRED, CANCELLED})

# a batch's state
RUNNING = "running"  # validating, in progress, finalizing, cancelling
ENDED = "ended"      # results can be read (completed, expired, cancelled)
FAILED = "failed"    # failed as a whole (validation, queue limit): no results, every line again


def kind_of_status(status: int) -> str:
    """A line's kind from the HTTP status the provider answered it with."""
    if 200 <= status < 300:
        return SUCCEEDED
    if status == 429:
        return RATE_LIMITED
    if status >= 500 or status in (408, 409):
        return SERVER_ERROR
    return CLIENT_ERROR


def refuse_streaming(body: Mapping[str, Any]) -> None:
    """A line's rule: a streamed call (``stream=True``) cannot be batched (ValueError)."""
    if body.get("stream"):
        raise ValueError("a streamed call (stream=True) cannot go through a Batch API: "
                         "call it without stream=True, or with batch_api=False")


@dataclass(frozen=True)
class FileLimits:
    """A provider's limits on one batch file."""

    max_lines: int
    max_bytes: int
    one_model: bool            # every line of a file uses one model (OpenAI)
    max_inputs: int | None = None  # embedding inputs in all (OpenAI embeddings)


class Line(NamedTuple):
    """One request as a line of a batch file."""

    custom_id: str
    endpoint: str
    model: str | None
    data: bytes   # the serialized line as the provider receives it, newline included
    inputs: int = 1  # embedding inputs it carries (1 for others)


class LineBlock(NamedTuple):
    """Lines of one endpoint and model made at once from the request log's bytes
    (``raw_lines``): each line's custom_id, bytes (newline included) and embedding inputs,
    in order; ``packing.Packer`` cuts a block where a file fills."""

    custom_ids: list[str]
    endpoint: str
    model: str | None
    lines: list[bytes]
    inputs: list[int]

    def cut(self, start: int, stop: int) -> LineBlock:
        """Lines ``start:stop`` of the block."""
        return LineBlock(self.custom_ids[start:stop], self.endpoint, self.model,
                         self.lines[start:stop], self.inputs[start:stop])


@dataclass(frozen=True)
class BatchFile:
    """Lines packed within a provider's limits: one batch. Its lines are ``lines`` (one by
    one) then ``blocks`` (a block at a time, from the request log's bytes): a transport
    reads them through ``custom_ids``, ``data()`` and ``count``."""

    lines: tuple[Line, ...]
    endpoint: str
    model: str | None
    size: int
    tag: str   # names the file (a hash of its custom_ids, in order)
    blocks: tuple[LineBlock, ...] = ()

    @property
    def custom_ids(self) -> list[str]:
        ids = [line.custom_id for line in self.lines]
        for block in self.blocks:
            ids += block.custom_ids
        return ids

    @property
    def count(self) -> int:
        """How many lines it holds."""
        return len(self.lines) + sum(len(b.custom_ids) for b in self.blocks)

    def data(self) -> bytes:
        return b"".join([*(line.data for line in self.lines),
                         *(data for block in self.blocks for data in block.lines)])


@dataclass(frozen=True)
class BatchError:
    """A whole-batch error as the provider reports it (validation, queue limit)."""

    code: str | None
    message: str
    line: int | None = None


@dataclass(frozen=True)
class BatchInfo:
    """A batch as the provider last reported it."""

    id: str
    state: str              # RUNNING | ENDED | FAILED
    provider_status: str    # the provider's own word ("in_progress", "ended", ...)
    total: int = 0
    succeeded: int = 0
    failed: int = 0         # lines that did not succeed (4xx, 5xx, expired, cancelled)
    errors: tuple[BatchError, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)
    created_at: float = 0.0
    input_file_id: str | None = None
    output_file_id: str | None = None   # OpenAI
    error_file_id: str | None = None    # OpenAI
    results_url: str | None = None      # Anthropic
    confirmed: bool = True  # False: found by list_batches, not yet known to be the map's

    @property
    def queue_limited(self) -> bool:
        """Failed for the provider's enqueued-token limit: submit again later."""
        return self.state == FAILED and any(e.code == "token_limit_exceeded"
                                            for e in self.errors)

    @property
    def message(self) -> str:
        """The provider's whole-batch errors, one line each ("" when none)."""
        return "\n".join(f"{e.code}: {e.message}" + (f" (line {e.line})" if e.line else "")
                         for e in self.errors)


class LineResult:
    """What the provider answered for one line. A succeeded line read as its bytes keeps
    its body as they came (``raw``: the JSON of the online response body), decoded only when
    ``body`` is read: the driver writes ``raw`` into the answer file as it is."""

    __slots__ = ("custom_id", "kind", "status", "_body", "raw", "message")

    def __init__(self, custom_id: str, kind: str, status: int | None = None, body: Any = None,
                 message: str = "", *, raw: bytes | None = None) -> None:
        self.custom_id, self.kind, self.status, self.message = custom_id, kind, status, message
        self._body, self.raw = body, raw

    @property
    def body(self) -> Any:
        """Its response body (the online one; an error body), decoded from ``raw`` if need be."""
        if self._body is None and self.raw is not None:
            self._body = json.loads(self.raw)
        return self._body

    @property
    def retry(self) -> bool:
        """Submit it again (the provider did not answer it for good)."""
        return self.kind in RETRYABLE

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LineResult) and (
            (self.custom_id, self.kind, self.status, self.body, self.message)
            == (other.custom_id, other.kind, other.status, other.body, other.message))

    __hash__ = None  # type: ignore[assignment]  # equal by value and mutable body: unhashable, as a dataclass with eq

    def __repr__(self) -> str:
        return (f"LineResult({self.custom_id!r}, {self.kind!r}, {self.status!r}, "
                f"{self.body!r}, {self.message!r})")


def read_results(data: bytes, fast: Callable[[bytes], LineResult | None],
                 full: Callable[[bytes], LineResult]) -> Iterator[LineResult]:
    """A results file's lines: ``fast`` (a scan of the provider's documented shape, the body
    kept as bytes) where it reads the line, else ``full`` (the line parsed whole). ``fast`` is
    checked against ``full`` on the first line it reads: a file in another shape (another
    key order, a key after the body) is parsed whole, every line."""
    trusted: bool | None = None
    for raw in data.splitlines():
        if not raw.strip():
            continue
        got = fast(raw) if trusted is not False else None
        if got is not None and trusted is None:
            trusted = _same(got, full(raw))
        yield got if got is not None and trusted else full(raw)


class AnsweredLines(NamedTuple):
    """A results file whose every line is a succeeded one in the provider's documented
    shape, read at once (``read_at_once``): ``data`` holds its lines in the answer store's
    layout (``{"d":<digest>,"s":<status>,"b":<body as sent>}``, ``store.AnswerWriter``'s,
    in file order); ``digests``, ``statuses`` and ``lengths`` (bytes, newline included)
    are each line's."""

    data: bytes
    digests: list[str]
    statuses: list[int]
    lengths: list[int]


# the answer store's line (``store.AnswerWriter.add``) as ``read_at_once`` writes it: the
# digest (the custom_id after its map tag), the status, the body's bytes as they came
_ANSWER_LINE = b'{"d":"%s","s":%s,"b":%s}\n'


def read_at_once(data: bytes, fast: Callable[[bytes], LineResult | None],
                 full: Callable[[bytes], LineResult], lines: re.Pattern[bytes]
                 ) -> AnsweredLines | None:
    """``data``'s lines in the answer store's layout, read by one ``lines.findall`` (a
    succeeded line in the documented shape, anchored ``^...$`` with ``re.M``: groups
    digest, status, body) when every line is one (no blank line, no ``\\r``) and the first
    reads the same fast and parsed whole (``read_results``' check); else None: read it
    line by line. Each line is then written as ``read_results`` and ``AnswerWriter.add``
    write it."""
    end = data.find(b"\n")
    if not data or b"\r" in data:
        return None
    first = data if end < 0 else data[:end]
    got = fast(first)
    if got is None or not _same(got, full(first)):
        return None
    found = lines.findall(data)
    if len(found) != data.count(b"\n") + (not data.endswith(b"\n")):
        return None
    out = [_ANSWER_LINE % line for line in found]
    return AnsweredLines(b"".join(out), [d.decode() for d, _, _ in found],
                         [int(s) for _, s, _ in found], [len(line) for line in out])


def _same(fast: LineResult, full: LineResult) -> bool:
    try:
        return fast == full
    except ValueError:  # the bytes taken for the body are not one JSON value
        return False


class BatchNotFoundError(LookupError):
    """The provider does not know the batch (404: deleted, or another API key)."""

    def __init__(self, batch_id: str, provider: str) -> None:
        super().__init__(f"{provider} does not know batch {batch_id!r} (404): it was deleted "
                         "or belongs to another API key; its requests are resubmitted only "
                         "if you say so: `hypernodes-dist batches resubmit-lost <into>` (or "
                         "hypernodes_dist.resubmit_lost_batches(into)), then run the map again")
        self.batch_id = batch_id


class QueueLimitError(RuntimeError):
    """The provider refused a batch at create for its queue limit (a gateway's 429):
    submit it again once an earlier batch has finished."""


class UnsupportedClientError(TypeError):
    """A client no transport knows."""


@runtime_checkable
class BatchTransport(Protocol):
    """One provider's Batch API, around the user's client (sync or async)."""

    provider: ClassVar[str]
    limits: FileLimits
    map_id: str

    def line(self, endpoint: str, body: Mapping[str, Any], digest: str | None = None) -> Line:
        """A request as a line; its custom_id derives from the map and the request's
        identity (endpoint + canonical body), so identical requests share one line.
        ``digest``: the request's ``identity.digest_of(endpoint, canonical)`` when the caller
        has it (the request log's), not computed again where ``endpoint`` is the line's URL."""
        ...

    def pack(self, lines: Iterable[Line]) -> Iterator[BatchFile]:
        """Files within ``limits``, one custom_id once (repeats dropped)."""
        ...

    async def upload(self, file: BatchFile) -> str:
        """Upload a file; its provider id ("" where requests go inline with create)."""
        ...

    async def create(self, file: BatchFile, file_id: str,
                     metadata: Mapping[str, str] | None = None) -> BatchInfo:
        """Create the batch (metadata names the map where the provider keeps it);
        ``QueueLimitError`` when refused for the queue limit."""
        ...

    async def status(self, batch_id: str) -> BatchInfo:
        """The batch now; ``BatchNotFoundError`` on 404."""
        ...

    def results(self, info: BatchInfo) -> AsyncIterator[LineResult]:
        """The lines of an ENDED batch, in the provider's order."""
        ...

    async def cancel(self, batch_id: str) -> BatchInfo:
        """Ask the provider to cancel (a batch already over is returned as it is)."""
        ...

    async def list_batches(self, since: float | None = None) -> list[BatchInfo]:
        """The batches this map created (created at or after ``since``, a Unix time),
        newest first; see each provider's module for how they are recognized."""
        ...

    async def delete_files(self, info: BatchInfo) -> None:
        """Delete what the batch left at the provider (files / the batch's results)."""
        ...
