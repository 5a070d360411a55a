"""A user's ``module:attr`` spec (an env class, a branching rule, an agent) -> the object it names.

This is the one place treegym imports by a computed name, and it is only for specs a user
supplies: built-in parts are reached through real imports that every reader and tool can see.
"""

from __future__ import annotations

import importlib
from typing import Any


def load_object(spec: str) -> Any:
    """The object ``module:attr`` names (``attr`` may be dotted: ``mod:Class.method``).

    Raises ``ImportError`` when the module does not import and ``AttributeError`` when it has no
    such attribute; each caller words them for its own kind of spec.
    """
    module_name, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
