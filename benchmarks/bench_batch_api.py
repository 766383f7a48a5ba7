"""Provider Batch APIs at 1,000,000 rows (issue 32): Parquet in -> batch path -> Parquet out,
beside the online path of the same job under the same server's token-rate limit, in one run.

One loopback fake provider (``hypernodes_bench.batch_server.BatchServer``: OpenAI Files +
Batches, a batch answered ``--delay`` seconds after it starts; its online endpoint limited
to ``RPM`` requests and ``TPM`` tokens a minute, 429 + Retry-After past them; price 1e-6 a
token online, half in a batch) serves every part; each part runs in its own process (its
peak RSS is its own ``ru_maxrss``), with the real ``openai.AsyncOpenAI``:

- ``driver``: the batch path below the call layer, on every row: read the Parquet rows,
  record each row's request as a worker does (``RequestLog``; the answer store asked
  first), then the driver's loop (``BatchLoop``: read the request log, pack 50,000-line
  files, upload, create, poll with back-off, download, write the answers), then finish
  each row from its answer (``AnswerStore.get``) and write Parquet out.
- ``client``: what the node's own ``AsyncOpenAI`` call costs on that path (the recording
  client: the call recorded, then replayed into a ``ChatCompletion``), over ``--client-rows``
  rows, scaled to ``--rows``: the online path pays the same client per row.
- ``graph``: ``graph.map(source=..., into=...)`` with a ``@node(batch_api=True)`` (the
  whole call layer), when this tree has it.
- ``online``: the same job online (``graph.map(source=..., into=...)``, the node declaring
  the server's limits) over ``--online-rows`` rows; its time and cost scaled to ``--rows``
  (the online path is bound by the rate limit: a million rows would take hours).

Reported per part: rows, requests at the server (and the most times one request was
received: 1 = none sent twice), cost at the server's price table, wall seconds, OUR OWN
TIME (the process's CPU seconds, user + system, all threads, from the part's start: everything
but waiting for the provider; the interpreter's start-up and imports apart, and the bench's
own check of the labels written, ``check_cpu_s``, apart), peak RSS, and for ``driver`` where the time goes (CPU seconds per phase).

Run: ``.venv/bin/python benchmarks/bench_batch_api.py [--rows 1000000] [--delay 30]
[--online-rows 6000] [--parts driver,client,graph,online]``; ``--rows 20000`` is the quick
check. Prints the tables and writes ``benchmarks/results/batch_api.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pyarrow as pa
import pyarrow.parquet as pq

from hypernodes_bench.batch_server import BatchServer
from hypernodes_bench.llm_server import label_of
from hypernodes_bench.tables import machine, print_table, write_results
from hypernodes_dist import DiskCache, Graph, meter, node
from hypernodes_dist import resource as hn_resource
from hypernodes_dist.batchapi import transport_for
from hypernodes_dist.batchapi.identity import Canonical, canonical_body, digest_of
from hypernodes_dist.batchapi.recording import BatchWait, recording_client
from hypernodes_dist.batchapi.store import AnswerStore, RequestLog
from hypernodes_dist.run.batchloop import Backoff, BatchLoop

RESULTS = Path(__file__).parent / "results"
ENDPOINT = "/v1/chat/completions"
MODEL = "gpt-4o-mini"
MAX_TOKENS = 5
WINDOW = 6.0           # the server's online window, seconds
RPM = 5_000            # online requests a minute (500 a window)
TPM = 2_000_000        # online tokens a minute
COLUMNS = ["part", "rows", "requests", "received_max", "cost_usd", "wall_s", "own_cpu_s",
           "own_s_per_1M", "peak_rss_mb"]
PHASE_COLUMNS = ["phase", "cpu_s", "s_per_1M", "share"]
CHUNK = 1000           # result lines timed at once


def text_of(i: int) -> str:
    return f"review {i}: " + "fine " * (i % 9) + "value"


def body_of(text: str) -> dict[str, Any]:
    """The request a row makes (what the node sends through the client)."""
    return {"model": MODEL, "messages": [{"role": "user", "content": text}],
            "max_tokens": MAX_TOKENS}


def write_source(path: Path, rows: int, chunk: int = 100_000) -> None:
    """``rows`` rows (``id``, ``text``) as one Parquet file."""
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    with pq.ParquetWriter(path, schema) as w:
        for start in range(0, rows, chunk):
            ids = range(start, min(rows, start + chunk))
            w.write_table(pa.table([pa.array(ids, pa.int64()),
                                    pa.array([text_of(i) for i in ids])], schema=schema))


def texts(path: Path) -> Iterator[list[str]]:
    """The source's ``text`` column, a record batch at a time."""
    for batch in pq.ParquetFile(path).iter_batches(batch_size=50_000, columns=["text"]):
        yield batch.column(0).to_pylist()


