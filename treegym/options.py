"""Command-line option parsers shared by every subcommand. A leaf: it imports nothing of treegym's
but its errors, so any layer's CLI module can use it without a cycle through ``treegym.cli``."""

from __future__ import annotations

import json
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
