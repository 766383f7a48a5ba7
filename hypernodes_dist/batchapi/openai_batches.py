"""The OpenAI Batch API (Files + Batches) as a ``BatchTransport``: OpenAI and every
OpenAI-compatible server reached through the ``openai`` client (Azure OpenAI, Together,
Groq, vLLM), sync ``OpenAI`` or async ``AsyncOpenAI``.

Endpoints: ``/v1/chat/completions``, ``/v1/embeddings``, ``/v1/responses``. A file holds at
most 50,000 lines and 200 MB, one model and one endpoint (embeddings: 50,000 inputs in all).
Each batch carries ``metadata={"hn_map": <map id>, "hn_file": <file tag>}``;
``list_batches`` pages the provider's batch list (newest first, stopping before ``since``)
and keeps those whose ``hn_map`` is this map's: a batch created but never recorded (a
crash between create and the ledger) is found that way.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import aclosing
from typing import Any, ClassVar

from hypernodes_dist.batchapi.clientcalls import ClientCalls, http_status
from hypernodes_dist.batchapi.identity import canonical_body, digest_of, map_tag
from hypernodes_dist.batchapi.packing import pack
from hypernodes_dist.batchapi.transport import (
    CANCELLED,
    ENDED,
    EXPIRED,
    FAILED,
    RUNNING,
    SERVER_ERROR,
    SUCCEEDED,
    AnsweredLines,
    BatchError,
    BatchFile,
    BatchInfo,
    FileLimits,
    Line,
    LineBlock,
    LineResult,
    QueueLimitError,
    kind_of_status,
    read_at_once,
    read_results,
    refuse_streaming,
)

__all__ = ["OpenAIBatches", "OPENAI_LIMITS", "OPENAI_ENDPOINTS"]

# 200 MB read as 10^6 bytes: within the limit under either reading of "MB"
OPENAI_LIMITS = FileLimits(max_lines=50_000, max_bytes=200 * 10**6, one_model=True,
                           max_inputs=50_000)
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses")
_STATES = {"validating": RUNNING, "in_progress": RUNNING, "finalizing": RUNNING,
           "cancelling": RUNNING, "completed": ENDED, "expired": ENDED, "cancelled": ENDED,
           "failed": FAILED}
_LINE_ERRORS = {"batch_expired": EXPIRED, "batch_cancelled": CANCELLED}


def _endpoint(endpoint: str) -> str:
    if endpoint in OPENAI_ENDPOINTS:
        return endpoint
    path = "/" + endpoint.strip("/").replace(".", "/")
    path = path if path.startswith("/v1/") else "/v1" + path
    if path not in OPENAI_ENDPOINTS:
        raise ValueError(f"the OpenAI Batch API path takes {', '.join(OPENAI_ENDPOINTS)}; "
                         f"got {endpoint!r}: call it with batch_api=False")
    return path


class OpenAIBatches:
    """``BatchTransport`` over an ``openai`` client (sync or async)."""

    provider: ClassVar[str] = "openai"

    def __init__(self, client: Any, map_id: str, limits: FileLimits = OPENAI_LIMITS) -> None:
        self.client, self.map_id, self.limits = client, map_id, limits
        self.tag = map_tag(map_id)
        self.meta_map = map_id if len(map_id) <= 512 else self.tag
        self.call = ClientCalls(client)

    @staticmethod
    def supports(client: Any) -> bool:
        """Whether ``client`` is an ``openai`` client with Files and Batches."""
        return (any(c.__module__.split(".")[0] == "openai" for c in type(client).__mro__)
                and hasattr(client, "batches") and hasattr(client, "files"))

    def line(self, endpoint: str, body: Mapping[str, Any], digest: str | None = None) -> Line:
        url = _endpoint(endpoint)
        refuse_streaming(body)
        canonical = canonical_body(body)
        if digest is None or url != endpoint:
            digest = digest_of(url, canonical)
        cid = f"{self.tag}_{digest}"
        data = b"".join((b'{"custom_id":"', cid.encode(), b'","method":"POST","url":"',
                         url.encode(), b'","body":', canonical, b"}\n"))
        got = body.get("input") if url == "/v1/embeddings" else None
        inputs = len(got) if isinstance(got, list) else 1
        return Line(cid, url, body.get("model"), data, inputs)

    def raw_lines(self, endpoint: str, model: str, digests: list[str], bodies: list[bytes],
                  inputs: list[int]) -> LineBlock | None:
        """``line`` of each request of one endpoint and model, given as its body's canonical
        bytes (the request log's), nothing parsed; None where the bodies must be read (an
        endpoint to normalize, a "stream" key anywhere in one)."""
        if endpoint not in OPENAI_ENDPOINTS or any(b'"stream":' in b for b in bodies):
            return None
        head = f"{self.tag}_"
        form = b"".join((b'{"custom_id":"', head.encode(), b'%s","method":"POST","url":"',
                         endpoint.encode(), b'","body":%s}\n'))
        return LineBlock([head + d for d in digests], endpoint, model,
                         [form % line for line in zip(map(str.encode, digests), bodies)],
                         inputs if endpoint == "/v1/embeddings" else [1] * len(digests))

    def pack(self, lines: Iterable[Line]) -> Iterator[BatchFile]:
        return pack(lines, self.limits)

    async def upload(self, file: BatchFile) -> str:
        obj = await self.call(self.client.files.create,
                              file=(f"hn-{file.tag}.jsonl", file.data(), "application/jsonl"),
                              purpose="batch")
        return str(obj.id)

    async def create(self, file: BatchFile, file_id: str,
                     metadata: Mapping[str, str] | None = None) -> BatchInfo:
        meta = {"hn_map": self.meta_map, "hn_file": file.tag, **(metadata or {})}
        try:
            batch = await self.call(self.client.batches.create, input_file_id=file_id,
                                    endpoint=file.endpoint, completion_window="24h",
                                    metadata=meta)
        except Exception as exc:
            if http_status(exc) == 429:
                raise QueueLimitError(f"openai refused the batch of file {file_id} "
                                      f"(429, the queue limit): {exc}") from exc
            raise
        return _info(batch)

    async def status(self, batch_id: str) -> BatchInfo:
        return await self.call.about(self.client.batches.retrieve, batch_id, self.provider, _info)

    async def _contents(self, info: BatchInfo) -> AsyncIterator[bytes]:
        """The batch's output and error files' bytes (those it has)."""
        for file_id in (info.output_file_id, info.error_file_id):
            if file_id:
                yield (await self.call(self.client.files.content, file_id)).content

    async def results(self, info: BatchInfo) -> AsyncIterator[LineResult]:
        async for data in self._contents(info):
            for r in read_results(data, _fast_result, _line_result):
                yield r

    async def results_at_once(self, info: BatchInfo
                              ) -> AsyncIterator[LineResult | AnsweredLines]:
        """``results``, a file whose every line succeeded in the documented shape given as
        one ``AnsweredLines`` (the driver writes it as it is)."""
        async for data in self._contents(info):
            block = read_at_once(data, _fast_result, _line_result, _AT_ONCE)
            if block is not None:
                yield block
                continue
            for r in read_results(data, _fast_result, _line_result):
                yield r

    async def cancel(self, batch_id: str) -> BatchInfo:
        return await self.call.about(self.client.batches.cancel, batch_id, self.provider, _info,
                                     over=self.status)  # a 400/409: already over

    async def list_batches(self, since: float | None = None) -> list[BatchInfo]:
        found: list[BatchInfo] = []
        async with aclosing(self.call.pages(self.client.batches.list, "after")) as pages:
            async for data in pages:
                for batch in data:
                    if since is not None and batch.created_at < since:
                        return found
                    if (batch.metadata or {}).get("hn_map") == self.meta_map:
                        found.append(_info(batch))
        return found

    async def delete_files(self, info: BatchInfo) -> None:
        for file_id in (info.input_file_id, info.output_file_id, info.error_file_id):
            if not file_id:
                continue
            try:
                await self.call(self.client.files.delete, file_id)
            except Exception as exc:
                if http_status(exc) != 404:
                    raise


def _info(batch: Any) -> BatchInfo:
    counts = batch.request_counts
    errors = tuple(BatchError(e.code, e.message or "", e.line)
                   for e in ((batch.errors.data or []) if batch.errors else []))
    total = counts.total if counts else 0
    succeeded = counts.completed if counts else 0
    return BatchInfo(
        id=batch.id, state=_STATES.get(batch.status, RUNNING), provider_status=batch.status,
        total=total, succeeded=succeeded, failed=counts.failed if counts else 0,
        errors=errors, metadata=dict(batch.metadata or {}), created_at=float(batch.created_at),
        input_file_id=batch.input_file_id, output_file_id=batch.output_file_id,
        error_file_id=batch.error_file_id)


# a succeeded line as OpenAI documents it (either spacing), its body the last key of "response"
_SUCCEEDED = re.compile(rb'\{"id": ?"[^"\\]*", ?"custom_id": ?"([^"\\]*)", ?"response": ?\{'
                        rb'"status_code": ?(2\d\d), ?"request_id": ?(?:"[^"\\]*"|null), ?"body": ?')
_ENDS = (b'}, "error": null}', b'},"error":null}')
# ``_SUCCEEDED`` to one of ``_ENDS``, a line of a file (``read_at_once``): the custom_id's
# digest (after its tag), the status, the body (``_fast_result``'s reading of that line)
_AT_ONCE = re.compile(rb'^\{"id": ?"[^"\\\n]*", ?"custom_id": ?"[^"\\_\n]*_([^"\\\n]*)", ?'
                      rb'"response": ?\{"status_code": ?(2\d\d), ?"request_id": ?'
                      rb'(?:"[^"\\\n]*"|null), ?"body": ?(.*)(?:\}, "error": null\}|'
                      rb'\},"error":null\})$', re.M)


def _fast_result(raw: bytes) -> LineResult | None:
    """A succeeded line read without parsing it: custom_id and status scanned, the body
    kept as its bytes (None: not in that shape, to be parsed)."""
    m = _SUCCEEDED.match(raw)
    if m is None:
        return None
    for end in _ENDS:
        if raw.endswith(end):
            return LineResult(m.group(1).decode(), SUCCEEDED, int(m.group(2)),
                              raw=raw[m.end():len(raw) - len(end)])
    return None


def _line_result(raw: bytes) -> LineResult:
    kept = _answered(raw)
    if kept is not None:
        return kept
    obj = json.loads(raw)
    cid, response, error = obj.get("custom_id"), obj.get("response"), obj.get("error")
    if response:
        status, body = int(response.get("status_code") or 0), response.get("body")
        err = body.get("error") if isinstance(body, dict) else None
        message = (err or {}).get("message", "") if isinstance(err, dict) else ""
        return LineResult(cid, kind_of_status(status), status, body, message)
    error = error or {}
    return LineResult(cid, _LINE_ERRORS.get(str(error.get("code")), SERVER_ERROR), None, None,
                      f"{error.get('code')}: {error.get('message', '')}")


_BODY = '"body":'
_MARK = "\x00hn-body"  # what the body is replaced with to parse the rest of a line
_SCAN = json.JSONDecoder()


def _answered(raw: bytes) -> LineResult | None:
    """A 2xx line with its body as the JSON bytes it came as (the answer store keeps them
    as they are: parsed once here, never encoded again), or None: parse the line whole.
    The first ``"body":`` of a line is a key (quotes inside strings are escaped); the rest
    of the line, with a marker in that body's place, must put the marker at
    ``response.body`` (else: None)."""
    text = raw.decode()
    at = text.find(_BODY)
    if at < 0:
        return None
    start = at + len(_BODY)
    while start < len(text) and text[start] in " \t\r\n":
        start += 1
    try:
        end = _SCAN.raw_decode(text, start)[1]
        obj = json.loads(text[:start] + json.dumps(_MARK) + text[end:])
    except ValueError:
        return None
    response = obj.get("response") if isinstance(obj, dict) else None
    if not isinstance(response, dict) or response.get("body") != _MARK:
        return None
    status = response.get("status_code")
    if type(status) is not int or not 200 <= status < 300:
        return None
    return LineResult(obj.get("custom_id"), SUCCEEDED, status, raw=text[start:end].encode())
