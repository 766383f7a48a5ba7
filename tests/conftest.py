"""Make the repository root importable, so worker processes can import ``tests.*`` modules;
give each test process (one per pytest-xdist worker) machine-wide limit state of its own."""

from __future__ import annotations

import gc
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import certifi
import pytest
from dask import config as dask_config

from hypernodes_bench.batch_server import DEFAULTS as BATCH_DEFAULTS
from hypernodes_bench.batch_server import BatchServer
from hypernodes_bench.llm_server import LLMServer
from hypernodes_dist.batchapi.recording import answered_scope
from hypernodes_dist.policies.machine import remove_semaphores
from tests import fresh, warmup
from tests.reliability import figures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p
)

# pytest-xdist gives its workers COLUMNS=80 and LINES=24 (the controller's terminal): tqdm
# would cut the progress bars the tests read at 79 characters. A worker runs its tests as a
# plain pytest process does: no terminal size.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)

# A suite started from a shell that ignores SIGINT (a background job of a script, nohup)
# hands every process SIG_IGN for it: Python then installs no KeyboardInterrupt handler, and
# the Ctrl-C tests (which press Ctrl-C as a user at a terminal does) would test nothing but
# that. A test process takes Python's own handler, as at a terminal; the processes it starts
# then start with the default disposition too (a handler is reset by exec, SIG_IGN is not).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Dask's clusters in the tests (LocalClusters, `dask scheduler`/`dask worker` processes) run
# without their background sampling, which nothing here reads: the statistical profiler (a
# stack sample every 10 ms), the event-loop health tick (20 ms), the system monitor (500 ms)
# and the memory monitor (100 ms). An idle 2-worker LocalCluster then costs 0.6 CPU s a minute
# instead of 3.6, and the session clusters live for most of a run. Set in the environment, so
# every process the tests start (workers, scripts) inherits it.
DASK_LEAN = {
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "500ms",
    "DASK_DISTRIBUTED__ADMIN__TICK__CYCLE": "5s",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "5s",
    "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "2s",
}
for _name, _value in DASK_LEAN.items():
    os.environ.setdefault(_name, _value)
dask_config.refresh()  # dask was imported before the environment had these

# Processes the test processes start themselves (Dask's process pools and LocalClusters, the
# tests' other processes) start from a fork server (``tests/fresh.py``); the jobs and scripts
# the tests run as programs start theirs with Dask's default, spawn, as a user's program does.
os.environ.update(fresh.S3_ENV)
dask_config.set(fresh.DASK_CONFIG)

# Concurrency limits are kernel semaphores and rate/hold-off state is in files, both keyed by
# the limits directory and shared by every process of the machine: two xdist workers (or two
# test runs) testing the same node would share its limit. Each pytest process gets its own
# directory (inherited by the workers, clusters and scripts its tests start).
LIMITS_DIR = tempfile.mkdtemp(prefix=f"hn-limits-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
os.environ["HYPERNODES_LIMITS_DIR"] = LIMITS_DIR


def _one_certificate_bundle() -> str:
    """A CA bundle of one certificate (certifi's first), in a folder of this process."""
    bundle = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n",
                       Path(certifi.where()).read_text(), re.S)
    assert bundle is not None, certifi.where()
    path = os.path.join(tempfile.mkdtemp(prefix="hn-ca-"), "one-ca.pem")
    Path(path).write_text(bundle.group(0))
    return path


# Every HTTP client the tests build (openai, anthropic, httpx: thousands per run, in the
# workers and the processes they start) loads a CA bundle for TLS: 17 ms of CPU each with
# certifi's or the system's (~150 certificates), 0.4 ms with one. The tests speak plain HTTP
# to 127.0.0.1 only and verify no TLS peer: their processes get a bundle of one certificate
# (httpx reads SSL_CERT_FILE; xdist workers inherit the controller's). Daft, imported by
# every worker and by Ray's, sends no telemetry.
if not os.environ.get("HN_TESTS_CA_BUNDLE"):
    os.environ["SSL_CERT_FILE"] = os.environ["HN_TESTS_CA_BUNDLE"] = _one_certificate_bundle()
    CA_DIR: str | None = os.path.dirname(os.environ["SSL_CERT_FILE"])
else:
    CA_DIR = None
os.environ.setdefault("DO_NOT_TRACK", "1")


