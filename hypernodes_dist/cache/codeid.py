"""Code identity of node functions: what makes a cached result stale when code changes.

A node's code identity covers its source (or bytecode), defaults, closure values, and what it
reads through global names and module attributes, recursively: functions by code (those of
the stdlib and site-packages by name only), immutable constants (str, numbers, bytes, None,
and tuples/frozensets of them) by value. ``helpers.fmt(x)`` and ``prompts.SYSTEM`` count like
``from helpers import fmt``: editing ``fmt``'s body, or what ``SYSTEM`` says, changes the key.
Modules count by the attributes the function's code names, ``MODULE_DEPTH`` levels deep
(``pkg.sub.CONST``). Mutable module state (lists, dicts, objects) does not count: salt the node
with ``version=`` when such data changes what it returns.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import sysconfig
import textwrap
import types
from collections.abc import Callable
from typing import Any

from hypernodes_dist.cache.hashing import (
    UnhashableValueError,
    _qualname,
    combine,
    hash_value,
    set_code_identity,
)

__all__ = ["MODULE_DEPTH", "hash_code"]

MODULE_DEPTH = 3  # pkg.sub.mod.attr: modules followed through this many attribute levels


_SOURCE_MEMO: dict[int, tuple[types.CodeType, str]] = {}


@functools.lru_cache(maxsize=1)
def _library_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple(sorted({paths[k] for k in keys if k in paths}))


def hash_code(func: Callable, version: str | None = None) -> str:
    """Code identity of a node function.

    Source text from the ``def`` line on (decorators stripped, dedented, trailing spaces removed)
    + closure values + defaults + the code of the global functions and simple constants it names
    (recursively, cycle-guarded; functions of the stdlib or site-packages count by name only).
    Without source (REPL, lambdas) the bytecode, constants and names count instead. Partials,
    bound methods and callable instances are handled. With ``version=``, only the qualified name
    and the version string count. Compute it once in the driver and ship it with the plan: a
    worker without the source file would fall back to bytecode and get a different id.
    """
    if version is not None:
        name = getattr(func, "__qualname__", None) or _qualname(type(func))
        return combine("hn-code-version", name, str(version))
    return _code_id(func, set())


def _code_id(func: Any, active: set[int]) -> str:
    if id(func) in active:
        return combine("hn-code-cycle", getattr(func, "__qualname__", "?"))
    active.add(id(func))
    try:
        return _code_id_inner(func, active)
    finally:
        active.discard(id(func))


def _code_id_inner(func: Any, active: set[int]) -> str:
    if isinstance(func, functools.partial):
        args = _opaque_id((func.args, func.keywords), active)
        return combine("hn-partial", _code_id(func.func, active), args)
    if isinstance(func, types.MethodType):
        return combine(
            "hn-method", _code_id(func.__func__, active), _opaque_id(func.__self__, active)
        )
    wrapped = getattr(func, "__wrapped__", None)
    if wrapped is not None and wrapped is not func and not isinstance(func, type):
        return _code_id(wrapped, active)
    if isinstance(func, types.FunctionType):
        return _function_id(func, active)
    if isinstance(func, type):
        return combine("hn-ref", _qualname(func))
    if isinstance(func, types.BuiltinFunctionType):
        return combine("hn-ref", _ref_name(func))
    call = inspect.getattr_static(type(func), "__call__", None)
    if isinstance(call, types.FunctionType):
        try:
            cls_src = _clean_source(inspect.getsource(type(func)))
        except (OSError, TypeError):
            cls_src = _code_fallback(call.__code__)
        state = _opaque_id(vars(func) if hasattr(func, "__dict__") else func, active)
        return combine("hn-instance", _qualname(type(func)), cls_src, _code_id(call, active), state)
    return combine("hn-ref", _ref_name(func), _opaque_id(func, active))


def _ref_name(obj: Any) -> str:
    mod = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return f"{mod}.{name}" if name else _qualname(type(obj))


def _opaque_id(value: Any, active: set[int]) -> str:
    """Id of a closed-over value; values that cannot be hashed count by their type only."""
    if isinstance(value, (types.FunctionType, functools.partial, types.MethodType)):
        return _code_id(value, active)
    try:
        return hash_value(value)
    except (UnhashableValueError, RecursionError):
        return combine("hn-opaque", _qualname(type(value)))


def _function_id(func: types.FunctionType, active: set[int]) -> str:
    code = func.__code__
    parts = [_source_id(func), _opaque_id(func.__defaults__, active)]
    parts.append(_opaque_id(func.__kwdefaults__, active))
    for name, cell in zip(code.co_freevars, func.__closure__ or (), strict=False):
        try:
            contents = cell.cell_contents
        except ValueError:  # empty cell
            contents = _EMPTY
        parts += [name, _opaque_id(contents, active) if contents is not _EMPTY else "-"]
    globs = func.__globals__
    names = _global_names(code)
    for name in sorted(names):
        if name in globs:
            ident = _attribute_id(globs[name], names, active, MODULE_DEPTH)
            if ident is not None:
                parts += [name, ident]
    return combine("hn-func", *parts)


def _attribute_id(obj: Any, names: set[str], active: set[int], depth: int) -> str | None:
    """Identity of what a function reads through a global name or a module attribute:
    functions by code (library ones by name), immutable constants by value, modules by the
    attributes the function names (``depth`` levels of ``pkg.mod.attr``); else ``None``."""
    target = getattr(obj, "__wrapped__", obj) if not isinstance(obj, type) else obj
    if isinstance(target, types.FunctionType):
        if target.__code__.co_filename.startswith(_library_prefixes()):
            return combine("hn-ref", _ref_name(target))
        return _code_id(target, active)
    if _is_simple_const(obj):
        return hash_value(obj)
    if isinstance(obj, types.ModuleType) and depth > 0:
        return _module_id(obj, names, active, depth)
    return None


def _module_id(mod: types.ModuleType, names: set[str], active: set[int], depth: int) -> str:
    """A module by the attributes a function may read from it: every name the function's
    code uses that the module defines (``helpers.fmt``, ``prompts.SYSTEM``). Library
    modules (stdlib, site-packages, builtins) count by name only."""
    path = getattr(mod, "__file__", None)
    if not path or path.startswith(_library_prefixes()) or id(mod) in active:
        return combine("hn-ref", mod.__name__)
    active.add(id(mod))
    try:
        attrs = vars(mod)
        parts = [mod.__name__]
        for attr in sorted(names & attrs.keys()):
            ident = _attribute_id(attrs[attr], names, active, depth - 1)
            if ident is not None:
                parts += [attr, ident]
        return combine("hn-module", *parts)
    finally:
        active.discard(id(mod))


_EMPTY = object()


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _is_simple_const(obj: Any) -> bool:
    if type(obj) in (str, int, float, bool, bytes, complex, type(None)):
        return True
    if type(obj) in (tuple, frozenset) and len(obj) <= 64:
        return all(_is_simple_const(x) for x in obj)
    return False


def _source_id(func: types.FunctionType) -> str:
    code = func.__code__
    memo = _SOURCE_MEMO.get(id(code))
    if memo is not None and memo[0] is code:
        return memo[1]
    src = None
    if code.co_name != "<lambda>":
        try:
            src = _clean_source(inspect.getsource(func))
        except (OSError, TypeError, SyntaxError):
            src = None
    result = combine("hn-src", src) if src is not None else _code_fallback(code)
    if len(_SOURCE_MEMO) > 8192:
        _SOURCE_MEMO.clear()
    _SOURCE_MEMO[id(code)] = (code, result)
    return result


def _clean_source(src: str) -> str:
    """Dedent, drop decorator lines (everything before the def/class line), strip line ends."""
    src = textwrap.dedent(src)
    lines = src.splitlines()
    try:
        tree = ast.parse(src)
        first = tree.body[0]
        start = first.lineno - 1 if isinstance(first, _DEFS) else 0
    except (SyntaxError, IndexError):
        start = 0
    return "\n".join(line.rstrip() for line in lines[start:])


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _code_fallback(code: types.CodeType) -> str:
    """Identity of a code object without its source: bytecode, constants, names, arguments."""
    consts = [
        _code_fallback(c) if isinstance(c, types.CodeType) else hash_value(c)
        for c in code.co_consts
    ]
    shape = (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)
    return combine(
        "hn-bytecode",
        sys.implementation.cache_tag or "",
        code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
        code.co_code.hex(),
        *consts,
        "|".join(code.co_names),
        "|".join(code.co_varnames),
        "|".join(code.co_freevars),
        repr(shape),
    )


set_code_identity(hash_code)  # function values hash by their code identity
