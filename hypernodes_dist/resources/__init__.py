"""Resources: what a node needs but must neither build per call nor ship (an HTTP or LLM
client with its connection pool, a database connection, a loaded model).

- ``declare.py``: ``@resource`` and the ``Resource`` it makes (put in a graph's node list);
- ``registry.py``: the per-process registry that builds each resource once (per process and
  event loop), hands it to every call, and tears it down when the engine closes or the
  process ends;
- ``bind.py``: at plan compile, a node that takes resources becomes a node whose call
  fetches them from the registry, so every executor (columnar, item flow, reactive
  scheduler, batch calls) and every engine calls it unchanged.
"""

from hypernodes_dist.resources.declare import Resource, resource
from hypernodes_dist.resources.registry import release_resources

__all__ = ["Resource", "resource", "release_resources"]