# -- where the time goes: CPU seconds (this thread's) per phase ---------------------------
class Phases:
    """CPU seconds by phase (``time.thread_time``: the thread's own, not its waits)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.cpu[phase] = self.cpu.get(phase, 0.0) + seconds


class TimedTransport:
    """A ``BatchTransport`` that counts the CPU its provider calls take, by phase."""

    def __init__(self, inner: Any, phases: Phases) -> None:
        self.inner, self.phases = inner, phases
        self.provider, self.limits, self.map_id = inner.provider, inner.limits, inner.map_id

    def line(self, endpoint: str, body: Any, digest: str | None = None) -> Any:
        # (a tree whose driver passes no digest has transports without the parameter)
        return self.inner.line(endpoint, body) if digest is None else \
            self.inner.line(endpoint, body, digest)

    def raw_lines(self, *args: Any) -> Any:
        """Lines made from the log's bytes where the transport makes them (None: ``line``)."""
        raw_lines = getattr(self.inner, "raw_lines", None)
        return None if raw_lines is None else raw_lines(*args)

    def pack(self, lines: Any) -> Any:
        return self.inner.pack(lines)

    async def _timed(self, phase: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        try:
            return await call(*args, **kwargs)
        finally:
            self.phases.add(phase, time.thread_time() - t)

    async def upload(self, file: Any) -> str:
        return await self._timed("upload", self.inner.upload, file)

    async def create(self, file: Any, file_id: str, metadata: Any = None) -> Any:
        return await self._timed("create + poll", self.inner.create, file, file_id, metadata)

    async def status(self, batch_id: str) -> Any:
        return await self._timed("create + poll", self.inner.status, batch_id)

    def results(self, info: Any) -> Any:
        return self._timed_lines(self.inner.results(info))

    def results_at_once(self, info: Any) -> Any:
        """The driver's way to read where the transport has it (a file of succeeded lines
        as one block; a tree before it reads line by line)."""
        return self._timed_lines(getattr(self.inner, "results_at_once", self.inner.results)(info))

    async def _timed_lines(self, lines: Any) -> Any:
        """The lines read ``CHUNK`` at a time, each chunk timed (a clock read per line
        would cost more than some phases measured)."""
        it, more = lines.__aiter__(), True
        while more:
            t, chunk = time.thread_time(), list[Any]()
            try:
                while len(chunk) < CHUNK:
                    chunk.append(await it.__anext__())
            except StopAsyncIteration:
                more = False
            self.phases.add("download + parse", time.thread_time() - t)
            for r in chunk:
                yield r

    async def cancel(self, batch_id: str) -> Any:
        return await self.inner.cancel(batch_id)

    async def list_batches(self, since: float | None = None) -> Any:
        return await self.inner.list_batches(since)

    async def delete_files(self, info: Any) -> None:
        await self._timed("delete files", self.inner.delete_files, info)


def _time_driver(loop: BatchLoop, phases: Phases) -> None:
    """Count each driver's submit (less upload / create) and download (less parsing)."""
    for d in loop.drivers.values():
        # the loop submits through submit_log (the log read a block at a time) where it exists
        name = "submit_log" if hasattr(d, "submit_log") else "submit"
        submit, download = getattr(d, name), d._download

        async def timed_submit(*args: Any, submit: Any = submit) -> int:
            t, before = time.thread_time(), _sum(phases, "upload", "create + poll")
            try:
                return await submit(*args)
            finally:
                spent = time.thread_time() - t
                phases.add("read log + pack", spent - (_sum(phases, "upload", "create + poll")
                                                      - before))

        async def timed_download(state: Any, info: Any, download: Any = download) -> None:
            t, before = time.thread_time(), _sum(phases, "download + parse", "delete files")
            try:
                await download(state, info)
            finally:
                spent = time.thread_time() - t
                phases.add("write answers", spent - (_sum(phases, "download + parse",
                                                          "delete files") - before))

        setattr(d, name, timed_submit)
        d._download = timed_download  # type: ignore[method-assign]


def _sum(phases: Phases, *names: str) -> float:
    return sum(phases.cpu.get(n, 0.0) for n in names)


# -- the batch path below the call layer --------------------------------------------------
class Rows:
    """The rows of the driver part: each round asks the answers of the rows not done, records
    the requests of the others (as a worker's recording client does) and writes the rows it
    finished as one Parquet part."""

    def __init__(self, src: Path, out: Path, folder: Path, record: Any, phases: Phases) -> None:
        self.src, self.out, self.folder, self.record, self.phases = src, out, folder, record, phases
        self.done = bytearray(pq.ParquetFile(src).metadata.num_rows)
        self.rounds = 0

    def __call__(self) -> int:
        t = time.thread_time()
        answers, waiting, start = AnswerStore(self.folder), 0, 0
        finished: dict[str, list[Any]] = {"id": [], "label": []}
        for chunk in texts(self.src):
            for i, text in enumerate(chunk, start):
                if self.done[i]:
                    continue
                # as the recording client does: the body encoded once, its answer's body
                # read as bytes (``raw``) and parsed by the client
                body = body_of(text)
                canonical = canonical_body(body)
                answer = answers.raw(digest_of(ENDPOINT, canonical))
                if answer is None:
                    self.record(ENDPOINT, Canonical(body, canonical))
                    waiting += 1
                    continue
                self.done[i] = 1
                finished["id"].append(i)
                finished["label"].append(label(answer.body))
            start += len(chunk)
        if finished["id"]:
            pq.write_table(pa.table(finished), self.out / f"part-{self.rounds:04d}.parquet")
        self.phases.add("record" if self.rounds == 0 else "finish items + write Parquet",
                        time.thread_time() - t)
        self.rounds += 1
        return waiting


def label(body: Any) -> str:
    """The label in a chat completion's body (its JSON bytes, or parsed)."""
    return (json.loads(body) if isinstance(body, bytes) else body)[
        "choices"][0]["message"]["content"]


def part_driver(src: Path, out: Path, folder: Path, base_url: str,
                delay: float) -> dict[str, Any]:
    """The first poll once every batch has had its delay: the rows run twice (record, then
    finish), whatever the order the batches end in (else a third round, or not, by timing)."""
    phases = Phases()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=2)
    loop = BatchLoop(folder, {"llm": TimedTransport(transport_for(client, "bench"), phases)},
                     backoff=Backoff(first=2 * delay + 2))
    _time_driver(loop, phases)
    rows = Rows(src, out, folder, loop.recorder("llm"), phases)
    left = loop.run(rows)
    check = _cpu()
    labels = pq.read_table(out).to_pydict()
    wrong = sum(1 for i, got in zip(labels["id"], labels["label"]) if got != label_of(text_of(i)))
    return {"rows_out": len(labels["id"]), "wrong": wrong, "left": left, "rounds": rows.rounds,
            "phases": phases.cpu, "check_cpu_s": _cpu() - check}


