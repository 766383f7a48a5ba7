"""A map's batch folder (``into/_hn_batches/`` or in the cache dir): what the workers recorded,
what the driver did at the provider, and what the provider answered.

- ``RequestLog``: requests the workers recorded (``requests/<process>.jsonl``, appended by
  each process, read incrementally by the driver); identical requests are one.
- ``Ledger``: ``ledger.jsonl``, one fsync'd JSON event per line, written before and after
  every provider call (``file``, ``uploaded``, ``creating``, ``created``, ``online``,
  ``failed``, ``done``, ``lost``; each names its file by ``fid``), and by the user's
  commands (``cancel``: the user cancelled the file's batch; ``forget``: resubmit a lost
  batch's requests); ``Ledger.files()`` replays it into the state of each file. Each event
  is one ``write`` on an ``O_APPEND`` descriptor, so another process (``control.py``) may
  append while a driver runs.
- ``AnswerStore``: ``answers/<batch>.jsonl`` written whole (temp file + rename) once a batch
  is downloaded: ``{"d": digest, "s": status, "b": body}``; read by every process, new
  files picked up when the folder changes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import json.scanner
import operator
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, KeysView, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

from hypernodes_dist.batchapi.identity import (
    Canonical,
    canonical_body,
    digest_for,
    digest_of,
    request_digest,
)
from hypernodes_dist.batchapi.recording import REFUSED, Answer
from hypernodes_dist.batchapi.transport import AnsweredLines
from hypernodes_dist.perprocess import PROCESS

__all__ = ["RequestLog", "Request", "LogBlock", "Ledger", "FileState", "AnswerStore", "apply_event"]


class Request(NamedTuple):
    """One distinct request a worker recorded (a tuple: the driver reads a million of them,
    and a frozen dataclass costs twice as much to build). Its body stays the canonical JSON
    bytes the log holds (``canonical``), parsed only when ``body`` is read; ``model`` (a
    string; None: read the body) and ``inputs`` (embedding inputs, 1 for others) are what
    the worker wrote beside it: the driver reads the log a block at a time (``LogBlock``)
    and the transport makes the lines from the bytes (``raw_lines``), none parsed."""

    endpoint: str
    canonical: bytes
    digest: str
    source: str = ""   # who recorded it (the resource), so the driver picks its transport
    model: str | None = None
    inputs: int = 1

    @property
    def body(self) -> Canonical:
        """The body, parsed from its canonical bytes (which it keeps)."""
        text = self.canonical.decode()
        body, end = _SCAN(text, 0)
        if end != len(text) or type(body) is not dict:
            raise ValueError(f"request {self.digest}: its logged body is not one JSON object")
        return _canonical(body, self.canonical)


class RequestLog:
    """Requests recorded by the workers of a map (``folder/requests/``).

    A line is ``{"d": digest, "e": endpoint, "s": source, "m": model, "n": inputs, "b":
    canonical body}`` (``m``: the body's model, null when not a string; ``n``: its embedding
    inputs, 1 for others: the driver packs lines without parsing a body); each process
    appends to its own file through one ``O_APPEND`` descriptor (one write a request, or,
    while a round of the map's rows runs here (``round``), one write for many: the lines
    are held and written when they pass ``_HELD_BYTES`` and when the round ends, before its
    rows are handed back, so the driver, which reads the log between rounds, reads them
    all)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.root = Path(folder)
        self.folder = self.root / "requests"
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = self._forks = 0
        self._offsets: dict[str, int] = {}
        self._seen: set[str] = set()
        self.sources: set[str] = set()  # the sources ``requests()`` has met
        self._middle: dict[tuple[str, str, str | None], bytes] = {}  # bytes between d and n
        self._rounds = 0  # rounds running in this process (``round``): lines are held
        self._held: list[bytes] = []  # lines recorded in them, not written yet
        self._held_bytes = 0
        self._held_in = 0  # the fork generation those belong to (a child holds none of them)

    def __reduce__(self) -> tuple[Any, ...]:  # a worker process opens its own file
        return (RequestLog, (self.root,))

    def record(self, endpoint: str, body: Mapping[str, Any], source: str = "") -> None:
        """Append a request (a worker's side; safe from threads and forked processes)."""
        canonical = canonical_body(body)  # a Canonical's digest was computed by its lookup
        digest = digest_for(endpoint, body) if type(body) is Canonical else digest_of(
            endpoint, canonical)
        model, given = body.get("model"), body.get("input")
        if type(model) is not str:  # (written as null: the driver reads the body)
            model = None
        middle = self._middle.get((endpoint, source, model))
        if middle is None:
            middle = self._middle_of(endpoint, source, model)
        data = b"".join((b'{"d":"', digest.encode(), middle,
                         b"1" if type(given) is not list else str(len(given)).encode(),
                         b',"b":', canonical, b"}\n"))
        with self._lock:
            if self._rounds and self._held_in == _FORKS[0]:  # in a round: held
                self._held.append(data)
                self._held_bytes += len(data)
                if self._held_bytes < _HELD_BYTES:
                    return
                data = self._take_held()
            self._write(data)

    def _middle_of(self, endpoint: str, source: str, model: str | None) -> bytes:
        """A line's bytes between its digest and its inputs, kept per endpoint, source and
        model (a map's few)."""
        middle = b"".join((b'","e":', json.dumps(endpoint).encode(), b',"s":',
                           json.dumps(source).encode(), b',"m":', json.dumps(model).encode(),
                           b',"n":'))
        if len(self._middle) < 256:
            self._middle[(endpoint, source, model)] = middle
        return middle

    def _write(self, data: bytes) -> None:
        """``data`` (whole lines) appended to this process's file (under the lock)."""
        if self._fd is None or self._forks != _FORKS[0]:  # a forked child: its own file
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid, self._forks = os.getpid(), _FORKS[0]
            weakref.finalize(self, _close_fd, self._fd, self._pid)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def _take_held(self) -> bytes:
        data = b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        return data

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        """While a round of the map's rows runs in this process: ``record`` holds its lines,
        written at the round's end (and whenever ``_HELD_BYTES`` are held): one write for
        many requests. A round's rows wait for the driver, which reads the log only once
        the round has handed them back."""
        with self._lock:
            if self._held_in != _FORKS[0]:  # a forked child: not its parent's rounds or lines
                self._rounds, self._held, self._held_bytes = 0, [], 0
                self._held_in = _FORKS[0]
            self._rounds += 1
        try:
            yield
        finally:
            with self._lock:
                self._rounds -= 1
                if self._held:
                    self._write(self._take_held())

    def recorder(self, source: str) -> Callable[[str, Mapping[str, Any]], None]:
        """``record`` for one source (a resource's name)."""
        return functools.partial(_record_from, self, source)

    def new(self) -> list[Request]:
        """The distinct requests recorded since the last call (the driver's side)."""
        out: list[Request] = []
        if not self.folder.is_dir():
            return out
        for path in sorted(self.folder.glob("*.jsonl")):
            for block in _blocks_of(self._read_new(path)):
                for req in block.requests():
                    if req.digest not in self._seen:
                        self._seen.add(req.digest)
                        out.append(req)
        return out

    def blocks(self, source: str | None = None) -> Iterator[LogBlock]:
        """Every request recorded so far (of ``source``), repeats kept, as ``LogBlock``s of
        lines of one endpoint, source and model in log order, read ``_LOG_BLOCK`` bytes at
        a time (a generator: the driver keeps no request in memory between two submits).
        Lines in ``record``'s layout are read by one regex pass a block (``_LOG_LINE``):
        no line's JSON is parsed."""
        if not self.folder.is_dir():
            return
        sources = self.sources
        for path in sorted(self.folder.glob("*.jsonl")):
            for block in _blocks(path):
                sources.add(block.source)
                if source is None or block.source == source:
                    yield block

    def requests(self, source: str | None = None,
                 skip: Callable[[str], bool] | None = None) -> Iterator[Request]:
        """Every distinct request recorded so far (of ``source``), read as ``blocks``.
        ``skip`` (a digest): a request it names is passed over (the driver's requests
        already in a batch or answered)."""
        seen: set[str] = set()
        for block in self.blocks(source):
            for req in block.requests():
                digest = req.digest
                if digest in seen or (skip is not None and skip(digest)):
                    continue
                seen.add(digest)
                yield req

    def _read_new(self, path: Path) -> bytes:
        start = self._offsets.get(path.name, 0)
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        self._offsets[path.name] = start + end
        return data[:end]


