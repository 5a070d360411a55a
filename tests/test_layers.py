"""The layers import one way: trainers -> agents (incl. agents.rollout) -> envs -> retrieval_index.

``treegym.errors`` and ``treegym.paths`` sit under everything; the face (``treegym`` itself: the
CLI, options, integrations, studies) may import any layer. Every import counts, including those
inside functions: a lazy import against the direction is still a cycle waiting to happen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package it installs as (pyproject's package-dir)
LAYERS = {"retrieval_index": 0, "envs": 1, "agents": 2, "trainers": 3}
BASE = {"treegym.errors", "treegym.paths", "treegym.options"}


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


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    # importlib strings count too: ``importlib.import_module("treegym.x")`` hides an import from grep
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def violations() -> list[str]:
    found = []
    for folder, layer in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for lineno, module in _imports(path):
                target = _layer_of_module(module)
                if target is not None and target > layer:
                    names = {v: k for k, v in LAYERS.items()} | {99: "the treegym face"}
                    found.append(f"{path.relative_to(ROOT)}:{lineno} ({folder}) imports {module} ({names[target]})")
    return found


def test_imports_run_one_way():
    """trainers -> agents -> envs -> retrieval_index; the face above all; errors/paths/options below."""
    assert violations() == []


@pytest.mark.parametrize("module,layer", [("treegym.trainers.loop", 3), ("treegym.agents.rollout.trees", 2),
                                          ("treegym.envs.core", 1), ("treegym.retrieval_index.qa", 0),
                                          ("treegym.cli", 99), ("treegym.errors", None)])
def test_the_checker_knows_the_layers(module, layer):
    assert _layer_of_module(module) == layer


def test_the_checker_catches_a_lazy_upward_import(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from treegym.trainers.loop import train\n    import importlib\n"
                   "    importlib.import_module('treegym.cli')\n")
    assert [m for _, m in _imports(src) if m.startswith("treegym")] == ["treegym.trainers.loop", "treegym.cli"]