def pytest_configure(config) -> None:
    """The xdist controller, before it starts its workers, compiles what they import and
    collect (``tests/warmup.py``)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        warmup.compile_what_workers_import()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What a test process holds after collection (every imported module, the test items)
    lives to its end: frozen, the collector's full passes no longer walk it (they took
    ~0.25 s each in a worker, ~80 a run)."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config) -> None:
    """Semaphores outlive their processes: remove this process's, then its limits folder
    (and the CA bundle folder it made)."""
    remove_semaphores(LIMITS_DIR)
    shutil.rmtree(LIMITS_DIR, ignore_errors=True)
    if CA_DIR is not None:
        shutil.rmtree(CA_DIR, ignore_errors=True)


WORKER_FIGURES: list[dict] = []  # the reliability figures each xdist worker sent back


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its reliability figures to the controller."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["reliability"] = figures.collect()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    WORKER_FIGURES.append(getattr(node, "workeroutput", {}).get("reliability", {}))


RERUN_FAILURES: list[tuple[str, str]] = []  # (test id, its first attempt's failure)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test that failed and was run again (``--reruns``): its first failure is kept, to be
    shown at the end (a rerun that passes would hide the cause of a flaky test)."""
    if report.outcome == "rerun":
        RERUN_FAILURES.append((report.nodeid, report.longreprtext))


def pytest_terminal_summary(terminalreporter) -> None:
    """The reliability suite's figures, summed over the workers (or of this process), and
    the first failure of every test that needed its rerun."""
    found = figures.lines(figures.merge(WORKER_FIGURES or [figures.collect()]))
    if found:
        terminalreporter.write_sep("-", "reliability figures")
        for line in found:
            terminalreporter.write_line(line)
    for nodeid, failure in RERUN_FAILURES:
        terminalreporter.write_sep("-", f"first attempt of {nodeid} (rerun)")
        for line in failure.splitlines()[-25:]:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def _fork_server():
    """The fork server starts before the first test, with the test process's environment
    (not in the Daft-on-Ray pytest process, which starts no process of its own)."""
    if os.environ.get("HYPERNODES_CONFORMANCE_DAFT") != "ray":
        fresh.start()


@pytest.fixture(scope="session")
def llm_servers():
    """``llm_servers(**options)`` -> a loopback ``LLMServer`` with those options, started
    once per test process and shared by every test asking for the same options (a fixture
    of a module parametrized by engine would otherwise start one per engine). Its rate
    window and failure sequence carry on from test to test; ``reset()`` clears its stats.
    The first runs in a process of its own, the others in that process, each on a port of
    its own (``LLMServer.start(within=...)``): one server process per test process."""
    started: dict[tuple, LLMServer] = {}

    def shared(**options) -> LLMServer:
        key = tuple(sorted(options.items()))
        if key not in started:
            host = next(iter(started.values()), None)
            started[key] = LLMServer(**options).start(within=host)
        return started[key]

    yield shared
    for server in started.values():
        server.stop()


@pytest.fixture(scope="session")
def batch_server():
    """The loopback fake Batch API provider (``hypernodes_bench.batch_server``), one per test
    process, started by the first test that asks for it (its batches and files stay from test
    to test: each map finds its own by its metadata)."""
    with BatchServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _in_batch_api_stays_in_the_test():
    """A recording client's answer read outside a node's scope (a test's own check) sets
    ``in_batch_api()`` for the thread: False again after the test."""
    with answered_scope():
        yield


@pytest.fixture
def batch_fake(batch_server):
    """The module's fake provider, counters zeroed before the test, knobs back to the
    defaults after it."""
    batch_server.reset()
    yield batch_server
    batch_server.configure(**BATCH_DEFAULTS)


@pytest.fixture(scope="session")
def llm_server(llm_servers):
    """A loopback OpenAI-compatible server (``hypernodes_bench.llm_server``), 10-30 ms
    answers, no limits; shared by the whole session (``reset()`` clears its stats)."""
    return llm_servers()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long tests (marked ``slow``) first, in their order: pytest-xdist then starts them
    while the short ones fill the other workers, instead of one of them ending the run alone.
    Then the tests sharing an ``xdist_group`` (each engine variant of the conformance suite,
    the Dask session cluster: started once per run, on the worker running the group), then
    the rest, which fill the workers at the end. ``make test`` keeps this order for the
    groups (``--no-loadscope-reorder``). Tests of the session-scoped ``engine`` fixture are
    never marked slow, so its grouping by engine is kept."""
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") is not None:
            return 0
        return 1 if item.get_closest_marker("xdist_group") is not None else 2

    items.sort(key=rank)
    grouped = [i for i in items if i.get_closest_marker("xdist_group") is not None]
    if getattr(config.option, "loadgroup", False) and grouped and "@" not in grouped[0].nodeid:
        raise pytest.UsageError(  # pytest 9.2 keeps the id in _id: xdist 3.8 cannot rename it
            "pytest-xdist ignored the xdist_group marks (this pytest does not let it add the "
            "group to the test ids): every worker would start every engine; install "
            "pytest<9.2 (pyproject.toml's test extra)")