_FORKS = [1]  # forks this process descends from (no getpid() a record)
_HELD_BYTES = 1 << 18  # request lines held in a round before they are written
PROCESS.register("batchapi.store.forks", lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


def _close_fd(fd: int, pid: int) -> None:
    if os.getpid() == pid:
        os.close(fd)


class LogBlock(NamedTuple):
    """Requests of one endpoint, source and model as the log holds them, in order (repeats
    kept): their digests, bodies' canonical bytes and embedding inputs. ``model`` None: the
    body's is not a string (read the body)."""

    endpoint: str
    source: str
    model: str | None
    digests: list[str]
    bodies: list[bytes]
    inputs: list[int]

    def requests(self) -> Iterator[Request]:
        """Its requests one by one."""
        endpoint, source, model = self.endpoint, self.source, self.model
        for digest, body, inputs in zip(self.digests, self.bodies, self.inputs):
            yield Request(endpoint, body, digest, source, model, inputs)


def _blocks(path: Path) -> Iterator[LogBlock]:
    """A log file's ``LogBlock``s, read ``_LOG_BLOCK`` bytes at a time; a line being
    written (no newline yet) is read next time."""
    with open(path, "rb") as f:
        rest = b""
        while chunk := f.read(_LOG_BLOCK):
            data = rest + chunk
            end = data.rfind(b"\n") + 1
            data, rest = data[:end], data[end:]
            yield from _blocks_of(data)


def _blocks_of(data: bytes) -> list[LogBlock]:
    """Whole request lines as ``LogBlock``s: one regex pass when every line is in
    ``record``'s layout (each run of one header a block), else line by line."""
    found = _LOG_LINE.findall(data)
    if len(found) != data.count(b"\n"):  # a line in another layout: one by one
        return [b for raw in data.splitlines() for b in _line_blocks(raw)]
    out = []
    for middle, group in itertools.groupby(found, key=_MIDDLE_OF):
        rows = list(group)
        endpoint, source, model = _header(middle)
        out.append(LogBlock(endpoint, source, model, list(map(bytes.decode, map(_DIGEST_OF, rows))),
                            list(map(_BODY_OF, rows)), list(map(int, map(_INPUTS_OF, rows)))))
    return out


def _line_blocks(raw: bytes) -> list[LogBlock]:
    """One request line in another layout (older, or escaped), parsed when not in ours."""
    if _LOG_LINE.fullmatch(raw):
        return _blocks_of(raw + b"\n")
    obj = json.loads(raw)
    endpoint, body, source = obj["e"], obj["b"], obj.get("s", "")
    digest = obj["d"] if "d" in obj else request_digest(endpoint, body)
    model, given = body.get("model"), body.get("input")
    return [LogBlock(endpoint, source, model if type(model) is str else None, [digest],
                     [canonical_body(body)], [len(given) if type(given) is list else 1])]


def _header(middle: bytes) -> tuple[str, str, str | None]:
    """A request line's endpoint, source and model from its bytes between digest and
    inputs (read once per distinct header)."""
    found = _HEADERS.get(middle)
    if found is None:
        got = _MIDDLE.fullmatch(middle)
        assert got is not None  # (``_LOG_LINE`` matched it)
        e, s, m = got.groups()
        found = (e.decode(), s.decode(), None if m is None else m.decode())
        if len(_HEADERS) < 256:
            _HEADERS[middle] = found
    return found


_HEADERS: dict[bytes, tuple[str, str, str | None]] = {}
_LOG_BLOCK = 1 << 22  # bytes of a request log read at once
# a request line as ``record`` writes it: digest, the header (endpoint, source, model or
# null), inputs, the canonical body (no newline in it: JSON escapes them; no quote or
# backslash in the header's strings, else the line is parsed)
_LOG_LINE = re.compile(rb'^\{"d":"([0-9a-f]{32})(","e":"[^"\\\n]*","s":"[^"\\\n]*",'
                       rb'"m":(?:"[^"\\\n]*"|null),"n":)([0-9]+),"b":(\{[^\n]*\})\}$', re.M)
_MIDDLE = re.compile(rb'","e":"([^"]*)","s":"([^"]*)","m":(?:"([^"]*)"|null),"n":')
_DIGEST_OF, _MIDDLE_OF, _INPUTS_OF, _BODY_OF = (operator.itemgetter(i) for i in range(4))


# one JSON value from a str at an index (the C scanner json.loads ends in, called directly;
# typeshed types its argument as the scanner class itself, not the decoder it reads)
_SCAN: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    cast(Any, json.JSONDecoder()))


