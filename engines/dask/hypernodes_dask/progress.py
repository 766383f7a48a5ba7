"""Progress on a ``distributed`` cluster: workers log their finished row counts as worker
events, which the driver's client subscribes to (Dask's own channel: it reaches workers
on any machine, through the scheduler connection). All maps share one topic (the
scheduler keeps a bounded log per topic); each message names its map's channel."""

from __future__ import annotations

from typing import Any

from hypernodes_dist.execution.progress import ProgressChannel, Receive, Updates
from hypernodes_dist.perprocess import Table

__all__ = ["WorkerEvents", "TOPIC"]

TOPIC = "hypernodes-progress"
# the driver's: channel key -> its receiver, id(client) -> open channels on it (the lock
# is the receivers')
_RECEIVERS: Table[str, Receive] = Table("dask.progress.receivers")
_SUBSCRIBED: Table[int, int] = Table("dask.progress.subscribed")


def _worker() -> Any:
    """The Dask worker of this process (the task's, or, in a thread the task started,
    the running one), or ``None``."""
    from distributed import get_worker
    from distributed.worker import Worker

    try:
        return get_worker()
    except ValueError:
        return next((w for w in list(Worker._instances) if w.status.name == "running"), None)


def _handler(event: tuple[float, Any]) -> None:
    key, pairs = event[1]
    receive = _RECEIVERS.get(key)
    if receive is not None:
        receive({int(k): (int(done), metered) for k, done, metered in pairs})


class WorkerEvents(ProgressChannel):
    """``send`` logs a worker event (``Worker.log_event``: thread-safe, batched with the
    worker's other messages); the client's handler hands it to the map's receiver."""

    def __init__(self, client: Any, receive: Receive) -> None:
        super().__init__()
        self._client = client
        with _RECEIVERS.lock:
            _RECEIVERS[self.key] = receive
            if not _SUBSCRIBED.get(id(client)):
                client.subscribe_topic(TOPIC, _handler)
            _SUBSCRIBED[id(client)] = _SUBSCRIBED.get(id(client), 0) + 1

    def send(self, updates: Updates) -> None:
        worker = _worker()
        if worker is not None:
            worker.log_event(TOPIC, [self.key, [[k, done, metered] for k, (done, metered)
                                                in updates.items()]])

    def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        with _RECEIVERS.lock:
            _RECEIVERS.pop(self.key, None)
            left = _SUBSCRIBED[id(client)] = _SUBSCRIBED.get(id(client), 1) - 1
            if left > 0:
                return
            del _SUBSCRIBED[id(client)]
        try:
            client.unsubscribe_topic(TOPIC)
        except Exception:  # noqa: BLE001 -- the client may be closing
            pass

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "_client": None}
