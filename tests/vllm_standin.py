"""A stand-in ``vllm`` module generated from benchmarks/vllm_manifest.json (the real wheel's API).

Its ``LLM`` has exactly the manifest's methods and takes exactly their parameters (and, through
``**kwargs``, the ``EngineArgs`` fields); ``SamplingParams`` takes exactly vLLM's fields; the
outputs carry exactly vLLM's attributes; ``LLM(...)`` refuses a ``VLLM_*`` variable vLLM does
not read (set by the code under test) and a dtype it does not know. A name the real vLLM lacks fails here as it would there.
What runs behind it is an engine the test gives (e.g. transformers sampling on the CPU): it gets
each call's arguments by name, only once they have passed the manifest.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _vllm_api_check as api_check  # noqa: E402

MANIFEST: dict[str, Any] = json.loads(api_check.MANIFEST.read_text(encoding="utf-8"))


def _checked(qualname: str, method: str, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, or the TypeError the real vLLM would raise."""
    problems = api_check.call_problems(MANIFEST, qualname, method, len(args), kwargs, complete=True)
    if problems:
        raise TypeError("; ".join(problems))
    sig = api_check.signature(MANIFEST, qualname, method)
    bound = sig.bind(*args, **kwargs).arguments
    var_kw = next((p.name for p in sig.parameters.values() if p.kind == p.VAR_KEYWORD), None)
    return {**{k: v for k, v in bound.items() if k != var_kw}, **bound.get(var_kw, {})}


def output(qualname: str, **values: Any) -> Any:
    """An instance of vLLM's output class ``qualname``: every attribute it has (None unless
    given), and no other."""
    attrs = MANIFEST["classes"][qualname]["attributes"]
    unknown = set(values) - set(attrs)
    if unknown:
        raise TypeError(f"{qualname} has no attribute(s) {sorted(unknown)} in vLLM {MANIFEST['vllm_version']}")
    cls = _OUTPUT_CLASSES.setdefault(qualname, type(qualname.rsplit(".", 1)[1], (), {"__slots__": tuple(attrs)}))
    obj = cls()
    for a in attrs:
        setattr(obj, a, values.get(a))
    return obj


_OUTPUT_CLASSES: dict[str, type] = {}


class SamplingParams:
    """vLLM's ``SamplingParams``: its fields, set from the keywords given (None otherwise)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = _checked("vllm.SamplingParams", "__init__", args, kwargs)
        for name in MANIFEST["classes"]["vllm.SamplingParams"]["fields"]:
            setattr(self, name.rstrip("="), given.get(name.rstrip("=")))


def _check_environment(before: set[str]) -> None:
    """Variables set since the stand-in was made (by the code under test) must be vLLM's own."""
    known = set(MANIFEST["env"]) | before
    unknown = sorted(k for k in os.environ if k.startswith("VLLM_") and k not in known)
    if unknown:  # vLLM itself warns ("Unknown vLLM environment variable detected"): a stand-in fails
        raise RuntimeError(f"vLLM {MANIFEST['vllm_version']} reads no variable(s) {unknown}")


def standin_vllm(engine: type) -> types.ModuleType:
    """A ``vllm`` module whose ``LLM`` checks every call against the manifest, then calls
    ``engine``'s method of the same name (``engine(**init arguments)`` for ``LLM(...)``)."""
    methods = MANIFEST["classes"]["vllm.LLM"]["methods"]
    dtypes = MANIFEST["constants"]["vllm.config.model.ModelDType"]
    before = set(os.environ)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given = _checked("vllm.LLM", "__init__", args, kwargs)
        if given.get("dtype", "auto") not in dtypes:
            raise ValueError(f"dtype {given['dtype']!r} is not one of vLLM's {dtypes}")
        _check_environment(before)
        self.engine = engine(**given)

    def forward(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            given = _checked("vllm.LLM", name, args, kwargs)
            impl = getattr(self.engine, name, None)
            if impl is None:
                raise NotImplementedError(f"the stand-in engine has no LLM.{name}")
            return impl(**given)

        method.__name__ = name
        return method

    body = {"__init__": __init__, **{m: forward(m) for m in methods if m != "__init__"}}
    module = types.ModuleType("vllm")
    module.__version__ = MANIFEST["vllm_version"]
    module.LLM = type("LLM", (), body)
    module.SamplingParams = SamplingParams
    return module