def _canonical(body: dict[str, Any], canonical: bytes,
               _new: Callable[..., Any] = dict.__new__,
               _update: Callable[..., None] = dict.update) -> Canonical:
    """``Canonical(body, canonical)`` built without its ``__init__`` (half the cost: one of
    these per request line the driver reads)."""
    made: Canonical = _new(Canonical)
    _update(made, body)
    made.canonical, made.named = canonical, None
    return made


def _record_from(log: RequestLog, source: str, endpoint: str, body: Mapping[str, Any]) -> None:
    log.record(endpoint, body, source)


@dataclass
class FileState:
    """One batch file as the ledger knows it."""

    fid: str          # unique per file the driver made (a tag repeats when lines go again)
    tag: str
    digests: list[str]
    file_id: str | None = None
    creating_at: float | None = None   # a create was sent (its answer may be lost)
    batch_id: str | None = None
    state: str = "new"                 # new | submitted | done | failed | lost
    counted: bool = True               # a failure counts against the lines' retries
    online: bool = False               # cancelled for online_after: unanswered lines go online
    provider: str = ""                 # the transport's provider ("openai", "anthropic")
    why: str = ""                      # the provider's message when the batch failed whole
    cancelled: bool = False            # the user cancelled it: unanswered lines not counted


class Ledger:
    """``folder/ledger.jsonl``: the driver's provider calls, before and after."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "ledger.jsonl"
        self.end = 0  # the byte after the last event read

    def write(self, event: str, **fields: Any) -> None:
        """Append one event, on disk before the call it announces is made (one ``write``
        on an ``O_APPEND`` descriptor: appends of other processes never interleave)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        data = (json.dumps({"ev": event, "t": time.time(), **fields},
                           separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def events(self, start: int = 0) -> Iterator[dict[str, Any]]:
        """The events from byte ``start`` on; ``self.end`` is where the last one ended."""
        self.end = start
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(start)
            for raw in f:
                if not raw.endswith(b"\n"):  # a torn last line: its call never ran
                    return
                self.end += len(raw)
                yield json.loads(raw)

    def commands(self) -> list[dict[str, Any]]:
        """The user's ``cancel`` and ``forget`` events appended since the last read (of
        ``files()`` or of this); the other events are skipped unparsed."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.end)
            data = f.read()
        data = data[:data.rfind(b"\n") + 1]
        self.end += len(data)
        return [json.loads(raw) for raw in data.splitlines()
                if raw.startswith((b'{"ev":"cancel"', b'{"ev":"forget"'))]

    def files(self) -> dict[str, FileState]:
        """Every file's state, replayed from the events (by file id)."""
        files: dict[str, FileState] = {}
        for ev in self.events():
            if ev["ev"] == "file":
                files[ev["fid"]] = FileState(ev["fid"], ev["tag"], list(ev["digests"]))
            elif ev.get("fid") in files:
                apply_event(files[ev["fid"]], ev)
        return files


def apply_event(state: FileState, ev: Mapping[str, Any]) -> None:
    """One ledger event (other than ``file``) applied to its file's state."""
    kind = ev["ev"]
    if kind == "uploaded":
        state.file_id = ev["file_id"]
    elif kind == "creating":
        state.creating_at = ev["t"]
    elif kind == "created":
        state.batch_id, state.state = ev["batch"], "submitted"
        state.provider = ev.get("provider", state.provider)
    elif kind == "online":
        state.online = True
    elif kind == "cancel":
        state.cancelled = True
    elif kind == "lost":
        state.state = "lost"
    elif kind == "forget" and state.state == "lost":
        state.state, state.counted = "failed", False
    elif kind in ("done", "failed"):
        state.state, state.counted = kind, bool(ev.get("counted", True))
        state.why = ev.get("why", "") or state.why


def _parsed(raw: bytes) -> Answer:
    """An answer line (``{"d":..., "s":..., "b":...}``) as its ``Answer``."""
    obj = json.loads(raw)
    return Answer(obj["s"], obj["b"])


class AnswerStore:
    """The provider's answers by request digest (``folder/answers/``).

    Only an index is kept in memory (digest -> file, offset, length); an answer's line is
    read when asked for (``get``), so a million answers cost an index, not their bodies."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder) / "answers"
        self._index: dict[str, int] = {}   # digest -> _loc(file number, offset, length)
        self._refused: set[str] = set()    # digests whose answer is a budget refusal
        self.online = False                # some answer is ONLINE (online_after): send it
        self._paths: list[Path] = []       # by file number
        self._loaded: dict[str, int] = {}  # file name -> its number
        self._fds = _Fds()
        self._mtime: int | None = None
        self._settled = False
        self._checked = -_ONLINE_CHECK  # when sends_online last read the folder (monotonic)
        self._where = _Folder(str(self.folder))
        self._lock = threading.Lock()
        self._rounds = 0      # rounds of the map's rows running in this process (``round``)
        self._quiet = False   # in them, the folder was read settled: a miss reads it no more

    def __reduce__(self) -> tuple[Any, ...]:  # another process builds its own index
        return (AnswerStore, (self.folder.parent,))

    def put(self, name: str, answers: Iterable[tuple[str, Answer]]) -> int:
        """Write one batch's answers as ``name`` (whole, atomically); how many."""
        with self.writer(name) as w:
            for digest, answer in answers:
                w.add(digest, answer)
        return w.n

    def writer(self, name: str) -> AnswerWriter:
        """Answers written one by one, in place as ``name`` once the ``with`` block ends."""
        return AnswerWriter(self, name)

    def make(self) -> None:
        """Make the folder if it is missing (before the rows run: a miss then costs an
        ``fstat``, not a failed open), dated a minute back: a folder whose mtime is under a
        second old is listed again at every miss (a change within the clock's grain may be
        unseen), and the first answer file written dates it now, which every reader sees."""
        try:
            self.folder.mkdir(parents=True)
        except FileExistsError:
            return
        past = time.time_ns() - 60 * 1_000_000_000
        os.utime(self.folder, ns=(past, past))

    def drop(self, prefix: str) -> None:
        """Remove the answer files named ``prefix...`` (before any worker reads them)."""
        for path in self.folder.glob(f"{prefix}*.jsonl"):
            path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        """While a round of the map's rows runs in this process: the driver writes answers
        only between two rounds (``run/batchloop.py``), so once a miss has found the folder
        settled (its mtime a second old) the round's later misses do not read it again (an
        ``fstat`` each); a round starting (another batch of rows) reads it at its first miss.
        An answer another process writes meanwhile is read by the next round (its request,
        recorded again, is answered already: the driver does not submit it)."""
        with self._lock:
            self._rounds += 1
            self._quiet = False
        try:
            yield
        finally:
            with self._lock:
                self._rounds -= 1
                self._quiet = self._quiet and self._rounds > 0

    def get(self, digest: str) -> Answer | None:
        """The answer to a request, or None (new answer files are read on a miss, unless
        ``round`` found them all)."""
        loc = self._index.get(digest)
        # a miss, or a budget refusal (a rerun drops them), reads new answer files first
        if (loc is None or digest in self._refused) and self._refresh():
            loc = self._index.get(digest)
        return None if loc is None else _parsed(self._line(loc))

    def sends_online(self) -> bool:
        """Whether some request is to be sent online (``online_after``): until then no call
        of the map reaches the network. Asked before every call: the folder is read again
        at most every ``_ONLINE_CHECK`` seconds (the driver writes answers between two
        runs of the rows; its own process's store knows them at once, and a call whose
        answer says online is sent online whatever this said)."""
        if self.online:
            return True
        now = time.monotonic()
        if now - self._checked >= _ONLINE_CHECK:
            self._checked = now
            self._refresh(force=True)
        return self.online

    def raw(self, digest: str) -> Answer | None:
        """``get`` with the body left as its JSON bytes (a replayed call hands them to the
        client as the response's content: no parse and encode in between)."""
        loc = self._index.get(digest)
        if loc is None:  # (a refusal is in the index too)
            return None if self._quiet else self.get(digest)
        if digest in self._refused:
            return self.get(digest)
        raw = self._line(loc)
        if raw.startswith(b'{"d":"') and raw[38:44] == b'","s":' and raw.endswith(b"}\n"):
            end = raw.index(b",", 44)
            if raw[end:end + 5] == b',"b":':
                return Answer(int(raw[44:end]), raw[end + 5:-2])
        return _parsed(raw)

    def _line(self, loc: int) -> bytes:
        return self._fds.read(self._paths[loc & _FILE_MASK], loc >> 64, (loc >> 24) & _LEN_MASK)

    def known(self) -> KeysView[str]:
        """The digests answered (as of the last ``refresh``), as a live view not to be
        changed: a block of requests is checked against it at once."""
        return self._index.keys()

    def __contains__(self, digest: object) -> bool:
        """Whether a request has an answer (as of the last ``refresh``; no body read)."""
        return digest in self._index

    def refresh(self) -> None:
        """Read the answer files written since the last look."""
        self._refresh(force=True)

    def __len__(self) -> int:
        self._refresh(force=True)
        return len(self._index)

    def _refresh(self, force: bool = False) -> bool:
        if self._quiet and not force:  # ``round``: the folder was found settled
            return False
        with self._lock:  # (also the folder's descriptor: one thread at a time)
            mtime = self._where.mtime()
            if mtime is None or (mtime == self._mtime and self._settled):
                self._quiet = self._rounds > 0 and mtime is not None
                return False
            # a folder changed within the clock's grain may change again unseen: read it
            # again until its mtime is a second old
            self._mtime, self._settled = mtime, time.time_ns() - mtime > 1_000_000_000
            names = self._where.names(".jsonl")
            if set(self._loaded).difference(names):  # files dropped: read anew
                self._index, self._refused, self._paths, self._loaded = {}, set(), [], {}
                self.online = False
                self._fds.close()
            for name in names:
                if name not in self._loaded:
                    self._load(self.folder / name)
            self._quiet = self._rounds > 0 and self._settled
            return True

    def _load(self, path: Path) -> None:
        lines: list[tuple[str, int, int, int]] = []
        offset = 0
        with open(path, "rb") as f:
            for raw in f:
                lines.append(_line_of(raw, offset))
                offset += len(raw)
        self._note(self._number(path), lines)

    def _number(self, path: Path) -> int:
        number = self._loaded.get(path.name)
        if number is None:
            number = self._loaded[path.name] = len(self._paths)
            self._paths.append(path)
        return number

    def _note(self, number: int, lines: Iterable[tuple[str, int, int, int]]) -> None:
        """Index the answers of file ``number`` (digest, status, offset, length): where
        each line is, whether it is sent online or a refusal."""
        index, refused = self._index, self._refused
        for digest, status, offset, length in lines:
            index[digest] = (offset << 64) | (length << 24) | number
            if status == 0:
                self.online = True
            if status == REFUSED:
                refused.add(digest)
            elif refused:
                refused.discard(digest)


def _line_of(raw: bytes, offset: int) -> tuple[str, int, int, int]:
    """An answer line written by ``AnswerWriter`` (``{"d":...,"s":...,"b":...}``) at
    ``offset``, as the index takes it: digest, status, offset, length."""
    if raw.startswith(b'{"d":"') and raw[38:44] == b'","s":':
        return raw[6:38].decode(), int(raw[44:raw.index(b",", 44)]), offset, len(raw)
    obj = json.loads(raw)  # not in the written layout: parse it
    return obj["d"], obj["s"], offset, len(raw)


_ONLINE_CHECK = 0.05  # seconds between two reads of the folder by sends_online
_FILE_MASK = (1 << 24) - 1
_LEN_MASK = (1 << 40) - 1


class AnswerWriter:
    """One answer file being written (temp file, renamed in place at the end); the writing
    store indexes its lines at once."""

    def __init__(self, store: AnswerStore, name: str) -> None:
        self.store, self.n, self.name = store, 0, name
        store.folder.mkdir(parents=True, exist_ok=True)
        self.tmp = store.folder / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        self.file = open(self.tmp, "wb")
        self.offset = 0
        self.lines: list[tuple[str, int, int, int]] = []  # digest, status, offset, length

    def add(self, digest: str, answer: Answer) -> None:
        """One answer; a body given as bytes is its JSON, written as it is (not encoded)."""
        body = answer.body
        line = b"".join((b'{"d":"', digest.encode(), b'","s":', str(answer.status).encode(),
                         b',"b":', body if type(body) is bytes else _COMPACT.encode(body).encode(),
                         b"}\n"))
        self.lines.append((digest, answer.status, self.offset, len(line)))
        self.file.write(line)
        self.offset += len(line)
        self.n += 1

    def add_lines(self, lines: AnsweredLines) -> None:
        """Answers already in this file's layout (``transport.read_at_once``), in order."""
        offset, out = self.offset, self.lines
        for digest, status, length in zip(lines.digests, lines.statuses, lines.lengths):
            out.append((digest, status, offset, length))
            offset += length
        self.file.write(lines.data)
        self.offset = offset
        self.n += len(lines.digests)

    def __enter__(self) -> AnswerWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.file.close()
        if exc_type is not None:
            self.tmp.unlink(missing_ok=True)
            return
        path = self.store.folder / f"{self.name}.jsonl"
        os.replace(self.tmp, path)
        store = self.store
        with store._lock:
            if path.name in store._loaded:  # written again: its old lines are gone
                store._fds.forget(path)
            store._note(store._number(path), self.lines)


_COMPACT = json.JSONEncoder(separators=(",", ":"))


class _Folder:
    """A folder's mtime, read by ``fstat`` of a descriptor kept open: every answer missed
    asks it, and a path's ``stat`` costs three times as much (a missing folder's, raising,
    four). A folder removed (its link count 0) is opened again by its path."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: list[int] = []  # the open descriptor, if any
        weakref.finalize(self, _close_dirs, self.fd)

    def mtime(self) -> int | None:
        """Its mtime in ns; None while it does not exist."""
        if self.fd:
            st = os.fstat(self.fd[0])
            if st.st_nlink:
                return st.st_mtime_ns
            _close_dirs(self.fd)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        self.fd.append(fd)
        return os.fstat(fd).st_mtime_ns

    def names(self, suffix: str) -> list[str]:
        """The names in it ending in ``suffix``, sorted (after ``mtime`` found it)."""
        return sorted(n for n in os.listdir(self.fd[0] if self.fd else self.path)
                      if n.endswith(suffix))


def _close_dirs(fds: list[int]) -> None:
    while fds:
        os.close(fds.pop())


class _Fds:
    """Open answer files (at most ``most``), read by offset. Rows ask their answers mostly
    in the order the file holds them (the order they were recorded in): a read just past
    the last block read takes the next ``_BLOCK`` bytes at once, and the answers within it
    are sliced from memory (a ``pread`` per answer cost more than the rest of the lookup);
    a read elsewhere takes its line alone. One block per open file."""

    def __init__(self, most: int = 64) -> None:
        self.most = most
        self.fds: dict[Path, int] = {}
        self.blocks: dict[Path, tuple[int, bytes]] = {}  # path -> (offset, its bytes)
        self.lock = threading.Lock()
        weakref.finalize(self, _close_all, self.fds)

    def read(self, path: Path, offset: int, length: int) -> bytes:
        with self.lock:
            block = self.blocks.get(path)
            if block is not None:
                at = offset - block[0]
                if 0 <= at and at + length <= len(block[1]):
                    return block[1][at:at + length]
            fd = self.fds.get(path)
            if fd is None:
                if len(self.fds) >= self.most:
                    self._close(next(iter(self.fds)))
                fd = self.fds[path] = os.open(path, os.O_RDONLY)
            if length >= _BLOCK or not (block is None or block[0] <= offset
                                        <= block[0] + len(block[1]) + _BLOCK):
                return os.pread(fd, length, offset)
            data = os.pread(fd, _BLOCK, offset)
            self.blocks[path] = (offset, data)
            return data[:length]

    def _close(self, path: Path) -> None:
        self.blocks.pop(path, None)
        fd = self.fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def forget(self, path: Path) -> None:
        with self.lock:
            self._close(path)

    def close(self) -> None:
        with self.lock:
            self.blocks.clear()
            _close_all(self.fds)


_BLOCK = 1 << 18  # bytes read ahead of an answer read in file order (~600 answers)


def _close_all(fds: dict[Path, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()
