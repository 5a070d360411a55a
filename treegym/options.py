"""Command-line option parsers shared by every subcommand. A leaf: it imports nothing of treegym's
but its errors, so any layer's CLI module can use it without a cycle through ``treegym.cli``."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

from treegym.errors import ConfigError


def json_object_option(text: str | None, flag: str = "--env-kwargs") -> dict:
    """A command-line option that holds a JSON object (e.g. ``--env-kwargs '{"index": "bm25"}'``)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object")
    return value


def parse_kwargs(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; values are read as JSON when they parse, else kept as text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``lo..hi`` (no upper bound without ``hi``); anything else
    is argparse's one-line error naming the option, before any work starts."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None
        if value < lo or (hi is not None and value > hi):
            bounds = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"must be {'in ' if hi is not None else ''}{bounds}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


def float_in(lo: float, hi: float = math.inf, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a number in ``lo..hi`` (``above``: strictly above ``lo``); NaN never."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
        if math.isnan(value) or value < lo or (above and value == lo) or value > hi:
            low = f"above {lo:g}" if above else f"at least {lo:g}"
            raise argparse.ArgumentTypeError(f"must be {low}{'' if hi == math.inf else f' and at most {hi:g}'}, "
                                             f"got {text[:40]}")
        return value

    parse.__name__ = "float"
    return parse
