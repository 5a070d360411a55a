"""The layers import one way: trainers -> agents (incl. agents.rollout) -> envs -> retrieval_index.

``treegym.errors`` and ``treegym.paths`` sit under everything; the face (``treegym`` itself: the
CLI, options, integrations, studies) may import any layer. Every import counts, including those
inside functions: a lazy import against the direction is still a cycle waiting to happen.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package it installs as (pyproject's package-dir)
LAYERS = {"retrieval_index": 0, "envs": 1, "agents": 2, "trainers": 3}
# Under every layer; each imports nothing of treegym's but the others here.
BASE = {"treegym.errors", "treegym.paths", "treegym.options", "treegym.stats", "treegym.specs", "treegym.hosts"}
# The function that loads a user's ``module:name`` spec (an env class, a branching rule, an agent):
# the one place a computed import belongs. Built-in parts (a family's expert) are real imports.
USER_SPECS = {("treegym/specs.py", "load_object")}


def _layer_of_module(name: str) -> int | None:
    """The layer a ``treegym.*`` module belongs to; 99 for the face; None for the base."""
    if name in BASE or any(name.startswith(b + ".") for b in BASE):
        return None
    parts = name.split(".")
    if parts[0] != "treegym":
        return None
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS[parts[1]]
    return 99


def _calls(tree: ast.AST) -> list[tuple[ast.Call, str]]:
    """Every call with the name of the function it is in ("" at module level)."""
    out: list[tuple[ast.Call, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            if isinstance(child, ast.Call):
                out.append((child, where))
            visit(child, inner)

    visit(tree, "")
    return out


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``; hidden ones get a module name that says why:
    ``<relative>``, ``<__import__>``, ``<computed import_module>``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, node.module if node.level == 0 and node.module else "<relative>"))
    # importlib strings count too: ``importlib.import_module("treegym.x")`` hides an import from grep
    for call, where in _calls(tree):
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        if name == "__import__":
            out.append((call.lineno, "<__import__>"))
        elif name == "import_module":
            arg = call.args[0] if call.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.append((call.lineno, arg.value))
            elif (rel, where) not in USER_SPECS:
                out.append((call.lineno, "<computed import_module>"))
    return out


def _sources() -> list[tuple[str, Path]]:
    """``(folder, file)`` for the layers, the face (``treegym/``) and the base modules in it."""
    files = [(folder, path) for folder in LAYERS for path in sorted((ROOT / folder).rglob("*.py"))]
    return files + [("treegym", path) for path in sorted((ROOT / "treegym").rglob("*.py"))]


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts) if rel.parts[0] == "treegym" else ["treegym", *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations() -> list[str]:
    names = {v: k for k, v in LAYERS.items()} | {99: "the treegym face"}
    found = []
    for folder, path in _sources():
        module = _module_of(path)
        layer = LAYERS.get(folder, 99)
        base = module in BASE
        for lineno, target in _imports(path):
            where = f"{path.relative_to(ROOT)}:{lineno} ({module})"
            if target.startswith("<"):
                found.append(f"{where} has a hidden import: {target[1:-1]}")
                continue
            got = _layer_of_module(target)
            if base and target.split(".")[0] == "treegym" and target not in BASE:
                found.append(f"{where} is under every layer but imports {target}")
            elif got is not None and got > layer:
                found.append(f"{where} imports {target} ({names[got]})")
    return found


def test_imports_run_one_way():
    """trainers -> agents -> envs -> retrieval_index; the face above all; the base below, importing none."""
    assert violations() == []


@pytest.mark.parametrize("module,layer", [("treegym.trainers.loop", 3), ("treegym.agents.rollout.samplers", 2),
                                          ("treegym.envs.core", 1), ("treegym.retrieval_index.qa", 0),
                                          ("treegym.cli", 99), ("treegym.errors", None), ("treegym.stats", None)])
def test_the_checker_knows_the_layers(module, layer):
    assert importlib.util.find_spec(module) is not None, f"{module} does not exist"
    assert _layer_of_module(module) == layer


def test_the_checker_names_only_modules_and_functions_that_exist():
    for name in BASE:
        assert importlib.util.find_spec(name) is not None, f"BASE names {name}, which does not exist"
    for rel, function in USER_SPECS:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        assert function in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, (rel, function)


def test_the_checker_catches_a_lazy_upward_import(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from treegym.trainers.loop import train\n    import importlib\n"
                   "    importlib.import_module('treegym.cli')\n")
    assert [m for _, m in _imports(src) if m.startswith("treegym")] == ["treegym.trainers.loop", "treegym.cli"]


def test_the_checker_catches_hidden_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import importlib\nfrom . import sibling\nfrom .loop import train\n\n\ndef f(name):\n"
                   "    importlib.import_module('treegym.' + name)\n    return __import__(name)\n")
    hidden = [m for _, m in _imports(src) if m.startswith("<")]
    assert hidden == ["<relative>", "<relative>", "<computed import_module>", "<__import__>"]