# -- the node's own client on that path -----------------------------------------------------
async def _calls(client: Any, chunk: list[str]) -> int:
    answered = 0
    for text in chunk:
        try:
            await client.chat.completions.create(**body_of(text))
            answered += 1
        except BatchWait:
            pass
    return answered


def part_client(src: Path, answered: Path, rows: int, base_url: str) -> dict[str, Any]:
    """The recording client's CPU per call: recorded (no answer yet), then replayed (the
    answers the driver part stored)."""
    chunk = next(texts(src))[:rows]
    client = openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=0)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as empty:
        for phase, folder in (("record", Path(empty)), ("replay", answered)):
            rc = recording_client(client, AnswerStore(folder), RequestLog(empty).recorder("llm"))
            t = time.thread_time()
            got = asyncio.run(_calls(rc, chunk))
            out[phase] = {"cpu_s": time.thread_time() - t, "answered": got}
    return {"calls": len(chunk), **out}


# -- the same job through graph.map ----------------------------------------------------------
@hn_resource
def llm(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=0)


async def classify(text: str, llm: Any) -> str:
    r = await llm.chat.completions.create(**body_of(text))
    meter(tokens=r.usage.total_tokens)
    return r.choices[0].message.content


def has_batch_api() -> bool:
    return "batch_api" in inspect.signature(node).parameters


