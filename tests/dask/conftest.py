"""Shared Dask resources for the engine-specific tests: one LocalCluster per session."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.groups import finish_after_group

HERE = Path(__file__).parent
SESSION = ("cluster", "client", "processes_engine", "distributed_engine")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of the session's cluster and process pool run on one pytest-xdist worker
    (``--dist loadgroup``): they start once per run, not once per worker."""
    for item in items:
        if HERE not in item.path.parents:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        uses = set(getattr(item, "fixturenames", ())) | {
            f"{params.get(name)}_engine" for name in ("any_engine", "remote_engine")}
        if uses & set(SESSION):
            item.add_marker(pytest.mark.xdist_group("dask-session"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """The session's cluster and process pool stop after the group's last test."""
    result = yield
    finish_after_group(item, nextitem, SESSION)
    return result


@pytest.fixture(scope="session")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0", silence_logs=logging.WARNING) as c:
        yield c


@pytest.fixture(scope="session")
def client(cluster):
    from distributed import Client

    with Client(cluster, set_as_default=False) as c:
        yield c


@pytest.fixture(scope="session")
def processes_engine():
    from hypernodes_dask import DaskEngine

    eng = DaskEngine(scheduler="processes", num_workers=2)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def distributed_engine(client):
    from hypernodes_dask import DaskEngine

    eng = DaskEngine(client=client)
    yield eng
    eng.close()


@pytest.fixture(params=["threads", "sync", "processes", "distributed"])
def any_engine(request):
    """A Dask engine on each scheduler (processes/distributed reuse the session resources)."""
    from hypernodes_dask import DaskEngine

    if request.param == "processes":
        return request.getfixturevalue("processes_engine")
    if request.param == "distributed":
        return request.getfixturevalue("distributed_engine")
    return DaskEngine(scheduler=request.param, num_workers=2)


@pytest.fixture(params=["processes", "distributed"])
def remote_engine(request):
    """Engines whose tasks run in other processes (pickling matters)."""
    return request.getfixturevalue(f"{request.param}_engine")
