"""Is this value an env state of the declared shape? The check behind ``restore()``.

A snapshot may have crossed a wire (serve-env) or a file (a pickle), so its state is data
from outside: ``shape_problem`` walks it against the type hints of the state dataclass (nested
dataclasses, tuples, frozensets, unions, scalars) before an env uses it; each env then checks
its own rules (``ForkableEnv.state_problem``: ranges, a task it knows). Either names the first
field that is wrong, so the refusal says where.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any

_MAX_ITEMS = 1 << 20  # a tuple in a state longer than this is not one an env made


@functools.cache
def _hints(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints.get(f.name, Any)) for f in dataclasses.fields(cls))


def shape_problem(value: Any, hint: Any, where: str = "state") -> str | None:
    """None when ``value`` fits the type ``hint``; else what is wrong, and where."""
    if hint is Any or hint is object:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        problems = [shape_problem(value, arm, where) for arm in args]
        return None if any(p is None for p in problems) else next(p for p in problems if p)
    if origin in (tuple, frozenset):
        return _container_problem(value, origin, args, where)
    if origin is typing.Literal:
        return None if value in args else f"{where} is {_short(value)}, not one of {args}"
    if hint is type(None):
        return None if value is None else f"{where} is {_short(value)}, not None"
    if not isinstance(hint, type):
        return None  # a hint this check does not read (a TypeVar, a Callable): the env's own rules decide
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else f"{where} is {_short(value)}, not a finite number"
    if hint is int and isinstance(value, bool):
        return f"{where} is {_short(value)}, not an integer"
    if not isinstance(value, hint):
        return f"{where} is {_short(value)}, not a {hint.__name__}"
    if dataclasses.is_dataclass(hint):
        for name, field_hint in _hints(hint):
            problem = shape_problem(getattr(value, name, None), field_hint, f"{where}.{name}")
            if problem:
                return problem
    return None


def _container_problem(value: Any, origin: type, args: tuple[Any, ...], where: str) -> str | None:
    if not isinstance(value, origin):
        return f"{where} is {_short(value)}, not a {origin.__name__}"
    if len(value) > _MAX_ITEMS:
        return f"{where} holds {len(value)} items"
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            return f"{where} has {len(value)} items, not {len(args)}"
        pairs = zip(value, args)
    else:
        item_hint = args[0] if args else Any
        pairs = ((v, item_hint) for v in value)
    for i, (item, item_hint) in enumerate(pairs):
        problem = shape_problem(item, item_hint, f"{where}[{i}]")
        if problem:
            return problem
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
