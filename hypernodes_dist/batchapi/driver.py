"""The driver's cycle over one ``BatchTransport``: submit, poll, download, submit again.

``BatchDriver`` keeps no state of its own: it replays the ledger (``store.Ledger``) when
built and writes an event before and after every provider call, so a rerun (after a crash
or a ``wait=False`` map) carries on where the last one stopped:

- ``submit(requests)``: the requests with no answer, in no live batch and with attempts
  left, packed (a generator into ``transport.pack``), uploaded and created.
- **The queue limit.** A create refused for it (a gateway's 429, ``QueueLimitError``) or a
  batch the provider failed for it (OpenAI's ``token_limit_exceeded``) leaves its lines for
  a later ``submit`` (not counted as an attempt) and ``held``: no further file is uploaded
  until one of the map's batches ends (or, none running, until the next ``submit``).
- ``poll()``: each live batch's status; an ended one is downloaded: answered lines (2xx and
  4xx) go to the ``AnswerStore``, expired / cancelled / 5xx / 429 / missing lines and the
  lines of a batch failed as a whole are submitted again by the next ``submit`` while they
  have attempts left (``attempts``: 1 + the node's retries), after which the last outcome is
  stored as their answer (an error status the client raises as its own error; for a batch
  failed as a whole, a 400 carrying the provider's message, kept in the ledger). A batch
  refused at create with 400/413/422 (the provider's validation) fails as a whole alike.
- ``online_after``: a batch still running that long after its creation is cancelled; once
  it has ended its answered lines are kept and the others are stored as ``ONLINE``: the
  recording client sends them online (with the node's policies around the call).
- ``recover()``: a create sent but never recorded (a crash) is looked up in the provider's
  batch list by metadata (``hn_file``) or, for providers without metadata, by the
  custom_ids of an ended batch's results; a batch still unconfirmed keeps its lines out of
  ``submit`` until it is.
- ``reserve``: a request reserves its expected usage when it goes into a batch; one the
  budget refuses is not submitted and its answer is the refusal (``BudgetExceededError``
  in the node's code); refusals are dropped when a driver starts, so a rerun asks again.
- A batch the provider no longer knows (404: deleted, or another API key) is ``lost``: its
  requests are submitted again only with ``resubmit_lost=True`` or after the user's
  ``forget`` in the ledger (``run/batchcontrol.resubmit_lost_batches``).
- **The user's cancel** (``cancel`` events another process appends to the ledger,
  ``run/batchcontrol.cancel_batches``): the file's unanswered lines are not counted as an
  attempt, and a driver running when it arrives is ``stopped`` (it submits nothing more).
- Provider files are deleted once a batch is downloaded, unless ``keep_files``.
- ``on_batch(state, answered, failed)``, if set, hears a batch created, downloaded, failed
  as a whole or lost (the trace's spans and the bar, ``run/batchview.py``).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from hypernodes_dist.batchapi.clientcalls import http_status
from hypernodes_dist.batchapi.packing import Packer
from hypernodes_dist.batchapi.recording import ONLINE, Answer, refusal_answer
from hypernodes_dist.batchapi.store import (
    AnswerStore,
    FileState,
    Ledger,
    LogBlock,
    Request,
    RequestLog,
)
from hypernodes_dist.batchapi.transport import (
    ENDED,
    FAILED,
    SUCCEEDED,
    AnsweredLines,
    BatchFile,
    BatchInfo,
    BatchNotFoundError,
    BatchTransport,
    LineBlock,
    LineResult,
    QueueLimitError,
)
from hypernodes_dist.errors import BudgetExceededError

__all__ = ["BatchDriver", "DriverCounts", "Reserve"]

# ``reserve(request)``: the budget takes the request's expected usage, or refuses it
Reserve = Callable[[Request], BudgetExceededError | None]
REFUSED_PREFIX = "refused-"

_SKEW = 300.0  # seconds of clock skew allowed when listing batches after a crash
_REFUSED_WHOLE = (400, 413, 422)  # a provider's validation refusing a file or batch at once


@dataclass
class DriverCounts:
    """What the driver did (for progress and tests)."""

    files: int = 0
    batches_created: int = 0
    queue_refusals: int = 0
    lines_answered: int = 0
    lines_again: int = 0
    lines_online: int = 0
    lines_failed: int = 0   # answered with an error (4xx)
    lines_given_up: int = 0  # failed with no answer after the attempts (the last error's)
    answers: int = 0  # answers written (lines answered, failed, given up, online, refused)


def _digest(custom_id: str) -> str:
    return custom_id.split("_", 1)[1]


def _digests(file: BatchFile) -> list[str]:
    """The request digests of a file's lines (one transport, one map tag: sliced off)."""
    cids = file.custom_ids
    cut = cids[0].index("_") + 1 if cids else 0
    return [c[cut:] for c in cids]


