"""A loopback fake of the providers' Batch APIs (OpenAI Files + Batches, Anthropic Message
Batches) and their online endpoints, for tests, benchmarks and examples (no network).

``BatchServer`` starts ``python -m hypernodes_bench.batch_server`` as a subprocess (aiohttp)
on 127.0.0.1 and stops it on exit; the REAL ``openai`` and ``anthropic`` clients work
against it unchanged:

    with BatchServer(delay=0.5) as server:
        oa = openai.OpenAI(base_url=server.base_url, api_key="x")
        an = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="x")
        server.stats(); server.counts(); server.configure(queue_tokens=1000); server.reset()

OpenAI: ``POST /v1/files`` (multipart, streamed to disk), ``GET|DELETE /v1/files/{id}``,
``GET /v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches/{id}``,
``GET /v1/batches?limit=&after=`` (newest first), ``POST /v1/batches/{id}/cancel``; online
``POST /v1/chat/completions``, ``/v1/embeddings``, ``/v1/responses``. Anthropic:
``POST|GET /v1/messages/batches``, ``GET|DELETE /v1/messages/batches/{id}``,
``GET .../{id}/results`` (JSONL), ``POST .../{id}/cancel``; online ``POST /v1/messages``.
A batch answers exactly what the online endpoint answers for the same body
(``batch_answers``); output lines come in a shuffled order. The state and the batches'
life are in ``batch_store``; this module is the HTTP side and the context manager.

Knobs (``BatchServer(**config)``, ``configure(**config)``): ``delay`` (seconds from
in_progress to completion; a batch cancelled or expired midway keeps the answers of the
first ``elapsed/delay`` of its lines), ``validate_delay``, ``expire_after`` (a batch still
running then expires), ``queue_tokens`` (OpenAI's enqueued-token limit per model: a batch
over it is accepted, then ``failed`` with ``token_limit_exceeded``) and ``queue_refuse``
(a gateway: refused at create with 429 instead), ``fail_batches`` (the next N OpenAI batches
fail validation as a whole), ``max_lines``/``max_bytes``/``max_embedding_inputs`` (OpenAI
per file: failed validation with ``errors.data[]``; so do ``duplicate_custom_id``,
``mismatched_model``, ``mismatched_endpoint``, ``invalid_json``),
``anthropic_max_requests``/``anthropic_max_bytes`` (400 / 413 at create),
``price_online``/``price_batch`` (per token); ``hang`` ("upload", "create", "status",
"results": such a request does its work and never answers until the knob changes, after
``hang_after`` let through; ``stats()["hung"]`` counts them: kill tests kill the client there); the online endpoints' ``rpm``/``tpm`` over
``window_seconds`` (429 with ``retry-after`` and OpenAI's ``x-ratelimit-*`` headers past
them, as ``llm_server``; ``headers=False``: no ``x-ratelimit-*`` headers, only 429 +
``retry-after``) and ``latency`` (seconds an online answer takes). Markers in a prompt choose a line's fate
(``batch_answers``). ``stats()`` counts requests, lines by outcome, tokens and cost;
``counts()`` gives, per ``request_key``, ``[received, answered]`` over both paths (answered:
a 2xx or a 4xx other than 429 — what the client keeps); ``complete(ids)`` ends running
batches now, one still validating once it is validated (a test's "the provider has
answered", with no clock).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from hypernodes_bench import batch_answers as answers
from hypernodes_bench.batch_answers import request_key
from hypernodes_bench.batch_store import (
    DEFAULTS,
    HANG_POINTS,
    OPENAI_ENDPOINTS,
    RUNNING,
    Batches,
    BatchRec,
    FileRec,
    Store,
    anthropic_view,
    openai_view,
    page,
)
from hypernodes_bench.loopback import Loopback, serve_until_orphaned

__all__ = ["BatchServer", "DEFAULTS", "request_key"]

_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _oa_error(status: int, message: str, code: str | None = None) -> web.Response:
    return web.json_response(answers.openai_error(status, message, code), status=status)


def _an_error(status: int, message: str) -> web.Response:
    return web.json_response(answers.anthropic_error(status, message), status=status)


class OpenAIRoutes:
    """OpenAI's Files and Batches endpoints."""

    def __init__(self, store: Store, batches: Batches) -> None:
        self.store, self.batches = store, batches

    def add(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/files", self.upload)
        r.add_get("/v1/files/{id}", self.file)
        r.add_delete("/v1/files/{id}", self.delete_file)
        r.add_get("/v1/files/{id}/content", self.content)
        r.add_post("/v1/batches", self.create)
        r.add_get("/v1/batches", self.list)
        r.add_get("/v1/batches/{id}", self.retrieve)
        r.add_post("/v1/batches/{id}/cancel", self.cancel)

    async def upload(self, request: web.Request) -> web.Response:
        """Multipart ``file`` + ``purpose``, the file streamed to disk."""
        fid = self.store.new_id("file-")
        path, name, purpose, size = self.store.folder / f"{fid}.jsonl", "upload.jsonl", "", 0
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if getattr(part, "name", None) == "purpose":
                purpose = (await part.text()).strip()  # type: ignore[union-attr]  # a part of a flat form, never a nested multipart
            elif getattr(part, "name", None) == "file":
                name = part.filename or name  # type: ignore[union-attr]  # a part of a flat form, never a nested multipart
                with path.open("wb") as f:
                    while chunk := await part.read_chunk(1 << 20):  # type: ignore[union-attr]  # a part of a flat form, never a nested multipart
                        f.write(chunk)
                        size += len(chunk)
        if not path.exists():
            return _oa_error(400, "The request has no 'file' part.")
        rec = FileRec(fid, path, name, purpose or "batch", size, int(time.time()))
        self.store.files[fid] = rec
        self.store.stats["files"] += 1
        self.store.stats["file_bytes"] += size
        await self.store.hang("upload")
        return web.json_response(_file_view(rec))

    def _file(self, request: web.Request) -> FileRec | None:
        return self.store.files.get(request.match_info["id"])

    async def file(self, request: web.Request) -> web.Response:
        rec = self._file(request)
        if rec is None:
            return _oa_error(404, f"No such File object: {request.match_info['id']}")
        return web.json_response(_file_view(rec))

    async def content(self, request: web.Request) -> web.StreamResponse:
        rec = self._file(request)
        if rec is None:
            return _oa_error(404, f"No such File object: {request.match_info['id']}")
        await self.store.hang("results")
        return web.FileResponse(rec.path, headers={"Content-Type": "application/octet-stream"})

    async def delete_file(self, request: web.Request) -> web.Response:
        rec = self.store.files.pop(request.match_info["id"], None)
        if rec is None:
            return _oa_error(404, f"No such File object: {request.match_info['id']}")
        in_use = any(b.input_path == rec.path and b.status in RUNNING
                     for b in self.store.batches.values())
        if not in_use:
            rec.path.unlink(missing_ok=True)
        self.store.stats["files_deleted"] += 1
        return web.json_response({"id": rec.id, "object": "file", "deleted": True})

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        problem = self._create_problem(body)
        if problem:
            return _oa_error(400, problem)
        file = self.store.files[body["input_file_id"]]
        rec = BatchRec(self.store.new_id("batch_"), "openai", body["endpoint"], file.path,
                       time.time(), input_file_id=file.id, metadata=body.get("metadata") or {})
        scanned = None
        if self.store.config["queue_refuse"]:
            scanned = await self.batches.scan(rec)
            rec.model, rec.tokens = scanned.model, scanned.tokens
            if not scanned.errors and self.batches.over_queue(rec):
                self.store.stats["queue_refused"] += 1
                return _oa_error(429, self.batches.queue_message(rec), "token_limit_exceeded")
        self.batches.add(rec)
        self.batches.spawn(self.batches.validate(rec, scanned))
        await self.store.hang("create")
        return web.json_response(openai_view(rec))

    def _create_problem(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return "The body must be a JSON object."
        if body.get("input_file_id") not in self.store.files:
            return f"No such File object: {body.get('input_file_id')}"
        if body.get("endpoint") not in OPENAI_ENDPOINTS:
            return (f"Invalid endpoint {body.get('endpoint')!r}: one of "
                    f"{', '.join(OPENAI_ENDPOINTS)}.")
        if body.get("completion_window") != "24h":
            return "completion_window must be '24h'."
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict) or len(meta) > 16 or any(
                len(str(k)) > 64 or not isinstance(v, str) or len(v) > 512
                for k, v in meta.items()):
            return ("metadata: at most 16 pairs, keys of at most 64 characters, string values "
                    "of at most 512.")
        return None

    def _batch(self, request: web.Request) -> BatchRec | None:
        rec = self.store.batches.get(request.match_info["id"])
        return rec if rec is not None and rec.provider == "openai" else None

    async def retrieve(self, request: web.Request) -> web.Response:
        rec = self._batch(request)
        if rec is None:
            return _oa_error(404, f"No batch found with id '{request.match_info['id']}'.")
        await self.store.hang("status")
        return web.json_response(openai_view(rec))

    async def cancel(self, request: web.Request) -> web.Response:
        rec = self._batch(request)
        if rec is None:
            return _oa_error(404, f"No batch found with id '{request.match_info['id']}'.")
        if not self.batches.cancel(rec):
            return _oa_error(409, f"Cannot cancel a batch with status {rec.status!r}.")
        return web.json_response(openai_view(rec))

    async def list(self, request: web.Request) -> web.Response:
        q = request.query
        limit = max(1, min(100, int(q.get("limit", 20))))
        ids = page(self.store.order["openai"], q.get("after"), None, limit + 1)
        data = [openai_view(self.store.batches[i]) for i in ids[:limit]]
        return web.json_response({"object": "list", "data": data,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None,
                                  "has_more": len(ids) > limit})


def _file_view(rec: FileRec) -> dict[str, Any]:
    return {"id": rec.id, "object": "file", "bytes": rec.bytes, "created_at": rec.created_at,
            "filename": rec.filename, "purpose": rec.purpose, "status": "processed",
            "expires_at": None, "status_details": None}


class AnthropicRoutes:
    """Anthropic's Message Batches endpoints."""

    def __init__(self, store: Store, batches: Batches) -> None:
        self.store, self.batches = store, batches

    def add(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/messages/batches", self.create)
        r.add_get("/v1/messages/batches", self.list)
        r.add_get("/v1/messages/batches/{id}", self.retrieve)
        r.add_delete("/v1/messages/batches/{id}", self.delete)
        r.add_post("/v1/messages/batches/{id}/cancel", self.cancel)
        r.add_get("/v1/messages/batches/{id}/results", self.results)

    def base(self) -> str:
        return f"http://127.0.0.1:{self.store.port}"

    async def create(self, request: web.Request) -> web.Response:
        """``{requests: [{custom_id, params}]}``, streamed to disk, then checked."""
        bid = self.store.new_id("msgbatch_")
        raw, path = self.store.folder / f"{bid}.json", self.store.folder / f"{bid}-input.jsonl"
        size, limit = 0, self.store.config["anthropic_max_bytes"]
        with raw.open("wb") as f:
            async for chunk in request.content.iter_chunked(1 << 20):
                size += len(chunk)
                if size <= limit:
                    f.write(chunk)
        if size > limit:
            raw.unlink()
            return _an_error(413, f"Request exceeds the maximum size of {limit} bytes.")
        problem = await asyncio.to_thread(
            _anthropic_input, raw, path, self.store.config["anthropic_max_requests"])
        raw.unlink()
        if problem:
            path.unlink(missing_ok=True)
            return _an_error(400, problem)
        rec = BatchRec(bid, "anthropic", "/v1/messages", path, time.time())
        sc = await self.batches.scan(rec)
        self.batches.add(rec)
        self.batches.run(rec, sc)
        await self.store.hang("create")
        return web.json_response(anthropic_view(rec, self.base()))

    def _batch(self, request: web.Request) -> BatchRec | None:
        rec = self.store.batches.get(request.match_info["id"])
        return rec if rec is not None and rec.provider == "anthropic" else None

    def _missing(self, request: web.Request) -> web.Response:
        return _an_error(404, f"No message batch with id {request.match_info['id']!r}.")

    async def retrieve(self, request: web.Request) -> web.Response:
        rec = self._batch(request)
        if rec is None:
            return self._missing(request)
        await self.store.hang("status")
        return web.json_response(anthropic_view(rec, self.base()))

    async def cancel(self, request: web.Request) -> web.Response:
        rec = self._batch(request)
        if rec is None:
            return self._missing(request)
        self.batches.cancel(rec)
        return web.json_response(anthropic_view(rec, self.base()))

    async def delete(self, request: web.Request) -> web.Response:
        rec = self._batch(request)
        if rec is None:
            return self._missing(request)
        if rec.status != "ended":
            return _an_error(400, "Message batches can only be deleted once they have "
                                  "finished processing; cancel it first.")
        del self.store.batches[rec.id]
        self.store.order["anthropic"].remove(rec.id)
        for path in (rec.input_path, rec.results_path):
            if path is not None:
                path.unlink(missing_ok=True)
        return web.json_response({"id": rec.id, "type": "message_batch_deleted"})

    async def results(self, request: web.Request) -> web.StreamResponse:
        rec = self._batch(request)
        if rec is None:
            return self._missing(request)
        if rec.status != "ended" or rec.results_path is None:
            return _an_error(400, f"Message batch {rec.id} has not finished processing.")
        await self.store.hang("results")
        if not rec.results_path.exists():
            return web.Response(body=b"", content_type="application/binary")
        return web.FileResponse(rec.results_path,
                                headers={"Content-Type": "application/binary"})

    async def list(self, request: web.Request) -> web.Response:
        q = request.query
        limit = max(1, min(1000, int(q.get("limit", 20))))
        order = self.store.order["anthropic"]
        ids = page(order, q.get("after_id"), q.get("before_id"), limit + 1)
        more = len(ids) > limit
        ids = ids[-limit:] if q.get("before_id") else ids[:limit]
        data = [anthropic_view(self.store.batches[i], self.base()) for i in ids]
        return web.json_response({"data": data, "has_more": more,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None})


def _anthropic_input(raw: Path, out: Path, max_requests: int) -> str | None:
    """Check a create body and write its requests as JSONL ``{custom_id, params}`` lines;
    the problem (Anthropic's 400 message) or None."""
    try:
        with raw.open("rb") as f:
            requests = json.load(f).get("requests")
    except (ValueError, AttributeError):
        return "The request body is not a JSON object."
    if not isinstance(requests, list) or not requests:
        return "requests: at least one request is required."
    if len(requests) > max_requests:
        return f"requests: at most {max_requests} requests a batch, got {len(requests)}."
    seen: set[str] = set()
    with out.open("wb") as f:
        for i, req in enumerate(requests):
            cid = req.get("custom_id") if isinstance(req, dict) else None
            if not isinstance(cid, str) or not _CUSTOM_ID.match(cid):
                return (f"requests.{i}.custom_id: {cid!r} must be 1-64 characters of "
                        "[a-zA-Z0-9_-].")
            if cid in seen:
                return f"requests.{i}.custom_id: {cid!r} is not unique in the batch."
            seen.add(cid)
            line = {"custom_id": cid, "params": req.get("params")}
            f.write(answers.COMPACT.encode(line).encode() + b"\n")
    return None


class OnlineRoutes:
    """The online endpoints: the same answer as a batch line, billed at the online price."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, app: web.Application) -> None:
        for endpoint in ("/v1/chat/completions", "/v1/embeddings", "/v1/responses",
                         "/v1/messages"):
            app.router.add_post(endpoint, self.handler(endpoint))

    def handler(self, endpoint: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            return await self.answer(endpoint, await request.read())
        return handle

    async def answer(self, endpoint: str, raw: bytes) -> web.Response:
        store, anthropic = self.store, endpoint == "/v1/messages"
        body = json.loads(raw)
        key = answers.key_int(endpoint, body)
        seen = store.received.get(key, 0) + 1
        store.received[key] = seen
        store.stats["online_requests"] += 1
        billed = answers.tokens(endpoint, body)
        wait = store.window.admit(sum(billed))
        headers = store.window.headers() if store.config["headers"] else {}
        if wait > 0:
            store.stats["online_rate_limited"] += 1
            headers["retry-after"] = f"{math.ceil(wait * 1000) / 1000:g}"
            return self.error(anthropic, 429, "Rate limit reached; retry later", headers)
        if store.config["latency"]:
            await asyncio.sleep(float(store.config["latency"]))
        fate = answers.marker_fate(raw, seen, batch=False)
        if fate is not None:
            status = fate[1]
            if status < 500 and status != 429:
                store.answered[key] = store.answered.get(key, 0) + 1
            store.stats["online_errors"] += 1
            return self.error(anthropic, status, f"fake provider: status {status} for this "
                              "request", headers)
        store.answered[key] = store.answered.get(key, 0) + 1
        store.stats["online_ok"] += 1
        store.bill(*billed, "online")
        out = answers.answer(endpoint, body, f"{key:016x}", billed)
        return web.json_response(out, headers=headers)

    @staticmethod
    def error(anthropic: bool, status: int, message: str,
              headers: dict[str, str]) -> web.Response:
        body = (answers.anthropic_error(status, message) if anthropic
                else answers.openai_error(status, message))
        return web.json_response(body, status=status, headers=headers)


def _admin(app: web.Application, store: Store, batches: Batches) -> None:
    async def complete(request: web.Request) -> web.Response:
        ids = (await request.json()).get("ids")
        asked = [rec for rec in store.batches.values() if ids is None or rec.id in ids]
        while any(rec.status == "validating" for rec in asked):  # a batch just created
            await asyncio.sleep(0.005)  # is validated first (``validate_delay``)
        done = [rec for rec in asked if rec.status == "in_progress"]
        for rec in done:
            batches.end(rec, "completed")
        while any(rec.status in RUNNING for rec in done):  # until their results are written
            await asyncio.sleep(0.005)
        return web.json_response({"completed": [rec.id for rec in done]})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(store.summary())

    async def counts(request: web.Request) -> web.Response:
        keys = set(store.received) | set(store.answered)
        return web.json_response({f"{k:016x}": [store.received.get(k, 0),
                                                store.answered.get(k, 0)] for k in keys})

    async def reset(request: web.Request) -> web.Response:
        await batches.settle()  # a batch ending now is counted before, not after
        store.reset()
        return web.json_response({"ok": True})

    async def config(request: web.Request) -> web.Response:
        if request.method == "POST":
            changes = await request.json()
            unknown = set(changes) - set(DEFAULTS)
            if unknown:
                return web.json_response({"error": f"unknown knobs {sorted(unknown)}"},
                                         status=400)
            if "hang" in changes and changes["hang"] not in (None, *HANG_POINTS):
                return web.json_response({"error": f"hang: one of {HANG_POINTS}"}, status=400)
            store.config.update(changes)
            if "hang" in changes:
                store.release()
            if changes.keys() & {"rpm", "tpm", "window_seconds"}:
                store.window = store.new_window()
        return web.json_response(store.config)

    app.router.add_get("/stats", stats)
    app.router.add_get("/counts", counts)
    app.router.add_post("/reset", reset)
    app.router.add_post("/complete", complete)
    app.router.add_get("/config", config)
    app.router.add_post("/config", config)


def _serve(args: argparse.Namespace) -> None:
    # stop() sends SIGINT: a server started from a shell that ignores it (a background job,
    # nohup) would otherwise serve on until stop() kills it 10 s later, its folder left
    signal.signal(signal.SIGINT, signal.default_int_handler)
    folder = Path(tempfile.mkdtemp(prefix="hn-batch-server-"))
    store = Store(folder, json.loads(args.config))
    batches = Batches(store)
    app = web.Application(client_max_size=64 * 2**20)
    OpenAIRoutes(store, batches).add(app)
    AnthropicRoutes(store, batches).add(app)
    OnlineRoutes(store).add(app)
    _admin(app, store, batches)

    def on_port(port: int) -> None:
        store.port = port

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=3600)
        await serve_until_orphaned(runner, args.port, on_port)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class BatchServer(Loopback):
    """The fake provider as a subprocess on 127.0.0.1 (a context manager); ``config`` are
    the knobs of the module docstring."""

    module, what = "hypernodes_bench.batch_server", "the fake batch provider"
    stop_signal = signal.SIGINT  # the server removes its folder

    def __init__(self, **config: Any) -> None:
        unknown = set(config) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"BatchServer: unknown knobs {sorted(unknown)}; "
                            f"known: {sorted(DEFAULTS)}")
        self.config = config
        self.proc = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """What ``openai.OpenAI(base_url=...)`` takes."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """What ``anthropic.Anthropic(base_url=...)`` takes."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> BatchServer:
        self._launch(["--config", json.dumps(self.config)])
        return self

    def stats(self) -> dict[str, Any]:
        """Counters: files, batches, lines by outcome, online requests, tokens, cost,
        ``distinct`` requests, ``answered_max`` / ``answered_twice``..."""
        return self.call("/stats")

    def counts(self) -> dict[str, list[int]]:
        """Per ``request_key``: ``[received, answered]`` over the batch and online paths."""
        return self.call("/counts")

    def configure(self, **config: Any) -> dict[str, Any]:
        """Change knobs while running; returns the whole configuration."""
        return self.call("/config", config)

    def reset(self) -> None:
        """Zero the counters (files and batches stay) once the batches ending now have
        written their results."""
        self.call("/reset", {})

    def complete(self, ids: list[str] | None = None) -> list[str]:
        """End the running batches (``ids``, or all) now, every line answered, as if their
        ``delay`` had passed; returns once they have ended, with their ids."""
        return list(self.call("/complete", {"ids": ids})["completed"])

    def __enter__(self) -> BatchServer:
        return self.start()


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--config", default="{}", help="the knobs, as a JSON object")
    return p.parse_args(argv)


if __name__ == "__main__":
    _serve(_parse())
