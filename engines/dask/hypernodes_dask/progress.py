"""Progress on a ``distributed`` cluster: workers log their finished row counts as worker
events on a topic of the map's own, which the driver's client subscribes to (Dask's own
channel: it reaches workers on any machine, through the scheduler connection)."""

from __future__ import annotations

from typing import Any

from hypernodes_dist.execution.progress import ProgressChannel, Receive

__all__ = ["WorkerEvents"]


def _worker() -> Any:
    """The Dask worker of this process (the task's, or, in a thread the task started,
    the running one), or ``None``."""
    from distributed import get_worker
    from distributed.worker import Worker

    try:
        return get_worker()
    except ValueError:
        return next((w for w in list(Worker._instances) if w.status.name == "running"), None)


class WorkerEvents(ProgressChannel):
    """``send`` logs a worker event (``Worker.log_event``: thread-safe, batched with the
    worker's other messages); the client's handler hands it to the driver's receiver."""

    def __init__(self, client: Any, receive: Receive) -> None:
        super().__init__()
        self.topic = f"hn-progress-{self.key}"
        self._client = client

        def handler(event: tuple[float, Any]) -> None:
            receive({int(k): int(v) for k, v in event[1]})

        client.subscribe_topic(self.topic, handler)

    def send(self, updates: dict[int, int]) -> None:
        worker = _worker()
        if worker is not None:
            worker.log_event(self.topic, [[k, v] for k, v in updates.items()])

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.unsubscribe_topic(self.topic)
            except Exception:  # noqa: BLE001 -- the client may be closing
                pass

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "topic": self.topic, "_client": None}