class BatchDriver:
    """Submit / poll / download for one transport, over a batch folder."""

    def __init__(self, transport: BatchTransport, folder: str, *, attempts: int = 1,
                 keep_files: bool = False, online_after: float | None = None,
                 ledger_folder: str | None = None, resubmit_lost: bool = False,
                 reserve: Reserve | None = None, answers: AnswerStore | None = None) -> None:
        """``folder`` holds the answers (and the ledger unless ``ledger_folder`` is given:
        one ledger per transport, one answer store per map: ``answers``, the map's store
        when the caller has one, so its index is built once per process)."""
        self.transport, self.attempts, self.keep_files = transport, max(1, attempts), keep_files
        self.online_after, self.resubmit_lost, self.reserve = online_after, resubmit_lost, reserve
        self.ledger = Ledger(ledger_folder or folder)
        self.answers = answers if answers is not None else AnswerStore(folder)
        self.answers.make()  # before any row runs: an answer missed reads its mtime only
        self.answers.drop(REFUSED_PREFIX)  # a rerun asks the budget again
        self.files: dict[str, FileState] = self.ledger.files()
        self.counts = DriverCounts()
        self._last: dict[str, Answer] = {}  # digest -> its latest unanswered outcome
        self._reserved: set[str] = set()    # digests the budget took in this driver
        self._taken: set[str] = set()       # digests in a live batch or this submit's files
        self.held = False     # refused for the queue limit: no new file until a batch ends
        self.again = False    # lines wait to be submitted again (a submit may take them)
        self.stopped = False  # the user cancelled the map's batches while this driver ran
        # hears each batch created / ended: (its file, lines answered, lines failed)
        self.on_batch: Callable[[FileState, int, int], None] | None = None

    # -- which requests go ------------------------------------------------------------
    def _history(self) -> tuple[Counter[str], dict[str, str]]:
        """Counted attempts per digest, and the message of the last whole-batch failure."""
        tries: Counter[str] = Counter()
        why: dict[str, str] = {}
        for f in self.files.values():
            if f.counted and f.state in ("done", "failed"):
                tries.update(f.digests)
                if f.state == "failed" and f.why:
                    why.update(dict.fromkeys(f.digests, f.why))
        return tries, why

    def _live(self) -> set[str]:
        """Requests in a batch at the provider, or in a lost one not to be resubmitted."""
        held = ("new", "submitted") if self.resubmit_lost else ("new", "submitted", "lost")
        return {d for f in self.files.values() if f.state in held for d in f.digests}

    @property
    def lost(self) -> list[str]:
        """Batches the provider no longer knows (404), by id."""
        return [str(f.batch_id) for f in self.files.values() if f.state == "lost"]

    def has_line(self, digest: str) -> bool:
        """Whether a request needs no line: answered, or in a live batch (as of the running
        submit), so that the request log may pass over it unparsed."""
        return digest in self._taken or digest in self.answers

    def to_submit(self, requests: Iterable[Request]) -> Iterator[Request]:
        """The requests that go into the next batches (a generator)."""
        taking = _Taking(self)
        for req in requests:
            if taking.takes(req):
                yield req

    def _reserve(self, req: Request) -> bool:
        """The budget takes the request once per driver (a file refused for the queue limit
        does not take it twice); a refusal is stored as its answer."""
        if self.reserve is None or req.digest in self._reserved:
            return True
        refused = self.reserve(req)
        if refused is not None:
            self._put(f"{REFUSED_PREFIX}{req.digest}", [(req.digest, refusal_answer(refused))])
            return False
        self._reserved.add(req.digest)
        return True

    def _give_up(self, digest: str, why: str) -> None:
        last = self._last.get(digest)
        if last is None and why:
            last = _whole_batch_answer(why)
        self.counts.lines_given_up += 1
        self._put(f"final-{digest}", [(digest, last or Answer(500, {"error": {
            "message": f"the batch line was not answered in {self.attempts} attempt(s)",
            "type": "batch_line_failed"}}))])

    def _put(self, name: str, answers: list[tuple[str, Answer]]) -> None:
        self.answers.put(name, answers)
        self.counts.answers += len(answers)

    # -- submitting -------------------------------------------------------------------
    async def submit(self, requests: Iterable[Request]) -> int:
        """Pack, upload and create batches for the requests that need one; lines sent.
        Nothing while ``held`` with a batch running, nor once ``stopped``; a queue-limit
        refusal ends the pass (its lines and the rest wait for a later one)."""
        line = self.transport.line  # the log's digest: not computed again
        return await self._submit_files(self.transport.pack(
            line(r.endpoint, r.body, r.digest) for r in self.to_submit(requests)))

    async def submit_log(self, log: RequestLog, source: str) -> int:
        """``submit`` of the requests ``source`` recorded in ``log``, read a block of lines
        at a time (``log.blocks``): a block whose every request goes is made into lines at
        once where the transport can (``raw_lines``: no line parsed, no object a line) and
        packed whole (``Packer``); the requests of any other block go one by one."""
        raw_lines = getattr(self.transport, "raw_lines", None)
        if raw_lines is None:
            return await self.submit(log.requests(source, self.has_line))
        return await self._submit_files(self._log_files(log.blocks(source), raw_lines))

    def _log_files(self, blocks: Iterable[LogBlock],
                   raw_lines: Callable[..., LineBlock | None]) -> Iterator[BatchFile]:
        taking, packer, line = _Taking(self), Packer(self.transport.limits), self.transport.line
        for block in blocks:
            made = raw_lines(block.endpoint, block.model, block.digests, block.bodies,
                             block.inputs) if taking.whole(block) else None
            if made is not None:
                taking.live.update(block.digests)
                yield from packer.add_block(made)
                continue
            for req in block.requests():
                if taking.takes(req):
                    yield from packer.add(line(req.endpoint, req.body, req.digest))
        yield from packer.close()

    async def _submit_files(self, files: Iterable[BatchFile]) -> int:
        if self.stopped or (self.held and self.running):
            return 0
        self.held = self.again = False
        sent = 0
        try:
            with _no_gc():
                for file in files:
                    outcome = await self._submit_file(file)
                    if outcome == "held":
                        break
                    sent += file.count if outcome == "created" else 0
        finally:
            self._taken = set()  # (the files' digests hold them: not kept twice)
        return sent

    async def _submit_file(self, file: BatchFile) -> str:
        """Upload and create one file: "created", "held" (queue limit) or "failed"."""
        state = FileState(f"{file.tag}-{time.time_ns():x}", file.tag, _digests(file))
        self.files[state.fid] = state
        self.ledger.write("file", fid=state.fid, tag=file.tag, digests=state.digests)
        self.counts.files += 1
        try:
            state.file_id = await self.transport.upload(file)
            self.ledger.write("uploaded", fid=state.fid, file_id=state.file_id)
            self.ledger.write("creating", fid=state.fid)
            state.creating_at = time.time()
            info = await self.transport.create(file, state.file_id)
        except QueueLimitError:
            self._queue_limited(state)
            return "held"
        except Exception as exc:
            status = http_status(exc)
            if status not in _REFUSED_WHOLE:
                raise
            self._failed_whole(state, f"{self.transport.provider} refused the batch "
                                      f"({status}): {exc}")
            return "failed"
        self._created(state, info.id)
        return "created"

    def _created(self, state: FileState, batch_id: str) -> None:
        state.batch_id, state.state = batch_id, "submitted"
        state.provider = self.transport.provider
        self.ledger.write("created", fid=state.fid, batch=batch_id, provider=state.provider)
        self.counts.batches_created += 1
        self._tell(state)

    def _tell(self, state: FileState, answered: int = 0, failed: int = 0) -> None:
        if self.on_batch is not None:
            self.on_batch(state, answered, failed)

    def _fail(self, state: FileState, counted: bool, why: str = "") -> None:
        state.state, state.counted = "failed", counted
        state.why = why or state.why
        self.ledger.write("failed", fid=state.fid, counted=counted, why=why)
        if state.creating_at is not None:  # a batch (or a create) the provider refused
            self._tell(state)

    def _queue_limited(self, state: FileState) -> None:
        """Refused for the provider's queue limit: its lines go again, not as an attempt,
        once a batch has ended."""
        self._fail(state, counted=False, why="queue limit")
        self.counts.queue_refusals += 1
        self.held = self.again = True

    def _failed_whole(self, state: FileState, message: str) -> None:
        """Failed as a whole (validation): its lines go again, counted as an attempt."""
        self._fail(state, counted=True, why=message)
        self.counts.lines_again += len(state.digests)
        self.again = True

    # -- polling ----------------------------------------------------------------------
    @property
    def running(self) -> int:
        """Batches submitted and not yet downloaded (or still unconfirmed)."""
        return sum(1 for f in self.files.values() if f.state in ("submitted", "new")
                   and (f.batch_id or f.creating_at))

    async def poll(self) -> int:
        """One pass over the live batches; how many ended (downloaded, or failed as a whole
        other than for the queue limit): each one lifts ``held``."""
        self._read_commands()
        ended = 0
        for state in [f for f in self.files.values() if f.state == "submitted"]:
            try:
                info = await self.transport.status(str(state.batch_id))
            except BatchNotFoundError:
                state.state = "lost"
                self.ledger.write("lost", fid=state.fid)
                self._tell(state)
                continue
            if info.state == ENDED:
                await self._download(state, info)
            elif info.queue_limited:
                self._queue_limited(state)
                continue
            elif info.state == FAILED:
                self._failed_whole(state, info.message or "the batch failed")
            else:
                await self._maybe_online(state, info)
                continue
            ended += 1
            self.held = False
        return ended

    def _read_commands(self) -> None:
        """The user's ``cancel`` appended to the ledger since: this driver stops."""
        for ev in self.ledger.commands():
            state = self.files.get(ev.get("fid", ""))
            if state is not None and ev["ev"] == "cancel":
                state.cancelled = self.stopped = True

    async def _maybe_online(self, state: FileState, info: BatchInfo) -> None:
        """``online_after``: a batch running that long is cancelled; its unanswered lines
        will go online once it has ended (its answered ones are kept)."""
        # the provider's created_at is whole seconds: our own clock of the create is finer
        started = max(info.created_at, state.creating_at or 0.0)
        if (self.online_after is None or state.online
                or time.time() - started < self.online_after):
            return
        state.online = True
        self.ledger.write("online", fid=state.fid)
        await self.transport.cancel(str(state.batch_id))

    async def _download(self, state: FileState, info: BatchInfo) -> None:
        """The batch's lines streamed into its answer file (no line kept in memory)."""
        seen: set[str] = set()
        again: set[str] = set()  # lines of this batch to submit again
        failed = 0  # lines answered with an error (4xx)
        # a file of succeeded lines as one block where the transport can (its optional
        # results_at_once), else line by line
        read = getattr(self.transport, "results_at_once", self.transport.results)
        with _no_gc(), self.answers.writer(str(state.batch_id)) as out:
            async for r in read(info):
                if type(r) is AnsweredLines:  # a file of succeeded lines, written as it is
                    seen.update(r.digests)
                    out.add_lines(r)
                    continue
                digest = _digest(r.custom_id)
                seen.add(digest)
                if r.retry:
                    self._last[digest] = _error_answer(r)
                    again.add(digest)
                else:  # a succeeded line's body written as the provider sent it
                    status = int(r.status or 200)
                    failed += status >= 400
                    out.add(digest, Answer(status, r.body if r.raw is None else r.raw))
            answered = out.n
            if state.online:
                for d in state.digests:
                    if d not in seen or d in again:
                        out.add(d, ONLINE)
                self.counts.lines_online += out.n - answered
            elif answered < len(state.digests):
                self.counts.lines_again += len(state.digests) - answered
                self.again = True
        self.counts.lines_answered += answered
        self.counts.lines_failed += failed
        self.counts.answers += out.n
        state.state, state.counted = "done", not state.cancelled  # the user's cancel: no try
        self.ledger.write("done", fid=state.fid, answered=out.n, seen=len(seen),
                          counted=state.counted)
        self._tell(state, answered - failed, failed)
        if not self.keep_files:
            await self.transport.delete_files(info)

    # -- after a crash ----------------------------------------------------------------
    async def recover(self) -> int:
        """Adopt batches created but not recorded; how many files are still uncertain."""
        uncertain = [f for f in self.files.values()
                     if f.state == "new" and f.creating_at is not None]
        if not uncertain:
            self._drop_unsent()
            return 0
        since = min(f.creating_at or 0.0 for f in uncertain) - _SKEW
        known = {f.batch_id for f in self.files.values() if f.batch_id}
        found = [b for b in await self.transport.list_batches(since) if b.id not in known]
        left = 0
        for state in uncertain:
            match = await self._match(state, found)
            if match is not None:
                self._created(state, match.id)
            elif any(not b.confirmed and b.total in (0, len(state.digests)) for b in found):
                left += 1  # a running batch of its size may be it: wait until it ends
            else:
                self._fail(state, counted=False, why="never created")
        self._drop_unsent()
        return left

    def _drop_unsent(self) -> None:
        for f in self.files.values():
            if f.state == "new" and f.creating_at is None:
                self._fail(f, counted=False, why="never created")

    async def _match(self, state: FileState, found: list[BatchInfo]) -> BatchInfo | None:
        for info in found:
            if info.metadata.get("hn_file") == state.tag:
                return info
            if info.confirmed and not info.metadata and info.state == ENDED:
                async for r in self.transport.results(info):
                    if _digest(r.custom_id) in state.digests:
                        return info
                    break
        return None


