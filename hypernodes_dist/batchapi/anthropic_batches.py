"""Anthropic Message Batches as a ``BatchTransport``, over an ``anthropic`` client (sync
``Anthropic`` or async ``AsyncAnthropic``).

Endpoint: ``/v1/messages`` (``messages.create``). A batch holds at most 100,000 requests and
256 MB of create body (models may differ; ``anthropic_limits`` counts the body's envelope);
requests go inline with create, so ``upload`` is a no-op returning "".

**Finding a map's batches without metadata.** Message Batches carry no metadata, so every
``custom_id`` starts with the map's tag (``<12 hex of the map id>_<request digest>``).
``list_batches(since)`` pages the batch list (newest first, stopping before ``since``: the
ledger's time of the create it did not see answered, minus some clock skew) and, for each
batch that has ended, reads the first line of its results: the batch is the map's when
that custom_id carries the map's tag. A batch still running has no results to read yet:
it is returned with ``confirmed=False`` (its ``total`` tells the file it may be); the
driver waits for it to end before resubmitting the lines of a file it may hold, which
keeps every request submitted once. Once confirmed, its results' custom_ids say which of
the ledger's files it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import aclosing
from dataclasses import replace
from typing import Any, ClassVar

from hypernodes_dist.batchapi.clientcalls import ClientCalls, http_status
from hypernodes_dist.batchapi.identity import canonical_body, digest_of, map_tag
from hypernodes_dist.batchapi.packing import pack
from hypernodes_dist.batchapi.transport import (
    CANCELLED,
    ENDED,
    EXPIRED,
    RUNNING,
    SERVER_ERROR,
    SUCCEEDED,
    BatchFile,
    BatchInfo,
    FileLimits,
    Line,
    LineBlock,
    LineResult,
    QueueLimitError,
    kind_of_status,
    read_results,
    refuse_streaming,
)

__all__ = ["AnthropicBatches", "ANTHROPIC_LIMITS", "ERROR_STATUS", "anthropic_limits"]

# the create body is the lines' JSON in ``{"requests":[...]}``, commas for the newlines: it
# is the packed lines' bytes + this many (the client's JSON is compact UTF-8, as the lines)
ENVELOPE = len(b'{"requests":[]}') - 1


def anthropic_limits(max_requests: int = 100_000, max_bytes: int = 256 * 10**6) -> FileLimits:
    """Packing limits for a provider taking ``max_requests`` a batch and a create body of
    at most ``max_bytes`` (Anthropic: 100,000 and 256 MB, read as 10^6 bytes: safe under
    either reading)."""
    return FileLimits(max_lines=max_requests, max_bytes=max_bytes - ENVELOPE, one_model=False)


ANTHROPIC_LIMITS = anthropic_limits()
ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                "rate_limit_error": 429, "api_error": 500, "timeout_error": 504,
                "overloaded_error": 529}
ENDPOINT = "/v1/messages"


class AnthropicBatches:
    """``BatchTransport`` over an ``anthropic`` client (sync or async)."""

    provider: ClassVar[str] = "anthropic"

    def __init__(self, client: Any, map_id: str, limits: FileLimits = ANTHROPIC_LIMITS) -> None:
        self.client, self.map_id, self.limits = client, map_id, limits
        self.tag = map_tag(map_id)
        self.call = ClientCalls(client)

    @staticmethod
    def supports(client: Any) -> bool:
        """Whether ``client`` is an ``anthropic`` client with Message Batches."""
        return (any(c.__module__.split(".")[0] == "anthropic" for c in type(client).__mro__)
                and hasattr(getattr(client, "messages", None), "batches"))

    def line(self, endpoint: str, body: Mapping[str, Any], digest: str | None = None) -> Line:
        if "/" + endpoint.strip("/").replace(".", "/").removeprefix("v1/") != "/messages":
            raise ValueError(f"the Anthropic Batch API path takes {ENDPOINT} "
                             f"(messages.create); got {endpoint!r}: call it with "
                             "batch_api=False")
        refuse_streaming(body)
        canonical = canonical_body(body)
        if digest is None or endpoint != ENDPOINT:
            digest = digest_of(ENDPOINT, canonical)
        cid = f"{self.tag}_{digest}"
        data = b"".join((b'{"custom_id":"', cid.encode(), b'","params":', canonical, b"}\n"))
        return Line(cid, ENDPOINT, body.get("model"), data)

    def raw_lines(self, endpoint: str, model: str, digests: list[str], bodies: list[bytes],
                  inputs: list[int]) -> LineBlock | None:
        """``line`` of each request of one endpoint and model, given as its body's canonical
        bytes (the request log's), nothing parsed; None where the bodies must be read
        (another endpoint, a "stream" key anywhere in one)."""
        if endpoint != ENDPOINT or any(b'"stream":' in b for b in bodies):
            return None
        head = f"{self.tag}_"
        form = b"".join((b'{"custom_id":"', head.encode(), b'%s","params":%s}\n'))
        return LineBlock([head + d for d in digests], ENDPOINT, model,
                         [form % line for line in zip(map(str.encode, digests), bodies)],
                         [1] * len(digests))

    def pack(self, lines: Iterable[Line]) -> Iterator[BatchFile]:
        return pack(lines, self.limits)

    async def upload(self, file: BatchFile) -> str:
        return ""

    async def create(self, file: BatchFile, file_id: str,
                     metadata: Mapping[str, str] | None = None) -> BatchInfo:
        requests = [json.loads(line) for line in file.data().splitlines()]
        try:
            batch = await self.call(self.client.messages.batches.create, requests=requests)
        except Exception as exc:
            if http_status(exc) == 429:
                raise QueueLimitError(f"anthropic refused the batch of file {file.tag} "
                                      f"(429): {exc}") from exc
            raise
        return _info(batch)

    async def status(self, batch_id: str) -> BatchInfo:
        return await self.call.about(self.client.messages.batches.retrieve, batch_id,
                                     self.provider, _info)

    async def results(self, info: BatchInfo) -> AsyncIterator[LineResult]:
        url = info.results_url or f"{ENDPOINT}/batches/{info.id}/results"
        data = await self.call(self.client.get, url, cast_to=bytes,
                               options={"headers": {"Accept": "application/binary"}})
        for r in read_results(data, _fast_result, _line_result):
            yield r

    async def cancel(self, batch_id: str) -> BatchInfo:
        return await self.call.about(self.client.messages.batches.cancel, batch_id,
                                     self.provider, _info, over=self.status)

    async def list_batches(self, since: float | None = None) -> list[BatchInfo]:
        found: list[BatchInfo] = []
        batches = self.call.pages(self.client.messages.batches.list, "after_id")
        async with aclosing(batches) as pages:
            async for data in pages:
                for batch in data:
                    info = _info(batch)
                    if since is not None and info.created_at < since:
                        return found
                    mine = await self._owned(info)
                    if mine is not False:
                        found.append(info if mine else _unconfirmed(info))
        return found

    async def _owned(self, info: BatchInfo) -> bool | None:
        """True/False once the batch has ended (its first result's custom_id), None before."""
        if info.state != ENDED:
            return None
        first = await self.call.first(self.client.messages.batches.results, info.id)
        return first is not None and str(first.custom_id).startswith(self.tag + "_")

    async def delete_files(self, info: BatchInfo) -> None:
        try:
            await self.call(self.client.messages.batches.delete, info.id)
        except Exception as exc:
            if http_status(exc) != 404:
                raise


def _info(batch: Any) -> BatchInfo:
    c = batch.request_counts
    failed = c.errored + c.canceled + c.expired
    return BatchInfo(
        id=batch.id, state=ENDED if batch.processing_status == "ended" else RUNNING,
        provider_status=batch.processing_status, total=c.processing + c.succeeded + failed,
        succeeded=c.succeeded, failed=failed, created_at=batch.created_at.timestamp(),
        results_url=batch.results_url)


def _unconfirmed(info: BatchInfo) -> BatchInfo:
    return replace(info, confirmed=False)


# a succeeded line as Anthropic documents it (either spacing), the message its last key
_SUCCEEDED = re.compile(rb'\{"custom_id": ?"([^"\\]*)", ?"result": ?\{"type": ?"succeeded", ?'
                        rb'"message": ?')
_ENDS = (b"}}", b"} }")


def _fast_result(raw: bytes) -> LineResult | None:
    """A succeeded line read without parsing it: the custom_id scanned, the message kept
    as its bytes (None: not in that shape, to be parsed)."""
    m = _SUCCEEDED.match(raw)
    if m is None:
        return None
    for end in _ENDS:
        if raw.endswith(end):
            return LineResult(m.group(1).decode(), SUCCEEDED, 200,
                              raw=raw[m.end():len(raw) - len(end)])
    return None


def _line_result(raw: bytes) -> LineResult:
    obj = json.loads(raw)
    cid, result = obj.get("custom_id"), obj.get("result") or {}
    kind = result.get("type")
    if kind == "succeeded":
        return LineResult(cid, SUCCEEDED, 200, result.get("message"))
    if kind == "expired":
        return LineResult(cid, EXPIRED, message="expired")
    if kind == "canceled":
        return LineResult(cid, CANCELLED, message="canceled")
    body = result.get("error") or {}
    error = body.get("error") or {}
    status = ERROR_STATUS.get(str(error.get("type")), 500)
    kind = kind_of_status(status) if kind == "errored" else SERVER_ERROR
    return LineResult(cid, kind, status, body, str(error.get("message", "")))