def part_graph(src: Path, out: Path, base_url: str, online: bool) -> dict[str, Any]:
    """``graph.map(source=, into=)``; a tree whose batch maps take no ``into=`` yet runs the
    rows as an in-memory map (``cache=DiskCache``) and writes them itself."""
    per_window = {"calls": f"{int(RPM * WINDOW / 60)}/{WINDOW:g}s",
                  "tokens": f"{int(TPM * WINDOW / 60)}/{WINDOW:g}s"}
    options: dict[str, Any] = (
        {"retries": 8, "retry_on": openai.RateLimitError, "concurrency": 64,
         "rate_limit": per_window} if online else {"batch_api": True})
    paid = node(output_name="label", **options)(classify)
    graph = Graph([llm, paid], cache=DiskCache(str(out.parent / f"cache-{out.name}")))
    how = "source=, into="
    try:
        res = graph.map({"base_url": base_url}, source=str(src), columns={"text": "text"},
                        keep=["id"], into=str(out))
        pending = getattr(res, "pending", 0)
    except (NotImplementedError, TypeError, ValueError) as exc:
        if online:
            raise
        how = f"in memory, written here ({type(exc).__name__}: {str(exc)[:120]})"
        pending = _in_memory(graph, src, out, base_url)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the map's, not the check's
    check, rows_out, wrong = _cpu(), 0, 0
    for batch in pq.read_table(out, columns=["id", "label"]).to_batches(100_000):
        ids, labels = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        rows_out += len(ids)
        wrong += sum(1 for i, got in zip(ids, labels) if got != label_of(text_of(i)))
    return {"rows_out": rows_out, "wrong": wrong, "pending": pending, "how": how,
            "map_peak_rss_mb": peak, "check_cpu_s": _cpu() - check}


def _in_memory(graph: Graph, src: Path, out: Path, base_url: str) -> int:
    table = pq.read_table(src)
    res = graph.map({"text": table.column("text").to_pylist(), "base_url": base_url},
                    map_over="text", on_error="collect")
    labels = [r["label"] if r.status == "complete" else None for r in res]
    pq.write_table(pa.table({"id": table.column("id"), "label": labels}), out / "part-0.parquet")
    return int(getattr(res, "pending", 0))


# -- one part per process; the main process holds the server ---------------------------------
def child(args: argparse.Namespace) -> None:
    """Run one part in this process and print its numbers as the last line (JSON)."""
    work, t0, start = Path(args.work), time.perf_counter(), _cpu()
    out = work / f"out-{args.part}"
    out.mkdir()
    if args.part == "driver":
        got = part_driver(work / "source.parquet", out, work / "batches", args.base_url,
                          args.delay)
    elif args.part == "client":
        got = part_client(work / "source.parquet", work / "batches", args.client_rows,
                          args.base_url)
    else:
        src = work / f"{args.part}.parquet"
        got = part_graph(src, out, args.base_url, online=args.part == "online")
    # our own time: the part's CPU less the bench's check of the labels written
    print(json.dumps({"wall_s": time.perf_counter() - t0,
                      "own_cpu_s": _cpu() - start - got.get("check_cpu_s", 0.0),
                      "startup_cpu_s": start,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      **got}))