class _Taking:
    """One submit's choice of the requests that go: a request at a time (``takes``), or a
    block of the log whose every request goes (``whole``)."""

    def __init__(self, driver: BatchDriver) -> None:
        self.driver = driver
        self.live = driver._taken = driver._live()  # taken: live, or in this submit's files
        driver.answers.refresh()
        self.history: tuple[Counter[str], dict[str, str]] | None = None

    def _tries(self) -> Counter[str]:
        if self.history is None:
            self.history = self.driver._history()
        return self.history[0]

    def takes(self, req: Request) -> bool:
        """Whether ``req`` goes (taken then): not taken or answered, attempts left (else
        its last outcome becomes its answer), the budget's yes."""
        d, digest = self.driver, req.digest
        if digest in self.live or digest in d.answers:
            return False
        if self._tries().get(digest, 0) >= d.attempts:
            assert self.history is not None
            d._give_up(digest, self.history[1].get(digest, ""))
            return False
        if d.reserve is not None and not d._reserve(req):
            return False
        self.live.add(digest)
        return True

    def whole(self, block: LogBlock) -> bool:
        """Whether every request of ``block`` goes as ``takes`` would say, without asking
        each: none taken, answered, tried before or repeated, no budget to ask, its model
        known (not taken here: ``live`` is updated once its lines are made)."""
        digests, tries = block.digests, self._tries()
        return (block.model is not None and self.driver.reserve is None
                and self.live.isdisjoint(digests)
                and self.driver.answers.known().isdisjoint(digests)
                and len(set(digests)) == len(digests)
                and (not tries or tries.keys().isdisjoint(digests)))


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic collector paused while the driver reads a million lines (the rows do not
    run meanwhile): its passes over the lines' short-lived objects cost a fifth of packing
    them, and those objects hold no cycles (refcounting frees them)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _whole_batch_answer(message: str) -> Answer:
    """A line of a batch failed as a whole: the client raises a 400 with the message."""
    return Answer(400, {"error": {"message": message, "type": "batch_failed"},
                        "type": "error"})


def _error_answer(r: LineResult) -> Answer:
    if r.status and r.body is not None:
        return Answer(r.status, r.body)
    return Answer(503 if r.kind != SUCCEEDED else 200,
                  {"error": {"message": r.message or r.kind, "type": r.kind}})
