"""Known ``create`` calls' 2xx answers built into the SDK's own return value, without its
request and response path.

On the replay pass of a ``batch_api=True`` node a call the fast path (``fastcalls.py``) takes
is answered from the batch. Through the SDK that answer costs a request built (its param
transforms, the request options), a ``Response`` made and read, and only then what the
user gets: ``client._process_response_data(data=..., cast_to=...)`` (``construct_type``),
the method's post-parser (openai embeddings: the base64 vectors decoded when the caller did
not ask for a format) and the response ids the SDK sets from the response's headers
(``_request_id``; anthropic also ``_workspace_id``: None, an answer from a batch has no
headers). ``Replier`` does exactly these steps, with the SDK's own functions, from the answer.

Self-checking (``same``): the first fast answer per (client class, method, arguments given)
in a process is also made the SDK's way and compared: type, ``model_dump()``, the JSON,
every nested model's type, fields set, extras and private attributes; on any difference the
fast answer is off for that method in this process. A client with strict response
validation, or a method whose SDK parts are not where they were, takes the SDK's way.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

__all__ = ["Reply", "Replier", "replier", "same", "embeddings_post"]


class Reply(NamedTuple):
    """How a method's ``create`` turns a 2xx body into its return value."""

    cast_to: str  # "module:Class" the SDK parses the answer into
    # the post-parser the SDK's create applies, given the call's arguments (None: none)
    post: Callable[[Any, Mapping[str, Any]], Callable[[Any], Any] | None] | None = None
    # whether the SDK's create would do more than build and send (e.g. warn): its way then
    loud: Callable[[Any, Mapping[str, Any]], bool] | None = None


def embeddings_post(resource: Any, kwargs: Mapping[str, Any]) -> Callable[[Any], Any] | None:
    """openai embeddings' post-parser: ``parse_embedding_response`` with the call's
    ``encoding_format`` (its ``omit`` when not given), as ``prepare_embedding_request``
    makes it."""
    parsing = sys.modules.get("openai.lib._parsing._embeddings")
    types_ = sys.modules.get("openai._types")
    parse = getattr(parsing, "parse_embedding_response", None)
    if parse is None or types_ is None:
        raise LookupError("openai's embeddings parser is not where it was")
    return functools.partial(parse, encoding_format=kwargs.get("encoding_format",
                                                               types_.omit))


def _resolve(name: str) -> Any:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def _ids_of(models: Any) -> Callable[[Any], None] | None:
    """The SDK's setter of the response ids on a parsed model, with the ids of a response
    that carries no id headers (None)."""
    both = getattr(models, "add_response_ids", None)
    if both is not None:
        return lambda obj: both(obj, request_id=None, workspace_id=None)
    one = getattr(models, "add_request_id", None)
    if one is not None:
        return lambda obj: one(obj, None)
    return None


class Replier:
    """One client's ``create`` return value of a method, built from a 2xx answer."""

    def __init__(self, reply: Reply, resource: Any, process: Callable[..., Any],
                 model: type, ids: Callable[[Any], None]) -> None:
        self.reply, self.resource, self.process = reply, resource, process
        self.cast_to, self.model, self.ids = _resolve(reply.cast_to), model, ids

    def takes(self, kwargs: Mapping[str, Any]) -> bool:
        """Whether this call's answer is built here (not one the SDK would also warn of)."""
        loud = self.reply.loud
        return loud is None or not loud(self.resource, kwargs)

    def build(self, body: Any, kwargs: Mapping[str, Any]) -> Any:
        """The return value of ``create(**kwargs)`` answered ``body`` (its JSON bytes, or
        the parsed JSON: copied, the user may change what they get), or None: the SDK's way
        (a body that is not a JSON object)."""
        data = json.loads(body) if isinstance(body, (bytes, str)) else json.loads(
            json.dumps(body))
        if type(data) is not dict:
            return None
        parsed = self.process(data=data, cast_to=self.cast_to, response=None)
        post = self.reply.post
        parser = None if post is None else post(self.resource, kwargs)
        if parser is not None:
            parsed = parser(parsed)
        if isinstance(parsed, self.model):
            self.ids(parsed)
        return parsed


def replier(reply: Reply | None, resource: Any) -> Replier | None:
    """The ``Replier`` of ``resource``'s ``create`` (None: the SDK's way: no ``reply``
    known, strict response validation, or the SDK's parts not where they were)."""
    client = getattr(resource, "_client", None)
    if reply is None or client is None or getattr(client, "_strict_response_validation", True):
        return None
    models = sys.modules.get(type(client).__module__.split(".")[0] + "._models")
    model, ids = getattr(models, "BaseModel", None), _ids_of(models)
    process = getattr(client, "_process_response_data", None)
    if not isinstance(model, type) or ids is None or process is None:
        return None
    try:
        return Replier(reply, resource, process, model, ids)
    except (ImportError, AttributeError):
        return None


def _tree(obj: Any, model: type) -> Any:
    """``obj`` as a comparable tree: every model's type, fields (in order), fields set,
    extras and private attributes; containers by their type and items; scalars by type
    and value."""
    if isinstance(obj, model):
        return (type(obj), [(k, _tree(v, model)) for k, v in vars(obj).items()],
                sorted(getattr(obj, "__pydantic_fields_set__", ())),
                _tree(getattr(obj, "__pydantic_extra__", None), model),
                _tree(getattr(obj, "__pydantic_private__", None), model))
    if isinstance(obj, dict):
        return (type(obj), [(k, _tree(v, model)) for k, v in obj.items()])
    if isinstance(obj, (list, tuple)):
        return (type(obj), [_tree(v, model) for v in obj])
    return (type(obj), obj)


def same(fast: Any, sdk: Any, model: type) -> bool:
    """Whether the fast answer is the SDK's own: type, ``model_dump()``, its JSON, and the
    whole tree (nested types, fields set, private attributes)."""
    try:
        if type(fast) is not type(sdk) or _tree(fast, model) != _tree(sdk, model):
            return False
        if isinstance(sdk, model):
            dump = getattr(sdk, "model_dump", None)
            if dump is not None and (dump(warnings=False) != fast.model_dump(warnings=False)
                                     or dump(mode="json", warnings=False)
                                     != fast.model_dump(mode="json", warnings=False)):
                return False
        return True
    except Exception:  # noqa: BLE001 - a model we cannot compare: not proven the same
        return False