def _cpu() -> float:
    """This process's CPU seconds so far (user + system, every thread)."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def run_part(part: str, server: BatchServer, work: Path, args: argparse.Namespace
             ) -> dict[str, Any]:
    """One part in a child process, with the server's counters and CPU around it."""
    server.reset()
    cpu0 = _cpu_of(server)
    cmd = [sys.executable, __file__, "--part", part, "--work", str(work), "--base-url",
           server.base_url, "--client-rows", str(args.client_rows), "--delay", str(args.delay)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"part {part} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    stats = server.stats()
    got["server"] = {k: v for k, v in stats.items() if v}
    got["server_cpu_s"] = round(_cpu_of(server) - cpu0, 2)
    return got


def _cpu_of(server: BatchServer) -> float:
    with open(f"/proc/{server.proc.pid}/stat") as f:  # type: ignore[union-attr]
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def row_of(part: str, rows: int, got: dict[str, Any], scale: float = 1.0) -> dict[str, Any]:
    """A table row; ``scale``: the online part's numbers scaled to ``rows``."""
    s = got.get("server", {})
    requests = s.get("batch_lines", 0) + s.get("online_requests", 0)
    cost = s.get("cost_batch", 0.0) + s.get("cost_online", 0.0)
    return {"part": part, "rows": rows, "requests": round(requests * scale),
            "received_max": s.get("received_max", ""), "cost_usd": round(cost * scale, 2),
            "wall_s": round(got["wall_s"] * scale, 1),
            "own_cpu_s": round(got["own_cpu_s"] * scale, 1),
            "own_s_per_1M": round(got["own_cpu_s"] * scale * 1e6 / rows, 1),
            "peak_rss_mb": round(got["peak_rss_mb"])}


def phase_rows(got: dict[str, Any], rows: int) -> list[dict[str, Any]]:
    """Where the driver part's CPU went; ``other``: the rest of the process's CPU (the
    loop's bookkeeping, the ledger, the HTTP client's threads, start-up, GC)."""
    cpu = dict(got["phases"])
    cpu["other (loop, ledger, HTTP threads, GC)"] = got["own_cpu_s"] - sum(cpu.values())
    return [{"phase": k, "cpu_s": round(v, 2), "s_per_1M": round(v * 1e6 / rows, 2),
             "share": f"{100 * v / got['own_cpu_s']:.0f}%"} for k, v in cpu.items()]


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    parts = [p for p in args.parts.split(",") if p != "graph" or has_batch_api()]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-batch-api-") as tmp:
        work = Path(tmp)
        write_source(work / "source.parquet", args.rows)
        write_source(work / "online.parquet", min(args.rows, args.online_rows))
        write_source(work / "graph.parquet", min(args.rows, args.graph_rows))
        with BatchServer(delay=args.delay, rpm=int(RPM * WINDOW / 60),
                         tpm=int(TPM * WINDOW / 60), window_seconds=WINDOW) as server:
            for part in parts:
                out[part] = run_part(part, server, work, args)
                print(part, json.dumps(out[part]), flush=True)
    rows = [row_of("batch: driver path", args.rows, out["driver"])] if "driver" in out else []
    for part, what, n in (("graph", "batch: graph.map", args.graph_rows),
                          ("online", "online: graph.map", args.online_rows)):
        if part in out:
            n = min(args.rows, n)
            label = what if n == args.rows else f"{what} ({n:,} rows, scaled)"
            rows.append(row_of(label, args.rows, out[part], args.rows / n))
    return {"machine": {**machine(load_before[0], openai=openai.__version__),
                        "loadavg_before": [round(x, 2) for x in load_before],
                        "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
            "workload": {"rows": args.rows, "delay_s": args.delay, "online_rows": args.online_rows,
                         "graph_rows": args.graph_rows,
                         "online_rpm": RPM, "online_tpm": TPM, "model": MODEL,
                         "max_tokens": MAX_TOKENS, "graph_path": "graph" in out},
            "rows": rows,
            "phases": phase_rows(out["driver"], args.rows) if "driver" in out else [],
            "client": _client_rows(out.get("client"), args.rows),
            "parts": out}


def _client_rows(got: dict[str, Any] | None, rows: int) -> list[dict[str, Any]]:
    if not got:
        return []
    return [{"phase": f"client {phase}", "cpu_s": round(got[phase]["cpu_s"], 2),
             "s_per_1M": round(got[phase]["cpu_s"] * 1e6 / got["calls"], 1),
             "share": f"{got[phase]['answered']:,}/{got['calls']:,} answered"}
            for phase in ("record", "replay")]


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--delay", type=float, default=30.0, help="seconds a batch takes")
    p.add_argument("--online-rows", type=int, default=6_000)
    p.add_argument("--client-rows", type=int, default=10_000)
    p.add_argument("--graph-rows", type=int, default=1_000_000,
                   help="rows of the graph part (fewer: scaled to --rows)")
    p.add_argument("--parts", default="driver,client,graph,online")
    p.add_argument("--name", default="batch_api", help="results/<name>.json")
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part:
        child(args)
        return
    report = run(args)
    print()
    print_table(report["rows"], COLUMNS)
    if report["phases"] or report["client"]:
        print()
        print_table(report["phases"] + report["client"], PHASE_COLUMNS)
    print(f"\nwrote {write_results(RESULTS, args.name, report)}")


if __name__ == "__main__":
    main()
